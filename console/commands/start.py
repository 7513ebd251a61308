"""`gpudeck start JOB`: start a detached run and print its id at once."""
from __future__ import annotations

import argparse

from gpudeck.console.commands._host import open_box


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("start", help="start a job (detached: it outlives this command and the console)",
                       description="Start JOB under its own runner and print the run id. Returns at once; "
                                   "the job keeps running after gpudeck exits.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(handler=run_start, remote_ok=True, mutates=True)


def run_start(args: argparse.Namespace) -> int:
    with open_box(args) as box:
        print(box.start(args.job).run_id)
    return 0
