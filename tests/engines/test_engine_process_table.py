"""Engine discovery's process table read from /proc says what psutil says, for every process of this box."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs.engines import discovery

pytestmark = pytest.mark.skipif(not os.path.isfile("/proc/self/stat"), reason="no Linux /proc here")

SLEEPER = "import time; time.sleep(60)"


def facts(table: dict) -> dict:
    return {pid: (_stable_name(p.name), p.ppid, _stable_cmdline(p.cmdline), p.create_time) for pid, p in table.items()}


def _stable_cmdline(cmdline: list) -> list:
    """A process title set over argv (sshd's `sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups`) down to
    its first word: the process rewrites it as it works (CI saw a test's sshd listener count a connection
    between the /proc scans and psutil's, and back)."""
    return cmdline[:1] if cmdline and cmdline[0].endswith(":") else cmdline


def _stable_name(name: str) -> str:
    """A kernel workqueue worker's name without its work item (kworker/1:24-events): the kernel renames
    it with each item, and between two reads it can go to another and back (CI saw -events in both
    /proc scans and -virtio_vsock in psutil's between them)."""
    return name.split("-", 1)[0] if name.startswith("kworker/") else name


def test_the_proc_table_equals_psutils_for_every_process_including_the_odd_ones(tmp_path: Path) -> None:
    # The shapes where /proc and psutil could part: a program name longer than comm's 15 bytes,
    # an argument that is not UTF-8, an empty argument, a zombie (left out by both).
    long_named = tmp_path / "a-program-named-longer-than-comm"
    shutil.copy(sys.executable, long_named)
    odd = [
        subprocess.Popen([str(long_named), "-c", SLEEPER]),
        subprocess.Popen([sys.executable.encode(), b"-c", SLEEPER.encode(), b"caf\xe9-\xff", b""]),
        subprocess.Popen([sys.executable, "-c", "pass"]),        # exits, is not reaped: a zombie
    ]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:                      # the zombie is one once it has exited
            if Path(f"/proc/{odd[2].pid}/stat").read_bytes().split(b") ")[1][:1] == b"Z":
                break
            time.sleep(0.05)
        fast, slow, fast_again = discovery._proc_fs_table(), discovery._psutil_table(), discovery._proc_fs_table()
        assert fast is not None and fast_again is not None
        mine, theirs, mine_again = facts(fast), facts(slow), facts(fast_again)
        # Processes may start, end or rename themselves between the scans (a kernel workqueue
        # thread's name follows its work item: CI saw kworker/u8:1-writeback become -events_unbound).
        # Compared are those the /proc scans before and after psutil's agree on (workers' names
        # without their work item: _stable_name).
        steady = {pid for pid in fast.keys() & slow.keys() & fast_again.keys() if mine[pid] == mine_again[pid]}
        assert {odd[0].pid, odd[1].pid} <= steady
        assert len(steady) >= len(slow) // 2                    # a renaming box is the exception, not the rule
        assert odd[2].pid not in fast and odd[2].pid not in slow
        assert {pid: mine[pid] for pid in steady} == {pid: theirs[pid] for pid in steady}
        assert fast[odd[0].pid].name == "a-program-named-longer-than-comm"
        assert fast[odd[1].pid].cmdline[-2:] == [os.fsdecode(b"caf\xe9-\xff"), ""]
        # The table the discovery builds (children linked) is the /proc one.
        assert odd[0].pid in discovery._process_table()[os.getpid()].children
    finally:
        for proc in odd:
            proc.kill()
            proc.wait()
