"""Lines the painted panels compose themselves (skipping Textual's styles cache) equal what the styles cache composes.

A repainted content line of a PaintedLines widget is composed from the border and padding read back
from a line Textual composed, plus the painter's strip (console/widgets/strip_painter.py). Here, on
every view and state the dashboard goes through (line and card density, a focused table, another
theme, a stale sample, the jobs view), each such widget's lines are compared segment by segment with
what Textual's own path renders for the same widget at the same moment.
"""
from __future__ import annotations

from typing import Any

from textual.geometry import Region
from textual.widget import Widget

from gpudeck.console.app import make_app
from gpudeck.console.widgets import strip_painter
from gpudeck.console.widgets.strip_painter import PaintedLines
from gpudeck.jobs.telemetry.history import History
from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for


def painted(app: Any) -> list[Any]:
    return [w for w in app.screen.query("*") if isinstance(w, PaintedLines) and w.size.area]


def differences(app: Any) -> list[str]:
    """Each painted widget: its lines as it renders them now, then as Textual's styles cache renders
    them from scratch (the cache cleared), compared segment by segment."""
    found = []
    for widget in painted(app):
        whole = Region(0, 0, *widget._size)
        mine = [list(strip) for strip in widget.render_lines(whole)]
        widget._styles_cache.clear()
        textual = [list(strip) for strip in Widget.render_lines(widget, whole)]
        for y, (a, b) in enumerate(zip(mine, textual)):
            if a != b:
                found.append(f"{type(widget).__name__} line {y}:\n  composed: {a}\n  textual:  {b}")
    return found


async def ticks_with_composed_lines(app: Any, pilot: Any, ticks: int = 4) -> None:
    """Wait for `ticks` more ticks, and for lines composed without the styles cache on this view."""
    start = app.ticks
    before = sum(w.composed_lines for w in painted(app))
    await wait_for(pilot, lambda: app.ticks >= start + ticks and sum(w.composed_lines for w in painted(app)) > before,
                   "ticks that repaint lines without the styles cache", detail=lambda: app.ticks)


class FailingOnce:
    """A sampler whose next sample fails once (the dashboard turns stale), then recovers."""

    def __init__(self, sampler: Any) -> None:
        self.sampler, self.fail = sampler, False
        self.simulated = True

    def sample(self) -> Any:
        if self.fail:
            raise OSError("NVML read failed: driver went away")
        return self.sampler.sample()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


@pilot_test
async def test_composed_lines_equal_the_styles_caches_on_every_view_and_state():
    from gpudeck.jobs.telemetry.sampler import make_sampler

    sampler = FailingOnce(make_sampler(demo=True, seed=4))
    app = make_app(sampler, refresh=0.1, history=History(capacity=120), demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await ticks_with_composed_lines(app, pilot)
        composing = {type(w).__name__ for w in painted(app) if w.composed_lines}
        assert {"GpuLinesPanel", "HostPanel", "GpuProcessTable"} <= composing, composing
        assert differences(app) == []

        await pilot.press("d")                               # cards: another border, titles, heights
        await ticks_with_composed_lines(app, pilot)
        assert differences(app) == []

        await pilot.press("tab")                             # a focused table: its border changes colour
        await ticks_with_composed_lines(app, pilot)
        assert any(w.has_focus for w in painted(app))
        assert differences(app) == []

        await pilot.press("t")                               # another theme: every colour changes
        await ticks_with_composed_lines(app, pilot)
        assert differences(app) == []

        sampler.fail = True                                  # stale: -stale classes, red borders
        await wait_for(pilot, lambda: app.sample_error is not None, "a failed sample")
        sampler.fail = False
        await ticks_with_composed_lines(app, pilot)
        assert differences(app) == []

        await pilot.press("2")                               # the jobs view (a replay)
        await pilot.pause(0.5)
        assert differences(app) == []


@pilot_test
async def test_the_comparison_catches_a_wrong_border_and_a_tinted_panel_keeps_textuals_path():
    app = make_app(demo=True, seed=4, refresh=0.1, history=History(capacity=120))
    async with app.run_test(size=(120, 40)) as pilot:
        await ticks_with_composed_lines(app, pilot)
        # Edges read back wrong (left and right swapped) and not checked: the comparison must see it.
        read_edges = PaintedLines._read_edges

        def swapped(self: Any) -> Any:
            edges = read_edges(self)
            if edges is not None and edges.left != edges.right:
                edges.left, edges.right = edges.right, edges.left
            return edges

        PaintedLines._read_edges = swapped
        try:
            for widget in painted(app):
                widget._styles_cache.clear()
            await ticks_with_composed_lines(app, pilot, ticks=2)
            assert differences(app), "the comparison missed lines composed with swapped borders"
        finally:
            PaintedLines._read_edges = read_edges

        # A panel Textual post-processes (a tint) is never composed here, and looks as Textual paints it.
        host = next(w for w in painted(app) if type(w).__name__ == "HostPanel")
        host.styles.tint = "red 30%"
        await pilot.pause(0.3)
        composed = host.composed_lines
        await ticks_with_composed_lines(app, pilot, ticks=3)
        assert host.composed_lines == composed
        assert strip_painter._plain_box(host) is False
        assert differences(app) == []


@pilot_test
async def test_a_tick_repaints_the_panels_without_an_update_message_each():
    # Each refreshed widget used to cost a Prompt to it and an Update from it to the screen; the
    # panels' changed lines now mark the screen's dirty widgets directly. What they paint is the
    # partial-update test's business (test_console_partial_update.py); here: no Update per panel.
    from textual.screen import Screen

    app = make_app(demo=True, seed=4, refresh=0.1, history=History(capacity=120))
    updates: list[str] = []
    on_update = Screen._on_update

    async def counting(self: Any, message: Any) -> None:
        updates.append(type(message.widget).__name__)
        await on_update(self, message)

    Screen._on_update = counting
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await ticks_with_composed_lines(app, pilot)
            updates.clear()
            await ticks_with_composed_lines(app, pilot, ticks=10)
            painted_names = {type(w).__name__ for w in painted(app)}
            assert not painted_names & set(updates), updates
    finally:
        Screen._on_update = on_update
