"""Whole-file analysis with the byte passes spread over processes: workers find a sparse log's kept lines, one reader reads them in order.

On a serving log the reader's cost is its C passes over every byte (sparse.py: hyperscan's
scan of the anchors, the newline count that numbers the kept lines), not Python: those
passes are what one core cannot make faster. Here worker processes (forked, one per core)
make them, each on its own stretch of the file, and hand back per READ_CHUNK piece exactly
what sparse.mapped would (the kept lines and their line numbers, counted from the piece's
start) or None for a piece that is dense. The reader, in this process, takes the pieces in
file order: a mapped piece through LogAnalyzer.feed_mapped (no byte of it read here), any
other through feed as before. The answer is the serial one by construction: the same
pieces, read by the same code, in the same order; only which process ran the byte passes
differs. The engine must be known first (before, a piece's kept lines depend on what the
log named so far), so the file is read serially until it is; a log that never names one
(a build, a training run) is read serially throughout, as analyze_stream would.
"""
from __future__ import annotations

import marshal
import os
import signal
import threading
from typing import Any, Optional

from . import sparse
from .model import READ_CHUNK, LogAnalysis
from .scanner import LogAnalyzer, analyze_stream

MIN_FILE = 32 << 20        # a smaller file: one process reads it in about the time the workers take to start
# A worker task is the stretch's share of a worker, in TASKS_PER_WORKER parts (the last tasks then
# leave few workers idle), within these bounds: a fork and a result per task, memory per task.
TASK_BYTES = 8 << 20
MIN_TASK_BYTES = 1 << 20
TASKS_PER_WORKER = 4
# After a task the workers found dense, the spread ends (its workers stopped, what they mapped
# ahead dropped) and this many bytes are read here, with the reader's own sparse reads and their backoff,
# before the workers are tried again (twice as many after a spread that read nothing mapped): a
# dense log's stretches are long, and while the reader's Python is the bound the workers' passes
# over them are wasted (and each spread costs the reader page faults, its heap copied on write).
DENSE_BACKOFF_BYTES = 64 << 20
# A mapped piece whose kept lines hold more than 1/KEPT_SHARE of its bytes (a few long anchored lines)
# is handed back as dense: results in flight then stay small whatever the lines (the reader's own
# sparse read of it, if any, is as cheap), and memory does not grow with the number of workers.
KEPT_SHARE = 4
FIRST_PIECE = 16 << 10     # the first read, until the engine is known (then twice as much each time)
IN_FLIGHT = 2              # tasks a worker may map ahead of the reader's taking their answers
PIPE_BYTES = 1 << 20       # a worker's answers' pipe: its answers ahead written without waiting
_fd = -1                   # the log's descriptor, in a worker (inherited over fork)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                            # (not Linux)
        return os.cpu_count() or 1


def analyze_regular(fh: Any, *, max_bytes: Optional[int] = None,
                    workers: Optional[int] = None) -> tuple[LogAnalysis, bool]:
    """(analysis, truncated) of an open regular file read from its start, as analyze_stream gives them;
    the byte passes spread over `workers` processes (default: one per usable core) where that pays."""
    workers = usable_cores() if workers is None else workers
    fd = fh.fileno()
    size = os.fstat(fd).st_size
    limit = size if max_bytes is None else min(size, max_bytes)
    # Forking a process with other threads can copy a lock held mid-use: then one reader it is.
    if workers < 2 or limit < MIN_FILE or not sparse.available() or fh.tell() != 0 or threading.active_count() > 1:
        return analyze_stream(fh, max_bytes=max_bytes)
    if not hasattr(os, "fork"):
        return analyze_stream(fh, max_bytes=max_bytes)
    analyzer = LogAnalyzer()
    pos = _read_here(analyzer, fd, 0, limit, limit, until_mapped=True)
    backoff = DENSE_BACKOFF_BYTES
    while limit - pos >= MIN_FILE // 2:
        pos, mapped = _spread(analyzer, fd, pos, limit, workers)
        if limit - pos >= MIN_FILE // 2 and analyzer.accepts_mapped():
            # A dense stretch: the rest read in slices, examination and all, by workers (slices.py)
            from .slices import read_dense            # (slices.py imports this module)
            at = read_dense(analyzer, fd, pos, limit, workers)
            if at > pos:
                pos = at
                continue
        if pos < limit:                               # a dense stretch: read here a while, with no pool alive
            backoff = DENSE_BACKOFF_BYTES if mapped else backoff * 2   # (dense from its start: longer)
            pos = _read_here(analyzer, fd, pos, pos + backoff, limit)
    fh.seek(pos)                                      # the rest (or what the file grew by) as analyze_stream reads
    return analyze_stream(fh, max_bytes=None if max_bytes is None else max_bytes - pos, analyzer=analyzer)


def _read_here(analyzer: LogAnalyzer, fd: int, pos: int, stop: int, limit: int, until_mapped: bool = False) -> int:
    """Feed the bytes from pos (just after a newline) through stop and on to the end of the line there,
    limit at most (or, until_mapped, until the analyzer accepts mapped pieces), in pieces ending after a
    newline (but a line longer than a piece, read a piece at a time); returns where it stopped: just after
    a newline, or limit, so that the analyzer holds no partial line there. Until mapped, the pieces
    start small and double: a log names its engine in its first lines, and what is read here before
    the workers start is read in full, one line at a time."""
    ended = True                                      # the bytes fed so far end with a line's newline
    piece = FIRST_PIECE if until_mapped else READ_CHUNK
    while pos < limit and (pos < stop or not ended) and not (until_mapped and analyzer.accepts_mapped()):
        end = _after_newline(fd, pos + piece, limit, READ_CHUNK)
        ended = end != 0
        end = end or pos + READ_CHUNK                 # (0: no newline that near; then end < limit)
        analyzer.feed(os.pread(fd, end - pos, pos))
        pos = end
        piece = min(READ_CHUNK, piece * 2)
    return pos


def _spread(analyzer: LogAnalyzer, fd: int, start: int, limit: int, workers: int) -> tuple[int, bool]:
    """Feed the file's bytes from start (just after a newline) with the workers mapping its pieces, to
    limit or to the end of the first task they find dense (the workers are then stopped), or to its start
    where the rest is one for the slices (analyze_regular); returns (where, whether any piece was read
    mapped)."""
    step = max(MIN_TASK_BYTES, min(TASK_BYTES, (limit - start) // (workers * TASKS_PER_WORKER)))
    cuts = (_after_newline(fd, at, limit, step) for at in range(start + step, limit, step))
    bounds = sorted({start, limit, *(cut for cut in cuts if cut)})
    tasks = list(zip(bounds, bounds[1:]))
    sparse.prepare()                                  # the database compiled (or loaded) once, inherited
    pool = _Workers()
    try:
        pool.start(fd, tasks, min(workers, len(tasks)))
        return _feed_spread(analyzer, fd, pool, tasks, start, limit)
    finally:
        # Done, a dense task, Ctrl-C or an error reading: a worker still mapping is stopped (its
        # answers would be read by no one) and every one reaped, none left behind.
        pool.stop()


def _feed_spread(analyzer: LogAnalyzer, fd: int, pool: _Workers, tasks: list, at: int, limit: int) -> tuple[int, bool]:
    """_spread's loop: the tasks' pieces fed in file order, as the workers hand them back."""
    mapped = False
    for number, (a, b) in enumerate(tasks):
        pieces = pool.answer(number)
        if pieces is None:                            # its worker died (killed, out of memory): read it here
            pieces = [(b - a, None)]
        dense = all(got is None for _, got in pieces)
        if dense:                                     # (the workers stopped before this task is read here)
            pool.stop()
            if analyzer.accepts_mapped() and limit - at >= MIN_FILE // 2:
                return at, mapped                     # left to the slices, this task and all (slices.py)
        for length, got in pieces:
            if got is not None and analyzer.accepts_mapped():
                analyzer.feed_mapped(length, got)
                mapped = True
            else:
                for c in range(at, at + length, READ_CHUNK):
                    analyzer.feed_dense(os.pread(fd, min(READ_CHUNK, at + length - c), c))
            at += length
        if dense:                                     # the rest is read here, from this task's end
            break
    return at, mapped


class _Workers:
    """Worker processes forked from this one, worker k mapping tasks k, k + n, k + 2n ... in order and
    writing each answer (marshal) to its own pipe, which the reader reads in task order.

    Not concurrent.futures' process pool: importing it and multiprocessing, forking every worker
    before the first task, its manager thread and queues and its shutdown cost ~0.1 s on the VM
    with 16 workers, about what the spread saves on a serving log of 200 MB there. A worker begins a task only with a
    credit from the reader (a byte on a second pipe): IN_FLIGHT at first, one more for each answer
    taken. So it runs that far ahead and no further, whatever its answers' size: memory stays flat,
    and on a dense log, where the reader is slow, idle workers take no core from it. A worker that
    dies leaves an end of file where its answer was; the reader then reads those bytes itself."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.answers: list[int] = []                  # the reader's end of each worker's answers
        self.credits: list[int] = []                  # the reader's end of each worker's credits

    def start(self, fd: int, tasks: list, n: int) -> None:
        with _sigint_held():                          # (delivered once they are all forked)
            for k in range(n):
                answers, credits = os.pipe(), os.pipe()
                try:
                    pid = os.fork()
                except BaseException:
                    for end in (*answers, *credits):
                        os.close(end)
                    raise
                if pid == 0:                          # the worker: never returns
                    _work(fd, tasks[k::n], credits[0], answers[1],
                          [answers[0], credits[1], *self.answers, *self.credits])
                os.close(answers[1])
                os.close(credits[0])
                self.pids.append(pid)
                self.answers.append(answers[0])
                self.credits.append(credits[1])
                _widen(answers[0])
                os.write(credits[1], b"+" * IN_FLIGHT)

    def answer(self, number: int) -> Optional[list]:
        """Task `number`'s pieces (as _map_task made them), or None where its worker died first."""
        k = number % len(self.answers)
        pipe = self.answers[k]
        head = _read_exactly(pipe, 8)
        size = int.from_bytes(head, "little") if head is not None else -1
        blob = _read_exactly(pipe, size) if size >= 0 else None
        try:
            os.write(self.credits[k], b"+")
        except OSError:                               # (a worker gone)
            pass
        try:
            return marshal.loads(blob) if blob is not None else None
        except (EOFError, ValueError, TypeError):
            return None

    def stop(self) -> None:
        for end in (*self.answers, *self.credits):
            os.close(end)
        reap(self.pids)
        self.pids, self.answers, self.credits = [], [], []


def reap(pids: list[int]) -> None:
    """Workers killed (one still at work reads for no one) and waited for, none left behind."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)              # (one done already has exited: a zombie, harmless)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _work(fd: int, tasks: list, credits: int, out: int, readers: list[int]) -> None:
    """A worker's life: its tasks mapped, each once credited, and written to `out`, then os._exit,
    whatever happens (no stdio buffer inherited is flushed, no atexit hook of the reader's runs here)."""
    status = 1
    try:
        for end in readers:                           # the reader's ends: a reader gone is then a broken pipe
            os.close(end)
        _adopt(fd)
        for a, b in tasks:
            if not os.read(credits, 1):               # the reader is done with this worker
                break
            blob = marshal.dumps(_map_task(a, b))
            _write_all(out, len(blob).to_bytes(8, "little") + blob)
        status = 0
    except BaseException:                             # (a reader gone, a cut file: the reader copes)
        pass
    finally:
        os._exit(status)


def _widen(pipe: int) -> None:
    """A pipe of 1 MiB instead of 64 KiB (Linux), so that a worker can run a task or two ahead."""
    try:
        import fcntl
        fcntl.fcntl(pipe, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ImportError):
        pass


def _read_exactly(pipe: int, size: int) -> Optional[bytes]:
    parts, left = [], size
    while left:
        got = os.read(pipe, min(left, 1 << 20))
        if not got:
            return None
        parts.append(got)
        left -= len(got)
    return b"".join(parts)


def _write_all(pipe: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(pipe, view):]


class _sigint_held:
    """SIGINT blocked in this thread while the workers are forked, delivered when this ends: a
    KeyboardInterrupt raised between two forks is then raised after them, where _spread stops them
    all. The workers are forked with SIGINT blocked too, so that one not yet in _adopt is not killed
    by it with a traceback."""

    def __enter__(self) -> None:
        held = hasattr(signal, "pthread_sigmask")
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if held else None

    def __exit__(self, *exc: Any) -> None:
        if self.mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _after_newline(fd: int, at: int, limit: int, reach: int) -> int:
    """The offset just after the first newline at or after at - 1 within `reach` bytes; limit from
    limit on; 0 if there is none (a line that long)."""
    if at >= limit:
        return limit
    at -= 1
    end = min(limit, at + reach)
    window = 4096
    while at < end:
        got = os.pread(fd, min(window, end - at), at)
        nl = got.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        if not got:
            break
        at += len(got)
        window *= 2
    return limit if end >= limit else 0


def _adopt(fd: int) -> None:
    global _fd
    _fd = fd
    # Ctrl-C reaches the whole process group: the reader stops the spread and kills its workers; a
    # worker ignores it, instead of printing a KeyboardInterrupt traceback. (Forked
    # with SIGINT blocked, _sigint_held: one that came since is dropped as ignored, then unblocked.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _map_task(start: int, stop: int) -> list[tuple[int, Optional[tuple[bytes, list[int], int]]]]:
    """In a worker: the bytes [start, stop) as the pieces the reader will take, each (its length, sparse.mapped's
    answer from line 0) or (its length, None): dense, or not ended by a newline. A piece is read, scanned
    and counted while it is in the CPU's cache (READ_CHUNK at most, to its last newline); a run of
    mapped pieces is handed back as one, so the reader pays its per-call work once."""
    out: list[tuple[int, Optional[tuple[bytes, list[int], int]]]] = []
    run: list[tuple[int, tuple[bytes, list[int], int]]] = []
    a = start
    inside = False                                    # a is inside a line begun in an earlier piece
    while a < stop:
        data = os.pread(_fd, min(READ_CHUNK, stop - a), a)
        nl = data.find(b"\n") if inside else data.rfind(b"\n")
        # A line longer than a piece goes to the reader a piece at a time, to its newline (a worker's
        # reads stay a piece long, whatever the line's length); the file cut while read: the rest.
        end = nl + 1 or len(data) or stop - a
        got = sparse.mapped(data, end, 0, 0) if nl >= 0 and not inside else None
        if got is not None and len(got[0]) > end // KEPT_SHARE:
            got = None                                # its kept lines are most of it: the reader reads it whole
        inside = nl < 0
        if got is None:
            _flush(run, out)
            out.append((end, None))
        else:
            run.append((end, got))
        a += end
    _flush(run, out)
    return out


def _flush(run: list[tuple[int, tuple[bytes, list[int], int]]], out: list) -> None:
    """A run of consecutive mapped pieces appended to out as one piece, and emptied."""
    if not run:
        return
    lines: list[int] = []
    base = 0
    for _length, (_blob, more, end) in run:
        lines.extend([base + n for n in more] if base else more)
        base += end
    out.append((sum(length for length, _ in run), (b"".join(got[0] for _, got in run), lines, base)))
    run.clear()
