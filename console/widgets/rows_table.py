"""A light table for the dashboard: whole rows in, only changed rows re-built, a cursor, mouse clicks.

Textual's DataTable re-renders every cell whenever any cell changes; the process table changes
every tick (CPU%, SM%), which cost ~10 ms of CPU per tick on a 2-core box. This renders the
table line by line (Line API), re-building only the rows whose cells changed.
"""
from __future__ import annotations

# Textual internal touched here: Widget._styles_cache.clear() for a table scrolled out of view (what
# it buys and why it stays: strip_painter's header, scrolled_out).

from typing import Any, Optional, Sequence, Union

from textual import events
from textual.binding import Binding
from textual.strip import Strip
from textual.geometry import Region, Size
from textual.widget import Widget

from gpudeck.console.widgets.border_titles import set_border_titles
from gpudeck.console.widgets.strip_painter import PaintedLines, content_width, refresh_changed_lines, scrolled_out

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


class RowsTable(PaintedLines, Widget, can_focus=True):
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

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self._row_cache: dict[str, tuple[object, Strip]] = {}
        self._header: tuple[object, Strip] | None = None
        self._keys: list[str] = []
        self.cursor_key: Optional[str] = None
        self.title = ""

    # -- data ---------------------------------------------------------------------------------

    def sync(self, rows: dict[str, tuple[Cell, ...]], title: str, stale: bool) -> None:
        """Show exactly `rows` (in order); repaint only if something visible changed."""
        set_border_titles(self, title + (" · STALE" if stale else ""))
        if stale != self.has_class("-stale"):
            self.set_class(stale, "-stale")
            self._painter.invalidate()      # the class changes the base style; data alone does not
        if rows == self._rows:
            return
        count_changed = len(rows) != len(self._rows)
        shown = self._rows
        same_rows = list(rows) == self._keys
        self._rows = dict(rows)
        self._keys = list(rows)
        for gone in set(self._row_cache) - set(rows):
            del self._row_cache[gone]
        if self.cursor_key is not None and self.cursor_key not in rows:
            self.cursor_key = None
        if same_rows:
            # The same rows in the same order: repaint only those whose cells changed (CPU%, SM%…).
            refresh_changed_lines(self, [shown[k] for k in self._keys], [rows[k] for k in self._keys], top=1)
        elif not count_changed and scrolled_out(self):
            self._styles_cache.clear()      # Textual internal, see strip_painter's header: repainted when shown
        else:
            self.refresh(layout=count_changed)

    @property
    def row_keys(self) -> list[str]:
        return list(self._keys)

    # -- layout and rendering ----------------------------------------------------------------

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + max(1, len(self._rows))

    def _widths(self, width: int) -> list[int]:
        fixed = sum(c.width or 0 for c in self.COLUMNS) + self.GAP * (len(self.COLUMNS) - 1)
        flex = max(8, width - fixed)
        return [c.width if c.width is not None else flex for c in self.COLUMNS]

    def _line(self, cells: Sequence[Cell], widths: list[int], header: bool = False) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        gap = " " * self.GAP
        for i, (column, cell, w) in enumerate(zip(self.COLUMNS, cells, widths)):
            text, style = (cell, "") if isinstance(cell, str) else cell
            if header:
                style = "bold $text-muted"
            parts.append((_fit(text, w, column.right), style))
            if i < len(widths) - 1:
                parts.append((gap, style if header else ""))
        return parts

    def render_line(self, y: int) -> Strip:
        width = content_width(self)
        self._painter.ensure()
        generation = self._painter.generation
        if y == 0:
            header_key = ("header", width, generation)
            if self._header is None or self._header[0] != header_key:
                labels = [c.label for c in self.COLUMNS]
                self._header = (header_key, self._painter.strip(self._line(labels, self._widths(width), True), width))
            return self._header[1]
        if not self._rows:
            return self._painter.strip([(self.EMPTY, "$text-muted italic")] if y == 1 else [], width)
        if y - 1 >= len(self._keys):
            return self._painter.blank(width)
        row_key = self._keys[y - 1]
        cells = self._rows[row_key]
        cursor = "" if row_key != self.cursor_key else ("reverse" if self.has_focus else "underline")
        key = (cells, width, generation, cursor)
        cached = self._row_cache.get(row_key)
        if cached is None or cached[0] != key:
            parts = self._line(cells, self._widths(width))
            if cursor:
                parts = [(t, f"{s} {cursor}".strip()) for t, s in parts]
            cached = (key, self._painter.strip(parts, width))
            self._row_cache[row_key] = cached
        return cached[1]

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
        self._painter.invalidate()
        self.refresh()

    def on_blur(self) -> None:
        self._painter.invalidate()
        self.refresh()
