"""Supervisor on real processes: fast start, stop that leaves nothing, port/foreign checks, re-attach, PID reuse."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gpudeck.jobs import procs
from gpudeck.jobs.runs import create_run, latest_run, list_runs
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import JobAlreadyRunning, Supervisor, run_processes

from runsupport import PY, free_port, pid_alive, tagged_pids, wait_for, write_jobs

STUBBORN = (
    # Ignores SIGTERM itself; a setsid grandchild leaves the group; a double-forked
    # one is orphaned (reparented to the runner) and also ignores SIGTERM.
    "trap '' TERM; "
    "setsid bash -c 'trap \"\" TERM; sleep 300; true' & "
    "( setsid bash -c 'trap \"\" TERM; sleep 301; true' & ) ; "
    "while true; do sleep 0.2; done"
)


def listener_code(port: int) -> str:
    return ("import socket, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {port})); s.listen()\n"
            "print('listening', flush=True)\n"
            "time.sleep(300)\n")


def make(tmp_path: Path, jobs: dict) -> Supervisor:
    return Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", jobs)))


def test_start_returns_well_under_a_second_with_the_job_running(tmp_path, state):
    sup = make(tmp_path, {"svc": {"cmd": "sleep 300"}})
    t0 = time.monotonic()
    run_id = sup.start("svc")
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, f"start took {elapsed:.3f}s"
    assert run_id == latest_run("svc").run_id
    st = wait_for(lambda: (s := sup.job_state("svc")).state == "running" and s, what="running state")
    assert st.pid and procs.is_alive(st.pid, latest_run("svc").job_id().start)
    with pytest.raises(JobAlreadyRunning):
        sup.start("svc")


def test_stop_of_a_term_ignoring_job_with_setsid_grandchildren_leaves_no_process(tmp_path, state):
    sup = make(tmp_path, {"stubborn": {"cmd": STUBBORN, "stop_timeout": 1}})
    run_id = sup.start("stubborn")
    run = latest_run("stubborn")
    # Both escapees are up: three sleeps/bashes beyond the main shell.
    wait_for(lambda: sum(1 for st in run_processes(run) if st.comm == "sleep") >= 3, what="the whole tree")
    # The confirmation names the tree stop will find. The job's shell forks a `sleep` every 0.2 s, so
    # the two listings are compared taken back to back, again until one pair agrees.
    before = wait_for(lambda: (ids := [st.identity for st in run_processes(run)])
                      and {p.pid for p in sup.processes("stubborn")} == {i.pid for i in ids} and ids,
                      what="the confirmation's processes equal to the run's tree")
    sessions = {procs.read_stat(p.pid).session for p in before if procs.read_stat(p.pid)}
    assert len(sessions) >= 3, "the test job must really have processes outside its session"
    report = sup.stop("stubborn")
    assert report.escalated and report.signal == "SIGTERM"
    assert report.clean, report.lines()
    assert report.remaining == []
    assert not any(procs.is_alive(p.pid, p.start) for p in before)
    assert tagged_pids(run_id) == []
    record = run.exit_record()
    assert record["stopped_by_request"] is True and record["signal"] == "SIGKILL"
    assert sup.job_state("stubborn").state == "stopped"
    events = [e["event"] for e in run.events()]
    assert events.index("StopRequested") < events.index("StopEscalated") < events.index("StopVerified")


def test_graceful_stop_with_the_jobs_own_stop_signal(tmp_path, state):
    sup = make(tmp_path, {"polite": {
        "cmd": "trap 'echo got-int; exit 0' INT; echo ready; while true; do sleep 0.1; done",
        "stop_signal": "INT", "stop_timeout": 20}})
    sup.start("polite")
    run = latest_run("polite")
    wait_for(lambda: b"ready" in run.log_path.read_bytes(), what="ready")
    report = sup.stop("polite")
    assert report.signal == "SIGINT" and not report.escalated and report.clean
    assert report.duration_s < 10
    assert b"got-int" in run.log_path.read_bytes()
    record = run.exit_record()
    assert record["exit_code"] == 0 and record["stopped_by_request"] is True
    assert sup.job_state("polite").state == "stopped"


def test_port_is_verified_free_and_a_foreign_holder_is_named_not_touched(tmp_path, state):
    port = free_port()
    script = tmp_path / "listen.py"
    script.write_text(listener_code(port))
    sup = make(tmp_path, {"server": {"cmd": [PY, str(script)], "port": port, "stop_timeout": 5}})
    sup.start("server")
    wait_for(lambda: sup.job_state("server").port_open, what="the job's port to listen")
    report = sup.stop("server")
    assert report.port_free is True and report.clean
    assert sup.job_state("server").port_open is False
    # Now something gpudeck did not start takes the port.
    foreign = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE)
    try:
        assert foreign.stdout.readline().strip() == b"listening"
        again = sup.stop("server")
        assert again.port_free is False and not again.clean
        assert [h.pid for h in again.port_holders] == [foreign.pid]
        assert again.port_holders[0].owned is False
        assert "left alone" in " ".join(again.lines())
        assert foreign.poll() is None, "stop signalled a process it did not start"
    finally:
        foreign.kill()
        foreign.wait()


def test_a_stale_run_record_never_signals_the_process_that_reused_its_pid(tmp_path, state):
    sup = make(tmp_path, {"ghost": {"cmd": "sleep 300", "stop_timeout": 1}})
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        real = procs.identity(stranger.pid)
        run = create_run("ghost")
        # What disk says after a reboot or PID wrap: the same PIDs, other start times.
        run.update_meta(job="ghost", created_at=time.time() - 3600, command="sleep 300",
                        runner={"pid": stranger.pid, "start": real.start - 5},
                        job_process={"pid": stranger.pid, "start": real.start + 5}, pgid=stranger.pid)
        assert sup.job_state("ghost").state == "lost"
        report = sup.stop("ghost")
        assert report.signalled == [] and report.killed == []
        assert stranger.poll() is None and pid_alive(stranger.pid)
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_of_a_job_never_started_signals_nothing(tmp_path, state):
    sup = make(tmp_path, {"never": {"cmd": "sleep 300"}})
    lookalike = subprocess.Popen(["bash", "-c", "sleep 300"])
    try:
        report = sup.stop("never")
        assert report.was_running is False and report.signalled == []
        assert "never started" in report.message
        assert lookalike.poll() is None
    finally:
        lookalike.kill()
        lookalike.wait()


def test_a_new_supervisor_reattaches_from_disk(tmp_path, state):
    jobs = {"a": {"cmd": "while true; do echo a; sleep 0.2; done"}, "b": {"cmd": "exit 4"}, "c": {"cmd": "true"}}
    first = make(tmp_path, jobs)
    run_a = first.start("a")
    first.start("b")
    first.wait("b", timeout=30)
    del first
    second = Supervisor(load_jobs(tmp_path / "jobs.toml"))
    states = {s.name: s for s in second.job_states()}
    assert [s.name for s in second.job_states()] == ["a", "b", "c"]
    assert states["a"].state == "running" and states["a"].run_id == run_a and states["a"].runner_alive
    assert states["b"].state == "exited" and states["b"].exit_code == 4
    assert states["c"].state == "idle" and states["c"].run_id is None
    assert second.stop("a").clean


def test_restart_stops_the_old_run_and_log_keep_prunes_old_runs(tmp_path, state):
    sup = make(tmp_path, {"svc": {"cmd": "sleep 300", "stop_timeout": 2, "log_keep": 2}})
    first = sup.start("svc")
    report, second = sup.restart("svc")
    assert report.clean and second != first
    assert [r.run_id for r in list_runs("svc")][-2:] == [first, second]
    assert sup.job_state("svc").state == "running"
    _, third = sup.restart("svc")
    runs = [r.run_id for r in list_runs("svc")]
    assert runs == [second, third], "log_keep=2 keeps the two newest runs"
    assert sup.stop("svc").clean
