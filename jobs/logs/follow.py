"""Follow a growing log file by byte offset: new complete lines since an offset, the partial tail kept back.

The log is read, never loaded whole: a follower remembers a byte offset and
returns what was appended since. A line longer than `max_line_bytes` comes back
in pieces (`complete=False`) so a 20 MB line without a newline never sits in
memory whole. Used by `gpudeck logs -f`, the console's log pane and the analyzers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from gpudeck.jobs.paths import open_regular
MAX_LINE_BYTES = 1 << 20
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class LogLine:
    offset: int          # byte offset of `data` in the file
    data: bytes          # without the trailing "\n"
    complete: bool = True   # False: a piece of an over-long line; more of it follows

    @property
    def end(self) -> int:
        """Offset just past this piece (and its newline, if complete)."""
        return self.offset + len(self.data) + (1 if self.complete else 0)


class LogFollower:
    """Reads what a file gained since the last call, as lines, starting at `offset`."""

    def __init__(self, path: str | os.PathLike, offset: int = 0,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self._pos = offset             # next byte to read from the file
        self._partial = b""            # bytes after the last newline, not yet returned
        self._partial_at = offset      # file offset of _partial[0]

    @property
    def offset(self) -> int:
        """Offset of the first byte not yet returned (start of the partial line)."""
        return self._partial_at

    @property
    def partial(self) -> bytes:
        """The unterminated last line seen so far (e.g. a progress bar being redrawn)."""
        return self._partial

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def read(self, max_bytes: int = 8 * READ_CHUNK) -> list[LogLine]:
        """New complete lines (and pieces of over-long ones) since the last call."""
        lines: list[LogLine] = []
        try:
            fh = open_regular(self.path)      # a FIFO planted as output.log must not block the reader
        except OSError:
            return lines
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self._pos:
                # Truncated or replaced: start over rather than read garbage offsets.
                self._pos = 0
                self._partial = b""
                self._partial_at = 0
            budget = max_bytes
            fh.seek(self._pos)
            while budget > 0:
                chunk = fh.read(min(READ_CHUNK, budget))
                if not chunk:
                    break
                self._pos += len(chunk)
                budget -= len(chunk)
                self._split(self._partial + chunk, lines)
        return lines

    def feed(self, chunk: bytes) -> list[LogLine]:
        """Lines from bytes that arrived another way (a remote host's log, by offset) instead of the file."""
        lines: list[LogLine] = []
        if chunk:
            self._pos += len(chunk)
            self._split(self._partial + chunk, lines)
        return lines

    def _split(self, data: bytes, lines: list[LogLine]) -> None:
        start = 0
        at = self._partial_at
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self._emit(data, start, nl, at, lines)
            start = nl + 1
        rest = data[start:]
        rest_at = at + start
        while len(rest) > self.max_line_bytes:
            lines.append(LogLine(rest_at, rest[:self.max_line_bytes], False))
            rest = rest[self.max_line_bytes:]
            rest_at += self.max_line_bytes
        self._partial = rest
        self._partial_at = rest_at

    def _emit(self, data: bytes, start: int, end: int, at: int, lines: list[LogLine]) -> None:
        # A complete line longer than the cap comes out in pieces too: one rule for every line.
        while end - start > self.max_line_bytes:
            lines.append(LogLine(at + start, data[start:start + self.max_line_bytes], False))
            start += self.max_line_bytes
        lines.append(LogLine(at + start, data[start:end], True))

    def flush(self) -> Optional[LogLine]:
        """Return the partial tail as a final line (when the writer is known to be done)."""
        if not self._partial:
            return None
        line = LogLine(self._partial_at, self._partial, True)
        self._partial_at += len(self._partial)
        self._partial = b""
        return line


def tail_offset(path: str | os.PathLike, n: int, block: int = 64 * 1024) -> int:
    """Offset where the last `n` lines of the file begin (an unterminated last line counts)."""
    if n <= 0:
        try:
            return os.stat(path).st_size
        except OSError:
            return 0
    try:
        fh = open_regular(path)
    except OSError:
        return 0
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return 0
        fh.seek(size - 1)
        # A final newline ends the last line; it does not start another.
        end = size - 1 if fh.read(1) == b"\n" else size
        pos = end
        found = 0
        while pos > 0:
            step = min(block, pos)
            fh.seek(pos - step)
            data = fh.read(step)
            idx = len(data)
            while True:
                idx = data.rfind(b"\n", 0, idx)
                if idx < 0:
                    break
                found += 1
                if found == n:
                    return pos - step + idx + 1
            pos -= step
        return 0


def follow(path: str | os.PathLike, offset: int = 0, *, done: Callable[[], bool],
           poll_s: float = 0.2, max_line_bytes: int = MAX_LINE_BYTES,
           on_idle: Optional[Callable[[bytes], None]] = None) -> Iterator[LogLine]:
    """Yield lines as they arrive until `done()` is true and the file has no more to give.

    `done` is checked before the final read, so output written just before the
    writer ended is never missed; the unterminated tail is flushed at the end.
    `on_idle(partial)` is called when a poll brought no complete line, with the
    unterminated last line as it stands (a `\r`-redrawn progress bar): a follower
    can show its current redraw, as a terminal would.
    """
    follower = LogFollower(path, offset, max_line_bytes)
    while True:
        finished = done()
        lines = follower.read()
        yield from lines
        if finished and not lines:
            tail = follower.flush()
            if tail is not None:
                yield tail
            return
        if not lines:
            if on_idle is not None:
                on_idle(follower.partial)
            time.sleep(poll_s)
