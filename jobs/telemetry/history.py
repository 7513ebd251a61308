"""Bounded history of numeric telemetry series (sparklines, stall rules), one ring buffer per key.

Series keys (tuples):

    ("host", "cpu")               host CPU percent (all cores)
    ("host", "load1")             1-minute load average
    ("host", "mem_used")          bytes (total - available)
    ("host", "mem_percent")       percent of mem_total
    ("host", "swap_used")         bytes
    ("host", "disk_read_bps")     bytes/s  (None on the first sample)
    ("host", "disk_write_bps")    bytes/s
    ("host", "net_rx_bps")        bytes/s  (loopback excluded)
    ("host", "net_tx_bps")        bytes/s
    ("gpu", i, "util")            GPU i utilisation percent
    ("gpu", i, "mem_util")        memory-controller utilisation percent
    ("gpu", i, "mem_used")        bytes
    ("gpu", i, "mem_percent")     percent of mem_total
    ("gpu", i, "temp")            Celsius
    ("gpu", i, "power_w")         watts
    ("gpu", i, "sm_clock_mhz")    MHz
    ("gpu", i, "mem_clock_mhz")   MHz
    ("gpu", i, "fan_pct")         percent (None where the GPU has no fan)
    ("gpu", i, "pcie_rx_bps")     bytes/s (refreshed slowly, may lag)
    ("gpu", i, "pcie_tx_bps")     bytes/s
    ("gpu_proc", pid, "mem_used") bytes of GPU memory held by pid, summed over GPUs
    ("gpu_proc", pid, "sm_util")  SM percent of pid, summed over GPUs (None when NVML gave no sample)

Values are floats or None (not available at that tick). Every series is aligned to
the tail of `times()`: a series that started later is simply shorter.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Hashable, Optional

from gpudeck.jobs.strictjson import number
from gpudeck.jobs.telemetry.snapshot import Snapshot

DEFAULT_CAPACITY = 900          # 15 minutes at the default 1 s refresh (>= 10 minutes at 0.66 s)

SeriesKey = tuple[Hashable, ...]

_GPU_FIELDS = ("util", "mem_util", "mem_used", "temp", "power_w", "sm_clock_mhz", "mem_clock_mhz",
               "fan_pct", "pcie_rx_bps", "pcie_tx_bps")
_HOST_FIELDS = ("disk_read_bps", "disk_write_bps", "net_rx_bps", "net_tx_bps", "swap_used", "mem_used")


_num = number               # the one strict number rule (strictjson): finite, never a bool


def snapshot_values(snapshot: Snapshot) -> dict[SeriesKey, Optional[float]]:
    """Every series value one snapshot contributes, keyed as documented above."""
    h = snapshot.host
    values: dict[SeriesKey, Optional[float]] = {
        ("host", "cpu"): _num(h.cpu_percent),
        ("host", "load1"): _num(h.load_avg[0]) if h.load_avg else None,
        ("host", "mem_percent"): (100.0 * h.mem_used / h.mem_total) if h.mem_total else None,
    }
    for name in _HOST_FIELDS:
        values[("host", name)] = _num(getattr(h, name))
    procs_mem: dict[int, float] = {}
    procs_sm: dict[int, Optional[float]] = {}
    for g in snapshot.gpus:
        for name in _GPU_FIELDS:
            values[("gpu", g.index, name)] = _num(getattr(g, name))
        values[("gpu", g.index, "mem_percent")] = (
            100.0 * g.mem_used / g.mem_total if g.mem_used is not None and g.mem_total else None)
        for p in g.processes:
            procs_mem[p.pid] = procs_mem.get(p.pid, 0.0) + (p.mem_used or 0)
            if p.sm_util is not None:
                procs_sm[p.pid] = (procs_sm.get(p.pid) or 0.0) + p.sm_util
            else:
                procs_sm.setdefault(p.pid, None)
    for pid, mem in procs_mem.items():
        values[("gpu_proc", pid, "mem_used")] = mem
        values[("gpu_proc", pid, "sm_util")] = procs_sm.get(pid)
    return values


class History:
    """Ring buffers of the last `capacity` samples per series. Thread-safe."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._times: deque[float] = deque(maxlen=capacity)
        self._series: dict[SeriesKey, deque[Optional[float]]] = {}
        self._lock = threading.Lock()

    def add(self, snapshot: Snapshot) -> None:
        """Append one snapshot. A known series missing from it gets None (gap, stays aligned)."""
        values = snapshot_values(snapshot)
        with self._lock:
            self._times.append(snapshot.time)
            for key, buf in self._series.items():
                if key not in values:
                    buf.append(None)
            for key, value in values.items():
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = deque(maxlen=self.capacity)
                series.append(value)
            # A series that has been all-gap for a full window (a process long gone) is dropped.
            if len(self._times) == self.capacity:
                for key in [k for k, b in self._series.items() if b[-1] is None and k not in values
                            and all(v is None for v in b)]:
                    del self._series[key]

    def series(self, key: SeriesKey) -> list[Optional[float]]:
        """Values of `key`, oldest first, aligned to the tail of times(); [] for an unknown key."""
        with self._lock:
            buf = self._series.get(tuple(key))
            return list(buf) if buf is not None else []

    def times(self) -> list[float]:
        """Snapshot times, oldest first."""
        with self._lock:
            return list(self._times)

    def keys(self) -> list[SeriesKey]:
        with self._lock:
            return list(self._series)

    def latest(self, key: SeriesKey) -> Optional[float]:
        with self._lock:
            buf = self._series.get(tuple(key))
            return buf[-1] if buf else None

    def __len__(self) -> int:
        return len(self._times)
