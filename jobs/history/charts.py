"""What the Markdown and HTML post-mortems share: which charts to draw from the timelines, their Unicode sparkline form, value formats, how many alerts to list."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from gpudeck.jobs.strictjson import number

SPARKS = "▁▂▃▄▅▆▇█"
# One letter per phase in the Markdown phase strip (initials collide: compiling/capturing).
PHASE_MARK = {"starting": "s", "loading": "L", "compiling": "C", "capturing": "G", "ready": "R",
              "building": "B", "training": "T", "failed": "X", "running": "r", "error (recovered)": "e"}
_GPU_SERIES = re.compile(r"^gpu(\d+):(\w+)$")

# (title, unit, which series) — unit: bytes | pct | watts | bps | count | ratio | rate
RESOURCE_GROUPS = (
    ("GPU memory", "bytes", "mem"),
    ("GPU utilisation", "pct", "util"),
    ("GPU power", "watts", "power_w"),
    ("CPU", "pct", "cpu_pct"),
    ("RSS", "bytes", "rss"),
    ("disk read", "bps", "read_bps"),
    ("log output", "bps", "log_bps"),
)
SERVING_GROUPS = (
    ("tokens/s", "rate", ("gen_tokens_per_s", "prompt_tokens_per_s")),
    ("requests", "count", ("running", "waiting")),
    ("KV cache", "pct", ("kv_cache_pct",)),
    ("spec-decode acceptance", "ratio", ("spec_accept_rate",)),
)
SERIES_LABELS = {"gen_tokens_per_s": "generation", "prompt_tokens_per_s": "prompt", "running": "running",
                 "waiting": "waiting", "kv_cache_pct": "KV cache", "spec_accept_rate": "acceptance",
                 "cpu_pct": "CPU", "rss": "RSS", "read_bps": "read", "log_bps": "log"}


def chart_groups(report: dict) -> list[dict]:
    """[{title, unit, t, lines: [(label, values)]}] for every group with data, resources then serving."""
    out = []
    res = report.get("resources") or {}
    series = res.get("series") or {}
    for title, unit, key in RESOURCE_GROUPS:
        lines = []
        if key in ("mem", "util", "power_w"):
            per_gpu = []
            for name, values in series.items():
                m = _GPU_SERIES.match(name)
                if m and m.group(2) == key:
                    per_gpu.append((int(m.group(1)), f"GPU{m.group(1)}", values))
            lines = [(label, values) for _, label, values in sorted(per_gpu)]
        elif key in series:
            lines = [(SERIES_LABELS.get(key, key), series[key])]
        if lines and any(v is not None for _, vals in lines for v in vals):
            out.append({"title": title, "unit": unit, "t": res.get("t") or [], "lines": lines})
    srv = report.get("serving") or {}
    sseries = srv.get("series") or {}
    for title, unit, keys in SERVING_GROUPS:
        lines = [(SERIES_LABELS.get(k, k), sseries[k]) for k in keys if k in sseries]
        if lines:
            out.append({"title": title, "unit": unit, "t": srv.get("t") or [], "lines": lines, "serving": True})
    return out


def fmt_value(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("bytes", "bps"):
        v = float(value)
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or suffix == "TiB":
                text = f"{v:.0f} {suffix}" if suffix == "B" or abs(v) >= 100 else f"{v:.1f} {suffix}"
                return text + ("/s" if unit == "bps" else "")
            v /= 1024
    if unit == "pct":
        return f"{value:.0f}%"
    if unit == "watts":
        return f"{value:.0f} W"
    if unit == "ratio":
        return f"{100 * value:.0f}%"
    if unit == "rate":
        return f"{value:.1f}/s"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def resample(values: list, width: int) -> list[Optional[float]]:
    """At most `width` cells, each the maximum of the values it covers (a peak stays visible)."""
    n = len(values)
    if n <= width:
        return list(values)
    out = []
    for i in range(width):
        cell = [v for v in values[i * n // width:(i + 1) * n // width] if v is not None]
        out.append(max(cell) if cell else None)
    return out


def sparkline(values: list, width: int = 60, lo: Optional[float] = None, hi: Optional[float] = None) -> str:
    cells = resample(values, width)
    present = [v for v in cells if v is not None]
    if not present:
        return " " * len(cells)
    lo = min(present) if lo is None else lo
    hi = max(present) if hi is None else hi
    span = (hi - lo) or 1.0
    return "".join(" " if v is None else SPARKS[max(0, min(7, int((v - lo) / span * 7.999)))] for v in cells)


def phase_strip(report: dict, t: list, width: int = 60) -> str:
    """One character per cell: the initial of the phase the run was in at that time (aligned with sparklines)."""
    phases = [p for p in report.get("phases") or [] if p.get("start_s") is not None]
    if not phases or not t:
        return ""
    cells = resample(list(t), width) if len(t) > width else list(t)
    out = []
    for tt in cells:
        current = " "
        for p in phases:
            if tt is not None and tt >= p["start_s"]:
                current = phase_mark(p["phase"])
        out.append(current)
    return "".join(out)


def phase_mark(phase: str) -> str:
    return PHASE_MARK.get(phase, phase[:1] or "?")


MAX_ALERTS_SHOWN = 20

def result_text(o: dict, text: Callable[[Any], str] = str) -> str:
    """The outcome in one line (`failed, exit 1, stopped by you — Slurm job 12 TIMEOUT on node3`); `text` makes the
    job's own words safe for the format."""
    result = text(o.get("state") or "?")
    if o.get("signal"):
        result += f", {text(o['signal'])}"
    elif o.get("exit_code") is not None:
        result += f", exit {text(o['exit_code'])}"
    if o.get("stopped_by"):
        result += f", stopped by {text(o['stopped_by'])}"
    slurm = o.get("slurm") if isinstance(o.get("slurm"), dict) else None
    if slurm and slurm.get("job_id"):
        result += text(f" — Slurm job {slurm['job_id']} {slurm.get('state') or 'not ended'}"
                       + (f" on {slurm['nodes']}" if slurm.get("nodes") else ""))
    return result


def history_items(hist: dict, text: Callable[[Any], str] = str) -> list[str]:
    """The run against earlier runs of its job, a sentence each; `text` makes a failure cause safe for the format."""
    from gpudeck.jobs.history.postmortem import clock
    items = []
    if hist.get("median_load_s") is not None and hist.get("load_s") is not None:
        diff = hist["load_s"] - hist["median_load_s"]
        pct = f" ({100 * diff / hist['median_load_s']:+.0f}%)" if hist["median_load_s"] else ""
        items.append(f"load time {clock(hist['load_s'])} vs median {clock(hist['median_load_s'])} of "
                     f"{hist['load_runs']} earlier runs{pct}")
    elif hist.get("median_load_s") is not None:
        items.append(f"this run never became ready; earlier runs loaded in {clock(hist['median_load_s'])} (median)")
    if hist.get("same_failure"):
        k, n = hist["same_failure"]
        items.append(f"same failure seen in {k} of the last {n} runs")
    if hist.get("failed_of_last"):
        k, n = hist["failed_of_last"]
        items.append(f"{k} of the last {n} runs failed: " + ", ".join(
            f"{text(r['run_id'])} {'✗ ' + text(r['cause'] or 'failed') if r['failed'] else '✓'}" for r in hist.get("last") or []))
    return items


def recovered_note(phase: dict) -> str:
    n = phase.get("recovered_errors")
    if not n:
        return ""
    lines = [str(x) for x in phase.get("error_lines") or [] if x]
    where = f" (lines {', '.join(lines[:3])}{', …' if len(lines) > 3 else ''})" if lines else ""
    return f"{n} error{'s' if n > 1 else ''} logged and recovered from{where}"


def stall_stacks_note(stall: dict) -> str:
    """The stack dump a stall took, in words ("stacks at 0:57: <verdict>"); "" when it took none. Plain text:
    each renderer escapes it as it escapes the rest (the verdict is made of the job's frame names)."""
    verdict = stall.get("stacks")
    if not verdict or not isinstance(verdict, str):
        return ""
    at_s = number(stall.get("stacks_at_s"))       # the console reads a box's report unshaped
    return f"stacks{'' if at_s is None else ' at ' + _clock(at_s)}: {verdict}"


_LOG_LINE_REF = re.compile(r"\s*\[log line [\d,]+\]")


def alert_items(alerts: list[dict], live_run: bool) -> list[tuple[str, str, str]]:
    """(when, code, the rest) per line to list: an alert that came and went many times with the same
    message is one line with its count, so a flapping alert cannot bury the report."""
    groups: dict[tuple, list[dict]] = {}
    for a in alerts:
        key = (a.get("code"), _LOG_LINE_REF.sub("", str(a.get("message") or "")), a.get("cleared") is not None)
        groups.setdefault(key, []).append(a)
    items: list[tuple[float, tuple[str, str, str]]] = []
    for (code, message, cleared), members in groups.items():
        first = members[0]
        at = _clock(first.get("at_s"))
        if len(members) == 1:
            rest = f": {first.get('message')}"
            if cleared and first.get("raised") is not None:
                rest += f" — cleared after {_span(first['cleared'] - first['raised'])}"
            elif live_run and code != "crashed":
                rest += " — never cleared"
        else:
            at = f"{at}–{_clock(members[-1].get('at_s'))}"
            rest = f" ×{len(members)}: {message}"
            if cleared:
                took = [m["cleared"] - m["raised"] for m in members if m.get("raised") is not None]
                if took:
                    rest += f" — each cleared, after {_span(min(took))} to {_span(max(took))}"
        at_s = first.get("at_s")
        items.append((at_s if at_s is not None else float("inf"), (at, str(code), rest)))
    items.sort(key=lambda item: item[0])
    lines = [item for _, item in items]
    return lines[:MAX_ALERTS_SHOWN] + ([("", "", f"… {len(items) - MAX_ALERTS_SHOWN} more kinds of alert "
                                         "(every one in the JSON report)")] if len(lines) > MAX_ALERTS_SHOWN else [])


def _clock(seconds: Optional[float]) -> str:
    from gpudeck.jobs.history.postmortem import clock
    return clock(seconds) if seconds is not None else "?"


def _span(seconds: Optional[float]) -> str:
    from gpudeck.jobs.history.postmortem import span
    return span(seconds)
