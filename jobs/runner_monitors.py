"""What the runner runs each tick besides sampling: the run's HealthMonitor (stall rules, health.json, on_alert) and its history recorder (summary.json, the run index)."""
from __future__ import annotations

from typing import Any

from gpudeck.jobs.health import HealthMonitor


class HealthRunnerMonitor:
    """Adapts the runner's Tick/finished calls to the HealthMonitor of this run."""

    def __init__(self, run: Any, meta: dict) -> None:
        self.health = HealthMonitor.for_run(run.path, meta)

    def tick(self, tick: Any) -> None:
        self.health.tick(tick.sample, alive=tick.job_alive, now=tick.now)

    def finished(self, run: Any, exit_record: dict) -> None:
        self.health.finish(exit_record)


class HistoryRunnerMonitor:
    """Keeps the run's summary.json from what the health monitor already read (the log is read once),
    and indexes the run when it ends."""

    def __init__(self, run: Any, health: HealthMonitor) -> None:
        from gpudeck.jobs.history.recorder import RunRecorder
        self.health = health
        self.recorder = RunRecorder(run.path)

    def _observe(self, now: float, sample: dict, log_size: Any) -> None:
        line = getattr(self.health.analyzer, "line", None)
        self.recorder.observe(now, sample, log_size=log_size, analysis=self.health.analysis,
                              log_offset=self.health.log_offset, line=line if isinstance(line, int) else None)

    def tick(self, tick: Any) -> None:
        self._observe(tick.now, tick.sample, tick.log_size)

    def finished(self, run: Any, exit_record: dict) -> None:
        import time
        # The health monitor has read the rest of the log and judged the exit: take its final state.
        line = getattr(self.health.analyzer, "line", None)
        self.recorder.observe_log(time.time(), self.health.analysis, self.health.log_offset,
                                  line if isinstance(line, int) else None)
        self.recorder.flush(final=True)
        from gpudeck.jobs.history.index import index_run_at_end
        index_run_at_end(run.path)


def make_monitors(run: Any, meta: dict) -> list[Any]:
    """Called once by the runner after the job started (see gpudeck.jobs.runner.load_monitors)."""
    health = HealthRunnerMonitor(run, meta)
    return [health, HistoryRunnerMonitor(run, health.health)]
