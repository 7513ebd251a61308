"""`gpudeck pivot TARGET`: stop the running engines, prove GPUs and ports free, start TARGET (and wait)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gpudeck.jobs import strictjson
from gpudeck.console.commands._jobs_file import supervisor
from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.engines.pivot import PivotStep
    from gpudeck.jobs.hosts.config import HostSpec


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
    from gpudeck.console.commands._host import remote_spec
    spec = remote_spec(args)
    if spec is not None:
        return _pivot_remote(args, spec)
    from gpudeck.jobs.engines.pivot import PivotError, execute_pivot, plan_pivot
    sup = supervisor(args)
    try:
        plan = plan_pivot(sup, args.target, stop_foreign=args.stop_foreign)
    except PivotError as exc:
        raise CliError(str(exc), code=2) from None
    out = sys.stdout
    if not _confirmed(args, plan.lines()):
        return 1

    def show(step: PivotStep) -> None:
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


def _pivot_remote(args: argparse.Namespace, spec: HostSpec) -> int:
    """The pivot on the box: planned there, confirmed here, stopped and started there; --wait asks the box
    until the target is ready (each ask bounded, so a dropped link costs one ask, not the pivot)."""
    import time

    from gpudeck.console.commands._host import Remote
    from gpudeck.jobs.engines.pivot import READY_DEADLINE_S, PivotStep
    target = {"target": args.target, "stop_foreign": args.stop_foreign}
    with Remote(spec) as remote:
        shown = remote.call("pivot_plan", target)
        if not _confirmed(args, shown["lines"]):
            return 1
        params = {**target, "plan": shown["plan"]}
        if args.gpu_deadline is not None:
            params["gpu_deadline_s"] = args.gpu_deadline
        token = remote.action("pivot", params)["token"]
        seen = 0
        while True:
            try:
                progress = remote.call("pivot_progress", {"token": token, "seen": seen, "wait_s": 5.0})
            except CliError as exc:
                raise CliError(f"{exc}; the pivot started on {spec.name} and carries on there without this "
                               f"command: check `gpudeck --host {spec.name} jobs`", exc.code) from None
            for data in progress["steps"]:
                if not args.json:
                    print(PivotStep(**data).line(), flush=True)
            seen += len(progress["steps"])
            if progress["done"] is not None:
                break
        reply = progress["done"]
        if "error" in reply:
            raise CliError(f"pivot failed on {spec.name}: {reply['error']}", 1)
        result = reply["result"]
        steps = [PivotStep(**s) for s in result["steps"]]
        if result["ok"] and args.wait:
            deadline = args.timeout if args.timeout is not None else READY_DEADLINE_S
            t0 = time.monotonic()
            while True:
                try:
                    state = remote.call("pivot_ready", {"target": args.target, "run_id": result["run_id"],
                                                        "wait_s": max(0.0, min(5.0, deadline - (time.monotonic() - t0)))})
                except CliError as exc:
                    # The pivot itself is done on the box: say so, not only that the link failed.
                    raise CliError(f"{exc}; the pivot was done on {spec.name} ({result['message']}) but its "
                                   f"readiness is unknown: check `gpudeck --host {spec.name} jobs`", exc.code) from None
                waited = time.monotonic() - t0
                if state["ready"] or not state["alive"] or waited >= deadline:
                    break
            detail = state["detail"] if state["ready"] or not state["alive"] else \
                f"not ready after {deadline:.0f} s: {state['detail']}"
            step = PivotStep(f"wait for {args.target} ready", state["ready"], waited, detail)
            steps.append(step)
            result["steps"].append({"name": step.name, "ok": step.ok, "duration_s": step.duration_s,
                                    "detail": step.detail})
            result["duration_s"] = round(result["duration_s"] + waited, 3)
            if not args.json:
                print(step.line(), flush=True)
            if step.ok:
                result["message"] += ", ready"
            else:
                result["ok"] = False
                result["message"] = f"{args.target} did not become ready: {detail}"
    if args.json:
        print(strictjson.dumps({"plan": shown["plan"], "result": result, "host": spec.name}, indent=1))
    if not result["ok"]:
        print(f"gpudeck: pivot stopped on {spec.name}: {result['message']}", file=sys.stderr)
        return 1
    if not args.json:
        print(f"{result['message']} on {spec.name} in {result['duration_s']:.1f} s "
              f"(pivot overhead {reply['overhead_s']:.1f} s)")
    return 0
