"""A dense stretch of a log read in slices by forked workers, each from a guess of the state it starts
in; the reader keeps a slice's reading only where it proved it the one it would have made itself.

On a dense log the reader's Python is the bound (every few lines one that can change the answer), so
the byte passes spread by parallel.py gain nothing there. Here each worker reads a whole slice, Python
and all, from the state the reader had when it forked them: the state at the stretch's start, which
for every slice but the first is a guess. Worker k (k ≥ 1) also sends the states it had after the
first CHECKS bytes of its slice. The reader, holding the true state at slice k's start (the slices
before it read), reads up to the first check itself and compares (State.same_course). The reading is
deterministic, so where the two states are the same (but for `seq`, a counter whose offset is then
known and added), the worker's state at its slice's end is the reader's own reading of the slice,
which the reader takes. Where they differ (a field set before the slice that the window did not
overwrite: the guess lacked it), the reader reads on to the next check (CHECKS: the windows grow,
so a log that converges soon costs the reader little of each slice and one that converges late is
still taken), and after the last reads the rest of the slice itself. A dead worker's
slice is read here too. So the answer is the serial one whatever the log: only its time depends on
how soon the log's state converges (on the dense mixes, within one repetition of their excerpts).

The engine must be known and nothing be pending outside the state (LogAnalyzer.accepts_mapped): until
the engine is known, the reading depends on caches a worker does not share (State._bar_label).
"""
from __future__ import annotations

import os
import pickle
from typing import Optional

from .model import READ_CHUNK
from .parallel import _adopt, _after_newline, _read_exactly, _sigint_held, _widen, _write_all, reap
from .scanner import LogAnalyzer

# Where a worker's guess is compared, in bytes from its slice's start: the first that agrees ends what the
# reader reads of the slice. A check costs ~0.2 ms (a 3.5 KB state pickled, unpickled, compared), so
# they are close at first: the dense mixes converge within one repetition of their excerpts (the
# fixtures' 128 KB, the reference logs' 154 KB: 96–160 KiB); a state a rare line set takes longer.
CHECKS = (*range(32 << 10, 256 << 10, 32 << 10), 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20)
STEP = 256 << 10          # what the reader is expected to read of each slice: the slices' staircase
MIN_SLICE = 4 << 20       # a slice smaller than this is not worth a fork: the reader reads it
# What the reader reads of the stretch itself before it forks the workers: their guess is its state
# then, which has seen what the stretch sets once and keeps (the first error of a dense mix's
# repetitions: a guess from before any never converges).
LEAD = 1 << 20


def read_dense(analyzer: LogAnalyzer, fd: int, start: int, limit: int, workers: int) -> int:
    """Feed the file's bytes from start (just after a newline) to the last newline before limit, in slices
    read by up to `workers` worker processes and checked here; returns where it stopped (start when it
    read nothing): what follows, a line unended, the caller reads (a worker would keep it to itself)."""
    tail = os.pread(fd, min(READ_CHUNK, limit - start), max(start, limit - READ_CHUNK))
    nl = tail.rfind(b"\n")
    limit = limit - len(tail) + nl + 1 if nl >= 0 else start
    lead = _after_newline(fd, start + LEAD, limit, READ_CHUNK)
    slices, own = _slices(fd, lead, limit, workers) if lead else ([], False)
    if len(slices) < 2:
        return start
    _feed(analyzer, fd, start, lead)
    start = lead
    theirs = slices[1:] if own else slices
    pool = _Slicers(fd, theirs, analyzer, start)
    try:
        if own:                                       # the reader's share, read while the workers read theirs
            _feed(analyzer, fd, *slices[0])
        for k, (a, b) in enumerate(theirs):
            _take(analyzer, fd, a, b, pool.answer(k))
    finally:
        pool.stop()
    return slices[-1][1]


def _slices(fd: int, start: int, limit: int, workers: int) -> tuple[list[tuple[int, int]], bool]:
    """The slices' bounds (each after a newline) and whether the first is the reader's own.

    The reader checks the slices in order, about a STEP each, so their sizes are set for no one to wait:
    on few cores the reader reads the first slice itself, as much as leaves it a worker's share (its
    slice and a STEP of each other one); on many, every slice is a worker's, each one STEP longer
    than the one before from the third on (slice k is done when the reader is through slice k - 1's
    checks), or all alike where that staircase would not fit."""
    total = limit - start
    n = max(1, min(workers, total // MIN_SLICE))
    size = (total + max(0, n - 2) * STEP) // n
    first = size - max(0, n - 2) * STEP
    own = first >= MIN_SLICE // 4 and n > 1
    sizes = [first] + [size] * (n - 1)
    if not own:
        base = (total - STEP * (n - 1) * (n - 2) // 2) // n
        sizes = ([base, base] + [base + k * STEP for k in range(1, n - 1)])[:n] if base >= MIN_SLICE // 4 \
            else [total // n] * n
    cuts = [start]
    at = start
    for length in sizes[:-1]:
        cut = _after_newline(fd, at + length, limit, READ_CHUNK)
        if not cut or cut >= limit:
            break
        cuts.append(cut)
        at = cut
    cuts.append(limit)
    return list(zip(cuts, cuts[1:])), own


def _take(analyzer: LogAnalyzer, fd: int, a: int, b: int, got: Optional[tuple]) -> None:
    """Slice [a, b): the worker's reading (its checks: each (p, its state at p), None when it started from
    the truth; its state at b; the line after b) taken where it is proven the reader's own; else read here."""
    if got is None:                                   # its worker died: read here
        _feed(analyzer, fd, a, b)
        return
    checks, end_blob, end_line = got
    if checks is None:
        analyzer.adopt(pickle.loads(end_blob), 0, end_line, b - a)
        return
    at = a
    for p, blob in checks:
        _feed(analyzer, fd, at, p)
        at = p
        delta = analyzer._state.same_course(pickle.loads(blob), analyzer.line)
        if delta is not None:
            analyzer.adopt(pickle.loads(end_blob), delta, end_line, b - p)
            return
    _feed(analyzer, fd, at, b)                        # a guess that never converged: the rest read here


def _feed(analyzer: LogAnalyzer, fd: int, a: int, b: int) -> None:
    for c in range(a, b, READ_CHUNK):
        analyzer.feed(os.pread(fd, min(READ_CHUNK, b - c), c))


class _Slicers:
    """One worker process a slice, forked from the reader (its state at `start` inherited), each writing
    its answer (pickled) to its own pipe. The first slice's worker starts from the true state when
    the reader reads no slice itself (`truth`): its answer needs no window."""

    def __init__(self, fd: int, slices: list[tuple[int, int]], analyzer: LogAnalyzer, start: int) -> None:
        self.pids: list[int] = []
        self.answers: list[int] = []
        truth = slices[0][0] == start
        with _sigint_held():
            for k, (a, b) in enumerate(slices):
                read, write = os.pipe()
                try:
                    pid = os.fork()
                except BaseException:
                    os.close(read)
                    os.close(write)
                    self.stop()
                    raise
                if pid == 0:                          # the worker: never returns
                    _work(analyzer, fd, start, a, b, not (truth and k == 0), write, [read, *self.answers])
                os.close(write)
                _widen(read)
                self.pids.append(pid)
                self.answers.append(read)

    def answer(self, k: int) -> Optional[tuple]:
        pipe = self.answers[k]
        head = _read_exactly(pipe, 8)
        blob = _read_exactly(pipe, int.from_bytes(head, "little")) if head is not None else None
        try:
            return pickle.loads(blob) if blob is not None else None
        except Exception:                             # (a worker cut short: read its slice here)
            return None

    def stop(self) -> None:
        for end in self.answers:
            os.close(end)
        reap(self.pids)
        self.pids, self.answers = [], []


def _work(analyzer: LogAnalyzer, fd: int, start: int, a: int, b: int, guess: bool, out: int,
          readers: list[int]) -> None:
    """A worker's life: slice [a, b) read from the inherited state, its answer written, then os._exit."""
    status = 1
    try:
        for end in readers:
            os.close(end)
        _adopt(fd)
        line = analyzer.line + _newlines(fd, start, a)
        analyzer._line = line                         # the slice's first line, counted: line numbers are exact
        p = a
        checks: list[tuple[int, bytes]] = []
        for size in CHECKS if guess else ():
            q = _after_newline(fd, a + size, b, READ_CHUNK) or b
            if q > p:
                _feed(analyzer, fd, p, q)
                p = q
                checks.append((p, analyzer.state_blob()))
            if p >= b:
                break
        _feed(analyzer, fd, p, b)
        blob = pickle.dumps((checks if guess else None, analyzer.state_blob(), analyzer.line),
                            protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(out, len(blob).to_bytes(8, "little") + blob)
        status = 0
    except BaseException:                             # (a reader gone: it reads the slice itself)
        pass
    finally:
        os._exit(status)


def _newlines(fd: int, a: int, b: int) -> int:
    count = 0
    for c in range(a, b, 4 << 20):
        count += os.pread(fd, min(4 << 20, b - c), c).count(b"\n")
    return count
