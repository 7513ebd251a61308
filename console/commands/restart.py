"""`gpudeck restart JOB`: stop (with verification) then start; prints the new run id."""
from __future__ import annotations

import argparse
import sys

from gpudeck.console.commands._host import open_box
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("restart", help="stop a job (verified) and start it again",
                       description="Stop JOB as `gpudeck stop` does, then start a new run and print its id. "
                                   "Refuses to start if something of the old run remains.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(handler=run_restart, remote_ok=True, mutates=True)


def run_restart(args: argparse.Namespace) -> int:
    with open_box(args) as box:
        restarted = box.restart(args.job)
    for line in restarted.stopped.lines:
        print(line, file=sys.stderr)
    if restarted.run_id is None:
        where = "" if box.local else f" on {box.name}"
        raise CliError(f"{args.job}: not restarted, something of the old run remains{where}")
    print(restarted.run_id)
    return 0
