"""Slurm jobs end to end on a real single-node cluster: a three-stage pipeline queued with dependencies, a stop of a
job that ignores SIGTERM, OUT_OF_MEMORY, TIMEOUT — each read by `jobs`, `analyze`, `runs` and `postmortem` as
Slurm reported it.

The time-limit job takes Slurm's minimum (1 minute), so it is submitted first (a session fixture) and judged at the
end of the session (marker `late`): the other tests, of this file and of the rest of the suite, run while it waits
for its limit.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from runsupport import cli, cli_env, pid_alive, wait_for, write_jobs

pytestmark = pytest.mark.slow


def gd(jobs: Path, env: dict, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return cli(["--jobs", str(jobs), *args], env=env, timeout=timeout, text=True)


def jobs_json(jobs: Path, env: dict) -> dict:
    done = gd(jobs, env, "jobs", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def job(jobs: Path, env: dict, name: str) -> dict:
    return next(j for j in jobs_json(jobs, env)["jobs"] if j["name"] == name)


def wait_state(jobs: Path, env: dict, name: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    seen: dict = {}

    def reached():
        seen.update(job(jobs, env, name))
        return seen if seen["state"] in states else None

    try:
        return wait_for(reached, timeout=timeout, interval=0.5, what=f"{name} in {states}")
    except AssertionError:
        raise AssertionError(f"{name} never reached {states}; last: {json.dumps(seen)[:600]}") from None


def run_dir(state: Path, name: str, run_id: str) -> Path:
    return state / "runs" / name / run_id


def analyze(path: Path, env: dict) -> dict:
    done = cli(["analyze", str(path), "--json"], env=env, timeout=60, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def history(jobs: Path, env: dict, name: str) -> dict:
    """The run index's row for the job's newest run (what the post-mortem reads)."""
    done = gd(jobs, env, "runs", name, "--json")
    assert done.returncode == 0, done.stderr
    rows = [r for r in json.loads(done.stdout)["runs"] if r.get("kind", "job") == "job"]
    return rows[0]


def postmortem(jobs: Path, env: dict, name: str) -> dict:
    done = gd(jobs, env, "postmortem", name, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def squeue_field(job_id: str, fmt: str, env: dict) -> str:
    return subprocess.run(["squeue", "-h", "--states=all", "-j", job_id, "-o", fmt], env=env, capture_output=True,
                          text=True, timeout=30).stdout.strip()


def sacct_state(job_id: str, env: dict) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "--parsable2", "-j", job_id, "-o", "State"], env=env,
                         capture_output=True, text=True, timeout=30).stdout.split()
    return out[0] if out else ""


@pytest.fixture(scope="session")
def timeout_job(slurm_cluster, tmp_path_factory):
    """A job past its 1-minute limit, submitted before the other tests so they run while it waits."""
    base = tmp_path_factory.mktemp("slurm-timeout")
    state = base / "state"
    env = cli_env(state)
    jobs = write_jobs(base / "jobs.toml", {
        "slowpoke": {"cmd": "echo working; sleep 600", "backend": "slurm", "partition": "gpu", "time": 1},
    })
    started = gd(jobs, env, "start", "slowpoke")
    assert started.returncode == 0, started.stderr
    yield jobs, env, state, started.stdout.strip()
    cancel_all(state, env)


def cancel_all(state: Path, env: dict) -> None:
    """scancel every Slurm job submitted under `state`, by id: other sessions may share the cluster."""
    for meta in state.glob("runs/*/*/meta.json"):
        job_id = json.loads(meta.read_text()).get("slurm_job_id")
        if job_id:
            subprocess.run(["scancel", str(job_id)], env=env, capture_output=True, timeout=30)


@pytest.fixture
def slurm_env(slurm_cluster, state, timeout_job):
    """A private state dir; every Slurm job submitted under it is cancelled afterwards."""
    env = cli_env(state)
    yield env
    cancel_all(state, env)


def test_slurm_keys_are_checked_with_their_location(slurm_env, tmp_path):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.a]\ncmd = "true"\nbackend = "slurm"\ntime = "soon"\n'
                    'sbatch_args = ["--output=x.log"]\n\n[jobs.b]\ncmd = "true"\npartition = "gpu"\n')
    done = gd(jobs, slurm_env, "check")
    assert done.returncode != 0
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith(f"{jobs}:4:8: time: bad time limit 'soon'") for line in lines), lines
    assert any(line.startswith(f"{jobs}:5:16: sbatch_args: gpudeck sets --output itself") for line in lines), lines
    assert any(line.startswith(f"{jobs}:9:1: partition is a Slurm setting") for line in lines), lines


def test_pipeline_queued_at_once_with_dependencies(slurm_cluster, slurm_env, state, tmp_path):
    (tmp_path / "out").mkdir()
    stages = {
        "prep": {"cmd": "echo prep; sleep 1; touch out/prep.done", "backend": "slurm", "partition": "gpu",
                 "done_when": "out/prep.done"},
        "train": {"cmd": "for i in 1 2 3; do echo \"epoch $i/3\"; sleep 1; done; echo CVD=$CUDA_VISIBLE_DEVICES",
                  "backend": "slurm", "needs": ["prep"], "gpus_per_node": 2, "time": "5m"},
        "eval": {"cmd": "test -f out/prep.done && echo evaluated", "backend": "slurm", "needs": ["train"]},
    }
    jobs = write_jobs(tmp_path / "jobs.toml", stages)
    done = gd(jobs, slurm_env, "run", "eval")
    assert done.returncode == 0, done.stderr

    def all_queued():
        pipes = jobs_json(jobs, slurm_env)["pipelines"]
        stages_seen = pipes[0]["stages"] if pipes else []
        return stages_seen if len(stages_seen) == 3 and all(s["run_id"] for s in stages_seen) else None

    wait_for(all_queued, timeout=30, interval=0.3, what="three stages handed to Slurm")
    ids = {j["name"]: j["slurm"]["job_id"] for j in jobs_json(jobs, slurm_env)["jobs"]}
    # Slurm holds the order itself: nothing of gpudeck has to be alive for it to advance.
    assert squeue_field(ids["train"], "%E", slurm_env) in (f"afterok:{ids['prep']}(unfulfilled)",
                                                          f"afterok:{ids['prep']}(failed)", "(null)")
    assert f"afterok:{ids['train']}" in squeue_field(ids["eval"], "%E", slurm_env) or \
        squeue_field(ids["eval"], "%T", slurm_env) in ("RUNNING", "COMPLETED")

    final = wait_state(jobs, slurm_env, "eval", ("exited", "stopped", "lost"), timeout=90)
    assert final["slurm"]["state"] == "COMPLETED" and final["exit_code"] == 0, final
    payload = jobs_json(jobs, slurm_env)
    by_name = {j["name"]: j for j in payload["jobs"]}
    for name in ("prep", "train", "eval"):
        assert by_name[name]["state"] == "exited" and by_name[name]["slurm"]["state"] == "COMPLETED", by_name[name]
    assert [s["status"] for s in payload["pipelines"][0]["stages"]] == ["succeeded"] * 3
    assert payload["pipelines"][0]["state"] == "succeeded"
    train_dir = run_dir(state, "train", by_name["train"]["run_id"])
    meta = json.loads((train_dir / "meta.json").read_text())
    assert meta["backend"] == "slurm" and meta["slurm_job_id"] == ids["train"]
    if slurm_cluster.gpu_files:
        assert (train_dir / "output.log").read_text().splitlines()[-1] == "CVD=0,1"     # Slurm gave it 2 GPUs
    assert by_name["train"]["progress"]["done"] == 3 and by_name["train"]["progress"]["total"] == 3
    found = analyze(train_dir / "output.log", slurm_env)
    assert found["failure"] is None and found["progress"]["done"] == 3
    row = history(jobs, slurm_env, "train")
    assert row["backend"] == "slurm" and row["exit_code"] == 0 and not row["failed"]
    logs = gd(jobs, slurm_env, "logs", "eval")
    assert logs.stdout.strip() == "evaluated"

    # Again, with prep done (its done_when exists) and train failing: prep is skipped, train is
    # queued with no dependency, and Slurm itself cancels eval when train fails.
    stages["train"]["cmd"] = "echo 'RuntimeError: bad batch'; exit 3"
    write_jobs(jobs, stages)
    done = gd(jobs, slurm_env, "run", "eval")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: jobs_json(jobs, slurm_env)["pipelines"][0]["state"] == "failed", timeout=90, interval=0.5,
             what="the pipeline to fail at train")
    payload = jobs_json(jobs, slurm_env)
    pipe = payload["pipelines"][0]
    assert [s["status"] for s in pipe["stages"]] == ["skipped", "failed", "failed"] and pipe["failed_stage"] == "train"
    by_name = {j["name"]: j for j in payload["jobs"]}
    assert by_name["train"]["slurm"]["state"] == "FAILED" and by_name["train"]["exit_code"] == 3
    assert by_name["eval"]["slurm"]["state"] == "CANCELLED"
    assert by_name["eval"]["slurm"]["reason"] == "DependencyNeverSatisfied"
    assert by_name["prep"]["run_id"] == meta_run(state, "prep")       # not run again
    row = history(jobs, slurm_env, "train")
    assert row["failed"] and row["exit_code"] == 3
    report = postmortem(jobs, slurm_env, "train")
    assert report["outcome"]["slurm"]["state"] == "FAILED" and report["outcome"]["exit_code"] == 3
    assert report["failure"]["cause"] == "exception" and "bad batch" in report["failure"]["message"]
    report = postmortem(jobs, slurm_env, "eval")
    assert report["outcome"]["slurm"] == {"job_id": by_name["eval"]["slurm"]["job_id"], "state": "CANCELLED",
                                          "reason": "DependencyNeverSatisfied", "nodes": None}


def meta_run(state: Path, name: str) -> str:
    return sorted(p.name for p in (state / "runs" / name).iterdir() if p.is_dir())[-1]


def test_stop_a_job_that_ignores_sigterm(slurm_env, state, tmp_path):
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "stubborn": {"cmd": "trap 'echo got TERM, ignoring' TERM; echo ready; while true; do sleep 0.2; done",
                     "backend": "slurm", "stop_timeout": 2},
    })
    assert gd(jobs, slurm_env, "start", "stubborn").returncode == 0
    running = wait_state(jobs, slurm_env, "stubborn", ("running",), timeout=60)
    assert running["slurm"]["state"] == "RUNNING" and running["slurm"]["nodes"]
    log = run_dir(state, "stubborn", running["run_id"]) / "output.log"
    wait_for(lambda: "ready" in log.read_text(), timeout=30, what="the job to start its loop")
    stopped = gd(jobs, slurm_env, "stop", "stubborn", "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = json.loads(stopped.stdout)
    assert report["signal"] == "SIGTERM" and report["escalated"] is True and report["clean"] is True
    assert report["slurm_state"] == "CANCELLED" and report["slurm_final"] is True
    assert "got TERM, ignoring" in log.read_text()            # the stop signal reached the job itself
    job_id = running["slurm"]["job_id"]
    assert sacct_state(job_id, slurm_env) == "CANCELLED"
    assert squeue_field(job_id, "%T", slurm_env) in ("", "CANCELLED")
    after = job(jobs, slurm_env, "stubborn")
    assert after["state"] == "stopped" and after["slurm"]["state"] == "CANCELLED"
    assert analyze(log, slurm_env)["failure"] is None         # a requested cancel is not a failure
    row = history(jobs, slurm_env, "stubborn")
    assert row["state"] == "stopped" and not row["failed"]
    report = postmortem(jobs, slurm_env, "stubborn")
    assert report["outcome"]["state"] == "stopped" and report["outcome"]["slurm"]["state"] == "CANCELLED"
    assert report["verdict"].startswith("stopped by")
    events = [json.loads(line)["event"] for line in (log.parent / "events.jsonl").read_text().splitlines()]
    assert events.index("StopRequested") < events.index("StopEscalated") < events.index("JobExited")


def test_out_of_memory(slurm_cluster, slurm_env, state, tmp_path):
    hog = ("import time\nchunks = []\nfor i in range(60):\n    chunks.append(bytearray(10 * 2**20))\n"
           "    print(f'allocated {10 * (i + 1)} MiB', flush=True)\n    time.sleep(0.05)\n")
    (tmp_path / "hog.py").write_text(hog)
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "hog": {"cmd": "python3 hog.py", "backend": "slurm", "sbatch_args": ["--mem=60M"]},
    })
    assert gd(jobs, slurm_env, "start", "hog").returncode == 0
    final = wait_state(jobs, slurm_env, "hog", ("exited", "stopped", "lost"), timeout=90)
    oom = slurm_cluster.oom_state      # OUT_OF_MEMORY with a memory cgroup; FAILED where Slurm polls RSS
    assert final["state"] == "exited" and final["slurm"]["state"] == oom, final
    assert final["exit_code"] != 0
    log = run_dir(state, "hog", final["run_id"]) / "output.log"
    found = analyze(log, slurm_env)
    assert found["failure"]["cause"] == "host_oom" and "--mem" in found["failure"]["hint"], found["failure"]
    assert final["failure"]["cause"] == "host_oom"
    row = history(jobs, slurm_env, "hog")
    assert row["failed"] and row["failure_cause"] == "host_oom"
    record = json.loads((log.parent / "exit.json").read_text())
    assert record["slurm_state"] == oom and (oom != "OUT_OF_MEMORY" or "memory" in record["note"])
    # Without accounting (no slurmdbd), slurmctld's own record gives the same end.
    from gpudeck.jobs import slurm
    job_id = final["slurm"]["job_id"]
    kept = slurm.scontrol_job(job_id)
    assert kept is not None and kept.state == oom
    without = slurm.exit_record(job_id, kept.state, kept, stopped=False)
    assert (without["exit_code"], without["signal"]) == (record["exit_code"], record["signal"]) == (137, "SIGKILL")
    report = postmortem(jobs, slurm_env, "hog")
    assert report["outcome"]["slurm"]["state"] == oom and report["failure"]["cause"] == "host_oom"
    assert "--mem" in report["verdict"]


def test_dead_watcher_is_replaced_and_a_queued_pipeline_stops(slurm_env, state, tmp_path):
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "first": {"cmd": "echo started; sleep 120", "backend": "slurm", "stop_timeout": 5},
        "second": {"cmd": "echo never", "backend": "slurm", "needs": ["first"]},
    })
    assert gd(jobs, slurm_env, "run", "second").returncode == 0
    first = wait_state(jobs, slurm_env, "first", ("running",), timeout=60)
    meta_path = run_dir(state, "first", first["run_id"]) / "meta.json"
    watcher = json.loads(meta_path.read_text())["runner"]
    os.kill(watcher["pid"], signal.SIGKILL)          # the watcher dies; the job is Slurm's and runs on
    wait_for(lambda: not pid_alive(watcher["pid"]), timeout=10, what="the watcher to die")
    again = job(jobs, slurm_env, "first")            # a reader re-attaches: a new watcher follows the run
    assert again["state"] == "running" and again["slurm"]["state"] == "RUNNING", again
    new = json.loads(meta_path.read_text())["runner"]
    assert new["pid"] != watcher["pid"] and pid_alive(new["pid"])
    second = job(jobs, slurm_env, "second")
    assert second["state"] == "starting" and second["slurm"]["reason"] == "Dependency"
    done = gd(jobs, slurm_env, "stop", "second")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: jobs_json(jobs, slurm_env)["pipelines"][0]["state"] == "stopped", timeout=60, interval=0.5,
             what="the pipeline to stop")
    by_name = {j["name"]: j for j in jobs_json(jobs, slurm_env)["jobs"]}
    assert by_name["second"]["state"] == "stopped" and by_name["second"]["slurm"]["state"] == "CANCELLED"
    assert by_name["first"]["state"] == "stopped", by_name["first"]      # the pipeline stopped its live stage
    assert sacct_state(by_name["first"]["slurm"]["job_id"], slurm_env) in ("FAILED", "CANCELLED")


def test_status_shows_the_partition(slurm_env, tmp_path):
    jobs = write_jobs(tmp_path / "jobs.toml", {"t": {"cmd": "true", "backend": "slurm", "partition": "gpu"}})
    done = gd(jobs, slurm_env, "status", "--json", "--interval", "0")
    assert done.returncode == 0, done.stderr
    slurm = json.loads(done.stdout)["slurm"]
    assert slurm["error"] is None and slurm["partitions"] == ["gpu"] and slurm["gpus"] == 4
    assert [n["cpus"] for n in slurm["nodes"]] == [8]
    text = gd(jobs, slurm_env, "status", "--interval", "0").stdout
    assert "slurm partition gpu: 1 node, GPUs " in text


def test_sbatch_refusal_is_one_line(slurm_env, tmp_path):
    jobs = write_jobs(tmp_path / "jobs.toml", {"t": {"cmd": "true", "backend": "slurm", "partition": "nosuch"}})
    done = gd(jobs, slurm_env, "start", "t")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudeck: t: not submitted: sbatch: error: "), lines
    assert "sbatch: sbatch:" not in lines[0] and "partition" in lines[0].lower()
    # Recorded as a failed run, the submission error its cause: not "finished OK", not a plain "exited".
    row = history(jobs, slurm_env, "t")
    assert row["failed"] and row["failure_cause"] == "not_submitted", row
    assert "Invalid partition" in row["failure_message"]
    failed = gd(jobs, slurm_env, "runs", "--failed")
    assert "✗" in failed.stdout and "not submitted" in failed.stdout, failed.stdout
    report = postmortem(jobs, slurm_env, "t")
    assert report["outcome"]["failed"] and "finished OK" not in report["verdict"]
    assert report["verdict"].startswith("never ran; not submitted: sbatch: error: "), report["verdict"]


def test_sbatch_output_paths_are_escaped_or_refused():
    from gpudeck.jobs.slurm import SlurmError, sbatch_filename
    assert sbatch_filename("/s/run%j/%%/output.log") == "/s/run%%j/%%%%/output.log"
    with pytest.raises(SlurmError, match="backslash"):
        sbatch_filename("/s/a\\b/output.log")


def test_a_state_dir_with_percent_signs_keeps_its_log(slurm_cluster, tmp_path):
    # sbatch --output expands %j, %x, %N...: unescaped, this log would land in "run%123x/..." or nowhere.
    state = tmp_path / "state%j%x%%"
    env = cli_env(state)
    jobs = write_jobs(tmp_path / "jobs.toml", {"pct": {"cmd": "echo percent-safe", "backend": "slurm",
                                                       "partition": "gpu"}})
    try:
        started = gd(jobs, env, "start", "pct")
        assert started.returncode == 0, started.stderr
        final = wait_state(jobs, env, "pct", ("exited", "stopped", "lost"), timeout=90)
        assert final["state"] == "exited" and final["slurm"]["state"] == "COMPLETED", final
        log = run_dir(state, "pct", started.stdout.strip()) / "output.log"
        assert log.read_text() == "percent-safe\n"
        assert gd(jobs, env, "logs", "pct").stdout == "percent-safe\n"
    finally:
        cancel_all(state, env)


@pytest.mark.late
def test_time_limit(timeout_job):
    jobs, env, state, run_id = timeout_job
    final = wait_state(jobs, env, "slowpoke", ("exited", "stopped", "lost"), timeout=180)
    assert final["state"] == "exited" and final["slurm"]["state"] == "TIMEOUT", final
    assert final["exit_code"] != 0
    log = run_dir(state, "slowpoke", run_id) / "output.log"
    assert log.read_text().startswith("working\n")
    found = analyze(log, env)
    assert found["failure"]["cause"] == "time_limit" and "time" in found["failure"]["hint"]
    row = history(jobs, env, "slowpoke")
    assert row["failed"] and row["failure_cause"] == "time_limit"
    report = postmortem(jobs, env, "slowpoke")
    assert report["outcome"]["slurm"]["state"] == "TIMEOUT" and report["failure"]["cause"] == "time_limit"
    assert "time limit" in report["verdict"]
