"""The signature table: one row per signature (id, pattern, the field it decides, priority, releases, example).

Adding a signature is adding a row. The failure rows (``FAILURES``) are what State reads a
record's cause with: they compile to one multi-pattern matcher (matcher.py: hyperscan where
it installs) that names the rows worth asking; those are tried highest ``priority`` first and
the first whose pattern is found in the record's body (and whose ``verdict`` accepts it)
decides the line; the row's ``rank`` says how strongly that line names the run's cause
(cause.py's rule). The engine rows (``ENGINES``) and phase rows (``PHASES``) compile to the
patterns State reads engines and phase markers with (ENGINE_STRONG/PATH/WEAK, MARKERS). The
record-prefix, progress, serving and warning rows document the readers of patterns.py and
generic.py with the pattern each uses. Every row carries one
example line; tests/test_analyze_table.py reads each example through the analyzer and
checks the row's field comes out as the row says, and docs/LOG_SIGNATURES.md is generated
from this table (``python docs/make_log_signatures.py``; a test checks the checked-in copy).

A new row comes with one fixture in tests/fixtures/logs/ whose first lines say what it reads and
which row reads it (``# expect: {"phase": "failed", "failure": ["hang", 9]}``, ``# fix: ROW``):
tests/test_analyze_table.py checks that reading and that the row decided it, and the differential
test (tests/test_analyze_diff.py) takes the fixture's differences from the old analyzer as the
row's fix. Nothing else is listed anywhere.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Protocol

from . import generic, patterns
from .cause import Spec
from .matcher import Matcher
from .model import F, M, P, S, W
from .patterns import (_LEVELS, _PREFIX, BAD_ARGS, BRACKET_LEVEL_TAIL, CONFIG_REJECTED, CUDA_NO_DEVICE, DISK_FULL,
                       HF_HUB, HINTS, STAMP_TAIL, STAMP_ZONE, BUILD_SPECIFIC, BUILD_UMBRELLA, CRASH, CUDA_ERR, CUDA_OOM,
                       ENGINE_UMBRELLA, EPOCH, EXC_LINE, FOREIGN_PREFIX, GPU_FAULT, HANG, HOST_OOM, IMPORT, JIT,
                       KV_PRESSURE, LOSS_DICT, MAKE, NCCL, NINJA, NODE_OOM, NUM_EPOCHS, OOM_RISK, PORT_IN_USE,
                       PYDANTIC_DETAIL, REQUEST_ERROR, BATCH_END, SLURM_END, STEP, TOTAL_STEPS, TQDM, VLLM_SPEC_RATE, _SGLANG_FIELD, _VLLM_STATS,
                       is_build_tool)
from . import regexcache

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


class RowPattern(Protocol):
    """What a row's pattern is to its readers: a compiled re.Pattern, or a _Lazy one (compiled on first use)."""

    @property
    def pattern(self) -> str: ...

    def search(self, string: str, pos: int = ..., endpos: int = ...) -> Optional["re.Match[str]"]: ...

    def match(self, string: str, pos: int = ..., endpos: int = ...) -> Optional["re.Match[str]"]: ...


@dataclass(frozen=True)
class Signature:
    id: str
    field: str                 # engine | phase | progress | cause | warning | serving
    pattern: Optional[RowPattern]      # None: a row read by its level or its `test`
    decides: str               # the value it decides (a cause, a phase, a warning code, a serving key...)
    priority: int              # failure rows: tried highest first; others: documentation order
    releases: str
    example: str
    rank: int = 0              # failure rows: cause.Spec of the candidate (see cause.py)
    hint: str = ""             # failure rows: the HINTS key when verdict is None
    verdict: Optional[Callable[[str, "re.Match[str]", Context], Verdict]] = None
    reads: str = ""            # what the analyzer reads from `example` alone (tests); default: decides
    ends_traceback: bool = False   # an envelope that is a traceback's final line: it replaces the traceback's header
    test: Optional[Callable[[str, Context], Any]] = None   # instead of pattern.search(body)
    advice: str = ""           # failure rows: the hint's own text (its HINTS key is the row's id): a row complete in itself

    def match(self, body: str, ctx: Context) -> Any:
        return self.test(body, ctx) if self.test is not None else self.pattern.search(body)   # type: ignore[union-attr]

    def decide(self, body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
        if self.verdict is not None:
            return self.verdict(body, m, ctx)
        return (self.rank, self.decides, self.hint or (self.id if self.advice else self.decides))


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
    if body.startswith("Exit Code:"):
        # `kubectl describe`'s exit status of SIGKILL: its Reason says who (OOMKilled: the memory limit, a
        # HOST_OOM line of its own; Error: another SIGKILL, such as the kubelet's after a failed probe)
        return (EXCEPTION, "host_oom", "host_oom_k8s_exit")
    if "ptxas" in body and "signal 9" not in body:
        return (SPECIFIC, "build_failed", "build_segfault")
    if ctx.building or is_build_tool(body):
        return (SPECIFIC, "host_oom", "host_oom_build")
    if "exitcode" in body or "SIGKILL" in body or "terminated with" in body:
        return (SPECIFIC, "host_oom", "host_oom_launcher")     # a launcher reporting its worker's SIGKILL
    return (SPECIFIC, "host_oom", "host_oom")


# An engine announcing it kills its own processes: State notes the line whatever candidate is held (the
# SIGKILL after it is no OOM), so no template of it is skipped as a held candidate's (templates.py).
ENGINE_SELF_KILL = regexcache.compile(r"Got fatal signal from worker processes, shutting down"
                                      r"|Received sigquit from a child process"
                                      r"|SIGQUIT received\..*It usually means one child failed"
                                      r"|Triggering SIGQUIT for cleanup"
                                      r"|Dumping requests before crash")   # (SGLang's tokenizer manager, then the kill)

_SLURM_ENDS = {"TIME LIMIT": ("time_limit", "slurm_time_limit"), "PREEMPTION": ("preempted", "slurm_preempted"),
               "JOB REQUEUE": ("preempted", "slurm_requeued")}    # (scontrol requeue, a requeue-mode preemption)


def _slurm_end(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    why = m.group("why") or ""
    if why.startswith("NODE FAIL"):      # "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"
        return (SPECIFIC, "node_fail", "slurm_node_fail")
    hit = _SLURM_ENDS.get(why)
    return None if hit is None else (SPECIFIC, hit[0], hit[1])     # none: scancel, a stop someone asked for


_BATCH_ENDS = {"walltime": ("time_limit", "batch_time_limit"), "RUNLIMIT": ("time_limit", "batch_time_limit"),
               "CPULIMIT": ("time_limit", "batch_time_limit"), "PREEMPT": ("preempted", "batch_preempted")}


def _batch_end(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    what = m.group("pbs") or m.group("lsf")
    if what is None:
        return (SPECIFIC, "preempted", "batch_preempted")         # Kubernetes' preemption event
    cause, key = _BATCH_ENDS.get(what, ("host_oom", "batch_oom"))  # PBS mem/vmem/pmem, LSF MEMLIMIT/SWAP
    return (SPECIFIC, cause, key)


def _slurm_refused(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "timed out" in body or "contact slurm controller" in body or "Zero Bytes were transmitted" in body:
        return None             # the controller did not answer: SLURM_COMM's, the cluster's trouble, not the request's
    return (SPECIFIC, "bad_arguments", "slurm_refused")


def _slurm_comm(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    return (SPECIFIC, "node_fail", "slurm_node_fail" if "Node failure on" in body else "slurm_comm")


# An allocation the line says was the GPU's (a CUDA call, a device, a GPU buffer): a plain `out of memory` there is CUDA's.
_GPU_ALLOCATION = regexcache.compile(r"\bcuda\w*|\bCUDA\w*|\bGPU\b|\bon device \d|\bVRAM\b|\bhipMalloc")


def _plain_oom(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "ecode out of memory happened" in body:
        return None             # SGLang 0.2-0.4 retracting requests (KV cache pressure, a warning): it serves on
    if "cc1plus" in body:
        return (SPECIFIC, "host_oom", "host_oom_build")
    if _GPU_ALLOCATION.search(body) is not None:      # llama.cpp / Ollama: `… on device 0: cudaMalloc failed: out of memory`
        return (SPECIFIC, "cuda_oom", "cuda_oom")
    if ctx.building or "allocating" in body:
        return (SPECIFIC, "host_oom", "host_oom_build")
    return (SPECIFIC, "cuda_oom", "cuda_oom_nccl" if "Cuda failure" in body or "NCCL" in body else "cuda_oom")


CUDA_NO_DEVICE_RX = regexcache.compile(CUDA_NO_DEVICE)


def _cuda_err(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "no kernel image" in body:
        key = "cuda_error_arch"
    elif "peer access" in body or "PeerAccess" in body:
        key = "cuda_error_p2p"
    elif CUDA_NO_DEVICE_RX.search(body):
        key = "cuda_error_driver"
    elif "invalid device ordinal" in body:
        key = "cuda_error_ordinal"
    elif "Assertion" in body or "device-side assert" in body:
        key = "cuda_error_assert"
    else:
        key = "cuda_error"
    return (SPECIFIC, "cuda_error", key)


def _nccl(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if "nhandled cuda error" in body or "UnhandledCudaError" in body or "Call to CUDA function failed" in body:
        # NCCL passing on a CUDA call's failure: the CUDA error it names (torch's `Last error:` lines
        # below, NCCL's own `Cuda failure 'out of memory'`) is the cause; alone, it stays nccl.
        return (EXCEPTION, "nccl", "nccl_cuda")
    if "emote process exit" in body or "ncclRemoteError" in body or "closed by remote peer" in body:
        # A peer rank died (or the network failed): that rank's own error, printed before, is the cause;
        # alone, it stays nccl.
        return (EXCEPTION, "nccl", "nccl_remote")
    if "terminate called after throwing" in body:
        return (EXCEPTION, "nccl", "nccl")     # the abort of a c10::DistBackendError: its `what():` line says which
    if "ms for recv operation" in body or "ms for send operation" in body:
        return (SPECIFIC, "nccl", "nccl_gloo")
    key = "nccl_net" if "NET/" in body else "nccl_shm" if "/dev/shm" in body else "nccl"
    if "timeout" in body.lower() or "timed out" in body:
        key = "nccl_first" if "SeqNum=1," in body or "last completed NCCL work: 0" in body else "nccl_timeout"
    return (SPECIFIC, "nccl", key)


def _disk_full(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    key = "exception_shm_full" if "/dev/shm" in body or "</torch_" in body else "exception_disk_full"
    return (SPECIFIC, "build_failed" if ctx.building else "exception", key)


def _hf_hub(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    offline = "connect to" in body or "LocalEntryNotFound" in body or "outgoing traffic" in body
    return (EXCEPTION, "exception", "exception_hf_offline" if offline else "exception_hf_auth")


def _watchdog(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    cause = generic.watchdog_cause(body)
    return None if cause is None else (SPECIFIC, cause, "nccl_timeout" if cause == "nccl" else "hang")


def _import(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if body.startswith("Ignore import error when loading"):
        return None             # SGLang skipping a model class whose optional dependency is missing: it starts on
    if generic.AT_SHUTDOWN.search(body):
        return None             # a destructor's import at interpreter exit: noise after the run's own end
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


# argparse naming the option it rejects (`error: argument --tensor-parallel-size/-tp: invalid int value: 'auto'`):
# an option's value is wrong, usage line or not.
_ARGPARSE_OPTION = regexcache.compile(r": error: argument --?[\w-]+(?:/--?[\w-]+)*: ")


def _bad_args(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if _ARGPARSE_OPTION.search(body) and ("invalid" in body or "expected" in body):
        return (SPECIFIC, "bad_arguments", "bad_arguments_parse")
    if ctx.usage_near or "unrecognized arguments" in body or "arguments are required" in body \
            or body.startswith("Error: "):
        return (SPECIFIC, "bad_arguments", "bad_arguments")
    return None


def _bad_args_test(body: str, ctx: Context) -> Optional["re.Match[str]"]:
    if "error:" in body or body.startswith("Error: "):
        return BAD_ARGS.search(body)
    return None


def _config_rejected(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    """A config check's words on an exception's own line (a traceback's last, pydantic's detail): the option."""
    if EXC_LINE.match(body) or PYDANTIC_DETAIL.match(body):
        return (SPECIFIC, "bad_arguments", "bad_arguments" if "HfArgumentParser" in body else "bad_arguments_value")
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
    bus = body.startswith("Bus error") or "(SIGBUS)" in body
    return (EXCEPTION, "exception", "exception_bus_error" if bus else "exception_crash")


def _exception(body: str, m: "re.Match[str]", ctx: Context) -> Verdict:
    if generic.AT_SHUTDOWN.search(body):
        return None
    cause, rank, key = generic.exception_cause_of(m.group("type"), body)
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
    Signature("SLURM_END", "cause", SLURM_END, "time_limit", 210, "Slurm slurmstepd (all): the job's end it wrote "
              "itself; `node_fail` and `preempted` (PREEMPTION, JOB REQUEUE) by the same line's reason, none for a plain scancel",
              "slurmstepd: error: *** JOB 4815162 ON gpu-node-07 CANCELLED AT 2026-05-02T14:00:03 DUE TO TIME LIMIT ***",
              SPECIFIC, verdict=_slurm_end),
    Signature("BATCH_END", "cause", BATCH_END, "time_limit", 209, "PBS Pro / Torque (`=>> PBS: job killed: walltime "
              "N exceeded limit N`, mem), IBM LSF (`TERM_RUNLIMIT`, `TERM_MEMLIMIT`, `TERM_PREEMPT`), Kubernetes' "
              "`Preempted by pod … on node …` event: the scheduler's own end of the job, as SLURM_END",
              "=>> PBS: job killed: walltime 43236 exceeded limit 43200", SPECIFIC, verdict=_batch_end),
    Signature("SLURM_REFUSED", "cause", regexcache.compile(r"(?:sbatch|srun|salloc): error: (?:Batch job submission failed"
                                                  r"|Unable to allocate resources|Job submit/allocate failed): "),
              "bad_arguments", 205, "Slurm sbatch / srun / salloc (all): the request was refused before the job ran "
              "(partition, account, QOS, gres, time limit, node count); the reason ends the line",
              "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification",
              SPECIFIC, verdict=_slurm_refused),
    Signature("SLURM_COMM", "cause", regexcache.compile(r"\b(?:srun|slurmstepd|salloc|sbatch|slurmd)(?:-[\w.\-]+)?(?:\[\d+\])?: "
                                               r"error: .*?"
                                               r"(?:Socket timed out|Zero Bytes were transmitted|Communication "
                                               r"(?:connection|send|receive) failure|contact slurm controller"
                                               r"|Connection (?:timed out|refused)|Node failure on )"),
              "node_fail", 204, "Slurm srun / slurmstepd / sbatch (all): its daemons did not answer each other "
              "(`Socket timed out on send/recv operation`, `Zero Bytes were transmitted or received`, a connection "
              "failure) or srun saw the node fail (`Node failure on N`): the node's or the cluster's trouble",
              "srun: error: Task launch for StepId=4815162.0 failed on node gpu-node-07: Socket timed out on "
              "send/recv operation", SPECIFIC, verdict=_slurm_comm),
    Signature("DCGM_DIAG_FAIL", "cause", regexcache.compile(r"(?:^|\|)\s*Fail - (?:GPUs?: \d[\d, ]*|All)\b"),
              "gpu_fault", 199, "NVIDIA DCGM's `dcgmi diag` result table (DCGM 2.x-4.x): a test's `Fail - GPU: N` cell",
              "|                           | Fail - GPU: 5                                  |", SPECIFIC,
              advice="DCGM's diagnostic failed a test on this GPU — drain it from scheduling, read the Warning "
              "rows under the failed test (an ECC DBE, a PCIe replay, a thermal violation), then reset or RMA it"),
    Signature("RAY_NODE_DIED", "cause", regexcache.compile(r"The actor died because its node has died"
                                                  r"|\bhas been marked dead because the detector has missed too many heartbeats"),
              "node_fail", 203, "Ray 2.x (all): an actor's node died (`ActorDiedError`'s context, the GCS's "
              "`… has been marked dead because the detector has missed too many heartbeats`), as vLLM's and "
              "SGLang's Ray executors print it: a node of the cluster, not the engine",
              "The actor died because its node has died. Node Id: 5c2b8e1d4f7a90b3e6f1d2c0a8b4e9f7d1c3a5b6e8f0d2c4",
              SPECIFIC, advice="a node of the Ray cluster died or stopped answering (missed heartbeats: the "
              "network, its raylet killed, the host out of memory or rebooted) — check that node's "
              "/tmp/ray/session_latest/logs and dmesg, then restart the cluster"),
    Signature("GPU_FAULT", "cause", GPU_FAULT, "gpu_fault", 200, "NVIDIA driver (NVRM), GSP firmware R535+",
              "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", SPECIFIC),
    Signature("NODE_OOM", "cause", NODE_OOM, "host_oom", 190, "Ray >= 2.3 memory monitor",
              "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
              SPECIFIC, "host_oom_ray"),
    Signature("CUDA_OOM", "cause", CUDA_OOM, "cuda_oom", 180, "torch >= 1.x, vLLM, SGLang (all); JAX/XLA `RESOURCE_EXHAUSTED: Out of memory`, TensorFlow `OOM when allocating tensor`",
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total "
              "capacity of 23.56 GiB", SPECIFIC, verdict=_cuda_oom,
              test=_cuda_oom_test),
    Signature("ENGINE_SELF_KILL", "cause", ENGINE_SELF_KILL,
              "exception", 171, "vLLM V1 0.8-0.9 (core_client: its worker's error above, then it SIGKILLs its own "
              "process tree), SGLang (its SIGQUIT handler, a child's failure above, then the same; 2026: `SIGQUIT "
              "received. signum=None, frame=None. It usually means one child failed.`, its subprocess watchdog's "
              "`Triggering SIGQUIT for cleanup`; its tokenizer manager's `Dumping requests before crash` just before the kill): an envelope; the shell's bare `Killed` after it (within 6 lines: "
              "SGLang logs its crash-dump settings between) is that kill, not the OOM killer's; and a serving line "
              "just before it (another DP rank's) proved no recovery",
              "CRITICAL 05-07 19:18:17 [core_client.py:359] Got fatal signal from worker processes, shutting down. "
              "See stack trace above for root cause issue.", UMBRELLA, "exception"),
    Signature("HOST_OOM", "cause", HOST_OOM, "host_oom", 170, "Linux OOM killer, gcc, torch elastic, docker",
              "c++: fatal error: Killed signal terminated program cc1plus", SPECIFIC, verdict=_host_oom),
    Signature("SIGKILLED", "cause", generic.SIGKILLED, "host_oom", 165, "Go os/exec, supervisors, launchers",
              "worker 3: signal: killed", SPECIFIC, "host_oom"),
    Signature("KILLED_EXIT", "cause", generic.KILLED_EXIT, "host_oom", 166,
              "SIGKILL's exit code in spellings HOST_OOM misses: CI runners / k8s `Exit code: 137`, Python "
              "subprocess `returncode=-9`", "CompletedProcess(args=['python', 'prep.py'], returncode=-9)",
              SPECIFIC, verdict=_host_oom),
    Signature("OUT_OF_MEMORY", "cause", regexcache.compile("out of memory"), "cuda_oom", 160, "any",
              "RuntimeError: out of memory", SPECIFIC, verdict=_plain_oom),
    Signature("TORCH_NO_CUDA", "cause", regexcache.compile(r"Torch not compiled with CUDA enabled"), "cuda_error", 151,
              "torch (all): a CPU-only wheel, often pulled in by another package's pin",
              "AssertionError: Torch not compiled with CUDA enabled", SPECIFIC,
              advice="this torch build has no CUDA (a CPU-only wheel): reinstall torch from the CUDA index "
                     "(pip install torch --index-url https://download.pytorch.org/whl/cu128) and check "
                     "`python -c 'import torch; print(torch.version.cuda)'` prints a version"),
    Signature("CUDA_ERR", "cause", CUDA_ERR, "cuda_error", 150,
              "torch, CUDA runtime (all); no usable GPU (`No CUDA GPUs are available`, "
              "NVML `Driver/library version mismatch`, cudaGetDeviceCount's Error 804)",
              "RuntimeError: CUDA error: an illegal memory access was encountered", SPECIFIC, verdict=_cuda_err),
    Signature("STORE_BARRIER_TIMEOUT", "cause",
              regexcache.compile(r"Timed out initializing process group in store based barrier"),
              "nccl", 141, "torch.distributed 1.x-2.x (`_store_based_barrier`): not every rank joined the process "
              "group before its timeout (`world_size=8, worker_count=7`)",
              "RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
              "store_based_barrier_key:1 (world_size=8, worker_count=7, timeout=0:30:00)", SPECIFIC, "nccl_rendezvous"),
    Signature("NVSWITCH_FATAL", "cause", regexcache.compile(r"\bNVSwitch fatal error\b"),
              "gpu_fault", 198, "NVIDIA Fabric Manager (HGX/DGX, R470 -> R570): an NVSwitch's fatal error, which "
              "takes every GPU of the system down with it",
              "[ERROR] [tid 2903] detected NVSwitch fatal error 20034 on NVSwitch pci bus id 00000000:05:00.0 "
              "physical id 0 port 12", SPECIFIC, advice="an NVSwitch reported a fatal error: the GPUs behind it "
              "cannot talk to each other until every GPU and NVSwitch of the system is reset (nvidia-smi -r, or a "
              "reboot); if it repeats, the baseboard needs service"),
    Signature("CLOUD_PREEMPTED", "cause",
              regexcache.compile(r"\bcompute\.instances\.preempted\b|\bSpot ITN received\b"
                                 r"|\bSpot Instance Interruption Warning\b"),
              "preempted", 208, "the cloud's own notice that it takes a spot/preemptible VM back: GCE's "
              "`compute.instances.preempted` operation, AWS's two-minute Spot interruption (the EC2 event, "
              "aws-node-termination-handler's `Spot ITN received`)",
              "systemevent-1715071102351-617d1c0d8d2f3  compute.instances.preempted  us-central1-a/instances/a3-3  "
              "200  DONE", SPECIFIC, advice="the cloud took the spot/preemptible VM back: not a bug — resume from "
              "the last checkpoint, or run where the capacity is reserved"),
    Signature("TEST_TIMEOUT", "cause",
              regexcache.compile(r"^Timeout \(\d+:\d\d:\d\d\)!$|\bFailed: Timeout >\d+(?:\.\d+)?s\b"),
              "hang", 119, "Python's faulthandler (`dump_traceback_later`: `Timeout (0:30:00)!`, then every "
              "thread's stack), pytest-timeout (`Failed: Timeout >1800.0s`): the run sat that long without ending",
              "Timeout (0:30:00)!", SPECIFIC, "hang_timeout"),
    Signature("NCCL", "cause", NCCL, "nccl", 140, "NCCL 2.x, torch ProcessGroupNCCL, gloo's `Timed out waiting "
              "Nms for recv operation` (`remote process exited`, "
              "ncclRemoteError: another rank's death, ranked as an exception, so that rank's earlier error decides)",
              "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE) "
              "ran for 600059 milliseconds before timing out.", SPECIFIC, verdict=_nccl),
    Signature("SAFETENSORS_CUT_SHORT", "cause",
              regexcache.compile(r"Error while deserializing header: (?:MetadataIncompleteBuffer|Header\w+|"
                                 r"InvalidHeader\w*|header too (?:large|small)|incomplete metadata)"),
              "exception", 131,
              "safetensors 0.3-0.6 (its Rust error's Debug name, or 0.6's words), read by vLLM, SGLang, "
              "transformers' loaders",
              "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
              SPECIFIC,
              advice="a safetensors weight file is cut short or is not the file itself (a partial download, a "
                     "git-lfs pointer): compare its size with the hub's, delete it and download it again "
                     "(huggingface-cli download --force-download)"),
    Signature("SHM_EXHAUSTED", "cause",
              regexcache.compile(r"killed by signal: Bus error|out of shared memory|insufficient shared memory"),
              "exception", 128, "torch DataLoader (all: `DataLoader worker (pid N) is killed by signal: Bus error. "
              "It is possible that dataloader's workers are out of shared memory`)",
              "RuntimeError: DataLoader worker (pid 4123) is killed by signal: Bus error. It is possible that "
              "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
              SPECIFIC,
              advice="/dev/shm is full: DataLoader workers pass batches through shared memory — give the container "
                     "more (docker --shm-size=16g or --ipc=host; Kubernetes: an emptyDir with medium: Memory at "
                     "/dev/shm), or lower num_workers"),
    Signature("MODEL_LOAD_FAILED", "cause",
              regexcache.compile(r"\berror loading model: |\bfailed to load model\b|exiting due to model loading error"),
              "exception", 129, "llama.cpp server / llama-cli (2024-2026, `llama_model_load: error loading model:`), "
              "Ollama's runner", "llama_model_load: error loading model: llama_model_loader: failed to load model from "
              "/models/x.gguf", EXCEPTION,
              advice="the model file could not be loaded: check the path, that the file is whole (its size against "
                     "the source's) and that this build reads its format (a GGUF newer than the binary)"),
    Signature("SERVER_EXIT", "cause", regexcache.compile(r"\bexiting due to (?:[\w-]+ ){0,3}error\b"),
              "exception", 58, "llama.cpp server's `main: exiting due to HTTP server error`: a server giving up, "
              "its reason on the lines above", "main: exiting due to HTTP server error", UMBRELLA, "exception"),
    Signature("PORT_IN_USE", "cause", PORT_IN_USE, "exception", 130, "uvicorn, llama.cpp server, any server",
              "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already "
              "in use", SPECIFIC, "exception_port"),
    Signature("ROUTER_WORKERS_TIMEOUT", "cause",
              regexcache.compile(r"Timeout \d+s waiting for workers\b.{0,400}?\bto become healthy"),
              "hang", 122, "SGLang's router (sglang_router 0.1 -> 2026, Rust): it gives up at startup when its workers' "
              "/health never answered (`Failed to create router: Timeout 300s waiting for workers [...] to become healthy`)",
              "ERROR sglang_router_rs::routers::pd_router: src/routers/pd_router.rs:301: Timeout 600s waiting for workers "
              "[\"http://10.0.3.5:30002\"] to become healthy. Please set --router-worker-startup-timeout-secs",
              SPECIFIC, advice="the router gave up waiting for its workers' /health: a worker is down or unreachable "
              "from the router, or still loading (a long weight load or torch.compile) — check each worker's own log, "
              "and give a slow start more time with --router-worker-startup-timeout-secs"),
    Signature("PROBE_KILLED", "cause",
              regexcache.compile(r"failed (?:liveness|startup) probe, will be restarted"),
              "hang", 121, "Kubernetes kubelet's event (any release): a liveness/startup probe's failures end the "
              "container (SIGTERM, then SIGKILL: `Exit Code: 137`, `Reason: Error`)",
              "Normal   Killing    3m12s (x3 over 27m)    kubelet  Container sglang failed liveness probe, will be "
              "restarted", SPECIFIC, advice="the kubelet killed the container because its liveness (or startup) probe "
              "failed: the server did not answer in time — a long weight load or CUDA-graph capture answers no "
              "/health; give it a startupProbe with a failureThreshold that covers the startup, or a longer "
              "initialDelaySeconds"),
    Signature("HANG", "cause", HANG, "hang", 120, "SGLang 2024-2025 scheduler watchdog, vLLM V1, vLLM V0's engine "
              "iteration timeout",
              "[2025-03-01 10:00:00 TP3] Watchdog timeout (self.watchdog_timeout=300)", SPECIFIC),
    Signature("WATCHDOG", "cause", generic.WATCHDOG, "hang", 115,
              "any watchdog/timeout family: SGLang 2026 `Scheduler watchdog timeout (…, self.soft=False)`",
              "[2026-05-02 10:09:10 PP1 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, "
              "self.soft=False)", SPECIFIC, verdict=_watchdog),
    Signature("HEALTH_CHECK_STUCK", "cause", regexcache.compile(r"Health check failed\. Server couldn't get a response from "
              r"detokenizer"), "hang", 112, "SGLang 2024-2026 /health_generate (http_server.py: 503 after "
              "HEALTH_CHECK_TIMEOUT s without output); outranked by any specific error, before or after it",
              "[2026-05-02 10:09:41] Health check failed. Server couldn't get a response from detokenizer for last "
              "20 seconds. tic start time: 10:09:21. last_heartbeat time: 10:05:20", EXCEPTION, "hang_timeout"),
    # (a wait that is retried is not the end: `Timeout waiting for lock …, retrying`)
    Signature("WAIT_EXPIRED", "cause", regexcache.compile(r"^(?!.*\b[Rr]etry)(?:.*?Did not receive (?:a )?response "
              r"from .{1,80}? within \d+|Timeout waiting for (?!lock)\w|.*?not ready after waiting \d+ seconds)"),
              "hang", 111,
              "an engine's own wait that ran out, in words with no TimeoutError: vLLM 0.2x EngineCore's front-end "
              "handshake (`Did not receive response from front-end process within 5 minutes`), SGLang 0.5.x's DP "
              "controller (`Timeout waiting for worker ports from node 0`) and weights wait (`Weights are not ready "
              "after waiting 120 seconds`)",
              "RuntimeError: Did not receive response from front-end process within 5 minutes", EXCEPTION,
              "hang_timeout"),
    Signature("IMPORT", "cause", IMPORT, "import_error", 110, "Python, ld.so (all); cuDNN's loader (`Unable to "
              "load any of {libcudnn_ops.so.9…}`, `Could not load library libcudnn_cnn_infer.so.8`)",
              "ImportError: /x/sgl_kernel/common_ops.abi3.so: undefined symbol: cuGreenCtxStreamCreate",
              SPECIFIC, verdict=_import, test=_import_test),
    Signature("BAD_ARGS", "cause", BAD_ARGS, "bad_arguments", 100, "argparse, click",
              "vllm: error: unrecognized arguments: --foo", SPECIFIC, verdict=_bad_args, test=_bad_args_test),
    Signature("BAD_ARG_VALUE", "cause", regexcache.compile(r"User-specified \w+ \(\d+\) is greater than the derived"
                                                  r"|Bfloat16 is only supported on GPUs with compute capability"
                                                  r"|Both servers must use the same --[\w\-]+ value"),
              "bad_arguments", 95, "vLLM 0.6-0.2x config checks that name the flag to change (max_model_len, dtype); "
              "SGLang's same check of --context-length (`User-specified context_length (N) is greater than the derived`); "
              "SGLang 0.5.x PD disaggregation's prefill/decode mismatch (`Both servers must use the same --page-size value`)",
              "ValueError: User-specified max_model_len (65536) is greater than the derived max_model_len "
              "(max_position_embeddings=32768 or model_max_length=None in model's config.json).", SPECIFIC,
              "bad_arguments_value"),
    Signature("CONFIG_REJECTED", "cause", CONFIG_REJECTED, "bad_arguments", 96,
              "vLLM 0.2x config and loader checks (quantization method, load_format, TP/PP/world size, Ray placement "
              "group, tool parser), SGLang 0.3-0.5.x (attention backend, speculative algorithm, tp/ep sizes), transformers' "
              "HfArgumentParser (flags it does not use): an "
              "exception's own line (or pydantic's `Value error, ` detail) that rejects a launch option's value",
              "ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3).",
              SPECIFIC, verdict=_config_rejected),
    Signature("DISK_FULL", "cause", DISK_FULL, "exception", 92, "any write (ENOSPC, EDQUOT in strerror's words: "
              "Python OSError, pip, tar, compilers); torch.save's checkpoint cut short; `build_failed` while building; "
              "outranked by NCCL's own /dev/shm words",
              "OSError: [Errno 28] No space left on device", SPECIFIC, verdict=_disk_full),
    Signature("BUILD_SPECIFIC", "cause", BUILD_SPECIFIC, "build_failed", 90, "gcc, nvcc, CMake, ld",
              "csrc/attention.cu(12): error: identifier \"foo\" is undefined", SPECIFIC, verdict=_build_specific),
    Signature("BUILD_TOOL_EXIT", "cause", generic.BUILD_TOOL_EXIT, "build_failed", 85,
              "subprocess / setup.py / torch cpp_extension driving ninja, cmake, make, nvcc, pip",
              "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.",
              UMBRELLA, "build_failed", ends_traceback=True),
    Signature("BUILD_UMBRELLA", "cause", BUILD_UMBRELLA, "build_failed", 80,
              "ninja, make, pip >= 23 (box-drawing envelope), setuptools",
              "  \u00d7 Building wheel for vllm (pyproject.toml) did not run successfully.", UMBRELLA),
    Signature("PIP_NO_WHEELS", "cause", regexcache.compile(r"Could not build wheels for \S|Failed to build installable wheels"),
              "build_failed", 78, "pip (all): its last words after a failed wheel build, often all a CI log's tail "
              "keeps (`Could not build wheels for X` to 24.0, `Failed to build installable wheels` from 24.1)",
              "ERROR: Could not build wheels for flash-attn, which is required to install pyproject.toml-based "
              "projects", UMBRELLA, "build_failed"),
    Signature("DEPS_UNRESOLVED", "cause", regexcache.compile(r"No matching distribution found for \S|Could not find a version that satisfies the requirement"
                                                    r"|ResolutionImpossible"
                                                    r"|because these package versions have conflicting dependencies"
                                                    r"|No solution found when resolving dependencies"
                                                    r"|\b(?:LibMamba)?UnsatisfiableError\b|Could not solve for environment specs"),
              "build_failed", 79, "pip (all), uv, conda / mamba: the installer found no version that fits the pins, "
              "before any build (`No matching distribution found for X`, `ResolutionImpossible`, uv's `No solution "
              "found`, conda's `UnsatisfiableError`, `LibMambaUnsatisfiableError`)",
              "ERROR: No matching distribution found for vllm==0.99.0", SPECIFIC, "build_deps"),
    Signature("ENGINE_UMBRELLA", "cause", ENGINE_UMBRELLA, "exception", 70,
              "vLLM V1 EngineCore, SGLang scheduler, torchrun and its elastic agent, the DeepSpeed launcher, Python "
              "tracebacks",
              "RuntimeError: Engine core initialization failed. See root cause above.", UMBRELLA,
              verdict=_engine_umbrella),
    Signature("HF_HUB", "cause", HF_HUB, "exception", 55, "huggingface_hub / transformers (all): a gated or "
              "private repo, a bad token (`GatedRepoError`, `401 Client Error: Unauthorized for url`), the Hub "
              "unreachable in offline mode; rank of an exception, with the hint that says which",
              "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-674f0000-1a2b)",
              EXCEPTION, verdict=_hf_hub),
    Signature("CRASH", "cause", CRASH, "exception", 60, "any native crash",
              "Segmentation fault (core dumped)", EXCEPTION, verdict=_crash),
    Signature("PYTEST_FAILED", "cause",
              regexcache.compile(r"^=+ [^=]*\b\d+ (?:failed|errors?)\b[^=]* in \d+(?:\.\d+)?s\b"),
              "exception", 58, "pytest (all): the session's last line, its counts (`== 3 failed, 120 passed in 45.21s ==`)",
              "========= 3 failed, 120 passed, 1 warning in 45.21s =========", EXCEPTION,
              advice="tests failed — the `FAILED …` lines of the short test summary above name them (and each one's "
                     "error); rerun one alone with `pytest -x path::test -vv`"),
    Signature("TORCH_RERAISED", "cause", regexcache.compile(r"\bCaught \w+ in (?:DataLoader worker process|replica) \d+"),
              "exception", 59, "torch DataLoader workers, DataParallel replicas (all): the worker's exception re-raised "
              "in the main process, its `Original Traceback` below: an envelope of the error that ends it",
              "OSError: Caught OSError in DataLoader worker process 3.", UMBRELLA,
              advice="a DataLoader worker (or a DataParallel replica) raised — the `Original Traceback` printed after "
                     "this line ends on its own error"),
    Signature("PYDANTIC_DETAIL", "cause", PYDANTIC_DETAIL, "exception", 51, "pydantic 2 (vLLM 0.10+ config "
              "dataclasses): the `Value error, ` line under `ValidationError: N validation error(s) for X` carries "
              "the check's message; read as the exception it wraps",
              "  Value error, Invalid repository ID or local directory specified: '/models/x'. [type=value_error, "
              "input_value=ArgsKwargs((), {'model': '/models/x'}), input_type=ArgsKwargs]", EXCEPTION, "exception"),
    Signature("EXC_LINE", "cause", EXC_LINE, "exception", 50, "Python (a traceback's final exception, by type)",
              "KeyError: 'model.layers.0.self_attn.qkv_proj.weight'",
              EXCEPTION, verdict=_exception, test=_exc_test),
    Signature("ERROR level", "cause", None, "exception", 0, "any logger at ERROR/CRITICAL/FATAL",
              "ERROR 07-01 13:54:43 [serving_chat.py:120] request handling broke", ERROR_LEVEL, "exception_umbrella", test=_error_level),
)
_ORDERED = tuple(sorted(FAILURES, key=lambda s: -s.priority))
for _advised in FAILURES:              # a row's own advice is its hint, under its id
    if _advised.advice:
        if HINTS.setdefault(_advised.id, _advised.advice) != _advised.advice:
            raise ValueError(f"row {_advised.id}: a hint of that name exists already")
ENDS_TRACEBACK = frozenset(s.id for s in FAILURES if s.ends_traceback)


MATCHER = Matcher(_ORDERED)


def use_backend(backend: Optional[str]) -> None:
    """Rebuild the failure rows' matcher on one backend (matcher.BACKENDS; None: the best installed)."""
    global MATCHER
    MATCHER = Matcher(_ORDERED, backend)


def classify(body: str, ctx: Context) -> Optional[tuple[int, str, str, str]]:
    """(rank, cause, hint key, signature id) of the first row, by priority, that decides this line."""
    rows = MATCHER.rows
    for i in MATCHER.candidates(body):
        sig = rows[i]
        m = sig.match(body, ctx)
        if m is None:
            continue
        v = sig.decide(body, m, ctx)
        if v is not None:
            return (v[0], v[1], v[2], sig.id)
    return None


# --------------------------------------------------------------------------- the readers' rows

class _Lazy:
    """A row's pattern compiled on first use: the readers' rows are compiled into combined patterns
    (MARKERS, ENGINE_STRONG...) at import; their own compiles serve only tests and the doc."""
    __slots__ = ("pattern", "_rx")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._rx: Optional[re.Pattern] = None

    def _compiled(self) -> re.Pattern:
        if self._rx is None:
            self._rx = regexcache.compile(self.pattern)
        return self._rx

    def search(self, *args: Any) -> Optional["re.Match[str]"]:
        return self._compiled().search(*args)

    def match(self, *args: Any) -> Optional["re.Match[str]"]:
        return self._compiled().match(*args)


def _row(id: str, field: str, pattern: Any, decides: str, priority: int, releases: str, example: str,
         reads: str = "") -> Signature:
    rx: RowPattern = pattern if isinstance(pattern, re.Pattern) else _Lazy(pattern)
    return Signature(id, field, rx, decides, priority, releases, example, reads=reads)


def _rx(row: Signature) -> RowPattern:
    """The pattern of a row that has one (every reader's row: _row gives each its own)."""
    if row.pattern is None:
        raise ValueError(f"signature {row.id} has no pattern")
    return row.pattern


# Record prefixes: stripped before a record is read, by patterns._PREFIX (one combined pattern, re-applied;
# each row's pattern is its branch's shape) after a wrapper's FOREIGN_PREFIX; `reads` is the message left.
PREFIXES: tuple[Signature, ...] = (
    _row("wrapper_prefix", "prefix", FOREIGN_PREFIX, "stripped", 100,
         "IDE CMake runners `[build] `, docker compose `web-1  | `, kubectl `pod/x ` / `[pod/x/c] `, pasted line "
         "numbers, journald/syslog `Dec  1 10:00:01 host unit[pid]: ` (also short-precise `…:01.123456 `, short-full "
         "`Thu 2026-12-03 10:00:01 UTC `), torchrun --tee `[default0]:`, pdsh/clush "
         "`node-3: `, Open MPI's --tag-output `[1,13]<stderr>:`",
         "web-1  | Uvicorn running on http://0.0.0.0:8000", "Uvicorn running on http://0.0.0.0:8000"),
    _row("vllm_process_prefix", "prefix", r"\((?:[A-Za-z][\w\-:]*\s+)?pid=\d+(?:,\s*ip=[^)]*)?\)", "stripped", 90, "vLLM multiproc `_add_prefix`, all V1; Ray actors",
         "(EngineCore_DP0 pid=185) INFO 03-11 09:02:10 [core.py:58] Initializing", "Initializing"),
    _row("vllm_logger_header", "prefix", r"(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.\-]+:\d+\]", "stripped", 89, "vLLM >= 0.7 `[file.py:N]`; 0.4-0.6 `file.py:N]`",
         "INFO 07-24 04:00:31 metrics.py:295] Avg prompt throughput: 0.0 tokens/s",
         "Avg prompt throughput: 0.0 tokens/s"),
    _row("sglang_rank_tags", "prefix", r" ?\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\s+[A-Z]{1,4}\d+)*\]", "stripped", 88,
         "SGLang 2024 `[TP0]` -> 2025-26 `[time DPn PPn ATTN_CPn MOE_DPn TPn EPn]`; Megatron-LM's ` [time] "
         "iteration …` (one space before: its timestamps give the rate)",
         "[2026-05-02 10:06:02 PP1 TP1] Load weight end.", "Load weight end."),
    _row("torch_rank", "prefix", r"\[rank\d+\]:?|\[(?:PG [^\]]*?)?Rank \d+\]", "stripped", 87, "torch.distributed `[rankN]:`, ProcessGroupNCCL `[PG … Rank N]`",
         "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog fired", "Watchdog fired"),
    _row("python_logging", "prefix", r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:\s*[-|]\s*|\s+)(?:INFO|WARNING|ERROR|DEBUG)\b", "stripped", 86,
         "HF, uvicorn, Lightning, sglang_router; `%(asctime)s %(levelname)s` (a space), Ray's `<tab>INFO file.py:N -- `",
         "2025-01-01 10:00:00,123 - INFO - trainer - Saving model", "Saving model"),
    _row("glog", "prefix", r"\[?[EWIF]\d{3,4}\s\d\d:\d\d:\d\d\.\d+(?:\s+\d+)?\s\S+:\d+\]|\[[EWIF]\s[^\]]*\.(?:cpp|cc|cu|h):\d+\]", "stripped", 85, "torch C++, NCCL plugins (glog / c10)",
         "E0524 12:00:00.123 1234 socket.cpp:10] connect failed", "connect failed"),
    _row("dmesg", "prefix", r"\[\s*\d+\.\d+\]", "stripped", 84, "Linux kernel", "[   24.302465] NVRM: loading NVIDIA UNIX",
         "NVRM: loading NVIDIA UNIX"),
    _row("buildkit", "prefix", r"#\d+\s\d+\.\d+(?=\s\S)", "stripped", 83, "docker build (BuildKit)", "#12 25.88 [3/9] c++ -c a.cpp",
         "[3/9] c++ -c a.cpp"),
    _row("python_logging_default", "prefix", r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE):[A-Za-z_][\w.]*:"
         r"(?=\S)(?!//)", "stripped",
         82, "Python logging's default format (basicConfig): torch elastic, the DeepSpeed launcher",
         "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 4187)",
         "failed (exitcode: 1) local_rank: 0 (pid: 4187)"),
    _row("stamped_wrapper", "prefix", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?" + STAMP_ZONE + "(?:" + STAMP_TAIL + ")",
         "stripped", 80, "kubelet's CRI container log (/var/log/pods, containerd, CRI-O) `<RFC3339> stdout F `; "
         "journalctl -o short-iso `<ISO> host unit[pid]: `",
         "2026-12-03T14:00:21.323456789Z stderr F (EngineCore_DP0 pid=88) ERROR 12-03 14:00:21 [core.py:708] "
         "EngineCore failed to start.", "EngineCore failed to start."),
    _row("bracketed_level", "prefix", r"\[(?:" + _LEVELS + BRACKET_LEVEL_TAIL, "stripped", 79,
         "DeepSpeed and launchers `[ts] [WARNING] [file.py:N:func] `, HF examples `[INFO|file.py:N] ts >> `",
         "[WARNING] [stage3.py:2140:step] 4 pytorch allocator cache flushes since last step.",
         "4 pytorch allocator cache flushes since last step."),
    _row("tagged_header", "prefix", r"\[[A-Za-z][\w\-]{0,30} [DIWEFC] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? [\w.\-]+:\d+\]"
         r"|\[[A-Za-z][\w.\-]{0,30}\](?=\s?\d{4}-\d\d-\d\d[ T]\d\d:)", "stripped", 78,
         "NeMo `[NeMo W <date> <time> file:N]` (a one-letter level); a logger's `[name]` before its timestamp "
         "behind a rank prefix (torchtitan `[rank0]:[titan] <ts> - root - INFO - `)",
         "[NeMo W 2026-12-03 14:00:02 nemo_logging:393] Could not import apex", "Could not import apex"),
    _row("nccl_debug_info", "prefix", r"[\w.\-]+:\d+:\d+ \[\d+\] NCCL (?:INFO|TRACE)(?=\s)", "stripped", 77,
         "NCCL_DEBUG=INFO / TRACE (all): `host:pid:tid [dev] NCCL INFO `, read at level INFO (never a failure); "
         "a `NCCL WARN` keeps its header for NCCL's rows",
         "gpu-a-03:40211:40211 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open "
         "shared object file: No such file or directory", "NET/Plugin: Plugin load returned 2 : libnccl-net.so: "
         "cannot open shared object file: No such file or directory"),
    _row("sglang_gpu_tag", "prefix", r"\[gpu=\d+\]", "stripped", 81, "SGLang 0.2 (ModelTpServer's lines)",
         "[gpu=0] Load weight end. type=LlamaForCausalLM, dtype=torch.float16", "Load weight end. type=LlamaForCausalLM, "
         "dtype=torch.float16"),
)

# Engines: strong signatures name the engine at once; medium ones (a source path, a header) when no
# strong one is seen; weak hints are weighed (see State.engine). The row id is the signature's name.
ENGINES: tuple[Signature, ...] = (
    _row("vllm_process_prefix", "engine",
         r"\((?:A(?:PI|pi)Server(?:_\d+)?|VLLM_\w+|EngineCore(?:_\w+)?|VllmWorker(?:Process|_\w+|(?: (?:rank=\d+|[A-Z]{2}\d+))+)?"
         r"|Worker(?:_[A-Z]{2}\d+)+|RayWorkerWrapper|VLLM::\w+) pid=\d+|^\(Worker pid=\d+\)", "vllm", 3,
         "VllmWorkerProcess 0.4-0.6; VllmWorker rank= 0.8-0.9; VllmWorker TPn 0.10; Worker_* 0.11+; "
         "EngineCore/APIServer all V1; --api-server-count's ApiServer_N, VLLM_DP_Coordinator (data parallel)",
         "(Worker_PP1_TP3 pid=31) INFO 06-02 14:00:15 [loader.py:10] rank 3 is ready"),
    _row("vllm_banner", "engine", r"Starting vLLM|vLLM API server|vLLM is using|Initializing a V\d LLM engine"
         r"|usage: vllm|^vllm: error|vllm serve|VLLM::|vllm_config|from vllm|vllm\.entrypoints", "vllm", 3,
         "vLLM 0.4 -> current", "INFO 06-02 14:00:00 [api_server.py:1] vLLM API server version 0.11.0"),
    _row("vllm_stats", "engine", r"Engine \d{3}:|Avg prompt throughput:|Speculative metrics: Draft acceptance rate",
         "vllm", 3, "vLLM V0 0.4-0.10 (no `Engine` field), V1",
         "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.0 tokens/s"),
    _row("vllm_startup", "engine", r"Capturing CUDA graphs? (?:shapes|\()|Capturing cudagraphs for decoding"
         r"|Model loading took|Graph capturing finished in|Initializing an LLM engine \(v|init engine \(profile"
         r"|Maximum concurrency for [\d,]+ tokens per request|# (?:GPU|cuda) blocks: \d+|GPU KV cache size: [\d,]+ tokens"
         r"|Directly load the compiled graph", "vllm", 3,
         "vLLM V0 0.6-0.10, V1 0.9+ (mined: 0.6.0, 0.9.2, main 2026-05)",
         "Model loading took 75.79 GiB and 130.2 seconds"),
    _row("sglang_rank_tag", "engine", r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z_]{2,7}\d+)* TP\d+"
         r"(?: [A-Z_]{2,7}\d+)*\]", "sglang", 3, "SGLang 2024 -> 2026 (ranks in any order)",
         "[2026-05-02 10:00:01 PP1 TP1] Init torch distributed begin."),
    _row("sglang_process", "engine", r"sglang::|sglang\.launch_server|sglang serve|\[Router \(Rust\)\]|sglang_router",
         "sglang", 3, "SGLang, sgl-router (2025)", "python3 -m sglang.launch_server --model-path /models/x"),
    _row("sglang_stats", "engine", r"(?:Decode|Prefill) batch(?:[.,]| \[\d+\],) #", "sglang", 3,
         "SGLang (the comma form 2026, `Decode batch [18240], #` 0.5.4)", "Prefill batch, #new-seq: 1, #new-token: 12, #running-req: 0"),
    _row("sglang_startup", "engine", r"fired up and ready to roll|Capturing batches|Capture (?:\w+ ){0,2}(?:cuda|CUDA) graph"
         r"|Load weight (?:begin|end)|KV Cache is allocated|Memory pool end|server_args=ServerArgs\(|\[gpu=\d+\] "
         r"|max_total_num_tokens=|Init torch distributed be|Init torch distributed ends", "sglang", 3,
         "SGLang (mined: 0.2.13 to 0.5.18)",
         "KV Cache is allocated. #tokens: 412331, K size: 9.84 GB"),
    _row("sglang_failure", "engine", r"KV cache pool is full|[Dd]ecode out of memory happened|Scheduler hit an exception"
         r"|[Ss]cheduler is dead|--mem-fraction-static|self\.watchdog_timeout=|get a response from detokenizer"
         r"|Received sigquit from a child process|It usually means one child failed|Triggering SIGQUIT for cleanup"
         r"|Exception in ModelTpServer|DetokenizerManager hit an exception",
         "sglang", 3, "SGLang's own failure and pressure words (mined: 0.2.13 to 0.5.18)",
         "Scheduler hit an exception: Traceback (most recent call last):"),
    # (a relative module path too: py-spy's frames, `step (vllm/v1/engine/core.py:318)`)
    _row("vllm_source_path", "engine", r"/vllm/|\bvllm\._C\b|(?<![\w.\-/])vllm/[\w/.\-]*\.py\b", "vllm", 2,
         "vLLM and forks (medium)", 'File "/usr/lib/python3/site-packages/vllm/worker.py", line 3, in run'),
    _row("sglang_source_path", "engine", r"/sglang/|/sgl_kernel/|\bsglang\.srt\b|(?<![\w.\-/])(?:sglang|sgl_kernel)/[\w/.\-]*\.py\b",
         "sglang", 2, "SGLang (medium)", 'File "/usr/lib/python3/site-packages/sglang/srt/server.py", line 3, in run'),
    # (a container's image: `kubectl describe pod`'s `Image:`, a `docker run` line, a compose file pasted)
    _row("vllm_image", "engine", r"\bvllm/vllm-(?:openai|tpu|cpu|rocm)\b|\brocm/vllm\b", "vllm", 1,
         "vLLM's container images (Docker Hub vllm/vllm-openai, rocm/vllm), as a pod's `Image:` or a compose file "
         "names them (weak, weight 2: the engine's own words may never have been printed; no phase from it)",
         "    Image:         vllm/vllm-openai:v0.6.4.post1", "vllm"),
    _row("sglang_image", "engine", r"\blmsysorg/sglang\b", "sglang", 1,
         "SGLang's container images (Docker Hub lmsysorg/sglang): as vllm_image",
         "    Image:         lmsysorg/sglang:v0.4.6.post1-cu124", "sglang"),
    _row("vllm_offline_bar", "engine", r"^(?:Processed prompts|Adding requests)\b", "vllm", 2,
         "vLLM offline inference, LLM.generate / chat (0.2 -> current): its bars' labels (medium: words another "
         "tool could reuse)",
         "Processed prompts:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, est. speed input: 1520.11 toks/s, "
         "output: 300.20 toks/s]"),
    _row("vllm_logger_header", "engine", r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
         r"\[?[\w.\-]+\.py:\d+\]", "vllm", 2, "vLLM header format (medium)",
         "ERROR 06-02 14:00:00 [core.py:1] Failed to reach the server"),
    _row("vllm_weak_shard_bar", "engine", r"checkpoint shards:\s*\d+% Completed", "vllm", 1,
         "vLLM's shard loader (SGLang reuses it: weak, weight 1)",
         "Loading safetensors checkpoint shards: 100% Completed", "vllm"),
    _row("sglang_weak_flashinfer_jit", "engine", r"flashinfer\.\s*jit", "sglang", 1,
         "flashinfer JIT, SGLang's default backend (weak, weight 2)", "flashinfer.jit: Loading JIT ops: sampling"),
)
_WEIGHT = {"vllm_weak_shard_bar": 1, "sglang_weak_flashinfer_jit": 2, "vllm_image": 2, "sglang_image": 2}
ENGINE_STRONG = regexcache.compile("|".join(f"(?P<{r.id}>{_rx(r).pattern})" for r in ENGINES if r.priority == 3))
ENGINE_PATH = regexcache.compile("|".join(f"(?P<{r.id}>{_rx(r).pattern})" for r in ENGINES if r.priority == 2))
ENGINE_WEAK = [(_rx(r), r.decides, _WEIGHT[r.id]) for r in ENGINES if r.priority == 1]


def engine_signals(text: str, body: str) -> tuple[Optional[str], Optional[str], frozenset]:
    """(strong signature name, medium signature name, weak hint keys) that one record carries.

    `text` is the record with its prefixes, `body` without; a name's first word is its engine.
    """
    lead = text.lstrip()
    # A wrapper's prefixes are no part of the record: `web-1  | `, a quoted paste's `> `, stacked, and
    # a wrapper's ISO stamp with no level (kubelet's CRI log `<ISO> stdout F `, journalctl -o short-iso).
    for _ in range(3):
        p = _PREFIX.match(lead)
        f = FOREIGN_PREFIX.match(lead) if p is None else None
        if p is not None and p.group("ts4") and not p.group("lvl2"):
            lead = lead[p.end():].lstrip()
        elif f is not None and f.end():
            lead = lead[f.end():].lstrip()
        else:
            break
    m = ENGINE_STRONG.search(lead) or ENGINE_STRONG.search(body)
    strong = m.lastgroup if m is not None else None
    m = ENGINE_PATH.search(lead)
    path = m.lastgroup if m is not None else None
    weak = frozenset(engine + rx.pattern for rx, engine, _ in ENGINE_WEAK if rx.search(body))
    return strong, path, weak


# Phase markers: `decides` is the marker's kind (State._marker turns it into a phase); `reads` the
# phase its example alone reads as. Rows of one kind are joined in table order (first match wins).
PHASES: tuple[Signature, ...] = (
    _row("load_begin", "phase", r"Load weight begin|Loading (?:model )?weights(?! took)|Starting to load model"
         r"|Loading model from|Loading safetensors|Loading pt checkpoint|Loading drafter model"
         r"|[Dd]ownloading (?:model )?weights|Prefetching checkpoint|GGUF shard", "loading", 50,
         "vLLM (and its speculative drafter, 0.2x; its download, page-cache prefetch and GGUF shards, 0.2x), "
         "SGLang, HF",
         "INFO 06-02 14:00:15 [gpu_model_runner.py:1] Starting to load model /models/x...", "loading"),
    _row("load_end", "phase", r"Loading (?:model )?weights took|Model loading took|Load weight end|Loaded model weights",
         "loaded", 49, "vLLM (0.4-0.6: `Loading model weights took 14.99 GB`), SGLang", "Loading weights took 3.74 seconds",
         "starting"),
    _row("torch_compile", "phase", r"Dynamo bytecode transform|Compiling a graph|torch\.compile(?! takes)"
         r"|torch_compile_cache|Compile and warming up model for size|Cache the graph (?:of|for) "
         r"|compiler manager cache", "compiling", 48,
         "vLLM V1 (and its compile-size warmup and graph cache, 0.2x), SGLang --enable-torch-compile "
         "(`Cache the graph of shape N`, 0.5.4+)",
         "Dynamo bytecode transform time: 7.14 s", "compiling"),
    _row("jit_compile", "phase", r"Prebuilt kernels not found|Loading JIT ops|JIT compil|Compiling (?:kernel|module|model)"
         r"|Compiling the model with different input shapes",
         "compiling", 47, "flashinfer, DeepSpeed ops; vLLM on TPU (XLA precompiles each padded shape, 0.4-0.1x)", "Prebuilt kernels not found, using JIT backend", "compiling"),
    _row("inductor_autotune", "phase", r"AUTOTUNE \w+\(|SingleProcess AUTOTUNE", "compiling", 46, "torch Inductor",
         "AUTOTUNE mm(128x4096, 4096x4096)", "compiling"),
    _row("compile_done", "phase", r"torch\.compile takes|Compilation finished in \d|Compilation for (?:prefill|decode) done in",
         "compiled", 45, "vLLM V1; on TPU (`Compilation finished in 41.07 [secs].`, V0's `… for decode done in`)",
         "torch.compile takes 7.14 s in total", "starting"),
    _row("capture_begin", "phase", r"Capture (?:\w+ ){0,2}(?:cuda|CUDA) graph begin|Capturing CUDA graph|Capturing cudagraph"
         r"|Capturing the model for CUDA graph|Capturing batches|Capture (?:piecewise )?cuda graph (?:bs|num tokens)",
         "capturing", 44, "vLLM V0/V1, SGLang 2024-2026 (0.5.18: `Capture target decode CUDA graph begin.`)",
         "Capture cuda graph begin. This can take up to several minutes.", "capturing"),
    _row("capture_end", "phase", r"Capture (?:\w+ ){0,2}(?:cuda|CUDA) graph end|Graph capturing finished", "captured", 43,
         "SGLang, vLLM",
         "Capture cuda graph end. Time elapsed: 5.37 s", "starting"),
    _row("kv_cache_sized", "phase", r"GPU KV cache size|Available KV cache memory|KV Cache is allocated|Memory pool end",
         "starting", 42, "vLLM, SGLang", "Available KV cache memory: 16.23 GiB", "starting"),
    _row("api_server_start", "phase", r"Starting vLLM API server|Available routes are|Started server process"
         r"|Waiting for application startup|Initializing a V\d LLM engine|Server args|server_args=",
         "starting", 41, "vLLM, SGLang, uvicorn", "INFO:     Started server process [123]", "starting"),
    _row("uvicorn_listening", "phase", r"Uvicorn running on", "listening", 41,
         "uvicorn: vLLM prints it after `Application startup complete` (a ready server stays ready), "
         "SGLang before its warmup", "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
         "starting"),
    _row("uvicorn_ready", "phase", r"Application startup complete", "startup_complete", 40, "uvicorn (vLLM)",
         "INFO:     Application startup complete.", "ready"),
    _row("sglang_ready", "phase", r"fired up and ready to roll|Router ready \| workers:", "ready", 39,
         "SGLang; the Rust routers (sgl-router, smg, vllm-router: `Router ready | workers: [...]`)",
         "The server is fired up and ready to roll!", "ready"),
    _row("tgi_phases", "phase", r"text_generation_launcher: Starting shard|(?:router|backends/\w+)/src/\w+\.rs:\d+: Warming up model",
         "starting", 39, "text-generation-inference 1.x-3.x: the launcher starting its shards, the router warming up",
         "INFO text_generation_router: router/src/main.rs:559: Warming up model", "starting"),
    _row("tgi_ready", "phase", r"router/src/\w+\.rs:\d+: Connected\b", "ready", 39,
         "text-generation-inference 1.x-3.x: the router connected to its warmed-up shards, serving",
         "INFO text_generation_router: router/src/main.rs:597: Connected", "ready"),
    _row("server_listening", "phase", r"[Ss]erver is listening on https?://|\bListening on https?://|\bListening at:? https?://"
         r"|\* Running on https?://|\bServing on https?://|llama runner started in|all slots are idle", "startup_complete", 39,
         "any HTTP server naming its URL once it serves (llama.cpp server's `server is listening on http://…`, "
         "werkzeug, gunicorn), llama.cpp's idle slots, Ollama's runner; its early `HTTP server is listening, "
         "hostname:` (before the model loads) names none",
         "main: server is listening on http://0.0.0.0:8080 - starting the main loop", "ready"),
    _row("build_steps", "phase", r"Building (?:CUDA|CXX|C) object|\*\*\* Configuring CMake|-- Configuring (?:done|incomplete)"
         r"|-- The (?:C|CXX|CUDA) compiler identification|Building wheel|running build_ext|Emitting ninja build file"
         r"|scikit-build-core|Linking (?:CUDA|CXX|C) (?:shared|static)|Building extension"
         r"|Preparing (?:editable )?metadata \((?:setup\.py|pyproject\.toml)\)|Getting requirements to build (?:wheel|editable)"
         r"|Build TensorRT engine",
         "building", 38,
         "CMake, ninja, setuptools, pip (its metadata and build-requirements steps run setup.py too), scikit-build-core; "
         "TensorRT-LLM's trtllm-build (`[TRT-LLM] [I] Build TensorRT engine …`)", "-- The CUDA compiler identification is NVIDIA 12.8.93",
         "building"),
    _row("dist_init", "phase", r"Waiting in store based barrier to initialize process group", "starting", 38,
         "torch.distributed 1.x-2.x: c10d's store-based barrier while the ranks join (it never moves a job "
         "already training back)",
         "Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
         "(world_size=8, num_workers_joined=7, timeout=0:30:00)", "starting"),
    _row("training_banner", "phase", r"\*+ Running training \*+|^training \.\.\.\s*$", "training", 37,
         "HF Trainer, Megatron-LM", "***** Running training *****", "training"),
)


def _grouped(rows: tuple[Signature, ...]) -> str:
    kinds: dict[str, list[str]] = {}
    for r in rows:
        kinds.setdefault(r.decides, []).append(_rx(r).pattern)
    return "|".join(f"(?P<{kind}>{'|'.join(alts)})" for kind, alts in kinds.items())


MARKERS = regexcache.compile(_grouped(PHASES))

# Progress, serving numbers and warnings: the readers of patterns.py / generic.py, one row each.
PROGRESS: tuple[Signature, ...] = (
    _row("tqdm bar", "progress", TQDM, "done/total, rate, ETA; phase from the label", 30,
         "tqdm (any), vLLM shard loader `% Completed |`, bar-less non-TTY bars; the label's phase "
         "(patterns.label_phase): a hub file's name is loading, validation/eval is training, HF datasets' "
         "preparation (`Generating train split`, `Map`, `… dataset`) names none",
         "Capturing CUDA graphs (decode, FULL):  45%|####5     | 23/51 [00:02<00:02, 11.40it/s]", "23/51"),
    _row("ninja [n/N]", "progress", NINJA, "build n/N", 29, "ninja (CMake, torch cpp_extension)",
         "[12/345] Building CUDA object CMakeFiles/_C.dir/csrc/x.cu.o", "12/345"),
    _row("make [n%]", "progress", MAKE, "build n/100", 28, "CMake Makefiles", "[ 45%] Building CXX object x.o", "45/100"),
    _row("step n/N", "progress", STEP, "training n/N", 27, "custom loops, Megatron, Lightning",
         "step 10/100 loss 1.25", "10/100"),
    _row("epoch n/N", "progress", EPOCH, "training n/N", 26, "custom loops, fairseq", "Epoch 2/10 loss 1.1", "2/10"),
    _row("HF loss dict 'epoch'", "progress", LOSS_DICT, "epoch of `Num Epochs`", 25, "HF Trainer",
         "{'loss': 1.2, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.59}", "0.59/None"),
    _row("trainer banners", "progress", NUM_EPOCHS.pattern + "|" + TOTAL_STEPS.pattern, "totals", 24,
         "HF Trainer; torchtitan (`…, total steps 3000 (warmup 300)`)", "  Total optimization steps = 564", ""),
    _row("rich bar n/N", "progress", generic.RICH_BAR, "n/N, rate, remaining; phase from the label", 23,
         "any rich.progress bar: Lightning's RichProgressBar, pip; the words before the glyphs label it, and a "
         "counter among them is the label's (`Epoch 3/9 ━━━╸━ 400/1000 0:04:52 • 0:07:37 1.33it/s`: 400/1000)",
         "Epoch 3/9  ━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━━━━━━━━━━ 400/1000 0:04:52 • 0:07:37 1.33it/s v_num: 0",
         "400/1000"),
    _row("keras bar n/N", "progress", generic.KERAS_BAR, "n/N; phase from the reading (an `Epoch 3/10` before it)", 23,
         "Keras / TensorFlow `Model.fit` (Progbar, verbose=1): the batch counter before an ASCII bar",
         "157/469 [=========>....................] - ETA: 11s - loss: 0.3148 - accuracy: 0.8861", "157/469"),
    _row("labelled [n/N]", "progress", generic.LABELLED_BRACKET, "n/N; phase from the label", 23,
         "any: the generic layer, a [N/M] after a label that names a phase (a bracketed epoch may stand between: "
         "mmengine's `Epoch(train)  [3][ 400/1250]`), or before a build step's words "
         "(`BUILD_STEP_ANYWHERE`: ninja behind a prefix nobody listed), or a bare one before a loss (a training step: "
         "`[1200/20000] loss=3.25`, a JAX/absl loop's); of several the last, the finest "
         "(`Epoch [3/10] Step [170/500]`: 170/500, `Epoch 3 Step`)",
         "rank0: Loading checkpoint shard [3/8] from /models/x", "3/8"),
    _row("labelled n/N", "progress", generic.LABELLED_COUNT, "n/N; phase from the label", 22,
         "any: the generic layer, `label N/M` (a whole token, N <= M) in a line with no step/epoch word, no "
         "other anchor needed (`Processing shard 3/8`); a label naming no phase: phase unknown; one naming who "
         "counts (rank, GPU, channel, attempt): none",
         "rank0: Loading checkpoint 3/8 from /models/x", "3/8"),
)
SERVING: tuple[Signature, ...] = (
    _row("vllm_stats", "serving", _VLLM_STATS, "prompt/gen tokens/s, running, waiting, kv_cache_pct "
         "(`Preemptions: N`: kv_cache_pressure)", 20,
         "vLLM V0 (0.4+, every 5 s), V1 (`Engine 000:`; `Preemptions:` only when some were, 0.10+)",
         "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 132.5 tokens/s, "
         "Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 55.1%", "gen_tokens_per_s=132.5"),
    _row("vllm_spec_decode", "serving", VLLM_SPEC_RATE, "spec_accept_len, spec_accept_rate", 19,
         "vLLM V1 `SpecDecoding metrics`, V0 0.4-0.6 `Speculative metrics`",
         "SpecDecoding metrics: Mean acceptance length: 2.64, Accepted: 7 tokens, Drafted: 9 tokens, "
         "Avg Draft acceptance rate: 33.0%", "spec_accept_len=2.64"),
    _row("sglang_batch", "serving", _SGLANG_FIELD, "running, waiting, kv_cache_pct, gen tokens/s, accept len/rate", 18,
         "SGLang 2024-2026 (`Decode batch.`, 0.5.4 `Decode batch [18240],`, 2026 `Decode batch,`)",
         "Decode batch, #running-req: 4, #token: 2210, token usage: 0.01, gen throughput (token/s): 210.44, "
         "#queue-req: 0", "running=4"),
)
WARNINGS: tuple[Signature, ...] = (
    _row("oom_risk", "warning", OOM_RISK, "oom_risk", 10, "torch cpp_extension (no MAX_JOBS), make -j, compilers; "
         "DeepSpeed ZeRO-3 `N pytorch allocator cache flushes since last step` (GPU memory)",
         "Allowing ninja to set a default number of workers... (overridable by setting the environment variable MAX_JOBS=N)"),
    _row("kv_cache_pressure", "warning", KV_PRESSURE, "kv_cache_pressure", 9,
         "vLLM PreemptionMode, SGLang retract (also: KV >= 95 % with requests waiting, vLLM V1's stats `Preemptions: N`)",
         "Sequence group 3 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space."),
    _row("jit_compile", "warning", JIT, "jit_compile", 8, "flashinfer, DeepSpeed ops",
         "Prebuilt kernels not found, using JIT backend"),
    _row("request_error", "warning", REQUEST_ERROR, "request_error", 7,
         "uvicorn / Starlette (any ASGI server: vLLM, SGLang); vLLM's OpenAI handlers (0.6 -> current). A plain "
         "exception within 40 lines after it is that request's: a warning, no failure (cause.py rule 6)",
         "ERROR:    Exception in ASGI application"),
)

TABLE: tuple[Signature, ...] = PREFIXES + ENGINES + PHASES + PROGRESS + SERVING + WARNINGS + FAILURES
# The rows' own wording is what the byte passes look for: an alternative of a row that holds no
# listed anchor of its family adds its longest literal as one (`Cuda failure 217 '...'` after NCCL's
# `Last error:` carried none, and was never read). Adding a row is adding its row.
_ANCHOR_FAMILY = {"cause": F, "phase": M, "progress": P, "serving": S, "warning": W}
ANCHOR_ROWS = [(row.pattern, _ANCHOR_FAMILY[row.field]) for row in TABLE
               if row.field in _ANCHOR_FAMILY and row.pattern is not None]
ROW_ANCHORS = patterns.adopt_row_anchors(ANCHOR_ROWS)


def derived_anchors_source() -> str:
    """derived_anchors.py as docs/make_log_signatures.py writes it: the rows' anchors with the inputs they came from."""
    import textwrap
    inputs = patterns.row_anchor_inputs(ANCHOR_ROWS)
    pieces = "\n".join(f"    {piece!r}" for piece in textwrap.wrap(inputs, 100, drop_whitespace=False))
    pairs = "\n".join(f"    ({lit!r}, {family}),"
                       for lit, family in patterns.derive_row_anchors(ANCHOR_ROWS))
    return ('"""Generated by docs/make_log_signatures.py from the signature table: the anchors its rows\' own\n'
            "wording adds (patterns.adopt_row_anchors), so that no process parses the rows\' regexes to find them.\n"
            "Made from INPUTS; where the table no longer gives the same, they are derived at import instead.\n"
            '"""\n\n'
            f"INPUTS = (\n{pieces}\n)\n\n"
            f"ANCHORS: tuple[tuple[bytes, int], ...] = (\n{pairs}\n)\n")


# --------------------------------------------------------------------------- the generated doc

_SECTIONS = (("prefix", "Record prefixes (stripped before a line is read)"), ("engine", "Engine"),
             ("phase", "Phase markers"), ("progress", "Progress"), ("serving", "Serving numbers"),
             ("warning", "Warnings"), ("cause", "Failures (root cause)"))


def _cell(text: str, limit: int = 0) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    if limit and len(text) > limit:
        text = text[:limit - 1] + "…"
    return text


def markdown() -> str:
    """docs/LOG_SIGNATURES.md: every row of TABLE, by field (tests/test_analyze_table.py checks the checked-in copy)."""
    from . import cause
    out = ["# Log signatures", "",
           "Generated from `jobs/logs/analyze/signatures.py` by `python docs/make_log_signatures.py`; do not edit.",
           "Every row is one signature: what it matches (its pattern), the field it decides, its priority,",
           "the releases that print it and one example line (tests/test_analyze_table.py reads each example",
           "through the analyzer and checks the row's field). `LogAnalysis.decided_by` names the row that",
           "decided each field.", "",
           "Adding a signature is one row in the table and one fixture in `tests/fixtures/logs/` whose first",
           "lines say what it reads and which row reads it (`# expect: {\"failure\": [\"hang\", 9]}`, `# fix: ROW`):",
           "the tests pick both up. A failure row's hint can be its own `advice=` text. Then",
           "`python docs/make_log_signatures.py` rewrites this doc and `jobs/logs/analyze/derived_anchors.py`",
           "(the anchors the rows' wording adds; until then they are derived at each process start).", ""]
    for field, title in _SECTIONS:
        rows = [r for r in TABLE if r.field == field]
        out += [f"## {title}", ""]
        if field == "cause":
            doc = (cause.__doc__ or "").strip().split("\n")
            out += [line[0:] for line in doc[2:]] + [""]
            out += ["Rows are tried by priority (highest first); rank: 3 specific, 2 exception/crash, 1 envelope, "
                    "0 ERROR level.", "",
                    "| id | decides | priority | rank | releases | example | pattern |", "|---|---|---|---|---|---|---|"]
            for r in sorted(rows, key=lambda r: -r.priority):
                pat = r.pattern.pattern if r.pattern is not None else "(the record's level)"
                out.append(f"| `{r.id}` | {r.decides} | {r.priority} | {int(r.rank)} | {_cell(r.releases)} | "
                           f"`{_cell(r.example)}` | `{_cell(pat, 300)}` |")
            out.append("")
            out += ["Exceptions by type (the generic layer, `generic.EXCEPTION_TYPES`):", "",
                    "| type | cause | rank |", "|---|---|---|"]
            out += [f"| `{t}` | {c} | {int(k)} |" for t, (c, k, _) in generic.EXCEPTION_TYPES.items()]
            out.append("")
            continue
        out += ["| id | decides | priority | releases | example | pattern |", "|---|---|---|---|---|---|"]
        for r in rows:
            pat = r.pattern.pattern if r.pattern is not None else ""
            out.append(f"| `{r.id}` | {_cell(r.decides)} | {r.priority} | {_cell(r.releases)} | `{_cell(r.example)}` | "
                       f"`{_cell(pat, 300)}` |")
        out.append("")
    return "\n".join(out) + "\n"
