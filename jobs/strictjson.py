"""Strict JSON and strict numbers: what gpudeck writes is RFC 8259 JSON, and every number it reads is checked once.

Out: a non-finite number (inf, nan, an int too big for a float) becomes null, never `Infinity`.
In: `number`, `integer` and `parse_number` are the one set of rules for a number read from a run
file, a reply, a sample or a tool's text: finite, not a bool, an int within 64 bits, a text that is
the whole token (so `1e5` is 100000.0 and `29/1e5` is no number at all).
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional


def finite_number(value: Any) -> Any:
    """A number as JSON can carry it everywhere, or None. Non-numbers pass through unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        # An int past float range is exact in JSON but overflows every reader that does arithmetic.
        return value if abs(value) <= 2 ** 63 else None
    return value if math.isfinite(value) else None


_INT_LIMIT = 2 ** 63


def number(value: Any) -> Optional[float]:
    """`value` as a finite float when it is an int or float (never a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= _INT_LIMIT else None
    return value if math.isfinite(value) else None


def integer(value: Any) -> Optional[int]:
    """`value` when it is an int within 64 bits (never a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if abs(value) <= _INT_LIMIT else None


def parse_number(text: Optional[str]) -> Optional[float]:
    """A whole token of text as a finite number ("12", "0.5", "1e5", " 7 "); None for anything else."""
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_integer(text: Optional[str]) -> Optional[int]:
    """A whole token of text as an int within 64 bits ("12", "-3"); None for "1.5", "1e3", "" or "[N/A]"."""
    if text is None:
        return None
    try:
        value = int(text.strip(), 10)
    except (AttributeError, ValueError):
        return None
    return value if abs(value) <= _INT_LIMIT else None


def first_number(mapping: Optional[Mapping[str, Any]], *keys: str) -> Optional[float]:
    """The first strict number under any of `keys` (sources name one figure differently)."""
    if not mapping:
        return None
    for key in keys:
        value = number(mapping.get(key))
        if value is not None:
            return value
    return None


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
