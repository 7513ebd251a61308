"""The immutable telemetry records that flow up to every face: TUI, CLI --json, tests, recorder."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about one process; None where it could not be read."""

    pid: int
    name: Optional[str] = None
    cmdline: Optional[str] = None
    user: Optional[str] = None
    cpu_percent: Optional[float] = None
    rss: Optional[int] = None          # bytes
    age_s: Optional[float] = None      # seconds since the process started
    known: bool = True                 # False: NVML reported a PID this /proc does not have (container PID namespace)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    mem_used: Optional[int] = None     # bytes; None when NVML does not say
    sm_util: Optional[float] = None    # percent, from NVML process utilization samples
    proc: Optional[ProcInfo] = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. Any field NVML could not give is None ("not available")."""

    index: int
    name: Optional[str] = None
    uuid: Optional[str] = None
    util: Optional[float] = None               # percent
    mem_util: Optional[float] = None           # percent (memory controller)
    mem_used: Optional[int] = None             # bytes
    mem_total: Optional[int] = None            # bytes
    temp: Optional[float] = None               # Celsius
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    sm_clock_mhz: Optional[int] = None
    mem_clock_mhz: Optional[int] = None
    fan_pct: Optional[float] = None
    throttle_reasons: tuple[str, ...] = ()
    compute_capability: Optional[str] = None   # "9.0"
    pcie_rx_bps: Optional[float] = None        # slow call: filled off the hot path, may lag
    pcie_tx_bps: Optional[float] = None
    processes: tuple[GpuProcess, ...] = ()
    simulated: bool = False


@dataclass(frozen=True)
class HostSample:
    name: str
    cpu_percent: Optional[float] = None
    cpu_per_core: tuple[float, ...] = ()
    cpu_count: int = 0
    load_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    mem_total: int = 0
    mem_used: int = 0
    mem_available: int = 0
    swap_total: int = 0
    swap_used: int = 0
    disk_read_bps: Optional[float] = None      # None on the first sample (a rate needs two)
    disk_write_bps: Optional[float] = None
    net_rx_bps: Optional[float] = None
    net_tx_bps: Optional[float] = None


@dataclass(frozen=True)
class PortListener:
    port: int
    address: str
    pid: Optional[int] = None                  # None when the owner cannot be read
    process: Optional[str] = None
    proc: Optional[ProcInfo] = None


@dataclass(frozen=True)
class Snapshot:
    """The whole box at one instant."""

    time: float
    host: HostSample
    gpus: tuple[GpuSample, ...] = ()
    gpu_error: Optional[str] = None            # why `gpus` is empty (no driver, no GPU…), else None
    ports: tuple[PortListener, ...] = ()
    simulated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)   # later layers (engines, jobs) attach here

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(self)


def to_jsonable(value: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists, recursively (the --json path)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value
