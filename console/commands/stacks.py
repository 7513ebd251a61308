"""`gpudeck stacks JOB [--native] [--json]`: where a job's Python processes are waiting, grouped, with a verdict."""
from __future__ import annotations

import argparse

from gpudeck.jobs import strictjson
from gpudeck.console.commands._host import open_box
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stacks", help="stack-dump every Python process of a running job (py-spy), grouped",
                       description="Dump the Python stacks of every process of the job's latest live run (the "
                                   "runner's tree, including processes that left its group: the set `stop` "
                                   "finds) with py-spy, two samples 0.2 s apart. Identical stacks fold into "
                                   "one entry with a count, idle helper threads fold below, and one verdict "
                                   "line says what the processes wait on (a collective, a lock, a queue, a "
                                   "socket, disk, CUDA, a subprocess, or spinning in Python). Exits 2 when "
                                   "py-spy is missing or ptrace is not permitted, 1 when the job is not running.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--native", action="store_true", help="include C/C++ frames (py-spy --native)")
    p.add_argument("--json", action="store_true", help="print the grouped dump as JSON")
    p.set_defaults(handler=run_stacks, remote_ok=True)


def run_stacks(args: argparse.Namespace) -> int:
    # py-spy runs on the box, on the box's own process tree; a refusal keeps its exit code (2 or 1).
    with open_box(args) as box:
        result = box.stacks(args.job, native=args.native)
    if result.refused is not None:
        raise CliError(result.refused, code=result.code)
    dump = result.dump or {}
    if args.json:
        print(strictjson.dumps({**dump, "host": box.name}, indent=1))
    else:
        for line in result.lines:
            print(line)
    return 0 if dump.get("processes") else 1
