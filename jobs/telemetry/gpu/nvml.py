"""The NVML GPU backend: one lazy NVML session, cached handles, every call through one error wrapper.

The only module of gpudeck that imports pynvml (nvidia-ml-py); everything else asks the seam
(`gpudeck.jobs.telemetry.gpu`).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Optional

from gpudeck.jobs.telemetry.gpu import DriverInfo, GpuFigures, GpuHolder, GpuMemory, GpuUnavailable
from gpudeck.jobs.telemetry.snapshot import GpuProcess, GpuSample

# NVML return codes (stable ABI values; spelled out so a fake module need not define them).
_ERR_UNINITIALIZED = 1
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13

# A field answering one of these will answer it forever on this driver: never ask again.
_UNSUPPORTED_CODES = frozenset({_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND})

_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2
_PCIE_TX_BYTES = 0
_PCIE_RX_BYTES = 1

# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits (nvml.h).
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clock"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

# Static or slow-moving fields are re-read this rarely (seconds).
_POWER_LIMIT_TTL_S = 30.0
# PCIe throughput blocks ~20 ms per call on an H200: it lives in a background thread. Each call
# also costs ~0.8 ms of CPU there (two a GPU a round), so a round comes every 10 s, not 5.
PCIE_INTERVAL_S = 10.0
# After a failed nvmlInit (driver not loaded yet…), try again no sooner than this.
_INIT_RETRY_S = 30.0
# A per-process util sample older than this is not shown (the process went idle or left).
_PROC_UTIL_MAX_AGE_S = 5.0
# Per-process SM% is asked no more often than this. On an H200 (driver 580) under load one
# nvmlDeviceGetProcessUtilization costs ~2 ms of CPU (pynvml asks the size, then the driver fills
# its whole sample buffer): 2.0-2.2 ms of a 3.5 ms 1 GPU sample, more than every other field together.
PROC_UTIL_INTERVAL_S = 2.0


def binding_installed() -> bool:
    """Whether nvidia-ml-py can be imported here, without importing it (or is imported already)."""
    import importlib.util
    import sys
    if sys.modules.get("pynvml") is not None:
        return True
    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def decode_throttle_reasons(mask: Optional[int]) -> tuple[str, ...]:
    """The clock-event bitmask as names; unknown bits are kept as hex so nothing is hidden."""
    if not mask:
        return ()
    names = []
    known = 0
    for bit, name in THROTTLE_REASON_BITS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    if rest:
        names.append(f"unknown_0x{rest:x}")
    return tuple(names)


def describe_init_error(exc: BaseException) -> str:
    """One line saying why NVML is unusable, for Snapshot.gpu_error."""
    code = getattr(exc, "value", None)
    if code == _ERR_LIBRARY_NOT_FOUND:
        return "NVIDIA driver not found (libnvidia-ml.so.1 missing)"
    if code == _ERR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded (kernel module absent)"
    if code == _ERR_NO_PERMISSION:
        return "no permission to talk to the NVIDIA driver"
    return f"NVML failed to start: {exc}"


class _Device:
    """One GPU's cached handle, its static facts and what its driver cannot answer."""

    __slots__ = ("index", "handle", "name", "uuid", "compute_capability", "unsupported",
                 "power_limit_w", "power_limit_at", "util_ts", "proc_util", "proc_util_at", "proc_util_asked")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.name: Optional[str] = None
        self.uuid: Optional[str] = None
        self.compute_capability: Optional[str] = None
        self.unsupported: set[str] = set()
        self.power_limit_w: Optional[float] = None
        self.power_limit_at = float("-inf")
        self.util_ts = 0                      # last NVML process-util timestamp seen (µs)
        self.proc_util: dict[int, float] = {}
        self.proc_util_at = float("-inf")
        self.proc_util_asked = float("-inf")  # when NVML was last asked for per-process util


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvmlGpuSource:
    """The NVML GpuBackend: reads every visible NVIDIA GPU; nothing but `driver()` raises.

    NVML is initialised on the first call, not at construction, so building a
    sampler is free on machines without a driver. Each (device, field) that answers
    NotSupported / FunctionNotFound is remembered and never called again.
    """

    kind = "nvml"
    label = "NVML"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"

    def __init__(self, nvml: Any = None, *, pcie: bool = True, pcie_interval_s: float = PCIE_INTERVAL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._pcie_enabled = pcie
        self._pcie_interval_s = pcie_interval_s
        self._monotonic = monotonic
        self._devices: list[_Device] = []
        self._initialised = False
        self._error: Optional[str] = None
        self._error_at = float("-inf")
        self._lock = threading.Lock()
        self._pcie: dict[int, tuple[Optional[float], Optional[float]]] = {}
        self._pcie_thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._closed = False
        self.calls = 0                                  # NVML calls made (for benches and tests)

    # -- the one wrapper ---------------------------------------------------------------
    def _call(self, dev: Optional[_Device], field: str, fn_name: str, *args: Any) -> Any:
        """Call one NVML function; any NVMLError becomes None for that field.

        NotSupported / FunctionNotFound (or a pynvml too old to have the function)
        marks the field unsupported for that device so it is never asked again.
        NotFound is *not* unsupported: NVML uses it for "no samples yet".
        """
        if dev is not None and field in dev.unsupported:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            if dev is not None:
                dev.unsupported.add(field)
            return None
        self.calls += 1
        try:
            return fn(*args)
        except self._nvml_error as exc:
            if dev is not None and getattr(exc, "value", None) in _UNSUPPORTED_CODES:
                dev.unsupported.add(field)
            return None

    # -- lifecycle ---------------------------------------------------------------------
    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        now = self._monotonic()
        if self._error is not None and now - self._error_at < _INIT_RETRY_S:
            return False
        self._error_at = now
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py; optional on the runner side and on a remote box
            except ImportError:
                self._error = "nvidia-ml-py is not installed (no pynvml module)"
                return False
            self._nvml = pynvml
        self._nvml_error = getattr(self._nvml, "NVMLError", Exception)
        try:
            self._nvml.nvmlInit()
        except self._nvml_error as exc:
            self._error = describe_init_error(exc)
            return False
        except OSError as exc:                   # a broken libnvidia-ml can raise from ctypes
            self._error = f"NVIDIA driver library could not be loaded: {exc}"
            return False
        count = self._call(None, "count", "nvmlDeviceGetCount")
        if not count:
            self._error = "no NVIDIA GPU visible"
            self._shutdown_quietly()
            return False
        devices = []
        for index in range(count):
            handle = self._call(None, "handle", "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue                          # a lost GPU: the others still count
            devices.append(self._probe(_Device(index, handle)))
        if not devices:
            self._error = f"{count} NVIDIA GPU(s) reported but none could be opened"
            self._shutdown_quietly()
            return False
        self._devices = devices
        self._initialised = True
        self._error = None
        if self._pcie_enabled:
            self._pcie_thread = threading.Thread(target=self._pcie_loop, name="gpudeck-pcie", daemon=True)
            self._pcie_thread.start()
        return True

    def _probe(self, dev: _Device) -> _Device:
        """Read the static facts once; the first read of each live field doubles as its probe."""
        h = dev.handle
        dev.name = _text(self._call(dev, "name", "nvmlDeviceGetName", h))
        dev.uuid = _text(self._call(dev, "uuid", "nvmlDeviceGetUUID", h))
        cc = self._call(dev, "cc", "nvmlDeviceGetCudaComputeCapability", h)
        if cc is not None:
            dev.compute_capability = f"{cc[0]}.{cc[1]}"
        return dev

    def _shutdown_quietly(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-started NVML must not raise
            pass

    def open(self) -> None:
        """Initialise NVML now (the first read() would): lets a caller overlap it with other waiting."""
        with self._lock:
            if not self._closed:
                try:
                    self._ensure_init()
                except Exception:  # noqa: BLE001 - read() reports what is wrong
                    pass

    def close(self) -> None:
        self._stop.set()
        if self._pcie_thread is not None:
            self._pcie_thread.join(timeout=2.0)
            self._pcie_thread = None
        with self._lock:
            self._closed = True
            if self._initialised:
                self._initialised = False
                self._devices = []
                self._shutdown_quietly()

    @property
    def error(self) -> Optional[str]:
        return self._error

    def unsupported_fields(self, index: int) -> frozenset[str]:
        """Fields the driver said it cannot give for GPU `index` (never asked again)."""
        for dev in self._devices:
            if dev.index == index:
                return frozenset(dev.unsupported)
        return frozenset()

    def available(self) -> bool:
        with self._lock:
            return not self._closed and self._ensure_init_quietly()

    def _ensure_init_quietly(self) -> bool:
        try:
            return self._ensure_init()
        except Exception as exc:  # noqa: BLE001 - an odd binding reports, never raises
            self._error = f"NVML failed to start: {exc}"
            return False

    # -- one-off questions (stop, pivot, doctor, the runner's stall samples) ---------------
    def holders(self) -> Optional[list[GpuHolder]]:
        """Every compute and graphics process on every GPU, with its memory; None when NVML is unavailable."""
        with self._lock:
            if self._closed or not self._ensure_init_quietly():
                return None
            found: dict[tuple[int, int], GpuHolder] = {}
            for dev in self._devices:
                for field, getter in (("holders_compute", "nvmlDeviceGetComputeRunningProcesses"),
                                      ("holders_graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
                    for p in self._call(dev, field, getter, dev.handle) or ():
                        mem = getattr(p, "usedGpuMemory", None)
                        if not isinstance(mem, int) or mem < 0 or mem >= 2 ** 63:
                            mem = None        # NVML_VALUE_NOT_AVAILABLE (e.g. no permission in a container)
                        key = (dev.index, int(p.pid))
                        if key not in found or (mem or 0) > (found[key].mem_used or 0):
                            found[key] = GpuHolder(gpu=dev.index, pid=int(p.pid), mem_used=mem)
            return list(found.values())

    def memory(self) -> Optional[GpuMemory]:
        holders = self.holders()
        if holders is None:
            return None
        with self._lock:
            used = {}
            for dev in self._devices:
                mem = self._memory_info(dev, dev.handle)
                if mem is not None:
                    used[dev.index] = int(mem.used)
        return GpuMemory(holders=tuple(holders), used=used)

    def figures(self, indices: Iterable[int]) -> dict[int, GpuFigures]:
        """Utilization, memory and power of the given GPUs. Power tells a hung NCCL collective
        (util pinned at 100 %, near-idle watts) from real work."""
        wanted = set(indices)
        out: dict[int, GpuFigures] = {}
        with self._lock:
            if self._closed or not wanted or not self._ensure_init_quietly():
                return out
            for dev in self._devices:
                if dev.index not in wanted:
                    continue
                h = dev.handle
                util = self._call(dev, "util", "nvmlDeviceGetUtilizationRates", h)
                mem = self._memory_info(dev, h)
                power_mw = self._call(dev, "power", "nvmlDeviceGetPowerUsage", h)
                limit_mw = self._call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
                out[dev.index] = GpuFigures(
                    util=float(util.gpu) if util is not None else None,
                    mem_used=int(mem.used) if mem is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None)
        return out

    def driver(self) -> DriverInfo:
        with self._lock:
            if self._closed or not self._ensure_init_quietly():
                raise GpuUnavailable(self._error or "NVML unavailable")
            version = _text(self._call(None, "driver", "nvmlSystemGetDriverVersion"))
            if version is None:
                raise GpuUnavailable("NVML answered but gave no driver version")
            return DriverInfo(version=version, names=tuple(dev.name or "?" for dev in self._devices))

    # -- sampling ----------------------------------------------------------------------
    def read(self) -> tuple[tuple[GpuSample, ...], Optional[str]]:
        """(one GpuSample per GPU, None) or ((), one-line reason)."""
        with self._lock:
            if self._closed:
                return (), "GPU source closed"
            try:
                if not self._ensure_init():
                    return (), self._error
                now = self._monotonic()
                return tuple(self._read_device(dev, now) for dev in self._devices), None
            except Exception as exc:  # noqa: BLE001 - a sampler must degrade, never crash
                return (), f"NVML read failed: {exc}"

    def _memory_info(self, dev: _Device, handle: Any) -> Any:
        """Memory as nvidia-smi counts it: the v2 call, whose `used` leaves out the driver's
        reserved memory (~600 MiB on an H200); v1 (used = total - free) where v2 is missing."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if version is not None and "mem_v2" not in dev.unsupported:
            self.calls += 1
            try:
                return self._nvml.nvmlDeviceGetMemoryInfo(handle, version)
            except Exception:  # noqa: BLE001 - old driver/binding: never ask v2 again
                dev.unsupported.add("mem_v2")
        return self._call(dev, "mem", "nvmlDeviceGetMemoryInfo", handle)

    def _read_device(self, dev: _Device, now: float) -> GpuSample:
        h = dev.handle
        call = self._call
        util = call(dev, "util", "nvmlDeviceGetUtilizationRates", h)
        mem = self._memory_info(dev, h)
        temp = call(dev, "temp", "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU)
        power_mw = call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        if now - dev.power_limit_at >= _POWER_LIMIT_TTL_S:
            limit_mw = call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
            dev.power_limit_w = limit_mw / 1000.0 if limit_mw is not None else None
            dev.power_limit_at = now
        sm_clock = call(dev, "sm_clock", "nvmlDeviceGetClockInfo", h, _CLOCK_SM)
        mem_clock = call(dev, "mem_clock", "nvmlDeviceGetClockInfo", h, _CLOCK_MEM)
        fan = call(dev, "fan", "nvmlDeviceGetFanSpeed", h)
        reasons = self._throttle_mask(dev)
        rx, tx = self._pcie.get(dev.index, (None, None))
        return GpuSample(
            index=dev.index,
            name=dev.name,
            uuid=dev.uuid,
            util=float(util.gpu) if util is not None else None,
            mem_util=float(util.memory) if util is not None else None,
            mem_used=int(mem.used) if mem is not None else None,
            mem_total=int(mem.total) if mem is not None else None,
            temp=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=dev.power_limit_w,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            mem_clock_mhz=int(mem_clock) if mem_clock is not None else None,
            fan_pct=float(fan) if fan is not None else None,
            throttle_reasons=decode_throttle_reasons(reasons),
            compute_capability=dev.compute_capability,
            pcie_rx_bps=rx,
            pcie_tx_bps=tx,
            processes=self._processes(dev, now),
        )

    def _throttle_mask(self, dev: _Device) -> Optional[int]:
        # The call was renamed "ClocksEvent" in R535; older drivers only have "ClocksThrottle".
        if "throttle_event" not in dev.unsupported:
            mask = self._call(dev, "throttle_event", "nvmlDeviceGetCurrentClocksEventReasons", dev.handle)
            if mask is not None or "throttle_event" not in dev.unsupported:
                return mask
        return self._call(dev, "throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", dev.handle)

    def _running_processes(self, dev: _Device) -> Optional[list[Any]]:
        # v3 carries the MIG instance ids and is what current drivers speak; fall back for older ones.
        for field, fn_name in (("procs_v3", "nvmlDeviceGetComputeRunningProcesses_v3"),
                               ("procs_v2", "nvmlDeviceGetComputeRunningProcesses_v2"),
                               ("procs", "nvmlDeviceGetComputeRunningProcesses")):
            if field in dev.unsupported:
                continue
            procs = self._call(dev, field, fn_name, dev.handle)
            if procs is not None or field not in dev.unsupported:
                return procs
        return None

    def _processes(self, dev: _Device, now: float) -> tuple[GpuProcess, ...]:
        procs = self._running_processes(dev)
        if not procs:
            return ()
        sm = self._process_util(dev, now)
        seen: dict[int, GpuProcess] = {}
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            mem_used = int(used) if used is not None else None
            if pid in seen:                       # one PID per MIG instance: add the memory up
                prev = seen[pid]
                if prev.mem_used is not None and mem_used is not None:
                    mem_used += prev.mem_used
            seen[pid] = GpuProcess(pid=pid, mem_used=mem_used, sm_util=sm.get(pid))
        return tuple(seen.values())

    def _process_util(self, dev: _Device, now: float) -> dict[int, float]:
        if now - dev.proc_util_asked < PROC_UTIL_INTERVAL_S:
            return dev.proc_util                  # the last answer: at most PROC_UTIL_INTERVAL_S old
        dev.proc_util_asked = now
        samples = self._call(dev, "proc_util", "nvmlDeviceGetProcessUtilization", dev.handle, dev.util_ts)
        if samples:
            latest: dict[int, tuple[int, float]] = {}
            for s in samples:
                ts = int(s.timeStamp)
                if ts > dev.util_ts:
                    dev.util_ts = ts
                pid = int(s.pid)
                if pid not in latest or ts >= latest[pid][0]:
                    latest[pid] = (ts, float(s.smUtil))
            dev.proc_util = {pid: util for pid, (_, util) in latest.items()}
            dev.proc_util_at = now
        elif now - dev.proc_util_at > _PROC_UTIL_MAX_AGE_S:
            dev.proc_util = {}                    # NotFound = no new samples: old ones expire
        return dev.proc_util

    # -- PCIe, off the hot path ---------------------------------------------------------
    def _pcie_loop(self) -> None:
        while not self._stop.is_set():
            for dev in list(self._devices):
                if self._stop.is_set():
                    return
                try:
                    rx = self._call(dev, "pcie_rx", "nvmlDeviceGetPcieThroughput", dev.handle, _PCIE_RX_BYTES)
                    tx = self._call(dev, "pcie_tx", "nvmlDeviceGetPcieThroughput", dev.handle, _PCIE_TX_BYTES)
                except Exception:  # noqa: BLE001 - a background reader must not die loudly
                    rx = tx = None
                # NVML reports KB/s.
                self._pcie[dev.index] = (rx * 1024.0 if rx is not None else None,
                                         tx * 1024.0 if tx is not None else None)
            if all({"pcie_rx", "pcie_tx"} <= d.unsupported for d in self._devices):
                return                            # nothing to refresh on this driver
            self._stop.wait(self._pcie_interval_s)
