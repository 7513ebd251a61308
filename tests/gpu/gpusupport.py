"""What every GPU test needs first: a working NVML, and torch with CUDA — or a clean module-level skip."""
from __future__ import annotations

import pytest


def require_nvml():
    """pynvml, initialised; skips the calling module where the driver or a GPU is missing."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver / no GPU
        pytest.skip(f"NVML unavailable: {exc}", allow_module_level=True)
    return pynvml


def require_cuda(min_gpus: int = 1):
    """torch with at least `min_gpus` CUDA devices; skips the calling module otherwise."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU", allow_module_level=True)
    if torch.cuda.device_count() < min_gpus:
        pytest.skip(f"needs at least {min_gpus} GPUs", allow_module_level=True)
    return torch
