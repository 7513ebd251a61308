"""All GPUs one line each, drawn by a single widget: the compact form for small terminals."""
from __future__ import annotations

from typing import Optional, Sequence

from textual.content import Content
from textual.widget import Widget

from jobs.telemetry.snapshot import GpuSample

from console.widgets.gpu_card_panel import render_gpu_line

# One widget rather than one per GPU: each widget repaint has a fixed cost (~0.3 ms on a
# slow core) that eight separate lines would pay eight times per tick.


class GpuLinesPanel(Widget):
    DEFAULT_CSS = """
    GpuLinesPanel {
        height: auto;
        width: 1fr;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    GpuLinesPanel.-stale { color: $text-muted; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._gpus: list[tuple[GpuSample, tuple[Optional[float], ...]]] = []
        self._stale = False
        self._cache: dict[int, tuple[object, Content]] = {}

    def update_lines(self, gpus: Sequence[tuple[GpuSample, Sequence[Optional[float]]]], stale: bool) -> None:
        new = [(g, tuple(recent)) for g, recent in gpus]
        if new == self._gpus and stale == self._stale:
            return
        layout = len(new) != len(self._gpus)
        self._gpus, self._stale = new, stale
        self.set_class(stale, "-stale")
        self.refresh(layout=layout)

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(1, len(self._gpus))

    def render(self) -> Content:
        width = self.size.width
        lines = []
        for gpu, recent in self._gpus:
            key = (gpu, recent, width, self._stale)
            cached = self._cache.get(gpu.index)
            if cached is None or cached[0] != key:
                cached = (key, render_gpu_line(gpu, recent, width, self._stale))
                self._cache[gpu.index] = cached
            lines.append(cached[1])
        return Content("\n").join(lines)
