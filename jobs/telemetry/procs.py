"""Process facts (cmdline, user, cpu%, rss, age) for GPU processes and listeners, cached across ticks."""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional

import psutil

from gpudeck.jobs.telemetry.snapshot import ProcInfo

_CMDLINE_MAX = 4096       # a vLLM command line can be huge; the UI never needs more than this
# Between fork and exec a child shows its parent's (or an empty) command line; facts read
# that young are re-read on later ticks until the process is older than this.
_SETTLE_S = 2.0


def in_host_pid_namespace(proc_root: str = "/proc") -> bool:
    """True when this /proc is the host's PID namespace (where NVML's PIDs live).

    In the initial namespace PID 2 is always the kernel's kthreadd; in a container
    PID namespace it is some ordinary process or absent.
    """
    try:
        with open(os.path.join(proc_root, "2", "comm"), encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() == "kthreadd"
    except OSError:
        return False


def holds_nvidia_device(pid: int, proc_root: str = "/proc") -> Optional[bool]:
    """Whether `pid` has /dev/nvidia* open; None when its fds cannot be read."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        entries = os.scandir(fd_dir)
    except OSError:
        return None
    with entries:
        for entry in entries:
            try:
                if os.readlink(entry.path).startswith("/dev/nvidia"):
                    return True
            except OSError:
                continue
    return False


class _Tracked:
    __slots__ = ("process", "create_time", "name", "cmdline", "user", "primed", "gpu_verified", "settled")

    def __init__(self, process: psutil.Process, create_time: float) -> None:
        self.process = process
        self.create_time = create_time
        self.name: Optional[str] = None
        self.cmdline: Optional[str] = None
        self.user: Optional[str] = None
        self.primed = False                 # cpu_percent needs one earlier call to mean anything
        self.gpu_verified: Optional[bool] = None
        self.settled = False                # static facts read late enough to be final


class ProcTable:
    """Keeps one psutil.Process per live PID so cpu_percent spans ticks.

    A PID is re-resolved when its start time changes (a reused PID is a different
    process). Static facts (name, cmdline, user) are read once per process.
    """

    def __init__(self, *, wall_clock: Callable[[], float] = time.time, host_namespace: Optional[bool] = None) -> None:
        self._wall_clock = wall_clock
        self._tracked: dict[int, _Tracked] = {}
        self._host_ns = in_host_pid_namespace() if host_namespace is None else host_namespace

    def _track(self, pid: int) -> Optional[_Tracked]:
        entry = self._tracked.get(pid)
        try:
            if entry is not None:
                if entry.process.is_running():   # compares create time: PID reuse is caught here
                    if not entry.settled:
                        self._read_static(entry)
                    return entry
                del self._tracked[pid]
            process = psutil.Process(pid)
            entry = _Tracked(process, process.create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._tracked.pop(pid, None)
            return None
        except psutil.Error:
            return None
        self._read_static(entry)
        self._tracked[pid] = entry
        return entry

    def _read_static(self, entry: _Tracked) -> None:
        p = entry.process
        entry.settled = self._wall_clock() - entry.create_time >= _SETTLE_S
        try:
            entry.name = p.name()
        except psutil.Error:
            pass
        try:
            argv = p.cmdline()
            # setproctitle pads the title with spaces and NULs (VLLM::Worker): strip them.
            joined = " ".join(a for a in (x.strip("\x00 ") for x in argv) if a) if argv else ""
            entry.cmdline = joined or (f"[{entry.name}]" if entry.name else None)
            if entry.cmdline is not None:
                entry.cmdline = entry.cmdline[:_CMDLINE_MAX]
        except psutil.Error:
            pass
        try:
            entry.user = p.username()
        except (psutil.Error, KeyError):
            pass

    def info(self, pid: int) -> ProcInfo:
        """What this /proc says about `pid`; known=False when it is not here."""
        entry = self._track(pid)
        if entry is None:
            return ProcInfo(pid=pid, known=False)
        p = entry.process
        cpu = rss = None
        try:
            with p.oneshot():
                pct = p.cpu_percent(None)
                cpu = pct if entry.primed else None
                entry.primed = True
                rss = p.memory_info().rss
        except psutil.Error:
            pass
        return ProcInfo(
            pid=pid,
            name=entry.name,
            cmdline=entry.cmdline,
            user=entry.user,
            cpu_percent=cpu,
            rss=rss,
            age_s=max(0.0, self._wall_clock() - entry.create_time),
            known=True,
        )

    def gpu_info(self, pid: int) -> ProcInfo:
        """Like info(), for a PID that NVML reported.

        NVML speaks host PIDs. Inside a container PID namespace the same number may
        name an unrelated local process, so a local match is only trusted when this
        is the host namespace or the process really holds /dev/nvidia* open.
        """
        entry = self._track(pid)
        if entry is None:
            return ProcInfo(pid=pid, known=False)
        if not self._host_ns:
            if entry.gpu_verified is None:
                entry.gpu_verified = bool(holds_nvidia_device(pid))
            if not entry.gpu_verified:
                return ProcInfo(pid=pid, known=False)
        return self.info(pid)

    def prune(self, live: Iterable[int]) -> None:
        """Forget PIDs no longer reported by any source."""
        keep = set(live)
        for pid in list(self._tracked):
            if pid not in keep:
                del self._tracked[pid]
