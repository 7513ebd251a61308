"""gpudeck.jobs.procs on real processes: identity with start time, trees, run tags, signals that never hit a reused PID."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpudeck.jobs import procs
from gpudeck.jobs.procs import ProcessId

from runsupport import wait_for


def spawn_sleep(env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], env=env, **kw)


def test_identity_of_a_live_process_and_a_fake_start_time():
    child = spawn_sleep()
    try:
        ident = procs.identity(child.pid)
        assert ident is not None and ident.pid == child.pid
        assert procs.is_alive(ident.pid, ident.start)
        # The same PID with another start time is another process: never "alive".
        assert not procs.is_alive(ident.pid, ident.start + 1)
        assert not procs.is_alive(ident.pid, ident.start - 1)
    finally:
        child.kill()
        child.wait()
    assert not procs.is_alive(ident.pid, ident.start)


def test_signal_with_a_wrong_start_time_is_not_sent():
    child = spawn_sleep()
    try:
        real = procs.identity(child.pid)
        impostor = ProcessId(child.pid, real.start + 7)   # what a stale record of a reused PID looks like
        assert procs.signal_process(impostor, signal.SIGKILL) is False
        assert child.poll() is None, "a process was killed through a stale identity"
        assert procs.signal_process(real, signal.SIGKILL) is True
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_signal_group_needs_a_known_member():
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        real = procs.identity(child.pid)
        assert procs.signal_group(child.pid, signal.SIGKILL, [ProcessId(child.pid, real.start + 1)]) is False
        assert child.poll() is None
        assert procs.signal_group(child.pid, signal.SIGKILL, [real]) is True
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_descendants_and_run_tag_find_a_setsid_escapee():
    env = dict(os.environ, GPUDECK_RUN_ID="test-tag-123")
    # bash -> setsid'd bash -> sleep: the grandchild leaves the session but keeps the tag.
    parent = subprocess.Popen(["bash", "-c", "setsid bash -c 'sleep 300; true' & wait"], env=env)
    try:
        me = procs.identity(parent.pid)
        found = wait_for(lambda: [st for st in procs.descendants(me) if st.comm == "sleep"],
                         what="the grandchild sleep")
        grandchild = found[0]
        assert grandchild.session != procs.read_stat(parent.pid).session
        assert grandchild.pid in {st.pid for st in procs.tagged("test-tag-123")}
        assert parent.pid in {st.pid for st in procs.tagged("test-tag-123")}
        assert procs.tagged("test-tag-12") == []          # the tag matches exactly, not as a prefix
        assert "sleep 300" in procs.cmdline(grandchild.pid)
    finally:
        for st in procs.tagged("test-tag-123"):
            procs.signal_process(st.identity, signal.SIGKILL)
        parent.wait(timeout=10)


def test_stat_parses_a_process_name_with_spaces_and_parens():
    code = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); time.sleep(300)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        st = wait_for(lambda: (s := procs.read_stat(child.pid)) and s.comm == "a) b (c" and s,
                      what="renamed process")
        assert st.ppid == os.getpid()
        assert st.start == procs.start_time(child.pid)
    finally:
        child.kill()
        child.wait()


def test_signal_names():
    assert procs.signal_number("TERM") == signal.SIGTERM
    assert procs.signal_number("SIGINT") == signal.SIGINT
    assert procs.signal_number("kill") == signal.SIGKILL
    assert procs.signal_number("15") == 15
    assert procs.signal_name(9) == "SIGKILL"
