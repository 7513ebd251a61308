"""The hosts feed: every host's overview row and cached data, published on the UI thread from the core's Fleet."""
from __future__ import annotations

import time
from typing import Any, Optional

from textual.timer import Timer
from textual.widget import Widget

from gpudeck.console.feeds import Feed


class HostsFeed(Feed[dict]):
    """{host name: {"summary", "status", "jobs", "agent"}}, local first, then `specs`' remote hosts in order.

    When a view first follows it, every remote host is watched on the app's one Fleet (`app.fleet`: the
    core's SSH polling, on its own thread), the one the shown box's BoxLink polls through too: a host
    both show is polled once. From then on they stay watched until the console quits (the hosts view
    may be opened again at any time; its rows keep their data). Each publish reads the fleet's cached
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
                fleet = self.app.fleet
                for spec in remote:
                    fleet.watch(spec)          # idempotent: the shown box's poller is kept as it is
                self.fleet = fleet
            self.publish_now()
            self._timer = self.app.set_interval(self.refresh_s, self.publish_now, name="hosts-feed")

    def publish_now(self) -> None:
        hosts = {"local": self._local()}
        if self.fleet is not None:
            for spec in self.specs:
                view = None if spec.local else self.fleet.view(spec.name)
                if view is not None:
                    hosts[spec.name] = {"summary": view.summary(), "status": view.status, "jobs": view.jobs,
                                        "agent": view.agent}
        self.publish(hosts)

    def watches(self, name: str) -> bool:
        """Whether this feed keeps host `name` polled (it has been followed and lists that host)."""
        return self.fleet is not None and any(spec.name == name and not spec.local for spec in self.specs)

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
        """Publish no more remote rows; the fleet is the app's (closed when the app unmounts)."""
        self.fleet = None
