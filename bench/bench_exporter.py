"""Benchmark: one `gpudeck exporter` scrape of a box with 50 jobs, over HTTP, median and p95 over N scrapes.

    python bench/bench_exporter.py [--jobs 50] [--live 10] [--scrapes 50] [--log-mb 2] [--dir DIR] [--profile]

The run directories are real ones, made the way the tests make them: a jobs.toml of `--jobs`
jobs started through the Supervisor (each job's own runner writes meta.json, output.log,
health.json, exit.json). `--jobs - --live` of them print `--log-mb` MB of progress lines and
exit (every 7th with a CUDA out-of-memory traceback, exit 1); `--live` keep running, printing a
progress line every 0.5 s, so their health.json changes under the scrapes. Five ended runs lose
their health.json, as an older runner leaves them: the payload then judges their log's tail.

Timed: the warm-up the exporter does before it serves (every run read once), the first scrape,
then `--scrapes` scrapes of the real HTTP server (start_http_server, the 8 SIMULATED GPUs
included, 0.2 s apart), and, for comparison, the same jobs payload without the exporter's cache.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ENDING = r"""
import sys
line = "epoch 1/1 step {i}/{n} loss=2.0 lr=1e-4 tokens/s=3165.2 " + "x" * 40
n = int(sys.argv[1])
out = sys.stdout
for i in range(1, n + 1):
    out.write(line.format(i=i, n=n) + "\n")
out.flush()
if sys.argv[2] == "oom":
    sys.stderr.write("Traceback (most recent call last):\n  File \"/work/train.py\", line 88, in <module>\n"
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.\n")
    sys.exit(1)
"""

_LIVE = r"""
import time
for i in range(1, 1000000):
    print(f"epoch 1/1 step {i}/100000 loss=2.0", flush=True)
    time.sleep(0.5)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--live", type=int, default=10)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--log-mb", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/gpudeck-bench-exporter")
    ap.add_argument("--profile", action="store_true", help="also print where 20 warm in-process scrapes spend their time")
    args = ap.parse_args(argv)
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ["GPUDECK_STATE_DIR"] = str(base / "state")
    sys.path.insert(0, str(ROOT / "tests"))
    from runsupport import cleanup_state, write_jobs

    from gpudeck.jobs import exporter as core
    from gpudeck.jobs.spec import load_jobs
    from gpudeck.jobs.supervisor import Supervisor

    (base / "ending.py").write_text(_ENDING)
    (base / "live.py").write_text(_LIVE)
    lines = max(1, int(args.log_mb * 1e6 / 100))
    jobs = {}
    for i in range(args.jobs):
        if i < args.jobs - args.live:
            how = "oom" if i % 7 == 0 else "ok"
            jobs[f"job-{i:02d}"] = {"cmd": f"{sys.executable} {base / 'ending.py'} {lines} {how}", "kind": "train"}
        else:
            jobs[f"job-{i:02d}"] = {"cmd": f"{sys.executable} {base / 'live.py'}", "kind": "train"}
    path = write_jobs(base / "jobs.toml", jobs)
    sup = Supervisor(load_jobs(path))
    try:
        t0 = time.perf_counter()
        ending = [name for name, spec in jobs.items() if "ending.py" in spec["cmd"]]
        for at in range(0, len(ending), 6):            # 6 at a time: the VM has 2 cores
            batch = ending[at:at + 6]
            for name in batch:
                sup.start(name)
            for name in batch:
                sup.wait(name, timeout=300)
        for name in jobs:
            if name not in ending:
                sup.start(name)
        time.sleep(3)                                  # the live runs' monitors have written health.json
        # Five ended runs as an older runner leaves them: no health.json (the payload reads the log's tail).
        for name in ending[1:6]:
            health = sup.latest(name).path / "health.json"
            health.unlink(missing_ok=True)
        log_bytes = sum((sup.latest(n).path / "output.log").stat().st_size for n in jobs)
        print(f"made {len(jobs)} jobs ({len(ending)} ended, {len(jobs) - len(ending)} live) in "
              f"{time.perf_counter() - t0:.1f} s; {log_bytes / 1e6:.0f} MB of logs")

        source = core.JobsFileSource(path)
        read, label, close = core.simulated_gpus()
        collector = core.GpudeckCollector(source, read, gpu_source=label)
        registry = core.make_registry(collector)
        from prometheus_client import generate_latest, start_http_server

        c0, t0 = time.process_time(), time.perf_counter()
        collector.warm()
        print(f"warm-up at start (every run read once, as `gpudeck exporter` does before it serves): "
              f"{(time.perf_counter() - t0) * 1000:.0f} ms wall, {(time.process_time() - c0) * 1000:.0f} ms CPU")
        c0, t0 = time.process_time(), time.perf_counter()
        text = generate_latest(registry)
        newlines = text.count(b"\n")
        print(f"first scrape: {(time.perf_counter() - t0) * 1000:.0f} ms wall, "
              f"{(time.process_time() - c0) * 1000:.0f} ms CPU, {len(text):,} bytes, "
              f"{newlines:,} lines, {source.health.reads} run dirs read")

        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        walls, collects, cpus = [], [], []
        reads0 = source.health.reads
        for _ in range(args.scrapes):
            time.sleep(0.2)
            c0, t0 = time.process_time(), time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = reply.read()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            collects.append(collector.last_duration_s)
        assert b"gpudeck_job_phase" in body
        server.shutdown()
        close()
        print(f"{args.scrapes} HTTP scrapes of {len(jobs)} jobs + 8 GPUs: median {statistics.median(walls) * 1000:.1f} ms, "
              f"p95 {pct(walls, 0.95) * 1000:.1f} ms wall (collect alone median "
              f"{statistics.median(collects) * 1000:.1f} ms, p95 {pct(collects, 0.95) * 1000:.1f} ms); "
              f"CPU median {statistics.median(cpus) * 1000:.1f} ms; "
              f"{(source.health.reads - reads0) / args.scrapes:.1f} run dirs re-read a scrape")

        if args.profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                generate_latest(registry)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        from gpudeck.jobs.payload import jobs_payload
        plain = []
        for _ in range(5):
            t0 = time.perf_counter()
            jobs_payload(sup)
            plain.append(time.perf_counter() - t0)
        print(f"for comparison, the jobs payload without the cache: median {statistics.median(plain) * 1000:.0f} ms "
              f"(the 5 log-only runs' 4 MiB tails analysed every time)")
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
              f"Python {platform.python_version()}")
    finally:
        for name in jobs:
            try:
                sup.stop(name, timeout=5)
            except Exception:                          # noqa: BLE001 - ended runs: nothing to stop
                pass
        cleanup_state(base / "state")
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
