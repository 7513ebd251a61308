"""The hosts feed: every host's overview row and cached data, published on the UI thread from the core's Fleet."""
from __future__ import annotations

import time
from typing import Any, Optional

from textual.timer import Timer
from textual.widget import Widget

from gpudeck.console.feeds import Feed


class HostsFeed(Feed[dict]):
    """{host name: {"summary", "status", "jobs", "agent"}}, local first. Starts the Fleet (the core's SSH
    polling, on its own thread) when a view first follows it; each publish reads the fleet's cached
    views, so it never waits on the network."""

    def __init__(self, app: Any, specs: list, refresh_s: float) -> None:
        super().__init__(app, "hosts")
        self.app = app
        self.specs = specs
        self.refresh_s = refresh_s
        self.fleet: Any = None
        self._timer: Optional[Timer] = None
        # This machine's last telemetry and jobs, kept while the console shows another box (the app's
        # sampler and jobs feed may then be that box's: they are never shown as this machine's).
        self._local_seen: tuple[Any, Optional[dict]] = (None, None)

    def follow(self, node: Widget, callback: Any, *, while_hidden: bool = False) -> None:
        super().follow(node, callback, while_hidden=while_hidden)
        if self._timer is None:
            remote = [s for s in self.specs if not s.local]
            if remote:
                from gpudeck.jobs.hosts.fleet import Fleet
                self.fleet = Fleet(remote, interval=self.refresh_s).start()
            self.publish_now()
            self._timer = self.app.set_interval(self.refresh_s, self.publish_now, name="hosts-feed")

    def publish_now(self) -> None:
        hosts = {"local": self._local()}
        if self.fleet is not None:
            for name, view in self.fleet.views().items():
                hosts[name] = {"summary": view.summary(), "status": view.status, "jobs": view.jobs,
                               "agent": view.agent}
        self.publish(hosts)

    def _local(self) -> dict:
        from gpudeck.jobs.hosts.fleet import HostView
        from gpudeck.jobs.telemetry.status import status_payload
        # This machine's own figures, also while the console shows another box (then the last ones, STALE).
        snapshot = getattr(self.app, "local_snapshot", getattr(self.app, "snapshot", None))
        status = status_payload(snapshot) if snapshot is not None else None
        source = getattr(self.app.jobs_feed, "source", None)
        # A chosen replay's jobs are not this machine's live ones (--demo's recordings are its jobs).
        replaying = getattr(source, "session", None) is not None and not getattr(source, "demo", False)
        jobs_snapshot = None if replaying else (getattr(self.app, "local_jobs") if hasattr(self.app, "local_jobs")
                                                else self.app.jobs_feed.latest)
        jobs = ({"jobs": [job.payload for job in jobs_snapshot.jobs], "pipelines": list(jobs_snapshot.pipelines)}
                if jobs_snapshot is not None else self._local_seen[1])
        self._local_seen = (snapshot, jobs)
        error = getattr(self.app, "local_error", getattr(self.app, "sample_error", None))
        view = HostView(name="local", ssh=None, state="LIVE" if snapshot is not None and not error else
                        ("STALE" if snapshot is not None else "CONNECTING"),
                        data_age_s=max(0.0, time.time() - snapshot.time) if snapshot is not None else None,
                        error=error, status=status, jobs=jobs)
        return {"summary": view.summary(), "status": status, "jobs": jobs, "agent": {}}

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
            self.fleet = None
