"""Process identity and process trees read from Linux /proc (stdlib only): who is alive, who belongs to a run, safe signals."""
from __future__ import annotations

import errno
import os
import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

PROC = Path("/proc")
RUN_TAG = "GPUDECK_RUN_ID"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class ProcessId:
    """A process as gpudeck names it: the PID *and* its start time.

    A PID alone is reused by the kernel after the process dies; the start time
    (clock ticks since boot, /proc/PID/stat field 22) makes the pair unique for
    the life of the machine, so a stored ProcessId never names a stranger.
    """

    pid: int
    start: int

    def to_jsonable(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_jsonable(cls, data: Optional[dict]) -> Optional["ProcessId"]:
        # A hand-edited or corrupt meta.json names no process rather than crashing its readers.
        if not isinstance(data, dict) or data.get("pid") is None or data.get("start") is None:
            return None
        try:
            return cls(int(data["pid"]), int(data["start"]))
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that gpudeck uses."""

    pid: int
    comm: str
    state: str          # R S D Z T ...; Z = zombie (dead, not yet reaped)
    ppid: int
    pgrp: int
    session: int
    utime: int          # clock ticks
    stime: int
    start: int          # clock ticks since boot
    rss_pages: int

    @property
    def identity(self) -> ProcessId:
        return ProcessId(self.pid, self.start)

    @property
    def cpu_seconds(self) -> float:
        return (self.utime + self.stime) / _CLK_TCK

    @property
    def rss_bytes(self) -> int:
        return self.rss_pages * _PAGE_SIZE


def read_stat(pid: int) -> Optional[ProcStat]:
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm may itself contain spaces and parentheses: it ends at the LAST ')'.
    open_paren = raw.find(b"(")
    close_paren = raw.rfind(b")")
    if open_paren < 0 or close_paren < 0:
        return None
    comm = raw[open_paren + 1:close_paren].decode("utf-8", "replace")
    rest = raw[close_paren + 2:].split()
    try:
        # rest[0] is field 3 (state); field N is rest[N - 3].
        return ProcStat(
            pid=pid, comm=comm, state=rest[0].decode(), ppid=int(rest[1]), pgrp=int(rest[2]),
            session=int(rest[3]), utime=int(rest[11]), stime=int(rest[12]), start=int(rest[19]),
            rss_pages=int(rest[21]),
        )
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> Optional[int]:
    stat = read_stat(pid)
    return stat.start if stat else None


def identity(pid: int) -> Optional[ProcessId]:
    """The ProcessId of a live PID now, or None."""
    stat = read_stat(pid)
    return stat.identity if stat else None


def is_alive(pid: int, start: int, *, zombies_count: bool = False) -> bool:
    """True only if PID exists now AND started at `start`: a reused PID is never taken for ours.

    A zombie has exited and holds no memory or GPU: it counts as dead unless asked.
    """
    stat = read_stat(pid)
    if stat is None or stat.start != start:
        return False
    return zombies_count or stat.state != "Z"


def alive(proc: Optional[ProcessId]) -> bool:
    return proc is not None and is_alive(proc.pid, proc.start)


def all_pids() -> list[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def all_stats() -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    for pid in all_pids():
        stat = read_stat(pid)
        if stat is not None:
            stats[pid] = stat
    return stats


def descendants(root: ProcessId, stats: Optional[dict[int, ProcStat]] = None) -> list[ProcStat]:
    """Every live process below `root` (children, grandchildren, ...), by a ppid walk.

    Empty if `root` itself is no longer the process it was.
    """
    stats = all_stats() if stats is None else stats
    top = stats.get(root.pid)
    if top is None or top.start != root.start:
        return []
    children: dict[int, list[ProcStat]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st)
    found: list[ProcStat] = []
    stack = [root.pid]
    seen = {root.pid}
    while stack:
        for child in children.get(stack.pop(), ()):
            if child.pid not in seen and child.start >= top.start:
                seen.add(child.pid)
                found.append(child)
                stack.append(child.pid)
    return found


def group_members(pgid: int, stats: Optional[dict[int, ProcStat]] = None) -> list[ProcStat]:
    stats = all_stats() if stats is None else stats
    return [st for st in stats.values() if st.pgrp == pgid]


def environ_value(pid: int, name: str) -> Optional[str]:
    """One variable of a process's initial environment, or None (gone, or not ours to read)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def tagged(run_id: str, stats: Optional[dict[int, ProcStat]] = None) -> list[ProcStat]:
    """Processes whose environment carries GPUDECK_RUN_ID=<run_id>.

    The runner puts the tag in the job's environment, so every process of the run
    carries it, including ones that double-forked and setsid'd out of the tree.
    """
    stats = all_stats() if stats is None else stats
    needle = f"{RUN_TAG}={run_id}".encode()
    found = []
    for st in stats.values():
        try:
            raw = (PROC / str(st.pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle + b"\0" in raw or raw.endswith(needle):
            found.append(st)
    return found


def cmdline(pid: int) -> Optional[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        stat = read_stat(pid)
        return f"[{stat.comm}]" if stat else None
    return " ".join(part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0"))


def boot_time() -> Optional[float]:
    """Unix time the machine booted (/proc/stat btime)."""
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def ticks_at(unix_time: float) -> int:
    """The start-time value (clock ticks since boot) a process started at `unix_time` would have."""
    boot = boot_time()
    return 0 if boot is None else max(0, int((unix_time - boot) * _CLK_TCK) - _CLK_TCK)


def cmdline_args(pid: int) -> list[str]:
    """argv of a process as the kernel shows it (empty: gone, a kernel thread, or not ours to read)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")] if raw else []


def file_id(path: str | os.PathLike) -> Optional[tuple[int, int]]:
    """(device, inode) of a file, the identity an open fd is compared with."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def holds_file(pid: int, target: tuple[int, int]) -> bool:
    """True if the process has the file (device, inode) open on any fd (even after it was renamed)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(fd_dir / fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == target:
            return True
    return False


def holders_of(target: tuple[int, int], stats: Optional[dict[int, "ProcStat"]] = None) -> list["ProcStat"]:
    """Every process holding the file open: a job's processes keep its output.log as stdout/stderr."""
    stats = all_stats() if stats is None else stats
    return [st for st in stats.values() if holds_file(st.pid, target)]


def io_bytes(pid: int) -> tuple[Optional[int], Optional[int]]:
    """(read_bytes, write_bytes) from /proc/PID/io: storage bytes, not page-cache hits."""
    try:
        text = (PROC / str(pid) / "io").read_text()
    except OSError:
        return None, None
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        values[key.strip()] = value.strip()
    try:
        return int(values["read_bytes"]), int(values["write_bytes"])
    except (KeyError, ValueError):
        return None, None


def signal_process(proc: ProcessId, sig: int) -> bool:
    """Send `sig` to `proc` only if it is still that process. True if sent.

    With a pidfd the check and the signal refer to the same process even if it
    dies and its PID is reused between them; without one the window is tiny.
    """
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return False
            pidfd = None
    try:
        if not is_alive(proc.pid, proc.start, zombies_count=True):
            return False
        if pidfd is not None:
            _signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def signal_group(pgid: int, sig: int, members_ok: Iterable[ProcessId]) -> bool:
    """killpg(pgid, sig), but only while a process we know (`members_ok`) is in that group.

    A group id names a group as long as any member lives; checking that one of
    ours is still a member keeps a recycled group id from being signalled.
    """
    known = {p.pid: p.start for p in members_ok}
    for st in group_members(pgid):
        if known.get(st.pid) == st.start:
            try:
                os.killpg(pgid, sig)
                return True
            except (ProcessLookupError, PermissionError):
                return False
    return False


def signal_number(name: str | int) -> int:
    """'TERM', 'SIGTERM', 'term', 15 -> 15."""
    if isinstance(name, int):
        return name
    text = str(name).strip().upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    return int(getattr(_signal.Signals, text))


def signal_name(num: int) -> str:
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def listening_ports() -> dict[int, set[int]]:
    """{port: {socket inode, ...}} of TCP sockets in LISTEN, from /proc/net/tcp{,6}."""
    ports: dict[int, set[int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":      # 0A = TCP_LISTEN
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            ports.setdefault(port, set()).add(int(fields[9]))
    return ports


def port_listening(port: int) -> bool:
    return port in listening_ports()


def socket_owners(inodes: set[int]) -> list[int]:
    """PIDs holding any of these socket inodes (only processes we may inspect)."""
    targets = {f"socket:[{i}]" for i in inodes}
    owners = []
    for pid in all_pids():
        fd_dir = PROC / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in targets:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners


def port_owners(port: int) -> list[int]:
    inodes = listening_ports().get(port)
    return socket_owners(inodes) if inodes else []
