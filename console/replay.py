"""The replay source of the jobs feed: a ReplaySession's frames published as JobsSnapshots on the live path's feed."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from gpudeck.jobs.replay import Mark, ReplaySession, jobs_snapshot
from gpudeck.jobs.view import JobsSnapshot

from gpudeck.console.feeds import RearmedSource
from gpudeck.console.format import safe_text

# A frame a second while playing, the live path's own cadence, so a replay costs what live jobs
# cost (the core's part is ~4 ms a frame for the demo's four runs); a key shows its frame at
# once, and a paused or finished replay publishes nothing until the next key.
TICK_S = 1.0


class ReplayJobsSource(RearmedSource):
    """Publishes the session's frame every TICK_S (re-armed after each frame is published, so a slow
    frame never stacks up), and at once after a key moved the position. Read-only: no supervisor."""

    supervisor = None
    worker_group = "jobs-replay"

    def __init__(self, session: ReplaySession, *, tick_s: float = TICK_S,
                 clock: Callable[[], float] = time.monotonic, demo: bool = False) -> None:
        super().__init__()
        self.session = session
        self.demo = demo                     # the bundled demo session (`gpudeck --demo`), not a chosen run
        self.tick_s = tick_s
        self._clock = clock
        self._last_wall: Optional[float] = None
        self._last: Optional[JobsSnapshot] = None
        self.frames = 0                      # frames published (tests wait on it)

    @property
    def paths(self) -> list[Path]:
        return [r.recording.path for r in self.session.runs]

    def _starting(self) -> None:
        self._last_wall = None

    # -- the player's keys (UI thread): each moves the session, then a frame is published at once ------
    def toggle_pause(self) -> bool:
        self._advance()
        paused = self.session.toggle_pause()
        self.poll_now()
        return paused

    def faster(self) -> float:
        self._advance()
        speed = self.session.faster()
        self.poll_now()
        return speed

    def slower(self) -> float:
        self._advance()
        speed = self.session.slower()
        self.poll_now()
        return speed

    def seek(self, delta: float) -> float:
        self._advance()
        t = self.session.seek(delta)
        self.poll_now()
        return t

    def next_mark(self, kinds: Optional[set[str]] = None) -> Optional[Mark]:
        self._advance()
        mark = self.session.next_mark(kinds)
        self.poll_now()
        return mark

    def previous_mark(self) -> Optional[Mark]:
        self._advance()
        mark = self.session.previous_mark()
        self.poll_now()
        return mark

    # -- frames ---------------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Move the position by the wall time since the last move (times the speed, unless paused)."""
        now = self._clock()
        if self._last_wall is not None:
            self.session.advance(now - self._last_wall)
        self._last_wall = now

    def _before_run(self) -> None:
        self._advance()

    def _take(self) -> JobsSnapshot:
        try:
            return jobs_snapshot(self.session.frame())
        except Exception as exc:          # a broken recording shows as an error line, the last frame stays
            last = self._last or JobsSnapshot(taken_at=self.session.position)
            return JobsSnapshot(taken_at=last.taken_at, jobs=last.jobs, engines=last.engines,
                                log_paths=last.log_paths, log_limits=last.log_limits, replay=last.replay,
                                error=f"replay: {type(exc).__name__}: {exc}")

    def _published(self, snapshot: JobsSnapshot) -> None:
        self._last = snapshot
        self.frames += 1

    def _next_delay(self) -> Optional[float]:
        session = self.session
        if session.paused or (session.at_end and not session.loop):
            return None                      # nothing moves: the next frame comes with a key
        return self.tick_s


class NoJobsSource(RearmedSource):
    """One snapshot with no jobs and the reason why (a demo without its recordings). Read-only."""

    supervisor = None
    worker_group = "jobs-none"

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    def _take(self) -> JobsSnapshot:
        return JobsSnapshot(taken_at=time.time(), reason=self.reason)

    def _next_delay(self) -> Optional[float]:
        return None


def record_dir(box: Any, job: str, run_id: str, path: Optional[str] = None) -> Path:
    """The directory on this machine holding a run's record (blocking: a worker calls it).

    On this machine that is the run itself (its indexed path, when it is one: a --demo run lives
    outside the state dir); for a remote box, `box.run_record` — the run fetched by offset into a
    private copy (a second call fetches only what grew). A remote box's `path` is never opened here."""
    if getattr(box, "local", False) and path:
        local = Path(path)
        if local.is_dir():
            return local
    return Path(box.run_record(job, run_id))


def replay_from_box(app: Any, box: Any, runs: Sequence[tuple[str, str, Optional[str]]]) -> None:
    """Play these (job, run_id, path) runs of `box` in the jobs view (`app.replay_runs`). A remote box's
    records are fetched first, off the UI thread, with a notice; a fetch that fails is one line."""
    if not runs:
        return
    replay = getattr(app, "replay_runs", None)
    if replay is None:
        app.notify("replay is not available in this console", severity="warning", timeout=3, markup=False)
        return
    what = (f"{runs[0][0]} run {runs[0][1]}" if len(runs) == 1 else f"{len(runs)} runs")
    if not getattr(box, "local", False):
        app.notify(safe_text(f"fetching {what} from {box.name} for the replay…", 300), timeout=4, markup=False)

    def fetch() -> None:
        try:
            paths = [record_dir(box, job, run_id, path) for job, run_id, path in runs]
        except Exception as exc:  # noqa: BLE001 - BoxError (the link, a refusal) or a local OSError: one line
            app.call_from_thread(app.notify, safe_text(f"cannot replay {what}: {exc}", 400), severity="error",
                                 timeout=6, markup=False)
            return
        app.call_from_thread(replay, paths)

    app.run_worker(fetch, thread=True, exclusive=True, group="replay-fetch", exit_on_error=False)


def open_session(paths: Sequence[Path], **kwargs: Any) -> ReplaySession:
    """A session over run directories (blocking: a worker calls it)."""
    return ReplaySession.open([Path(p) for p in paths], **kwargs)
