"""`gpudeck run JOB [--wait]`: run JOB after everything it needs, as a detached pipeline."""
from __future__ import annotations

import argparse
import time
from typing import Callable, Optional

from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a job after its `needs` (a detached pipeline)",
                       description="Run JOB after everything it needs, transitively, in dependency order; "
                                   "stages whose done_when path exists are skipped; the first failure stops "
                                   "the pipeline. The pipeline runs detached and advances with no console "
                                   "open. --wait follows it and exits 0 on success, 1 naming the failed stage.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--wait", action="store_true", help="follow the pipeline to its end and exit with its result")
    p.set_defaults(handler=run_pipeline, remote_ok=True, mutates=True)


def describe_event(ev: dict) -> str | None:
    kind = ev.get("event")
    stage = ev.get("stage")
    if kind == "StageSkipped":
        return f"{stage}: skipped ({ev.get('reason')})"
    if kind == "StageStarted":
        return f"{stage}: started (run {ev.get('run_id')})"
    if kind == "StageFinished":
        if ev.get("ok"):
            return f"{stage}: succeeded"
        how = f"signal {ev['signal']}" if ev.get("signal") else f"exit {ev.get('exit_code')}"
        return f"{stage}: failed ({'stopped, ' if ev.get('stopped') else ''}{how})"
    if kind == "StageFailedToStart":
        return f"{stage}: could not start: {ev.get('error')}"
    return None


def run_pipeline(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import open_box
    with open_box(args) as box:
        started = box.run(args.job)
        print(f"pipeline {started.pipeline_id}: {' -> '.join(started.stages)}", flush=True)
        if not args.wait:
            return 0

        def poll(seen: int) -> tuple[list[dict], int, dict | None, str]:
            progress = box.pipeline(args.job, started.pipeline_id, seen=seen)
            return progress.events, progress.count, progress.result, progress.state

        return follow_pipeline(started.pipeline_id, poll)


def follow_pipeline(pipeline_id: str, poll: Callable[[int], tuple[list[dict], int, Optional[dict], str]]) -> int:
    """Print each stage event as it happens; exit 0 on success, 1 naming the failed stage."""
    seen = 0
    while True:
        events, count, _, _ = poll(seen)
        for ev in events:
            text = describe_event(ev)
            if text:
                print(text, flush=True)
        seen = count
        _, count, result, state = poll(seen)
        if result is not None and seen >= count:
            if result.get("ok"):
                print(f"pipeline {pipeline_id}: succeeded")
                return 0
            stage = result.get("failed_stage")
            how = result.get("error") or (f"signal {result['signal']}" if result.get("signal")
                                          else f"exit {result.get('exit_code')}")
            raise CliError(f"pipeline {pipeline_id} failed at stage {stage} ({how})", code=1)
        if state == "lost":
            raise CliError(f"pipeline {pipeline_id} vanished without a result", code=1)
        time.sleep(0.3)
