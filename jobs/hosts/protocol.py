"""The agent wire format: JSON lines, request/response ids, and the telemetry deltas (stdlib only)."""
from __future__ import annotations

import json
from typing import Any, Optional

from gpudeck.jobs.strictjson import MAX_DEPTH, nesting

# Bumped whenever a request or reply changes shape: a gpudeck installed on the
# remote box is used only when it speaks exactly this protocol.
PROTOCOL = 1

# First line the agent writes, so the client knows the channel carries an agent
# (and not, say, a login banner or a shell error).
HELLO = "gpudeck-agent"


def encode(message: dict) -> bytes:
    # Compact separators: at 1 Hz per host every byte counts (bandwidth target 2 KB/s).
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def decode(line: bytes | str) -> dict:
    """One message; ValueError for anything that is not a JSON object of bounded depth (a hostile box
    nesting a reply 100,000 deep would otherwise raise RecursionError in the link's reader and kill it)."""
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    if nesting(raw) > MAX_DEPTH:
        raise ValueError(f"agent message nests deeper than {MAX_DEPTH}")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("agent message nests too deep") from None
    if not isinstance(data, dict):
        raise ValueError("agent message is not an object")
    return data


# -- deltas ---------------------------------------------------------------------
# A delta turns one JSON value into the next. Node forms:
#   a number, string, bool or null   replace with it (inside a "d" or "l" node)
#   {"=": value}                     replace with value (a dict or list, or at the top)
#   {"d": {key: delta}, "x": [keys]} a dict: changed keys, removed keys
#   {"l": {"i": delta}, "n": len}    a list of the same shape: changed items, new length
# An unchanged value has no node at all (the parent leaves the key out).
_SAME = object()


def diff(old: Any, new: Any) -> Any:
    """The delta from `old` to `new`, or None when they are equal."""
    node = _diff(old, new)
    if node is _SAME:
        return None
    return node if isinstance(node, dict) else {"=": node}


def _diff(old: Any, new: Any) -> Any:
    if type(old) is type(new) and isinstance(new, dict):
        changes = {}
        for key, value in new.items():
            if key in old:
                sub = _diff(old[key], value)
                if sub is not _SAME:
                    changes[key] = sub
            else:
                changes[key] = {"=": value}
        removed = [key for key in old if key not in new]
        if not changes and not removed:
            return _SAME
        node: dict = {"d": changes}
        if removed:
            node["x"] = removed
        return node
    if type(old) is type(new) and isinstance(new, list) and len(old) == len(new):
        changes = {}
        for i, (a, b) in enumerate(zip(old, new)):
            sub = _diff(a, b)
            if sub is not _SAME:
                changes[str(i)] = sub
        if not changes:
            return _SAME
        node = {"l": changes, "n": len(new)}
        whole = {"=": new}
        # A column whose every item moved is cheaper sent whole than item by item.
        return whole if len(json.dumps(whole, separators=(",", ":"))) <= len(
            json.dumps(node, separators=(",", ":"))) else node
    if type(old) is type(new) and old == new:
        return _SAME
    return {"=": new} if isinstance(new, (dict, list)) else new


def patch(old: Any, delta: Any) -> Any:
    """Apply a delta made by `diff` (None: nothing changed). Never mutates `old`."""
    if delta is None:
        return old
    if "=" in delta:
        return delta["="]
    if "d" in delta:
        out = dict(old)
        for key in delta.get("x", ()):
            out.pop(key, None)
        for key, sub in delta["d"].items():
            out[key] = patch(out.get(key), sub) if isinstance(sub, dict) else sub
        return out
    if "l" in delta:
        items = list(old)
        for i, sub in delta["l"].items():
            items[int(i)] = patch(items[int(i)], sub) if isinstance(sub, dict) else sub
        return items
    raise ValueError(f"not a delta: {delta!r}")


# -- the status payload on the wire --------------------------------------------------------
# Sent at the precision the faces show (whole percent, degree and watt; two significant
# figures for byte rates; per-core CPU in 64 levels), lists of records as columns, and
# process ages as birth times (an age changes every second, a birth time never): an idle
# 8-GPU box then costs well under 2 KB/s. `unpack_status` restores the `status --json` shape.
_WHOLE = frozenset({"util", "mem_util", "sm_util", "fan_pct", "temp", "power_w", "power_limit_w"})
_RATES = frozenset({"pcie_rx_bps", "pcie_tx_bps", "disk_read_bps", "disk_write_bps", "net_rx_bps",
                    "net_tx_bps"})
_LEVELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"


def _two_figures(value: float) -> float:
    if not value:
        return value
    import math
    digits = 1 - int(math.floor(math.log10(abs(value))))
    rounded = round(value, digits)
    return int(rounded) if digits <= 0 else rounded


def _quantise(key: str, value: Any, now: Optional[float]) -> tuple[str, Any]:
    if key == "age_s" and now is not None:
        # Every record carries `born` instead (None stays None): columns keep one key set.
        return "born", None if value is None else round(now - value)
    if value is None or isinstance(value, bool):
        return key, value
    if key in _WHOLE and isinstance(value, (int, float)):
        return key, round(value)
    if key == "cpu_percent" and isinstance(value, (int, float)):
        return key, round(value, 1)
    if key in _RATES and isinstance(value, (int, float)):
        return key, _two_figures(value)
    if isinstance(value, float):
        return key, round(value, 2)
    return key, value


def _record(data: dict, now: Optional[float]) -> dict:
    out = {}
    for key, value in data.items():
        if key == "processes" and isinstance(value, list):
            out[key] = _columns([_record(p, now) for p in value])
            continue
        key, value = _quantise(key, value, now)
        out[key] = value
    return out


def _columns(rows: list[dict]) -> dict:
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    return {"n": len(rows), "c": {k: [row.get(k) for row in rows] for k in keys}}


def _rows(packed: dict) -> list[dict]:
    cols = packed.get("c") or {}
    return [{k: v[i] for k, v in cols.items()} for i in range(int(packed.get("n") or 0))]


def _unrecord(data: dict, now: Optional[float]) -> dict:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "processes" and isinstance(value, dict):
            out[key] = [_unrecord(p, now) for p in _rows(value)]
        elif key == "born" and now is not None:
            out["age_s"] = None if value is None else max(0.0, round(now - value, 1))
        else:
            out[key] = value
    return out


def pack_status(payload: dict) -> dict:
    now = payload.get("time")
    out = dict(payload)
    out["time"] = round(now, 1) if isinstance(now, float) else now
    host = dict(payload.get("host") or {})
    cores = host.get("cpu_per_core")
    if isinstance(cores, list):
        host["cpu_per_core"] = "".join(_LEVELS[max(0, min(63, round((c or 0) * 63 / 100)))] for c in cores)
    out["host"] = _record(host, now)
    out["gpus"] = _columns([_record(g, now) for g in payload.get("gpus") or []])
    out["ports"] = _columns([_record(p, now) for p in payload.get("ports") or []])
    return out


def unpack_status(packed: dict) -> dict:
    now = packed.get("time")
    out = dict(packed)
    host = _unrecord(dict(packed.get("host") or {}), now)
    if isinstance(host.get("cpu_per_core"), str):
        host["cpu_per_core"] = [round(_LEVELS.index(ch) * 100 / 63, 1) for ch in host["cpu_per_core"]]
    out["host"] = host
    out["gpus"] = [_unrecord(g, now) for g in _rows(packed.get("gpus") or {})]
    out["ports"] = [_unrecord(p, now) for p in _rows(packed.get("ports") or {})]
    return out
