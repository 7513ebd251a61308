"""`gpudeck stacks JOB [--native] [--json]`: where a job's Python processes are waiting, grouped, with a verdict."""
from __future__ import annotations

import argparse

from gpudeck.jobs import strictjson
from gpudeck.console.commands._jobs_file import known_job, supervisor
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
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        # py-spy runs on the box, by its agent, on the box's own process tree.
        with Remote(spec) as remote:
            reply = remote.call("stacks", {"job": args.job, "native": args.native})
        if reply.get("refused"):
            raise CliError(str(reply["refused"]), code=int(reply.get("code") or 1))
        if args.json:
            print(strictjson.dumps({**reply["dump"], "host": spec.name}, indent=1))
        else:
            for line in reply["lines"]:
                print(line)
        return 0 if reply["dump"].get("processes") else 1
    from gpudeck.jobs.stacks import StacksUnavailable, render_lines
    from gpudeck.jobs.supervisor import SupervisorError
    sup = supervisor(args)
    known_job(sup, args.job)
    try:
        result = sup.stacks(args.job, native=args.native)
    except StacksUnavailable as exc:
        raise CliError(str(exc), code=2) from None
    except SupervisorError as exc:
        raise CliError(str(exc), code=1) from None
    if args.json:
        print(strictjson.dumps({**result.to_jsonable(), "host": "local"}, indent=1))
    else:
        for line in render_lines(result):
            print(line)
    return 0 if result.processes else 1
