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

import os
import signal
import sys
import threading
from collections import deque
from typing import Any, Optional

from . import sparse
from .model import READ_CHUNK, LogAnalysis
from .scanner import LogAnalyzer, analyze_stream

MIN_FILE = 32 << 20        # a smaller file: one process reads it in about the time the pool takes to start
# A worker task is the stretch's share of a worker, in TASKS_PER_WORKER parts (the last tasks then
# leave few workers idle), within these bounds: a fork and a result per task, memory per task.
TASK_BYTES = 8 << 20
MIN_TASK_BYTES = 1 << 20
TASKS_PER_WORKER = 4
# After a task the workers found dense, the spread ends (its pool too, the tasks handed out taken
# back) and this many bytes are read here, with the reader's own sparse reads and their backoff,
# before the workers are tried again (twice as many after a spread that read nothing mapped): a
# dense log's stretches are long, and while the reader's Python is the bound the workers' passes
# over them are wasted (and each pool costs the reader ~7,000 page faults, its heap copied on write).
DENSE_BACKOFF_BYTES = 64 << 20
# A mapped piece whose kept lines hold more than 1/KEPT_SHARE of its bytes (a few long anchored lines)
# is handed back as dense: results in flight then stay small whatever the lines (the reader's own
# sparse read of it, if any, is as cheap), and memory does not grow with the number of workers.
KEPT_SHARE = 4
IN_FLIGHT = 2              # tasks outstanding per worker: results are kept lines only, memory stays flat
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
    import multiprocessing                            # (here: its import is ~15 ms of every small file's run)
    if "fork" not in multiprocessing.get_all_start_methods():
        return analyze_stream(fh, max_bytes=max_bytes)
    analyzer = LogAnalyzer()
    pos = _read_here(analyzer, fd, 0, limit, limit, until_mapped=True)
    backoff = DENSE_BACKOFF_BYTES
    while limit - pos >= MIN_FILE // 2:
        pos, mapped = _spread(analyzer, fd, pos, limit, workers)
        if pos < limit:                               # a dense stretch: read here a while, with no pool alive
            backoff = DENSE_BACKOFF_BYTES if mapped else backoff * 2   # (dense from its start: longer)
            pos = _read_here(analyzer, fd, pos, pos + backoff, limit)
    fh.seek(pos)                                      # the rest (or what the file grew by) as analyze_stream reads
    return analyze_stream(fh, max_bytes=None if max_bytes is None else max_bytes - pos, analyzer=analyzer)


def _read_here(analyzer: LogAnalyzer, fd: int, pos: int, stop: int, limit: int, until_mapped: bool = False) -> int:
    """Feed the bytes from pos (just after a newline) through stop and on to the end of the line there,
    limit at most (or, until_mapped, until the analyzer accepts mapped pieces), in pieces ending after a
    newline (but a line longer than a piece, read a piece at a time); returns where it stopped: just after
    a newline, or limit, so that the analyzer holds no partial line there."""
    ended = True                                      # the bytes fed so far end with a line's newline
    while pos < limit and (pos < stop or not ended) and not (until_mapped and analyzer.accepts_mapped()):
        end = _after_newline(fd, pos + READ_CHUNK, limit, READ_CHUNK)
        ended = end != 0
        end = end or pos + READ_CHUNK                 # (0: no newline that near; then end < limit)
        analyzer.feed(os.pread(fd, end - pos, pos))
        pos = end
    return pos


def _spread(analyzer: LogAnalyzer, fd: int, start: int, limit: int, workers: int) -> tuple[int, bool]:
    """Feed the file's bytes from start (just after a newline) with the workers mapping its pieces, to
    limit or to the end of the first task they find dense (the pool then closes); returns (where, whether
    any piece was read mapped)."""
    step = max(MIN_TASK_BYTES, min(TASK_BYTES, (limit - start) // (workers * TASKS_PER_WORKER)))
    cuts = (_after_newline(fd, at, limit, step) for at in range(start + step, limit, step))
    bounds = sorted({start, limit, *(cut for cut in cuts if cut)})
    workers = min(workers, len(bounds) - 1)           # (a fork pool starts them all at once)
    tasks = iter(zip(bounds, bounds[1:]))
    sparse.prepare()                                  # the database compiled (or loaded) once, inherited
    # A forked worker flushes the stdio buffers it inherited when it exits: what this process had not
    # written yet (a `gpudeck serve` reply) would be written twice. One that cannot be emptied: no fork.
    if not _flushed(sys.stdout, sys.stderr):
        return start, False
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_adopt, initargs=(fd,)) as pool:
        try:
            return _feed_spread(analyzer, fd, pool, tasks, workers, start)
        except BaseException:
            # Ctrl-C (or an error reading): the tasks not begun are cancelled; leaving the `with` then
            # waits only for those the workers are running (a task's passes, milliseconds) and their exit.
            _shut(pool)
            raise


def _feed_spread(analyzer: LogAnalyzer, fd: int, pool: Any, tasks: Any, workers: int, at: int) -> tuple[int, bool]:
    """_spread's loop: the tasks handed out and their pieces fed in file order."""
    mapped = False
    pending: deque = deque()
    with _sigint_held():                              # (the first submit forks the workers)
        for a, b in tasks:
            pending.append((a, b, _submit(pool, a, b)))
            if len(pending) >= workers * IN_FLIGHT:
                break
    while pending:
        at, stop, future = pending.popleft()
        try:
            pieces = future.result()
        except Exception:                         # a worker died (killed, out of memory): read it here
            pieces = [(stop - at, None)]
        dense = all(got is None for _, got in pieces)
        if dense:                                 # the rest handed back; read here from this task's end
            _shut(pool)
            pending.clear()
        for a, b in () if dense else tasks:       # one more in flight for the one taken
            pending.append((a, b, _submit(pool, a, b)))
            break
        for length, got in pieces:
            if got is not None and analyzer.accepts_mapped():
                analyzer.feed_mapped(length, got)
                mapped = True
            else:
                for a in range(at, at + length, READ_CHUNK):
                    analyzer.feed_dense(os.pread(fd, min(READ_CHUNK, at + length - a), a))
            at += length
    return at, mapped


def _flushed(*streams: Any) -> bool:
    """Whether the streams hold no unwritten output, after a flush: one that is None (a process started
    with that descriptor closed) or closed holds none; one whose flush fails (a full pipe) may."""
    for stream in streams:
        flush = getattr(stream, "flush", None)
        if flush is None or getattr(stream, "closed", False):
            continue
        try:
            flush()
        except (OSError, ValueError):
            return False
    return True


class _sigint_held:
    """SIGINT blocked in this thread while the pool forks its workers, delivered when this ends. A fork
    pool forks them all in its first submit, before its manager thread (which alone tells them to
    stop) exists: a KeyboardInterrupt raised then left forked workers, SIGINT ignored, waiting for tasks
    for ever, and the process hung at exit joining them. The workers are forked with SIGINT blocked
    too, so that one not yet in _adopt is not killed by it with a traceback."""

    def __enter__(self) -> None:
        held = hasattr(signal, "pthread_sigmask")
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if held else None

    def __exit__(self, *exc: Any) -> None:
        if self.mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _shut(pool: Any) -> None:
    """pool.shutdown(wait=False, cancel_futures=True); the workers it forked terminated where its manager
    thread never started (an error, or a KeyboardInterrupt raised otherwise than by SIGINT, while it
    forked them): nothing else would tell them to stop, and the process would hang at exit joining them."""
    started = getattr(pool, "_executor_manager_thread", None) is not None
    forked = [] if started else list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in forked:
        process.terminate()
    for process in forked:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def _submit(pool: Any, start: int, stop: int) -> Any:
    """A future of the task; one that holds the error where the pool cannot take it (a fork refused,
    the pool broken by a worker's death): the reader then reads those bytes itself."""
    try:
        return pool.submit(_map_task, start, stop)
    except Exception as exc:
        from concurrent.futures import Future
        failed: Future = Future()
        failed.set_exception(exc)
        return failed


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
    # Ctrl-C reaches the whole process group: the reader stops the spread; a worker finishes its task
    # (milliseconds) and exits when told, instead of printing a KeyboardInterrupt traceback. (Forked
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
