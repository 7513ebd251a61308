"""Issue 9, alerts: a NUL in a crash message still raises and delivers the alert; on_alert hooks live outside the run, outlive its runner, and have a deadline."""
from __future__ import annotations

import json
import os
import time

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run

from runsupport import PY, cli, cli_env, pid_alive, wait_for, write_jobs


def _events(run, name):
    return [e for e in run.events() if e.get("event") == name]


def test_nul_in_a_crash_message_still_raises_the_alert_and_runs_on_alert(tmp_path, state):
    script = tmp_path / "crash.py"
    script.write_text("import sys\n"
                      "sys.stderr.write('Traceback (most recent call last):\\n  File \"x.py\", line 1, in <module>\\n')\n"
                      "sys.stderr.write('ValueError: bad \\x00 byte \\x1b]52;c;U0VDUkVU\\x07\\u202eevil\\x1bc\\n')\n"
                      "sys.exit(1)\n")
    out = tmp_path / "hook.out"
    jobs = write_jobs(tmp_path / "jobs.toml", {"crashy": {
        "cmd": f"{PY} {script}", "on_alert": f'printf "%s|%s\\n" "$GPUDECK_ALERT_CODE" "$GPUDECK_ALERT_MESSAGE" > {out}'}})
    assert cli(["--jobs", str(jobs), "start", "crashy"], cli_env(state)).returncode == 0
    run = latest_run("crashy", state)
    wait_for(lambda: run.exit_record(), what="exit record")
    raised = wait_for(lambda: _events(run, "AlertRaised"), what="AlertRaised")
    assert raised[0]["code"] == "crashed"
    text = wait_for(lambda: out.exists() and out.read_text(), what="on_alert output")
    assert text.startswith("crashed|") and "bad \\0 byte" in text, text
    # The hook's GPUDECK_ALERT_* went through the sanitizer: no escape sequence, bidi shown escaped.
    assert "\x1b" not in text and "U0VDUkVU" not in text and "<U+202E>evil" in text, text
    health = wait_for(lambda: (json.loads((run.path / "health.json").read_text())
                               if (run.path / "health.json").exists() else {}).get("ended"), what="ended")
    assert health is True


def test_on_alert_hook_is_not_the_jobs_leftover_and_outlives_the_runner(tmp_path, state):
    out = tmp_path / "hook.out"
    # The hook takes a while: it must survive stop, the runner's leftover sweep and the runner's exit.
    jobs = write_jobs(tmp_path / "jobs.toml", {"idle": {
        "cmd": "sleep 300", "stall_after": "2s",
        "on_alert": f'sleep 6; echo "delivered $GPUDECK_ALERT_CODE" > {out}'}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "idle"], env).returncode == 0
    run = latest_run("idle", state)
    raised = wait_for(lambda: _events(run, "AlertRaised"), timeout=40, what="stalled alert")
    hook_pid = raised[0]["on_alert_pid"]
    assert pid_alive(hook_pid)
    runner = run.runner_id()
    done = cli(["--jobs", str(jobs), "stop", "idle", "--json", "--timeout", "3"], env)
    report = json.loads(done.stdout)
    assert hook_pid not in report["signalled"] + report["killed"], report
    assert all(p["pid"] != hook_pid for p in report["remaining"]), report
    assert report["clean"], report
    wait_for(lambda: not procs.alive(runner), what="runner exit")
    assert all(p["pid"] != hook_pid for p in run.exit_record().get("leftovers") or [])
    assert wait_for(lambda: out.exists() and out.read_text(), timeout=30, what="hook output") == "delivered stalled\n"


def test_on_alert_hook_is_terminated_at_its_deadline(tmp_path, state):
    marker = tmp_path / "hook.pid"
    jobs = write_jobs(tmp_path / "jobs.toml", {"crashy": {
        "cmd": "exit 3", "on_alert": f"echo $$$$ > {marker}; exec sleep 300"}})
    env = {**cli_env(state), "GPUDECK_ON_ALERT_TIMEOUT": "2"}
    assert cli(["--jobs", str(jobs), "start", "crashy"], env).returncode == 0
    run = latest_run("crashy", state)
    pid = int(wait_for(lambda: marker.exists() and marker.read_text().strip(), what="hook started"))
    started = time.monotonic()
    wait_for(lambda: not pid_alive(pid), timeout=30, what="hook terminated")
    assert time.monotonic() - started < 20
    log = (run.path / "on_alert.log").read_text()
    assert "still running after 2 s; terminated" in log, log
