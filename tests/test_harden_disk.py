"""Issue 9, full disk: the runner cleans up first, records the exit in space reserved at start, and the job is not `lost`."""
from __future__ import annotations

import json
import subprocess

import pytest

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run

from runsupport import cleanup_state, cli, cli_env, pid_alive, wait_for, write_jobs


@pytest.fixture
def small_fs(tmp_path, monkeypatch):
    """A 4 MiB tmpfs (we are root in the test environment); skipped where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    state_dir = mnt / "state"
    monkeypatch.setenv("GPUDECK_STATE_DIR", str(state_dir))
    try:
        yield state_dir
    finally:
        cleanup_state(state_dir)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


import pytest as _pytest


@_pytest.mark.parametrize("leftover", ["sleep 300", "while :; do head -c 65536 /dev/zero >> fill 2>/dev/null; done"],
                         ids=["idle-leftover", "leftover-still-writing"])
def test_a_full_disk_still_cleans_up_and_records_the_exit(tmp_path, small_fs, leftover):
    pidfile = tmp_path / "leftover.pid"          # not on the small disk
    work = small_fs.parent / "work"              # the job's cwd is on the small disk: its writer competes
    work.mkdir()
    jobs = write_jobs(tmp_path / "jobs.toml", {"filler": {
        "cwd": str(work),
        "cmd": f"( {leftover} ) & echo $! > {pidfile}; head -c 50000000 /dev/zero; exit 3"}})
    env = cli_env(small_fs)
    assert cli(["--jobs", str(jobs), "start", "filler"], env).returncode == 0
    run = latest_run("filler", small_fs)
    leftover = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="leftover pid"))
    record = wait_for(lambda: run.exit_record(), timeout=60, what="exit record on the full disk")
    assert record["exit_code"] == 3 and "disk full" in record.get("note", ""), record
    wait_for(lambda: not pid_alive(leftover), timeout=30, what="the leftover killed")
    runner = run.runner_id()
    wait_for(lambda: runner is None or not procs.alive(runner), timeout=30, what="runner finished")
    listing = cli(["--jobs", str(jobs), "jobs", "--json"], env)
    assert listing.returncode == 0, listing.stderr
    job = json.loads(listing.stdout)["jobs"][0]
    assert job["state"] == "exited" and job["exit_code"] == 3, job
