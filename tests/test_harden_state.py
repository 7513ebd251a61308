"""Issue 9, state dir: private modes whatever the umask, foreign/writable dirs refused, no symlink followed, no unproven PID signalled."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time

from gpudeck.jobs import procs
from gpudeck.jobs.runs import latest_run

from runsupport import PY, REPO, cli, cli_env, pid_alive, wait_for, write_jobs


def _cli_umask(args, env, mask):
    return subprocess.run([PY, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=env, capture_output=True,
                          timeout=60, preexec_fn=lambda: os.umask(mask))


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_state_dir_0700_and_files_0600_under_umask_000(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "echo hi; sleep 1.5"}})
    env = cli_env(state)
    done = _cli_umask(["--jobs", str(jobs), "start", "quick"], env, 0)
    assert done.returncode == 0, done.stderr
    run = latest_run("quick", state)
    wait_for(lambda: run.exit_record(), what="exit record")
    wait_for(lambda: (run.path / "health.json").exists(), what="health.json")
    runner = run.runner_id()
    wait_for(lambda: not procs.alive(runner), what="the runner to finish")
    for d in (state, state / "runs", state / "runs" / "quick", run.path):
        assert _mode(d) == 0o700, (d, oct(_mode(d)))
    files = [p for p in run.path.iterdir()] + [state / "runs" / "quick" / ".start.lock"]
    assert {p.name for p in files} >= {"meta.json", "output.log", "events.jsonl", "exit.json", "times",
                                        "samples.jsonl", "health.json", "runner.log"}
    for f in files:
        assert _mode(f) == 0o600, (f.name, oct(_mode(f)))
    # And everything else gpudeck keeps there (the run index, its WAL, pipelines...).
    for root, dirs, names in os.walk(state):
        for d in dirs:
            assert _mode(os.path.join(root, d)) == 0o700, os.path.join(root, d)
        for n in names:
            assert _mode(os.path.join(root, n)) == 0o600, os.path.join(root, n)


def test_foreign_owned_or_group_writable_dirs_are_refused_in_one_line(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "echo hi"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "quick"], env).returncode == 0
    run = latest_run("quick", state)
    wait_for(lambda: run.exit_record(), what="exit record")
    cases = [
        (run.path, lambda p: os.chown(p, 65534, 65534), lambda p: os.chown(p, 0, 0)),
        (state / "runs" / "quick", lambda p: os.chown(p, 65534, 65534), lambda p: os.chown(p, 0, 0)),
        (state, lambda p: os.chmod(p, 0o777), lambda p: os.chmod(p, 0o700)),
        (run.path, lambda p: os.chmod(p, 0o770), lambda p: os.chmod(p, 0o700)),
    ]
    for path, spoil, fix in cases:
        spoil(path)
        try:
            for command in (["jobs"], ["stop", "quick"], ["start", "quick"], ["logs", "quick"]):
                done = cli(["--jobs", str(jobs), *command], env)
                err = done.stderr.decode()
                assert done.returncode == 2, (path, command, done.returncode, err)
                assert err.startswith("gpudeck: ") and err.count("\n") == 1 and "refusing" in err, err
        finally:
            fix(path)
    assert cli(["--jobs", str(jobs), "jobs"], env).returncode == 0


def test_planted_symlinks_in_a_run_dir_are_never_written_through(tmp_path, state):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode == 0
    run = latest_run("svc", state)
    runner = wait_for(lambda: run.runner_id(), what="runner pid")
    wait_for(lambda: run.state().state == "running", what="running")
    # The runner writes exit.json through .exit.json.<its pid>.tmp; samples.jsonl every second.
    (run.path / f".exit.json.{runner.pid}.tmp").symlink_to(victim)
    (run.path / "samples.jsonl").unlink(missing_ok=True)
    (run.path / "samples.jsonl").symlink_to(victim)
    time.sleep(1.5)              # a few runner ticks that would append to the link
    done = cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "5"], env)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    record = wait_for(lambda: run.exit_record(), what="exit record")
    assert record["stopped_by_request"] is True


def test_stop_never_signals_a_pid_from_meta_json_it_cannot_prove(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode == 0
    run = latest_run("svc", state)
    wait_for(lambda: run.state().state == "running", what="running")
    for ident in (run.runner_id(), run.job_id()):
        procs.signal_process(ident, signal.SIGKILL)
    wait_for(lambda: run.state().state == "lost", what="lost")
    # Someone rewrote meta.json to name an unrelated process tree (its own session, no tag).
    victim = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300; wait"], start_new_session=True,
                              env={"PATH": os.environ["PATH"]})
    try:
        child = wait_for(lambda: [st for st in procs.all_stats().values() if st.ppid == victim.pid],
                         what="victim's child")[0]
        ident = procs.identity(victim.pid)
        meta = json.loads(run.meta_path.read_text())
        meta.update(job_process=ident.to_jsonable(), runner=ident.to_jsonable(), pgid=victim.pid)
        run.meta_path.write_text(json.dumps(meta))
        done = cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "2"], env)
        assert "Traceback" not in done.stderr.decode()
        time.sleep(0.5)
        assert pid_alive(victim.pid) and pid_alive(child.pid), "stop signalled a process it could not prove"
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_stop_never_signals_a_pid_from_a_pipeline_record_it_cannot_prove(tmp_path, state):
    from gpudeck.jobs.pipeline import stop_pipeline
    from gpudeck.jobs.pipeline_records import list_pipelines
    jobs = write_jobs(tmp_path / "jobs.toml", {"a": {"cmd": "sleep 300"}, "b": {"cmd": "sleep 300", "needs": "a"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "run", "b"], env).returncode == 0
    pipe = wait_for(lambda: list_pipelines("b", state), what="pipeline record")[0]
    real = wait_for(lambda: pipe.process(), what="pipeline process")
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        meta = json.loads((pipe.path / "meta.json").read_text())
        meta["process"] = procs.identity(victim.pid).to_jsonable()
        (pipe.path / "meta.json").write_text(json.dumps(meta))
        assert stop_pipeline(pipe) is False
        done = cli(["--jobs", str(jobs), "stop", "b", "--timeout", "2"], env)
        assert "Traceback" not in done.stderr.decode()
        time.sleep(0.3)
        assert pid_alive(victim.pid), "a pid from the pipeline's meta.json was signalled unproven"
    finally:
        victim.kill()
        victim.wait()
        procs.signal_process(real, signal.SIGKILL)
