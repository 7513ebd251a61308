"""The reference (exhaustive) log scanner: examines every anchored segment in order; the fast scanner must give its answers."""
from __future__ import annotations

from typing import Any

from gpudeck.jobs.logs.analyze import LogAnalysis, analyze_file
from gpudeck.jobs.logs.analyze.model import GIANT_SEGMENT, HEAD_BYTES, TAIL_BYTES
from gpudeck.jobs.logs.analyze.patterns import families_in, prefilter_in
from gpudeck.jobs.logs.analyze.scanner import LogAnalyzer


class ReferenceAnalyzer(LogAnalyzer):
    """LogAnalyzer whose scan skips none of the template scanner's shortcuts (the definition of the answer)."""

    def _scan(self, buf: bytes, end: int) -> None:
        """Examine every complete segment of buf[:end] that has an anchor hit."""
        line = self._line
        counted = 0
        pos = 0
        next_nl = next_cr = -1
        has_cr = b"\r" in buf
        state = self._state
        engine_known = state.engine_strong is not None
        rx = prefilter_in(buf, engine_known)
        search = rx.search
        find, rfind, count = buf.find, buf.rfind, buf.count
        while pos < end:
            m = search(buf, pos, end)
            if m is None:
                break
            p = m.start()
            start = max(rfind(b"\n", pos, p), rfind(b"\r", pos, p) if has_cr else -1, pos - 1) + 1
            if next_nl < p:
                next_nl = find(b"\n", p, end)
                if next_nl < 0:
                    next_nl = end
            if has_cr and next_cr < p:
                next_cr = find(b"\r", p, end)
                if next_cr < 0:
                    next_cr = end
            stop = min(next_nl, next_cr) if has_cr else next_nl
            if start > counted:
                line += count(b"\n", counted, start)
                counted = start
            if stop - start > GIANT_SEGMENT:
                self._examine_giant(buf[start:start + HEAD_BYTES], buf[stop - TAIL_BYTES:stop], line)
            else:
                state.examine(buf[start:stop], line, families_in(rx, buf, m, stop))
            pos = stop + 1
            if not engine_known and state.engine_strong is not None:
                engine_known = True
                rx = prefilter_in(buf, True)
                search = rx.search
        line += count(b"\n", counted, end)
        self._line = line


def reference_analyze_file(path: Any, **kwargs: Any) -> LogAnalysis:
    """analyze_file() through the reference scanner."""
    return analyze_file(path, analyzer=ReferenceAnalyzer(), **kwargs)
