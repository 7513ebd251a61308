"""The shapes of the agent's replies, checked on the console side before anything reads them.

The box at the other end of the link is not trusted: a compromised or spoofed agent
can send any JSON. Every reply is checked here, at the boundary (`HostLink.call`,
and the fleet once a delta is applied), against a declarative shape per request:
types, finite numbers within bounds, bounded strings and lists. A reply that does
not fit is refused with one line naming the first thing wrong —
`box: bad reply to poll: status.gpus[3] is a str, not an object` — so no face ever
meets a str where it expects a dict, a NaN, or a time in the year 10^292.

Unknown keys are allowed (a newer agent may add some) but still checked as plain
JSON: finite numbers, bounded strings, bounded depth. Stdlib only.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional

from gpudeck.jobs.hosts.errors import HostError


class BadReply(HostError):
    """The agent answered with something that is not the reply its request has: one line for the operator."""


class _Mismatch(Exception):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path or 'the reply'} {what}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a str"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _wrong(path: str, value: Any, expected: str) -> _Mismatch:
    return _Mismatch(path, f"is {_kind(value)}, not {expected}")


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- shapes ---------------------------------------------------------------------------------
# A shape is a callable (value, path) that raises _Mismatch. Closures, not classes: a status
# payload of an 8-GPU box is checked every second, and a runs listing may hold 10,000 rows.
Shape = Callable[[Any, str], None]

# Plain JSON anywhere (unknown keys, free-form documents): bounded so a hostile reply cannot
# make a face walk a million-deep list or print a gigabyte string.
MAX_DEPTH = 24
MAX_STR = 64 * 1024
MAX_ITEMS = 100_000


def _any_json(value: Any, path: str, depth: int = 0) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise _Mismatch(path, f"is a str of {len(value)} chars (at most {MAX_STR})")
        return
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise _Mismatch(path, f"is {value!r}, not a finite number")
        return
    if depth >= MAX_DEPTH:
        raise _Mismatch(path, f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            raise _Mismatch(path, f"has {len(value)} items (at most {MAX_ITEMS})")
        for i, item in enumerate(value):
            _any_json(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise _Mismatch(path, f"has {len(value)} keys (at most {MAX_ITEMS})")
        for key, item in value.items():
            if not isinstance(key, str) or len(key) > 256:
                raise _Mismatch(path, "has a key that is not a short string")
            _any_json(item, _at(path, key), depth + 1)
        return
    raise _wrong(path, value, "JSON")


def Any_(value: Any, path: str) -> None:          # noqa: N802 - a shape, named like the others
    _any_json(value, path)


def Str(max_len: int = 4096) -> Shape:             # noqa: N802
    def check(value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise _wrong(path, value, "a string")
        if len(value) > max_len:
            raise _Mismatch(path, f"is a str of {len(value)} chars (at most {max_len})")
    return check


def Num(lo: float = -1e15, hi: float = 1e15, integer: bool = False) -> Shape:   # noqa: N802
    expected = "an integer" if integer else "a number"

    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _wrong(path, value, expected)
        if integer and not isinstance(value, int):
            raise _wrong(path, value, expected)
        if isinstance(value, float) and not math.isfinite(value):
            raise _Mismatch(path, f"is {value!r}, not a finite number")
        if not lo <= value <= hi:
            raise _Mismatch(path, f"is {value:g}, outside {lo:g}..{hi:g}")
    return check


def Int(lo: float = -(2 ** 53), hi: float = 2 ** 53) -> Shape:     # noqa: N802
    return Num(lo, hi, integer=True)


def Bool(value: Any, path: str) -> None:           # noqa: N802
    if not isinstance(value, bool):
        raise _wrong(path, value, "a bool")


def Opt(shape: Shape) -> Shape:                    # noqa: N802
    """`shape` or null."""
    def check(value: Any, path: str) -> None:
        if value is not None:
            shape(value, path)
    return check


def OneOf(*shapes: Shape, expected: str) -> Shape:  # noqa: N802
    def check(value: Any, path: str) -> None:
        for shape in shapes:
            try:
                shape(value, path)
                return
            except _Mismatch:
                continue
        raise _wrong(path, value, expected)
    return check


def List(item: Shape, max_len: int = 10_000) -> Shape:     # noqa: N802
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise _wrong(path, value, "a list")
        if len(value) > max_len:
            raise _Mismatch(path, f"has {len(value)} items (at most {max_len})")
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]")
    return check


def Map(value_shape: Shape, max_len: int = 10_000) -> Shape:   # noqa: N802
    """An object with any (short string) keys, every value of one shape."""
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(path, value, "an object")
        if len(value) > max_len:
            raise _Mismatch(path, f"has {len(value)} keys (at most {max_len})")
        for key, v in value.items():
            if len(key) > 256:
                raise _Mismatch(path, "has a key longer than 256 chars")
            value_shape(v, _at(path, key))
    return check


def Obj(fields: Optional[dict[str, Shape]] = None, required: tuple[str, ...] = ()) -> Shape:   # noqa: N802
    """An object: the named keys have their shapes (absent is fine unless `required`), any other key is plain JSON."""
    fields = fields or {}

    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(path, value, "an object")
        for key in required:
            if key not in value:
                raise _Mismatch(_at(path, key), "is missing")
        if len(value) > MAX_ITEMS:
            raise _Mismatch(path, f"has {len(value)} keys (at most {MAX_ITEMS})")
        for key, v in value.items():
            shape = fields.get(key)
            if shape is not None:
                shape(v, _at(path, key))
            else:
                if len(key) > 256:
                    raise _Mismatch(path, "has a key longer than 256 chars")
                _any_json(v, _at(path, key), 1)
    return check


_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def Base64(max_len: int) -> Shape:                 # noqa: N802
    def check(value: Any, path: str) -> None:
        Str(max_len)(value, path)
        if len(value) % 4 or not _B64.fullmatch(value):
            raise _Mismatch(path, "is not base64")
    return check


# -- the figures -------------------------------------------------------------------------------
# Bounds are what a real box can report, with room: they exist to stop an OverflowError
# (a time of 1e300 in strftime) or a nonsense bar, not to judge a plausible reading.
TIME = Num(0, 1e11)                        # epoch seconds, until the year 5138 (strftime copes)
SECONDS = Num(0, 1e10)                     # durations and ages
REL_SECONDS = Num(-1e10, 1e10)             # offsets from a run's start
PCT = Num(0, 100.5)                        # a percent (rounding on the box may pass 100)
CPU_PCT = Num(0, 1e5)                      # a process's CPU percent: 100 per core it uses
BYTES = Num(0, 2.0 ** 63)
RATE = Num(0, 1e15)                        # bytes/s
PID = Int(0, 2 ** 31)
PORT = Int(0, 65535)
COUNT = Int(0, 10 ** 7)
NAME = Str(256)
TEXT = Str(4096)
LONG_TEXT = Str(MAX_STR)

_opt = Opt

GPU_PROCESS = Obj({"pid": PID, "mem_used": _opt(BYTES), "sm_util": _opt(PCT), "name": _opt(NAME),
                   "cmdline": _opt(Str(16384)), "user": _opt(NAME), "cpu_percent": _opt(CPU_PCT), "rss": _opt(BYTES),
                   "age_s": _opt(SECONDS), "known": _opt(Bool)}, required=("pid",))
GPU = Obj({"index": Int(0, 4096), "name": _opt(NAME), "uuid": _opt(NAME), "util": _opt(PCT), "mem_util": _opt(PCT),
           "mem_used": _opt(BYTES), "mem_total": _opt(BYTES), "temp": _opt(Num(-100, 300)),
           "power_w": _opt(Num(0, 1e5)), "power_limit_w": _opt(Num(0, 1e5)), "sm_clock_mhz": _opt(Int(0, 10 ** 6)),
           "mem_clock_mhz": _opt(Int(0, 10 ** 6)), "fan_pct": _opt(PCT), "throttle_reasons": List(NAME, 64),
           "compute_capability": _opt(Str(16)), "pcie_rx_bps": _opt(RATE), "pcie_tx_bps": _opt(RATE),
           "processes": List(GPU_PROCESS, 4096), "simulated": _opt(Bool)}, required=("index",))
HOST = Obj({"name": NAME, "cpu_percent": _opt(PCT), "cpu_per_core": List(PCT, 8192), "cpu_count": COUNT,
            "load_avg": List(Num(0, 1e7), 3), "mem_total": BYTES, "mem_used": Num(-(2.0 ** 63), 2.0 ** 63),
            "mem_available": BYTES, "swap_total": BYTES, "swap_used": Num(-(2.0 ** 63), 2.0 ** 63),
            "disk_read_bps": _opt(RATE), "disk_write_bps": _opt(RATE), "net_rx_bps": _opt(RATE),
            "net_tx_bps": _opt(RATE)}, required=("name",))
PORT_LISTENER = Obj({"port": PORT, "address": _opt(NAME), "pid": _opt(PID), "process": _opt(NAME),
                     "cmdline": _opt(Str(16384)), "user": _opt(NAME)}, required=("port",))
STATUS = Obj({"time": _opt(TIME), "simulated": _opt(Bool), "host": _opt(HOST), "gpus": List(GPU, 1024),
              "gpu_error": _opt(TEXT), "ports": List(PORT_LISTENER, 65536), "source": _opt(Map(_opt(NAME), 16)),
              "host_error": _opt(TEXT), "ports_error": _opt(TEXT), "engines_error": _opt(TEXT)})

ALERT = Obj({"code": _opt(NAME), "message": _opt(TEXT), "severity": _opt(Str(32)), "since": _opt(TIME),
             "job": _opt(NAME), "run_id": _opt(NAME)})
JOB = Obj({"name": NAME, "kind": _opt(Str(64)), "state": Str(64), "pid": _opt(PID), "run_id": _opt(NAME),
           "exit_code": _opt(Int(-(2 ** 31), 2 ** 31)), "signal": _opt(Str(64)), "started_at": _opt(TIME),
           "ended_at": _opt(TIME), "port": _opt(PORT), "port_open": _opt(Bool), "gpus": List(Int(0, 4096), 4096),
           "runner_alive": _opt(Bool), "pgid": _opt(PID), "backend": _opt(Str(64)), "slurm": _opt(Obj()),
           "phase": _opt(Str(64)), "progress": _opt(Obj()), "progress_at": _opt(TIME), "alerts": List(ALERT, 1024),
           "failure": _opt(Obj()), "serving": _opt(Obj()), "engine_status": _opt(Obj()), "engine_error": _opt(TEXT),
           "health_error": _opt(TEXT)}, required=("name", "state"))
JOBS = Obj({"jobs": List(JOB, 10_000), "pipelines": List(Obj(), 10_000)}, required=("jobs",))

# A delta-sent reply ({"full": payload} or {"delta": changes}) is plain JSON here: what it
# adds up to is checked once it is applied (`check_payload`).
_FULL = Obj({"full": Obj()})
_DELTA = Obj({"delta": Opt(Obj())})


def DELTA_REPLY(value: Any, path: str) -> None:    # noqa: N802
    if not isinstance(value, dict):
        raise _wrong(path, value, "an object")
    if "full" in value:
        _FULL(value, path)
    elif "delta" in value:
        _DELTA(value, path)
    else:
        raise _Mismatch(path, 'has neither "full" nor "delta"')


RUN_ROW = Obj({"run_id": NAME, "job": NAME, "kind": Str(32), "started_at": _opt(TIME), "ended_at": _opt(TIME),
               "duration_s": _opt(SECONDS), "state": _opt(Str(64)), "exit_code": _opt(Int(-(2 ** 31), 2 ** 31)),
               "signal": _opt(Str(64)), "final_phase": _opt(Str(64)), "load_s": _opt(SECONDS),
               "peak_gpu_mem_max": _opt(BYTES), "gpu_count": _opt(COUNT), "failure_cause": _opt(TEXT),
               "failure_line": _opt(Int(0, 2 ** 53)), "stopped_by": _opt(TEXT), "pivot": _opt(TEXT),
               "alerts": _opt(List(NAME, 1024)), "host": _opt(NAME), "backend": _opt(Str(64)),
               "failed": _opt(OneOf(Bool, Int(0, 1), expected="a bool")), "gpus": _opt(List(Int(0, 4096), 4096))},
              required=("run_id", "kind"))

_LINE_NO = Int(0, 2 ** 53)
REPORT = Obj({
    "verdict": _opt(TEXT),
    "source": _opt(Obj({"kind": _opt(Str(32)), "job": _opt(NAME), "run_id": _opt(NAME), "log": _opt(TEXT),
                        "job_kind": _opt(Str(64)), "host": _opt(NAME), "backend": _opt(Str(64)),
                        "command": _opt(Str(16384)), "gpus": _opt(List(Int(0, 4096), 4096)),
                        "engine": _opt(NAME)})),
    "outcome": _opt(Obj({"started_at": _opt(TIME), "ended_at": _opt(TIME), "duration_s": _opt(SECONDS),
                         "exit_code": _opt(Int(-(2 ** 31), 2 ** 31)), "signal": _opt(Str(64)),
                         "state": _opt(Str(64))})),
    "phases": _opt(List(Obj({"phase": Str(64), "start_s": _opt(REL_SECONDS), "duration_s": _opt(SECONDS),
                             "line": _opt(_LINE_NO)}, required=("phase",)))),
    "stalls": _opt(List(Obj({"code": NAME, "start_s": _opt(REL_SECONDS), "duration_s": _opt(SECONDS),
                             "cleared": _opt(Bool), "stacks": _opt(TEXT), "stacks_at_s": _opt(REL_SECONDS)},
                            required=("code",)))),
    # postmortem.stack_dumps: each dump on the timeline, with the head of its grouped text.
    "stacks": _opt(List(Obj({"t": _opt(TIME), "at_s": _opt(REL_SECONDS), "code": _opt(NAME), "since": _opt(TIME),
                             "verdict": _opt(TEXT), "path": _opt(TEXT), "error": _opt(TEXT),
                             "lines": _opt(List(LONG_TEXT, 1000)), "lines_left_out": _opt(COUNT),
                             "simulated": _opt(Bool)}), 10_000)),
    "alerts": _opt(List(Obj())),
    "silences": _opt(List(Obj({"start_s": _opt(REL_SECONDS), "duration_s": SECONDS}, required=("duration_s",)))),
    "context": _opt(Obj()),
    "resources": _opt(Obj()),
    "serving": _opt(Obj()),
    "lines": _opt(List(Obj({"label": TEXT, "line": _LINE_NO,
                            "context": List(Obj({"key": Bool, "line": _LINE_NO, "text": LONG_TEXT},
                                                required=("key", "line", "text")))},
                           required=("label", "line", "context")))),
    "last_lines": _opt(List(Obj({"line": _opt(_LINE_NO), "text": LONG_TEXT}, required=("text",)))),
    "history": _opt(Obj()),
    "missing": _opt(List(TEXT)),
})

HELLO = Obj({"hello": NAME, "protocol": Int(0, 10 ** 6), "version": _opt(NAME), "via": _opt(NAME),
             "python": _opt(NAME), "pid": _opt(PID), "hostname": _opt(NAME), "state_dir": _opt(TEXT),
             "jobs_file": _opt(TEXT), "readonly": _opt(Bool)})

# Logs come in chunks of at most 256 KiB (agent.MAX_LOG_CHUNK): base64 is 4/3 of that.
LOGS = Obj({"run_id": NAME, "offset": Int(0, 2 ** 62), "next_offset": Int(0, 2 ** 62),
            "data": Base64(4 * 1024 * 1024), "ended": _opt(Bool)}, required=("run_id", "next_offset"))


def _status_reply(value: Any, path: str) -> None:
    """`status`: a delta reply; its full payload (packed for the wire) must unpack to a STATUS."""
    DELTA_REPLY(value, path)
    if "full" in value:
        check_packed_status(value["full"], _at(path, "full"))


def _jobs_reply(value: Any, path: str) -> None:
    if isinstance(value, dict) and ("full" in value or "delta" in value):
        DELTA_REPLY(value, path)
        if "full" in value:
            JOBS(value["full"], _at(path, "full"))
    else:
        JOBS(value, path)


REPLIES: dict[str, Shape] = {
    "hello": HELLO,
    "ping": Obj({"time": _opt(TIME)}),
    "poll": Obj({"status": DELTA_REPLY, "jobs": DELTA_REPLY, "jobs_error": _opt(TEXT)}, required=("status",)),
    "status": _status_reply,
    "jobs": _jobs_reply,
    "logs": LOGS,
    "run_file": Obj({"size": _opt(Int(0, 2 ** 62)), "data": Base64(4 * 1024 * 1024)}, required=("data",)),
    "runs": Obj({"runs": List(RUN_ROW, 1_000_000)}, required=("runs",)),
    "postmortem": Obj({"report": REPORT}, required=("report",)),
    "start": Obj({"run_id": NAME}, required=("run_id",)),
    "stop": Obj({"lines": List(TEXT, 1000), "clean": _opt(Bool), "report": _opt(Obj())}),
    "restart": Obj({"run_id": _opt(NAME), "lines": _opt(List(TEXT, 1000)), "clean": _opt(Bool)}),
}


def check_packed_status(packed: Any, path: str = "status") -> None:
    """A status payload as the wire carries it (columns, levels): it must unpack, and unpacked be a STATUS."""
    from gpudeck.jobs.hosts.protocol import unpack_status
    Obj({"host": Opt(Obj()), "gpus": Opt(_COLUMNS), "ports": Opt(_COLUMNS), "time": Opt(TIME)})(packed, path)
    try:
        unpacked = unpack_status(packed)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise _Mismatch(path, f"does not unpack ({type(exc).__name__}: {exc})") from None
    STATUS(unpacked, path)


def _columns(value: Any, path: str) -> None:
    """{"n": rows, "c": {column: [one value per row]}}: every column as long as n (unpacking indexes them)."""
    Obj({"n": Int(0, 100_000), "c": Map(List(Any_, 100_000), 256)})(value, path)
    n = value.get("n") or 0
    for key, column in (value.get("c") or {}).items():
        if len(column) < n:
            raise _Mismatch(_at(_at(path, "c"), key), f"has {len(column)} values for {n} rows")


_COLUMNS = _columns


def _raise(host: Optional[str], op: str, exc: _Mismatch) -> None:
    prefix = f"{host}: " if host else ""
    raise BadReply(f"{prefix}bad reply to {op}: {exc}") from None


def check_reply(op: str, result: Any, host: Optional[str] = None) -> Any:
    """`result` if it has the shape of a reply to `op` (plain bounded JSON for ops without one), else BadReply."""
    shape = REPLIES.get(op, Any_)
    try:
        shape(result, "")
    except _Mismatch as exc:
        _raise(host, op, exc)
    return result


def check_payload(kind: str, payload: Any, *, op: str, host: Optional[str] = None) -> Any:
    """A delta-sent payload once applied: `kind` "status" (unpacked) or "jobs"."""
    try:
        (STATUS if kind == "status" else JOBS)(payload, kind)
    except _Mismatch as exc:
        _raise(host, op, exc)
    return payload


def bad_reply(op: str, what: str, host: Optional[str] = None) -> BadReply:
    """A BadReply for something found wrong outside a shape (a delta that does not apply)."""
    return BadReply(f"{host + ': ' if host else ''}bad reply to {op}: {what}")
