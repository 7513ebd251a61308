"""Telemetry on the agent's box: NVML/psutil where importable, else nvidia-smi CSV and /proc (stdlib only)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from typing import Any, Optional

from gpudeck.jobs.telemetry.snapshot import GpuSample, HostSample, Snapshot

# nvidia-smi is a process per call; a hung driver must not hang the agent.
SMI_TIMEOUT_S = 5.0
_SMI_FIELDS = ("index", "name", "uuid", "utilization.gpu", "utilization.memory", "memory.used",
               "memory.total", "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.mem",
               "fan.speed")
_MIB = 1 << 20


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _smi_number(text: str) -> Optional[float]:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None            # "[N/A]", "[Not Supported]"


class SmiGpuSource:
    """GPUs from `nvidia-smi --query-gpu=... --format=csv`: what a box without nvidia-ml-py still has."""

    def __init__(self) -> None:
        self.binary = shutil.which("nvidia-smi")

    def read(self) -> tuple[tuple[GpuSample, ...], Optional[str]]:
        if self.binary is None:
            return (), "no NVIDIA driver: nvidia-smi not found on this box"
        try:
            out = subprocess.run([self.binary, f"--query-gpu={','.join(_SMI_FIELDS)}",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                 timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return (), f"nvidia-smi failed: {exc}"
        if out.returncode != 0:
            return (), f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}"
        gpus = []
        for line in out.stdout.strip().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != len(_SMI_FIELDS):
                continue
            num = [_smi_number(c) for c in cells]
            mib = lambda v: int(v * _MIB) if v is not None else None  # noqa: E731
            gpus.append(GpuSample(
                index=int(num[0] or 0), name=cells[1], uuid=cells[2], util=num[3], mem_util=num[4],
                mem_used=mib(num[5]), mem_total=mib(num[6]), temp=num[7], power_w=num[8],
                power_limit_w=num[9], sm_clock_mhz=int(num[10]) if num[10] is not None else None,
                mem_clock_mhz=int(num[11]) if num[11] is not None else None, fan_pct=num[12]))
        return tuple(gpus), None if gpus else "nvidia-smi reported no GPU"

    def close(self) -> None:
        pass


class ProcHostSampler:
    """CPU, memory and load from /proc: the host panel on a box without psutil."""

    def __init__(self) -> None:
        self._cpu: Optional[list[tuple[int, int]]] = None
        self.name = socket.gethostname()

    @staticmethod
    def _cpu_times() -> list[tuple[int, int]]:
        out = []
        with open("/proc/stat") as fh:
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
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                mem[key] = int(rest.split()[0]) * 1024
        with open("/proc/loadavg") as fh:
            load = tuple(float(v) for v in fh.read().split()[:3])
        total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
        return HostSample(
            name=self.name, cpu_percent=percents[0] if percents else None,
            cpu_per_core=tuple(percents[1:]), cpu_count=os.cpu_count() or 0, load_avg=load,  # type: ignore[arg-type]
            mem_total=total, mem_used=total - avail, mem_available=avail,
            swap_total=mem.get("SwapTotal", 0), swap_used=mem.get("SwapTotal", 0) - mem.get("SwapFree", 0))


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
        gpu_source = "nvml" if _importable("pynvml") else "nvidia-smi"
        if gpu_source == "nvml":
            from gpudeck.jobs.telemetry.gpu import NvmlGpuSource
            self._gpu = NvmlGpuSource()
        else:
            self._gpu = SmiGpuSource()
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
