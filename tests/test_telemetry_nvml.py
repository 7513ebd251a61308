"""NVML source against a fake pynvml module: error wrapper, NotSupported probing, unknown PIDs, no driver."""
from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from gpudeck.jobs.telemetry.gpu.nvml import PROC_UTIL_INTERVAL_S, NvmlGpuSource, decode_throttle_reasons
from gpudeck.jobs.telemetry.sampler import LiveSampler
from runsupport import own_cmdline

NOT_SUPPORTED = 3
NOT_FOUND = 6
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
GiB = 1024 ** 3


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def make_fake_nvml(*, count: int = 2, init_error: int | None = None, unsupported: set[str] = frozenset(),
                   pids: dict[int, list[tuple[int, int]]] | None = None, util_samples=None) -> types.ModuleType:
    """A pynvml stand-in. `unsupported` names functions that raise NotSupported; calls are counted."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.calls = {}
    m.shutdowns = 0
    pids = pids or {}

    def counted(name, fn):
        def wrapper(*args):
            m.calls[name] = m.calls.get(name, 0) + 1
            if name in unsupported:
                raise FakeNVMLError(NOT_SUPPORTED)
            return fn(*args)
        setattr(m, name, wrapper)

    def init():
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def shutdown():
        m.shutdowns += 1

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    counted("nvmlDeviceGetCount", lambda: count)
    counted("nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    counted("nvmlDeviceGetName", lambda h: b"NVIDIA H200")
    counted("nvmlDeviceGetUUID", lambda h: f"GPU-fake-{h[1]}")
    counted("nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0))
    counted("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=40 + h[1], memory=12))
    counted("nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=(10 + h[1]) * GiB, total=140 * GiB,
                                                                 free=(130 - h[1]) * GiB))
    counted("nvmlDeviceGetTemperature", lambda h, sensor: 51)
    counted("nvmlDeviceGetPowerUsage", lambda h: 312_500)
    counted("nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000)
    counted("nvmlDeviceGetClockInfo", lambda h, clock: {1: 1980, 2: 3201}[clock])
    counted("nvmlDeviceGetFanSpeed", lambda h: 30)
    counted("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4 | 0x20 | 0x8000)
    counted("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: 0x1)
    counted("nvmlDeviceGetComputeRunningProcesses_v3",
            lambda h: [SimpleNamespace(pid=p, usedGpuMemory=mem) for p, mem in pids.get(h[1], [])])
    counted("nvmlDeviceGetComputeRunningProcesses",
            lambda h: [SimpleNamespace(pid=p, usedGpuMemory=mem) for p, mem in pids.get(h[1], [])])

    def proc_util(h, ts):
        samples = (util_samples or {}).get(h[1])
        if not samples:
            raise FakeNVMLError(NOT_FOUND)          # what NVML says when there are no new samples
        return [SimpleNamespace(pid=p, timeStamp=t, smUtil=u) for p, t, u in samples]
    counted("nvmlDeviceGetProcessUtilization", proc_util)
    counted("nvmlDeviceGetPcieThroughput", lambda h, counter: 1000 if counter == 1 else 500)
    return m


def test_fields_read_and_converted():
    nvml = make_fake_nvml(count=2, pids={0: [(os.getpid(), 3 * GiB)]},
                          util_samples={0: [(os.getpid(), 100, 20), (os.getpid(), 200, 37)]})
    src = NvmlGpuSource(nvml, pcie=False)
    gpus, error = src.read()
    assert error is None
    assert [g.index for g in gpus] == [0, 1]
    g = gpus[0]
    assert (g.name, g.uuid, g.compute_capability) == ("NVIDIA H200", "GPU-fake-0", "9.0")
    assert (g.util, g.mem_util, g.mem_used, g.mem_total) == (40.0, 12.0, 10 * GiB, 140 * GiB)
    assert (g.temp, g.power_w, g.power_limit_w) == (51.0, 312.5, 700.0)
    assert (g.sm_clock_mhz, g.mem_clock_mhz, g.fan_pct) == (1980, 3201, 30.0)
    assert g.throttle_reasons == ("sw_power_cap", "sw_thermal", "unknown_0x8000")
    assert g.simulated is False
    (p,) = g.processes
    assert (p.pid, p.mem_used, p.sm_util) == (os.getpid(), 3 * GiB, 37.0)   # the newest sample wins
    assert gpus[1].processes == ()
    src.close()
    assert nvml.shutdowns == 1


def test_not_supported_fields_become_none_and_are_never_asked_again():
    nvml = make_fake_nvml(count=1, unsupported={
        "nvmlDeviceGetFanSpeed", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCurrentClocksEventReasons"})
    src = NvmlGpuSource(nvml, pcie=False)
    for _ in range(5):
        gpus, error = src.read()
    assert error is None
    g = gpus[0]
    assert g.fan_pct is None and g.power_w is None
    assert g.util == 40.0 and g.temp == 51.0            # the supported fields still arrive
    assert g.throttle_reasons == ("gpu_idle",)          # fell back to the pre-R535 name
    assert nvml.calls["nvmlDeviceGetFanSpeed"] == 1
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1
    assert nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 5
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 5   # v3 missing: older call used
    assert {"fan", "power", "procs_v3", "throttle_event"} <= src.unsupported_fields(0)


def test_function_missing_from_old_pynvml_is_unsupported():
    nvml = make_fake_nvml(count=1)
    del nvml.nvmlDeviceGetCurrentClocksEventReasons
    src = NvmlGpuSource(nvml, pcie=False)
    gpus, _ = src.read()
    assert gpus[0].throttle_reasons == ("gpu_idle",)
    assert "throttle_event" in src.unsupported_fields(0)


def test_transient_error_is_none_but_asked_again():
    nvml = make_fake_nvml(count=1)
    flaky = {"n": 0}

    def temp(h, sensor):
        flaky["n"] += 1
        if flaky["n"] == 1:
            raise FakeNVMLError(GPU_IS_LOST)
        return 60
    nvml.nvmlDeviceGetTemperature = temp
    src = NvmlGpuSource(nvml, pcie=False)
    assert src.read()[0][0].temp is None
    assert src.read()[0][0].temp == 60.0
    assert "temp" not in src.unsupported_fields(0)


def test_no_process_util_samples_is_not_unsupported():
    nvml = make_fake_nvml(count=1, pids={0: [(4242, GiB)]})
    clock = [100.0]
    src = NvmlGpuSource(nvml, pcie=False, monotonic=lambda: clock[0])
    for _ in range(3):
        gpus, _ = src.read()
        clock[0] += PROC_UTIL_INTERVAL_S
    assert gpus[0].processes[0].sm_util is None
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 3


def test_process_util_is_asked_at_most_every_interval_and_shown_between():
    # ~2 ms of CPU a call on an H200: once every PROC_UTIL_INTERVAL_S, whatever the refresh.
    pid = os.getpid()
    samples = {0: [(pid, 100, 20)]}
    nvml = make_fake_nvml(count=1, pids={0: [(pid, GiB)]}, util_samples=samples)
    clock = [100.0]
    src = NvmlGpuSource(nvml, pcie=False, monotonic=lambda: clock[0])
    seen = []
    for _ in range(9):                        # 4 s of ticks at a 0.5 s refresh
        samples[0] = [(pid, int(clock[0] * 1e6), clock[0])]   # a new sample each tick, SM% = time
        seen.append(src.read()[0][0].processes[0].sm_util)
        clock[0] += 0.5
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 3          # at 100.0, 102.0, 104.0
    assert seen == [100.0] * 4 + [102.0] * 4 + [104.0]


@pytest.mark.parametrize("code, expected", [
    (LIBRARY_NOT_FOUND, "NVIDIA driver not found (libnvidia-ml.so.1 missing)"),
    (9, "NVIDIA driver not loaded (kernel module absent)"),
])
def test_init_failure_is_one_line_reason(code, expected):
    src = NvmlGpuSource(make_fake_nvml(init_error=code), pcie=False)
    assert src.read() == ((), expected)


def test_zero_gpus_says_so():
    nvml = make_fake_nvml(count=0)
    assert NvmlGpuSource(nvml, pcie=False).read() == ((), "no NVIDIA GPU visible")
    assert nvml.shutdowns == 1


def test_pcie_is_read_in_the_background_and_converted_to_bytes():
    nvml = make_fake_nvml(count=1)
    src = NvmlGpuSource(nvml, pcie=True, pcie_interval_s=0.01)
    try:
        import time
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            g = src.read()[0][0]
            if g.pcie_rx_bps is not None:
                break
            time.sleep(0.01)
        assert (g.pcie_rx_bps, g.pcie_tx_bps) == (1000 * 1024.0, 500 * 1024.0)
    finally:
        src.close()


def test_unknown_pid_is_labelled_not_guessed(monkeypatch):
    # The sampler imports pynvml itself: the fake is installed the way a test double would be.
    foreign = 4_000_000            # above any pid_max: certainly not a process here
    nvml = make_fake_nvml(count=1, pids={0: [(os.getpid(), 2 * GiB), (foreign, GiB)]})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = LiveSampler(clock=lambda: 123.0, pcie=False)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    assert snap.gpu_error is None and snap.time == 123.0
    procs = {p.pid: p for p in snap.gpus[0].processes}
    mine, theirs = procs[os.getpid()], procs[foreign]
    assert theirs.proc.known is False and theirs.proc.cmdline is None and theirs.mem_used == GiB
    # Our own process is only trusted here if this is the host PID namespace or it holds /dev/nvidia*.
    from gpudeck.jobs.telemetry.procs import in_host_pid_namespace
    if in_host_pid_namespace():
        assert mine.proc.known is True and mine.proc.cmdline == own_cmdline()
    else:
        assert mine.proc.known is False


def test_throttle_decoding():
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(None) == ()
    assert decode_throttle_reasons(0x1 | 0x40 | 0x80) == ("gpu_idle", "hw_thermal", "hw_power_brake")


def test_read_after_close_does_not_restart_nvml():
    nvml = make_fake_nvml(count=1)
    inits = {"n": 0}
    real_init = nvml.nvmlInit

    def counting_init():
        inits["n"] += 1
        real_init()
    nvml.nvmlInit = counting_init
    src = NvmlGpuSource(nvml, pcie=False)
    assert src.read()[1] is None
    src.close()
    assert src.read() == ((), "GPU source closed")
    assert inits["n"] == 1 and nvml.shutdowns == 1


def test_memory_used_is_counted_as_nvidia_smi_does_when_the_v2_call_exists():
    # NVML v1 counts the driver's reserved memory as used (an idle H200 shows ~600 MiB);
    # nvidia-smi and the v2 call do not. gpudeck must agree with nvidia-smi.
    nvml = make_fake_nvml(count=1)
    nvml.nvmlMemory_v2 = 0x2000028
    v1 = nvml.nvmlDeviceGetMemoryInfo

    def memory_info(handle, version=None):
        if version is None:
            return v1(handle)
        assert version == nvml.nvmlMemory_v2
        return SimpleNamespace(used=4 * 2**20, total=140 * GiB, free=140 * GiB - 604 * 2**20, reserved=600 * 2**20)

    nvml.nvmlDeviceGetMemoryInfo = memory_info
    src = NvmlGpuSource(nvml, pcie=False)
    (g,), _ = src.read()
    assert g.mem_used == 4 * 2**20


def test_memory_falls_back_to_v1_where_the_binding_has_no_v2():
    nvml = make_fake_nvml(count=1)
    nvml.nvmlMemory_v2 = 0x2000028          # advertised, but the function takes no version
    src = NvmlGpuSource(nvml, pcie=False)
    for _ in range(3):
        (g,), _ = src.read()
    assert g.mem_used == 10 * GiB
    assert "mem_v2" in src.unsupported_fields(0)


def test_open_initialises_once_ahead_of_the_first_read_and_never_raises():
    nvml = make_fake_nvml(count=1)
    src = NvmlGpuSource(nvml, pcie=False)
    src.open()
    assert nvml.calls.get("nvmlDeviceGetCount") == 1        # NVML is up before any read
    assert src.read()[1] is None
    assert nvml.calls.get("nvmlDeviceGetCount") == 1        # the read did not initialise again
    src.close()
    broken = NvmlGpuSource(make_fake_nvml(init_error=9), pcie=False)
    broken.open()                                            # a failed init is read()'s to report
    assert broken.read() == ((), "NVIDIA driver not loaded (kernel module absent)")
