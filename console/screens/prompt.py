"""A small prompt for the optional note when disabling a schedule."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from backend.inputs import NOTE_MAX_CHARS
from console.widgets.bounded import BoundedInput

__all__ = ["NotePrompt"]


class NotePrompt(ModalScreen[str | None]):
    """Asks why a schedule is being disabled. Enter disables (an empty note is fine);
    Esc cancels. Dismisses with the note (``""`` for none) or ``None`` when cancelled."""

    DEFAULT_CSS = """
    NotePrompt {
        align: center middle;
    }
    NotePrompt > Vertical {
        width: 64;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    NotePrompt .hint {
        color: $text-muted;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_prompt")]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.schedule_name = name
        """The schedule about to be disabled."""

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Disable {self.schedule_name}"
            yield Label("Why? (optional; shown with the schedule)")
            yield BoundedInput(placeholder="e.g. vendor outage, INC-412", id="note", limit=NOTE_MAX_CHARS, unit="characters",
                               what="A note")
            yield Label("enter disables · esc cancels", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
