"""Issue 9, clocks: run ids in UTC as a monotonic sequence, and a live run is always the job's current run."""
from __future__ import annotations

from gpudeck.jobs.runs import list_runs, new_run_id

from runsupport import cli, cli_env, wait_for, write_jobs


def test_a_tz_change_never_hides_the_live_run(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}, "quick": {"cmd": "true"}})
    ahead = {**cli_env(state), "TZ": "Etc/GMT-14"}      # UTC+14
    behind = {**cli_env(state), "TZ": "Etc/GMT+12"}     # UTC-12
    # A finished run made while the clock read 26 hours later, then the live one.
    assert cli(["--jobs", str(jobs), "start", "svc"], ahead).returncode == 0
    assert cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "3"], ahead).returncode == 0
    assert cli(["--jobs", str(jobs), "start", "svc"], behind).returncode == 0
    runs = list_runs("svc", state)
    assert len(runs) == 2
    live = wait_for(lambda: [r for r in runs if r.state().state == "running"], what="the live run")[0]
    assert live == runs[-1], "the new run must sort after the older one whatever TZ said"
    for env in (ahead, behind):
        listing = cli(["--jobs", str(jobs), "jobs"], env).stdout.decode()
        assert any(line.startswith("svc") and " running " in line for line in listing.splitlines()), listing
        again = cli(["--jobs", str(jobs), "start", "svc"], env)
        assert again.returncode != 0 and b"already running" in again.stderr, again.stderr
    done = cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "3"], ahead)
    assert done.returncode == 0 and b"stopped svc" in done.stdout, done.stdout + done.stderr
    assert live.exit_record() is not None


def test_a_live_run_older_by_name_is_still_current(tmp_path, state):
    """Ids written in local time by an older version, or a clock set back: the live run stays current."""
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode == 0
    live = list_runs("svc", state)[-1]
    wait_for(lambda: live.state().state == "running", what="running")
    # A finished run whose id sorts later (made with a clock 1 day ahead).
    later = live.path.parent / new_run_id(now=__import__("time").time() + 86400)
    later.mkdir(mode=0o700)
    (later / "exit.json").write_text('{"exit_code": 0, "ended_at": 1}')
    (later / "meta.json").write_text('{"created_at": 1}')
    assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode != 0
    done = cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "3"], env)
    assert b"stopped svc" in done.stdout, done.stdout + done.stderr
    assert live.exit_record() is not None


def test_run_ids_are_utc_and_monotonic():
    assert new_run_id(now=0.5).startswith("19700101-000000-500")
    first = new_run_id(now=1000.0)
    assert new_run_id(now=10.0, after=first) > first           # clock stepped back
    assert new_run_id(now=1000.9995).startswith("19700101-001640-999")
