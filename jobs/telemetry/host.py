"""The host sampler: CPU, load, RAM, swap, disk and network rates via psutil and /proc."""
from __future__ import annotations

import os
import socket
import time
from typing import Callable, Optional

import psutil

from gpudeck.jobs.telemetry.snapshot import HostSample


# /proc/stat counts in 10 ms jiffies: a CPU figure over a shorter window is noise.
_MIN_CPU_WINDOW_S = 0.1
# /proc/diskstats counts 512-byte sectors whatever the device's own sector size.
_DISKSTATS_SECTOR = 512


def read_meminfo(proc_root: str = "/proc") -> Optional[tuple[int, int, int, int]]:
    """(RAM total, RAM available, swap total, swap free) in bytes from one read of /proc/meminfo.

    What psutil.virtual_memory() and swap_memory() report for these fields, from one read
    instead of three (swap_memory also reads /proc/vmstat for page-in counts shown nowhere
    here): ~0.2 ms a tick on a 16-core H200 VM. None when the file or a field is missing
    (kernels before 3.14 have no MemAvailable): the caller asks psutil, which estimates it.
    """
    try:
        with open(f"{proc_root}/meminfo", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = {}
    for line in data.splitlines():
        name, _, rest = line.partition(b":")
        if name in (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree"):
            try:
                fields[name] = int(rest.split()[0]) * 1024
            except (ValueError, IndexError):
                return None
    try:
        return fields[b"MemTotal"], fields[b"MemAvailable"], fields[b"SwapTotal"], fields[b"SwapFree"]
    except KeyError:
        return None


class DiskstatsReader:
    """Bytes read and written by the box's whole disks since boot, from /proc/diskstats.

    The sum psutil.disk_io_counters(perdisk=False) gives: devices with a /sys/block entry
    (disks, loop, md, dm; not partitions, whose I/O their disk already counts). psutil asks
    /sys/block about every device on every call; a name's answer never changes, so it is
    asked once here (a hot-plugged disk is a new name). None when the file is not there or
    a line has a shape this does not know: the caller asks psutil.
    """

    def __init__(self, proc_root: str = "/proc", sys_block: str = "/sys/block") -> None:
        self._path = f"{proc_root}/diskstats"
        self._sys_block = sys_block
        self._whole_disk: dict[bytes, bool] = {}

    def _is_whole_disk(self, name: bytes) -> bool:
        known = self._whole_disk.get(name)
        if known is None:
            # A slash in a device name (cciss/c0d0) is a '!' in sysfs.
            path = f"{self._sys_block}/{name.decode('utf-8', 'replace').replace('/', '!')}"
            known = self._whole_disk[name] = os.access(path, os.F_OK)
        return known

    def read(self) -> Optional[tuple[int, int]]:
        try:
            with open(self._path, "rb") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return None
        read_sectors = written_sectors = 0
        for line in lines:
            fields = line.split()
            if len(fields) == 7:                      # a partition's short form (Linux 2.6)
                continue
            if len(fields) != 14 and len(fields) < 18:
                return None
            if self._is_whole_disk(fields[2]):
                read_sectors += int(fields[5])
                written_sectors += int(fields[9])
        return read_sectors * _DISKSTATS_SECTOR, written_sectors * _DISKSTATS_SECTOR


def _loopback(nic: str) -> bool:
    return nic == "lo" or nic.startswith("lo:")


class HostSampler:
    """`read()` -> HostSample. Rates come from the delta to the previous read (None on the first)."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, name: Optional[str] = None,
                 proc_root: str = "/proc", sys_block: str = "/sys/block") -> None:
        self._monotonic = monotonic
        self._proc_root = proc_root
        self._diskstats = DiskstatsReader(proc_root, sys_block)
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
        mine = self._diskstats.read()
        if mine is not None:
            return mine
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
        memory = read_meminfo(self._proc_root)
        if memory is None:
            vm, sw = psutil.virtual_memory(), psutil.swap_memory()
            memory = (vm.total, vm.available, sw.total, sw.free)
        mem_total, mem_available, swap_total, swap_free = memory
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
            mem_total=int(mem_total),
            # "used" as an operator means it: what is not available to new work.
            mem_used=int(mem_total - mem_available),
            mem_available=int(mem_available),
            swap_total=int(swap_total),
            swap_used=int(swap_total - swap_free),
            disk_read_bps=disk_r,
            disk_write_bps=disk_w,
            net_rx_bps=net_rx,
            net_tx_bps=net_tx,
        )
