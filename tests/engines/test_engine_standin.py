"""Readiness and serving numbers against the SGLang STAND-IN (real process, real HTTP; not a real SGLang)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpudeck.jobs.engines.monitor import EngineMonitor
from gpudeck.jobs.engines.profiles import engine_settings
from gpudeck.jobs.spec import JobSpec
from runsupport import free_port

STANDIN = Path(__file__).parent / "sglang_standin.py"


@pytest.fixture
def standin(tmp_path):
    procs = []

    def start(*extra: str, load_seconds: float = 1.0, metrics_path=None):
        port = free_port()
        log = tmp_path / f"standin-{port}.log"
        cmd = [sys.executable, str(STANDIN), "--model-path", "/models/stand-in", "--port", str(port),
               "--load-seconds", str(load_seconds), *extra]
        with open(log, "wb") as fh:
            procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT))
        spec = JobSpec(name="sg", cmd=["python", "-m", "sglang.launch_server", "--model-path",
                                       "/models/stand-in", "--port", str(port), *extra],
                       kind="engine", engine="sglang", metrics_path=metrics_path)
        return EngineMonitor(engine_settings(spec), log), port
    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def poll_until(monitor, predicate, deadline_s=30.0):
    end = time.monotonic() + deadline_s
    seen = []
    while time.monotonic() < end:
        status = monitor.poll()
        seen.append(status.phase)
        if predicate(status):
            return status, seen
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {deadline_s}s; last: {status}")


def generate(port: int, tokens: int = 60) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate",
                                 data=json.dumps({"text": "hello there",
                                                  "sampling_params": {"max_new_tokens": tokens}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_ready_only_after_log_port_and_health(standin):
    monitor, port = standin("--enable-metrics", "--warmup-seconds", "0.8")
    status, seen = poll_until(monitor, lambda s: s.phase == "ready")
    assert seen[0] == "starting"                        # loading: no port yet
    assert "ready on port" in status.detail
    assert monitor.last.log_ready and monitor.last.health_status == 200


def test_serving_numbers_from_sglang_metrics(standin):
    monitor, port = standin("--enable-metrics", "--accept-len", "1.1", "--accept-rate", "0.04")
    poll_until(monitor, lambda s: s.phase == "ready")
    generate(port)
    status, _ = poll_until(monitor, lambda s: s.serving and s.serving.prompt_tokens_per_s is not None)
    assert status.serving_source == "metrics"
    assert status.serving.spec_accept_len == pytest.approx(1.1)
    assert monitor.metrics_available is True


def test_log_fallback_when_metrics_are_off(standin):
    monitor, port = standin("--accept-len", "2.3", "--accept-rate", "0.6")
    poll_until(monitor, lambda s: s.phase == "ready")
    generate(port, tokens=300)                           # ~1.5 s: the stand-in logs Decode batch lines
    status, _ = poll_until(monitor, lambda s: s.serving is not None)
    assert monitor.settings.metrics_path is None        # no --enable-metrics: not even asked
    assert status.serving_source == "log"
    assert status.serving.spec_accept_len == pytest.approx(2.3)
    assert status.serving.gen_tokens_per_s == pytest.approx(180.0)
    assert status.alerts == ()


def test_metrics_404_falls_back_to_the_log(standin):
    # jobs.toml claims metrics, but the server was started without them.
    monitor, port = standin("--accept-len", "1.2", "--accept-rate", "0.05", metrics_path="/metrics")
    poll_until(monitor, lambda s: s.phase == "ready")
    generate(port, tokens=300)
    status, _ = poll_until(monitor, lambda s: s.serving is not None)
    assert monitor.metrics_available is False           # /metrics answered 404
    assert status.serving_source == "log"
    assert [a.kind for a in status.alerts] == ["spec_decode_ineffective"]


def test_unhealthy_once_a_ready_engine_stops_answering(standin):
    monitor, port = standin("--enable-metrics", load_seconds=0.2)
    poll_until(monitor, lambda s: s.phase == "ready")
    # The stand-in is the newest child: stop it as an engine core dying would.
    import psutil
    for child in psutil.Process().children():
        if str(port) in " ".join(child.cmdline()):
            child.kill()
            child.wait(10)
    status, _ = poll_until(monitor, lambda s: s.phase == "unhealthy")
    assert "not listening" in status.detail
