"""analyze, pivot and runs --reindex/--prune with --host, over a real OpenSSH server: the work happens on the box."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from runsupport import kill_run_leftovers, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "logs"
STANDIN = REPO / "tests" / "engines" / "sglang_standin.py"
pytestmark = pytest.mark.slow


def gd(lab, *args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def gd_tty(lab, *args: str, answer: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI with a terminal on stdin (a real pty) that answers the confirmation with `answer`."""
    import pty
    master, slave = pty.openpty()
    try:
        os.write(master, answer.encode() + b"\n")
        return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                              stdin=slave, capture_output=True, text=True, timeout=timeout)
    finally:
        os.close(slave)
        os.close(master)


def local(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GPUDECK_HOST"}
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_analyze_a_log_on_the_box_answers_as_locally(lab, tmp_path):
    # Logs with a failure, with progress (rate, ETA), with serving numbers and warnings.
    names = ["build_ninja_cc1plus_killed.log", "hf_trainer_total_steps_loss_step.log",
             "vllm_startup_ready_spec_bad.log", "sglang_kv_retract_v0_spec.log"]
    for name in names:
        path = str(FIXTURES / name)
        here, there = local("analyze", "--json", path), gd(lab, "--host", "box", "analyze", "--json", path)
        assert there.returncode == 0, there.stderr
        remote = json.loads(there.stdout)
        assert remote.pop("host") == "box"
        assert remote == json.loads(here.stdout), name
        text = gd(lab, "--host", "box", "analyze", path)
        assert text.returncode == 0 and text.stdout == local("analyze", path).stdout, name
    # --max-bytes is applied on the box, and says so here.
    cut = gd(lab, "--host", "box", "analyze", "--max-bytes", "100", str(FIXTURES / names[0]))
    assert cut.returncode == 0 and "read only the first 100 bytes" in cut.stderr


def test_analyze_over_ssh_refuses_what_local_refuses_in_one_line(lab, tmp_path):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    for target, words in ((str(fifo), "a FIFO, not a regular file"), (str(tmp_path), "a directory"),
                          (str(tmp_path / "missing.log"), "No such file or directory")):
        out = gd(lab, "--host", "box", "analyze", target, timeout=60)
        assert out.returncode == 2, out.stderr
        assert words in out.stderr and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
        # The local line, naming the host.
        assert out.stderr == local("analyze", target).stderr.replace("gpudeck: ", "gpudeck: box: ", 1)
    # stdin is this machine's: with --host it is refused, pointing at the local form.
    out = gd(lab, "--host", "box", "analyze", "-", stdin="INFO: Started server process\n")
    assert out.returncode == 2 and "drop --host" in out.stderr and len(out.stderr.splitlines()) == 1


def _standin(port: int) -> str:
    return (f'engine = "sglang"\nport = {port}\nstop_timeout = "10s"\n'
            f'cmd = ["{sys.executable}", "{STANDIN}", "--model-path", "/models/stand-in", "--port", "{port}", '
            f'"--enable-metrics", "--load-seconds", "0.3"]\n')


def _healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
    except OSError:
        return False


@pytest.fixture
def engines(lab):
    """box runs two stand-in SGLang engine jobs; the agent is the zipapp under a python that has psutil."""
    ports = {"eng-a": free_port(), "eng-b": free_port()}
    lab.setup(lab.work, extra=f'python = "{sys.executable}"\nagent = "zipapp"\n')
    (lab.work / "jobs.toml").write_text("".join(f"[jobs.{name}]\n{_standin(port)}\n" for name, port in ports.items()))
    yield ports
    for name in ports:                          # the tests may add jobs to this dict
        gd(lab, "--host", "box", "stop", name, "--timeout", "2", timeout=60)
    for run_dir in (lab.state_dir("box") / "runs").glob("*/2*"):
        kill_run_leftovers(run_dir.name)


def test_pivot_on_the_box_stops_one_engine_and_starts_the_other(lab, engines):
    assert gd(lab, "--host", "box", "start", "eng-a").returncode == 0
    wait_for(lambda: _healthy(engines["eng-a"]), timeout=60, what="eng-a healthy on box")
    # Without --yes and no terminal: the plan is shown, nothing happens.
    asked = gd(lab, "--host", "box", "pivot", "eng-b")
    assert asked.returncode == 2 and "needs confirmation" in asked.stderr
    assert asked.stdout.splitlines()[0].startswith("pivot to eng-b (sglang, port")
    assert "job eng-a" in asked.stdout and _healthy(engines["eng-a"])

    # In a terminal: the plan, then the question; "n" stops nothing.
    no = gd_tty(lab, "--host", "box", "pivot", "eng-b", answer="n")
    assert no.returncode == 1 and "Proceed? [y/N]" in no.stdout and "cancelled; nothing was stopped" in no.stdout
    assert _healthy(engines["eng-a"]) and not _healthy(engines["eng-b"])

    out = gd_tty(lab, "--host", "box", "pivot", "eng-b", "--wait", "--timeout", "60", answer="y")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("pivot to eng-b") and "Proceed? [y/N]" in out.stdout
    # The answer echoes on the terminal, not in stdout: the first step follows the prompt on its line.
    lines = out.stdout.replace("Proceed? [y/N] ", "").splitlines()
    steps = [ln for ln in lines if ln.startswith("[")]
    assert [s.split(" (")[0] for s in steps] == ["[ok] stop job eng-a", "[ok] verify GPUs free",
                                                 "[ok] verify ports free", "[ok] start eng-b",
                                                 "[ok] wait for eng-b ready"]
    assert all(s.split(" (")[1].split(" s)")[0].replace(".", "").isdigit() for s in steps)   # each with a duration
    assert lines[-1].startswith("pivoted to eng-b (run ") and ", ready on box in " in lines[-1]
    assert _healthy(engines["eng-b"]) and not _healthy(engines["eng-a"])
    payload = json.loads(gd(lab, "--host", "box", "jobs", "--json").stdout)
    states = {j["name"]: j["state"] for j in payload["jobs"]}
    assert states["eng-b"] == "running" and states["eng-a"] != "running"

    # Back again, as JSON: the plan and result shapes of a local pivot, plus host.
    back = gd(lab, "--host", "box", "pivot", "eng-a", "--yes", "--wait", "--timeout", "60", "--json")
    assert back.returncode == 0, back.stderr
    data = json.loads(back.stdout)
    assert data["host"] == "box" and data["result"]["ok"] and data["plan"]["target"] == "eng-a"
    assert [s["job"] for s in data["plan"]["stops"]] == ["eng-b"]
    assert data["result"]["steps"][-1]["name"] == "wait for eng-a ready"
    assert _healthy(engines["eng-a"])
    # Already running: one line, exit 2, as locally.
    again = gd(lab, "--host", "box", "pivot", "eng-a", "--yes")
    assert again.returncode == 2 and "already running" in again.stderr and len(again.stderr.splitlines()) == 1


def test_pivot_on_a_box_without_psutil_is_one_line(lab, engines):
    has = subprocess.run(["python3", "-c", "import psutil"], capture_output=True).returncode == 0
    if has:
        pytest.skip("this machine's python3 has psutil: no box without it to try")
    lab.setup(lab.work, extra='agent = "zipapp"\n')          # the box's plain python3
    (lab.work / "jobs.toml").write_text("".join(f"[jobs.{n}]\n{_standin(p)}\n" for n, p in engines.items()))
    out = gd(lab, "--host", "box", "pivot", "eng-b", "--yes")
    assert out.returncode == 2 and "pivot cannot run on this host" in out.stderr and "psutil" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_runs_reindex_and_prune_over_ssh(lab):
    for _ in range(3):
        started = gd(lab, "--host", "box", "start", "prep")
        assert started.returncode == 0, started.stderr
        wait_for(lambda: all((d / "exit.json").exists() for d in (lab.state_dir("box") / "runs" / "prep").glob("2*")),
                 timeout=60, what="prep run ended")
    runs_dir = lab.state_dir("box") / "runs" / "prep"
    assert len(list(runs_dir.glob("2*"))) == 3
    out = gd(lab, "--host", "box", "runs", "--reindex")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("reindexed ") and " runs into box:" in out.stdout
    assert str(lab.state_dir("box")) in out.stdout

    dry = gd(lab, "--host", "box", "runs", "--prune", "--keep", "1")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 2 runs" in dry.stdout and "dry run: nothing deleted" in dry.stdout
    assert len(list(runs_dir.glob("2*"))) == 3
    listed = json.loads(gd(lab, "--host", "box", "runs", "--prune", "--keep", "1", "--json").stdout)
    assert listed["host"] == "box" and len(listed["would_delete"]) == 2
    assert {c["job"] for c in listed["would_delete"]} == {"prep"}
    # box2's index is its own: nothing of box's there.
    assert "nothing to prune" in gd(lab, "--host", "box2", "runs", "--prune", "--keep", "1").stdout

    done = gd(lab, "--host", "box", "runs", "--prune", "--keep", "1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "deleting 2 runs" in done.stdout and "deleted 2 runs" in done.stdout
    assert len(list(runs_dir.glob("2*"))) == 1
    rows = json.loads(gd(lab, "--host", "box", "runs", "prep", "--json").stdout)["runs"]
    assert len(rows) == 1


def test_pivot_over_ssh_prints_each_step_as_it_completes_on_the_box(lab, engines):
    # Two engines whose stop takes about 2 s each (the job's shell lingers after SIGTERM):
    # the first stop's line must be here while the second stop is still going on there.
    slow = {"slow-a": free_port(), "slow-c": free_port()}
    engines.update(slow)                       # the fixture stops these too
    (lab.work / "jobs.toml").write_text("".join(
        f'[jobs.{name}]\nengine = "sglang"\nport = {port}\nstop_timeout = "10s"\n'
        f'cmd = "trap \'sleep 2; exit 0\' TERM; {sys.executable} {STANDIN} --model-path /models/stand-in '
        f'--port {port} --load-seconds 0.1 & wait; wait"\n\n' for name, port in slow.items())
        + f"[jobs.eng-b]\n{_standin(engines['eng-b'])}\n")
    for name, port in slow.items():
        assert gd(lab, "--host", "box", "start", name).returncode == 0
        wait_for(lambda: _healthy(port), timeout=60, what=f"{name} healthy on box")
    proc = subprocess.Popen([sys.executable, "-m", "gpudeck.console.cli", "--host", "box", "pivot", "eng-b", "--yes"],
                            cwd=REPO, env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    arrived = {}
    for line in proc.stdout:
        if line.startswith("[ok] stop job "):
            arrived[line.split()[3]] = time.monotonic()
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert set(arrived) == {"slow-a", "slow-c"}
    first, second = sorted(arrived.values())
    assert second - first >= 1.0, f"the stop lines came together ({second - first:.2f} s apart): not live"
