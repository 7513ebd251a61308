"""What reaches the terminal: the partial updates the console writes tick after tick add up to a full render.

The console's screens use a compositor that renders, per update, only the widgets and lines that
changed (console/compositor.py). Each update written to the terminal here is applied to a virtual
screen, and after every update that screen must equal a full render of the same moment, cell by
cell (text and SGR style), on the dashboard, the jobs view, after a resize, a scroll and a density
change. A compositor that leaves something out is caught (the last test breaks one on purpose).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from textual._compositor import ChopsUpdate, CompositorUpdate

from gpudeck.console.app import make_app
from gpudeck.console.compositor import BandedCompositor
from gpudeck.jobs.telemetry.history import History
from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for

CONTROL = re.compile(r"\x1b\[(\d+);(\d+)H|\x1b\[([0-9;]*)m|\n")


class VirtualScreen:
    """A grid of (character, SGR parameters) cells that understands what Textual writes: cursor
    moves, SGR and text (every line of an update starts with a cursor move)."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.cells: list[list[tuple[str, str]]] = [[(" ", "")] * width for _ in range(height)]

    def apply(self, data: str) -> None:
        x = y = 0
        sgr = ""
        position = 0
        for match in CONTROL.finditer(data):
            x = self._text(data[position:match.start()], x, y, sgr)
            position = match.end()
            if match.group(1) is not None:
                y, x = int(match.group(1)) - 1, int(match.group(2)) - 1
            elif match.group(0) == "\n":
                y, x = y + 1, 0
            else:
                params = match.group(3)
                sgr = "" if params in ("", "0") else params
        self._text(data[position:], x, y, sgr)

    def _text(self, text: str, x: int, y: int, sgr: str) -> int:
        for char in text:
            if 0 <= y < self.height and 0 <= x < self.width:
                self.cells[y][x] = (char, sgr)
            x += 1
        return x

    def line(self, y: int) -> str:
        return "".join(char for char, _ in self.cells[y])


def full_render(app: Any) -> VirtualScreen:
    """The current screen rendered in full, through the same terminal path, without touching the
    compositor's pending state."""
    screen = VirtualScreen(*app.size)
    strips = app.screen._compositor.render_strips()
    screen.apply("".join(f"\x1b[{y + 1};1H" + strip.render(app.console) for y, strip in enumerate(strips)))
    return screen


class Recorder:
    """Wraps app._display: applies every update to a virtual terminal, then compares it with a full render."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.terminal: Optional[VirtualScreen] = None
        self.shown: tuple = ()
        self.partial_updates = 0
        self.partial_lines = 0
        self.mismatch: Optional[str] = None
        self.compared = 0
        self._display = app._display
        app._display = self.display

    @staticmethod
    def settled(screen: Any) -> bool:
        """No refresh is on its way: a widget's refresh() reaches the compositor only when the widget
        next idles (an Update message to the screen), so an update displayed in between may leave
        out a widget whose state already changed; the next one paints it. Compared only when settled."""
        if screen._message_queue.qsize():
            return False
        return not any(widget._repaint_required for widget in screen.walk_children())

    def display(self, screen: Any, update: Any) -> None:
        self._display(screen, update)
        if not isinstance(update, CompositorUpdate) or screen is not self.app.screen:
            return
        size = self.app.size
        shown = (screen, tuple(size))
        if self.terminal is None or shown != self.shown:
            if isinstance(update, ChopsUpdate):
                # After a resize or a switch of screens Textual paints the whole screen in its next
                # full update (a partial one may come first): compare from that one on.
                return
            self.terminal, self.shown = VirtualScreen(*size), shown
        written = update.render_segments(self.app.console)
        self.terminal.apply(written)
        if isinstance(update, ChopsUpdate):
            # Textual's own writer writes every partial update (a writer of our own saved ~1 % of a
            # tick and was removed): any other would have to write the same bytes.
            if type(update).render_segments is not ChopsUpdate.render_segments and self.mismatch is None:
                textual_bytes = ChopsUpdate.render_segments(update, self.app.console)
                if written != textual_bytes:
                    self.mismatch = f"update {self.partial_updates} written differently:\n  {written!r}\n  {textual_bytes!r}"
            self.partial_updates += 1
            self.partial_lines += len({y for y, _, _ in update.spans})
        if self.mismatch is None and self.settled(screen):
            self.compared += 1
            expected = full_render(self.app)
            for y in range(expected.height):
                if expected.cells[y] != self.terminal.cells[y]:
                    self.mismatch = (f"after {self.partial_updates} partial updates, line {y} differs:\n"
                                     f"  terminal: {self.terminal.line(y)!r}\n  full:     {expected.line(y)!r}")
                    break


async def drive(app: Any, recorder: Recorder, pilot: Any, updates: int) -> None:
    target = recorder.partial_updates + updates
    await wait_for(pilot, lambda: recorder.partial_updates >= target or recorder.mismatch,
                   f"{updates} more partial updates", detail=lambda: recorder.partial_updates)
    assert recorder.mismatch is None, recorder.mismatch


@pilot_test
async def test_partial_updates_add_up_to_a_full_render_on_every_view():
    app = make_app(demo=True, seed=3, refresh=0.1, history=History(capacity=120), demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        recorder = Recorder(app)
        await drive(app, recorder, pilot, 15)                 # dashboard: cards, host, ports, processes
        assert app.screen._compositor.__class__ is BandedCompositor
        await pilot.press("d")                                # GPU density: one line each
        await drive(app, recorder, pilot, 8)
        await pilot.resize_terminal(100, 30)                  # narrow: host above ports, the body scrolls
        await drive(app, recorder, pilot, 8)
        body = app.screen.query_one("#dashboard-body")
        body.scroll_to(y=6, animate=False)
        await drive(app, recorder, pilot, 8)
        await pilot.press("2")                                # the jobs view: a SIMULATED replay
        await drive(app, recorder, pilot, 12)
        await pilot.press("1")
        await drive(app, recorder, pilot, 8)
        # Partial updates really were partial: fewer lines than the screen, on average.
        assert recorder.partial_lines < recorder.partial_updates * 30
        # Most updates were compared (the unsettled ones are skipped), not a lucky few.
        assert recorder.compared >= recorder.partial_updates // 2, (recorder.compared, recorder.partial_updates)


class SkipsAWidget(BandedCompositor):
    """A broken compositor: never asks the GPU panels to render in a partial update."""

    def _get_renders(self, crop=None):
        for region, clip, strips in super()._get_renders(crop):
            if self._dirty_spans is not None and region.y < 12:
                continue
            yield region, clip, strips


@pilot_test
async def test_the_comparison_catches_a_compositor_that_leaves_a_widget_out():
    app = make_app(demo=True, seed=3, refresh=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        recorder = Recorder(app)
        await wait_for(pilot, lambda: recorder.partial_updates >= 2, "two partial updates")
        app.screen._compositor.__class__ = SkipsAWidget
        await wait_for(pilot, lambda: recorder.mismatch, "the comparison to notice the stale GPU lines",
                       detail=lambda: recorder.partial_updates)
        assert "differs" in recorder.mismatch


@pilot_test
async def test_a_panel_scrolled_out_of_view_costs_no_layout_and_is_current_when_scrolled_back():
    # A panel below the fold that is refreshed makes Textual rebuild the layout of the whole screen
    # at the next frame; the dashboard's panels skip that and repaint from scratch when shown again.
    from gpudeck.console.widgets.gpu_process_table import GpuProcessTable

    app = make_app(demo=True, seed=5, refresh=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        recorder = Recorder(app)
        await drive(app, recorder, pilot, 3)
        compositor = app.screen._compositor
        table = app.screen.query_one(GpuProcessTable)
        assert table not in compositor.visible_widgets, "the test needs the process table below the fold"
        rebuilds = []
        arrange = compositor._arrange_root
        compositor._arrange_root = lambda root, size, visible_only=True: (
            rebuilds.append(visible_only) or arrange(root, size, visible_only))
        ticks, rows_before = app.ticks, dict(table._rows)
        await drive(app, recorder, pilot, 10)
        assert table._rows != rows_before, "the test needs the table's data to change while out of view"
        assert app.ticks - ticks >= 10
        assert rebuilds.count(False) <= 1, f"{rebuilds.count(False)} whole-screen layouts in 10 ticks"

        app.screen.query_one("#dashboard-body").scroll_end(animate=False)
        await wait_for(pilot, lambda: table in compositor.visible_widgets, "the process table on screen")
        await drive(app, recorder, pilot, 2)
        # What the screen shows of the table is what the table's data paints now (not lines cached
        # from before it was scrolled out).
        region, _clip = compositor.visible_widgets[table]
        top = table.content_region.y
        strips = compositor.render_strips()
        for y in range(table.size.height):
            shown = strips[top + y].crop(table.content_region.x, table.content_region.right).text
            assert shown == table.render_line(y).text, f"process table line {y} is stale"
