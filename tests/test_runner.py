"""The runner on real jobs: byte-exact output, arrival times, exit code or signal, samples, leftovers, its own death."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path


from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import PY, cli_env, tagged_pids, wait_for, write_jobs


def supervisor_for(tmp_path: Path, jobs: dict) -> Supervisor:
    return Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", jobs)))


def test_output_is_byte_for_byte_with_arrival_times(tmp_path, state):
    script = tmp_path / "emit.py"
    script.write_text(
        "import os, sys, time\n"
        "out = sys.stdout.buffer\n"
        "out.write(b'first\\n'); out.flush()\n"
        "sys.stderr.buffer.write(b'to stderr\\n'); sys.stderr.flush()\n"
        "out.write(b'10%\\r50%\\r100%\\n\\xff\\xfe raw \\x1b[31mred\\x1b[0m\\r\\n'); out.flush()\n"
        # The late line only once the runner has recorded the rest's arrival (its once-a-second tick, to
        # the second) and that second is over: a fixed sleep raced a runner slow to start on a loaded
        # machine (both in one tick).
        "times = os.path.join(os.environ['GPUDECK_RUN_DIR'], 'times')\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline and not (os.path.exists(times) and os.path.getsize(times)):\n"
        "    time.sleep(0.05)\n"
        "recorded = int(open(times).read().split()[-1])\n"
        "while time.time() < recorded + 1.05:\n"
        "    time.sleep(0.05)\n"
        "out.write(b'late line, no newline')\n")
    sup = supervisor_for(tmp_path, {"emit": {"cmd": [PY, str(script)]}})
    run_id = sup.start("emit")
    record = sup.wait("emit", timeout=30)
    assert record["exit_code"] == 0 and record["signal"] is None
    run = latest_run("emit")
    assert run.run_id == run_id
    expected = (b"first\nto stderr\n10%\r50%\r100%\n\xff\xfe raw \x1b[31mred\x1b[0m\r\n"
                b"late line, no newline")
    assert run.log_path.read_bytes() == expected
    index = run.arrival_index()
    assert index.offsets == tuple(sorted(index.offsets))
    assert index.offsets[-1] == len(expected)
    first_at = index.time_of(0)
    late_at = index.time_of(expected.index(b"late"))
    assert first_at is not None and late_at is not None
    assert late_at - first_at >= 1, "the late line must be recorded as arriving later"
    meta = run.meta()
    assert meta["job"] == "emit" and meta["command"] == [PY, str(script)]
    assert meta["job_process"]["pid"] == meta["pgid"]
    assert meta["runner"]["pid"] != meta["job_process"]["pid"]
    assert meta["host"]
    events = [e["event"] for e in run.events()]
    assert events[0] == "JobStarted" and "JobExited" in events


def test_exit_code_and_killing_signal_are_recorded(tmp_path, state):
    sup = supervisor_for(tmp_path, {
        "fails": {"cmd": "echo about to fail; exit 3"},
        "killed": {"cmd": "echo bye; kill -9 $$$$"},  # $$ is jobs.toml's escape for $,
    })
    sup.start("fails")
    sup.start("killed")
    fails = sup.wait("fails", timeout=30)
    killed = sup.wait("killed", timeout=30)
    assert (fails["exit_code"], fails["signal"], fails["stopped_by_request"]) == (3, None, False)
    assert (killed["exit_code"], killed["signal"], killed["stopped_by_request"]) == (137, "SIGKILL", False)
    states = {s.name: s for s in sup.job_states()}
    assert states["fails"].state == "exited" and states["fails"].exit_code == 3
    assert states["killed"].state == "exited" and states["killed"].signal == "SIGKILL"


def test_env_cwd_gpus_and_run_tag_reach_the_job(tmp_path, state):
    work = tmp_path / "work"
    work.mkdir()
    sup = supervisor_for(tmp_path, {"envy": {
        "cmd": 'echo "$GREETING|$CUDA_VISIBLE_DEVICES|$GPUDECK_JOB|$GPUDECK_RUN_ID|$(pwd)"; '
               'test -t 0 && echo stdin-is-a-tty || echo stdin-closed',
        "cwd": str(work), "env": {"GREETING": "hi"}, "gpus": [2, 3]}})
    run_id = sup.start("envy")
    assert sup.wait("envy", timeout=30)["exit_code"] == 0
    out = latest_run("envy").log_path.read_text().splitlines()
    assert out[0] == f"hi|2,3|envy|{run_id}|{work}"
    assert out[1] == "stdin-closed"


def test_samples_record_the_tree_resources(tmp_path, state):
    sup = supervisor_for(tmp_path, {"busy": {
        "cmd": [PY, "-c", "import time\nx = bytearray(30 * 2**20)\nt = time.time()\n"
                          "while time.time() - t < 2.5: pass\n"]}})
    sup.start("busy")
    assert sup.wait("busy", timeout=30)["exit_code"] == 0
    samples = latest_run("busy").samples()
    live = [s for s in samples if s["procs"] >= 1]
    assert len(live) >= 2
    assert max(s["rss"] for s in live) > 30 * 2**20
    assert max(s["cpu_s"] for s in live) > 0.5
    assert all({"t", "procs", "pids", "cpu_s", "rss", "read_bytes", "write_bytes", "log_bytes"} <= set(s)
               for s in samples)


def test_leftovers_of_an_exited_job_are_terminated(tmp_path, state):
    # The main process exits at once; its setsid'd, TERM-ignoring grandchild is
    # what a crashed engine leaves holding the GPUs. The runner must end it.
    sup = supervisor_for(tmp_path, {"crashy": {
        "cmd": "setsid bash -c 'trap \"\" TERM; sleep 300' & sleep 0.5; exit 1",
        "stop_timeout": 1}})
    run_id = sup.start("crashy")
    record = sup.wait("crashy", timeout=30)
    assert record["exit_code"] == 1
    run = latest_run("crashy")
    wait_for(lambda: not tagged_pids(run_id), timeout=30, what="leftovers to be killed")
    wait_for(lambda: run.exit_record().get("leftovers"), timeout=10, what="leftovers recorded")
    assert any("sleep 300" in (p["command"] or "") for p in run.exit_record()["leftovers"])
    events = [e["event"] for e in run.events()]
    assert "LeftoversFound" in events and "LeftoversTerminated" in events


def test_sigterm_to_the_runner_stops_the_job(tmp_path, state):
    sup = supervisor_for(tmp_path, {"svc": {"cmd": "trap '' TERM; sleep 300", "stop_timeout": 1}})
    run_id = sup.start("svc")
    run = latest_run("svc")
    wait_for(lambda: run.runner_id() and run.job_id(), what="runner and job pids")
    os.kill(run.runner_id().pid, signal.SIGTERM)
    record = sup.wait("svc", timeout=30)
    assert record["stopped_by_request"] is True and record["signal"] == "SIGKILL"
    assert sup.job_state("svc").state == "stopped"
    wait_for(lambda: not tagged_pids(run_id), what="no process of the run")


def test_job_outlives_the_cli_session_and_hangup(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"long": {"cmd": "while true; do echo tick; sleep 0.1; done"}})
    env = cli_env(state)
    # The CLI runs inside a session of its own (like an SSH login); the whole
    # session is then hung up and SIGKILLed.
    session = subprocess.Popen(
        ["bash", "-c", f"{PY} -m gpudeck.console.cli --jobs {jobs} start long; sleep 300"],
        cwd=str(Path(__file__).resolve().parent.parent), env=env, start_new_session=True,
        stdout=subprocess.PIPE)
    run_id = session.stdout.readline().decode().strip()
    assert run_id
    run = wait_for(lambda: latest_run("long"), what="the run dir")
    wait_for(lambda: run.job_id(), what="job pid")
    os.killpg(session.pid, signal.SIGHUP)
    os.killpg(session.pid, signal.SIGKILL)
    session.wait(timeout=10)
    runner = run.runner_id()
    assert procs.read_stat(runner.pid).ppid != session.pid
    size = run.log_path.stat().st_size
    wait_for(lambda: run.log_path.stat().st_size > size + 50, what="the job to keep writing")
    assert procs.is_alive(runner.pid, runner.start)
    assert run.state().state == "running"


def test_job_survives_its_runner_being_killed_and_stop_still_works(tmp_path, state):
    sup = supervisor_for(tmp_path, {"orphan": {
        "cmd": "setsid bash -c 'sleep 300' & while true; do echo tick; sleep 0.1; done", "stop_timeout": 2}})
    run_id = sup.start("orphan")
    run = latest_run("orphan")
    wait_for(lambda: run.job_id(), what="job pid")
    runner = run.runner_id()
    os.kill(runner.pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(runner.pid, runner.start), what="runner death")
    size = run.log_path.stat().st_size
    wait_for(lambda: run.log_path.stat().st_size > size + 50, what="output to reach disk without the runner")
    st = sup.job_state("orphan")
    assert st.state == "running" and st.runner_alive is False
    report = sup.stop("orphan")
    assert report.clean, report.lines()
    assert not tagged_pids(run_id)
    assert sup.job_state("orphan").state == "stopped"


def test_command_that_cannot_start_is_an_exit_record(tmp_path, state):
    sup = supervisor_for(tmp_path, {"nope": {"cmd": ["/nonexistent/binary", "x"]}})
    sup.start("nope")
    record = sup.wait("nope", timeout=30)
    assert record["exit_code"] == 127
    assert "could not start" in latest_run("nope").log_path.read_text()
    assert sup.job_state("nope").state == "exited"


def test_runner_module_imports_without_side_effects():
    out = subprocess.run([PY, "-c", "import os, gpudeck.jobs.runner, json; print(json.dumps(os.getpid()))"],
                         cwd=str(Path(__file__).resolve().parent.parent), capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and json.loads(out.stdout)
