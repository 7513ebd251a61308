"""What the Markdown and HTML renderers may rely on: a report (built here, or a remote host's JSON) reshaped to the types each field is formatted as.

A remote host's report arrives as JSON from a box the operator may not control: a
field that is a line number here can be a string of markup there. The renderers
escape every string they print; this module makes sure that a number is a
number, a list a list and a row a dict before they do, so a hostile or broken
report costs its odd fields, never the escaping or the whole report.
"""
from __future__ import annotations

from typing import Any, Optional

from gpudeck.jobs.strictjson import integer, number

NUM, INT, STR, BOOL, ANY = "num", "int", "str", "bool", "any"
PAIR = "pair"                      # [k, n]: "same failure in k of the last n runs"


_num = number                      # the one strict number rule (strictjson)


def _int(v: Any) -> Optional[int]:
    """An int, or a float that is one (a remote's JSON may write 12.0 for a line number)."""
    whole = integer(v)
    if whole is not None:
        return whole
    value = number(v)
    return int(value) if value is not None and value.is_integer() else None


def _str(v: Any) -> Optional[str]:
    if v is None or isinstance(v, (dict, list)):
        return None
    return v if isinstance(v, str) else str(v)


_ROW_PHASE = {"phase": STR, "start_s": NUM, "at": NUM, "duration_s": NUM, "line": INT, "recovered_errors": INT,
              "error_lines": [INT]}
_TIMELINE = {"t": [NUM], "width_s": NUM, "series": {STR: [NUM]},
             "peaks": {"gpu_mem": {STR: NUM}, "rss": NUM, "cpu_pct": NUM, "read_bps": NUM}}
SHAPE: dict = {
    "version": INT, "verdict": STR, "build_s": NUM,
    "source": {"kind": STR, "job": STR, "run_id": STR, "path": STR, "log": STR, "host": STR, "backend": STR,
               "command": STR, "gpus": [STR], "job_kind": STR, "engine": STR, "bytes": INT},
    "outcome": {"state": STR, "exit_code": INT, "signal": STR, "stopped_by": STR, "failed": BOOL,
                "started_at": NUM, "ended_at": NUM, "duration_s": NUM, "final_phase": STR, "load_s": NUM,
                "note": STR, "slurm": {"job_id": STR, "state": STR, "reason": STR, "nodes": STR}},
    "failure": {"cause": STR, "line": INT, "message": STR, "hint": STR},
    "phases": [_ROW_PHASE],
    "alerts": [{"code": STR, "raised": NUM, "since": NUM, "cleared": NUM, "message": STR, "severity": STR,
                "cause": STR, "hint": STR, "at_s": NUM}],
    # `stacks`: the verdict of the dump the stall took (and `stacks_at_s`, when), "" when it took none.
    "stalls": [{"code": STR, "start_s": NUM, "duration_s": NUM, "cleared": BOOL, "message": STR, "stacks": STR,
                "stacks_at_s": NUM}],
    # Stack dumps the run took (jobs/stacks.py), each at its moment, with its verdict or why none.
    "stacks": [{"t": NUM, "at_s": NUM, "code": STR, "since": NUM, "verdict": STR, "path": STR, "error": STR,
                "lines": [STR], "lines_left_out": INT, "simulated": BOOL}],
    # Webhook deliveries and failures (jobs/notify.py), one row an attempt.
    "notifications": [{"outcome": STR, "t": NUM, "at_s": NUM, "target": STR, "format": STR, "code": STR,
                       "attempt": INT, "attempts": INT, "status": INT, "error": STR, "final": BOOL,
                       "retry_in_s": NUM, "took_s": NUM, "url": STR}],
    "silences": [{"start_s": NUM, "duration_s": NUM}],
    "context": {"pipeline": {"id": STR, "target": STR, "state": STR, "stages": [STR]}, "pivot": STR,
                "pivot_steps": [STR], "stopped_by": STR},
    "resources": _TIMELINE,
    "serving": _TIMELINE,
    "lines": [{"label": STR, "line": INT, "context": [{"line": INT, "text": STR, "key": BOOL}]}],
    "last_lines": [{"line": INT, "text": STR}],
    "history": {"earlier_runs": INT, "last": [{"run_id": STR, "failed": BOOL, "cause": STR, "load_s": NUM}],
                "failed_of_last": PAIR, "same_failure": PAIR, "median_load_s": NUM, "load_runs": INT, "load_s": NUM},
    "missing": [STR],
}
# Rows the renderers index (p["phase"], c["text"]): every key is there, a missing one as its empty value.
_EMPTY = {STR: "", BOOL: False}


def shape(report: Any) -> dict:
    """`report` with every field the renderers read in the type they format it as; anything else dropped."""
    out = _shape(report if isinstance(report, dict) else {}, SHAPE, row=False)
    return out if isinstance(out, dict) else {}


def _shape(value: Any, spec: Any, row: bool) -> Any:
    if spec == NUM:
        return _num(value)
    if spec == INT:
        return _int(value)
    if spec == STR:
        return _str(value)
    if spec == BOOL:
        return bool(value) if isinstance(value, (bool, int, float, str)) else False
    if spec == PAIR:
        pair = [_int(v) for v in value] if isinstance(value, list) and len(value) == 2 else None
        return pair if pair and None not in pair else None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return None
        item = spec[0]
        shaped = [_shape(v, item, row=True) for v in value]
        # A list of rows keeps only rows; a list of numbers keeps its Nones (a gap in a chart).
        return [v for v in shaped if v is not None] if isinstance(item, dict) or item == STR else shaped
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return None
        if STR in spec and len(spec) == 1:          # {name: series}: keys are job text too
            named = {str(k): _shape(v, spec[STR], row=False) for k, v in value.items()}
            return {k: v for k, v in named.items() if v is not None}
        out = {}
        for key, sub in spec.items():
            if key in value:
                out[key] = _shape(value[key], sub, row=False)
            elif row and not isinstance(sub, dict):
                out[key] = None
            if row and out.get(key) is None and (isinstance(sub, list) or sub in (STR, BOOL)):
                out[key] = [] if isinstance(sub, list) else _EMPTY[sub]
        return out
    return value
