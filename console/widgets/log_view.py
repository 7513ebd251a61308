"""The log pane: a Line-API view that follows, searches and wraps a log file it never loads whole."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from rich.cells import cell_len
from rich.segment import Segment
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static
from textual.worker import get_current_worker

from gpudeck.jobs.logs.sanitize import sanitize_line

from gpudeck.console.widgets.log_index import IndexState, LogIndex, LogSearch

# Belt and braces after the core sanitiser: nothing below 0x20 ever reaches Rich.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Longest display line kept after decoding: beyond this the view is pointless
# and cell-width arithmetic gets slow.
MAX_DISPLAY_CHARS = 8192


def sanitize_for_display(raw: bytes) -> str:
    """One raw log line as text that cannot move the cursor or inject escapes (tabs expanded)."""
    text = sanitize_line(raw, MAX_DISPLAY_CHARS)
    if "\t" in text:
        text = text.expandtabs(8)
    if _CONTROL.search(text):
        text = _CONTROL.sub("\ufffd", text)
    return text


class LogViewPane(ScrollView, can_focus=True):
    """Scrollable view of one log file: tails it, pauses when scrolled up, searches, wraps."""

    DEFAULT_CSS = """
    LogViewPane {
        background: $surface;
        color: $foreground;
    }
    LogViewPane > .log-view--match {
        background: $warning 50%;
        color: $text;
    }
    LogViewPane > .log-view--current {
        background: $accent 40%;
    }
    LogViewPane > .log-view--omitted {
        color: $text-muted;
        text-style: italic;
    }
    """
    COMPONENT_CLASSES = {"log-view--match", "log-view--current", "log-view--omitted"}

    BINDINGS = [
        Binding("end,G", "follow", "Follow", id="log.follow"),
        Binding("home,g", "top", "Top", show=False, id="log.top"),
        Binding("w", "toggle_wrap", "Wrap", id="log.wrap"),
        Binding("n", "next_match", "Next match", show=False, id="log.next"),
        Binding("N", "previous_match", "Prev match", show=False, id="log.previous"),
    ]

    following: reactive[bool] = reactive(True)
    wrap: reactive[bool] = reactive(False)

    class Grew(Message):
        """The index advanced (coalesced: only the latest one matters)."""

        def __init__(self, state: IndexState) -> None:
            super().__init__()
            self.state = state

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, LogViewPane.Grew)

    class SearchProgressed(Message):
        def can_replace(self, message: Message) -> bool:
            return isinstance(message, LogViewPane.SearchProgressed)

    class StatusChanged(Message):
        """Something the status line shows changed (coalesced)."""

        def __init__(self, pane: "LogViewPane") -> None:
            super().__init__()
            self.pane = pane

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, LogViewPane.StatusChanged)

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        poll_interval: float = 0.1,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.poll_interval = poll_interval
        self.path: Path | None = None
        self.index: LogIndex | None = None
        self._state = IndexState(0, 0, 0, 0)
        self._grew_pending = threading.Event()
        self._wake = threading.Event()           # set_limit() wakes the watcher at once
        self._text_cache: LRUCache[tuple[int, int], tuple[str, int]] = LRUCache(4096)
        self._max_width = 0
        self.search: LogSearch | None = None
        self.current_match: int | None = None
        self._search_running = threading.Event()
        self._wrap_layout_key: tuple | None = None
        self._wrap_rows: list[tuple[int, int]] = []
        self._pending_path = Path(path) if path is not None else None

    # -- opening and watching -------------------------------------------
    def on_mount(self) -> None:
        super().on_mount()          # type: ignore[no-untyped-call]  # Textual's ScrollView.on_mount is unannotated
        if self._pending_path is not None:
            self.open(self._pending_path)

    def set_limit(self, limit: int | None) -> None:
        """Show only the first `limit` bytes of the file (a replay's position); None: all of it."""
        if self.index is None or self.index.limit == limit:
            return
        self.index.limit = limit
        self._wake.set()

    def open(self, path: str | Path, limit: int | None = None) -> None:
        """Show `path` (which may not exist yet), following its end; only its first `limit` bytes if given."""
        # The old index is closed by its own watcher as it exits: closing its fd here,
        # under a read in flight, could let the number be reused by another file.
        self.workers.cancel_group(self, "log-watch")
        self.workers.cancel_group(self, "log-search")
        self.path = Path(path)
        self.index = LogIndex(self.path)
        self.index.limit = limit
        self._state = IndexState(0, 0, 0, 0)
        self._text_cache.clear()
        self._max_width = 0
        self.search = None
        self.current_match = None
        self._grew_pending.clear()
        self.following = True
        self.virtual_size = Size(0, 0)
        self.scroll_to(0, 0, animate=False, force=True)
        self._watch(self.index)
        self.refresh()
        self._status_changed()

    @work(thread=True, exclusive=True, group="log-watch", exit_on_error=False)
    def _watch(self, index: LogIndex) -> None:
        """Index new bytes as they land; post at most one pending Grew at a time."""
        worker = get_current_worker()
        try:
            while not worker.is_cancelled:
                try:
                    changed = index.update()
                except OSError:
                    changed = False         # unreadable for now (NFS hiccup, permissions): retry
                state = index.state()
                if changed and not self._grew_pending.is_set():
                    self._grew_pending.set()
                    self.post_message(self.Grew(state))
                if index.file_size <= state.size or (index.limit is not None and index.limit <= state.size):
                    self._wake.wait(self.poll_interval)
                    self._wake.clear()
        finally:
            index.close()

    def on_unmount(self) -> None:
        self.workers.cancel_group(self, "log-watch")
        self.workers.cancel_group(self, "log-search")

    @on(Grew)
    def _on_grew(self, message: Grew) -> None:
        message.stop()
        self._grew_pending.clear()
        if self.index is None:
            return
        state = self.index.state()  # newer than the message's, if more landed meanwhile
        if state.generation != self._state.generation:
            self._text_cache.clear()
            self._max_width = 0
            self.search = None if self.search is None else LogSearch(self.index, self.search.query)
            self.current_match = None
        self._state = state
        self._set_virtual_size()
        if self.following:
            self._scroll_to_end()
            # Before the first layout the viewport height is unknown: settle again after it.
            self.call_after_refresh(self._keep_following)
        self.refresh()
        if self.search is not None and not self._search_running.is_set():
            self._run_search(self.search)
        self._status_changed()

    # -- geometry and following -------------------------------------------
    @property
    def line_count(self) -> int:
        return self._state.line_count

    def _set_virtual_size(self) -> None:
        self.virtual_size = Size(0 if self.wrap else self._max_width, self._state.line_count)

    def _scroll_to_end(self) -> None:
        self._auto_scrolling = True
        try:
            # force: right after the file grew, the scrollbar (and with it
            # allow_vertical_scroll) is only updated at the next layout.
            self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True, force=True)
        finally:
            self._auto_scrolling = False

    _auto_scrolling = False

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._auto_scrolling:
            return
        # At the bottom means following; anywhere above means paused.
        at_bottom = round(new_value) >= self.max_scroll_y
        if at_bottom != self.following:
            self.following = at_bottom

    def watch_following(self, following: bool) -> None:
        self._wrap_layout_key = None
        if following and self.is_mounted:
            self._scroll_to_end()
            self.refresh()
        self._status_changed()

    def watch_wrap(self, wrap: bool) -> None:
        self._wrap_layout_key = None
        self._set_virtual_size()
        if wrap:
            self.scroll_to(x=0, animate=False, immediate=True)
        self.refresh()
        self._status_changed()

    def on_resize(self) -> None:
        self._wrap_layout_key = None
        if self.following:
            self.call_after_refresh(self._keep_following)

    def _keep_following(self) -> None:
        # Deferred: the operator may have scrolled away (or jumped to a match) meanwhile.
        if self.following:
            self._scroll_to_end()

    # -- actions -----------------------------------------------------------
    def action_follow(self) -> None:
        self.following = True
        self._scroll_to_end()

    def action_top(self) -> None:
        self.scroll_to(y=0, animate=False, immediate=True, force=True)
        if self.max_scroll_y > 0:
            self.following = False

    def action_toggle_wrap(self) -> None:
        self.wrap = not self.wrap

    def action_next_match(self) -> None:
        self._jump_match(forward=True)

    def action_previous_match(self) -> None:
        self._jump_match(forward=False)

    def _jump_match(self, forward: bool) -> None:
        if self.search is None:
            return
        anchor = self.current_match
        if anchor is None:
            anchor = int(self.scroll_y) - 1 if forward else int(self.scroll_y) + self.size.height
        line = self.search.next_line(anchor) if forward else self.search.previous_line(anchor)
        if line is None:
            # The query is typed by the operator, often pasted from a log: shown as written, never markup.
            self.notify(f"No match for {self.search.query!r} yet", severity="warning", markup=False)
            return
        self.show_line(line)

    def show_line(self, line: int) -> None:
        """Scroll so that `line` is visible near the middle and mark it current."""
        self.current_match = line
        self.following = False
        target = max(0, line - self.size.height // 2)
        self.scroll_to(y=min(target, self.max_scroll_y), animate=False, immediate=True, force=True)
        # scrolling to the very bottom would resume following; the match stays marked
        self._wrap_layout_key = None
        self.refresh()
        self._status_changed()

    # -- search --------------------------------------------------------------
    def start_search(self, query: str) -> None:
        """Search for `query` (case-insensitive) from the top; jump to the first match
        at or below the current view once it is found."""
        if self.search is not None:
            self.search.cancelled = True
        self.current_match = None
        if not query or self.index is None:
            self.search = None
            self.refresh()
            self._status_changed()
            return
        self.search = LogSearch(self.index, query)
        self._jump_when_found = int(self.scroll_y)
        self._run_search(self.search)
        self.refresh()
        self._status_changed()

    _jump_when_found: int | None = None

    @work(thread=True, exclusive=True, group="log-search", exit_on_error=False)
    def _run_search(self, search: LogSearch) -> None:
        self._search_running.set()
        try:
            worker = get_current_worker()
            step = 64 * 1024 * 1024
            while not worker.is_cancelled and not search.cancelled:
                size = search.index.state().size
                if search.scanned >= size:
                    break
                before = search.scanned
                if not search.scan(until=min(size, search.scanned + step)):
                    break
                self.post_message(self.SearchProgressed())
                if search.scanned == before:
                    break
        finally:
            self._search_running.clear()
            self.post_message(self.SearchProgressed())

    @on(SearchProgressed)
    def _on_search_progressed(self, message: SearchProgressed) -> None:
        message.stop()
        search = self.search
        if search is None:
            return
        if self._jump_when_found is not None and search.lines:
            line = search.next_line(self._jump_when_found - 1)
            if line is not None and (line >= self._jump_when_found or not self._search_running.is_set()):
                self._jump_when_found = None
                self.show_line(line)
        self.refresh()
        self._status_changed()

    def match_position(self) -> tuple[int | None, int]:
        """(1-based position of the current match or None, total matching lines)."""
        if self.search is None:
            return None, 0
        position = None if self.current_match is None else self.search.position_of(self.current_match)
        return position, self.search.count

    # -- status --------------------------------------------------------------
    def _status_changed(self) -> None:
        if self.is_attached:
            self.post_message(self.StatusChanged(self))

    def status_text(self) -> str:
        if self.path is None:
            return "no log"
        state = self._state
        parts = [f"{state.line_count:,} lines"]
        size_on_disk = self.index.file_size if self.index else 0
        if self.index is not None and self.index.limit is not None:
            size_on_disk = min(size_on_disk, self.index.limit)
        if self.index is not None and size_on_disk > state.size and size_on_disk:
            parts.append(f"indexing {100 * state.size // size_on_disk}%")
        parts.append("FOLLOWING" if self.following else "PAUSED (End/G follows)")
        if self.wrap:
            parts.append("wrap")
        if self.search is not None:
            position, total = self.match_position()
            searching = "…" if self._search_running.is_set() else ""
            at = f"{position}/" if position else ""
            parts.append(f"/{self.search.query}: {at}{total:,}{searching} matches")
        return " · ".join(parts)

    # -- rendering -----------------------------------------------------------
    def line_text(self, line: int) -> tuple[str, int]:
        """Sanitised text of a line and the bytes left out of it (cached when complete)."""
        index = self.index
        if index is None or not 0 <= line < self._state.line_count:
            return "", 0
        key = (self._state.generation, line)
        cached = self._text_cache.get(key)
        if cached is not None:
            return cached
        try:
            raw, omitted = index.read_line(line)
        except (IndexError, OSError, ValueError):
            return "", 0
        result = (sanitize_for_display(raw), omitted)
        if line < self._state.newlines:      # a line still being written may change
            self._text_cache[key] = result
        return result

    def _line_strip(self, line: int) -> Strip:
        text, omitted = self.line_text(line)
        base = self.rich_style
        style = base
        if line == self.current_match:
            style = base + self.get_component_rich_style("log-view--current", partial=True)
        segments: list[Segment] = []
        search = self.search
        if search is not None and search.query and text:
            needle = search.query.lower()
            lowered = text.lower()
            match_style = style + self.get_component_rich_style("log-view--match", partial=True)
            start = 0
            at = lowered.find(needle) if len(lowered) == len(text) else -1
            while at >= 0:
                if at > start:
                    segments.append(Segment(text[start:at], style))
                segments.append(Segment(text[at:at + len(needle)], match_style))
                start = at + len(needle)
                at = lowered.find(needle, start)
            if start < len(text):
                segments.append(Segment(text[start:], style))
        elif text:
            segments.append(Segment(text, style))
        if omitted:
            omitted_style = base + self.get_component_rich_style("log-view--omitted", partial=True)
            segments.append(Segment(f" … [{omitted:,} more bytes]", omitted_style))
        width = sum(cell_len(s.text) for s in segments)
        if width > self._max_width and not self.wrap:
            self._max_width = width
            self.call_later(self._set_virtual_size)
        return Strip(segments, width)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.rich_style
        if self.wrap:
            return self._render_wrapped_row(y, width)
        if self.following:
            # Following shows the tail whatever scroll_y says: the scroll position is
            # synced after layout, and a frame drawn before that must not show stale rows.
            scroll_y = max(0, self._state.line_count - self.scrollable_content_region.height)
        line = scroll_y + y
        if line >= self._state.line_count:
            return Strip.blank(width, base)
        strip = self._line_strip(line)
        return strip.crop_extend(scroll_x, scroll_x + width, base).apply_offsets(scroll_x, line)

    def _render_wrapped_row(self, y: int, width: int) -> Strip:
        rows = self._wrap_layout(width, self.size.height)
        base = self.rich_style
        if y >= len(rows):
            return Strip.blank(width, base)
        line, piece = rows[y]
        strip = self._line_strip(line)
        if width <= 0:
            return Strip.blank(width, base)
        length = strip.cell_length
        pieces = strip.divide([*range(width, length, width), length]) if length else [strip]
        chunk = pieces[piece] if piece < len(pieces) else Strip.blank(0)
        return chunk.crop_extend(0, width, base)

    def _wrap_layout(self, width: int, height: int) -> list[tuple[int, int]]:
        """(line, piece) for each visible row; only the visible region is wrapped."""
        count = self._state.line_count
        key = (self._state.generation, int(self.scroll_y), width, height, count, self.following,
               self.current_match, self.search.query if self.search else None)
        if key == self._wrap_layout_key:
            return self._wrap_rows
        width = max(1, width)

        def pieces_of(line: int) -> int:
            text, omitted = self.line_text(line)
            cells = cell_len(text) + (len(f" … [{omitted:,} more bytes]") if omitted else 0)
            return max(1, -(-cells // width))

        rows: list[tuple[int, int]] = []
        if self.following and count:
            # Bottom-anchored: the last line's last piece sits on the last row.
            line = count - 1
            while line >= 0 and len(rows) < height:
                n = pieces_of(line)
                rows[0:0] = [(line, p) for p in range(n)]
                line -= 1
            rows = rows[-height:]
        else:
            line = int(self.scroll_y)
            while line < count and len(rows) < height:
                rows.extend((line, p) for p in range(pieces_of(line)))
                line += 1
            rows = rows[:height]
        self._wrap_layout_key = key
        self._wrap_rows = rows
        return rows

    def visible_text(self) -> list[str]:
        """The rows as rendered now, as plain text (for tests and benchmarks)."""
        return [self.render_line(y).text for y in range(self.size.height)]


class LogView(Vertical):
    """A log pane with its status line and a `/` search box."""

    DEFAULT_CSS = """
    LogView { height: 1fr; }
    LogView > #log-status { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    LogView > LogViewPane { height: 1fr; }
    LogView > Input { dock: bottom; display: none; }
    LogView > Input.-searching { display: block; }
    """

    BINDINGS = [Binding("slash", "search", "Search", id="log.search")]

    def __init__(self, path: str | Path | None = None, *, title: str = "", id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._path = path
        self.title = title

    def compose(self) -> ComposeResult:
        yield Static("", id="log-status", markup=False)
        yield LogViewPane(self._path, id="log-pane")
        yield Input(placeholder="search (Enter to find, Esc to cancel)", id="log-search")

    @property
    def pane(self) -> LogViewPane:
        return self.query_one(LogViewPane)

    def open(self, path: str | Path, title: str = "", limit: int | None = None) -> None:
        self.title = title
        self.pane.open(path, limit=limit)

    def action_search(self) -> None:
        box = self.query_one(Input)
        box.add_class("-searching")
        box.value = self.pane.search.query if self.pane.search else ""
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        event.input.remove_class("-searching")
        self.pane.focus()
        self.pane.start_search(event.value)

    def on_key(self, event: events.Key) -> None:
        box = self.query_one(Input)
        if event.key == "escape" and box.has_focus:
            event.stop()
            event.prevent_default()
            box.remove_class("-searching")
            self.pane.focus()

    @on(LogViewPane.StatusChanged)
    def _status(self, message: LogViewPane.StatusChanged) -> None:
        message.stop()
        prefix = f"{self.title} · " if self.title else ""
        self.query_one("#log-status", Static).update(prefix + message.pane.status_text())
