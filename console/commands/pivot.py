"""`gpudeck pivot TARGET`: stop the running engines, prove GPUs and ports free, start TARGET (and wait)."""
from __future__ import annotations

import argparse
import sys

from gpudeck.jobs import strictjson
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
    p.set_defaults(handler=run_pivot, remote_ok=True, mutates=True)


def _confirmed(args: argparse.Namespace, lines: list[str]) -> bool:
    """Show the plan (not with --json) and ask, unless --yes; False when the operator says no."""
    if not args.json:
        for line in lines:
            print(line, file=sys.stdout)
    if args.yes:
        return True
    if args.json or not sys.stdin.isatty():
        raise CliError("pivot needs confirmation: run it in a terminal or pass --yes", code=2)
    try:
        answer = input("Proceed? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("cancelled; nothing was stopped", file=sys.stdout)
        return False
    return True


def run_pivot(args: argparse.Namespace) -> int:
    """Planned on the box, confirmed here, stopped and started on the box; each step printed as it completes."""
    from gpudeck.console.commands._host import open_box
    from gpudeck.jobs.engines.pivot import PivotStep
    with open_box(args) as box:
        plan = box.pivot_plan(args.target, stop_foreign=args.stop_foreign)
        if not _confirmed(args, plan.lines):
            return 1

        def show(step: dict) -> None:
            if not args.json:
                print(PivotStep(**step).line(), flush=True)

        outcome = box.pivot(plan, wait=args.wait, on_step=show, ready_deadline_s=args.timeout,
                            gpu_deadline_s=args.gpu_deadline)
    where = "" if box.local else f" on {box.name}"
    if args.json:
        document: dict = {"plan": plan.plan, "result": outcome.result}
        if not box.local:
            document["host"] = box.name
        print(strictjson.dumps(document, indent=1))
    if not outcome.ok:
        print(f"gpudeck: pivot stopped{where}: {outcome.message}", file=sys.stderr)
        return 1
    if not args.json:
        print(f"{outcome.message}{where} in {outcome.duration_s:.1f} s (pivot overhead {outcome.overhead_s:.1f} s)")
    return 0
