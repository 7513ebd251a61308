"""The agent wire format: JSON lines, request/response ids, and the telemetry deltas (stdlib only)."""
from __future__ import annotations

import json
from typing import Any

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
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("agent message is not an object")
    return data


# -- deltas ---------------------------------------------------------------------
# A delta turns one JSON value into the next. Node forms:
#   {"=": value}                     replace with value
#   {"d": {key: delta}, "x": [keys]} a dict: changed keys, removed keys
#   {"l": {"i": delta}, "n": len}    a list of the same shape: changed items, new length
# An unchanged value has no node at all (the parent leaves the key out).
_SAME = object()


def diff(old: Any, new: Any) -> Any:
    """The delta from `old` to `new`, or None when they are equal."""
    node = _diff(old, new)
    return None if node is _SAME else node


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
        return {"l": changes, "n": len(new)} if changes else _SAME
    if type(old) is type(new) and old == new:
        return _SAME
    return {"=": new}


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
            out[key] = patch(out.get(key), sub) if "=" not in sub else sub["="]
        return out
    if "l" in delta:
        out = list(old)
        for i, sub in delta["l"].items():
            out[int(i)] = patch(out[int(i)], sub)
        return out
    raise ValueError(f"not a delta: {delta!r}")
