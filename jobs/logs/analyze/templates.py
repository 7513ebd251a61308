"""The fast scanner's templates: what examining any segment of one digit-normalised shape can do, learned once per shape."""
from __future__ import annotations

import re
from bisect import bisect_right
from enum import IntEnum
from itertools import accumulate
from operator import itemgetter
from typing import Literal, Optional, Union

from .model import ALL_FAMILIES, F, Family, GIANT_SEGMENT, M, P, S, SERVING_KEYS, W
from .patterns import (CHAINED, ANSI, BAD_ARGS, CODE_INDENT, EPOCH, EXC_LINE, FAMILY, FRAME, JIT, KV_PRESSURE, LOSS_DICT, MAKE,
                       NINJA, NOT_FAILURE_LEVELS, NUM_EPOCHS, OOM_RISK, SIZE, STALL_NOTICE, STEP,
                       TOTAL_STEPS, TQDM, TQDM_RATE, TQDM_TIMES, TRAIN_END, VLLM_SPEC_RATE, clock, families_in, indent_width, label_phase, names_totals, parse_serving_stats_line, warns, prefilter_in, prefix_ts_span, requested_cancel,
                       serving_stats_spans, strip_prefixes, training_shaped, ts_seconds)
from .generic import count_after_epoch, labelled_bracket, labelled_count
from .cause import Spec
from .signatures import ENGINE_SELF_KILL, MARKERS, engine_signals
from .state import (ONLY_NVRM, ONLY_STALL, PG_COUNT, PG_LOSS, PG_MAKE, PG_NINJA, PG_STEP, State, bar_label)
from . import regexcache


# --------------------------------------------------------------------------- the fast scanner's templates
#
# Most lines of a long log are repeats of a few shapes that differ only in their numbers
# (stats lines, tqdm redraws, ninja steps, NCCL chatter). The fast scanner therefore looks
# at each segment's *template* — its bytes with every digit turned into 0 — once, learns
# statically what examining such a segment can do, and then, per chunk, examines only the
# segments whose effect no later segment of the chunk overwrites.
#
# Soundness rests on one property: every decision the handlers take is the same for all
# segments of one template. Regexes test digits by class (\d), never by value, except in
# the contexts of _DIGIT_VALUE_WORDS, whose templates are examined in full every time (Xid
# codes, exit/return codes and signal numbers, collect2) — tests/test_analyze_fast.py checks that no other
# pattern names a digit. The anchor "signal 9" names one too: templates with "signal 0"
# are re-filtered per segment. Value-dependent verdicts (argparse usage proximity, V0
# spec-decode token counts, step/epoch arithmetic, timestamped build steps, KV-cache
# thresholds) send segments to full examination as well.
# tests/analyze_reference.py (ReferenceAnalyzer) examines every anchored segment; tests compare the two.

NORMALIZE = bytes.maketrans(b"0123456789\r", b"0000000000\n")
_DIGIT_VALUE_WORDS = ("Xid", "xit", "signal", "collect", "return", "terminated", "core proc")
_DIGIT_ANCHOR = b"signal 9"
_DIGIT_ANCHOR_TEMPLATE = b"signal 0"
assert [lit for lit in FAMILY if set(lit) & set(b"0123456789")] == [_DIGIT_ANCHOR]



class Kind(IntEnum):
    """What examining a segment of one template can do."""
    INERT = 0        # nothing (falsy: "no run pending")
    BAR = 1          # a progress-bar redraw
    BAR_GLUED = 2    # a bar with a log record glued after it
    BUILD = 3        # a ninja/make build step
    SERVING = 4      # a serving-stats line
    OTHER = 5        # anything else: examined in full
    GIANT = 6        # longer than GIANT_SEGMENT: examined on its ends
    REFILTER = 7     # "signal 0" template: re-prefiltered per segment (the anchor "signal 9" names a digit)


K_INERT, K_BAR, K_BAR_GLUED, K_BUILD, K_SERVING, K_OTHER, K_GIANT, K_REFILTER = Kind
_SERVING_BIT = {key: 1 << i for i, key in enumerate(SERVING_KEYS)}
ALL_SERVING_BITS = (1 << len(SERVING_KEYS)) - 1
SPEC_BITS = _SERVING_BIT["spec_accept_rate"] | _SERVING_BIT["spec_accept_len"]
KV_WAITING_BITS = _SERVING_BIT["kv_cache_pct"] | _SERVING_BIT["waiting"]
_NO_WEAK: frozenset = frozenset()
_NO_HITS = (False, False, _NO_WEAK)
TEMPLATE_KEY_MAX = 2048                 # longer segments are classified each time, not remembered
TEMPLATE_CACHE_BYTES = 4 * 1024 * 1024  # bound on remembered template bytes (memory stays flat)
TEMPLATE_ONE_OFFS_MAX = 256             # more one-off templates than this in a chunk: see LogAnalyzer._learn
RUN_GROUPS: dict = {}
SKIP_GROUP = ("skip",)


# A template's plan: None until planned, False where no plan fits (see record_plan).
Plan = Union[None, Literal[False], "RecordPlan"]


class Template:
    """What examining any segment of one template can do (see classify_template)."""
    __slots__ = ("fams", "kind", "named", "keys", "strong", "path", "weak", "group", "plan", "seen")

    def __init__(self, fams: int, kind: int, named: Optional[str] = None, keys: int = 0,
                 hits: tuple[bool, bool, frozenset] = _NO_HITS) -> None:
        self.fams = fams
        self.kind = kind
        self.named = named          # K_BAR / K_BAR_GLUED: the phase the bar's label names (None: unnamed)
        self.keys = keys            # K_SERVING: bit set of the SERVING_KEYS the line provides
        self.strong, self.path, self.weak = hits   # what _engine() would find in it (engine not yet known)
        self.plan: Plan = None      # built on the second examination; False: none fits
        self.seen = 0
        # Consecutive segments with one group key are handled together: a run of redraws of
        # bars naming one phase, of build steps, of stats lines. Anything else, and anything
        # that may teach the engine, is its own group (handled one segment at a time).
        if hits == _NO_HITS and kind in (K_BAR, K_BUILD, K_SERVING):
            self.group = RUN_GROUPS.setdefault((kind, named), (kind, named))
        else:
            self.group = self

    def __repr__(self) -> str:
        return f"Template({Family(self.fams)!r}, {self.kind!r}, named={self.named!r}, keys={self.keys:#x})"


_GIANT_TEMPLATE = Template(ALL_FAMILIES, K_GIANT)
_REFILTER_TEMPLATE = Template(ALL_FAMILIES, K_REFILTER)
_PROBE = State()   # only ever asked _classify() on non-NVRM lines, which reads but never writes it


def _engine_hits(text: str, body: str) -> tuple[bool, bool, frozenset]:
    """What State._engine(text, body) would look at, independent of what is already known."""
    strong, path, weak = engine_signals(text, body)
    return strong is not None, path is not None, weak


def _progress_kind(body: str, ts: Optional[tuple[str, str]]) -> Kind:
    """Mirror of State._progress_record's branches: K_INERT (does nothing), K_BUILD (ninja/make step), K_OTHER."""
    c = body[0]
    if c == "[" and (NINJA.match(body) or MAKE.match(body)):
        return K_BUILD if ts is None else K_OTHER        # a timestamp feeds a rate: every line counts
    if labelled_bracket(body) is not None:
        return K_OTHER
    if c == "{" and (LOSS_DICT.match(body) or TRAIN_END.match(body)):
        return K_OTHER
    if names_totals(body):
        return K_OTHER if (NUM_EPOCHS.search(body) or TOTAL_STEPS.search(body)) else K_INERT
    if not ("tep" in body or "TEP" in body or "ter" in body or "poch" in body or "POCH" in body):
        return K_OTHER if labelled_count(body) is not None else K_INERT
    return K_OTHER if (STEP.search(body) or EPOCH.search(body)) else K_INERT


def _failure_inert(body: str, level: Optional[str]) -> bool:
    """True if State._failure(body, level, …) changes nothing, whatever the state and the digits."""
    if FRAME.match(body) or body.startswith("usage:"):
        return False
    if body[0] in "^~":
        return True
    if STALL_NOTICE.search(body):
        return False                                  # counted, whatever its level
    if level in NOT_FAILURE_LEVELS:
        return True
    if body.startswith("NVRM:") or any(w in body for w in _DIGIT_VALUE_WORDS) or BAD_ARGS.search(body):
        return False                                  # digit- or state-dependent verdicts
    if requested_cancel(body) or CHAINED.search(body):
        return False                                  # a requested cancel, a chain's joint: no candidate, but State notes it
    return _PROBE._classify(body, level, 0) is None


def _glued_inert(rest: str, fams: int) -> bool:
    """True if State._examine_text(rest, …) after a bar (engine known) changes nothing, whatever the
    state and the digits: no bar, and a record whose every handler is inert (as classify_template)."""
    if fams & P and "%" in rest and TQDM.search(rest) is not None:
        return False
    msg, level, ts = strip_prefixes(rest)
    body = msg.strip()
    if not body:
        return True
    if fams & S and parse_serving_stats_line(body):
        return False
    if fams & M and MARKERS.search(body):
        return False
    if fams & P and _progress_kind(body, ts) != K_INERT:
        return False
    if fams & F and not _failure_inert(body, level):
        return False
    return not (fams & W and warns(body))


def classify_template(tpl: bytes, engine_known: bool) -> Union[int, Template]:
    """0 for a template the prefilter skips, else what examining it can do. Mirrors State.examine."""
    if len(tpl) > GIANT_SEGMENT:
        return _GIANT_TEMPLATE
    if _DIGIT_ANCHOR_TEMPLATE in tpl:
        return _REFILTER_TEMPLATE                     # "signal 9" is an anchor, "signal 1" is not
    rx = prefilter_in(tpl, engine_known)
    m = rx.search(tpl)
    if m is None:
        return 0
    fams = families_in(rx, tpl, m, len(tpl))
    raw = ANSI.sub(b"", tpl) if b"\x1b" in tpl else tpl
    text = raw.decode("utf-8", "replace")
    no_hits = _NO_HITS
    if fams & P and "%" in text:                      # _examine_text: a tqdm bar
        bar = TQDM.search(text)
        if bar is not None:
            label = strip_prefixes(text[:bar.start()].strip())[0].strip().rstrip(":").strip()[:100]
            hits = no_hits if engine_known else _engine_hits(label, label)
            rest = text[bar.end():]
            # What is glued after the bar matters only if examining it can do something: a bar
            # with an inert record glued on is a plain redraw (it joins runs of its phase's bars).
            kind = K_BAR_GLUED if rest.strip() and not (engine_known and _glued_inert(rest, fams)) else K_BAR
            return Template(fams, kind, named=label_phase(label), hits=hits)
    msg, level, ts = strip_prefixes(text)            # _record
    body = msg.strip()
    hits = no_hits if engine_known else _engine_hits(text, body)
    if not body:                                      # _record looks for the engine only
        return 0 if hits == no_hits else Template(fams, K_INERT, hits=hits)
    if fams & S:
        stats = parse_serving_stats_line(body)
        if stats:
            if "Avg prompt throughput" not in body and "acceptance" in body:
                rate = VLLM_SPEC_RATE.search(body)
                if rate and not rate.group(2):
                    return Template(fams, K_OTHER)   # V0 spec metrics: which keys depends on token counts
            keys = 0
            for key in stats:
                keys |= _SERVING_BIT.get(key, 0)     # (no bit: "preemptions", a warning, no number)
            # SGLang's Prefill batch lines run apart: while it warms up they prove no serving (State.marks_ready)
            return Template(fams, K_SERVING, named="prefill" if body.startswith("Prefill batch") else None,
                            keys=keys, hits=hits)
    if fams & M and MARKERS.search(body):
        return Template(fams, K_OTHER)
    kind = _progress_kind(body, ts) if fams & P else K_INERT
    if kind == K_OTHER:
        return Template(fams, K_OTHER)
    if fams & F and not _failure_inert(body, level):
        return Template(fams, K_OTHER)
    if fams & W and warns(body):
        return Template(fams, K_OTHER)
    if kind == K_INERT and hits == no_hits:
        return 0
    return Template(fams, kind, hits=hits)


def prefilter_one_offs(templates: list[bytes], engine_known: bool) -> dict[bytes, Union[int, Template]]:
    """0 or a K_OTHER template (examined in full) for each of many templates, with one prefilter pass over all."""
    out: dict[bytes, Union[int, Template]] = {}
    batch = []
    for tpl in templates:
        if len(tpl) > GIANT_SEGMENT or _DIGIT_ANCHOR_TEMPLATE in tpl:
            out[tpl] = classify_template(tpl, engine_known)
        else:
            out[tpl] = 0
            batch.append(tpl)
    joined = b"\n".join(batch)
    ends = list(accumulate(len(tpl) + 1 for tpl in batch))      # just past each template's separator
    rx = prefilter_in(joined, engine_known)
    search = rx.search
    pos = 0
    while True:
        m = search(joined, pos)
        if m is None:
            break
        k = bisect_right(ends, m.start())
        stop = ends[k] - 1
        out[batch[k]] = Template(families_in(rx, joined, m, stop), K_OTHER)
        pos = stop + 1
    return out


class RecordPlan:
    """What State.examine decides from a segment's template alone, so that segments of the template
    are read without the searches (State.examine_planned applies it to the segment's real text).

    Sound for the same reason the templates are: every pattern tests digits by class, so a
    template and its segments have the same match spans, prefixes, level and branches; values
    (numbers, messages, timestamps) are read from the real text at the planned spans.
    """
    __slots__ = ("ansi", "bar_at", "msg_at", "body", "indent", "level", "has_ts", "stats", "marker",
                 "progress", "failure", "guard", "warn", "only", "marker_only", "bar_end", "rest", "bar", "ts", "prog",
                 "reads_frame", "bar_bytes", "stats_at", "stats_read", "bar_label", "eta_text", "marker_at", "hint_only", "timed_step", "step_stretch")

    def __init__(self) -> None:
        self.ansi = False
        self.bar_at = -1                 # a tqdm bar at this offset, ending at bar_end,
        self.bar_end = -1
        self.bar: Optional[tuple] = None   # where its numbers lie (see bar_plan)
        self.bar_bytes: Optional[tuple] = None   # (n start, n end, n scale, N start, N end, N scale) in bytes
        self.bar_label: Optional[tuple] = None   # State._bar_label's answer when the text before the bar has no digit
        self.eta_text = False            # its remaining time is clock()'s to read for sure (see _tqdm_planned)
        self.rest: Optional[RecordPlan] = None     # and the plan of what is glued after it
        self.msg_at = 0
        self.body = (0, 0)               # span of the stripped message
        self.indent = 0
        self.level: Optional[str] = None
        self.has_ts = False
        self.ts: Optional[tuple[str, int, int]] = None   # (kind, start, end) of the prefixes' timestamp
        self.prog: Optional[tuple] = None   # where State._progress_record reads (progress_plan); None: in full
        self.stats = False
        self.stats_at: Optional[tuple] = None    # where the stats line's numbers lie (serving_stats_spans)
        # The same for an ASCII template, read at C level from the segment (bytes or its text): (keys,
        # an itemgetter of the numbers' slices, (key, times, over) of the scaled ones) — see patterns.read_stats.
        self.stats_read: Optional[tuple] = None
        self.marker: Optional[tuple[str, int, int]] = None    # (kind, start, end) in the body
        self.marker_at: Optional[tuple[int, int]] = None      # that span in the segment's bytes (ASCII templates)
        self.progress = False
        self.failure: Optional[str] = None   # "frame" | "usage" | "stall" | "classify" | None
        self.guard = False               # indented like traceback source: skipped right after a frame
        self.reads_frame = False         # applying it reads the last frame's line (guard), here or glued after
        self.warn = False
        # The whole effect, when it is one the scanner applies without reading the segment:
        # ONLY_FRAME (a traceback frame: its line), ONLY_STALL (a stall notice), ONLY_NVRM (a driver
        # line), or the Spec of the failure candidate it is (for a rank that depends on digits, its
        # bound: SPECIFIC).
        self.only: Optional[int] = None
        # A phase marker and nothing else: repeating it changes nothing but the lines it is
        # remembered by (the first: ready line; the last: decided_by), so a run of segments
        # of the template reduces to its first and last.
        self.marker_only = False
        # An HF loss dict (no timestamp) and nothing else: a "hint" progress update whose every
        # effect the next such update overwrites (without a clock, no rate reads the series' start).
        self.hint_only = False
        # A make/ninja step with a plain timestamp (seconds, or h:m:s), maybe a "building" marker,
        # and nothing else: (has the marker, done's byte span, total's byte span or None for
        # make's 100, the timestamp's (kind, start, end)) — see the scanner's timed build steps.
        self.timed_step: Optional[tuple] = None
        # A step/epoch record (State._step_epoch) and nothing else, ASCII: (step's spans, epoch's
        # spans, lossy, the timestamp's (kind, start, end) or None) in bytes — see the scanner.
        self.step_stretch: Optional[tuple] = None


def record_plan(tpl: bytes, fams: int) -> RecordPlan:
    """The plan for segments of template `tpl` (prefiltered into `fams`)."""
    ansi = b"\x1b" in tpl
    raw = ANSI.sub(b"", tpl) if ansi else tpl
    text = raw.decode("utf-8", "replace")
    plan = _text_plan(text, fams)
    plan.ansi = ansi
    if plan.bar is not None and not ansi:
        # The bar's n and N as byte offsets (same bytes in every segment), for the scanner's
        # "is this loading bar full?" without decoding: plain UTF-8 and ASCII numbers only.
        n0, n1, n_scale, t0, t1, t_scale = plan.bar[:6]
        if text[n0:n1].isascii() and text[t0:t1].isascii() and text.encode("utf-8") == raw:
            offsets = [len(text[:k].encode("utf-8")) for k in (n0, n1, t0, t1)]
            plan.bar_bytes = (offsets[0], offsets[1], n_scale, offsets[2], offsets[3], t_scale)
    if plan.stats_at is not None and not ansi and plan.bar_at < 0 and tpl.isascii():
        # ASCII: the text's offsets are the bytes'; float() reads bytes as it reads their text
        b0 = plan.body[0]
        spans = [slice(b0 + a, b0 + b) for _, a, b, _, _ in plan.stats_at]
        plan.stats_read = (tuple(key for key, _, _, _, _ in plan.stats_at),
                           itemgetter(*spans) if len(spans) > 1 else itemgetter(spans[0], spans[0]),   # a tuple
                           tuple((key, times, over) for key, _, _, times, over in plan.stats_at
                                 if times != 1.0 or over != 1.0))
    if (not ansi and plan.bar_at < 0 and plan.progress and plan.prog is not None and plan.prog[0] in (PG_MAKE, PG_NINJA)
            and plan.ts is not None and plan.ts[0] in ("ts2", "ts5") and not (plan.stats or plan.warn or plan.failure)
            and (plan.marker is None or plan.marker[0] == "building") and tpl.isascii()
            and ts_seconds((plan.ts[0], text[plan.ts[1]:plan.ts[2]])) is not None):
        # ASCII: the decoded text's offsets are the bytes'. Its h:m:s or seconds parse on the template,
        # so on every segment (digits for digits): the scanner relies on it (a member's time is never None).
        b0 = plan.body[0]
        done, total = plan.prog[1], plan.prog[2] if plan.prog[0] == PG_NINJA else None
        plan.timed_step = (plan.marker is not None, (b0 + done[0], b0 + done[1]),
                           None if total is None else (b0 + total[0], b0 + total[1]), plan.ts)
    if (not ansi and plan.bar_at < 0 and plan.progress and plan.prog is not None and plan.prog[0] == PG_STEP
            and not (plan.stats or plan.warn or plan.failure or plan.marker) and tpl.isascii()):
        b0 = plan.body[0]

        def at(spans: Optional[tuple]) -> Optional[tuple]:
            if spans is None:
                return None
            (a, b), n_at = spans
            return (b0 + a, b0 + b), None if n_at is None else (b0 + n_at[0], b0 + n_at[1])

        plan.step_stretch = (at(plan.prog[1]), at(plan.prog[2]), plan.prog[3], plan.ts)
    if plan.marker is not None and plan.bar_at < 0 and not ansi and tpl.isascii():
        plan.marker_at = (plan.body[0] + plan.marker[1], plan.body[0] + plan.marker[2])
    part: Optional[RecordPlan] = plan
    while part is not None:
        if part.guard and part.failure in ("stall", "classify"):
            plan.reads_frame = True
        part = part.rest
    return plan


def _text_plan(text: str, fams: int) -> RecordPlan:
    """Mirror of State._examine_text (each bar, and what is glued after the last) and _record: a chain of
    plans (.rest), one a bar."""
    head = plan = RecordPlan()
    while fams & P and "%" in text:
        m = TQDM.search(text)
        if m is None:
            break
        plan.bar_at, plan.bar_end = m.start(), m.end()
        plan.bar = bar_plan(m)
        before = text[:m.start()]
        if "0" not in before:                         # no digit (a template's digits are 0s): the segments' text
            plan.bar_label = bar_label(before)
        rem = plan.bar[6]
        # clock() fails on an empty part ("1:", "::") alone: on the template as on its segments
        plan.eta_text = rem is not None and clock(text[rem[0]:rem[1]]) is not None
        text = text[m.end():]
        if not text.strip():
            return head
        plan.rest = plan = RecordPlan()
    msg, level, ts = strip_prefixes(text)
    plan.msg_at = len(text) - len(msg)
    body = msg.strip()
    plan.body = (plan.msg_at + len(msg) - len(msg.lstrip()), plan.msg_at + len(msg.rstrip()))
    plan.indent = indent_width(msg)
    plan.level, plan.has_ts = level, ts is not None
    plan.ts = prefix_ts_span(text) if ts is not None else None
    if not body:
        return head
    plan.stats = bool(fams & S) and parse_serving_stats_line(body) is not None
    if plan.stats:
        plan.stats_at = serving_stats_spans(body)
    if fams & M:
        m = MARKERS.search(body)
        if m is not None and m.lastgroup is not None:     # (always named: each branch of MARKERS is a group)
            plan.marker = (m.lastgroup, m.start(), m.end())
    plan.progress = bool(fams & P) and _progress_kind(body, ts) != K_INERT
    if plan.progress:
        plan.prog = progress_plan(body)
    if fams & F:
        if FRAME.match(body):
            plan.failure = "frame"
        elif body.startswith("usage:"):
            plan.failure = "usage"
        else:
            plan.guard = plan.indent >= CODE_INDENT and EXC_LINE.match(body) is None    # (state._failure)
            if body[0] in "^~":
                pass
            elif STALL_NOTICE.search(body):
                plan.failure = "stall"
            elif level in NOT_FAILURE_LEVELS:
                pass
            elif not _failure_inert(body, level):
                plan.failure = "classify"
    plan.warn = bool(fams & W) and warns(body)
    plan.marker_only = plan.marker is not None and not (plan.stats or plan.progress or plan.warn or plan.failure)
    plan.hint_only = (plan.progress and plan.prog is not None and plan.prog[0] == PG_LOSS and plan.ts is None
                      and not (plan.stats or plan.marker or plan.warn or plan.failure))
    if (not (plan.stats or plan.marker or plan.progress or plan.warn) and ENGINE_SELF_KILL.search(body) is None
            and CHAINED.search(body) is None):       # (each noted whatever is held: State._failure)
        if plan.failure == "frame":
            plan.only = ONLY_FRAME
        elif plan.failure == "stall":
            plan.only = ONLY_STALL                     # a no-op once STALL_REPEATS notices are counted
        elif plan.failure == "classify" and body.startswith("NVRM:"):
            if "slurmstepd" not in body:               # (slurm_oom replaces a held host_oom)
                plan.only = ONLY_NVRM                  # joins the driver-line window: see the scanner
        elif plan.failure == "classify" and not (
                BAD_ARGS.search(body)                  # reads the usage line's distance
                or any(w in body for w in _DIGIT_VALUE_WORDS)):
            cand = _PROBE._classify(body, level, 0)   # its Spec does not depend on the phase, nor on digits here
            if cand is not None and cand.hint_key != "slurm_oom":   # it replaces a held host_oom of its rank
                plan.only = int(cand.spec)
        elif plan.failure == "classify" and not ("slurmstepd" in body or body.startswith("***")):
            # Its verdict (a candidate of some rank, or none) depends on digits or on the usage
            # line, not on slurm_oom's exception: its rank's bound stands for it (candidate_is_noop).
            plan.only = int(Spec.SPECIFIC)
    return head


ONLY_FRAME = -1
# The value a traceback-frame template (plan.only == ONLY_FRAME) gets in the engine-known
# template cache: falsy, so the per-line C passes leave its segments out of the ones Python
# visits; the scanner finds where they are only to give an examination that reads "the last
# frame line" its value.
FRAME_LINE = ()


def progress_plan(body: str) -> Optional[tuple]:
    """Mirror of State._progress_record's branches, taken on the template's body: which one its
    segments take and the spans of the numbers it reads (State._progress_planned); None for the
    rare branches read in full (trainer banners, the train_runtime dict). Sound as bar_plan is."""
    c = body[0]
    if c == "[":
        m = NINJA.match(body)
        if m:
            return (PG_NINJA, m.span(1), m.span(2))
        m = MAKE.match(body)
        if m:
            return (PG_MAKE, m.span(1))
    if labelled_bracket(body) is not None:
        return None                                   # read in full (State._progress_record)
    if c == "{":
        m = LOSS_DICT.match(body)
        if m:
            return (PG_LOSS, m.span(1), m.span(2) if m.group(2) is not None else None)
        if TRAIN_END.match(body):
            return None
    if names_totals(body):
        return None
    if not ("tep" in body or "TEP" in body or "ter" in body or "poch" in body or "POCH" in body):
        m = labelled_count(body)
        if m is None:
            return (PG_STEP, None, None, False)
        # The label's span and phase hold for every segment: it starts with a letter, its end is
        # stripped of whitespace and colons (no digits), and no word label_phase looks for has one.
        label = m.group("label").strip().rstrip(":").strip()
        return (PG_COUNT, (m.start("label"), m.start("label") + len(label)), label_phase(label) or "unknown",
                m.span("n"), m.span("N"))
    sm, em = STEP.search(body), EPOCH.search(body)
    if sm is None and em is not None:
        sm = count_after_epoch(body, em.end())
    step = (sm.span(1), sm.span(2) if sm.group(2) else None) if sm else None
    epoch = (em.span(1), em.span(2) if em.group(2) else None) if em else None
    return (PG_STEP, step, epoch, training_shaped(body))


def bar_plan(m: "re.Match[str]") -> tuple:
    """Where State._tqdm reads a bar's numbers, from the bar's TQDM match on its template:
    (n start, n end, n scale, N start, N end, N scale, remaining-time span or None,
    (rate start, rate end, rate scale, seconds per item) or None). The unit letters, '?'
    and the rate's direction are no digits, so they are the template's; the spans are the
    segment's too (every pattern involved tests digits by class)."""
    inner = m.group("inner")
    rem = rate = None
    if inner:
        base = m.start("inner")
        t = TQDM_TIMES.match(inner)
        if t and t.group("rem") != "?":
            rem = (base + t.start("rem"), base + t.end("rem"))
        off = t.end() if t else 0
        r = TQDM_RATE.search(inner[off:])
        if r and r.group("v") != "?":
            rate = (base + off + r.start("v"), base + off + r.end("v"), SIZE[r.group("u")],
                    r.group("a") == "s" and r.group("b") != "s")     # "2.87s/it": seconds per item
    return (m.start("n"), m.end("n"), SIZE[m.group("nu")], m.start("N"), m.end("N"), SIZE[m.group("Nu")], rem, rate)


# A run of stats lines is "KV-safe" when none of them can raise kv_cache_pressure (KV use >= 95 %,
# or vLLM's "Preemptions: N"): no "Preemptions:" in its bytes, every "usage:" followed by a plainly
# small number, and the KV use already known below 95 %. Otherwise its lines are examined in full, because that warning keeps
# the line of the last line that raised it. One C-level search over the run's bytes only
# (the separators around them cannot be part of a match, nor change its lookarounds).
_KV_UNSAFE_USAGE = regexcache.compile(
    rb"Preemptions:|usage:(?!(?<=cache usage:) ?(?:\d|[1-8]\d|9[0-4])(?:\.\d{1,6})?(?![\d.])"
    rb"|(?<=token usage:) ?(?:0|0?\.(?:[0-8]\d{0,5}|9[0-4]\d{0,4}))(?![\d.]))")


def run_kv_safe(data: bytes, start: int, stop: int, state: "State") -> bool:
    """Whether the stats lines in data[start:stop] are KV-safe."""
    kv = state.serving.get("kv_cache_pct")
    if kv is not None and kv >= 95.0:
        return False
    return _KV_UNSAFE_USAGE.search(data, start, stop) is None
