"""The Box over the wire: which request names which Box method, its parameters checked, its result serialised once.

The agent serves a LocalBox with `answer(box, op, params)`; RemoteBox sends the same op
names. A parameter of the wrong type is refused with one line (code 2) before the core
sees it: the laptop is trusted to act, not to send well-formed JSON. Stdlib only.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from gpudeck.jobs.box import Box, BoxError

Convert = Callable[[Any, str], Any]


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise BoxError(f"bad request: {name} must be a non-empty string", code=2)
    return value


def _opt(convert: Convert) -> Convert:
    return lambda value, name: None if value is None else convert(value, name)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2 ** 53:
        raise BoxError(f"bad request: {name} must be an integer", code=2)
    return value


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BoxError(f"bad request: {name} must be a finite number", code=2)
    return float(value)


def _bool(value: Any, name: str) -> bool:
    return bool(value)


def _columns(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BoxError(f"bad request: {name} must be a list of column names", code=2)
    return tuple(value)


STR_OPT, INT_OPT, NUM_OPT = _opt(_str), _opt(_int), _opt(_num)

# op -> (Box method, {wire parameter: (method keyword, converter)}). Positional parameters come first, in order.
OPS: dict[str, tuple[str, dict[str, tuple[str, Convert]], tuple[str, ...]]] = {
    "jobs": ("jobs", {}, ()),
    "check": ("check", {}, ()),
    "doctor": ("doctor", {"job": ("job", STR_OPT)}, ()),
    "analyze": ("analyze", {"path": ("path", _str), "max_bytes": ("max_bytes", INT_OPT),
                            "workers": ("workers", INT_OPT)}, ("path",)),
    "logs": ("read_log", {"job": ("job", _str), "run": ("run", STR_OPT), "offset": ("offset", INT_OPT),
                          "tail": ("tail", INT_OPT), "max_bytes": ("max_bytes", INT_OPT),
                          "wait_s": ("wait_s", NUM_OPT)}, ("job",)),
    "start": ("start", {"job": ("job", _str)}, ("job",)),
    "stop": ("stop", {"job": ("job", _str), "timeout": ("timeout", NUM_OPT)}, ("job",)),
    "restart": ("restart", {"job": ("job", _str), "timeout": ("timeout", NUM_OPT)}, ("job",)),
    "run": ("run", {"job": ("job", _str)}, ("job",)),
    "pipeline": ("pipeline", {"job": ("job", _str), "pipeline_id": ("pipeline_id", _str),
                              "seen": ("seen", INT_OPT)}, ("job", "pipeline_id")),
    "pivot_plan": ("pivot_plan", {"target": ("target", _str), "stop_foreign": ("stop_foreign", _bool)}, ("target",)),
    "stacks": ("stacks", {"job": ("job", _str), "native": ("native", _bool)}, ("job",)),
    "runs": ("runs", {"job": ("job", STR_OPT), "failed": ("failed", _bool), "since": ("since", NUM_OPT),
                      "limit": ("limit", INT_OPT), "columns": ("columns", _opt(_columns))}, ()),
    "runs_reindex": ("reindex", {}, ()),
    "runs_prune": ("prune", {"keep": ("keep", INT_OPT), "older_s": ("older_s", NUM_OPT), "job": ("job", STR_OPT),
                             "yes": ("yes", _bool)}, ()),
    "postmortem": ("postmortem", {"target": ("target", STR_OPT)}, ()),
    "run_file": ("record_file", {"job": ("job", _str), "run_id": ("run_id", _str), "name": ("name", _str),
                                 "offset": ("offset", INT_OPT)}, ("job", "run_id", "name")),
}


def answer(box: Box, op: str, params: Optional[dict]) -> Any:
    """The JSON reply to request `op`: the Box method it names, called with its checked parameters
    (a parameter left out or null takes the method's default)."""
    method_name, spec, positional = OPS[op]
    params = params if isinstance(params, dict) else {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for wire, (keyword, convert) in spec.items():
        value = params.get(wire)
        if value is None:
            if wire in positional:
                raise BoxError(f"bad request: {op} needs {wire}", code=2)
            continue
        if wire in positional:
            args.append(convert(value, wire))
        else:
            kwargs[keyword] = convert(value, wire)
    result = getattr(box, method_name)(*args, **kwargs)
    return result if isinstance(result, dict) else result.to_json()
