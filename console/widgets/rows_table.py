"""A light table for the dashboard: whole rows in, only changed rows re-built, a cursor, mouse clicks.

Textual's DataTable re-renders every cell whenever any cell changes; the process table changes
every tick (CPU%, SM%), which cost ~10 ms of CPU per tick on a 2-core box. This renders the
table as one Content, re-building only rows whose cells changed.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Region
from textual.widget import Widget

from console.widgets.border_titles import set_border_titles
from console.widgets.content_parts import assemble

# A cell is its text, or (text, style) where style may use theme variables ("bold $warning").
Cell = Union[str, tuple[str, str]]


class Column:
    __slots__ = ("label", "width", "right")

    def __init__(self, label: str, width: Optional[int] = None, right: bool = False) -> None:
        self.label = label
        self.width = width          # None: takes the remaining width (at most one column)
        self.right = right


def _fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[: max(0, width - 1)] + "…" if width > 1 else text[:width]
    return text.rjust(width) if right else text.ljust(width)


class RowsTable(Widget, can_focus=True):
    DEFAULT_CSS = """
    RowsTable {
        height: auto;
        text-wrap: nowrap;
        text-overflow: clip;
        border: round $primary;
        border-title-color: $foreground;
        border-title-style: bold;
        padding: 0 1;
    }
    RowsTable:focus { border: round $accent; }
    RowsTable.-stale { border: round $error; color: $text-muted; }
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False, id="table.cursor-up"),
        Binding("down", "cursor(1)", "Down", show=False, id="table.cursor-down"),
        Binding("home", "cursor_to(0)", "First", show=False, id="table.cursor-first"),
        Binding("end", "cursor_to(-1)", "Last", show=False, id="table.cursor-last"),
    ]

    COLUMNS: Sequence[Column] = ()
    EMPTY = "none"
    GAP = 2

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self._row_cache: dict[str, tuple[tuple[Cell, ...], int, Content]] = {}
        self._keys: list[str] = []
        self.cursor_key: Optional[str] = None
        self.title = ""

    # -- data ---------------------------------------------------------------------------------

    def sync(self, rows: dict[str, tuple[Cell, ...]], title: str, stale: bool) -> None:
        """Show exactly `rows` (in order); repaint only if something visible changed."""
        set_border_titles(self, title + (" · STALE" if stale else ""))
        self.set_class(stale, "-stale")
        if rows == self._rows:
            return
        count_changed = len(rows) != len(self._rows)
        self._rows = dict(rows)
        self._keys = list(rows)
        for gone in set(self._row_cache) - set(rows):
            del self._row_cache[gone]
        if self.cursor_key is not None and self.cursor_key not in rows:
            self.cursor_key = None
        self.refresh(layout=count_changed)

    @property
    def row_keys(self) -> list[str]:
        return list(self._keys)

    # -- layout and rendering ----------------------------------------------------------------

    def get_content_height(self, container, viewport, width: int) -> int:
        return 1 + max(1, len(self._rows))

    def _widths(self, width: int) -> list[int]:
        fixed = sum(c.width or 0 for c in self.COLUMNS) + self.GAP * (len(self.COLUMNS) - 1)
        flex = max(8, width - fixed)
        return [c.width if c.width is not None else flex for c in self.COLUMNS]

    def _line(self, cells: Sequence[Cell], widths: list[int], header: bool = False) -> Content:
        parts: list = []
        gap = " " * self.GAP
        for i, (column, cell, w) in enumerate(zip(self.COLUMNS, cells, widths)):
            text, style = (cell, "") if isinstance(cell, str) else cell
            if header:
                style = "bold $text-muted"
            parts.append((_fit(text, w, column.right), style) if style else _fit(text, w, column.right))
            if i < len(widths) - 1:
                parts.append(gap)
        return assemble(parts)

    def render(self) -> Content:
        width = self.size.width
        widths = self._widths(width)
        lines = [self._line([c.label for c in self.COLUMNS], widths, header=True)]
        if not self._rows:
            lines.append(Content.styled(self.EMPTY, "$text-muted italic"))
        for key, cells in self._rows.items():
            cached = self._row_cache.get(key)
            if cached is None or cached[0] != cells or cached[1] != width:
                line = self._line(cells, widths)
                self._row_cache[key] = (cells, width, line)
            else:
                line = cached[2]
            if key == self.cursor_key and self.has_focus:
                line = line.stylize("reverse")
            elif key == self.cursor_key:
                line = line.stylize("underline")
            lines.append(line)
        return Content("\n").join(lines)

    # -- cursor: keys and mouse --------------------------------------------------------------

    def _move_to(self, index: int) -> None:
        if not self._keys:
            return
        index = max(0, min(index, len(self._keys) - 1))
        self.cursor_key = self._keys[index]
        self.refresh()
        # Keep the cursor row on screen inside whatever scrolls this table (the dashboard body).
        scroller = next((a for a in self.ancestors_with_self[1:]
                         if isinstance(a, Widget) and a.is_scrollable and a.allow_vertical_scroll), None)
        if scroller is not None:
            y = scroller.scroll_offset.y + self.content_region.y - scroller.content_region.y + 1 + index
            scroller.scroll_to_region(Region(0, y, 1, 1), animate=False, immediate=True)

    def action_cursor(self, delta: int) -> None:
        if self.cursor_key in self._keys:
            self._move_to(self._keys.index(self.cursor_key) + delta)
        else:
            self._move_to(0 if delta > 0 else len(self._keys) - 1)

    def action_cursor_to(self, index: int) -> None:
        self._move_to(index if index >= 0 else len(self._keys) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y >= 1:
            self._move_to(offset.y - 1)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
