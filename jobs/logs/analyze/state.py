"""The state machine: what one examined log record changes in the analysis (engine, phase, progress, failure, serving, warnings)."""
from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Final, Iterable, Optional, Union

from .model import (ALL_FAMILIES, F, Failure, KeyLine, LogAnalysis, LogWarning, M, MAX_MESSAGE, Number, P,
                    Progress, RECOVERY_ADVANCES, S, SERVING_KEYS, SPEC_MIN_ACCEPT_LEN, SPEC_MIN_ACCEPT_RATE,
                    SPEC_WINDOW, STALL_REPEATS, ServingNumbers, W)
from .cause import FALLBACK_CAUSES, Spec, is_no_event, is_warning
from .generic import count_after_epoch, is_count, labelled_bracket, labelled_count
from .patterns import (CHAINED, ANSI, BAD_ARGS, CODE_INDENT, EPOCH, EXC_LINE, FRAME, GPU_FAULT, HINTS, JIT, KV_PRESSURE, LOSS_DICT,
                       MAKE, NINJA, NOT_FAILURE_LEVELS, NUM_EPOCHS, OOM_RISK, CLIENT_STATUS_ERROR, REQUEST_ERROR, REQUEST_ERROR_LINES, SERIES_LABELS, SHELL_KILLED, SIZE,
                       SLURM_OOM, STALL_NOTICE, STEP, TOTAL_STEPS, TQDM, TQDM_RATE, TQDM_TIMES, TRAIN_END, XID,
                       XID_APP, XID_NOISE, clock, indent_width, label_phase, names_totals, num, parse_serving_stats_line, read_stats, requested_cancel,
                       series_label, strip_prefixes, training_shaped, ts_seconds)
from .signatures import ENDS_TRACEBACK, ENGINE_WEAK, MARKERS, Context, classify as classify_failure, engine_signals

if TYPE_CHECKING:                      # templates imports this module
    from .templates import RecordPlan

# A `why` entry: its text, or (format, *args), kept so on the hot paths and formatted when a result is made.
Why = Union[str, tuple[Any, ...]]
# A remaining time: seconds, or a planned bar's text of it, which clock() reads when a result is made.
Eta = Union[float, str, None]

# Spec.EXCEPTION and Spec.UMBRELLA as plain ints (an IntEnum member read through its class costs ~60 ns).
_EXCEPTION, _UMBRELLA = int(Spec.EXCEPTION), int(Spec.UMBRELLA)


@dataclass
class _Candidate:
    spec: Spec
    cause: str
    line: int
    message: str
    hint_key: str
    sig: str = ""      # the signature that matched (named for `decided_by`)

    @property
    def hold(self) -> int:
        """The rank a candidate of the same or a lower one cannot displace (candidate_is_noop): its own, but one
        lower for a cause that a later one of its rank may displace (_DISPLACED_BY; cause.py, rule 3)."""
        return self.spec - 1 if self.cause in _DISPLACED_BY or self.sig in _DISPLACED_BY else self.spec


def _same(a: Any, b: Any) -> bool:
    """a == b, but NaN is NaN and dicts are the same only in the same order (State.same_course)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (tuple, list, deque)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, _Candidate):
        return _same(tuple(vars(a).values()), tuple(vars(b).values()))
    return a == b


def _is_traceback_header(cand: _Candidate) -> bool:
    return "Traceback (most recent call last)" in cand.message


# The causes whose held candidate a later one of the same rank displaces, and by which causes (cause.py, rule 3):
# a build error brings about no GPU failure (the job got past it); a GPU's hardware fault explains the CUDA and
# NCCL errors around it, wherever a paste puts its dmesg lines.
# No NCCL error brings about a compiler's or linker's (a build's configure probe printed it: `NCCL not found: NCCL
# error: unhandled system error … Userbuffers support will be disabled`).
# A hang read from repeated stall notices (by its row, STALL_NOTICE) names no culprit: the NCCL watchdog's
# timeout, a CUDA error or a GPU fault after them says what hung.
_DISPLACED_BY: dict[str, frozenset[str]] = {"build_failed": frozenset(("cuda_oom", "gpu_fault")),
                                            "cuda_error": frozenset(("gpu_fault",)),
                                            "nccl": frozenset(("gpu_fault", "build_failed")),
                                            "STALL_NOTICE": frozenset(("nccl", "cuda_error", "gpu_fault"))}
_NONE: frozenset[str] = frozenset()

# progress_at_failure for an error no progress undoes: a key no series has (see _candidate).
_NO_RECOVERY = (("never",), float("inf"))


def stats_working(stats: dict[str, float]) -> bool:
    """False for a stats line that shows requests running and no token made, prompt or generated, in its
    interval (vLLM's `Running: 7 reqs … Avg generation throughput: 0.0 tokens/s`, SGLang's decode line
    at 0.00 token/s): no proof that the engine steps. A line without a generation rate (a prefill batch)
    proves work."""
    gen = stats.get("gen_tokens_per_s")
    return gen is None or gen > 0 or stats.get("prompt_tokens_per_s", 0.0) > 0 or stats.get("running", 0.0) <= 0


def stats_of_segment(raw: bytes) -> Optional[dict[str, float]]:
    """The numbers of a serving-stats line read whole (its prefixes and colours stripped)."""
    if b"\x1b" in raw:
        raw = ANSI.sub(b"", raw)
    return parse_serving_stats_line(strip_prefixes(raw.decode("utf-8", "replace"))[0].strip())


def series_done(key: tuple, done: float) -> bool:
    """Whether the series `key` (source, phase, label, total) reached its total at `done`."""
    return len(key) == 4 and key[3] is not None and done >= key[3]

# The rows whose candidates _candidate looks at first: an engine killing itself, the bare `Killed` after it.
_SELF_KILL_SIGS = frozenset(("ENGINE_SELF_KILL", "HOST_OOM"))
# How close after an engine's self-kill announcement its kill lands (SGLang logs its crash-dump settings between),
# and how close before it a serving line proved no recovery (another DP rank's last stats line).
SELF_KILL_LINES = 6

# --------------------------------------------------------------------------- the state machine

# _classify's verdicts by (body, level, phase), for examine_planned: bounded, shared by analyzers.
_CLASSIFIED: dict[tuple, Optional[tuple]] = {}


class _Miss(enum.Enum):
    MISS = enum.auto()


_MISS: Final = _Miss.MISS             # not in _CLASSIFIED (an enum member: `is` narrows it away)
# "NVRM:" bodies -> whether _classify reads them as plain driver chatter (remembered in the window only).
_NVRM_PLAIN: dict[str, bool] = {}

def bar_label(before: str) -> tuple[str, Optional[str], str]:
    """(label, the phase its words name or None, series key) for the text before a tqdm bar."""
    label = strip_prefixes(before.strip())[0].strip().rstrip(":").strip()[:100]
    return label, label_phase(label), series_label(label)


def _why_text(why: Why) -> str:
    """A `why` entry as text: kept as (format, *args) on the hot paths, formatted when a result is made."""
    return why[0].format(*why[1:]) if isinstance(why, tuple) else why


def _log_warning(w: tuple) -> LogWarning:
    code, line, message = w
    if code == "error_recovered":
        message = f"{message[0]} logged at line {message[1]} but the job carried on: {message[2]}"[:MAX_MESSAGE]
    return LogWarning(code, line, message)


def _progress(done_total: tuple) -> Progress:
    """The Progress of a progress entry's (done, total, label, rate, eta): whole numbers as ints, and
    an eta kept as its text (a planned bar's remaining time) read."""
    done, total, label, rate, eta = done_total
    if eta.__class__ is str:
        eta = clock(eta)
    return Progress(int(done) if done.is_integer() else done,
                    None if total is None else int(total) if total.is_integer() else total, label, rate, eta)


_NAN = float("nan")
# The branches of _progress_record a planned body takes (templates.progress_plan).
PG_NINJA, PG_MAKE, PG_LOSS, PG_STEP, PG_COUNT = range(5)
# RecordPlan.only for a stall notice (beside a Spec: see candidate_is_noop), and for an NVRM driver
# line (a no-op only where the scanner knows it is: see scanner._Chunk).
ONLY_STALL, ONLY_NVRM = -2, -3

# transformers' from_pretrained bar (vLLM's and SGLang's loaders say `Loading safetensors checkpoint shards`).
_HF_LOAD_BAR = ("Loading checkpoint shards", "Loading pipeline components")   # transformers, diffusers
# The label of a bar that has none, by its phase.
_DEFAULT_LABELS = {"capturing": "CUDA graphs", "loading": "weights", "training": "training", "building": "build",
                   "compiling": "compile"}
# The phase each phase marker asserts (for `decided_by`), by its MARKERS group: a match's lastgroup,
# Optional to the type system (never None: each branch of MARKERS is a named group).
_MARKER_PHASE: dict[Optional[str], str] = {
    "loading": "loading", "loaded": "starting", "compiling": "compiling", "compiled": "starting",
    "capturing": "capturing", "captured": "starting", "starting": "starting", "startup_complete": "ready",
    "ready": "ready", "building": "building", "training": "training", "listening": "starting"}


class State:
    """Everything the analysis knows; small and bounded, so result() can copy it cheaply."""

    # Slots: more than 30 attributes overflow an instance's shared-key dict (CPython 3.11), and every
    # self.x then goes through the instance's own dict; a slot is read at a fixed offset. (__dict__
    # kept: tests wrap a method on an instance.)
    __slots__ = ("now", "engine_strong", "engine_path", "engine_weak", "weak_seen", "phase", "load_done", "hf_loaded",
                 "ready_line", "serving", "spec_recent", "warnings", "num_epochs", "total_steps", "bar", "hint",
                 "seq", "series", "first_error", "best", "first_low", "first_weak", "advances_since_failure",
                 "progress_at_failure", "last_frame_line", "request_error_at", "self_kill_at", "cancelled_at", "usage_line", "nvrm", "last_progress_key", "labels",
                 "stall_notices", "why", "text", "progress_at", "ready_text", "recovered_from", "warming",
                 "chained_at", "request_final_at", "outer_bar", "__dict__")

    def __init__(self) -> None:
        self.now: Optional[float] = None
        self.engine_strong: Optional[str] = None
        self.engine_path: Optional[str] = None
        self.engine_weak: dict[str, int] = {}
        self.weak_seen: set[str] = set()
        self.phase: Optional[str] = None
        self.load_done = False
        self.hf_loaded = False           # the load that completed was transformers' (see _unnamed_bar_phase)
        self.ready_line: Optional[int] = None
        self.serving: dict[str, float] = {}
        self.spec_recent: deque[tuple[Optional[float], Optional[float]]] = deque(maxlen=SPEC_WINDOW)
        # code -> (code, line, message), made a LogWarning by result(); error_recovered's message is
        # (cause, line, message), formatted there.
        self.warnings: dict[str, tuple] = {}
        self.num_epochs: Optional[int] = None
        self.total_steps: Optional[int] = None
        # progress: "bar" sources (tqdm/ninja/make/step n/N) beat "hint" sources (loss dicts, step=N) of one phase
        self.bar: Optional[tuple] = None     # (seq, phase, progress, signature, line, text)
        self.hint: Optional[tuple] = None
        # An unlabeled training bar left unfinished when an unlabeled bar of another total began in it
        # (HF Trainer's evaluation loop): the job's progress until a bar of its total comes back (_nest).
        self.outer_bar: Optional[tuple] = None
        self.seq = 0
        self.series: Optional[tuple[tuple, float, float]] = None  # (key, first done, first time) for rates
        # failure
        self.first_error: Optional[_Candidate] = None  # earliest candidate of any spec
        self.best: Optional[_Candidate] = None        # highest spec >= 2, earliest
        self.first_low: Optional[_Candidate] = None   # earliest spec 1
        self.first_weak: Optional[_Candidate] = None  # earliest spec 0
        # (best, first_error) as a phase marker or progress dropped them as recovered from: another rank
        # may have logged those while the one that raised it died; an envelope after it ("see above") revives it.
        # (the error recovered from, the first error then, the line serving proved it or None)
        self.recovered_from: Optional[tuple[_Candidate, Optional[_Candidate], Optional[int]]] = None
        # SGLang's uvicorn is up and its own warmup request not yet answered: a Prefill batch line now is
        # that request's, no proof it serves (its `fired up` line, or a Decode batch, is)
        self.warming = False
        self.advances_since_failure = 0
        self.progress_at_failure: Optional[tuple[tuple, Number]] = None
        self.last_frame_line = -10**9
        self.request_error_at = -10**9                # the last request-error line (REQUEST_ERROR)
        self.request_final_at: Optional[int] = None   # the last exception line taken as that request's
        self.chained_at = -10**9                      # the last joint of chained exceptions (CHAINED)
        self.self_kill_at = -10**9                    # the last ENGINE_SELF_KILL line
        self.cancelled_at = 10**18                    # the first requested cancel (Slurm's, no reason given)
        self.usage_line = -10**9
        self.nvrm: deque[tuple[int, str]] = deque(maxlen=6)
        self.last_progress_key: Optional[tuple[tuple, float]] = None
        self.labels: dict[str, tuple[str, Optional[str], str]] = {}
        self.stall_notices: list[int] = []            # lines of consecutive stall notices (STALL_NOTICE)
        # Which signature decided each field, and the text of the lines that matter (post-mortems).
        self.why: dict[str, Why] = {}
        self.text = ""                                # the record being examined
        self.progress_at: Optional[tuple[int, str]] = None   # (line, text) of the progress reported
        self.ready_text = ""

    # ------------------------------------------------------------------ entry

    def examine(self, raw: bytes, line: int, fams: int = ALL_FAMILIES) -> None:
        """One segment; `fams` (from its prefilter anchors) says which handlers it can concern."""
        if b"\x1b" in raw:
            raw = ANSI.sub(b"", raw)
        text = self.text = raw.decode("utf-8", "replace")
        self._examine_text(text, line, fams)

    def examine_planned(self, raw: bytes, line: int, fams: int, plan: RecordPlan) -> None:
        """examine() for a segment whose template was planned (templates.RecordPlan): the same
        effect, without the template-level searches. Until the engine is known, read in full."""
        if plan.ansi:
            raw = ANSI.sub(b"", raw)
        text = self.text = raw.decode("utf-8", "replace")
        if self.engine_strong is None:
            self._examine_text(text, line, fams)
            return
        self._apply_plan(text, line, plan)

    def _apply_plan(self, text: str, line: int, plan: RecordPlan) -> None:
        while plan.bar_at >= 0:                       # bars glued one after another: each, in order
            self._tqdm_planned(text, plan, line)
            if plan.rest is None:
                return
            text = text[plan.bar_end:]
            plan = plan.rest
        b0, b1 = plan.body
        if b0 >= b1:
            return
        body = text[b0:b1]
        if plan.stats:
            at = plan.stats_at
            stats = parse_serving_stats_line(body) if at is None else read_stats(text, plan.stats_read) if (
                plan.stats_read is not None) else {key: float(body[a:b]) * times / over for key, a, b, times, over in at}
            if stats:
                self._serving(stats, line, body.startswith("Prefill batch"))
                return
        marker = plan.marker
        if marker is not None:
            kind = marker[0]
            self.why["marker"] = ("marker {}: {!r} (line {})", kind, body[marker[1]:marker[2]], line)
            before = self.phase
            self._marker(kind, line)
            if self.phase != before or self.phase == _MARKER_PHASE.get(kind):
                self.why["phase"] = self.why["marker"]
        if plan.progress:
            span = plan.ts
            ts = (span[0], text[span[1]:span[2]]) if span is not None else None
            if plan.prog is None:
                self._progress_record(body, line, ts)
            else:
                self._progress_planned(body, line, ts, plan.prog)
        failure = plan.failure
        if failure is not None:
            if failure == "frame":
                self.last_frame_line = line
            elif failure == "usage":
                self.usage_line = line
            elif plan.guard and line - self.last_frame_line <= 40:
                pass
            elif failure == "stall":
                self._stall_notice(body, line)
            else:
                cand = self._classify_memo(body, plan.level, line)
                if cand is not None:
                    self._candidate(cand)
        if plan.warn:
            self._warnings(body, line)

    def _classify_memo(self, body: str, level: Optional[str], line: int) -> Optional[_Candidate]:
        """_classify() through a memo of its pure part (what it makes of a body at a phase); None
        also for a remembered candidate that _candidate() would ignore now."""
        if line < self.cancelled_at and requested_cancel(body):
            self.cancelled_at = line              # a stop someone asked for (SLURM_END reads no failure in it)
        if "above exception" in body and CHAINED.search(body):
            self.chained_at = line                # a chain's joint: the traceback after it is the same failure's
            return None
        if body.startswith("NVRM:") and len(body) <= 1024:
            # A driver line that names no fault (nor Xid, nor Slurm) only joins the NVRM window.
            plain = _NVRM_PLAIN.get(body)
            if plain is None:
                if len(_NVRM_PLAIN) >= 1024:
                    _NVRM_PLAIN.clear()
                plain = _NVRM_PLAIN[body] = ("slurmstepd" not in body and "Xid" not in body
                                             and GPU_FAULT.search(body) is None)
            if plain:
                self.nvrm.append((line, body))
                return None
            return self._classify(body, level, line)
        if (len(body) > 1024 or body.startswith("NVRM:")            # long bodies are not remembered (memory)
                or (("error:" in body or body.startswith("Error: ")) and BAD_ARGS.search(body))):
            return self._classify(body, level, line)      # reads the NVRM window / the usage line
        key = (body, level, self.phase)
        hit = _CLASSIFIED.get(key, _MISS)
        if hit is _MISS:
            cand = self._classify(body, level, line)
            if len(_CLASSIFIED) >= 4096:
                _CLASSIFIED.clear()
            hit = _CLASSIFIED[key] = None if cand is None else (cand.spec, cand.cause, cand.hint_key, cand.sig)
            return cand
        if hit is None or (hit[2] != "slurm_oom" and hit[3] != "ENGINE_SELF_KILL" and self.candidate_is_noop(hit[0])):
            # (a candidate that would change nothing now is not built: see _candidate; an engine's
            # self-kill notes its line whatever is held, for the SIGKILL that follows it)
            return None
        return _Candidate(hit[0], hit[1], line, body[:MAX_MESSAGE], hit[2], hit[3])

    def _examine_text(self, text: str, line: int, fams: int) -> None:
        # Bars glued one after another (redraws a paste lost the \r of, a log record between them) are read
        # in order, every one: the last is the latest (a segment is at most GIANT_SEGMENT bytes).
        while fams & P and "%" in text:
            m = TQDM.search(text)
            if m is None:
                break
            self._tqdm(text[:m.start()], m, line)
            text = text[m.end():]
            if not text.strip():
                return
        self._record(text, line, fams)

    # ------------------------------------------------------------------ one log record

    def _record(self, text: str, line: int, fams: int) -> None:
        msg, level, ts = strip_prefixes(text)
        body = msg.strip()
        if self.engine_strong is None:
            self._engine(text, body, line)          # a bare "(EngineCore_DP0 pid=1)" prefix names the engine too
        if not body:
            return
        if fams & S:
            stats = parse_serving_stats_line(body)
            if stats:
                self._serving(stats, line, body.startswith("Prefill batch"))
                return
        if fams & M:
            m = MARKERS.search(body)
            if m is not None:
                self.why["marker"] = ("marker {}: {!r} (line {})", m.lastgroup, m.group(), line)
                before = self.phase
                self._marker(m.lastgroup, line)
                if self.phase != before or self.phase == _MARKER_PHASE.get(m.lastgroup):
                    self.why["phase"] = self.why["marker"]
        if fams & P:
            self._progress_record(body, line, ts)
        if fams & F:
            self._failure(body, level, indent_width(msg), line)
        if fams & W:
            self._warnings(body, line)

    # ------------------------------------------------------------------ engine

    def _engine(self, text: str, body: str, line: int) -> None:
        strong, path, weak = engine_signals(text, body)
        if strong is not None:
            self.engine_strong = strong.split("_", 1)[0]
            self.why["engine"] = f"{strong} (line {line})"
            return
        if path is not None and self.engine_path is None:
            self.engine_path = path.split("_", 1)[0]
            self.why["engine_path"] = f"{path} (line {line})"
        for rx, engine, weight in ENGINE_WEAK:
            if engine + rx.pattern in weak and engine + rx.pattern not in self.weak_seen:
                self.weak_seen.add(engine + rx.pattern)
                self.engine_weak[engine] = self.engine_weak.get(engine, 0) + weight
                self.why.setdefault("engine_weak", f"weak hint {rx.pattern!r} (line {line})")

    def engine(self) -> Optional[str]:
        if self.engine_strong or self.engine_path:
            return self.engine_strong or self.engine_path
        if self.engine_weak:
            ranked = sorted(self.engine_weak.items(), key=lambda kv: -kv[1])
            if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
                return ranked[0][0]
        return None

    # ------------------------------------------------------------------ phases

    def _marker(self, kind: Optional[str], line: int) -> None:
        before = self.phase
        self._enter_phase(kind, line)
        # A job that goes on to another phase after logging an error did not die of it (cause.py, rule 5).
        if self.progress_at_failure is not None and self.phase != before and (
                self.best is None or self.best.cause in FALLBACK_CAUSES or self._past_a_probe_build()):
            self._recovered(line)

    def _past_a_probe_build(self) -> bool:
        """A build error held as a marker moves the job on to training: a probe's compile or link test
        failed (DeepSpeed's op builder: `/usr/bin/ld: cannot find -laio`); a real build ends on one.
        (A marker's only: folded runs of bars may skip the one that turns the phase, scanner.bar_run.)"""
        best = self.best
        return best is not None and best.cause == "build_failed" and self.phase == "training"

    def _enter_phase(self, kind: Optional[str], line: int) -> None:
        if kind == "loading":
            if self.phase not in ("building", "training"):
                self.phase = "loading"
                self.load_done = False
        elif kind == "loaded":
            self.phase = "starting"
            self.load_done = True
        elif kind == "compiling":
            if self.phase != "building":
                self.phase = "compiling"
        elif kind in ("compiled", "captured", "starting"):
            if self.phase not in ("building", "training") or kind != "starting":
                self.phase = "starting"
        elif kind == "capturing":
            self.phase = "capturing"
        elif kind == "listening":                    # uvicorn's `Uvicorn running on`: after its startup, for vLLM
            if self.phase not in ("building", "training", "ready"):
                self.phase = "starting"
        elif kind == "startup_complete":
            if self.engine() == "sglang":
                self.phase = "starting"      # SGLang still warms up after uvicorn starts
                self.warming = True
            else:
                self._became_ready(line)
        elif kind == "ready":
            self._became_ready(line)
        elif kind == "building":
            self.phase = "building"
        elif kind == "training":
            self.phase = "training"

    def marker_transition(self, phase: Optional[str], load_done: bool, kind: str) -> tuple:
        """(phase, load_done, sets why["phase"]) after a marker of a kind that reads no line (not
        ready / startup_complete) from (phase, load_done); the state itself is left as it was."""
        saved = self.phase, self.load_done
        self.phase, self.load_done = phase, load_done
        self._marker(kind, 0)
        out = (self.phase, self.load_done, self.phase != phase or self.phase == _MARKER_PHASE.get(kind))
        self.phase, self.load_done = saved
        return out

    def _became_ready(self, line: int) -> None:
        self.phase = "ready"
        self.warming = False
        if self.ready_line is None:
            self.ready_line = line
            self.ready_text = self.text[:MAX_MESSAGE]
            self.why["ready_line"] = self.why.get("marker", "")
        self._recovered(line, proven=True)
        # what was loading/capturing is done; progress means nothing for a serving engine
        self.bar = None
        self.hint = None
        self.outer_bar = None

    # ------------------------------------------------------------------ progress

    def _bar_label(self, before: str, line: int) -> tuple[str, Optional[str], str]:
        """(label, the phase its words name or None, series key) for the text before a bar; cached."""
        hit = self.labels.get(before)
        if hit is None:
            hit = bar_label(before)
            if self.engine_strong is None:
                self._engine(hit[0], hit[0], line)
            if len(self.labels) >= 256:
                self.labels.clear()
            self.labels[before] = hit
        return hit

    def _tqdm_planned(self, text: str, plan: RecordPlan, line: int) -> None:
        """_tqdm() for a bar at plan.bar_at in text whose numbers lie where templates.bar_plan says."""
        assert plan.bar is not None                # set with bar_at (templates._text_plan)
        n0, n1, n_scale, t0, t1, t_scale, rem, rate_at = plan.bar
        # The remaining time's text when clock() reads it for sure (it is read when a result is made).
        eta = None if rem is None else text[rem[0]:rem[1]] if plan.eta_text else clock(text[rem[0]:rem[1]])
        rate = None
        if rate_at is not None:
            value = float(text[rate_at[0]:rate_at[1]]) * rate_at[2]
            rate = (1.0 / value if value > 0 else None) if rate_at[3] else value
        # The label from the plan when the text before the bar has no digit (the template's is the segment's).
        hit = plan.bar_label
        if hit is None:
            before = text[:plan.bar_at]
            hit = self.labels.get(before)
            if hit is None:
                hit = self._bar_label(before, line)
        self._labelled_bar(hit, float(text[n0:n1]) * n_scale, float(text[t0:t1]) * t_scale, rate, eta, line)

    def _tqdm(self, before: str, m: re.Match, line: int) -> None:
        done = float(m.group("n")) * SIZE[m.group("nu")]
        total = float(m.group("N")) * SIZE[m.group("Nu")]
        rate = eta = None
        inner = m.group("inner")
        if inner:
            t = TQDM_TIMES.match(inner)
            if t and t.group("rem") != "?":
                eta = clock(t.group("rem"))
            r = TQDM_RATE.search(inner[t.end():] if t else inner)
            if r and r.group("v") != "?":
                value = float(r.group("v")) * SIZE[r.group("u")]
                if r.group("a") == "s" and r.group("b") != "s":      # "2.87s/it": seconds per item
                    rate = 1.0 / value if value > 0 else None
                else:
                    rate = value
        self._bar(before, done, total, rate, eta, line)

    def _bar(self, before: str, done: float, total: float, rate: Optional[float], eta: Eta,
             line: int) -> None:
        self._labelled_bar(self._bar_label(before, line), done, total, rate, eta, line)

    def _labelled_bar(self, hit: tuple[str, Optional[str], str], done: float, total: float, rate: Optional[float],
                      eta: Eta, line: int) -> None:
        label, named_phase, key_label = hit
        phase = named_phase or self._unnamed_bar_phase()
        if named_phase is None and phase == "training":
            self._nest(label or "training", total)
        if phase == "ready" and self.phase == "training":
            phase = "training"        # vLLM's `Processed prompts` bar in a trainer's rollouts (TRL GRPO): still training
        elif phase == "unknown" and self.load_done and self.phase in ("loading", "unknown"):
            # a bar of its own after transformers' load (lm-eval's requests): no longer loading (each such bar
            # says so: the reason is the last one's, whether a run of them is read whole or folded)
            self.phase = "unknown"
            self.why["phase"] = ("progress {} (line {})", "tqdm bar", line)
        if phase == "loading" and total and done >= total:
            self.load_done = True
            self.hf_loaded = label.startswith(_HF_LOAD_BAR)
        self._set_progress("bar", phase, label or _DEFAULT_LABELS.get(phase, ""), done, total, rate, eta, line, None,
                           key_label)
        if named_phase == "capturing" and total and done >= total and "PIECEWISE" not in label:
            # A capture bar (its label says so) is full: capture finished, the server is next. Not
            # for unlabeled bars, whose phase comes from the state: runs of them must keep it fixed;
            # nor for vLLM V1's `(mixed prefill-decode, PIECEWISE)` bar, which its `(decode, FULL)` one follows.
            self.phase = "starting"
            self.why["phase"] = f"full capture bar (line {line})"

    def _nest(self, label: str, total: float) -> None:
        """A training bar whose label names no phase, of another total than the unfinished one before it of
        the same label, runs inside it (HF Trainer's evaluation loop inside its training loop, both bars
        unlabeled): the outer bar stays the job's progress (outer_bar) until a bar of its total is drawn
        again. (The scanner folds a run of bars into its last only where their totals are one: bar_run.)"""
        outer = self.outer_bar
        if outer is not None:
            if outer[2][1] == total:
                self.outer_bar = None
            return
        bar = self.bar
        if (bar is not None and bar[1] == "training" and bar[2][2] == label and bar[2][1] is not None
                and bar[2][1] != total and bar[2][0] < bar[2][1]):
            self.outer_bar = bar

    def _unnamed_bar_phase(self) -> str:
        current = self.phase
        if current in ("training", "building"):
            return current
        # An unlabeled bar right after the weights are in is the CUDA-graph capture (SGLang's old bar), unless
        # transformers loaded them (its `Loading checkpoint shards`): a script's or a harness's bars follow.
        if self.load_done and current in ("starting", "compiling", "loading", "capturing"):
            return "unknown" if self.hf_loaded else "capturing"
        return current or "unknown"

    def _progress_planned(self, body: str, line: int, ts: Optional[tuple[str, str]], prog: tuple) -> None:
        """_progress_record() for a body whose branch and number spans templates.progress_plan found."""
        kind = prog[0]
        if kind == PG_NINJA:
            (a, b), (c, d) = prog[1], prog[2]
            self._set_progress("bar", "building", "build", float(body[a:b]), float(body[c:d]),
                               None, None, line, ts, sig="ninja [n/N]")
        elif kind == PG_MAKE:
            a, b = prog[1]
            self._set_progress("bar", "building", "build", float(body[a:b]), 100.0, None, None, line, ts,
                               sig="make [n%]")
        elif kind == PG_LOSS:
            (a, b), step_at = prog[1], prog[2]
            if step_at is not None and self.total_steps:
                self._set_progress("hint", "training", "step", float(body[step_at[0]:step_at[1]]),
                                   float(self.total_steps), None, None, line, ts, sig="HF loss dict 'step'")
            else:
                self._set_progress("hint", "training", "epoch", float(body[a:b]),
                                   float(self.num_epochs) if self.num_epochs else None, None, None, line, ts,
                                   sig="HF loss dict 'epoch'")
        elif kind == PG_COUNT:
            _, (a, b), phase, (c, d), (e, f) = prog
            done, total = float(body[c:d]), float(body[e:f])
            if is_count(done, total):                  # the generic layer: "label N/M"
                self._set_progress("bar", phase, body[a:b], done, total, None, None, line, ts, sig="labelled n/N")
        else:
            _, step_at, epoch_at, lossy = prog
            step = epoch = None
            if step_at is not None:
                (a, b), n_at = step_at
                step = (float(body[a:b]), float(body[n_at[0]:n_at[1]]) if n_at is not None else None)
            if epoch_at is not None:
                (a, b), n_at = epoch_at
                epoch = (float(body[a:b]), float(body[n_at[0]:n_at[1]]) if n_at is not None else None)
            self._step_epoch(step, epoch, lossy, line, ts)

    def _progress_record(self, body: str, line: int, ts: Optional[tuple[str, str]]) -> None:
        c = body[0]
        if c == "[":
            m = NINJA.match(body)
            if m:
                self._set_progress("bar", "building", "build", float(m.group(1)), float(m.group(2)),
                                   None, None, line, ts, sig="ninja [n/N]")
                return
            m = MAKE.match(body)
            if m:
                self._set_progress("bar", "building", "build", float(m.group(1)), 100.0, None, None, line, ts,
                                   sig="make [n%]")
                return
        named = labelled_bracket(body)
        if named is not None:                # the generic layer: a labelled [N/M] anywhere in the line
            self._set_progress("bar", named.phase or "unknown", named.label, float(named.group("n")),
                               float(named.group("N")), named.rate, named.eta, line, ts, sig=named.sig)
            return
        if c == "{":
            m = LOSS_DICT.match(body)
            if m:
                # HF Trainer: with "Total optimization steps = N" known and a 'step' in the dict, step/N;
                # else the epoch (of "Num Epochs = N").
                if m.group(2) is not None and self.total_steps:
                    self._set_progress("hint", "training", "step", float(m.group(2)), float(self.total_steps),
                                       None, None, line, ts, sig="HF loss dict 'step'")
                else:
                    self._set_progress("hint", "training", "epoch", float(m.group(1)),
                                       float(self.num_epochs) if self.num_epochs else None, None, None, line, ts,
                                       sig="HF loss dict 'epoch'")
                return
            if TRAIN_END.match(body):
                self.phase = "training"
                self.why["phase"] = f"HF Trainer train_runtime dict (line {line})"
                return
        if names_totals(body):
            m = NUM_EPOCHS.search(body)
            if m:
                self.num_epochs = int(m.group(1).replace(",", ""))
                self.phase = "training"
                self.why["phase"] = f"trainer banner 'Num Epochs' (line {line})"
            m = TOTAL_STEPS.search(body)
            if m:
                self.total_steps = int(m.group(1).replace(",", ""))
                self.phase = "training"
                self.why["phase"] = f"trainer banner 'Total optimization steps' (line {line})"
            return
        low_hit = ("tep" in body or "TEP" in body or "ter" in body or "poch" in body or "POCH" in body)
        if not low_hit:
            m = labelled_count(body)
            if m is not None and is_count(float(m.group("n")), float(m.group("N"))):
                label = m.group("label").strip().rstrip(":").strip()     # the generic layer: "label N/M"
                self._set_progress("bar", label_phase(label) or "unknown", label, float(m.group("n")),
                                   float(m.group("N")), None, None, line, ts, sig="labelled n/N")
            return
        sm = STEP.search(body)
        em = EPOCH.search(body)
        if sm is None and em is not None:
            sm = count_after_epoch(body, em.end())  # `epoch 2/20 | batch 340/1563`: the finer count is the step
        # Only training-shaped lines: "step 10/100", or step/epoch beside a loss (patterns.training_shaped).
        lossy = training_shaped(body)
        step = (float(sm.group(1)), float(sm.group(2)) if sm.group(2) else None) if sm else None
        epoch = (float(em.group(1)), float(em.group(2)) if em.group(2) else None) if em else None
        self._step_epoch(step, epoch, lossy, line, ts)

    def _step_epoch(self, step: Optional[tuple], epoch: Optional[tuple], lossy: bool, line: int,
                    ts: Optional[tuple[str, str]]) -> None:
        update = self.step_epoch_update(step, epoch, lossy)
        if update is not None:
            source, label, done, total, sig = update
            self._set_progress(source, "training", label, done, total, None, None, line, ts, sig=sig)

    def step_epoch_update(self, step: Optional[tuple], epoch: Optional[tuple], lossy: bool) -> Optional[tuple]:
        """(source, label, done, total, signature) of the training progress a step/epoch record
        reports (phase "training"), or None; reads only total_steps and num_epochs."""
        if step and step[1] is not None and step[1] > 0 and (lossy or step[0] <= step[1]):
            return "bar", f"epoch {num(epoch[0])} step" if epoch else "step", step[0], step[1], "step n/N"
        if epoch and epoch[1] is not None and epoch[1] > 0 and epoch[0] <= epoch[1] + 1:
            return "bar", "epoch", epoch[0], epoch[1], "epoch n/N"
        if step and lossy:
            total = float(self.total_steps) if self.total_steps else None
            return "hint", f"epoch {num(epoch[0])} step" if epoch else "step", step[0], total, "step beside a loss"
        if epoch and lossy:
            total = float(self.num_epochs) if self.num_epochs else None
            return "hint", "epoch", epoch[0], total, "epoch beside a loss"
        return None

    def _set_progress(self, source: str, phase: str, label: str, done: float, total: Optional[float],
                      rate: Optional[float], eta: Eta, line: int, ts: Optional[tuple[str, str]],
                      key_label: Optional[str] = None, sig: str = "tqdm bar") -> None:
        # (the hot path of every progress update: locals, no helper calls; done and total are floats)
        self.seq = seq = self.seq + 1
        if self.stall_notices:
            self.stall_notices.clear()
        key = (source, phase, key_label if key_label is not None else SERIES_LABELS.get(label) or series_label(label), total)
        if self.now is not None:
            when: Optional[float] = self.now
        else:
            when = ts_seconds(ts) if rate is None and ts is not None else None
        # Rates the bar does not print come from the clock: the caller's, else the lines' own timestamps.
        series = self.series
        if series is None or series[0] != key or when is None or done < series[1]:
            self.series = (key, done, when) if when is not None else (key, done, _NAN)
        elif rate is None:
            first_done, first_when = series[1], series[2]
            if when > first_when and done > first_done:
                rate = (done - first_done) / (when - first_when)
        if eta is None and rate and total is not None and total >= done:
            eta = (total - done) / rate
        # Progress(...) is built when a result is asked for (see _progress): most updates are overwritten first.
        entry = (seq, phase, (done, total, label, rate, eta), sig, line, self.text[:MAX_MESSAGE])
        if source == "bar":
            self.bar = entry
        else:
            self.hint = entry
        if phase != "unknown":
            self.phase = phase
            self.why["phase"] = ("progress {} (line {})", sig, line)
        # A job that keeps advancing after logging an error did not die of it.
        if self.progress_at_failure is not None:
            pkey, pdone = self.progress_at_failure
            if not pkey:              # no progress before the error: the first series after it is watched
                self.progress_at_failure = (key, done)
            elif pkey == key and done > pdone or series_done(pkey, pdone) and (pkey != key or done < pdone):
                # (a series that completed, then another begins: the job went on to its next step)
                self.advances_since_failure += 1
                self.progress_at_failure = (key, done)
                if self.advances_since_failure >= RECOVERY_ADVANCES:
                    self._recovered(line)
        self.last_progress_key = (key, done)

    def progress_entry(self) -> Optional[tuple]:
        """(seq, phase, Progress, signature, line, text) of the progress to report."""
        bar, hint = self.outer_bar or self.bar, self.hint
        # A newer hint of another phase wins — unless it only says "epoch 2.25" where the bar
        # still counts done/total (a loss dict glued onto a Trainer bar): the bar is the better answer.
        # And a newer step count beside a loss wins over an epoch's n/N, a coarser count the trainer printed
        # when the epoch began (DeepSpeed-Chat's `Beginning of Epoch 1/1`, then `step=410, … lr=`).
        if hint is not None and (bar is None or (hint[0] > bar[0] and (
                hint[1] != bar[1] and (hint[2][1] is not None or bar[2][1] is None)
                or bar[3] == "epoch n/N" and hint[3] == "step beside a loss"))):
            return hint
        return bar

    def progress(self) -> Optional[Progress]:
        entry = self.progress_entry()
        return _progress(entry[2]) if entry is not None else None

    # ------------------------------------------------------------------ serving

    def _serving(self, stats: dict[str, float], line: int, prefill: bool = False) -> None:
        # Two independent halves (disjoint fields): the fast scanner applies the first at the
        # start of a run of stats lines and the second only where a later line does not overwrite it.
        if self.marks_ready(prefill):
            self.ready_mark(line, stats_working(stats))
        self.serving_data(stats, line)

    def marks_ready(self, prefill: bool) -> bool:
        """Whether a stats line (an SGLang Prefill batch one: prefill) proves the server serves: not SGLang's
        warmup request's (see warming)."""
        return not (prefill and self.warming)

    def holds_candidate(self) -> bool:
        """Whether an error waits for proof that the job carried on (what a stats line may give)."""
        return (self.best is not None or self.first_low is not None or self.first_weak is not None
                or bool(self.stall_notices))

    def ready_mark(self, line: int, working: bool = True) -> None:
        """What any serving-stats line says about the job: it is ready, and earlier errors did not kill it —
        unless it shows requests running and not one token made (`working` False: a stuck step's stats,
        which the front-end prints on; stats_working). Inside a training run the engine is the trainer's
        (RL rollouts: verl, OpenRLHF): still training."""
        self.warming = False
        if self.phase == "training":
            if working or not self.holds_candidate():
                self._recovered(line, proven=True)
            return
        self.why["phase"] = "serving stats lines"
        if self.phase != "ready":
            self.phase = "ready"
            self.bar = None
            self.hint = None
            self.outer_bar = None
        if working or not self.holds_candidate():
            self._recovered(line, proven=True)

    def serving_data(self, stats: dict[str, float], line: int, judge: bool = True) -> None:
        """The numbers of one serving-stats line: merged values, the spec-decode window, KV pressure.
        judge=False: the window is not judged (a later line's judgement replaces this one's)."""
        preempted = stats.pop("preemptions", None)
        self.serving.update(stats)
        if "spec_accept_len" in stats or "spec_accept_rate" in stats:
            self.spec_recent.append((stats.get("spec_accept_len"), stats.get("spec_accept_rate")))
            if judge:
                self._judge_spec(line)
        kv, waiting = self.serving.get("kv_cache_pct"), self.serving.get("waiting")
        if preempted:
            self.warnings["kv_cache_pressure"] = (
                "kv_cache_pressure", line, f"{preempted:.0f} requests preempted: the KV cache is full"
                + (f" ({kv:.0f}% used)" if kv is not None else ""))
        elif kv is not None and kv >= 95.0 and waiting:
            self.warnings["kv_cache_pressure"] = (
                "kv_cache_pressure", line, f"KV cache {kv:.0f}% full with {waiting:.0f} requests waiting")

    def _judge_spec(self, line: int) -> None:
        """Whether speculative decoding pays, from the means over the spec-decode window."""
        lens = [a for a, _ in self.spec_recent if a is not None]
        rates = [r for _, r in self.spec_recent if r is not None]
        mean_len = sum(lens) / len(lens) if lens else None
        mean_rate = sum(rates) / len(rates) if rates else None
        bad = ((mean_len is not None and mean_len < SPEC_MIN_ACCEPT_LEN)
               or (mean_rate is not None and mean_rate < SPEC_MIN_ACCEPT_RATE))
        if bad:
            parts = []
            if mean_len is not None:
                parts.append(f"mean acceptance length {mean_len:.2f}")
            if mean_rate is not None:
                parts.append(f"acceptance rate {mean_rate * 100:.1f}%")
            self.warnings["spec_decode_ineffective"] = (
                "spec_decode_ineffective", line,
                "speculative decoding accepts almost nothing (" + ", ".join(parts) + ") — it is likely "
                "slower than no speculation; check the draft model matches the target, or turn it off")
        else:
            self.warnings.pop("spec_decode_ineffective", None)

    # ------------------------------------------------------------------ failures

    def _failure(self, body: str, level: Optional[str], indent: int, line: int) -> None:
        if FRAME.match(body):
            self.last_frame_line = line
            return
        if body.startswith("usage:"):
            self.usage_line = line
            return
        # Source lines quoted inside a traceback (`raise RuntimeError("NCCL error …")`) are not errors;
        # an exception line indented there ends a traceback nested in a wrapper's output (pip's block).
        if indent >= CODE_INDENT and line - self.last_frame_line <= 40 and EXC_LINE.match(body) is None:
            return
        if body[0] in "^~":
            return
        if STALL_NOTICE.search(body):             # logged at INFO: judged before the level is
            self._stall_notice(body, line)
            return
        if level in NOT_FAILURE_LEVELS:
            return
        if line < self.cancelled_at and requested_cancel(body):
            self.cancelled_at = line              # (as _classify_memo: its caller on the planned path)
        if "above exception" in body and CHAINED.search(body):
            self.chained_at = line                # (as _classify_memo)
            return
        cand = self._classify(body, level, line)
        if cand is None:
            return
        self._candidate(cand)

    def _stall_notice(self, body: str, line: int) -> None:
        """A repeated "waited N seconds for the workers" notice with no progress between is a hang."""
        self.stall_notices.append(line)
        if len(self.stall_notices) == STALL_REPEATS:
            first = self.stall_notices[0]
            self._candidate(_Candidate(Spec.SPECIFIC, "hang", first,
                                       f"{body[:MAX_MESSAGE - 40]} (x{STALL_REPEATS}, no progress between)",
                                       "hang_stall", sig="STALL_NOTICE"))
        del self.stall_notices[STALL_REPEATS:]

    def candidate_is_noop(self, spec: int) -> bool:
        """True if a failure candidate of this Spec (or RecordPlan.only's ONLY_ANY_RANK / ONLY_STALL)
        would change nothing now (see _candidate, _stall_notice)."""
        if spec == ONLY_STALL:                 # a further notice: appended, then cut back to STALL_REPEATS
            return len(self.stall_notices) >= STALL_REPEATS
        if spec == ONLY_NVRM:
            return False
        if self.first_error is None:
            return False
        best = self.best
        if best is not None:
            # While one is held, root_cause() reads `best` alone (first_low and first_weak are read
            # only without it, and _recovered clears them with it), and progress_at_failure was set
            # with it. So this is monotone in spec: a bound on a line's rank may stand for it.
            return best.hold >= spec
        if spec >= _EXCEPTION:
            return False
        if spec == _UMBRELLA:
            return (self.first_low is not None and self.progress_at_failure is not None
                    and not _is_traceback_header(self.first_low))
        return self.first_weak is not None

    def _candidate(self, cand: _Candidate) -> None:
        if cand.sig in _SELF_KILL_SIGS:
            if cand.sig == "ENGINE_SELF_KILL":
                self.self_kill_at = cand.line
            elif (cand.line - self.self_kill_at <= SELF_KILL_LINES or self.cancelled_at < cand.line) and \
                    SHELL_KILLED.search(cand.message) is not None:
                # the engine's SIGKILL of its own processes, announced above, or a requested cancel's
                # escalation (scancel: SIGTERM, then SIGKILL after KillWait): no OOM
                return
        if (cand.cause == "exception" and cand.line - self.request_error_at <= REQUEST_ERROR_LINES
                and (self.request_final_at is None or self.chained_at > self.request_final_at)
                and not self.candidate_is_noop(cand.spec)):
            # (cause.py rule 6) the traceback of one request the server answered: a warning, no failure.
            # It ends on its exception line, unless a chain's joint follows: a traceback after that is another.
            self.warnings["request_error"] = ("request_error", cand.line, f"a request failed and the server "
                                              f"answered it (it serves on): {cand.message}")
            if cand.spec >= _EXCEPTION:
                self.request_final_at = cand.line
            return
        if (cand.cause == "exception" and (self.ready_line is not None or self.phase == "ready")
                and CLIENT_STATUS_ERROR.search(cand.message) is not None and not self.candidate_is_noop(cand.spec)):
            # (cause.py rule 6) a client's traceback, pasted after the ready server's log: the server
            # answered its request with an error status; the traceback's header was the client's too
            self.warnings["request_error"] = ("request_error", cand.line, f"a client's request failed and the "
                                              f"server answered it (it serves on): {cand.message}")
            self._drop_client_header(cand.line)
            return
        if self.first_error is None:
            self.first_error = cand
        if cand.spec >= _EXCEPTION:
            # Slurm's own OOM line names the limit that killed it: a better hint than the bare "Killed" above it.
            if (self.best is None or cand.spec > self.best.spec
                    or (cand.hint_key == "slurm_oom" and self.best.cause == "host_oom")
                    or (cand.spec >= self.best.spec and cand.cause in (
                        _DISPLACED_BY.get(self.best.cause) or _DISPLACED_BY.get(self.best.sig, _NONE)))):
                self.best = cand
                # (cause.py rule 5) progress proves recovery from the error held, so it counts from this one:
                # pip prints its envelope before the build output it wraps, whose ninja steps came first.
                self.advances_since_failure = 0
                self.progress_at_failure = self.last_progress_key or ((), 0)
        elif cand.spec == _UMBRELLA:
            if self.first_low is None or (cand.sig in ENDS_TRACEBACK and _is_traceback_header(self.first_low)):
                self.first_low = cand       # (cause.py rule 4: the envelope that ends a traceback names it)
        elif self.first_weak is None:
            self.first_weak = cand
        if cand.spec >= _UMBRELLA and self.progress_at_failure is None:
            self.advances_since_failure = 0
            self.progress_at_failure = self.last_progress_key or ((), 0)
        if cand.cause == "time_limit" and self.best is cand:
            # A scheduler's time limit is the job's end wherever it is printed: LSF's report comes before the
            # output it follows (`The output (if any) follows:`), whose progress proves nothing.
            self.progress_at_failure = _NO_RECOVERY

    def _drop_client_header(self, line: int) -> None:
        """A client's status error ends the traceback whose header is held (within REQUEST_ERROR_LINES): that was the client's."""
        held = self.first_low
        if (self.best is None and held is not None and _is_traceback_header(held)
                and line - held.line <= REQUEST_ERROR_LINES):
            self.first_low = None
            if self.first_error is held:
                self.first_error = self.first_weak
            if self.first_weak is None:
                self.progress_at_failure = None
                self.advances_since_failure = 0

    def _classify(self, body: str, level: Optional[str], line: int) -> Optional[_Candidate]:
        msg = body[:MAX_MESSAGE]

        # (Slurm's own end of a job is the table's SLURM_END row, tried first by classify_failure below.)
        if ("slurmstepd" in body or body.startswith("***")) and SLURM_OOM.search(body):
            return _Candidate(Spec.SPECIFIC, "host_oom", line, msg, "slurm_oom", sig="SLURM_OOM")
        if "Xid" in body and not is_no_event(body):   # (`$ journalctl -k | grep -c "NVRM: Xid"`: a command)
            x = XID.search(body)
            code = int(x.group(1)) if x else None
            if code in XID_NOISE:
                return None
            if code in XID_APP:
                return _Candidate(Spec.EXCEPTION, "cuda_error", line, msg, "cuda_error", sig="XID")
            return _Candidate(Spec.SPECIFIC, "gpu_fault", line, msg, "gpu_fault", sig="XID")
        if body.startswith("NVRM:"):
            self.nvrm.append((line, body))
            if GPU_FAULT.search(body):
                start, parts = line, []
                for ln, txt in reversed(self.nvrm):
                    if ln != start - 1 and ln != line or "loading NVIDIA" in txt:   # the driver's load banner
                        break
                    parts.append(txt[5:].strip())
                    start = ln
                    if "The NVIDIA GPU" in txt or "GPU at PCI" in txt:
                        break
                return _Candidate(Spec.SPECIFIC, "gpu_fault", start, " ".join(reversed(parts))[:MAX_MESSAGE], "gpu_fault", sig="GPU_FAULT")
            return None
        if is_warning(body, level) or is_no_event(body):
            return None                   # a warning, a command, code never names the cause (cause.py, rule 1)
        hit = classify_failure(body, Context(self.phase, level, line - self.usage_line <= 60))
        if hit is None:
            return None
        return _Candidate(Spec(hit[0]), hit[1], line, msg, hit[2], sig=hit[3])

    def _recovered(self, line: int, proven: bool = False) -> None:
        """The candidates so far dropped: the job carried on (cause.py, rule 5). Serving is proof; a phase
        marker or progress is not, where another rank logs it: their dropped error stays revivable."""
        self.stall_notices.clear()
        cand = self.best or self.first_low or self.first_weak
        if cand is not None:
            # (its text is made when a result is asked for: most are replaced by the next recovery)
            self.warnings["error_recovered"] = ("error_recovered", cand.line, (
                cand.cause if cand.spec else "an ERROR line", cand.line, cand.message))
        if proven:
            # Kept only for an engine's self-kill announced right after (root_cause): another rank still served.
            if self.best is not None:
                self.recovered_from = (self.best, self.first_error, line)
            elif self.recovered_from is not None and self.recovered_from[2] is None:
                self.recovered_from = None
        elif self.best is not None:
            self.recovered_from = (self.best, self.first_error, None)
        self.best = self.first_low = self.first_weak = self.first_error = None
        self.progress_at_failure = None
        self.advances_since_failure = 0

    def root_cause(self) -> Optional[_Candidate]:
        if self.best is not None:
            return self.best
        if self.first_low is not None:
            c = self.first_low
            r, served_at = self.recovered_from[0::2] if self.recovered_from is not None else (None, None)
            if r is not None and r.line < c.line and (served_at is None or (
                    c.sig == "ENGINE_SELF_KILL" and c.line - served_at <= SELF_KILL_LINES)):
                # The envelope says "see above", and above it is an error read as recovered from:
                # it was not (rank 1's KeyError, rank 0's "Model loading took", "EngineCore failed"; the
                # stats line of another DP rank just before SGLang kills itself over this one's error).
                return _Candidate(r.spec, r.cause, r.line, r.message, r.hint_key, f"{r.sig} above {c.sig}")
            # The umbrella says "see above": the first ERROR line above it is the root cause.
            if self.first_weak is not None and self.first_weak.line < c.line:
                w = self.first_weak
                c = _Candidate(Spec.UMBRELLA, c.cause, w.line, w.message, c.hint_key, f"{w.sig} above {c.sig}")
            return c
        return None

    def failure(self) -> Optional[Failure]:
        c = self.root_cause()
        if c is None:
            return None
        return Failure(cause=c.cause, line=c.line, message=c.message, hint=HINTS[c.hint_key])

    # ------------------------------------------------------------------ warnings

    def _warnings(self, body: str, line: int) -> None:
        if OOM_RISK.search(body):
            if "ninja" in body:
                text = "MAX_JOBS is not set: ninja runs one compiler per core (nvcc can take several GB each) — set MAX_JOBS"
            elif "allocator cache" in body:
                text = ("GPU memory pressure: the PyTorch allocator flushes its cache between steps (DeepSpeed) — "
                        "a CUDA OOM is near; lower the micro-batch, or offload")
            elif "make -j" in body or "nproc" in body:
                text = "unbounded build parallelism (-j without a limit) — pass -jN sized to free RAM / ~4 GB per job"
            else:
                text = f"the build is short of host memory: {body[:200]}"
            self.warnings["oom_risk"] = ("oom_risk", line, text)
        elif KV_PRESSURE.search(body):
            self.warnings["kv_cache_pressure"] = (
                "kv_cache_pressure", line, f"KV cache full, requests preempted/retracted: {body[:200]}")
        elif REQUEST_ERROR.search(body):
            # One request failed: the exception its traceback ends on (within REQUEST_ERROR_LINES) is
            # that request's, which the server answered; it is no candidate (see _candidate).
            self.request_error_at = line
            self.request_final_at = None
            self.warnings["request_error"] = ("request_error", line, f"a request failed and the server answered "
                                              f"it (it serves on): {body[:200]}")
        elif JIT.search(body) and "jit_compile" not in self.warnings:
            self.warnings["jit_compile"] = (
                "jit_compile", line, "kernels are JIT-compiled on first use (no prebuilt kernels): the next "
                "steps can be silent for minutes without being stuck")

    # ------------------------------------------------------------------ slices (slices.py)

    def same_course(self, other: "State", next_line: Optional[int] = None) -> Optional[int]:
        """The offset of this state's `seq` over other's where the two are the same in all that the rest
        of a reading and its result read (every field, dicts in order, the candidates' sharing; `seq`
        and the progress entries' by that offset), else None. What follows is then read the same from
        either, but for that offset (slices.py). `labels` (a memo) and `now` are left out; so are the
        NVRM lines no later line can join, when `next_line` (the next line's number) says which."""
        delta = self.seq - other.seq
        for name in _COURSE_FIELDS:
            if not _same(getattr(self, name), getattr(other, name)):
                return None
        for mine, theirs in ((self.bar, other.bar), (self.hint, other.hint), (self.outer_bar, other.outer_bar)):
            if mine is None or theirs is None:
                if mine is not theirs:
                    return None
            elif mine[0] != theirs[0] + delta or not _same(mine[1:], theirs[1:]):
                return None
        if not _same(_nvrm_run(self.nvrm, next_line), _nvrm_run(other.nvrm, next_line)):
            return None
        if not _same(sorted(self.warnings.items(), key=itemgetter(0)), sorted(other.warnings.items(), key=itemgetter(0))):
            return None
        mine_c, theirs_c = self._candidates(), other._candidates()
        if [a is b for a in mine_c for b in mine_c] != [a is b for a in theirs_c for b in theirs_c]:
            return None                               # (State reads their sharing: `best is cand`)
        return delta if _same(self.__dict__, other.__dict__) else None

    def _candidates(self) -> list[Any]:
        r = self.recovered_from
        return [self.first_error, self.best, self.first_low, self.first_weak,
                *((r[0], r[1]) if r is not None else (None, None))]

    def shift_seq(self, delta: int) -> None:
        """Add delta to `seq` and to the progress entries' (the reading of a slice made from a guess, taken
        once same_course proved it: slices.py)."""
        self.seq += delta
        if self.bar is not None:
            self.bar = (self.bar[0] + delta, *self.bar[1:])
        if self.hint is not None:
            self.hint = (self.hint[0] + delta, *self.hint[1:])
        if self.outer_bar is not None:
            self.outer_bar = (self.outer_bar[0] + delta, *self.outer_bar[1:])

    # ------------------------------------------------------------------ result

    def result(self) -> LogAnalysis:
        root = self.root_cause()
        failure = self.failure()
        engine = self.engine()
        why: dict[str, str] = {}
        if self.engine_strong:
            why["engine"] = _why_text(self.why["engine"])
        elif self.engine_path:
            why["engine"] = _why_text(self.why["engine_path"])
        elif engine:
            why["engine"] = _why_text(self.why.get("engine_weak", "weak hints"))
        if failure is not None:
            phase = "failed"
            why["phase"] = "the failure"
        elif self.phase:
            phase = self.phase
            why["phase"] = _why_text(self.why.get("phase", ""))
        else:
            # (an engine named only by weak hints, as a pod's image, may never have printed a line: no start seen)
            phase = "starting" if self.engine_strong or self.engine_path else "unknown"
            if phase == "starting":
                why["phase"] = "engine seen, no phase marker yet"
        shown: Iterable[tuple] = self.warnings.values()
        first_error = self.first_error
        if root is not None and root is not self.best and self.recovered_from is not None \
                and root.line == self.recovered_from[0].line:   # revived: it was not recovered from after all
            shown = [w for w in shown if w[0] != "error_recovered" or w[1] != root.line]
            first_error = self.recovered_from[1] or first_error
        entry = self.progress_entry()
        key_lines: list[KeyLine] = []
        if root is not None:
            why["failure"] = f"{root.sig} -> {root.hint_key} (line {root.line})"
            key_lines.append(KeyLine("root_cause", root.line, root.message))
        if first_error is not None:
            key_lines.append(KeyLine("first_error", first_error.line, first_error.message))
        if entry is not None:
            why["progress"] = f"{entry[3]} (line {entry[4]})"
            key_lines.append(KeyLine("last_progress", entry[4], entry[5]))
        if self.ready_line is not None:
            why["ready_line"] = _why_text(self.why.get("ready_line", ""))
            key_lines.append(KeyLine("ready", self.ready_line, self.ready_text))
        serving = None
        if self.serving:
            serving = ServingNumbers(**{k: self.serving.get(k) for k in SERVING_KEYS})
        warnings = tuple(sorted(map(_log_warning, shown), key=lambda w: (w.line, w.code)))
        return LogAnalysis(engine=engine, phase=phase, progress=_progress(entry[2]) if entry is not None else None,
                           failure=failure, ready_line=self.ready_line, serving=serving, warnings=warnings,
                           key_lines=tuple(key_lines), decided_by=tuple(why.items()))


# What State.same_course compares as it is (seq and the progress entries by an offset, nvrm by its last run;
# labels is a memo, now the caller's).
# (warnings: compared by code, whatever the order they were raised in: the result sorts them, and a reading
# begun mid-file raises the codes of a repeated stretch in another order than the one begun at its start)
_COURSE_FIELDS = tuple(name for name in State.__slots__ if name not in (
    "now", "labels", "seq", "bar", "hint", "outer_bar", "nvrm", "warnings", "__dict__"))


def _nvrm_run(nvrm: deque, next_line: Optional[int] = None) -> list:
    """The NVRM lines a later one can still join (_classify walks back over consecutive lines only, from
    the line it reads): the last run of consecutive line numbers, none where it ends before the line
    just read (`next_line` - 1: that walk would stop before it); the ones before a gap are never read
    again. (An NVRM line skipped while a SPECIFIC candidate is held, scanner.candidate_held, leaves
    such a gap in one reading and not in another: they differ in nothing a later line reads.)"""
    if next_line is not None and (not nvrm or nvrm[-1][0] < next_line - 1):
        return []
    run: list = []
    for entry in reversed(nvrm):
        if run and entry[0] != run[-1][0] - 1:
            break
        run.append(entry)
    return run
