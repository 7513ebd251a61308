"""Regenerates the SIMULATED run recordings that `gpudeck --demo` replays (jobs/demo_runs/), deterministically.

    .venv/bin/python docs/make_demo_runs.py [--out DIR]

Four runs of the story's box, started together on one simulated clock (5 minutes):
an engine loading 64 weight shards with an ETA, then serving; a relaunch that dies
within seconds on a SyntaxError in a patched file; a kernel build heading for the
host OOM killer at default parallelism, then killed by it; and SGLang loading fast,
then deadlocked (alive, 0% CPU and GPU, port shut, log silent), with the stack dump the
stall takes by itself (stacks/<time>.json + .txt; its verdict joins the alert).

Nothing here fakes the judgement: each simulated second appends the job's output and
a resource sample exactly as the runner writes them (output.log, `times`,
samples.jsonl) and hands the sample to the real HealthMonitor (log analyzer + stall
rules), which writes health.json and the AlertRaised/AlertCleared events. Only the
machine is simulated (host RAM, the listening port, the process tree's numbers), and
the processes py-spy would read: their frames are made up here, in py-spy's JSON shape,
and grouped and judged by the real gpudeck.jobs.stacks (the dump is labelled SIMULATED).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpudeck.jobs import stacks  # noqa: E402
from gpudeck.jobs.health import DUMP_ON, HealthMonitor  # noqa: E402
from gpudeck.jobs.procs import ProcessId  # noqa: E402
from gpudeck.jobs.runs import append_jsonl, write_json_atomic  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import spec_snapshot  # noqa: E402

BASE = 1_800_000_000.0          # 2027-01-15 08:00:00 UTC: a fixed clock, so the files never change
DURATION = 300                  # seconds recorded
GIB = 1024 ** 3
CPU_COUNT = 64                  # the simulated host's cores (the OOM rule suggests MAX_JOBS from them)
MEM_TOTAL = 128 * GIB
DEFAULT_OUT = REPO / "jobs" / "demo_runs"

JOBS_TOML = """\
# The SIMULATED box of `gpudeck --demo` (docs/make_demo_runs.py): the jobs its recordings come from.

[jobs.vllm-k2]
engine = "vllm"
model = "kimi-k2-instruct-int4"
cmd = "vllm serve /models/kimi-k2-instruct-int4 --tensor-parallel-size 4 --port 8000"
gpus = "0-3"

[jobs.vllm-eagle3]
engine = "vllm"
model = "kimi-k2-instruct-int4 + eagle3"
cmd = "vllm serve /models/kimi-k2-instruct-int4 --tensor-parallel-size 4 --port 8001 --speculative-config /cfg/eagle3.json"
gpus = "4-7"

[jobs.sgl-kernel-build]
kind = "build"
cmd = "python -m pip wheel /src/sglang/sgl-kernel --no-build-isolation -v"

[jobs.sglang-k2]
engine = "sglang"
model = "kimi-k2-instruct-int4"
cmd = "python -m sglang.launch_server --model-path /models/kimi-k2-instruct-int4 --tp 4 --port 30000"
gpus = "4-7"
stall_after = "30s"
"""


def run_id_at(t: float, n: int) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t % 1 * 1000):03d}{n:02x}"


class SimulatedDump:
    """A stall's stack dump, done at once (the runner's StallDump is a py-spy thread; nothing is traced here)."""

    def __init__(self, alert, verdict: str, path: Optional[str]) -> None:
        self.alert = alert
        self.key = (alert.code, alert.since)
        self.sharers: list[tuple] = []
        self.deadline = 0.0
        self.verdict = verdict
        self.path = path
        self.error = None
        self.done = True


class DemoMonitor(HealthMonitor):
    """The real monitor, except that a stall's stack dump comes from the scenario's simulated
    processes instead of py-spy on this machine's pids (which are not the recorded ones)."""

    simulated_stacks: Optional[Callable[[float], "stacks.StackDump"]] = None

    def _start_dump(self, alert, now: float) -> bool:
        if (self.simulated_stacks is None or not self.dump_on_stall or alert.code not in DUMP_ON
                or (alert.code, alert.since) in self.stacks):
            return False
        result = self.simulated_stacks(now)
        self._dumps_taken += 1
        self._dumps.append(SimulatedDump(alert, result.verdict, self.store_dump(result, now)))
        return True


class Recorder:
    """Writes one run directory the way the runner does, and judges it with the real HealthMonitor."""

    def __init__(self, root: Path, spec, start: float, n: int, pid: int) -> None:
        self.spec = spec
        self.start = start
        self.dir = root / spec.name / run_id_at(start, n)
        self.dir.mkdir(parents=True)
        self.log = self.dir / "output.log"
        self.log.touch()
        self.size = 0
        self.noted = 0
        self.pid = pid
        self.mem_available = MEM_TOTAL
        self.listening = False
        self.pids = [pid, pid + 1, pid + 2]         # the process tree the samples list
        snapshot = spec_snapshot(spec)
        self.meta = {
            "job": spec.name, "run_id": self.dir.name, "simulated": True, "host": "demo-h200 (SIMULATED)",
            "runner_host": "demo-h200 (SIMULATED)", "command": spec.cmd, "cwd": "/work", "env": {},
            "gpus": list(spec.gpus), "kind": spec.kind, "port": spec.port, "pipeline": None,
            "created_at": start, "started_at": start + 0.1, "pgid": pid,
            "runner": {"pid": pid - 1, "start": 1000}, "job_process": {"pid": pid, "start": 1001},
            "spec": snapshot, "stop_signal": spec.stop_signal, "stop_timeout": spec.stop_timeout,
        }
        write_json_atomic(self.dir / "meta.json", self.meta)
        self.monitor = DemoMonitor.for_run(self.dir, self.meta, clock=lambda: self.start,
                                             meminfo=lambda: (self.mem_available, MEM_TOTAL),
                                             listening=lambda port: self.listening)
        append_jsonl(self.dir / "events.jsonl", {"t": round(start + 0.1, 3), "event": "JobStarted",
                                                 "pid": pid, "pgid": pid})

    def write(self, text: str) -> None:
        data = text.encode()
        with open(self.log, "ab") as fh:
            fh.write(data)
        self.size += len(data)

    def tick(self, t: float, *, cpu_s: float, rss: int, read_bytes: int, gpu: Optional[dict] = None,
             alive: bool = True) -> None:
        if self.size > self.noted:
            with open(self.dir / "times", "a", encoding="ascii") as fh:
                fh.write(f"{self.size} {int(t)}\n")
            self.noted = self.size
        sample = {"t": round(t, 3), "procs": len(self.pids) if alive else 0, "pids": list(self.pids) if alive else [],
                  "cpu_s": round(cpu_s, 2), "rss": rss, "read_bytes": read_bytes, "write_bytes": 4096,
                  "log_bytes": self.size}
        if gpu is not None:
            sample["gpu"] = gpu
        append_jsonl(self.dir / "samples.jsonl", sample)
        self.monitor.tick(sample, alive=alive, now=t)

    def exit(self, t: float, exit_code: Optional[int], signal: Optional[str], **last) -> None:
        record = {"exit_code": exit_code, "signal": signal, "ended_at": round(t, 3),
                  "stopped_by_request": False, "leftovers": []}
        write_json_atomic(self.dir / "exit.json", record)
        append_jsonl(self.dir / "events.jsonl", {"t": round(t, 3), "event": "JobExited", "exit_code": exit_code,
                                                 "signal": signal, "stopped_by_request": False})
        self.tick(t + 0.01, alive=False, **last)
        self.monitor.finish(record, now=t + 0.02)


def gpu_reading(gpus: tuple, pid: int, mem_each: float, util: float, power: float) -> dict:
    return {"mem_by_pid": [{"gpu": g, "pid": pid, "mem": int(mem_each)} for g in gpus],
            "mem": int(mem_each * len(gpus)),
            "util": {str(g): round(util) for g in gpus},
            "power_w": {str(g): round(power) for g in gpus},
            "power_limit_w": {str(g): 700 for g in gpus}}


def stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60:02d}:{s % 60:02d}"


# -- the four scenarios: each a function of the simulated second ---------------------------------

def vllm_loading_then_serving(rec: Recorder) -> None:
    """A 64-shard weight load (2.5 s a shard, the bar prints its ETA), compile, graph capture, ready, serving."""
    api, core, worker = "(APIServer pid=4100)", "(EngineCore_DP0 pid=4200)", "(Worker_TP0 pid=4300)"
    shards, per_shard, load_at = 64, 2.0, 15.0
    loaded_at = load_at + shards * per_shard            # 143 s
    ready_at = loaded_at + 48
    cpu = read = 0.0
    said: set[str] = set()

    def once(key: str, text: str) -> None:
        if key not in said:
            said.add(key)
            rec.write(text)

    for k in range(DURATION):
        t = rec.start + k + 0.4
        rel = k + 0.4
        if rel >= 0.5 or k == 0:
            once("hello", f"{api} INFO {stamp(t)} [api_server.py:1800] vLLM API server version 0.11.0\n"
                          f"{api} INFO {stamp(t)} [utils.py:230] non-default args: {{'model': "
                          f"'/models/kimi-k2-instruct-int4', 'tensor_parallel_size': 4, 'port': 8000}}\n")
        if rel >= 8:
            once("init", f"{core} INFO {stamp(t)} [core.py:90] Initializing a V1 LLM engine (v0.11.0) with config: "
                         f"model='/models/kimi-k2-instruct-int4', tensor_parallel_size=4\n")
        if rel >= load_at:
            once("load", f"{worker} INFO {stamp(t)} [gpu_model_runner.py:2600] Starting to load model "
                         f"/models/kimi-k2-instruct-int4...\n")
        loading = load_at <= rel < loaded_at + 1
        if loading:
            done = min(shards, int((rel - load_at) / per_shard))
            key = f"shard{done}"
            if key not in said:
                elapsed = done * per_shard
                left = "?" if done == 0 else clock((shards - done) * per_shard)
                rate = "?it/s" if done == 0 else f"{per_shard:.2f}s/it"
                once(key, f"Loading safetensors checkpoint shards: {100 * done // shards:3d}% Completed | "
                          f"{done}/{shards} [{clock(elapsed)}<{left}, {rate}]\n")
        if rel >= loaded_at + 1:
            once("loaded", f"{worker} INFO {stamp(t)} [default_loader.py:300] Loading weights took 128.30 seconds\n"
                           f"{worker} INFO {stamp(t)} [gpu_model_runner.py:2650] Model loading took 136.20 GiB "
                           f"memory and 129.6 seconds\n")
        if rel >= loaded_at + 6:
            once("dynamo", f"{worker} INFO {stamp(t)} [backends.py:550] Dynamo bytecode transform time: 9.10 s\n")
        if rel >= loaded_at + 30:
            once("compiled", f"{worker} INFO {stamp(t)} [monitor.py:34] torch.compile takes 24.10 s in total\n"
                             f"{core} INFO {stamp(t)} [kv_cache_utils.py:1100] GPU KV cache size: 1,402,112 tokens\n")
        for i, n in enumerate((17, 34, 51, 67)):
            if rel >= loaded_at + 33 + 3 * i:
                once(f"capture{n}", f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {100 * n // 67:3d}%|"
                                    f"{'#' * (10 * n // 67):<10}| {n}/67 [00:{3 * i + 3:02d}<00:{9 - 3 * i:02d}, 5.60it/s]\n")
        if rel >= loaded_at + 46:
            once("captured", f"{worker} INFO {stamp(t)} [gpu_model_runner.py:3400] Graph capturing finished in "
                             f"12 secs, took 1.10 GiB\n")
        if rel >= ready_at:
            once("ready", f"{api} INFO {stamp(t)} [api_server.py:1600] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
                          f"{api} INFO:     Started server process [4100]\n"
                          f"{api} INFO:     Waiting for application startup.\n"
                          f"{api} INFO:     Application startup complete.\n")
            rec.listening = True
        serving = rel >= ready_at + 5
        if serving and k % 10 == 0:
            n = (k - int(ready_at)) // 10
            gen = 780 + 90 * ((n * 7) % 5) + 4 * n
            running, waiting = 12 + (n * 5) % 9, (n * 3) % 4
            kv = min(92.0, 18 + 3.1 * n)
            rec.write(f'{api} INFO:     10.0.0.5:{51000 + n} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
                      f"{api} INFO {stamp(t)} [loggers.py:200] Engine 000: Avg prompt throughput: {310 + 40 * (n % 3):.1f} "
                      f"tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, "
                      f"Waiting: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 31.0%\n")
        if loading:
            cpu += 1.6
            read += 3.4 * GIB
        else:
            cpu += 1.1 if rel < ready_at else 2.3
        mem = min(136.2, 136.2 * max(0.0, rel - load_at) / (shards * per_shard)) * GIB if rel >= load_at else 0
        if rel >= loaded_at + 30:
            mem = 139.0 * GIB
        util = 0 if rel < loaded_at + 5 else (35 if rel < ready_at else 70 + (k * 13) % 25)
        power = 120 if util == 0 else 180 + 5 * util
        rec.tick(t, cpu_s=cpu, rss=int((8 + min(40, rel / 5)) * GIB), read_bytes=int(read),
                 gpu=gpu_reading(tuple(rec.spec.gpus), 4300, mem, util, power))


def vllm_syntax_error(rec: Recorder) -> None:
    """The relaunch with the EAGLE-3 patch: dead five seconds in, on a SyntaxError in the patched file."""
    api = "(APIServer pid=5100)"
    rec.write(f"{api} INFO {stamp(rec.start)} [api_server.py:1800] vLLM API server version 0.11.0\n")
    rec.tick(rec.start + 1.4, cpu_s=0.9, rss=900 * 1024 ** 2, read_bytes=60 * 1024 ** 2,
             gpu=gpu_reading(tuple(rec.spec.gpus), 5100, 0, 0, 110))
    rec.write(f"{api} INFO {stamp(rec.start + 2)} [utils.py:230] non-default args: {{'model': "
              f"'/models/kimi-k2-instruct-int4', 'speculative_config': {{'method': 'eagle3', 'model': "
              f"'/models/k2-eagle3', 'num_speculative_tokens': 3}}, 'tensor_parallel_size': 4}}\n")
    rec.tick(rec.start + 2.4, cpu_s=1.9, rss=1400 * 1024 ** 2, read_bytes=120 * 1024 ** 2,
             gpu=gpu_reading(tuple(rec.spec.gpus), 5100, 0, 0, 110))
    rec.write("Traceback (most recent call last):\n"
              '  File "/opt/venvs/vllm/bin/vllm", line 5, in <module>\n'
              "    from vllm.entrypoints.cli.main import main\n"
              '  File "/opt/venvs/vllm/lib/python3.12/site-packages/vllm/spec_decode/eagle3_patch.py", line 212\n'
              "    if draft_hidden is None\n"
              "                           ^\n"
              "SyntaxError: expected ':'\n")
    rec.tick(rec.start + 3.4, cpu_s=2.4, rss=1500 * 1024 ** 2, read_bytes=130 * 1024 ** 2,
             gpu=gpu_reading(tuple(rec.spec.gpus), 5100, 0, 0, 110))
    rec.exit(rec.start + 4.1, 1, None, cpu_s=2.4, rss=0, read_bytes=130 * 1024 ** 2)


def build_heading_for_oom(rec: Recorder) -> None:
    """sgl-kernel at default parallelism: 64 nvcc jobs, host RAM falls ~1.4 GiB/s, the OOM killer ends it."""
    total, killed_at = 312, 71.3
    rec.write("running bdist_wheel\nrunning build_ext\n"
              "-- The CUDA compiler identification is NVIDIA 12.8.93\n"
              "-- Detecting CUDA compile features - done\n"
              "-- Build files have been written to: /src/sglang/sgl-kernel/build\n")
    sources = ("flash_extension", "moe_align_kernel", "fused_moe_gate", "per_token_group_quant_8bit",
               "cutlass_mla_kernel", "fp8_blockwise_gemm", "nvfp4_scaled_mm", "allreduce_fusion",
               "merge_attn_states", "rotary_embedding", "topk_softmax", "awq_dequant")
    cpu = 0.0
    step = 0
    for k in range(DURATION):
        t = rec.start + k + 0.7
        if t >= rec.start + killed_at:
            break
        rel = k + 0.7
        rec.mem_available = int(max(1.2 * GIB, 62 * GIB - 1.4 * GIB * max(0.0, rel - 4)))
        if rel >= 3:
            for _ in range(2 if rel > 10 else 1):
                step += 1
                name = sources[step % len(sources)]
                rec.write(f"[{step}/{total}] Building CUDA object CMakeFiles/common_ops.dir/csrc/"
                          f"{name}_{step}.cu.o\n")
        cpu += min(CPU_COUNT, 6 + 4 * rel)
        rss = MEM_TOTAL - rec.mem_available - 6 * GIB
        rec.tick(t, cpu_s=cpu, rss=max(0, int(rss)), read_bytes=int(2 * GIB + rel * 30 * 1024 ** 2))
    # The OOM killer leaves no line in the job's own log: the run just ends with SIGKILL.
    rec.exit(rec.start + killed_at, 128 + 9, "SIGKILL", cpu_s=cpu, rss=0, read_bytes=int(4 * GIB))


# Where SGLang's processes sit in the deadlock, as py-spy dumps them (innermost frame first): the four
# tensor-parallel schedulers in the first all-reduce after the weight load, the detokenizer on its
# ZMQ socket, and the server waiting on the schedulers' pipes. SGLang runs from the source checkout
# the operator built sgl-kernel from (/src/sglang): its frames are the job's own code, torch's are not.
SGL = "/src/sglang/python/sglang/srt"
VENV = "/opt/venvs/sglang/lib/python3.12/site-packages"
LIB = "/usr/lib/python3.12"
SPAWNED = [("BaseProcess.run", f"{LIB}/multiprocessing/process.py", 108),
           ("BaseProcess._bootstrap", f"{LIB}/multiprocessing/process.py", 314),
           ("_main", f"{LIB}/multiprocessing/spawn.py", 135), ("spawn_main", f"{LIB}/multiprocessing/spawn.py", 122),
           ("<module>", "<string>", 1)]
RANK_FRAMES = [("all_reduce", f"{VENV}/torch/distributed/distributed_c10d.py", 2806),
               ("_exception_logger.<locals>.wrapper", f"{VENV}/torch/distributed/c10d_logger.py", 81),
               ("GroupCoordinator.all_reduce", f"{SGL}/distributed/parallel_state.py", 412),
               ("tensor_model_parallel_all_reduce", f"{SGL}/distributed/communication_op.py", 13),
               ("ModelRunner.profile_max_num_token", f"{SGL}/model_executor/model_runner.py", 880),
               ("ModelRunner.init_memory_pool", f"{SGL}/model_executor/model_runner.py", 925),
               ("ModelRunner.initialize", f"{SGL}/model_executor/model_runner.py", 260),
               ("ModelRunner.__init__", f"{SGL}/model_executor/model_runner.py", 231),
               ("TpModelWorker.__init__", f"{SGL}/managers/tp_worker.py", 81),
               ("Scheduler.__init__", f"{SGL}/managers/scheduler.py", 310),
               ("run_scheduler_process", f"{SGL}/managers/scheduler.py", 2480), *SPAWNED]
DETOKENIZER_FRAMES = [("Socket.recv_pyobj", f"{VENV}/zmq/sugar/socket.py", 989),
                      ("DetokenizerManager.event_loop", f"{SGL}/managers/detokenizer_manager.py", 109),
                      ("run_detokenizer_process", f"{SGL}/managers/detokenizer_manager.py", 268), *SPAWNED]
SERVER_FRAMES = [("Connection._recv", f"{LIB}/multiprocessing/connection.py", 395),
                 ("Connection._recv_bytes", f"{LIB}/multiprocessing/connection.py", 430),
                 ("_ConnectionBase.recv", f"{LIB}/multiprocessing/connection.py", 250),
                 ("_launch_subprocesses", f"{SGL}/entrypoints/engine.py", 712),
                 ("launch_server", f"{SGL}/entrypoints/http_server.py", 1050),
                 ("<module>", "/src/sglang/python/sglang/launch_server.py", 14),
                 ("_run_code", f"{LIB}/runpy.py", 88), ("_run_module_as_main", f"{LIB}/runpy.py", 198)]
SERVER_CMD = "python -m sglang.launch_server --model-path /models/kimi-k2-instruct-int4 --tp 4 --port 30000"


def py_spy_thread(tid: int, frames: list[tuple[str, str, int]], name: str = "MainThread") -> dict:
    """One thread as `py-spy dump --json` prints it."""
    return {"thread_id": tid, "os_thread_id": tid, "thread_name": name, "active": False, "owns_gil": False,
            "frames": [{"name": fn, "filename": path, "module": None, "short_filename": path.rsplit("/", 1)[-1],
                        "line": line} for fn, path, line in frames]}


def sglang_stacks(rec: Recorder, now: float) -> stacks.StackDump:
    """The dump py-spy would have taken of the deadlocked tree, grouped and judged by the real code."""
    server, detok, *ranks = rec.pids
    tree = [(server, SERVER_CMD, SERVER_FRAMES), (detok, "sglang::detokenizer", DETOKENIZER_FRAMES)]
    tree += [(pid, f"sglang::scheduler_TP{i}", RANK_FRAMES) for i, pid in enumerate(ranks)]
    procs = []
    for pid, command, frames in tree:
        raw = [py_spy_thread(pid, frames)]
        procs.append(stacks.build_process(ProcessId(pid, 1001 + pid - server), command, raw, raw))
    result = stacks.StackDump(taken_at=now, native=False, processes=procs, job=rec.spec.name, run_id=rec.dir.name,
                              py_spy="SIMULATED (docs/make_demo_runs.py)", duration_s=0.9, simulated=True)
    result.groups = stacks.group(procs)
    result.verdict = stacks.verdict(result)
    return result


def sglang_deadlock(rec: Recorder) -> None:
    """547 GB loaded in 22 s, then nothing: alive, 0% CPU, 0% GPU, port shut, log silent."""
    # The server, the detokenizer and one scheduler per TP rank.
    rec.pids = [rec.pid, rec.pid + 1, rec.pid + 2, rec.pid + 3, rec.pid + 4, rec.pid + 5]
    rec.monitor.simulated_stacks = lambda now: sglang_stacks(rec, now)
    tp = ("TP0", "TP1", "TP2", "TP3")
    shards, load_s = 64, 22.0
    cpu = read = 0.0
    for k in range(int(DURATION - (rec.start - BASE))):
        t = rec.start + k + 0.2
        rel = k + 0.2
        if k == 0:
            rec.write(f"[{stamp(t)}] server_args=ServerArgs(model_path='/models/kimi-k2-instruct-int4', "
                      f"tp_size=4, port=30000, enable_metrics=False)\n")
        if k == 2:
            rec.write("".join(f"[{stamp(t)} {r}] Load weight begin. avail mem=139.20 GB\n" for r in tp))
        if 2 <= rel <= 2 + load_s + 1:
            done = min(shards, int((rel - 2) / load_s * shards))
            if done and done % 8 == 0 or done == shards:
                rec.write(f"Loading safetensors checkpoint shards: {100 * done // shards:3d}% Completed | "
                          f"{done}/{shards} [00:{int(rel - 2):02d}<00:{max(0, int(load_s - rel + 2)):02d}, "
                          f"{shards / load_s:.2f}it/s]\n")
            cpu += 3.5
            read += 547e9 / load_s
        if k == int(2 + load_s + 1):
            rec.write("".join(f"[{stamp(t)} {r}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
                              f"avail mem=2.40 GB, mem usage=136.80 GB.\n" for r in tp))
        if k == int(2 + load_s + 2):
            cpu += 0.8
        mem = min(136.8, 136.8 * max(0.0, rel - 2) / load_s) * GIB
        rec.tick(t, cpu_s=cpu, rss=int(24 * GIB), read_bytes=int(read),
                 gpu=gpu_reading(tuple(rec.spec.gpus), 6300, mem, 0, 115))


SCENARIOS: list[tuple[str, float, int, Callable[[Recorder], None]]] = [
    # (job, start offset in seconds, pid, scenario)
    ("vllm-k2", 0.0, 4100, vllm_loading_then_serving),
    ("vllm-eagle3", 0.0, 5100, vllm_syntax_error),
    ("sgl-kernel-build", 0.0, 7100, build_heading_for_oom),
    # the operator pivots GPUs 4-7 to SGLang once the EAGLE-3 relaunch is dead
    ("sglang-k2", 8.0, 6300, sglang_deadlock),
]


def generate(out: Path) -> list[Path]:
    # The rules suggest MAX_JOBS from the host's cores: the simulated host's, not this machine's.
    os.cpu_count = lambda: CPU_COUNT          # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path = Path(tmp) / "jobs.toml"
        jobs_path.write_text(JOBS_TOML)
        jobs = load_jobs(jobs_path).jobs
        staging = Path(tmp) / "demo_runs"
        staging.mkdir()
        made = []
        for n, (name, offset, pid, scenario) in enumerate(SCENARIOS):
            rec = Recorder(staging, jobs[name], BASE + offset, n, pid)
            scenario(rec)
            made.append(rec.dir.relative_to(staging))
        (staging / "README").write_text(
            "SIMULATED run recordings replayed by `gpudeck --demo`; regenerate with docs/make_demo_runs.py.\n")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(staging, out)
    return [out / p for p in made]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    for path in generate(args.out):
        health = json.loads((path / "health.json").read_text())
        codes = [a["code"] for a in health.get("history") or []]
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: phase {health.get('phase')}, "
              f"alerts {codes or 'none'}, {size // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
