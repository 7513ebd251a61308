"""`gpudeck jobs [--json]`: every declared job with its state, from the run directories."""
from __future__ import annotations

import argparse
import json
import time

from gpudeck.console.commands._jobs_file import supervisor
from gpudeck.console.format import human_age
from gpudeck.jobs.logs.sanitize import terminal_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list the jobs and their states",
                       description="List every job of the jobs file: state (idle, starting, running, "
                                   "stopping, exited, stopped, lost), pid, run, runtime, port, exit code.")
    p.add_argument("--json", action="store_true", help='print {"jobs": [...], "pipelines": [...]}')
    p.set_defaults(handler=run_jobs)


def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def _phase_text(job: dict) -> str:
    """`loading 33/85 ETA 12m` — the phase and, while there is one, the progress."""
    phase = job.get("phase")
    if not phase or phase == "unknown":
        return "-"
    progress = job.get("progress") or {}
    if progress.get("total"):
        text = f"{phase} {progress.get('done')}/{progress['total']}"
        if progress.get("eta_s") is not None:
            text += f" ETA {human_age(progress['eta_s'])}"
        return text
    return phase


def run_jobs(args: argparse.Namespace) -> int:
    from gpudeck.jobs.payload import jobs_payload
    sup = supervisor(args)
    payload = jobs_payload(sup)
    if args.json:
        print(json.dumps(payload, indent=1, default=str))
        return 0
    now = time.time()
    rows = [("NAME", "KIND", "STATE", "PID", "RUNTIME", "PORT", "GPUS", "EXIT", "PHASE", "RUN")]
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
                     _phase_text(job), _cell(job.get("run_id"))))
    # Sanitised before the widths are measured: what is measured is what is shown.
    rows = [tuple(terminal_text(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for job in payload["jobs"]:
        # Alerts and failures under the table, one line each: what the operator must act on.
        for alert in job.get("alerts") or []:
            print(f"! {job['name']}: {alert.get('code')}: {alert.get('message')}")
        failure = job.get("failure")
        if failure and not any(a.get("code") == "crashed" for a in job.get("alerts") or []):
            print(f"! {job['name']}: {failure.get('cause')} at log line {failure.get('line')}: {failure.get('hint')}")
    for pipe in payload.get("pipelines", []):
        stages = " → ".join(f"{s['name']}[{s['status']}]" for s in pipe["stages"])
        print(f"pipeline {pipe['id']} {pipe['target']}: {pipe['state']}  {stages}")
    return 0
