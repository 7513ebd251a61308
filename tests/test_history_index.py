"""The run index on real runs and a real SQLite file: the runner indexes its run, readers catch up lazily, `runs` filters, a corrupt DB is rebuilt, prune is a dry run first."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
import sqlite3

import pytest

from gpudeck.jobs.history.index import RunIndex, db_path
from gpudeck.jobs.history.recorder import RunRecorder, Timeline, read_summary
from gpudeck.jobs.runs import latest_run

from runsupport import PY, cli, cli_env, wait_for, write_jobs

CRASH = ("import sys, time\n"
         "print('Loading safetensors checkpoint shards:  50% Completed | 1/2', flush=True)\n"
         "time.sleep(1.5)\n"
         "import torch_missing_module_for_test\n")


def _jobs(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    return write_jobs(tmp_path / "jobs.toml", {
        "crashy": {"cmd": [PY, str(script)], "log_keep": 3},
        "fine": {"cmd": "echo hello; sleep 0.5"},
    })


def _start_and_wait(jobs, env, name):
    out = cli(["--jobs", str(jobs), "start", name], env)
    assert out.returncode == 0, out.stderr
    run = latest_run(name)
    wait_for(lambda: run.exit_record() is not None, timeout=60, what=f"{name} to exit")
    # The runner indexes its run after the exit record: let it finish so nothing races the test.
    wait_for(lambda: not run.state().runner_alive, timeout=60, what=f"{name}'s runner to finish")
    return run


def _row_in_db(state_dir, run_id):
    # The runner's row, read straight from the file (no lazy sync by a reader in between).
    def probe():
        if not db_path(state_dir).exists():
            return None
        conn = sqlite3.connect(str(db_path(state_dir)), timeout=10)
        try:
            return conn.execute("SELECT state, failed, failure_cause, exit_code FROM runs WHERE run_id = ?",
                                (run_id,)).fetchone()
        except sqlite3.OperationalError:
            return None
        finally:
            conn.close()
    return wait_for(probe, timeout=30, what="the runner's index row")


def test_runner_indexes_a_crash_and_runs_lists_it(tmp_path, state):
    jobs = _jobs(tmp_path)
    env = cli_env(state)
    crash = _start_and_wait(jobs, env, "crashy")
    fine = _start_and_wait(jobs, env, "fine")
    assert _row_in_db(state, crash.run_id) == ("exited", 1, "import_error", 1)
    assert _row_in_db(state, fine.run_id) == ("exited", 0, None, 0)
    summary = read_summary(crash.path)
    assert summary["final"] is True
    assert [p["phase"] for p in summary["phases"]][-1] == "failed"
    assert "loading" in [p["phase"] for p in summary["phases"]]

    out = cli(["runs"], env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["RUN", "JOB", "KIND"]
    assert fine.run_id in lines[1] and crash.run_id in lines[2]      # newest first
    assert "import_error" in lines[2] and lines[2].startswith("✗")

    failed = cli(["runs", "--failed"], env).stdout.decode()
    assert crash.run_id in failed and fine.run_id not in failed
    data = json.loads(cli(["runs", "crashy", "--json"], env).stdout)
    assert [r["run_id"] for r in data["runs"]] == [crash.run_id]
    row = data["runs"][0]
    # line 5 of the log: bar, Traceback, File, the import, then ModuleNotFoundError
    assert row["failed"] is True and row["failure_line"] == 5 and row["host"] and row["backend"] == "local"
    assert row["phases"].get("loading", 0) > 0.5
    assert json.loads(cli(["runs", "--since", "1h", "--json"], env).stdout)["runs"]

    bad = cli(["runs", "--since", "yesterday"], env)
    assert bad.returncode == 2 and bad.stderr.decode().startswith("gpudeck: --since") and b"Traceback" not in bad.stderr


def test_lazy_sync_adds_missing_and_drops_deleted_runs_and_a_corrupt_db_is_rebuilt(tmp_path, state):
    jobs = _jobs(tmp_path)
    env = cli_env(state)
    first = _start_and_wait(jobs, env, "fine")
    second = _start_and_wait(jobs, env, "fine")
    # A run the runner could not index (an older runner, a full disk): the reader adds it.
    os.unlink(db_path(state))
    with RunIndex(state) as index:
        index.sync()
        assert {r["run_id"] for r in index.query()} == {first.run_id, second.run_id}
    shutil.rmtree(first.path)
    with RunIndex(state) as index:
        index.sync()
        assert [r["run_id"] for r in index.query()] == [second.run_id]

    _corrupt(state)
    out = cli(["runs", "--json"], env)
    assert out.returncode == 0 and b"Traceback" not in out.stderr
    assert b"rebuilt from the run directories" in out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)["runs"]] == [second.run_id]
    rebuilt = cli(["runs", "--reindex"], env)
    assert rebuilt.returncode == 0 and b"reindexed 1 runs" in rebuilt.stdout


def test_prune_lists_first_and_deletes_with_yes(tmp_path, state):
    jobs = _jobs(tmp_path)
    env = cli_env(state)
    runs = [_start_and_wait(jobs, env, "fine") for _ in range(3)]
    dry = cli(["--jobs", str(jobs), "runs", "--prune", "--keep", "1"], env)
    assert dry.returncode == 0, dry.stderr
    text = dry.stdout.decode()
    assert "would delete 2 runs" in text and runs[0].run_id in text and runs[1].run_id in text
    assert "nothing deleted" in text and all(r.path.exists() for r in runs)
    done = cli(["--jobs", str(jobs), "runs", "--prune", "--keep", "1", "--yes"], env)
    assert done.returncode == 0 and b"deleted 2 runs" in done.stdout
    assert not runs[0].path.exists() and not runs[1].path.exists() and runs[2].path.exists()
    listed = json.loads(cli(["runs", "--json"], env).stdout)["runs"]
    assert [r["run_id"] for r in listed] == [runs[2].run_id]
    assert b"nothing to prune" in cli(["runs", "--prune", "--older", "30d"], env).stdout
    bad = cli(["runs", "--keep", "2"], env)
    assert bad.returncode == 2 and b"go with --prune" in bad.stderr


def test_timeline_decimates_keeping_peaks():
    tl = Timeline(max_buckets=100)
    for i in range(10_000):
        tl.add(1000.0 + i, {"rss": 5.0 if i != 7777 else 99.0, "cpu_pct": 50.0})
    data = tl.to_json()
    assert len(data["t"]) <= 100 and data["width_s"] >= 100
    assert max(data["series"]["rss"]) == 99.0          # a peak survives decimation
    assert set(data["series"]["cpu_pct"]) == {50.0}      # a mean stays a mean


def test_recorder_line_checkpoints_point_at_line_starts(tmp_path):
    from gpudeck.jobs.logs.analyze import LogAnalyzer
    import gpudeck.jobs.history.recorder as recorder
    data = b"".join(b"line %d %s\n" % (i, b"x" * (i % 50)) for i in range(1, 20001))
    rec = RunRecorder(tmp_path)
    analyzer = LogAnalyzer()
    old, recorder.CHECKPOINT_EVERY = recorder.CHECKPOINT_EVERY, 50_000
    try:
        offset = 0
        for start in range(0, len(data), 33_333):
            chunk = data[start:start + 33_333]
            analyzer.feed(chunk)
            offset += len(chunk)
            rec.observe_log(0.0, {"phase": "unknown"}, offset, analyzer.line)
    finally:
        recorder.CHECKPOINT_EVERY = old
    assert len(rec.checkpoints) > 5
    for off, newlines in rec.checkpoints:
        assert data[:off].count(b"\n") == newlines


def _fake_run(state, job, run_id, *, exit_code=None, started=1_700_000_000.0):
    # Files as a runner leaves them (written by hand: no process needed to test the index's bookkeeping).
    d = state / "runs" / job / run_id
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"job": job, "run_id": run_id, "created_at": started,
                                             "started_at": started, "command": "true", "host": "h"}))
    if exit_code is not None:
        (d / "exit.json").write_text(json.dumps({"exit_code": exit_code, "ended_at": started + 5,
                                                 "stopped_by_request": False}))
    return d


def test_sync_sees_new_finished_and_deleted_runs_without_relisting_unchanged_jobs(tmp_path):
    state = tmp_path / "state"
    old = _fake_run(state, "a", "20250101-000000-00001", exit_code=0)
    live = _fake_run(state, "b", "20250101-000000-00002", started=1_700_000_100.0)
    with RunIndex(state) as index:
        assert index.sync() == 2
        assert index.sync() == 1                   # only the run without an exit record is re-read
        states = {r["run_id"]: r["state"] for r in index.query()}
        assert states == {old.name: "exited", live.name: "lost"}
        # The live run ends (its job dir's mtime does not change): re-read because it was not final.
        (live / "exit.json").write_text(json.dumps({"exit_code": 3, "ended_at": 1_700_000_200.0,
                                                    "stopped_by_request": False}))
        index.sync()
        row = index.get(f"job/b/{live.name}")
        assert row["state"] == "exited" and row["exit_code"] == 3 and row["failed"] is True
        new = _fake_run(state, "a", "20250101-000000-00003", exit_code=0, started=1_700_000_300.0)
        shutil.rmtree(old)
        index.sync()
        assert [r["run_id"] for r in index.query()] == [new.name, live.name]
        assert index.get(f"job/a/{old.name}")["state"] == "deleted"      # kept for post-mortems
        assert [r["run_id"] for r in index.query(include_deleted=True)][-1] == old.name


def _corrupt(state):
    # The main file overwritten with junk, its WAL gone (a WAL holding page 1 would mask the junk).
    for suffix in ("-wal", "-shm"):
        Path(str(db_path(state)) + suffix).unlink(missing_ok=True)
    db_path(state).write_bytes(b"this is not a database" * 100)


def test_a_pipeline_is_a_run_and_its_failed_stage_knows_it(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "prep": {"cmd": "echo prepared"},
        "train": {"cmd": "echo training; exit 3", "needs": ["prep"]},
    })
    env = cli_env(state)
    out = cli(["--jobs", str(jobs), "run", "train", "--wait"], env, timeout=120)
    assert out.returncode != 0, out.stdout
    train = latest_run("train")
    wait_for(lambda: not train.state().runner_alive, timeout=60, what="train's runner to finish")
    rows = json.loads(cli(["runs", "--json"], env).stdout)["runs"]
    pipe = next(r for r in rows if r["kind"] == "pipeline")
    assert pipe["job"] == "train" and pipe["state"] == "failed" and pipe["failed"] is True
    assert pipe["failure_cause"] == "stage train failed" and pipe["command"] == "prep → train"
    stage = next(r for r in rows if r["kind"] == "job" and r["job"] == "train")
    assert stage["pipeline"] == pipe["run_id"] and stage["exit_code"] == 3
    report = cli(["postmortem", train.run_id], env).stdout.decode()
    assert report.startswith("**exited with code 3") and f"pipeline {pipe['run_id']} → train (failed)" in report
    summary = cli(["postmortem", pipe["run_id"]], env).stdout.decode()
    assert summary.startswith(f"**pipeline train failed at stage train (run {train.run_id}, exit 3)")


def test_a_slurm_run_is_a_run_on_its_node(tmp_path):
    # The files a Slurm-backed run leaves (as gpudeck.jobs.slurm writes them after sacct), written by hand.
    state = tmp_path / "state"
    d = _fake_run(state, "train", "20250101-000000-00009", started=1_700_000_000.0)
    meta = json.loads((d / "meta.json").read_text())
    meta.update(backend="slurm", host="login-1")
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "output.log").write_text("epoch 1/5\nslurmstepd: error: *** JOB 42 ON gpu-node-7 CANCELLED DUE TO TIME LIMIT ***\n")
    (d / "exit.json").write_text(json.dumps({
        "exit_code": 143, "signal": "SIGTERM", "ended_at": 1_700_003_700.0, "stopped_by_request": False,
        "backend": "slurm", "slurm_job_id": "42", "slurm_state": "TIMEOUT", "nodes": "gpu-node-7",
        "started_at": 1_700_000_100.0, "note": "Slurm: killed by Slurm at its time limit"}))
    with RunIndex(state) as index:
        index.sync()
        row = index.query()[0]
    assert row["backend"] == "slurm" and row["host"] == "gpu-node-7"
    assert row["started_at"] == 1_700_000_100.0 and row["duration_s"] == 3600.0
    assert row["failed"] is True and row["failure_cause"] == "slurm_timeout"
    from gpudeck.jobs.history.postmortem import build
    report = build(str(d), state)
    assert report["outcome"]["slurm"]["state"] == "TIMEOUT" and report["outcome"]["slurm"]["nodes"] == "gpu-node-7"
    assert report["verdict"] == "killed by SIGTERM after 1 h 00 min of training; Slurm: killed by Slurm at its time limit"


def test_a_non_finite_number_in_a_runs_files_never_reaches_runs_json(tmp_path, state):
    # An older runner wrote Infinity into its summary (a step i/10^30 bar): the index reads it as
    # null, as the runs module does, and `runs --json` / `--reindex` stay strict JSON.
    jobs = _jobs(tmp_path)
    env = cli_env(state)
    run = _start_and_wait(jobs, env, "fine")
    summary = (run.path / "summary.json").read_text()
    (run.path / "summary.json").write_text(re.sub(r'"peaks":\s*\{', '"peaks": {"rss": Infinity, "x": NaN, ', summary, 1))
    assert "Infinity" in (run.path / "summary.json").read_text()
    assert cli(["runs", "--reindex"], env).returncode == 0
    out = cli(["runs", "--json"], env)
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr
    text = out.stdout.decode()
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
