"""Which PIDs hold GPU memory, per NVML — imported lazily so the runner stays stdlib-only where NVML is absent."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

_nvml = None            # the pynvml module once initialised; False when unavailable
_nvml_error: Optional[str] = None


@dataclass(frozen=True)
class GpuHolder:
    """One process's memory on one GPU."""

    gpu: int
    pid: int
    mem_used: Optional[int]          # bytes; None when NVML does not say


def _init():
    global _nvml, _nvml_error
    if _nvml is not None:
        return _nvml or None
    try:
        import pynvml  # nvidia-ml-py; optional on the runner side
        pynvml.nvmlInit()
        _nvml = pynvml
    except Exception as exc:          # no library, no driver, no GPU: all "unavailable"
        _nvml = False
        # The same one-line wording as the dashboard's GPU panel (stdlib-only module).
        from gpudeck.jobs.telemetry.gpu import describe_init_error
        _nvml_error = describe_init_error(exc) if not isinstance(exc, ImportError) else \
            "nvidia-ml-py (pynvml) is not installed"
    return _nvml or None


def available() -> bool:
    return _init() is not None


def unavailable_reason() -> Optional[str]:
    _init()
    return _nvml_error


def holders() -> Optional[list[GpuHolder]]:
    """Every compute/graphics process on every GPU, or None when NVML is unavailable."""
    nvml = _init()
    if nvml is None:
        return None
    found: dict[tuple[int, int], GpuHolder] = {}
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception:
        return None
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            continue
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(nvml, getter)(handle)
            except Exception:
                continue
            for p in procs:
                mem = getattr(p, "usedGpuMemory", None)
                if not isinstance(mem, int) or mem < 0 or mem >= 2 ** 63:
                    mem = None        # NVML_VALUE_NOT_AVAILABLE (e.g. no permission in a container)
                key = (index, int(p.pid))
                if key not in found or (mem or 0) > (found[key].mem_used or 0):
                    found[key] = GpuHolder(gpu=index, pid=int(p.pid), mem_used=mem)
    return list(found.values())


def utilization(indices: set[int]) -> dict[int, dict]:
    """{gpu: {"util": %, "mem_used": bytes, "power_w": W, "power_limit_w": W}} for the given GPUs; empty without NVML.

    Power is what tells a hung NCCL collective (util pinned at 100%, near-idle watts) from real work.
    """
    nvml = _init()
    out: dict[int, dict] = {}
    if nvml is None:
        return out
    for index in sorted(indices):
        entry: dict = {}
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            continue
        try:
            entry["util"] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except Exception:
            pass
        try:
            entry["mem_used"] = nvml.nvmlDeviceGetMemoryInfo(handle).used
        except Exception:
            pass
        try:
            entry["power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0          # mW -> W
        except Exception:
            pass
        try:
            entry["power_limit_w"] = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        except Exception:
            pass
        out[index] = entry
    return out
