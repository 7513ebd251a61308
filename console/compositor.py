"""Partial screen updates that cost what changed: the console's screens repaint only their dirty lines."""
from __future__ import annotations

# Textual internals touched here (textual pinned to 8.2.x; tests/test_console_partial_update.py
# checks every partial update against a full render, and passes with Textual's own compositor):
#   textual._compositor.Compositor, ChopsUpdate  subclassed / returned: the private compositor
#     module (no public way to change how a partial update is rendered);
#   Compositor._dirty_regions, _regions_to_spans, _render_chops, _get_renders, .cuts,
#     .visible_widgets  read or overridden by BandedCompositor;
#   Screen._compositor  replaced by DeckScreen.
# What it buys: a dashboard tick renders 3 widgets over ~11 lines instead of 11 over ~110 (UI-thread
# CPU 3.2-3.5 -> 2.9-3.0 ms a tick, ~10 %). Textual's own ChopsUpdate writes the result: our
# writer (LeanChopsUpdate, ~1 % of a tick) was removed, under the 2 % an internal must buy.

from typing import Any, Iterable, Optional

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget


class BandedCompositor(Compositor):
    """Textual's compositor renders, for a partial update, every widget under the bounding box of all
    dirty regions, each over its whole visible height, and then keeps only the dirty lines. A
    dashboard tick dirties a few lines from the top card to the bottom table, so that was the whole
    screen, every container and panel, every line, every tick (~2/3 of the console's UI-thread CPU).

    Here a partial update asks a widget to render only if, on some dirty line, it owns a cell that
    no widget in front of it covers (containers under their panels own nothing), and only over the
    range of dirty lines it owns. Each piece of each dirty line is still painted by the same widget
    as before; full updates are unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owned_for: tuple[object, object] = (None, None)  # (visible_widgets, cuts) it was computed for
        self._owned: dict[Widget, dict[int, tuple[int, int]]] = {}  # widget -> {line: columns it paints}
        self._dirty_spans: Optional[dict[int, list[tuple[int, int]]]] = None   # while a partial update renders

    def render_partial_update(self) -> Optional[ChopsUpdate]:
        update_regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not update_regions:
            return None
        screen = self.size.region
        spans = [span for span in self._regions_to_spans(update_regions) if 0 <= span[0] < screen.height]
        if not spans:
            return None
        dirty: dict[int, list[tuple[int, int]]] = {}
        for y, x1, x2 in spans:
            dirty.setdefault(y, []).append((x1, x2))
        top, bottom = spans[0][0], spans[-1][0] + 1          # spans come sorted by line
        self._dirty_spans = dirty
        try:
            chops = self._render_chops(Region(0, top, screen.width, bottom - top), dirty.__contains__)
        finally:
            self._dirty_spans = None
        chop_ends = [cut_set[1:] for cut_set in self.cuts]
        return ChopsUpdate(chops, spans, chop_ends)

    def _line_owners(self) -> dict[Widget, dict[int, tuple[int, int]]]:
        """For each visible widget, the lines on which it paints at least one chop, with the columns
        those chops span (as _render_chops decides: the widgets in front come first, and the first
        strip for a chop wins)."""
        visible, cuts = self.visible_widgets, self.cuts
        if self._owned_for[0] is visible and self._owned_for[1] is cuts:
            return self._owned
        taken: list[set[int]] = [set() for _ in cuts]
        owned: dict[Widget, dict[int, tuple[int, int]]] = {}
        for widget, (region, clip) in visible.items():
            x, y, width, height = region.intersection(clip)
            lines: dict[int, tuple[int, int]] = {}
            for line in range(max(y, 0), min(y + height, len(cuts))):
                line_cuts = cuts[line]
                mine = [(cut, end) for cut, end in zip(line_cuts, line_cuts[1:])
                        if x <= cut < x + width and cut not in taken[line]]
                if mine:
                    taken[line].update(cut for cut, _ in mine)
                    lines[line] = (mine[0][0], mine[-1][1])
            owned[widget] = lines
        self._owned_for, self._owned = (visible, cuts), owned
        return owned

    def _get_renders(self, crop: Optional[Region] = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        dirty = self._dirty_spans
        if dirty is None or crop is None:
            yield from super()._get_renders(crop)
            return
        owners = self._line_owners()
        for widget, (region, clip) in self.visible_widgets.items():
            lines = owners.get(widget)
            if not lines:
                continue
            # The dirty lines where a chop it paints meets a dirty span: nothing else of it survives.
            mine = [y for y, (start, end) in lines.items()
                    if y in dirty and any(x1 < end and start < x2 for x1, x2 in dirty[y])]
            if not mine:
                continue
            # Only those lines, whole width (a line's chops stay those of the full render).
            top, bottom = max(clip.y, min(mine)), min(clip.bottom, max(mine) + 1)
            clip = Region(clip.x, top, clip.width, bottom - top)
            x, y, width, height = region.intersection(clip)
            if width and height:
                yield region, clip, widget.render_lines(Region(x - region.x, y - region.y, width, height))


class DeckScreen(Screen):
    """A Screen with the banded compositor (every gpudeck screen that repaints on ticks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = BandedCompositor()
