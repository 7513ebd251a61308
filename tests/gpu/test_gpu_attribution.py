"""On a machine with 2+ NVIDIA GPUs: `gpus =` pins a job, and every process of a multi-process job is attributed to its own GPU.

Run on a GPU machine: python -m pytest tests/gpu/test_gpu_attribution.py -v -s
(skips where NVML, torch with CUDA, or a second GPU is missing).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpusupport import require_cuda, require_nvml  # noqa: E402

pynvml = require_nvml()
torch = require_cuda(min_gpus=2)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runsupport import wait_for, write_jobs  # noqa: E402

from gpudeck.jobs.runs import latest_run  # noqa: E402
from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor  # noqa: E402
from gpudeck.jobs.telemetry.sampler import make_sampler  # noqa: E402
from gpudeck.jobs.telemetry.status import status_payload  # noqa: E402

GIB = 2 ** 30
PY = sys.executable

# One "engine" process per visible GPU, like a tensor-parallel engine's workers: each
# holds (1 + its rank) GiB on cuda:rank, so the figures tell the workers apart.
WORKERS = """
import os, sys, time, torch, multiprocessing as mp

def worker(rank):
    torch.cuda.set_device(rank)   # else synchronize() opens a context on cuda:0 as well
    x = torch.empty(int((1 + rank) * 2**30), dtype=torch.uint8, device=f"cuda:{rank}")
    x.fill_(1); torch.cuda.synchronize()
    print(f"worker {rank} pid {os.getpid()} on cuda:{rank} visible={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    time.sleep(3600)

if __name__ == "__main__":
    mp.set_start_method("spawn")
    procs = [mp.Process(target=worker, args=(r,)) for r in range(torch.cuda.device_count())]
    for p in procs: p.start()
    for p in procs: p.join()
"""


def nvml_pids_by_gpu() -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        out[i] = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return out


def worker_pids(log: bytes) -> dict[int, int]:
    """{rank: pid} from the workers' own lines."""
    found = {}
    for line in log.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "worker":
            found[int(parts[1])] = int(parts[3])
    return found


@pytest.mark.parametrize("gpus, expect_physical", [([1], [1]), ([0, 1], [0, 1])])
def test_each_worker_is_attributed_to_its_own_physical_gpu(tmp_path, state, gpus, expect_physical):
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    sup = Supervisor(load_jobs(write_jobs(tmp_path / "jobs.toml", {
        "tp": {"cmd": [PY, str(script)], "gpus": gpus, "stop_timeout": 5}})))
    sup.start("tp")
    run = latest_run("tp")
    try:
        pids = wait_for(lambda: (lambda w: w if len(w) == len(gpus) else None)(worker_pids(run.log_path.read_bytes())),
                        timeout=180, what="every worker holding memory")
        assert f"visible={','.join(map(str, gpus))}".encode() in run.log_path.read_bytes()

        # NVML (physical indices) agrees with what gpus = asked for.
        by_gpu = wait_for(lambda: (lambda m: m if all(pids[r] in m[g] for r, g in enumerate(expect_physical)) else None)(
            nvml_pids_by_gpu()), timeout=60, what="NVML to list each worker on its GPU")
        for rank, physical in enumerate(expect_physical):
            others = [g for g in by_gpu if g != physical]
            assert all(pids[rank] not in by_gpu[g] for g in others), f"worker {rank} listed on another GPU"

        # gpudeck's own sampler and status payload attribute them the same way.
        with make_sampler() as sampler:
            snap = sampler.sample()
        payload = status_payload(snap)
        for rank, physical in enumerate(expect_physical):
            gpu = next(g for g in payload["gpus"] if g["index"] == physical)
            entry = next((p for p in gpu["processes"] if p["pid"] == pids[rank]), None)
            assert entry is not None, f"status: worker {rank} missing on GPU {physical}"
            assert entry["mem_used"] >= (1 + rank) * GIB * 0.95
            print(f"gpus={gpus}: worker {rank} pid {pids[rank]} -> GPU {physical} "
                  f"{entry['mem_used'] / GIB:.2f} GiB, command {entry.get('cmdline')!r:.60}")

        # The runner's own timeline (written with no console open) has per-GPU attribution too.
        def runner_saw_all():
            for s in reversed(run.samples()):
                by_pid = {(m["pid"], m["gpu"]) for m in (s.get("gpu") or {}).get("mem_by_pid", [])}
                if all((pids[r], g) in by_pid for r, g in enumerate(expect_physical)):
                    return s
            return None
        sample = wait_for(runner_saw_all, timeout=30, what="the runner's samples to attribute each worker")
        print(f"runner sample: {sample['gpu']['mem_by_pid']}")
    finally:
        report = sup.stop("tp")
    assert report.clean, report.lines()
