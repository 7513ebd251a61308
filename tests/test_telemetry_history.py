"""History: bounded ring buffers per series, aligned to the snapshot times."""
from __future__ import annotations


import pytest

from gpudeck.jobs.telemetry.history import DEFAULT_CAPACITY, History
from gpudeck.jobs.telemetry.simulated import SimulatedBox
from gpudeck.jobs.telemetry.snapshot import GpuProcess, GpuSample, HostSample, Snapshot


def snap(t: float, util: float | None = 10.0, gpus: int = 1, pids=()) -> Snapshot:
    return Snapshot(
        time=t,
        host=HostSample(name="h", cpu_percent=t, mem_total=100, mem_used=25, load_avg=(1.0, 0.5, 0.2)),
        gpus=tuple(GpuSample(index=i, util=util, mem_used=50, mem_total=200,
                             processes=tuple(GpuProcess(pid=p, mem_used=7) for p in pids))
                   for i in range(gpus)),
    )


def test_default_holds_ten_minutes_at_one_second():
    assert History().capacity == DEFAULT_CAPACITY >= 600


def test_series_are_bounded_and_oldest_first():
    h = History(capacity=5)
    for t in range(12):
        h.add(snap(float(t)))
    assert h.times() == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert h.series(("host", "cpu")) == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert h.series(("gpu", 0, "util")) == [10.0] * 5
    assert h.series(("host", "mem_percent")) == [25.0] * 5
    assert h.series(("gpu", 0, "mem_percent")) == [25.0] * 5
    assert h.series(("host", "load1")) == [1.0] * 5
    assert len(h) == 5


def test_missing_values_are_none_and_unknown_keys_empty():
    h = History(capacity=10)
    h.add(snap(0.0, util=None))
    h.add(snap(1.0, util=30.0))
    assert h.series(("gpu", 0, "util")) == [None, 30.0]
    assert h.series(("gpu", 0, "fan_pct")) == [None, None]
    assert h.series(("gpu", 9, "util")) == []
    assert h.latest(("gpu", 0, "util")) == 30.0


def test_late_series_align_to_the_tail_and_gone_ones_get_gaps():
    h = History(capacity=10)
    h.add(snap(0.0, gpus=1))
    h.add(snap(1.0, gpus=2, pids=(42,)))
    h.add(snap(2.0, gpus=1))
    assert h.series(("gpu", 1, "util")) == [10.0, None]       # started late: shorter, tail-aligned
    assert h.series(("gpu_proc", 42, "mem_used")) == [14.0, None]   # summed over both GPUs, then gone
    assert len(h.series(("gpu", 0, "util"))) == len(h.times()) == 3


def test_a_series_gone_for_a_whole_window_is_dropped():
    h = History(capacity=3)
    h.add(snap(0.0, pids=(42,)))
    for t in range(1, 5):
        h.add(snap(float(t)))
    assert ("gpu_proc", 42, "mem_used") not in h.keys()


def test_full_simulated_window_is_cheap_and_complete():
    h = History()
    box = SimulatedBox(0)
    for step in range(DEFAULT_CAPACITY + 10):
        h.add(box.snapshot(step))
    for i in range(8):
        assert len(h.series(("gpu", i, "util"))) == DEFAULT_CAPACITY
    assert len(h.series(("host", "net_tx_bps"))) == DEFAULT_CAPACITY


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        History(capacity=0)
