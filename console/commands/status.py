"""`gpudeck status [--json]`: one snapshot of the box (GPUs, host, listening ports), no UI."""
from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import TYPE_CHECKING, Optional

from gpudeck.jobs import strictjson

from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.hosts.config import HostSpec

# Rates (CPU %, disk and network bytes/s) need two readings; this is the least gap between them.
# /proc/stat counts 10 ms jiffies: 0.1 s is the shortest window the host sampler calls a figure,
# enough for one look (10 jiffies a core); a longer --interval gives steadier rates.
_DEFAULT_INTERVAL_S = 0.1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="one snapshot of GPUs, host, listening ports and inference engines",
        description="Print the box's GPUs (from its driver), host CPU/RAM/IO, listening TCP ports with their owners "
                    "and every vLLM/SGLang engine (gpudeck's and foreign ones). "
                    "With --demo the SIMULATED 8-GPU box is shown instead. Exits 0 even without a GPU "
                    "(gpu_error says why) unless --require-gpu is given.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--interval", type=float, default=_DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"seconds between the two readings rates are computed from (default {_DEFAULT_INTERVAL_S}; "
                        "0 = one reading, rates null); the engine scan runs inside it")
    p.add_argument("--require-gpu", action="store_true",
                   help="exit 3 with a one-line reason when no GPU can be read")
    p.set_defaults(handler=run_status, remote_ok=True)


def _slurm_status(args: argparse.Namespace) -> Optional[dict]:
    """sinfo of the partitions the jobs file's Slurm jobs use; None without such jobs (or a usable jobs file)."""
    from gpudeck.jobs.paths import find_jobs_file
    path = find_jobs_file(getattr(args, "jobs_file", None))
    if path is None or not path.exists():
        return None
    from gpudeck.jobs.spec import SpecError, load_jobs
    try:
        jobs_file = load_jobs(path)
    except SpecError:
        return None          # status is about the box; `gpudeck check` reports a broken jobs file
    if not any(spec.backend == "slurm" for spec in jobs_file.jobs.values()):
        return None          # no Slurm jobs: not even the Slurm module is loaded
    from gpudeck.jobs.slurm import cluster_status
    return cluster_status(jobs_file)


def run_status(args: argparse.Namespace) -> int:
    if args.interval < 0:
        raise CliError("--interval must be >= 0", code=2)
    from gpudeck.console.commands._host import host_spec
    spec = host_spec(args)
    if not spec.local:
        return _remote_status(args, spec)
    from gpudeck.jobs.telemetry.sampler import make_sampler
    from gpudeck.jobs.telemetry.status import render_engines_text, render_status_text, status_payload
    # One sample: a PCIe throughput thread would have nothing to show yet, and close() would wait for it.
    sampler = make_sampler(demo=bool(getattr(args, "demo", False)), pcie=False)
    engines = slurm = None
    try:
        if not sampler.simulated:
            # The first host reading opens the rate window; the engine scan and sinfo run inside it,
            # and only the rest of the window is waited (a timed wait, not a hope).
            started = time.monotonic()
            if args.interval > 0:
                sampler.prime_rates()
            # The GPU driver's session start (its library import, driver calls) runs beside the engine scan, inside the window.
            opener = threading.Thread(target=sampler.open_sources, name="gpudeck-gpu-open", daemon=True)
            opener.start()
            # Every vLLM/SGLang on the box, gpudeck's (managed) or not (foreign).
            from gpudeck.jobs.engines.discovery import discover_engines, engines_payload
            engines = engines_payload(discover_engines())
            slurm = _slurm_status(args)
            opener.join()
            left = args.interval - (time.monotonic() - started)
            if args.interval > 0 and left > 0:
                threading.Event().wait(left)
        snapshot = sampler.sample()
    finally:
        sampler.close()
    if engines is not None:
        snapshot.extra["engines"] = engines
    if sampler.simulated:
        slurm = _slurm_status(args)
    if slurm is not None:
        snapshot.extra["slurm"] = slurm
    if args.json:
        payload = status_payload(snapshot)
        payload["host_name"] = spec.name
        sys.stdout.write(strictjson.dumps(payload, indent=2))
        sys.stdout.write("\n")
    else:
        print(render_status_text(snapshot))
        if engines is not None:
            print()
            print(render_engines_text(engines))
        if slurm is not None:
            from gpudeck.jobs.slurm import status_lines
            print("\n".join(status_lines(slurm)))   # stdout goes through the sanitizer (cli.py)
    if args.require_gpu and not snapshot.gpus:
        raise CliError(f"no GPU telemetry: {snapshot.gpu_error or 'no GPU reported'}", code=3)
    return 0


def _remote_status(args: argparse.Namespace, spec: HostSpec) -> int:
    """The same snapshot, taken by the host's agent (its telemetry source is in payload["source"])."""
    from gpudeck.jobs.hosts.protocol import unpack_status
    from gpudeck.jobs.telemetry.status import render_engines_text, render_status_text, snapshot_from_payload

    from gpudeck.console.commands._host import Remote
    params = {"engines": True, "simulated": bool(getattr(args, "demo", False))}
    with Remote(spec) as remote:
        payload = unpack_status(remote.call("status", params)["full"])
        if not payload.get("simulated") and args.interval > 0:
            threading.Event().wait(args.interval)
            payload = unpack_status(remote.call("status", params)["full"])
        hello = remote.agent_info()
    payload["host_name"] = spec.name
    payload["agent"] = {key: hello.get(key) for key in ("via", "version", "python", "hostname", "pid", "readonly")}
    if args.json:
        sys.stdout.write(strictjson.dumps(payload, indent=2))
        sys.stdout.write("\n")
    else:
        source = payload.get("source") or {}
        print(f"[{spec.name}: {spec.ssh}; GPU via {source.get('gpu', '?')}, host via {source.get('host', '?')}]")
        print(render_status_text(snapshot_from_payload(payload)))
        engines_text = render_engines_text(payload.get("engines"), payload.get("engines_error"))
        if engines_text:
            print()
            print(engines_text)
    if args.require_gpu and not payload.get("gpus"):
        raise CliError(f"no GPU telemetry on {spec.name}: {payload.get('gpu_error') or 'no GPU reported'}", code=3)
    return 0
