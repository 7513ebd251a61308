"""A REAL vLLM (CPU build, tiny local model) driven through gpudeck: ready, serving, completion, pivot, foreign.

One test on purpose: each vLLM launch costs ~30 s of the machine's two cores, so
the story runs once: start -> ready -> serve -> pivot (foreign one untouched).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from gpudeck.jobs.engines.discovery import discover_engines
from gpudeck.jobs.engines.monitor import EngineMonitor
from gpudeck.jobs.engines.pivot import pivot
from gpudeck.jobs.engines.profiles import engine_settings
from gpudeck.jobs.procs import port_listening, read_stat
from gpudeck.jobs.runs import latest_run
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor
from runsupport import free_port, kill_run_leftovers, tagged_pids, wait_for, write_jobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

READY_DEADLINE_S = 300          # ~30 s alone on 2 cores; two at once and a busy CI box take longer


def vllm_job(env, port: int, cache) -> dict:
    serve_env = env.serve_env(cache)
    job_env = {k: serve_env[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                         "VLLM_NO_USAGE_STATS", "VLLM_CACHE_ROOT", "PYTHONUNBUFFERED",
                                         "PYTHONDONTWRITEBYTECODE")}
    return {"engine": "vllm", "port": port, "stop_timeout": "30s", "env": job_env,
            "cmd": env.serve_argv(port)}


def complete(port: int, prompt: str = "def main(", tokens: int = 24) -> dict:
    body = json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": tokens}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state != "Z"


def test_real_vllm_ready_serving_pivot_and_foreign(vllm_env, tmp_path):
    p1, p2, pf = free_port(), free_port(), free_port()
    path = write_jobs(tmp_path / "jobs.toml", {
        "vllm-a": vllm_job(vllm_env, p1, vllm_env.cache_root),
        "vllm-b": vllm_job(vllm_env, p2, vllm_env.cache_root)})
    sup = Supervisor(load_jobs(path), state_dir=tmp_path / "state")
    foreign_log = open(tmp_path / "foreign.log", "wb")
    foreign_env = {k: v for k, v in vllm_env.serve_env(vllm_env.cache_root).items()
                   if not k.startswith("GPUDECK_")}
    # A vLLM started by hand, outside gpudeck, in its own session like an operator's nohup.
    foreign = subprocess.Popen(vllm_env.serve_argv(pf), env=foreign_env, stdout=foreign_log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        run_id = sup.start("vllm-a")
        run_a = latest_run("vllm-a", sup.state_dir)
        monitor = EngineMonitor(engine_settings(sup.spec("vllm-a")), run_a.log_path)
        phases = []
        status = None
        end = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < end:
            status = monitor.poll()
            phases.append(status.phase)
            if status.phase == "ready":
                break
            assert sup.job_state("vllm-a").live, run_a.log_path.read_text()[-3000:]
            time.sleep(0.5)
        assert status.phase == "ready", status.detail
        print(f"\n[vllm] launch -> ready through gpudeck: {time.monotonic() - t0:.1f} s")
        assert phases[0] == "starting"

        out = complete(p1)
        assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] > 0
        # Serving numbers: two scrapes around traffic give counter deltas.
        complete(p1, tokens=48)
        status = monitor.poll()
        assert status.serving_source == "metrics"
        assert status.serving.running == 0 and status.serving.kv_cache_pct is not None
        complete(p1, tokens=48)
        time.sleep(0.2)
        status = monitor.poll()
        assert status.serving.gen_tokens_per_s > 0 and status.serving.prompt_tokens_per_s > 0

        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{pf}/health", timeout=2).status == 200
                 if port_listening(pf) else False, timeout=READY_DEADLINE_S, interval=0.5,
                 what="the foreign vLLM ready")
        engines = {e.port: e for e in discover_engines()}
        a, f = engines[p1], engines[pf]
        assert a.managed and a.job == "vllm-a" and a.run_id == run_id and a.engine == "vllm"
        titles = [m.title for m in a.members]
        assert "VLLM::EngineCore" in titles and any(t.startswith("VLLM::Worker") for t in titles)
        assert not f.managed and f.pid == foreign.pid and f.job is None
        a_pids = [m.pid for m in a.members]

        result = pivot(sup, "vllm-b", wait=True, ready_deadline_s=READY_DEADLINE_S)
        assert result.ok, result.message
        print(f"[vllm] pivot {result.duration_s:.1f} s, overhead {result.overhead_s:.2f} s: "
              + "; ".join(f"{s.name} {s.duration_s:.2f}s" for s in result.steps))
        # Nothing of the first engine remains: no tagged process, none of its tree, its port free.
        assert tagged_pids(run_id) == []
        assert [p for p in a_pids if alive(p)] == []
        assert not port_listening(p1)
        assert complete(p2)["choices"][0]["text"]
        # The foreign vLLM was listed but not touched.
        assert foreign.poll() is None
        assert urllib.request.urlopen(f"http://127.0.0.1:{pf}/health", timeout=5).status == 200
    finally:
        for name in ("vllm-a", "vllm-b"):
            run = latest_run(name, sup.state_dir)
            if run is not None:
                sup.stop(name, timeout=10)
                kill_run_leftovers(run.run_id)
        if foreign.poll() is None:
            os.killpg(foreign.pid, signal.SIGTERM)
            try:
                foreign.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(foreign.pid, signal.SIGKILL)
                foreign.wait(10)
        foreign_log.close()
