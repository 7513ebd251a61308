"""On a real NVIDIA GPU: stop frees the GPU memory of a job's whole tree (setsid child included); a foreign holder is reported, not killed.

Run on a GPU machine: .venv/bin/python -m pytest tests/gpu/test_stop_gpu.py -q -rs
(skips cleanly where NVML or torch with CUDA is missing).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


from gpusupport import require_cuda, require_nvml  # noqa: E402

pynvml = require_nvml()
torch = require_cuda()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runsupport import wait_for, write_jobs  # noqa: E402

from gpudeck.jobs.runs import latest_run  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor, run_processes  # noqa: E402

GIB = 2 ** 30
PY = sys.executable

HOLDER = """
import os, subprocess, sys, time, torch
gib = float(sys.argv[1])
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
if len(sys.argv) > 2 and sys.argv[2] == "with-child":
    # A child in a session of its own, also holding memory: it survives a SIGKILL of this parent.
    subprocess.Popen([sys.executable, __file__, str(gib)], start_new_session=True)
print("holding", os.getpid(), flush=True)
time.sleep(3600)
"""


def gpu0_used() -> int:
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used


def gpu0_pids() -> set[int]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def test_stop_frees_the_gpu_memory_of_the_whole_tree(tmp_path, state):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", {"holder": {
        # Ignores SIGTERM so that stop has to escalate to SIGKILL of the group and the escapee.
        "cmd": f"trap '' TERM; exec {PY} {script} 1 with-child", "gpus": [0], "stop_timeout": 3}})))
    baseline = gpu0_used()
    run_id = sup.start("holder")
    run = latest_run("holder")
    wait_for(lambda: run.log_path.read_bytes().count(b"holding") >= 2, timeout=120, what="two holders")
    wait_for(lambda: gpu0_used() >= baseline + int(1.8 * GIB), timeout=60, what="2 GiB in use")
    tree = {st.pid for st in run_processes(run)}
    assert len(tree) >= 2
    report = sup.stop("holder")
    assert report.gpu_checked, report.gpu_unavailable_reason
    assert report.clean, report.lines()
    assert not [h for h in report.gpu_holders if h.owned]
    wait_for(lambda: gpu0_used() <= baseline + 256 * 2**20, timeout=30, what="memory back near baseline")
    assert not (gpu0_pids() & tree), "a pid of the run is still in NVML's process list"
    samples = run.samples()
    assert any((s.get("gpu") or {}).get("mem", 0) >= GIB for s in samples), "the runner's timeline saw GPU memory"
    print(f"baseline {baseline / GIB:.2f} GiB, after stop {gpu0_used() / GIB:.2f} GiB, run {run_id}, "
          f"stop took {report.duration_s:.1f}s")


def test_a_left_behind_holder_outside_the_run_is_reported_not_killed(tmp_path, state):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    foreign = subprocess.Popen([PY, str(script), "0.5"], stdout=subprocess.PIPE)
    try:
        assert foreign.stdout.readline().startswith(b"holding")
        sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", {
            "job": {"cmd": "sleep 300", "gpus": [0], "stop_timeout": 2}})))
        sup.start("job")
        wait_for(lambda: latest_run("job").job_id(), what="job pid")
        report = sup.stop("job")
        assert report.gpu_checked
        others = [h for h in report.gpu_holders if not h.owned]
        assert others, f"the foreign holder was not reported: {report.lines()}"
        assert any((h.gpu_mem or 0) >= 400 * 2**20 for h in others)
        assert any("left alone" in line for line in report.lines())
        assert report.clean, "a foreign holder does not make the job's own stop unclean"
        assert foreign.poll() is None, "stop killed a process it did not start"
    finally:
        foreign.kill()
        foreign.wait()
