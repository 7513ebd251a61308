"""Setting a border title repaints the widget even when the text is unchanged: assign only on change."""
from __future__ import annotations

from typing import Optional

from textual.widget import Widget

_UNSET = object()


def set_border_titles(widget: Widget, title: Optional[str], subtitle: Optional[str] | object = _UNSET) -> None:
    shown = getattr(widget, "_gpudeck_titles", (None, None))
    if title != shown[0]:
        widget.border_title = title
    if subtitle is not _UNSET and subtitle != shown[1]:
        widget.border_subtitle = subtitle  # type: ignore[assignment]
    widget._gpudeck_titles = (title, shown[1] if subtitle is _UNSET else subtitle)  # type: ignore[attr-defined]
