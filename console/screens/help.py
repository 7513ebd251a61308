"""The `?` help screen: every key the view underneath answers to, and what the colours mean."""
from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

LEGEND = (
    "Colours: green = fine, amber = worth a look, red = act now (memory > 95%, temperature > 88°C,\n"
    "power at its limit, throttling). STALE in red = the last sample failed; values are old.\n"
    "SIMULATED = the data comes from the demo box, not from real hardware.\n"
    "Mouse: click footer keys, scroll panels, click table rows. Ctrl+P opens the command palette."
)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: auto;
        max-width: 100;
        height: auto;
        max-height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    HelpScreen #help-keys { width: auto; }
    HelpScreen #help-legend { width: auto; margin-top: 1; color: $text-muted; }
    """

    BINDINGS = [
        Binding("escape", "dismiss", "Close", id="help.close"),
        Binding("question_mark", "dismiss", "Close", show=False, id="help.close-alt"),
    ]

    def __init__(self, keys: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keys = keys

    def compose(self) -> ComposeResult:
        width = max((len(k) for k, _ in self.keys), default=4)
        lines = [Content.styled("gpudeck keys", "bold $primary")]
        for key, description in self.keys:
            lines.append(Content.assemble((key.ljust(width), "bold $accent"), "  ", description))
        with VerticalScroll():
            yield Static(Content("\n").join(lines), id="help-keys")
            yield Static(LEGEND, id="help-legend", markup=False)
