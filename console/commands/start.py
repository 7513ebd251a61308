"""`gpudeck start JOB`: start a detached run and print its id at once."""
from __future__ import annotations

import argparse

from gpudeck.console.commands._jobs_file import known_job, supervisor
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("start", help="start a job (detached: it outlives this command and the console)",
                       description="Start JOB under its own runner and print the run id. Returns at once; "
                                   "the job keeps running after gpudeck exits.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(handler=run_start, remote_ok=True, mutates=True)


def run_start(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        with Remote(spec) as remote:
            print(remote.action("start", {"job": args.job})["run_id"])
        return 0
    from gpudeck.jobs.supervisor import SupervisorError
    sup = supervisor(args)
    known_job(sup, args.job)
    try:
        run_id = sup.start(args.job)
    except SupervisorError as exc:
        raise CliError(str(exc)) from None
    print(run_id)
    return 0
