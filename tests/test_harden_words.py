"""The post-mortem's words say what happened: a load that ended in a crash counts as the load, a stop the operator asked for is the operator's, a replay is a replay, and a runner still reading the log is finishing, not dead."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gpudeck.console.app import make_app
from gpudeck.console.feeds import JobsFeed
from gpudeck.console.messages import SamplesCollected
from gpudeck.console.replay import ReplayJobsSource
from gpudeck.jobs.history.phases import phase_rows
from gpudeck.jobs.history.postmortem import build, verdict
from gpudeck.jobs.procs import identity
from gpudeck.jobs.replay import demo_session
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.telemetry.history import History
from gpudeck.jobs.telemetry.sampler import make_sampler

from runsupport import PY, cli, cli_env, pilot_test, pilot_wait_for, wait_for, write_jobs

# Loads its weights for about 3 s, says so the way vLLM does, then dies in the start-up after the load.
LOADED_THEN_DIED = r'''
import sys, time
print("INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", flush=True)
for i in range(1, 4):
    print(f"Loading safetensors checkpoint shards:  {i * 33}% Completed | {i}/3 [00:0{i}<00:01,  1.00it/s]", flush=True)
    time.sleep(1.0)
print("INFO 12-01 10:00:03 [default_loader.py:262] Loading weights took 3.01 seconds", flush=True)
print("INFO 12-01 10:00:03 [gpu_model_runner.py:2007] Model loading took 14.99 GiB and 3.2 seconds", flush=True)
time.sleep(1.5)
raise RuntimeError("boom in the warm-up")
'''


def test_a_crash_right_after_the_load_is_told_by_the_load():
    t0 = 1000.0
    rows = phase_rows([{"phase": "loading", "t": t0, "line": 2}, {"phase": "starting", "t": t0 + 12, "line": 9},
                       {"phase": "failed", "t": t0 + 12.3, "line": 11}], t0, t0 + 12.3)
    report = {"outcome": {"state": "exited", "failed": True, "duration_s": 12.3}, "phases": rows,
              "failure": {"cause": "exception", "line": 11, "message": "RuntimeError: boom"}}
    said = verdict(report)
    assert said.startswith("crashed right after 12 s of loading: Python exception"), said
    report["phases"][1]["duration_s"] = 3.0
    assert verdict(report).startswith("crashed 3 s after 12 s of loading:"), verdict(report)


def test_a_real_run_that_loaded_then_died_and_runs_shows_its_load(tmp_path, state):
    script = tmp_path / "engine.py"
    script.write_text(LOADED_THEN_DIED)
    jobs = write_jobs(tmp_path / "jobs.toml", {"engine": {"cmd": [PY, str(script)]}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "engine"], env).returncode == 0
    run = latest_run("engine")
    wait_for(lambda: run.exit_record() is not None and not run.state().runner_alive, timeout=60,
             what="the run to end")
    report = build("engine", state)
    assert re.match(r"crashed (right|\d+ s) after [3-5] s of loading: ", report["verdict"]), report["verdict"]
    table = cli(["runs"], env).stdout.decode()
    row = next(line for line in table.splitlines() if run.run_id in line)
    assert re.search(r"  [3-5]s✗  ", row), table


def _finished_run(run_dir: Path, runner: dict) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"command": ["python", "big.py"], "started_at": 100.0,
                                                   "created_at": 100.0, "runner": runner}))
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "ended_at": 160.0,
                                                   "stopped_by_request": False}))
    (run_dir / "output.log").write_bytes(b"working\n" * 1000)
    (run_dir / "summary.json").write_text(json.dumps({
        "version": 1, "final": False, "written_at": 150.0, "analysis": {"phase": "running"},
        "phases": [{"phase": "running", "t": 100.0, "line": 1}], "log": {"bytes": 4000, "lines": 501}}))
    (run_dir / "events.jsonl").write_text("")
    return run_dir


def test_a_runner_still_reading_the_log_is_finishing_not_dead(tmp_path, state):
    me = identity(os.getpid())
    alive = _finished_run(state / "runs" / "big" / "20251201-000000-00001", me.to_jsonable())
    missing = " ".join(build(str(alive), state)["missing"])
    assert "runner is finishing" in missing and "died" not in missing, missing
    # A pid that is ours but with another start time is a reused pid: that runner is gone.
    gone = _finished_run(state / "runs" / "big" / "20251201-000000-00002", {"pid": me.pid, "start": me.start + 1})
    missing = " ".join(build(str(gone), state)["missing"])
    assert "the runner died before the end" in missing, missing


def test_a_stop_asked_for_by_the_operator_says_so(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"slow": {"cmd": "sleep 60", "stop_timeout": 5}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "slow"], env).returncode == 0
    run = latest_run("slow")
    wait_for(lambda: run.state().state == "running", timeout=30, what="the job to run")
    assert cli(["--jobs", str(jobs), "stop", "slow"], env).returncode == 0
    wait_for(lambda: not run.state().runner_alive, timeout=60, what="the runner to finish")
    report = build("slow", state)
    assert report["verdict"].startswith("stopped by the operator"), report["verdict"]
    assert "supervisor" not in cli(["postmortem", "slow"], env).stdout.decode()
    row = next(line for line in cli(["runs"], env).stdout.decode().splitlines() if run.run_id in line)
    assert "stopped by the operator" in row, row


@pilot_test
async def test_the_header_says_replay_during_a_replay_and_live_after() -> None:
    from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
    sampler = make_sampler(demo=True, seed=0)
    app = make_app(sampler=sampler, history=History(), start_sampling=False)
    session = demo_session(loop=False)
    session.seek_to(session.start + 70)
    session.paused = True
    app.jobs_feed = JobsFeed(app, ReplayJobsSource(session))
    async with app.run_test(size=(120, 36)) as pilot:
        app.post_message(SamplesCollected(sampler.sample()))
        await pilot.press("2")
        await pilot_wait_for(pilot, lambda: getattr(app.screen, "replay", None), "a replayed frame")

        def header() -> str:
            return "".join(p if isinstance(p, str) else p[0] for p in app.screen.query_one(BoxHeaderPanel).parts())
        await pilot_wait_for(pilot, lambda: "REPLAY" in header(), "REPLAY in the header", detail=header)
        assert "live" not in header(), header()
        app.leave_replay()
        await pilot_wait_for(pilot, lambda: getattr(app.screen, "replay", 1) is None, "live jobs")
        await pilot_wait_for(pilot, lambda: "live" in header() and "REPLAY" not in header(), "live again",
                             detail=header)
