"""All GPUs of the box: cards in a grid when there is room, one line each when there is not."""
from __future__ import annotations

import math
from typing import Literal, Optional

from textual.app import ComposeResult
from textual.containers import Container
from textual.widgets import Static

from console.telemetry_view import TelemetryView
from console.widgets.gpu_card_panel import CARD_HEIGHT, GpuCardPanel

Density = Literal["auto", "lines", "cards"]

MIN_CARD_WIDTH = 38
# Full cards only while the GPU area leaves most of the screen to host, ports and processes.
MAX_CARD_AREA_FRACTION = 0.55


def choose_layout(gpu_count: int, width: int, height: int, density: Density = "auto") -> tuple[bool, int]:
    """(cards?, columns) for `gpu_count` GPUs on a `width` x `height` screen."""
    if gpu_count <= 0:
        return False, 1
    max_cols = max(1, min(gpu_count, (width - 2) // MIN_CARD_WIDTH))
    rows = math.ceil(gpu_count / max_cols)
    cols = math.ceil(gpu_count / rows)       # balance: 8 GPUs on 5 columns look better as 4+4
    fits = rows * CARD_HEIGHT + 2 <= height * MAX_CARD_AREA_FRACTION
    if density == "cards" or (density == "auto" and fits):
        return True, cols
    return False, 1


class GpuGridPanel(Container):
    DEFAULT_CSS = """
    GpuGridPanel {
        height: auto;
        layout: grid;
        grid-size: 1;
        grid-rows: 1;
        grid-gutter: 0 1;
        border: round $primary;
        border-title-color: $foreground;
        border-title-style: bold;
        border-subtitle-color: $warning;
        border-subtitle-style: bold;
        padding: 0 1;
    }
    GpuGridPanel.-cards {
        grid-rows: 8;
        border: none;
        padding: 0;
    }
    GpuGridPanel.-stale { border: round $error; }
    GpuGridPanel > .gpu-error {
        color: $warning;
        width: 1fr;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "GPUs"
        self.density: Density = "auto"
        self._screen_size: tuple[int, int] = (80, 24)
        self._cards: dict[int, GpuCardPanel] = {}
        self._message = Static("waiting for the first sample…", classes="gpu-error")
        self._cards_mode = False
        self._last_error: Optional[str] = None

    def compose(self) -> ComposeResult:
        yield self._message

    def set_screen_size(self, width: int, height: int) -> None:
        self._screen_size = (width, height)
        self._relayout()

    def set_density(self, density: Density) -> None:
        self.density = density
        self._relayout()

    def _relayout(self) -> None:
        cards, cols = choose_layout(len(self._cards), *self._screen_size, self.density)
        self._cards_mode = cards
        self.set_class(cards, "-cards")
        self.styles.grid_size_columns = cols
        for card in self._cards.values():
            card.set_card_mode(cards)

    def apply_telemetry(self, view: TelemetryView) -> None:
        snapshot = view.snapshot
        self.set_class(view.stale, "-stale")
        if snapshot is None:
            text = f"GPU data unavailable: {view.error}" if view.error else "waiting for the first sample…"
            self._show_message(text)
            return
        sim = "SIMULATED" if snapshot.simulated else None
        count = len(snapshot.gpus)
        self.border_title = f"GPUs ({count})" + (" · STALE" if view.stale else "")
        self.border_subtitle = sim
        if not snapshot.gpus:
            self._show_message(f"No GPU: {snapshot.gpu_error or 'NVML reported no devices'}")
            return
        self._message.display = False
        indices = [g.index for g in snapshot.gpus]
        if indices != list(self._cards):
            # The set of GPUs changes only at start (or on a driver reset): re-mount then, never per tick.
            self.remove_children(GpuCardPanel)
            self._cards = {i: GpuCardPanel(i, id=f"gpu-card-{i}") for i in indices}
            self.mount_all(self._cards.values())
            self._relayout()
        for gpu in snapshot.gpus:
            card = self._cards[gpu.index]
            width = max(card.size.width, 20)
            card.update_card(gpu, view.values(("gpu", gpu.index, "util"), width), view.stale)

    def _show_message(self, text: str) -> None:
        if self._cards:
            self.remove_children(GpuCardPanel)
            self._cards = {}
            self._relayout()
        self._message.update(text)
        self._message.display = True
        self.set_class(False, "-cards")
