"""``?``: every key, and the legend of statuses and coordination outcomes."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import format as fmt
from ..widgets.palette import (
    OUTCOME_COLORS,
    OUTCOME_MEANINGS,
    STATUS_BACKGROUNDS,
    STATUS_COLORS,
    STATUS_MEANINGS,
)

__all__ = ["HelpScreen"]


class HelpScreen(ModalScreen[None]):
    """Keys (as currently bound, so a remapped key shows its new binding) and the legend."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="close_help")]

    def __init__(self, keys: Iterable[tuple[str, str]], read_only_reason: str | None = None) -> None:
        super().__init__()
        self.keys = list(keys)
        """(key as displayed, what it does)."""
        self.read_only_reason = read_only_reason

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "schedtui help"
            box.border_subtitle = "esc closes"
            yield Static(self._body())

    def _body(self) -> Content:
        keys = [Content.from_markup("[b]Keys[/b]")]
        rows = [*self.keys, ("tab", "switch between the schedules and the runs")]
        for key, description in rows:
            keys.append(Content.assemble("  ", (f"{key:>8}", "bold $text-accent"), "  ", description))
        if self.read_only_reason:
            keys.append(
                Content.assemble("  ", ("read-only", "bold $text-warning"), f" {self.read_only_reason}: r, e and b do nothing")
            )
        lines: list[str] = []
        lines.append("")
        lines.append("[b]Run status[/b] [$text-muted](timeline cell · table)[/]")
        for status, meaning in STATUS_MEANINGS.items():
            glyph = fmt.STATUS_GLYPHS[status]
            lines.append(
                f"  [b reverse ${STATUS_BACKGROUNDS[status]}]{glyph}[/] [${STATUS_COLORS[status]}]{glyph} {status:<10}[/]"
                f" [$text-muted]{escape(meaning)}[/]"
            )
        lines.append("")
        lines.append("[b]Coordination outcome[/b]")
        for outcome, meaning in OUTCOME_MEANINGS.items():
            glyph = fmt.OUTCOME_GLYPHS[outcome]
            lines.append(f"    [${OUTCOME_COLORS[outcome]}]{glyph} {outcome:<10}[/] [$text-muted]{escape(meaning)}[/]")
        return Content("\n").join([*keys, Content.from_markup("\n".join(lines))])

    def action_close(self) -> None:
        self.dismiss(None)
