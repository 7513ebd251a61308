"""The box switcher: `b` picks a box from a list (local and every hosts.toml host, with its link state);
`:` takes a command line, `box NAME` as k9s takes `:ctx NAME`."""
from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from gpudeck.console.format import safe_text

LINK_STYLES = {"LIVE": "$success", "STALE": "$warning", "DOWN": "$error", "CONNECTING": "$warning"}


class BoxPickerScreen(ModalScreen[Optional[str]]):
    """One row per box: name, how it is reached, its link state. Enter shows it; Esc (or b) leaves."""

    DEFAULT_CSS = """
    BoxPickerScreen { align: center middle; }
    BoxPickerScreen > Vertical { width: 72; max-width: 95%; height: auto; max-height: 80%;
                                 border: thick $primary; background: $surface; padding: 0 1; }
    BoxPickerScreen #box-picker-title { text-style: bold; color: $primary; }
    BoxPickerScreen #box-picker-hint { color: $text-muted; }
    BoxPickerScreen OptionList { height: auto; max-height: 20; border: none; }
    """

    BINDINGS = [
        Binding("escape,b", "leave", "Close", id="box-picker.close"),
    ]

    def __init__(self, rows: list[tuple[str, Optional[str], str]], current: str) -> None:
        """`rows`: (name, ssh target or None for this machine, link state)."""
        super().__init__()
        self.rows = rows
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Show which box?", id="box-picker-title", markup=False)
            options = []
            for name, ssh, state in self.rows:
                label = Text()
                label.append("● " if name == self.current else "  ", style="bold")
                label.append(f"{safe_text(name, 30):<18}", style="bold" if name == self.current else "")
                label.append(f" {safe_text(ssh or 'this machine', 28):<28} ", style="dim")
                label.append(safe_text(state, 16))
                options.append(Option(label, id=name))
            yield OptionList(*options, id="box-picker-list")
            yield Static("Enter shows it · Esc closes · the hosts view (4) shows every box at once",
                         id="box-picker-hint", markup=False)

    def on_mount(self) -> None:
        names = [name for name, _, _ in self.rows]
        option_list = self.query_one(OptionList)
        if self.current in names:
            option_list.highlighted = names.index(self.current)
        option_list.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_leave(self) -> None:
        self.dismiss(None)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.rows]


class PromptScreen(ModalScreen[Optional[str]]):
    """A one-line command at the bottom: Enter runs it, Esc forgets it."""

    DEFAULT_CSS = """
    PromptScreen { align: left bottom; background: $background 0%; }
    PromptScreen > Input { width: 100%; border: tall $accent; }
    """

    BINDINGS = [
        Binding("escape", "leave", "Cancel", id="prompt.cancel"),
    ]

    def compose(self) -> ComposeResult:
        yield Input(placeholder="box NAME · dashboard · jobs · history · hosts", id="prompt-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_leave(self) -> None:
        self.dismiss(None)
