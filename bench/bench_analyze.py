"""Benchmark: analyze_file on a generated few-hundred-MB GPU-box log vs `grep -c .` on the same file; speed ratio and peak memory.

    python bench/bench_analyze.py [--mb 300] [--dense-mb 200] [--reference-logs DIR] [--keep] [--exhaustive]

The log mixes what a long day on the box writes: a vLLM startup and hours of serving
(access lines, stats + spec-decode lines, the odd request traceback), SGLang decode
batches, an HF-Trainer run (tqdm redrawn with \\r, loss dicts glued on), a kernel build
(ninja lines, compiler warnings) and NCCL_DEBUG=INFO chatter, ending in a CUDA OOM.
A second, *dense* file is built from the real excerpts in shared/reference-logs (when
present): all of them concatenated and repeated to --dense-mb MB, so that nearly every
other line is one the analyzer must read. Each file is timed against `grep -c .` (wall
and CPU time: the machine is shared, CPU time is the steadier figure).
Analysis runs in a child process so its peak RSS is its own. --exhaustive times the
reference scanner (every anchored segment examined: the analyzer before its template scanner).
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _serving_block(rng: random.Random, t: int) -> str:
    out = []
    for i in range(40):
        port = rng.randint(30000, 60000)
        path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"])
        out.append(f'(APIServer pid=1) INFO:     10.1.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{port} - '
                   f'"POST {path} HTTP/1.1" 200 OK\n')
    out.append(f"(APIServer pid=1) INFO 05-07 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d} [loggers.py:271] "
               f"Engine 000: Avg prompt throughput: {rng.uniform(0, 900):.1f} tokens/s, Avg generation throughput: "
               f"{rng.uniform(20, 300):.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: {rng.randint(0, 9)} "
               f"reqs, GPU KV cache usage: {rng.uniform(0, 90):.1f}%, Prefix cache hit rate: {rng.uniform(0, 60):.1f}%\n")
    out.append(f"(APIServer pid=1) INFO 05-07 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d} [metrics.py:101] "
               f"SpecDecoding metrics: Mean acceptance length: {rng.uniform(2.0, 3.0):.2f}, Accepted throughput: 76.80 "
               f"tokens/s, Drafted throughput: 235.49 tokens/s, Accepted: 768 tokens, Drafted: 2355 tokens, "
               f"Per-position acceptance rate: 0.726, 0.467, 0.240, Avg Draft acceptance rate: {rng.uniform(25, 45):.1f}%\n")
    if rng.random() < 0.02:
        out.append("(APIServer pid=1) ERROR 05-07 10:00:00 [serving_chat.py:300] Error in preprocessing prompt inputs\n"
                   "(APIServer pid=1) Traceback (most recent call last):\n"
                   '(APIServer pid=1)   File "/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/'
                   'serving_chat.py", line 290, in create_chat_completion\n'
                   '(APIServer pid=1)     raise ValueError("too long")\n'
                   "(APIServer pid=1) ValueError: This model's maximum context length is 8192 tokens.\n")
    return "".join(out)


def _sglang_block(rng: random.Random, t: int) -> str:
    return "".join(
        f"[2025-10-22 10:{t // 60 % 60:02d}:{t % 60:02d} TP0] Decode batch. #running-req: {rng.randint(1, 64)}, "
        f"#token: {rng.randint(100, 90000)}, token usage: {rng.uniform(0, 0.9):.2f}, accept len: {rng.uniform(1.5, 3):.2f}, "
        f"accept rate: {rng.uniform(0.3, 0.7):.2f}, cuda graph: True, gen throughput (token/s): {rng.uniform(50, 900):.2f}, "
        f"#queue-req: {rng.randint(0, 5)}, \n" for _ in range(30))


def _training_block(rng: random.Random, step: int) -> str:
    # One physical line of \r-redrawn bar updates (as tqdm writes to a file), a loss dict glued on the end.
    bar = "".join(f"\r {s * 100 // 20000:3d}%|{'#' * (s * 10 // 20000):10s}| {s}/20000 [1:{s % 60:02d}:00<3:{s % 60:02d}:00, "
                  f" {rng.uniform(1.1, 1.9):.2f}s/it]" for s in range(step, step + 50))
    return bar + (f"{{'loss': {rng.uniform(0.2, 2):.4f}, 'grad_norm': {rng.uniform(1, 9):.6f}, "
                  f"'learning_rate': {rng.uniform(1e-6, 2e-5):.6e}, 'epoch': {step / 6000:.2f}}}\n")


def _build_block(rng: random.Random, n: int) -> str:
    out = []
    for i in range(n, n + 20):
        out.append(f"[{i}/5000] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c /src/csrc/kernels/"
                   f"moe_{i}.cu -o /src/build/temp/moe_{i}.o -O3 -std=c++17 --expt-relaxed-constexpr "
                   f"-gencode arch=compute_90a,code=sm_90a --threads 4\n")
        if rng.random() < 0.1:
            out.append(f"/src/csrc/kernels/moe_{i}.cu(88): warning #177-D: variable \"tmp\" was declared but never "
                       f"referenced\n")
    return "".join(out)


def _nccl_block(rng: random.Random) -> str:
    return "".join(f"node-{rng.randint(0, 7)}:{rng.randint(1000, 9999)}:{rng.randint(1000, 9999)} [{rng.randint(0, 7)}] "
                   f"NCCL INFO Channel {rng.randint(0, 31):02d}/0 : {rng.randint(0, 7)}[{rng.randint(0, 7)}] -> "
                   f"{rng.randint(0, 7)}[{rng.randint(0, 7)}] via P2P/CUMEM/read\n" for _ in range(30))


STARTUP = """(APIServer pid=1) INFO 05-07 08:00:00 [api_server.py:1800] vLLM API server version 0.11.0
(EngineCore_DP0 pid=20) INFO 05-07 08:00:09 [core.py:90] Initializing a V1 LLM engine (v0.11.0)
(Worker_TP0 pid=30) INFO 05-07 08:00:20 [gpu_model_runner.py:2600] Starting to load model /models/m...
""" + "".join(f"Loading safetensors checkpoint shards: {i * 100 // 85:3d}% Completed | {i}/85 [00:{i % 60:02d}<01:00,  "
              f"1.50s/it]\n\n" for i in range(86)) + """(Worker_TP0 pid=30) INFO 05-07 08:02:00 [default_loader.py:300] Loading weights took 100.12 seconds
(APIServer pid=1) INFO:     Application startup complete.
"""


def generate(path: Path, megabytes: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    target = megabytes * 1024 * 1024
    written = 0
    t = step = n = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(STARTUP)
        while written < target:
            r = rng.random()
            t += 10
            if r < 0.60:
                block = _serving_block(rng, t)
            elif r < 0.70:
                block = _sglang_block(rng, t)
            elif r < 0.85:
                block = _training_block(rng, step % 19000)
                step += 50
            elif r < 0.95:
                block = _build_block(rng, n % 4980)
                n += 20
            else:
                block = _nccl_block(rng)
            fh.write(block)
            written += len(block)
        fh.write("(EngineCore_DP0 pid=20) ERROR 05-07 23:59:59 [core.py:700] torch.OutOfMemoryError: CUDA out of "
                 "memory. Tried to allocate 2.00 GiB.\n")
    return path.stat().st_size


_CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(0, {root!r} + "/tests")
from gpudeck.jobs.logs.analyze import LogAnalyzer, analyze_file
from analyze_reference import ReferenceAnalyzer
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
r = analyze_file({path!r}, analyzer=ReferenceAnalyzer() if {exhaustive!r} else LogAnalyzer())
dt, dc = time.perf_counter() - t, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dt, dc, base, peak, r.phase, r.failure.cause if r.failure else None, r.failure.line if r.failure else None)
"""

REFERENCE_LOGS = ROOT.parent / "shared" / "reference-logs"


def make_dense(path: Path, folder: Path, mb: int) -> int:
    """The reference logs concatenated, repeated to `mb` MB: real logs where nearly every other line matters."""
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(folder.glob("*.log")))
    with open(path, "wb") as fh:
        for _ in range(max(1, mb * 1_000_000 // len(blob))):
            fh.write(blob)
    return path.stat().st_size


def time_grep(path: Path) -> tuple[float, float]:
    """Best (wall, CPU) seconds of `grep -c .` over three runs."""
    best = (float("inf"), float("inf"))
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(["grep", "-c", ".", str(path)], check=True, capture_output=True)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best = min(best, (wall, cpu))
    return best


def measure(path: Path, runs: int, exhaustive: bool) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:       # warm the page cache so both tools read from memory
        while fh.read(16 << 20):
            pass
    grep_s, grep_cpu = time_grep(path)
    results = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), path=str(path), exhaustive=exhaustive)],
                             check=True, capture_output=True, text=True).stdout.split()
        results.append(out)
    best = min(results, key=lambda r: float(r[1]))
    analyze_s, analyze_cpu, base_kb, peak_kb = float(best[0]), float(best[1]), int(best[2]), int(best[3])
    mb = size / 1e6
    print(f"file: {path.name}, {mb:.0f} MB, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"grep -c .    : {grep_s:.3f} s wall, {grep_cpu:.3f} s CPU  ({mb / grep_s:.0f} MB/s wall)")
    name = "exhaustive" if exhaustive else "analyze_file"
    print(f"{name:13s}: {analyze_s:.3f} s wall, {analyze_cpu:.3f} s CPU  ({mb / analyze_cpu:.1f} MB/s CPU)  "
          f"-> {best[4]}, failure {best[5]} at line {best[6]}")
    print(f"ratio        : {100 * grep_s / analyze_s:.1f}% of grep's speed (wall), "
          f"{100 * grep_cpu / analyze_cpu:.1f}% (CPU time)")
    print(f"peak RSS     : {peak_kb / 1024:.1f} MiB (interpreter + imports alone: {base_kb / 1024:.1f} MiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="size of the generated (synthetic) log")
    parser.add_argument("--path", default="/tmp/gpudeck-bench.log")
    parser.add_argument("--dense-mb", type=int, default=200, help="size of the dense file (0: skip it)")
    parser.add_argument("--dense-path", default="/tmp/gpudeck-bench-dense.log")
    parser.add_argument("--reference-logs", default=str(REFERENCE_LOGS),
                        help="folder of real log excerpts the dense file is made of (skipped when absent)")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the generated logs")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--exhaustive", action="store_true", help="time the reference (exhaustive) scanner")
    args = parser.parse_args(argv)
    path = Path(args.path)
    if args.mb:
        if not (args.keep and path.exists()):
            t = time.perf_counter()
            generate(path, args.mb)
            print(f"generated {path} in {time.perf_counter() - t:.1f}s")
        measure(path, args.runs, args.exhaustive)
        if not args.keep:
            path.unlink()
    dense, folder = Path(args.dense_path), Path(args.reference_logs)
    if args.dense_mb and folder.is_dir():
        if not (args.keep and dense.exists()):
            make_dense(dense, folder, args.dense_mb)
            print(f"made {dense} from {folder}")
        measure(dense, args.runs, args.exhaustive)
        if not args.keep:
            dense.unlink()
    elif args.dense_mb:
        print(f"dense file skipped: {folder} not found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
