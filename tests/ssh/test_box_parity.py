"""Every CLI command against this machine's box and a box over the real sshd: one body per command, run twice.

The `deck` fixture is parametrised: "local" is `gpudeck --jobs FILE` with its own GPUDECK_STATE_DIR,
"remote" is `gpudeck --host box` whose hosts.toml entry names the same kind of jobs file and a state
dir of its own on the box (the box is this machine, reached through sshd: so a path the test knows
is a path on the box). Each test body holds for both; where the outputs legitimately differ (a remote
answer names its box: `host`, the `box: ` prefix of an error line, `box:` before a path) the body
says so explicitly through `deck.name`, `deck.err()` and `deck.where()`.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runsupport import cleanup_state, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
FIXTURE_LOG = REPO / "tests" / "fixtures" / "logs" / "build_ninja_cc1plus_killed.log"
STANDIN = REPO / "tests" / "engines" / "sglang_standin.py"
PY = sys.executable
pytestmark = pytest.mark.slow

RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{5}$")
COUNT_LINES = 120          # `count` prints this many lines, 20 ms apart: a follow starts while it runs
NAMES = ["count", "sleeper", "pysleep", "prep", "train", "fail", "eng-a", "eng-b"]
KEEPALIVE = "keepalive_s = 1\nkeepalive_count = 3\nconnect_timeout_s = 5\n"


def _standin(port: int) -> str:
    return (f'engine = "sglang"\nport = {port}\nstop_timeout = "10s"\n'
            f'cmd = ["{PY}", "{STANDIN}", "--model-path", "/models/stand-in", "--port", "{port}", '
            f'"--enable-metrics", "--load-seconds", "0.3"]\n')


def jobs_toml(ports: dict[str, int]) -> str:
    # Python jobs name this interpreter: the box's PATH (sshd's) finds another python3 than this shell's.
    count = (f"import time\\nfor i in range({COUNT_LINES}):\\n"
             "    print('line %d' % i, flush=True)\\n    time.sleep(0.02)")
    return (f'[jobs.count]\ncmd = ["{PY}", "-u", "-c", "{count}"]\n\n'
            '[jobs.sleeper]\ncmd = "echo sleeper up; exec sleep 600"\nstop_timeout = 2\n\n'
            f'[jobs.pysleep]\ncmd = ["{PY}", "-c", "import time; print(\'up\', flush=True); time.sleep(600)"]\n'
            'stop_timeout = 2\n\n'
            '[jobs.prep]\ncmd = "echo prepared > prep.done"\n\n'
            '[jobs.train]\ncmd = "cat prep.done; echo trained"\nneeds = ["prep"]\n\n'
            '[jobs.fail]\ncmd = "echo starting; echo \'RuntimeError: CUDA out of memory\' >&2; exit 3"\n\n'
            + "".join(f"[jobs.{name}]\n{_standin(port)}\n" for name, port in ports.items()))


BROKEN = '[jobs.a]\ncmd = "x"\nbogus = 1\n\n[jobs.b]\ncmd = "y"\nneeds = ["nope"]\n'


@dataclass
class Deck:
    """One box and how the CLI reaches it."""

    kind: str                     # "local" | "remote"
    work: Path                    # the box's jobs file and files live here (the box is this machine)
    env: dict
    ports: dict[str, int]
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = "box" if self.remote else "local"

    @property
    def remote(self) -> bool:
        return self.kind == "remote"

    @property
    def jobs(self) -> Path:
        return self.work / "jobs.toml"

    @property
    def state(self) -> Path:
        return self.work / "state"

    def argv(self, *args: str, broken: bool = False) -> list[str]:
        if self.remote:
            box = ["--host", "box-broken" if broken else "box"]
        else:
            box = ["--jobs", str(self.work / ("broken.toml" if broken else "jobs.toml"))]
        return [PY, "-m", "gpudeck", *box, *args]

    def gd(self, *args: str, broken: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args, broken=broken), cwd=self.work, env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def ok(self, *args: str, **kw) -> subprocess.CompletedProcess:
        out = self.gd(*args, **kw)
        assert out.returncode == 0, f"{args}: {out.stderr}"
        return out

    def json(self, *args: str) -> dict:
        return json.loads(self.ok(*args, "--json").stdout)

    def err(self, message: str, host: str = "box") -> str:
        """The one stderr line of a refusal: a remote box's names the box."""
        return f"gpudeck: {host + ': ' if self.remote else ''}{message}\n"

    def where(self, path: Path, host: str = "box") -> str:
        return f"{host}:{path}" if self.remote else str(path)

    def run_dir(self, job: str, run_id: str) -> Path:
        return self.state / "runs" / job / run_id

    def ended(self, job: str, run_id: str, timeout: float = 60) -> None:
        wait_for(lambda: (self.run_dir(job, run_id) / "exit.json").exists(), timeout=timeout,
                 what=f"{job} run {run_id} ended on {self.name}")

    def start(self, job: str) -> str:
        run_id = self.ok("start", job).stdout.strip()
        assert RUN_ID.match(run_id), run_id
        return run_id

    def states(self) -> dict[str, dict]:
        return {j["name"]: j for j in self.json("jobs")["jobs"]}


@pytest.fixture(scope="module", params=["local", "remote"])
def deck(request, tmp_path_factory):
    kind = request.param
    work = tmp_path_factory.mktemp(f"parity-{kind}")
    ports = {"eng-a": free_port(), "eng-b": free_port()}
    (work / "jobs.toml").write_text(jobs_toml(ports))
    (work / "broken.toml").write_text(BROKEN)
    lab = None
    if kind == "remote":
        lab = request.getfixturevalue("ssh_lab")
        for sshd in (lab.box, lab.box2):
            if sshd.proc is None:
                sshd.start()
        # The box's python is this one: it has psutil (pivot, doctor) and py-spy beside it, as this machine does.
        lab.client.write_hosts("".join(
            f'[hosts.{name}]\nssh = "box"\njobs = "{work / jobs}"\nstate_dir = "{work / "state"}"\n'
            f'simulated = true\npython = "{PY}"\n{KEEPALIVE}\n'
            for name, jobs in (("box", "jobs.toml"), ("box-broken", "broken.toml"))))
        env = lab.client.env()
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
        env["GPUDECK_STATE_DIR"] = str(work / "state")
    deck = Deck(kind, work, env, ports)
    yield deck
    if lab is not None:
        lab.client.stop_keepers()
    cleanup_state(deck.state)          # every process of every run of this box (a failed test's leftovers)


@pytest.fixture(scope="module")
def failed_run(deck) -> str:
    """One ended run of `fail` (exit 3, a CUDA OOM line on stderr): what runs, postmortem and analyze read."""
    run_id = deck.start("fail")
    deck.ended("fail", run_id)
    # The runner's last word (its crash analysis) follows exit.json: the run is indexed whole after it.
    wait_for(lambda: (deck.run_dir("fail", run_id) / "summary.json").exists(), timeout=30, what="fail summarised")
    return run_id


# -- see ---------------------------------------------------------------------------------------
def test_status(deck):
    payload = deck.json("--demo", "status")
    assert payload["simulated"] is True and payload["host"]["name"] == "h200-sim-01"
    assert [g["name"] for g in payload["gpus"]] == ["NVIDIA H200"] * 8 and payload["gpu_error"] is None
    assert payload["host_name"] == deck.name
    if deck.remote:
        # The box's agent says where its figures come from and who answered.
        assert payload["source"] == {"gpu": "simulated", "host": "simulated"}
        assert payload["agent"]["hostname"] == socket.gethostname() and payload["agent"]["readonly"] is False
    else:
        assert "source" not in payload and "agent" not in payload

    text = deck.ok("--demo", "status").stdout.splitlines()
    if deck.remote:
        assert text.pop(0) == "[box: box; GPU via simulated, host via simulated]"
    assert text[0].startswith("h200-sim-01  ") and text[0].endswith("SIMULATED (demo data, not this machine)")
    assert re.match(r"CPU \d+\.\d% of 192 cores  load ", text[1]), text[1]
    assert sum(1 for ln in text if ln.startswith(tuple(f"{i}    NVIDIA H200" for i in range(8)))) == 8


def test_jobs(deck):
    text = deck.ok("jobs").stdout.splitlines()
    assert text[0].split() == ["NAME", "KIND", "STATE", "RUNTIME", "PID", "RUN", "PORT", "GPUS", "EXIT", "PHASE"]
    assert [ln.split()[0] for ln in text[1:len(NAMES) + 1]] == NAMES
    assert {ln.split()[1] for ln in text[1:len(NAMES) + 1]} == {"stage", "engine"}

    payload = deck.json("jobs")
    assert [j["name"] for j in payload["jobs"]] == NAMES
    # Both name their box (this machine is "local"): in the payload and in every job.
    assert payload["host"] == deck.name and {j["host"] for j in payload["jobs"]} == {deck.name}
    eng = next(j for j in payload["jobs"] if j["name"] == "eng-a")
    assert eng["kind"] == "engine" and eng["port"] == deck.ports["eng-a"] and eng["backend"] == "local"
    assert isinstance(payload["pipelines"], list)


def test_check(deck):
    good = deck.gd("check")
    assert good.returncode == 0 and good.stderr == ""
    assert good.stdout == f"{deck.where(deck.jobs)}: {len(NAMES)} jobs OK ({', '.join(NAMES)})\n"

    bad = deck.gd("check", broken=True)
    broken = deck.work / "broken.toml"
    # Every located error, FILE:LINE:COL first, the box's own path; the count names the box.
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith(f"{broken}:") for ln in lines)
    assert lines[0] == f"{broken}:3:1: unknown key 'bogus' in job 'a' (did you mean 'gpus'?)"
    assert re.match(rf"{re.escape(str(broken))}:\d+:\d+: .*'nope'", lines[1]), lines[1]
    assert bad.stderr == f"gpudeck: {deck.where(broken, 'box-broken')}: 2 errors\n"
    # A command that needs the jobs file refuses it with the first error, one line, exit 2.
    refused = deck.gd("jobs", broken=True)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(deck.err(lines[0], "box-broken")[:-1]) and "run `gpudeck check`" in refused.stderr


def test_doctor(deck):
    payload = deck.gd("doctor", "--json")
    data = json.loads(payload.stdout)
    assert payload.returncode == (0 if data["ok"] else 1)
    assert [c["name"] for c in data["checks"]][:1] == ["nvidia_driver"] and data["job"] is None
    if deck.remote:
        assert data.pop("host") == "box"
    assert "host" not in data
    text = deck.gd("doctor")
    assert text.returncode == payload.returncode
    rows = [ln.split()[:2] for ln in text.stdout.splitlines()]
    assert rows == [["skip" if c.get("skipped") else ("ok" if c["ok"] else "FAIL"), c["name"]]
                    for c in data["checks"]]
    if not data["ok"]:
        failed = ", ".join(c["name"] for c in data["checks"] if not c["ok"])
        assert text.stderr == f"gpudeck: doctor: failed: {failed}\n"
    # A job with no GPUs and no port: nothing to fail.
    job = deck.gd("doctor", "count")
    assert job.returncode == 0, job.stderr
    assert job.stdout.splitlines() == ["skip  nvidia_driver  count (stage) declares no GPUs",
                                       "skip  port_free      the job declares no port"]
    unknown = deck.gd("doctor", "nosuch")
    assert unknown.returncode == 2
    assert unknown.stderr == deck.err(f"no job named 'nosuch' in {deck.jobs} (jobs: {', '.join(NAMES)})")


# -- act ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sleeper(deck) -> str:
    """A running `sleeper` started through the CLI (test_start checks that start, test_stop stops it)."""
    return deck.start("sleeper")


def test_start(deck, sleeper):
    job = deck.states()["sleeper"]
    assert job["state"] == "running" and job["run_id"] == sleeper and job["runner_alive"] is True
    assert deck.run_dir("sleeper", sleeper).is_dir()
    again = deck.gd("start", "sleeper")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == deck.err(f"sleeper is already running (run {sleeper}); stop it first or use restart")
    unknown = deck.gd("start", "nosuch")
    assert unknown.returncode == 2
    assert unknown.stderr == deck.err(f"no job named 'nosuch' in {deck.jobs} (jobs: {', '.join(NAMES)})")


def test_stop(deck, sleeper):
    out = deck.gd("stop", "sleeper", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["host"] == deck.name                 # both name their box
    assert report["clean"] is True and report["was_running"] is True and report["run_id"] == sleeper
    assert report["signal"] == "SIGTERM" and report["escalated"] is False and report["remaining"] == []
    assert report["message"] == f"stopped sleeper (run {sleeper})"
    assert deck.states()["sleeper"]["state"] == "stopped"
    # Stopped already: said so, nothing signalled, still exit 0.
    again = deck.gd("stop", "sleeper")
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout.splitlines()[0].startswith("sleeper is not running")


def test_restart(deck):
    first = deck.start("sleeper")
    out = deck.gd("restart", "sleeper")
    assert out.returncode == 0, out.stderr
    second = out.stdout.strip()
    assert RUN_ID.match(second) and second != first
    # The stop's lines go to stderr, the new run id alone to stdout.
    assert out.stderr.splitlines()[0] == f"stopped sleeper (run {first})"
    job = deck.states()["sleeper"]
    assert job["state"] == "running" and job["run_id"] == second
    assert json.loads((deck.run_dir("sleeper", first) / "exit.json").read_text())["signal"] == "SIGTERM"
    stopped = deck.gd("stop", "sleeper")
    assert stopped.returncode == 0 and stopped.stdout.splitlines()[0] == f"stopped sleeper (run {second})"


def test_logs(deck):
    run_id = deck.start("count")
    follow = subprocess.Popen(deck.argv("logs", "count", "-f"), cwd=deck.work, env=deck.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        first = follow.stdout.readline()
        live = not (deck.run_dir("count", run_id) / "exit.json").exists()
        rest = follow.stdout.read()            # (not communicate(): it would skip what readline buffered)
        err = follow.stderr.read()
        follow.wait(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert live, "the run had ended before the follow printed its first line: nothing was followed"
    # Every line exactly once, in order, and the follow ended with the run.
    assert [first.rstrip("\n"), *rest.splitlines()] == [f"line {i}" for i in range(COUNT_LINES)]
    assert (deck.run_dir("count", run_id) / "exit.json").exists()

    tail = deck.ok("logs", "count", "-n", "3")
    assert tail.stdout.splitlines() == [f"line {i}" for i in range(COUNT_LINES - 3, COUNT_LINES)]
    assert deck.ok("logs", "count", "--run", run_id, "-n", "1").stdout == f"line {COUNT_LINES - 1}\n"
    assert deck.ok("logs", "count", "-n", "0").stdout == ""
    never = deck.gd("logs", "prep")
    assert never.returncode == 2 and never.stderr == deck.err("prep has never run")
    norun = deck.gd("logs", "count", "--run", "nope")
    assert norun.returncode == 2 and norun.stderr == deck.err("count has no run nope")


def test_run_wait(deck):
    out = deck.gd("run", "train", "--wait")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    pipeline = lines[0].split()[1].rstrip(":")
    assert lines[0] == f"pipeline {pipeline}: prep -> train" and RUN_ID.match(pipeline)
    assert [re.sub(r"\(run \S+\)", "(run ID)", ln) for ln in lines[1:]] == [
        "prep: started (run ID)", "prep: succeeded", "train: started (run ID)", "train: succeeded",
        f"pipeline {pipeline}: succeeded"]
    train_run = re.search(r"train: started \(run (\S+)\)", out.stdout).group(1)
    assert (deck.run_dir("train", train_run) / "output.log").read_text() == "prepared\ntrained\n"
    payload = deck.json("jobs")
    pipe = next(p for p in payload["pipelines"] if p["id"] == pipeline)
    assert pipe["state"] == "succeeded" and [s["status"] for s in pipe["stages"]] == ["succeeded", "succeeded"]
    unknown = deck.gd("run", "nosuch", "--wait")
    assert unknown.returncode == 2
    assert unknown.stderr == deck.err(f"no job named 'nosuch' in {deck.jobs} (jobs: {', '.join(NAMES)})")


def _healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
    except OSError:
        return False


def test_pivot(deck):
    """Two stand-in SGLang engines (tests/engines/sglang_standin.py, 0.3 s to load): a → b as JSON, b → a as text."""
    a, b = deck.ports["eng-a"], deck.ports["eng-b"]
    deck.start("eng-a")
    wait_for(lambda: _healthy(a), timeout=60, what=f"eng-a healthy on {deck.name}")
    asked = deck.gd("pivot", "eng-b")
    assert asked.returncode == 2
    assert asked.stderr == "gpudeck: pivot needs confirmation: run it in a terminal or pass --yes\n"
    assert asked.stdout.splitlines()[0].startswith(f"pivot to eng-b (sglang, port {b}")
    assert "job eng-a" in asked.stdout and _healthy(a)

    out = deck.gd("pivot", "eng-b", "--yes", "--wait", "--timeout", "60", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    if deck.remote:
        assert data.pop("host") == "box"
    assert set(data) == {"plan", "result"}
    assert data["plan"]["target"] == "eng-b" and [s["job"] for s in data["plan"]["stops"]] == ["eng-a"]
    assert data["result"]["ok"] is True
    assert [s["name"] for s in data["result"]["steps"]] == ["stop job eng-a", "verify GPUs free", "verify ports free",
                                                            "start eng-b", "wait for eng-b ready"]
    assert _healthy(b) and not _healthy(a)

    back = deck.gd("pivot", "eng-a", "--yes", "--wait", "--timeout", "60")
    assert back.returncode == 0, back.stderr
    lines = back.stdout.splitlines()
    assert lines[0].startswith(f"pivot to eng-a (sglang, port {a}")
    steps = [ln.split(" (")[0] for ln in lines if ln.startswith("[")]
    assert steps == ["[ok] stop job eng-b", "[ok] verify GPUs free", "[ok] verify ports free", "[ok] start eng-a",
                     "[ok] wait for eng-a ready"]
    where = " on box" if deck.remote else ""
    assert re.match(rf"pivoted to eng-a \(run \S+\), ready{where} in \d+\.\d s \(pivot overhead \d+\.\d s\)$",
                    lines[-1]), lines[-1]
    assert _healthy(a) and not _healthy(b)
    states = deck.states()
    assert states["eng-a"]["state"] == "running" and states["eng-b"]["state"] != "running"
    again = deck.gd("pivot", "eng-a", "--yes")
    assert again.returncode == 2 and "already running" in again.stderr and len(again.stderr.splitlines()) == 1
    assert again.stderr.startswith(deck.err("")[:-1])
    assert deck.gd("stop", "eng-a").returncode == 0


def test_stacks(deck):
    from gpudeck.jobs.stacks import find_py_spy
    run_id = deck.start("pysleep")
    wait_for(lambda: (deck.run_dir("pysleep", run_id) / "output.log").read_text() == "up\n", timeout=30,
             what="pysleep up")
    try:
        out = deck.gd("stacks", "pysleep", "--json")
        if find_py_spy() is None:            # the box's python is this one: the same py-spy, or none
            assert out.returncode == 2 and "py-spy" in out.stderr and len(out.stderr.splitlines()) == 1
            assert out.stderr.startswith(deck.err("")[:-1])
            return
        assert out.returncode == 0, out.stderr
        dump = json.loads(out.stdout)
        assert dump["host"] == deck.name and dump["job"] == "pysleep" and dump["run_id"] == run_id
        assert len(dump["processes"]) == 1 and dump["skipped"] == []
        assert dump["processes"][0]["command"].startswith(f"{PY} -c import time")
        assert [len(g["pids"]) for g in dump["groups"]] == [1]
        # Sleeping in nanosleep, or "idle" when py-spy's attach left the sleep between syscalls as the
        # kernel was read (jobs/stacks.py reads it after the first dump): seen on either box, not a box's doing.
        verdict = r"1 of 1 process (sleeping \(nanosleep\)|idle) at <string>:1 \(<module>\)$"
        assert re.match(verdict, dump["verdict"]), dump["verdict"]
        text = deck.ok("stacks", "pysleep").stdout.splitlines()
        assert re.match(f"verdict: {verdict}", text[0]), text[0]
        assert text[1].startswith("1 Python process dumped (pid ")
        # (py-spy reads thread names only where the interpreter keeps them: not asserted)
        assert any(re.match(r"1 of 1 process \[.*\] — (sleeping \(nanosleep\)|idle)$", ln) for ln in text), text
    finally:
        deck.gd("stop", "pysleep", "--timeout", "1")
    # Not running: exit 1, one line.
    dead = deck.gd("stacks", "pysleep")
    assert dead.returncode == 1
    assert dead.stderr == deck.err(f"pysleep is not running (run {run_id} stopped): no process to dump")


# -- remember ----------------------------------------------------------------------------------
def test_runs(deck, failed_run):
    rows = deck.json("runs")["runs"]
    row = next(r for r in rows if r["run_id"] == failed_run)
    # The run index's host is the machine the run ran on, for either box.
    assert row["job"] == "fail" and row["kind"] == "job" and row["host"] == socket.gethostname()
    assert row["failed"] is True and row["exit_code"] == 3 and row["state"] == "exited"
    assert row["failure_cause"] == "cuda_oom" and row["failure_line"] == 2
    assert row["path"] == str(deck.run_dir("fail", failed_run))
    assert [r["started_at"] for r in rows] == sorted((r["started_at"] for r in rows), reverse=True)

    failed = deck.json("runs", "--failed")["runs"]
    assert failed and all(r["failed"] for r in failed) and failed_run in {r["run_id"] for r in failed}
    text = deck.ok("runs", "--failed").stdout.splitlines()
    assert text[0].split()[:3] == ["RUN", "JOB", "KIND"]
    line = next(ln for ln in text if failed_run in ln)
    assert line.startswith(f"✗ {failed_run}  fail") and "exit 3" in line and "cuda_oom (line 2)" in line
    only = deck.json("runs", "fail", "-n", "1")["runs"]
    assert [r["run_id"] for r in only] == [failed_run]


def test_runs_prune_dry_run(deck, failed_run):
    text = deck.ok("runs", "--prune", "--keep", "0").stdout.splitlines()
    count = int(re.match(r"would delete (\d+) runs \(", text[0]).group(1))
    assert count >= 1 and len(text) == count + 2
    assert any(ln.startswith(f"  fail/{failed_run}  exited  ") and ln.endswith("beyond the newest 0") for ln in text)
    assert text[-1] == "dry run: nothing deleted; add --yes to delete them"
    doc = deck.json("runs", "--prune", "--keep", "0")
    if deck.remote:
        assert doc.pop("host") == "box"
    assert set(doc) == {"would_delete"} and len(doc["would_delete"]) == count
    mine = next(c for c in doc["would_delete"] if c["run_id"] == failed_run)
    assert mine["job"] == "fail" and mine["state"] == "exited" and mine["path"] == str(deck.run_dir("fail", failed_run))
    assert all(Path(c["path"]).is_dir() for c in doc["would_delete"])      # nothing deleted
    assert deck.ok("runs", "--prune").stdout == "nothing to prune\n"       # each job's log_keep: all kept


def test_postmortem(deck, failed_run):
    report = json.loads(deck.ok("postmortem", failed_run, "--format", "json").stdout)
    source = report["source"]
    assert source["kind"] == "run" and source["job"] == "fail" and source["run_id"] == failed_run
    assert source["host"] == socket.gethostname() and source["path"] == str(deck.run_dir("fail", failed_run))
    assert report["verdict"].startswith("crashed after 0 s: CUDA out of memory (line 2)")
    assert report["outcome"]["exit_code"] == 3 and report["failure"]["cause"] == "cuda_oom"
    assert "host" not in report                    # a report names its run's host in source, for either box
    # By job, as markdown: the same run, the same verdict first.
    md = deck.ok("postmortem", "fail").stdout
    assert md.splitlines()[0] == f"**{report['verdict']}**"
    assert f"Post-mortem of fail run {failed_run}" in md and "## The lines that matter" in md
    assert f"| log | `{deck.run_dir('fail', failed_run) / 'output.log'}` |" in md
    unknown = deck.gd("postmortem", "nosuch")
    assert unknown.returncode == 2 and unknown.stderr == deck.err("nosuch: no such log file, job with runs, or run id")


def _analysis(path: Path) -> dict:
    """What the core says of a log file, here, in-process: what either box's CLI must print."""
    from gpudeck.jobs import strictjson
    from gpudeck.jobs.box.local import analyze_stream_result
    with open(path, "rb") as fh:
        return json.loads(strictjson.dumps(analyze_stream_result(fh).analysis))


def test_analyze(deck, failed_run):
    log = deck.run_dir("fail", failed_run) / "output.log"          # a log file on that box
    for path in (log, FIXTURE_LOG):
        doc = deck.json("analyze", str(path))
        if deck.remote:
            assert doc.pop("host") == "box"
        assert doc == _analysis(path), path
    text = deck.ok("analyze", str(log)).stdout.splitlines()
    assert text[:3] == ["engine:   -", "phase:    failed", "FAILED:   cuda_oom at line 2"]
    missing = deck.gd("analyze", str(deck.work / "missing.log"))
    assert missing.returncode == 2
    assert missing.stderr == deck.err(f"cannot read {deck.work / 'missing.log'}: No such file or directory")
    folder = deck.gd("analyze", str(deck.work))
    assert folder.returncode == 2
    assert folder.stderr == deck.err(f"cannot analyze {deck.work}: a directory, not a regular file")
