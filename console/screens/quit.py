"""``q`` while a backfill started here is running: ask before leaving it (the console's one
convention: ``y`` quits; ``n``, ``esc`` and ``enter`` stay)."""

from __future__ import annotations

from textual.binding import Binding

from backend.model import BackfillProgress
from console.screens.confirm import Question

__all__ = ["QuitPrompt"]


class QuitPrompt(Question[str | None]):
    """Dismisses with ``"quit"`` (``y``), ``"cancel"`` (``c``: stop the backfills, recorded
    ``cancelled``, then quit) or ``None`` (``n``, ``esc`` or ``enter``: stay). ``q`` again
    asks nothing more: the question stays until answered."""

    DEFAULT_CSS = """
    QuitPrompt > Vertical {
        border: round $warning;
    }
    """

    BINDINGS = [
        Binding("y", "choose('quit')", "Quit", id="quit_anyway"),
        Binding("c", "choose('cancel')", "Stop it and quit", id="quit_cancel_backfills"),
        Binding("n,escape,enter", "choose(None)", "Stay", id="quit_stay"),
        Binding("q", "ask_again", show=False, id="quit_again"),
    ]

    HINT = "y: yes, quit · c: stop it (recorded cancelled), then quit · n, esc or enter: no, stay"
    TITLE = "Quit?"

    def __init__(self, running: list[BackfillProgress], *, embedded: bool) -> None:
        many = len(running) > 1
        if embedded:
            detail = (f"{'Their engine runs' if many else 'Its engine runs'} in this console: quitting abandons "
                      f"{'them' if many else 'it'} (the slots not fired yet stay unfired).")
        else:
            detail = f"{'They run' if many else 'It runs'} on the server and {'go' if many else 'goes'} on without this console."
        facts = [f"A backfill is running: {p.name} ({p.fired} of {p.total} fired, {p.failed} failed)." for p in running]
        super().__init__("Quit while a backfill started here runs?", detail, facts=facts)
        self.running = running
        self.embedded = embedded

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)

    def action_ask_again(self) -> None:
        """``q`` again: not an answer (and no second question on top of this one)."""
