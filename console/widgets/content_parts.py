"""Build a Content line from (text, style) parts with as few spans as possible: each span costs a Style per repaint."""
from __future__ import annotations

from typing import Iterable, Union

from textual.content import Content

Part = Union[str, tuple[str, str]]


def assemble(parts: Iterable[Part]) -> Content:
    merged: list[list[str]] = []          # [text, style] runs
    for part in parts:
        text, style = (part, "") if isinstance(part, str) else part
        if not text:
            continue
        if merged and merged[-1][1] == style:
            merged[-1][0] += text
        else:
            merged.append([text, style])
    if len(merged) == 1 and not merged[0][1]:
        return Content(merged[0][0])
    return Content.assemble(*[(t, s) if s else t for t, s in merged])
