"""The host sampler: CPU, load, RAM, swap, disk and network rates via psutil."""
from __future__ import annotations

import os
import socket
import time
from typing import Callable, Optional

import psutil

from gpudeck.jobs.telemetry.snapshot import HostSample


# /proc/stat counts in 10 ms jiffies: a CPU figure over a shorter window is noise.
_MIN_CPU_WINDOW_S = 0.1


def _loopback(nic: str) -> bool:
    return nic == "lo" or nic.startswith("lo:")


class HostSampler:
    """`read()` -> HostSample. Rates come from the delta to the previous read (None on the first)."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, name: Optional[str] = None) -> None:
        self._monotonic = monotonic
        self._name = name or socket.gethostname()
        self._cpu_count = psutil.cpu_count(logical=True) or 0
        self._prev_at: Optional[float] = None
        self._prev_disk: Optional[tuple[int, int]] = None
        self._prev_net: Optional[tuple[int, int]] = None
        # CPU% is computed from this sampler's own previous cpu_times, not psutil.cpu_percent,
        # whose "since the last call" state is module-global: two samplers in one process
        # (the console and a `status` call, or tests) would steal each other's interval.
        self._prev_cpu = self._cpu_times()
        self._primed_at = monotonic()

    @staticmethod
    def _cpu_times() -> list[tuple[float, float]]:
        """(busy, total) seconds per core, counted the way psutil.cpu_percent counts them."""
        out = []
        for t in psutil.cpu_times(percpu=True):
            total = sum(t)
            # guest time is already inside user/nice on Linux; iowait is idle time.
            total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
            idle = t.idle + getattr(t, "iowait", 0.0)
            out.append((total - idle, total))
        return out

    def _cpu_percent(self) -> tuple[float, ...]:
        now = self._cpu_times()
        before, self._prev_cpu = self._prev_cpu, now
        if len(before) != len(now):                   # a CPU went on/offline: restart the window
            return ()
        per_core = []
        for (busy1, total1), (busy0, total0) in zip(now, before):
            d_total = total1 - total0
            pct = 100.0 * (busy1 - busy0) / d_total if d_total > 0 else 0.0
            per_core.append(round(min(100.0, max(0.0, pct)), 1))
        return tuple(per_core)

    def _disk_bytes(self) -> Optional[tuple[int, int]]:
        # nowrap=False: psutil's wrap bookkeeping (a dict walk a call, ~25 us) guards sums that
        # go backwards, which _rate already reports as no figure for that one tick.
        try:
            io = psutil.disk_io_counters(perdisk=False, nowrap=False)
        except (OSError, RuntimeError):
            return None
        return (io.read_bytes, io.write_bytes) if io is not None else None

    def _net_bytes(self) -> Optional[tuple[int, int]]:
        try:
            per_nic = psutil.net_io_counters(pernic=True, nowrap=False)
        except OSError:
            return None
        # Loopback traffic (engine <-> its own API server) is not the box's network.
        rx = tx = 0
        for nic, c in per_nic.items():
            if not _loopback(nic):
                rx += c.bytes_recv
                tx += c.bytes_sent
        return rx, tx

    @staticmethod
    def _rate(now: tuple[int, int] | None, before: tuple[int, int] | None, dt: Optional[float]
              ) -> tuple[Optional[float], Optional[float]]:
        if now is None or before is None or not dt or dt <= 0:
            return None, None
        # Counters can go backwards (device removed, wrap): report nothing rather than a negative rate.
        a = (now[0] - before[0]) / dt
        b = (now[1] - before[1]) / dt
        return (a if a >= 0 else None), (b if b >= 0 else None)

    def read(self) -> HostSample:
        now = self._monotonic()
        dt = None if self._prev_at is None else now - self._prev_at
        per_core = self._cpu_percent()
        if self._prev_at is None and now - self._primed_at < _MIN_CPU_WINDOW_S:
            per_core = ()                      # a few jiffies say nothing: better no figure than 0% or 100%
        cpu_total = sum(per_core) / len(per_core) if per_core else None
        try:
            load = os.getloadavg()
        except OSError:
            load = (0.0, 0.0, 0.0)
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        disk = self._disk_bytes()
        net = self._net_bytes()
        disk_r, disk_w = self._rate(disk, self._prev_disk, dt)
        net_rx, net_tx = self._rate(net, self._prev_net, dt)
        self._prev_at, self._prev_disk, self._prev_net = now, disk, net
        return HostSample(
            name=self._name,
            cpu_percent=cpu_total,
            cpu_per_core=per_core,
            cpu_count=self._cpu_count,
            load_avg=(float(load[0]), float(load[1]), float(load[2])),
            mem_total=int(vm.total),
            # "used" as an operator means it: what is not available to new work.
            mem_used=int(vm.total - vm.available),
            mem_available=int(vm.available),
            swap_total=int(sw.total),
            swap_used=int(sw.used),
            disk_read_bps=disk_r,
            disk_write_bps=disk_w,
            net_rx_bps=net_rx,
            net_tx_bps=net_tx,
        )
