"""The Box seam without SSH: the request table against the interface, checked parameters, results that round-trip,
the agent answering through a real LocalBox, and docs/BOX.md generated from the interface."""
from __future__ import annotations

import inspect
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeck.jobs.box import Box, BoxError, results
from gpudeck.jobs.box.local import LocalBox
from gpudeck.jobs.box.remote import RemoteBox
from gpudeck.jobs.box.serve import OPS, answer
from gpudeck.jobs.hosts.agent import Agent

from runsupport import wait_for, write_jobs

REPO = Path(__file__).resolve().parent.parent


def test_every_request_names_a_box_method_with_its_parameters():
    for op, (method, params, positional) in OPS.items():
        target = getattr(LocalBox, method)
        accepted = set(inspect.signature(target).parameters) - {"self"}
        for wire, (keyword, _) in params.items():
            assert keyword in accepted, f"{op}: {keyword} is no parameter of LocalBox.{method}"
        assert set(positional) <= set(params), op


def test_both_boxes_implement_the_whole_interface():
    abstract = {name for name, m in vars(Box).items() if getattr(m, "__isabstractmethod__", False)}
    assert {"status", "jobs", "start", "stop", "read_log", "runs", "postmortem", "run_record", "pivot"} <= abstract
    for cls in (LocalBox, RemoteBox):
        assert not cls.__abstractmethods__, (cls.__name__, cls.__abstractmethods__)
        for name in abstract:
            mine, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(Box, name))
            assert list(mine.parameters) == list(theirs.parameters), (cls.__name__, name)


@pytest.mark.parametrize("op,params,what", [
    ("start", {}, "start needs job"),
    ("start", {"job": 7}, "job must be a non-empty string"),
    ("logs", {"job": "x", "offset": "12"}, "offset must be an integer"),
    ("logs", {"job": "x", "wait_s": float("nan")}, "wait_s must be a finite number"),
    ("runs", {"columns": "run_id"}, "columns must be a list"),
    ("stop", {"job": "x", "timeout": True}, "timeout must be a finite number"),
])
def test_a_malformed_request_is_refused_before_the_core_sees_it(op, params, what, tmp_path):
    box = LocalBox(jobs_file=str(tmp_path / "none.toml"), state_dir=tmp_path / "state")
    with pytest.raises(BoxError) as err:
        answer(box, op, params)
    assert what in str(err.value) and err.value.code == 2


def test_results_rebuild_from_their_own_json():
    samples = [
        results.Stopped(job="j", clean=False, lines=["still alive: pid 7"], report={"run_id": "r", "clean": False}),
        results.LogChunk(run_id="r", offset=10, next_offset=14, data=b"\x1b]0;x\x07", ended=True),
        results.RunsListing(rows=[{"run_id": "r"}], notes=["rebuilt"]),
        results.CheckResult(path="/j.toml", errors=["/j.toml:3:1: bad"], jobs=[], targets=[]),
        results.Pruned(candidates=[{"run_id": "r"}], removed=1),
        results.StacksResult(refused="no py-spy", code=2),
        results.PipelineProgress(events=[{"event": "StageStarted"}], count=1, result=None, state="running"),
    ]
    for value in samples:
        wire = json.loads(json.dumps(value.to_json()))
        rebuilt = (type(value).from_json(wire, "j") if type(value) is results.Stopped else type(value).from_json(wire))
        assert rebuilt == value


def test_a_hostile_reply_rebuilds_into_a_result_of_the_right_types():
    # replies.py refuses most of this at the boundary; from_json never lets a wrong type through either.
    stopped = results.Stopped.from_json({"lines": [1, None], "clean": "yes", "report": []}, "j")
    assert stopped.lines == ["1", "None"] and stopped.clean is True and stopped.report == {}
    assert results.StacksResult.from_json({"refused": "x", "code": 99}).code == 1
    assert results.PipelineProgress.from_json({"events": "no", "count": True}).count == 0


@pytest.fixture
def local_box(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUDECK_STATE_DIR", str(tmp_path / "state"))
    jobs = write_jobs(tmp_path / "jobs.toml", {"hello": {"cmd": "echo hello from the box; echo bye"}})
    return LocalBox(jobs_file=str(jobs), state_dir=tmp_path / "state")


def test_a_local_box_runs_a_job_and_reads_it_back(local_box):
    run_id = local_box.start("hello").run_id
    wait_for(lambda: local_box.jobs().jobs[0]["state"] == "exited", timeout=30, what="the job's exit")
    chunks: list[bytes] = []
    end = local_box.follow_log("hello", chunks.append, follow=True)
    assert b"".join(chunks) == b"hello from the box\nbye\n" and end == len(b"".join(chunks))
    chunk = local_box.read_log("hello", tail=1)
    assert chunk.run_id == run_id and chunk.data == b"bye\n" and chunk.ended is False
    assert local_box.read_log("hello", offset=chunk.next_offset).ended is True
    assert (local_box.run_record("hello") / "output.log").read_bytes() == b"hello from the box\nbye\n"
    with pytest.raises(BoxError) as err:
        local_box.start("nope")
    assert err.value.code == 2 and "nope" in str(err.value)
    with pytest.raises(BoxError) as err:
        local_box.read_log("hello", run="20990101-000000-000ff")
    assert err.value.code == 2



def test_reading_a_log_again_parses_the_jobs_file_only_when_it_changed(local_box, tmp_path, monkeypatch):
    import gpudeck.jobs.spec as spec
    local_box.start("hello")
    wait_for(lambda: local_box.jobs().jobs[0]["state"] == "exited", timeout=30, what="the job's exit")
    parses = []
    load_jobs = spec.load_jobs
    monkeypatch.setattr(spec, "load_jobs", lambda path: parses.append(path) or load_jobs(path))
    for _ in range(5):                                  # a remote log pane's polls
        assert local_box.read_log("hello", tail=1).data == b"bye\n"
    assert len(parses) == 1
    write_jobs(tmp_path / "jobs.toml", {"hello": {"cmd": "echo hello"}, "other": {"cmd": "true"}})
    with pytest.raises(BoxError) as err:                # the edited file is read again: "other" is known
        local_box.read_log("other")
    assert err.value.code == 2 and "has never run" in str(err.value) and len(parses) == 2


def test_the_agent_answers_box_requests_through_its_local_box(local_box, tmp_path):
    """The agent's wire, in process: the same LocalBox answers, errors carry their exit code."""
    out = io.BytesIO()
    agent = Agent(out, jobs_file=local_box.jobs_file_arg, state_dir=str(tmp_path / "state"), simulated=True, via="test")
    requests = [{"id": 1, "op": "start", "params": {"job": "hello"}},
                {"id": 2, "op": "start", "params": {"job": "nope"}},
                {"id": 3, "op": "check", "params": {}},
                {"id": 4, "op": "run_file", "params": {"job": "hello", "run_id": "x", "name": "../../etc/passwd"}}]
    for request in requests:
        agent.handle(request)
    replies = {r["id"]: r for r in (json.loads(line) for line in out.getvalue().splitlines())}
    assert replies[1]["ok"] and replies[1]["result"]["run_id"]
    assert not replies[2]["ok"] and replies[2]["code"] == 2 and "nope" in replies[2]["error"]
    assert replies[3]["ok"] and replies[3]["result"]["jobs"] == ["hello"]
    assert not replies[4]["ok"] and "not a file of a run's record" in replies[4]["error"]


def test_the_box_reference_is_generated_from_the_interface():
    out = subprocess.run([sys.executable, str(REPO / "docs" / "make_box_reference.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = (REPO / "docs" / "BOX.md").read_text()
    for name, member in vars(Box).items():
        if callable(member) and not name.startswith("_"):
            assert f"### `{name}(" in text, name
