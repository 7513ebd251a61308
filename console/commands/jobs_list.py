"""`gpudeck jobs [--json]`: every declared job with its state, from the run directories."""
from __future__ import annotations

import argparse
import json
import time

from console.commands._jobs_file import supervisor
from console.format import human_age


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list the jobs and their states",
                       description="List every job of the jobs file: state (idle, starting, running, "
                                   "stopping, exited, stopped, lost), pid, run, runtime, port, exit code.")
    p.add_argument("--json", action="store_true", help='print {"jobs": [...], "pipelines": [...]}')
    p.set_defaults(handler=run_jobs)


def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def run_jobs(args: argparse.Namespace) -> int:
    from jobs.supervisor import jobs_payload
    sup = supervisor(args)
    payload = jobs_payload(sup)
    if args.json:
        print(json.dumps(payload, indent=1, default=str))
        return 0
    now = time.time()
    rows = [("NAME", "KIND", "STATE", "PID", "RUNTIME", "PORT", "GPUS", "EXIT", "RUN")]
    for job in payload["jobs"]:
        runtime = None
        if job.get("started_at"):
            end = job.get("ended_at") or now
            runtime = human_age(end - job["started_at"])
        port = job.get("port")
        if port is not None:
            port = f"{port}{' open' if job.get('port_open') else ''}"
        exit_text = job.get("exit_code")
        if job.get("signal"):
            exit_text = f"{exit_text} ({job['signal']})"
        rows.append((job["name"], job["kind"], job["state"], _cell(job.get("pid")), _cell(runtime),
                     _cell(port), ",".join(map(str, job.get("gpus") or [])) or "-", _cell(exit_text),
                     _cell(job.get("run_id"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for pipe in payload.get("pipelines", []):
        stages = " → ".join(f"{s['name']}[{s['status']}]" for s in pipe["stages"])
        print(f"pipeline {pipe['id']} {pipe['target']}: {pipe['state']}  {stages}")
    return 0
