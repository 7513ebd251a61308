"""Benchmark of the console's log pane: follow lag under a 50,000 lines/s writer, and RSS with a 1 GB log open."""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from textual.app import App, ComposeResult

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpudeck.console.widgets.log_view import LogView, LogViewPane  # noqa: E402

LINE_BYTES = 100   # fixed-size lines: lines in the file = size // LINE_BYTES, no counting needed

# The writer runs in its own process, as a job would: it appends a batch every
# ~5 ms so that it holds the target rate without a syscall per line.
WRITER = r"""
import os, sys, time
path, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
t0 = time.time(); written = 0
while True:
    now = time.time()
    if now - t0 >= seconds:
        break
    target = int((now - t0) * rate)
    if target > written:
        lines = []
        for seq in range(written, target):
            head = "seq=%010d t=%.6f " % (seq, now)
            lines.append(head + "x" * (LINE_BYTES - 1 - len(head)) + "\n")
        os.write(fd, "".join(lines).encode())
        written = target
    time.sleep(0.005)
os.close(fd)
print(written)
""".replace("LINE_BYTES", str(LINE_BYTES))


class FollowApp(App):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        yield LogView(self.path)


def _last_shown_seq(pane: LogViewPane) -> tuple[int, float] | None:
    for text in reversed(pane.visible_text()):
        if text.startswith("seq="):
            fields = text.split()
            return int(fields[0][4:]), float(fields[1][2:])
    return None


async def bench_follow(rate: float, seconds: float, workdir: Path) -> dict:
    path = workdir / "follow.log"
    path.write_bytes(b"")
    app = FollowApp(path)
    lag_lines: list[int] = []
    lag_ms: list[float] = []
    tick_late_ms: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(LogViewPane)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(rate), str(seconds)],
                                  stdout=subprocess.PIPE, text=True)
        interval = 0.05
        next_tick = time.monotonic() + interval
        while writer.poll() is None:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            now_mono = time.monotonic()
            # How late the event loop woke us: a swamped UI shows up here first.
            tick_late_ms.append((now_mono - next_tick) * 1000)
            next_tick += interval
            now = time.time()
            in_file = os.path.getsize(path) // LINE_BYTES
            shown = _last_shown_seq(pane)
            if shown is None or in_file == 0:
                continue
            seq, stamp = shown
            lag_lines.append(in_file - 1 - seq)
            lag_ms.append((now - stamp) * 1000)
        written = int(writer.stdout.read().strip() or 0)
        # After the writer stops, the pane must catch up completely.
        deadline = time.monotonic() + 10
        caught_up_after = None
        t_stop = time.monotonic()
        while time.monotonic() < deadline:
            shown = _last_shown_seq(pane)
            if shown and shown[0] == written - 1:
                caught_up_after = time.monotonic() - t_stop
                break
            await pilot.pause(0.02)
        following = pane.following
        count = pane.line_count

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {
        "rate_lines_s": rate,
        "seconds": seconds,
        "lines_written": written,
        "lines_indexed": count,
        "samples": len(lag_lines),
        "lag_lines_median": statistics.median(lag_lines) if lag_lines else None,
        "lag_lines_p95": pct(lag_lines, 0.95),
        "lag_lines_max": max(lag_lines) if lag_lines else None,
        "lag_ms_median": round(statistics.median(lag_ms), 1) if lag_ms else None,
        "lag_ms_p95": round(pct(lag_ms, 0.95), 1),
        "lag_ms_max": round(max(lag_ms), 1) if lag_ms else None,
        "ui_tick_late_ms_p95": round(pct(tick_late_ms, 0.95), 1),
        "ui_tick_late_ms_max": round(max(tick_late_ms), 1) if tick_late_ms else None,
        "caught_up_after_stop_s": None if caught_up_after is None else round(caught_up_after, 3),
        "still_following": following,
    }


def make_big_log(path: Path, size: int) -> int:
    """A log of `size` bytes of varied, numbered lines (written in 8 MB batches)."""
    words = ["INFO", "loading", "shard", "step", "loss=0.4121", "tokens/s=3165", "GPU", "rank=3"]
    with open(path, "wb") as f:
        seq = 0
        written = 0
        while written < size:
            batch = []
            for _ in range(100_000):
                batch.append("%010d %s %s %s %s\n" % (seq, words[seq % 8], words[(seq >> 3) % 8],
                                                      "." * (seq % 97), words[(seq >> 6) % 8]))
                seq += 1
            data = "".join(batch).encode()
            f.write(data)
            written += len(data)
        f.write(b"NEEDLE the one line the search must find\n")
        return seq + 1


async def bench_memory(size: int, workdir: Path) -> dict:
    path = workdir / "big.log"
    t = time.monotonic()
    # Generated in a child process so that the peak RSS below is the console's alone.
    done = subprocess.run([sys.executable, __file__, "--generate", str(path), "--size-mb", str(size // 2**20)],
                          check=True, capture_output=True, text=True)
    lines = int(done.stdout.strip())
    generate_s = time.monotonic() - t
    proc = psutil.Process()
    empty = workdir / "empty.log"
    empty.write_bytes(b"")
    result: dict = {"file_bytes": path.stat().st_size, "file_lines": lines, "generate_s": round(generate_s, 1)}
    app = FollowApp(empty)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(LogViewPane)
        await pilot.pause(0.5)
        result["rss_mb_empty_pane"] = round(proc.memory_info().rss / 2**20, 1)
        t = time.monotonic()
        pane.open(path)
        first_lines_at = None
        while pane.index.state().size < path.stat().st_size:
            if first_lines_at is None and pane.line_count > 0:
                first_lines_at = time.monotonic() - t
            await pilot.pause(0.01)
        await pilot.pause(0.2)
        result["first_lines_shown_s"] = round(first_lines_at or (time.monotonic() - t), 3)
        result["fully_indexed_s"] = round(time.monotonic() - t, 2)
        result["lines_indexed"] = pane.line_count
        result["tail_shown"] = [row for row in pane.visible_text() if row.strip()][-1].strip()[:40]
        result["rss_mb_open_following"] = round(proc.memory_info().rss / 2**20, 1)
        # Jump around: top, middle, end; each must render at once.
        jumps = []
        for target in (0, pane.line_count // 2, pane.line_count // 3, pane.max_scroll_y):
            t = time.monotonic()
            pane.scroll_to(y=target, animate=False, immediate=True)
            pane.visible_text()
            jumps.append((time.monotonic() - t) * 1000)
        result["jump_render_ms_max"] = round(max(jumps), 1)
        t = time.monotonic()
        pane.start_search("NEEDLE")
        while pane.current_match is None and time.monotonic() - t < 120:
            await pilot.pause(0.05)
        result["search_1gb_s"] = round(time.monotonic() - t, 2)
        result["search_found_line"] = pane.current_match
        pane.action_toggle_wrap()
        await pilot.pause(0.1)
        result["rss_mb_after_jumps_search_wrap"] = round(proc.memory_info().rss / 2**20, 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    path.unlink()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--only", choices=["follow", "memory"])
    parser.add_argument("--generate", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        print(make_big_log(Path(args.generate), args.size_mb * 2**20))
        return 0
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="gpudeck-bench-", dir="/tmp") as tmp:
        if args.only in (None, "follow"):
            print("follow:", asyncio.run(bench_follow(args.rate, args.seconds, Path(tmp))))
        if args.only in (None, "memory"):
            print("memory:", asyncio.run(bench_memory(args.size_mb * 2**20, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
