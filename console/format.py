"""How numbers look in the console: byte sizes, rates, ages, bars, sparklines, safe text."""
from __future__ import annotations

import math
from typing import Iterable, Optional

from gpudeck.jobs.logs.sanitize import terminal_text
from gpudeck.jobs.view import human_age as human_age  # one formatter for ages, core and console

NA = "n/a"

_EIGHTHS = " ▏▎▍▌▋▊▉"
_SPARKS = "▁▂▃▄▅▆▇█"


def human_bytes(n: Optional[float], precision: int = 1) -> str:
    """1536 -> '1.5K'; binary units, no 'B' or 'i' so columns stay narrow."""
    if n is None:
        return NA
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(value) < 1024 or unit == "P":
            if unit == "":
                return f"{int(value)}B"
            # Large values lose the decimal: '141G' reads faster than '141.0G'.
            return f"{value:.{precision}f}{unit}" if abs(value) < 100 else f"{value:.0f}{unit}"
        value /= 1024
    return f"{value:.0f}P"  # pragma: no cover - loop always returns


def human_rate(bps: Optional[float]) -> str:
    return NA if bps is None else f"{human_bytes(bps)}/s"


def pct(value: Optional[float], width: int = 3) -> str:
    return NA.rjust(width + 1) if value is None else f"{value:{width}.0f}%"


def hbar(fraction: Optional[float], width: int) -> str:
    """A horizontal bar of `width` cells, filled to `fraction` with eighth-cell precision."""
    if width <= 0:
        return ""
    if fraction is None or math.isnan(fraction):
        return "·" * width
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full
    if full < width:
        bar += _EIGHTHS[part]
    return bar.ljust(width)


def sparkline(values: Iterable[Optional[float]], width: int, lo: float = 0.0, hi: float = 100.0) -> str:
    """The last `width` values as block glyphs between lo and hi; gaps (None) are blanks."""
    if width <= 0:
        return ""
    tail = list(values)[-width:]
    span = (hi - lo) or 1.0
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
            continue
        level = int((min(max(v, lo), hi) - lo) / span * (len(_SPARKS) - 1) + 0.5)
        out.append(_SPARKS[level])
    return "".join(out).rjust(width)


def level_style(value: Optional[float], warn: float, crit: float) -> str:
    """Theme variable for a reading: calm, worth a look, act now."""
    if value is None:
        return "$text-muted"
    if value >= crit:
        return "$error"
    if value >= warn:
        return "$warning"
    return "$success"


def safe_text(text: Optional[str], limit: int = 400) -> str:
    """One table cell or message from a job, a log or another user's process: the core's sanitizer, on one line.

    Escape sequences are removed and bidi controls shown escaped (sanitize_text);
    a TAB becomes a space and anything else unprintable left (line separators) a '?'.
    """
    if not text:
        return ""
    cleaned = terminal_text(text, limit).replace("\t", " ")
    return "".join(ch if ch.isprintable() else "?" for ch in cleaned)


def short_gpu_name(name: Optional[str]) -> str:
    """'NVIDIA H200' -> 'H200': the vendor prefix costs columns and says nothing on a GPU box."""
    if not name:
        return "GPU"
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name
