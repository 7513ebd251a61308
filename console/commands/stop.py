"""`gpudeck stop JOB`: stop signal, grace, SIGKILL of the whole tree, then proof that nothing is left."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gpudeck.jobs import strictjson
from gpudeck.console.commands._jobs_file import known_job, supervisor
from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.supervisor import StopReport, Supervisor


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


def print_report(report: StopReport, as_json: bool) -> int:
    if as_json:
        print(strictjson.dumps({**report.to_jsonable(), "host": "local"}, indent=1, default=str))
    else:
        for line in report.lines():
            print(line)
    if not report.clean:
        print(f"gpudeck: {report.job}: something of the run remains (see above)", file=sys.stderr)
        return 1
    return 0


def run_stop(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        with Remote(spec) as remote:
            reply = remote.action("stop", {"job": args.job, "timeout": args.timeout})
        return print_remote_report(reply, args.json, args.job, spec.name)
    from gpudeck.jobs.supervisor import SupervisorError
    sup = supervisor(args)
    known_job(sup, args.job)
    stop_active_pipeline(sup, args.job)
    try:
        report = sup.stop(args.job, timeout=args.timeout)
    except SupervisorError as exc:
        raise CliError(str(exc)) from None
    return print_report(report, args.json)


def print_remote_report(reply: dict, as_json: bool, job: str, host: str) -> int:
    """A stop report made on a remote host (the agent ran the same stop there)."""
    if as_json:
        print(strictjson.dumps({**reply["report"], "host": host}, indent=1, default=str))
    else:
        for line in reply["lines"]:
            print(line)
    if not reply["clean"]:
        print(f"gpudeck: {job}: something of the run remains on {host} (see above)", file=sys.stderr)
        return 1
    return 0


def stop_active_pipeline(sup: Supervisor, job: str) -> None:
    """Stopping a pipeline's target stops the pipeline too (it stops its current stage itself)."""
    from gpudeck.jobs.pipeline import stop_pipeline
    from gpudeck.jobs.pipeline_records import latest_pipeline
    pipe = latest_pipeline(job, sup.state_dir)
    if pipe is not None and pipe.state() == "running":
        if stop_pipeline(pipe):
            print(f"asked pipeline {pipe.pipeline_id} for {job} to stop")
