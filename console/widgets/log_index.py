"""A growing log file, indexed by line without ever being loaded whole (no Textual here)."""
from __future__ import annotations

import os
import stat
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass

# Why per-block newline counts rather than one offset per line: a 1 GB log of
# 100-byte lines has 10 M lines, i.e. 80 MB of offsets; counting newlines per
# 64 KiB block costs 8 bytes per block (128 KiB per GB) and `bytes.count` runs
# at memory speed, so a multi-GB file is indexed in about a second.  Exact line
# offsets are recovered for the few blocks on screen, and cached.
BLOCK = 64 * 1024
READ_CHUNK = 1024 * 1024
# Display cap for one line: a 100 MB line must not cost 100 MB to show.
LINE_DISPLAY_LIMIT = 16 * 1024


@dataclass(frozen=True)
class IndexState:
    """What the index knows at one instant (safe to read from another thread)."""

    size: int              # bytes indexed
    newlines: int          # newline bytes in [0, size)
    line_count: int        # counts an unterminated last line
    generation: int        # bumped when the file was truncated or replaced


class LogIndex:
    """Line index over an append-only file; `update()` may run in a worker thread.

    A truncated or replaced file (size shrinks, inode changes) resets the index
    and bumps `generation`, so callers drop what they cached.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        # _block_newlines[b] = newlines in [0, b * BLOCK); only complete
        # boundaries are recorded, so the entries never change once written.
        self._block_newlines = array("Q", [0])
        self._size = 0
        self._newlines = 0
        self._ends_with_newline = True
        self._generation = 0
        self._block_cache: OrderedDict[tuple[int, int, int], array] = OrderedDict()
        # Replay shows the file as it stood at an instant: only its first `limit` bytes.
        # Lowering the limit below what is indexed re-indexes (a new generation), like a truncation.
        self.limit: int | None = None

    # -- scanning --------------------------------------------------------
    def _open(self) -> bool:
        if self._fd is not None:
            return True
        try:
            # O_NONBLOCK: a FIFO planted as output.log opens at once and is refused below, never read.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return False
        os.set_blocking(fd, True)
        self._fd = fd
        self._inode = (st.st_dev, st.st_ino)
        return True

    def _reset(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = None
            self._inode = None
            self._block_newlines = array("Q", [0])
            self._size = 0
            self._newlines = 0
            self._ends_with_newline = True
            self._generation += 1
            self._block_cache.clear()

    def update(self, max_bytes: int = 64 * 1024 * 1024) -> bool:
        """Index up to `max_bytes` of new data; True if anything changed."""
        try:
            st_path = os.stat(self.path)
        except OSError:
            if self._fd is not None and self._size:
                return False        # deleted while open: keep showing what we have
            return False
        limit = self.limit
        if self._fd is not None and (
            (st_path.st_dev, st_path.st_ino) != self._inode or st_path.st_size < self._size
            or (limit is not None and limit < self._size)
        ):
            self._reset()
            changed = True
        else:
            changed = False
        if not self._open():
            return changed
        fd = self._fd
        assert fd is not None                   # _open() succeeded
        end = min(os.fstat(fd).st_size, self._size + max_bytes)
        if limit is not None:
            end = min(end, limit)
        pos = self._size
        if pos >= end:
            return changed
        newlines = self._newlines
        boundaries = self._block_newlines
        last_byte = b""
        while pos < end:
            data = os.pread(fd, min(READ_CHUNK, end - pos), pos)
            if not data:
                break
            offset = 0
            while offset < len(data):
                boundary = len(boundaries) * BLOCK
                take = min(len(data) - offset, boundary - (pos + offset))
                newlines += data.count(b"\n", offset, offset + take)
                offset += take
                if pos + offset == boundary:
                    boundaries.append(newlines)
            pos += len(data)
            last_byte = data[-1:]
        with self._lock:
            self._size = pos
            self._newlines = newlines
            self._ends_with_newline = last_byte == b"\n"
        return True

    @property
    def file_size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def state(self) -> IndexState:
        with self._lock:
            partial = 0 if (self._size == 0 or self._ends_with_newline) else 1
            return IndexState(self._size, self._newlines, self._newlines + partial, self._generation)

    @property
    def line_count(self) -> int:
        return self.state().line_count

    # -- lookups ---------------------------------------------------------
    def _block_positions(self, block: int, size: int) -> array:
        """Absolute offsets of the newlines inside one block (cached)."""
        start = block * BLOCK
        stop = min(start + BLOCK, size)
        key = (self._generation, block, stop)
        cached = self._block_cache.get(key)
        if cached is not None:
            self._block_cache.move_to_end(key)
            return cached
        data = os.pread(self._fd, stop - start, start) if self._fd is not None else b""
        positions = array("Q")
        find = data.find
        at = find(b"\n")
        while at >= 0:
            positions.append(start + at)
            at = find(b"\n", at + 1)
        self._block_cache[key] = positions
        if len(self._block_cache) > 256:
            self._block_cache.popitem(last=False)
        return positions

    def _newline_offset(self, k: int, size: int) -> int:
        """Offset of the k-th (0-based) newline; k must be < newlines."""
        block = bisect_right(self._block_newlines, k) - 1
        positions = self._block_positions(block, size)
        return positions[k - self._block_newlines[block]]

    def line_span(self, line: int) -> tuple[int, int]:
        """(start, end) byte offsets of a line, end excluding its newline."""
        st = self.state()
        if not 0 <= line < st.line_count:
            raise IndexError(line)
        start = 0 if line == 0 else self._newline_offset(line - 1, st.size) + 1
        end = self._newline_offset(line, st.size) if line < st.newlines else st.size
        return start, end

    def line_at_offset(self, offset: int) -> int:
        """The line that contains byte `offset`."""
        st = self.state()
        offset = max(0, min(offset, st.size))
        block = offset // BLOCK
        if block >= len(self._block_newlines):
            block = len(self._block_newlines) - 1
        positions = self._block_positions(block, st.size)
        return self._block_newlines[block] + bisect_left(positions, offset)

    def read_line(self, line: int, limit: int = LINE_DISPLAY_LIMIT) -> tuple[bytes, int]:
        """Raw bytes of a line for display, and how many bytes were left out.

        A line longer than `limit` is shown by what a terminal would show: if its
        tail holds carriage returns (a progress bar redrawn thousands of times),
        the last redraw; otherwise its head.
        """
        start, end = self.line_span(line)
        length = end - start
        if self._fd is None or length <= 0:
            return b"", 0
        if length <= limit:
            return os.pread(self._fd, length, start), 0
        tail = os.pread(self._fd, limit, end - limit)
        cut = tail.rstrip(b"\r").rfind(b"\r")
        if cut >= 0:
            shown = tail[cut + 1:]
            return shown, length - len(shown)
        return os.pread(self._fd, limit, start), length - limit

    def read_range(self, start: int, length: int) -> bytes:
        if self._fd is None:
            return b""
        return os.pread(self._fd, length, start)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class LogSearch:
    """Case-insensitive substring search over the raw bytes, resumable as the file grows.

    Matching lines are collected as line numbers (at most `cap` are kept; the
    count goes on).  `scan()` is meant to run in a worker thread.
    """

    def __init__(self, index: LogIndex, query: str, cap: int = 1_000_000) -> None:
        self.index = index
        self.query = query
        self._needle = query.encode("utf-8", "replace").lower()
        self.cap = cap
        self.lines = array("Q")
        self.count = 0
        self.scanned = 0               # bytes searched
        self._line_no = 0              # line number at `scanned`
        self._last_match_line = -1
        self.generation = index.state().generation
        self.cancelled = False

    def scan(self, until: int | None = None, chunk: int = 4 * 1024 * 1024) -> bool:
        """Search [scanned, until); True if it reached `until` (not cancelled)."""
        if not self._needle:
            return True
        st = self.index.state()
        if st.generation != self.generation:
            return False
        end = st.size if until is None else min(until, st.size)
        needle = self._needle
        overlap = len(needle) - 1
        pos = self.scanned
        while pos < end:
            if self.cancelled:
                return False
            data = self.index.read_range(pos, min(chunk, end - pos))
            if not data:
                break
            # Advance only to the last complete line: a line still being written
            # is searched now and again once complete (dedup by line number).
            cut = data.rfind(b"\n")
            if cut >= 0:
                advance = cut + 1
            elif pos + len(data) < end:
                # Inside one huge line: keep a tail so a match across chunks is found.
                advance = max(1, len(data) - overlap)
            else:
                advance = 0
            lowered = data.lower()
            line_no = self._line_no
            counted_to = 0
            at = lowered.find(needle)
            while at >= 0:
                line_no += lowered.count(b"\n", counted_to, at)
                counted_to = at
                if line_no != self._last_match_line:
                    self._last_match_line = line_no
                    self.count += 1
                    if len(self.lines) < self.cap:
                        self.lines.append(line_no)
                newline = lowered.find(b"\n", at)
                if newline < 0:
                    break
                at = lowered.find(needle, newline + 1)
            self._line_no = line_no + lowered.count(b"\n", counted_to, advance)
            pos += advance
            self.scanned = pos
            if advance == 0:
                break
        return True

    def next_line(self, after: int) -> int | None:
        i = bisect_right(self.lines, after)
        if i < len(self.lines):
            return self.lines[i]
        return self.lines[0] if self.lines else None

    def previous_line(self, before: int) -> int | None:
        i = bisect_left(self.lines, before)
        if i > 0:
            return self.lines[i - 1]
        return self.lines[-1] if self.lines else None

    def position_of(self, line: int) -> int | None:
        """1-based ordinal of a matching line, or None."""
        i = bisect_left(self.lines, line)
        if i < len(self.lines) and self.lines[i] == line:
            return i + 1
        return None
