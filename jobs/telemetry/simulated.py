"""The SIMULATED box behind `--demo` and the tests: 8 H200-class GPUs serving vLLM, a big host, its ports.

Every value is a pure function of (seed, step): the same seed and step always give
the same snapshot, so snapshot tests are stable. Everything is marked simulated.
"""
from __future__ import annotations

import math
import random
from typing import Iterable, Optional

from gpudeck.jobs.telemetry.gpu import DriverInfo, GpuFigures, GpuHolder, GpuMemory
from gpudeck.jobs.telemetry.snapshot import GpuProcess, GpuSample, HostSample, PortListener, ProcInfo, Snapshot

GPU_COUNT = 8
GPU_NAME = "NVIDIA H200"
MiB = 1024 ** 2
GiB = 1024 ** 3
TiB = 1024 ** 4
GPU_MEM_TOTAL = 143_771 * MiB          # what NVML reports for a 141 GB H200
GPU_POWER_LIMIT_W = 700.0
HOST_NAME = "h200-sim-01"
HOST_CPUS = 192                        # 2 sockets x 96 cores
HOST_MEM_TOTAL = 2 * TiB
STEP_S = 1.0                           # simulated seconds per step (ages and uptimes advance by this)

# How long the simulated vLLM had been up at step 0 (it is past its 35-minute weight load).
_VLLM_UPTIME_AT_STEP0_S = 2 * 3600 + 17 * 60
_SSHD_UPTIME_AT_STEP0_S = 41 * 86400

MODEL = "/models/kimi-k2-instruct-int4"
_API_PID = 48213
_ENGINE_PID = 48391
_WORKER_PID0 = 48502
_SSHD_PID = 1187
_NODE_EXPORTER_PID = 1422
_RESOLVED_PID = 811
# A PID NVML reports but this /proc cannot see (another container): shown as unknown, never guessed.
_FOREIGN_PID = 3_141_592

_VLLM_CMDLINE = (f"/opt/venv/bin/python3 -m vllm.entrypoints.openai.api_server --model {MODEL} "
                 "--tensor-parallel-size 8 --gpu-memory-utilization 0.92 --max-model-len 131072 "
                 "--port 8000 --trust-remote-code")


def _rng(seed: int, step: int, *parts: object) -> random.Random:
    # String seeds hash with SHA-512 inside random: stable across runs and Python builds.
    return random.Random(f"gpudeck-sim:{seed}:{step}:" + ":".join(map(str, parts)))


def traffic(seed: int, step: int) -> float:
    """Serving load in [0, 1] at `step`: slow waves of requests plus a lull every 10 minutes."""
    if step % 600 >= 540:
        return 0.0                                   # a minute with no requests: GPUs idle
    phase = (seed % 97) * 0.1
    t = step * STEP_S
    wave = 0.58 + 0.25 * math.sin(2 * math.pi * t / 180 + phase) + 0.12 * math.sin(2 * math.pi * t / 47 + 2 * phase)
    jitter = _rng(seed, step, "traffic").uniform(-0.06, 0.06)
    return min(1.0, max(0.03, wave + jitter))


def _warmth(seed: int, step: int) -> float:
    """Traffic smoothed over the last 30 s: temperature lags load."""
    return sum(traffic(seed, s) for s in range(max(0, step - 29), step + 1)) / min(30, step + 1)


class SimulatedBox:
    """Produces whole simulated Snapshots; `snapshot(step, now)` is pure."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        uuid_rng = random.Random(f"gpudeck-sim-uuid:{seed}")
        self._uuids = tuple(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}".format(
                uuid_rng.getrandbits(32), uuid_rng.getrandbits(16), uuid_rng.getrandbits(16),
                uuid_rng.getrandbits(16), uuid_rng.getrandbits(48))
            for _ in range(GPU_COUNT))
        self._worker_mem = tuple(int((126.8 + 0.05 * i) * GiB) for i in range(GPU_COUNT))

    # -- processes -----------------------------------------------------------------------
    def _proc(self, pid: int, name: str, cmdline: str, user: str, cpu: float, rss: int, age: float) -> ProcInfo:
        return ProcInfo(pid=pid, name=name, cmdline=cmdline, user=user, cpu_percent=round(cpu, 1),
                        rss=rss, age_s=age, known=True)

    def _worker(self, i: int, step: int, load: float) -> ProcInfo:
        r = _rng(self.seed, step, "worker", i)
        age = _VLLM_UPTIME_AT_STEP0_S - 40 + step * STEP_S
        # Workers busy-poll their CUDA stream: a full core whenever requests are in flight.
        cpu = (97.0 + r.uniform(0, 3.0)) if load > 0 else r.uniform(0.5, 2.0)
        return self._proc(_WORKER_PID0 + i, f"VLLM::Worker_TP{i}", f"VLLM::Worker_TP{i}", "ops",
                          cpu, int(9.4 * GiB) + i * 3 * MiB, age)

    def _api_server(self, step: int, load: float) -> ProcInfo:
        r = _rng(self.seed, step, "api")
        return self._proc(_API_PID, "python3", _VLLM_CMDLINE, "ops", 8 + 30 * load + r.uniform(0, 4),
                          int(6.1 * GiB), _VLLM_UPTIME_AT_STEP0_S + step * STEP_S)

    def _engine_core(self, step: int, load: float) -> ProcInfo:
        r = _rng(self.seed, step, "engine")
        return self._proc(_ENGINE_PID, "VLLM::EngineCor", "VLLM::EngineCore", "ops",
                          (99.0 + r.uniform(0, 1.0)) if load > 0 else r.uniform(1, 4),
                          int(14.2 * GiB), _VLLM_UPTIME_AT_STEP0_S - 20 + step * STEP_S)

    # -- GPUs ----------------------------------------------------------------------------
    def _gpu(self, i: int, step: int, load: float, warmth: float) -> GpuSample:
        r = _rng(self.seed, step, "gpu", i)
        idle = load == 0.0
        # Tensor parallelism keeps the 8 GPUs in lockstep: same load, small per-GPU noise.
        util = 0.0 if idle else min(100.0, max(0.0, 100 * load + r.uniform(-4, 4)))
        hot_spot = 6.0 if i == 5 else 0.0            # one GPU sits in a worse airflow slot
        temp = 31.0 + hot_spot + 41.0 * warmth + r.uniform(-0.8, 0.8)
        power = 118.0 + 560.0 * (util / 100.0) ** 1.2 + r.uniform(-6, 6)
        throttle: tuple[str, ...]
        if idle:
            throttle = ("gpu_idle",)
            sm_clock = 345
        elif power > 0.93 * GPU_POWER_LIMIT_W:
            throttle = ("sw_power_cap",)
            sm_clock = 1755 + int(r.uniform(-40, 40))
        else:
            throttle = ()
            sm_clock = 1980
        worker = self._worker(i, step, load)
        procs = [GpuProcess(pid=worker.pid, mem_used=self._worker_mem[i], sm_util=round(util), proc=worker)]
        if i == GPU_COUNT - 1:
            procs.append(GpuProcess(pid=_FOREIGN_PID, mem_used=512 * MiB, sm_util=None,
                                    proc=ProcInfo(pid=_FOREIGN_PID, known=False)))
        # The driver and CUDA contexts hold some memory no process is charged for.
        mem_used = sum(p.mem_used or 0 for p in procs) + 570 * MiB
        return GpuSample(
            index=i,
            name=GPU_NAME,
            uuid=self._uuids[i],
            util=round(util, 1),
            mem_util=round(util * 0.62, 1),
            mem_used=mem_used,
            mem_total=GPU_MEM_TOTAL,
            temp=round(temp, 1),
            power_w=round(min(power, GPU_POWER_LIMIT_W), 1),
            power_limit_w=GPU_POWER_LIMIT_W,
            sm_clock_mhz=sm_clock,
            mem_clock_mhz=3201,
            fan_pct=None,                            # passively cooled: NVML says NotSupported
            throttle_reasons=throttle,
            compute_capability="9.0",
            pcie_rx_bps=round((0.3 + 2.5 * load) * 1e9 * (1 + r.uniform(-0.1, 0.1))),
            pcie_tx_bps=round((0.2 + 1.1 * load) * 1e9 * (1 + r.uniform(-0.1, 0.1))),
            processes=tuple(procs),
            simulated=True,
        )

    # -- host and ports ------------------------------------------------------------------
    def _host(self, step: int, load: float) -> HostSample:
        r = _rng(self.seed, step, "host")
        busy_cores = 10 if load > 0 else 0           # API server, engine core, 8 workers
        per_core = []
        for c in range(HOST_CPUS):
            if c < busy_cores:
                per_core.append(round(r.uniform(94.0, 100.0), 1))
            else:
                per_core.append(round(r.uniform(0.0, 6.0), 1))
        total = sum(per_core) / HOST_CPUS
        load1 = 1.2 + busy_cores + r.uniform(-0.3, 0.3)
        mem_used = int(612 * GiB + 4 * GiB * math.sin(step / 300))
        return HostSample(
            name=HOST_NAME,
            cpu_percent=round(total, 2),
            cpu_per_core=tuple(per_core),
            cpu_count=HOST_CPUS,
            load_avg=(round(load1, 2), round(load1 * 0.97, 2), round(load1 * 0.93, 2)),
            mem_total=HOST_MEM_TOTAL,
            mem_used=mem_used,
            mem_available=HOST_MEM_TOTAL - mem_used,
            swap_total=0,
            swap_used=0,
            disk_read_bps=round(r.uniform(0.2, 3.0) * 1e6),
            disk_write_bps=round((1.5 + 4.0 * load) * 1e6 * (1 + r.uniform(-0.2, 0.2))),
            net_rx_bps=round((0.1 + 2.0 * load) * 1e6 * (1 + r.uniform(-0.2, 0.2))),
            net_tx_bps=round((0.2 + 9.0 * load) * 1e6 * (1 + r.uniform(-0.2, 0.2))),
        )

    def _ports(self, step: int, api: ProcInfo, engine: ProcInfo) -> tuple[PortListener, ...]:
        sshd = self._proc(_SSHD_PID, "sshd", "sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups",
                          "root", 0.0, 9 * MiB, _SSHD_UPTIME_AT_STEP0_S + step * STEP_S)
        exporter = self._proc(_NODE_EXPORTER_PID, "node_exporter",
                              "/usr/local/bin/node_exporter --web.listen-address=:9100", "nobody",
                              0.3, 31 * MiB, _SSHD_UPTIME_AT_STEP0_S - 5 + step * STEP_S)
        resolved = self._proc(_RESOLVED_PID, "systemd-resolve", "/lib/systemd/systemd-resolved",
                              "systemd-resolve", 0.0, 12 * MiB, _SSHD_UPTIME_AT_STEP0_S + 3 + step * STEP_S)
        listeners = [
            PortListener(22, "0.0.0.0", sshd.pid, sshd.name, sshd),
            PortListener(22, "::", sshd.pid, sshd.name, sshd),
            PortListener(53, "127.0.0.53", resolved.pid, resolved.name, resolved),
            PortListener(8000, "0.0.0.0", api.pid, api.name, api),
            PortListener(9100, "::", exporter.pid, exporter.name, exporter),
            # vLLM's internal ZMQ channel between the API server and the engine core.
            PortListener(41733, "127.0.0.1", engine.pid, engine.name, engine),
        ]
        return tuple(listeners)

    # -- the whole box -------------------------------------------------------------------
    def snapshot(self, step: int, now: Optional[float] = None) -> Snapshot:
        """The box at `step` (time = `now`, or a fixed epoch + step seconds)."""
        load = traffic(self.seed, step)
        warmth = _warmth(self.seed, step)
        api = self._api_server(step, load)
        engine = self._engine_core(step, load)
        return Snapshot(
            time=now if now is not None else SIM_EPOCH + step * STEP_S,
            host=self._host(step, load),
            gpus=tuple(self._gpu(i, step, load, warmth) for i in range(GPU_COUNT)),
            gpu_error=None,
            ports=self._ports(step, api, engine),
            simulated=True,
        )


SIM_EPOCH = 1_790_000_000.0            # a fixed wall-clock origin for simulated snapshots without a clock


class SimulatedGpuBackend:
    """The SIMULATED box's GPUs as a GpuBackend: each call advances one step; every answer says SIMULATED."""

    kind = "simulated"
    label = "SIMULATED"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"

    def __init__(self, seed: int = 0, start_step: int = 0) -> None:
        self._box = SimulatedBox(seed)
        self._step = start_step

    def _gpus(self) -> tuple[GpuSample, ...]:
        load = traffic(self._box.seed, self._step)
        warmth = _warmth(self._box.seed, self._step)
        gpus = tuple(self._box._gpu(i, self._step, load, warmth) for i in range(GPU_COUNT))
        self._step += 1
        return gpus

    @property
    def error(self) -> Optional[str]:
        return None

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def available(self) -> bool:
        return True

    def read(self) -> tuple[tuple[GpuSample, ...], Optional[str]]:
        return self._gpus(), None

    def holders(self) -> list[GpuHolder]:
        return [GpuHolder(gpu=g.index, pid=p.pid, mem_used=p.mem_used) for g in self._gpus() for p in g.processes]

    def memory(self) -> GpuMemory:
        gpus = self._gpus()
        return GpuMemory(holders=tuple(GpuHolder(gpu=g.index, pid=p.pid, mem_used=p.mem_used)
                                       for g in gpus for p in g.processes),
                         used={g.index: g.mem_used for g in gpus if g.mem_used is not None})

    def figures(self, indices: Iterable[int]) -> dict[int, GpuFigures]:
        wanted = set(indices)
        return {g.index: GpuFigures(util=g.util, mem_used=g.mem_used, power_w=g.power_w,
                                    power_limit_w=g.power_limit_w)
                for g in self._gpus() if g.index in wanted}

    def driver(self) -> DriverInfo:
        return DriverInfo(version="SIMULATED", names=(f"{GPU_NAME} (SIMULATED)",) * GPU_COUNT)
