#!/usr/bin/env bash
# The GPU evidence in one go, on a machine with NVIDIA GPUs and no network: GPU tests, then
# the sampling and console benchmarks with real NVML. Output lands in $OUT (or ./gpu-evidence).
# Python packages the machine lacks (Textual and its deps) come as wheels in .whl/ (see README of tests/gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-evidence}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 GPUDECK_STATE_DIR=/tmp/gpudeck-state
{
  echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, pynvml, psutil; print('torch', torch.__version__, 'nvidia-ml-py', pynvml.__version__ if hasattr(pynvml,'__version__') else '?', 'psutil', psutil.__version__)"
  nproc; uname -r
  echo "== gpudeck status (real NVML)"; python3 -m gpudeck.console.cli status
  python3 -m gpudeck.console.cli status --json > "$out/status.json"; echo "status --json exit $?"
  echo "== doctor"; python3 -m gpudeck.console.cli doctor; echo "doctor exit $?"
  # An engine job whose interpreter is this machine's torch python: torch, CUDA and the
  # H200's sm_90 are checked for real; the engine import fails here (no vLLM installed).
  printf '[jobs.vllm-h200]\nengine = "vllm"\npython = "%s"\nmodel = "/tmp"\ncmd = "vllm serve /tmp --port 8000"\n' \
    "$(command -v python3)" > /tmp/doctor-jobs.toml
  echo "== doctor vllm-h200"; python3 -m gpudeck.console.cli --jobs /tmp/doctor-jobs.toml doctor vllm-h200; echo "doctor exit $?"
} 2>&1 | tee "$out/machine.txt"
timeout 420 python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.txt"
timeout 60 python3 bench/bench_sampling.py --ticks 300 2>&1 | tee "$out/bench-sampling.txt"
timeout 100 python3 bench/bench_console_cpu.py --seconds 60 --real 2>&1 | tee "$out/bench-console.txt"
