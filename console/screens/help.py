"""``?``: every key (as bound now), and the legend of statuses, outcomes and timeline marks."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label

from console import format as fmt
from console.widgets.palette import (
    KIND_GLYPHS,
    KIND_MEANINGS,
    OUTCOME_COLORS,
    OUTCOME_MEANINGS,
    STATUS_COLORS,
    STATUS_MEANINGS,
)
from console.widgets.schedules import STORED_MARK
from console.widgets.timeline import MARKS

__all__ = ["HelpScreen"]

KeySections = list[tuple[str, list[tuple[str, str]]]]


class HelpScreen(ModalScreen[None]):
    """Keys in sections (a remapped key shows its new binding), then the legend. It scrolls
    (↑ ↓, pgup pgdn, home end); the border says so when it does not fit."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 90;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
        scrollbar-size-vertical: 1;
    }
    HelpScreen .help-key {
        height: auto;
    }
    HelpScreen .help-key > .key {
        padding: 0 2;
        text-align: right;
        text-style: bold;
        color: $text-accent;
    }
    HelpScreen .help-key > .what {
        width: 1fr;
    }
    HelpScreen VerticalScroll > Label {
        width: 1fr;
    }
    HelpScreen .legend {
        padding-left: 2;
    }
    """

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close", id="close_help"),
        Binding("home", "scroll('home')", "Top", show=False),
        Binding("end", "scroll('end')", "Bottom", show=False),
    ]

    def __init__(self, sections: KeySections, read_only_note: str | None = None) -> None:
        super().__init__()
        self.sections = sections
        """(title, [(key as displayed, what it does)])."""
        self.read_only_note = read_only_note
        """Why the console is read-only and which keys therefore do nothing (``None``: it is not)."""

    @property
    def keys(self) -> list[tuple[str, str]]:
        """Every (key, description), all sections."""
        return [item for _, items in self.sections for item in items]

    @property
    def text(self) -> str:
        """All it says, as plain text, a key and what it does on one line."""
        return "\n".join(line.plain for line in self._lines())

    def compose(self) -> ComposeResult:
        # A key's description wraps under itself, not to the left edge (at 80 columns it did):
        # each key is a row of two labels, the key's as wide as the widest key.
        width = max((cell_len(key) for key, _ in self.keys), default=9) + 4
        with VerticalScroll() as box:
            box.border_title = "schedtui help"
            box.border_subtitle = "esc closes"
            for title, items in self.sections:
                yield Label(Content.from_markup(f"[b]{title}[/b]"))
                for key, description in items:
                    with Horizontal(classes="help-key"):
                        yield Label(Content(key), classes="key").set_styles(width=width)
                        yield Label(Content(description), classes="what")
                yield Label()
            if self.read_only_note:
                with Horizontal(classes="help-key"):
                    yield Label(Content.styled("read-only", "$text-warning"), classes="key").set_styles(width=width)
                    yield Label(Content(self.read_only_note), classes="what")
                yield Label()
            for line in self._legend():
                indented = line.plain.startswith("  ")
                yield Label(line[2:] if indented else line, classes="legend" if indented else "")

    def on_mount(self) -> None:
        self.call_after_refresh(self._scroll_hint)

    def on_resize(self) -> None:
        self.call_after_refresh(self._scroll_hint)

    def _scroll_hint(self) -> None:
        box = self.query_one(VerticalScroll)
        box.border_subtitle = "↑↓ pgup pgdn scroll · esc closes" if box.max_scroll_y > 0 else "esc closes"

    def action_scroll(self, where: str) -> None:
        box = self.query_one(VerticalScroll)
        if where == "home":
            box.scroll_home(animate=False)
        else:
            box.scroll_end(animate=False)

    def _lines(self) -> list[Content]:
        """Every line, as plain as the tests and a reader of :attr:`text` want them."""
        out: list[Content] = []
        for title, items in self.sections:
            out.append(Content(title))
            out.extend(Content(f"  {key:>9}  {description}") for key, description in items)
            out.append(Content(""))
        if self.read_only_note:
            out.extend([Content(f"  read-only {self.read_only_note}"), Content("")])
        return out + self._legend()

    def _legend(self) -> list[Content]:
        """The legend of statuses, outcomes and timeline marks, a line each."""
        lines: list[str] = ["[b]Run status[/b] [$text-muted](tables, strip and timeline; a failure is also reversed)[/]"]
        for status, meaning in STATUS_MEANINGS.items():
            glyph = fmt.STATUS_GLYPHS[status]
            style = f"b reverse ${STATUS_COLORS[status]}" if status == "failed" else f"${STATUS_COLORS[status]}"
            lines.append(f"  [{style}]{glyph} {status:<10}[/] [$text-muted]{meaning}[/]")
        lines.append("")
        lines.append("[b]Coordination outcome[/b]")
        for outcome, meaning in OUTCOME_MEANINGS.items():
            glyph = fmt.OUTCOME_GLYPHS[outcome]
            lines.append(f"  [${OUTCOME_COLORS[outcome]}]{glyph} {outcome:<10}[/] [$text-muted]{meaning}[/]")
        lines.append(f"  [$text-muted]LAST RUN is the newest self/external slot; [/]{fmt.OUTCOME_GLYPHS['manual']}"
                     "[$text-muted] after it: a newer manual run (Run now or backfill)[/]")
        lines.append("")
        lines.append("[b]Timeline[/b] [$text-muted](one cell per time step; where runs share a cell, the worst shows)[/]")
        lines.append("  [$text-muted]a run that ran shows who fired it, coloured by how it ended:[/]")
        for kind, meaning in KIND_MEANINGS.items():
            glyph = KIND_GLYPHS[kind]
            lines.append(
                f"  [$text-success]{glyph}[/] [b reverse $text-error]{glyph}[/] "
                f"[$text-muted]{kind:<9}[/] {meaning} [$text-muted](succeeded · failed)[/]"
            )
        lines.append("  [$text-muted]a run that did not run, or runs now, shows its status:[/] "
                     f"[$text-warning]{fmt.STATUS_GLYPHS['skipped']}[/] skipped  "
                     f"{fmt.STATUS_GLYPHS['missed']} missed  [$text-primary]{fmt.STATUS_GLYPHS['running']}[/] running")
        lines.append(f"  [b $text-warning]{MARKS['gap']}[/] a past slot with no run at all   "
                     f"[b $text-primary]{MARKS['next']}[/] the next fire, [$text-muted]{MARKS['upcoming']}[/] the ones after   "
                     f"[b $text-accent]{MARKS['now']}[/] now   [$text-muted]{MARKS['unknown']}[/] not loaded (zoom in)")
        lines.append(f"  [b reverse $text-warning]⚠[/] overdue: a slot {30}s past with no run   "
                     "[$text-muted]○ before a name: disabled[/]")
        lines.append(f"  [$text-accent]{STORED_MARK}[/] after a name: created at run time (stored; E edits, D deletes); "
                     "[$text-muted]the others are in code: e only[/]")
        lines.append("  [b reverse $text-error]✗ invalid[/] a stored schedule not valid on the instance read "
                     "(why: in its detail line); not run there until E corrects it")
        return [Content.from_markup(line) for line in lines]

    def action_close(self) -> None:
        self.dismiss(None)
