"""Benchmark: the console's own CPU use, running `gpudeck --demo` in a real pseudo-terminal for a minute.

Not a test: it prints one figure (percent of one core) and the machine it ran on.
    .venv/bin/python bench/bench_console_cpu.py [--seconds 60] [--refresh 1] [--size 120x36]
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import pty
import select
import signal
import struct
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def drain(fd: int, stop: threading.Event, counter: list[int]) -> None:
    """Read the terminal's output as a real terminal would, so the app never blocks on a full pty."""
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            counter[0] += len(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds to let the app start before measuring")
    parser.add_argument("--refresh", type=float, default=1.0)
    parser.add_argument("--size", default="120x36")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", metavar="FILE", help="run the console under cProfile, writing stats to FILE")
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.lower().split("x"))

    pid, master = pty.fork()
    if pid == 0:  # child: becomes the console, with the pty as its controlling terminal
        os.chdir(REPO)
        env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", PYTHONPATH=str(REPO))
        env.pop("TEXTUAL", None)
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        os.execve(sys.executable, [sys.executable, *profile, "-m", "console", "--demo", "--refresh", str(args.refresh)], env)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    stop = threading.Event()
    written = [0]
    reader = threading.Thread(target=drain, args=(master, stop, written), daemon=True)
    reader.start()
    proc = psutil.Process(pid)
    try:
        time.sleep(args.warmup)
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            print("bench: the console exited during warm-up", file=sys.stderr)
            return 1
        t0, c0, b0 = time.monotonic(), proc.cpu_times(), written[0]
        time.sleep(args.seconds)
        t1, c1, b1 = time.monotonic(), proc.cpu_times(), written[0]
    finally:
        try:
            os.write(master, b"q")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass
        stop.set()
    cpu_s = (c1.user + c1.system) - (c0.user + c0.system)
    wall = t1 - t0
    result = {
        "cpu_percent_of_one_core": round(100.0 * cpu_s / wall, 3),
        "cpu_seconds": round(cpu_s, 3),
        "wall_seconds": round(wall, 2),
        "ms_cpu_per_tick": round(1000.0 * cpu_s / (wall / args.refresh), 2),
        "terminal_bytes_per_s": round((b1 - b0) / wall),
        "refresh_s": args.refresh,
        "size": f"{cols}x{rows}",
        "machine": f"{os.cpu_count()} cores {platform.machine()} ({cpu_model()}), Python {platform.python_version()}",
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"console CPU: {result['cpu_percent_of_one_core']:.2f}% of one core over {wall:.0f} s "
              f"(--demo, refresh {args.refresh:g} s, {cols}x{rows}); {result['ms_cpu_per_tick']:.1f} ms CPU per tick; "
              f"{result['terminal_bytes_per_s']} B/s to the terminal")
        print(f"machine: {result['machine']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
