"""Small Textual apps the console tests mount one widget in."""
from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from gpudeck.console.widgets.log_view import LogView, LogViewPane


class LogApp(App):
    """One LogView over `path`, its pane focused (keys go to it)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        yield LogView(self.path)

    def on_mount(self) -> None:
        self.query_one(LogViewPane).focus()
