"""Standalone installer of the real-vLLM test environment (the pytest fixture calls the same code).

Usage: python tests/engines/setup_vllm_cpu.py   (prints the venv, model and timings as JSON)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_env import ensure_vllm_env  # noqa: E402


def main() -> int:
    started = time.monotonic()
    env = ensure_vllm_env()
    print(json.dumps({
        "venv": str(env.venv), "model": str(env.model_dir), "vllm": env.version,
        "install_seconds": round(env.install_seconds, 1),
        "total_seconds": round(time.monotonic() - started, 1),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
