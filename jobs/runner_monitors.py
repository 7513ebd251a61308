"""What the runner runs each tick besides sampling: the run's HealthMonitor (stall rules, health.json, on_alert)."""
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


def make_monitors(run: Any, meta: dict) -> list[Any]:
    """Called once by the runner after the job started (see gpudeck.jobs.runner.load_monitors)."""
    return [HealthRunnerMonitor(run, meta)]
