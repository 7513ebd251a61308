"""Engine profiles: launch-line parsing, engine detection, interpreter inference, a job's engine settings."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpudeck.jobs.engines.profiles import (SGLANG, VLLM, detect_engine, engine_settings, infer_python,
                                   parse_launch, profile_for)
from gpudeck.jobs.spec import JobSpec


def test_defaults_of_both_engines():
    assert (VLLM.default_port, SGLANG.default_port) == (8000, 30000)
    assert VLLM.ready_lines == ("Application startup complete.",)
    assert SGLANG.ready_lines == ("The server is fired up and ready to roll!",)
    assert VLLM.metrics_on_by_default and not SGLANG.metrics_on_by_default
    with pytest.raises(ValueError, match="unknown engine"):
        profile_for("tgi")


@pytest.mark.parametrize("cmd,engine", [
    ("vllm serve /models/k2 --port 8001", "vllm"),
    ("python -m vllm.entrypoints.openai.api_server --model /m", "vllm"),
    ("/opt/venv/bin/python3.11 -u -m sglang.launch_server --model-path /m", "sglang"),
    ("sglang serve --model-path /m", "sglang"),
    ("cd /work && CUDA_VISIBLE_DEVICES=0,1 exec vllm serve /m", "vllm"),
    (["/venv/bin/python", "/venv/bin/vllm", "serve", "/m"], "vllm"),
    ("python train.py --model vllm", None),
    ("echo vllm serve", None),
    ("pip install vllm", None),
])
def test_detect_engine(cmd, engine):
    assert detect_engine(cmd) == engine


def test_vllm_launch_with_eagle3_and_tp():
    cmd = ("vllm serve /models/k2-int4 --enforce-eager --port=8100 -tp 8 --speculative-config "
           "'{\"method\": \"eagle3\", \"model\": \"/drafts/e3\", \"num_speculative_tokens\": 3}'")
    la = parse_launch(cmd)
    assert la.model == "/models/k2-int4"
    assert la.port == 8100 and la.tp == 8
    assert la.spec.method == "eagle3" and la.spec.draft_model == "/drafts/e3" and la.spec.num_tokens == 3
    assert la.metrics_enabled


def test_vllm_model_after_a_boolean_flag_is_still_the_model():
    la = parse_launch("vllm serve --enforce-eager /m --tensor-parallel-size 2")
    assert la.model == "/m" and la.tp == 2 and la.port is None and la.spec is None


def test_sglang_launch_with_eagle3_and_metrics():
    cmd = ("python -m sglang.launch_server --model-path /m --tp 8 --port 30001 "
           "--speculative-algorithm EAGLE3 --speculative-draft-model-path /d "
           "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
           "--enable-metrics")
    la = parse_launch(cmd)
    assert (la.engine, la.model, la.tp, la.port) == ("sglang", "/m", 8, 30001)
    assert la.spec.method == "eagle3" and la.spec.num_tokens == 4
    assert la.metrics_enabled
    assert not parse_launch("sglang serve --model-path /m").metrics_enabled


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_infer_python_from_venv_script_shebang(tmp_path):
    venv_python = _script(tmp_path / "venv/bin/python", "#!/bin/sh\n")
    vllm = _script(tmp_path / "venv/bin/vllm", f"#!{venv_python}\nimport sys\n")
    assert infer_python(f"{vllm} serve /m") == str(venv_python)
    # A bare name resolves on the job's PATH, not gpudeck's.
    env = {"PATH": str(tmp_path / "venv/bin")}
    assert infer_python("vllm serve /m", env) == str(venv_python)


def test_infer_python_from_python_dash_m(tmp_path):
    py = "/opt/sglang-env/bin/python3"
    assert infer_python(f"{py} -m sglang.launch_server --model-path /m") == py


def test_infer_python_without_shebang_uses_the_python_beside_it(tmp_path):
    venv_python = _script(tmp_path / "env/bin/python", "#!/bin/sh\n")
    sglang = _script(tmp_path / "env/bin/sglang", "binary launcher, no shebang\n")
    assert infer_python([str(sglang), "serve", "--model-path", "/m"]) == str(venv_python)


def test_infer_python_unknown_when_nothing_says():
    assert infer_python("vllm serve /m", {"PATH": "/nonexistent"}) is None
    assert infer_python("python train.py") is None


def test_engine_settings_defaults_then_command_then_jobs_toml():
    spec = JobSpec(name="v", cmd="vllm serve /models/k2 --port 8100", kind="engine", engine="vllm")
    s = engine_settings(spec)
    assert (s.port, s.health_path, s.metrics_path, s.model) == (8100, "/health", "/metrics", "/models/k2")
    assert s.url("/health") == "http://127.0.0.1:8100/health"

    spec = JobSpec(name="s", cmd="python -m sglang.launch_server --model-path /m", kind="engine",
                   engine="sglang")
    s = engine_settings(spec)
    assert s.port == 30000 and s.metrics_path is None      # SGLang without --enable-metrics
    spec = JobSpec(name="s", cmd="python -m sglang.launch_server --model-path /m --host 0.0.0.0",
                   kind="engine", engine="sglang", port=31000, metrics_path="/metrics",
                   python="/x/bin/python", model="/elsewhere")
    s = engine_settings(spec)
    assert (s.port, s.metrics_path, s.python, s.model) == (31000, "/metrics", "/x/bin/python", "/elsewhere")
    # The command's --port wins over the default the loader filled in.
    spec = JobSpec(name="v", cmd="vllm serve /m --port 8100", kind="engine", engine="vllm", port=8000)
    assert engine_settings(spec).port == 8100
    assert s.url("/health") == "http://127.0.0.1:31000/health"
    assert engine_settings(JobSpec(name="b", cmd="make -j8", kind="build")) is None
