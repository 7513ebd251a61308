"""Stack dumps of a run's Python processes (py-spy, as a subprocess), grouped and folded to one verdict line (stdlib only).

Why stdlib only: the runner takes a dump by itself when a stall is flagged, and the
runner side imports no third-party package (.importlinter). py-spy is a separate
binary: it is run with a deadline, never imported.

The verdict reads the innermost frames of every thread: Python frames first (the
wait wrappers of threading, queue, subprocess, torch.distributed...), then the
innermost frame's source line (a C call such as `lock.acquire()` or `sock.recv()`
leaves no Python frame of its own), then native frames (--native), then what the
kernel says the thread is blocked in (/proc/PID/task/TID/syscall and its fd).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from gpudeck.jobs import strictjson
from gpudeck.jobs.procs import PROC, ProcessId, cmdline, is_alive, read_stat

# Every py-spy call ends within this (a wedged ptrace must not wedge gpudeck).
CALL_TIMEOUT_S = 10.0
# The whole dump of a run ends within this, however many processes it has.
DUMP_DEADLINE_S = 30.0
# Two samples this far apart tell a thread spinning in Python from one that only passed by.
SAMPLE_INTERVAL_S = 0.2
# Bounds on what one dump holds (a stored dump must stay small; a build can have thousands of processes).
MAX_PROCESSES = 64
MAX_THREADS = 256
MAX_FRAMES = 128
# py-spy calls in flight at once.
PARALLEL = 8
# How many of the innermost Python frames can explain a wait.
EXPLAIN_DEPTH = 12
CAP_SYS_PTRACE = 19

PY_SPY_ENV = "GPUDECK_PY_SPY"
INSTALL_HINT = ("py-spy is not installed: pip install py-spy (into the environment gpudeck runs from), "
                f"or name the binary in ${PY_SPY_ENV}")


SIMULATED_LINE = "SIMULATED: a recorded demo dump (docs/make_demo_runs.py); no process was traced"
# A stored dump is read back at most this big (the runner writes at most 2 MiB of each file).
MAX_STORED_READ = 2 * 1024 * 1024


class StacksUnavailable(Exception):
    """No dump can be taken at all here (no py-spy, ptrace not permitted): one line saying which and why."""


# -- finding py-spy and the right to use it ------------------------------------------

def find_py_spy() -> Optional[str]:
    """$GPUDECK_PY_SPY first (a path), then py-spy next to the running Python (the venv gpudeck is
    installed in), then in the bin/ of a $PYTHONPATH entry (what `pip install --target DIR` leaves:
    DIR/bin/py-spy, the GPU machine's carried wheels), then $PATH."""
    explicit = os.environ.get(PY_SPY_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    candidates = [Path(sys.executable).parent / "py-spy"]
    candidates += [Path(entry) / "bin" / "py-spy" for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                   if entry]
    for here in candidates:
        if here.is_file() and os.access(here, os.X_OK):
            return str(here)
    return shutil.which("py-spy")


def effective_caps(status_path: Path = PROC / "self" / "status") -> Optional[int]:
    try:
        for line in status_path.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def ptrace_scope(path: Path = PROC / "sys" / "kernel" / "yama" / "ptrace_scope") -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None                   # no Yama: classic ptrace rules (same uid, or CAP_SYS_PTRACE)


def ptrace_refusal(scope: Optional[int] = None, caps: Optional[int] = None) -> Optional[str]:
    """Why no process can be traced from here, or None. py-spy is not the job's ancestor, so Yama's
    scope 1 (only ancestors may trace) refuses it like scopes 2 and 3, unless we hold CAP_SYS_PTRACE."""
    scope = ptrace_scope() if scope is None else scope
    caps = effective_caps() if caps is None else caps
    has_cap = caps is not None and bool(caps >> CAP_SYS_PTRACE & 1)
    if scope == 3:
        return ("ptrace is disabled on this kernel (kernel.yama.ptrace_scope = 3, until reboot): "
                "no stack dump is possible")
    if scope in (1, 2) and not has_cap:
        why = "only a process's ancestors may trace it" if scope == 1 else "only CAP_SYS_PTRACE may trace"
        return (f"ptrace not permitted: kernel.yama.ptrace_scope = {scope} ({why}) and this process lacks "
                f"CAP_SYS_PTRACE; run as root, or `sysctl kernel.yama.ptrace_scope=0`")
    return None


def process_refusal(pid: int, caps: Optional[int] = None) -> Optional[str]:
    """Why this one process cannot be traced by us (another user's), or None."""
    try:
        uid = os.stat(PROC / str(pid)).st_uid
    except OSError:
        return None
    caps = effective_caps() if caps is None else caps
    if uid != os.geteuid() and not (caps is not None and caps >> CAP_SYS_PTRACE & 1):
        return f"belongs to uid {uid}, not to you (uid {os.geteuid()}), and this process lacks CAP_SYS_PTRACE"
    return None


def is_python(pid: int) -> bool:
    """A Python interpreter (its executable is python*, or it maps libpython): py-spy can read nothing else."""
    try:
        exe = os.path.basename(os.readlink(PROC / str(pid) / "exe"))
    except OSError:
        exe = ""
    if re.match(r"(python|pypy)", exe):
        return True
    try:
        with open(PROC / str(pid) / "maps", "rb") as fh:
            return b"libpython" in fh.read(4 * 1024 * 1024)
    except OSError:
        return False


# -- the data --------------------------------------------------------------------------

@dataclass(frozen=True)
class Frame:
    name: str
    file: str                  # short file name, as shown
    line: int
    path: str = ""             # full path, as the target process sees it
    native: bool = False

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    def label(self) -> str:
        return f"{self.name} ({self.where()})"

    def to_jsonable(self) -> dict:
        return {"name": self.name, "file": self.file, "line": self.line, "path": self.path, "native": self.native}


@dataclass(frozen=True)
class Wait:
    """What a thread waits on: a kind from WAIT_PHRASES, a label (`threading.Lock.acquire`), the frames."""

    kind: str
    label: str
    frame: Optional[Frame] = None          # the frame that explains the wait
    caller: Optional[Frame] = None         # the first frame outside the waiting machinery (the job's code)
    source: str = "python"                 # python | source | native | kernel | sampling

    def phrase(self) -> str:
        return WAIT_PHRASES.get(self.kind, self.kind).format(label=self.label)

    def to_jsonable(self) -> dict:
        return {"kind": self.kind, "label": self.label, "phrase": self.phrase(), "source": self.source,
                "frame": self.frame.to_jsonable() if self.frame else None,
                "caller": self.caller.to_jsonable() if self.caller else None}


@dataclass(frozen=True)
class ThreadStack:
    pid: int
    tid: Optional[int]
    name: str
    active: bool
    frames: tuple[Frame, ...]              # innermost first, Python and (with --native) C frames
    main: bool = False
    spinning: bool = False                 # active in both samples, in the same innermost frame
    kernel: Optional[str] = None           # what /proc says it is blocked in ("futex", "read on socket")
    truncated: int = 0                     # frames left out past MAX_FRAMES
    wait: Optional[Wait] = None
    helper: bool = False                   # an idle helper thread (tqdm monitor, executor worker...)

    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)

    def to_jsonable(self) -> dict:
        return {"pid": self.pid, "tid": self.tid, "name": self.name, "active": self.active, "main": self.main,
                "spinning": self.spinning, "kernel": self.kernel, "truncated": self.truncated,
                "helper": self.helper, "wait": self.wait.to_jsonable() if self.wait else None,
                "frames": [f.to_jsonable() for f in self.frames]}


@dataclass(frozen=True)
class ProcessStacks:
    pid: int
    start: int
    command: str
    threads: tuple[ThreadStack, ...]
    wait: Optional[Wait] = None            # the thread wait that explains this process

    def to_jsonable(self) -> dict:
        return {"pid": self.pid, "start": self.start, "command": self.command,
                "wait": self.wait.to_jsonable() if self.wait else None,
                "threads": [t.to_jsonable() for t in self.threads]}


@dataclass(frozen=True)
class Skipped:
    pid: int
    command: str
    reason: str

    def to_jsonable(self) -> dict:
        return {"pid": self.pid, "command": self.command, "reason": self.reason}


@dataclass(frozen=True)
class StackGroup:
    """Identical stacks folded into one: which processes and threads share them."""

    frames: tuple[Frame, ...]
    wait: Optional[Wait]
    pids: tuple[int, ...]
    threads: int
    thread_names: tuple[str, ...]
    helper: bool

    def count_text(self, total: int) -> str:
        procs = f"{len(self.pids)} of {total} process{'es' if total != 1 else ''}"
        if self.threads != len(self.pids):
            return f"{self.threads} threads in {procs}"
        return procs

    def chain(self, depth: int = 4) -> str:
        shown = [f for f in self.frames if not (f.native and f.name.startswith("0x"))][:depth]
        text = " ← ".join(f.label() for f in shown)
        if len(self.frames) > len(shown):
            text += " ← …"
        return text

    def to_jsonable(self) -> dict:
        return {"pids": list(self.pids), "threads": self.threads, "thread_names": list(self.thread_names),
                "helper": self.helper, "wait": self.wait.to_jsonable() if self.wait else None,
                "frames": [f.to_jsonable() for f in self.frames]}


@dataclass
class StackDump:
    taken_at: float
    native: bool
    processes: list[ProcessStacks] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    job: str = ""
    run_id: str = ""
    py_spy: str = ""
    duration_s: float = 0.0
    groups: list[StackGroup] = field(default_factory=list)
    verdict: str = ""
    simulated: bool = False            # made up for `gpudeck --demo` (docs/make_demo_runs.py): no process was traced

    def to_jsonable(self, *, frames: bool = True) -> dict:
        """Everything; with frames=False each thread names its group instead of repeating its frames
        (what a stored dump keeps: the groups carry the frames once)."""
        processes = [p.to_jsonable() for p in self.processes]
        if not frames:
            index = {(g.helper, _frame_key(g.frames)): i for i, g in enumerate(self.groups)}
            for proc, data in zip(self.processes, processes):
                for thread, tdata in zip(proc.threads, data["threads"]):
                    tdata.pop("frames")
                    tdata["group"] = index.get((thread.helper, _frame_key(thread.frames)))
        return {"job": self.job, "run_id": self.run_id, "taken_at": round(self.taken_at, 3), "native": self.native,
                "py_spy": self.py_spy, "duration_s": round(self.duration_s, 3), "verdict": self.verdict,
                "groups": [g.to_jsonable() for g in self.groups], "processes": processes,
                "skipped": [s.to_jsonable() for s in self.skipped], **({"simulated": True} if self.simulated else {})}


# -- what a wait is: the rules, as data --------------------------------------------------

WAIT_PHRASES = {
    "spinning": "spinning in Python",
    "collective": "in a collective ({label})",
    "cuda_sync": "in a CUDA synchronize ({label})",
    "barrier": "waiting on a {label}",
    "subprocess": "waiting for a subprocess ({label})",
    "queue": "waiting on a queue ({label})",
    "future": "waiting on a future ({label})",
    "socket": "blocked on a socket ({label})",
    "pipe": "blocked reading a pipe ({label})",
    "disk": "in disk I/O ({label})",
    "select": "waiting in select/poll ({label})",
    "lock": "blocked on a lock ({label})",
    "sleep": "sleeping ({label})",
    "join": "waiting for {label}",
    "running": "running Python",
    "idle": "idle",
}
# Which wait explains a thread (and a thread a process) when several frames match: the most specific first.
PRIORITY = ("spinning", "collective", "cuda_sync", "barrier", "subprocess", "queue", "future", "socket", "pipe",
            "disk", "select", "lock", "sleep", "join", "running", "idle")
RANK = {kind: i for i, kind in enumerate(PRIORITY)}

# (kind, label, path pattern, function-name pattern) over the innermost Python frames.
# Paths are matched with forward slashes against the end of the frame's path.
PYTHON_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("collective", "torch.distributed.{fn}", r"torch/distributed/distributed_c10d\.py$",
     r"^(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|all_to_all\w*|reduce|"
     r"gather\w*|scatter\w*|send|recv|isend|irecv|batch_isend_irecv|wait)$"),
    ("collective", "{fn}", r"(vllm|sglang)/.*(parallel_state|communication_op|pynccl\w*|custom_all_reduce)\.py$",
     r"(all_reduce|all_gather|reduce_scatter|broadcast|barrier|send|recv)"),
    ("cuda_sync", "torch.cuda.synchronize", r"torch/cuda/__init__\.py$", r"^synchronize$"),
    ("cuda_sync", "torch.cuda.{fn}", r"torch/cuda/streams\.py$", r"synchronize|wait"),
    ("barrier", "multiprocessing.Barrier", r"multiprocessing/synchronize\.py$", r"Barrier"),
    ("barrier", "threading.Barrier", r"threading\.py$", r"^Barrier\."),
    ("subprocess", "Popen.{short}", r"subprocess\.py$", r"^Popen\.(wait|_wait|_try_wait|communicate|_communicate)$"),
    ("subprocess", "subprocess.{fn}", r"subprocess\.py$", r"^(run|call|check_call|check_output)$"),
    ("queue", "multiprocessing.Queue.{short}", r"multiprocessing/queues\.py$", r"^(Joinable)?(Simple)?Queue\.(get|put|join)$"),
    ("queue", "queue.Queue.{short}", r"/queue\.py$", r"^\w*Queue\.(get|put|join)$"),
    ("future", "concurrent.futures {fn}", r"concurrent/futures/_base\.py$", r"(Future\.result|wait|as_completed)"),
    ("socket", "{fn}", r"/(socket|ssl)\.py$", r"(recv|readinto|read|accept|connect|create_connection|do_handshake)"),
    ("socket", "http.client {fn}", r"http/client\.py$", r"(begin|_read_status|readinto|read|getresponse)"),
    ("socket", "urllib3 {fn}", r"urllib3/.*\.py$", r"(recv|read|_make_request|getresponse)"),
    ("pipe", "multiprocessing Connection.{short}", r"multiprocessing/connection\.py$",
     r"(_recv|recv|recv_bytes|_recv_bytes|poll|_poll|wait|accept)"),
    # torch's nested readers (`_load.<locals>.load_tensor`) and the API the job called are one torch.load.
    ("disk", "torch.load", r"torch/serialization\.py$", r"^_?load"),
    ("disk", "torch.save", r"torch/serialization\.py$", r"^_?save"),
    # Not safetensors' `load(bytes)`: that one parses memory the job already read.
    ("disk", "safetensors {fn}", r"safetensors/[^/]+\.py$", r"^(load_file|safe_open|save_file)$"),
    ("select", "selectors.{fn}", r"/selectors\.py$", r"select"),
    ("select", "asyncio event loop", r"asyncio/base_events\.py$", r"_run_once"),
    ("lock", "multiprocessing.{fn}", r"multiprocessing/synchronize\.py$", r"(acquire|wait|__enter__)"),
    ("lock", "threading.{fn}", r"threading\.py$",
     r"^(Condition\.wait\w*|Event\.wait|Semaphore\.acquire|BoundedSemaphore\.acquire|_RLock\.acquire)$"),
    ("join", "a thread to finish (Thread.join)", r"threading\.py$", r"^(Thread\.join|Thread\._wait_for_tstate_lock)$"),
    ("join", "child processes to exit (Process.join)", r"multiprocessing/(process|popen_fork)\.py$",
     r"(join|wait|poll)"),
)

# The innermost frame's source line, for waits in C functions that leave no Python frame of their own.
SOURCE_RULES: tuple[tuple[str, str, str], ...] = (
    ("collective", "{m}", r"\b(dist|torch\.distributed)\.(all_reduce|barrier|all_gather\w*|broadcast|reduce_scatter\w*)\s*\("),
    ("cuda_sync", "torch.cuda.synchronize", r"\b(cuda\.synchronize|\.synchronize)\s*\("),
    ("lock", "Lock.acquire", r"\.acquire\s*\("),
    ("lock", "threading.Lock (with)", r"^\s*with\s+\w*(lock|mutex)\w*\s*:"),
    ("socket", "{m}", r"\.(recv_into|recvfrom|recvmsg|recv|accept|connect|sendall)\s*\("),
    ("subprocess", "{m}", r"\b(os\.waitpid|os\.wait|os\.waitid|\.communicate)\s*\("),
    ("select", "select", r"\b(select\.select|select\.poll|\.poll|epoll)\s*\("),
    ("sleep", "time.sleep", r"\b(time\.)?sleep\s*\("),
    ("disk", "{m}", r"\bos\.(fsync|fdatasync)\s*\("),
    # An os.read is on a file, a socket or a pipe: the kernel's fd says which (_FD_KINDS); a pipe if it cannot.
    ("fd_read", "os.read", r"\bos\.read\s*\("),
)
# What a read on an fd waits on, by what the fd is (kernel_state's "read on file").
_FD_KINDS = {"file": "disk", "socket": "socket", "pipe": "pipe"}

# Native (C/C++) frame names, read only with --native.
NATIVE_RULES: tuple[tuple[str, str, str], ...] = (
    ("collective", "NCCL", r"nccl|ProcessGroupNCCL"),
    ("collective", "gloo", r"gloo::|ProcessGroupGloo"),
    ("cuda_sync", "{m}", r"(cudaDeviceSynchronize|cudaStreamSynchronize|cuStreamSynchronize|cuCtxSynchronize|"
                         r"cudaEventSynchronize|cuEventSynchronize)"),
    ("socket", "{m}", r"^sock_(recv\w*|accept|connect\w*)"),
    ("select", "{m}", r"^select_(select|poll|epoll)\w*"),
    ("subprocess", "os.waitpid", r"^os_wait\w*"),
    ("sleep", "time.sleep", r"^(pysleep|time_sleep)$"),
    ("lock", "threading.Lock.acquire", r"^(lock_PyThread_acquire_lock|rlock_acquire|PyThread_acquire_lock\w*)$"),
)

# Helper threads that idle by design, folded below the threads that matter (path or thread-name patterns).
HELPER_PATTERNS = (
    r"tqdm/_monitor\.py$", r"concurrent/futures/(thread|process)\.py$", r"multiprocessing/(queues|pool|"
    r"resource_sharer|managers|resource_tracker)\.py$", r"logging/handlers\.py$", r"watchdog",
    r"torch/utils/data/_utils/pin_memory\.py$", r"wandb/", r"sentry_sdk/", r"pydevd", r"IPython/",
    r"prometheus_client/", r"zmq/", r"torch/_inductor/compile_worker",
)
HELPER_THREAD_NAMES = re.compile(r"(tqdm|TMonitor|watchdog|ThreadPoolExecutor|QueueFeederThread|"
                                 r"pin_memory|Timer|heartbeat|asyncio_\d+)", re.IGNORECASE)

# Syscall numbers the kernel hint names (/proc/PID/task/TID/syscall).
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 23: "select", 34: "pause",
               35: "nanosleep", 42: "connect", 43: "accept", 45: "recvfrom", 47: "recvmsg", 61: "wait4",
               74: "fsync", 75: "fdatasync", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
               247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
               441: "epoll_pwait2", 449: "futex_waitv"},
    "aarch64": {22: "epoll_pwait", 63: "read", 64: "write", 67: "pread64", 68: "pwrite64", 72: "pselect6",
                73: "ppoll", 82: "fsync", 83: "fdatasync", 95: "waitid", 98: "futex", 101: "nanosleep",
                115: "clock_nanosleep", 202: "accept", 203: "connect", 207: "recvfrom", 212: "recvmsg",
                242: "accept4", 260: "wait4", 441: "epoll_pwait2", 449: "futex_waitv"},
}
_KERNEL_KINDS = {
    "futex": ("lock", "a futex"), "futex_waitv": ("lock", "a futex"),
    "poll": ("select", "poll"), "ppoll": ("select", "poll"), "select": ("select", "select"),
    "pselect6": ("select", "select"), "epoll_wait": ("select", "epoll_wait"), "epoll_pwait": ("select", "epoll_wait"),
    "epoll_pwait2": ("select", "epoll_wait"),
    "recvfrom": ("socket", "recv"), "recvmsg": ("socket", "recvmsg"), "accept": ("socket", "accept"),
    "accept4": ("socket", "accept"), "connect": ("socket", "connect"),
    "wait4": ("subprocess", "wait4"), "waitid": ("subprocess", "waitid"),
    "nanosleep": ("sleep", "nanosleep"), "clock_nanosleep": ("sleep", "nanosleep"),
    "fsync": ("disk", "fsync"), "fdatasync": ("disk", "fdatasync"),
}


def _path(frame: Frame) -> str:
    return (frame.path or frame.file).replace("\\", "/")


def _short_fn(name: str) -> str:
    # Popen._try_wait and Popen._wait are Popen.wait to the operator; Queue._get is Queue.get.
    return re.sub(r"^_(try_)?", "", name.rsplit(".", 1)[-1])


def _is_machinery(frame: Frame) -> bool:
    """A frame of the interpreter's library or an installed package: not where the job's own code waits."""
    path = _path(frame)
    if frame.native or path.startswith("<frozen"):
        return True
    return bool(re.search(r"/lib/python3[\d.]*/", path) or "site-packages/" in path or "dist-packages/" in path)


def _caller(frames: Sequence[Frame], index: int) -> Optional[Frame]:
    """The first Python frame from `index` outwards that is the job's own code (else the matched frame)."""
    py = [f for f in frames[index:] if not f.native]
    for frame in py:
        if not _is_machinery(frame):
            return frame
    return py[0] if py else None


def _source_line(frame: Frame) -> str:
    """The frame's current source line, read afresh (no linecache: the runner lives for days and files change)."""
    path = frame.path
    if not path or not frame.line or path.startswith("<"):
        return ""
    try:
        # A regular file of sane size only: a frame's path is the job's word, and /dev/zero never ends.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4 * 1024 * 1024:
            return ""
        with os.fdopen(os.dup(fd), "rb") as fh:
            for number, raw in enumerate(fh, 1):
                if number == frame.line:
                    return raw.decode("utf-8", "replace").strip()[:400]
    except OSError:
        return ""
    finally:
        os.close(fd)
    return ""


def _python_wait(frames: Sequence[Frame]) -> Optional[Wait]:
    best: Optional[tuple[int, int, Wait]] = None
    py_index = 0
    for index, frame in enumerate(frames):
        if frame.native:
            continue
        py_index += 1
        if py_index > EXPLAIN_DEPTH:
            break
        path = _path(frame)
        for kind, label, path_re, fn_re in PYTHON_RULES:
            if re.search(path_re, path) and re.search(fn_re, frame.name):
                wait = Wait(kind, label.format(fn=frame.name, short=_short_fn(frame.name)), frame,
                            _caller(frames, index), "python")
                # The same kind further out is the API the job called (Event.wait over Condition.wait);
                # a collective is named by torch's own frame, innermost, not by an engine's wrapper.
                key = (RANK[kind], py_index if kind == "collective" else -py_index)
                if best is None or key < best[:2]:
                    best = (key[0], key[1], wait)
                break
    if best is not None and best[2].kind == "barrier" and any(
            re.search(r"multiprocessing/synchronize\.py$", _path(f)) for f in frames):
        # multiprocessing.Barrier is threading.Barrier over a multiprocessing Condition.
        return Wait("barrier", "multiprocessing.Barrier", best[2].frame, best[2].caller, "python")
    return best[2] if best else None


def _source_wait(frames: Sequence[Frame], kernel: Optional[str] = None) -> Optional[Wait]:
    py = [f for f in frames if not f.native]
    if not py:
        return None
    text = _source_line(py[0])
    if not text:
        return None
    for kind, label, pattern in SOURCE_RULES:
        m = re.search(pattern, text)
        if m:
            what = m.group(0).rstrip("( ").lstrip(".").strip()
            if kind == "fd_read":
                kind = _FD_KINDS.get((kernel or "").partition(" on ")[2], "pipe")
            return Wait(kind, label.format(m=what), py[0], py[0], "source")
    return None


def _native_wait(frames: Sequence[Frame]) -> Optional[Wait]:
    for index, frame in enumerate(frames):
        if not frame.native:
            continue
        for kind, label, pattern in NATIVE_RULES:
            m = re.search(pattern, frame.name)
            if m:
                return Wait(kind, label.format(m=m.group(0)), frame, _caller(frames, index), "native")
    return None


def kernel_state(pid: int, tid: Optional[int]) -> Optional[str]:
    """What the kernel says a thread is blocked in: "futex", "read on socket", "uninterruptible (D)"; None if unknown."""
    base = PROC / str(pid) / "task" / str(tid or pid)
    try:
        stat = (base / "stat").read_bytes()
        state = stat[stat.rfind(b")") + 2:].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    if state == "D":
        return "uninterruptible (D)"
    try:
        fields = (base / "syscall").read_text().split()
    except OSError:
        return None
    if not fields or not fields[0].lstrip("-").isdigit():
        return None                    # "running"
    name = _SYSCALLS.get(platform.machine(), {}).get(int(fields[0]))
    if name in ("read", "pread64", "write", "pwrite64", "recvfrom", "recvmsg") and len(fields) > 1:
        try:
            target = os.readlink(PROC / str(pid) / "fd" / str(int(fields[1], 16)))
        except (OSError, ValueError):
            target = ""
        kind = ("socket" if target.startswith("socket:") else "pipe" if target.startswith("pipe:")
                else "tty" if target.startswith("/dev/pts") or target.startswith("/dev/tty")
                else "file" if target.startswith("/") else "")
        return f"{name} on {kind}" if kind else name
    return name


def _kernel_wait(hint: Optional[str], frames: Sequence[Frame]) -> Optional[Wait]:
    if not hint:
        return None
    py = [f for f in frames if not f.native]
    at = py[0] if py else None
    if hint.startswith("uninterruptible"):
        return Wait("disk", "uninterruptible sleep, state D", at, _caller(frames, 0), "kernel")
    name, _, on = hint.partition(" on ")
    if on == "socket":
        return Wait("socket", name.replace("from", ""), at, _caller(frames, 0), "kernel")
    if on == "pipe":
        return Wait("pipe", name, at, _caller(frames, 0), "kernel")
    if on == "file":
        return Wait("disk", f"{name} of a file", at, _caller(frames, 0), "kernel")
    if name in _KERNEL_KINDS:
        kind, label = _KERNEL_KINDS[name]
        return Wait(kind, label, at, _caller(frames, 0), "kernel")
    return None


_SPIN_WAITS = ("cuda_sync", "collective")


def explain(thread: ThreadStack) -> Wait:
    """The one wait that explains a thread."""
    frames = thread.frames
    py = [f for f in frames if not f.native]
    top = py[0] if py else (frames[0] if frames else None)
    wait = _python_wait(frames)
    if thread.spinning:
        # On CPU in both samples, but inside a C wait that spins by design (the CUDA driver spin-waits a
        # synchronize unless told to block; a collective may poll): that wait, not Python, is the answer.
        if wait is not None and wait.kind in _SPIN_WAITS and wait.frame is top:
            return wait
        return Wait("spinning", top.name if top else "?", top, _caller(frames, 0), "sampling")
    if wait is None and thread.active:
        return Wait("running", top.name if top else "?", top, _caller(frames, 0), "sampling")
    wait = (wait or _native_wait(frames) or _source_wait(frames, thread.kernel)
            or _kernel_wait(thread.kernel, frames))
    if wait is not None:
        return wait
    return Wait("idle", top.name if top else "no Python frames", top, _caller(frames, 0), "sampling")


# The stdlib's waiting wrappers: a helper is recognised by the first frame outside them.
_WAIT_WRAPPERS = re.compile(r"/(threading|queue|selectors)\.py$|multiprocessing/(connection|synchronize)\.py$")
# Waits a helper idles in; a pool worker blocked on a socket inside a task is not idle.
_IDLE_KINDS = ("lock", "queue", "sleep", "select", "join", "idle", "future", "pipe")


def _is_helper(thread: ThreadStack, wait: Wait) -> bool:
    """An idle helper thread (tqdm monitor, executor worker on its queue, queue feeder, watchdog)."""
    if thread.main or thread.active or wait.kind not in _IDLE_KINDS:
        return False
    if wait.kind == "join" or HELPER_THREAD_NAMES.search(thread.name or ""):
        return True
    frames = thread.python_frames()
    if any(_path(f).endswith("threading.py") and f.name == "Timer.run" for f in frames):
        return True
    for frame in frames:
        path = _path(frame)
        if _WAIT_WRAPPERS.search(path):
            continue
        return any(re.search(p, path) for p in HELPER_PATTERNS)
    return False


# -- taking a dump ----------------------------------------------------------------------

def _frames(raw_frames: Any) -> tuple[tuple[Frame, ...], int]:
    frames = []
    for raw in raw_frames if isinstance(raw_frames, list) else []:
        if not isinstance(raw, dict):
            continue
        path = str(raw.get("filename") or "")
        native = raw.get("module") is not None
        frames.append(Frame(name=str(raw.get("name") or "?"), file=str(raw.get("short_filename") or
                                                                        os.path.basename(path) or "?"),
                            line=int(raw.get("line") or 0) if str(raw.get("line") or 0).isdigit() else 0,
                            path=path, native=native))
    return tuple(frames[:MAX_FRAMES]), max(0, len(frames) - MAX_FRAMES)


def _run_py_spy(binary: str, pid: int, native: bool, timeout: float,
                on_spawn: Optional[Callable[[int], None]] = None) -> tuple[Optional[list], str]:
    argv = [binary, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    try:
        # Its own session: inside a runner, py-spy is a child of the runner, and `on_spawn` records it
        # as not part of the job (its CPU must not read as the stalled job's sign of life).
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=on_spawn is not None, close_fds=True)
    except OSError as exc:
        return None, f"py-spy could not run: {exc}"
    if on_spawn is not None:
        try:
            on_spawn(child.pid)
        except Exception:       # noqa: BLE001 - a lost record costs the bookkeeping, never the dump
            pass
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()            # the kernel detaches a dead tracer's tracees: the job goes on
        child.communicate()
        return None, f"py-spy did not answer within {timeout:g}s"
    # stdout first: a runner reaps every child (it is a subreaper), so the exit status may read 0 or be lost.
    try:
        data = json.loads(out) if out.strip() else None
    except ValueError:
        data = None
    if isinstance(data, list):
        return data, ""
    text = err.decode("utf-8", "replace")
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith(" ")), "")
    return None, (first[:300] or f"py-spy printed no stack (status {child.returncode})")


def _permission_text(error: str) -> bool:
    lowered = error.lower()
    return "permission" in lowered or "operation not permitted" in lowered or "eperm" in lowered


def _sample_process(binary: str, proc: ProcessId, native: bool, interval: float, deadline: float,
                    on_spawn: Optional[Callable[[int], None]] = None) -> tuple[Optional[ProcessStacks], Optional[str]]:
    """Two dumps of one process `interval` apart -> its threads (None + why when it cannot be dumped)."""
    if time.monotonic() >= deadline:
        return None, "not dumped: the whole dump's deadline had passed"
    timeout = max(1.0, min(CALL_TIMEOUT_S, deadline - time.monotonic()))
    if not is_alive(proc.pid, proc.start):
        return None, "exited before the dump"
    first, error = _run_py_spy(binary, proc.pid, native, timeout, on_spawn)
    if first is None:
        if not is_alive(proc.pid, proc.start):
            return None, "exited during the dump"
        if _permission_text(error):
            return None, f"ptrace not permitted: {error}"
        return None, error
    kernel = {}
    for raw in first:
        if isinstance(raw, dict):
            tid = raw.get("os_thread_id")
            kernel[tid] = kernel_state(proc.pid, tid if isinstance(tid, int) else None)
    time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
    second = None
    if time.monotonic() < deadline and is_alive(proc.pid, proc.start):
        second, _ = _run_py_spy(binary, proc.pid, native, max(1.0, min(CALL_TIMEOUT_S, deadline - time.monotonic())),
                                on_spawn)
    if not is_alive(proc.pid, proc.start):
        return None, "exited during the dump"
    return build_process(proc, (cmdline(proc.pid) or "?")[:300], first, second, kernel), None


def build_process(proc: ProcessId, command: str, first: list, second: Optional[list],
                  kernel: Optional[dict] = None) -> ProcessStacks:
    """One process from py-spy's JSON (two samples; `second` None if only one was taken): threads
    with their wait and helper flag, and the wait that explains the process. Pure: no I/O."""
    kernel = kernel or {}
    before = {}
    for raw in first:
        if isinstance(raw, dict):
            frames, _ = _frames(raw.get("frames"))
            py = [f for f in frames if not f.native]
            before[raw.get("thread_id")] = (bool(raw.get("active")), (py[0].name, py[0].path) if py else None)
    threads = []
    for raw in (second if second is not None else first)[:MAX_THREADS]:
        if not isinstance(raw, dict):
            continue
        frames, cut = _frames(raw.get("frames"))
        if not frames:
            continue
        py = [f for f in frames if not f.native]
        active = bool(raw.get("active"))
        was = before.get(raw.get("thread_id"))
        spinning = (second is not None and active and was is not None and was[0] and py
                    and was[1] == (py[0].name, py[0].path))
        tid = raw.get("os_thread_id") if isinstance(raw.get("os_thread_id"), int) else None
        thread = ThreadStack(pid=proc.pid, tid=tid, name=str(raw.get("thread_name") or ""), active=active,
                             frames=frames, main=(tid == proc.pid) or raw.get("thread_name") == "MainThread",
                             spinning=bool(spinning), kernel=kernel.get(tid), truncated=cut)
        wait = explain(thread)
        threads.append(_replace(thread, wait=wait, helper=_is_helper(thread, wait)))
    threads.sort(key=lambda t: (not t.main, t.helper, t.name))
    return ProcessStacks(pid=proc.pid, start=proc.start, command=command, threads=tuple(threads),
                         wait=_process_wait(threads))


def _replace(thread: ThreadStack, **changes: Any) -> ThreadStack:
    from dataclasses import replace
    return replace(thread, **changes)


def _process_wait(threads: Sequence[ThreadStack]) -> Optional[Wait]:
    """The thread wait that explains a process: the most specific among its threads that matter."""
    waiting = [(t, t.wait) for t in threads if t.wait is not None]
    candidates = [(t, w) for t, w in waiting if not t.helper] or waiting
    if not candidates:
        return None
    _, best = min(candidates, key=lambda c: (RANK.get(c[1].kind, len(RANK)), not c[0].main))
    return best


def dump(processes: Iterable[ProcessId], *, native: bool = False, py_spy: Optional[str] = None,
         interval: float = SAMPLE_INTERVAL_S, deadline_s: float = DUMP_DEADLINE_S,
         job: str = "", run_id: str = "", on_spawn: Optional[Callable[[int], None]] = None) -> StackDump:
    """Dump every Python process of `processes` (start-time checked), group the stacks, say the verdict.

    Raises StacksUnavailable when no process can be dumped from here at all.
    """
    binary = py_spy or find_py_spy()
    if binary is None:
        raise StacksUnavailable(INSTALL_HINT)
    refusal = ptrace_refusal()
    if refusal:
        raise StacksUnavailable(refusal)
    started = time.monotonic()
    deadline = started + deadline_s
    result = StackDump(taken_at=time.time(), native=native, job=job, run_id=run_id, py_spy=binary)
    todo: list[ProcessId] = []
    for proc in sorted(set(processes), key=lambda p: p.pid):
        if not is_alive(proc.pid, proc.start):
            continue
        command = (cmdline(proc.pid) or "?")[:300]
        if not is_python(proc.pid):
            stat = read_stat(proc.pid)
            result.skipped.append(Skipped(proc.pid, command, f"not a Python process ({stat.comm if stat else '?'})"))
            continue
        why = process_refusal(proc.pid)
        if why:
            result.skipped.append(Skipped(proc.pid, command, f"ptrace not permitted: {why}"))
            continue
        if len(todo) >= MAX_PROCESSES:
            result.skipped.append(Skipped(proc.pid, command, f"past the first {MAX_PROCESSES} Python processes"))
            continue
        todo.append(proc)
    if todo:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(PARALLEL, len(todo))) as pool:
            futures = {pool.submit(_sample_process, binary, proc, native, interval, deadline, on_spawn): proc
                       for proc in todo}
            for future, proc in futures.items():
                try:
                    stacks, why = future.result(timeout=max(0.1, deadline - time.monotonic() + 2 * CALL_TIMEOUT_S))
                except Exception as exc:           # noqa: BLE001 - one process must not lose the others
                    stacks, why = None, f"{type(exc).__name__}: {exc}"
                if stacks is not None:
                    result.processes.append(stacks)
                else:
                    result.skipped.append(Skipped(proc.pid, (cmdline(proc.pid) or "?")[:300], why or "not dumped"))
    if not result.processes and result.skipped and all(s.reason.startswith("ptrace not permitted")
                                                       for s in result.skipped):
        caps = effective_caps()
        hint = ("" if caps is not None and caps >> CAP_SYS_PTRACE & 1
                else "; this process lacks CAP_SYS_PTRACE (in a container: --cap-add SYS_PTRACE)")
        raise StacksUnavailable(f"{result.skipped[0].reason} (pid {result.skipped[0].pid}){hint}")
    result.processes.sort(key=lambda p: p.pid)
    result.skipped.sort(key=lambda s: s.pid)
    result.duration_s = time.monotonic() - started
    result.groups = group(result.processes)
    result.verdict = verdict(result)
    return result


# -- grouping and the verdict -----------------------------------------------------------

def _frame_key(frames: Sequence[Frame]) -> tuple:
    return tuple((f.name, f.path, f.line) for f in frames if not (f.native and f.name.startswith("0x")))


def group(processes: Sequence[ProcessStacks]) -> list[StackGroup]:
    """Identical stacks across processes and threads, one entry each: the ones that matter first
    (most processes, most specific wait), idle helpers last."""
    buckets: dict[tuple, list[ThreadStack]] = {}
    for proc in processes:
        for thread in proc.threads:
            buckets.setdefault((thread.helper, _frame_key(thread.frames)), []).append(thread)
    groups = []
    for (helper, _), threads in buckets.items():
        first = threads[0]
        groups.append(StackGroup(frames=first.frames, wait=first.wait,
                                 pids=tuple(sorted({t.pid for t in threads})), threads=len(threads),
                                 thread_names=tuple(sorted({t.name for t in threads if t.name})), helper=helper))
    groups.sort(key=lambda g: (g.helper, -len(g.pids), RANK.get(g.wait.kind if g.wait else "idle", 99), -g.threads))
    return groups


def _where(waits: Sequence[Wait]) -> str:
    """ at busy.py:6 (spin)"; the lines of every process when they differ (a loop sampled at two lines)."""
    at = [f for f in (w.caller or w.frame for w in waits) if f is not None]
    if not at:
        return ""
    lines = sorted({f.line for f in at if f.line})
    line = ":" + ",".join(map(str, lines[:3])) + (",…" if len(lines) > 3 else "") if lines else ""
    return f" at {at[0].file}{line} ({at[0].name})"


_ON_CHILDREN = ("subprocess", "join")


def _share_key(wait: Optional[Wait]) -> tuple:
    # The same wait in the same function of the same file is one share, whatever line each process is at.
    if wait is None:
        return ("idle",)
    at = wait.caller or wait.frame
    return (wait.kind, wait.label, at.path if at else "", at.name if at else "")


def verdict(result: StackDump) -> str:
    """One line: what the processes wait on, largest share first ("3 of 3 processes waiting on a ...")."""
    total = len(result.processes)
    if total == 0:
        if result.skipped:
            return f"no Python process could be dumped ({len(result.skipped)} skipped: {result.skipped[0].reason})"
        return "no live Python process in the run"
    shares: dict[tuple, list[ProcessStacks]] = {}
    for proc in result.processes:
        shares.setdefault(_share_key(proc.wait), []).append(proc)
    # Among equal shares, a process waiting on its children comes after the children's own wait: that is the cause.
    ordered = sorted(shares.values(), key=lambda ps: (-len(ps), bool(ps[0].wait and ps[0].wait.kind in _ON_CHILDREN),
                                                      RANK.get(ps[0].wait.kind if ps[0].wait else "idle", 99)))
    parts = []
    noun = "process" if total == 1 else "processes"
    for i, procs in enumerate(ordered[:3]):
        wait = procs[0].wait
        text = (wait.phrase() + _where([p.wait for p in procs if p.wait])) if wait else "no Python stack"
        parts.append(f"{len(procs)} of {total} {noun} {text}" if i == 0 else f"{len(procs)} {text}")
    if len(ordered) > 3:
        parts.append(f"{sum(len(p) for p in ordered[3:])} other")
    return "; ".join(parts)


# -- text -------------------------------------------------------------------------------

def render_lines(result: StackDump, *, full: bool = True) -> list[str]:
    """The grouped dump as plain text lines (the CLI prints them, the run dir keeps them, the console shows them)."""
    total = len(result.processes)
    lines = [f"verdict: {result.verdict}"]
    head = f"{total} Python process{'es' if total != 1 else ''} dumped"
    if result.processes:
        head += " (pid " + ", ".join(str(p.pid) for p in result.processes[:16])
        head += ", …)" if total > 16 else ")"
    head += f" in {result.duration_s:.1f}s" + (" with native frames" if result.native else "")
    lines.append(head)
    if result.simulated:
        lines.append(SIMULATED_LINE)
    main = [g for g in result.groups if not g.helper]
    helpers = [g for g in result.groups if g.helper]
    for g in main:
        lines.append("")
        names = ", ".join(g.thread_names[:3]) + (", …" if len(g.thread_names) > 3 else "")
        wait = f" — {g.wait.phrase()}" if g.wait else ""
        lines.append(f"{g.count_text(total)} [{names}]{wait}")
        lines.append(f"  {g.chain()}")
        if full:
            for frame in g.frames:
                if frame.native and frame.name.startswith("0x"):
                    continue
                lines.append(f"    {frame.label()}{'  [native]' if frame.native else ''}")
    if helpers:
        lines.append("")
        count = sum(g.threads for g in helpers)
        lines.append(f"idle helper threads ({count}, folded):")
        for g in helpers:
            names = ", ".join(g.thread_names[:2]) + (", …" if len(g.thread_names) > 2 else "")
            lines.append(f"  {g.count_text(total)} [{names}]: {g.chain(3)}")
    if result.skipped:
        lines.append("")
        for s in result.skipped:
            lines.append(f"skipped pid {s.pid} ({s.command[:80]}): {s.reason}")
    return lines


# -- a dump stored in a run dir (stacks/<time>.json + .txt, gpudeck.jobs.health) ------------------

@dataclass(frozen=True)
class StoredDump:
    """A dump as the run dir keeps it: its verdict, when it was taken, and the grouped text a person reads."""

    path: Path
    verdict: str
    taken_at: Optional[float]
    lines: tuple[str, ...]                  # the .txt, "verdict: ..." first, as render_lines wrote it
    simulated: bool = False


def read_stored_dump(run_dir: Path, rel_path: str) -> StoredDump:
    """stacks/<time>.json (and its .txt) of a run dir; OSError/ValueError when it is not there or not one.
    `rel_path` comes from the run's events: only a file under the run's stacks/ folder is read."""
    run_dir = Path(run_dir)
    folder = (run_dir / "stacks").resolve()
    path = (run_dir / rel_path).resolve()
    if path.parent != folder or path.suffix != ".json":
        raise ValueError(f"{rel_path}: not a stored stack dump of this run")
    with open(path, "rb") as fh:
        data = strictjson.loads(fh.read(MAX_STORED_READ))
    if not isinstance(data, dict) or not isinstance(data.get("verdict"), str):
        raise ValueError(f"{rel_path}: not a stored stack dump (no verdict)")
    try:
        with open(path.with_suffix(".txt"), "rb") as fh:
            lines = tuple(fh.read(MAX_STORED_READ).decode("utf-8", "replace").splitlines())
    except OSError:
        lines = (f"verdict: {data['verdict']}", f"(no {path.with_suffix('.txt').name} beside the dump)")
    taken = data.get("taken_at")
    return StoredDump(path=path, verdict=data["verdict"], lines=lines,
                      taken_at=float(taken) if isinstance(taken, (int, float)) and not isinstance(taken, bool) else None,
                      simulated=bool(data.get("simulated")))
