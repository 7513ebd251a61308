"""A DataTable that takes the whole wanted content each tick and touches only the cells that changed."""
from __future__ import annotations

from typing import Hashable, Sequence

from rich.text import Text
from textual.widgets import DataTable

Cell = str | Text


class SyncedTable(DataTable):
    """Base of the dashboard's tables: `sync(rows)` with rows keyed by a stable identity."""

    DEFAULT_CSS = """
    SyncedTable {
        height: auto;
        max-height: 100%;
        border: round $primary;
        border-title-color: $foreground;
        border-title-style: bold;
    }
    SyncedTable.-stale { border: round $error; }
    SyncedTable:focus { border: round $accent; }
    """

    COLUMNS: Sequence[tuple[str, int | None]] = ()

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: dict[str, tuple[Cell, ...]] = {}

    def on_mount(self) -> None:
        for label, width in self.COLUMNS:
            self.add_column(label, width=width, key=label)

    def sync(self, rows: dict[str, tuple[Cell, ...]]) -> None:
        if list(rows) != list(self._rows):
            # Rows came or went: rebuild in the wanted order, keeping the cursor on the same row.
            keep = self._cursor_key()
            self.clear()
            for key, cells in rows.items():
                self.add_row(*cells, key=key)
            if keep in rows:
                self.move_cursor(row=list(rows).index(keep), animate=False)
        else:
            for key, cells in rows.items():
                old = self._rows[key]
                for (label, _), new_cell, old_cell in zip(self.COLUMNS, cells, old):
                    if new_cell != old_cell:
                        self.update_cell(key, label, new_cell)
        self._rows = dict(rows)

    def _cursor_key(self) -> Hashable | None:
        if not self._rows or self.cursor_row < 0:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # an empty or just-cleared table has no cell under the cursor
            return None
