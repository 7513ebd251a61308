"""A post-mortem as Markdown to paste into a GitHub issue: verdict first, tables, Unicode sparkline charts, fenced log lines."""
from __future__ import annotations

import re
import time
from typing import Any, Optional

from gpudeck.jobs.history.charts import (alert_items, chart_groups, fmt_value, phase_mark, phase_strip, recovered_note,
                                         history_items, result_text, sparkline)
from gpudeck.jobs.history.postmortem import clock, span
from gpudeck.jobs.logs.sanitize import terminal_text

SPARK_WIDTH = 60
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|])")


def text(value: Any, limit: int = 400) -> str:
    """Job text made terminal-safe and inert as Markdown (no links, tables or HTML from a log)."""
    return _MD_SPECIAL.sub(r"\\\1", terminal_text(value, limit))


def when(t: Optional[float]) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def _fence(lines: list[str]) -> list[str]:
    longest = max((len(m) for line in lines for m in re.findall(r"`+|~+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *lines, fence]


def _notifications(report: dict) -> list[str]:
    from gpudeck.jobs.notify import describe
    rows = report.get("notifications") or []
    if not rows:
        return []
    return (["## Notifications", ""]
            + [f"- {clock(r['at_s']) if r.get('at_s') is not None else '?'} {text(describe(r), 600)}" for r in rows]
            + [""])


def render(report: dict) -> str:
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
    if src.get("kind") in ("run", "pipeline"):
        facts += [("job", f"{text(src.get('job'))}" + (f" ({text(src.get('job_kind'))})" if src.get("job_kind") else "")),
                  ("host", f"{text(src.get('host') or '?')} ({text(src.get('backend') or 'local')})"),
                  ("command", f"`{terminal_text(src.get('command'), 300).replace('`', chr(39))}`"
                   if src.get("command") else "?")]
        if src.get("gpus"):
            facts.append(("GPUs", ", ".join(str(g) for g in src["gpus"])))
        if src.get("engine"):
            facts.append(("engine", text(src["engine"])))
        facts += [("started", when(o.get("started_at"))),
                  ("ended", when(o.get("ended_at")) + (f" (took {span(o.get('duration_s'))})"
                                                       if o.get("duration_s") is not None else ""))]
        facts.append(("result", result_text(o, text)))
    if src.get("log"):
        facts.append(("log", f"`{terminal_text(src['log'], 300)}`"))
    if facts:
        out += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts] + [""]

    phases = report.get("phases") or []
    if phases:
        out += ["## Phases", "",
                " → ".join(f"{p['phase']} {clock(p['duration_s'])}" if p.get("duration_s") is not None
                           else p["phase"] for p in phases), "",
                "| phase | at | took | log line | note |", "|---|---|---|---|---|"]
        for p in phases:
            out.append(f"| {p['phase']} | {clock(p.get('start_s')) if p.get('start_s') is not None else '-'} | "
                       f"{clock(p['duration_s']) if p.get('duration_s') is not None else '-'} | "
                       f"{p['line'] if p.get('line') else '-'} | {recovered_note(p)} |")
        out.append("")

    stalls, alerts, silences = report.get("stalls") or [], report.get("alerts") or [], report.get("silences") or []
    if stalls or alerts or silences:
        out += ["## Stalls and alerts", ""]
        for at, code, rest in alert_items(alerts, live_run=src.get("kind") == "run"):
            out.append(f"- {at} **{text(code)}**{text(rest)}" if code else f"- {text(rest)}")
        for s in stalls:
            out.append(f"- stall window ({text(s['code'])}): from {clock(s.get('start_s'))} for "
                       f"{span(s.get('duration_s'))}{'' if s.get('cleared') else ' (until the end)'}")
        for s in silences:
            out.append(f"- log silent from {clock(s.get('start_s'))} for {span(s['duration_s'])}")
        out.append("")

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
                + ", ".join(f"{phase_mark(p)}={p}" for p in dict.fromkeys(p["phase"] for p in phases)), ""]
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
            rows.append(f"{''.ljust(label_w)}  {clock(t[0]).ljust(SPARK_WIDTH - len(clock(t[-1])))}{clock(t[-1])}")
        out += _fence(rows) + [""]
    peaks = (report.get("resources") or {}).get("peaks") or {}
    if peaks.get("gpu_mem") or peaks.get("rss"):
        by_value: dict[str, list[str]] = {}
        for g, v in sorted((peaks.get("gpu_mem") or {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            by_value.setdefault(fmt_value(v, "bytes"), []).append(g)
        parts = [f"GPU{gs[0]} {v}" if len(gs) == 1 else f"GPU{','.join(gs)} {v} each" for v, gs in by_value.items()]
        if peaks.get("rss"):
            parts.append(f"RSS {fmt_value(peaks['rss'], 'bytes')}")
        out += ["Peaks: " + ", ".join(parts), ""]

    lines = report.get("lines") or []
    if lines:
        out += ["## The lines that matter", ""]
        for item in lines:
            out.append(f"**{text(item['label'])}** — line {item['line']:,}")
            body = [f"{'>' if c['key'] else ' '}{c['line']:>8} | {c['text']}" for c in item["context"]]
            out += _fence(body or ["(not in the log on disk)"]) + [""]
    last = report.get("last_lines") or []
    if last:
        out += ["## Last lines", ""]
        out += _fence([f" {(format(x['line'], '>8') if x.get('line') else '        ')} | {x['text']}" for x in last]) + [""]

    hist = report.get("history")
    if hist and hist.get("earlier_runs"):
        out += ["## Against earlier runs", ""] + [f"- {item}" for item in history_items(hist, text)] + [""]
    elif hist is not None:
        out += ["## Against earlier runs", "", "- no earlier run of this job in the index", ""]

    missing = report.get("missing") or []
    if missing:
        out += ["## What this report could not see", ""] + [f"- {text(m)}" for m in missing] + [""]
    return "\n".join(out).rstrip() + "\n"

