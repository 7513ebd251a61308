"""`gpudeck postmortem [RUN_ID | JOB | PATH.log] [--format md|html|json] [-o FILE]`: what happened to a run, when, and why."""
from __future__ import annotations

import argparse
import json
import os
import sys

from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "postmortem", help="what happened to a run: verdict, phase timeline, stalls, alerts, resources, key lines",
        description="Report on a run (by run id, or a job's latest run) or on any log file: a verdict line "
                    "first, then the phase timeline with durations, stall windows and alerts, pipeline/pivot "
                    "context, resource and serving timelines, the lines that matter with context, and a "
                    "comparison with the job's earlier runs. Markdown (default), self-contained HTML, or JSON.")
    p.add_argument("target", metavar="RUN_ID|JOB|FILE", nargs="?",
                   help="a run id (or a unique part of one), a job (its latest run), a run directory or any log file;"
                        " default: the latest run of any job")
    p.add_argument("--format", choices=("md", "html", "json"), default=None,
                   help="md (default; charts as Unicode sparklines), html (one self-contained file), json")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (format from .html/.json/.md)")
    p.set_defaults(handler=run_postmortem, remote_ok=True)


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    ext = os.path.splitext(args.output or "")[1].lower()
    return {".html": "html", ".htm": "html", ".json": "json"}.get(ext, "md")


def run_postmortem(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import open_box
    # Built on the box that holds the run, from its run directories; rendered here, the same for any box.
    with open_box(args) as box:
        report = box.postmortem(args.target).report
    fmt = _format(args)
    try:
        body = _render(report, fmt)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError) as exc:
        if box.local:
            raise
        # The reply had the shape of a report (jobs/hosts/replies.py) but not every detail a
        # renderer reads: the box's answer is at fault, said in one line.
        raise CliError(f"{box.name}: bad reply to postmortem: the report cannot be rendered "
                       f"({type(exc).__name__}: {exc})") from None
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(body)
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        from gpudeck.jobs.logs.sanitize import terminal_text
        print(terminal_text(report.get("verdict"), 600))
        print(f"wrote {args.output} ({fmt}, {len(body.encode()):,} bytes, built in {report.get('build_s')} s)")
        return 0
    sys.stdout.write(body)
    return 0


def _render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=1, default=str, ensure_ascii=False) + "\n"
    if fmt == "html":
        from gpudeck.jobs.history.render_html import render
        return render(report)
    from gpudeck.jobs.history.render_md import render as render_md
    return render_md(report)
