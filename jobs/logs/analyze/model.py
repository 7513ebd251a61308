"""The log analysis's vocabulary: phases, causes, limits, handler families and the result dataclasses."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntFlag
from typing import Any, Optional, Union

Number = Union[int, float]

PHASES = ("starting", "loading", "compiling", "capturing", "ready", "building", "training", "failed", "unknown")
CAUSES = ("cuda_oom", "host_oom", "nccl", "cuda_error", "import_error", "syntax_error", "bad_arguments",
          "build_failed", "hang", "gpu_fault", "exception",
          "time_limit", "node_fail", "preempted")     # Slurm's own end of a job (SLURM_END)
SERVING_KEYS = ("running", "waiting", "kv_cache_pct", "gen_tokens_per_s", "prompt_tokens_per_s",
                "spec_accept_rate", "spec_accept_len")

# Warning codes this module can emit (and what they mean to an operator).
WARNING_CODES = {
    "spec_decode_ineffective": "speculative decoding accepts so little that it slows serving down",
    "oom_risk": "memory is running out: a build heading for the host OOM killer, a trainer's GPU allocator flushing",
    "kv_cache_pressure": "the KV cache is full: requests are preempted/retracted or queue up",
    "jit_compile": "kernels are JIT-compiled on first use: startup may be silent for minutes",
    "error_recovered": "an error was logged but the job carried on (served, progress advanced, or it went on to another phase)",
    "request_error": "one request failed and the server answered it with an error (it serves on)",
}

GIANT_SEGMENT = 64 * 1024      # a segment longer than this is examined on its ends only
HEAD_BYTES = 8 * 1024
TAIL_BYTES = 8 * 1024
READ_CHUNK = 256 * 1024      # analyze_file: the per-line C passes stay in cache; Python overhead per chunk is small
MAX_MESSAGE = 400              # characters kept of a failure/warning message

# Spec-decode judgement: mean acceptance length 1.0 means no draft token is ever accepted.
SPEC_MIN_ACCEPT_LEN = 1.3
SPEC_MIN_ACCEPT_RATE = 0.10
SPEC_WINDOW = 5                # judge the mean of the last few stats windows, not one noisy one
STALL_REPEATS = 2                # consecutive "still waiting" notices (a minute apart) that make a hang
RECOVERY_ADVANCES = 3          # progress updates past a logged error that prove the job carried on


class Family(IntFlag):
    """The handler families a segment can concern (named by the prefilter anchors it contains)."""
    PROGRESS = 1
    SERVING = 2
    MARKER = 4      # phase markers
    FAILURE = 8
    WARNING = 16
    ENGINE = 32


# Plain ints on the hot paths: IntFlag's & and | run in Python, int's in C (Family(x) names a set).
P, S, M, F, W, E = (int(f) for f in Family)
ALL_FAMILIES = P | S | M | F | W | E


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Progress:
    done: Number
    total: Optional[Number]
    label: str
    rate: Optional[float] = None       # units of done per second
    eta_s: Optional[float] = None

    def __post_init__(self) -> None:
        # `step 1/1000…000` parses to an infinite total: no inf/nan (nor an ETA from one) leaves the analyzer.
        _finite_fields(self, ("done", "total", "rate", "eta_s"))
        if self.total is None and self.eta_s is not None:
            object.__setattr__(self, "eta_s", None)
        if self.done is None:
            object.__setattr__(self, "done", 0)

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

    def __post_init__(self) -> None:
        _finite_fields(self, SERVING_KEYS)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SERVING_KEYS}


@dataclass(frozen=True)
class KeyLine:
    """A line that matters for a post-mortem: root_cause, first_error, last_progress or ready."""
    kind: str
    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "line": self.line, "text": self.text}


@dataclass(frozen=True)
class LogAnalysis:
    engine: Optional[str] = None
    phase: str = "unknown"
    progress: Optional[Progress] = None
    failure: Optional[Failure] = None
    ready_line: Optional[int] = None
    serving: Optional[ServingNumbers] = None
    warnings: tuple[LogWarning, ...] = ()
    key_lines: tuple[KeyLine, ...] = ()
    # (field, the signature that decided it) for engine, phase, progress, failure, ready_line
    decided_by: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "phase": self.phase,
            "progress": self.progress.to_json() if self.progress else None,
            "failure": self.failure.to_json() if self.failure else None,
            "ready_line": self.ready_line,
            "serving": self.serving.to_json() if self.serving else None,
            "warnings": [w.to_json() for w in self.warnings],
            "key_lines": [k.to_json() for k in self.key_lines],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LogAnalysis":
        """The analysis back from `dataclasses.asdict(analysis)` (what the SSH agent sends: unrounded)."""
        def part(kind: Any, value: Optional[dict]) -> Any:
            return kind(**value) if value is not None else None
        return cls(engine=d.get("engine"), phase=d.get("phase", "unknown"), progress=part(Progress, d.get("progress")),
                   failure=part(Failure, d.get("failure")), ready_line=d.get("ready_line"),
                   serving=part(ServingNumbers, d.get("serving")),
                   warnings=tuple(LogWarning(**w) for w in d.get("warnings") or ()),
                   key_lines=tuple(KeyLine(**k) for k in d.get("key_lines") or ()),
                   decided_by=tuple(tuple(x) for x in d.get("decided_by") or ()))


def _finite_fields(obj: Any, names: tuple[str, ...]) -> None:
    """Set each named numeric field of a frozen dataclass that is not finite (inf, nan, past float range) to None."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if (isinstance(value, float) and not math.isfinite(value)) or (isinstance(value, int) and abs(value) > 2 ** 63):
            object.__setattr__(obj, name, None)


def _round(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)
