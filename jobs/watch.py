"""The headless jobs watcher: finds and loads the jobs file, and each poll turns the run dirs into a JobsSnapshot."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

from gpudeck.jobs.view import LIVE_STATES, EngineSpec, JobsSnapshot, JobView, engine_views

if TYPE_CHECKING:                     # loaded with the jobs file, on the first poll
    from gpudeck.jobs.supervisor import Supervisor

# Engine discovery walks every process's environment: often enough to catch a
# foreign vLLM appearing, rarely enough to stay cheap on a busy box.
DISCOVERY_INTERVAL_S = 5.0
NO_JOBS_FILE = ("no jobs file: pass --jobs FILE, set GPUDECK_JOBS, or create ./jobs.toml "
                "or ~/.config/gpudeck/jobs.toml — the dashboard works without one")


class JobsWatcher:
    """Blocking calls (a face runs them off its UI thread): `poll()` returns the next snapshot.

    `supervisor` and `payload(supervisor) -> {"jobs": [...]}` are injectable (a fixed state for
    snapshot tests); by default the jobs file is found like the CLI finds it, and found again on
    every poll until it loads (a jobs.toml created while the console runs shows up).
    """

    def __init__(self, jobs_file: Optional[str] = None, *, supervisor: Optional[Supervisor] = None,
                 payload: Optional[Callable[[Supervisor], dict]] = None, discover: Optional[bool] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.jobs_file_arg = jobs_file
        self.supervisor: Optional[Supervisor] = supervisor
        self._payload = payload
        self._discover = supervisor is None if discover is None else discover
        self._clock = clock
        self._foreign: list[dict] = []
        self._discovered_at: Optional[float] = None
        self._last: Optional[JobsSnapshot] = None

    def load(self) -> Optional[str]:
        """Load the jobs file if not yet loaded; None when loaded, else why not (one line)."""
        if self.supervisor is not None:
            return None
        from gpudeck.jobs.paths import find_jobs_file
        from gpudeck.jobs.spec import SpecError, load_jobs
        from gpudeck.jobs.supervisor import Supervisor
        try:
            path = find_jobs_file(self.jobs_file_arg)
            if path is None:
                return NO_JOBS_FILE
            if not path.exists():
                return f"{path}: no such file — the dashboard works without it"
            try:
                jobs_file = load_jobs(path)
            except SpecError as exc:
                return f"{exc} (run `gpudeck check` for every problem)"
            self.supervisor = Supervisor(jobs_file)
        except Exception as exc:       # never take a face down: the reason is shown instead
            return f"jobs unavailable: {type(exc).__name__}: {exc}"
        return None

    def poll(self) -> JobsSnapshot:
        now = self._clock()
        reason = self.load()
        supervisor = self.supervisor
        if reason is not None or supervisor is None:     # load() sets the supervisor or says why not
            return JobsSnapshot(taken_at=now, reason=reason)
        try:
            if self._payload is not None:
                payload = self._payload(supervisor)
            else:
                from gpudeck.jobs.payload import jobs_payload
                payload = jobs_payload(supervisor)
            snapshot = JobsSnapshot.from_payload(payload, now)
            log_paths = {}
            for job in snapshot.jobs:
                run = supervisor.latest(job.name) if job.run_id else None
                if run is not None:
                    log_paths[job.name] = str(run.log_path)
            engines = engine_views(list(snapshot.jobs), self._engine_specs(supervisor, snapshot.jobs), self._foreign_engines())
            snapshot = JobsSnapshot(taken_at=now, jobs=snapshot.jobs, engines=tuple(engines), log_paths=log_paths,
                                    pipelines=snapshot.pipelines)
        except Exception as exc:       # the last good jobs stay shown, with the error
            last = self._last or JobsSnapshot(taken_at=now)
            return JobsSnapshot(taken_at=now, jobs=last.jobs, engines=last.engines, log_paths=last.log_paths,
                                pipelines=last.pipelines, error=f"{type(exc).__name__}: {exc}")
        self._last = snapshot
        return snapshot

    def _engine_specs(self, supervisor: Supervisor, jobs: tuple[JobView, ...]) -> dict[str, EngineSpec]:
        """Each engine job's (engine, model, port), from its spec (a profile fills in what the cmd says)."""
        specs: dict[str, EngineSpec] = {}
        try:
            from gpudeck.jobs.engines.profiles import engine_settings
            for job in jobs:
                spec = supervisor.spec(job.name)
                settings = engine_settings(spec)
                if settings is not None:
                    specs[job.name] = (settings.engine, settings.model, settings.port)
                elif spec.kind == "engine":
                    specs[job.name] = (spec.engine, spec.model, spec.port)
        except Exception:
            specs = {j.name: (None, None, j.port) for j in jobs if j.kind == "engine"}
        return specs

    def _foreign_engines(self) -> list[dict]:
        """Engines no job of ours started, re-discovered every DISCOVERY_INTERVAL_S."""
        if not self._discover:
            return []
        now = time.monotonic()
        if self._discovered_at is None or now - self._discovered_at >= DISCOVERY_INTERVAL_S:
            try:
                from gpudeck.jobs.engines.discovery import discover_engines
                self._foreign = [e.to_dict() for e in discover_engines() if not e.managed]
            except Exception:
                self._foreign = []
            self._discovered_at = now
        return self._foreign


def live_jobs_note(jobs_file_arg: Optional[str]) -> Optional[str]:
    """What quitting a face leaves behind, in one line (None when nothing runs)."""
    try:
        from gpudeck.jobs.paths import find_jobs_file
        from gpudeck.jobs.spec import load_jobs
        from gpudeck.jobs.supervisor import Supervisor
        path = find_jobs_file(jobs_file_arg)
        if path is None or not path.exists():
            return None
        live = [s.name for s in Supervisor(load_jobs(path)).job_states() if s.state in LIVE_STATES]
    except Exception:
        return None
    if not live:
        return None
    names = ", ".join(live[:5]) + ("…" if len(live) > 5 else "")
    noun = "job keeps" if len(live) == 1 else "jobs keep"
    return f"{len(live)} {noun} running ({names}); `gpudeck jobs` to see them"
