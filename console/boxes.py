"""The console on a remote box: one delta poll a second feeds both the telemetry and the jobs view.

`BoxLink` is one host of the app's Fleet (one kept SSH link, `poll` with deltas: status and jobs in
one round trip, ~1.7 KB/s at 1 Hz; the hosts view's row of that host reads the same poll).
`RemoteSampler` turns its latest status payload into a Snapshot for the sampling thread (the same path the local sampler takes); `RemoteJobsSource` turns its latest jobs
payload into a JobsSnapshot for the jobs feed. Neither ever waits on the network: both read the
poller's cached view, so a dead box shows as STALE / DOWN with its last data, never as a frozen screen.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from gpudeck.jobs.view import EngineSpec, JobsSnapshot, engine_views

from gpudeck.console.feeds import RearmedSource

if TYPE_CHECKING:
    from gpudeck.jobs.box import Box
    from gpudeck.jobs.hosts.config import HostSpec
    from gpudeck.jobs.hosts.fleet import Fleet, HostView

# How a remote job's log is named in a JobsSnapshot's log_paths: "box:NAME/JOB/RUN/output.log".
# Path(ref).parent.name is the run id, as for a local path; the jobs view reads it through the box.
REMOTE_LOG_PREFIX = "box:"


def remote_log_ref(box: str, job: str, run_id: str) -> str:
    return f"{REMOTE_LOG_PREFIX}{box}/{job}/{run_id}/output.log"


def is_remote_log_ref(path: str) -> bool:
    return path.startswith(REMOTE_LOG_PREFIX)


class BoxUnavailable(Exception):
    """The box has no fresh data: its link is CONNECTING, STALE or DOWN (the message says why)."""

    plain = True          # the sampling thread shows the message as written, without the class name


def link_problem(view: HostView) -> Optional[str]:
    """None when the box's data is live; else one line: its link state, why, and how old the data is."""
    if view.state == "LIVE":
        return None
    if view.state == "CONNECTING":
        return f"{view.name}: CONNECTING" + (f" — {view.error}" if view.error else "")
    parts = [f"{view.name}: {view.state}"]
    if view.error:
        parts.append(f" — {view.error}")
    if view.data_age_s is not None:
        parts.append(f" (data {view.data_age_s:.0f}s old)")
    if view.retry_in_s is not None:
        parts.append(f", retry in {view.retry_in_s:.0f}s")
    return "".join(parts)


class BoxLink:
    """One remote box polled in the background; `view()` never blocks.

    Given a `fleet` (the app's one Fleet, `GpuDeckApp.fleet`), the box is one more host watched there:
    a host the hosts view also shows is polled once, over one link, for both. Without one it runs a
    Fleet of its own (closed by `close()`)."""

    def __init__(self, spec: HostSpec, interval: float, fleet: Optional[Fleet] = None) -> None:
        from gpudeck.jobs.hosts.fleet import Fleet
        self.spec = spec
        self.name = spec.name
        self.owned = fleet is None
        self.fleet = Fleet([], interval=interval) if fleet is None else fleet
        self._started = False

    def start(self) -> "BoxLink":
        if not self._started:
            self._started = True
            self.fleet.watch(self.spec)        # idempotent: a host already watched keeps its poller
            if self.owned:
                self.fleet.start()
        return self

    def view(self) -> HostView:
        self.start()
        view = self.fleet.view(self.name)
        if view is None:                       # let go of (a switch away): said, never a KeyError
            from gpudeck.jobs.hosts.fleet import HostView
            return HostView(name=self.name, ssh=self.spec.ssh, state="DOWN", data_age_s=None,
                            error="no longer watched (the console shows another box)")
        return view

    def close(self) -> None:
        """Its own Fleet closed (blocks up to a few seconds on a wedged link: call it off the UI thread).
        On a shared fleet nothing: the fleet's owner decides when the host stops being polled."""
        if self.owned:
            self.fleet.close()


class RemoteSampler:
    """A Sampler (sample / close) over a BoxLink: the box's latest status as a Snapshot.

    Raises BoxUnavailable while the link is not LIVE: the app then keeps the last snapshot and the
    header says STALE / DOWN with the reason. An unchanged payload is not parsed again."""

    def __init__(self, link: BoxLink) -> None:
        self.link = link
        self._payload: Optional[dict] = None
        self._snapshot: Any = None

    def sample(self) -> Any:
        view = self.link.view()
        problem = link_problem(view)
        if problem is not None:
            raise BoxUnavailable(problem)
        if view.status is None:
            raise BoxUnavailable(f"{view.name}: no telemetry yet" + (f" — {view.error}" if view.error else ""))
        if view.status is not self._payload:
            from gpudeck.jobs.box import StatusReport
            self._snapshot = StatusReport(view.status).snapshot()
            self._payload = view.status
        return self._snapshot

    def close(self) -> None:
        """The link is closed by whoever switches boxes (BoxLink.close)."""


class RemoteJobsSource(RearmedSource):
    """The jobs feed of a remote box: its latest jobs payload every `refresh_s`, from the BoxLink's cache.

    `box` is what the jobs view acts through; `supervisor` is None (nothing here is local)."""

    worker_group = "jobs-poll"
    supervisor = None

    def __init__(self, box: Box, link: BoxLink, refresh_s: float) -> None:
        super().__init__()
        self.box = box
        self.link = link
        self.refresh_s = refresh_s
        self.polls = 0
        self._payload: Optional[dict] = None
        self._status: Optional[dict] = None
        self._snapshot: Optional[JobsSnapshot] = None

    def _take(self) -> JobsSnapshot:
        now = time.time()
        try:
            view = self.link.view()
        except Exception as exc:  # noqa: BLE001 - the jobs view shows why, polling goes on
            return JobsSnapshot(taken_at=now, reason=f"{self.link.name}: {type(exc).__name__}: {exc}")
        problem = link_problem(view)
        if view.jobs is None:
            if problem is None and view.error:          # LIVE, but the box has no jobs file (or it is broken)
                return JobsSnapshot(taken_at=now, reason=f"{view.name}: {view.error}")
            return JobsSnapshot(taken_at=now, reason=problem or f"{view.name}: waiting for its jobs…")
        if view.jobs is not self._payload or view.status is not self._status or self._snapshot is None:
            self._snapshot = self._build(view, now)
            self._payload, self._status = view.jobs, view.status
        snapshot = self._snapshot
        return JobsSnapshot(taken_at=now, jobs=snapshot.jobs, engines=snapshot.engines,
                            log_paths=snapshot.log_paths, pipelines=snapshot.pipelines,
                            error=problem or (view.error if view.error else None))

    def _build(self, view: HostView, now: float) -> JobsSnapshot:
        snapshot = JobsSnapshot.from_payload(view.jobs or {}, now)
        log_paths = {job.name: remote_log_ref(view.name, job.name, job.run_id)
                     for job in snapshot.jobs if job.run_id}
        specs: dict[str, EngineSpec] = {}
        for job in snapshot.jobs:
            if job.kind == "engine":
                engine = job.payload.get("engine")
                model = job.payload.get("model")
                specs[job.name] = (engine if isinstance(engine, str) else None,
                                   model if isinstance(model, str) else None, job.port)
        foreign = (view.status or {}).get("engines")
        foreign = [e for e in foreign if isinstance(e, dict)] if isinstance(foreign, list) else []
        engines = engine_views(list(snapshot.jobs), specs, foreign)
        return JobsSnapshot(taken_at=now, jobs=snapshot.jobs, engines=tuple(engines), log_paths=log_paths,
                            pipelines=snapshot.pipelines)

    def _published(self, snapshot: JobsSnapshot) -> None:
        self.polls += 1

    def _next_delay(self) -> Optional[float]:
        return self.refresh_s


def box_stacks(box: Box, job: str) -> Any:
    """`box.stacks(job)` in the shape the stacks modal shows (a refusal raised as its one line)."""
    from pathlib import Path

    from gpudeck.jobs.stacks import StoredDump
    result = box.stacks(job)
    if result.refused is not None:
        raise RuntimeError(result.refused)
    dump = result.dump or {}
    verdict = dump.get("verdict")
    return StoredDump(path=Path("."), verdict=str(verdict) if verdict else "", taken_at=None,
                      lines=tuple(result.lines), simulated=bool(dump.get("simulated")))
