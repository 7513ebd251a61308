"""Issue 9, ETA: shown only while a live run's progress moves; an ended run says where it got to, a stuck one for how long."""
from __future__ import annotations

from pathlib import Path

from gpudeck.jobs.health import HealthMonitor
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.view import JobView

from runsupport import PY, cli, cli_env, wait_for, write_jobs

BASE = {"name": "w", "kind": "stage", "phase": "loading",
        "progress": {"done": 8, "total": 64, "label": "shards", "eta_s": 180}}
NOW = 10_000.0


def phase(**extra) -> str:
    return JobView.from_payload({**BASE, **extra}).cells(NOW)["phase"]


def test_eta_only_while_the_phase_advances():
    assert phase(state="running", progress_at=NOW - 5).endswith("ETA 3m00s")
    stuck = phase(state="running", progress_at=NOW - 300)
    assert "ETA" not in stuck and stuck.endswith("no progress for 5m00s"), stuck
    stalled = phase(state="running", progress_at=NOW - 30, alerts=[{"code": "stalled", "message": "quiet"}])
    assert "ETA" not in stalled and "no progress for 30s" in stalled, stalled
    assert phase(state="stopped") == "loading at 8/64 when stopped"
    assert phase(state="exited", exit_code=1) == "loading at 8/64 when it failed"
    assert phase(state="lost") == "loading at 8/64 when lost"


def test_progress_at_moves_only_when_the_progress_does(tmp_path: Path):
    run_dir = tmp_path / "runs" / "w" / "r1"
    run_dir.mkdir(parents=True)
    log = run_dir / "output.log"
    log.write_bytes(b"")
    mon = HealthMonitor(run_dir, kind="stage")
    with open(log, "ab") as fh:
        fh.write(b"Loading safetensors checkpoint shards:  12% Completed | 8/64 [00:10<01:10,  1.25s/it]\n")
    mon.tick({}, now=100.0)
    first = mon.health_record(100.0)["progress_at"]
    mon.tick({}, now=160.0)                      # nothing new
    assert mon.health_record(160.0)["progress_at"] == first == 100.0
    with open(log, "ab") as fh:
        fh.write(b"Loading safetensors checkpoint shards:  14% Completed | 9/64 [00:11<01:09,  1.25s/it]\n")
    mon.tick({}, now=170.0)
    assert mon.health_record(170.0)["progress_at"] == 170.0


def test_a_stopped_job_shows_where_it_got_not_an_eta(tmp_path, state):
    script = tmp_path / "bar.py"
    script.write_text("import time\n"
                      "for i in range(1, 9):\n"
                      "    print(f'Loading safetensors checkpoint shards: {i*100//64:3d}% Completed | {i}/64 "
                      "[00:{i:02d}<03:00,  1.00s/it]', flush=True)\n"
                      "    time.sleep(0.1)\n"
                      "time.sleep(300)\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"loader": {"cmd": f"{PY} {script}"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "loader"], env).returncode == 0
    run = latest_run("loader", state)
    wait_for(lambda: b"8/64" in run.log_path.read_bytes(), what="8/64 in the log")
    wait_for(lambda: "8/64" in cli(["--jobs", str(jobs), "jobs"], env).stdout.decode(), what="8/64 shown")
    live = cli(["--jobs", str(jobs), "jobs"], env).stdout.decode()
    assert "ETA" in live, live
    assert cli(["--jobs", str(jobs), "stop", "loader", "--timeout", "3"], env).returncode == 0
    listing = cli(["--jobs", str(jobs), "jobs"], env).stdout.decode()
    row = next(line for line in listing.splitlines() if line.startswith("loader"))
    assert "at 8/64 when stopped" in row and "ETA" not in row, listing


def test_a_stall_without_a_progress_time_does_not_claim_zero_seconds():
    """A replayed (demo) stall carries the alert but no progress_at: it read "no progress for 0s" while stalled 1m+."""
    stalled = phase(state="running", alerts=[{"code": "stalled", "message": "quiet"}])
    assert stalled.endswith("64 12% no progress") and "ETA" not in stalled and "for 0s" not in stalled, stalled
