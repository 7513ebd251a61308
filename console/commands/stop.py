"""`gpudeck stop JOB`: stop signal, grace, SIGKILL of the whole tree, then proof that nothing is left."""
from __future__ import annotations

import argparse
import sys

from gpudeck.jobs import strictjson
from gpudeck.console.commands._host import open_box


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stop", help="stop a job started by gpudeck and verify nothing of it remains",
                       description="Send the job's stop signal to its process group, wait its stop_timeout, "
                                   "SIGKILL every process of the run (including ones that left the group), "
                                   "then verify: no process alive, port free, no GPU memory held. Exits 1 if "
                                   "anything of the run remains. Processes gpudeck did not start are reported, "
                                   "never signalled.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="grace period before SIGKILL (default: the job's stop_timeout)")
    p.add_argument("--json", action="store_true", help="print the stop report as JSON")
    p.set_defaults(handler=run_stop, remote_ok=True, mutates=True)


def run_stop(args: argparse.Namespace) -> int:
    with open_box(args) as box:
        stopped = box.stop(args.job, timeout=args.timeout)
    if args.json:
        print(strictjson.dumps({**stopped.report, "host": box.name}, indent=1, default=str))
    else:
        for line in stopped.lines:
            print(line)
    if not stopped.clean:
        where = "" if box.local else f" on {box.name}"
        print(f"gpudeck: {args.job}: something of the run remains{where} (see above)", file=sys.stderr)
        return 1
    return 0
