"""`gpudeck exporter [--listen 127.0.0.1:9402] [--host BOX ...]`: the jobs, engines and GPUs as Prometheus metrics over HTTP.

Without --host it serves this machine, reading the core directly (as it always has). With --host
(repeated, or --all-hosts) it serves those boxes through the Box seam (`Box.status()`, `Box.jobs()`),
each labelled host="NAME", over agents started read-only: an exporter only ever watches.
"""
from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from gpudeck.console.errors import CliError
from gpudeck.console.listen import is_loopback, parse_listen

if TYPE_CHECKING:
    from gpudeck.jobs.exporter import JobsReader
    from prometheus_client import CollectorRegistry
    from gpudeck.jobs.hosts.config import HostSpec

DEFAULT_LISTEN = "127.0.0.1:9402"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "exporter", help="serve jobs, engines and GPUs as Prometheus metrics",
        description="Serve /metrics in the Prometheus text format: every job of the jobs file (state, phase, "
                    "progress, ETA, stalled, alerts, failure cause, exit, start time; labels job_name and host), the serving "
                    "numbers of engine jobs, and the GPUs under dcgm-exporter's names (DCGM_FI_DEV_GPU_UTIL ...). "
                    "With --demo: the SIMULATED box and its recorded runs, every series labelled simulated=\"true\". "
                    "See docs/EXPORTER.md.")
    p.add_argument("--listen", metavar="ADDR:PORT", default=DEFAULT_LISTEN,
                   help=f"address and port to serve on (default {DEFAULT_LISTEN}; [::1]:9402 for IPv6)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen address (the endpoint has no authentication)")
    p.add_argument("--no-gpus", action="store_true",
                   help="leave the GPU figures out (a box that already runs dcgm-exporter)")
    p.add_argument("--host", metavar="NAME", dest="hosts", action="append", default=None,
                   help="serve this hosts.toml box (repeat for several; `local` is this machine); its series "
                        "carry host=\"NAME\" and gpudeck_box_up says whether it answered")
    p.add_argument("--all-hosts", action="store_true",
                   help="serve every box of hosts.toml (the local entry included)")
    p.add_argument("--box-timeout", metavar="SECONDS", type=float, default=None,
                   help="a remote box that has not answered within this is down for that scrape "
                        "(gpudeck_box_up 0; default 3)")
    # A remote box is reached through the Box seam, over an agent that refuses to act.
    p.set_defaults(handler=run_exporter, remote_ok=True)


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


def box_specs(args: argparse.Namespace) -> list[HostSpec]:
    """The boxes to serve, in order, each once: the global --host / $GPUDECK_HOST, the exporter's own
    --host (repeated), --all-hosts. Empty: this machine alone, as without any. Every remote one read-only."""
    import dataclasses

    from gpudeck.console.commands._host import host_spec
    from gpudeck.jobs.hosts.config import HostConfigError, load_hosts, resolve_host
    specs: list[HostSpec] = []
    try:
        first = host_spec(args)                 # --host before the command, else $GPUDECK_HOST
        if not first.local:
            specs.append(first)
        specs += [resolve_host(name) for name in args.hosts or ()]
        if args.all_hosts:
            specs += list(load_hosts().values())
    except HostConfigError as exc:
        raise CliError(str(exc), code=2) from None
    seen: set[str] = set()
    out = []
    for spec in specs:
        if spec.name in seen:
            continue
        seen.add(spec.name)
        # Watching is all an exporter does: the box's agent refuses anything else on this link.
        out.append(spec if spec.local or spec.readonly else dataclasses.replace(spec, readonly=True))
    if len(out) == 1 and out[0].local:
        return []
    return out


def run_exporter(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen, DEFAULT_LISTEN, any_free_port=True)
    if not is_loopback(host) and not args.allow_remote:
        raise CliError(f"--listen {args.listen}: not a loopback address; the metrics endpoint has no "
                       "authentication, so pass --allow-remote to serve it beyond this machine", code=2)
    if args.box_timeout is not None and not 0 < args.box_timeout <= 60:
        raise CliError(f"--box-timeout {args.box_timeout:g}: give 0 < SECONDS <= 60", code=2)
    specs = box_specs(args)
    if specs and getattr(args, "demo", False):
        raise CliError("--demo serves the SIMULATED box alone; leave out --host / --all-hosts", code=2)
    from gpudeck.jobs import exporter as core
    if specs:
        return _serve(args, host, port, *_fleet(args, specs))
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
    return _serve(args, host, port, registry, f"{where}; GPUs: {gpu_note}", close)


def _fleet(args: argparse.Namespace, specs: list[HostSpec]) -> tuple[CollectorRegistry, str, Callable[[], None]]:
    """(registry, what is served, close) for boxes named by hosts.toml: remote ones through the Box seam."""
    import sys

    from gpudeck.jobs import exporter as core
    from gpudeck.jobs.box import open_box
    timeout = args.box_timeout if args.box_timeout is not None else core.BOX_TIMEOUT_S
    local: Optional[core.GpudeckCollector] = None
    boxes: list[core.BoxSource] = []
    close_local: Optional[Callable[[], None]] = None
    for spec in specs:
        if spec.local:
            jobs, where = _jobs_source(args)
            gpus = None if args.no_gpus else core.live_gpus()
            read, label, close_local = gpus if gpus is not None else (None, "off", None)
            local = core.GpudeckCollector(jobs, read, gpu_source=label,
                                          jobs_reason=None if jobs is not None else where)
        else:
            boxes.append(core.BoxSource(open_box(spec), gpus=not args.no_gpus, timeout_s=timeout))
    collector = core.FleetCollector(local, boxes)

    def changed(name: str, up: bool, why: Optional[str]) -> None:
        print(f"gpudeck exporter: {name} {'answers' if up else 'is DOWN: ' + (why or '?')}", file=sys.stderr,
              flush=True)
    collector.on_change = changed
    collector.warm()
    registry = core.make_registry(collector)

    def close() -> None:
        collector.close()
        if close_local is not None:
            close_local()
    names = ", ".join(("this machine" if s.local else s.name) for s in specs)
    return registry, f"boxes {names} (remote ones read-only, each bounded to {timeout:g} s a scrape)", close


def _serve(args: argparse.Namespace, host: str, port: int, registry: CollectorRegistry, where: str,
           close: Optional[Callable[[], None]]) -> int:
    from prometheus_client import start_http_server
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if close is not None:
            close()
        raise CliError(f"cannot listen on {args.listen}: {exc.strerror or exc}", code=1) from None
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"gpudeck exporter: serving http://{shown}:{bound}/metrics — {where}", flush=True)
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
