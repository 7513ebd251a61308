"""The replay bar: REPLAY (or SIMULATED) badge, play/pause, speed, position, a position bar with alert marks, keys."""
from __future__ import annotations

from typing import Any, Optional

from textual.content import Content
from textual.widget import Widget

from gpudeck.jobs.replay import SessionFrame, clock_text, position_bar

KEYS = "space pause · +/- speed · [ ] ∓1 min · n/N event · Esc live"


def bar_parts(frame: SessionFrame, width: int) -> list:
    """The line as (text, style) parts for `width` cells (job text never goes in here unsanitised)."""
    badge = " SIMULATED REPLAY " if frame.simulated else " REPLAY "
    state = "paused" if frame.paused else ("end" if frame.t >= frame.end else "▶")
    speed = f"{frame.speed:g}×"
    where = f"{clock_text(frame.t - frame.start)} / {clock_text(frame.end - frame.start)}"
    head = [(badge, "bold reverse $warning"), " ", (state, "bold"), f" {speed:>3} ", (where, "bold"), "  "]
    used = sum(len(p if isinstance(p, str) else p[0]) for p in head)
    keys = f"  {KEYS}" if width - used >= 40 + len(KEYS) else ""
    bar_width = max(10, width - used - len(keys) - 1)
    return head + [(position_bar(frame, bar_width), "$accent"), (keys, "$text-muted")]


class ReplayBar(Widget):
    """One line under the header while the jobs view replays; hidden otherwise (no room taken)."""

    DEFAULT_CSS = """
    ReplayBar { height: 1; padding: 0 1; display: none; background: $panel; }
    ReplayBar.-shown { display: block; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.frame: Optional[SessionFrame] = None
        self._shown: Optional[tuple] = None

    def show_frame(self, frame: Optional[SessionFrame]) -> None:
        self.frame = frame
        self.set_class(frame is not None, "-shown")
        key = None if frame is None else (round(frame.t), frame.speed, frame.paused, self.size.width)
        if key != self._shown:            # repaint only when what it says changed (once a second at 1x)
            self._shown = key
            self.refresh()

    def render(self) -> Content:
        if self.frame is None:
            return Content("")
        return Content.assemble(*bar_parts(self.frame, max(20, self.content_size.width)))
