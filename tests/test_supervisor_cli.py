"""The job CLI on real processes: a job loses no line while `logs -f` is SIGKILLed and restarted 20 times; jobs/stop/restart/logs."""
from __future__ import annotations

import json
import signal
import subprocess
import time

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run, list_runs

from runsupport import PY, REPO, cli, cli_env, wait_for, write_jobs

COUNTER = """
import os, sys, time
flag = sys.argv[1]
i = 0
while not os.path.exists(flag):
    i += 1
    print(f"n={i}", flush=True)
    time.sleep(0.005)
print("END", flush=True)
"""


def numbers(text: str) -> list[int]:
    return [int(line[2:]) for line in text.splitlines() if line.startswith("n=")]


def test_no_line_lost_while_the_cli_is_sigkilled_and_restarted_20_times(tmp_path, state):
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    flag = tmp_path / "enough"
    jobs = write_jobs(tmp_path / "jobs.toml", {"counter": {"cmd": [PY, str(script), str(flag)]}})
    env = cli_env(state)
    started = cli(["--jobs", str(jobs), "start", "counter"], env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.decode().strip()
    run = latest_run("counter")
    job = wait_for(lambda: run.job_id(), what="job pid")
    for attempt in range(20):
        follower = subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "logs", "counter", "-f"],
                                    cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 5 and time.monotonic() < deadline:
            line = follower.stdout.readline()
            if not line:
                break
            seen.append(line)
        follower.send_signal(signal.SIGKILL)
        follower.wait(timeout=10)
        follower.stdout.close()
        got = numbers(b"".join(seen).decode())
        assert len(got) >= 5, f"attempt {attempt}: logs -f printed {seen!r}"
        assert got == list(range(got[0], got[0] + len(got))), "logs -f skipped or repeated a line"
        # A fresh CLI sees the same live run.
        listing = json.loads(cli(["--jobs", str(jobs), "jobs", "--json"], env).stdout)
        (entry,) = [j for j in listing["jobs"] if j["name"] == "counter"]
        assert (entry["state"], entry["run_id"], entry["pid"]) == ("running", run_id, job.pid)
        assert procs.is_alive(job.pid, job.start)
    flag.touch()
    wait_for(lambda: run.exit_record(), timeout=30, what="the counter to finish")
    out = cli(["--jobs", str(jobs), "logs", "counter"], env).stdout.decode()
    got = numbers(out)
    assert got == list(range(1, len(got) + 1)), "a line of the job was lost or duplicated"
    assert len(got) > 100
    assert out.rstrip().endswith("END")
    assert run.exit_record()["exit_code"] == 0


def test_logs_follow_ends_with_the_run_and_prints_everything(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "burst": {"cmd": "for i in $(seq 1 300); do echo line-$i; done; sleep 1; printf 'tail-without-newline'"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "burst"], env).returncode == 0
    t0 = time.monotonic()
    out = cli(["--jobs", str(jobs), "logs", "burst", "-f"], env, timeout=60)
    assert out.returncode == 0 and time.monotonic() - t0 < 30
    lines = out.stdout.decode().splitlines()
    assert lines[:300] == [f"line-{i}" for i in range(1, 301)]
    assert lines[300:] == ["tail-without-newline"]


def test_logs_last_lines_and_an_older_run(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"twice": {"cmd": 'for i in 1 2 3 4 5; do echo "$RUN_MARK-$i"; done'}})
    env = cli_env(state)
    first = cli(["--jobs", str(jobs), "start", "twice"], {**env, "RUN_MARK": "one"}).stdout.decode().strip()
    wait_for(lambda: latest_run("twice").exit_record(), what="first run")
    cli(["--jobs", str(jobs), "start", "twice"], {**env, "RUN_MARK": "two"})
    wait_for(lambda: len(list_runs("twice")) == 2 and latest_run("twice").exit_record(), what="second run")
    last = cli(["--jobs", str(jobs), "logs", "twice", "-n", "2"], env).stdout.decode()
    assert last.splitlines() == ["two-4", "two-5"]
    older = cli(["--jobs", str(jobs), "logs", "twice", "--run", first], env).stdout.decode()
    assert older.splitlines() == [f"one-{i}" for i in range(1, 6)]
    assert cli(["--jobs", str(jobs), "logs", "twice", "-n", "0"], env).stdout == b""
    missing = cli(["--jobs", str(jobs), "logs", "twice", "--run", "nope"], env)
    assert missing.returncode != 0 and missing.stderr.decode().count("\n") == 1


def test_jobs_json_start_stop_restart_through_the_cli(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "svc": {"cmd": "trap '' TERM; sleep 300", "kind": "service", "stop_timeout": 1, "gpus": [0]},
        "idle_one": {"cmd": "true"}})
    env = cli_env(state)
    t0 = time.monotonic()
    started = cli(["--jobs", str(jobs), "start", "svc"], env)
    wall = time.monotonic() - t0
    assert started.returncode == 0 and wall < 3.0, f"CLI start took {wall:.2f}s (interpreter included)"
    run_id = started.stdout.decode().strip()
    payload = json.loads(cli(["--jobs", str(jobs), "jobs", "--json"], env).stdout)
    by_name = {j["name"]: j for j in payload["jobs"]}
    for key in ("name", "kind", "state", "pid", "run_id", "exit_code", "started_at", "ended_at", "port",
                "port_open", "gpus"):
        assert key in by_name["svc"]
    assert by_name["svc"]["kind"] == "service" and by_name["svc"]["gpus"] == [0]
    assert by_name["svc"]["run_id"] == run_id and by_name["svc"]["state"] in ("starting", "running")
    assert by_name["idle_one"]["state"] == "idle"
    table = cli(["--jobs", str(jobs), "jobs"], env).stdout.decode()
    assert "svc" in table and "idle_one" in table and "NAME" in table
    restarted = cli(["--jobs", str(jobs), "restart", "svc"], env)
    assert restarted.returncode == 0, restarted.stderr
    new_id = restarted.stdout.decode().strip()
    assert new_id != run_id
    stopped = cli(["--jobs", str(jobs), "stop", "svc", "--json"], env)
    assert stopped.returncode == 0, stopped.stderr
    report = json.loads(stopped.stdout)
    assert report["clean"] is True and report["run_id"] == new_id and report["escalated"] is True
    payload = json.loads(cli(["--jobs", str(jobs), "jobs", "--json"], env).stdout)
    assert {j["name"]: j["state"] for j in payload["jobs"]}["svc"] == "stopped"


def test_user_errors_are_one_line(tmp_path, state):
    env = cli_env(state)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["start", "x"], ["stop", "x"], ["restart", "x"], ["jobs"], ["jobs", "--json"], ["run", "x"],
                 ["logs", "x"]):
        out = subprocess.run([PY, "-m", "gpudeck.console.cli", *args], cwd=empty, env={**env, "PYTHONPATH": str(REPO)},
                             capture_output=True, timeout=60)
        err = out.stderr.decode()
        assert out.returncode != 0 and err.startswith("gpudeck: ") and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err
    jobs = write_jobs(tmp_path / "jobs.toml", {"real": {"cmd": "true"}})
    for args in (["start", "nope"], ["stop", "nope"], ["logs", "nope"], ["run", "nope"]):
        out = cli(["--jobs", str(jobs), *args], env)
        err = out.stderr.decode()
        assert out.returncode != 0 and err.count("\n") == 1 and "nope" in err, (args, err)
    broken = tmp_path / "broken.toml"
    broken.write_text("[jobs.x]\ncmd = \n")
    out = cli(["--jobs", str(broken), "start", "x"], env)
    assert out.returncode != 0 and f"{broken}:2:" in out.stderr.decode()
