"""Review regressions in the headless core: hostile state on disk, start/stop races, foreign-stop PID checks."""
from __future__ import annotations

import json
import subprocess
import time

import psutil

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import PY, REPO, cli, cli_env, wait_for, write_jobs


def test_unusable_state_dir_is_one_line_not_a_traceback(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}})
    not_a_dir = tmp_path / "afile"
    not_a_dir.write_text("")
    env = cli_env(not_a_dir)
    for command in (["start", "svc"], ["run", "svc"]):
        done = cli(["--jobs", str(jobs), *command], env)
        err = done.stderr.decode()
        assert done.returncode != 0, command
        assert "Traceback" not in err, err
        assert err.startswith("gpudeck: ") and err.count("\n") == 1, err


def test_corrupt_meta_json_fields_are_one_line_or_tolerated(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "echo hi"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "quick"], env).returncode == 0
    run = latest_run("quick")
    wait_for(lambda: run.exit_record(), what="exit record")
    for bad in ({"runner": "x"}, {"runner": {"pid": "abc", "start": 1}}, {"job_process": [1, 2]},
                {"created_at": "abc"}):
        run.exit_path.unlink(missing_ok=True)
        run.meta_path.write_text(json.dumps(bad))
        for command in (["jobs"], ["jobs", "--json"], ["stop", "quick"]):
            done = cli(["--jobs", str(jobs), *command], env)
            assert "Traceback" not in done.stderr.decode(), (bad, command, done.stderr.decode())


def test_stop_before_a_slow_runner_launched_the_job_keeps_the_job_from_starting(tmp_path, state, monkeypatch):
    """start immediately followed by stop, on a box so loaded that the runner is not up yet."""
    import gpudeck.jobs.supervisor as supervisor_module
    monkeypatch.setattr(supervisor_module, "STARTING_STOP_WAIT_S", 0.3)
    marker = tmp_path / "ran"
    sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml",
                                          {"svc": {"cmd": f"touch {marker}; sleep 300"}})))
    # What start() writes before it launches the runner; the runner itself comes late.
    real_popen = subprocess.Popen
    launched = []

    def no_runner(argv, **kw):
        if argv[1:3] == ["-m", "gpudeck.jobs.runner"]:
            launched.append(argv)
            return real_popen(["true"], **kw)
        return real_popen(argv, **kw)
    monkeypatch.setattr(supervisor_module.subprocess, "Popen", no_runner)
    sup.start("svc")
    monkeypatch.setattr(supervisor_module.subprocess, "Popen", real_popen)
    report = sup.stop("svc")
    assert launched
    # The runner finally gets the CPU.
    runner = subprocess.Popen([PY, "-m", "gpudeck.jobs.runner", launched[0][-1]], cwd=REPO)
    run = latest_run("svc")
    try:
        wait_for(lambda: marker.exists() or run.exit_record(), timeout=60, what="job start or exit record")
        assert not marker.exists(), f"the job ran after stop said {report.message!r}"
        record = run.exit_record()
        assert record is not None and record.get("stopped_by_request"), record
        assert sup.job_state("svc").state == "stopped"
        assert runner.wait(timeout=30) == 0
    finally:
        runner.kill()
        runner.wait(timeout=10)


def test_foreign_stop_never_signals_a_member_pid_that_was_reused(tmp_path):
    from gpudeck.jobs.engines.pivot import PlannedStop, stop_foreign
    root = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"])
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"])
    try:
        root_time = psutil.Process(root.pid).create_time()
        # The plan saw a member with the bystander's PID, but an earlier process: the PID was reused since.
        stop = PlannedStop(kind="foreign", pid=root.pid, engine="vllm", cmdline="vllm serve", gpu_mem=None,
                           port=None, create_time=root_time,
                           members=((root.pid, "vllm"), (bystander.pid, "VLLM::Worker")),
                           member_create_times=((root.pid, root_time),
                                                (bystander.pid, root_time - 1000.0)))
        ok, detail = stop_foreign(stop, grace_s=5)
        assert root.wait(timeout=10) is not None
        time.sleep(0.2)
        assert bystander.poll() is None, f"a reused PID was signalled ({detail})"
    finally:
        for p in (root, bystander):
            p.kill()
            p.wait(timeout=10)


def test_foreign_stop_without_member_times_leaves_unverifiable_members_alone(tmp_path):
    from gpudeck.jobs.engines.pivot import PlannedStop, stop_foreign
    root = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"])
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"])
    try:
        root.kill()
        root.wait(timeout=10)
        # The root is gone; nothing proves the remaining member PID is still the engine's.
        stop = PlannedStop(kind="foreign", pid=root.pid, engine="vllm", cmdline="vllm serve", gpu_mem=None,
                           port=None, create_time=time.time() - 50,
                           members=((root.pid, "vllm"), (bystander.pid, "VLLM::Worker")))
        stop_foreign(stop, grace_s=2)
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_start_at_once_followed_by_stop_leaves_nothing_running(tmp_path, state):
    marker = tmp_path / "ran"
    sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml",
                                          {"svc": {"cmd": f"echo x >> {marker}; exec sleep 300"}})))
    for _ in range(3):
        sup.start("svc")
        report = sup.stop("svc")
        run = latest_run("svc")
        wait_for(lambda: run.exit_record(), timeout=30, what="exit record")
        assert sup.job_state("svc").state == "stopped", report.message
        assert not [st for st in procs.tagged(run.run_id)], report.message


def test_health_json_with_wrong_typed_fields_does_not_crash_the_jobs_table(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "echo hi"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "quick"], env).returncode == 0
    run = latest_run("quick")
    wait_for(lambda: run.exit_record(), what="exit record")
    for bad in ({"phase": 5, "alerts": "x", "progress": "y", "failure": 3},
                {"alerts": [1, "x"], "progress": ["z"], "serving": 2}):
        (run.path / "health.json").write_text(json.dumps(bad))
        done = cli(["--jobs", str(jobs), "jobs"], env)
        assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr.decode()


def test_two_clis_starting_the_same_job_at_once_start_it_once(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}})
    env = cli_env(state)
    for attempt in range(12):
        clis = [subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "start", "svc"], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
        codes = [p.wait(timeout=60) for p in clis]
        for p in clis:
            p.stdout.close()
            p.stderr.close()
        live = [r for r in __import__("gpudeck.jobs.runs").jobs.runs.list_runs("svc")
                if r.state().state in ("starting", "running")]
        assert codes.count(0) == 1 and len(live) == 1, (attempt, codes, live)
        Supervisor(load_jobs(jobs)).stop("svc", timeout=5)


def test_two_clis_running_the_same_pipeline_at_once_start_one_pipeline(tmp_path, state):
    from gpudeck.jobs.pipeline_records import list_pipelines
    jobs = write_jobs(tmp_path / "jobs.toml", {"first": {"cmd": "sleep 300"},
                                                "second": {"cmd": "true", "needs": ["first"]}})
    env = cli_env(state)
    for attempt in range(6):
        clis = [subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "run", "second"], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
        codes = [p.wait(timeout=60) for p in clis]
        for p in clis:
            p.stdout.close()
            p.stderr.close()
        running = [p for p in list_pipelines("second", state) if p.state() == "running"]
        assert codes.count(0) == 1 and len(running) == 1, (attempt, codes, running)
        cli(["--jobs", str(jobs), "stop", "second"], env)
        cli(["--jobs", str(jobs), "stop", "first"], env)
        wait_for(lambda: all(p.state() != "running" for p in list_pipelines("second", state)),
                 timeout=30, what="the pipeline to end")
