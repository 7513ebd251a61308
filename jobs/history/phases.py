"""A run's phase timeline from the phase changes its runner recorded: rows with start and duration, errors the job recovered from folded into the phase they interrupted."""
from __future__ import annotations

from typing import Any, Optional

from gpudeck.jobs.strictjson import number


_num = number               # the one strict number rule (strictjson)


def phase_rows(phases: list[dict], started: Optional[float], end: Optional[float]) -> list[dict]:
    """Recorded phase changes -> [{phase, start_s, duration_s, line}] relative to the run's start.

    The first phase starts when the job started, whenever the analyzer first named it; a
    phase the log never named is shown as "running".
    """
    rows: list[dict] = []
    base = started if started is not None else next((_num(p.get("t")) for p in phases if _num(p.get("t"))), None)
    for i, change in enumerate(phases):
        t = _num(change.get("t"))
        if i == 0 and started is not None:
            t = started
        nxt = _num(phases[i + 1].get("t")) if i + 1 < len(phases) else end
        name = change.get("phase") if change.get("phase") not in (None, "unknown") else "running"
        duration = (nxt - t) if (t is not None and nxt is not None) else None
        if rows and rows[-1]["phase"] == name:
            if rows[-1]["duration_s"] is not None and duration is not None:
                rows[-1]["duration_s"] = round(rows[-1]["duration_s"] + max(0.0, duration), 3)
            continue
        rows.append({"phase": name, "start_s": round(t - base, 3) if t is not None and base is not None else None,
                     "at": t, "duration_s": round(max(0.0, duration), 3) if duration is not None else None,
                     "line": change.get("line") if isinstance(change.get("line"), int) else None})
    if rows and rows[-1]["phase"] == "failed":
        rows[-1]["duration_s"] = None       # "failed" is where the log ends, not a phase that took time
    for row in rows[:-1]:
        if row["phase"] == "failed":
            row["phase"] = "error (recovered)"   # the log showed an error and the job carried on
    return fold_recovered(rows)


def fold_recovered(rows: list[dict]) -> list[dict]:
    """ready, error (recovered), ready -> one ready row that counts the errors: a day of serving with
    the odd failed request is one phase, not a hundred."""
    out: list[dict] = []
    i = 0
    while i < len(rows):
        row = rows[i]
        if (row["phase"] == "error (recovered)" and out and i + 1 < len(rows)
                and rows[i + 1]["phase"] == out[-1]["phase"]):
            prev = out[-1]
            for part in (row, rows[i + 1]):
                if prev["duration_s"] is not None and part["duration_s"] is not None:
                    prev["duration_s"] = round(prev["duration_s"] + part["duration_s"], 3)
                else:
                    prev["duration_s"] = None
            prev["recovered_errors"] = prev.get("recovered_errors", 0) + 1
            prev.setdefault("error_lines", []).append(row.get("line"))
            i += 2
            continue
        out.append(row)
        i += 1
    return out


def phase_durations(phases: list[dict], started: Optional[float], end: Optional[float]) -> dict[str, float]:
    """{phase: seconds} for the run index; a phase entered twice adds up."""
    out: dict[str, float] = {}
    for row in phase_rows(phases, started, end):
        if row["duration_s"] is not None:
            out[row["phase"]] = round(out.get(row["phase"], 0.0) + row["duration_s"], 3)
    return out
