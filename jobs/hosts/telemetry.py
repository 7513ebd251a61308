"""Telemetry on the agent's box: psutil where importable, else /proc; GPUs from the GPU seam (stdlib only)."""
from __future__ import annotations

import importlib.util
import os
import socket
import time
from typing import Any, Optional

from gpudeck.jobs.telemetry.snapshot import HostSample, Snapshot


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# /proc/diskstats counts 512-byte sectors whatever the device's own sector size.
_DISKSTATS_SECTOR = 512


def read_disk_bytes(proc_root: str = "/proc", sys_block: str = "/sys/block",
                    whole_disk: Optional[dict[str, bool]] = None) -> Optional[tuple[int, int]]:
    """(bytes read, bytes written) since boot by the box's whole disks, from /proc/diskstats; None if unreadable.

    Whole disks are the devices with a /sys/block entry (disks, md, dm, loop): a
    partition's I/O is already in its disk's. What jobs/telemetry/host.py reads
    through psutil's module, here without it (the agent side is stdlib only).
    `whole_disk` caches the /sys/block answer per name (it never changes).
    """
    try:
        with open(f"{proc_root}/diskstats") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    cache = whole_disk if whole_disk is not None else {}
    read = written = 0
    for line in lines:
        fields = line.split()
        if len(fields) < 14:                       # 7 fields: a partition's short form (Linux 2.6)
            continue
        name = fields[2]
        known = cache.get(name)
        if known is None:
            # A slash in a device name (cciss/c0d0) is a '!' in sysfs.
            known = cache[name] = os.path.exists(f"{sys_block}/{name.replace('/', '!')}")
        if known:
            try:
                read += int(fields[5])
                written += int(fields[9])
            except ValueError:
                return None
    return read * _DISKSTATS_SECTOR, written * _DISKSTATS_SECTOR


def read_net_bytes(proc_root: str = "/proc") -> Optional[tuple[int, int]]:
    """(bytes received, bytes sent) since boot by every interface but loopback, from /proc/net/dev."""
    try:
        with open(f"{proc_root}/net/dev") as fh:
            lines = fh.read().splitlines()[2:]       # two header lines
    except OSError:
        return None
    rx = tx = 0
    for line in lines:
        nic, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 9:
            continue
        nic = nic.strip()
        # Loopback traffic (an engine and its own API server) is not the box's network.
        if nic == "lo" or nic.startswith("lo:"):
            continue
        try:
            rx += int(fields[0])
            tx += int(fields[8])
        except ValueError:
            return None
    return rx, tx


def _rates(now: Optional[tuple[int, int]], before: Optional[tuple[int, int]], dt: Optional[float]
           ) -> tuple[Optional[float], Optional[float]]:
    if now is None or before is None or not dt or dt <= 0:
        return None, None
    # Counters can go backwards (a device removed, a wrap): no figure rather than a negative one.
    a, b = (now[0] - before[0]) / dt, (now[1] - before[1]) / dt
    return (a if a >= 0 else None), (b if b >= 0 else None)


class ProcHostSampler:
    """CPU, memory, load, disk and network from /proc: the host panel on a box without psutil.

    Disk and network are rates, so the first read has none (None: "n/a"), like psutil's sampler.
    """

    def __init__(self, proc_root: str = "/proc", sys_block: str = "/sys/block",
                 monotonic: Any = time.monotonic) -> None:
        self._cpu: Optional[list[tuple[int, int]]] = None
        self.name = socket.gethostname()
        self._proc = proc_root
        self._sys_block = sys_block
        self._monotonic = monotonic
        self._whole_disk: dict[str, bool] = {}
        self._prev_at: Optional[float] = None
        self._prev_disk: Optional[tuple[int, int]] = None
        self._prev_net: Optional[tuple[int, int]] = None

    def _cpu_times(self) -> list[tuple[int, int]]:
        out = []
        with open(f"{self._proc}/stat") as fh:
            for line in fh:
                if not line.startswith("cpu"):
                    break
                vals = [int(v) for v in line.split()[1:]]
                idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
                out.append((sum(vals), idle))
        return out

    def read(self) -> HostSample:
        times = self._cpu_times()
        percents: list[float] = []
        if self._cpu is not None and len(self._cpu) == len(times):
            for (tot0, idle0), (tot1, idle1) in zip(self._cpu, times):
                dt = tot1 - tot0
                percents.append(round(100.0 * (1 - (idle1 - idle0) / dt), 1) if dt > 0 else 0.0)
        self._cpu = times
        mem: dict[str, int] = {}
        with open(f"{self._proc}/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                mem[key] = int(rest.split()[0]) * 1024
        with open(f"{self._proc}/loadavg") as fh:
            load = tuple(float(v) for v in fh.read().split()[:3])
        now = self._monotonic()
        elapsed = None if self._prev_at is None else now - self._prev_at
        disk = read_disk_bytes(self._proc, self._sys_block, self._whole_disk)
        net = read_net_bytes(self._proc)
        disk_r, disk_w = _rates(disk, self._prev_disk, elapsed)
        net_rx, net_tx = _rates(net, self._prev_net, elapsed)
        self._prev_at, self._prev_disk, self._prev_net = now, disk, net
        total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
        return HostSample(
            name=self.name, cpu_percent=percents[0] if percents else None,
            cpu_per_core=tuple(percents[1:]), cpu_count=os.cpu_count() or 0, load_avg=load,  # type: ignore[arg-type]
            mem_total=total, mem_used=total - avail, mem_available=avail,
            swap_total=mem.get("SwapTotal", 0), swap_used=mem.get("SwapTotal", 0) - mem.get("SwapFree", 0),
            disk_read_bps=disk_r, disk_write_bps=disk_w, net_rx_bps=net_rx, net_tx_bps=net_tx)


class AgentTelemetry:
    """One status payload per call, from the best source this box has; `source` says which."""

    def __init__(self, simulated: bool = False) -> None:
        self._sampler: Any = None
        self._host: Optional[ProcHostSampler] = None
        self._gpu: Any = None
        if simulated:
            from gpudeck.jobs.telemetry.sampler import SimulatedSampler
            self._sampler = SimulatedSampler()
            self.source = {"gpu": "simulated", "host": "simulated"}
            return
        from gpudeck.jobs.telemetry.gpu import detect, make_backend
        gpu_source = detect()                    # NVML where nvidia-ml-py imports, else nvidia-smi
        self._gpu = make_backend(gpu_source)
        if _importable("psutil"):
            from gpudeck.jobs.telemetry.sampler import LiveSampler
            self._sampler = LiveSampler(gpu_source=self._gpu)
            self.source = {"gpu": gpu_source, "host": "psutil"}
        else:
            from gpudeck.jobs.telemetry.ports import PortScanner     # netlink or /proc/net/tcp{,6}: stdlib
            self._host = ProcHostSampler()
            self._ports = PortScanner()
            self.source = {"gpu": gpu_source, "host": "/proc"}

    def payload(self) -> dict:
        from gpudeck.jobs.telemetry.status import status_payload
        if self._sampler is not None:
            snap = self._sampler.sample()
        else:
            extra: dict[str, Any] = {}
            try:
                host = self._host.read()  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:
                host, extra["host_error"] = HostSample(name=socket.gethostname()), str(exc)
            gpus, gpu_error = self._gpu.read()
            try:
                ports = self._ports.read()
            except (OSError, ValueError) as exc:
                ports, extra["ports_error"] = (), f"listening ports unreadable on this box: {exc}"
            snap = Snapshot(time=time.time(), host=host, gpus=gpus, gpu_error=gpu_error, ports=ports, extra=extra)
        data = status_payload(snap)
        data["source"] = dict(self.source)
        return data

    def close(self) -> None:
        for part in (self._sampler, self._gpu):
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - closing must never fail the agent
                    pass
