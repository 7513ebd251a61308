#!/usr/bin/env bash
# The GPU evidence, on a machine with NVIDIA GPUs and no network. Output lands in $OUT (or ./gpu-evidence).
#   tests/gpu/device_batch.sh tests     machine, `gpudeck status --json` timings, tests/gpu, the sampling bench
#   tests/gpu/device_batch.sh console   console CPU, gpudeck beside nvitop, with a matmul load on every GPU
#   tests/gpu/device_batch.sh analyze   the analyze bench (a many-core machine: the spread over cores)
#   tests/gpu/device_batch.sh           both (tests, console)
# Python packages the machine lacks (Textual and its deps, nvitop) come as wheels in .whl/:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl textual==8.2.8 rich ... nvitop
# gpudeck itself is not installed there (no setuptools from an index): a shim folder maps
# gpudeck.jobs / gpudeck.console / gpudeck.themes onto this checkout's jobs/, console/, themes/.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:-all}
out=${OUT:-gpu-evidence}; mkdir -p "$out"
site=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 1
fi
shim=/tmp/gd
mkdir -p "$shim/gpudeck" && : > "$shim/gpudeck/__init__.py"
for name in jobs console themes; do ln -sfn "$PWD/$name" "$shim/gpudeck/$name"; done
export PYTHONPATH=$shim:$site:$PWD/tests
# Bytecode as `pip install` leaves it: that machine writes no .pyc on import, so without this every
# `status --json` timed below compiled gpudeck's own 34 modules first (0.16 s of its 0.34 s, 2026-12-01).
python3 -m compileall -q jobs console themes >/dev/null || echo "device_batch: compileall failed: the timings include compiling" >&2
export PYTHONUNBUFFERED=1 GPUDECK_STATE_DIR=/tmp/gpudeck-state

if [ "$phase" = tests ] || [ "$phase" = all ]; then
  {
    echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, pynvml, psutil, textual; print('torch', torch.__version__, 'psutil', psutil.__version__, 'textual', textual.__version__)"
    python3 --version; nproc; uname -r; grep -m1 'model name' /proc/cpuinfo
    echo "== gpudeck status (real NVML)"; python3 -m gpudeck.console.cli status
    echo "== time gpudeck status --json (3 runs)"
    TIMEFORMAT='real %3R s  user %3U s  sys %3S s'
    # That machine sets PYTHONDONTWRITEBYTECODE and its site-packages hold no .pyc for pynvml, so
    # every run compiled nvidia-ml-py's 5,000-line module (0.15 s of 0.29 s; `import psutil, pynvml`
    # 0.29 s there, 0.14 s with bytecode). Bytecode in a cache folder, written by one unmeasured
    # run, is what `pip install` leaves for every module; the first run is printed as well.
    time python3 -m gpudeck.console.cli status --json > /dev/null
    export PYTHONPYCACHEPREFIX=/tmp/gpudeck-pyc PYTHONDONTWRITEBYTECODE=
    python3 -m gpudeck.console.cli status --json > /dev/null
    echo "-- with bytecode for every module"
    for i in 1 2 3; do time python3 -m gpudeck.console.cli status --json > "$out/status.json"; done
    unset PYTHONPYCACHEPREFIX
  } 2>&1 | tee "$out/machine.txt"
  timeout 450 python3 -m pytest tests/gpu -v -rs -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.txt"
  timeout 60 python3 bench/bench_sampling.py --ticks 300 2>&1 | tee "$out/bench-sampling.txt"
fi

if [ "$phase" = console ] || [ "$phase" = all ]; then
  # A matmul load on every GPU for the whole comparison: utilisation, power and clocks move as in use.
  load_s=${LOAD_S:-560}
  python3 - "$load_s" > "$out/load.txt" 2>&1 <<'EOF' &
import sys, time, torch
end = time.time() + float(sys.argv[1])
mats = []
for i in range(torch.cuda.device_count()):
    a = torch.randn(8192, 8192, device=f"cuda:{i}", dtype=torch.bfloat16)
    mats.append((a, torch.randn_like(a)))
print("load on", len(mats), "GPUs", flush=True)
while time.time() < end:
    for a, b in mats:
        for _ in range(8):
            a @ b
    for i in range(len(mats)):
        torch.cuda.synchronize(i)
EOF
  load=$!
  sleep 8
  # Where a sample's CPU goes under that load (per part, per NVML call): a process is on the GPU.
  timeout 60 python3 bench/bench_sampling.py --parts --ticks 40 --interval 0.5 2>&1 | tee "$out/bench-sampling-parts.txt"
  timeout $((load_s - 20)) python3 bench/bench_console_cpu.py --real --nvitop --refresh 1 2 --runs "${ROUNDS:-3}" \
      --seconds "${SECONDS_EACH:-30}" --warmup 6 --size 120x40 2>&1 | tee "$out/bench-console.txt"
  kill "$load" 2>/dev/null; wait "$load" 2>/dev/null
fi

if [ "$phase" = analyze ]; then
  # `gpudeck analyze` on a many-core machine: parallel.py spreads a file's byte passes over the cores
  # (-j 1, the one-process reading, is the bench's baseline). The bench runs the CLI through a venv
  # of its own, as the README's Quickstart makes one, seeing the shim and the wheels (hyperscan), with
  # a gpudeck script. Not this machine's site-packages: their .pth files run at every start of a
  # Python that sees them (numba-cuda's redirector: 25 ms of a 90 ms `analyze` of one line, 12-07).
  rm -rf /tmp/gd-venv
  python3 -m venv --without-pip /tmp/gd-venv
  echo "$shim:$site" | tr ':' '\n' > "$(/tmp/gd-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gd.pth"
  printf '#!/tmp/gd-venv/bin/python\nimport sys\nfrom gpudeck.console.cli import main\nsys.exit(main())\n' > /tmp/gd-venv/bin/gpudeck
  chmod +x /tmp/gd-venv/bin/gpudeck
  { nproc; grep -m1 'model name' /proc/cpuinfo
    timeout 500 /tmp/gd-venv/bin/python bench/bench_analyze.py --runs "${ROUNDS:-2}" --dir /tmp \
        --dense-mb "${DENSE_MB:-0}" --fixtures-mb ${FIX_MB:-200} --serving-mb 200 ${REFERENCE_LOGS:+--reference-logs "$REFERENCE_LOGS"}; } 2>&1 | tee "$out/bench-analyze.txt"
  # Where a dense mix's time goes on this many cores: the slices' timeline (bench/bench_slices.py), in process.
  if [ "${DENSE_MB:-0}" != 0 ]; then
    timeout 120 python3 bench/bench_slices.py --mb "$DENSE_MB" ${REFERENCE_LOGS:+--reference-logs "$REFERENCE_LOGS"} 2>&1 \
        | tee "$out/bench-slices.txt"
  fi
fi
