"""Log intelligence: reads engine/build/training logs incrementally for progress, phase, engine, failure cause, serving numbers and warnings.

Stdlib only: the runner process runs this on live logs.

How it stays fast and flat on logs of hundreds of MB:
- bytes are cut into *segments* at every ``\\n`` and ``\\r`` (a tqdm bar rewrites itself
  with ``\\r`` on one physical line; each rewrite is a segment with that line's number);
- what defines the answer (the *exhaustive* scanner, kept as ``LogAnalyzer(exhaustive=True)``):
  every segment with a hit of the anchor prefilter is decoded and examined, in order;
- what runs (the *template* scanner, same answer, ~15x faster): a segment's template is its
  bytes with digits turned into 0, so the thousands of stats lines, bar redraws, build
  steps and NCCL chatter lines of a log share a few templates. Each template is prefiltered
  and classified once (inert / bar redraw / build step / stats line / other); per chunk,
  everything is C-level (translate, split, dict lookups, grouping) except the segments
  whose effect no later segment of the chunk overwrites, which are examined as before.
  Chunks of one-off lines (request ids) fall back to one C-level prefilter pass;
- a segment longer than ``GIANT_SEGMENT`` is examined on its first ``HEAD_BYTES`` and last
  ``TAIL_BYTES`` only, and an incomplete one is kept as head + rolling suffix, so memory is
  bounded whatever the line length (the template cache is bounded too);
- the answer depends only on the bytes, never on how they were split into ``feed()``
  calls, so live (incremental) and whole-file analysis agree.
"""
from __future__ import annotations

import copy
import re
from bisect import bisect_right
from collections import Counter, deque
from itertools import accumulate, compress, islice, repeat
from operator import attrgetter, is_, is_not
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Union

Number = Union[int, float]

PHASES = ("starting", "loading", "compiling", "capturing", "ready", "building", "training", "failed", "unknown")
CAUSES = ("cuda_oom", "host_oom", "nccl", "cuda_error", "import_error", "syntax_error", "bad_arguments",
          "build_failed", "hang", "gpu_fault", "exception")
SERVING_KEYS = ("running", "waiting", "kv_cache_pct", "gen_tokens_per_s", "prompt_tokens_per_s",
                "spec_accept_rate", "spec_accept_len")

# Warning codes this module can emit (and what they mean to an operator).
WARNING_CODES = {
    "spec_decode_ineffective": "speculative decoding accepts so little that it slows serving down",
    "oom_risk": "a build shows signs of heading for the host OOM killer",
    "kv_cache_pressure": "the KV cache is full: requests are preempted/retracted or queue up",
    "jit_compile": "kernels are JIT-compiled on first use: startup may be silent for minutes",
    "error_recovered": "an error was logged but the job carried on (served, or progress advanced)",
}

GIANT_SEGMENT = 64 * 1024      # a segment longer than this is examined on its ends only
HEAD_BYTES = 8 * 1024
TAIL_BYTES = 8 * 1024
READ_CHUNK = 4 * 1024 * 1024   # analyze_file: big enough to amortise Python overhead, small enough to stay flat
MAX_MESSAGE = 400              # characters kept of a failure/warning message

# Spec-decode judgement: mean acceptance length 1.0 means no draft token is ever accepted.
SPEC_MIN_ACCEPT_LEN = 1.3
SPEC_MIN_ACCEPT_RATE = 0.10
SPEC_WINDOW = 5                # judge the mean of the last few stats windows, not one noisy one
RECOVERY_ADVANCES = 3          # progress updates past a logged error that prove the job carried on


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Progress:
    done: Number
    total: Optional[Number]
    label: str
    rate: Optional[float] = None       # units of done per second
    eta_s: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "label": self.label,
                "rate": _round(self.rate), "eta_s": _round(self.eta_s, 1)}


@dataclass(frozen=True)
class Failure:
    cause: str
    line: int
    message: str
    hint: str

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "line": self.line, "message": self.message, "hint": self.hint}


@dataclass(frozen=True)
class LogWarning:
    code: str
    line: int
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "line": self.line, "message": self.message}


@dataclass(frozen=True)
class ServingNumbers:
    running: Optional[float] = None
    waiting: Optional[float] = None
    kv_cache_pct: Optional[float] = None
    gen_tokens_per_s: Optional[float] = None
    prompt_tokens_per_s: Optional[float] = None
    spec_accept_rate: Optional[float] = None     # 0..1
    spec_accept_len: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SERVING_KEYS}


@dataclass(frozen=True)
class LogAnalysis:
    engine: Optional[str] = None
    phase: str = "unknown"
    progress: Optional[Progress] = None
    failure: Optional[Failure] = None
    ready_line: Optional[int] = None
    serving: Optional[ServingNumbers] = None
    warnings: tuple[LogWarning, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "phase": self.phase,
            "progress": self.progress.to_json() if self.progress else None,
            "failure": self.failure.to_json() if self.failure else None,
            "ready_line": self.ready_line,
            "serving": self.serving.to_json() if self.serving else None,
            "warnings": [w.to_json() for w in self.warnings],
        }


def _round(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- the byte-level prefilter

# Every segment that can change the analysis contains one of these anchors; each names
# the families of handlers its segment needs (P progress, S serving, M phase markers,
# F failures, W warnings, E engine). Python's regex engine tries the alternation at
# every byte that can start an anchor, so anchors start with bytes that are rare in
# logs (capitals, punctuation); those made of common lowercase letters join the pattern
# only for chunks that contain them (an exact `in` check, so which segments are
# examined never depends on how the bytes were chunked). No ^ anchors: a segment can
# start after \r as well as after \n.
P, S, M, F, W, E = 1, 2, 4, 8, 16, 32
_RARE_ANCHORS: list[tuple[bytes, int]] = [
    # failures
    (b"Error", F), (b"ERROR", F), (b"xception", F), (b"Traceback", F), (b"Killed", F), (b"killed", F),
    (b"SIGKILL", F), (b"SIGSEGV", F), (b"NCCL", F), (b"Xid", F), (b"NVRM", F), (b"Watchdog", F), (b"watchdog", F),
    (b"CUDA", F), (b"xit code", F), (b"xit status", F), (b"xited with", F), (b"quit", F), (b"Out of memory", F),
    (b"-kill", F), (b"FAILED", F), (b"Failed", F), (b"Segmentation fault", F), (b"(core dumped", F),
    (b"GLIBC", F), (b"FATAL", F), (b"CRITICAL", F), (b"_alloc", F | W), (b"Cannot allocate", F | W),
    (b"xhausted", F | W), (b"Interrupt", F), (b"File \"", F), (b"Timeout", F), (b"Not enough memory", F),
    (b"No available memory", F), (b"No module named", F), (b"Aborted", F), (b"Fatal", F),
    (b"EngineDead", F), (b"EngineCore", F | E), (b"CMake Error", F | M), (b"ptxas", F), (b"ninja: build stopped", F),
    # phases
    (b"Load weight", M), (b"Loading", M | P), (b"Loaded", M), (b"Model loading", M), (b"Starting", M),
    (b"Started", M), (b"Compiling", M), (b"Dynamo", M), (b"_compile", M), (b".compile", M), (b"Captur", M | P),
    (b"Capture", M), (b"Graph captur", M), (b"KV cache", M | W), (b"KV Cache", M), (b"Memory pool", M),
    (b"API server", M), (b"Application startup", M), (b"Waiting for application", M), (b"Uvicorn", M),
    (b"The server is fired", M), (b"Available", M), (b"Building", M), (b"Configuring", M), (b"-- The C", M),
    (b"build_ext", M), (b"scikit-build", M), (b"Running training", M | P), (b"Num Epochs", P), (b"Num epochs", P),
    (b"Total optimization", P), (b"JIT", M | W), (b"Prebuilt", M | W), (b"MAX_JOBS", W), (b"Allowing ninja", W),
    (b"Emitting ninja", M), (b"Linking", M), (b"Initializing a V", M | E), (b"ServerArgs", M), (b"Server args", M),
    (b"PreemptionMode", W), (b"Retract", W),
    # serving
    (b"Avg prompt", S), (b"Avg generation", S), (b"Decode batch", S | E), (b"Prefill batch", S | E),
    (b"SpecDecoding", S), (b"Speculative metrics", S),
    # progress
    (b"%|", P), (b"% Completed", P), (b"%]", P), (b"Step", P), (b"STEP", P), (b"Epoch", P), (b"EPOCH", P),
    (b"{'", P), (b'{"', P),
]
_COMMON_ANCHORS: list[tuple[bytes, int]] = [
    (b"error", F), (b"failed", F), (b"out of memory", F | W), (b"signal 9", F), (b"died", F), (b"usage:", F),
    (b"timed out", F), (b"undefined symbol", F), (b"step", P), (b"epoch", P), (b"retract", W), (b"preempted", W),
    (b"make -j", W),
]
# Until the engine is known for sure, every line of an engine's log carries its
# signature (a `(Worker_TP0 pid=…)` prefix, a `[… TP3]` rank tag): look at those too.
_ENGINE_ANCHORS: list[tuple[bytes, int]] = [
    (b"pid=", E), (b"vllm", E), (b"VLLM", E), (b"vLLM", E), (b"sglang", E), (b"SGLang", E), (b"sgl_kernel", E),
]
_NINJA_ANCHOR = rb"\[\d+/\d+\]"           # [12/345]
_RANK_ANCHOR = rb"TP\d"                   # [2025-… TP3]

_FAMILY: dict[bytes, int] = {}
for _lit, _fam in _RARE_ANCHORS + _COMMON_ANCHORS + _ENGINE_ANCHORS:
    _FAMILY[_lit] = _FAMILY.get(_lit, 0) | _fam


def _family(hit: bytes) -> int:
    fam = _FAMILY.get(hit)
    if fam is not None:
        return fam
    return P if hit[:1] == b"[" else E        # the two regex anchors


def _trie_pattern(literals: list[bytes], extra: list[bytes]) -> bytes:
    """One alternation factored as a trie, every branch starting with a literal byte.

    Python's regex engine tries a flat alternation branch by branch at every candidate
    byte; a trie tries one branch per distinct first byte, and as long as every top-level
    branch starts with a literal the engine skips non-candidate bytes in C (a non-literal
    branch there makes it try every position: several times slower).
    """
    trie: dict = {}
    for word in literals:
        node = trie
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = {}

    def build(node: dict) -> bytes:
        items = sorted((k, v) for k, v in node.items() if k is not None)
        if not items:
            return b""
        alts = [re.escape(bytes([k])) + build(v) for k, v in items]
        body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
        return b"(?:" + body + b")?" if None in node else body

    top = [re.escape(bytes([k])) + build(v) for k, v in sorted((k, v) for k, v in trie.items() if k is not None)]
    return b"(?:" + b"|".join(top + extra) + b")"


_prefilters: dict[tuple[bytes, ...], re.Pattern] = {}


def _prefilter_for(extra: tuple[bytes, ...]) -> re.Pattern:
    rx = _prefilters.get(extra)
    if rx is None:
        if len(_prefilters) > 256:      # bounded: combinations seen in practice are few
            _prefilters.clear()
        literals = [lit for lit, _ in _RARE_ANCHORS] + [lit for lit in extra if lit != _RANK_ANCHOR]
        specials = [_NINJA_ANCHOR] + ([_RANK_ANCHOR] if _RANK_ANCHOR in extra else [])
        rx = _prefilters[extra] = re.compile(_trie_pattern(literals, specials))
    return rx


def _prefilter_in(data: bytes, engine_known: bool) -> re.Pattern:
    """The prefilter for `data`: rare anchors, plus the common ones `data` actually contains."""
    extra = [lit for lit, _ in _COMMON_ANCHORS if lit in data]
    if not engine_known:
        extra += [lit for lit, _ in _ENGINE_ANCHORS if lit in data]
        extra.append(_RANK_ANCHOR)
    return _prefilter_for(tuple(extra))


def _families_in(rx: re.Pattern, data: bytes, m: re.Match, stop: int) -> int:
    """Family bits of every anchor in data[m.start():stop] (m is the first hit)."""
    fams = _family(m.group())
    q = m.end()
    search = rx.search
    while q < stop:
        m = search(data, q, stop)
        if m is None:
            break
        fams |= _family(m.group())
        q = m.end()
    return fams


_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()][0-9A-Za-z]|[@-Z\\-_])")


# --------------------------------------------------------------------------- record structure

_LEVELS = "INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE"
# One prefix at a time, re-applied: worker tags, timestamps, logger headers, rank tags.
_PREFIX = re.compile(
    r"(?:"
    r"\((?:[A-Za-z][\w\-:]*\s+)?pid=\d+(?:,\s*ip=[^)]*)?\)"                                   # (Worker_TP0 pid=1)
    r"|\[rank\d+\]:?"                                                                          # [rank0]:
    r"|\[(?:PG [^\]]*?)?Rank \d+\]"                                                            # [PG ID 0 PG GUID 0 Rank 1]
    r"|\[(?P<ts1>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:\s+[A-Z]{1,4}\d+)*\]"          # [2025-.. DP0 TP0]
    r"|\[(?P<ts2>\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:\s+[A-Z]{1,4}\d+)*\]"                            # [23:03:43 TP0]
    r"|(?P<lvl1>" + _LEVELS + r")\s+(?P<ts3>\d\d-\d\d\s\d\d:\d\d:\d\d)(?:\.\d+)?\s+\[[^\]]*\]"   # vLLM header
    r"|(?P<ts4>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"              # 2025-.. [- INFO -]
    r"(?:\s*[-|]\s*(?P<lvl2>" + _LEVELS + r")\s*[-|:]\s*(?:[\w.]+(?:\s*\[[^\]]*\])?\s*[:|\-]\s)?)?"
    r"|(?P<lvl3>" + _LEVELS + r")(?::\s*|\s+-\s+|\s+(?=\[))"                                   # INFO:  / INFO - 
    r"|\[(?P<lvl4>[EWIF])\s[^\]]*\.(?:cpp|cc|cu|h|hpp|c):\d+\]"                                 # [E ProcessGroupNCCL.cpp:563]
    r"|\[?(?P<lvl5>[EWIF])\d{3,4}\s\d\d:\d\d:\d\d\.\d+(?:\s+\d+)?\s\S+:\d+\]"                         # glog, bare or [bracketed]
    r"|\[\s*\d+\.\d+\]"                                                                       # dmesg
    r"|(?:#\d+\s)?(?P<ts5>\d+\.\d+)(?=\s\S)"                                                  # buildkit 25.88
    r")\s?")
_LEVEL_OF = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "FATAL"}


def _strip_prefixes(text: str) -> tuple[str, Optional[str], Optional[tuple[str, str]]]:
    """(message, level, raw timestamp) with worker/rank/time/logger prefixes removed.

    The timestamp stays raw ((kind, text)); _ts_seconds parses it only where a rate needs it.
    """
    level: Optional[str] = None
    ts: Optional[tuple[str, str]] = None
    for _ in range(6):
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            break
        g = m.groupdict()
        lvl = g["lvl1"] or g["lvl2"] or g["lvl3"] or g["lvl4"] or g["lvl5"]
        if lvl:
            level = _LEVEL_OF.get(lvl, lvl)
        for key in ("ts1", "ts4", "ts3", "ts2", "ts5"):
            if g[key]:
                ts = (key, g[key])
                break
        text = text[m.end():]
    return text, level, ts


def _ts_seconds(ts: Optional[tuple[str, str]]) -> Optional[float]:
    return _parse_ts(*ts) if ts is not None else None


def _parse_ts(kind: str, raw: str) -> Optional[float]:
    try:
        if kind in ("ts1", "ts4"):     # YYYY-MM-DD HH:MM:SS
            return datetime(int(raw[0:4]), int(raw[5:7]), int(raw[8:10]), int(raw[11:13]), int(raw[14:16]),
                            int(raw[17:19])).timestamp()
        if kind == "ts3":   # vLLM's MM-DD HH:MM:SS omits the year: fine for the differences rates are made of
            return datetime(2000, int(raw[0:2]), int(raw[3:5]), int(raw[6:8]), int(raw[9:11]),
                            int(raw[12:14])).timestamp()
        if kind == "ts2":
            h, m, s = raw.split(":")
            return int(h) * 3600 + int(m) * 60 + int(s)
        return float(raw)
    except ValueError:
        return None


# --------------------------------------------------------------------------- progress formats

_SIZE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TQDM = re.compile(
    r"(?P<pct>\d{1,3})%\s*(?:\|[^|\r\n]{0,400}\||Completed\s*\|)\s*"
    r"(?P<n>\d+(?:\.\d+)?)(?P<nu>[kKMGT]?)/(?P<N>\d+(?:\.\d+)?)(?P<Nu>[kKMGT]?)"
    r"(?:\s*\[(?P<inner>[^\]\r\n]{0,200})\])?")
_TQDM_TIMES = re.compile(r"^\s*(?P<el>[\d:]+)\s*<\s*(?P<rem>[\d:]+|\?)")
_TQDM_RATE = re.compile(r"(?P<v>\d+(?:\.\d+)?|\?)\s*(?P<u>[kKMGT]?)(?P<a>[A-Za-z]*)/(?P<b>[A-Za-z]+)")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s")
_MAKE = re.compile(r"^\[\s*(\d{1,3})%\]\s")
_STEP = re.compile(r"\b(?:global[_ ])?(?:step|Step|STEP|iter|Iter|iteration|Iteration)\b\s*[:=#]?\s*\[?\s*(\d+)\s*(?:/\s*(\d+))?")
_EPOCH = re.compile(r"\b(?:epoch|Epoch|EPOCH)\b\s*[:=#]?\s*\[?\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+))?")
_LOSS_DICT = re.compile(r"""^\{['"](?:loss|train_loss|eval_loss)['"]\s*:.*['"]epoch['"]\s*:\s*([\d.]+)""")
_TRAIN_END = re.compile(r"""^\{['"]train_runtime['"]""")
_NUM_EPOCHS = re.compile(r"Num [Ee]pochs\s*=\s*([\d,]+)")
_TOTAL_STEPS = re.compile(r"Total optimization steps\s*=\s*([\d,]+)")


def _clock(text: str) -> Optional[float]:
    parts = text.split(":")
    try:
        value = 0.0
        for part in parts:
            value = value * 60 + float(part)
        return value
    except ValueError:
        return None


def _num(value: float) -> Number:
    return int(value) if float(value).is_integer() else value


# --------------------------------------------------------------------------- serving stats lines

_F = r"([-+]?\d+(?:\.\d+)?)"
# vLLM: "Engine 000: Avg prompt throughput: …" (V1) and "Avg prompt throughput: …" (V0) alike.
_VLLM_STATS = re.compile(
    r"Avg prompt throughput:\s*" + _F + r"[^,]*,\s*Avg generation throughput:\s*" + _F +
    r"(?:.*?Running:\s*" + _F + r"\s*req)?(?:.*?(?:Waiting|Pending):\s*" + _F + r"\s*req)?"
    r"(?:.*?GPU KV cache usage:\s*" + _F + r"\s*%)?")
_VLLM_SPEC_LEN = re.compile(r"Mean acceptance length:\s*" + _F)
_VLLM_SPEC_RATE = re.compile(r"Draft acceptance rate:\s*" + _F + r"\s*(%?)")
# SGLang "Decode batch. …" / "Prefill batch. …": one pass over "name: value" pairs.
_SGLANG_FIELD = re.compile(r"(#running-req|#queue-req|(?<![#\w])(?:full )?token usage|gen throughput \(token/s\)"
                           r"|input throughput \(token/s\)|accept len(?:gth)?|accept rate):\s*" + _F)
_SGLANG_KEY = {"#running-req": ("running", 1.0), "#queue-req": ("waiting", 1.0),
               "token usage": ("kv_cache_pct", 100.0), "full token usage": ("kv_cache_pct", 100.0),
               "gen throughput (token/s)": ("gen_tokens_per_s", 1.0),
               "input throughput (token/s)": ("prompt_tokens_per_s", 1.0),
               "accept len": ("spec_accept_len", 1.0), "accept length": ("spec_accept_len", 1.0),
               "accept rate": ("spec_accept_rate", 1.0)}
_V0_SPEC_K = re.compile(r"Number of speculative tokens:\s*(\d+)")
_V0_SPEC_DRAFT = re.compile(r"Number of draft tokens:\s*(\d+)")
_V0_SPEC_EMITTED = re.compile(r"Number of emitted tokens:\s*(\d+)")


def parse_serving_stats_line(line: str) -> Optional[dict[str, float]]:
    """Serving numbers from one engine stats line (vLLM `Engine 000: Avg prompt throughput …`,
    `SpecDecoding metrics: …`, V0 `Speculative metrics: …`; SGLang `Decode batch. …` /
    `Prefill batch. …`), as a partial dict over SERVING_KEYS; None for any other line.

    kv_cache_pct is 0..100, spec_accept_rate 0..1. Prefixes and ANSI colour are tolerated.
    """
    if "\x1b" in line:
        line = _ANSI.sub(b"", line.encode("utf-8", "replace")).decode("utf-8", "replace")
    out: dict[str, float] = {}
    if "Avg prompt throughput" in line:
        m = _VLLM_STATS.search(line)
        if m:
            for key, value in zip(("prompt_tokens_per_s", "gen_tokens_per_s", "running", "waiting", "kv_cache_pct"),
                                  m.groups()):
                if value is not None:
                    out[key] = float(value)
    elif "acceptance" in line:
        m = _VLLM_SPEC_LEN.search(line)
        if m:
            out["spec_accept_len"] = float(m.group(1))
        m = _VLLM_SPEC_RATE.search(line)
        if m:
            out["spec_accept_rate"] = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
            if not m.group(2):     # V0 "Speculative metrics": a fraction, and the length from token counts
                k, drafted, emitted = (_V0_SPEC_K.search(line), _V0_SPEC_DRAFT.search(line),
                                       _V0_SPEC_EMITTED.search(line))
                if k and drafted and emitted and int(drafted.group(1)) > 0:
                    steps = int(drafted.group(1)) / max(1, int(k.group(1)))
                    out["spec_accept_len"] = int(emitted.group(1)) / steps
    elif "batch." in line:
        for name, value in _SGLANG_FIELD.findall(line):
            key, scale = _SGLANG_KEY[name]
            if key not in out:
                out[key] = float(value) * scale
        if "Prefill batch" in line:
            out.pop("gen_tokens_per_s", None)      # the decode rate lives on decode lines only
    return out or None


# --------------------------------------------------------------------------- engine signatures

_ENGINE_STRONG = re.compile(
    r"(?P<vllm>^\((?:APIServer|EngineCore[\w]*|Worker[\w]*|VllmWorker[\w]*|RayWorkerWrapper|VLLM[\w:]*) pid="
    r"|Starting vLLM|vLLM API server|Engine \d{3}:|usage: vllm|^vllm: error|vllm serve|VLLM::|vLLM is using"
    r"|Initializing a V\d LLM engine|vllm_config|from vllm|vllm\.entrypoints)"
    r"|(?P<sglang>\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?:\s+(?:DP|PP|EP)\d+)*\s+TP\d+\]"
    r"|sglang::|Decode batch\.|Prefill batch\.|fired up and ready to roll|Capturing batches|Capture cuda graph"
    r"|Load weight (?:begin|end)|sglang\.launch_server|sglang serve|KV Cache is allocated|Memory pool end)")
_ENGINE_PATH = re.compile(r"(?P<vllm>/vllm/|\bvllm\._C\b)|(?P<sglang>/sglang/|/sgl_kernel/|\bsglang\.srt\b)")
# Weak hints, weighted: vLLM's shard-loader bar (SGLang reuses it), flashinfer JIT (SGLang's default backend).
_ENGINE_WEAK = [(re.compile(r"checkpoint shards:\s*\d+% Completed"), "vllm", 1),
                (re.compile(r"flashinfer\.\s*jit"), "sglang", 2)]


# --------------------------------------------------------------------------- phase markers

_MARKERS = re.compile(
    r"(?P<loading>Load weight begin|Loading (?:model )?weights(?! took)|Starting to load model|Loading model from"
    r"|Loading safetensors|Loading pt checkpoint)"
    r"|(?P<loaded>Loading weights took|Model loading took|Load weight end|Loaded model weights)"
    r"|(?P<compiling>Dynamo bytecode transform|Compiling a graph|torch\.compile(?! takes)|torch_compile_cache"
    r"|Prebuilt kernels not found|Loading JIT ops|JIT compil|Compiling (?:kernel|module|model))"
    r"|(?P<compiled>torch\.compile takes)"
    r"|(?P<capturing>Capture cuda graph begin|Capturing CUDA graph|Capturing cudagraph|Capturing the model for CUDA graph"
    r"|Capturing batches)"
    r"|(?P<captured>Capture cuda graph end|Graph capturing finished)"
    r"|(?P<starting>GPU KV cache size|Available KV cache memory|KV Cache is allocated|Memory pool end"
    r"|Starting vLLM API server|Available routes are|Started server process|Waiting for application startup"
    r"|Uvicorn running on|Initializing a V\d LLM engine|Server args|server_args=)"
    r"|(?P<startup_complete>Application startup complete)"
    r"|(?P<ready>fired up and ready to roll)"
    r"|(?P<building>Building (?:CUDA|CXX|C) object|\*\*\* Configuring CMake|-- Configuring (?:done|incomplete)"
    r"|-- The (?:C|CXX|CUDA) compiler identification|Building wheel|running build_ext|Emitting ninja build file"
    r"|scikit-build-core|Linking (?:CUDA|CXX|C) (?:shared|static)|Building extension)"
    r"|(?P<training>\*+ Running training \*+)")


# --------------------------------------------------------------------------- failure signatures

_CODE_INDENT = 4     # traceback source lines are indented by >= 4 spaces; exception lines by 0
_EXC_LINE = re.compile(
    r"^(?:-\s+)?(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Fault))(?::\s*(?P<msg>.*))?$")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_XID = re.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*:?\s*(\d+)")
_XID_APP = {13, 31, 43, 45, 68, 69}           # application faults and their clean-up, not the hardware
_XID_NOISE = {43, 45}                          # a consequence of an app being killed
_GPU_FAULT = re.compile(r"fallen off the bus|GPU is lost|[Uu]ncorrectable ECC|cudaErrorECCUncorrectable"
                        r"|GPU requires reset|NVRM: GPU at PCI.*has fallen")
_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|No available memory for the cache blocks|Not enough memory\. Please try to increase"
    r"|can be stored in KV cache|Capture cuda graph failed:.*out of memory|insufficient (?:GPU|device) memory"
    r"|out of memory on (?:device|GPU)")
_HOST_OOM = re.compile(
    r"^Killed\s*$|^Killed process|\d+\s+Killed\b|\bKilled\s{2,}\S|died due to signal 9|Killed signal terminated program"
    r"|internal compiler error: Killed|(?:exit|exited with) (?:code|status)[:= ]*(?:137|-9)\b"
    r"|non-zero exit status (?:137|-9)\b|Signals\.SIGKILL|killed by signal(?: 9\b|:? Killed)|received signal 9\b"
    r"|terminated by signal 9\b|Out of memory: Kill|invoked oom-killer|oom-kill|oom_reaper|^MemoryError\b"
    r"|std::bad_alloc|Cannot allocate memory|virtual memory exhausted|out of memory allocating")
_NCCL = re.compile(
    r"NCCL error|nccl(?:System|Internal|UnhandledCuda|InvalidUsage|Remote|InvalidArgument)Error"
    r"|collective operation timeout|NCCL communicator was aborted|NCCL (?:timeout|Timeout)|DistBackendError"
    r"|Timeout at NCCL work|NCCL operations have failed")
_CUDA_ERR = re.compile(
    r"CUDA error|CUDA driver error|illegal memory access|device-side assert|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+"
    r"|CUDNN_STATUS_[A-Z_]+|cuDNN error|cudaError[A-Z]\w+|no kernel image is available|misaligned address"
    r"|unspecified launch failure|CUDA driver version is insufficient|illegal instruction was encountered")
_HANG = re.compile(r"Watchdog timeout \(|watchdog_timeout=\d+\)|[Hh]ang detected|detected a hang"
                   r"|execute_model timed out|ENGINE_ITERATION_TIMEOUT")
_IMPORT = re.compile(r"undefined symbol|cannot open shared object file|No module named|GLIBC(?:XX)?_[\d.]+'? not found"
                     r"|DLL load failed|cannot import name")
_BAD_ARGS = re.compile(
    r"^[\w.\-]+(?: [\w\-]+)?: error: (?:unrecognized arguments|the following arguments are required|argument \S+"
    r"|invalid choice|ambiguous option|unrecognized option|expected one argument)"
    r"|^Error: (?:No such option|Got unexpected extra argument|Invalid value for|Missing (?:option|argument))")
_BUILD_SPECIFIC = re.compile(
    r"^\S+?:\d+:(?:\d+:)? (?:fatal )?error: |^\S+\(\d+\): (?:catastrophic )?error|^nvcc fatal|CMake Error"
    r"|ptxas (?:fatal|error)|died due to signal (?!9\b)\d+|undefined reference to|collect2: error|ld returned \d+ exit status"
    r"|^\S+: fatal error: |^nvcc (?:error|fatal)\s*:"
    r"|^(?:[\w.+-]*-)?(?:c\+\+|g\+\+|gcc|cc|clang(?:\+\+)?|ld|ld\.\w+)(?:-\d+)?: (?:fatal )?error: ")
_BUILD_UMBRELLA = re.compile(
    r"ninja: build stopped|^make(?:\[\d+\])?: \*\*\*|error: command '[^']*' failed|subprocess-exited-with-error"
    r"|Failed building wheel|did not run successfully|Error compiling objects for extension|^FAILED: "
    r"|CalledProcessError.*(?:cmake|ninja|make|nvcc|setup\.py)")
_ENGINE_UMBRELLA = re.compile(
    r"Engine core initialization failed|EngineCore failed to start|Scheduler hit an exception"
    r"|Received sigquit from a child process|EngineDeadError|EngineCore encountered a fatal error"
    r"|died unexpectedly|[Ww]orker.* died|Child process .* died|terminate called after throwing"
    r"|Traceback \(most recent call last\)|Initialization failed\. detoken|Capture cuda graph failed")
_CRASH = re.compile(r"Segmentation fault|SIGSEGV|core dumped|Aborted \(core dumped\)|Fatal Python error")
_NOT_FAILURE_LEVELS = ("INFO", "DEBUG", "NOTICE")

_OOM_RISK = re.compile(r"Allowing ninja to set a default number of workers|make -j(?:\s|$)"
                       r"|virtual memory exhausted|Cannot allocate memory|std::bad_alloc")
_KV_PRESSURE = re.compile(r"preempted by PreemptionMode|not enough KV cache space|KV cache pool is full"
                          r"|Decode out of memory|[Rr]etract(?:ed)? requests")
_JIT = re.compile(r"Prebuilt kernels not found|using JIT backend|Loading JIT ops|JIT compil")

_HINTS = {
    "cuda_oom": "GPU memory exhausted — lower --gpu-memory-utilization / --mem-fraction-static, max model length "
                "or batch size, or spread the model over more GPUs (tensor parallel)",
    "cuda_oom_capture": "GPU memory ran out while capturing CUDA graphs — lower --cuda-graph-max-bs / "
                        "--max-num-seqs, leave more memory free (--mem-fraction-static), or disable CUDA graphs",
    "host_oom_build": "killed by the host OOM killer — lower MAX_JOBS (or CMAKE_BUILD_PARALLEL_LEVEL) and NVCC_THREADS",
    "host_oom": "killed by the host OOM killer (SIGKILL) — free host RAM, lower CPU-side memory use "
                "(swap space, loader workers), or check `dmesg` for the kill",
    "nccl": "NCCL collective failed — rerun with NCCL_DEBUG=INFO; check P2P/NVLink/IB topology (try "
            "NCCL_P2P_DISABLE=1) and that every rank started",
    "nccl_timeout": "an NCCL collective timed out — a rank is stuck or the GPUs cannot talk to each other; "
                    "rerun with NCCL_DEBUG=INFO, try NCCL_P2P_DISABLE=1 / --disable-custom-all-reduce",
    "nccl_first": "the very first NCCL collective never completed — the GPUs cannot talk (P2P/topology/IOMMU/ACS); "
                  "try NCCL_P2P_DISABLE=1 and check `nvidia-smi topo -m` with NCCL_DEBUG=INFO",
    "cuda_error": "CUDA kernel fault — rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try another attention "
                  "backend or disable CUDA graphs (--enforce-eager / --disable-cuda-graph)",
    "cuda_error_arch": "the binary has no kernels for this GPU — rebuild for its arch (TORCH_CUDA_ARCH_LIST) "
                       "or install a wheel built for it",
    "import_error_abi": "compiled extension built against another torch/CUDA — rebuild it or install a matching wheel; "
                        "import torch first",
    "import_error": "a module or shared library is missing — install it into the environment the job runs in "
                    "(check which python/venv the job uses)",
    "syntax_error": "a Python file does not parse — fix the file and line named in the traceback (a patched file?) "
                    "before relaunching",
    "bad_arguments": "the command line has an option this program/version does not accept — check `--help` "
                     "(e.g. `vllm serve` given twice when the image's entrypoint already runs it)",
    "build_failed": "the build failed — fix the first compiler/CMake error above; check the CUDA toolkit, "
                    "compiler and TORCH_CUDA_ARCH_LIST",
    "build_segfault": "a compiler tool crashed (segfault, not OOM) — retry; if it repeats, change the CUDA "
                      "toolkit version or the arch list",
    "hang": "the engine's own watchdog found a batch stuck — usually a collective deadlock or a very slow JIT "
            "compile; try --disable-custom-all-reduce, or raise --watchdog-timeout only if it was compiling",
    "gpu_fault": "GPU hardware/driver fault (Xid) — the GPU needs a reset or the node a reboot; not a software bug",
    "exception": "uncaught Python exception — read the traceback that ends at this line",
    "exception_umbrella": "a process of the job died — its own error is printed above (or in its own log); "
                          "look for the first traceback/ERROR before this line",
    "exception_below": "a process of the job died with a Python exception — its type and message end the "
                       "traceback that starts here",
    "exception_traceback": "a Python traceback without its final exception line (log cut short?) — read it above",
    "exception_crash": "the process crashed in native code — rerun with CUDA_LAUNCH_BLOCKING=1 / faulthandler "
                       "to locate it",
    "exception_interrupt": "interrupted (Ctrl-C / SIGINT) — stopped by someone, not by a bug",
}


@dataclass
class _Candidate:
    spec: int          # 3 specific signature, 2 exception line, 1 umbrella, 0 an ERROR-level line
    cause: str
    line: int
    message: str
    hint_key: str


# --------------------------------------------------------------------------- the state machine


class _State:
    """Everything the analysis knows; small and bounded, so result() can copy it cheaply."""

    def __init__(self) -> None:
        self.now: Optional[float] = None
        self.engine_strong: Optional[str] = None
        self.engine_path: Optional[str] = None
        self.engine_weak: dict[str, int] = {}
        self.weak_seen: set[str] = set()
        self.phase: Optional[str] = None
        self.load_done = False
        self.ready_line: Optional[int] = None
        self.serving: dict[str, float] = {}
        self.spec_recent: deque[tuple[Optional[float], Optional[float]]] = deque(maxlen=SPEC_WINDOW)
        self.warnings: dict[str, LogWarning] = {}
        self.num_epochs: Optional[int] = None
        self.total_steps: Optional[int] = None
        # progress: "bar" sources (tqdm/ninja/make/step n/N) beat "hint" sources (loss dicts, step=N) of one phase
        self.bar: Optional[tuple[int, str, Progress]] = None     # (seq, phase, progress)
        self.hint: Optional[tuple[int, str, Progress]] = None
        self.seq = 0
        self.series: Optional[tuple[tuple, float, float]] = None  # (key, first done, first time) for rates
        # failure
        self.best: Optional[_Candidate] = None        # highest spec >= 2, earliest
        self.first_low: Optional[_Candidate] = None   # earliest spec 1
        self.first_weak: Optional[_Candidate] = None  # earliest spec 0
        self.advances_since_failure = 0
        self.progress_at_failure: Optional[tuple[tuple, Number]] = None
        self.last_frame_line = -10**9
        self.usage_line = -10**9
        self.nvrm: deque[tuple[int, str]] = deque(maxlen=6)
        self.last_progress_key: Optional[tuple[tuple, float]] = None
        self.labels: dict[str, tuple[str, Optional[str], str]] = {}

    # ------------------------------------------------------------------ entry

    def examine(self, raw: bytes, line: int, fams: int = P | S | M | F | W | E) -> None:
        """One segment; `fams` (from its prefilter anchors) says which handlers it can concern."""
        if b"\x1b" in raw:
            raw = _ANSI.sub(b"", raw)
        self._examine_text(raw.decode("utf-8", "replace"), line, 0, fams)

    def _examine_text(self, text: str, line: int, depth: int, fams: int) -> None:
        if fams & P and "%" in text:
            m = _TQDM.search(text)
            if m is not None:
                self._tqdm(text[:m.start()], m, line)
                rest = text[m.end():]
                if depth < 3 and rest.strip():
                    self._examine_text(rest, line, depth + 1, fams)   # a log record glued onto the bar
                return
        self._record(text, line, fams)

    # ------------------------------------------------------------------ one log record

    def _record(self, text: str, line: int, fams: int) -> None:
        msg, level, ts = _strip_prefixes(text)
        body = msg.strip()
        if not body:
            return
        if self.engine_strong is None:
            self._engine(text, body)
        if fams & S:
            stats = parse_serving_stats_line(body)
            if stats:
                self._serving(stats, line)
                return
        if fams & M:
            m = _MARKERS.search(body)
            if m is not None:
                self._marker(m.lastgroup, line)
        if fams & P:
            self._progress_record(body, line, ts)
        if fams & F:
            self._failure(body, level, len(msg) - len(msg.lstrip(" ")), line)
        if fams & W:
            self._warnings(body, line)

    # ------------------------------------------------------------------ engine

    def _engine(self, text: str, body: str) -> None:
        m = _ENGINE_STRONG.search(text.lstrip()) or _ENGINE_STRONG.search(body)
        if m is not None:
            self.engine_strong = m.lastgroup
            return
        if self.engine_path is None:
            m = _ENGINE_PATH.search(body)
            if m is not None:
                self.engine_path = m.lastgroup
        for rx, engine, weight in _ENGINE_WEAK:
            if engine + rx.pattern not in self.weak_seen and rx.search(body):
                self.weak_seen.add(engine + rx.pattern)
                self.engine_weak[engine] = self.engine_weak.get(engine, 0) + weight

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
        elif kind == "startup_complete":
            if self.engine() == "sglang":
                self.phase = "starting"      # SGLang still warms up after uvicorn starts
            else:
                self._became_ready(line)
        elif kind == "ready":
            self._became_ready(line)
        elif kind == "building":
            self.phase = "building"
        elif kind == "training":
            self.phase = "training"

    def _became_ready(self, line: int) -> None:
        self.phase = "ready"
        if self.ready_line is None:
            self.ready_line = line
        self._recovered(line)
        # what was loading/capturing is done; progress means nothing for a serving engine
        self.bar = None
        self.hint = None

    # ------------------------------------------------------------------ progress

    def _bar_label(self, before: str) -> tuple[str, Optional[str], str]:
        """(label, the phase its words name or None, series key) for the text before a bar; cached."""
        hit = self.labels.get(before)
        if hit is None:
            label, _, _ = _strip_prefixes(before.strip())
            label = label.strip().rstrip(":").strip()[:100]
            if self.engine_strong is None:
                self._engine(label, label)
            if len(self.labels) >= 256:
                self.labels.clear()
            hit = self.labels[before] = (label, _label_phase(label), _series_label(label))
        return hit

    def _tqdm(self, before: str, m: re.Match, line: int) -> None:
        label, named_phase, key_label = self._bar_label(before)
        done = float(m.group("n")) * _SIZE[m.group("nu")]
        total = float(m.group("N")) * _SIZE[m.group("Nu")]
        rate = eta = None
        inner = m.group("inner")
        if inner:
            t = _TQDM_TIMES.match(inner)
            if t and t.group("rem") != "?":
                eta = _clock(t.group("rem"))
            r = _TQDM_RATE.search(inner[t.end():] if t else inner)
            if r and r.group("v") != "?":
                value = float(r.group("v")) * _SIZE[r.group("u")]
                if r.group("a") == "s" and r.group("b") != "s":      # "2.87s/it": seconds per item
                    rate = 1.0 / value if value > 0 else None
                else:
                    rate = value
        phase = named_phase or self._unnamed_bar_phase()
        if phase == "loading" and total and done >= total:
            self.load_done = True
        self._set_progress("bar", phase, label or self._default_label(phase), done, total, rate, eta, line, None,
                           key_label)

    def _unnamed_bar_phase(self) -> str:
        current = self.phase
        if current in ("training", "building"):
            return current
        # An unlabeled bar right after the weights are in is the CUDA-graph capture (SGLang's old bar).
        if self.load_done and current in ("starting", "compiling", "loading", "capturing"):
            return "capturing"
        return current or "unknown"

    @staticmethod
    def _default_label(phase: str) -> str:
        return {"capturing": "CUDA graphs", "loading": "weights", "training": "training",
                "building": "build", "compiling": "compile"}.get(phase, "")

    def _progress_record(self, body: str, line: int, ts: Optional[tuple[str, str]]) -> None:
        c = body[0]
        if c == "[":
            m = _NINJA.match(body)
            if m:
                self._set_progress("bar", "building", "build", float(m.group(1)), float(m.group(2)),
                                   None, None, line, ts)
                return
            m = _MAKE.match(body)
            if m:
                self._set_progress("bar", "building", "build", float(m.group(1)), 100.0, None, None, line, ts)
                return
        if c == "{":
            m = _LOSS_DICT.match(body)
            if m:
                self._set_progress("hint", "training", "epoch", float(m.group(1)),
                                   float(self.num_epochs) if self.num_epochs else None, None, None, line, ts)
                return
            if _TRAIN_END.match(body):
                self.phase = "training"
                return
        if "Num" in body or "optimization" in body:
            m = _NUM_EPOCHS.search(body)
            if m:
                self.num_epochs = int(m.group(1).replace(",", ""))
                self.phase = "training"
            m = _TOTAL_STEPS.search(body)
            if m:
                self.total_steps = int(m.group(1).replace(",", ""))
                self.phase = "training"
            return
        low_hit = ("tep" in body or "TEP" in body or "ter" in body or "poch" in body or "POCH" in body)
        if not low_hit:
            return
        sm = _STEP.search(body)
        em = _EPOCH.search(body)
        # Only training-shaped lines: "step 10/100", or step/epoch beside a loss.
        lossy = "loss" in body or "Loss" in body
        step = (float(sm.group(1)), float(sm.group(2)) if sm.group(2) else None) if sm else None
        epoch = (float(em.group(1)), float(em.group(2)) if em.group(2) else None) if em else None
        if step and step[1] is not None and step[1] > 0 and (lossy or step[0] <= step[1]):
            label = f"epoch {_num(epoch[0])} step" if epoch else "step"
            self._set_progress("bar", "training", label, step[0], step[1], None, None, line, ts)
        elif epoch and epoch[1] is not None and epoch[1] > 0 and epoch[0] <= epoch[1] + 1:
            self._set_progress("bar", "training", "epoch", epoch[0], epoch[1], None, None, line, ts)
        elif step and lossy:
            label = f"epoch {_num(epoch[0])} step" if epoch else "step"
            total = float(self.total_steps) if self.total_steps else None
            self._set_progress("hint", "training", label, step[0], total, None, None, line, ts)
        elif epoch and lossy:
            total = float(self.num_epochs) if self.num_epochs else None
            self._set_progress("hint", "training", "epoch", epoch[0], total, None, None, line, ts)

    def _set_progress(self, source: str, phase: str, label: str, done: float, total: Optional[float],
                      rate: Optional[float], eta: Optional[float], line: int, ts: Optional[tuple[str, str]],
                      key_label: Optional[str] = None) -> None:
        self.seq += 1
        key = (source, phase, key_label if key_label is not None else _series_label(label), total)
        if self.now is not None:
            when: Optional[float] = self.now
        else:
            when = _ts_seconds(ts) if rate is None else None
        # Rates the bar does not print come from the clock: the caller's, else the lines' own timestamps.
        if self.series is None or self.series[0] != key or when is None or done < self.series[1]:
            self.series = (key, done, when) if when is not None else (key, done, float("nan"))
        elif rate is None:
            first_done, first_when = self.series[1], self.series[2]
            if when > first_when and done > first_done:
                rate = (done - first_done) / (when - first_when)
        if eta is None and rate and total is not None and total >= done:
            eta = (total - done) / rate
        progress = Progress(done=_num(done), total=_num(total) if total is not None else None, label=label,
                            rate=rate, eta_s=eta)
        if source == "bar":
            self.bar = (self.seq, phase, progress)
        else:
            self.hint = (self.seq, phase, progress)
        if phase != "unknown":
            self.phase = phase
        # A job that keeps advancing after logging an error did not die of it.
        if self.progress_at_failure is not None:
            pkey, pdone = self.progress_at_failure
            if pkey == key and done > pdone:
                self.advances_since_failure += 1
                self.progress_at_failure = (key, done)
                if self.advances_since_failure >= RECOVERY_ADVANCES:
                    self._recovered(line)
        self.last_progress_key = (key, done)

    def progress(self) -> Optional[Progress]:
        bar, hint = self.bar, self.hint
        # A newer hint of another phase wins — unless it only says "epoch 2.25" where the bar
        # still counts done/total (a loss dict glued onto a Trainer bar): the bar is the better answer.
        if hint is not None and (bar is None or (hint[0] > bar[0] and hint[1] != bar[1]
                                                 and (hint[2].total is not None or bar[2].total is None))):
            return hint[2]
        return bar[2] if bar is not None else None

    # ------------------------------------------------------------------ serving

    def _serving(self, stats: dict[str, float], line: int) -> None:
        # Two independent halves (disjoint fields): the fast scanner applies the first at the
        # start of a run of stats lines and the second only where a later line does not overwrite it.
        self.ready_mark(line)
        self.serving_data(stats, line)

    def ready_mark(self, line: int) -> None:
        """What any serving-stats line says about the job: it is ready, and earlier errors did not kill it."""
        if self.phase != "ready":
            self.phase = "ready"
            self.bar = None
            self.hint = None
        self._recovered(line)

    def serving_data_of(self, raw: bytes, line: int) -> None:
        """serving_data() for a segment known to be a serving-stats line (see _classify_template)."""
        if b"\x1b" in raw:
            raw = _ANSI.sub(b"", raw)
        stats = parse_serving_stats_line(_strip_prefixes(raw.decode("utf-8", "replace"))[0].strip())
        if stats:
            self.serving_data(stats, line)

    def serving_data(self, stats: dict[str, float], line: int) -> None:
        """The numbers of one serving-stats line: merged values, the spec-decode window, KV pressure."""
        self.serving.update(stats)
        if "spec_accept_len" in stats or "spec_accept_rate" in stats:
            self.spec_recent.append((stats.get("spec_accept_len"), stats.get("spec_accept_rate")))
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
                self.warnings["spec_decode_ineffective"] = LogWarning(
                    "spec_decode_ineffective", line,
                    "speculative decoding accepts almost nothing (" + ", ".join(parts) + ") — it is likely "
                    "slower than no speculation; check the draft model matches the target, or turn it off")
            else:
                self.warnings.pop("spec_decode_ineffective", None)
        kv, waiting = self.serving.get("kv_cache_pct"), self.serving.get("waiting")
        if kv is not None and kv >= 95.0 and waiting:
            self.warnings["kv_cache_pressure"] = LogWarning(
                "kv_cache_pressure", line, f"KV cache {kv:.0f}% full with {waiting:.0f} requests waiting")

    # ------------------------------------------------------------------ failures

    def _failure(self, body: str, level: Optional[str], indent: int, line: int) -> None:
        if _FRAME.match(body):
            self.last_frame_line = line
            return
        if body.startswith("usage:"):
            self.usage_line = line
            return
        # Source lines quoted inside a traceback (`raise RuntimeError("NCCL error …")`) are not errors.
        if indent >= _CODE_INDENT and line - self.last_frame_line <= 40:
            return
        if body[0] in "^~":
            return
        if level in _NOT_FAILURE_LEVELS:
            return
        cand = self._classify(body, level, line)
        if cand is None:
            return
        if cand.spec >= 2:
            if self.best is None or cand.spec > self.best.spec:
                self.best = cand
        elif cand.spec == 1:
            if self.first_low is None:
                self.first_low = cand
        elif self.first_weak is None:
            self.first_weak = cand
        if cand.spec >= 1 and self.progress_at_failure is None:
            self.advances_since_failure = 0
            self.progress_at_failure = self.last_progress_key or ((), 0)

    def _classify(self, body: str, level: Optional[str], line: int) -> Optional[_Candidate]:
        msg = body[:MAX_MESSAGE]
        building = self.phase == "building"

        if "Xid" in body:
            x = _XID.search(body)
            code = int(x.group(1)) if x else None
            if code in _XID_NOISE:
                return None
            if code in _XID_APP:
                return _Candidate(2, "cuda_error", line, msg, "cuda_error")
            return _Candidate(3, "gpu_fault", line, msg, "gpu_fault")
        if body.startswith("NVRM:"):
            self.nvrm.append((line, body))
            if _GPU_FAULT.search(body):
                start, parts = line, []
                for ln, txt in reversed(self.nvrm):
                    if ln != start - 1 and ln != line:
                        break
                    parts.append(txt[5:].strip())
                    start = ln
                    if "The NVIDIA GPU" in txt or "GPU at PCI" in txt:
                        break
                return _Candidate(3, "gpu_fault", start, " ".join(reversed(parts))[:MAX_MESSAGE], "gpu_fault")
            return None
        if _GPU_FAULT.search(body):
            return _Candidate(3, "gpu_fault", line, msg, "gpu_fault")
        if _CUDA_OOM.search(body) or ("out of memory" in body and "CUDA" in body):
            key = "cuda_oom_capture" if self.phase == "capturing" or "graph" in body.lower() else "cuda_oom"
            return _Candidate(3, "cuda_oom", line, msg, key)
        if _HOST_OOM.search(body):
            if "ptxas" in body and "signal 9" not in body:
                return _Candidate(3, "build_failed", line, msg, "build_segfault")
            key = "host_oom_build" if building or _is_build_tool(body) else "host_oom"
            return _Candidate(3, "host_oom", line, msg, key)
        if "out of memory" in body:
            if building or "cc1plus" in body or "allocating" in body:
                return _Candidate(3, "host_oom", line, msg, "host_oom_build")
            return _Candidate(3, "cuda_oom", line, msg, "cuda_oom")
        if _CUDA_ERR.search(body):
            key = "cuda_error_arch" if "no kernel image" in body else "cuda_error"
            return _Candidate(3, "cuda_error", line, msg, key)
        if _NCCL.search(body):
            key = "nccl"
            if "timeout" in body.lower() or "timed out" in body:
                key = "nccl_first" if "SeqNum=1," in body or "last completed NCCL work: 0" in body else "nccl_timeout"
            return _Candidate(3, "nccl", line, msg, key)
        if _HANG.search(body):
            return _Candidate(3, "hang", line, msg, "hang")
        exc = _EXC_LINE.match(body)
        if _IMPORT.search(body) or (exc and exc.group("type").split(".")[-1] in ("ImportError", "ModuleNotFoundError")):
            if exc and not (exc.group("msg") or "").strip():
                return _Candidate(1, "import_error", line, msg, "import_error")
            key = "import_error_abi" if ("undefined symbol" in body or "GLIBC" in body) else "import_error"
            return _Candidate(3, "import_error", line, msg, key)
        if "error:" in body or body.startswith("Error: "):
            if _BAD_ARGS.search(body) and (line - self.usage_line <= 60 or "unrecognized arguments" in body
                                           or "arguments are required" in body or body.startswith("Error: ")):
                return _Candidate(3, "bad_arguments", line, msg, "bad_arguments")
        if _BUILD_SPECIFIC.search(body):
            key = "build_segfault" if "died due to signal" in body else "build_failed"
            return _Candidate(3, "build_failed", line, msg, key)
        if _BUILD_UMBRELLA.search(body):
            return _Candidate(1, "build_failed", line, msg, "build_failed")
        if _ENGINE_UMBRELLA.search(body):
            if body.startswith("Traceback"):
                key = "exception_traceback"
            elif "Traceback" in body or "hit an exception" in body:
                key = "exception_below"
            else:
                key = "exception_umbrella"
            return _Candidate(1, "build_failed" if building else "exception", line, msg,
                              "build_failed" if building else key)
        if _CRASH.search(body):
            return _Candidate(2, "build_failed" if building else "exception", line, msg,
                              "build_failed" if building else "exception_crash")
        if exc is not None and level not in ("WARNING", "WARN"):
            etype = exc.group("type").split(".")[-1]
            if etype in ("SyntaxError", "IndentationError", "TabError"):
                return _Candidate(3, "syntax_error", line, msg, "syntax_error")
            if etype == "KeyboardInterrupt":
                return _Candidate(2, "exception", line, msg, "exception_interrupt")
            if building:
                return _Candidate(2, "build_failed", line, msg, "build_failed")
            return _Candidate(2, "exception", line, msg, "exception")
        if level in ("ERROR", "CRITICAL", "FATAL"):
            return _Candidate(0, "exception", line, msg, "exception_umbrella")
        return None

    def _recovered(self, line: int) -> None:
        cand = self.best or self.first_low
        if cand is not None:
            self.warnings["error_recovered"] = LogWarning(
                "error_recovered", cand.line,
                f"{cand.cause} logged at line {cand.line} but the job carried on: {cand.message}"[:MAX_MESSAGE])
        self.best = self.first_low = self.first_weak = None
        self.progress_at_failure = None
        self.advances_since_failure = 0

    def failure(self) -> Optional[Failure]:
        if self.best is not None:
            c = self.best
        elif self.first_low is not None:
            c = self.first_low
            # The umbrella says "see above": the first ERROR line above it is the root cause.
            if self.first_weak is not None and self.first_weak.line < c.line:
                w = self.first_weak
                c = _Candidate(1, c.cause, w.line, w.message, c.hint_key)
        else:
            return None
        return Failure(cause=c.cause, line=c.line, message=c.message, hint=_HINTS[c.hint_key])

    # ------------------------------------------------------------------ warnings

    def _warnings(self, body: str, line: int) -> None:
        if _OOM_RISK.search(body):
            if "ninja" in body:
                text = "MAX_JOBS is not set: ninja runs one compiler per core (nvcc can take several GB each) — set MAX_JOBS"
            elif "make -j" in body or "nproc" in body:
                text = "unbounded build parallelism (-j without a limit) — pass -jN sized to free RAM / ~4 GB per job"
            else:
                text = f"the build is short of host memory: {body[:200]}"
            self.warnings["oom_risk"] = LogWarning("oom_risk", line, text)
        elif _KV_PRESSURE.search(body):
            self.warnings["kv_cache_pressure"] = LogWarning(
                "kv_cache_pressure", line, f"KV cache full, requests preempted/retracted: {body[:200]}")
        elif _JIT.search(body) and "jit_compile" not in self.warnings:
            self.warnings["jit_compile"] = LogWarning(
                "jit_compile", line, "kernels are JIT-compiled on first use (no prebuilt kernels): the next "
                "steps can be silent for minutes without being stuck")

    # ------------------------------------------------------------------ result

    def result(self) -> LogAnalysis:
        failure = self.failure()
        engine = self.engine()
        if failure is not None:
            phase = "failed"
        elif self.phase:
            phase = self.phase
        else:
            phase = "starting" if engine else "unknown"
        serving = None
        if self.serving:
            serving = ServingNumbers(**{k: self.serving.get(k) for k in SERVING_KEYS})
        warnings = tuple(sorted(self.warnings.values(), key=lambda w: (w.line, w.code)))
        return LogAnalysis(engine=engine, phase=phase, progress=self.progress(), failure=failure,
                           ready_line=self.ready_line, serving=serving, warnings=warnings)


def _label_phase(label: str) -> Optional[str]:
    """The phase a progress bar's label names, or None for an unlabeled/unknown bar."""
    low = label.lower()
    if "captur" in low or "graph" in low:
        return "capturing"
    for word in ("load", "checkpoint", "shard", "weight", "download", "fetch"):
        if word in low:
            return "loading"
    if "compil" in low or "autotun" in low or "warm" in low:
        return "compiling"
    for word in ("train", "epoch", "step", "iter"):
        if word in low:
            return "training"
    if "build" in low or "ninja" in low:
        return "building"
    return None


_SERIES_LABELS: dict[str, str] = {}


def _series_label(label: str) -> str:
    """A label with its changing parts (numbers, parenthesised state) removed: one bar, one series."""
    key = _SERIES_LABELS.get(label)
    if key is None:
        if len(_SERIES_LABELS) >= 1024:
            _SERIES_LABELS.clear()
        key = _SERIES_LABELS[label] = re.sub(r"[\d.]+", "#", re.sub(r"\([^)]*\)", "", label)).strip()
    return key


def _is_build_tool(body: str) -> bool:
    return any(t in body for t in ("cicc", "cudafe", "cc1plus", "nvcc", "ptxas", "c++:", "g++", "gcc", "ninja",
                                   "make", "ld ", "fatbinary"))


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
# codes, exit/signal numbers, collect2) — tests/test_analyze_fast.py checks that no other
# pattern names a digit. The anchor "signal 9" names one too: templates with "signal 0"
# are re-filtered per segment. Value-dependent verdicts (argparse usage proximity, V0
# spec-decode token counts, step/epoch arithmetic, timestamped build steps, KV-cache
# thresholds) send segments to full examination as well.
# LogAnalyzer(exhaustive=True) examines every anchored segment; tests compare the two.

_NORMALIZE = bytes.maketrans(b"0123456789\r", b"0000000000\n")
_DIGIT_VALUE_WORDS = ("Xid", "exit", "signal", "collect")
_DIGIT_ANCHOR = b"signal 9"
_DIGIT_ANCHOR_TEMPLATE = b"signal 0"
assert [lit for lit in _FAMILY if set(lit) & set(b"0123456789")] == [_DIGIT_ANCHOR]

K_INERT, K_BAR, K_BAR_GLUED, K_BUILD, K_SERVING, K_OTHER, K_GIANT, K_REFILTER = range(8)
_SERVING_BIT = {key: 1 << i for i, key in enumerate(SERVING_KEYS)}
_ALL_SERVING_BITS = (1 << len(SERVING_KEYS)) - 1
_SPEC_BITS = _SERVING_BIT["spec_accept_rate"] | _SERVING_BIT["spec_accept_len"]
_NO_WEAK: frozenset = frozenset()
_NO_HITS = (False, False, _NO_WEAK)
TEMPLATE_KEY_MAX = 2048                 # longer segments are classified each time, not remembered
TEMPLATE_CACHE_BYTES = 4 * 1024 * 1024  # bound on remembered template bytes (memory stays flat)
TEMPLATE_ONE_OFFS_MAX = 256             # more one-off templates than this in a chunk: see LogAnalyzer._learn
_RUN_GROUPS: dict = {}
_SKIP_GROUP = ("skip",)


class _Template:
    """What examining any segment of one template can do (see _classify_template)."""
    __slots__ = ("fams", "kind", "named", "keys", "strong", "path", "weak", "group")

    def __init__(self, fams: int, kind: int, named: Optional[str] = None, keys: int = 0,
                 hits: tuple[bool, bool, frozenset] = _NO_HITS) -> None:
        self.fams = fams
        self.kind = kind
        self.named = named          # K_BAR / K_BAR_GLUED: the phase the bar's label names (None: unnamed)
        self.keys = keys            # K_SERVING: bit set of the SERVING_KEYS the line provides
        self.strong, self.path, self.weak = hits   # what _engine() would find in it (engine not yet known)
        # Consecutive segments with one group key are handled together: a run of redraws of
        # bars naming one phase, of build steps, of stats lines. Anything else, and anything
        # that may teach the engine, is its own group (handled one segment at a time).
        if hits == _NO_HITS and kind in (K_BAR, K_BUILD, K_SERVING):
            self.group = _RUN_GROUPS.setdefault((kind, named), (kind, named))
        else:
            self.group = self


_GIANT_TEMPLATE = _Template(P | S | M | F | W | E, K_GIANT)
_REFILTER_TEMPLATE = _Template(P | S | M | F | W | E, K_REFILTER)
_PROBE = _State()   # only ever asked _classify() on non-NVRM lines, which reads but never writes it


def _engine_hits(text: str, body: str) -> tuple[bool, bool, frozenset]:
    """What _State._engine(text, body) would look at, independent of what is already known."""
    strong = _ENGINE_STRONG.search(text.lstrip()) is not None or _ENGINE_STRONG.search(body) is not None
    path = _ENGINE_PATH.search(body) is not None
    weak = frozenset(engine + rx.pattern for rx, engine, _ in _ENGINE_WEAK if rx.search(body))
    return strong, path, weak


def _progress_kind(body: str, ts: Optional[tuple[str, str]]) -> int:
    """Mirror of _State._progress_record's branches: K_INERT (does nothing), K_BUILD (ninja/make step), K_OTHER."""
    c = body[0]
    if c == "[" and (_NINJA.match(body) or _MAKE.match(body)):
        return K_BUILD if ts is None else K_OTHER        # a timestamp feeds a rate: every line counts
    if c == "{" and (_LOSS_DICT.match(body) or _TRAIN_END.match(body)):
        return K_OTHER
    if "Num" in body or "optimization" in body:
        return K_OTHER if (_NUM_EPOCHS.search(body) or _TOTAL_STEPS.search(body)) else K_INERT
    if not ("tep" in body or "TEP" in body or "ter" in body or "poch" in body or "POCH" in body):
        return K_INERT
    return K_OTHER if (_STEP.search(body) or _EPOCH.search(body)) else K_INERT


def _failure_inert(body: str, level: Optional[str]) -> bool:
    """True if _State._failure(body, level, …) changes nothing, whatever the state and the digits."""
    if _FRAME.match(body) or body.startswith("usage:"):
        return False
    if body[0] in "^~" or level in _NOT_FAILURE_LEVELS:
        return True
    if body.startswith("NVRM:") or any(w in body for w in _DIGIT_VALUE_WORDS) or _BAD_ARGS.search(body):
        return False                                  # digit- or state-dependent verdicts
    return _PROBE._classify(body, level, 0) is None


def _classify_template(tpl: bytes, engine_known: bool) -> Union[int, _Template]:
    """0 for a template the prefilter skips, else what examining it can do. Mirrors _State.examine."""
    if len(tpl) > GIANT_SEGMENT:
        return _GIANT_TEMPLATE
    if _DIGIT_ANCHOR_TEMPLATE in tpl:
        return _REFILTER_TEMPLATE                     # "signal 9" is an anchor, "signal 1" is not
    rx = _prefilter_in(tpl, engine_known)
    m = rx.search(tpl)
    if m is None:
        return 0
    fams = _families_in(rx, tpl, m, len(tpl))
    raw = _ANSI.sub(b"", tpl) if b"\x1b" in tpl else tpl
    text = raw.decode("utf-8", "replace")
    no_hits = _NO_HITS
    if fams & P and "%" in text:                      # _examine_text: a tqdm bar
        m = _TQDM.search(text)
        if m is not None:
            label = _strip_prefixes(text[:m.start()].strip())[0].strip().rstrip(":").strip()[:100]
            hits = no_hits if engine_known else _engine_hits(label, label)
            kind = K_BAR_GLUED if text[m.end():].strip() else K_BAR
            return _Template(fams, kind, named=_label_phase(label), hits=hits)
    msg, level, ts = _strip_prefixes(text)            # _record
    body = msg.strip()
    if not body:
        return 0                                      # _record returns before anything
    hits = no_hits if engine_known else _engine_hits(text, body)
    if fams & S:
        stats = parse_serving_stats_line(body)
        if stats:
            if "Avg prompt throughput" not in body and "acceptance" in body:
                rate = _VLLM_SPEC_RATE.search(body)
                if rate and not rate.group(2):
                    return _Template(fams, K_OTHER)   # V0 spec metrics: which keys depends on token counts
            keys = 0
            for key in stats:
                keys |= _SERVING_BIT[key]
            return _Template(fams, K_SERVING, keys=keys, hits=hits)
    if fams & M and _MARKERS.search(body):
        return _Template(fams, K_OTHER)
    kind = _progress_kind(body, ts) if fams & P else K_INERT
    if kind == K_OTHER:
        return _Template(fams, K_OTHER)
    if fams & F and not _failure_inert(body, level):
        return _Template(fams, K_OTHER)
    if fams & W and (_OOM_RISK.search(body) or _KV_PRESSURE.search(body) or _JIT.search(body)):
        return _Template(fams, K_OTHER)
    if kind == K_INERT and hits == no_hits:
        return 0
    return _Template(fams, kind, hits=hits)


def _prefilter_one_offs(templates: list[bytes], engine_known: bool) -> dict[bytes, Union[int, _Template]]:
    """0 or a K_OTHER template (examined in full) for each of many templates, with one prefilter pass over all."""
    out: dict[bytes, Union[int, _Template]] = {}
    batch = []
    for tpl in templates:
        if len(tpl) > GIANT_SEGMENT or _DIGIT_ANCHOR_TEMPLATE in tpl:
            out[tpl] = _classify_template(tpl, engine_known)
        else:
            out[tpl] = 0
            batch.append(tpl)
    joined = b"\n".join(batch)
    ends = list(accumulate(len(tpl) + 1 for tpl in batch))      # just past each template's separator
    rx = _prefilter_in(joined, engine_known)
    search = rx.search
    pos = 0
    while True:
        m = search(joined, pos)
        if m is None:
            break
        k = bisect_right(ends, m.start())
        stop = ends[k] - 1
        out[batch[k]] = _Template(_families_in(rx, joined, m, stop), K_OTHER)
        pos = stop + 1
    return out


# A chunk is "KV-safe" when none of its stats lines can raise kv_cache_pressure (KV use >= 95 %):
# every "usage:" in it is followed by a plainly small number. Otherwise its stats lines are
# all examined in full, because that warning keeps the line of the last line that raised it.
_KV_UNSAFE_USAGE = re.compile(
    rb"usage:(?!(?<=cache usage:) ?(?:\d|[1-8]\d|9[0-4])(?:\.\d{1,6})?(?![\d.])"
    rb"|(?<=token usage:) ?(?:0|0?\.(?:[0-8]\d{0,5}|9[0-4]\d{0,4}))(?![\d.]))")


def _kv_safe(data: bytes, state: "_State") -> bool:
    kv = state.serving.get("kv_cache_pct")
    return (kv is None or kv < 95.0) and _KV_UNSAFE_USAGE.search(data) is None


# --------------------------------------------------------------------------- the incremental reader


class LogAnalyzer:
    """Feed it bytes as they arrive; ask result() at any time.

    Work per feed() is proportional to the new bytes. Memory is bounded: a partial
    line is kept up to GIANT_SEGMENT bytes, then only its head and a rolling tail.
    """

    def __init__(self, *, exhaustive: bool = False) -> None:
        # exhaustive=True examines every anchored segment (the reference the fast scanner is tested against)
        self.exhaustive = exhaustive
        self._state = _State()
        self._templates: tuple[dict, dict] = ({}, {})   # per "engine known": template -> 0 | _Template
        self._template_bytes = 0
        self._tail = b""                 # the incomplete segment (< GIANT_SEGMENT bytes)
        self._giant_head: Optional[bytes] = None
        self._giant_tail = b""
        self._line = 1                   # physical line number of the incomplete segment
        self.bytes_fed = 0
        # A leading block of `#` lines is an annotation (an excerpt's `# source:` / `# expect:`
        # header), not output: its lines are counted but not read. None once the header is over.
        self._header: Optional[bytes] = b""

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
            data = self._skip_annotation_header(data)
            if not data:
                return
        if self._giant_head is not None:
            data = self._feed_giant(data)
            if data is None:
                return
        buf = self._tail + data if self._tail else data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        if end:
            self._scan(buf, end)
        rest = buf[end:]
        if len(rest) > GIANT_SEGMENT:
            self._giant_head = rest[:HEAD_BYTES]
            self._giant_tail = rest[-TAIL_BYTES:]
            self._tail = b""
        else:
            self._tail = bytes(rest)

    def _skip_annotation_header(self, data: bytes) -> bytes:
        """Blank the leading `#` lines (keeping their newlines, so line numbers hold); the same
        whatever the chunking, since an undecided first line waits for its newline."""
        buf = self._header + data
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

    def _feed_giant(self, data: bytes) -> Optional[bytes]:
        nl, cr = data.find(b"\n"), data.find(b"\r")
        cut = min(x for x in (nl, cr) if x >= 0) if (nl >= 0 or cr >= 0) else -1
        if cut < 0:
            self._giant_tail = (self._giant_tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
            return None
        self._giant_tail = (self._giant_tail + data[max(0, cut - TAIL_BYTES):cut])[-TAIL_BYTES:]
        self._examine_giant(self._giant_head, self._giant_tail, self._line)
        self._giant_head, self._giant_tail = None, b""
        if data[cut] == 0x0A:
            self._line += 1
        return data[cut + 1:]

    def _examine_giant(self, head: bytes, tail: bytes, line: int) -> None:
        # A giant segment is judged by its two ends only, the same way whether it arrived whole or in pieces.
        for part in (head, tail):
            rx = _prefilter_in(part, self._state.engine_strong is not None)
            m = rx.search(part)
            if m is not None:
                self._state.examine(part, line, _families_in(rx, part, m, len(part)))

    def _scan(self, buf: bytes, end: int) -> None:
        """Examine (or prove irrelevant) every complete segment of buf[:end] (buf[end-1] is a separator)."""
        if self.exhaustive:
            self._scan_exhaustive(buf, end)
            return
        rest: Optional[bytes] = buf
        while rest is not None:
            rest = self._scan_templates(rest)

    def _scan_templates(self, data: bytes) -> Optional[bytes]:
        """The fast scanner over the complete segments of data (what follows its last separator is
        left alone); returns what is left to scan when the engine became known, else None.

        Per segment it does C-level work only (translate, split, dict lookups, grouping);
        Python runs per group of consecutive segments that can matter. Within the chunk, a
        run of tqdm redraws or build steps is reduced to its last member (each overwrites the
        previous one's effect), a run of stats lines to one ready mark plus, at the end, the
        lines whose numbers no later line overwrites; templates proven inert are skipped.
        Everything else is examined as the exhaustive scanner would, in order.
        """
        state = self._state
        engine_known = state.engine_strong is not None
        templates = self._templates[engine_known]
        segs = data.translate(_NORMALIZE).split(b"\n")
        segs.pop()                                    # the incomplete segment after the last separator
        infos = list(map(templates.get, segs))
        if None in infos:
            infos = self._learn(segs, infos, templates, engine_known)
        sel = list(compress(range(len(segs)), infos))
        base = self._line
        has_cr = b"\r" in data
        if not sel:
            self._line = base + (data.count(b"\n") if has_cr else len(segs))
            return None
        ends = list(accumulate(map(len, segs)))       # ends[i] + i: offset just past segment i
        # Line numbers: a segment's index when no \r splits lines, else \n counted from a cursor
        # that follows the examined segments (deferred lines lie a little behind it).
        cursor = [0, base]

        def where(i: int) -> tuple[int, int]:
            start = ends[i] - len(segs[i]) + i
            if not has_cr:
                return start, base + i
            off, line = cursor
            if start < off:
                return start, line - data.count(b"\n", start, off)
            line += data.count(b"\n", off, start)
            cursor[0], cursor[1] = start, line
            return start, line

        run_kind = K_INERT        # K_BAR / K_BUILD while a run awaits its last member
        run_named: Optional[str] = None
        run_len = run_last = 0
        serving_run = False       # a ready mark was applied and nothing was examined since
        deferred: list[tuple[int, int]] = []   # (first, last) positions in sel of stats-line groups
        kv_safe: Optional[bool] = None
        now_unset = state.now is None

        def examine(i: int) -> None:
            start, line = where(i)
            stop = start + len(segs[i])
            kind = infos[i].kind
            if kind == K_GIANT:
                self._examine_giant(data[start:start + HEAD_BYTES], data[stop - TAIL_BYTES:stop], line)
                return
            raw = data[start:stop]
            fams = infos[i].fams
            if kind == K_REFILTER:
                rx = _prefilter_in(raw, state.engine_strong is not None)
                m = rx.search(raw)
                if m is None:
                    return
                fams = _families_in(rx, raw, m, len(raw))
            state.examine(raw, line, fams)

        def flush_run() -> None:
            nonlocal run_kind, serving_run
            state.seq += run_len - 1                  # the dropped members' progress updates
            examine(run_last)
            run_kind = K_INERT
            serving_run = False

        def flush_deferred() -> None:
            # Keep each line that provides a number no later line provides, and the last
            # SPEC_WINDOW spec-decode lines (their mean is judged); apply them in order.
            covered, spec_left, keep = 0, SPEC_WINDOW, []
            for first, last in reversed(deferred):
                for q in range(last, first - 1, -1):
                    keys = infos[sel[q]].keys
                    need = keys & ~covered
                    if keys & _SPEC_BITS and spec_left:
                        spec_left -= 1
                        need = 1
                    if need:
                        keep.append(sel[q])
                        covered |= keys
                        if covered == _ALL_SERVING_BITS and not spec_left:
                            break
                else:
                    continue
                break
            for i in reversed(keep):
                start, line = where(i)
                state.serving_data_of(data[start:start + len(segs[i])], line)
            deferred.clear()

        if engine_known:
            groups = list(map(attrgetter("group"), map(infos.__getitem__, sel)))
        else:
            groups = [self._group_now(infos[i]) for i in sel]
        # Where the group changes (C-level): consecutive members of one group are handled together.
        bounds = list(compress(range(1, len(sel)), map(is_not, islice(groups, 1, None), groups)))
        bounds.append(len(sel))
        next_first = 0
        for bound in bounds:
            first, last, next_first = next_first, bound - 1, bound
            group = groups[first]
            info = infos[sel[first]]
            kind = info.kind
            if group is _SKIP_GROUP:
                continue
            if group is not info:                     # a run group (no engine to learn from it)
                if kind == K_SERVING:
                    if kv_safe is None:
                        kv_safe = _kv_safe(data, state)
                    if kv_safe:
                        if run_kind:
                            flush_run()
                        if not serving_run:
                            state.ready_mark(0)       # its line is unused: a recovery names the error's line
                            serving_run = True
                        deferred.append((first, last))
                        continue
                else:
                    if run_kind:
                        flush_run()
                    # A member's effect is overwritten by the next one's when nothing else depends
                    # on it: no clock-based rate, no error waiting for progress, a phase that is a
                    # fixed point (a loading bar may complete the load, turning later bars into capture).
                    if now_unset and state.progress_at_failure is None and (
                            kind == K_BUILD or (info.named or state._unnamed_bar_phase()) != "loading"):
                        run_kind, run_named, run_len, run_last = kind, info.named, last - first + 1, sel[last]
                        continue
            for q in range(first, last + 1):          # one segment at a time, as the exhaustive scanner
                i = sel[q]
                if not engine_known and group is info and info.kind != K_OTHER and self._absorbed(info):
                    if info.kind == K_INERT:
                        continue
                if kind == K_BAR_GLUED and run_kind == K_BAR and run_named == info.named:
                    run_kind = K_INERT                # its own bar overwrites the pending run's
                    state.seq += run_len
                if run_kind:
                    flush_run()
                if deferred and info.fams & S:
                    flush_deferred()
                serving_run = False
                examine(i)
                if not engine_known and state.engine_strong is not None:
                    if deferred:
                        flush_deferred()
                    start, line = where(i)
                    rest = start + len(segs[i]) + 1
                    self._line = line + (data[rest - 1] == 0x0A)
                    return data[rest:]
        if run_kind:
            flush_run()
        if deferred:
            flush_deferred()
        self._line = base + len(segs) if not has_cr else cursor[1] + data.count(b"\n", cursor[0])
        return None

    def _absorbed(self, info: _Template) -> bool:
        """True if examining a segment of this template can no longer teach the engine anything."""
        state = self._state
        return (state.engine_strong is not None or not info.strong and (not info.path or state.engine_path is not None)
                and info.weak <= state.weak_seen)

    def _group_now(self, info: _Template) -> Any:
        """info.group, or for a template with engine hits already absorbed the group it would have without them."""
        if info.group is not info or info.kind not in (K_INERT, K_BAR, K_BUILD, K_SERVING) or not self._absorbed(info):
            return info.group
        if info.kind == K_INERT:
            return _SKIP_GROUP
        return _RUN_GROUPS.setdefault((info.kind, info.named), (info.kind, info.named))

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
            self._template_bytes = 0
            new = Counter(segs)
        else:
            new = Counter(compress(segs, map(is_, infos, repeat(None))))
        transient: dict[bytes, Union[int, _Template]] = {}
        if len(new) > TEMPLATE_ONE_OFFS_MAX:
            one_offs = [tpl for tpl, n in new.items() if n == 1]
            if len(one_offs) > TEMPLATE_ONE_OFFS_MAX:
                transient = _prefilter_one_offs(one_offs, engine_known)
        for tpl in new:
            if tpl in transient:
                continue
            info = _classify_template(tpl, engine_known)
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

    def _scan_exhaustive(self, buf: bytes, end: int) -> None:
        """The reference scanner: examine every complete segment of buf[:end] that has an anchor hit."""
        line = self._line
        counted = 0
        pos = 0
        next_nl = next_cr = -1
        has_cr = b"\r" in buf
        state = self._state
        engine_known = state.engine_strong is not None
        rx = _prefilter_in(buf, engine_known)
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
                state.examine(buf[start:stop], line, _families_in(rx, buf, m, stop))
            pos = stop + 1
            if not engine_known and state.engine_strong is not None:
                engine_known = True
                rx = _prefilter_in(buf, True)
                search = rx.search
        line += count(b"\n", counted, end)
        self._line = line

    def finish(self) -> None:
        """The stream ended: the last, unterminated line counts as a line."""
        if self._giant_head is not None:
            self._examine_giant(self._giant_head, self._giant_tail, self._line)
            self._giant_head, self._giant_tail = None, b""
        elif self._tail:
            tail = self._tail
            rx = _prefilter_in(tail, self._state.engine_strong is not None)
            m = rx.search(tail)
            if m is not None:
                self._state.examine(tail, self._line, _families_in(rx, tail, m, len(tail)))
            self._tail = b""

    def result(self) -> LogAnalysis:
        """The analysis of everything fed so far, the unterminated last line included (tentatively)."""
        if self._giant_head is None and not self._tail:
            return self._state.result()
        probe = copy.copy(self)
        probe._state = copy.deepcopy(self._state)
        probe.finish()
        return probe._state.result()


def analyze_file(path: Any, chunk_size: int = READ_CHUNK, *, exhaustive: bool = False) -> LogAnalysis:
    """Analyze a whole log file, reading it in chunks (memory stays flat whatever its size)."""
    analyzer = LogAnalyzer(exhaustive=exhaustive)
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(chunk_size)
            if not chunk:
                break
            analyzer.feed(chunk)
    analyzer.finish()
    return analyzer.result()


def analyze_bytes(data: bytes) -> LogAnalysis:
    """Analyze an in-memory log (tests, small excerpts)."""
    analyzer = LogAnalyzer()
    analyzer.feed(data)
    analyzer.finish()
    return analyzer.result()
