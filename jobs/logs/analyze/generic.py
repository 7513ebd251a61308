"""The generic layer: what a log says that no signature of the table knows, read by shape.

- a Python traceback's final exception, classified by its type (``exception_cause``);
- a non-zero exit of a build tool (ninja, cmake, make, nvcc, pip's build) as a Python
  ``CalledProcessError`` or a launcher's "exit status" (``BUILD_TOOL_EXIT``);
- watchdog / timeout families, read as a hang or an NCCL failure by what they name
  (``WATCHDOG``, ``watchdog_cause``);
- labelled counters anywhere in a line: ``[N/M]``, ``label N/M`` (``counter``), the latter with
  any label that names what is counted (``Processing shard 3/8``: progress of phase "unknown"
  where the label names none);
- numbers, strictly: a whole token, finite (``strict_number``): ``1e5`` is 100000, never "1",
  and ``1e400`` is rejected, never infinity.

Exit codes and signals (``-9``, ``137``, ``Killed``) are read by the HOST_OOM row of the table,
and by KILLED_EXIT (``Exit code: 137``, ``returncode=-9``) and SIGKILLED (``signal: killed``)
where HOST_OOM's spellings miss them (their hint says to check dmesg).
"""
from __future__ import annotations

import math
import re
from typing import Iterator, Optional, Union

from .cause import Spec
from .patterns import clock, label_phase
from . import regexcache

# --------------------------------------------------------------------------- exceptions by type

# A final exception's type (its last dotted part) -> (cause, rank, hint key). Types not here are
# a plain `exception`. Subclasses named by convention (…OutOfMemoryError) are matched by suffix.
EXCEPTION_TYPES: dict[str, tuple[str, int, str]] = {
    "ImportError": ("import_error", Spec.SPECIFIC, "import_error"),
    "ModuleNotFoundError": ("import_error", Spec.SPECIFIC, "import_error"),
    "SyntaxError": ("syntax_error", Spec.SPECIFIC, "syntax_error"),
    "IndentationError": ("syntax_error", Spec.SPECIFIC, "syntax_error"),
    "TabError": ("syntax_error", Spec.SPECIFIC, "syntax_error"),
    "OutOfMemoryError": ("cuda_oom", Spec.SPECIFIC, "cuda_oom"),
    "MemoryError": ("host_oom", Spec.SPECIFIC, "host_oom"),
    "ResourceExhaustedError": ("cuda_oom", Spec.SPECIFIC, "cuda_oom"),   # TensorFlow's, its `OOM when allocating` below
    "CalledProcessError": ("exception", Spec.EXCEPTION, "exception"),   # a build tool's: BUILD_TOOL_EXIT
    "KeyboardInterrupt": ("exception", Spec.EXCEPTION, "exception_interrupt"),
    # torch elastic's summary of a worker that failed: an envelope ("see the failures table"), never the cause
    "ChildFailedError": ("exception", Spec.UMBRELLA, "exception_umbrella"),
    "DistBackendError": ("nccl", Spec.SPECIFIC, "nccl"),
    # c10d's store and socket, torch elastic's rendezvous (any Rendezvous…Error, by prefix): the ranks never met
    "DistStoreError": ("nccl", Spec.SPECIFIC, "nccl_rendezvous"),
    "DistNetworkError": ("nccl", Spec.SPECIFIC, "nccl_rendezvous"),
    "RendezvousError": ("nccl", Spec.SPECIFIC, "nccl_rendezvous"),
    # torch elastic's handler of a signal sent to the launcher (SIGTERM, SIGINT from outside): stopped, not a bug
    "SignalException": ("exception", Spec.EXCEPTION, "exception_signal"),
    "TimeoutError": ("hang", Spec.EXCEPTION, "hang_timeout"),    # nccl when it names a collective
}


# An exception raised while the interpreter shuts down (a destructor or atexit hook importing after sys.meta_path is
# gone): printed after the run's own end, it is noise, never its cause.
AT_SHUTDOWN = regexcache.compile(r"Python is likely shutting down|sys\.meta_path is None")


# An ssl/socket read or write that timed out (`TimeoutError: The read operation timed out`, urllib3's
# `ReadTimeoutError: HTTPSConnectionPool(...): Read timed out.`): the network, not a hang.
_NETWORK_IO = regexcache.compile(r"The (?:read|write|handshake) operation timed out|HTTPS?ConnectionPool\(|"
                                 r"\bRead timed out\b")


def exception_cause_of(etype: str, body: str) -> tuple[str, int, str]:
    """exception_cause(), with a timeout read by what it names (a collective: nccl; else a hang)."""
    cause = exception_cause(etype)
    if cause[0] == "hang" and _NAMES_COLLECTIVE.search(body):
        return ("nccl", cause[1], "nccl_timeout")
    if cause[0] == "hang" and _NETWORK_IO.search(body):
        return ("exception", cause[1], "exception")   # a socket's read ran out (a download): no stuck process
    return cause


def exception_cause(etype: str) -> tuple[str, int, str]:
    """(cause, rank, hint key) of a traceback's final exception line, by the exception's type (a wrapper's
    bracketed cause type first: Ray's RayTaskError(ModuleNotFoundError) is an import error)."""
    if etype.endswith(")") and "(" in etype:
        inner = exception_cause(etype[etype.index("(") + 1:-1])
        if inner[0] != "exception":
            return inner
        etype = etype[:etype.index("(")]
    name = etype.rsplit(".", 1)[-1]
    if name.startswith("Rendezvous") and name.endswith("Error"):      # RendezvousTimeoutError, …ConnectionError
        name = "RendezvousError"
    hit = EXCEPTION_TYPES.get(name)
    if hit is not None:
        return hit
    return ("exception", Spec.EXCEPTION, "exception")


# --------------------------------------------------------------------------- build tools' exits

_BUILD_TOOLS = r"(?:ninja|cmake|make|gmake|nvcc|pip|setup\.py|bdist_wheel|build_ext|meson|bazel)"
# subprocess's "Command '['ninja', '-v']' returned non-zero exit status 1." and the like, with the tool
# named in the command's first words; "-9"/"137" (SIGKILL) are read by HOST_OOM first. (Unbounded
# repeats: a record is one line, and bounded ones cost hyperscan seconds to compile.)
BUILD_TOOL_EXIT = regexcache.compile(
    r"CalledProcessError: Command '?\[?['\"]?(?:[^'\"\s]*/)?(?:python\d?(?:\.\d+)?['\"]?,? ['\"]?)?"
    + _BUILD_TOOLS + r"\b.*?non-zero exit status"
    r"|^" + _BUILD_TOOLS + r"(?: --build)?.*\b(?:failed with exit code|exited with (?:code|status)) [1-9]")


# --------------------------------------------------------------------------- signals

# A process killed by SIGKILL in words no HOST_OOM spelling has (Go's os/exec "signal: killed", a
# supervisor's "received SIGKILL"): almost always the OOM killer. No digits: a template reads it too.
SIGKILLED = regexcache.compile(r"\bsignal: killed\b|\breceived SIGKILL\b|\bSIGKILL received\b|\bwas SIGKILLed\b")

# SIGKILL's exit code in the spellings HOST_OOM's "exit code 137" misses: a capital (`Exit code: 137`,
# k8s `Exit Code: 137`), a field (`exit_code=137`, `exitCode: 137`), Python's `returncode=-9`
# (CompletedProcess, Popen) and `return code 137`. 137 is 128 + 9 (a shell's), -9 Python's: SIGKILL,
# almost always the OOM killer. Also a process that "terminated with -9" (multiprocessing's exitcode, as
# SGLang's launcher prints a dead scheduler's), and SGLang's SIGCHLD handler, which prints os.waitpid's
# raw status: `exitcode=9` / `an exit code 9` is a child ended by signal 9 (an exit status N prints N*256).
# Digit values: read per segment (templates._DIGIT_VALUE_WORDS).
KILLED_EXIT = regexcache.compile(r"(?:\b[Ee]xit[ _]?(?:[Cc]ode|[Ss]tatus)|\bexitCode|\breturn[ _]?code"
                         r"|\bterminated with(?: exit ?code| signal)?)\s*[:=]?\s*(?:137|-9)\b"
                         r"|\bterminated with signal 9\b|unexpectedly failed with (?:exitcode=|an exit code )9\b"
                         r"|\bexited on signal 9\b"        # Open MPI: `mpirun noticed that process rank 3 … exited on signal 9 (Killed)`
                         r"|Failed core proc\(s\): \{[^}]*: -9\b")   # vLLM V1: `Failed core proc(s): {'EngineCore_DP0': -9}`


# --------------------------------------------------------------------------- watchdogs and timeouts

# A watchdog that fired, in any engine's words ("Scheduler watchdog timeout (…)", "watchdog timed out",
# "timeout … watchdog"): what it names says which cause.
WATCHDOG = regexcache.compile(r"\b[Ww]atchdog\b.*?\b(?:timeout|timed out|time out|expired)"
                      r"|\b(?:[Tt]imeout|[Tt]imed out)\b.*?\b[Ww]atchdog\b")
# (c10d's digits by class, as every pattern here tests them: a template's digits are 0s)
_NAMES_COLLECTIVE = regexcache.compile(r"NCCL|[Cc]ollective|ProcessGroup|c\d\dd|all_?reduce|ALLREDUCE|all_?gather|SeqNum")


def watchdog_cause(body: str) -> Optional[str]:
    """`nccl` for a watchdog timeout that names a collective, `hang` for an engine's own watchdog, None for none."""
    if WATCHDOG.search(body) is None:
        return None
    return "nccl" if _NAMES_COLLECTIVE.search(body) else "hang"


# --------------------------------------------------------------------------- counters and numbers

# A number as one whole token: digits, an optional fraction, an optional exponent. Used with
# strict_number: the token must end here (no letter or digit glued on), else it is no number.
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_STRICT = regexcache.compile(NUMBER + r"\Z")
# A labelled counter anywhere in a line: "[47/230]", "step 12/500", "shard 3 / 8".
COUNTER = regexcache.compile(r"\[\s*(?P<bn>\d+)\s*/\s*(?P<bN>\d+)\s*\]"
                     r"|(?P<label>[A-Za-z][\w \-]{0,40}?)[\s:=#]+(?P<n>\d+)\s*/\s*(?P<N>\d+)(?![\w.])")


# "[N/M]" after a label, anywhere in a line ("Loading shard [3/8]", "rank0 capture [12/52]"): what
# State reads when no signature read the line's progress and the label names a phase (label_phase).
# A label may be a chain of bracketed tags (`[Warmup][Prompt][7/24]`, vLLM on Gaudi): the first names it,
# the others (`tags`) follow it in the label. A bracketed number may stand between the label and the
# counter (mmengine's `Epoch(train)  [3][ 400/1250]`: the epoch, then the iteration of its N).
LABELLED_BRACKET = regexcache.compile(r"(?P<label>[A-Za-z](?:[\w .:\-]|\(\w+\)){0,60}?)(?P<tags>(?:\]\s*\[[A-Za-z][\w .:\-]{0,30})*)\]?"
                                      r"\s*(?:\[\d+\]\s*)?\[\s*(?P<n>\d+)\s*/\s*(?P<N>\d+)\s*\]")
_BRACKET = regexcache.compile(r"\s*\[\s*\d+\s*/\s*\d+\s*\]")                  # its counters alone


# A trainer's bare counter, its loss after it (JAX/absl loops: `[1200/20000] loss=3.2495 lr=2.99e-04`): a step.
LEAD_COUNT_BESIDE_LOSS = regexcache.compile(r"\[\s*(?P<n>\d+)\s*/\s*(?P<N>\d+)\s*\]\s+(?=[^\n]*\bloss\b)")
# ninja's "[N/M] what" after a prefix nobody listed (">>> [47/230] Building CUDA object …"): the
# words after the counter name it.
BUILD_STEP_ANYWHERE = regexcache.compile(r"\[(?P<n>\d+)/(?P<N>\d+)\]\s+(?P<label>\S[^\n]{0,80})")
_BUILD_WORDS = regexcache.compile(r"^(?:Building|Linking|Compiling|Generating|Installing)\b|\b(?:nvcc|c\+\+|g\+\+|gcc|clang"
                          r"|cicc|ptxas|ld|ar|cmake|ninja)\b")


def _labelled(rx: "re.Pattern[str]", counters: "re.Pattern[str]", body: str) -> "Iterator[re.Match[str]]":
    """rx.finditer(body) for a labelled counter, searched only in the window before each of its counters
    (counters.finditer: the counter and the whitespace before it): a label is at most 61 characters, so no
    match ending at a counter starts earlier. The same matches; a long line costs its length, not its
    length times the label's."""
    pos = 0
    for c in counters.finditer(body):
        if c.start() < pos:
            continue
        m = rx.search(body, max(pos, c.start() - 61), c.end())
        if m is not None:
            pos = m.end()
            yield m


class _Named:
    """A counter match with its label given (the words before it, or for a build step the step's words);
    a rich bar's also with the rate and remaining time it prints (else None)."""
    __slots__ = ("m", "label", "phase", "sig", "rate", "eta")

    def __init__(self, m: "re.Match[str]", label: str, phase: Optional[str], sig: str = "labelled [n/N]",
                 rate: Optional[float] = None, eta: Optional[float] = None) -> None:
        self.m, self.label, self.phase, self.sig, self.rate, self.eta = m, label, phase, sig, rate, eta

    def group(self, name: str) -> str:
        return self.label if name == "label" else self.m.group(name)


# A rich progress bar (rich.progress, as Lightning's RichProgressBar and pip draw it): its glyphs, then the
# count it shows, then its columns (`Epoch 3/9 ━━━━╸━━━ 400/1000 0:04:52 • 0:07:37 1.33it/s`). The words
# before the glyphs label it; a counter among them (`3/9`) is the label's, the one after the glyphs the bar's.
RICH_BAR = regexcache.compile(r"[━╸╺]{3,}\s*(?P<n>\d+(?:\.\d+)?)/(?P<N>\d+(?:\.\d+)?)(?![\w./%])")
_RICH_REMAINING = regexcache.compile(r"(?:•|\beta)\s*(?P<rem>\d+:\d\d(?::\d\d)?)\b")
_RICH_RATE = regexcache.compile(r"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>it/s|s/it)\b")


def rich_bar(body: str) -> Optional[_Named]:
    """A rich progress bar's count, label (the words before its glyphs, any phase or none), rate and
    remaining time; None for a line that draws none. By shape only (templates ask it too)."""
    m = RICH_BAR.search(body)
    if m is None:
        return None
    label = body[:m.start()].strip().rstrip(":").strip()[:100]
    rest = body[m.end():]
    rate: Optional[float] = None
    r = _RICH_RATE.search(rest)
    if r is not None:
        v = float(r.group("v"))
        rate = v if r.group("u") == "it/s" else (1.0 / v if v else None)
    t = _RICH_REMAINING.search(rest)
    eta = clock(t.group("rem")) if t is not None else None
    return _Named(m, label, label_phase(label), "rich bar n/N", rate, eta)


# Keras' progress bar (`Model.fit`'s Progbar, verbose=1): the batch counter, then an ASCII bar, then
# ` - ETA: 11s - loss: …` (or ` - 12s 25ms/step - loss: …` when the epoch is done). Unlabeled: its
# phase is the reading's (an `Epoch 3/10` line before it).
KERAS_BAR = regexcache.compile(r"^\s*(?P<n>\d+)/(?P<N>\d+) \[[=>.]{3,}\] - ")


def labelled_bracket(body: str) -> Optional[_Named]:
    """The [N/M] counter of a body whose label names a phase — the words before it, or (a build step)
    the words after it — or None. By shape only (templates ask it too). Of several, the last is read:
    the finest (`Epoch [3/10] Step [170/500]`), labelled with the ones before it (`Epoch 3 Step`).
    A rich progress bar's count is read first, whatever its label (rich_bar)."""
    if "/" not in body:
        return None
    if "━" in body or "╸" in body or "╺" in body:
        bar = rich_bar(body)
        if bar is not None:
            return bar
    if "[" not in body:
        return None
    keras = KERAS_BAR.match(body)
    if keras is not None:
        return _Named(keras, "", None, "keras bar n/N")
    found: Optional[_Named] = None
    for m in _labelled(LABELLED_BRACKET, _BRACKET, body):
        label = m.group("label").strip().rstrip(":").strip()
        if m.group("tags"):
            label = " ".join([label] + [t.strip("[] ") for t in m.group("tags").split("[")[1:]])
        phase = label_phase(label)
        if phase is not None:
            if found is not None:
                label = f"{found.label} {found.m.group('n')} {label}"
            found = _Named(m, label, phase)
    if found is not None:
        return found
    step = BUILD_STEP_ANYWHERE.search(body)
    if step is not None and _BUILD_WORDS.search(step.group("label")):
        return _Named(step, "build", "building")
    lead = LEAD_COUNT_BESIDE_LOSS.match(body)
    if lead is not None:
        return _Named(lead, "step", "training")
    return None


# "label N/M" with N/M a whole token ("Loading checkpoint 3/8", "Processing shard 3/8"): read where
# no step/epoch/iteration word is in the line (those are STEP/EPOCH's) and nothing more specific
# read it. Not a date ("2026/12/01"), nor "1.5/2", nor a path.
# Not the Kubernetes scheduler's fit (`0/8 nodes are available`), nor `kubectl get pods`' READY column (a pod's
# containers ready, then its STATUS), no progress.
_NOT_COUNTING = (r"(?! nodes? (?:are|is) available)(?! +(?:Running|Pending|Completed|CrashLoopBackOff|Error|Init:"
                 r"|ContainerCreating|PodInitializing|Terminating|OOMKilled|ImagePullBackOff|ErrImagePull|Evicted)\b)")
LABELLED_COUNT = regexcache.compile(r"(?P<label>[A-Za-z][\w .:\-]{0,60}?)\s+(?P<n>\d+)/(?P<N>\d+)(?![\w./%])"
                                    + _NOT_COUNTING)
_COUNT = regexcache.compile(r"\s+\d+/\d+(?![\w./%])" + _NOT_COUNTING)     # its counters alone
# A label whose last word says who counts, not how far ("rank 3/8", "GPU 1/8", NCCL's "Channel 01/32",
# "TP 0/4"), which try ("attempt 1/5"), or when ("at 01/12"): no progress unless a word of it names a phase.
_NOT_PROGRESS = regexcache.compile(r"(?i)(?:^|[^a-z])(?:rank|local_rank|world|node|host|gpu|device|worker|proc|process|pid"
                           r"|replica|channel|ring|tree|peer|tp|pp|dp|ep|cp|attempt|retry|retries|try"
                           r"|at|on|since|until|from|by|date|day)s?$")


def labelled_count(body: str) -> Optional["re.Match[str]"]:
    """The first "label N/M" of a body whose label names a phase, else the first whose label names
    what is counted (not who: _NOT_PROGRESS), or None. By shape only (the template scanner asks it
    of digit-normalised bodies): is_count() judges the numbers."""
    if "/" not in body or body.startswith("[+] "):   # (docker compose's own `[+] Running 2/3`: its containers)
        return None
    plain = None
    for m in _labelled(LABELLED_COUNT, _COUNT, body):
        label = m.group("label")
        if label_phase(label):
            return m
        if plain is None and not _NOT_PROGRESS.search(label.strip().rstrip(":").rstrip()):
            plain = m
    return plain


# A count after a record's epoch, labelled by a word (`epoch 2/20 | batch 340/1563`): the finer one, read
# as the step where no step word is in the line. Groups 1 and 2 are n and N, as STEP's.
_COUNT_AFTER = regexcache.compile(r"(?<![\w.])[A-Za-z][A-Za-z_\-]*\s*[:=#]?\s*\[?\s*(\d+)\s*/\s*(\d+)(?![\w./%])")


# fairseq's `epoch 004:    1600 / 2211 loss=…`: the count right after the epoch's colon, no word of its own.
_COUNT_RIGHT_AFTER = regexcache.compile(r"\s*:\s*(\d+)\s*/\s*(\d+)(?![\w./%])")


def count_after_epoch(body: str, start: int) -> Optional["re.Match[str]"]:
    """The N/M right after a record's epoch (`epoch 004:  1600 / 2211`), else the first word-labelled N/M
    of body after `start` (where its epoch ends) whose word says what is counted (not who, not when:
    _NOT_PROGRESS), or None. By shape only; step_epoch_update judges the numbers."""
    m = _COUNT_RIGHT_AFTER.match(body, start)
    if m is not None:
        return m
    for m in _COUNT_AFTER.finditer(body, start):
        if not _NOT_PROGRESS.search(body[m.start():m.start(1)].strip(" \t:=#[")):
            return m
    return None


def is_count(done: float, total: float) -> bool:
    """done/total reads as a count (a position in a known total), not a ratio or a date."""
    return 0 < total and done <= total


def strict_number(token: str) -> Optional[Union[int, float]]:
    """The token as a number when the whole token is one and it is finite; else None."""
    token = token.strip()
    if not _STRICT.match(token):
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2 ** 63 else value


def counter(text: str) -> Optional[tuple[str, int, int]]:
    """(label, done, total) of the first labelled counter anywhere in text, or None."""
    m = COUNTER.search(text)
    if m is None:
        return None
    if m.group("bn") is not None:
        return ("", int(m.group("bn")), int(m.group("bN")))
    return (m.group("label").strip(), int(m.group("n")), int(m.group("N")))
