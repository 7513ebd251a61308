"""`gpudeck restart JOB`: stop (with verification) then start; prints the new run id."""
from __future__ import annotations

import argparse
import sys

from gpudeck.console.commands._jobs_file import known_job, supervisor
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("restart", help="stop a job (verified) and start it again",
                       description="Stop JOB as `gpudeck stop` does, then start a new run and print its id. "
                                   "Refuses to start if something of the old run remains.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(handler=run_restart, remote_ok=True, mutates=True)


def run_restart(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        with Remote(spec) as remote:
            reply = remote.action("stop", {"job": args.job})
            for line in reply["lines"]:
                print(line, file=sys.stderr)
            if not reply["clean"]:
                raise CliError(f"{args.job}: not restarted, something of the old run remains on {spec.name}")
            print(remote.action("start", {"job": args.job})["run_id"])
        return 0
    from gpudeck.jobs.supervisor import SupervisorError
    sup = supervisor(args)
    known_job(sup, args.job)
    try:
        report = sup.stop(args.job)
        for line in report.lines():
            print(line, file=sys.stderr)
        if not report.clean:
            raise CliError(f"{args.job}: not restarted, something of the old run remains")
        run_id = sup.start(args.job)
    except SupervisorError as exc:
        raise CliError(str(exc)) from None
    print(run_id)
    return 0
