"""All GPUs of the box: cards in a grid when there is room, one line each when there is not."""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from textual.app import ComposeResult
from textual.containers import Container, Grid
from textual.widgets import Static

from gpudeck.console.feeds import FollowsTelemetry
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.border_titles import set_border_titles
from gpudeck.console.widgets.gpu_card_panel import CARD_HEIGHT, GpuCardPanel
from gpudeck.console.widgets.gpu_lines_panel import GpuLinesPanel
from gpudeck.console.widgets.strip_painter import content_width

Density = Literal["auto", "lines", "cards"]

MIN_CARD_WIDTH = 38
# Full cards only while the GPU area leaves most of the screen to host, ports and processes.
MAX_CARD_AREA_FRACTION = 0.55


def choose_layout(gpu_count: int, width: int, height: int, density: Density = "auto") -> tuple[bool, int]:
    """(cards?, columns) for `gpu_count` GPUs on a `width` x `height` screen."""
    if gpu_count <= 0:
        return False, 1
    max_cols = max(1, min(gpu_count, width // MIN_CARD_WIDTH))
    rows = math.ceil(gpu_count / max_cols)
    cols = math.ceil(gpu_count / rows)       # balance: 8 GPUs on 5 columns look better as 4+4
    fits = rows * CARD_HEIGHT <= height * MAX_CARD_AREA_FRACTION
    if density == "cards" or (density == "auto" and fits):
        return True, cols
    return False, 1


class GpuGridPanel(FollowsTelemetry, Container):
    DEFAULT_CSS = """
    GpuGridPanel {
        height: auto;
        border: round $primary;
        border-title-color: $foreground;
        border-title-style: bold;
        border-subtitle-color: $warning;
        border-subtitle-style: bold;
        padding: 0 1;
    }
    GpuGridPanel.-cards {
        border: none;
        padding: 0;
    }
    GpuGridPanel.-stale { border: round $error; }
    GpuGridPanel.-cards.-stale { border: none; }
    GpuGridPanel > Grid {
        height: auto;
        grid-size: 4;
        grid-rows: 8;
        grid-gutter: 0 1;
        display: none;
    }
    GpuGridPanel.-cards > Grid { display: block; }
    GpuGridPanel.-cards > GpuLinesPanel { display: none; }
    GpuGridPanel > .gpu-message {
        color: $warning;
        width: 1fr;
    }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "GPUs"
        self.density: Density = "auto"
        self._screen_size: tuple[int, int] = (80, 24)
        self._gpu_count = 0
        self._cards: dict[int, GpuCardPanel] = {}
        self._cards_mode = False
        self._view: Optional[TelemetryView] = None
        self._message_text = "waiting for the first sample…"
        self._message = Static(self._message_text, classes="gpu-message", markup=False)
        self._lines = GpuLinesPanel()
        self._grid = Grid()

    def compose(self) -> ComposeResult:
        yield self._message
        yield self._lines
        yield self._grid

    def on_mount(self) -> None:
        # Cards or lines depends on the whole screen, not only on this panel's own size.
        self.set_screen_size(*self.app.size)

    @property
    def cards_mode(self) -> bool:
        return self._cards_mode

    def set_screen_size(self, width: int, height: int) -> None:
        self._screen_size = (width, height)
        self._relayout()

    def set_density(self, density: Density) -> None:
        self.density = density
        self._relayout()

    def _relayout(self) -> None:
        cards, cols = choose_layout(self._gpu_count, *self._screen_size, self.density)
        changed = cards != self._cards_mode
        self._cards_mode = cards
        self.set_class(cards, "-cards")
        if self._grid.styles.grid_size_columns != cols:
            self._grid.styles.grid_size_columns = cols
        if changed and self._view is not None:
            self.apply_telemetry(self._view)    # the newly shown form has not been kept up to date

    def apply_telemetry(self, view: TelemetryView) -> None:
        self._view = view
        snapshot = view.snapshot
        self.set_class(view.stale, "-stale")
        if snapshot is None:
            self._show_message(f"GPU data unavailable: {view.error}" if view.error else "waiting for the first sample…")
            return
        count = len(snapshot.gpus)
        set_border_titles(self, f"GPUs ({count})" + (" · STALE" if view.stale else ""),
                          "SIMULATED" if snapshot.simulated else None)
        if not snapshot.gpus:
            self._show_message(f"No GPU: {snapshot.gpu_error or 'the GPU driver reported no devices'}")
            return
        self._message.display = False
        if count != self._gpu_count:
            self._gpu_count = count
            self._relayout()
        if not self._cards_mode:
            self._lines.update_lines(
                [(g, view.values(("gpu", g.index, "util"), content_width(self._lines) or 80)) for g in snapshot.gpus],
                view.stale)
            return
        indices = [g.index for g in snapshot.gpus]
        if indices != list(self._cards):
            # The set of GPUs changes only at start (or on a driver reset): re-mount then, never per tick.
            self._grid.remove_children()
            self._cards = {i: GpuCardPanel(i, id=f"gpu-card-{i}") for i in indices}
            self._grid.mount_all(self._cards.values())
        for gpu in snapshot.gpus:
            card = self._cards[gpu.index]
            card.update_card(gpu, view.values(("gpu", gpu.index, "util"), max(content_width(card), 40)), view.stale)

    def _show_message(self, text: str) -> None:
        # Called every tick on a box without GPUs: touch nothing that did not change
        # (Static.update and style assignments each cost a full layout pass).
        if text != self._message_text:
            self._message_text = text
            self._message.update(text)
        self._message.display = True
        if self._gpu_count or self._cards:
            self._gpu_count = 0
            self._lines.update_lines([], False)
            if self._cards:
                self._grid.remove_children()
                self._cards = {}
            self._relayout()
