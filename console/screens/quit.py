"""``q`` while a backfill started here is running: ask before leaving it (the console's one
convention: ``y`` quits; ``n``, ``esc`` and ``enter`` stay). What it says of the backfills
follows them while it is open (:meth:`QuitPrompt.show`, called by the app as their progress
comes): a count read when ``q`` was pressed went stale, and a backfill that ended meanwhile
was still said to run."""

from __future__ import annotations

from collections.abc import Sequence

from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Label

from backend.model import BackfillProgress
from console.screens.confirm import Question

__all__ = ["QuitPrompt"]


def _words(running: Sequence[BackfillProgress], embedded: bool) -> tuple[str, str, list[str]]:
    """(question, detail, facts) for the backfills started here that run now."""
    if not running:
        return ("Quit? The backfill started here has ended meanwhile.",
                "Nothing started here runs any more: quitting abandons nothing.", [])  # fmt: skip
    many = len(running) > 1
    if embedded:
        detail = (f"{'Their engine runs' if many else 'Its engine runs'} in this console: quitting abandons "
                  f"{'them' if many else 'it'} (the slots not fired yet stay unfired).")
    else:
        detail = f"{'They run' if many else 'It runs'} on the server and {'go' if many else 'goes'} on without this console."
    facts = [f"A backfill is running: {p.name} ({p.fired} of {p.total} fired, {p.failed} failed)." for p in running]
    return "Quit while a backfill started here runs?", detail, facts


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
        question, detail, facts = _words(running, embedded)
        super().__init__(question, detail, facts=facts)
        self.running = running
        self.embedded = embedded

    def show(self, running: list[BackfillProgress]) -> None:
        """Say the backfills started here as they are now (their counts, or that they ended)."""
        self.running = list(running)
        self.question, self.detail, facts = _words(self.running, self.embedded)
        self.facts = list(facts)
        if not self.is_mounted:
            return
        self.query_one("#confirm-question", Label).update(Content(self.question))
        self.query_one("#confirm-detail", Label).update(Content(self.detail))
        labels = list(self.query(".fact").results(Label))
        if len(labels) == len(facts):
            for label, fact in zip(labels, facts, strict=True):
                label.update(Content(fact))
            return
        for label in labels:
            label.remove()
        if facts:
            self.query_one(Vertical).mount_all([Label(Content(fact), classes="fact") for fact in facts],
                                               before="#confirm-detail")

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)

    def action_ask_again(self) -> None:
        """``q`` again: not an answer (and no second question on top of this one)."""
