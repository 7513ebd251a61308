"""Stall rules on a real NVIDIA GPU: a torch job blocked with the GPU idle is stalled; one keeping it busy is not.

Run on a GPU box:  .venv/bin/python -m pytest tests/gpu/test_stall_gpu.py -v -s
Needs torch with CUDA in the same interpreter and nvidia-ml-py; skips cleanly otherwise.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pytest

from gpusupport import require_cuda, require_nvml  # noqa: E402

torch = require_cuda()
pynvml = require_nvml()

from gpudeck.jobs.spec import load_jobs  # noqa: E402
from gpudeck.jobs.payload import jobs_payload  # noqa: E402
from gpudeck.jobs.supervisor import Supervisor  # noqa: E402

pytestmark = pytest.mark.gpu


STALL_AFTER = 5.0
PY = sys.executable

# Allocates, works, then blocks forever: the process lives, holds GPU memory, and does nothing.
BLOCKED = r"""
import threading, torch
x = torch.randn(8192, 8192, device="cuda")
for _ in range(40):
    y = x @ x
torch.cuda.synchronize()
print(f"matmuls done; holding {torch.cuda.memory_allocated() >> 20} MiB; waiting", flush=True)
threading.Event().wait()
"""

# Keeps the GPU busy with real matmuls, silent log, and a *blocking* sync so its CPU
# sleeps: the GPU is the only sign of life the rules can see.
BUSY = r"""
import torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("busy loop started", flush=True)
while True:
    for _ in range(200):
        y = x @ x
    ev = torch.cuda.Event(blocking=True)
    ev.record()
    ev.synchronize()
"""

# A spinning kernel with a blocking wait: util pinned at 100% at near-idle power and a
# silent log, which is what a rank stuck in an NCCL collective looks like.
SPIN = r"""
import torch
torch.cuda.init()
print("entering the collective", flush=True)
while True:
    torch.cuda._sleep(500_000_000)
    ev = torch.cuda.Event(blocking=True)
    ev.record()
    ev.synchronize()
"""


def start(tmp_path: Path, name: str, script: str) -> tuple[Supervisor, str]:
    (tmp_path / f"{name}.py").write_text(script)
    (tmp_path / "jobs.toml").write_text(
        f"[jobs.{name}]\nkind = \"stage\"\ngpus = [0]\nstall_after = {STALL_AFTER}\n"
        f"cmd = [{json.dumps(PY)}, {json.dumps(str(tmp_path / (name + '.py')))}]\n")
    sup = Supervisor(load_jobs(tmp_path / "jobs.toml"), state_dir=tmp_path / "state")
    return sup, sup.start(name)


def entry(sup: Supervisor, name: str) -> dict:
    return next(j for j in jobs_payload(sup)["jobs"] if j["name"] == name)


def codes(e: dict) -> set[str]:
    return {a["code"] for a in e.get("alerts") or []}


def wait_for_line(sup: Supervisor, name: str, needle: bytes, timeout: float = 120.0) -> float:
    log = sup.latest(name).log_path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_bytes():
            return time.time()
        assert entry(sup, name)["state"] in ("starting", "running"), log.read_text(errors="replace")[-2000:]
        time.sleep(0.1)
    raise AssertionError(f"{name} never printed {needle!r}: {log.read_text(errors='replace')[-2000:]}")


def gpu_timeline(sup: Supervisor, name: str) -> dict:
    """Util / power / CPU the runner recorded for the job, for the report and for proof."""
    samples = [json.loads(line) for line in sup.latest(name).samples_path.read_text().splitlines() if line.strip()]
    util = [v for s in samples for v in (s.get("gpu", {}).get("util") or {}).values() if v is not None]
    power = [v for s in samples for v in (s.get("gpu", {}).get("power_w") or {}).values() if v is not None]
    return {"samples": len(samples), "util_max": max(util, default=None),
            "util_median": statistics.median(util) if util else None,
            "power_median_w": statistics.median(power) if power else None}


@pytest.fixture
def stopper():
    started: list[tuple[Supervisor, str]] = []
    yield started
    for sup, name in started:
        try:
            sup.stop(name, timeout=10)
        except Exception:
            pass


def test_torch_job_blocked_with_idle_gpu_is_stalled(tmp_path, stopper):
    sup, _ = start(tmp_path, "blocked", BLOCKED)
    stopper.append((sup, "blocked"))
    quiet = wait_for_line(sup, "blocked", b"waiting")
    # NVML's utilization is averaged over up to a second: allow it to fall to 0.
    bound = STALL_AFTER + 4.0
    deadline = time.monotonic() + bound + 20
    flagged = None
    while time.monotonic() < deadline:
        if "stalled" in codes(entry(sup, "blocked")):
            flagged = time.time()
            break
        time.sleep(0.1)
    timeline = gpu_timeline(sup, "blocked")
    print(f"blocked: flagged {None if flagged is None else round(flagged - quiet, 2)}s after quiet; {timeline}")
    assert flagged is not None, f"never flagged: {entry(sup, 'blocked')}"
    assert flagged - quiet <= bound
    assert timeline["util_max"] is not None, "the runner recorded no GPU utilization for the job"


def test_torch_job_keeping_the_gpu_busy_is_not_stalled(tmp_path, stopper):
    sup, _ = start(tmp_path, "busy", BUSY)
    stopper.append((sup, "busy"))
    wait_for_line(sup, "busy", b"busy loop started")
    watch = STALL_AFTER + 8.0
    deadline = time.monotonic() + watch
    while time.monotonic() < deadline:
        e = entry(sup, "busy")
        assert e["state"] == "running", e
        assert not codes(e) & {"stalled", "nccl_hang"}, f"busy GPU job falsely flagged: {e['alerts']}"
        time.sleep(0.25)
    timeline = gpu_timeline(sup, "busy")
    print(f"busy: {timeline}")
    assert timeline["util_median"] is not None and timeline["util_median"] > 50, \
        "the GPU was not busy: the test proved nothing"


def test_spinning_kernel_at_idle_power_with_silent_log_is_an_nccl_hang(tmp_path, stopper):
    sup, _ = start(tmp_path, "spin", SPIN)
    stopper.append((sup, "spin"))
    quiet = wait_for_line(sup, "spin", b"entering the collective")
    deadline = time.monotonic() + STALL_AFTER + 30
    flagged = None
    while time.monotonic() < deadline:
        e = entry(sup, "spin")
        if "nccl_hang" in codes(e):
            flagged = time.time()
            break
        time.sleep(0.2)
    timeline = gpu_timeline(sup, "spin")
    print(f"spin: flagged {None if flagged is None else round(flagged - quiet, 2)}s after quiet; {timeline}")
    assert flagged is not None, f"nccl_hang not raised: {entry(sup, 'spin')['alerts']} {timeline}"
    assert "stalled" not in codes(entry(sup, "spin"))
