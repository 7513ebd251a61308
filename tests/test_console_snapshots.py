"""Snapshot tests of the dashboard: the SIMULATED box at fixed seed, clock and sizes (review SVG changes like code).

Update after an intended change with: .venv/bin/python -m pytest tests/test_console_snapshots.py --snapshot-update
"""
from __future__ import annotations

import time

import pytest

from gpudeck.jobs.telemetry.history import History
from gpudeck.jobs.telemetry.sampler import make_sampler
from gpudeck.jobs.telemetry.snapshot import HostSample, Snapshot

from gpudeck.console.app import make_app
from gpudeck.console.messages import SampleFailed, SamplesCollected

pytestmark = pytest.mark.usefixtures("utc")    # the header prints local time

EPOCH = 1_800_000_000.0      # a fixed wall clock: the header shows snapshot time
HISTORY_TICKS = 90           # enough ticks to fill the sparklines


class SteppingClock:
    """A clock that advances one second per reading: one reading per sample."""

    def __init__(self, start: float = EPOCH) -> None:
        self.now = start - 1.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def demo_app(theme: str = "gpudeck-dark", ticks: int = HISTORY_TICKS, fail_after: bool = False):
    """An app over the demo box whose ticks the test drives (no timer: deterministic)."""
    sampler = make_sampler(demo=True, seed=0, clock=SteppingClock())
    app = make_app(sampler=sampler, theme=theme, history=History(), start_sampling=False)

    async def run_before(pilot) -> None:
        for _ in range(ticks):
            app.post_message(SamplesCollected(sampler.sample()))
        if fail_after:
            app.post_message(SampleFailed("RuntimeError: NVML: GPU is lost"))
        await pilot.pause()
        await pilot.pause()

    return app, run_before


def test_dashboard_80x24(snap_compare) -> None:
    app, run_before = demo_app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_dashboard_160x50_cards(snap_compare) -> None:
    app, run_before = demo_app()
    assert snap_compare(app, terminal_size=(160, 50), run_before=run_before)


def test_dashboard_120x36_light(snap_compare) -> None:
    app, run_before = demo_app(theme="gpudeck-light")
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_dashboard_100x30_contrast(snap_compare) -> None:
    app, run_before = demo_app(theme="gpudeck-contrast")
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_dashboard_stale_after_a_failed_tick_80x24(snap_compare) -> None:
    app, run_before = demo_app(ticks=20, fail_after=True)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_dashboard_without_gpu_80x24(snap_compare) -> None:
    host = HostSample(name="laptop", cpu_percent=23.0, cpu_per_core=(30.0, 16.0, 22.0, 24.0), cpu_count=4,
                      load_avg=(0.9, 0.7, 0.5), mem_total=16 << 30, mem_used=9 << 30, mem_available=7 << 30,
                      swap_total=2 << 30, swap_used=0, disk_read_bps=1.5e6, disk_write_bps=2.5e5,
                      net_rx_bps=3.1e4, net_tx_bps=1.2e4)
    snapshot = Snapshot(time=EPOCH, host=host, gpus=(), gpu_error="NVML Shared Library Not Found (no NVIDIA driver)")
    app = make_app(sampler=None, history=History(), start_sampling=False, demo=True)

    async def run_before(pilot) -> None:
        app.post_message(SamplesCollected(snapshot))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_help_screen_80x24(snap_compare) -> None:
    app, run_before = demo_app(ticks=5)
    async def open_help(pilot) -> None:
        await run_before(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
    assert snap_compare(app, terminal_size=(80, 24), run_before=open_help)
