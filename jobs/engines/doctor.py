"""`gpudeck doctor`: the preflight checks an operator would otherwise do by hand, each {name, ok, detail}.

Failures vs not applicable: a check that cannot pass on this box for this job is
a failure (no NVIDIA driver when an engine needs GPUs); a check that does not
concern this job is reported with `skipped: true` and `ok: true` (GPU checks for a
CPU-only build, port checks for a job without a port), so it never fails the run.
Every check is guarded: a crash inside one becomes that check's failure, never a
traceback.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from gpudeck.jobs.engines.profiles import argv_of, engine_settings
from gpudeck.jobs.procs import signal_name

if TYPE_CHECKING:
    from gpudeck.jobs.supervisor import Supervisor

PROBE_TIMEOUT_S = 180.0          # importing vLLM takes ~10-20 s; a cold disk far more
GPU_IDLE_BYTES = 2 * 2**30
MIN_FREE_DISK = 10 * 2**30
# Memory one nvcc/cicc job can take on template-heavy CUDA (flash-attn, cutlass): 4-8 GB.
NVCC_JOB_BYTES_LOW = 4 * 2**30
NVCC_JOB_BYTES_SAFE = 8 * 2**30


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False


def _ok(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def _fail(name: str, detail: str) -> Check:
    return Check(name, False, detail)


def _skip(name: str, detail: str) -> Check:
    return Check(name, True, detail, skipped=True)


# --------------------------------------------------------------------------- GPU box

def check_driver() -> Check:
    from gpudeck.jobs.telemetry import gpu
    backend = gpu.local()
    try:
        info = backend.driver()
    except gpu.GpuUnavailable as exc:
        return _fail("nvidia_driver", f"no NVIDIA driver/GPU visible: {backend.label} unavailable ({exc})")
    except Exception as exc:  # noqa: BLE001 - a driver that answers oddly is a failed check, not a crash
        return _fail("nvidia_driver", f"the GPU driver answered but failed: {exc}")
    if not info.names:
        return _fail("nvidia_driver", f"driver {info.version} but no GPU visible")
    kinds = ", ".join(f"{n}x {k}" for k, n in _count(info.names).items())
    return _ok("nvidia_driver", f"driver {info.version}, {len(info.names)} GPU(s): {kinds}")


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def check_gpus_free(gpus: tuple[int, ...]) -> Check:
    from gpudeck.jobs.telemetry import gpu
    memory = gpu.local().memory()
    if memory is None:
        # The driver check already fails for this; one failure per cause.
        return _skip("gpus_free", "cannot tell without a GPU driver (see nvidia_driver)")
    # /proc directly, not engine discovery's psutil: doctor also runs in the agent on boxes without psutil.
    from gpudeck.jobs.procs import RUN_TAG, environ_value
    holders = memory.holders
    busy = []
    try:
        indices = list(gpus) if gpus else sorted(memory.used)
        for i in indices:
            used = memory.used.get(i, 0)
            on_gpu = [x for x in holders if x.gpu == i]
            if on_gpu or used > GPU_IDLE_BYTES:
                who = []
                for x in on_gpu:
                    run_id, job = environ_value(x.pid, RUN_TAG), environ_value(x.pid, "GPUDECK_JOB")
                    owner = f"gpudeck job {job}" if run_id else "not started by gpudeck"
                    mem = f" {x.mem_used / 2**30:.1f} GiB" if x.mem_used else ""
                    who.append(f"PID {x.pid}{mem} ({owner})")
                busy.append(f"GPU {i}: {used / 2**30:.1f} GiB used" + (f" by {', '.join(who)}" if who else ""))
    except Exception as exc:
        return _fail("gpus_free", f"GPU query failed: {exc}")
    if busy:
        return _fail("gpus_free", "; ".join(busy))
    return _ok("gpus_free", f"{len(indices)} GPU(s) idle")


# --------------------------------------------------------------------------- the job's interpreter

# Runs inside the engine's own interpreter. torch is imported FIRST: sgl_kernel and
# vllm._C link against libtorch, and loading them before torch fails with an
# "undefined symbol" that looks like a broken wheel but is not.
PROBE = r'''
import json, sys, glob, os, traceback
engine = sys.argv[1]
out = {"python": sys.version.split()[0], "executable": sys.executable}
def last(exc):
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return text[-1] if text else repr(exc)
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_arches"] = list(torch.cuda.get_arch_list()) if hasattr(torch.cuda, "get_arch_list") else []
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["devices"] = [{"name": torch.cuda.get_device_name(i),
                           "capability": list(torch.cuda.get_device_capability(i))}
                          for i in range(torch.cuda.device_count())]
except Exception as exc:
    out["torch_error"] = last(exc)
def vllm_kernels():
    # As vLLM loads them: its platform picks the build (CUDA's _C; on CPUs _C, _C_AVX512 or _C_AVX2
    # by what the CPU has). A bare `import vllm._C` on a CPU without AVX-512 dies of SIGILL.
    try:
        from vllm.platforms import current_platform
        load = current_platform.import_kernels
    except (ImportError, AttributeError):
        load = None
    if load is None:
        return __import__("vllm._C", fromlist=["_"])
    load()
    return sys.modules.get("vllm._C") or sys.modules.get("vllm")
mods = {"vllm": ["vllm", "vllm._C"], "sglang": ["sglang", "sgl_kernel"]}.get(engine, [engine])
for name in mods:
    try:
        if name == "vllm._C":
            m, version = vllm_kernels(), None       # (a kernels library has no version of its own)
        else:
            m = __import__(name, fromlist=["_"])
            version = getattr(m, "__version__", None)
        out.setdefault("imports", {})[name] = version or "ok"
        f = getattr(m, "__file__", None)
        if f:
            out.setdefault("files", {})[name] = f
    except Exception as exc:
        out.setdefault("import_errors", {})[name] = last(exc)
print("GPUDECK_PROBE " + json.dumps(out))
'''


def probe_interpreter(python: str, engine: str, env: dict[str, str],
                      timeout: float = PROBE_TIMEOUT_S) -> tuple[Optional[dict], str]:
    try:
        proc = subprocess.run([python, "-c", PROBE, engine], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, f"{python}: no such interpreter"
    except subprocess.TimeoutExpired:
        return None, f"{python} did not finish importing within {timeout:.0f} s"
    except OSError as exc:
        return None, f"{python}: {exc}"
    for line in proc.stdout.splitlines():
        if line.startswith("GPUDECK_PROBE "):
            return json.loads(line[len("GPUDECK_PROBE "):]), ""
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode < 0:
        why = _SIGNAL_WHY.get(-proc.returncode, "")
        return None, f"{python} was killed by {signal_name(-proc.returncode)} while importing{why}: {tail}"
    return None, f"{python} exited {proc.returncode}: {tail}"


# What an import that kills its interpreter usually means.
_SIGNAL_WHY = {
    4: " (an illegal instruction: a compiled module built for a CPU this one is not, e.g. AVX-512)",
    7: " (a bus error: a truncated or changed .so file)",
    11: " (a segfault in a compiled module: mismatched torch/CUDA builds)",
}


def _kernel_arches(files: dict) -> Optional[set[str]]:
    """sm_XY the engine's compiled kernels carry, via cuobjdump when the CUDA toolkit is here."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    arches: set[str] = set()
    for mod, f in files.items():
        root = Path(f).parent
        for so in list(root.glob("_C*.so")) + list(root.glob("common_ops*.so")) + list(root.glob("*/common_ops*.so")):
            try:
                out = subprocess.run([tool, "--list-elf", str(so)], capture_output=True, text=True,
                                     timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            arches.update(re.findall(r"sm_(\d+a?)", out))
    return arches or None


def interpreter_checks(python: Optional[str], engine: str, env: dict[str, str],
                       probe: Callable = probe_interpreter, source: str = "") -> list[Check]:
    if not python:
        return [_fail("python", "could not tell which python runs this engine; set python = \"/path/to/venv/"
                                "bin/python\" in jobs.toml")]
    data, error = probe(python, engine, env)
    if data is None:
        return [_fail("python", error)]
    checks = [_ok("python", f"{data['executable']} (Python {data['python']}){source}")]
    if "torch_error" in data:
        checks.append(_fail("torch_import", data["torch_error"]))
        return checks
    checks.append(_ok("torch_import", f"torch {data['torch']} (CUDA {data.get('torch_cuda') or 'none: CPU build'})"))
    if data.get("cuda_available"):
        devs = data.get("devices") or []
        checks.append(_ok("cuda_available", f"{len(devs)} device(s): " +
                          ", ".join(f"{d['name']} sm_{d['capability'][0]}{d['capability'][1]}" for d in devs[:2])))
        checks.append(_arch_check(devs, data.get("torch_arches") or [], _kernel_arches(data.get("files") or {})))
    else:
        why = "torch is a CPU build" if not data.get("torch_cuda") else "no GPU visible to torch"
        checks.append(_fail("cuda_available", f"torch.cuda.is_available() is False ({why})"))
        checks.append(_skip("gpu_arch", "no CUDA device to compare"))
    errors = data.get("import_errors") or {}
    imports = data.get("imports") or {}
    if errors:
        name, msg = next(iter(errors.items()))
        hint = ""
        if "undefined symbol" in msg:
            hint = " — built against another torch/CUDA than the one installed (torch was imported first)"
        checks.append(_fail("engine_import", f"import {name}: {msg}{hint}"))
    else:
        checks.append(_ok("engine_import", ", ".join(f"{k} {v}" for k, v in imports.items())
                          + " (imported after torch)"))
    return checks


def _arch_check(devices: list[dict], torch_arches: list[str], kernel_arches: Optional[set[str]]) -> Check:
    caps = sorted({f"{d['capability'][0]}{d['capability'][1]}" for d in devices})
    have = {a.split("_", 1)[1] for a in torch_arches if a.startswith("sm_")}
    ptx = [int(re.sub(r"\D", "", a.split("_", 1)[1])) for a in torch_arches if a.startswith("compute_")]
    problems = []
    for cap in caps:
        if cap not in have and f"{cap}a" not in have and not any(p <= int(cap) for p in ptx):
            problems.append(f"torch has no kernels for sm_{cap} (built for {', '.join(torch_arches) or 'none'})")
        if kernel_arches is not None and cap not in kernel_arches and f"{cap}a" not in kernel_arches:
            problems.append(f"engine kernels lack sm_{cap} (have {', '.join(sorted(kernel_arches))})")
    if problems:
        return _fail("gpu_arch", "; ".join(problems))
    note = "" if kernel_arches is not None else " (engine kernels not inspected: no cuobjdump)"
    return _ok("gpu_arch", f"sm_{', sm_'.join(caps)} supported by torch{note}")


# --------------------------------------------------------------------------- ports, disk, builds

def check_port_free(port: Optional[int], job_live: bool) -> Check:
    if port is None:
        return _skip("port_free", "the job declares no port")
    from gpudeck.jobs.procs import cmdline, port_listening, port_owners
    if not port_listening(port):
        return _ok("port_free", f"port {port} free")
    owners = port_owners(port)
    who = ", ".join(f"PID {p} ({(cmdline(p) or '?')[:80]})" for p in owners) or "unknown owner"
    if job_live:
        return _skip("port_free", f"port {port} is in use by the running job itself ({who})")
    return _fail("port_free", f"port {port} is already listening: {who}")


def check_disk(model: Optional[str], cwd: str) -> Check:
    target = None
    if model:
        p = Path(os.path.expanduser(model))
        if not p.is_absolute():
            p = Path(cwd) / p
        if p.exists():
            target = p
        elif model.startswith(("/", "~", ".")):
            return _fail("disk_space", f"model path {model} does not exist")
    if target is None:
        # A hub id (org/name): it will be downloaded into the HF cache.
        hub = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
        target = Path(hub)
        while not target.exists():
            target = target.parent
    usage = shutil.disk_usage(target)
    detail = f"{usage.free / 2**30:.0f} GiB free of {usage.total / 2**30:.0f} GiB at {target}"
    if usage.free < MIN_FREE_DISK:
        return _fail("disk_space", detail + f" (< {MIN_FREE_DISK / 2**30:.0f} GiB)")
    return _ok("disk_space", detail)


def build_parallelism(cmd: Union[str, tuple[str, ...]], env: dict[str, str]) -> dict[str, Optional[int]]:
    """MAX_JOBS / CMAKE_BUILD_PARALLEL_LEVEL / NVCC_THREADS / -jN as the job sets them."""
    tokens = argv_of(cmd)
    text = " ".join(tokens)
    found: dict[str, Optional[int]] = {}
    for key in ("MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "NVCC_THREADS", "SGL_KERNEL_COMPILE_THREADS"):
        m = re.search(rf"\b{key}=(\d+)", text)
        value = m.group(1) if m else env.get(key)
        found[key] = int(value) if value and str(value).isdigit() else None
    m = re.search(r"(?:^|\s)(?:-j\s*|--jobs[= ]|--parallel[= ])(\d+)", text)
    found["-j"] = int(m.group(1)) if m else None
    return found


def _mem_available() -> int:
    """Bytes of RAM available: psutil's figure, or the kernel's MemAvailable where psutil is missing (an agent's box)."""
    try:
        import psutil
    except ImportError:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        raise
    return psutil.virtual_memory().available


def check_build(cmd: Union[str, tuple[str, ...]], env: dict[str, str], *, cores: Optional[int] = None,
                mem_available: Optional[int] = None) -> Check:
    cores = cores or os.cpu_count() or 1
    mem_available = mem_available if mem_available is not None else _mem_available()
    par = build_parallelism(cmd, env)
    jobs = par["MAX_JOBS"] or par["CMAKE_BUILD_PARALLEL_LEVEL"] or par["-j"]
    source = next((k for k in ("MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "-j") if par[k]), None)
    if jobs is None:
        jobs, source = cores, "default (one per core)"
    threads = par["NVCC_THREADS"] or par["SGL_KERNEL_COMPILE_THREADS"] or 1
    safe = max(1, min(cores, int(mem_available // (NVCC_JOB_BYTES_SAFE * threads))))
    need_low = jobs * threads * NVCC_JOB_BYTES_LOW
    gib = 2**30
    detail = (f"{jobs} parallel compile job(s) [{source}] x {threads} nvcc thread(s) on {cores} cores, "
              f"{mem_available / gib:.0f} GiB RAM available; at 4-8 GB per nvcc job that needs "
              f"{need_low / gib:.0f}-{need_low * 2 / gib:.0f} GiB; safe: MAX_JOBS={safe}")
    if need_low > mem_available:
        return _fail("build_parallelism", detail + " — likely OOM-killed (cicc/cc1plus 'Killed')")
    return _ok("build_parallelism", detail)


# --------------------------------------------------------------------------- the whole run

def _guarded(fn: Callable[..., Union[Check, list[Check]]], name: str, *a: Any, **kw: Any) -> list[Check]:
    try:
        result = fn(*a, **kw)
    except Exception as exc:
        return [_fail(name, f"check failed to run: {type(exc).__name__}: {exc}")]
    return result if isinstance(result, list) else [result]


def run_doctor(supervisor: Optional[Supervisor] = None, job: Optional[str] = None, *,
               probe: Callable = probe_interpreter) -> list[Check]:
    """All checks for the box (no job) or for one job of the supervisor's jobs file."""
    if job is None:
        return _guarded(check_driver, "nvidia_driver") + _guarded(check_gpus_free, "gpus_free", ())
    if supervisor is None:
        raise ValueError(f"checking job {job!r} needs the supervisor of its jobs file")
    spec = supervisor.spec(job)
    state = supervisor.job_state(job)
    settings = engine_settings(spec)
    checks: list[Check] = []
    needs_gpu = settings is not None or bool(spec.gpus)
    if needs_gpu:
        checks += _guarded(check_driver, "nvidia_driver")
        if state.live:
            checks.append(_skip("gpus_free", f"{job} is running (run {state.run_id}): its GPUs are its own"))
        else:
            checks += _guarded(check_gpus_free, "gpus_free", tuple(spec.gpus))
    else:
        checks.append(_skip("nvidia_driver", f"{job} ({spec.kind}) declares no GPUs"))
    env = dict(os.environ)
    env.update(spec.env)
    from gpudeck.jobs.telemetry.gpu import visible_devices_env
    env.update(visible_devices_env(spec.gpus))
    port: Optional[int]
    if settings is not None:
        source = " from jobs.toml" if spec.python else " inferred from the command"
        checks += _guarded(interpreter_checks, "python", settings.python, settings.engine, env, probe, source)
        port = settings.port
    else:
        port = spec.port
    checks += _guarded(check_port_free, "port_free", port, state.live)
    if settings is not None:
        checks += _guarded(check_disk, "disk_space", settings.model, supervisor.job_cwd(spec))
    if spec.kind == "build":
        checks += _guarded(check_build, "build_parallelism", spec.cmd, env)
    return checks


def doctor_payload(checks: list[Check], job: Optional[str] = None) -> dict:
    return {"job": job, "ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}
