"""Pipelines on real processes: dependency order, done_when skips, first failure stops, advancing with no CLI attached."""
from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from gpudeck.jobs.pipeline import PipelineError, plan, start_pipeline
from gpudeck.jobs.pipeline_records import latest_pipeline
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.spec import JobSpec, JobsFile, load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import PY, cli, cli_env, toml_str, wait_for, write_jobs


def stage_jobs(tmp_path: Path, fail: str | None = None, slow: float = 0.0) -> dict:
    log = tmp_path / "order.txt"

    def cmd(name: str) -> str:
        body = f"sleep {slow}; echo {name} >> {log}"
        return body + ("; exit 5" if name == fail else "")

    return {
        "data": {"cmd": cmd("data"), "done_when": str(tmp_path / "data.done")},
        "extract": {"cmd": cmd("extract"), "needs": ["data"]},
        "unrelated": {"cmd": cmd("unrelated")},
        "train": {"cmd": cmd("train"), "needs": ["extract", "data"]},
        "bench": {"cmd": cmd("bench"), "needs": ["train"]},
    }


def order(tmp_path: Path) -> list[str]:
    path = tmp_path / "order.txt"
    return path.read_text().split() if path.exists() else []


def test_plan_is_dependency_order_and_rejects_cycles():
    jf = JobsFile(path=Path("jobs.toml"), jobs={
        "a": JobSpec(name="a", cmd="true"),
        "b": JobSpec(name="b", cmd="true", needs=("a",)),
        "c": JobSpec(name="c", cmd="true", needs=("b", "a")),
        "x": JobSpec(name="x", cmd="true", needs=("y",)),
        "y": JobSpec(name="y", cmd="true", needs=("x",)),
    })
    assert plan(jf, "c") == ["a", "b", "c"]
    assert plan(jf, "a") == ["a"]
    with pytest.raises(PipelineError, match="cycle"):
        plan(jf, "x")
    with pytest.raises(PipelineError):
        plan(jf, "missing")


def test_run_returns_at_once_and_the_pipeline_advances_with_no_cli(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", stage_jobs(tmp_path, slow=0.3))
    env = cli_env(state)
    t0 = time.monotonic()
    out = cli(["--jobs", str(jobs), "run", "bench"], env)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 3.0
    assert "data -> extract -> train -> bench" in out.stdout.decode()
    # No CLI is attached from here on: the detached pipeline carries on alone.
    wait_for(lambda: order(tmp_path) == ["data", "extract", "train", "bench"], timeout=60,
             what="all four stages")
    pipe = latest_pipeline("bench", state)
    wait_for(lambda: pipe.state() == "succeeded", what="pipeline result")
    payload = pipe.to_jsonable()
    assert [s["status"] for s in payload["stages"]] == ["succeeded"] * 4
    assert all(s["run_id"] for s in payload["stages"])
    assert latest_run("unrelated") is None


def test_done_stages_are_skipped(tmp_path, state):
    (tmp_path / "data.done").write_text("ok")
    sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", stage_jobs(tmp_path))))
    pipe = start_pipeline(sup, "train")
    wait_for(lambda: pipe.state() != "running", timeout=60, what="pipeline end")
    assert pipe.state() == "succeeded"
    assert order(tmp_path) == ["extract", "train"]
    assert latest_run("data") is None
    statuses = {s["name"]: s["status"] for s in pipe.to_jsonable()["stages"]}
    assert statuses == {"data": "skipped", "extract": "succeeded", "train": "succeeded"}


def test_first_failure_stops_and_wait_names_the_stage(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", stage_jobs(tmp_path, fail="extract"))
    env = cli_env(state)
    out = cli(["--jobs", str(jobs), "run", "bench", "--wait"], env, timeout=120)
    err = out.stderr.decode()
    assert out.returncode == 1
    assert "failed at stage extract" in err and "exit 5" in err and err.count("\n") == 1
    assert order(tmp_path) == ["data", "extract"]
    assert latest_run("train") is None and latest_run("bench") is None
    text = out.stdout.decode()
    assert "data: succeeded" in text and "extract: failed (exit 5)" in text


def test_run_wait_success_exits_zero(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", stage_jobs(tmp_path))
    out = cli(["--jobs", str(jobs), "run", "train", "--wait"], cli_env(state), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines()[-1].endswith("succeeded")
    assert order(tmp_path) == ["data", "extract", "train"]


def test_stopping_the_target_stops_a_running_pipeline(tmp_path, state):
    jobs_dict = stage_jobs(tmp_path)
    jobs_dict["extract"]["cmd"] = "echo extract-started; sleep 300"
    jobs_dict["extract"]["stop_timeout"] = 2
    jobs = write_jobs(tmp_path / "jobs.toml", jobs_dict)
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "run", "bench"], env).returncode == 0
    wait_for(lambda: (r := latest_run("extract")) and b"extract-started" in r.log_path.read_bytes(),
             timeout=60, what="the long stage")
    out = cli(["--jobs", str(jobs), "stop", "bench"], env)
    assert out.returncode == 0, out.stderr
    pipe = latest_pipeline("bench", state)
    wait_for(lambda: pipe.state() != "running", timeout=60, what="pipeline to stop")
    assert pipe.state() == "stopped"
    assert latest_run("extract").exit_record()["stopped_by_request"] is True
    assert latest_run("train") is None


@pytest.mark.parametrize("where", ["top-level", "[alerts]"])
def test_stages_keep_the_file_wide_settings(tmp_path, state, where):
    # A pipeline rebuilds its jobs file from what it recorded: the default on_alert was lost there
    # (the stage run's meta.json said "on_alert": null, and a crashing stage paged nobody).
    out = tmp_path / "paged.txt"
    hook = f'echo "$GPUDECK_ALERT_JOB $GPUDECK_ALERT_CODE ${{who}}" >> {out}'
    crash = "import sys; sys.stderr.write('Traceback (most recent call last):\\nRuntimeError: boom\\n'); sys.exit(1)"
    path = tmp_path / "jobs.toml"
    setting = f"on_alert = {toml_str(hook)}\n"
    path.write_text((setting if where == "top-level" else "") + '[vars]\nwho = "ops"\n'
                    + ("" if where == "top-level" else "[alerts]\n" + setting)
                    + f'[jobs.prep]\ncmd = "true"\n'
                    + f'[jobs.train]\ncmd = {toml_str(f"{PY} -c {shlex.quote(crash)}")}\nneeds = ["prep"]\n')
    sup = Supervisor(load_jobs(path))
    assert sup.jobs_file.on_alert == hook.replace("${who}", "ops")
    pipe = start_pipeline(sup, "train")
    wait_for(lambda: pipe.state() != "running", timeout=60, what="pipeline end")
    assert pipe.state() == "failed"
    for stage in ("prep", "train"):
        assert latest_run(stage).meta()["on_alert"] == sup.jobs_file.on_alert, stage
    text = wait_for(lambda: out.exists() and out.read_text(), what="the file-wide on_alert to fire")
    assert text.splitlines()[0] == "train crashed ops", text


def test_a_pipeline_record_keeps_every_file_wide_field():
    from dataclasses import fields
    import json
    from gpudeck.jobs.spec import file_settings, jobs_file_from_snapshot
    jf = JobsFile(path=Path("/x/jobs.toml"), jobs={"a": JobSpec(name="a", cmd="true")}, vars={"v": "1"},
                  on_alert="page")
    settings = json.loads(json.dumps(file_settings(jf)))
    assert set(settings) == {f.name for f in fields(JobsFile)} - {"path", "jobs"}
    assert jobs_file_from_snapshot(jf.path, jf.jobs, settings) == jf
