"""Pivot through gpudeck on real processes: SGLang STAND-IN engines (not a real SGLang), the real CLI."""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs.engines.discovery import discover_engines
from gpudeck.jobs.engines.pivot import PivotError, plan_pivot, pivot
from gpudeck.jobs.engines.readiness import port_listening
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor
from runsupport import cli, cli_env, free_port, kill_run_leftovers, tagged_pids, wait_for, write_jobs

STANDIN = Path(__file__).parent / "sglang_standin.py"
STANDIN_PKG = Path(__file__).parent / "standin_pkg"


def standin_job(port: int, load: float = 0.3) -> dict:
    return {"engine": "sglang", "port": port, "stop_timeout": "10s",
            "cmd": [sys.executable, str(STANDIN), "--model-path", "/models/stand-in", "--port", str(port),
                    "--enable-metrics", "--load-seconds", str(load)]}


@pytest.fixture
def box(tmp_path):
    ports = {"a": free_port(), "b": free_port()}
    path = write_jobs(tmp_path / "jobs.toml", {"eng-a": standin_job(ports["a"]),
                                               "eng-b": standin_job(ports["b"]),
                                               "builder": {"cmd": "sleep 300", "kind": "build"}})
    sup = Supervisor(load_jobs(path), state_dir=tmp_path / "state")
    yield sup, ports, path
    for name in ("eng-a", "eng-b", "builder"):
        run = latest_run(name, sup.state_dir)
        if run is not None:
            sup.stop(name, timeout=2)
            kill_run_leftovers(run.run_id)


def wait_ready(port: int) -> None:
    import urllib.request
    def ok():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
        except OSError:
            return False
    wait_for(ok, timeout=30, what=f"stand-in on {port} healthy")


def test_plan_lists_running_engines_and_leaves_builds_alone(box):
    sup, ports, _ = box
    sup.start("eng-a")
    sup.start("builder")
    wait_ready(ports["a"])
    plan = plan_pivot(sup, "eng-b", engines=[])
    assert [(s.kind, s.job) for s in plan.stops] == [("job", "eng-a")]
    text = "\n".join(plan.lines())
    assert "job eng-a" in text and "builder" not in text
    with pytest.raises(PivotError, match="already running"):
        plan_pivot(sup, "eng-a", engines=[])
    with pytest.raises(PivotError, match="not an engine job"):
        plan_pivot(sup, "builder", engines=[])


def test_the_plan_shows_a_list_command_as_the_shell_would_quote_it(box):
    # Found by its run, not by discovery (engines=[]): the plan printed the argv as a Python tuple,
    # "('python3', 'x.py', '18001')".
    sup, _, _ = box
    sup.start("eng-a")
    plan = plan_pivot(sup, "eng-b", engines=[])
    argv = sup.spec("eng-a").cmd
    assert isinstance(argv, tuple) and plan.stops[0].cmdline == shlex.join(argv)
    line = next(ln for ln in plan.lines() if "job eng-a" in ln)
    assert line.endswith(shlex.join(argv)[:160]) and "('" not in line, line


def test_pivot_stops_the_running_engine_and_follows_the_target_to_ready(box):
    sup, ports, _ = box
    sup.start("eng-a")
    wait_ready(ports["a"])
    run_a = latest_run("eng-a", sup.state_dir)
    seen = []
    result = pivot(sup, "eng-b", wait=True, on_step=seen.append, ready_deadline_s=60)
    assert result.ok, result.message
    assert [s.name for s in seen] == ["stop job eng-a", "verify GPUs free", "verify ports free",
                                      "start eng-b", "wait for eng-b ready"]
    assert tagged_pids(run_a.run_id) == []                     # nothing of the first engine remains
    assert not port_listening("127.0.0.1", ports["a"])
    assert port_listening("127.0.0.1", ports["b"])
    events_a = [e["event"] for e in run_a.events()]
    assert "PivotRequested" in events_a and "PivotCompleted" in events_a
    run_b = latest_run("eng-b", sup.state_dir)
    events_b = [e["event"] for e in run_b.events()]
    assert "PivotStarted" in events_b and events_b.count("PivotStepCompleted") == 5
    assert result.overhead_s < 5.0


def test_pivot_fails_clearly_when_the_target_port_is_taken(box, tmp_path):
    sup, ports, _ = box
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports["b"]))
    squatter.listen()
    try:
        started = time.monotonic()
        # The squatter never lets go: a 3 s wait for the port proves what the default 15 s would.
        result = pivot(sup, "eng-b", port_deadline_s=3)
    finally:
        squatter.close()
    assert time.monotonic() - started < 30
    assert not result.ok
    assert f"port {ports['b']} is still listening" in result.message
    assert str(os.getpid()) in result.message                  # the holder is named
    assert latest_run("eng-b", sup.state_dir) is None          # the target was not started


def test_cli_refuses_without_a_terminal_and_without_yes(box):
    sup, ports, path = box
    env = cli_env(sup.state_dir)
    out = cli(["--jobs", str(path), "pivot", "eng-b"], env, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    assert out.stderr.decode().strip().splitlines()[-1] == \
        "gpudeck: pivot needs confirmation: run it in a terminal or pass --yes"
    assert latest_run("eng-b", sup.state_dir) is None
    out = cli(["--jobs", str(path), "pivot", "nope", "--yes"], env)
    assert out.returncode == 2 and b"Traceback" not in out.stderr


def test_cli_pivot_prints_plan_and_timed_steps(box):
    sup, ports, path = box
    sup.start("eng-a")
    wait_ready(ports["a"])
    out = cli(["--jobs", str(path), "pivot", "eng-b", "--yes", "--wait", "--timeout", "60"],
              cli_env(sup.state_dir), timeout=120)
    text = out.stdout.decode()
    assert out.returncode == 0, out.stderr.decode()
    assert "will stop:" in text and "job eng-a" in text
    for step in ("[ok] stop job eng-a (", "[ok] verify GPUs free (", "[ok] verify ports free (",
                 "[ok] start eng-b (", "[ok] wait for eng-b ready ("):
        assert step in text
    assert "pivot overhead" in text


def foreign_standin(port: int) -> subprocess.Popen:
    """A stand-in launched like SGLang (`python -m sglang.launch_server`), outside gpudeck."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
    env["PYTHONPATH"] = str(STANDIN_PKG)
    return subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--gpudeck-stand-in",
                             "--model-path", "/models/foreign", "--port", str(port), "--load-seconds", "0.1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def test_foreign_engine_is_listed_and_survives_without_stop_foreign(box):
    sup, ports, _ = box
    port = free_port()
    proc = foreign_standin(port)
    try:
        wait_ready(port)
        found = [e for e in discover_engines() if e.pid == proc.pid]
        assert found and found[0].engine == "sglang" and not found[0].managed and found[0].port == port
        result = pivot(sup, "eng-b", wait=True, ready_deadline_s=60)
        assert result.ok, result.message
        assert proc.poll() is None                              # untouched
        # On another port and no GPU of the target's: --stop-foreign leaves it alone, and says so.
        plan = plan_pivot(sup, "eng-a", stop_foreign=True)
        assert not any(s.pid == proc.pid for s in plan.stops)
        assert any(s.kind == "foreign" and s.pid == proc.pid and not s.conflict for s in plan.foreign_left)
        text = "\n".join(plan.lines())
        assert "FOREIGN (not started by gpudeck)" in text and "left alone" in text
    finally:
        proc.kill()
        proc.wait(10)


def test_stop_foreign_stops_only_the_engine_in_the_targets_way(box):
    sup, ports, _ = box
    other_port = free_port()
    in_the_way = foreign_standin(ports["b"])          # holds eng-b's port
    beside = foreign_standin(other_port)              # another port (a test run beside it, say)
    try:
        wait_ready(ports["b"])
        wait_ready(other_port)
        plan = plan_pivot(sup, "eng-b", stop_foreign=True)
        assert [s.pid for s in plan.stops] == [in_the_way.pid]
        assert plan.stops[0].conflict == f"port {ports['b']}"
        assert any(s.pid == beside.pid for s in plan.foreign_left)
        steps = []
        result = pivot(sup, "eng-b", stop_foreign=True, on_step=steps.append, wait=True, ready_deadline_s=60)
        assert result.ok, result.message
        assert steps[0].name == f"stop foreign sglang PID {in_the_way.pid}"
        assert in_the_way.wait(10) is not None
        assert beside.poll() is None                            # left alone, still serving
        assert port_listening("127.0.0.1", other_port)
    finally:
        for proc in (in_the_way, beside):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_stop_foreign_judges_gpus_by_the_targets_gpu_list(tmp_path):
    """Which foreign engines hold the target's GPUs, from discovery's records (the GPU part needs no GPU here)."""
    from gpudeck.jobs.engines.discovery import EngineProcess
    port = free_port()
    path = write_jobs(tmp_path / "jobs.toml", {"eng-g": {**standin_job(port), "gpus": [0, 1]},
                                               "eng-all": standin_job(free_port())})
    sup = Supervisor(load_jobs(path), state_dir=tmp_path / "state")

    def foreign(pid: int, gpus: tuple[int, ...], fport: int) -> EngineProcess:
        return EngineProcess(pid=pid, engine="vllm", port=fport, gpu_mem=2**30, cmdline="vllm serve m",
                             managed=False, gpus=gpus)
    engines = [foreign(101, (1,), 9001), foreign(102, (2, 3), 9002), foreign(103, (), port)]
    plan = plan_pivot(sup, "eng-g", stop_foreign=True, engines=engines)
    assert {s.pid: s.conflict for s in plan.stops} == {101: "GPU 1", 103: f"port {port}"}
    assert [s.pid for s in plan.foreign_left] == [102]
    # A target without a GPU list takes every GPU: each engine on a GPU is in its way.
    plan = plan_pivot(sup, "eng-all", stop_foreign=True, engines=engines)
    assert [s.pid for s in plan.stops] == [101, 102]
    assert [s.pid for s in plan.foreign_left] == [103]
    # Without --stop-foreign nothing foreign is stopped.
    assert plan_pivot(sup, "eng-g", engines=engines).stops == []


def test_status_json_lists_managed_and_foreign_engines(tmp_path):
    port_m, port_f = free_port(), free_port()
    path = write_jobs(tmp_path / "jobs.toml", {"sg": {
        "engine": "sglang", "port": port_m, "stop_timeout": "10s",
        "env": {"PYTHONPATH": str(STANDIN_PKG)},
        "cmd": [sys.executable, "-m", "sglang.launch_server", "--gpudeck-stand-in", "--model-path",
                "/models/managed", "--port", str(port_m), "--load-seconds", "0.1"]}})
    sup = Supervisor(load_jobs(path), state_dir=tmp_path / "state")
    foreign = foreign_standin(port_f)
    try:
        run_id = sup.start("sg")
        wait_ready(port_m)
        wait_ready(port_f)
        out = cli(["status", "--json", "--interval", "0"], cli_env(sup.state_dir))
        assert out.returncode == 0, out.stderr.decode()
        engines = {e["port"]: e for e in json.loads(out.stdout)["engines"]}
        assert engines[port_m]["managed"] is True and engines[port_m]["job"] == "sg"
        assert engines[port_m]["engine"] == "sglang" and engines[port_m]["run_id"] == run_id
        assert engines[port_f]["managed"] is False and engines[port_f]["job"] is None
        assert engines[port_f]["pid"] == foreign.pid
        assert "sglang.launch_server" in engines[port_f]["cmdline"]
        assert set(engines[port_f]) >= {"pid", "engine", "port", "gpu_mem", "cmdline", "managed", "job"}
    finally:
        sup.stop("sg", timeout=2)
        foreign.kill()
        foreign.wait(10)


def test_jobs_json_phase_ready_only_when_answering_and_serving_from_metrics(tmp_path):
    port = free_port()
    path = write_jobs(tmp_path / "jobs.toml", {"sg": {
        "engine": "sglang", "port": port, "metrics_path": "/metrics", "stop_timeout": "10s",
        "cmd": [sys.executable, str(STANDIN), "--model-path", "/models/m", "--port", str(port),
                "--enable-metrics", "--load-seconds", "1.5", "--accept-len", "1.1", "--accept-rate", "0.05"]}})
    sup = Supervisor(load_jobs(path), state_dir=tmp_path / "state")
    env = cli_env(sup.state_dir)

    def job_json():
        out = cli(["--jobs", str(path), "jobs", "--json"], env)
        assert out.returncode == 0, out.stderr.decode()
        return json.loads(out.stdout)["jobs"][0]
    try:
        sup.start("sg")
        first = job_json()
        assert first["engine_status"]["ready"] is False and first["phase"] != "ready"
        wait_ready(port)
        ready = job_json()
        assert ready["phase"] == "ready" and ready["engine_status"]["ready"]
        assert ready["serving"]["running"] == 0 and ready["serving"]["source"] == "metrics"
        assert not [a for a in ready["alerts"] if a["code"] == "spec_decode_ineffective"]   # idle: no verdict
        import threading
        import urllib.request
        body = json.dumps({"text": "x", "sampling_params": {"max_new_tokens": 600}}).encode()
        busy = threading.Thread(target=lambda: urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/generate", data=body), timeout=60).read())
        busy.start()
        try:
            decoding = wait_for(lambda: (lambda j: j if j["serving"]["running"] else None)(job_json()),
                                timeout=20, what="a request running")
        finally:
            busy.join(60)
        codes = [a["code"] for a in decoding["alerts"]]
        assert codes.count("spec_decode_ineffective") == 1
    finally:
        sup.stop("sg", timeout=2)
