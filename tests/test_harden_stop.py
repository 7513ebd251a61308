"""Issue 9, stop: the deadline belongs to the run, a corrupt meta.json falls back to ids.json, and daemons that escaped a SIGKILLed runner are found."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run

from runsupport import PY, REPO, cli, cli_env, pid_alive, wait_for, write_jobs

STUBBORN = ("import signal, time, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('up', flush=True)\n"
            "time.sleep(300)\n")


def test_killing_the_cli_mid_stop_still_ends_the_job_at_the_runs_deadline(tmp_path, state):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    jobs = write_jobs(tmp_path / "jobs.toml", {"stubborn": {"cmd": f"{PY} {script}", "stop_timeout": "60s"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "stubborn"], env).returncode == 0
    run = latest_run("stubborn", state)
    wait_for(lambda: run.state().state == "running" and b"up" in run.log_path.read_bytes(), what="running")
    job = run.job_id()
    stopper = subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "stop", "stubborn",
                                "--timeout", "3"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: any(e.get("event") == "StopRequested" for e in run.events()), what="stop requested")
    time.sleep(0.3)
    stopper.kill()                  # the CLI dies during the grace period
    stopper.wait()
    assert pid_alive(job.pid), "the job ignores SIGTERM: only the deadline's SIGKILL can end it"
    # 3 s from the request, not the job's 60 s stop_timeout, and without any CLI.
    wait_for(lambda: not procs.alive(job), timeout=15, what="the runner's SIGKILL at the deadline")
    record = wait_for(lambda: run.exit_record(), what="exit record")
    assert record["stopped_by_request"] is True and record["signal"] == "SIGKILL", record
    assert run.state().state == "stopped"


def test_a_corrupt_meta_json_keeps_the_run_running_and_stop_graceful(tmp_path, state):
    marker = tmp_path / "got-term"
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {
        "cmd": f"trap 'echo term > {marker}; exit 0' TERM; sleep 300 & wait"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode == 0
    run = latest_run("svc", state)
    wait_for(lambda: run.state().state == "running", what="running")
    wait_for(lambda: run.ids().get("job_process"), what="ids.json")
    run.meta_path.write_text('{"job": "svc", "runner": {"pid": "garbage"')       # torn / corrupt
    listing = json.loads(cli(["--jobs", str(jobs), "jobs", "--json"], env).stdout)
    assert listing["jobs"][0]["state"] == "running", listing
    done = cli(["--jobs", str(jobs), "stop", "svc", "--json", "--timeout", "10"], env)
    report = json.loads(done.stdout)
    assert report["signal"] == "SIGTERM" and not report["escalated"] and report["clean"], report
    assert marker.exists(), "the job never got the graceful stop signal"


DAEMON = r'''
import os, sys, time
def daemonize(keep_log):
    if os.fork(): return
    os.setsid()
    if os.fork(): os._exit(0)
    if not keep_log:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    os.chdir("/")
    # a cleared environment: no GPUDECK_RUN_ID to find it by
    os.execve("/bin/sleep", ["sleep", "300"], {})
daemonize(keep_log=True)
daemonize(keep_log=False)
time.sleep(300)
'''


@pytest.mark.parametrize("cgroup", ["1", "0"], ids=["with-run-cgroup", "sessions-and-log-fd-only"])
def test_stop_after_the_runner_was_sigkilled_finds_setsid_double_forked_daemons(tmp_path, state, cgroup):
    script = tmp_path / "daemons.py"
    script.write_text(DAEMON)
    jobs = write_jobs(tmp_path / "jobs.toml", {"d": {"cmd": f"{PY} {script}"}})
    env = {**cli_env(state), "GPUDECK_RUN_CGROUP": cgroup}
    assert cli(["--jobs", str(jobs), "start", "d"], env).returncode == 0
    run = latest_run("d", state)
    job = wait_for(lambda: run.job_id(), what="job pid")

    def daemons():
        return [st for st in procs.all_stats().values()
                if st.comm == "sleep" and st.session != job.pid and st.start >= job.start
                and os.path.realpath(f"/proc/{st.pid}/cwd") == "/"
                and procs.environ_value(st.pid, "GPUDECK_RUN_ID") is None]
    found = wait_for(lambda: len(daemons()) == 2 and daemons(), what="two daemons")
    assert (run.ids().get("cgroup") is not None) == (cgroup == "1" and _cgroups_allowed())
    time.sleep(2.5)                              # a few runner ticks: sessions recorded
    runner = run.runner_id()
    procs.signal_process(runner, signal.SIGKILL)
    wait_for(lambda: not procs.alive(runner), what="runner gone")
    try:
        done = cli(["--jobs", str(jobs), "stop", "d", "--json", "--timeout", "3"], env)
        report = json.loads(done.stdout)
        touched = set(report["signalled"]) | set(report["killed"])
        for st in found:
            assert st.pid in touched, (st.pid, report)
            assert not pid_alive(st.pid), f"daemon {st.pid} survived stop"
        assert report["clean"], report
    finally:
        for st in found:
            procs.signal_process(st.identity, signal.SIGKILL)


def _cgroups_allowed() -> bool:
    from gpudeck.jobs import cgroups
    mount, here = cgroups.cgroup2_mount(), cgroups.current_cgroup()
    return bool(mount and here is not None and os.access(mount / here.lstrip("/"), os.W_OK))


def test_the_run_cgroup_is_used_where_this_machine_allows_it_and_removed_after(tmp_path, state):
    from gpudeck.jobs import cgroups
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "sleep 1"}})
    assert cli(["--jobs", str(jobs), "start", "quick"], cli_env(state)).returncode == 0
    run = latest_run("quick", state)
    wait_for(lambda: run.ids().get("job_process"), what="ids.json")
    path = run.ids().get("cgroup")
    if path is None:
        assert cgroups.enter_new.__doc__     # not allowed here: tag, sessions and log fd carry the work
        return
    job = run.job_id()
    assert job.pid in cgroups.members(path)
    wait_for(lambda: run.exit_record(), what="exit")
    runner = run.runner_id()
    wait_for(lambda: not procs.alive(runner), what="runner gone")
    assert not os.path.exists(path) and run.ids().get("cgroup") is None
