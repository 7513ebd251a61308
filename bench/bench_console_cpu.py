"""Benchmark: the console's own CPU use, running `gpudeck --demo` in a real pseudo-terminal for a minute.

Not a test: it prints figures (percent of one core) and the machine they ran on.
    .venv/bin/python bench/bench_console_cpu.py [--seconds 60] [--refresh 1] [--size 120x36] [--runs 3]
    .venv/bin/python bench/bench_console_cpu.py --real      # this machine's NVML/psutil sampler, not the demo
Side by side (alternating rounds, so every contender sees the same contention):
    bench_console_cpu.py --real --nvitop --refresh 1 2 --rounds 3 --size 120x40   # gpudeck vs nvitop, and the ratio
    bench_console_cpu.py --against /path/to/older/checkout --refresh 1 2 --rounds 3  # this code vs an older tree
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import pty
import select
import signal
import statistics
import subprocess
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


def calibration_ms() -> float:
    """CPU ms for a fixed pure-Python workload: this shared VM's speed drifts by 2x over
    minutes, so each figure is printed with the speed the machine had when it was taken."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        sum(i * i for i in range(200_000))
        best = min(best, time.process_time() - t0)
    return best * 1000


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


def shim_for(tree: Path) -> Path:
    """A PYTHONPATH entry importing gpudeck.* from another checkout's jobs/, console/, themes/ folders."""
    tree = tree.resolve()
    root = Path("/tmp") / f"gpudeck-shim-{hashlib.sha1(str(tree).encode()).hexdigest()[:10]}"
    package = root / "gpudeck"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")       # a regular package: wins over an installed gpudeck
    for name in ("jobs", "console", "themes"):
        link = package / name
        if not link.exists():
            link.symlink_to(tree / name)
    return root


def thread_cpu(proc: psutil.Process) -> dict[int, float]:
    """CPU seconds (user + system) of each of the process's threads, by thread id."""
    try:
        return {t.id: t.user_time + t.system_time for t in proc.threads()}
    except psutil.Error:
        return {}


def nvitop_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import nvitop"], capture_output=True)
    return probe.returncode == 0


def contenders(args: argparse.Namespace) -> list[tuple[str, list[str], dict]]:
    """(label, argv without the refresh, extra environment) of every program measured."""
    source = [] if args.real else ["--demo"]
    out = [("gpudeck", [sys.executable, "-m", "gpudeck.console", *source], {})]
    if args.against:
        out.append((f"gpudeck@{Path(args.against).name}", [sys.executable, "-m", "gpudeck.console", *source],
                    {"PYTHONPATH": str(shim_for(Path(args.against)))}))
    if args.nvitop:
        if nvitop_available():
            out.append(("nvitop", [sys.executable, "-m", "nvitop"], {}))
        else:
            print("bench: nvitop is not installed here: measuring gpudeck alone", file=sys.stderr)
    return out


def refresh_args(label: str, refresh: float) -> list[str]:
    return ["--interval", f"{refresh:g}"] if label == "nvitop" else ["--refresh", f"{refresh:g}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds to let the app start before measuring")
    parser.add_argument("--refresh", type=float, nargs="+", default=[1.0], help="one or more refresh periods")
    parser.add_argument("--size", default="120x36")
    parser.add_argument("--real", action="store_true", help="this machine's real sampler (NVML) instead of --demo")
    parser.add_argument("--runs", "--rounds", dest="runs", type=int, default=1,
                        help="rounds (contenders alternate within each); medians are reported")
    parser.add_argument("--nvitop", action="store_true",
                        help="also run nvitop (when installed) in the same pty size, alternating with gpudeck")
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="also run gpudeck from another checkout (an older commit), alternating")
    parser.add_argument("--baseline", action="store_true",
                        help="first measure the same console idle (no ticks): on a shared VM the idle figure "
                             "itself drifts 5x, so a tick figure means something only next to it")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", metavar="FILE", help="run the console under cProfile, writing stats to FILE")
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    programs = contenders(args)
    gpudeck_argv = programs[0][1]
    if args.baseline:
        idle = run_once(args, gpudeck_argv + ["--refresh", "3600"], {}, 3600.0, cols, rows)
        if idle is None:
            return 1
        print(f"baseline: the same console idle (no sampling ticks) uses {idle['cpu_percent_of_one_core']:.2f}% "
              f"of one core; calibration loop {idle['calibration_ms']:.1f} ms")
    medians: dict[tuple[str, float], float] = {}
    machine = ""
    for refresh in args.refresh:
        figures: dict[str, list[float]] = {label: [] for label, _, _ in programs}
        for round_no in range(args.runs):
            for label, argv, env in list(programs):
                result = run_once(args, argv + refresh_args(label, refresh), env, refresh, cols, rows)
                if result is None:
                    print(f"bench: {label} exited during warm-up", file=sys.stderr)
                    if label == "gpudeck":
                        return 1
                    programs.remove((label, argv, env))     # nvitop without a GPU, say: gpudeck alone
                    figures.pop(label, None)
                    continue
                machine = result["machine"]
                figures[label].append(result["cpu_percent_of_one_core"])
                if args.json:
                    print(json.dumps({"program": label, "round": round_no + 1, **result}))
                else:
                    print(f"{label:>16} refresh {refresh:g} s round {round_no + 1}: "
                          f"{result['cpu_percent_of_one_core']:.2f}% of one core over {result['wall_seconds']:.0f} s "
                          f"({'real sampler' if args.real else '--demo'}, {cols}x{rows}); "
                          f"{result['ms_cpu_per_tick']:.1f} ms CPU per tick (main thread "
                          f"{result['ms_per_tick_main_thread']:.2f}, others {result['ms_per_tick_other_threads']}); "
                          f"{result['terminal_bytes_per_s']} B/s "
                          f"to the terminal; calibration loop {result['calibration_ms']:.1f} ms", flush=True)
        for label, values in figures.items():
            medians[(label, refresh)] = statistics.median(values)
            if not args.json and len(values) > 1:
                print(f"{label:>16} refresh {refresh:g} s: median {statistics.median(values):.2f}% "
                      f"(min {min(values):.2f}%, max {max(values):.2f}%) over {len(values)} rounds")
    if not args.json:
        for label, _, _ in programs[1:]:
            for refresh in args.refresh:
                mine, theirs = medians[("gpudeck", refresh)], medians[(label, refresh)]
                ratio = mine / theirs if theirs else float("inf")
                print(f"ratio gpudeck / {label} at refresh {refresh:g} s: {ratio:.2f} "
                      f"({mine:.2f}% vs {theirs:.2f}% of one core, medians)")
        print(f"machine: {machine}")
    return 0


def run_once(args: argparse.Namespace, argv: list[str], extra_env: dict, refresh: float, cols: int,
             rows: int) -> dict | None:
    calibration = calibration_ms()
    pid, master = pty.fork()
    if pid == 0:  # child: becomes the measured program, with the pty as its controlling terminal
        os.chdir(REPO)
        pythonpath = os.pathsep.join(p for p in (extra_env.get("PYTHONPATH"), os.environ.get("PYTHONPATH"),
                                                 str(REPO)) if p)
        env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", PYTHONPATH=pythonpath)
        env.pop("TEXTUAL", None)
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile and "gpudeck.console" in argv else []
        os.execve(argv[0], [argv[0], *profile, *argv[1:]], env)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    stop = threading.Event()
    written = [0]
    reader = threading.Thread(target=drain, args=(master, stop, written), daemon=True)
    reader.start()
    proc = psutil.Process(pid)
    try:
        time.sleep(args.warmup)
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        t0, c0, b0, th0 = time.monotonic(), proc.cpu_times(), written[0], thread_cpu(proc)
        time.sleep(args.seconds)
        t1, c1, b1, th1 = time.monotonic(), proc.cpu_times(), written[0], thread_cpu(proc)
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
        os.close(master)
    cpu_s = (c1.user + c1.system) - (c0.user + c0.system)
    wall = t1 - t0
    ticks = wall / refresh
    # The main thread (tid == pid) runs the UI's event loop; the rest are sampling, input and workers.
    main_s = th1.get(pid, 0.0) - th0.get(pid, 0.0)
    others = sorted(((th1[t] - th0.get(t, 0.0), t) for t in th1 if t != pid), reverse=True)
    return {
        "cpu_percent_of_one_core": round(100.0 * cpu_s / wall, 3),
        "cpu_seconds": round(cpu_s, 3),
        "wall_seconds": round(wall, 2),
        "ms_cpu_per_tick": round(1000.0 * cpu_s / (wall / refresh), 2),
        "terminal_bytes_per_s": round((b1 - b0) / wall),
        "ms_per_tick_main_thread": round(1000.0 * main_s / ticks, 2),
        "ms_per_tick_other_threads": [round(1000.0 * s / ticks, 2) for s, _ in others[:4]],
        "calibration_ms": round(max(calibration, calibration_ms()), 2),
        "source": "real" if args.real else "demo",
        "refresh_s": refresh,
        "size": f"{cols}x{rows}",
        "machine": f"{os.cpu_count()} cores {platform.machine()} ({cpu_model()}), Python {platform.python_version()}",
    }


if __name__ == "__main__":
    raise SystemExit(main())
