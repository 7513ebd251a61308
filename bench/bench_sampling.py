"""Bench: CPU time per sampling tick (demo box, live sampler, real NVML when present). Prints a table only.

    .venv/bin/python bench/bench_sampling.py [--ticks N]
    .venv/bin/python bench/bench_sampling.py --parts [--ticks N] [--interval S]   # where a tick's CPU goes

CPU time is this process's time.process_time() over N ticks (all threads), so a
source that blocks without burning CPU (none should) would not show here; wall time
is printed beside it. Budget: < 5 ms CPU per tick + 1 ms per GPU.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudeck.jobs.telemetry import gpu as gpu_seam  # noqa: E402
from gpudeck.jobs.telemetry.history import History  # noqa: E402
from gpudeck.jobs.telemetry.sampler import LiveSampler, make_sampler  # noqa: E402


def fake_nvml(gpus: int, pids: list[int]):
    """An in-process stand-in for pynvml with `gpus` H200-like devices: measures gpudeck's own
    overhead per GPU on a machine without one (the driver's share is measured on real hardware)."""
    import types

    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

    def not_found(*_):
        raise NVMLError(6)

    def not_supported(*_):
        raise NVMLError(3)

    m.NVMLError = NVMLError
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=97, memory=60)
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=130 * 2 ** 30, total=140 * 2 ** 30)
    m.nvmlDeviceGetTemperature = lambda h, s: 61
    m.nvmlDeviceGetPowerUsage = lambda h: 612_000
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    m.nvmlDeviceGetClockInfo = lambda h, c: 1980
    m.nvmlDeviceGetFanSpeed = not_supported
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0
    m.nvmlDeviceGetComputeRunningProcesses_v3 = lambda h: [SimpleNamespace(pid=pids[h], usedGpuMemory=129 * 2 ** 30)]
    m.nvmlDeviceGetProcessUtilization = not_found
    m.nvmlDeviceGetPcieThroughput = lambda h, c: 1000
    return m


def measure(sampler, ticks: int, history: History | None = None) -> tuple[float, float, int]:
    snap = sampler.sample()                  # warm-up: NVML init, first /proc walk, psutil priming
    if history is not None:
        history.add(snap)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(ticks):
        snap = sampler.sample()
        if history is not None:
            history.add(snap)
    cpu = (time.process_time() - cpu0) / ticks * 1000
    wall = (time.perf_counter() - wall0) / ticks * 1000
    return cpu, wall, len(snap.gpus)




def parts(ticks: int, interval: float) -> int:
    """The shipped sampler, one sample every `interval` s (as the console takes them): this thread's
    CPU per sample, split by part (host, GPUs, ports, process details) and by NVML call."""
    sampler = make_sampler()
    spent: dict[str, list[float]] = {}

    def timed(owner, name: str, label: str) -> None:
        call = getattr(owner, name, None)
        if call is None:
            return

        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                entry = spent.setdefault(label, [0.0, 0])
                entry[0] += time.thread_time() - start
                entry[1] += 1
        setattr(owner, name, wrapper)

    timed(sampler, "_read_host", "host (psutil, /proc)")
    timed(sampler, "_attach_procs", "process details (/proc)")
    timed(sampler._ports, "read", "listening ports")
    timed(sampler._gpu, "read", "GPUs (NVML), all of it")
    # One level down: each psutil and /proc reader the host, port and process parts call.
    import psutil
    from gpudeck.jobs.telemetry import ports as ports_module
    for name in ("cpu_times", "virtual_memory", "swap_memory", "disk_io_counters", "net_io_counters"):
        timed(psutil, name, f"  psutil.{name}")
    for name in ("read_sock_diag_listeners", "read_proc_net_listeners", "map_socket_inodes", "_process_name"):
        timed(ports_module, name, f"  ports.{name}")
    for name in ("gpu_info", "info", "prune"):
        timed(sampler._procs, name, f"  ProcTable.{name}")
    if gpu_seam.local().available():
        import pynvml
        for name in sorted(n for n in dir(pynvml) if n.startswith("nvmlDeviceGet")):
            timed(pynvml, name, f"  {name}")
    try:
        sampler.sample()
        time.sleep(interval)
        spent.clear()
        start = time.thread_time()
        for _ in range(ticks):
            snap = sampler.sample()
            time.sleep(interval)
        total = (time.thread_time() - start) / ticks * 1000
    finally:
        sampler.close()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"{ticks} samples {interval:g} s apart; GPUs {len(snap.gpus)}, GPU processes "
          f"{sum(len(g.processes) for g in snap.gpus)}, listening ports {len(snap.ports)}")
    print(f"{'part':<52} {'CPU ms/sample':>13} {'calls/sample':>12}")
    print(f"{'the whole sample (this thread)':<52} {total:>13.3f} {1:>12}")
    for label, (cpu, calls) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        print(f"{label:<52} {cpu / ticks * 1000:>13.3f} {calls / ticks:>12.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--parts", action="store_true", help="split the shipped sampler's CPU by part and NVML call")
    parser.add_argument("--interval", type=float, default=0.5, help="--parts: seconds between samples")
    args = parser.parse_args()
    if args.parts:
        return parts(args.ticks, args.interval)

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{len(os.listdir('/proc')) if os.path.isdir('/proc') else '?'} /proc entries; ticks per row: {args.ticks}")
    rows = []

    base = {"cpu": 0.0}

    def run(label, sampler, with_history=False, marginal=True):
        try:
            cpu, wall, gpus = measure(sampler, args.ticks, History() if with_history else None)
        finally:
            sampler.close()
        budget = 5.0 + gpus
        # Per GPU: what each GPU adds over the same sampler with no GPU source.
        per_gpu = (cpu - base["cpu"]) / gpus if gpus and marginal else (cpu / gpus if gpus else None)
        rows.append((label, gpus, cpu, wall, per_gpu, budget))
        return cpu

    run("demo (SimulatedBox), total/8", make_sampler(demo=True), marginal=False)
    run("demo + History.add", make_sampler(demo=True), with_history=True, marginal=False)
    base["cpu"] = run("live, no GPU source (host+ports+procs)", LiveSampler(gpu_source=_NoGpu()))
    run("live: make_sampler() as shipped", make_sampler())
    run("live + History.add", make_sampler(), with_history=True)
    # One real process per GPU (as vLLM's TP workers are), so per-process /proc reads are counted.
    workers = [subprocess.Popen(["sleep", "600"]) for _ in range(8)]
    try:
        for n in (1, 8):
            run(f"live, fake in-process NVML x{n}", LiveSampler(gpu_source=_fake_source(n, [w.pid for w in workers])))
    finally:
        for w in workers:
            w.kill()
            w.wait()
    if gpu_seam.local().available():
        run("live, real NVML (PCIe thread on)", make_sampler())
        run("live, real NVML (PCIe thread off)", LiveSampler(pcie=False))
    else:
        print("real NVML: not present on this machine (row omitted)")

    print()
    print(f"{'sampler':<40} {'GPUs':>4} {'CPU ms/tick':>11} {'wall ms/tick':>12} {'+CPU ms/GPU':>11} "
          f"{'budget ms':>9}  ok")
    for label, gpus, cpu, wall, per_gpu, budget in rows:
        per = f"{per_gpu:.3f}" if per_gpu is not None else "-"
        print(f"{label:<40} {gpus:>4} {cpu:>11.3f} {wall:>12.3f} {per:>11} {budget:>9.0f}  "
              f"{'yes' if cpu < budget else 'NO'}")
    return 0


class _NoGpu:
    def read(self):
        return (), "bench: GPU source disabled"

    def close(self):
        pass


def _fake_source(n: int, pids: list[int]):
    from gpudeck.jobs.telemetry.gpu.nvml import NvmlGpuSource
    return NvmlGpuSource(fake_nvml(n, pids), pcie=False)


if __name__ == "__main__":
    raise SystemExit(main())
