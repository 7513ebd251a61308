"""A post-mortem as Markdown to paste into a GitHub issue: verdict first, tables, Unicode sparkline charts, fenced log lines.

Every field of the report (a remote host's as much as a local one) is printed inert:
escaped text, code spans and fences longer than any backtick run inside them.
"""
from __future__ import annotations

import re
import time
from typing import Any, Optional

from gpudeck.jobs.history.charts import (alert_items, chart_groups, fmt_value, phase_mark, phase_strip, recovered_note,
                                         history_items, result_text, sparkline, stall_stacks_note)
from gpudeck.jobs.history.postmortem import clock, span
from gpudeck.jobs.history.shape import shape
from gpudeck.jobs.logs.sanitize import terminal_text

SPARK_WIDTH = 60
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|&])")


def text(value: Any, limit: int = 400) -> str:
    """Job text made terminal-safe and inert as Markdown (no links, tables or HTML from a log)."""
    return _MD_SPECIAL.sub(r"\\\1", terminal_text(value, limit))


def when(t: Optional[float]) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def code_span(value: Any, limit: int = 300) -> str:
    """Job text as one inline code span: fenced by more backticks than it holds (CommonMark), pipes escaped so a
    table cell keeps its column (GFM reads `\\|` as a pipe inside a code span too)."""
    body = terminal_text(value, limit)
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    if body.startswith("`") or body.endswith("`") or (body.startswith(" ") and body.endswith(" ") and body.strip()):
        body = f" {body} "             # CommonMark strips one space each side: a backtick at an end stays text
    return f"{fence}{body.replace('|', chr(92) + '|')}{fence}"


def command_lines(command: Any) -> list[str]:
    """A command as the lines it was written in (a shell script in jobs.toml has several), each made terminal-safe."""
    if command is None:
        return []
    return [terminal_text(line, 300) for line in str(command).splitlines()[:40]] or [""]


def time_axis(t: list, width: int) -> str:
    """The first and last time under a chart of `width` cells, the last ending at its last cell."""
    known = [x for x in t if x is not None]
    first, last = (clock(known[0]), clock(known[-1])) if known else ("?", "?")
    if len(first) + 1 + len(last) <= width:
        return first.ljust(width - len(last)) + last
    return last.rjust(width) if len(last) <= width else f"{first}–{last}"


def _fence(lines: list[str], info: str = "text") -> list[str]:
    longest = max((len(m) for line in lines for m in re.findall(r"`+|~+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *lines, fence]


def _notifications(report: dict) -> list[str]:
    from gpudeck.jobs.notify import describe
    rows = report.get("notifications") or []
    if not rows:
        return []
    return (["## Notifications", ""]
            + [f"- {clock(r['at_s']) if r.get('at_s') is not None else '?'} {text(describe(r), 600)}" for r in rows]
            + [""])


def render(report: dict) -> str:
    # Every field in the type it is formatted as, whoever built the report; every string escaped below.
    report = shape(report)
    src = report.get("source") or {}
    o = report.get("outcome") or {}
    out: list[str] = []
    # The verdict is the first line: it is what an operator reads, and what a terminal shows first.
    out += [f"**{text(report.get('verdict'), 600)}**", ""]
    if src.get("kind") == "log":
        out += [f"Post-mortem of the log {text(src.get('log'))}", ""]
    else:
        out += [f"Post-mortem of {text(src.get('job'))} run {text(src.get('run_id'))}", ""]

    facts = []
    command = command_lines(src.get("command"))
    if src.get("kind") in ("run", "pipeline"):
        facts += [("job", f"{text(src.get('job'))}" + (f" ({text(src.get('job_kind'))})" if src.get("job_kind") else "")),
                  ("host", f"{text(src.get('host') or '?')} ({text(src.get('backend') or 'local')})"),
                  # A table cell is one line: a multi-line command is fenced below the table, whole.
                  ("command", code_span(command[0]) if len(command) == 1 else
                   (f"{len(command)} lines, below" if command else "?"))]
        if src.get("gpus"):
            facts.append(("GPUs", ", ".join(text(g) for g in src["gpus"])))
        if src.get("engine"):
            facts.append(("engine", text(src["engine"])))
        facts += [("started", when(o.get("started_at"))),
                  ("ended", when(o.get("ended_at")) + (f" (took {span(o.get('duration_s'))})"
                                                       if o.get("duration_s") is not None else ""))]
        facts.append(("result", result_text(o, text)))
    if src.get("log"):
        facts.append(("log", code_span(src["log"])))
    if facts:
        out += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts] + [""]
        if len(command) > 1:
            out += _fence(command, "sh") + [""]

    phases = report.get("phases") or []
    if phases:
        out += ["## Phases", "",
                " → ".join(f"{text(p['phase'])} {clock(p['duration_s'])}" if p.get("duration_s") is not None
                           else text(p["phase"]) for p in phases), "",
                "| phase | at | took | log line | note |", "|---|---|---|---|---|"]
        for p in phases:
            out.append(f"| {text(p['phase'])} | {clock(p.get('start_s')) if p.get('start_s') is not None else '-'} | "
                       f"{clock(p['duration_s']) if p.get('duration_s') is not None else '-'} | "
                       f"{text(p['line']) if p.get('line') else '-'} | {text(recovered_note(p))} |")
        out.append("")

    stalls, alerts, silences = report.get("stalls") or [], report.get("alerts") or [], report.get("silences") or []
    if stalls or alerts or silences:
        out += ["## Stalls and alerts", ""]
        for at, code, rest in alert_items(alerts, live_run=src.get("kind") == "run"):
            out.append(f"- {text(at)} **{text(code)}**{text(rest)}" if code else f"- {text(rest)}")
        for s in stalls:
            note = stall_stacks_note(s)
            out.append(f"- stall window ({text(s['code'])}): from {clock(s.get('start_s'))} for "
                       f"{span(s.get('duration_s'))}{'' if s.get('cleared') else ' (until the end)'}"
                       f"{'; ' + text(note, 600) if note else ''}")
        for s in silences:
            out.append(f"- log silent from {clock(s.get('start_s'))} for {span(s['duration_s'])}")
        out.append("")

    out += stack_dumps_md(report)
    out += _notifications(report)

    ctx = report.get("context") or {}
    if ctx:
        out += ["## Context", ""]
        if ctx.get("pipeline"):
            p = ctx["pipeline"]
            out.append(f"- pipeline {text(p.get('id'))}" + (f" → {text(p.get('target'))} ({text(p.get('state'))}): "
                                                             + " → ".join(text(s) for s in p.get("stages") or [])
                                                             if p.get("target") else ""))
        if ctx.get("pivot"):
            out.append(f"- {text(ctx['pivot'])}")
            for step in ctx.get("pivot_steps") or []:
                out.append(f"  - {text(step)}")
        if ctx.get("stopped_by"):
            out.append(f"- stopped by {text(ctx['stopped_by'])}")
        out.append("")

    groups = chart_groups(report)
    if groups:
        res = report.get("resources") or report.get("serving") or {}
        width = res.get("width_s")
        out += ["## Timeline", "", f"One cell is the maximum over {max(1, len(res.get('t') or []) // SPARK_WIDTH)}"
                f" point(s) of {span(width) if width else '?'}; phases: "
                + ", ".join(f"{text(phase_mark(p))}={text(p)}" for p in dict.fromkeys(p["phase"] for p in phases)), ""]
        rows = []
        label_w = max(len(f"{g['title']} {lbl}") for g in groups for lbl, _ in g["lines"])
        for g in groups:
            drawn: list[list] = []          # [labels, spark, peaks]: GPUs that look the same share a row
            for label, values in g["lines"]:
                present = [v for v in values if v is not None]
                peak = max(present) if present else None
                spark = sparkline(values, SPARK_WIDTH, lo=0.0 if g["unit"] != "rate" else None)
                if drawn and drawn[-1][1] == spark:
                    drawn[-1][0].append(label)
                    drawn[-1][2].append(peak)
                else:
                    drawn.append([[label], spark, [peak]])
            for labels, spark, peaks in drawn:
                label = labels[0] if len(labels) == 1 else f"{labels[0]}-{labels[-1].removeprefix('GPU')}"
                name = f"{g['title']} {label}" if label.lower() not in g["title"].lower() else g["title"]
                known = [p for p in peaks if p is not None]
                lo_text, hi_text = (fmt_value(min(known), g["unit"]), fmt_value(max(known), g["unit"])) if known \
                    else ("-", "-")
                rows.append(f"{name.ljust(label_w)}  {spark}  peak {hi_text if lo_text == hi_text else lo_text + '–' + hi_text}")
        strip = phase_strip(report, groups[0]["t"], SPARK_WIDTH)
        if strip:
            rows.append(f"{'phase'.ljust(label_w)}  {strip}")
        t = groups[0]["t"]
        if t:
            rows.append(f"{''.ljust(label_w)}  {time_axis(t, min(len(t), SPARK_WIDTH))}")
        out += _fence(rows) + [""]
    peaks = (report.get("resources") or {}).get("peaks") or {}
    if peaks.get("gpu_mem") or peaks.get("rss"):
        by_value: dict[str, list[str]] = {}
        for g, v in sorted((peaks.get("gpu_mem") or {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            by_value.setdefault(fmt_value(v, "bytes"), []).append(g)
        parts = [f"GPU{text(gs[0])} {v}" if len(gs) == 1 else f"GPU{text(','.join(gs))} {v} each"
                 for v, gs in by_value.items()]
        if peaks.get("rss"):
            parts.append(f"RSS {fmt_value(peaks['rss'], 'bytes')}")
        out += ["Peaks: " + ", ".join(parts), ""]

    lines = report.get("lines") or []
    if lines:
        out += ["## The lines that matter", ""]
        for item in lines:
            out.append(f"**{text(item['label'])}** — line {'?' if item['line'] is None else format(item['line'], ',')}")
            body = [f"{'>' if c['key'] else ' '}{'' if c['line'] is None else c['line']:>8} | {terminal_text(c['text'])}"
                    for c in item["context"]]
            out += _fence(body or ["(not in the log on disk)"]) + [""]
    last = report.get("last_lines") or []
    if last:
        out += ["## Last lines", ""]
        out += _fence([f" {(format(x['line'], '>8') if x.get('line') else '        ')} | {terminal_text(x['text'])}"
                       for x in last]) + [""]

    hist = report.get("history")
    if hist and hist.get("earlier_runs"):
        out += ["## Against earlier runs", ""] + [f"- {item}" for item in history_items(hist, text)] + [""]
    elif hist is not None:
        out += ["## Against earlier runs", "", "- no earlier run of this job in the index", ""]

    missing = report.get("missing") or []
    if missing:
        out += ["## What this report could not see", ""] + [f"- {text(m)}" for m in missing] + [""]
    return "\n".join(out).rstrip() + "\n"


def stack_dumps_md(report: dict) -> list[str]:
    """Where the stalled run waited: each stack dump it took, with its verdict."""
    dumps = report.get("stacks") or []
    if not dumps:
        return []
    out = ["## Stack dumps", ""]
    for d in dumps:
        what = text(d.get("verdict")) if d.get("verdict") else f"no verdict: {text(d.get('error') or '?')}"
        where = f" (`{terminal_text(d['path'], 200).replace('`', chr(39))}`)" if d.get("path") else ""
        out.append(f"- {clock(d.get('at_s'))} on **{text(d.get('code'))}**: {what}{where}")
        if d.get("lines"):
            # A fence no line of the job's can close: backticks in a frame name become quotes.
            body = [terminal_text(line, 400).replace("`", "'") for line in d["lines"]]
            if d.get("lines_left_out"):
                body.append(f"… {d['lines_left_out']} more lines in the file")
            out += ["", "  ```text", *(f"  {line}" for line in body), "  ```"]
    return out + [""]
