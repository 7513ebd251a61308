"""Benchmark: where the time of a dense log's reading in slices goes (jobs/logs/analyze/slices.py), in process.

    python bench/bench_slices.py [--mb 200] [--which fixtures|reference|both] [--workers N] [--reference-logs DIR]

For each dense mix (bench_analyze.py's make_dense) it reads the file the way `gpudeck analyze` does
(parallel.analyze_regular, one worker per usable core) and prints a timeline: when the dense stretch
was met and where, then for every slice its size, how long the reader waited for its worker's answer,
at which check (bytes from the slice's start) the guess was proven, or that the reader read it, and
the time the reader spent on it. Then the total beside `-j 1` (one process) in the same run. What it
shows is what bounds the figure: the head read before the slices, the last worker's slice, or the
reader's checks.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_analyze import FIXTURE_LOGS, REFERENCE_LOGS, make_dense  # noqa: E402
from gpudeck.jobs.logs.analyze import parallel, slices  # noqa: E402
from gpudeck.jobs.logs.analyze.state import State  # noqa: E402


def traced_reading(path: Path, workers: int) -> tuple[float, list[str]]:
    """One reading with the slices' events noted; (seconds, the timeline's lines)."""
    events: list[str] = []
    t0 = time.perf_counter()
    stamp = lambda: f"{(time.perf_counter() - t0) * 1000:7.1f} ms"    # noqa: E731
    read_dense, take, same = slices.read_dense, slices._take, State.same_course
    checks: list[bool] = []

    def noting_dense(analyzer, fd, start, limit, n):                  # type: ignore[no-untyped-def]
        events.append(f"{stamp()}  dense stretch from {start / 1e6:.1f} MB to {limit / 1e6:.1f} MB, {n} workers")
        return read_dense(analyzer, fd, start, limit, n)

    def noting_take(analyzer, fd, a, b, got):                        # type: ignore[no-untyped-def]
        waited = time.perf_counter()
        answer = got
        before = analyzer._state
        del checks[:]
        t = time.perf_counter()
        take(analyzer, fd, a, b, answer)
        spent = (time.perf_counter() - t) * 1000
        if answer is None:
            how = "worker died: read here"
        elif answer[0] is None:
            how = "from the truth"
        elif analyzer._state is before:
            how = f"read here after {len(checks)} checks"
        else:
            at = answer[0][len(checks) - 1][0] - a
            how = f"proven at check {len(checks)} ({at >> 10} KiB)"
        events.append(f"{stamp()}  slice {(b - a) / 1e6:6.1f} MB  answer in hand at {(waited - t0) * 1000:7.1f} ms;"
                      f" {how}; reader {spent:6.1f} ms")
        return None

    def noting_same(self, other, *rest):                             # type: ignore[no-untyped-def]
        delta = same(self, other, *rest)
        checks.append(delta is not None)
        return delta

    answer_of = slices._Slicers.answer

    def timed_answer(self, k):                                       # type: ignore[no-untyped-def]
        t = time.perf_counter()
        got = answer_of(self, k)
        wait = (time.perf_counter() - t) * 1000
        if wait > 1:
            events.append(f"{stamp()}  waited {wait:6.1f} ms for slice {k}'s worker")
        return got

    slices.read_dense, slices._take, State.same_course, slices._Slicers.answer = \
        noting_dense, noting_take, noting_same, timed_answer
    try:
        with open(path, "rb") as fh:
            parallel.analyze_regular(fh, workers=workers)
    finally:
        slices.read_dense, slices._take, State.same_course, slices._Slicers.answer = read_dense, take, same, answer_of
    return time.perf_counter() - t0, events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--which", choices=("fixtures", "reference", "both"), default="both")
    parser.add_argument("--workers", type=int, default=parallel.usable_cores())
    parser.add_argument("--reference-logs", default=str(REFERENCE_LOGS))
    args = parser.parse_args(argv)
    folders = {"fixtures": FIXTURE_LOGS, "reference": Path(args.reference_logs)}
    names = ["fixtures", "reference"] if args.which == "both" else [args.which]
    print(f"{os.cpu_count()} cores, {args.workers} workers; slices.CHECKS up to {slices.CHECKS[-1] >> 10} KiB,"
          f" STEP {slices.STEP >> 10} KiB")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = Path(tmp) / f"dense-{name}.log"
            size = make_dense(path, folders[name], args.mb)
            with open(path, "rb") as fh:                              # the page cache warm, as the CLI bench has it
                while fh.read(1 << 24):
                    pass
            spread, events = traced_reading(path, args.workers)
            t = time.perf_counter()
            with open(path, "rb") as fh:
                parallel.analyze_regular(fh, workers=1)
            alone = time.perf_counter() - t
            print(f"== dense {name} mix, {size / 1e6:.0f} MB: {spread:.3f} s in slices, -j 1 {alone:.3f} s"
                  f" ({alone / spread:.2f}x)")
            for line in events:
                print("  " + line)
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
