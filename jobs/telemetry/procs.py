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


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_stat_counters(pid: int, proc_root: str = "/proc") -> Optional[tuple[int, int, int]]:
    """(start time, user + system CPU, both in clock ticks; resident bytes) from /proc/PID/stat.

    One read a process a tick for what psutil reads twice (is_running builds a second Process
    from stat; cpu_percent and memory_info read stat and statm): the start time tells a reused
    PID, and stat's rss is statm's resident count. None when the process is gone.
    """
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE_SIZE
    except (IndexError, ValueError):
        return None


class _Tracked:
    __slots__ = ("process", "create_time", "start_ticks", "name", "cmdline", "user", "primed",
                 "cpu_ticks", "cpu_at", "gpu_verified", "settled")

    def __init__(self, process: psutil.Process, create_time: float, start_ticks: Optional[int] = None) -> None:
        self.process = process
        self.create_time = create_time
        self.start_ticks = start_ticks      # from /proc/PID/stat: a reused PID has another
        self.name: Optional[str] = None
        self.cmdline: Optional[str] = None
        self.user: Optional[str] = None
        self.primed = False                 # cpu_percent needs one earlier call to mean anything
        self.cpu_ticks = 0                  # the /proc path's last CPU reading and when it was taken
        self.cpu_at: Optional[float] = None
        self.gpu_verified: Optional[bool] = None
        self.settled = False                # static facts read late enough to be final


class ProcTable:
    """Keeps one entry per live PID so a process's CPU % spans ticks.

    A PID is re-resolved when its start time changes (a reused PID is a different
    process). Static facts (name, cmdline, user) are read once per process, through
    psutil; the per-tick ones (CPU, rss) from one read of /proc/PID/stat.
    """

    def __init__(self, *, wall_clock: Callable[[], float] = time.time, host_namespace: Optional[bool] = None,
                 monotonic: Callable[[], float] = time.monotonic, proc_root: str = "/proc") -> None:
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._proc_root = proc_root
        # Linux: the per-tick facts come from one read of /proc/PID/stat; elsewhere from psutil.
        self._procfs = os.path.isfile(f"{proc_root}/self/stat")
        self._tracked: dict[int, _Tracked] = {}
        self._host_ns = in_host_pid_namespace() if host_namespace is None else host_namespace

    def _track(self, pid: int, counters: Optional[tuple[int, int, int]]) -> Optional[_Tracked]:
        entry = self._tracked.get(pid)
        try:
            if entry is not None:
                if self._procfs:
                    alive = counters is not None and counters[0] == entry.start_ticks
                else:
                    alive = entry.process.is_running()   # compares create time: PID reuse is caught here
                if alive:
                    if not entry.settled:
                        self._read_static(entry)
                    return entry
                del self._tracked[pid]
            if self._procfs and counters is None:
                return None
            process = psutil.Process(pid)
            entry = _Tracked(process, process.create_time(), counters[0] if counters else None)
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

    def _counters(self, pid: int) -> Optional[tuple[int, int, int]]:
        return read_stat_counters(pid, self._proc_root) if self._procfs else None

    def info(self, pid: int) -> ProcInfo:
        """What this /proc says about `pid`; known=False when it is not here."""
        counters = self._counters(pid)
        entry = self._track(pid, counters)
        if entry is None:
            return ProcInfo(pid=pid, known=False)
        return self._facts(pid, entry, counters)

    def _facts(self, pid: int, entry: _Tracked, counters: Optional[tuple[int, int, int]]) -> ProcInfo:
        cpu = rss = None
        if counters is not None:
            # What psutil's cpu_percent(None) gives: CPU time over wall time since the last call.
            now, cpu_ticks = self._monotonic(), counters[1]
            if entry.cpu_at is not None and now > entry.cpu_at:
                cpu = round(100.0 * (cpu_ticks - entry.cpu_ticks) / _CLOCK_TICKS / (now - entry.cpu_at), 1)
            entry.cpu_ticks, entry.cpu_at = cpu_ticks, now
            rss = counters[2]
        else:
            p = entry.process
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
        counters = self._counters(pid)
        entry = self._track(pid, counters)
        if entry is None:
            return ProcInfo(pid=pid, known=False)
        if not self._host_ns:
            if entry.gpu_verified is None:
                entry.gpu_verified = bool(holds_nvidia_device(pid))
            if not entry.gpu_verified:
                return ProcInfo(pid=pid, known=False)
        return self._facts(pid, entry, counters)

    def prune(self, live: Iterable[int]) -> None:
        """Forget PIDs no longer reported by any source."""
        keep = set(live)
        for pid in list(self._tracked):
            if pid not in keep:
                del self._tracked[pid]
