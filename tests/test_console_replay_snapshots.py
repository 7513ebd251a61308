"""Snapshot tests of replay, history and post-mortem: the bundled SIMULATED recordings at fixed instants (review SVG changes like code).

Update after an intended change with:
    .venv/bin/python -m pytest tests/test_console_replay_snapshots.py --snapshot-update
"""
from __future__ import annotations

import shutil
import time

import pytest

from gpudeck.console.app import make_app
from gpudeck.console.feeds import JobsFeed
from gpudeck.console.messages import SamplesCollected
from gpudeck.console.replay import ReplayJobsSource
from gpudeck.jobs.replay import demo_run_dirs, demo_session
from gpudeck.jobs.telemetry.history import History
from gpudeck.jobs.telemetry.sampler import make_sampler

from runsupport import pilot_wait_for

pytestmark = pytest.mark.usefixtures("utc")    # the header prints local time

EPOCH = 1_800_000_070.0      # the header's clock: the replayed instant


def console(ticks: int = 3):
    clock = iter(range(int(EPOCH), int(EPOCH) + 100)).__next__
    sampler = make_sampler(demo=True, seed=0, clock=lambda: float(clock()))
    app = make_app(sampler=sampler, history=History(), start_sampling=False)

    async def samples(pilot) -> None:
        for _ in range(ticks):
            app.post_message(SamplesCollected(sampler.sample()))
        await pilot.pause()
    return app, samples


def test_replay_of_the_demo_runs_120x36(snap_compare) -> None:
    """70 s into the demo, paused: the build under its OOM alert, SGLang STALLED, the EAGLE-3 relaunch
    crashed, vLLM loading with an ETA."""
    app, samples = console()
    session = demo_session(loop=False)
    session.seek_to(session.start + 70)
    session.paused = True
    source = ReplayJobsSource(session)
    app.jobs_feed = JobsFeed(app, source)

    async def run_before(pilot) -> None:
        await samples(pilot)
        await pilot.press("2")
        await pilot_wait_for(pilot, lambda: source.frames >= 1 and getattr(app.screen, "replay", None), "a frame")
        # The log pane is left closed: where its scrollbar thumb was drawn at the instant of the
        # shot varied from run to run. Its cut at the replayed position is tested in test_console_replay.
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


@pytest.fixture
def demo_state(state):
    """The demo recordings as the run history of a state dir."""
    for run in demo_run_dirs():
        target = state / "runs" / run.parent.name / run.name
        shutil.copytree(run, target)
        for path in [target, target.parent, *target.iterdir()]:
            path.chmod(0o700 if path.is_dir() else 0o600)
    (state / "runs").chmod(0o700)
    state.chmod(0o700)
    return state


def test_history_of_the_demo_runs_120x30(snap_compare, demo_state) -> None:
    app, samples = console()

    async def run_before(pilot) -> None:
        await samples(pilot)
        await pilot.press("3")
        await pilot_wait_for(pilot, lambda: len(getattr(app.screen, "rows", [])) == 4, "four runs")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 30), run_before=run_before)


def test_postmortem_of_the_crashed_relaunch_120x40(snap_compare, demo_state) -> None:
    app, samples = console()

    async def run_before(pilot) -> None:
        await samples(pilot)
        await pilot.press("3")
        await pilot_wait_for(pilot, lambda: len(getattr(app.screen, "rows", [])) == 4, "four runs")
        rows = app.screen.rows
        index = next(i for i, r in enumerate(rows) if r["job"] == "vllm-eagle3")
        for _ in range(index):
            await pilot.press("down")
        await pilot.press("enter")
        await pilot_wait_for(pilot, lambda: getattr(app.screen, "view", None) is not None, "the report")
        await pilot.press("enter")                # show the root cause in the log pane
        pane = app.screen.query_one("#log-pane")
        await pilot_wait_for(pilot, lambda: pane.current_match is not None, "the log on the line")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
