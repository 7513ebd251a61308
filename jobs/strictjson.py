"""Strict JSON out of gpudeck: a non-finite number (inf, nan, an int too big for a float) becomes null, never `Infinity`."""
from __future__ import annotations

import json
import math
from typing import Any


def finite_number(value: Any) -> Any:
    """A number as JSON can carry it everywhere, or None. Non-numbers pass through unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        # An int past float range is exact in JSON but overflows every reader that does arithmetic.
        return value if abs(value) <= 2 ** 63 else None
    return value if math.isfinite(value) else None


def finite(obj: Any) -> Any:
    """`obj` with every non-finite number, at any depth of dicts/lists/tuples, replaced by None."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return finite_number(obj)


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps that always emits strict JSON (RFC 8259): cleaned, then allow_nan=False as the proof."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def _no_constant(name: str) -> None:
    return None


def loads(text: str | bytes) -> Any:
    """json.loads that reads `Infinity`/`NaN` (written by an older gpudeck) as null."""
    return json.loads(text, parse_constant=_no_constant)
