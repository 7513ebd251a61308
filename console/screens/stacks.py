"""The grouped stack dump of one job (key `D` in the jobs view): taken off the UI thread, shown markup-inert."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static

from gpudeck.jobs.logs.sanitize import sanitize_text

# A dump of 64 processes can be long; the pane scrolls, but never holds more than this.
MAX_LINES = 2000


class StacksDumped(Message):
    """The worker finished: `lines` to show (a dump, or the one line why there is none), `verdict` if any."""

    def __init__(self, job: str, lines: list[str], verdict: Optional[str], ok: bool) -> None:
        super().__init__()
        self.job = job
        self.lines = lines
        self.verdict = verdict
        self.ok = ok


class StacksScreen(ModalScreen[None]):
    """Says "dumping…" at once, then the grouped dump; Esc or q closes. `dump()` runs in a worker thread."""

    DEFAULT_CSS = """
    StacksScreen { align: center middle; }
    StacksScreen > Vertical {
        width: 90%; height: 85%; border: thick $primary; background: $surface; padding: 0 1;
    }
    StacksScreen #stacks-title { text-style: bold; color: $primary; }
    StacksScreen #stacks-verdict { color: $warning; text-style: bold; margin-bottom: 1; }
    StacksScreen #stacks-body { width: auto; }
    """

    BINDINGS = [
        Binding("escape,q", "close", "Close", id="stacks.close"),
    ]

    def __init__(self, job: str, dump: Callable[[], Any], *, recorded: bool = False) -> None:
        super().__init__()
        self.job = job
        self._dump = dump
        self.recorded = recorded                # `dump()` reads a stored dump (a replay): nothing is traced
        self.lines: list[str] = []
        self.verdict: Optional[str] = None
        self.done = False

    def compose(self) -> ComposeResult:
        with Vertical():
            title = f"stacks: {self.job}" + (" · recorded dump of the replayed run" if self.recorded else "")
            yield Static(sanitize_text(title), id="stacks-title", markup=False)
            yield Static("reading the recorded dump…" if self.recorded else "dumping the Python stacks (py-spy)…",
                         id="stacks-verdict", markup=False)
            with VerticalScroll(id="stacks-scroll"):
                yield Static("", id="stacks-body", markup=False)

    def on_mount(self) -> None:
        self._take()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _take(self) -> None:
        from gpudeck.jobs.stacks import StoredDump, render_lines
        try:
            result = self._dump()
        except Exception as exc:            # no py-spy, no ptrace, not running, a pruned file: one line
            self.post_message(StacksDumped(self.job, [str(exc)], None, False))
            return
        if isinstance(result, StoredDump):
            lines = list(result.lines)
            if lines and lines[0].startswith("verdict: "):
                lines = lines[1:]
            if result.taken_at is not None:
                when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(result.taken_at))
                lines.insert(0, f"recorded at {when}{' (SIMULATED)' if result.simulated else ''}")
            self.post_message(StacksDumped(self.job, lines, result.verdict, True))
            return
        self.post_message(StacksDumped(self.job, render_lines(result)[1:], result.verdict, True))

    @on(StacksDumped)
    def _dumped(self, message: StacksDumped) -> None:
        # Frames, thread names and commands come from the job: the core's sanitizer, then markup-inert Statics.
        self.lines = [sanitize_text(line) for line in message.lines[:MAX_LINES]]
        self.verdict = sanitize_text(message.verdict) if message.verdict else None
        self.done = True
        head = f"verdict: {self.verdict}" if self.verdict else (self.lines[0] if self.lines else "no dump")
        self.query_one("#stacks-verdict", Static).update(head)
        self.query_one("#stacks-body", Static).update("\n".join(self.lines if self.verdict else self.lines[1:]))

    def action_close(self) -> None:
        self.dismiss(None)

    @property
    def text(self) -> str:
        """Everything shown, as plain text (tests read it)."""
        head = f"verdict: {self.verdict}" if self.verdict else ""
        return "\n".join([head, *self.lines])
