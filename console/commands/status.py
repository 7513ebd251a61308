"""`gpudeck status [--json]`: one snapshot of the box (GPUs, host, listening ports), no UI."""
from __future__ import annotations

import argparse
import sys

from gpudeck.jobs import strictjson

from gpudeck.console.errors import CliError

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


def run_status(args: argparse.Namespace) -> int:
    if args.interval < 0:
        raise CliError("--interval must be >= 0", code=2)
    from gpudeck.console.commands._host import open_box
    from gpudeck.jobs.telemetry.status import render_engines_text, render_status_text
    with open_box(args) as box:
        report = box.status(interval_s=args.interval, simulated=bool(getattr(args, "demo", False)))
    payload = report.payload
    if args.json:
        sys.stdout.write(strictjson.dumps(payload, indent=2))
        sys.stdout.write("\n")
    else:
        if not box.local:
            source = payload.get("source") or {}
            spec = getattr(box, "spec", None)
            print(f"[{box.name}: {getattr(spec, 'ssh', '?')}; GPU via {source.get('gpu', '?')}, "
                  f"host via {source.get('host', '?')}]")
        print(render_status_text(report.snapshot()))
        engines_text = render_engines_text(payload.get("engines"), payload.get("engines_error"))
        if engines_text:
            print()
            print(engines_text)
        slurm = payload.get("slurm")
        if isinstance(slurm, dict):
            from gpudeck.jobs.slurm import status_lines
            print("\n".join(status_lines(slurm)))   # stdout goes through the sanitizer (cli.py)
    if args.require_gpu and not report.gpus:
        where = "" if box.local else f" on {box.name}"
        raise CliError(f"no GPU telemetry{where}: {report.gpu_error or 'no GPU reported'}", code=3)
    return 0
