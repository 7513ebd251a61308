"""`gpudeck pivot TARGET`: stop the running engines, prove GPUs and ports free, start TARGET (and wait)."""
from __future__ import annotations

import argparse
import sys

from gpudeck.jobs import strictjson
from gpudeck.console.commands._jobs_file import supervisor
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pivot", help="switch engines: stop the running ones, verify GPUs/ports free, start TARGET",
        description="Plan first: every running engine job of the jobs file is listed (and foreign engines "
                    "with PID, command and GPU memory). After confirmation: stop them, verify no process "
                    "of theirs holds GPU memory and the ports are free, start TARGET, and with --wait "
                    "follow it until ready. Each step is printed with its duration; the first failure "
                    "stops the pivot (exit 1).")
    p.add_argument("target", metavar="TARGET", help="the engine job to start")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--stop-foreign", action="store_true",
                   help="also stop engines gpudeck did not start that hold the target's GPUs or port "
                        "(listed in the plan; the others are left alone)")
    p.add_argument("--wait", action="store_true", help="return once TARGET is ready")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="with --wait: give up after this long (default 1 hour)")
    p.add_argument("--gpu-deadline", type=float, default=None, metavar="SECONDS",
                   help="how long GPU memory may take to be released (default 60)")
    p.add_argument("--json", action="store_true", help="print the plan and result as JSON (needs --yes)")
    p.set_defaults(handler=run_pivot)


def run_pivot(args: argparse.Namespace) -> int:
    from gpudeck.jobs.engines.pivot import PivotError, execute_pivot, plan_pivot
    sup = supervisor(args)
    try:
        plan = plan_pivot(sup, args.target, stop_foreign=args.stop_foreign)
    except PivotError as exc:
        raise CliError(str(exc), code=2) from None
    out = sys.stdout
    if not args.json:
        for line in plan.lines():
            print(line, file=out)
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise CliError("pivot needs confirmation: run it in a terminal or pass --yes", code=2)
        try:
            answer = input("Proceed? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("cancelled; nothing was stopped", file=out)
            return 1

    def show(step) -> None:
        if not args.json:
            print(step.line(), file=out, flush=True)

    deadlines = {}
    if args.timeout is not None:
        deadlines["ready_deadline_s"] = args.timeout
    if args.gpu_deadline is not None:
        deadlines["gpu_deadline_s"] = args.gpu_deadline
    result = execute_pivot(sup, plan, wait=args.wait, on_step=show, **deadlines)
    if args.json:
        print(strictjson.dumps({"plan": plan.to_jsonable(), "result": result.to_jsonable()}, indent=1))
    if not result.ok:
        print(f"gpudeck: pivot stopped: {result.message}", file=sys.stderr)
        return 1
    if not args.json:
        print(f"{result.message} in {result.duration_s:.1f} s (pivot overhead {result.overhead_s:.1f} s)")
    return 0
