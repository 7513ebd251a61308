"""The table's multi-pattern matcher: which rows can match a record, found in one pass in C.

Backends, same answers (each candidate row still confirms with its own Python pattern, so a
backend only decides which rows are worth asking):
- ``hyperscan`` (optional: the PyPI wheel, imported if it installs): every row's pattern in one
  database, compiled in prefilter mode (a superset of the row's matches: hyperscan has no
  lookarounds) on first use (~0.2 s, not at import; cached on disk from then on: hscache.py);
  one scan names the rows. Its classes are ASCII's (Unicode ones cost seconds to compile), so a
  record that is not printable ASCII asks every row: there Python's \\w, \\s, \\d may match what
  hyperscan's do not;
- ``re`` (stdlib, always there): every row is asked, by priority, each with its own compiled
  pattern (what the analyzer did before the table). A combined alternation of all the rows as a
  gate was measured and dropped: 25.3 us a fixture record against 19.5 us without it (its
  branches do not start with literals, so the engine tries every position).
Rows without a pattern (a level, a custom test) are always asked.
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

try:                                  # optional: the logs package is stdlib-only without it
    import hyperscan
except ImportError:                   # pragma: no cover - depends on the machine
    # mypy types a module name as never None; here None is "not installed", which every use tests first.
    hyperscan = None                  # type: ignore[assignment]
_hs = hyperscan                       # an assignment, not an import: exported, for sparse.py

BACKENDS = ("hyperscan", "re") if _hs is not None else ("re",)


class Matcher:
    """Rows (in the order given) that can match a record; `backend` is "hyperscan" or "re"."""

    def __init__(self, rows: Sequence[Any], backend: Optional[str] = None) -> None:
        self.rows = tuple(rows)
        self.backend = backend or BACKENDS[0]
        self.always = tuple(i for i, r in enumerate(self.rows) if r.pattern is None or r.test is not None)
        indexed = [(i, r.pattern.pattern) for i, r in enumerate(self.rows) if i not in self.always]
        self._indexed = indexed
        self._lock = threading.Lock()
        self._db: Any = None
        if self.backend == "hyperscan" and _hs is None:
            raise RuntimeError("hyperscan is not installed")
        self._everything = tuple(range(len(self.rows)))

    def _compile(self) -> Any:
        flags = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_SINGLEMATCH
        from .hscache import compile_database     # (hscache imports this module)
        try:
            db = compile_database([p.encode() for _, p in self._indexed], [i for i, _ in self._indexed],
                                  [flags] * len(self._indexed))
        except Exception:                     # a CPU or a pattern hyperscan refuses: degrade, never crash
            self.backend = "re"
            return None
        self._db = db
        return db

    def candidates(self, body: str) -> tuple[int, ...]:
        """Indexes (ascending) of the rows worth asking about `body`."""
        if self.backend != "hyperscan" or not (body.isascii() and body.isprintable()):
            return self._everything
        hits = set(self.always)
        with self._lock:                      # one database, one scratch: scans from two threads take turns
            db = self._db or self._compile()
            if db is None:
                return self._everything
            db.scan(body.encode("ascii"), match_event_handler=_collect, context=hits)
        return tuple(sorted(hits))


def _collect(row: int, start: int, end: int, flags: int, hits: set) -> Optional[bool]:
    hits.add(row)
    return None
