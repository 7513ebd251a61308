"""Sparse chunks: one hyperscan pass finds the physical lines that hold an anchor; the reader reads only those.

A serving log is mostly access lines that no signature reads (one stats line in hundreds).
Where hyperscan is installed, a chunk whose anchored lines are few is read *sparsely*: every
physical line with a prefilter anchor is kept as it is, and the rest are never seen by the
template scanner. Once the engine is known (`mapped`) the kept lines travel joined, each
segment with its own line number; before, (`compact`) every other line becomes its bare
newline (an empty segment: inert, and line numbers hold). The answer is the same, since a
segment without an anchor is never examined (a kept line that matters to nothing is read and
found inert); only the work changes, from the template scanner's C passes over every byte
(translate, split, group) to hyperscan's scan (GB/s) and a few C copies. A chunk where
anchored lines are not rare is left whole (reading it sparsely would cost more than it
saves): a chunk is given up past ``len/DENSE_BYTES`` kept lines (the scan halts past
``REPORTS_PER_LINE`` times as many anchor reports), and the analyzer does not try again for the next
``DENSE_BACKOFF`` chunks (a log's dense stretches are long). Until the
engine is known its anchors are in the set (then a vLLM log's every line has one: nothing is
compacted).
"""
from __future__ import annotations

import re
import threading
from typing import Any, Optional

from .hscache import compile_database
from .matcher import _hs
from .patterns import _COMMON_ANCHORS, _ENGINE_ANCHORS, _RANK_ANCHOR, _RARE_ANCHORS

MIN_BYTES = 64 * 1024      # smaller chunks: the template scanner alone is as cheap
# Compact only when at most one line in this many bytes holds an anchor: a kept line costs
# ~2 us here (a Python callback, copies), the template scanner ~0.5 ms a 256 KB chunk whatever it holds.
DENSE_BYTES = 2048
DENSE_BACKOFF = 8
_COUNTER_ANCHOR = rb"\d/\d"   # patterns' ninja and counter anchors, [12/345] and " 3/8", in one
REPORTS_PER_LINE = 4       # a line's anchors each report (at their ends): the scan halts past this many a kept line

_dbs: dict[bool, Any] = {}        # engine known? -> database (False: hyperscan refused to compile it)
_lock = threading.Lock()          # one database, one scratch: scans from two threads take turns


def _database(engine_known: bool) -> Any:
    """Every anchor its own literal pattern, reported where it ends (the line is found from there):
    a multi-literal scan runs ~3x faster than one alternation that also spans the rest of its line.
    The counters' anchors (`[12/345]`, `shard 3/8`) are one `\\d/\\d`: a superset (a kept line that
    holds no counter is read and found inert), at half the cost of the two. Until the engine is
    known its anchors (and rank tags) are in the set, as in the prefilter's."""
    db = _dbs.get(engine_known)
    if db is None:
        pairs = _RARE_ANCHORS + _COMMON_ANCHORS + ([] if engine_known else _ENGINE_ANCHORS)
        specials = [_COUNTER_ANCHOR] + ([] if engine_known else [_RANK_ANCHOR])
        patterns = [re.escape(lit) for lit in sorted({lit for lit, _ in pairs})] + specials
        try:
            db = compile_database(patterns, [0] * len(patterns), [0] * len(patterns))   # (cached: hscache.py)
        except Exception:              # a CPU hyperscan refuses: no compaction (degrade, never crash)
            db = False
        _dbs[engine_known] = db
    return db


def prepare() -> None:
    """Compile (or load) the engine-known database now: processes forked after it inherit it."""
    with _lock:
        _database(True)


def available() -> bool:
    return _hs is not None


def kept_lines(buf: bytes, end: int, begin: int = 0, engine_known: bool = True) -> Optional[list[tuple[int, int]]]:
    """The (start, stop) offsets of the physical lines of buf[begin:end] (begun and ended by a separator)
    that hold an anchor, ascending, each ending with its newline; the last one, ended by \\r and no
    newline, is always kept. None to scan the chunk whole (no hyperscan, a small chunk, a dense one)."""
    if _hs is None or end - begin < MIN_BYTES:
        return None
    cap = (end - begin) // DENSE_BYTES + 1
    ends: list[int] = []
    limit = cap * REPORTS_PER_LINE

    def on_hit(_id: int, _start: int, stop: int, _flags: int, _ctx: Any) -> Optional[bool]:
        ends.append(stop)
        return True if len(ends) > limit else None       # True halts the scan: a dense chunk

    view = buf[begin:end] if begin or end < len(buf) else buf
    try:
        with _lock:
            db = _database(engine_known)
            if db is False:
                return None
            db.scan(view, match_event_handler=on_hit)
    except _hs.ScanTerminated:
        return None
    ends.sort()                                        # (reported by end offset; sorted to be sure)
    spans: list[tuple[int, int]] = []
    rfind, find = buf.rfind, buf.find
    stop = -1
    for hit in ends:
        hit += begin
        if hit < stop:                                 # another anchor of the line just kept
            continue
        start = rfind(b"\n", begin, hit) + 1 or begin
        stop = find(b"\n", hit, end) + 1
        if not stop:                                   # the \r-ended piece after the last newline: kept below
            break
        spans.append((start, stop))
        if len(spans) > cap:
            return None
    last = spans[-1][1] if spans else begin
    if last < end:
        nl = rfind(b"\n", last, end) + 1
        if nl < end:                                   # the last line ends with \r (no newline): read it
            spans.append((max(nl, last), end))
    return spans


def compact(buf: bytes, end: int, begin: int = 0, engine_known: bool = True) -> Optional[bytes]:
    """buf[begin:end] with its unanchored lines reduced to their newline (line numbers hold: the
    reader counts them), or None to scan it whole: the reading before the engine is known (after it, mapped)."""
    spans = kept_lines(buf, end, begin, engine_known)
    if spans is None:
        return None
    out: list[bytes] = []
    pos = begin
    count = buf.count
    for start, stop in spans:
        out.append(b"\n" * count(b"\n", pos, start))
        out.append(buf[start:stop])
        pos = stop
    out.append(b"\n" * count(b"\n", pos, end))
    return b"".join(out)


def mapped(buf: bytes, end: int, begin: int, line: int) -> Optional[tuple[bytes, list[int], int]]:
    """The engine known: (the anchored lines of buf[begin:end] joined, the physical line number of each
    of their segments (\\r splits a line into several), the line number after buf[:end]), `line` being
    buf[begin]'s; or None to scan the chunk whole. The reader then splits only the kept lines, not
    the ~2,000 empty ones a compacted 256 KB chunk of a serving log holds."""
    spans = kept_lines(buf, end, begin, True)
    if spans is None:
        return None
    kept = [buf[start:stop] for start, stop in spans]
    lines: list[int] = []
    pos = begin
    count = buf.count
    for start, stop in spans:
        line += count(b"\n", pos, start)
        lines.append(line)
        line += 1
        pos = stop
    blob = b"".join(kept)
    if b"\r" in blob:                                  # every segment of a kept line has that line's number
        lines = [n for n, raw in zip(lines, kept) for n in [n] * (raw.count(b"\r") + raw.count(b"\n"))]
    if spans and spans[-1][1] == end and buf[end - 1] != 0x0A:
        line -= 1                                      # the \r-ended piece: no newline passed
    line += count(b"\n", pos, end)
    return blob, lines, line
