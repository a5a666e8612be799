"""The console's questions: the one confirmation before every dangerous action, and the
question ``q`` asks while a backfill started here runs (:mod:`console.screens.quit`).

A confirmation's question and detail are the action's declaration's
(:attr:`backend.client.actions.Action.danger`, rendered with the arguments), so the console
asks what the CLI asks. One convention for every question: ``y`` does it; ``n`` and
``esc`` leave it; ``enter`` leaves it too (a stray enter never does anything dangerous).
Every line is wrapped to the dialog's width: nothing of a warning is ever cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label

from backend.client.actions import action_of

__all__ = ["Confirm", "Question"]

Answer = TypeVar("Answer")


class Question(ModalScreen[Answer]):
    """A question in bold, ``facts`` (lines on the target as the console sees it now: who
    holds the lock, the job's status), a ``detail`` (what doing it does) and the keys
    (:attr:`HINT`), each wrapped to the dialog's width."""

    DEFAULT_CSS = """
    Question {
        align: center middle;
    }
    Question > Vertical {
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        overflow-y: auto;
        background: $surface;
        padding: 0 1;
    }
    Question Label {
        width: 1fr;
    }
    Question #confirm-question {
        text-style: bold;
    }
    Question .hint {
        color: $text-muted;
        margin-top: 1;
    }
    """

    HINT: ClassVar[str] = ""
    """The keys, as the dialog's last line says them."""
    TITLE: ClassVar[str] = "Confirm"

    def __init__(self, question: str, detail: str, *, facts: Sequence[Content | str] = ()) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.facts = list(facts)

    @property
    def text(self) -> str:
        """All it says, as plain text: the question, the facts, the detail."""
        facts = [line.plain if isinstance(line, Content) else line for line in self.facts]
        return "\n".join([self.question, *facts, self.detail])

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.TITLE
            yield Label(Content(self.question), id="confirm-question")
            for line in self.facts:
                yield Label(line if isinstance(line, Content) else Content(line), classes="fact")
            yield Label(Content(self.detail), id="confirm-detail")
            yield Label(Content(self.HINT), classes="hint")


class Confirm(Question[bool]):
    """Dismisses with ``True`` on ``y`` only; ``n``, ``esc`` and ``enter`` dismiss with
    ``False``."""

    DEFAULT_CSS = """
    Confirm > Vertical {
        border: round $error;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm_yes"),
        Binding("n,escape,enter", "answer(False)", "No", id="confirm_no"),
    ]

    HINT = "y: yes, do it · n, esc or enter: no, leave it"

    def __init__(self, question: str, detail: str, *, facts: Sequence[Content | str] = (), action: str | None = None) -> None:
        super().__init__(question, detail, facts=facts)
        self.action = action
        """The declared action it asks for (``None``: a question of the console's own)."""

    @classmethod
    def of(cls, action: str, arguments: Mapping[str, object], *, facts: Sequence[Content | str] = ()) -> Confirm:
        """The question the declaration of ``action`` asks, filled in with ``arguments``."""
        danger = action_of(action).danger
        if danger is None:
            raise ValueError(f"{action} is not declared dangerous: it does not ask")
        question, detail = danger.render(arguments)
        return cls(question, detail, facts=facts, action=action)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
