"""Benchmark: replaying a big recorded run — open, play at 64x, seek back a minute, jump to the end.

    python bench/bench_replay.py [--mb 256] [--hours 6] [--dir /tmp/gpudeck-bench-replay] [--keep]

Writes a run directory the way the runner does (output.log growing every second with its
`times` index, one sample a second with per-GPU numbers, a few alerts in events.jsonl), then
times what the console's replay does per tick: `ReplaySession.frame()` while playing forward
at 64x (0.5 s ticks), a seek back of 60 s (a checkpoint restore plus at most CHECKPOINT_BYTES
re-read), and jumps across the whole run.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpudeck.jobs.replay import CHECKPOINT_BYTES, ReplaySession  # noqa: E402

BASE = 1_800_000_000.0


def make_run(path: Path, mb: int, hours: float, seed: int = 0) -> Path:
    rng = random.Random(seed)
    run = path / "runs" / "bench" / "20270115-080000-00000"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    seconds = int(hours * 3600)
    per_second = mb * 1024 * 1024 // seconds
    meta = {"job": "bench", "run_id": run.name, "created_at": BASE, "started_at": BASE + 0.1,
            "gpus": [0, 1, 2, 3], "kind": "engine", "job_process": {"pid": 4100, "start": 1},
            "spec": {"name": "bench", "kind": "engine", "engine": "vllm", "port": 8000, "gpus": [0, 1, 2, 3],
                     "cmd": "vllm serve /models/x --port 8000 --tensor-parallel-size 4"}}
    (run / "meta.json").write_text(json.dumps(meta))
    size = 0
    with open(run / "output.log", "wb") as log, open(run / "times", "w") as times, \
            open(run / "samples.jsonl", "w") as samples:
        for k in range(seconds):
            t = BASE + k + 0.5
            lines = []
            while sum(map(len, lines)) < per_second:
                if rng.random() < 0.1:
                    lines.append(f"(APIServer pid=1) INFO 01-15 08:00:00 [loggers.py:200] Engine 000: Avg prompt "
                                 f"throughput: {rng.uniform(0, 900):.1f} tokens/s, Avg generation throughput: "
                                 f"{rng.uniform(20, 300):.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: "
                                 f"{rng.randint(0, 9)} reqs, GPU KV cache usage: {rng.uniform(0, 90):.1f}%, Prefix "
                                 f"cache hit rate: 10.0%\n".encode())
                else:
                    lines.append(f'(APIServer pid=1) INFO:     10.1.{rng.randint(0, 255)}.{rng.randint(1, 254)}:'
                                 f'{rng.randint(30000, 60000)} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'.encode())
            chunk = b"".join(lines)
            log.write(chunk)
            size += len(chunk)
            times.write(f"{size} {int(t)}\n")
            gpu = {"mem": 4 * 130 * 2**30, "util": {str(g): rng.randint(60, 95) for g in range(4)},
                   "power_w": {str(g): rng.randint(300, 600) for g in range(4)},
                   "power_limit_w": {str(g): 700 for g in range(4)},
                   "mem_by_pid": [{"gpu": g, "pid": 4300 + g, "mem": 130 * 2**30} for g in range(4)]}
            samples.write(json.dumps({"t": round(t, 3), "cpu_s": k * 1.5, "rss": 40 * 2**30, "read_bytes": 0,
                                      "log_bytes": size, "procs": 6, "gpu": gpu}) + "\n")
    with open(run / "events.jsonl", "w") as events:
        events.write(json.dumps({"t": BASE + 0.1, "event": "JobStarted", "pid": 4100}) + "\n")
        for i in range(1, 4):
            t = BASE + seconds * i / 4
            events.write(json.dumps({"t": t, "event": "AlertRaised", "code": "stalled", "since": t - 600,
                                     "message": "bench"}) + "\n")
            events.write(json.dumps({"t": t + 60, "event": "AlertCleared", "code": "stalled", "since": t - 600})
                         + "\n")
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpudeck-bench-replay"))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    run = make_run(args.dir, args.mb, args.hours)
    log_mb = (run / "output.log").stat().st_size / 2**20
    print(f"made {run} ({log_mb:.0f} MB log, {int(args.hours * 3600):,} samples) in {time.perf_counter() - t0:.1f}s")
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")

    t0 = time.perf_counter()
    session = ReplaySession.open([run], speed=64)
    opened = time.perf_counter() - t0
    print(f"open (meta, times, events; samples load on first use): {opened * 1000:.0f} ms")

    # Play the first 30 minutes at 64x in 0.5 s ticks, as the console does.
    ticks = []
    for _ in range(int(30 * 60 / 32)):
        session.advance(0.5)
        t0 = time.perf_counter()
        session.frame()
        ticks.append(time.perf_counter() - t0)
    print(f"play at 64x: {len(ticks)} ticks, median {statistics.median(ticks) * 1000:.2f} ms, "
          f"p95 {sorted(ticks)[int(len(ticks) * 0.95)] * 1000:.2f} ms, max {max(ticks) * 1000:.2f} ms per frame")

    t0 = time.perf_counter()
    session.seek_to(session.end)
    session.frame()
    to_end = time.perf_counter() - t0
    print(f"jump to the end (analyze the whole log once): {to_end:.2f} s "
          f"({log_mb / max(to_end, 1e-9):.0f} MB/s), {len(session.runs[0]._track.checkpoints)} checkpoints")

    backs = []
    for _ in range(10):
        session.seek(-60)
        t0 = time.perf_counter()
        session.frame()
        backs.append(time.perf_counter() - t0)
    print(f"seek back 60 s: median {statistics.median(backs) * 1000:.1f} ms, max {max(backs) * 1000:.1f} ms "
          f"(checkpoint every {CHECKPOINT_BYTES // 2**20} MiB)")

    t0 = time.perf_counter()
    session.seek_to(session.start + (session.end - session.start) / 2)
    session.frame()
    print(f"jump back to the middle: {(time.perf_counter() - t0) * 1000:.1f} ms")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
