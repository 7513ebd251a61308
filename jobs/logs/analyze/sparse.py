"""Sparse chunks: one hyperscan pass finds the physical lines that hold an anchor; the rest shrink to their newlines.

A serving log is mostly access lines that no signature reads (one stats line in hundreds).
Where hyperscan is installed, a chunk whose anchored lines are few is *compacted* before the
template scanner sees it: every physical line with a prefilter anchor is kept as it is, every
other line becomes its bare newline (an empty segment: inert, and line numbers hold). The
answer is the same, since a segment without an anchor is never examined; only the work
changes, from the template scanner's C passes over every byte (translate, split, group) to
hyperscan's scan (GB/s) and a few C copies. A chunk where anchored lines are not rare is
left whole (compacting it would cost more than it saves): the scan stops at the first
``len/DENSE_BYTES`` anchored lines, and the analyzer does not try again for the next
``DENSE_BACKOFF`` chunks (a log's dense stretches are long). Until the engine is known its
anchors are in the set (then a vLLM log's every line has one: nothing is compacted).
"""
from __future__ import annotations

import re
import threading
from typing import Any, Optional

from .hscache import compile_database
from .matcher import _hs
from .patterns import _COMMON_ANCHORS, _COUNT_ANCHOR, _ENGINE_ANCHORS, _NINJA_ANCHOR, _RANK_ANCHOR, _RARE_ANCHORS

MIN_BYTES = 64 * 1024      # smaller chunks: the template scanner alone is as cheap
# Compact only when at most one line in this many bytes holds an anchor: a kept line costs
# ~2 us here (a Python callback, copies), the template scanner ~0.5 ms a 256 KB chunk whatever it holds.
DENSE_BYTES = 2048
DENSE_BACKOFF = 8

_dbs: dict[bool, Any] = {}        # engine known? -> database (False: hyperscan refused to compile it)
_lock = threading.Lock()          # one database, one scratch: scans from two threads take turns


class _Dense(Exception):
    pass


def _database(engine_known: bool) -> Any:
    """One pattern: an anchor, then the rest of its physical line: one report per anchored line (at its
    end). Until the engine is known its anchors (and rank tags) are in the set, as in the prefilter's."""
    db = _dbs.get(engine_known)
    if db is None:
        pairs = _RARE_ANCHORS + _COMMON_ANCHORS + ([] if engine_known else _ENGINE_ANCHORS)
        specials = [_NINJA_ANCHOR, _COUNT_ANCHOR] + ([] if engine_known else [_RANK_ANCHOR])
        anchors = b"|".join([re.escape(lit) for lit in sorted({lit for lit, _ in pairs})] + specials)
        try:
            db = compile_database([b"(?:" + anchors + rb")[^\n]*\n"], [0], [0])    # (cached on disk: hscache.py)
        except Exception:              # a CPU hyperscan refuses: no compaction (degrade, never crash)
            db = False
        _dbs[engine_known] = db
    return db


def available() -> bool:
    return _hs is not None


def compact(buf: bytes, end: int, begin: int = 0, engine_known: bool = True) -> Optional[bytes]:
    """buf[begin:end] (begun and ended by a separator) with its unanchored lines reduced to their
    newline, or None to scan it whole (no hyperscan, a small chunk, a dense one)."""
    if _hs is None or end - begin < MIN_BYTES:
        return None
    cap = (end - begin) // DENSE_BYTES + 1
    ends: list[int] = []

    def on_hit(_id: int, _start: int, stop: int, _flags: int, _ctx: Any) -> Optional[bool]:
        ends.append(stop)
        return True if len(ends) > cap else None       # True halts the scan: a dense chunk

    view = buf[begin:end] if begin or end < len(buf) else buf
    try:
        with _lock:
            db = _database(engine_known)
            if db is False:
                return None
            db.scan(view, match_event_handler=on_hit)
    except _hs.ScanTerminated:
        return None
    if len(ends) > cap:
        return None
    out: list[bytes] = []
    pos = begin
    rfind, count = buf.rfind, buf.count
    for stop in ends:                                  # ascending: one report per line, at its newline
        stop += begin
        start = max(rfind(b"\n", begin, stop - 1) + 1, begin)
        out.append(b"\n" * count(b"\n", pos, start))
        out.append(buf[start:stop])
        pos = stop
    if pos < end:                                      # the last line ends with \r (no newline): read it
        start = max(rfind(b"\n", begin, end) + 1, begin)
        out.append(b"\n" * count(b"\n", pos, start))
        out.append(buf[start:end])
    return b"".join(out)
