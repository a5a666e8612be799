"""A yes/no question before an action that cannot be undone (``x`` on a lock)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label

__all__ = ["Confirm"]


class Confirm(ModalScreen[bool]):
    """Dismisses with ``True`` on ``y`` only; ``n``, ``esc`` and ``enter`` say no (the
    harmless answer is the easy one)."""

    DEFAULT_CSS = """
    Confirm {
        align: center middle;
    }
    Confirm > Vertical {
        width: 72;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    Confirm .hint {
        color: $text-muted;
        margin-top: 1;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm_yes"),
        Binding("n,escape,enter", "answer(False)", "No", id="confirm_no"),
    ]

    def __init__(self, title: str, lines: list[Content | str], yes: str) -> None:
        super().__init__()
        self.title_text = title
        self.lines = lines
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.title_text
            for line in self.lines:
                yield Label(line)
            yield Label(f"y {self.yes} · n or esc: leave it", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
