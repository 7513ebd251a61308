"""The signatures: byte anchors of the prefilter, record prefixes, progress/serving/engine/phase/failure patterns and hints."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Optional, Union

from .model import E, F, M, Number, P, S, W
from . import regexcache


# The words a training step is counted by (STEP), each one an anchor too (nanoGPT's `iter 100: loss
# 2.34` was never read: "iteration" was an anchor, "iter" not).
STEP_WORDS = ("step", "Step", "STEP", "iter", "Iter", "iteration", "Iteration")
# How a traceback's final exception line names its type: the endings EXC_LINE accepts, each one an
# anchor too (a type the anchors missed was never read: `triton...OutOfResources: out of resource`).
EXCEPTION_TYPE_ENDINGS = ("Error", "Exception", "Interrupt", "Fault", "Failed", "OutOfResources", "TimeoutExpired",
                          "NotFound", "Timeout")  # BackendCompilerFailed (dynamo), subprocess.TimeoutExpired,
#                                                   TemplateNotFound, requests' / httpx's ReadTimeout and ConnectTimeout


def training_shaped(body: str) -> bool:
    """A step or epoch count beside a loss (or a learning rate: DeepSpeed's `step=100, skipped=0, lr=[1e-05]`)
    is a training step's line; a bare count of something else is not."""
    return "loss" in body or "Loss" in body or "lr=" in body or "learning_rate" in body


# --------------------------------------------------------------------------- the byte-level prefilter

# Every segment that can change the analysis contains one of these anchors; each names
# the families of handlers its segment needs (P progress, S serving, M phase markers,
# F failures, W warnings, E engine). Python's regex engine tries the alternation at
# every byte that can start an anchor, so anchors start with bytes that are rare in
# logs (capitals, punctuation); those made of common lowercase letters join the pattern
# only for chunks that contain them (an exact `in` check, so which segments are
# examined never depends on how the bytes were chunked). No ^ anchors: a segment can
# start after \r as well as after \n.
_RARE_ANCHORS: list[tuple[bytes, int]] = [
    # failures
    (b"Error", F), (b"ERROR", F), (b"xception", F), (b"Traceback", F), (b"Killed", F), (b"killed", F),
    (b"SIGKILL", F), (b"SIGSEGV", F),
    (b"SIGBUS", F), (b"SIGABRT", F), (b"SIGILL", F), (b"SIGFPE", F), (b"NCCL", F), (b"Xid", F), (b"NVRM", F),
    (b"Watchdog", F), (b"watchdog", F), (b"GPU is lost", F), (b"fallen off the bus", F), (b"ncorrectable ECC", F),
    (b"GPU requires reset", F),
    (b"CUDA", F), (b"xit code", F), (b"xit status", F), (b"xited with", F), (b"xit Code", F), (b"xit Status", F),
    (b"xit_code", F), (b"xit_status", F), (b"xitCode", F), (b"quit", F), (b"Out of memory", F),
    (b"-kill", F), (b"FAILED", F), (b"Failed", F), (b"Segmentation fault", F), (b"(core dumped", F),
    (b"GLIBC", F), (b"FATAL", F), (b"CRITICAL", F), (b"_alloc", F | W), (b"Cannot allocate", F | W),
    (b"xhausted", F | W), (b"Interrupt", F), (b"File \"", F), (b"Timeout", F), (b"Not enough memory", F),
    (b"No available memory", F), (b"No module named", F), (b"Aborted", F), (b"Fatal", F),
    (b"EngineDead", F), (b"Did not receive", F), (b"EngineCore", F | E),
    (b"No CUDA GPUs", F), (b"NVIDIA driver", F), (b"Repository Not Found", F), (b"No space left", F),
    (b"Disk quota", F), (b"PytorchStreamWriter", F), (b"No solution found", F), (b"ResolutionImpossible", F),
    (b"CMake Error", F | M),
    (b"ptxas", F), (b"ninja: build stopped", F),
    # phases
    (b"Load weight", M), (b"Loading", M | P), (b"Loaded", M), (b"Model loading", M), (b"Starting", M),
    (b"Started", M), (b"Compiling", M), (b"Compile and warm", M), (b"Dynamo", M), (b"_compile", M), (b".compile", M), (b"Captur", M | P),
    (b"Capture", M), (b"Graph captur", M), (b"KV cache", M | W), (b"KV Cache", M), (b"Memory pool", M),
    (b"API server", M), (b"Application startup", M), (b"Waiting for application", M), (b"Uvicorn", M),
    (b"The server is fired", M), (b"Available", M), (b"Building", M), (b"Configuring", M), (b"-- The C", M),
    (b"build_ext", M), (b"scikit-build", M), (b"Running training", M | P), (b"Num Epochs", P), (b"Num epochs", P),
    (b"Total optimization", P), (b"JIT", M | W), (b"Prebuilt", M | W), (b"MAX_JOBS", W), (b"Allowing ninja", W),
    (b"Emitting ninja", M), (b"Linking", M), (b"Initializing a V", M | E), (b"ServerArgs", M), (b"Server args", M),
    (b"PreemptionMode", W), (b"Retract", W), (b"Cache the graph", M), (b"Prefetching checkpoint", M | P),
    (b"GGUF shard", M), (b"Downloading", M), (b"metadata (", M), (b"requirements to build", M),
    # serving
    (b"Avg prompt", S), (b"Avg generation", S), (b"Decode batch", S | E), (b"Prefill batch", S | E),
    (b"SpecDecoding", S), (b"Speculative metrics", S),
    # progress
    (b"%|", P), (b"% Completed", P), (b"%]", P), (b"Step", P), (b"STEP", P), (b"Epoch", P), (b"EPOCH", P),
    (b"{'", P), (b'{"', P), (b"% ", P), (b"] - ETA", P), (b"AUTOTUNE", M), (b"No available shared memory", F),
    (b"| Fail - ", F), (b"to become healthy", F), (b"store based barrier", F | M), (b"NVSwitch fatal", F),
    (b"instances.preempted", F), (b"Spot ITN", F), (b"Spot Instance Interruption", F), (b"Timeout (", F),
    (b"Failed: Timeout", F), (b".exc.", F),
] + [(ending.encode(), F) for ending in EXCEPTION_TYPE_ENDINGS] + [(w.encode(), P) for w in STEP_WORDS if w[0].isupper()]
_COMMON_ANCHORS: list[tuple[bytes, int]] = [
    (b"error", F), (b"failed", F), (b"out of memory", F | W), (b"signal 9", F), (b"died", F), (b"usage:", F),
    (b"timed out", F), (b"undefined symbol", F), (b"epoch", P), (b"retract", W), (b"preempted", W),
    (b"make -j", W), (b"training ...", M), (b"did not run successfully", F), (b"exitcode", F),
    (b"is dead", F), (b"terminated with", F), (b"after waiting", F), (b"returncode", F), (b"return code", F), (b"return_code", F), (b"fatal", F),
    (b"enable traceback", F), (b"above exception", F), (b"gated repo", F), (b"downloading weights", M), (b"compiler manager cache", M),
] + [(w.encode(), P) for w in STEP_WORDS if w[0].islower()]
# Until the engine is known for sure, every line of an engine's log carries its
# signature (a `(Worker_TP0 pid=…)` prefix, a `[… TP3]` rank tag): look at those too.
_ENGINE_ANCHORS: list[tuple[bytes, int]] = [
    (b"pid=", E), (b"vllm", E), (b"VLLM", E), (b"vLLM", E), (b"sglang", E), (b"SGLang", E), (b"sgl_kernel", E),
    # longer spellings of other anchors: a hit names only the longest literal, so they carry its families too
    (b"Router (", E), (b"Avg prompt", S | E), (b"Capturing CUDA", M | P | E), (b"Capturing cudagraphs", M | P | E),
    (b"Model loading took", M | E),
    # the engine's own startup words (signatures.ENGINES' vllm_startup / sglang_startup): an excerpt without its banner
    (b"LLM engine", E), (b"init engine", E), (b"Maximum concurrency", E), (b" blocks: ", E), (b"KV cache size", E),
    (b"compiled graph", E), (b"[gpu=", E), (b"max_total_num_tokens", E), (b"Init torch distributed", E),
]
def _required_runs(items: Any) -> list[str]:
    """The literal runs every match of a parsed regex sequence contains (inside mandatory groups and
    repeats too; never inside an alternation, an optional part or a case-insensitive group)."""
    from re import _constants as sre  # type: ignore[attr-defined]  # the stdlib parser's opcodes (tests pin the answers)
    runs: list[str] = []
    run: list[str] = []
    for op, av in items:
        if op is sre.LITERAL:
            run.append(chr(av))
            continue
        if run:
            runs.append("".join(run))
            run = []
        if op is sre.SUBPATTERN and not av[1] & re.IGNORECASE:
            runs += _required_runs(av[3])
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT) and av[0] >= 1:
            runs += _required_runs(av[2])
        elif op is sre.ATOMIC_GROUP:
            runs += _required_runs(av)
    if run:
        runs.append("".join(run))
    return runs


def _alternatives(items: Any) -> list[Any]:
    """A parsed regex's top-level alternatives (a pattern that is one group of them, expanded)."""
    from re import _constants as sre  # type: ignore[attr-defined]
    items = list(items)
    if len(items) == 1 and items[0][0] is sre.BRANCH:
        return [alt for branch in items[0][1][1] for alt in _alternatives(branch)]
    if len(items) == 1 and items[0][0] is sre.SUBPATTERN and not items[0][1][1] & re.IGNORECASE:
        return _alternatives(items[0][1][3])
    if len(items) > 1 and items[-1][0] is sre.BRANCH and all(op is sre.LITERAL for op, _ in items[:-1]):
        # The parser factors the alternatives' common first letters out (`Exception…|Error…` is
        # `E(?:xception…|rror…)`): each alternative is that prefix and its branch.
        return [items[:-1] + alt for branch in items[-1][1][1] for alt in _alternatives(branch)]
    return [items]


def row_anchors(rx: Any, have: Any, family: int = F) -> list[bytes]:
    """For each alternative of a row's pattern (a compiled one, or a row's lazy one) that holds none of
    the anchors `have` (literals, or {literal: families}: then only one of `family` counts), the
    longest digit-free literal all its matches contain (10 bytes or more, or 6 with a space in it: one
    short word is everywhere): an anchor, so that no line the row decides is ever skipped by the byte passes."""
    from re import _parser  # type: ignore[attr-defined]  # the stdlib's own regex parser (3.11+)
    parsed = _parser.parse(rx.pattern, getattr(rx, "flags", 0))
    if parsed.state.flags & re.IGNORECASE:
        return []
    families = have if isinstance(have, dict) else dict.fromkeys(have, family)
    out: list[bytes] = []
    for alternative in _alternatives(parsed):
        runs = [piece.encode() for run in _required_runs(alternative) for piece in re.split(r"\d+", run)
                if piece.isascii()]
        if any(lit in run for run in runs for lit in out) or any(
                lit in run and fam & family for run in runs for lit, fam in families.items()):
            continue
        best = max(runs, key=len, default=b"").strip(b" ")
        if len(best) >= 10 or (len(best) >= 6 and b" " in best):   # one short word is everywhere
            out.append(best)
    return out


def _listed_before_rows() -> tuple[list[bytes], dict[bytes, int]]:
    """The listed anchors and their families as they were before the rows' own were adopted."""
    if _BEFORE_ROWS is not None:
        return _BEFORE_ROWS
    return [lit for lit, _ in _RARE_ANCHORS + _COMMON_ANCHORS], dict(FAMILY)


def row_anchor_inputs(rows: list[tuple[Any, int]]) -> str:
    """Everything derive_row_anchors' answer depends on, as one exact string: the rows' patterns, flags and
    families, and the anchors listed before them (the checked-in derived_anchors.py holds the one it was made from)."""
    listed, family_of = _listed_before_rows()
    return repr(([(rx.pattern, getattr(rx, "flags", 0), family) for rx, family in rows], listed, list(family_of.items())))


def derive_row_anchors(rows: list[tuple[Any, int]]) -> list[tuple[bytes, int]]:
    """The (anchor, family) pairs the rows' own literals add ((pattern, family) pairs: F for the failure
    rows, M for the phase markers...), in order: a row's literal already listed for its family adds none."""
    listed_lits, family_of = _listed_before_rows()
    family_of = dict(family_of)
    listed = {lit: family_of[lit] for lit in listed_lits}        # (not the engine's: dropped once known)
    added: list[tuple[bytes, int]] = []
    for rx, family in rows:
        for lit in row_anchors(rx, listed, family):
            family_of[lit] = listed[lit] = family_of.get(lit, 0) | family
            added.append((lit, family))
    return added


def adopt_row_anchors(rows: list[tuple[Any, int]]) -> list[bytes]:
    """Make the rows' own literals anchors of their families, once, before any prefilter is built; returns them.

    Deriving them parses every row's regex (~30 ms at each process start): they are read from the
    generated derived_anchors.py instead where it was made from these very inputs, else derived here."""
    global _BEFORE_ROWS
    if _prefilters or _BEFORE_ROWS is not None:
        raise RuntimeError("adopt_row_anchors twice, or after a prefilter was built: its anchors would be missing there")
    _BEFORE_ROWS = _listed_before_rows()
    from . import derived_anchors
    if derived_anchors.INPUTS == row_anchor_inputs(rows):
        added = list(derived_anchors.ANCHORS)
    else:                                # a row changed: right, only slower (a test says to regenerate)
        added = derive_row_anchors(rows)
    for lit, family in added:
        _RARE_ANCHORS.append((lit, family))
        FAMILY[lit] = FAMILY.get(lit, 0) | family
    return [lit for lit, _ in added]


_NINJA_ANCHOR = rb"\[\d+/\d+\]"           # [12/345]
_COUNT_ANCHOR = rb" \d+/\d"               # a bare counter after its label: "Processing shard 3/8"
_RANK_ANCHOR = rb"TP\d"                   # [2025-… TP3]

FAMILY: dict[bytes, int] = {}
_BEFORE_ROWS: Optional[tuple[list[bytes], dict[bytes, int]]] = None   # (see adopt_row_anchors)
for _lit, _fam in _RARE_ANCHORS + _COMMON_ANCHORS + _ENGINE_ANCHORS:
    FAMILY[_lit] = FAMILY.get(_lit, 0) | _fam


def _family(hit: bytes) -> int:
    fam = FAMILY.get(hit)
    if fam is not None:
        return fam
    return P if hit[:1] in b"[ " else E       # the regex anchors: the counters', the rank tag


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
        specials = [_NINJA_ANCHOR, _COUNT_ANCHOR] + ([_RANK_ANCHOR] if _RANK_ANCHOR in extra else [])
        # (the trie's text is built in Python, ~10 ms: kept with the compiled code, by what it is built of)
        text = regexcache.derived(("trie", tuple(literals), tuple(specials)), lambda: _trie_pattern(literals, specials))
        rx = _prefilters[extra] = regexcache.compile(text)
    return rx


def prefilter_in(data: bytes, engine_known: bool) -> re.Pattern:
    """The prefilter for `data`: rare anchors, plus the common ones `data` actually contains.

    Short data (one segment, a template) gets every anchor instead: the same hits (an anchor
    not in the data cannot match), and one compiled pattern instead of one per combination.
    """
    if len(data) <= 16384:
        return _prefilter_for(_EVERY_ANCHOR[engine_known])
    extra = [lit for lit, _ in _COMMON_ANCHORS if lit in data]
    if not engine_known:
        extra += [lit for lit, _ in _ENGINE_ANCHORS if lit in data]
        extra.append(_RANK_ANCHOR)
    return _prefilter_for(tuple(extra))


_EVERY_ANCHOR = {True: tuple(lit for lit, _ in _COMMON_ANCHORS),
                 False: tuple([lit for lit, _ in _COMMON_ANCHORS + _ENGINE_ANCHORS] + [_RANK_ANCHOR])}


def families_in(rx: re.Pattern, data: bytes, m: re.Match, stop: int) -> int:
    """Family bits of every anchor in data[m.start():stop] (m is the first hit)."""
    fams = _family(m.group())
    q = m.end()
    search = rx.search
    while q < stop:
        hit = search(data, q, stop)
        if hit is None:
            break
        fams |= _family(hit.group())
        q = hit.end()
    return fams


ANSI = regexcache.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()][0-9A-Za-z]|[@-Z\\-_])")


# --------------------------------------------------------------------------- record structure

_LEVELS = "INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE"
# An ISO-8601 stamp's zone, and after it what stamped the line (the timestamp is the record's, the rest a
# wrapper's): kubelet's CRI log (/var/log/pods) `stdout F ` / `stderr P `, journalctl -o short-iso's
# `host unit[pid]: ` (`host kernel: `). journald and syslog write a numeric zone, never `Z`: after a `Z`
# (kubectl --timestamps) a `train step[120]: ` is the message's own.
STAMP_ZONE = r"(?:Z|[+-]\d\d:?\d\d)"
STAMP_TAIL = r"\s(?:stdout|stderr)\s[FP](?=\s)|(?<=\d)\s[\w.\-]+\s[\w.\-/@]+(?:\[\d+\]|(?<=\skernel)):(?=\s)"
# A bracketed level, after its `[` and level: DeepSpeed's and many launchers' `[INFO] [launch.py:256:main] `,
# HF examples' `[INFO|trainer.py:2406] 2026-05-02 14:00:01,100 >> `, a bare `[WARNING] `.
BRACKET_LEVEL_TAIL = (r")(?:\|[\w.\-]+:\d+)?\](?:\s*\[[\w.\-]+:\d+(?::[\w<>.]+)?\])?"
                      r"(?:\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+>>)?")
# One prefix at a time, re-applied: worker tags, timestamps, logger headers, rank tags.
_PREFIX = regexcache.compile(
    r"(?:"
    r"\((?:[A-Za-z][\w\-:]*\s+(?:[\w=]+\s+){0,3})?pid=\d+(?:,\s*ip=[^)]*)?\)"                                   # (Worker_TP0 pid=1)
    r"|\[\d+,\d+\]<(?:stdout|stderr)>:"                                                  # mpirun --tag-output [1,13]<stderr>:
    r"|\[rank\d+\]:?|\[gpu=\d+\]"                                                             # [rank0]: / SGLang 0.2's [gpu=0]
    r"|\[(?:PG [^\]]*?)?Rank \d+\]"                                                            # [PG ID 0 PG GUID 0 Rank 1]
    r"| ?\[(?P<ts1>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:\s+[A-Z]{1,4}\d+)*\]"         # [2025-.. DP0 TP0], Megatron's " [ts] "
    r"|\[(?P<ts2>\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:\s+[A-Z]{1,4}\d+)*\]"                            # [23:03:43 TP0]
    # vLLM header; a logging config of its own may date it in full (`ERROR 2026-01-28 06:36:45,123 [core.py:946]`)
    r"|(?P<lvl1>" + _LEVELS + r")\s+(?:(?P<ts3>\d\d-\d\d\s\d\d:\d\d:\d\d)|(?P<ts6>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d))"
    r"(?:[.,]\d+)?\s+(?:\[[^\]]*\]|[\w.\-]+:\d+\])"
    r"|(?P<ts4>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?"                                   # 2025-.. [- INFO -]
    r"(?:" + STAMP_ZONE + r"(?:" + STAMP_TAIL + r")?)?"
    # its level after ` - `, ` | ` or plain space (`%(asctime)s %(levelname)s`, Ray's `<tab>INFO worker.py:N -- `),
    # or after the logger's name (`%(asctime)s - %(name)s - %(levelname)s - `)
    # TensorFlow/XLA's C++ log (tsl): `2024-12-09 11:30:27.010442: W external/…/bfc_allocator.cc:291] `
    r"(?:: (?P<lvl10>[IWEF]) [^\s\]]+:\d+\]"
    r"|(?:\s*[-|]\s*(?P<nb>[\w.]+\s*[-|]\s*)?|\s+)(?P<lvl2>" + _LEVELS + r")(?=[\s:|\-])(?!\s+\d\d-\d\d\s)"
    r"\s*(?:[-|:]\s*)?"                        # (not vLLM's own header), then the logger's name unless it came first
    # (a logger's name is a module's: lowercase or dotted; `Epoch: 3/10`, `KeyError: 'x'` are the message)
    r"(?(nb)|(?:(?!(?:step|epoch|iter|iteration)\b)(?:[a-z_][\w.]*|\w+\.[\w.]+)(?:\s*\[[^\]]*\])?\s*[:|\-]\s"
    r"|[\w.]+:\d+ --\s)?))?"
    r"|(?P<lvl6>" + _LEVELS + r"):[A-Za-z_][\w.]*:(?=\S)(?!//)"                              # logging's ERROR:torch.x:
    # INFO:  / INFO - / a header without its time (`ERROR [core.py:946] `: the file tag goes with it)
    r"|(?P<lvl3>" + _LEVELS + r")(?::\s*|\s+-\s+|\s+(?:\[[\w.\-/]+\.py:\d+\]\s?|(?=\[)))"
    r"|\[(?P<lvl7>" + _LEVELS + BRACKET_LEVEL_TAIL +                                     # [INFO] [launch.py:N:f]
    # a framework's tagged header: NeMo's `[NeMo W 2026-05-02 14:00:02 nemo_logging:393]` (its level a letter),
    # and a logger's bracketed name before its timestamp, behind a rank prefix (torchtitan's `[rank0]:[titan] 2026-…`)
    r"|\[[A-Za-z][\w\-]{0,30} (?P<lvl8>[DIWEFC]) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? [\w.\-]+:\d+\]"
    r"|\[[A-Za-z][\w.\-]{0,30}\](?=\s?\d{4}-\d\d-\d\d[ T]\d\d:)"
    r"|\[(?P<lvl4>[EWIF])\s[^\]]*\.(?:cpp|cc|cu|h|hpp|c):\d+\]"                                 # [E ProcessGroupNCCL.cpp:563]
    # glog, bare or [bracketed]; torch's TORCH_LOGS header (a .py file's) carries the compile id `[0/1]`
    # (frame/recompile, no build step), which goes with it
    r"|\[?(?P<lvl5>[EWIF])\d{3,4}\s\d\d:\d\d:(?:\d\d|\d{10})\.\d+(?:\s+\d+)?\s"
    r"(?:\S*torch/\S+\.py:\d+\](?: \[\d+/\d+(?:_\d+)?\](?=\s))?|\S+:\d+\])"   # (a trainer's `[1200/20000] loss=` stays)
    r"|\[\s*\d+\.\d+\]"                                                                       # dmesg
    # NCCL_DEBUG's header `host:pid:tid [dev] NCCL INFO `: its INFO is chatter (a missing net plugin's
    # `cannot open shared object file` included); a WARN keeps its header, which NCCL's rows read
    r"|[\w.\-]+:\d+:\d+ \[\d+\] NCCL (?P<lvl9>INFO|TRACE)(?=\s)"
    r"|(?:#\d+\s)?(?P<ts5>\d+\.\d+)(?=\s\S)"                                                  # buildkit 25.88
    r")\s?")
_LEVEL_OF = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "FATAL", "D": "DEBUG", "C": "CRITICAL", "TRACE": "DEBUG"}
# What a wrapper puts before a whole record (outermost, before any prefix above): nobody can list
# them all, so the shapes are generic. An IDE/CMake runner's `[build] `, kubectl's `[pod/x/c] ` and
# `pod/x-7f9 `, docker compose's `web-1  | ` (or a pasted `  | `), a viewer's line number `[1830] `,
# `  12 | `, `12: `, a quoted paste's `> `, journald's `Dec  1 10:00:01 host unit[pid]: `, torchrun --tee's `[default0]:`, pdsh's
# or clush's `node-3: ` (a host name ending in a digit, but not `gcc-12: error: …` nor `train_v2: error:`).
# One space after it goes with it: the record's own indentation stays (tracebacks).
FOREIGN_PREFIX = regexcache.compile(
    r"\s*\[[A-Za-z][\w.\-]{0,40}\]:"          # torchrun's `[default0]:` is glued to the line: no space to take
    # journald / syslog (journalctl -o short, short-precise, short-full)
    r"|\s*(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?"
    r"(?: [A-Z]{2,5})?) \S+ [\w.\-/@]+(?:\[\d+\])?:"
    r"|\[(?:[A-Za-z][\w.\-/ ]{0,40}|\d{1,7})\]"
    # a host (letters, digits, dashes; ending in a digit), never a compiler or a tool reporting `error:`
    r"|(?!(?:[\w.+-]*-)?(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|nvcc)(?:-\d+)*:)[a-z][a-z0-9\-]{0,62}\d:"
    r"(?=\s)(?!\s+(?:(?:fatal )?error|warning|note):)"
    r"|(?:[\w.\-]{1,63}\s*)?\|"
    r"|pod/[\w.\-]+(?:/[\w.\-]+)?(?=\s)"
    r"|>(?=[ \t]|$)"                          # a quoted paste's `> ` (markdown, e-mail), one per level
    r"|\d{1,7}(?:\s*\||:(?=\s)|\t))[ \t]?")


def strip_prefixes(text: str) -> tuple[str, Optional[str], Optional[tuple[str, str]]]:
    """(message, level, raw timestamp) with wrapper/worker/rank/time/logger prefixes removed.

    The timestamp stays raw ((kind, text)); ts_seconds parses it only where a rate needs it.
    """
    level: Optional[str] = None
    ts: Optional[tuple[str, str]] = None
    outer = True                  # a wrapper's prefix comes before every prefix of the record's own
    for _ in range(6):
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            f = FOREIGN_PREFIX.match(text) if outer else None
            if f is None or f.end() == 0:
                break
            text = text[f.end():]
            continue
        outer = False
        g = m.groupdict()
        lvl = (g["lvl1"] or g["lvl2"] or g["lvl3"] or g["lvl4"] or g["lvl5"] or g["lvl6"] or g["lvl7"] or g["lvl8"]
               or g["lvl9"] or g["lvl10"])
        if lvl:
            level = _LEVEL_OF.get(lvl, lvl)
        for key in ("ts1", "ts4", "ts6", "ts3", "ts2", "ts5"):
            if g[key]:
                ts = (key, g[key])
                break
        text = text[m.end():]
    return text, level, ts


def prefix_ts_span(text: str) -> Optional[tuple[str, int, int]]:
    """Where strip_prefixes(text) finds its timestamp: (kind, start, end) in text, or None."""
    ts: Optional[tuple[str, int, int]] = None
    at = 0
    outer = True
    for _ in range(6):
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            f = FOREIGN_PREFIX.match(text) if outer else None
            if f is None or f.end() == 0:
                break
            at += f.end()
            text = text[f.end():]
            continue
        outer = False
        for key in ("ts1", "ts4", "ts6", "ts3", "ts2", "ts5"):
            if m.group(key):
                ts = (key, at + m.start(key), at + m.end(key))
                break
        at += m.end()
        text = text[m.end():]
    return ts


def ts_seconds(ts: Optional[tuple[str, str]]) -> Optional[float]:
    return _parse_ts(*ts) if ts is not None else None


# Local time of a minute's start -> its timestamp (a log has many lines a minute; the zone
# conversion is most of a parse): one dict per format, so a short text of one is no key of the other.
_MINUTES_YMD: dict[str, Union[float, bool]] = {}
_MINUTES_MD: dict[str, Union[float, bool]] = {}


def _minute_start(minute: datetime) -> Union[float, bool]:
    """The minute's first second as a timestamp, or False where the zone's offset changes within
    the minute (a sub-minute transition: each second is converted in full there)."""
    first = minute.timestamp()
    return first if minute.replace(second=59).timestamp() - first == 59 else False


def _parse_ts(kind: str, raw: str) -> Optional[float]:
    try:
        if kind in ("ts1", "ts4", "ts6"):     # YYYY-MM-DD HH:MM:SS
            second = int(raw[17:19])
            if not 0 <= second <= 59:
                return None            # datetime() refuses it
            base = _MINUTES_YMD.get(raw[:16])
            if base is None:
                if len(_MINUTES_YMD) >= 1024:
                    _MINUTES_YMD.clear()
                base = _MINUTES_YMD[raw[:16]] = _minute_start(datetime(
                    int(raw[0:4]), int(raw[5:7]), int(raw[8:10]), int(raw[11:13]), int(raw[14:16])))
            if base is not False:
                return base + second
            return datetime(int(raw[0:4]), int(raw[5:7]), int(raw[8:10]), int(raw[11:13]), int(raw[14:16]),
                            second).timestamp()
        if kind == "ts3":   # vLLM's MM-DD HH:MM:SS omits the year: fine for the differences rates are made of
            second = int(raw[12:14])
            if not 0 <= second <= 59:
                return None
            base = _MINUTES_MD.get(raw[:11])
            if base is None:
                if len(_MINUTES_MD) >= 1024:
                    _MINUTES_MD.clear()
                base = _MINUTES_MD[raw[:11]] = _minute_start(datetime(
                    2000, int(raw[0:2]), int(raw[3:5]), int(raw[6:8]), int(raw[9:11])))
            if base is not False:
                return base + second
            return datetime(2000, int(raw[0:2]), int(raw[3:5]), int(raw[6:8]), int(raw[9:11]), second).timestamp()
        if kind == "ts2":
            h, m, s = raw.split(":")
            return int(h) * 3600 + int(m) * 60 + int(s)
        return float(raw)
    except ValueError:
        return None


# --------------------------------------------------------------------------- progress formats

# A bar's count is the whole number or none: "29/1e5" is never 29 of 1 (issue harden 17); tqdm never
# writes an exponent, so a bar that has one is not read as a bar.
_WHOLE = r"(?!\.?\d|[eE][-+]?\d)"
SIZE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
TQDM = regexcache.compile(
    r"(?P<pct>\d{1,3})%\s*(?:\|[^|\r\n]{0,400}\||Completed\s*\||(?=\d+(?:\.\d+)?[kKMGT]?/\d+(?:\.\d+)?[kKMGT]?\s*\[))\s*"
    r"(?P<n>\d+(?:\.\d+)?)(?P<nu>[kKMGT]?)/(?P<N>\d+(?:\.\d+)?)(?P<Nu>[kKMGT]?)" + _WHOLE +
    r"(?:\s*\[(?P<inner>[^\]\r\n]{0,200})\])?")
TQDM_TIMES = regexcache.compile(r"^\s*(?P<el>[\d:]+)\s*<\s*(?P<rem>[\d:]+|\?)")
TQDM_RATE = regexcache.compile(r"(?P<v>\d+(?:\.\d+)?|\?)\s*(?P<u>[kKMGT]?)(?P<a>[A-Za-z]*)/(?P<b>[A-Za-z]+)")
NINJA = regexcache.compile(r"^\[(\d+)/(\d+)\]\s(?!\s*(?:loss|train|step|epoch)\b)")   # (a trainer's `[1200/20000] loss=`: no build)
MAKE = regexcache.compile(r"^\[\s*(\d{1,3})%\]\s")
# n/N with N a whole token ("29/1e5" is 29 of 100000, never 29 of 1; "1e400" is no finite total).
STEP = regexcache.compile(r"\b(?:global[_ ])?(?:" + "|".join(STEP_WORDS) + r")\b\s*[:=#]?\s*\[?\s*(\d+)"
                  r"(?![\w.])\s*(?:/\s*(\d+(?:[eE]\+?\d+)?)(?![\w.]))?")
EPOCH = regexcache.compile(r"\b(?:epoch|Epoch|EPOCH)\b\s*[:=#]?\s*\[?\s*(\d+(?:\.\d+)?)" + _WHOLE +
                   r"\s*(?:/\s*(\d+)" + _WHOLE + ")?")
LOSS_DICT = regexcache.compile(r"""^\{['"](?:loss|train_loss|eval_loss)['"]\s*:.*['"]epoch['"]\s*:\s*([\d.]+)"""
                       r"""(?:.*['"](?:global_)?step['"]\s*:\s*(\d+))?""")
TRAIN_END = regexcache.compile(r"""^\{['"]train_runtime['"]""")
NUM_EPOCHS = regexcache.compile(r"Num [Ee]pochs\s*=\s*([\d,]+)")
# HF Trainer's banner `Total optimization steps = 1,500`; torchtitan's `…, total steps 1000 (warmup 200)`
TOTAL_STEPS = regexcache.compile(r"(?:Total optimization steps\s*=\s*|\b[Tt]otal (?:training )?steps:?\s+)([\d,]+)")


def names_totals(body: str) -> bool:
    """Whether a record may be a trainer's banner of totals (NUM_EPOCHS / TOTAL_STEPS): read as one, never as a step."""
    return "Num" in body or "optimization" in body or "otal steps" in body or "otal training steps" in body


def clock(text: str) -> Optional[float]:
    parts = text.split(":")
    try:
        value = 0.0
        for part in parts:
            value = value * 60 + float(part)
        return value
    except ValueError:
        return None


def num(value: float) -> Number:
    return int(value) if float(value).is_integer() else value


# --------------------------------------------------------------------------- serving stats lines

# A number is a whole token (issue harden-17): "1e400" or "12abc" is no number, never its first digits.
# Engines print these fields in fixed point, so a token with an exponent rejects the field (or the line).
_F = r"([-+]?\d+(?:\.\d+)?)(?![\w.])"
# vLLM: "Engine 000: Avg prompt throughput: …" (V1) and "Avg prompt throughput: …" (V0) alike.
_VLLM_STATS = regexcache.compile(
    r"Avg prompt throughput:\s*" + _F + r"[^,]*,\s*Avg generation throughput:\s*" + _F +
    r"(?:.*?Running:\s*" + _F + r"\s*req)?(?:.*?(?:Waiting|Pending):\s*" + _F + r"\s*req)?"
    r"(?:.*?Preemptions:\s*" + _F + r")?(?:.*?GPU KV cache usage:\s*" + _F + r"\s*%)?")
# The V1 line's fields, in _VLLM_STATS's groups' order; "preemptions" (printed only when some were,
# since 0.10) raises kv_cache_pressure and is no serving number (State.serving_data).
_VLLM_STATS_KEYS = ("prompt_tokens_per_s", "gen_tokens_per_s", "running", "waiting", "preemptions", "kv_cache_pct")
_VLLM_SPEC_LEN = regexcache.compile(r"Mean acceptance length:\s*" + _F)
VLLM_SPEC_RATE = regexcache.compile(r"Draft acceptance rate:\s*" + _F + r"\s*(%?)")
# SGLang "Decode batch. …" / "Prefill batch. …": one pass over "name: value" pairs.
_SGLANG_FIELD = regexcache.compile(r"(#running-req|#queue-req|(?<![#\w])(?:full )?token usage|gen throughput \(token/s\)"
                           r"|input throughput \(token/s\)|accept len(?:gth)?|accept rate):\s*" + _F)
_SGLANG_KEY = {"#running-req": ("running", 1.0), "#queue-req": ("waiting", 1.0),
               "token usage": ("kv_cache_pct", 100.0), "full token usage": ("kv_cache_pct", 100.0),
               "gen throughput (token/s)": ("gen_tokens_per_s", 1.0),
               "input throughput (token/s)": ("prompt_tokens_per_s", 1.0),
               "accept len": ("spec_accept_len", 1.0), "accept length": ("spec_accept_len", 1.0),
               "accept rate": ("spec_accept_rate", 1.0)}
_V0_SPEC_K = regexcache.compile(r"Number of speculative tokens:\s*(\d+)")
_V0_SPEC_DRAFT = regexcache.compile(r"Number of draft tokens:\s*(\d+)")
_V0_SPEC_EMITTED = regexcache.compile(r"Number of emitted tokens:\s*(\d+)")


def parse_serving_stats_line(line: str) -> Optional[dict[str, float]]:
    """Serving numbers from one engine stats line (vLLM `Engine 000: Avg prompt throughput …`,
    `SpecDecoding metrics: …`, V0 `Speculative metrics: …`; SGLang `Decode batch. …` /
    `Prefill batch. …`), as a partial dict over SERVING_KEYS; None for any other line.

    kv_cache_pct is 0..100, spec_accept_rate 0..1. Prefixes and ANSI colour are tolerated.
    """
    if "\x1b" in line:
        line = ANSI.sub(b"", line.encode("utf-8", "replace")).decode("utf-8", "replace")
    out: dict[str, float] = {}
    if "Avg prompt throughput" in line:
        m = _VLLM_STATS.search(line)
        if m:
            for key, value in zip(_VLLM_STATS_KEYS, m.groups()):
                if value is not None:
                    out[key] = float(value)
    elif "acceptance" in line:
        m = _VLLM_SPEC_LEN.search(line)
        if m:
            out["spec_accept_len"] = float(m.group(1))
        m = VLLM_SPEC_RATE.search(line)
        if m:
            out["spec_accept_rate"] = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
            if not m.group(2):     # V0 "Speculative metrics": a fraction, and the length from token counts
                k, drafted, emitted = (_V0_SPEC_K.search(line), _V0_SPEC_DRAFT.search(line),
                                       _V0_SPEC_EMITTED.search(line))
                if k and drafted and emitted and int(drafted.group(1)) > 0:
                    steps = int(drafted.group(1)) / max(1, int(k.group(1)))
                    out["spec_accept_len"] = int(emitted.group(1)) / steps
    elif "batch." in line or "batch," in line or "batch [" in line:   # 2026 "Decode batch, #…"; 0.5.4 "batch [18240], #…"
        for name, value in _SGLANG_FIELD.findall(line):
            key, scale = _SGLANG_KEY[name]
            if key not in out:
                out[key] = float(value) * scale
            elif key == "kv_cache_pct":              # hybrid models (`full token usage`, `swa token usage`): the fullest binds
                out[key] = max(out[key], float(value) * scale)
        if "Prefill batch" in line:
            out.pop("gen_tokens_per_s", None)      # the decode rate lives on decode lines only
    return out or None


def read_stats(segment: Union[bytes, str], read: tuple) -> dict[str, float]:
    """The numbers of a stats line (bytes or text) whose plan has stats_read: what the dict
    {key: float(body[a:b]) * times / over for key, a, b, times, over in plan.stats_at} is
    (x * 1.0 / 1.0 is x), without a Python step per number. The scanner inlines it (templates.RecordPlan.stats_read)."""
    keys, get, scaled = read
    stats = dict(zip(keys, map(float, get(segment))))
    for key, times, over in scaled:
        stats[key] = stats[key] * times / over
    return stats


def serving_stats_spans(line: str) -> Optional[tuple[tuple[str, int, int, float, float], ...]]:
    """Where parse_serving_stats_line(line) reads its numbers: (key, start, end, times, over) for
    each key it returns (value = float(line[start:end]) * times / over), or None when its keys or
    values are not read at fixed spans (V0 spec metrics with all their token counts, ANSI colour)
    or it returns None. The
    same for every line with the same template: its patterns test digits by class."""
    if "\x1b" in line:
        return None
    out: dict[str, tuple[str, int, int, float, float]] = {}
    if "Avg prompt throughput" in line:
        m = _VLLM_STATS.search(line)
        if m:
            for k, key in enumerate(_VLLM_STATS_KEYS, start=1):
                if m.group(k) is not None:
                    out[key] = (key, m.start(k), m.end(k), 1.0, 1.0)
    elif "acceptance" in line:
        m = _VLLM_SPEC_LEN.search(line)
        if m:
            out["spec_accept_len"] = ("spec_accept_len", m.start(1), m.end(1), 1.0, 1.0)
        m = VLLM_SPEC_RATE.search(line)
        if m:
            if not m.group(2):                         # V0: a fraction; the length from token counts,
                if _V0_SPEC_K.search(line) and _V0_SPEC_DRAFT.search(line) and _V0_SPEC_EMITTED.search(line):
                    return None                        # when all three are there (not at fixed spans)
                out["spec_accept_rate"] = ("spec_accept_rate", m.start(1), m.end(1), 1.0, 1.0)
            else:
                out["spec_accept_rate"] = ("spec_accept_rate", m.start(1), m.end(1), 1.0, 100.0)
    elif "batch." in line or "batch," in line or "batch [" in line:
        for m in _SGLANG_FIELD.finditer(line):
            key, scale = _SGLANG_KEY[m.group(1)]
            if key not in out:
                out[key] = (key, m.start(2), m.end(2), scale, 1.0)
            elif key == "kv_cache_pct":
                return None                            # two pools' usage: the fuller one is read, at no fixed span
        if "Prefill batch" in line:
            out.pop("gen_tokens_per_s", None)
    return tuple(out.values()) or None


# Engine signatures and phase markers are rows of the signature table (signatures.py), compiled there.


# --------------------------------------------------------------------------- failure signatures

CODE_INDENT = 4     # traceback source lines are indented by >= 4 spaces; exception lines by 0


def indent_width(msg: str) -> int:
    """How deep msg is indented, a tab counting CODE_INDENT: a traceback captured with tabs (a pager, an
    editor's paste) quotes its source as deep as one of spaces (`\t\traise RuntimeError(` is no error line)."""
    lead = len(msg) - len(msg.lstrip(" \t"))
    return lead + (CODE_INDENT - 1) * msg.count("\t", 0, lead) if lead else 0
_UNDOTTED_ENDINGS = [e for e in EXCEPTION_TYPE_ENDINGS if e != "Timeout"]
EXC_LINE = regexcache.compile(
    # A type's last name is longer than its ending (ValueError; `Error: …` and `Failed: …` are a CLI's words),
    # but a dotted one may be a bare ending (triton.runtime.errors.OutOfResources, subprocess.TimeoutExpired),
    # and Python's own `Exception: message` (with a message: pip's `ERROR: Exception:` heads a traceback).
    # A type ending in Timeout only dotted, as a traceback names it (requests.exceptions.ReadTimeout): a
    # config dump's `ReadTimeout: 30s` is no exception.
    r"^(?:-\s+)?(?P<type>(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:" + "|".join(_UNDOTTED_ENDINGS) + r")"
    r"|(?:[A-Za-z_]\w*\.)+(?:Error|Exception|OutOfResources|TimeoutExpired|NotFound|\w*Timeout)|Exception(?=:\s*\S)"
    r"|(?:[A-Za-z_]\w*\.)+exc\.[A-Z]\w*)"     # a type of an `exc` module: torch._dynamo.exc.Unsupported
    r"(?:\([\w.]+\))?)"          # Ray's RayTaskError(ValueError): the cause's type in brackets
    r"(?::\s*(?P<msg>.*))?$")
FRAME = regexcache.compile(r'^\s*File "[^"]*", line \d+')
XID = regexcache.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*:?\s*(\d+)")
XID_APP = {13, 31, 43, 45, 68, 69}           # application faults and their clean-up, not the hardware
XID_NOISE = {43, 45}                          # a consequence of an app being killed
GPU_FAULT = regexcache.compile(r"fallen off the bus|GPU is lost|[Uu]ncorrectable ECC|cudaErrorECCUncorrectable"
                       r"|GPU requires reset|NVRM: GPU at PCI.*has fallen"
                       # GSP firmware (R535+ open modules): the Xid 119/120 family, as NVRM prints it
                       r"|Heartbeat timed out|GSP Timeout|Memory Subsystem Error|RmInitAdapter failed")
CUDA_OOM = regexcache.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|No available memory for the cache blocks|Not enough memory\. Please try to increase"
    r"|Not enough memory to handle \d+ (?:prefill |total )?tokens"   # TGI warmup: lower --max-batch-prefill-tokens
    r"|can be stored in KV cache|Capture cuda graph failed:.*out of memory|insufficient (?:GPU|device) memory"
    r"|out of memory on (?:device|GPU)|larger than the available KV cache memory"
    r"|not enough GPU memory available"   # vLLM 0.2x auto-fit of max_model_len: not even one token fits
    # GPU memory held by someone else at startup (vLLM >= 0.10 / SGLang)
    r"|is less than desired GPU memory utilization|memory capacity is unbalanced"
    r"|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_RESOURCES"    # Intel XPU (Unified Runtime, its SYCL PI before)
    r"|RESOURCE_EXHAUSTED: Out of memory|OOM when allocating tensor")      # JAX/XLA, TensorFlow
PORT_IN_USE = regexcache.compile(r"[Aa]ddress already in use|couldn't bind HTTP server socket")
# The Hugging Face Hub refusing a download (a gated or private repo, a bad token) or unreachable (offline mode,
# no network). No status digits: a template's are 0s; the words after them say which.
HF_HUB = regexcache.compile(r"GatedRepoError|[Cc]annot access gated repo|access a gated repo|RepositoryNotFoundError"
                    r"|Repository Not Found for url"
                    r"|Client Error: (?:Unauthorized|Forbidden) for url: https://huggingface\.co"
                    r"|Invalid user token|couldn't connect to 'https://huggingface\.co'|LocalEntryNotFoundError"
                    r"|outgoing traffic has been disabled")
# A write that found no room: ENOSPC / EDQUOT in strerror's words (no errno digits: a template's are 0s), and
# torch.save's own words for a checkpoint cut short (`PytorchStreamWriter failed writing file`, `unexpected pos`).
DISK_FULL = regexcache.compile(r"No space left on device|Disk quota exceeded|PytorchStreamWriter failed writing file"
                       r"|\bunexpected pos \d+ vs \d+")
# Ray's memory monitor kills workers when the node runs low on host RAM (its error is named OutOfMemoryError).
NODE_OOM = regexcache.compile(r"ray\.exceptions\.OutOfMemoryError|node running low on memory|exceeds the memory usage threshold"
                      r"|Ray killed this worker|killed due to memory pressure \(OOM\)")
HOST_OOM = regexcache.compile(
    r"^Killed\s*$|^Killed process|\d+\s+Killed\b|\bKilled\s{2,}\S|died due to signal 9|Killed signal terminated program"
    r"|internal compiler error: Killed|(?:exit|exited with) (?:code|status)[:= ]*(?:137|-9)\b"
    r"|non-zero exit status (?:137|-9)\b|Signals\.SIGKILL|killed by signal(?: 9\b|:? Killed)|received signal 9\b"
    r"|terminated by signal 9\b|Out of memory: Kill|invoked oom-killer|oom-kill|oom_reaper|^MemoryError\b"
    r"|std::bad_alloc|Cannot allocate memory|virtual memory exhausted|out of memory allocating"
    # torch.distributed.elastic: "failed (exitcode: -9) local_rank: 0", "Signal 9 (SIGKILL) received by PID"
    r"|exitcode\s*:\s*-9\b|Signal \d+ \(SIGKILL\) received"
    r"|\btasks? [\d,\-]+: Killed\b"       # srun: `srun: error: gpu-b11: task 2: Killed`
    r"|OOMKilled")   # Docker / Kubernetes: the container's memory limit
# A shell's report of a child it saw SIGKILLed (`bash: line 1:  9039 Killed  sleep 0.2`, a bare `Killed`): no
# word of who sent it (State drops it after an engine's own kill or a requested cancel).
SHELL_KILLED = regexcache.compile(r"^Killed\s*$|\d+\s+Killed\b")
NCCL = regexcache.compile(
    r"NCCL error|nccl(?:System|Internal|UnhandledCuda|InvalidUsage|Remote|InvalidArgument)Error"
    r"|collective operation timeout|NCCL communicator was aborted|NCCL (?:timeout|Timeout)|DistBackendError"
    r"|Timeout at NCCL work|NCCL operations have failed"
    r"|DeepEP error: [^\n]*timeout"   # DeepEP's dispatch/combine (`timeout (dispatch CPU)`, `CPU recv timeout`): the ranks' communication
    r"|Timed out waiting \d+ms for (?:recv|send) operation"   # gloo's collective on CPU tensors (a barrier): the same timeout
    r"|NCCL WARN NET/\w+ ?: (?:Got completion from peer|.*(?:failed|error))|NCCL WARN Call to \w+ failed"
    r"|NCCL WARN .*[Cc]onnection (?:refused|reset|closed)|NCCL WARN .*(?:failed to extend|shared memory segment) /dev/shm")
CUDA_NO_DEVICE = (r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA driver initialization failed"
                  r"|Unexpected error from cudaGetDeviceCount|Driver/library version mismatch"
                  r"|forward compatibility was attempted on non supported HW|couldn't communicate with the NVIDIA driver"
                  r"|NVIDIA driver on your system is too old"
                  # Ray's view of a node: vLLM's `Current node has no GPU available` (0.2x)
                  r"|\bhas no (?:GPU|CUDA device)s? available"
                  # the container runtime's: the NVIDIA hook failed, or docker has no GPU runtime at all
                  r"|nvidia-container-cli: \w+ error|could not select device driver \"[^\"]*\" with capabilities: \[\[gpu\]\]")
CUDA_ERR = regexcache.compile(
    r"CUDA error(?!s)|Cuda error(?!s)|CUDA driver error|\.cuh?:\d+: .*Assertion .* failed|illegal memory access|device-side assert|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+"
    r"|CUDNN_STATUS_[A-Z_]+|cuDNN error|cudaError[A-Z]\w+|no kernel image is available|misaligned address"
    r"|unspecified launch failure|CUDA driver version is insufficient|illegal instruction was encountered"
    # NCCL's own report of a CUDA call it made (`NCCL WARN Cuda failure 217 '...'`, torch's `Last error:`)
    r"|Cuda failure \d* ?'"
    # ROCm's HIP runtime on a GPU page fault (CUDA's illegal memory access); Intel XPU's device gone
    r"|Memory access fault by GPU node-\d+|UR_RESULT_ERROR_DEVICE_LOST"
    # no usable GPU at all: no driver, a driver and its libraries of two versions, none passed into the container
    r"|" + CUDA_NO_DEVICE)
# vLLM's shm_broadcast notice (INFO, once a minute while a step waits): one is a slow compile, repeats a hang.
STALL_NOTICE = regexcache.compile(r"No available shared memory broadcast block found in \d+ seconds?"
                          r"|No available block found in \d+ seconds?")
HANG = regexcache.compile(r"Watchdog timeout \(|watchdog_timeout=\d+\)|[Hh]ang detected|detected a hang"
                   r"|execute_model timed out|ENGINE_ITERATION_TIMEOUT|Engine iteration timed out")
IMPORT = regexcache.compile(r"undefined symbol|cannot open shared object file|No module named|GLIBC(?:XX)?_[\d.]+'? not found"
                     r"|DLL load failed|cannot import name"
                     # cuDNN's own loader (CTranslate2 / faster-whisper, TensorFlow): a library of it is missing
                     r"|Unable to load any of \{lib|Could not load library lib\w+\.so|Cannot load symbol cudnn"
                     # torch.ops of an extension that never loaded (vLLM only warns `Failed to import from vllm._C`):
                     # the ops call fails later, on the import's account
                     r"|'_OpNamespace' '_\w+' object has no attribute")
BAD_ARGS = regexcache.compile(
    r"^[\w.\-]+(?: [\w\-]+){0,3}: error: (?:unrecognized arguments|the following arguments are required|argument \S+"
    r"|invalid choice|ambiguous option|unrecognized option|expected one argument)"
    r"|^Error: (?:No such option|Got unexpected extra argument|Invalid value for|Missing (?:option|argument))")
# An engine's own config check that rejects a launch option's value, in the shapes its wording takes across
# releases: an unknown name for a named choice (`Unknown quantization method: x`, `Invalid attention backend: x`,
# `invalid tool call parser: x (chose from …)`), sizes that do not divide (`… must be divisible by tensor parallel
# size (3)`, `tp_size 8 must be divisible by ep_size 3`), a parallelism the model lacks, more GPUs asked than there
# are, a method the GPU or dtype cannot run, an option that contradicts the checkpoint, a fix spelled as a flag.
# Read only on an exception's own line (signatures._config_rejected): a warning may use the same words.
CONFIG_REJECTED = regexcache.compile(
    r"\b(?:[Uu]nknown|[Ii]nvalid|[Uu]nsupported|[Uu]nrecognized) (?:[\w\-]+ ){0,3}?(?:method|backend|load_format"
    r"|\w+_format|parser|algorithm(?: name)?|dtype|choice)s?: ['\"]?[\w.\-]"   # (an option's format: not an image's)
    r"|must be divisible by (?:the )?(?:tensor|pipeline|data|expert|context) parallel size"
    r"|\b[a-z]\w*_size \(?\d+\)? must be divisible by [a-z]\w*_size\b"
    r"|\b(?:[Pp]ipeline|[Tt]ensor|[Dd]ata|[Ee]xpert|[Cc]ontext) parallelism is not supported (?:for|with|by|on) "
    r"|(?:is larger than|exceeds) the (?:total )?number of available (?:GPU|device|node)s\b"   # (not KV blocks)
    r"|[Cc]annot provide a placement group requiring \d+ GPUs"
    r"|is not supported for (?:the current GPU|quantization method)\b"
    r"|specified in the `[\w\-]+` (?:argument|flag|option)"
    r"|(?:fix|solve|resolve) this by \w+ [^.]{0,40}?`--[a-z]"
    r"|[Ss]ome specified arguments are not used by the HfArgumentParser")   # (transformers: an unknown flag)
# pydantic's detail line under `ValidationError: 1 validation error for ModelConfig` (vLLM's config dataclasses,
# 0.10+): the check's own message follows `Value error, `; the header above it says nothing.
PYDANTIC_DETAIL = regexcache.compile(r"^\s*(?:Value|Assertion) error, \S")
BUILD_SPECIFIC = regexcache.compile(
    r"^\S+?:\d+:(?:\d+:)? (?:fatal )?error: |^\S+\(\d+\): (?:catastrophic )?error|^nvcc fatal|CMake Error"
    r"|ptxas (?:fatal|error)|died due to signal (?!9\b)\d+|undefined reference to|collect2: error|ld returned \d+ exit status"
    r"|^\S+: fatal error: |^nvcc (?:error|fatal)\s*:"
    r"|^(?:[\w.+-]*-)?(?:c\+\+|g\+\+|gcc|cc|clang(?:\+\+)?|ld|ld\.\w+)(?:-\d+)?: (?:fatal )?error: ")
BUILD_UMBRELLA = regexcache.compile(
    r"ninja: build stopped|^make(?:\[\d+\])?: \*\*\*|error: command '[^']*' failed|subprocess-exited-with-error"
    r"|Failed building wheel|did not run successfully|Error compiling objects for extension|Error building extension"
    r"|^FAILED: "
    r"|CalledProcessError.*(?:cmake|ninja|make|nvcc|setup\.py)")
ENGINE_UMBRELLA = regexcache.compile(
    r"Engine core initialization failed|EngineCore failed to start|\bhit an exception"
    # vLLM V1's worker processes (multiproc, Ray), and the EngineCore's dead-signal that did not go out
    r"|\b(?:Ray)?WorkerProc failed(?: to start)?[.:]|shutdown signal from EngineCore failed to send"
    # SGLang 0.5.x: the launcher / DP controller seeing a child end, the subprocess watchdog's SIGQUIT
    r"|Scheduler or DataParallelController \d+ terminated with|Subprocess \S+ \(pid=\d+\) crashed with exit code"
    r"|Received sigquit from a child process|EngineDeadError|EngineCore encountered a fatal error"
    # vLLM V1's own pointers to the error above (0.8: `Exception: WorkerProc initialization failed … See
    # stack trace for root cause.`, the client's `Got fatal signal from worker processes … See stack trace above`)
    r"|See stack trace (?:above )?for root cause"
    r"|died unexpectedly|[Ww]orker.* died|Child process .* died|terminate called after throwing|scheduler is dead"
    r"|Traceback \(most recent call last\)|Initialization failed\. detoken|Capture cuda graph failed"
    # launchers: torch elastic's "failed (exitcode: 1) local_rank: 0 (pid: …) of binary" and its summary's
    # traceback field. (DeepSpeed's launcher prints "Killing subprocess" and "exits with return code = -2"
    # on its own SIGINT/SIGTERM too: a stop; its -9 is KILLED_EXIT's.)
    r"|failed \(exitcode: -?\d+\) local_rank|To enable traceback see: \S*pytorch\.org/docs/\S*elastic"
    # vLLM V0's AsyncLLMEngine and its RPC server, V1's output handler: the engine is gone
    r"|AsyncLLMEngine has failed|Engine background task failed|RPCServer process died|output_handler failed"
    r"|Exception in ModelTpServer")                       # SGLang 0.2's scheduler
# Slurm's step daemon writes these into the job's own output when Slurm ends the job.
# (slurmstepd's node failure reads "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS")
SLURM_END = regexcache.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO (?P<why>[A-Z ,]+?))? \*\*\*")


def requested_cancel(body: str) -> bool:
    """Whether a record is Slurm's note of a cancel someone asked for (SLURM_END with no `DUE TO`):
    no failure, but the shell's `Killed` after it is the cancel's SIGKILL escalation."""
    return "CANCELLED AT" in body and "DUE TO" not in body


# Other schedulers' own end of a job, in its output or events: PBS's `=>> PBS: job killed: walltime N exceeded
# limit N`, LSF's `TERM_RUNLIMIT: job killed after reaching LSF run time limit.`, Kubernetes' `Preempted by
# pod … on node …` event.
BATCH_END = regexcache.compile(r"=>> PBS: job killed: (?P<pbs>walltime|mem|vmem|pmem|pvmem)\b"
                               r"|\bTERM_(?P<lsf>RUNLIMIT|CPULIMIT|MEMLIMIT|SWAP|PREEMPT): job killed"
                               r"|\bPreempted by (?:pod )?\S+ on node \S")
SLURM_OOM = regexcache.compile(r"Detected \d+ oom[-_ ]kill event|Exceeded (?:job|step) memory limit|exceeded memory limit")
# (torch elastic's failures table names a worker's fatal signal: `traceback : Signal 7 (SIGBUS) received by PID`)
CRASH = regexcache.compile(r"Segmentation fault|SIGSEGV|core dumped|Aborted \(core dumped\)|Fatal Python error|^Bus error\b"
                   r"|\(SIG(?:BUS|ABRT|ILL|FPE)\) received by PID")
NOT_FAILURE_LEVELS = ("INFO", "DEBUG", "NOTICE")

OOM_RISK = regexcache.compile(r"Allowing ninja to set a default number of workers|make -j(?:$|\s(?!\s*\d))"   # (-j 16: bounded)
                       r"|virtual memory exhausted|Cannot allocate memory|std::bad_alloc"
                       r"|allocator cache flushes since last step")     # DeepSpeed ZeRO-3: GPU memory nearly full
KV_PRESSURE = regexcache.compile(r"preempted by PreemptionMode|not enough KV cache space|KV cache pool is full"
                          r"|[Dd]ecode out of memory happened|[Rr]etract(?:ed)? requests")
JIT = regexcache.compile(r"Prebuilt kernels not found|using JIT backend|Loading JIT ops|JIT [Cc]ompil"
                         r"|JIT Pre-Compile")    # DeepGEMM's warm-up (SGLang: `Entering DeepGEMM JIT Pre-Compile session`)
# A server logging one request's failure, the traceback to follow: uvicorn's unhandled exception in a
# route, vLLM's OpenAI handlers catching one. The server answers that request (400/500) and serves on.
REQUEST_ERROR = regexcache.compile(r"Exception in ASGI application|Error in preprocessing prompt inputs"
                                   r"|Error in (?:chat )?completion stream generator")
REQUEST_ERROR_LINES = 40      # how far the traceback a request-error line announces may run
# The joint of chained exceptions: the traceback after it is the same failure's. A request error's
# traceback runs on past its last exception line only through one (cause.py rule 6).
CHAINED = regexcache.compile(r"The above exception was the direct cause of the following exception"
                             r"|During handling of the above exception, another exception occurred")
# A client's HTTP error by its library's type: the server answered the request with an error status (a
# client's traceback pasted after the server's log). Connection errors and timeouts are not here: they
# may be the server's death or hang.
CLIENT_STATUS_ERROR = regexcache.compile(
    r"^(?:openai\.(?:BadRequest|NotFound|UnprocessableEntity|Authentication|PermissionDenied|RateLimit|Conflict"
    r"|InternalServer|APIStatus)Error|httpx\.HTTPStatusError|requests\.exceptions\.HTTPError"
    r"|aiohttp\.client_exceptions\.ClientResponseError|urllib\.error\.HTTPError)\b")


def warns(body: str) -> bool:
    """Whether State._warnings reads anything in this record (the warning rows' patterns)."""
    return bool(OOM_RISK.search(body) or KV_PRESSURE.search(body) or JIT.search(body) or REQUEST_ERROR.search(body))

HINTS = {
    "cuda_oom": "GPU memory exhausted — lower --gpu-memory-utilization / --mem-fraction-static, max model length "
                "or batch size, or spread the model over more GPUs (tensor parallel)",
    "cuda_oom_capture": "GPU memory ran out while capturing CUDA graphs — lower --cuda-graph-max-bs / "
                        "--max-num-seqs, leave more memory free (--mem-fraction-static), or disable CUDA graphs",
    "cuda_oom_nccl": "GPU memory ran out while NCCL allocated its buffers (communicator init, P2P/all-reduce "
                     "buffers) — leave NCCL room: lower --gpu-memory-utilization / --mem-fraction-static, or "
                     "NCCL_BUFFSIZE; check no other process holds the GPU",
    "nccl_cuda": "NCCL reports a failed CUDA call — the CUDA error it names is the cause (torch prints it after "
                 "`Last error:`; rerun with NCCL_DEBUG=WARN to see NCCL's own `Cuda failure` line)",
    "nccl_remote": "a peer rank exited (or the network failed) during a collective — the error of the rank that "
                   "died is the cause: look above for its traceback; if there is none, check the network "
                   "(NCCL_DEBUG=WARN) and the host's dmesg for that rank",
    "host_oom_k8s_exit": "the container was SIGKILLed (exit code 137) — `kubectl describe pod` says why: Reason "
                         "OOMKilled is its memory limit (the node's dmesg shows the kill; raise "
                         "resources.limits.memory); Error is another kill (a failed liveness probe, an eviction: "
                         "see its Events)",
    "host_oom_build": "killed by the host OOM killer — lower MAX_JOBS (or CMAKE_BUILD_PARALLEL_LEVEL) and NVCC_THREADS",
    "host_oom": "killed by the host OOM killer (SIGKILL) — free host RAM, lower CPU-side memory use "
                "(swap space, loader workers), or check `dmesg` for the kill",
    "nccl": "NCCL collective failed — rerun with NCCL_DEBUG=INFO; check P2P/NVLink/IB topology (try "
            "NCCL_P2P_DISABLE=1) and that every rank started",
    "nccl_gloo": "a gloo collective (CPU tensors: a barrier, an object broadcast) timed out — a rank is stuck "
                 "before it (another rank's error or hang above), or the hosts cannot reach each other "
                 "(GLOO_SOCKET_IFNAME, MASTER_ADDR); a py-spy dump of each rank shows where",
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
    "bad_arguments_parse": "the command line gives an option a value it cannot take (the error names the option "
                           "and the value: a word where a number goes, a choice not offered) — fix that value; "
                           "`--help` lists what each option takes",
    "bad_arguments_value": "an option's value does not fit this model or GPU — the error names the flag to change "
                           "(--max-model-len / --context-length, --dtype half on GPUs older than Ampere, …)",
    "build_failed": "the build failed — fix the first compiler/CMake error above; check the CUDA toolkit, "
                    "compiler and TORCH_CUDA_ARCH_LIST",
    "build_deps": "the installer found no version that fits — read the conflict it printed, then change the pins "
                  "(torch / CUDA wheels of one release), the Python version or the index URL (--extra-index-url)",
    "build_segfault": "a compiler tool crashed (segfault, not OOM) — retry; if it repeats, change the CUDA "
                      "toolkit version or the arch list",
    "slurm_time_limit": "Slurm killed the job at its time limit — raise `time` in jobs.toml (sbatch --time), "
                        "or checkpoint and resume in shorter jobs",
    "slurm_oom": "Slurm's memory limit killed the job — raise --mem in sbatch_args (or ask for more nodes), "
                 "or lower the job's host memory use",
    "slurm_refused": "Slurm refused the job's request before it ran — the reason ends the line (partition, account, "
                     "QOS, --gres=gpu:N, time limit, node count): fix sbatch_args in jobs.toml (sinfo shows what exists)",
    "slurm_node_fail": "the Slurm node failed under the job — resubmit it; tell the cluster admins if it repeats",
    "slurm_comm": "Slurm's daemons did not answer each other (srun, slurmctld, the node's slurmd timed out or "
                  "refused) — the node or the controller is overloaded or down: check `sinfo -R` / `scontrol show "
                  "node`, then resubmit (--exclude the node if it repeats)",
    "batch_time_limit": "the scheduler killed the job at its run-time limit (PBS walltime, LSF RUNLIMIT) — ask for "
                        "more time, or checkpoint and resume in shorter jobs",
    "batch_oom": "the scheduler's memory limit killed the job (PBS mem, LSF MEMLIMIT) — ask for more memory, or "
                 "lower the job's host memory use",
    "batch_preempted": "the scheduler preempted the job for a higher-priority one (LSF TERM_PREEMPT, a Kubernetes "
                       "pod's PriorityClass) — resubmit, or run where it is not preempted",
    "slurm_preempted": "Slurm preempted the job for a higher-priority one — resubmit, or use a partition/QOS "
                       "that is not preempted",
    "slurm_requeued": "Slurm stopped the job to requeue it (scontrol requeue, or a preemption in requeue mode): it "
                      "starts again from its script's beginning — make sure it resumes from its last checkpoint",
    "hang": "the engine's own watchdog found a batch stuck — usually a collective deadlock or a very slow JIT "
            "compile; try --disable-custom-all-reduce, or raise --watchdog-timeout only if it was compiling",
    "hang_timeout": "a wait timed out — what it waited on is stuck or too slow (a deadlock, a stuck rank, a slow "
                    "load or compile): stack-dump it (py-spy dump) before raising the timeout",
    "gpu_fault": "GPU hardware/driver fault (Xid) — the GPU needs a reset or the node a reboot; not a software bug",
    "exception": "uncaught Python exception — read the traceback that ends at this line",
    "exception_umbrella": "a process of the job died — its own error is printed above (or in its own log); "
                          "look for the first traceback/ERROR before this line",
    "exception_below": "a process of the job died with a Python exception — its type and message end the "
                       "traceback that starts here",
    "exception_traceback": "a Python traceback without its final exception line (log cut short?) — read it above",
    "exception_crash": "the process crashed in native code — rerun with CUDA_LAUNCH_BLOCKING=1 / faulthandler "
                       "to locate it",
    "host_oom_ray": "Ray's memory monitor killed a worker: the node ran low on host RAM — free host memory, lower "
                    "CPU-side use (object store, dataloaders), or raise RAY_memory_usage_threshold knowingly",
    "cuda_oom_kv": "the model's max length needs more KV cache than the GPU memory left after the weights — lower "
                   "--max-model-len, or raise --gpu-memory-utilization / spread the model over more GPUs",
    "cuda_oom_occupied": "GPU memory is already taken by another process — find it (nvidia-smi, gpudeck status) "
                         "and stop it, or lower --gpu-memory-utilization / --mem-fraction-static",
    "exception_port": "the port is already in use — another server (or a previous run) listens on it: stop it "
                      "(gpudeck status shows who) or pick another --port",
    "host_oom_launcher": "a worker was SIGKILLed (exitcode -9) — almost always the host OOM killer: check `dmesg` "
                         "for the kill, then free host RAM or lower CPU-side memory use (loading weights into RAM, "
                         "dataloader workers)",
    "nccl_net": "the network transport between nodes failed (InfiniBand/RoCE completion error, retry exceeded, link "
                "down) — check the links and fabric (ibstat, NCCL_IB_HCA); NCCL_IB_DISABLE=1 tests over sockets",
    "cuda_error_p2p": "the GPUs cannot access each other's memory (P2P) — disable the custom all-reduce "
                      "(--disable-custom-all-reduce) or check `nvidia-smi topo -p2p r` / IOMMU and ACS settings",
    "cuda_error_driver": "no usable GPU — the driver is missing, or of another version than its libraries (upgraded "
                         "without a reboot), or not passed into the container: check nvidia-smi on the host, "
                         "CUDA_VISIBLE_DEVICES and --gpus / the device plugin",
    "cuda_error_ordinal": "a GPU index beyond the GPUs this process sees — check CUDA_VISIBLE_DEVICES and that "
                          "tensor × pipeline parallel size (or the ranks per node) fits the visible GPUs",
    "cuda_error_assert": "a device-side assertion fired in a kernel (usually an index out of bounds: a token id or "
                         "a length beyond the model's limits) — rerun with CUDA_LAUNCH_BLOCKING=1 to locate it",
    "hang_stall": "a step has waited minutes for the workers (repeated shared-memory broadcast notices) — a worker "
                  "is stuck (collective, device) or still compiling; stack-dump the workers (py-spy dump)",
    "nccl_shm": "NCCL could not grow its shared-memory segment — the container's /dev/shm is too small: run it "
                "with --shm-size (e.g. 16g) or --ipc=host",
    "exception_bus_error": "a bus error — in a container almost always /dev/shm too small for shared tensors "
                           "(dataloader workers, NCCL): --shm-size or --ipc=host",
    "nccl_rendezvous": "the ranks never met (c10d store / rendezvous) — check that MASTER_ADDR:MASTER_PORT (or "
                       "--rdzv-endpoint) is reachable from every node through the firewall and every node started",
    "exception_signal": "the launcher was sent a signal from outside (SIGTERM: a scheduler, an eviction, someone's "
                        "kill) — stopped, not a bug: check who stopped it and resume from the last checkpoint",
    "exception_disk_full": "a disk is full (or over its quota) — free space (df -h), or point the checkpoint, "
                           "cache (HF_HOME, ~/.cache) and temp (TMPDIR) dirs at a larger volume",
    "exception_shm_full": "/dev/shm is full — a container's is small by default: run it with --shm-size (e.g. 16g) "
                          "or --ipc=host, or use fewer dataloader workers",
    "exception_hf_auth": "the Hugging Face Hub refused the download (a gated or private repo, or a bad token) — "
                         "accept the model's license on its page and give the job HF_TOKEN, or use a local path",
    "exception_hf_offline": "the Hugging Face Hub was not reachable and the files are not in the cache — give the "
                            "job network access (or a mirror: HF_ENDPOINT), or download the model first (HF_HOME)",
    "exception_interrupt": "interrupted (Ctrl-C / SIGINT) — stopped by someone, not by a bug",
}



_EVAL_BARS = ("validat", "sanity check", "eval", "testing", "predicting")
_DATA_PREP_BARS = ("map", "filter", "generating ")
_DATA_PREP_WORDS = ("dataset", " split", "tokeniz", "preprocess", "grouping texts", "chat template")
# Files a hub download draws one bar each for: a model's weights (`model-00002-of-00017.safetensors`) and a
# dataset's (`train-00003-of-00020.parquet`).
_DOWNLOADED_FILES = (".safeten", ".gguf", ".bin", ".pt", ".msgpack", ".h5", ".parquet", ".arrow", ".jsonl", ".csv")


def label_phase(label: str) -> Optional[str]:
    """The phase a progress bar's label names, or None for an unlabeled/unknown bar."""
    low = label.lower()
    if "captur" in low or "graph" in low:
        return "capturing"
    if low.startswith(_EVAL_BARS):
        return "training"     # Lightning's `Validation DataLoader 0`, a trainer's eval: within training
    if low.startswith(_DATA_PREP_BARS) or any(word in low for word in _DATA_PREP_WORDS):
        return None           # HF datasets' `Generating train split`, `Map`: the data, neither training nor a load
    for word in ("load", "checkpoint", "shard", "weight", "download", "fetch", "convert ", "converting"):
        if word in low:
            return "loading"
    if any(ext in low for ext in _DOWNLOADED_FILES):
        return "loading"      # hub downloads, one bar a file
    if "compil" in low or "autotun" in low or "warm" in low:
        return "compiling"
    for word in ("train", "epoch", "step", "iter", "loss"):     # (torchtune's `1|142|Loss: 0.99`)
        if word in low:
            return "training"
    if "build" in low or "ninja" in low:
        return "building"
    if low.startswith(("processed prompts", "adding requests")):
        return "ready"        # vLLM's offline LLM.generate answering them (not a script's `Tokenizing prompts`)
    return None


SERIES_LABELS: dict[str, str] = {}


def series_label(label: str) -> str:
    """A label with its changing parts (numbers, parenthesised state) removed: one bar, one series."""
    key = SERIES_LABELS.get(label)
    if key is None:
        if len(SERIES_LABELS) >= 1024:
            SERIES_LABELS.clear()
        key = SERIES_LABELS[label] = re.sub(r"[\d.]+", "#", re.sub(r"\([^)]*\)", "", label)).strip()
    return key


_LINKER = regexcache.compile(r"(?:^|[\s/])ld\s")      # the linker as a word: "Child process" names no tool


def is_build_tool(body: str) -> bool:
    return any(t in body for t in ("cicc", "cudafe", "cc1plus", "nvcc", "ptxas", "c++:", "g++", "gcc", "ninja",
                                   "make", "fatbinary")) or ("ld" in body and _LINKER.search(body) is not None)
