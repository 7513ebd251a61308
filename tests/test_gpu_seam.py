"""The GPU seam: every implementation (NVML, nvidia-smi, SIMULATED) answers the same questions the same way.

NVML runs against a fake pynvml module, nvidia-smi against a stand-in `nvidia-smi` script answering the
exact queries in the driver's CSV format; the real driver is exercised by tests/gpu/ on a GPU machine.
"""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpudeck.jobs.telemetry import gpu
from gpudeck.jobs.telemetry.gpu.nvidia_smi import APP_FIELDS, SMI_FIELDS, SmiGpuSource
from gpudeck.jobs.telemetry.gpu.nvml import NvmlGpuSource
from gpudeck.jobs.telemetry.simulated import SimulatedGpuBackend
from test_telemetry_nvml import make_fake_nvml

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30
MiB = 1 << 20


def nvml_backend(**kwargs) -> NvmlGpuSource:
    # GPU 0 holds two processes (one also drawing graphics), GPU 1 none.
    nvml = make_fake_nvml(count=2, pids={0: [(4242, 9 * GiB), (4343, 1 * GiB)]}, **kwargs)
    nvml.nvmlSystemGetDriverVersion = lambda: b"580.159.04"
    # As the nvidia-smi stand-in says: 10 GiB in use on GPU 0, 1 MiB on GPU 1.
    nvml.nvmlDeviceGetMemoryInfo = lambda h, *version: SimpleNamespace(used=10 * GiB if h[1] == 0 else MiB,
                                                                       total=143771 * MiB, free=0)
    nvml.nvmlDeviceGetGraphicsRunningProcesses = lambda h: ([SimpleNamespace(pid=4343, usedGpuMemory=2 * GiB)]
                                                            if h[1] == 0 else [])
    return NvmlGpuSource(nvml, pcie=False)


def smi_backend(tmp_path: Path, *, answer: bool = True) -> SmiGpuSource:
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text(
        "#!/bin/sh\n"
        '[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
        'case "$1" in\n'
        f'  "--query-gpu={",".join(SMI_FIELDS)}")\n'
        '    echo "0, NVIDIA H200, GPU-aaaa, 87, 41, 10240, 143771, 61, 512.35, 700.00, 1980, 3201, [N/A]"\n'
        '    echo "1, NVIDIA H200, GPU-bbbb, 0, 0, 1, 143771, 33, 118.02, 700.00, 345, 3201, [Not Supported]";;\n'
        f'  "--query-compute-apps={",".join(APP_FIELDS)}")\n'
        '    echo "GPU-aaaa, 4242, 9216"\n'
        '    echo "GPU-aaaa, 4343, 2048";;\n'
        '  "--query-gpu=driver_version,name")\n'
        '    echo "580.159.04, NVIDIA H200"\n'
        '    echo "580.159.04, NVIDIA H200";;\n'
        '  *) exit 9;;\n'
        'esac\n' if answer else "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    stand_in.chmod(0o755)
    return SmiGpuSource(str(stand_in))


@pytest.fixture(params=["nvml", "nvidia-smi", "simulated"])
def backend(request, tmp_path):
    if request.param == "nvml":
        return nvml_backend()
    if request.param == "nvidia-smi":
        return smi_backend(tmp_path)
    return SimulatedGpuBackend()


def test_every_backend_answers_the_seams_questions(backend):
    assert backend.kind in gpu.KINDS and backend.label and backend.visible_devices_var
    assert backend.available() and backend.error is None
    samples, error = backend.read()
    assert error is None and samples
    indices = {s.index for s in samples}
    assert len(indices) == len(samples)

    holders = backend.holders()
    assert holders and all(isinstance(h, gpu.GpuHolder) and h.gpu in indices and h.pid > 0 for h in holders)
    assert len({(h.gpu, h.pid) for h in holders}) == len(holders)           # one entry a process a GPU

    memory = backend.memory()
    assert set(memory.used) <= indices and all(v >= 0 for v in memory.used.values())
    busy = {h.gpu for h in memory.holders}
    assert not memory.released(busy, idle_bytes=1 << 62)                     # someone holds memory there
    assert memory.released(busy, ignore_pids={h.pid for h in memory.holders}, idle_bytes=1 << 62)
    assert not memory.released(busy, ignore_pids={h.pid for h in memory.holders}, idle_bytes=0)

    first = min(indices)
    figures = backend.figures({first})
    assert set(figures) == {first}
    assert figures[first].mem_used is not None and figures[first].power_limit_w is not None
    assert backend.figures(()) == {}

    info = backend.driver()
    assert info.version and len(info.names) == len(samples)
    backend.close()


def test_the_backends_agree_on_who_holds_what(tmp_path):
    """NVML and nvidia-smi describe the same box (GPU 0: PIDs 4242 with 9 GiB, 4343; GPU 1 idle) alike."""
    nvml, smi = nvml_backend(), smi_backend(tmp_path)
    for b in (nvml, smi):
        held = {(h.gpu, h.pid) for h in b.holders()}
        assert held == {(0, 4242), (0, 4343)}, b.kind
        mem = {h.pid: h.mem_used for h in b.holders()}
        assert mem[4242] == 9 * GiB, b.kind
        assert mem[4343] == 2 * GiB, b.kind                  # the larger of its compute and graphics use
        assert b.memory().released({1}, idle_bytes=1 * GiB), b.kind
        assert not b.memory().released({0}, idle_bytes=1 * GiB), b.kind


@pytest.mark.parametrize("make", ["nvml", "nvidia-smi"])
def test_an_unavailable_backend_says_why_and_raises_only_from_driver(make, tmp_path):
    b = NvmlGpuSource(make_fake_nvml(init_error=12), pcie=False) if make == "nvml" else \
        smi_backend(tmp_path, answer=False)
    assert not b.available()
    assert b.read()[0] == () and b.read()[1]
    assert b.holders() is None and b.memory() is None and b.figures({0}) == {}
    assert b.error and "\n" not in b.error
    with pytest.raises(gpu.GpuUnavailable) as raised:
        b.driver()
    assert str(raised.value) and "\n" not in str(raised.value)


def test_the_registry_makes_each_kind_and_refuses_an_unknown_one():
    for kind in gpu.KINDS:
        made = gpu.make_backend(kind, pcie=False)
        assert made.kind == kind
        made.close()
    with pytest.raises(ValueError, match="unknown GPU backend 'rocm'"):
        gpu.make_backend("rocm")


def test_detect_falls_back_to_nvidia_smi_where_nvidia_ml_py_is_missing(tmp_path, monkeypatch):
    from gpudeck.jobs.telemetry.gpu import nvml
    smi_backend(tmp_path)
    monkeypatch.setattr(nvml, "binding_installed", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu.detect() == "nvidia-smi"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu.detect() == "nvidia-smi"                      # neither: nvidia-smi says what is missing
    assert gpu.make_backend().read() == ((), "no NVIDIA driver: nvidia-smi not found on this box")
    monkeypatch.undo()
    assert gpu.detect() == "nvml"                            # nvidia-ml-py is a dependency of gpudeck


def test_a_jobs_device_list_is_the_vendors_variable():
    assert gpu.visible_devices_env((0, 3)) == {"CUDA_VISIBLE_DEVICES": "0,3"}
    assert gpu.visible_devices_env(()) == {}
    assert gpu.visible_devices_env([2], SimulatedGpuBackend()) == {"CUDA_VISIBLE_DEVICES": "2"}


def test_only_the_nvml_backend_imports_nvidia_ml_py():
    """`grep -rl pynvml jobs console`: one file. Every other module asks the seam."""
    mentions = sorted(str(p.relative_to(REPO)) for top in ("jobs", "console") for p in (REPO / top).rglob("*.py")
                      if re.search(r"\bpynvml\b", p.read_text(encoding="utf-8")))
    assert mentions == ["jobs/telemetry/gpu/nvml.py"]
    visible = sorted(str(p.relative_to(REPO)) for top in ("jobs", "console") for p in (REPO / top).rglob("*.py")
                     if "CUDA_VISIBLE_DEVICES\"" in p.read_text(encoding="utf-8")
                     or "CUDA_VISIBLE_DEVICES'" in p.read_text(encoding="utf-8"))
    assert set(visible) <= {"jobs/telemetry/gpu/__init__.py", "jobs/telemetry/gpu/nvml.py",
                            "jobs/telemetry/gpu/nvidia_smi.py", "jobs/telemetry/simulated.py"}, visible
