"""The incremental reader: cuts bytes into segments and examines, through the templates, only those that can matter."""
from __future__ import annotations

import copy
import pickle
from collections import Counter
from bisect import bisect_left
from itertools import accumulate, compress, islice, repeat
from operator import is_, is_not, itemgetter
from typing import Any, Optional, Union

from .envelope import Unwrapper
from .model import (GIANT_SEGMENT, HEAD_BYTES, LogAnalysis, READ_CHUNK, S, SPEC_WINDOW, TAIL_BYTES)
from .patterns import (ANSI, SERIES_LABELS, SIZE, TQDM, families_in, parse_serving_stats_line, prefilter_in,
                       series_label, ts_seconds)
from . import sparse as _sparse
from .sparse import DENSE_BACKOFF, compact, mapped
from .cause import Spec
from .state import (_NAN, ONLY_NVRM, State, series_done, stats_of_segment, stats_working)
from .templates import (ALL_SERVING_BITS, FRAME_LINE, K_BAR, K_BAR_GLUED, K_BUILD, K_GIANT, K_INERT, K_OTHER, K_REFILTER,
                        K_SERVING, KV_WAITING_BITS, NORMALIZE, ONLY_FRAME, RUN_GROUPS, SKIP_GROUP, SPEC_BITS,
                        TEMPLATE_CACHE_BYTES, TEMPLATE_KEY_MAX, TEMPLATE_ONE_OFFS_MAX, Plan, RecordPlan, Template,
                        classify_template, prefilter_one_offs, record_plan, run_kv_safe)


# From this size on, a feed's first segment (the one its tail began) is scanned on its own (see feed).
SPLIT_FEED = 1 << 15
# Until the engine is known, a feed's first this many bytes are scanned on their own (see _scan).
ENGINE_PROBE = 1 << 16
COMPACT = True       # sparse chunks are read sparsely (sparse.py, where hyperscan is installed); tests turn it off
# Marker kinds whose effect reads the segment's line (ready line, recovery): never folded.
LINE_MARKERS = frozenset(("ready", "startup_complete"))
# The fold of a stretch of phase markers as a graph (see State.marker_transition): (phase, load_done) ->
# its node, (phase, load_done, {marker kind: (the next node, whether the marker sets why["phase"])}),
# so that a member costs one dict lookup (no key tuple built and hashed per member).
MARKER_NODES: dict[tuple, tuple] = {}
# The transitions read phase and load_done alone (the kinds that read more are never folded): any State will do.
_TRANSITIONS = State()


def _marker_edge(node: tuple, kind: str) -> tuple:
    """The node's edge for a marker kind not met from it before."""
    after = _TRANSITIONS.marker_transition(node[0], node[1], kind)
    hit = node[2][kind] = (_marker_node(after[0], after[1]), after[2])
    return hit


def _marker_node(phase: Optional[str], load_done: bool) -> tuple:
    node = MARKER_NODES.get((phase, load_done))
    if node is None:
        node = MARKER_NODES[(phase, load_done)] = (phase, load_done, {})
    return node
# The group of planned failure-line templates whose whole effect is a candidate (see _Chunk.candidates).
ONLY_GROUP = ("only",)
# The group of planned phase-marker templates that a stretch folds (see _Chunk.phase_markers).
MARKER_GROUP = ("markers",)
# Spec.SPECIFIC as a plain int (an IntEnum member read through its class costs ~60 ns: the group loop's tests).
SPECIFIC = int(Spec.SPECIFIC)
# Segment indexes as existing int objects: compress() over them allocates no int per unselected segment
# (range() makes one each). Chunks with more segments than this use range().
INDEXES = tuple(range(1 << 12))


# --------------------------------------------------------------------------- the incremental reader


class LogAnalyzer:
    """Feed it bytes as they arrive; ask result() at any time.

    Work per feed() is proportional to the new bytes. Memory is bounded: a partial
    line is kept up to GIANT_SEGMENT bytes, then only its head and a rolling tail.
    """

    def __init__(self) -> None:
        self._state = State()
        self._templates: tuple[dict, dict] = ({}, {})   # per "engine known": template -> 0 | Template
        self._template_bytes = 0
        self._frame_templates = 0        # how many templates are FRAME_LINE in the engine-known cache
        self._refilter_plans: dict[tuple[bytes, int], RecordPlan] = {}   # ("signal 0" template, families) -> plan
        self._refilter_fams: dict[tuple[bytes, tuple], int] = {}  # (that template, where "signal 9" is) -> families
        self._once: set[bytes] = set()   # templates of the one-off batches (see _learn), bounded
        self._once_bytes = 0
        self._tail = b""                 # the incomplete segment (< GIANT_SEGMENT bytes)
        self._giant_head: Optional[bytes] = None
        self._giant_tail = b""
        self._line = 1                   # physical line number of the incomplete segment
        self.bytes_fed = 0
        # A leading block of `#` lines is an annotation (an excerpt's `# source:` / `# expect:`
        # header), not output: its lines are counted but not read. None once the header is over.
        self._header: Optional[bytes] = b""
        self._dense_backoff = 0          # chunks left before a sparse read is tried again (see _read_sparse)
        self._sparse_off = False         # a worker found this feed dense (see feed_dense): no sparse read
        self._envelope = Unwrapper()     # docker json-file records unwrapped (envelope.py)

    @property
    def line(self) -> int:
        """The 1-based physical line number the next byte belongs to."""
        return self._line

    def feed(self, data: bytes, now: Optional[float] = None) -> None:
        """Consume new bytes. `now` (seconds) timestamps their arrival for rates the log does not print."""
        if not data:
            return
        self.bytes_fed += len(data)
        self._state.now = now
        if self._header is not None:
            data = self._skip_annotation_header(self._header, data)
            if not data:
                return
        if self._envelope.on is not False:
            data = self._envelope.feed(data)          # docker's json-file records: the text they carry
            if not data:
                return
        self._feed_text(data)

    def _feed_text(self, data: bytes) -> None:
        """feed() of bytes past the annotation header and the envelope."""
        if self._giant_head is not None:
            after = self._feed_giant(self._giant_head, data)
            if after is None:
                return
            data = after
        skip = 0
        if self._tail and len(data) >= SPLIT_FEED and self._state.engine_strong is not None:
            # The segment the tail began is scanned on its own, then the feed after it where it lies:
            # no copy of the whole feed behind the tail. (That copy and the translated one were two
            # transients as large as the feed at the heap's top: glibc trimmed the heap and grew it
            # again every feed in some processes' layouts — page faults, 5-10 % more CPU time.)
            # A small feed is joined to its tail instead: a second scan would cost more than the copy.
            nl = data.find(b"\n")
            cr = data.find(b"\r", 0, nl) if nl >= 0 else data.find(b"\r")   # (a \r after nl: no matter)
            k = nl if cr < 0 else cr
            if k >= 0:
                line = self._line
                self._scan_templates(self._tail + data[:k + 1])
                self._tail = b""
                skip = k + 1
        buf = self._tail + data if self._tail else data
        nl = buf.rfind(b"\n")
        end = max(nl, buf.rfind(b"\r", nl + 1)) + 1     # a \r is looked for after the last \n only
        if end > skip:
            if skip:
                self._line = line                 # the line of the feed's first segment: the tail's
                if not self._read_sparse(buf, end, skip, line + buf.count(b"\n", 0, skip)):
                    self._scan_templates(buf, skip)
            else:
                self._scan(buf, end)
        rest = buf[end:]
        if len(rest) > GIANT_SEGMENT:
            self._giant_head = rest[:HEAD_BYTES]
            self._giant_tail = rest[-TAIL_BYTES:]
            self._tail = b""
        else:
            self._tail = bytes(rest)

    def accepts_mapped(self) -> bool:
        """Whether a chunk's sparse reading made elsewhere (feed_mapped) can be fed now: the engine
        is known and nothing is pending (no annotation header, no partial line)."""
        return (COMPACT and self._state.engine_strong is not None and self._header is None
                and self._envelope.on is False and self._giant_head is None and not self._tail)

    def feed_mapped(self, size: int, got: tuple[bytes, list[int], int]) -> None:
        """Consume `size` bytes that end with a newline through sparse.mapped's answer for them made
        with line 0 (in another process: parallel.py); only when accepts_mapped(). The same as feed()."""
        self.bytes_fed += size
        self._state.now = None
        blob, lines, end = got
        base = self._line
        self._scan_mapped(blob, [base + n for n in lines], base + end)

    def feed_dense(self, data: bytes) -> None:
        """feed(data), with no sparse read tried: another process found these bytes dense."""
        self._sparse_off = True
        try:
            self.feed(data)
        finally:
            self._sparse_off = False

    def state_blob(self) -> bytes:
        """The state of the reading so far, pickled, for another process's same_course and adopt (slices.py):
        only when accepts_mapped() (nothing pending outside it). Its memo of bar labels stays here."""
        state = self._state
        labels, state.labels = state.labels, {}
        try:
            return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            state.labels = labels

    def adopt(self, state: State, delta: int, line: int, size: int) -> None:
        """Continue from `state` (another process's reading of the next `size` bytes, from a guess that
        same_course proved to be as good as this reading, `delta` its seq offset), at `line`."""
        state.shift_seq(delta)
        state.labels = self._state.labels
        state.now = self._state.now
        self._state = state
        self._line = line
        self.bytes_fed += size

    def _skip_annotation_header(self, header: bytes, data: bytes) -> bytes:
        """Blank the leading `#` lines (keeping their newlines, so line numbers hold); the same
        whatever the chunking, since an undecided first line (`header`, kept) waits for its newline."""
        buf = header + data
        blanked = 0
        pos = 0
        while True:
            if pos >= len(buf):
                self._header = b""
                return b"\n" * blanked
            if buf[pos] != 0x23:                      # not '#': the log itself starts here
                self._header = None
                return b"\n" * blanked + buf[pos:]
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if len(buf) - pos > 65536:            # no annotation is that long: treat it as output
                    self._header = None
                    return b"\n" * blanked + buf[pos:]
                self._header = buf[pos:]
                return b"\n" * blanked
            blanked += 1
            pos = nl + 1

    def _feed_giant(self, head: bytes, data: bytes) -> Optional[bytes]:
        """More of a giant segment (`head`: its kept head): its tail is kept; returns what follows the
        segment's end, or None while it has not ended."""
        nl, cr = data.find(b"\n"), data.find(b"\r")
        cut = min(x for x in (nl, cr) if x >= 0) if (nl >= 0 or cr >= 0) else -1
        if cut < 0:
            self._giant_tail = (self._giant_tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
            return None
        self._giant_tail = (self._giant_tail + data[max(0, cut - TAIL_BYTES):cut])[-TAIL_BYTES:]
        self._examine_giant(head, self._giant_tail, self._line)
        self._giant_head, self._giant_tail = None, b""
        if data[cut] == 0x0A:
            self._line += 1
        return data[cut + 1:]

    def _examine_giant(self, head: bytes, tail: bytes, line: int) -> None:
        # A giant segment is judged by its two ends only, the same way whether it arrived whole or in pieces.
        for part in (head, tail):
            rx = prefilter_in(part, self._state.engine_strong is not None)
            m = rx.search(part)
            if m is not None:
                self._state.examine(part, line, families_in(rx, part, m, len(part)))

    def _read_sparse(self, buf: bytes, end: int, begin: int, line: int) -> bool:
        """Read buf[begin:end] (buf[begin] on `line`) sparsely (sparse.py) if it is sparse: True if it
        was. Not tried for a while after a dense chunk."""
        if not COMPACT or self._sparse_off or end - begin < _sparse.MIN_BYTES or not _sparse.available():
            return False
        if self._dense_backoff:
            self._dense_backoff -= 1
            return False
        if self._state.engine_strong is not None:
            got = mapped(buf, end, begin, line)
            if got is not None:
                self._scan_mapped(*got)
                return True
        else:
            small = compact(buf, end, begin, False)
            if small is not None:
                self._line = line
                self._scan_all(small)
                return True
        self._dense_backoff = DENSE_BACKOFF
        return False

    def _scan_mapped(self, blob: bytes, lines: list[int], end_line: int) -> None:
        """The template scanner over a sparse chunk's kept lines (sparse.mapped: `lines` numbers their
        segments), the engine known; the next line is end_line."""
        segs, infos = self._segments(blob, 0, True)
        sel = list(compress(INDEXES if len(segs) <= len(INDEXES) else range(len(segs)), infos))
        frames: Any = self._frame_templates > 0 and list(compress(range(len(segs)), map(is_, infos, repeat(FRAME_LINE))))
        if sel:
            _Chunk(self, blob, segs, infos, sel, True, frames, True, lines).scan()
        elif frames:
            self._state.last_frame_line = lines[frames[-1]]
        self._line = end_line

    def _scan_all(self, data: bytes) -> None:
        """_scan_templates over all of data, again from where the engine became known (if it did)."""
        rest: Optional[bytes] = data or None
        while rest:
            rest = self._scan_templates(rest)

    def _scan(self, buf: bytes, end: int) -> None:
        """Examine (or prove irrelevant) every complete segment of buf[:end] (buf[end-1] is a separator)."""
        if self._state.engine_strong is not None and self._read_sparse(buf, end, 0, self._line):
            return                                    # sparse.py: only the anchored lines were read
        rest: Optional[bytes] = buf
        if self._state.engine_strong is None and end > ENGINE_PROBE * 2:
            # Most logs name their engine in the first lines, and a chunk scanned without the
            # engine is scanned again (its C passes, its grouping) from where it became known:
            # a first piece keeps that to a few KB.
            cut = max(buf.rfind(b"\n", 0, ENGINE_PROBE), buf.rfind(b"\r", 0, ENGINE_PROBE)) + 1
            if cut:
                left = self._scan_templates(buf[:cut])
                rest = b"".join((left, memoryview(buf)[cut:])) if left else buf[cut:]   # one copy
        while rest is not None:
            if rest is not buf:               # after the engine probe, or the engine became known
                nl = rest.rfind(b"\n")
                if self._read_sparse(rest, max(nl, rest.rfind(b"\r", nl + 1)) + 1, 0, self._line):
                    return
            rest = self._scan_templates(rest)

    def _scan_templates(self, data: bytes, skip: int = 0) -> Optional[bytes]:
        """The fast scanner over the complete segments of data (what follows its last separator is
        left alone); returns what is left to scan when the engine became known, else None.
        skip: data[:skip] is the end of a segment already scanned (see feed): its first segment is
        left alone but counted (the engine is known then).

        Per segment it does C-level work only (translate, split, dict lookups, grouping);
        Python runs per group of consecutive segments that can matter (_Chunk). Within the chunk, a
        run of tqdm redraws or build steps is reduced to its last member (each overwrites the
        previous one's effect), a run of stats lines to one ready mark plus, at the end, the
        lines whose numbers no later line overwrites; templates proven inert are skipped.
        Everything else is examined as the exhaustive scanner would, in order.
        """
        engine_known = self._state.engine_strong is not None
        segs, infos = self._segments(data, skip, engine_known)
        sel = list(compress(INDEXES if len(segs) <= len(INDEXES) else range(len(segs)), infos))
        has_cr = b"\r" in data
        # Segments of traceback-frame templates (FRAME_LINE) are not visited: their only effect is
        # "the last frame line", which only an examination within 40 lines after one reads (a guard).
        # So a reader (or the chunk's end) looks back at the 40 segments before it, which are 40
        # lines when no \r splits lines; with \r, all the frames' positions are found up front.
        frames: Any = engine_known and self._frame_templates > 0
        if frames and has_cr:
            frames = list(compress(range(len(segs)), map(is_, infos, repeat(FRAME_LINE))))
        if sel:
            return _Chunk(self, data, segs, infos, sel, has_cr, frames, engine_known).scan()
        if frames:
            state = self._state
            if has_cr:
                k = frames[-1]
                state.last_frame_line = self._line + data.count(b"\n", 0, sum(map(len, islice(segs, k))) + k)
            else:
                near = infos[-40:]
                if FRAME_LINE in near:
                    state.last_frame_line = self._line + len(segs) - 1 - near[::-1].index(FRAME_LINE)
        self._line += data.count(b"\n") if has_cr else len(segs)
        return None

    def _segments(self, data: bytes, skip: int, engine_known: bool) -> tuple[list[bytes], Any]:
        """The complete segments of data (\\r and \\n both end one) and each one's template (0: inert)."""
        templates = self._templates[engine_known]
        segs = data.translate(NORMALIZE).split(b"\n")
        segs.pop()                                    # the incomplete segment after the last separator
        if skip:
            piece, segs[0] = segs[0], b""             # looked up as an empty line: never selected
        try:
            # All known: no second pass looking for None. One itemgetter call looks every segment
            # up without map's per-item method call (itemgetter(x) is no tuple: short ones by map).
            infos = itemgetter(*segs)(templates) if len(segs) > 1 else list(map(templates.__getitem__, segs))
        except KeyError:
            infos = self._learn(segs, list(map(templates.get, segs)), templates, engine_known)
        if skip:
            segs[0] = piece                           # its length places the segments after it
        return segs, infos

    def _absorbed(self, info: Template) -> bool:
        """True if examining a segment of this template can no longer teach the engine anything."""
        state = self._state
        return (state.engine_strong is not None or not info.strong and (not info.path or state.engine_path is not None)
                and info.weak <= state.weak_seen)

    def _group_now(self, info: Template) -> Any:
        """info.group, or for a template with engine hits already absorbed the group it would have without them."""
        if info.group is not info or info.kind not in (K_INERT, K_BAR, K_BUILD, K_SERVING) or not self._absorbed(info):
            return info.group
        if info.kind == K_INERT:
            return SKIP_GROUP
        return RUN_GROUPS.setdefault((info.kind, info.named), (info.kind, info.named))

    def _learn(self, segs: list[bytes], infos: list, templates: dict, engine_known: bool) -> list:
        """Classify the templates of this chunk not seen before; the cache stays bounded.

        A chunk full of one-off lines (request ids, hashes) would pay a classification per
        line and churn the cache: its one-off templates are instead prefiltered together in
        one C-level pass, the anchored ones examined in full like the exhaustive scanner
        does, and none of them is remembered.
        """
        if self._template_bytes > TEMPLATE_CACHE_BYTES:
            for cache in self._templates:
                cache.clear()
            self._template_bytes = self._frame_templates = 0
            new = Counter(segs)
        else:
            new = Counter(compress(segs, map(is_, infos, repeat(None))))
        transient: dict[bytes, Union[int, Template]] = {}
        if len(new) > TEMPLATE_ONE_OFFS_MAX:
            once = self._once
            one_offs = [tpl for tpl, n in new.items() if n == 1 and tpl not in once]
            if len(one_offs) > TEMPLATE_ONE_OFFS_MAX:
                transient = prefilter_one_offs(one_offs, engine_known)
                # A one-off that comes back in a later feed was no one-off: a small feed (the
                # runner's 64 KiB, a dense log) holds each template once, and none would ever be
                # remembered (10x slower). Remembered as seen once, within the cache's bound.
                if self._once_bytes > TEMPLATE_CACHE_BYTES // 4:
                    once.clear()
                    self._once_bytes = 0
                once.update(one_offs)
                self._once_bytes += sum(map(len, one_offs)) + 80 * len(one_offs)
        for tpl in new:
            if tpl in transient:
                continue
            info = classify_template(tpl, engine_known)
            if len(tpl) > TEMPLATE_KEY_MAX:
                transient[tpl] = info
            else:
                templates[tpl] = info
                self._template_bytes += len(tpl) + 100
        templates.update(transient)
        infos = list(map(templates.__getitem__, segs))
        for tpl in transient:
            del templates[tpl]
        return infos

    def finish(self) -> None:
        """The stream ended: the last, unterminated line counts as a line."""
        if self._envelope.on is not False:
            rest = self._envelope.finish()
            if rest:
                self._feed_text(rest)
        if self._giant_head is not None:
            self._examine_giant(self._giant_head, self._giant_tail, self._line)
            self._giant_head, self._giant_tail = None, b""
        elif self._tail:
            tail = self._tail
            rx = prefilter_in(tail, self._state.engine_strong is not None)
            m = rx.search(tail)
            if m is not None:
                self._state.examine(tail, self._line, families_in(rx, tail, m, len(tail)))
            self._tail = b""

    def result(self) -> LogAnalysis:
        """The analysis of everything fed so far, the unterminated last line included (tentatively)."""
        if self._giant_head is None and not self._tail:
            return self._state.result()
        probe = copy.copy(self)
        probe._state = copy.deepcopy(self._state)
        probe._envelope = copy.copy(self._envelope)
        probe.finish()
        return probe._state.result()


def _read_stats(read: tuple, raw: bytes) -> dict[str, float]:
    """A stats line's numbers at the spans its plan knows (patterns.read_stats, inline)."""
    keys, get, scaled = read
    stats = dict(zip(keys, map(float, get(raw))))
    for key, times, over in scaled:
        stats[key] = stats[key] * times / over
    return stats


class _Chunk:
    """One pass of the template scanner (LogAnalyzer._scan_templates) over a chunk's complete segments.

    segs are the chunk's segments, infos their templates, sel the indexes of those that can matter,
    grouped (groups, bounds: where the group changes) so that consecutive members of one group are
    handled together. What a pass holds pending: a run of bars or build steps awaiting its last
    member (run_*), stats-line groups whose numbers are applied at the chunk's end (deferred).
    Each handler below reads one family of the table's fields: failure candidates (cause), phase
    markers (phase), loss dicts, build steps, step records and bars (progress), stats lines (serving).
    """
    __slots__ = ("an", "state", "data", "segs", "infos", "sel", "base", "has_cr", "frames", "engine_known",
                 "ends", "cursor", "groups", "bounds", "b", "next_first", "run_kind", "run_named", "run_len",
                 "run_last", "serving_run", "deferred", "now_unset", "apply_plan", "lines")

    def __init__(self, an: LogAnalyzer, data: bytes, segs: list[bytes], infos: Any, sel: list[int], has_cr: bool,
                 frames: Any, engine_known: bool, lines: Optional[list[int]] = None) -> None:
        self.an = an
        self.lines = lines             # each segment's line number (a sparse chunk: sparse.mapped), else None
        self.state = state = an._state
        self.data, self.segs, self.infos, self.sel = data, segs, infos, sel
        self.base = an._line
        self.has_cr, self.frames, self.engine_known = has_cr, frames, engine_known
        self.ends = list(accumulate(map(len, segs)))       # ends[i] + i: offset just past segment i
        # Line numbers: a segment's index when no \r splits lines, else \n counted from a cursor
        # (offset, line) that follows the examined segments (deferred lines lie a little behind it).
        self.cursor = [0, self.base]
        self.run_kind: int = K_INERT   # K_BAR / K_BUILD while a run awaits its last member
        self.run_named: Optional[str] = None
        self.run_len = self.run_last = 0
        self.serving_run = False       # a ready mark was applied and nothing was examined since
        self.deferred: list[tuple[int, int]] = []   # (first, last) positions in sel of stats-line groups
        self.now_unset = state.now is None
        self.apply_plan = state._apply_plan
        if engine_known:
            # sel's infos, in order (a comprehension: the interpreter's slot read beats attrgetter's lookup)
            groups = [info.group for info in compress(infos, infos)]
        else:
            groups = [an._group_now(infos[i]) for i in sel]
        # Where the group changes (C-level): consecutive members of one group are handled together.
        bounds = list(compress(islice(INDEXES, 1, None) if len(sel) <= len(INDEXES) else range(1, len(sel)),
                               map(is_not, islice(groups, 1, None), groups)))
        bounds.append(len(sel))
        self.groups, self.bounds = groups, bounds
        self.b = self.next_first = 0   # the loop's cursor: the next group's bound, its first member

    # ----------------------------------------------------------------------- the loop

    def scan(self) -> Optional[bytes]:
        """Every group in order; what is left of data when the engine became known, else None."""
        groups, bounds = self.groups, self.bounds
        nbounds = len(bounds)
        while self.b < nbounds:
            first = self.next_first
            self.next_first = bounds[self.b]
            self.b += 1
            group = groups[first]
            if group is ONLY_GROUP:
                self.candidates(first)
            elif group is not SKIP_GROUP:
                rest = self.group(first, group)
                if rest is not None:
                    return rest
        if self.run_kind:
            self.flush_run()
        if self.deferred:
            self.flush_deferred()
        if self.frames:
            self.frame_line(len(self.segs))
        if self.lines is None:                        # (a sparse chunk's reader knows its next line)
            cursor = self.cursor
            self.an._line = self.base + len(self.segs) if not self.has_cr else cursor[1] + self.data.count(b"\n", cursor[0])
        return None

    def group(self, first: int, group: Any) -> Optional[bytes]:
        """sel[first:next_first], one group (a stretch of groups after it may join in); what is left of
        data when its examination made the engine known, else None."""
        last = self.next_first - 1
        info = self.infos[self.sel[first]]
        # The group's own plan, read once: the tests below are the group's route (False for a
        # run or merged group, whose members may be of other templates, and before the engine).
        own_plan: Plan = info.plan if group is info and self.engine_known else False
        if (own_plan and own_plan.only is not None and own_plan.only >= ONLY_NVRM
                and self.candidate_held(info, own_plan.only)):
            return None
        waits = self.deferred and info.fams & S        # a stats line must be applied before it
        if group is MARKER_GROUP or (own_plan and own_plan.marker_only and own_plan.marker is not None
                                     and own_plan.marker[0] not in LINE_MARKERS and not waits):
            self.phase_markers(first, last, group)
            return None
        if own_plan and self.now_unset and not waits:
            if own_plan.hint_only and self.loss_dicts(first, last):
                return None
            if own_plan.timed_step and self.build_steps(first, last, own_plan.timed_step[0]):
                return None
            if own_plan.step_stretch and self.step_records(first, last):
                return None
        if group is not info:                         # a run group (no engine to learn from it)
            if self.stats_run(first, last) if info.kind == K_SERVING else self.bar_run(first, last, info):
                return None
        if last > first and own_plan and own_plan.marker_only:
            self.settle_run()
            if waits:
                self.flush_deferred()
            self.examine(self.sel[first])             # a run of one marker: its first and last (RecordPlan)
            self.examine(self.sel[last])
            return None
        return self.one_by_one(first, last, group, info)

    def one_by_one(self, first: int, last: int, group: Any, info: Template) -> Optional[bytes]:
        """sel[first..last] one segment at a time, as the exhaustive scanner (info: the first one's template)."""
        state, sel, segs, engine_known = self.state, self.sel, self.segs, self.engine_known
        kind = info.kind
        for q in range(first, last + 1):
            i = sel[q]
            if not engine_known and group is info and info.kind != K_OTHER and self.an._absorbed(info):
                if info.kind == K_INERT:
                    continue
            if kind == K_BAR_GLUED and self.run_kind == K_BAR and self.run_named == info.named:
                self.run_kind = K_INERT               # its own bar overwrites the pending run's
                state.seq += self.run_len
            if self.run_kind:
                self.flush_run()
            if self.deferred and info.fams & S:
                self.flush_deferred()
            plan = info.plan
            if plan and engine_known and plan.only is not None:
                # Effects the scanner applies without reading the segment (see RecordPlan.only).
                if plan.only == ONLY_FRAME:
                    state.last_frame_line = self.where(i)[1] if self.has_cr else self.base + i
                    templates = self.an._templates[engine_known]
                    if templates.get(segs[i]) is info:
                        templates[segs[i]] = FRAME_LINE      # from the next chunk on: see `frames`
                        self.an._frame_templates += 1
                    continue
                if state.candidate_is_noop(plan.only):
                    continue
            self.serving_run = False
            self.examine(i)
            if not engine_known and state.engine_strong is not None:
                if self.deferred:
                    self.flush_deferred()
                start, line = self.where(i)
                rest = start + len(segs[i]) + 1
                self.an._line = line + (self.data[rest - 1] == 0x0A)
                return self.data[rest:]
        return None

    def stretch(self, joins: Any) -> list[tuple[int, int]]:
        """The groups after the current one that its stretch takes in, as (first, end) positions in sel:
        each one `joins(group, its first template)` accepts, inert groups between skipped; the loop's
        cursor moves past them."""
        groups, bounds, infos, sel = self.groups, self.bounds, self.infos, self.sel
        b, at, nbounds = self.b, self.next_first, len(bounds)
        out = []
        while b < nbounds:
            g = groups[at]
            if g is not SKIP_GROUP:
                if not joins(g, infos[sel[at]]):
                    break
                out.append((at, bounds[b]))
            at = bounds[b]
            b += 1
        self.b, self.next_first = b, at
        return out

    # ----------------------------------------------------------------------- positions

    def start(self, i: int) -> int:
        """The offset in data of segment i."""
        return self.ends[i] - len(self.segs[i]) + i

    def where(self, i: int) -> tuple[int, int]:
        """(offset, line) of segment i."""
        start = self.ends[i] - len(self.segs[i]) + i
        if not self.has_cr:
            return start, self.base + i
        if self.lines is not None:
            return start, self.lines[i]
        cursor = self.cursor
        off, line = cursor
        if start < off:
            return start, line - self.data.count(b"\n", start, off)
        line += self.data.count(b"\n", off, start)
        cursor[0], cursor[1] = start, line
        return start, line

    def frame_line(self, i: int) -> None:
        """Give state the line of the last frame segment before segment i, as if it had been read
        (when it lies within 40 lines: an older one guards nothing at i or after)."""
        if self.has_cr:
            frames = self.frames
            k = bisect_left(frames, i)
            if not k:
                return
            line = self.where(frames[k - 1])[1]
        else:
            near = self.infos[i - 40 if i > 40 else 0:i]
            if FRAME_LINE not in near:
                return
            line = self.base + i - 1 - near[::-1].index(FRAME_LINE)
        if line > self.state.last_frame_line:
            self.state.last_frame_line = line

    # ----------------------------------------------------------------------- examining one segment

    def examine(self, i: int) -> None:
        """Segment i, read as the exhaustive scanner would (through its template's plan where it has one)."""
        info = self.infos[i]
        plan = info.plan
        if self.frames and (not plan or plan.reads_frame):
            self.frame_line(i)
        if self.has_cr:
            start, line = self.where(i)
            stop = start + len(self.segs[i])
        else:
            stop, line = self.ends[i] + i, self.base + i
            start = stop - len(self.segs[i])
        if plan:
            if self.engine_known and not plan.ansi:     # State.examine_planned, inlined: the hot path
                self.state.text = text = self.data[start:stop].decode("utf-8", "replace")
                self.apply_plan(text, line, plan)
            else:
                self.state.examine_planned(self.data[start:stop], line, info.fams, plan)
            return
        kind = info.kind
        if plan is None and kind != K_GIANT and kind != K_REFILTER:
            plan = self.plan_now(i, info)
            if plan:
                if self.engine_known and not info.fams & S and info.group is info:
                    # From the next chunk on, consecutive segments of such templates form one
                    # group (see group()): candidates of a known rank, phase markers.
                    if plan.only is not None and (plan.only >= 0 or plan.only == ONLY_NVRM):
                        info.group = ONLY_GROUP
                    elif plan.marker_only and plan.marker[0] not in LINE_MARKERS:
                        info.group = MARKER_GROUP
                self.state.examine_planned(self.data[start:stop], line, info.fams, plan)
                return
        if kind == K_GIANT:
            self.an._examine_giant(self.data[start:start + HEAD_BYTES], self.data[stop - TAIL_BYTES:stop], line)
            return
        raw = self.data[start:stop]
        if kind == K_REFILTER:
            if self.engine_known and len(raw) <= TEMPLATE_KEY_MAX:
                self.examine_refiltered(i, raw, line)
                return
            rx = prefilter_in(raw, self.state.engine_strong is not None)
            m = rx.search(raw)
            if m is not None:
                self.state.examine(raw, line, families_in(rx, raw, m, len(raw)))
            return
        self.state.examine(raw, line, info.fams)

    def plan_now(self, i: int, info: Template) -> Any:
        """info's plan, made on its second reading (one-off templates are not worth it); None before."""
        plan = None
        if info.seen:
            info.plan = plan = record_plan(self.segs[i], info.fams) or False
            self.an._template_bytes += 512            # a plan's share of the template cache's bound
        info.seen = 1
        return plan

    def examine_refiltered(self, i: int, raw: bytes, line: int) -> None:
        """A segment whose template has a "signal 0" (K_REFILTER), the engine known."""
        an = self.an
        # The prefilter tests every digit by class but the 9 of "signal 9": its families
        # for the segment are those of the template with the 9s where "signal 9" is,
        # remembered by (template, where).
        nines = []
        at = raw.find(b"signal 9")
        while at >= 0:
            nines.append(at)
            at = raw.find(b"signal 9", at + 1)
        fkey = (self.segs[i], tuple(nines))
        fams = an._refilter_fams.get(fkey)
        if fams is None:
            rx = prefilter_in(raw, True)
            m = rx.search(raw)
            fams = 0 if m is None else families_in(rx, raw, m, len(raw))
            if len(an._refilter_fams) >= 256:
                an._refilter_fams.clear()
            an._refilter_fams[fkey] = fams
        if not fams:
            return
        # Only the prefilter's families depend on the digit ("signal 9" is an anchor):
        # the template's plan for those families holds for the segment.
        key = (self.segs[i], fams)
        plan = an._refilter_plans.get(key)
        if plan is None:
            if len(an._refilter_plans) >= 256:
                an._refilter_plans.clear()
            plan = an._refilter_plans[key] = record_plan(self.segs[i], fams)
        only = plan.only
        if only is not None and only != ONLY_FRAME and self.state.candidate_is_noop(only):
            return                                    # as for a planned template (candidates())
        self.state.examine_planned(raw, line, fams, plan)

    # ----------------------------------------------------------------------- the pending run

    def settle_run(self) -> None:
        """Before a segment is examined: the pending run's last member first; no ready mark since."""
        if self.run_kind:
            self.flush_run()
        self.serving_run = False

    def flush_run(self) -> None:
        self.state.seq += self.run_len - 1            # the dropped members' progress updates
        self.examine(self.run_last)
        self.run_kind = K_INERT
        self.serving_run = False

    # ----------------------------------------------------------------------- cause: failure candidates

    def candidates(self, first: int) -> None:
        """Consecutive failure lines whose whole effect is a candidate of a known rank (or an NVRM
        line: see candidate_held), of any templates, handled as one group: all skipped at once while a
        SPECIFIC candidate is held, else one by one."""
        state, has_cr = self.state, self.has_cr
        best = state.best
        if best is not None and best.hold >= SPECIFIC and not has_cr:
            return
        infos = self.infos
        for i in self.sel[first:self.next_first]:
            only = infos[i].plan.only
            best = state.best
            if best is not None and (best.hold >= only if only >= 0 else not has_cr and best.hold >= SPECIFIC):
                continue
            if self.run_kind:
                self.flush_run()
            if state.candidate_is_noop(only):
                continue
            self.serving_run = False
            self.examine(i)

    def candidate_held(self, info: Template, only: int) -> bool:
        """Whether a group of a failure-candidate template (`only`: its plan's) changes nothing: a candidate
        of its rank is held (State.candidate_is_noop). A run pending before it cannot un-hold it: runs form
        only while no error waits on their series (and `best` implies an error waits), so it needs no flush."""
        best = self.state.best
        if best is None or (self.deferred and info.fams & S):
            return False
        if only >= 0:
            return best.hold >= only
        # An NVRM line's candidate changes nothing, and the window it joins is read only by a later
        # driver-fault line's candidate, walking back over consecutive lines: a no-op too until a
        # recovery clears `best`, which takes a line that is no NVRM line (one line each when no \r
        # splits lines), so no walk after it reaches back over it.
        return only == ONLY_NVRM and not self.has_cr and best.hold >= SPECIFIC

    # ----------------------------------------------------------------------- phase: markers

    def phase_markers(self, first: int, last: int, group: Any) -> None:
        """A stretch of phase markers (consecutive planned markers of any templates, or a marker template's
        group; inert groups between are skipped), folded (fold_markers)."""
        sel = self.sel
        if group is MARKER_GROUP:
            members = sel[first:last + 1]
        else:
            members = [sel[first], sel[last]] if last > first else [sel[first]]
        deferred = self.deferred

        def joins(g: Any, nxt: Template) -> bool:
            if g is MARKER_GROUP:
                return True
            plan = nxt.plan
            return not (g is not nxt or not plan or not plan.marker_only or plan.marker is None
                        or plan.marker[0] in LINE_MARKERS
                        or (deferred and nxt.fams & S))

        for lo, end in self.stretch(joins):
            if self.groups[lo] is MARKER_GROUP:
                members += sel[lo:end]
            else:
                members.append(sel[lo])
                if end - 1 > lo:
                    members.append(sel[end - 1])
        self.settle_run()
        self.fold_markers(members)

    def fold_markers(self, members: list[int]) -> None:
        """Phase markers (no line-reading kinds) with nothing examined between them: only the phase,
        load_done and the why texts of two of them survive them (the last marker's, and that of the last
        one that set why["phase"]), so the kinds are folded over (phase, load_done) and only those two
        segments are read."""
        state, infos = self.state, self.infos
        if state.progress_at_failure is not None:     # an error waits: the phase a marker enters may recover it
            for i in members:
                self.examine(i)
            return
        node = MARKER_NODES.get((state.phase, state.load_done)) or _marker_node(state.phase, state.load_done)
        at_p = None
        for i in members:
            kind = infos[i].plan.marker[0]
            hit = node[2].get(kind) or _marker_edge(node, kind)
            if hit[1]:
                p, at_p = i, node
            before_last, node = node, hit[0]
        last = members[-1]
        read_p = at_p is not None and p != last
        if infos[last].plan.ansi or read_p and infos[p].plan.ansi:
            if read_p and at_p is not None:           # (read_p says at_p is set)
                state.phase, state.load_done = at_p[0], at_p[1]
                self.examine(p)
            state.phase, state.load_done = before_last[0], before_last[1]
            self.examine(last)
            return
        # What examining them would do (State._apply_plan on a marker-only plan), from the fold:
        # the why texts in the same order, then the phase the fold reached (neither reads the
        # line otherwise, and no marker of these kinds reads state.text).
        why = state.why
        if read_p:
            why["marker"] = why["phase"] = self.marker_why(p)
        why["marker"] = w = self.marker_why(last)
        if hit[1]:
            why["phase"] = w
        state.phase, state.load_done = node[0], node[1]

    def marker_why(self, i: int) -> tuple:
        """A marker-only segment's why["marker"] (State._apply_plan's), its plan not ANSI."""
        start, line = self.where(i)
        plan = self.infos[i].plan
        at = plan.marker_at
        data = self.data
        if at is not None:                            # ASCII: the marker's bytes alone
            return ("marker {}: {!r} (line {})", plan.marker[0], data[start + at[0]:start + at[1]].decode(), line)
        b0 = plan.body[0]
        kind, m0, m1 = plan.marker
        return ("marker {}: {!r} (line {})", kind,
                data[start:start + len(self.segs[i])].decode("utf-8", "replace")[b0 + m0:b0 + m1], line)

    # ----------------------------------------------------------------------- progress: stretches

    def loss_dicts(self, first: int, last: int) -> bool:
        """A stretch of loss dicts (any templates; inert groups between are skipped): each overwrites the
        previous one's hint, series, phase and why texts, and no error waits on a hint series, so only the
        last is read. False (nothing done) while an error waits on a hint (or on any series: none ran before it)."""
        pending = self.state.progress_at_failure
        if not (pending is None or pending[0] and pending[0][0] != "hint" and not series_done(*pending)):
            return False
        n, i = last - first + 1, self.sel[last]
        deferred = self.deferred
        for lo, end in self.stretch(lambda g, nxt: not (g is not nxt or not nxt.plan or not nxt.plan.hint_only
                                                        or (deferred and nxt.fams & S))):
            n += end - lo
            i = self.sel[end - 1]
        self.settle_run()
        self.state.seq += n - 1
        self.examine(i)
        return True

    def build_steps(self, first: int, last: int, marked: Any) -> bool:
        """A stretch of timestamped build steps (any templates; inert groups between are skipped): each
        overwrites the previous one's bar, phase and why texts, and no error waits on a build series;
        what survives is the series' start (for the rate), so the members before the last are read for
        their numbers only. False (nothing done) while an error waits on a build (or on any series)."""
        pending = self.state.progress_at_failure
        if not (pending is None or pending[0] and (pending[0][0] != "bar" or pending[0][1] != "building")
                and not series_done(*pending)):
            return False
        members = self.sel[first:last + 1]
        deferred = self.deferred

        def joins(g: Any, nxt: Template) -> bool:
            step = nxt.plan and nxt.plan.timed_step
            return not (g is not nxt or not step or step[0] is not marked or (deferred and nxt.fams & S))

        for lo, end in self.stretch(joins):
            members += self.sel[lo:end]
        self.settle_run()
        if len(members) > 1:
            self.state.series = self.build_series(members)
            self.state.seq += len(members) - 1
        self.examine(members[-1])
        return True

    def build_series(self, members: list[int]) -> Any:
        """The progress series the build steps before the last leave (as State._set_progress would)."""
        data, infos = self.data, self.infos
        series = self.state.series
        for i in islice(members, len(members) - 1):
            _, (d0, d1), tot, (tk, t0, t1) = infos[i].plan.timed_step
            start = self.start(i)
            done = float(data[start + d0:start + d1])
            key = ("bar", "building", "build", float(data[start + tot[0]:start + tot[1]]) if tot else 100.0)
            # (its time is never None: see RecordPlan.timed_step), so it is read only where
            # the series starts again
            if series is None or series[0] != key or done < series[1]:
                when = ts_seconds((tk, data[start + t0:start + t1].decode()))
                series = (key, done, when if when is not None else _NAN)
        return series

    def step_records(self, first: int, last: int) -> bool:
        """A stretch of step/epoch records (any templates): as the timed build steps, when every member
        reports progress of one source (each overwrites the previous one's entry, phase and why texts; no
        error waits on a training series) only the series' start survives; else they are read one by one.
        False (nothing done) while an error waits on training progress (or on any series)."""
        pending = self.state.progress_at_failure
        if not (pending is None or pending[0] and pending[0][1:2] != ("training",) and not series_done(*pending)):
            return False
        members = self.sel[first:last + 1]
        deferred = self.deferred
        for lo, end in self.stretch(lambda g, nxt: not (g is not nxt or not nxt.plan or not nxt.plan.step_stretch
                                                        or (deferred and nxt.fams & S))):
            members += self.sel[lo:end]
        self.settle_run()
        if len(members) > 1:
            one_source, series = self.training_series(members)
            if not one_source:
                for i in members:                     # mixed: one by one, as the exhaustive scanner
                    self.examine(i)
                return True
            self.state.series = series
            self.state.seq += len(members) - 1
        self.examine(members[-1])
        return True

    def training_series(self, members: list[int]) -> tuple[bool, Any]:
        """(whether every member reports progress of one source, the series the members before the last
        leave)."""
        data, infos, state = self.data, self.infos, self.state
        series, source = state.series, None
        for i in members:
            st, ep, lossy, ts = infos[i].plan.step_stretch
            start = self.start(i)
            step = None if st is None else (float(data[start + st[0][0]:start + st[0][1]]), None
                                            if st[1] is None else float(data[start + st[1][0]:start + st[1][1]]))
            epoch = None if ep is None else (float(data[start + ep[0][0]:start + ep[0][1]]), None
                                             if ep[1] is None else float(data[start + ep[1][0]:start + ep[1][1]]))
            update = state.step_epoch_update(step, epoch, lossy)
            if update is None or (source is not None and update[0] != source):
                return False, None
            source = update[0]
            if i == members[-1]:
                break
            key = (source, "training", SERIES_LABELS.get(update[1]) or series_label(update[1]), update[3])
            when = None if ts is None else ts_seconds((ts[0], data[start + ts[1]:start + ts[2]].decode()))
            done = update[2]
            if series is None or series[0] != key or when is None or done < series[1]:
                series = (key, done, when if when is not None else _NAN)
        return True, series

    # ----------------------------------------------------------------------- progress: runs of bars and build steps

    def bar_run(self, first: int, last: int, info: Template) -> bool:
        """A run group of bars or build steps: it becomes the pending run (only its last member is read,
        when the run ends) where a member's effect is overwritten by the next one's; False where it is not
        (the caller reads it one by one)."""
        state, kind = self.state, info.kind
        if self.run_kind:
            if self.run_kind == K_BAR and kind == K_BAR and self.run_named is not None and info.named is not None:
                # A run of named bars met at once by a run of bars of another named phase
                # (one excerpt's capture bars, the next one's loading bars): the new run's
                # examination overwrites all the pending one leaves (bar, phase and its why,
                # series: another key, and no clock; the last progress key), and nothing reads
                # them before: the new run reads only load_done, which a named non-loading bar
                # never sets and a loading run's "any member full?" already did, and the
                # progress waiting on a failure, which the pending run cannot advance (a run
                # forms only where that progress is of another phase). Its count of updates
                # is kept.
                state.seq += self.run_len
                self.run_kind = K_INERT
                self.serving_run = False
            else:
                self.flush_run()
        # A member's effect is overwritten by the next one's when nothing else depends
        # on it: no clock-based rate, no error waiting for progress of this very series
        # (its advances would prove the job carried on; another phase's bar cannot be
        # that series), a phase that is a fixed point (a loading bar may complete the
        # load, turning later bars into capture).
        run_phase = "building" if kind == K_BUILD else (info.named or state._unnamed_bar_phase())
        if kind == K_BAR and run_phase == "training" and not info.named and not self.one_total(first, last):
            return False                              # an evaluation bar nested in a training one (State._nest)
        pending = state.progress_at_failure
        if not (self.now_unset and (pending is None or pending[0] and not series_done(*pending) and (
                                    pending[0][0] != "bar" or pending[0][1] != run_phase
                                    or kind == K_BAR and self.other_series(first, last, pending[0]))) and (
                kind == K_BUILD or run_phase != "loading" or info.named == "loading")):
            return False
        if run_phase == "loading" and last > first and self.load_completes(first, last - 1):
            return False        # a full bar before the last says whose load completed (State hf_loaded): each is read
        if run_phase == "loading" and not state.load_done and self.load_completes(first, last):
            # Bars that name loading stay loading bars; what a member leaves behind
            # is only that the load completed (nothing reads it before the run ends).
            state.load_done = True
        self.run_kind, self.run_named, self.run_len, self.run_last = kind, info.named, last - first + 1, self.sel[last]
        return True

    def load_completes(self, first: int, last: int) -> bool:
        """Whether any bar of sel[first..last] is full."""
        data, infos, sel = self.data, self.infos, self.sel
        seen = None
        for q in range(last, first - 1, -1):          # last first: a load's bars end full
            i = sel[q]
            member = infos[i]
            if member is not seen:                    # (a run's members are mostly of one template)
                seen, plan = member, member.plan
                at = plan.bar_bytes if plan else None
                if at is not None:
                    n0, n1, ns, t0, t1, ts = at
            if at is None:
                full = self.bar_full(i)
                seen = None                           # (bar_full may plan it)
            else:                                     # bar_full's planned path, inline
                start = self.start(i)
                total = float(data[start + t0:start + t1]) * ts
                full = bool(total) and float(data[start + n0:start + n1]) * ns >= total
            if full:
                return True
        return False

    def bar_full(self, i: int) -> bool:
        """Whether segment i's tqdm bar is full (State._tqdm's "the load completed")."""
        start = self.start(i)
        info = self.infos[i]
        plan = info.plan
        if plan is None:                              # planned on its second reading, as in examine()
            plan = self.plan_now(i, info)
        data = self.data
        if plan and plan.bar_bytes is not None:       # its numbers' bytes, from the template
            n0, n1, n_scale, t0, t1, t_scale = plan.bar_bytes
            total = float(data[start + t0:start + t1]) * t_scale
            return bool(total) and float(data[start + n0:start + n1]) * n_scale >= total
        raw = data[start:start + len(self.segs[i])]
        if plan and plan.bar is not None and not plan.ansi:     # its numbers' spans, from the template
            n0, n1, n_scale, t0, t1, t_scale = plan.bar[:6]
            text = raw.decode("utf-8", "replace")
            total = float(text[t0:t1]) * t_scale
            return bool(total) and float(text[n0:n1]) * n_scale >= total
        m = TQDM.search((ANSI.sub(b"", raw) if b"\x1b" in raw else raw).decode("utf-8", "replace"))
        assert m is not None                          # a bar template's segment: its bar is there too
        total = float(m.group("N")) * SIZE[m.group("Nu")]
        return bool(total) and float(m.group("n")) * SIZE[m.group("nu")] >= total

    def one_total(self, first: int, last: int) -> bool:
        """Whether every bar of sel[first..last] counts to the same total (their plans know where it lies)."""
        totals = set()
        for q in range(first, last + 1):
            i = self.sel[q]
            plan = self.infos[i].plan
            at = plan.bar_bytes if plan else None
            if at is None:
                return False
            start = self.start(i)
            totals.add((self.data[start + at[3]:start + at[4]], at[5]))
            if len(totals) > 1:
                return False
        return True

    def other_series(self, first: int, last: int, key: tuple) -> bool:
        """Whether no bar of sel[first..last] is of the series `key` (source, phase, key label, total)
        of the progress an error waits on, so that none of them advances it (State._set_progress
        compares the whole key): their plans know their labels (no digit before the bar) and where
        their totals lie."""
        for q in range(first, last + 1):
            i = self.sel[q]
            plan = self.infos[i].plan
            if not plan or plan.bar_label is None:
                return False
            if plan.bar_label[2] == key[2]:
                at = plan.bar_bytes
                if at is None:
                    return False
                start = self.start(i)
                if float(self.data[start + at[3]:start + at[4]]) * at[5] == key[3]:
                    return False
        return True

    # ----------------------------------------------------------------------- serving: stats lines

    def stats_run(self, first: int, last: int) -> bool:
        """A run group of stats lines: deferred to the chunk's end where the KV pressure rule allows it
        (run_kv_safe), else applied line by line now; False before the engine is known (the caller
        reads them one by one)."""
        sel, state = self.sel, self.state
        i, j = sel[first], sel[last]
        if run_kv_safe(self.data, self.start(i), self.ends[j] + j, state):
            if self.run_kind:
                self.flush_run()
            if not self.serving_run and state.marks_ready(self.infos[i].named == "prefill"):
                self.serving_run = self.mark_ready(first, last)   # (the line a recovery was proven at: root_cause)
            self.deferred.append((first, last))
            return True
        if not self.engine_known:
            return False
        # KV-unsafe: each line's numbers are applied, in order (kv_cache_pressure keeps
        # the line of the last line that raised it), but the ready mark only once: it
        # reads nothing the numbers write, and a second one changes nothing.
        if self.run_kind:
            self.flush_run()
        if self.deferred:
            self.flush_deferred()
        if self.infos[j].keys & KV_WAITING_BITS == KV_WAITING_BITS and self.kv_raised_at_end(first, last):
            # Its last line raises kv_cache_pressure with its own numbers: that replaces what
            # any line before it raised, so the run is applied as a KV-safe one (the lines
            # whose numbers no later line overwrites, and the spec-decode window), now.
            if not self.serving_run and state.marks_ready(self.infos[i].named == "prefill"):
                self.serving_run = self.mark_ready(first, last)
            self.deferred.append((first, last))
            self.flush_deferred()
            return True
        self.stats_each(first, last)
        return True

    def stats_each(self, first: int, last: int) -> None:
        """sel[first..last], stats lines applied one by one (the ready mark once)."""
        sel, infos, state, segs, data = self.sel, self.infos, self.state, self.segs, self.data
        need_mark = not self.serving_run
        # Each spec-decode line judges the window (State._judge_spec), replacing the judgement
        # before it, and no line of the run reads it: only the last one's is made.
        last_spec = -1
        for q in range(last, first - 1, -1):
            if infos[sel[q]].keys & SPEC_BITS:
                last_spec = sel[q]
                break
        for q in range(first, last + 1):
            i = sel[q]
            plan = infos[i].plan
            if plan and plan.stats_at is not None and not plan.ansi and plan.bar_at < 0:
                start = self.start(i)
                read = plan.stats_read
                if read is not None:
                    stats = _read_stats(read, data[start:start + len(segs[i])])
                else:
                    body = data[start:start + len(segs[i])].decode("utf-8", "replace")[plan.body[0]:plan.body[1]]
                    stats = {key: float(body[a:b]) * times / over for key, a, b, times, over in plan.stats_at}
                if need_mark and state.marks_ready(infos[i].named == "prefill"):
                    working = stats_working(stats)
                    # (a line with no work proves nothing where an error waits: a later one may: see mark_ready)
                    need_mark = not working and state.holds_candidate()
                    state.ready_mark(self.where(i)[1], working)
                state.serving_data(stats, self.where(i)[1] if self.has_cr else self.base + i, i == last_spec)
            else:
                self.examine(i)                       # in full (it may do more than a stats line)
                need_mark = True
        self.serving_run = not need_mark

    def kv_raised_at_end(self, first: int, last: int) -> bool:
        """Whether every stats line of sel[first..last] is read at planned spans and the last one, which
        gives both the KV use and the waiting requests, raises kv_cache_pressure (State.serving_data)."""
        infos, sel = self.infos, self.sel
        for q in range(first, last + 1):
            plan = infos[sel[q]].plan
            if not plan or plan.stats_read is None:
                return False
        j = sel[last]
        start = self.start(j)
        stats = _read_stats(infos[j].plan.stats_read, self.data[start:start + len(self.segs[j])])
        kv = stats.get("kv_cache_pct")
        return bool(stats.get("preemptions")) or kv is not None and kv >= 95.0 and bool(stats.get("waiting"))

    def flush_deferred(self) -> None:
        """Apply the deferred stats lines that count (stats_kept), in order."""
        keep, last_spec = self.stats_kept()
        for i in reversed(keep):
            self.stats_line(i, i == last_spec)
        self.deferred.clear()

    def stats_kept(self) -> tuple[list[int], int]:
        """(the deferred lines that count, latest first; the last spec-decode line): each line that
        provides a number no later line provides, and the last SPEC_WINDOW spec-decode lines (their mean
        is judged; only the last one's judgement of the window lasts)."""
        covered, spec_left, keep = 0, SPEC_WINDOW, []
        last_spec = -1
        infos, sel = self.infos, self.sel
        for first, last in reversed(self.deferred):
            for q in range(last, first - 1, -1):
                keys = infos[sel[q]].keys
                need = keys & ~covered
                if keys & SPEC_BITS and spec_left:
                    if spec_left == SPEC_WINDOW:
                        last_spec = sel[q]
                    spec_left -= 1
                    need = 1
                if need:
                    keep.append(sel[q])
                    covered |= keys
                    if covered == ALL_SERVING_BITS and not spec_left:
                        return keep, last_spec
        return keep, last_spec

    def stats_line(self, i: int, judge: bool) -> None:
        """One stats line's numbers applied (judge: it judges the spec-decode window)."""
        stats = self.segment_stats(i)
        if stats:
            self.state.serving_data(stats, self.where(i)[1], judge)

    def segment_stats(self, i: int) -> Optional[dict[str, float]]:
        """The numbers of stats line i: at its template's spans where planned, else read whole."""
        start = self.start(i)
        raw = self.data[start:start + len(self.segs[i])]
        info = self.infos[i]
        plan = info.plan
        if plan is None:                              # planned on its second reading, as in examine()
            plan = self.plan_now(i, info)
        if plan and plan.stats_read is not None:
            return _read_stats(plan.stats_read, raw)
        if plan and not plan.ansi and plan.bar_at < 0:    # its message's span, from the template
            body = raw.decode("utf-8", "replace")[plan.body[0]:plan.body[1]]
            at = plan.stats_at
            return parse_serving_stats_line(body) if at is None else {
                key: float(body[a:b]) * times / over for key, a, b, times, over in at}
        return stats_of_segment(raw)

    def mark_ready(self, first: int, last: int) -> bool:
        """State.ready_mark for a run of stats lines sel[first..last]: at its first line; where an error waits
        (State.holds_candidate), at its first line that shows work (stats_working: what reading them one by
        one would prove). True once a line proved it (the run's later lines then change nothing)."""
        state, sel = self.state, self.sel
        if not state.holds_candidate():
            state.ready_mark(self.where(sel[first])[1])
            return True
        for q in range(first, last + 1):
            stats = self.segment_stats(sel[q])
            if not stats or stats_working(stats):
                state.ready_mark(self.where(sel[q])[1])
                return True
        state.ready_mark(self.where(sel[last])[1], False)
        return False


def analyze_file(path: Any, chunk_size: int = READ_CHUNK, *, analyzer: Optional[LogAnalyzer] = None,
                 max_bytes: Optional[int] = None) -> LogAnalysis:
    """Analyze a whole log file, reading it in chunks (memory stays flat whatever its size).

    `path`: a path (only a regular file is read: a FIFO or /dev/zero raises
    NotARegularFile) or an open binary stream such as stdin. `max_bytes`: stop
    after that many bytes (see `truncated` on the result's reader: analyze_stream).
    `analyzer`: a fresh analyzer to use instead of the default one (the tests' reference scanner).
    """
    if hasattr(path, "read"):
        return analyze_stream(path, chunk_size, analyzer=analyzer, max_bytes=max_bytes)[0]
    from gpudeck.jobs.paths import open_regular
    with open_regular(path) as fh:
        return analyze_stream(fh, chunk_size, analyzer=analyzer, max_bytes=max_bytes)[0]


def analyze_stream(fh: Any, chunk_size: int = READ_CHUNK, *, analyzer: Optional[LogAnalyzer] = None,
                   max_bytes: Optional[int] = None) -> tuple[LogAnalysis, bool]:
    """(analysis, truncated): an open binary stream read to its end or to `max_bytes`."""
    analyzer = analyzer if analyzer is not None else LogAnalyzer()
    left = max_bytes
    truncated = False
    while left is None or left > 0:
        chunk = fh.read(chunk_size if left is None else min(chunk_size, left))
        if not chunk:
            break
        if left is not None:
            left -= len(chunk)
        analyzer.feed(chunk)
    else:
        truncated = bool(fh.read(1))
    analyzer.finish()
    return analyzer.result(), truncated


def analyze_bytes(data: bytes) -> LogAnalysis:
    """Analyze an in-memory log (tests, small excerpts)."""
    analyzer = LogAnalyzer()
    analyzer.feed(data)
    analyzer.finish()
    return analyzer.result()
