"""A cgroup v2 directory per run, where this machine lets gpudeck make one: every process of the run, however it daemonised (stdlib only)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

MOUNTINFO = Path("/proc/self/mountinfo")


def cgroup2_mount() -> Optional[Path]:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split()
            if len(fields) > 4:
                return Path(fields[4])
    return None


def current_cgroup(pid: int | str = "self") -> Optional[str]:
    """The v2 cgroup of a process, as in /proc/PID/cgroup ('0::/path')."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def _dir(mount: Path, cgroup: str) -> Path:
    return mount / cgroup.lstrip("/")


def enter_new(name: str) -> Optional[Path]:
    """Create <my cgroup>/<name> and move this process into it; its children are born there.

    None where that is not allowed (no cgroup2, not delegated to us, read-only):
    the run then relies on its tag, sessions and log fd alone.
    """
    mount, here = cgroup2_mount(), current_cgroup()
    if mount is None or here is None:
        return None
    path = _dir(mount, here) / name
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        remove(path)
        return None
    return path


def leave(to_cgroup: Optional[str]) -> bool:
    """Move this process back to `to_cgroup` (where it was before enter_new)."""
    mount = cgroup2_mount()
    if mount is None or to_cgroup is None:
        return False
    try:
        (_dir(mount, to_cgroup) / "cgroup.procs").write_text(f"{os.getpid()}\n")
        return True
    except OSError:
        return False


def members(path: Optional[str | Path]) -> list[int]:
    """PIDs in a cgroup directory (empty if it is gone or not a cgroup)."""
    if not path:
        return []
    try:
        text = (Path(path) / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split() if x.isdigit()]


def is_run_cgroup(path: Optional[str], run_id: str) -> bool:
    """A recorded cgroup path is believed only if it lies in the cgroup2 hierarchy and is named for the run."""
    mount = cgroup2_mount()
    if not path or mount is None:
        return False
    p = Path(os.path.normpath(path))
    return p.name.endswith(run_id) and p.name.startswith("gpudeck") and mount in p.parents


def remove(path: Optional[str | Path]) -> bool:
    """rmdir the cgroup once nothing is left in it."""
    if not path:
        return False
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False
