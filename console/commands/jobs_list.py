"""`gpudeck jobs [--json]`: every declared job with its state, from the run directories."""
from __future__ import annotations

import argparse
import time

from typing import TYPE_CHECKING

from gpudeck.jobs import strictjson
from gpudeck.console.commands._jobs_file import supervisor

if TYPE_CHECKING:
    from gpudeck.jobs.view import JobView


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list the jobs and their states",
                       description="List every job of the jobs file: state (idle, starting, running, "
                                   "stopping, exited, stopped, lost), pid, run, runtime, port, exit code.")
    p.add_argument("--json", action="store_true", help='print {"jobs": [...], "pipelines": [...]}')
    p.set_defaults(handler=run_jobs, remote_ok=True)


def cli_columns() -> tuple[tuple[str, str], ...]:
    """Every column of the view model but the alerts (their lines follow the table)."""
    from gpudeck.jobs.view import COLUMNS
    return tuple((key, label) for key, label in COLUMNS if key != "alerts")


def table_lines(views: list[JobView], now: float) -> list[str]:
    """The table and, under it, one line per alert or failure: the same words as the console's jobs view."""
    from gpudeck.jobs.view import EMPTY
    shown = [(key, label) for key, label in cli_columns()
             if key not in ("serving", "slurm") or any(view.cells(now)[key] for view in views)]
    rows = [tuple(label.split(" /")[0].upper() for _, label in shown)]
    for view in views:
        cells = view.cells(now)
        rows.append(tuple(cells[key] or EMPTY for key, _ in shown))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [line for view in views for line in view.notice_lines(now)]
    return lines


def run_jobs(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import Remote, host_spec
    from gpudeck.jobs.view import clean, job_views
    spec = host_spec(args)
    if spec.local:
        from gpudeck.jobs.payload import jobs_payload
        payload = jobs_payload(supervisor(args))
    else:
        with Remote(spec) as remote:
            payload = remote.call("jobs")
    payload["host"] = spec.name
    for job in payload["jobs"]:
        job["host"] = spec.name
    if args.json:
        print(strictjson.dumps(payload, indent=1, default=str))
        return 0
    for line in table_lines(job_views(payload), time.time()):
        print(line)
    for pipe in payload.get("pipelines", []):
        stages = " → ".join(f"{clean(s['name'], 40)}[{s['status']}]" for s in pipe["stages"])
        print(f"pipeline {pipe['id']} {clean(pipe['target'], 40)}: {pipe['state']}  {stages}")
    return 0
