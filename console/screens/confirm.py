"""A yes/no confirmation for actions that destroy work: says exactly what will happen, defaults to no."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only on `y` or the confirm button; `n`, Esc and the other button say no."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: auto; min-width: 40; max-width: 100; height: auto; max-height: 90%;
        border: thick $error; background: $surface; padding: 1 2;
    }
    ConfirmScreen #confirm-title { text-style: bold; color: $error; margin-bottom: 1; }
    ConfirmScreen #confirm-body { margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, title: str, lines: list[str], confirm_label: str = "Yes") -> None:
        super().__init__()
        self.title_text = title
        self.lines = lines
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="confirm-title", markup=False)
            yield Static("\n".join(self.lines), id="confirm-body", markup=False)
            with Horizontal():
                yield Button("No (n)", id="confirm-no", variant="default")
                yield Button(f"{self.confirm_label} (y)", id="confirm-yes", variant="error")

    def on_mount(self) -> None:
        # Focus on "No": an Enter typed out of habit must not destroy work.
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @property
    def text(self) -> str:
        """Everything the operator is asked, as plain text (tests read it)."""
        return "\n".join([self.title_text, *self.lines])
