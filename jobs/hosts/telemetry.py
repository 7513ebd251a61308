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
        from gpudeck.jobs.telemetry.gpu import detect, make_backend
        gpu_source = detect()                    # NVML where nvidia-ml-py imports, else nvidia-smi
        self._gpu = make_backend(gpu_source)
        if _importable("psutil"):
            from gpudeck.jobs.telemetry.sampler import LiveSampler
            self._sampler = LiveSampler(gpu_source=self._gpu)
            self.source = {"gpu": gpu_source, "host": "psutil"}
        else:
            self._host = ProcHostSampler()
            self.source = {"gpu": gpu_source, "host": "/proc"}

    def payload(self) -> dict:
        from gpudeck.jobs.telemetry.status import status_payload
        if self._sampler is not None:
            snap = self._sampler.sample()
        else:
            extra: dict[str, Any] = {"ports_error": "listening ports need psutil on this box"}
            try:
                host = self._host.read()  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:
                host, extra["host_error"] = HostSample(name=socket.gethostname()), str(exc)
            gpus, gpu_error = self._gpu.read()
            snap = Snapshot(time=time.time(), host=host, gpus=gpus, gpu_error=gpu_error, extra=extra)
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
