"""`gpudeck stacks` on real gpudeck jobs of several Python processes, deadlocked in the ways the verdicts name.

Each job is started with the real CLI, dumped with the real py-spy (from the test extra), and the
assertions are on the grouped frames and the verdict, never on py-spy's own text.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs import procs, stacks
from gpudeck.jobs.runs import latest_run

from runsupport import PY, cli, cli_env, wait_for, write_jobs

pytestmark = pytest.mark.skipif(stacks.find_py_spy() is None or stacks.ptrace_refusal() is not None,
                                reason="py-spy missing or ptrace not permitted here")

BARRIER = """
import multiprocessing as mp, time

def party(barrier):
    barrier.wait()                      # the fourth party never comes

if __name__ == "__main__":
    barrier = mp.Barrier(4)
    children = [mp.Process(target=party, args=(barrier,)) for _ in range(2)]
    for child in children:
        child.start()
    print("parties started", flush=True)
    party(barrier)
"""

SOCKET = """
import multiprocessing as mp, socket

def client(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.recv(1024)                 # the peer never writes

if __name__ == "__main__":
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    children = [mp.Process(target=client, args=(port,)) for _ in range(2)]
    for child in children:
        child.start()
    peers = [server.accept()[0] for _ in children]
    print("accepted", len(peers), flush=True)
    for child in children:
        child.join()
"""

LOCK = """
import multiprocessing as mp, threading, time

def holder(lock):
    lock.acquire()
    time.sleep(3600)                    # holds the lock forever

def worker():
    lock = threading.Lock()
    threading.Thread(target=holder, args=(lock,), name="holder", daemon=True).start()
    time.sleep(0.2)
    lock.acquire()                      # never granted

if __name__ == "__main__":
    children = [mp.Process(target=worker) for _ in range(2)]
    for child in children:
        child.start()
    print("workers started", flush=True)
    for child in children:
        child.join()
"""

BUSY = """
import multiprocessing as mp

def spin():
    n = 0
    while True:
        n += 1

if __name__ == "__main__":
    children = [mp.Process(target=spin) for _ in range(2)]
    for child in children:
        child.start()
    print("spinning", flush=True)
    for child in children:
        child.join()
"""

SUBPROCESS = """
import subprocess, sys

def build():
    subprocess.run(["sleep", "3600"])   # a child that never ends

if __name__ == "__main__":
    print("building", flush=True)
    build()
"""

HELPERS = """
import concurrent.futures, threading, time

def main():
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    pool.submit(time.sleep, 0.01).result()      # a worker now idles on its queue
    done = threading.Event()
    done.wait()                                 # the main thread waits for nothing

if __name__ == "__main__":
    print("main waiting", flush=True)
    main()
"""

def start(tmp_path: Path, name: str, script: str) -> tuple[Path, dict, str]:
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    jobs = write_jobs(tmp_path / "jobs.toml", {name: {"cmd": [PY, str(path)]}})
    env = cli_env(tmp_path / "state")
    started = cli(["--jobs", str(jobs), "start", name], env)
    assert started.returncode == 0, started.stderr
    return jobs, env, started.stdout.decode().strip()


def stacks_json(jobs: Path, env: dict, name: str, *extra: str) -> dict:
    out = cli(["--jobs", str(jobs), "stacks", name, "--json", *extra], env, timeout=90)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout) if out.returncode == 0 else {}


def dump_until(jobs: Path, env: dict, name: str, ready, what: str, timeout: float = 60.0) -> dict:
    """Dump until the job has reached the wait the test is about (its processes start at their own pace)."""
    seen: list[dict] = []

    def attempt():
        data = stacks_json(jobs, env, name)
        seen[:] = [data]
        return data if data and ready(data) else None
    try:
        return wait_for(attempt, timeout=timeout, what=what, interval=0.3)
    except AssertionError:
        raise AssertionError(f"{what}: last verdict {seen[0].get('verdict') if seen else None!r}") from None


def main_groups(data: dict) -> list[dict]:
    return [g for g in data["groups"] if not g["helper"]]


def names(group: dict) -> list[str]:
    return [f["name"] for f in group["frames"]]


def test_barrier_whose_fourth_party_never_comes(tmp_path, state):
    jobs, env, run_id = start(tmp_path, "barrier", BARRIER)
    data = dump_until(jobs, env, "barrier", lambda d: len(d["processes"]) == 3 and all(
        p["wait"]["kind"] == "barrier" for p in d["processes"]), "3 processes in the barrier")
    assert data["verdict"].startswith("3 of 3 processes waiting on a multiprocessing.Barrier at barrier.py:5 (party)")
    groups = main_groups(data)
    # The two children share one stack; the parent reached the same wait by another path.
    assert sorted(len(g["pids"]) for g in groups) == [1, 2]
    for g in groups:
        assert names(g)[:4] == ["Condition.wait", "Condition.wait_for", "Barrier._wait", "Barrier.wait"]
        assert "party" in names(g)
    run = latest_run("barrier")
    assert {p["pid"] for p in data["processes"]} <= {st.pid for st in procs.tagged(run.run_id)}


def test_socket_recv_on_a_peer_that_never_writes(tmp_path, state):
    jobs, env, _ = start(tmp_path, "sock", SOCKET)
    data = dump_until(jobs, env, "sock", lambda d: sum(
        p["wait"]["kind"] == "socket" for p in d["processes"]) == 2, "2 clients in recv")
    assert data["verdict"].startswith("2 of 3 processes blocked on a socket (recv) at sock.py:6 (client)")
    (clients,) = [g for g in main_groups(data) if g["wait"]["kind"] == "socket"]
    assert len(clients["pids"]) == 2 and clients["threads"] == 2
    assert names(clients)[0] == "client"
    assert "1 waiting for child processes to exit (Process.join)" in data["verdict"]


def test_threading_lock_held_forever(tmp_path, state):
    jobs, env, _ = start(tmp_path, "locked", LOCK)
    data = dump_until(jobs, env, "locked", lambda d: sum(
        p["wait"]["kind"] == "lock" for p in d["processes"]) == 2, "2 workers blocked on the lock")
    assert data["verdict"].startswith("2 of 3 processes blocked on a lock (Lock.acquire) at locked.py:12 (worker)")
    groups = main_groups(data)
    (blocked,) = [g for g in groups if g["wait"]["kind"] == "lock"]
    assert names(blocked)[0] == "worker" and len(blocked["pids"]) == 2
    # The holder threads are folded into one entry too: 2 threads in 2 processes, sleeping.
    (holders,) = [g for g in groups if "holder" in g["thread_names"]]
    assert len(holders["pids"]) == 2 and holders["wait"]["kind"] == "sleep"
    # With C frames the same wait is named from the interpreter's own lock function.
    native = stacks_json(jobs, env, "locked", "--native")
    assert native["native"] and native["verdict"].startswith(
        "2 of 3 processes blocked on a lock (threading.Lock.acquire) at locked.py:12 (worker)")
    (blocked,) = [g for g in main_groups(native) if g["wait"]["kind"] == "lock"]
    assert blocked["wait"]["source"] == "native" and any(f["native"] for f in blocked["frames"])


def test_busy_loop_is_spinning_in_python(tmp_path, state):
    jobs, env, _ = start(tmp_path, "busy", BUSY)
    data = dump_until(jobs, env, "busy", lambda d: sum(
        p["wait"]["kind"] == "spinning" for p in d["processes"]) == 2, "2 spinning children")
    # The two loops may be sampled at different lines: still one share of the verdict, naming both lines.
    assert re.match(r"2 of 3 processes spinning in Python at busy\.py:[67](,7)? \(spin\); "
                    r"1 waiting for child processes to exit \(Process\.join\)", data["verdict"]), data["verdict"]
    spinners = [g for g in data["groups"] if g["wait"]["kind"] == "spinning"]
    assert sum(len(g["pids"]) for g in spinners) == 2 and all(names(g)[0] == "spin" for g in spinners)


def test_subprocess_wait_and_the_non_python_child_is_named(tmp_path, state):
    jobs, env, _ = start(tmp_path, "build", SUBPROCESS)
    data = dump_until(jobs, env, "build", lambda d: d["processes"] and d["processes"][0]["wait"]["kind"]
                      == "subprocess", "the parent waiting on its child")
    assert data["verdict"].startswith("1 of 1 process waiting for a subprocess (subprocess.run) at build.py:5 (build)")
    assert [s["reason"] for s in data["skipped"]] == ["not a Python process (sleep)"]
    text = cli(["--jobs", str(jobs), "stacks", "build"], env, timeout=90)
    assert text.returncode == 0
    lines = text.stdout.decode().splitlines()
    assert lines[0].startswith("verdict: 1 of 1 process waiting for a subprocess (subprocess.run)")
    assert any(line.startswith("skipped pid ") and "not a Python process (sleep)" in line for line in lines)


def test_idle_helper_threads_fold_below_the_main_thread(tmp_path, state):
    jobs, env, _ = start(tmp_path, "helpers", HELPERS)
    data = dump_until(jobs, env, "helpers", lambda d: any(g["helper"] for g in d["groups"]), "an idle pool worker")
    assert data["verdict"] == "1 of 1 process blocked on a lock (threading.Event.wait) at helpers.py:8 (main)"
    assert [g["helper"] for g in data["groups"]] == sorted(g["helper"] for g in data["groups"])
    (helper,) = [g for g in data["groups"] if g["helper"]]
    assert "_worker" in names(helper)
    text = cli(["--jobs", str(jobs), "stacks", "helpers"], env, timeout=90).stdout.decode()
    assert "idle helper threads (1, folded):" in text


# A real torch.distributed gloo deadlock (the CPU torch of the engine tests' venv): tests/engines/test_stacks_gloo.py


ESCAPEE = """
import subprocess, sys

CHILD = "import threading\\nlock = threading.Lock()\\nlock.acquire()\\nprint('escaped', flush=True)\\nlock.acquire()\\n"

if __name__ == "__main__":
    # The child leaves the job's session and process group, as a daemonising server does.
    child = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
    child.wait()
"""


def test_a_process_that_left_the_group_is_dumped_like_stop_finds_it(tmp_path, state):
    jobs, env, run_id = start(tmp_path, "escapee", ESCAPEE)
    data = dump_until(jobs, env, "escapee", lambda d: len(d["processes"]) == 2 and any(
        p["wait"]["kind"] == "lock" for p in d["processes"]), "the escapee blocked on its lock")
    meta = latest_run("escapee").meta()
    [escaped] = [p for p in data["processes"] if p["wait"]["kind"] == "lock"]
    assert procs.read_stat(escaped["pid"]).pgrp != meta["pgid"]
    # `python -c` has no source to read: the kernel names the wait (a futex); the parent's wait comes second.
    assert data["verdict"] == ("1 of 2 processes blocked on a lock (a futex) at <string>:5 (<module>); "
                               "1 waiting for a subprocess (Popen.wait) at escapee.py:9 (<module>)")


def test_a_process_outside_the_run_is_never_touched(tmp_path, state):
    stranger = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])
    try:
        jobs, env, _ = start(tmp_path, "build", SUBPROCESS)
        data = dump_until(jobs, env, "build", lambda d: d["processes"], "the job's process")
        seen = {p["pid"] for p in data["processes"]} | {s["pid"] for s in data["skipped"]}
        assert stranger.pid not in seen and seen
    finally:
        stranger.kill()
        stranger.wait()


def test_a_job_that_is_not_running_is_one_line_and_exit_1(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": [PY, "-c", "pass"]}})
    env = cli_env(tmp_path / "state")
    out = cli(["--jobs", str(jobs), "stacks", "quick"], env)
    assert out.returncode == 1
    assert out.stderr.decode().strip() == "gpudeck: quick was never started by gpudeck: no process to dump"


# -- refusals: one line, never a hang -------------------------------------------------------

def fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])


def test_no_py_spy_is_one_line_how_to_get_it_and_exit_2(tmp_path, state, monkeypatch, capsys):
    from gpudeck.console import cli as cli_module
    child = sleeper()
    try:
        jobs, env, _ = start(tmp_path, "build", SUBPROCESS)
        wait_for(lambda: latest_run("build").job_id(), what="the job's pid")
        monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.delenv("PYTHONPATH", raising=False)
        monkeypatch.delenv(stacks.PY_SPY_ENV, raising=False)
        assert stacks.find_py_spy() is None
        assert cli_module.main(["--jobs", str(jobs), "stacks", "build"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"gpudeck: {stacks.INSTALL_HINT}"
        with pytest.raises(stacks.StacksUnavailable, match="pip install py-spy"):
            stacks.dump([procs.identity(child.pid)])
    finally:
        child.kill()
        child.wait()


def test_py_spy_is_found_by_name_next_to_python_in_a_pythonpath_bin_then_on_path(tmp_path, monkeypatch):
    def binary(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        return fake_py_spy(folder, "exit 0")
    on_path, site_bin, venv_bin = (binary(tmp_path / d) for d in ("path", "site/bin", "venv/bin"))
    named = binary(tmp_path / "named")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.delenv(stacks.PY_SPY_ENV, raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert stacks.find_py_spy() == on_path
    # `pip install --target /tmp/site py-spy` + PYTHONPATH=/tmp/site (the GPU machine's carried wheels).
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'shim'}:{tmp_path / 'site'}")
    assert stacks.find_py_spy() == site_bin
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python3"))
    assert stacks.find_py_spy() == venv_bin
    monkeypatch.setenv(stacks.PY_SPY_ENV, named)
    assert stacks.find_py_spy() == named
    # A named binary that is not there is not silently replaced by another one.
    monkeypatch.setenv(stacks.PY_SPY_ENV, str(tmp_path / "missing"))
    assert stacks.find_py_spy() is None and stacks.PY_SPY_ENV in stacks.INSTALL_HINT


@pytest.mark.parametrize("scope, caps, words", [
    (3, 1 << 19, "kernel.yama.ptrace_scope = 3"),
    (2, 0, "ptrace_scope = 2 (only CAP_SYS_PTRACE may trace) and this process lacks CAP_SYS_PTRACE"),
    (1, 0, "ptrace_scope = 1 (only a process's ancestors may trace it)"),
])
def test_ptrace_refusals_name_which_and_why(scope, caps, words):
    assert words in stacks.ptrace_refusal(scope=scope, caps=caps)


@pytest.mark.parametrize("scope, caps", [(None, 0), (0, 0), (1, 1 << 19), (2, 1 << 19)])
def test_ptrace_allowed(scope, caps):
    assert stacks.ptrace_refusal(scope=scope, caps=caps) is None


def test_ptrace_scope_and_caps_are_read_from_proc(tmp_path):
    (tmp_path / "scope").write_text("2\n")
    (tmp_path / "status").write_text("Name:\tx\nCapEff:\t0000000000080000\n")
    assert stacks.ptrace_scope(tmp_path / "scope") == 2
    assert stacks.effective_caps(tmp_path / "status") == 1 << 19
    assert stacks.ptrace_scope(tmp_path / "missing") is None


def test_another_users_process_is_refused_without_cap_sys_ptrace():
    import os
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    foreign = subprocess.Popen(["sleep", "600"], user=65534)
    try:
        wait_for(lambda: os.stat(f"/proc/{foreign.pid}").st_uid == 65534, what="the process to run as uid 65534")
        assert stacks.process_refusal(foreign.pid, caps=0) == (
            "belongs to uid 65534, not to you (uid 0), and this process lacks CAP_SYS_PTRACE")
        assert stacks.process_refusal(foreign.pid, caps=1 << 19) is None
        assert stacks.process_refusal(os.getpid(), caps=0) is None
    finally:
        foreign.kill()
        foreign.wait()


def test_a_wedged_py_spy_is_bounded_by_the_call_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "CALL_TIMEOUT_S", 1.0)
    child = sleeper()
    try:
        t0 = time.monotonic()
        result = stacks.dump([procs.identity(child.pid)], py_spy=fake_py_spy(tmp_path, "exec sleep 30"))
        assert time.monotonic() - t0 < 8
        assert [s.reason for s in result.skipped] == ["py-spy did not answer within 1s"]
        assert result.verdict.startswith("no Python process could be dumped (1 skipped")
    finally:
        child.kill()
        child.wait()


def test_the_whole_dump_has_a_deadline_however_many_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "CALL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(stacks, "PARALLEL", 1)
    children = [sleeper() for _ in range(4)]
    try:
        for child in children:
            wait_for(lambda: stacks.is_python(child.pid), what="the interpreters to start")
        t0 = time.monotonic()
        result = stacks.dump([procs.identity(c.pid) for c in children], py_spy=fake_py_spy(tmp_path, "exec sleep 30"),
                             deadline_s=1.5)
        assert time.monotonic() - t0 < 6
        reasons = [s.reason for s in result.skipped]
        assert len(reasons) == 4 and "not dumped: the whole dump's deadline had passed" in reasons
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_process_that_exits_mid_dump_is_skipped_and_said(tmp_path):
    child = sleeper()
    try:
        ident = procs.identity(child.pid)
        wait_for(lambda: stacks.is_python(child.pid), what="the interpreter to start")
        # This py-spy ends the process it was pointed at, then fails as py-spy does for a vanished pid.
        spy = fake_py_spy(tmp_path, 'kill -9 "$3"; sleep 0.2; echo "Error: Failed to open process" >&2; exit 1')
        result = stacks.dump([ident], py_spy=spy)
        assert [(s.pid, s.reason) for s in result.skipped] == [(child.pid, "exited during the dump")]
    finally:
        child.kill()
        child.wait()


def test_permission_denied_from_py_spy_reads_as_ptrace_not_permitted(tmp_path):
    child = sleeper()
    try:
        wait_for(lambda: stacks.is_python(child.pid), what="the interpreter to start")
        spy = fake_py_spy(tmp_path, 'echo "Permission Denied: Try running again with elevated permissions" >&2; exit 1')
        # Every process refused: the whole dump is refused in one line (exit 2 in the CLI), saying why.
        with pytest.raises(stacks.StacksUnavailable) as refused:
            stacks.dump([procs.identity(child.pid)], py_spy=spy)
        assert str(refused.value).startswith(f"ptrace not permitted: Permission Denied: Try running again "
                                             f"with elevated permissions (pid {child.pid})")
    finally:
        child.kill()
        child.wait()


# -- the runner dumps by itself when a stall is raised ----------------------------------------

QUIET_TWICE = """
import multiprocessing as mp, os, sys, time

def party(barrier):
    barrier.wait()

if __name__ == "__main__":
    flag = sys.argv[1]
    barrier = mp.Barrier(3)
    children = [mp.Process(target=party, args=(barrier,)) for _ in range(2)]
    for child in children:
        child.start()
    print("quiet now", flush=True)
    while not os.path.exists(flag):
        time.sleep(1.0)       # a dump that lands between sleeps reads "running Python": keep that window small
    print("woke up once", flush=True)      # the log grows: the stall clears, then comes back
    while True:
        time.sleep(0.2)
"""


def stall_job(tmp_path: Path, dump: bool = True) -> tuple[Path, dict, Path, Path]:
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_TWICE)
    flag, hook = tmp_path / "wake", tmp_path / "hook.env"
    keys = {"cmd": [PY, str(script), str(flag)], "stall_after": "2s",
            "on_alert": f"env | grep ^GPUDECK_ALERT_ | sort >> {hook}.tmp; mv {hook}.tmp {hook}"}
    jobs = write_jobs(tmp_path / "jobs.toml", {"quiet": keys})
    if not dump:
        jobs.write_text(jobs.read_text() + "dump_on_stall = false\n")
    env = cli_env(tmp_path / "state")
    assert cli(["--jobs", str(jobs), "start", "quiet"], env).returncode == 0
    return jobs, env, flag, hook


def events(run, name: str) -> list[dict]:
    return [e for e in run.events() if e.get("event") == name]


def test_a_stall_takes_one_dump_by_itself_and_every_face_carries_its_verdict(tmp_path, state):
    jobs, env, flag, hook = stall_job(tmp_path)
    run = latest_run("quiet")
    [dumped] = wait_for(lambda: events(run, "StacksDumped"), timeout=90, what="the runner's dump on the stall")
    verdict = dumped["verdict"]
    assert verdict.startswith("2 of 3 processes waiting on a multiprocessing.Barrier at quiet.py:5 (party)")
    assert "1 sleeping (time.sleep) at quiet.py:" in verdict
    # The files: a grouped JSON (frames once, in its groups) and the text a person reads.
    stored = json.loads((run.path / dumped["path"]).read_text())
    assert stored["verdict"] == verdict and stored["run_id"] == run.run_id
    assert all("frames" not in t for p in stored["processes"] for t in p["threads"])
    assert (run.path / dumped["path"]).with_suffix(".txt").read_text().startswith(f"verdict: {verdict}\n")
    # on_alert went out once, after the dump, with the verdict.
    hook_env = dict(line.split("=", 1) for line in wait_for(lambda: hook.exists() and hook.read_text(),
                                                              what="on_alert").splitlines())
    assert hook_env["GPUDECK_ALERT_STACKS"] == verdict
    assert hook_env["GPUDECK_ALERT_MESSAGE"].endswith(f" — stacks: {verdict}")
    assert hook_env["GPUDECK_ALERT_STACKS_FILE"] == str(run.path / dumped["path"])
    assert dumped["on_alert_pid"] > 0
    # `gpudeck jobs` (from health.json) carries it too.
    def listed():
        entry = [j for j in json.loads(cli(["--jobs", str(jobs), "jobs", "--json"], env).stdout)["jobs"]
                 if j["name"] == "quiet"][0]
        return [a for a in entry["alerts"] if a["code"] == "stalled" and "stacks" in a]
    [alert] = wait_for(listed, what="the verdict in gpudeck jobs")
    assert alert["message"].endswith(f" — stacks: {verdict}") and alert["stacks"]["path"] == dumped["path"]
    # py-spy ran in its own session, recorded as not the job's: its CPU did not clear the stall.
    assert not events(run, "AlertCleared") and len(events(run, "AlertRaised")) == 1
    # The post-mortem puts the dump on the timeline and its verdict on the stall, in every format.
    pm = json.loads(cli(["postmortem", "quiet", "--format", "json"], env).stdout)
    [entry] = pm["stacks"]
    assert entry["verdict"] == verdict and entry["path"] == dumped["path"] and entry["at_s"] >= 0
    from gpudeck.jobs.hosts.replies import check_reply
    assert check_reply("postmortem", {"report": pm})          # as a remote box would send it: it fits the shape
    assert [s.get("stacks") for s in pm["stalls"]] == [verdict]
    md = cli(["postmortem", "quiet", "--format", "md"], env).stdout.decode()
    assert "## Stack dumps" in md and "on **stalled**: 2 of 3 processes waiting on a multiprocessing.Barrier" in md
    page = cli(["postmortem", "quiet", "--format", "html"], env).stdout.decode()
    assert '<ul id="stack-dumps">' in page and "2 of 3 processes waiting on a multiprocessing.Barrier" in page


def test_a_stall_that_clears_and_comes_back_dumps_again(tmp_path, state):
    jobs, env, flag, hook = stall_job(tmp_path)
    run = latest_run("quiet")
    wait_for(lambda: events(run, "StacksDumped"), timeout=90, what="the first dump")
    flag.touch()
    wait_for(lambda: events(run, "AlertCleared"), timeout=30, what="the stall to clear")
    second = wait_for(lambda: len(events(run, "StacksDumped")) == 2 and events(run, "StacksDumped"),
                      timeout=90, what="the second dump")
    assert second[0]["since"] != second[1]["since"]
    assert len(list((run.path / "stacks").glob("*.json"))) == 2
    assert second[1]["verdict"].startswith("2 of 3 processes waiting on a multiprocessing.Barrier")


def test_dump_on_stall_false_turns_it_off(tmp_path, state):
    jobs, env, flag, hook = stall_job(tmp_path, dump=False)
    run = latest_run("quiet")
    [raised] = wait_for(lambda: events(run, "AlertRaised"), timeout=90, what="the stall")
    hook_env = dict(line.split("=", 1) for line in wait_for(lambda: hook.exists() and hook.read_text(),
                                                              what="on_alert").splitlines())
    assert "GPUDECK_ALERT_STACKS" not in hook_env and raised["on_alert_pid"] > 0
    assert not (run.path / "stacks").exists() and not events(run, "StacksDumped")


# -- key D in the jobs view ------------------------------------------------------------------

EVIL_NAMES = """
import threading, time

def stuck(lock):
    lock.acquire()

if __name__ == "__main__":
    lock = threading.Lock()
    lock.acquire()
    # A thread name is the job's text: markup and an escape sequence must reach the screen inert.
    worker = threading.Thread(target=stuck, args=(lock,), name="[bold red]evil[/] \\x1b]52;c;U0VDUkVU\\x07")
    worker.start()
    print("stuck", flush=True)
    worker.join()
"""


def test_key_d_shows_the_grouped_dump_with_its_verdict_and_inert_text(tmp_path, state):
    from runsupport import pilot_test, pilot_wait_for
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.screens.stacks import StacksScreen
    from gpudeck.jobs.telemetry.sampler import make_sampler
    from textual.widgets import Static

    jobs, env, _ = start(tmp_path, "evil", EVIL_NAMES)
    dump_until(jobs, env, "evil", lambda d: any(p["wait"]["kind"] == "lock" for p in d["processes"]), "the lock wait")

    @pilot_test
    async def drive() -> None:
        app = make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3, jobs_file=str(jobs))
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.press("2")
            screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs")
            await pilot_wait_for(pilot, lambda: screen.refreshes >= 1 and screen.selected_job is not None, "rows")
            await pilot.press("D")
            modal = await pilot_wait_for(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen, "modal")
            await pilot_wait_for(pilot, lambda: modal.done, "the dump", timeout=60)
            assert modal.verdict == "1 of 1 process blocked on a lock (Lock.acquire) at evil.py:5 (stuck)"
            assert "[bold red]evil[/]" in modal.text and "\x1b" not in modal.text and "U0VDUkVU" not in modal.text
            body = modal.query_one("#stacks-body", Static)
            assert "[bold red]evil[/]" in str(body.render())        # shown as written, not parsed as markup
            await pilot.press("escape")
            await pilot_wait_for(pilot, lambda: app.screen is screen, "back to the jobs view")
    drive()


# -- the verdict rules on py-spy's own JSON shape (for what this machine cannot run: torch, CUDA, HTTP) ----

def frame(name: str, path: str, line: int, native: bool = False) -> dict:
    return {"name": name, "filename": path, "short_filename": path.rsplit("/", 1)[-1], "line": line,
            "module": path if native else None}


def thread(tid: int, frames: list[dict], name: str = "MainThread", active: bool = False) -> dict:
    return {"thread_id": tid, "os_thread_id": tid, "thread_name": name, "active": active, "frames": frames}


SITE = "/venv/lib/python3.11/site-packages"
LIB = "/usr/lib/python3.11"


def rank(pid: int, extra: list[dict] = ()) -> stacks.ProcessStacks:
    main = thread(pid, [frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2501),
                        frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                        frame("all_reduce", f"{SITE}/vllm/distributed/parallel_state.py", 412),
                        frame("main", "/work/serve.py", 9)])
    raw = [main, *extra]
    return stacks.build_process(procs.ProcessId(pid, 1), "python serve.py", raw, raw)


def verdict_of(processes: list) -> tuple[str, list]:
    result = stacks.StackDump(taken_at=0.0, native=False, processes=processes)
    result.groups = stacks.group(processes)
    return stacks.verdict(result), result.groups


def test_eight_ranks_in_one_all_reduce_fold_into_one_group_and_one_verdict():
    tqdm = thread(7, [frame("Condition.wait", f"{LIB}/threading.py", 331), frame("Event.wait", f"{LIB}/threading.py", 629),
                      frame("TMonitor.run", f"{SITE}/tqdm/_monitor.py", 60)], name="Thread-1")
    text, groups = verdict_of([rank(100 + i, [dict(tqdm, thread_id=1000 + i, os_thread_id=1000 + i)])
                               for i in range(8)])
    assert text == ("8 of 8 processes in a collective (torch.distributed.all_reduce) at serve.py:9 (main)")
    assert [(len(g.pids), g.threads, g.helper) for g in groups] == [(8, 8, False), (8, 8, True)]
    assert groups[0].chain(3) == ("all_reduce (distributed_c10d.py:2501) ← wrapper (c10d_logger.py:83) ← "
                                  "all_reduce (parallel_state.py:412) ← …")


def test_a_native_nccl_frame_and_a_cuda_synchronize_are_named():
    nccl = stacks.build_process(procs.ProcessId(5, 1), "x", [thread(5, [
        frame("ncclGroupEnd", "/lib/libnccl.so.2", 0, native=True), frame("step", "/work/train.py", 40)])], None)
    assert (nccl.wait.kind, nccl.wait.label, nccl.wait.source) == ("collective", "NCCL", "native")
    sync = stacks.build_process(procs.ProcessId(6, 1), "x", [thread(6, [
        frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 985), frame("step", "/work/train.py", 41)])], None)
    assert sync.wait.phrase() == "in a CUDA synchronize (torch.cuda.synchronize)"
    assert (sync.wait.caller.file, sync.wait.caller.line) == ("train.py", 41)


def test_a_synchronize_the_driver_spin_waits_is_a_cuda_synchronize_not_spinning_in_python():
    # cudaDeviceScheduleAuto spins the CPU in the driver: the thread is active in both samples, at the same frame.
    raw = [thread(6, [frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 1083),
                      frame("step", "/work/train.py", 41)], active=True)]
    sync = stacks.build_process(procs.ProcessId(6, 1), "x", raw, raw)
    assert sync.threads[0].spinning
    assert sync.wait.phrase() == "in a CUDA synchronize (torch.cuda.synchronize)"
    # Innermost in the job's own code (a loop in a callback torch called), it is spinning in Python.
    loop = [thread(7, [frame("step", "/work/train.py", 41),
                       frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 1083)], active=True)]
    assert stacks.build_process(procs.ProcessId(7, 1), "x", loop, loop).wait.kind == "spinning"


H200 = Path(__file__).resolve().parent / "fixtures" / "py-spy-h200"


def test_real_py_spy_samples_of_a_spin_waited_cuda_synchronize_on_an_h200():
    first, second, native = (json.loads((H200 / f"cuda-sync-{n}.json").read_text())
                             for n in ("first", "second", "native"))
    proc = stacks.build_process(procs.ProcessId(645, 1), "python3 /tmp/s.py", first, second)
    [main] = proc.threads
    assert main.active and main.spinning            # 110% CPU in the driver: active in both samples
    assert proc.wait.phrase() == "in a CUDA synchronize (torch.cuda.synchronize)"
    assert (proc.wait.caller.file, proc.wait.caller.line, proc.wait.caller.name) == ("s.py", 10, "wait_for_the_gpu")
    text, _ = verdict_of([proc])
    assert text == "1 of 1 process in a CUDA synchronize (torch.cuda.synchronize) at s.py:10 (wait_for_the_gpu)"
    # With C frames: the driver's own synchronize is there under torch's; the verdict is the same.
    with_c = stacks.build_process(procs.ProcessId(645, 1), "python3 /tmp/s.py", native, native)
    assert verdict_of([with_c])[0] == text
    assert {"cudaDeviceSynchronize", "cuCtxSynchronize_v2"} <= {f.name for f in with_c.threads[0].frames if f.native}


def test_an_http_read_a_queue_get_and_a_popen_wait():
    http = stacks.build_process(procs.ProcessId(7, 1), "x", [thread(7, [
        frame("SocketIO.readinto", f"{LIB}/socket.py", 706),
        frame("HTTPResponse._read_status", f"{LIB}/http/client.py", 279),
        frame("HTTPResponse.begin", f"{LIB}/http/client.py", 318), frame("fetch", "/work/get.py", 3)])], None)
    assert http.wait.kind == "socket" and http.wait.label == "http.client HTTPResponse.begin"
    queue_get = stacks.build_process(procs.ProcessId(8, 1), "x", [thread(8, [
        frame("Condition.wait", f"{LIB}/threading.py", 327), frame("Queue.get", f"{LIB}/queue.py", 171),
        frame("consume", "/work/q.py", 7)])], None)
    assert queue_get.wait.phrase() == "waiting on a queue (queue.Queue.get)"
    popen = stacks.build_process(procs.ProcessId(9, 1), "x", [thread(9, [
        frame("Popen._try_wait", f"{LIB}/subprocess.py", 1959), frame("Popen._wait", f"{LIB}/subprocess.py", 2017),
        frame("Popen.wait", f"{LIB}/subprocess.py", 1264), frame("build", "/work/b.py", 5)])], None)
    assert popen.wait.phrase() == "waiting for a subprocess (Popen.wait)"


def test_a_pool_worker_blocked_on_a_socket_is_not_an_idle_helper():
    worker = thread(11, [frame("SocketIO.readinto", f"{LIB}/socket.py", 706),
                         frame("_worker", f"{LIB}/concurrent/futures/thread.py", 83)], name="ThreadPoolExecutor-0_0")
    idle = thread(12, [frame("_worker", f"{LIB}/concurrent/futures/thread.py", 81)], name="ThreadPoolExecutor-0_1")
    proc = stacks.build_process(procs.ProcessId(10, 1), "x", [thread(10, [frame("main", "/work/m.py", 3)]), worker, idle],
                                None)
    helpers = {t.tid: t.helper for t in proc.threads}
    assert helpers == {10: False, 11: False, 12: True}
    assert proc.wait.kind == "socket"


def alone(frames: list[dict], kernel: str | None = None, pid: int = 20) -> str:
    """The verdict of one process whose main thread has `frames` (and, as /proc would say, `kernel`)."""
    raw = [thread(pid, frames)]
    return verdict_of([stacks.build_process(procs.ProcessId(pid, 1), "x", raw, raw, {pid: kernel})])[0]


TORCH_LOAD = [frame("_load.<locals>.load_tensor", f"{SITE}/torch/serialization.py", 1813),
              frame("_load.<locals>.persistent_load", f"{SITE}/torch/serialization.py", 1848),
              frame("_load", f"{SITE}/torch/serialization.py", 1857),
              frame("load", f"{SITE}/torch/serialization.py", 1097),
              frame("restore", "/work/ckpt.py", 12)]


def test_a_torch_load_and_a_safetensors_load_file_are_disk_io_named_by_the_call():
    # torch's nested readers are one torch.load, named as the job called it (not a bare "load").
    assert alone(TORCH_LOAD) == "1 of 1 process in disk I/O (torch.load) at ckpt.py:12 (restore)"
    assert alone([frame("load_file", f"{SITE}/safetensors/torch.py", 315),
                  frame("load_weights", "/work/serve.py", 30)]) == (
        "1 of 1 process in disk I/O (safetensors load_file) at serve.py:30 (load_weights)")
    # safetensors.torch.load(bytes) parses memory already read: not disk I/O.
    assert "disk" not in alone([frame("load", f"{SITE}/safetensors/torch.py", 338), frame("f", "/work/m.py", 3)])


def test_an_os_read_of_a_file_an_fsync_and_a_file_read_are_disk_io(tmp_path):
    # A C call leaves no Python frame: the job's own source line, then the kernel's fd, say what it waits on.
    src = tmp_path / "save.py"
    src.write_text("import os\n"
                   "data = os.read(fd, 1 << 20)\n"
                   "os.fsync(fh.fileno())\n"
                   "blob = fh.read()\n")
    at = str(src)
    assert alone([frame("<module>", at, 2)], "read on file") == (
        "1 of 1 process in disk I/O (os.read) at save.py:2 (<module>)")
    # The same line on a pipe or a socket is that; with no word from the kernel, a pipe as before.
    assert alone([frame("<module>", at, 2)], "read on pipe") == (
        "1 of 1 process blocked reading a pipe (os.read) at save.py:2 (<module>)")
    assert alone([frame("<module>", at, 2)], "read on socket") == (
        "1 of 1 process blocked on a socket (os.read) at save.py:2 (<module>)")
    assert alone([frame("<module>", at, 2)]) == "1 of 1 process blocked reading a pipe (os.read) at save.py:2 (<module>)"
    # fsync is named from its line, whatever the kernel shows (often just state D).
    assert alone([frame("<module>", at, 3)]) == "1 of 1 process in disk I/O (os.fsync) at save.py:3 (<module>)"
    assert alone([frame("<module>", at, 3)], "uninterruptible (D)") == (
        "1 of 1 process in disk I/O (os.fsync) at save.py:3 (<module>)")
    # A file object's read is C all the way down: the kernel's "read on file" names it.
    assert alone([frame("<module>", at, 4)], "read on file") == (
        "1 of 1 process in disk I/O (read of a file) at save.py:4 (<module>)")


def barrier_rank(pid: int) -> stacks.ProcessStacks:
    raw = [thread(pid, [frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4159),
                        frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                        frame("main", "/work/train.py", 20)])]
    return stacks.build_process(procs.ProcessId(pid, 1), "python train.py", raw, raw)


def test_ranks_in_torch_distributed_barrier_are_a_collective_and_the_late_rank_is_named():
    text, groups = verdict_of([barrier_rank(300 + i) for i in range(4)])
    assert text == "4 of 4 processes in a collective (torch.distributed.barrier) at train.py:20 (main)"
    assert [(len(g.pids), g.helper) for g in groups] == [(4, False)]
    # Three ranks at the barrier, the fourth still reading its checkpoint: both said, the larger share first.
    late = stacks.build_process(procs.ProcessId(303, 1), "python train.py", [thread(303, TORCH_LOAD)], None)
    text, _ = verdict_of([barrier_rank(300 + i) for i in range(3)] + [late])
    assert text == ("3 of 4 processes in a collective (torch.distributed.barrier) at train.py:20 (main); "
                    "1 in disk I/O (torch.load) at ckpt.py:12 (restore)")
    # With C frames (gloo's wait under it), torch's Python frame still names the call.
    raw = [thread(310, [frame("gloo::transport::tcp::UnboundBuffer::waitRecv", "/lib/libgloo.so", 0, native=True),
                        frame("c10d::ProcessGroupGloo::AsyncWork::wait", "/lib/libtorch_cpu.so", 0, native=True),
                        frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4159),
                        frame("main", "/work/train.py", 20)])]
    gloo = stacks.build_process(procs.ProcessId(310, 1), "x", raw, raw)
    assert gloo.wait.phrase() == "in a collective (torch.distributed.barrier)" and gloo.wait.source == "python"


def test_a_notice_puts_the_dumps_verdict_before_the_rules_long_words():
    from gpudeck.jobs.view import AlertView, JobView
    verdict = "2 of 3 processes waiting on a multiprocessing.Barrier at quiet.py:5 (party)"
    words = "no sign of life while running for 2s: process alive, CPU ~0%, no disk reads, log silent"
    alert = AlertView.from_payload({"code": "stalled", "since": 100.0, "message": f"{words} — stacks: {verdict}",
                                    "stacks": {"verdict": verdict, "path": "stacks/x.json"}})
    assert alert.stacks == verdict and alert.notice_text() == f"stacks: {verdict} — {words}"
    job = JobView.from_payload({"name": "quiet", "state": "running", "alerts": [alert_payload(alert)]})
    assert job.notice_lines(105.0) == [f"⚠ quiet: stalled for 5s — stacks: {verdict} — {words}"]
    # Before the dump (or with none), the rule's words as they are.
    bare = AlertView.from_payload({"code": "stalled", "message": words})
    assert bare.stacks == "" and bare.notice_text() == words


def alert_payload(alert) -> dict:
    return {"code": alert.code, "since": alert.since, "message": alert.message,
            "stacks": {"verdict": alert.stacks}}


def test_the_jobs_view_banner_carries_the_stall_dumps_verdict(tmp_path, state):
    from runsupport import pilot_test, pilot_wait_for
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.jobs.telemetry.sampler import make_sampler
    from textual.widgets import Static

    jobs, env, flag, hook = stall_job(tmp_path)
    run = latest_run("quiet")
    [dumped] = wait_for(lambda: events(run, "StacksDumped"), timeout=90, what="the runner's dump on the stall")

    @pilot_test
    async def drive() -> None:
        app = make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3, jobs_file=str(jobs))
        async with app.run_test(size=(200, 40)) as pilot:
            await pilot.press("2")
            screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs")
            banner = screen.query_one("#jobs-banner", Static)
            await pilot_wait_for(pilot, lambda: "— stacks: 2 of 3 processes waiting on a multiprocessing.Barrier"
                                 in str(banner.render()), "the verdict in the banner", detail=lambda: str(banner.render()))
    drive()
