"""All GPUs one line each, drawn by a single widget: the compact form for small terminals."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from gpudeck.jobs.telemetry.snapshot import GpuSample

from gpudeck.console.widgets.gpu_card_panel import gpu_line_parts
from gpudeck.console.widgets.strip_painter import PaintedLines, Part, content_width, refresh_changed_lines

# One widget rather than one per GPU: each widget repaint has a fixed cost (~0.3 ms on a
# slow core) that eight separate lines would pay eight times per tick.


class GpuLinesPanel(PaintedLines, Widget):
    DEFAULT_CSS = """
    GpuLinesPanel {
        height: auto;
        width: 1fr;
    }
    GpuLinesPanel.-stale { color: $text-muted; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gpus: list[tuple[GpuSample, tuple[Optional[float], ...]]] = []
        self._stale = False
        self._lines: tuple[int, list[list[Part]]] = (-1, [])    # (width, each GPU's line as parts)

    def update_lines(self, gpus: Sequence[tuple[GpuSample, Sequence[Optional[float]]]], stale: bool) -> None:
        new = [(g, tuple(recent)) for g, recent in gpus]
        if new == self._gpus and stale == self._stale:
            return
        restyled = stale != self._stale
        count_changed = len(new) != len(self._gpus)
        self._gpus, self._stale = new, stale
        if restyled:
            self.set_class(stale, "-stale")
            self._painter.invalidate()      # the class changes the base style; data alone does not
        width = content_width(self)
        shown = self._lines[1] if self._lines[0] == width and not restyled else None
        self._lines = (width, self._build(width))
        if shown is None:
            self.refresh(layout=count_changed)
        else:
            # A sample that moved only below what a line shows (power 465.3 -> 465.4 W) repaints nothing.
            refresh_changed_lines(self, shown, self._lines[1])

    def _build(self, width: int) -> list[list[Part]]:
        return [gpu_line_parts(gpu, recent, width, self._stale) for gpu, recent in self._gpus]

    def lines(self) -> list[list[Part]]:
        width = content_width(self)
        if self._lines[0] != width:
            self._lines = (width, self._build(width))
        return self._lines[1]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._gpus)

    def render_line(self, y: int) -> Strip:
        return self.painted_line(y, self.lines())
