"""A post-mortem as one self-contained HTML file: inline CSS and SVG charts, no script, no external font or image, every field of the report escaped (a remote host's report as much as a local one)."""
from __future__ import annotations

import html
import time
from typing import Any, Optional

from gpudeck.jobs.history.charts import (alert_items, chart_groups, fmt_value, history_items, recovered_note, resample,
                                         result_text, stall_stacks_note)
from gpudeck.jobs.history.postmortem import clock, span
from gpudeck.jobs.history.shape import shape
from gpudeck.jobs.logs.sanitize import terminal_text

CHART_W, CHART_H = 920, 150
PAD_L, PAD_R, PAD_T, PAD_B = 70, 12, 18, 22
MAX_POINTS = 460                  # two pixels a point is as fine as a chart needs
LINE_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
PHASE_COLOURS = {"starting": "#e8eef7", "loading": "#fff3d6", "compiling": "#efe4fb", "capturing": "#e3f4f4",
                 "ready": "#e2f5e4", "building": "#f4ece1", "training": "#e6f0ff", "failed": "#fde2e2",
                 "running": "#f1f1f1", "error (recovered)": "#fbd0d0"}

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:980px;
color:#1b1f23;background:#fff;line-height:1.4;padding:0 12px}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
.verdict{font-size:16px;font-weight:600;padding:10px 14px;border-radius:6px;margin:8px 0 14px}
.verdict.bad{background:#fde2e2;border-left:5px solid #c62828}.verdict.ok{background:#e2f5e4;border-left:5px solid #2e7d32}
.verdict.info{background:#eef2f7;border-left:5px solid #5470a0}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
th{color:#555;font-weight:600} table.facts td:first-child{color:#555;white-space:nowrap}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:4px;padding:6px 8px;margin:4px 0 12px;
white-space:pre-wrap;overflow-wrap:anywhere} pre .key{background:#fff1b8;display:inline-block;min-width:100%} .ln{color:#888;user-select:none}
.chart{margin:6px 0 2px} .chart-title{font-size:13px;font-weight:600;margin-top:12px}
.legend{font-size:12px;color:#444} .legend span{margin-right:12px;white-space:nowrap}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px;vertical-align:-1px}
ul{margin:4px 0;padding-left:20px;font-size:14px} .muted{color:#666;font-size:13px}
.phasebar{display:flex;height:26px;border-radius:4px;overflow:hidden;border:1px solid #ccc;margin:6px 0}
.phasebar div{font-size:11px;padding:5px 4px;white-space:nowrap;overflow:hidden;border-right:1px solid #fff}
"""


def esc(value: Any, limit: int = 2000) -> str:
    """Job text: terminal-safe (no control characters) and HTML-escaped (quotes too)."""
    return html.escape(terminal_text(value, limit), quote=True)


def _when(t: Optional[float]) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def render(report: dict) -> str:
    # Every field in the type it is formatted as, whoever built the report; every string escaped below.
    report = shape(report)
    src = report.get("source") or {}
    o = report.get("outcome") or {}
    title = (f"Post-mortem: log {src.get('log')}" if src.get("kind") == "log"
             else f"Post-mortem: {src.get('job')} run {src.get('run_id')}")
    tone = "bad" if o.get("failed") or report.get("failure") and src.get("kind") == "log" else (
        "ok" if o.get("state") in ("exited", "succeeded") else "info")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             # No script, no remote anything: this file must open the same offline after scp.
             "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
             "img-src data:\">",
             f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>",
             f'<div class="verdict {tone}" id="verdict">{esc(report.get("verdict"))}</div>']
    parts.append(_facts(src, o))
    parts.append(_phases(report))
    parts.append(_alerts(report))
    parts.append(stack_dumps_html(report))
    parts.append(_notifications(report))
    parts.append(_context(report))
    parts.append(_charts(report))
    parts.append(_lines(report))
    parts.append(_history(report))
    missing = report.get("missing") or []
    if missing:
        parts.append("<h2>What this report could not see</h2><ul>" + "".join(f"<li>{esc(m)}</li>" for m in missing)
                     + "</ul>")
    parts.append(f'<p class="muted">gpudeck post-mortem, built in {esc(report.get("build_s"))} s.</p>')
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def _facts(src: dict, o: dict) -> str:
    rows = []
    if src.get("kind") in ("run", "pipeline"):
        rows += [("job", f"{src.get('job')}" + (f" ({src['job_kind']})" if src.get("job_kind") else "")),
                 ("run", src.get("run_id")),
                 ("host", f"{src.get('host') or '?'} ({src.get('backend') or 'local'})"),
                 ("command", src.get("command") or "?")]
        if src.get("gpus"):
            rows.append(("GPUs", ", ".join(str(g) for g in src["gpus"])))
        if src.get("engine"):
            rows.append(("engine", src["engine"]))
        rows += [("started", _when(o.get("started_at"))),
                 ("ended", _when(o.get("ended_at")) + (f" (took {span(o.get('duration_s'))})"
                                                       if o.get("duration_s") is not None else ""))]
        rows.append(("result", result_text(o)))
    if src.get("log"):
        rows.append(("log", src["log"]))
    if not rows:
        return ""
    return '<table class="facts">' + "".join(
        f"<tr><td>{esc(k)}</td><td>{_code(v) if k in ('command', 'log') else esc(v)}</td></tr>"
        for k, v in rows) + "</table>"


def _code(value: Any) -> str:
    """A command or path in <code>, each of its lines kept (a shell script in jobs.toml has several)."""
    lines = str(value).splitlines()[:40] or [""]
    return "<code>" + "<br>".join(esc(line, 300) for line in lines) + "</code>"


def _phases(report: dict) -> str:
    phases = report.get("phases") or []
    if not phases:
        return ""
    total = sum(p["duration_s"] or 0 for p in phases) or 1.0
    bar = []
    for p in phases:
        share = (p.get("duration_s") or 0) / total
        if share <= 0:
            continue
        label = f"{p['phase']} {clock(p['duration_s'])}"
        bar.append(f'<div style="flex:{share:.5f} 1 0;background:{PHASE_COLOURS.get(p["phase"], "#eee")}" '
                   f'title="{esc(label)}">{esc(label)}</div>')
    rows = "".join(
        f"<tr><td>{esc(p['phase'])}</td><td>{clock(p['start_s']) if p.get('start_s') is not None else '-'}</td>"
        f"<td>{clock(p['duration_s']) if p.get('duration_s') is not None else '-'}</td>"
        f"<td>{esc(p['line']) if p.get('line') else '-'}</td><td>{esc(recovered_note(p))}</td></tr>" for p in phases)
    return ("<h2>Phases</h2>" + (f'<div class="phasebar">{"".join(bar)}</div>' if bar else "")
            + "<table><tr><th>phase</th><th>at</th><th>took</th><th>log line</th><th></th></tr>"
            + f"{rows}</table>")


def _alerts(report: dict) -> str:
    alerts, stalls, silences = report.get("alerts") or [], report.get("stalls") or [], report.get("silences") or []
    if not (alerts or stalls or silences):
        return ""
    items = [f"<li>{esc(at)} <b>{esc(code)}</b>{esc(rest)}</li>" if code else f"<li>{esc(rest)}</li>"
             for at, code, rest in alert_items(alerts, live_run=(report.get("source") or {}).get("kind") == "run")]
    for s in stalls:
        note = stall_stacks_note(s)
        items.append(f"<li>stall window ({esc(s['code'])}): from {clock(s.get('start_s'))} for "
                     f"{span(s.get('duration_s'))}{'' if s.get('cleared') else ' (until the end)'}"
                     f"{'; ' + esc(note, 600) if note else ''}</li>")
    for s in silences:
        items.append(f"<li>log silent from {clock(s.get('start_s'))} for {span(s['duration_s'])}</li>")
    return "<h2>Stalls and alerts</h2><ul>" + "".join(items) + "</ul>"


def _notifications(report: dict) -> str:
    from gpudeck.jobs.notify import describe
    rows = report.get("notifications") or []
    if not rows:
        return ""
    return "<h2>Notifications</h2><ul>" + "".join(
        f"<li>{clock(r['at_s']) if r.get('at_s') is not None else '?'} {esc(describe(r), 600)}</li>" for r in rows) + "</ul>"


def _context(report: dict) -> str:
    ctx = report.get("context") or {}
    if not ctx:
        return ""
    items = []
    if ctx.get("pipeline"):
        p = ctx["pipeline"]
        items.append(f"<li>pipeline {esc(p.get('id'))}"
                     + (f" → {esc(p.get('target'))} ({esc(p.get('state'))}): "
                        + " → ".join(esc(s) for s in p.get("stages") or []) if p.get("target") else "") + "</li>")
    if ctx.get("pivot"):
        steps = "".join(f"<li>{esc(s)}</li>" for s in ctx.get("pivot_steps") or [])
        items.append(f"<li>{esc(ctx['pivot'])}" + (f"<ul>{steps}</ul>" if steps else "") + "</li>")
    if ctx.get("stopped_by"):
        items.append(f"<li>stopped by {esc(ctx['stopped_by'])}</li>")
    return "<h2>Context</h2><ul>" + "".join(items) + "</ul>"


def _charts(report: dict) -> str:
    groups = chart_groups(report)
    if not groups:
        return ""
    t_all = [t for g in groups for t in g["t"] if t is not None]
    o = report.get("outcome") or {}
    t_max = max([*t_all, o.get("duration_s") or 0, 1.0])
    out = ["<h2>Timeline</h2>"]
    res = report.get("resources") or report.get("serving") or {}
    if res.get("width_s"):
        out.append(f'<p class="muted">One point per {esc(span(res["width_s"]))} '
                   "(peaks kept for memory and queues, means for rates); shaded bands are the phases"
                   "; red hatching marks stall windows.</p>")
    for g in groups:
        out.append(f'<div class="chart-title">{esc(g["title"])}'
                   + (" (serving)" if g.get("serving") else "") + "</div>")
        out.append(_svg(report, g, t_max))
        legend = "".join(
            f'<span><i class="swatch" style="background:{LINE_COLOURS[i % len(LINE_COLOURS)]}"></i>{esc(label)} '
            f"peak {esc(fmt_value(_peak(values), g['unit']))}</span>"
            for i, (label, values) in enumerate(g["lines"]))
        out.append(f'<div class="legend">{legend}</div>')
    return "\n".join(out)


def _peak(values: list) -> Optional[float]:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _svg(report: dict, group: dict, t_max: float) -> str:
    w, h = CHART_W, CHART_H
    plot_w, plot_h = w - PAD_L - PAD_R, h - PAD_T - PAD_B
    t = group["t"]
    peak = max([v for _, vals in group["lines"] for v in vals if v is not None] or [0.0])
    top = peak * 1.08 if peak > 0 else 1.0
    if group["unit"] == "pct":
        top = max(100.0, peak)
    if group["unit"] == "ratio":
        top = 1.0

    def x(tt: float) -> float:
        return PAD_L + plot_w * max(0.0, min(1.0, tt / t_max))

    def y(v: float) -> float:
        return PAD_T + plot_h * (1 - max(0.0, min(1.0, v / top)))

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="{esc(group["title"])}">',
             '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="3" height="6" fill="#e53935" fill-opacity="0.25"/>'
             "</pattern></defs>"]
    for p in report.get("phases") or []:
        if p.get("start_s") is None:
            continue
        end = p["start_s"] + (p.get("duration_s") or 0) if p.get("duration_s") is not None else t_max
        x0, x1 = x(p["start_s"]), x(end)
        if x1 - x0 < 0.5:
            continue
        parts.append(f'<rect x="{x0:.1f}" y="{PAD_T}" width="{x1 - x0:.1f}" height="{plot_h}" '
                     f'fill="{PHASE_COLOURS.get(p["phase"], "#eee")}"><title>{esc(p["phase"])}</title></rect>')
        if x1 - x0 > 40:
            parts.append(f'<text x="{x0 + 3:.1f}" y="{PAD_T - 5}" font-size="10" fill="#666">{esc(p["phase"])}</text>')
    for s in report.get("stalls") or []:
        if s.get("start_s") is None or s.get("duration_s") is None:
            continue
        x0, x1 = x(s["start_s"]), x(s["start_s"] + s["duration_s"])
        parts.append(f'<rect x="{x0:.1f}" y="{PAD_T}" width="{max(1.0, x1 - x0):.1f}" height="{plot_h}" '
                     f'fill="url(#hatch)"><title>{esc(s["code"])}</title></rect>')
    parts += stack_dump_marks(report, x, plot_h)
    # axes: baseline, top value, time ticks
    parts.append(f'<line x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{w - PAD_R}" y2="{PAD_T + plot_h}" stroke="#999"/>')
    parts.append(f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + plot_h}" stroke="#999"/>')
    parts.append(f'<text x="{PAD_L - 6}" y="{PAD_T + 4}" font-size="10" text-anchor="end" fill="#444">'
                 f'{esc(fmt_value(top, group["unit"]))}</text>')
    parts.append(f'<text x="{PAD_L - 6}" y="{PAD_T + plot_h}" font-size="10" text-anchor="end" fill="#444">0</text>')
    for k in range(6):
        tt = t_max * k / 5
        anchor = "start" if k == 0 else ("end" if k == 5 else "middle")
        parts.append(f'<text x="{x(tt):.1f}" y="{h - 6}" font-size="10" text-anchor="{anchor}" fill="#444">'
                     f"{_tick(tt, t_max)}</text>")
    for i, (label, values) in enumerate(group["lines"]):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        pts = list(zip(t, values))
        if len(pts) > MAX_POINTS:
            ts = resample([p[0] for p in pts], MAX_POINTS)
            vs = resample([p[1] for p in pts], MAX_POINTS)
            pts = list(zip(ts, vs))
        segments: list[list[str]] = []
        current: list[str] = []
        for tt, v in pts:
            if tt is None or v is None:
                if current:
                    segments.append(current)
                current = []
                continue
            current.append(f"{x(tt):.1f},{y(v):.1f}")
        if current:
            segments.append(current)
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            else:
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(seg)}">'
                             f"<title>{esc(label)}</title></polyline>")
    parts.append("</svg>")
    return "".join(parts)


def _tick(t: float, t_max: float) -> str:
    # A run of a few seconds needs tenths, or its ticks repeat the same second.
    return f"{t:.1f} s" if t_max < 30 else clock(t)


def _lines(report: dict) -> str:
    out = []
    lines = report.get("lines") or []
    if lines:
        out.append("<h2>The lines that matter</h2>")
        for item in lines:
            out.append(f"<div><b>{esc(item['label'])}</b> — line {_count(item['line'])}</div>")
            body = []
            for c in item["context"]:
                row = f'<span class="ln">{esc(_count(c["line"], "", "")):>8} </span>{esc(c["text"])}'
                body.append(f'<span class="key">{row}</span>' if c["key"] else row)
            out.append("<pre>" + ("\n".join(body) or "(not in the log on disk)") + "</pre>")
    last = report.get("last_lines") or []
    if last:
        out.append("<h2>Last lines</h2><pre>" + "\n".join(
            f'<span class="ln">{esc(_count(x["line"], "", "")):>8} </span>{esc(x["text"])}' for x in last)
            + "</pre>")
    return "\n".join(out)


def _count(n: Optional[int], none: str = "?", sep: str = ",") -> str:
    """A line number as text (1,234); a missing one as `none`."""
    return none if n is None else format(n, sep)


def _history(report: dict) -> str:
    hist = report.get("history")
    if hist is None:
        return ""
    if not hist.get("earlier_runs"):
        return "<h2>Against earlier runs</h2><p class=\"muted\">No earlier run of this job in the index.</p>"
    items = history_items(hist)
    return "<h2>Against earlier runs</h2><ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


def stack_dumps_html(report: dict) -> str:
    """Where the stalled run waited: each stack dump it took, with its verdict."""
    dumps = report.get("stacks") or []
    if not dumps:
        return ""
    items = []
    for d in dumps:
        what = esc(d.get("verdict")) if d.get("verdict") else f"no verdict: {esc(d.get('error') or '?')}"
        where = f" <code>{esc(d['path'])}</code>" if d.get("path") else ""
        body = ""
        if d.get("lines"):
            more = [f"… {d['lines_left_out']} more lines in the file"] if d.get("lines_left_out") else []
            body = '<pre class="stack-dump">' + "\n".join(esc(line, 400) for line in [*d["lines"], *more]) + "</pre>"
        items.append(f"<li>{clock(d.get('at_s'))} on <b>{esc(d.get('code'))}</b>: {what}{where}{body}</li>")
    return '<h2>Stack dumps</h2><ul id="stack-dumps">' + "".join(items) + "</ul>"


def stack_dump_marks(report: dict, x: Any, plot_h: float) -> list[str]:
    """A dashed line on each chart where a stack dump was taken, its verdict as the tooltip."""
    marks = []
    for d in report.get("stacks") or []:
        if d.get("at_s") is None:
            continue
        at = x(d["at_s"])
        marks.append(f'<line x1="{at:.1f}" y1="{PAD_T}" x2="{at:.1f}" y2="{PAD_T + plot_h}" stroke="#b00" '
                     f'stroke-dasharray="3,2" class="stack-dump"><title>stacks: {esc(d.get("verdict") or d.get("error"))}'
                     f'</title></line>')
    return marks
