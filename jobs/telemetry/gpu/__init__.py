"""The GPU seam: what gpudeck asks of a GPU vendor, and which implementation answers on this box.

Every part of the core that needs a GPU fact goes through a `GpuBackend`: the sampler (devices and
their figures), stop and pivot (which processes hold memory, is it released), the runner's stall
samples (utilization and power of a job's GPUs), doctor (the driver), and the supervisor (the
device list a job may use). Three implementations: NVML (`nvml.py`, the only module that imports
nvidia-ml-py), nvidia-smi (`nvidia_smi.py`, for a remote box without nvidia-ml-py) and the SIMULATED box
(`telemetry/simulated.py`). A new vendor is one more module implementing `GpuBackend` plus its line
in `_FACTORIES` and in `detect()`.

Stdlib only, like everything the runner imports: implementations are imported when first made.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Protocol

if TYPE_CHECKING:
    from gpudeck.jobs.telemetry.snapshot import GpuSample


@dataclass(frozen=True)
class GpuHolder:
    """One process's memory on one GPU."""

    gpu: int
    pid: int
    mem_used: Optional[int]          # bytes; None when the driver does not say


@dataclass(frozen=True)
class GpuFigures:
    """The few live figures the runner's stall rules read for a job's GPUs; None where not known."""

    util: Optional[float] = None             # percent
    mem_used: Optional[int] = None           # bytes
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None


@dataclass(frozen=True)
class DriverInfo:
    version: str
    names: tuple[str, ...]                   # one per visible GPU


@dataclass(frozen=True)
class GpuMemory:
    """Who holds memory on which GPU, and how much each GPU has in use: the "is it released" question."""

    holders: tuple[GpuHolder, ...]
    used: dict[int, int] = field(default_factory=dict)        # {gpu: bytes in use}

    def by_gpu(self) -> dict[int, list[GpuHolder]]:
        out: dict[int, list[GpuHolder]] = {}
        for h in self.holders:
            out.setdefault(h.gpu, []).append(h)
        return out

    def released(self, gpus: Iterable[int] = (), *, ignore_pids: Iterable[int] = (), idle_bytes: int) -> bool:
        """No process but `ignore_pids` holds memory on `gpus` (all when empty), and each is back under idle_bytes."""
        ignored = set(ignore_pids)
        watched = set(gpus) or (set(self.used) | {h.gpu for h in self.holders})
        if any(h.gpu in watched and h.pid not in ignored for h in self.holders):
            return False
        return all(self.used.get(g, 0) <= idle_bytes for g in watched)


class GpuUnavailable(Exception):
    """The backend cannot answer on this box; str() is one line saying why."""


class GpuBackend(Protocol):
    """One GPU vendor's answers. No method raises except `driver()` (GpuUnavailable)."""

    kind: str                     # "nvml", "nvidia-smi", "simulated"
    label: str                    # how messages name it: "NVML", "nvidia-smi", "SIMULATED"
    visible_devices_var: str      # the environment variable that limits a process to some GPUs

    @property
    def error(self) -> Optional[str]:
        """Why the backend is unavailable (one line), or None while it works."""

    def open(self) -> None:
        """Start the driver session now (the first call would): lets a caller overlap it with other waiting."""

    def close(self) -> None:
        """End the session and any background reader."""

    def available(self) -> bool:
        """Whether the backend answers on this box (opens it if needed)."""

    def read(self) -> tuple[tuple[GpuSample, ...], Optional[str]]:
        """Every device with its figures and processes, or ((), one-line reason)."""

    def holders(self) -> Optional[list[GpuHolder]]:
        """Every process holding memory on any GPU; None when unavailable."""

    def memory(self) -> Optional[GpuMemory]:
        """Holders and memory in use per GPU; None when unavailable."""

    def figures(self, indices: Iterable[int]) -> dict[int, GpuFigures]:
        """Utilization, memory and power of the given GPUs; empty when unavailable."""

    def driver(self) -> DriverInfo:
        """The driver's version and the visible GPUs' names; raises GpuUnavailable."""


def _make_nvml(pcie: bool) -> GpuBackend:
    from gpudeck.jobs.telemetry.gpu.nvml import NvmlGpuSource
    return NvmlGpuSource(pcie=pcie)


def _make_smi(pcie: bool) -> GpuBackend:
    from gpudeck.jobs.telemetry.gpu.nvidia_smi import SmiGpuSource
    return SmiGpuSource()


def _make_simulated(pcie: bool) -> GpuBackend:
    from gpudeck.jobs.telemetry.simulated import SimulatedGpuBackend
    return SimulatedGpuBackend()


# The registry: a kind's name -> how to make one. A new vendor adds its line here and in detect().
_FACTORIES: dict[str, Callable[[bool], GpuBackend]] = {
    "nvml": _make_nvml,
    "nvidia-smi": _make_smi,
    "simulated": _make_simulated,
}
KINDS = tuple(_FACTORIES)


def detect() -> str:
    """The kind that serves this box: NVML where nvidia-ml-py imports, else nvidia-smi.

    Without nvidia-smi either, the nvidia-smi backend is the one that says what is missing (a box
    with a driver has the tool; nvidia-ml-py is what gpudeck installs beside itself).
    """
    from gpudeck.jobs.telemetry.gpu.nvml import binding_installed
    return "nvml" if binding_installed() else "nvidia-smi"


def make_backend(kind: Optional[str] = None, *, pcie: bool = True) -> GpuBackend:
    """A new backend of `kind` (detect()'s when None); `pcie`: read PCIe throughput in the background (NVML)."""
    kind = kind or detect()
    try:
        factory = _FACTORIES[kind]
    except KeyError:
        raise ValueError(f"unknown GPU backend {kind!r} (known: {', '.join(KINDS)})") from None
    return factory(pcie)


_local: Optional[GpuBackend] = None
_local_lock = threading.Lock()


def local() -> GpuBackend:
    """This process's shared backend for one-off questions (who holds memory, the driver): made once."""
    global _local
    with _local_lock:
        if _local is None:
            _local = make_backend(pcie=False)
        return _local


def visible_devices_env(gpus: Iterable[int], backend: Optional[GpuBackend] = None) -> dict[str, str]:
    """The environment that limits a job to `gpus` ({} when it declares none), in this box's vendor's variable."""
    chosen = [str(int(g)) for g in gpus]
    if not chosen:
        return {}
    var = backend.visible_devices_var if backend is not None else _VISIBLE_DEVICES_VAR[detect()]
    return {var: ",".join(chosen)}


# Without making a backend (the supervisor sets a job's environment before any GPU is asked).
_VISIBLE_DEVICES_VAR = {"nvml": "CUDA_VISIBLE_DEVICES", "nvidia-smi": "CUDA_VISIBLE_DEVICES",
                        "simulated": "CUDA_VISIBLE_DEVICES"}
