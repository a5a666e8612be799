"""One audit entry, whole: every field, its detail one key a line (an edit's before and
after, a backfill's range), wrapped and scrollable; it stays until closed."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from backend.events.audit import AuditEntry
from console import format as fmt
from console.unprintable import escaped

__all__ = ["AuditDetails"]


class AuditDetails(ModalScreen[None]):
    """``enter`` on an audit entry (esc, enter or q closes it)."""

    DEFAULT_CSS = """
    AuditDetails {
        align: center middle;
    }
    AuditDetails > VerticalScroll {
        width: 96;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="close_audit_entry")]

    def __init__(self, entry: AuditEntry, zone: str) -> None:
        super().__init__()
        self.entry = entry
        self.zone = zone
        """The display zone (UTC follows)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"Audit entry {self.entry.id}"
            box.border_subtitle = "↑↓ scroll · esc closes"
            yield Static(self._body(), id="audit-body")

    def _body(self) -> Content:
        e = self.entry
        label = "[$text-muted]{:<8}[/]".format
        at = fmt.local_time(e.at, self.zone)
        utc = "" if self.zone == "UTC" else f" [$text-muted]({escaped(fmt.local_time(e.at, 'UTC'))})[/]"
        lines = [
            f"{label('at')} {escaped(at)}{utc}",
            f"{label('actor')} [b]{escaped(e.actor)}[/b]",
            f"{label('action')} {escaped(e.action)}",
            f"{label('target')} [b]{escaped(e.target)}[/b]",
        ]
        detail = e.detail or {}
        lines += ["", "[$text-muted]detail[/]" if detail else "[$text-muted]no detail[/]"]
        width = max((len(key) for key in detail), default=0)
        for key, value in detail.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
            lines.append(f"  [$text-muted]{escaped(key.ljust(width))}[/] {escaped(shown)}")
        return Content.from_markup("\n".join(lines))

    def action_close(self) -> None:
        self.dismiss(None)
