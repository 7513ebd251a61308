"""The signature table: one row per signature (id, pattern, the field it decides, priority, releases, example).

Adding a signature is adding a row. The failure rows (``FAILURES``) are what State reads a
record's cause with: rows are tried highest ``priority`` first and the first row whose
pattern is found in the record's body (and whose ``verdict`` accepts it) decides the line;
the row's ``rank`` says how strongly that line names the run's cause (cause.py's rule).
The other rows (``READERS``) document the readers of the other fields (engine, phase,
progress, serving numbers, warnings) with the pattern each uses. Every row carries one
example line; tests/test_analyze_table.py reads each example through the analyzer and
checks the row's field comes out as the row says, and docs/LOG_SIGNATURES.md is generated
from this table (``python -m gpudeck.jobs.logs.analyze.signatures > docs/LOG_SIGNATURES.md``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from . import generic
from .cause import Spec
from .patterns import (BAD_ARGS, BUILD_SPECIFIC, BUILD_UMBRELLA, CRASH, CUDA_ERR, CUDA_OOM, ENGINE_PATH,
                       ENGINE_STRONG, ENGINE_UMBRELLA, EPOCH, EXC_LINE, GPU_FAULT, HANG, HOST_OOM, IMPORT, JIT,
                       KV_PRESSURE, MAKE, MARKERS, NCCL, NINJA, NODE_OOM, OOM_RISK, PORT_IN_USE, STALL_NOTICE,
                       STEP, TQDM, is_build_tool)

SPECIFIC, EXCEPTION, UMBRELLA, ERROR_LEVEL = Spec.SPECIFIC, Spec.EXCEPTION, Spec.UMBRELLA, Spec.ERROR_LEVEL


class Context(NamedTuple):
    """What a row may read besides the line: the phase, the level, argparse's usage line."""
    phase: Optional[str]
    level: Optional[str]
    usage_near: bool           # an argparse `usage:` line within 60 lines above

    @property
    def building(self) -> bool:
        return self.phase == "building"


# (rank, cause, hint key) a row gives its line, or None: the row does not decide this line after all.
Verdict = Optional[tuple[int, str, str]]


@dataclass(frozen=True)
class Signature:
    id: str
    field: str                 # engine | phase | progress | cause | warning | serving
    pattern: Optional[re.Pattern]
    decides: str               # the value it decides (a cause, a phase, a warning code, a serving key...)
    priority: int              # failure rows: tried highest first; others: documentation order
    releases: str
    example: str
    rank: int = 0              # failure rows: cause.Spec of the candidate (see cause.py)
    hint: str = ""             # failure rows: the HINTS key when verdict is None
    verdict: Optional[Callable[[str, "re.Match[str]", Context], Verdict]] = None
    test: Optional[Callable[[str, Context], Any]] = None   # instead of pattern.search(body)

    def match(self, body: str, ctx: Context) -> Any:
        return self.test(body, ctx) if self.test is not None else self.pattern.search(body)   # type: ignore[union-attr]

    def decide(self, body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
        if self.verdict is not None:
            return self.verdict(body, m, ctx)
        return (self.rank, self.decides, self.hint or self.decides)


# --------------------------------------------------------------------------- verdicts (hint refinements)

def _cuda_oom(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "KV cache" in body and "out of memory" not in body:
        key = "cuda_oom_kv"
    elif "desired GPU memory utilization" in body or "unbalanced" in body:
        key = "cuda_oom_occupied"
    elif ctx.phase == "capturing" or "graph" in body.lower():
        key = "cuda_oom_capture"
    else:
        key = "cuda_oom"
    return (SPECIFIC, "cuda_oom", key)


def _host_oom(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "ptxas" in body and "signal 9" not in body:
        return (SPECIFIC, "build_failed", "build_segfault")
    if ctx.building or is_build_tool(body):
        return (SPECIFIC, "host_oom", "host_oom_build")
    if "exitcode" in body or "SIGKILL" in body:
        return (SPECIFIC, "host_oom", "host_oom_launcher")     # torch elastic reporting its worker's SIGKILL
    return (SPECIFIC, "host_oom", "host_oom")


def _plain_oom(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if ctx.building or "cc1plus" in body or "allocating" in body:
        return (SPECIFIC, "host_oom", "host_oom_build")
    return (SPECIFIC, "cuda_oom", "cuda_oom")


def _cuda_err(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "no kernel image" in body:
        key = "cuda_error_arch"
    elif "peer access" in body or "PeerAccess" in body:
        key = "cuda_error_p2p"
    elif "Assertion" in body or "device-side assert" in body:
        key = "cuda_error_assert"
    else:
        key = "cuda_error"
    return (SPECIFIC, "cuda_error", key)


def _nccl(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    key = "nccl_net" if "NET/" in body else "nccl_shm" if "/dev/shm" in body else "nccl"
    if "timeout" in body.lower() or "timed out" in body:
        key = "nccl_first" if "SeqNum=1," in body or "last completed NCCL work: 0" in body else "nccl_timeout"
    return (SPECIFIC, "nccl", key)


def _watchdog(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    cause = generic.watchdog_cause(body)
    return None if cause is None else (SPECIFIC, cause, "nccl_timeout" if cause == "nccl" else "hang")


def _import(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    exc = EXC_LINE.match(body)
    if exc and not (exc.group("msg") or "").strip():
        return (UMBRELLA, "import_error", "import_error")
    key = "import_error_abi" if ("undefined symbol" in body or "GLIBC" in body) else "import_error"
    return (SPECIFIC, "import_error", key)


def _import_test(body: str, ctx: Context) -> Optional["re.Match[str]"]:
    m = IMPORT.search(body)
    if m is not None:
        return m
    exc = EXC_LINE.match(body)
    if exc and exc.group("type").split(".")[-1] in ("ImportError", "ModuleNotFoundError"):
        return exc
    return None


def _bad_args(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if ctx.usage_near or "unrecognized arguments" in body or "arguments are required" in body \
            or body.startswith("Error: "):
        return (SPECIFIC, "bad_arguments", "bad_arguments")
    return None


def _bad_args_test(body: str, ctx: Context) -> Optional["re.Match[str]"]:
    if "error:" in body or body.startswith("Error: "):
        return BAD_ARGS.search(body)
    return None


def _build_specific(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    return (SPECIFIC, "build_failed", "build_segfault" if "died due to signal" in body else "build_failed")


def _engine_umbrella(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if ctx.building:
        return (UMBRELLA, "build_failed", "build_failed")
    if body.startswith("Traceback"):
        return (UMBRELLA, "exception", "exception_traceback")
    if "Traceback" in body or "hit an exception" in body:
        return (UMBRELLA, "exception", "exception_below")
    return (UMBRELLA, "exception", "exception_umbrella")


def _crash(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if ctx.building:
        return (EXCEPTION, "build_failed", "build_failed")
    return (EXCEPTION, "exception", "exception_bus_error" if body.startswith("Bus error") else "exception_crash")


def _exception(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    cause, rank, key = generic.exception_cause(m.group("type"))
    if cause == "exception" and ctx.building:
        return (EXCEPTION, "build_failed", "build_failed")
    return (rank, cause, key)


def _error_level(body: str, ctx: Context) -> Optional[bool]:
    return True if ctx.level in ("ERROR", "CRITICAL", "FATAL") else None


def _cuda_oom_test(body: str, ctx: Context) -> Any:
    return CUDA_OOM.search(body) or ("out of memory" in body and "CUDA" in body) or None


def _exc_test(body: str, ctx: Context) -> Any:
    return EXC_LINE.match(body)


# --------------------------------------------------------------------------- the failure rows

FAILURES: tuple[Signature, ...] = (
    Signature("GPU_FAULT", "cause", GPU_FAULT, "gpu_fault", 200, "NVIDIA driver (NVRM), GSP firmware R535+",
              "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", SPECIFIC),
    Signature("NODE_OOM", "cause", NODE_OOM, "host_oom", 190, "Ray >= 2.3 memory monitor",
              "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
              SPECIFIC, "host_oom_ray"),
    Signature("CUDA_OOM", "cause", CUDA_OOM, "cuda_oom", 180, "torch >= 1.x, vLLM, SGLang (all)",
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total "
              "capacity of 23.56 GiB", SPECIFIC, verdict=_cuda_oom,
              test=_cuda_oom_test),
    Signature("HOST_OOM", "cause", HOST_OOM, "host_oom", 170, "Linux OOM killer, gcc, torch elastic, docker",
              "c++: fatal error: Killed signal terminated program cc1plus", SPECIFIC, verdict=_host_oom),
    Signature("OUT_OF_MEMORY", "cause", re.compile("out of memory"), "cuda_oom", 160, "any",
              "RuntimeError: out of memory", SPECIFIC, verdict=_plain_oom),
    Signature("CUDA_ERR", "cause", CUDA_ERR, "cuda_error", 150, "torch, CUDA runtime (all)",
              "RuntimeError: CUDA error: an illegal memory access was encountered", SPECIFIC, verdict=_cuda_err),
    Signature("NCCL", "cause", NCCL, "nccl", 140, "NCCL 2.x, torch ProcessGroupNCCL",
              "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE) "
              "ran for 600059 milliseconds before timing out.", SPECIFIC, verdict=_nccl),
    Signature("PORT_IN_USE", "cause", PORT_IN_USE, "exception", 130, "uvicorn, any server",
              "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already "
              "in use", SPECIFIC, "exception_port"),
    Signature("HANG", "cause", HANG, "hang", 120, "SGLang 2024-2025 scheduler watchdog, vLLM V1",
              "[2025-03-01 10:00:00 TP3] Watchdog timeout (self.watchdog_timeout=300)", SPECIFIC),
    Signature("WATCHDOG", "cause", generic.WATCHDOG, "hang", 115,
              "any watchdog/timeout family: SGLang 2026 `Scheduler watchdog timeout (…, self.soft=False)`",
              "[2026-05-02 10:09:10 PP1 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, "
              "self.soft=False)", SPECIFIC, verdict=_watchdog),
    Signature("IMPORT", "cause", IMPORT, "import_error", 110, "Python, ld.so (all)",
              "ImportError: /x/sgl_kernel/common_ops.abi3.so: undefined symbol: cuGreenCtxStreamCreate",
              SPECIFIC, verdict=_import, test=_import_test),
    Signature("BAD_ARGS", "cause", BAD_ARGS, "bad_arguments", 100, "argparse, click",
              "vllm: error: unrecognized arguments: --foo", SPECIFIC, verdict=_bad_args, test=_bad_args_test),
    Signature("BUILD_SPECIFIC", "cause", BUILD_SPECIFIC, "build_failed", 90, "gcc, nvcc, CMake, ld",
              "csrc/attention.cu(12): error: identifier \"foo\" is undefined", SPECIFIC, verdict=_build_specific),
    Signature("BUILD_TOOL_EXIT", "cause", generic.BUILD_TOOL_EXIT, "build_failed", 85,
              "subprocess / setup.py / torch cpp_extension driving ninja, cmake, make, nvcc, pip",
              "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.",
              EXCEPTION, "build_failed"),
    Signature("BUILD_UMBRELLA", "cause", BUILD_UMBRELLA, "build_failed", 80,
              "ninja, make, pip >= 23 (box-drawing envelope), setuptools",
              "  \u00d7 Building wheel for vllm (pyproject.toml) did not run successfully.", UMBRELLA),
    Signature("ENGINE_UMBRELLA", "cause", ENGINE_UMBRELLA, "exception", 70,
              "vLLM V1 EngineCore, SGLang scheduler, torchrun, Python tracebacks",
              "RuntimeError: Engine core initialization failed. See root cause above.", UMBRELLA,
              verdict=_engine_umbrella),
    Signature("CRASH", "cause", CRASH, "exception", 60, "any native crash",
              "Segmentation fault (core dumped)", EXCEPTION, verdict=_crash),
    Signature("EXC_LINE", "cause", EXC_LINE, "exception", 50, "Python (a traceback's final exception, by type)",
              "ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3).",
              EXCEPTION, verdict=_exception, test=_exc_test),
    Signature("ERROR level", "cause", None, "exception", 0, "any logger at ERROR/CRITICAL/FATAL",
              "ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 1159 died, "
              "exit code: -6", ERROR_LEVEL, "exception_umbrella", test=_error_level),
)
_ORDERED = tuple(sorted(FAILURES, key=lambda s: -s.priority))


def classify(body: str, ctx: Context) -> Optional[tuple[int, str, str, str]]:
    """(rank, cause, hint key, signature id) of the first row, by priority, that decides this line."""
    for sig in _ORDERED:
        m = sig.match(body, ctx)
        if m is None:
            continue
        v = sig.decide(body, m, ctx)
        if v is not None:
            return (v[0], v[1], v[2], sig.id)
    return None
