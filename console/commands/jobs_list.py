"""`gpudeck jobs [--json]`: every declared job with its state, from the run directories."""
from __future__ import annotations

import argparse
import os
import sys
import time

from typing import TYPE_CHECKING, Optional

from gpudeck.jobs import strictjson

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


PHASE_MIN = 24          # a terminal narrower than the other columns still gives the phase this much


def terminal_width() -> Optional[int]:
    """The terminal's columns ($COLUMNS first); None when the output is not a terminal (a pipe keeps whole lines)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def table_lines(views: list[JobView], now: float, width: Optional[int] = None) -> list[str]:
    """The table and, under it, one line per alert or failure: the same words as the console's jobs view.

    `width`: the terminal's; the phase column (last) gets what the others leave, its label shortened to fit."""
    from gpudeck.jobs.view import EMPTY
    shown = [(key, label) for key, label in cli_columns()
             if key not in ("serving", "slurm") or any(view.cells(now)[key] for view in views)]
    header = tuple(label.split(" /")[0].upper() for _, label in shown)
    cells = [view.cells(now) for view in views]
    if width is not None and shown and shown[-1][0] == "phase":
        others = sum(max([len(header[i])] + [len(c[key] or EMPTY) for c in cells]) + 2
                     for i, (key, _) in enumerate(shown[:-1]))
        phase_width = max(PHASE_MIN, width - others)
        cells = [view.cells(now, phase_width=phase_width) for view in views]
    rows = [header] + [tuple(c[key] or EMPTY for key, _ in shown) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [line for view in views for line in view.notice_lines(now)]
    return lines


def run_jobs(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import open_box
    from gpudeck.jobs.view import clean, job_views
    with open_box(args) as box:
        payload = dict(box.jobs().payload)
    payload["host"] = box.name
    for job in payload["jobs"]:
        job["host"] = box.name
    if args.json:
        print(strictjson.dumps(payload, indent=1, default=str))
        return 0
    for line in table_lines(job_views(payload), time.time(), terminal_width()):
        print(line)
    for pipe in payload.get("pipelines", []):
        stages = " → ".join(f"{clean(s['name'], 40)}[{s['status']}]" for s in pipe["stages"])
        print(f"pipeline {pipe['id']} {clean(pipe['target'], 40)}: {pipe['state']}  {stages}")
    return 0
