"""The pivot's own overhead beyond the engines' stop and start, against a real vLLM (CPU build, tiny model).

Usage: .venv/bin/python bench/bench_pivot.py [--rounds N]
Installs the CPU vLLM test environment on first use (tests/engines/vllm_env.py).
Each round: engine A is running and ready; `pivot(B, wait=True)`; then back to A.
Overhead = pivot wall time - (the managed engines' stop step + the wait-for-ready
step): planning (process discovery), GPU and port verification, runner start and
event bookkeeping.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "engines"))

from gpudeck.jobs.engines.monitor import EngineMonitor  # noqa: E402
from gpudeck.jobs.engines.pivot import plan_pivot, execute_pivot  # noqa: E402
from gpudeck.jobs.engines.profiles import engine_settings  # noqa: E402
from gpudeck.jobs.runs import latest_run  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor  # noqa: E402
from runsupport import kill_run_leftovers, write_jobs  # noqa: E402
from vllm_env import ensure_vllm_env  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = ensure_vllm_env()
    tmp = Path(tempfile.mkdtemp(prefix="gpudeck-bench-pivot-"))
    jobs = {}
    for name in ("vllm-a", "vllm-b"):
        port = free_port()
        serve_env = env.serve_env(tmp / f"cache-{name}")
        jobs[name] = {"engine": "vllm", "port": port, "stop_timeout": "30s",
                      "env": {k: serve_env[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE",
                                                        "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                                                        "VLLM_CACHE_ROOT", "PYTHONUNBUFFERED")},
                      "cmd": env.serve_argv(port)}
    sup = Supervisor(load_jobs(write_jobs(tmp / "jobs.toml", jobs)), state_dir=tmp / "state")
    rows = []
    try:
        sup.start("vllm-a")
        run = latest_run("vllm-a", sup.state_dir)
        mon = EngineMonitor(engine_settings(sup.spec("vllm-a")), run.log_path)
        t0 = time.monotonic()
        while mon.poll().phase != "ready":
            if time.monotonic() - t0 > 600:
                raise SystemExit("vllm-a never became ready")
            time.sleep(0.25)
        current, other = "vllm-a", "vllm-b"
        for i in range(args.rounds):
            t_plan = time.monotonic()
            plan = plan_pivot(sup, other)
            plan_s = time.monotonic() - t_plan
            result = execute_pivot(sup, plan, wait=True, ready_deadline_s=600)
            if not result.ok:
                raise SystemExit(f"pivot failed: {result.message}")
            steps = {s.name.split(" ")[0] + " " + s.name.split(" ")[1]: s.duration_s for s in result.steps}
            stop_s = sum(s.duration_s for s in result.steps if s.name.startswith("stop "))
            ready_s = sum(s.duration_s for s in result.steps if s.name.startswith("wait for "))
            overhead = result.overhead_s + plan_s
            rows.append((overhead, plan_s, stop_s, ready_s, result.duration_s + plan_s, steps))
            print(f"round {i + 1}: {current} -> {other}: total {result.duration_s + plan_s:.2f} s = "
                  f"stop {stop_s:.2f} + start->ready {ready_s:.2f} + overhead {overhead:.3f} "
                  f"(plan {plan_s:.3f}, " + ", ".join(f"{s.name} {s.duration_s:.3f}" for s in result.steps
                                                     if not s.name.startswith(("stop ", "wait for "))) + ")",
                  flush=True)
            current, other = other, current
    finally:
        for name in ("vllm-a", "vllm-b"):
            r = latest_run(name, sup.state_dir)
            if r is not None:
                sup.stop(name, timeout=10)
                kill_run_leftovers(r.run_id)
    over = [r[0] for r in rows]
    print(f"pivot overhead over {len(rows)} rounds: median {statistics.median(over):.3f} s, "
          f"max {max(over):.3f} s; engine stop median {statistics.median(r[2] for r in rows):.2f} s, "
          f"start->ready median {statistics.median(r[3] for r in rows):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
