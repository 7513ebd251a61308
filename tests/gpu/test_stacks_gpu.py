"""`gpudeck stacks --native` on a real NVIDIA GPU: a torch job blocked in torch.cuda.synchronize() behind a spinning kernel.

Run on a GPU box:  python3 -m pytest tests/gpu/test_stacks_gpu.py -v -rs
Needs torch with CUDA, nvidia-ml-py and py-spy (on $PATH, next to python, in `bin/` of a $PYTHONPATH
entry such as /tmp/site where device_batch.sh installs the carried wheels, or named by
$GPUDECK_PY_SPY); skips cleanly, with the reason, otherwise. Cannot hang: every CLI call has a
timeout, the kernels end by themselves in ~2 minutes, and the job is stopped in a finally.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusupport import require_cuda, require_nvml  # noqa: E402

torch = require_cuda()
pynvml = require_nvml()

from gpudeck.jobs import stacks  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor  # noqa: E402

pytestmark = pytest.mark.gpu          # bounded by its own deadlines: that machine may lack pytest-timeout

if stacks.find_py_spy() is None:
    pytest.skip("py-spy not found ($GPUDECK_PY_SPY, next to python, $PYTHONPATH/*/bin, $PATH)",
                allow_module_level=True)
if stacks.ptrace_refusal() is not None:
    pytest.skip(stacks.ptrace_refusal(), allow_module_level=True)

PY = sys.executable

# ~0.5 s of spinning per kernel at ~2 GHz: 240 of them keep the GPU busy ~2 minutes, then the job ends
# by itself; the CPU meanwhile waits in torch.cuda.synchronize() (line 11).
SYNC = r"""
import torch
torch.cuda.init()
x = torch.ones(1, device="cuda")
torch.cuda.synchronize()
for _ in range(240):
    torch.cuda._sleep(1_000_000_000)
print("kernels queued; synchronizing", flush=True)

def wait_for_the_gpu():
    torch.cuda.synchronize()

wait_for_the_gpu()
print("synchronized", flush=True)
"""


def cli(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    # The checkout as the machine runs it (device_batch.sh's shim on PYTHONPATH): `python -m`, never an entry point.
    return subprocess.run([PY, "-m", "gpudeck.console.cli", *args], env=env, capture_output=True, timeout=timeout)


def test_a_job_in_cuda_synchronize_behind_a_spinning_kernel_is_named(tmp_path):
    script = tmp_path / "sync_job.py"
    script.write_text(SYNC)
    jobs = tmp_path / "jobs.toml"
    # No dump of its own on a stall: this test's dumps are the ones that count.
    jobs.write_text(f"[jobs.sync]\nkind = \"stage\"\ngpus = [0]\ndump_on_stall = false\n"
                    f"cmd = [{json.dumps(PY)}, {json.dumps(str(script))}]\n")
    state = tmp_path / "state"
    env = {**os.environ, "GPUDECK_STATE_DIR": str(state)}
    env.setdefault(stacks.PY_SPY_ENV, stacks.find_py_spy())
    sup = Supervisor(load_jobs(jobs), state_dir=state)
    sup.start("sync")
    try:
        log = sup.latest("sync").log_path
        deadline = time.monotonic() + 120
        while not (log.exists() and b"synchronizing" in log.read_bytes()):
            assert time.monotonic() < deadline, f"the job never queued its kernels: {log.read_text(errors='replace')[-2000:]}"
            assert sup.job_state("sync").live, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        data: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = cli(["--jobs", str(jobs), "stacks", "sync", "--native", "--json"], env, timeout=90)
            assert out.returncode in (0, 1), out.stderr.decode(errors="replace")
            data = json.loads(out.stdout) if out.returncode == 0 else {}
            if data.get("processes") and data["processes"][0]["wait"]["kind"] == "cuda_sync":
                break
            time.sleep(0.5)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        print(f"verdict: {data.get('verdict')!r}; GPU 0 util {util}%; py-spy {data.get('py_spy')}")
        assert data.get("native") is True, data
        assert data["verdict"].startswith(
            "1 of 1 process in a CUDA synchronize (torch.cuda.synchronize) at sync_job.py:11 (wait_for_the_gpu)"), \
            data["verdict"]
        [group] = [g for g in data["groups"] if not g["helper"]]
        names = [f["name"] for f in group["frames"]]
        assert "synchronize" in names and "wait_for_the_gpu" in names
        assert any(f["native"] for f in group["frames"]), "--native brought no C frames"
        assert sup.job_state("sync").live, "the job ended before the dump: the test proved nothing"
    finally:
        sup.stop("sync", timeout=15)
