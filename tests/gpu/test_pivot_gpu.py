"""Pivot on a real NVIDIA GPU with torch stand-in engines: it waits for GPU memory, and names a holder that stays.

Run on a GPU box:  .venv/bin/python -m pytest tests/gpu/test_pivot_gpu.py -v -s
Needs torch with CUDA in the same interpreter and nvidia-ml-py; skips cleanly otherwise.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpusupport import require_cuda, require_nvml  # noqa: E402

torch = require_cuda()
pynvml = require_nvml()

pytestmark = pytest.mark.gpu


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudeck.jobs.engines.pivot import pivot  # noqa: E402
from gpudeck.jobs.runs import latest_run  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor  # noqa: E402
from runsupport import free_port, kill_run_leftovers, wait_for, write_jobs  # noqa: E402

STANDIN = Path(__file__).resolve().parent / "torch_engine_standin.py"
GPU = 0


def gpu_pids() -> set[int]:
    h = pynvml.nvmlDeviceGetHandleByIndex(GPU)
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


def job(port: int, gib: float, hold: float = 0.0) -> dict:
    return {"engine": "vllm", "port": port, "gpus": [GPU], "stop_timeout": "30s",
            "cmd": [sys.executable, str(STANDIN), "--port", str(port), "--gib", str(gib),
                    "--hold-after-term", str(hold)]}


@pytest.fixture
def sup(tmp_path):
    pa, pb = free_port(), free_port()
    path = write_jobs(tmp_path / "jobs.toml", {"eng-a": job(pa, 8, hold=4.0), "eng-b": job(pb, 2)})
    s = Supervisor(load_jobs(path), state_dir=tmp_path / "state")
    yield s
    for name in ("eng-a", "eng-b"):
        run = latest_run(name, s.state_dir)
        if run is not None:
            s.stop(name, timeout=5)
            kill_run_leftovers(run.run_id)


def wait_holding(run) -> None:
    wait_for(lambda: "Application startup complete." in run.log_path.read_text(errors="replace"),
             timeout=120, interval=0.2, what="stand-in holding GPU memory")


def test_pivot_waits_until_the_old_engine_released_its_memory(sup):
    sup.start("eng-a")
    run_a = latest_run("eng-a", sup.state_dir)
    wait_holding(run_a)
    a_pid = sup.job_state("eng-a").pid
    assert a_pid in gpu_pids()
    steps = []
    result = pivot(sup, "eng-b", wait=True, on_step=steps.append, ready_deadline_s=120)
    print("\n" + "\n".join(s.line() for s in steps))
    assert result.ok, result.message
    names = [s.name for s in steps]
    assert names.index("stop job eng-a") < names.index("verify GPUs free") < names.index("start eng-b")
    # The old engine held its 8 GiB for 4 s after SIGTERM: the stop waited for that.
    assert steps[0].duration_s >= 3.5
    assert a_pid not in gpu_pids()
    # B saw the GPU free when it started: A's 8 GiB were back.
    run_b = latest_run("eng-b", sup.state_dir)
    wait_holding(run_b)
    line = next(l for l in run_b.log_path.read_text().splitlines() if "GPU free at start" in l)
    free, total = map(float, re.search(r"free at start ([\d.]+) of ([\d.]+) GiB", line).groups())
    assert free > total - 2 - 2 - 1          # minus B's own 2 GiB, context, slack


def test_pivot_names_a_holder_that_does_not_let_go(sup, tmp_path):
    hog = subprocess.Popen([sys.executable, "-c",
                            "import torch, time\n"
                            "x = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1)\n"
                            "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)\n"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "holding"
        result = pivot(sup, "eng-b", gpu_deadline_s=10)
        assert not result.ok
        assert re.search(rf"GPU {GPU} still holds \d+ GiB for PID {hog.pid} \(python[\d.]*\), not started by gpudeck",
                         result.message), result.message
        assert latest_run("eng-b", sup.state_dir) is None          # the target was not started
        assert hog.poll() is None                                  # never touched
    finally:
        hog.kill()
        hog.wait(10)
