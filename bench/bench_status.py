"""Benchmark: wall and CPU time of the real `gpudeck status --json`, median of N runs, with the machine's load.

Not a test: it prints the figures and the machine they were taken on.
    .venv/bin/python bench/bench_status.py [--runs 21] [--interval SECONDS] [--keep-pyc-off]
Bytecode caches are written and used, as after `pip install` (a first, unmeasured run warms them), unless
--keep-pyc-off keeps PYTHONDONTWRITEBYTECODE from the environment.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def command(interval: float | None) -> list[str]:
    script = Path(sys.executable).with_name("gpudeck")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "gpudeck.console.cli"]
    argv += ["status", "--json"]
    if interval is not None:
        argv += ["--interval", str(interval)]
    return argv


def one_run(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+system) of one run of the command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.decode(errors='replace')}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--interval", type=float, default=None, help="pass --interval (default: the command's)")
    parser.add_argument("--keep-pyc-off", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ)
    if not args.keep_pyc_off:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = command(args.interval)
    one_run(argv, env)                                   # warm: bytecode caches, page cache
    load_before = os.getloadavg()[0]
    walls, cpus = [], []
    for _ in range(args.runs):
        wall, cpu = one_run(argv, env)
        walls.append(wall)
        cpus.append(cpu)
    load_after = os.getloadavg()[0]
    walls.sort()
    print(f"command: {' '.join(Path(a).name if i == 0 else a for i, a in enumerate(argv))}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {load_before:.1f} -> {load_after:.1f}, bytecode caches "
          f"{'off' if env.get('PYTHONDONTWRITEBYTECODE') else 'on'}")
    print(f"runs: {args.runs}")
    print(f"wall: median {statistics.median(walls):.3f} s  min {walls[0]:.3f} s  "
          f"p90 {walls[int(0.9 * (len(walls) - 1))]:.3f} s  max {walls[-1]:.3f} s")
    print(f"cpu (user+sys): median {statistics.median(cpus):.3f} s")


if __name__ == "__main__":
    main()
