"""Shared by the job commands: load the jobs file and build a Supervisor, or fail with one line."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpudeck.jobs.paths import check_regular, find_jobs_file

from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.spec import JobsFile
    from gpudeck.jobs.supervisor import Supervisor

NO_JOBS_FILE = ("no jobs file: pass --jobs FILE, set GPUDECK_JOBS, or create ./jobs.toml "
                "or ~/.config/gpudeck/jobs.toml")


def load_jobs_file(args: argparse.Namespace) -> JobsFile:
    path = find_jobs_file(getattr(args, "jobs_file", None))
    if path is None:
        raise CliError(NO_JOBS_FILE, code=2)
    if not path.exists():
        raise CliError(f"{path}: no such file", code=2)
    try:
        check_regular(path)             # a FIFO would block the read, /dev/zero never end it
    except OSError as exc:
        raise CliError(str(exc), code=2) from None
    from gpudeck.jobs.spec import SpecError, load_jobs
    try:
        return load_jobs(path)
    except SpecError as exc:
        # The first located error is enough here; `gpudeck check` lists them all.
        raise CliError(f"{exc} (run `gpudeck check` for every problem)", code=2) from None


def supervisor(args: argparse.Namespace) -> Supervisor:
    from gpudeck.jobs.supervisor import Supervisor
    return Supervisor(load_jobs_file(args))


def known_job(sup: Supervisor, name: str) -> None:
    from gpudeck.jobs.supervisor import UnknownJob
    try:
        sup.spec(name)
    except UnknownJob as exc:
        raise CliError(str(exc), code=2) from None
