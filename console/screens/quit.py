"""``q`` while a backfill started here is running: ask before leaving it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label

from backend.model import BackfillProgress

__all__ = ["QuitPrompt"]


class QuitPrompt(ModalScreen[str | None]):
    """Dismisses with ``"quit"`` (``q`` or enter), ``"cancel"`` (``c``: stop the backfills,
    recorded ``cancelled``, then quit) or ``None`` (esc: stay)."""

    DEFAULT_CSS = """
    QuitPrompt {
        align: center middle;
    }
    QuitPrompt > Vertical {
        width: 72;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    QuitPrompt .hint {
        color: $text-muted;
        margin-top: 1;
    }
    """

    BINDINGS = [
        Binding("q,enter", "choose('quit')", "Quit", id="quit_anyway"),
        Binding("c", "choose('cancel')", "Stop it and quit", id="quit_cancel_backfills"),
        Binding("escape", "choose(None)", "Stay", id="quit_stay"),
    ]

    def __init__(self, running: list[BackfillProgress], *, embedded: bool) -> None:
        super().__init__()
        self.running = running
        self.embedded = embedded

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Quit?"
            for p in self.running:
                yield Label(Content.assemble(
                    ("A backfill is running: ", "bold"), p.name, f" ({p.fired} of {p.total} fired, {p.failed} failed)."
                ))
            if self.embedded:
                yield Label("Its engine runs in this console: quitting abandons it (the slots not fired yet stay unfired).")
            else:
                yield Label("It runs on the server and goes on without this console.")
            yield Label("q quits · c stops it (recorded cancelled) and quits · esc stays", classes="hint")

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
