"""The one-line header: which box, how many GPUs, SIMULATED when it is, and whether the data is live or a replay."""
from __future__ import annotations

import time
from typing import Any, Optional

from textual.strip import Strip
from textual.widget import Widget

from gpudeck.console.feeds import Feed, FollowsTelemetry
from gpudeck.console.format import safe_text
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.strip_painter import PaintedLines, Part, content_width


def clock_text(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def minute_text(t: float) -> str:
    """The live clock: to the minute, so the header repaints once a minute, not every tick (a repaint
    of the top line widened each tick's screen update to the whole dashboard)."""
    return time.strftime("%H:%M", time.localtime(t))


def link_word(error: Optional[str], box: str) -> Optional[str]:
    """CONNECTING / STALE / DOWN when `error` is a remote box's link problem ("NAME: DOWN — why")."""
    if not error or not error.startswith(f"{box}: "):
        return None
    word = error[len(box) + 2:].split(" ", 1)[0]
    return word if word in ("CONNECTING", "STALE", "DOWN") else None


class BoxHeaderPanel(FollowsTelemetry, PaintedLines, Widget):
    DEFAULT_CSS = """
    BoxHeaderPanel {
        dock: top;
        height: 1;
        background: $panel;
        color: $foreground;
    }
    """

    def __init__(self, view_title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.view_title = view_title
        self.view: Optional[TelemetryView] = None
        self._shown: object = None
        self.replay_at: Optional[float] = None      # the replayed instant the view below shows; None: live
        self.box_name: Optional[str] = None         # a remote box shown (None: this machine)

    def on_mount(self) -> None:
        feed = getattr(self.app, "box_feed", None)
        if isinstance(feed, Feed):
            feed.follow(self, self.apply_box)

    def apply_box(self, box: Any) -> None:
        """The console shows another box: say which (this machine says nothing, as before)."""
        name = None if getattr(box, "local", True) else str(getattr(box, "name", "?"))
        if name != self.box_name:
            self.box_name = name
            self._shown = None
            self.refresh()

    def show_replay(self, at: Optional[float]) -> None:
        """The view below shows recorded runs at `at` (None: back to live): the header must not say "live"."""
        at = None if at is None else float(int(at))          # to the second, as the header prints it
        if at != self.replay_at:
            self.replay_at = at
            self.refresh()

    def apply_telemetry(self, view: TelemetryView) -> None:
        snap = view.snapshot
        live = not (view.stale or view.paused)
        key = (
            view.stale, view.error, view.paused, view.refresh_s,
            None if snap is None else (minute_text(snap.time) if live else snap.time, snap.host.name,
                                       len(snap.gpus), snap.simulated, snap.gpu_error),
        )
        if key != self._shown:
            self._shown = key
            self.view = view
            self.refresh()

    def render_line(self, y: int) -> Strip:
        self._painter.ensure()
        if y > 0:
            return self._painter.blank(content_width(self))
        return self._painter.strip(self.parts(), content_width(self))

    def parts(self) -> list[Part]:
        parts: list[Part] = [(" gpudeck ", "bold $primary"), (f"{self.view_title} ", "$text-muted")]
        view = self.view
        snap = view.snapshot if view else None
        link = None
        if self.box_name is not None:
            parts.append(("· box ", "$text-muted"))
            parts.append((f"{safe_text(self.box_name, 40)} ", "bold $accent"))
            link = link_word(view.error if view else None, self.box_name)
        error = view.error if view else None
        if link is not None and error and self.box_name is not None:
            # "NAME: DOWN — why": the badge says the state and the box is named already; the why follows.
            error = error[len(self.box_name) + 2 + len(link):].lstrip(" —") or error
        if snap is not None:
            parts.append(f"· {safe_text(snap.host.name, 40)} · ")
            parts.append(f"{len(snap.gpus)} GPUs " if snap.gpus else ("no GPU ", "$warning"))
            if snap.simulated:
                parts.append((" SIMULATED ", "bold reverse $warning"))
                parts.append(" ")
        if view is None or (snap is None and not view.error):
            parts.append(("waiting for the first sample…", "$text-muted"))
        elif snap is None and link == "CONNECTING":
            parts.append((f"connecting to {safe_text(self.box_name or '?', 40)}…", "$text-muted"))
        elif snap is None:
            parts.append((f" {link or 'UNAVAILABLE'} ", "bold reverse $error"))
            parts.append((f" {safe_text(error, 120)}", "$error"))
        elif view.stale:
            since = f" since {clock_text(snap.time)}" if snap else ""
            parts.append((f" {link if link in ('DOWN', 'STALE') else 'STALE'}{since} ", "bold reverse $error"))
            parts.append((f" {safe_text(error, 120)}", "$error"))
        elif self.replay_at is not None:
            parts.append((" REPLAY ", "bold reverse $accent"))
            parts.append(f" at {clock_text(self.replay_at)}")
        elif view.paused:
            parts.append((" PAUSED ", "bold reverse $accent"))
            parts.append(f" at {clock_text(snap.time)}" if snap else "")
        else:
            parts.append((f"live · every {view.refresh_s:g}s · {minute_text(snap.time)}", "$text-muted"))
        return parts
