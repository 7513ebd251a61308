"""Cost of one HealthMonitor tick (new log bytes -> analyzer -> rules -> health.json) on a busy run directory."""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudeck.jobs.health import HealthMonitor  # noqa: E402

LINE = ("(EngineCore_DP0 pid=4242) INFO 11-29 12:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: "
        "0.0 tokens/s, Avg generation throughput: 812.4 tokens/s, Running: 8 reqs, Waiting: 2 reqs, "
        "GPU KV cache usage: 41.2%, Prefix cache hit rate: 12.0%\n")
BAR = "Loading safetensors checkpoint shards:  {p}% Completed | {d}/85 [00:{s:02d}<01:00,  1.2it/s]\r"


def main(ticks: int = 600, bytes_per_tick: int = 64 * 1024) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs" / "job" / "20261129-000000-00000"
        run_dir.mkdir(parents=True)
        log = run_dir / "output.log"
        log.write_bytes(b"")
        mon = HealthMonitor(run_dir, kind="engine", port=1, stall_after=600, listening=lambda p: False)
        costs = []
        with open(log, "ab") as fh:
            for i in range(ticks):
                chunk = []
                size = 0
                while size < bytes_per_tick:
                    text = (BAR.format(p=i % 100, d=i % 85, s=i % 60) if i % 2 else LINE.format(s=i % 60))
                    chunk.append(text)
                    size += len(text)
                fh.write("".join(chunk).encode())
                fh.flush()
                t = time.perf_counter()
                mon.tick({"cpu_s": i * 0.5, "read_bytes": i * 10 ** 6, "rss": 10 ** 9}, now=1000.0 + i)
                costs.append(time.perf_counter() - t)
        costs.sort()
        print(f"{ticks} ticks, {bytes_per_tick // 1024} KiB of new log each: "
              f"median {costs[len(costs) // 2] * 1000:.2f} ms, p95 {costs[int(len(costs) * 0.95)] * 1000:.2f} ms, "
              f"max {costs[-1] * 1000:.2f} ms per tick")
        quiet = []
        for i in range(200):
            t = time.perf_counter()
            mon.tick({"cpu_s": 0.0}, now=2000.0 + i)
            quiet.append(time.perf_counter() - t)
        quiet.sort()
        print(f"quiet log: median {quiet[len(quiet) // 2] * 1000:.2f} ms per tick")


if __name__ == "__main__":
    main()
