"""`gpudeck exporter` on a real NVIDIA GPU: the DCGM-named series agree with nvidia-smi.

Run on a GPU machine:  .venv/bin/python -m pytest tests/gpu/test_exporter_gpu.py -s -v
Skips cleanly without a GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpusupport import require_nvml

pytest.importorskip("prometheus_client")
require_nvml()
pytestmark = pytest.mark.gpu

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def smi(fields: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]


def test_dcgm_named_gpu_series_match_nvidia_smi(tmp_path):
    if not shutil.which("nvidia-smi"):
        pytest.skip("no nvidia-smi to compare with")
    # No jobs file anywhere: the exporter serves the GPUs alone and says so.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), GPUDECK_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "gpudeck.console.cli", "exporter", "--listen", "127.0.0.1:0"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        print(line.strip())
        assert "GPUs: NVML" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
            text = reply.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    rows = smi("index,uuid,name,memory.total,memory.used,temperature.gpu,power.draw")
    assert len(fams["DCGM_FI_DEV_GPU_UTIL"]) == len(rows)
    by_gpu = {name: {s.labels["gpu"]: s for s in fams[name]} for name in fams if name.startswith("DCGM_")}
    for index, uuid, name, total, used, temp, power in rows:
        util = by_gpu["DCGM_FI_DEV_GPU_UTIL"][index]
        print(f"GPU {index}: {util.labels}  " + "  ".join(
            f"{n[12:]}={by_gpu[n][index].value:g}" for n in sorted(by_gpu) if index in by_gpu[n]))
        assert util.labels["UUID"] == uuid and util.labels["modelName"] == name
        assert util.labels["device"] == f"nvidia{index}"
        assert 0.0 <= util.value <= 100.0
        assert by_gpu["DCGM_FI_DEV_FB_TOTAL"][index].value == pytest.approx(float(total), abs=2)
        assert by_gpu["DCGM_FI_DEV_FB_USED"][index].value == pytest.approx(float(used), abs=512)
        assert by_gpu["DCGM_FI_DEV_GPU_TEMP"][index].value == pytest.approx(float(temp), abs=5)
        assert by_gpu["DCGM_FI_DEV_POWER_USAGE"][index].value == pytest.approx(float(power), rel=0.5, abs=30)
