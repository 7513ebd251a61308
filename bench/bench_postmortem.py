"""Benchmark: `postmortem` on a run with a 1 GB log and 24 h of 1 s samples (8 GPUs), built by the real runner monitors.

    python bench/bench_postmortem.py [--gb 1] [--hours 24] [--dir /tmp/gpudeck-bench-pm] [--keep] [--reuse]

The run is made the way a real one is: the log grows second by second (a vLLM startup
with a 40-minute weight load, then serving until a CUDA OOM), the `times` index and
samples.jsonl get one line a second, and the runner's own monitors
(gpudeck.jobs.runner_monitors: health + history recorder) are ticked with each sample on
a simulated clock, so summary.json is what a runner leaves. Then the post-mortem is timed
in-process (build + Markdown + HTML + JSON) and through the CLI (`gpudeck postmortem RUN
--format html -o FILE`, a fresh Python process).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_analyze import _serving_block  # noqa: E402  (the same serving traffic the analyzer bench uses)

START = 1_764_000_000.0          # the simulated run's start (unix time)
LOAD_S = 2400                    # a 40-minute weight load
GPUS = 8


def startup_lines(t: int) -> str:
    """What a vLLM startup prints in second t (empty when nothing)."""
    if t == 0:
        return ("INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
                "INFO 05-07 10:00:01 [config.py:1] Initializing a V1 LLM engine with config: model='/data/k2'\n")
    if 5 <= t < LOAD_S and t % 24 == 0:
        done = (t - 5) // 24 + 1
        return (f"Loading safetensors checkpoint shards: {done}% Completed | {done}/100 "
                f"[{t // 60:02d}:{t % 60:02d}<{(LOAD_S - t) // 60:02d}:00, 24.00s/it]\n")
    if t == LOAD_S:
        return ("INFO 05-07 10:40:00 [gpu_model_runner.py:1] Model loading took 70.1 GiB and 2400.0 seconds\n"
                "INFO 05-07 10:40:01 [backends.py:1] Compiling a graph for dynamic shape takes 95.2 s\n")
    if t == LOAD_S + 100:
        return "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:40<00:00]\n"
    if t == LOAD_S + 140:
        return ("INFO 05-07 10:42:20 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
                "INFO:     Application startup complete.\n")
    return ""


CRASH = ("(EngineCore_DP0 pid=811) ERROR 05-08 10:00:00 [core.py:700] EngineCore encountered a fatal error.\n"
         "(EngineCore_DP0 pid=811) ERROR 05-08 10:00:00 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. "
         "Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 139.80 GiB of which 1.20 GiB is free.\n"
         "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.\n")


def make_run(run_dir: Path, gigabytes: float, hours: float) -> dict:
    from gpudeck.jobs.runner import Tick
    from gpudeck.jobs.runner_monitors import make_monitors
    from gpudeck.jobs.runs import Run, write_json_atomic
    seconds = int(hours * 3600)
    target = int(gigabytes * 1024 ** 3)
    run_dir.mkdir(parents=True)
    meta = {"job": "vllm-k2", "run_id": run_dir.name, "kind": "engine", "command": "vllm serve /data/k2 -tp 8",
            "host": platform.node(), "gpus": list(range(GPUS)), "created_at": START, "started_at": START,
            "spec": {"kind": "engine", "engine": "vllm"}}
    write_json_atomic(run_dir / "meta.json", meta)
    run = Run(run_dir)
    monitors = make_monitors(run, meta)
    for m in monitors:            # no port probing or meminfo on a simulated clock
        if hasattr(m, "health"):
            m.health.listening = lambda port: None
    rng = random.Random(7)
    serving_s = max(1, seconds - LOAD_S - 141)
    block = _serving_block(rng, 0).encode()
    per_second = max(0, (target - 200_000) // serving_s)
    log = open(run_dir / "output.log", "ab")
    times = open(run_dir / "times", "a")
    samples = open(run_dir / "samples.jsonl", "a")
    size = 0
    cpu_s = read_b = 0.0
    t0 = time.perf_counter()
    for t in range(seconds):
        now = START + t
        chunk = startup_lines(t).encode()
        if t > LOAD_S + 140:
            need = per_second
            parts = [chunk]
            while need > 0:
                if rng.random() < 0.02:
                    block = _serving_block(rng, t).encode()     # fresh numbers now and then
                parts.append(block)
                need -= len(block)
            chunk = b"".join(parts)
        if t == seconds - 1:
            chunk += CRASH.encode()
        if chunk:
            log.write(chunk)
            log.flush()
            size += len(chunk)
            times.write(f"{size} {int(now)}\n")
        loading = t < LOAD_S
        cpu_s += 0.9 if loading else 3.5
        read_b += 2.5e8 if loading else 1e4
        mem = min(70.1, 70.1 * t / LOAD_S) * 1024 ** 3 if t < LOAD_S + 100 else 128 * 1024 ** 3
        sample = {"t": round(now, 3), "procs": 10, "pids": list(range(100, 110)), "cpu_s": round(cpu_s, 2),
                  "rss": int((20 + 10 * rng.random()) * 1024 ** 3), "read_bytes": int(read_b), "write_bytes": 0,
                  "log_bytes": size,
                  "gpu": {"mem_by_pid": [{"gpu": g, "pid": 100 + g, "mem": int(mem)} for g in range(GPUS)],
                          "mem": int(mem) * GPUS,
                          "util": {str(g): (0 if loading else rng.randint(60, 100)) for g in range(GPUS)},
                          "power_w": {str(g): (90.0 if loading else rng.uniform(300, 650)) for g in range(GPUS)},
                          "power_limit_w": {str(g): 700 for g in range(GPUS)}}}
        samples.write(json.dumps(sample, separators=(",", ":")) + "\n")
        tick = Tick(now=now, run=run, meta=meta, log_size=size, log_grew=bool(chunk),
                    last_output_at=now, sample=sample, job_alive=True)
        for m in monitors:
            m.tick(tick)
    for f in (log, times, samples):
        f.close()
    end = START + seconds
    record = {"exit_code": 1, "signal": None, "ended_at": end, "stopped_by_request": False, "leftovers": []}
    write_json_atomic(run_dir / "exit.json", record)
    for m in monitors:
        m.finished(run, record)
    return {"log_bytes": size, "samples": seconds, "setup_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--dir", default="/tmp/gpudeck-bench-pm")
    ap.add_argument("--keep", action="store_true", help="keep the generated state dir")
    ap.add_argument("--reuse", action="store_true", help="reuse a state dir a --keep run left")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    state = Path(args.dir)
    run_dir = state / "runs" / "vllm-k2" / "20251201-000000-00000"
    if not (args.reuse and (run_dir / "summary.json").exists()):
        shutil.rmtree(state, ignore_errors=True)
        info = make_run(run_dir, args.gb, args.hours)
        print(f"generated: log {info['log_bytes'] / 1024 ** 3:.2f} GiB, {info['samples']:,} samples, "
              f"through the runner monitors in {info['setup_s']:.0f} s")
    os.environ["GPUDECK_STATE_DIR"] = str(state)
    from gpudeck.jobs.history import render_html, render_md
    from gpudeck.jobs.history.postmortem import build
    sizes = {p.name: p.stat().st_size for p in run_dir.iterdir()}
    print("files: " + ", ".join(f"{k} {v / 1024 ** 2:.1f} MiB" for k, v in sorted(sizes.items())))
    best = {}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = build(str(run_dir), state)
        t1 = time.perf_counter()
        md = render_md.render(report)
        t2 = time.perf_counter()
        page = render_html.render(report)
        t3 = time.perf_counter()
        js = json.dumps(report, default=str)
        t4 = time.perf_counter()
        for key, value in (("build", t1 - t0), ("md", t2 - t1), ("html", t3 - t2), ("json", t4 - t3),
                           ("total_html", t3 - t0 - (t2 - t1))):
            best[key] = min(best.get(key, 1e9), value)
    print(f"verdict: {report['verdict']}")
    print(f"in-process (best of {args.repeat}): build {best['build']:.3f} s, markdown {best['md']:.3f} s, "
          f"html {best['html']:.3f} s ({len(page) / 1024:.0f} KiB), json {best['json']:.3f} s ({len(js) / 1024:.0f} KiB)")
    walls = []
    out = state / "r.html"
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "postmortem", str(run_dir),
                               "--format", "html", "-o", str(out)], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "GPUDECK_STATE_DIR": str(state)})
        walls.append(time.perf_counter() - t0)
        if done.returncode != 0:
            print(done.stderr)
            return 1
    print(f"CLI `gpudeck postmortem RUN --format html -o FILE` wall: best {min(walls):.2f} s, "
          f"median {sorted(walls)[len(walls) // 2]:.2f} s (Python start-up included)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if not args.keep:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
