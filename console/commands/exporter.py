"""`gpudeck exporter [--listen 127.0.0.1:9402]`: the jobs, engines and GPUs as Prometheus metrics over HTTP."""
from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from gpudeck.console.errors import CliError
from gpudeck.console.listen import is_loopback, parse_listen

if TYPE_CHECKING:
    from gpudeck.jobs.exporter import JobsReader

DEFAULT_LISTEN = "127.0.0.1:9402"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "exporter", help="serve jobs, engines and GPUs as Prometheus metrics",
        description="Serve /metrics in the Prometheus text format: every job of the jobs file (state, phase, "
                    "progress, ETA, stalled, alerts, exit, start time; labels job_name and host), the serving "
                    "numbers of engine jobs, and the GPUs under dcgm-exporter's names (DCGM_FI_DEV_GPU_UTIL ...). "
                    "With --demo: the SIMULATED box and its recorded runs, every series labelled simulated=\"true\". "
                    "See docs/EXPORTER.md.")
    p.add_argument("--listen", metavar="ADDR:PORT", default=DEFAULT_LISTEN,
                   help=f"address and port to serve on (default {DEFAULT_LISTEN}; [::1]:9402 for IPv6)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen address (the endpoint has no authentication)")
    p.add_argument("--no-gpus", action="store_true",
                   help="leave the GPU figures out (a box that already runs dcgm-exporter)")
    p.set_defaults(handler=run_exporter)


def _jobs_source(args: argparse.Namespace) -> tuple[Optional["JobsReader"], str]:
    """(the jobs reader or None, a line saying where the jobs come from)."""
    from gpudeck.jobs.paths import find_jobs_file
    explicit = getattr(args, "jobs_file", None)
    path = find_jobs_file(explicit)
    if path is None:
        return None, "no jobs file (pass --jobs FILE): GPUs only"
    if not path.exists():
        raise CliError(f"{path}: no such file", code=2)
    from gpudeck.jobs.exporter import JobsFileSource
    from gpudeck.jobs.spec import SpecError
    source = JobsFileSource(Path(path))
    try:
        jobs = source.supervisor().jobs_file.jobs
    except SpecError as exc:
        raise CliError(f"{exc} (run `gpudeck check` for every problem)", code=2) from None
    return source, f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} from {path}"


def run_exporter(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen, DEFAULT_LISTEN, any_free_port=True)
    if not is_loopback(host) and not args.allow_remote:
        raise CliError(f"--listen {args.listen}: not a loopback address; the metrics endpoint has no "
                       "authentication, so pass --allow-remote to serve it beyond this machine", code=2)
    from prometheus_client import start_http_server

    from gpudeck.jobs import exporter as core
    demo = bool(getattr(args, "demo", False))
    host_name: Optional[str] = None       # this machine's name
    jobs: Optional[JobsReader]
    if demo:
        from gpudeck.jobs.telemetry.simulated import HOST_NAME
        host_name = HOST_NAME
        jobs, where = core.DemoJobsSource(), "the SIMULATED demo runs"
        gpus = None if args.no_gpus else core.simulated_gpus()
    else:
        jobs, where = _jobs_source(args)
        gpus = None if args.no_gpus else core.live_gpus()
    read, label, close = gpus if gpus is not None else (None, "off", None)
    collector = core.GpudeckCollector(jobs, read, host=host_name, simulated=demo, gpu_source=label,
                                      jobs_reason=None if jobs is not None else where)
    registry = core.make_registry(collector)
    collector.warm()
    gpu_note = label
    if read is not None and not demo:
        # One reading up front, so a box without a usable driver says why at once (scrapes show gpus_up 0).
        try:
            found, error = read()
        except Exception as exc:          # noqa: BLE001 - the collector reports it per scrape too
            found, error = (), str(exc)
        if not found:
            gpu_note = f"{label} unavailable ({error or 'no GPU reported'})"
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if close is not None:
            close()
        raise CliError(f"cannot listen on {args.listen}: {exc.strerror or exc}", code=1) from None
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"gpudeck exporter: serving http://{shown}:{bound}/metrics — {where}; GPUs: {gpu_note}", flush=True)
    stop = threading.Event()

    def _stop(signum: int, frame: Optional[object]) -> None:
        stop.set()
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
        if close is not None:
            close()
    return 0
