"""Listening TCP sockets (IPv4 and IPv6) and the PID that owns each one."""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from typing import Callable, Optional

try:
    import psutil
except ImportError:     # the SSH agent on a box without psutil: Linux needs only /proc and netlink here
    psutil = None       # type: ignore[assignment]

from gpudeck.jobs.telemetry.snapshot import PortListener

_TCP_LISTEN = "0A"
# Finding a socket's owner means reading every process's fd table: expensive on a
# box where vLLM holds thousands of fds. Owners are cached per socket inode (stable
# for the socket's life) and an unresolvable inode is retried no more often than this.
_UNRESOLVED_RETRY_S = 10.0


def _parse_v4(hex_addr: str) -> str:
    # /proc/net/tcp stores the address as one little-endian 32-bit word.
    return socket.inet_ntop(socket.AF_INET, bytes.fromhex(hex_addr)[::-1])


def _parse_v6(hex_addr: str) -> str:
    # Four little-endian 32-bit words.
    raw = bytes.fromhex(hex_addr)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(swapped))


def read_proc_net_listeners(proc_root: str = "/proc") -> Optional[list[tuple[int, str, int]]]:
    """[(port, address, socket inode)] from /proc/net/tcp{,6}; None when /proc has no such files."""
    found: list[tuple[int, str, int]] = []
    any_file = False
    for name, parse in (("tcp", _parse_v4), ("tcp6", _parse_v6)):
        try:
            with open(os.path.join(proc_root, "net", name), encoding="ascii", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        any_file = True
        for line in lines[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != _TCP_LISTEN:
                continue
            addr_hex, port_hex = parts[1].split(":")
            try:
                found.append((int(port_hex, 16), parse(addr_hex), int(parts[9])))
            except ValueError:
                continue
    return found if any_file else None


# sock_diag over netlink (what `ss -ltn` uses). /proc/net/tcp walks the kernel's whole
# established-connection hash, sized by RAM: ~1.2 ms per file on a 24 GiB VM, far more on a
# 2 TiB box, even with nothing in it. A LISTEN-only sock_diag dump reads just the listening table.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_TCP_LISTEN_STATE = 10
_NLMSG_HDR = struct.Struct("=IHHII")
_DIAG_REQ = struct.Struct("=BBBBI48s")                  # inet_diag_req_v2
_DIAG_MSG = struct.Struct("=BBBBHH16s16sI8sIIIII")      # inet_diag_msg


def read_sock_diag_listeners() -> Optional[list[tuple[int, str, int]]]:
    """[(port, address, socket inode)] of listening TCP sockets via netlink; None if unavailable."""
    found: list[tuple[int, str, int]] = []
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    with sock:
        sock.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            req = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN_STATE, bytes(48))
            try:
                sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), _SOCK_DIAG_BY_FAMILY,
                                          _NLM_F_REQUEST_DUMP, seq, 0) + req)
                done = False
                while not done:
                    data = sock.recv(65536)
                    if not data:
                        return None
                    offset = 0
                    while offset + _NLMSG_HDR.size <= len(data):
                        length, kind, _, _, _ = _NLMSG_HDR.unpack_from(data, offset)
                        if length < _NLMSG_HDR.size:
                            return None
                        if kind == _NLMSG_DONE:
                            done = True
                            break
                        if kind == _NLMSG_ERROR:
                            return None             # e.g. sock_diag not built in: use /proc instead
                        if kind == _SOCK_DIAG_BY_FAMILY:
                            (fam, state, _, _, sport, _, src, _, _, _, _, _, _, _, inode
                             ) = _DIAG_MSG.unpack_from(data, offset + _NLMSG_HDR.size)
                            if state == _TCP_LISTEN_STATE:
                                port = socket.ntohs(sport)
                                if fam == socket.AF_INET:
                                    addr = socket.inet_ntop(socket.AF_INET, src[:4])
                                else:
                                    addr = str(ipaddress.IPv6Address(src))
                                found.append((port, addr, inode))
                        offset += (length + 3) & ~3
            except OSError:
                return None
    return found


def map_socket_inodes(wanted: set[int], proc_root: str = "/proc") -> dict[int, list[int]]:
    """inode -> every pid holding it, by walking /proc/*/fd (only fds this user may read)."""
    holders: dict[int, list[int]] = {}
    if not wanted:
        return holders
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return holders
    for pid in pids:
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue                              # gone, or not ours to read (non-root)
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in wanted:
                    pids_for = holders.setdefault(inode, [])
                    if pid not in pids_for:
                        pids_for.append(pid)
    return holders


def _parent_pid(pid: int, proc_root: str) -> Optional[int]:
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            stat = fh.read()
        # The command name may contain spaces and parentheses: parse after the last ')'.
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def choose_owner(holders: list[int], proc_root: str = "/proc") -> int:
    """The process that owns a socket shared by a tree (forked workers inherit it): the tree's root."""
    if len(holders) == 1:
        return holders[0]
    held = set(holders)
    roots = [pid for pid in holders if _parent_pid(pid, proc_root) not in held]
    return min(roots or holders)


def _process_name(pid: int, proc_root: str = "/proc") -> Optional[str]:
    if psutil is None:
        try:
            with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                return fh.read().strip() or None
        except OSError:
            return None
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


class PortScanner:
    """`read()` -> listening sockets, sorted by port; owners cached per socket inode."""

    def __init__(self, *, proc_root: str = "/proc", monotonic: Callable[[], float] = time.monotonic) -> None:
        self._proc_root = proc_root
        self._monotonic = monotonic
        self._owner: dict[int, tuple[Optional[int], Optional[str]]] = {}   # inode -> (pid, name)
        self._unresolved_at: dict[int, float] = {}

    def read(self) -> tuple[PortListener, ...]:
        rows = read_sock_diag_listeners() if self._proc_root == "/proc" else None
        if rows is None:
            rows = read_proc_net_listeners(self._proc_root)
        if rows is None:
            return self._read_psutil()
        live = {inode for _, _, inode in rows}
        now = self._monotonic()
        wanted = {
            inode for inode in live
            if inode not in self._owner
            and now - self._unresolved_at.get(inode, float("-inf")) >= _UNRESOLVED_RETRY_S
        }
        # Inode 0 is a socket whose owner the kernel hides from us (another netns user): no search.
        wanted.discard(0)
        if wanted:
            holders = map_socket_inodes(wanted, self._proc_root)
            for inode in wanted:
                if inode not in holders:
                    self._unresolved_at[inode] = now
                else:
                    pid = choose_owner(holders[inode], self._proc_root)
                    self._owner[inode] = (pid, _process_name(pid, self._proc_root))
                    self._unresolved_at.pop(inode, None)
        for cache in (self._owner, self._unresolved_at):
            for inode in [i for i in cache if i not in live]:
                del cache[inode]
        seen: set[tuple[int, str, Optional[int]]] = set()
        out = []
        for port, address, inode in rows:
            owner, name = self._owner.get(inode, (None, None))
            key = (port, address, owner)
            if key in seen:                       # SO_REUSEPORT workers: one row per owner
                continue
            seen.add(key)
            out.append(PortListener(port=port, address=address, pid=owner, process=name))
        out.sort(key=lambda p: (p.port, p.address, p.pid or 0))
        return tuple(out)

    @staticmethod
    def _read_psutil() -> tuple[PortListener, ...]:
        """Non-Linux path: psutil sees every socket; owners only where permitted."""
        if psutil is None:
            raise OSError("no /proc/net/tcp and no psutil: listening ports cannot be read here")
        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.AccessDenied, OSError):
            return ()
        seen = set()
        out = []
        for c in conns:
            if c.status != psutil.CONN_LISTEN or not c.laddr:
                continue
            key = (c.laddr.port, c.laddr.ip, c.pid)
            if key in seen:
                continue
            seen.add(key)
            out.append(PortListener(port=c.laddr.port, address=c.laddr.ip, pid=c.pid,
                                    process=_process_name(c.pid) if c.pid else None))
        out.sort(key=lambda p: (p.port, p.address, p.pid or 0))
        return tuple(out)
