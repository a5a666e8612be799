"""View 6: the audit log, newest first: who did what to which thing, and when."""

from __future__ import annotations

import json
from datetime import datetime
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import DataTable, Static

from backend.events.audit import AuditEntry
from backend.safetext import in_line
from console import format as fmt
from console.keys import Key, bindings
from console.screens.audit import AuditDetails
from console.views.base import View, details_key, filter_key
from console.widgets.line import Line
from console.widgets.palette import theme_color
from console.widgets.schedules import FreshTable
from console.workers import work

__all__ = ["AUDIT_PAGE", "AuditTable", "AuditView", "detail_text", "entry_matches"]

AUDIT_PAGE = 200
"""Entries read at a time: the newest on every refresh, and ``]`` reads as many older ones."""


def detail_text(entry: AuditEntry) -> str:
    """The detail on one line: ``key=value`` pairs, strings bare, the rest as JSON."""
    if not entry.detail:
        return ""
    parts = []
    for key, value in entry.detail.items():
        if value is None:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{key}={shown}")
    return in_line(" ".join(parts).replace("\n", " "))


def entry_matches(entry: AuditEntry, needle: str) -> bool:
    """The filter: its text in the actor, action, target or detail (any case)."""
    needle = needle.strip().lower()
    if not needle:
        return True
    return any(needle in field.lower() for field in (entry.actor, entry.action, entry.target, detail_text(entry)))


class AuditTable(FreshTable):
    """The entries, newest first; the detail column takes the room the others leave."""

    DEFAULT_CSS = """
    AuditTable {
        height: 1fr;
    }
    """

    COLUMNS = (("at", "AT"), ("actor", "ACTOR"), ("action", "ACTION"), ("target", "TARGET"), ("detail", "DETAIL"))
    DETAIL_MIN = 8

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.entries: list[AuditEntry] = []
        self._shown: list[tuple[str, tuple[Text, ...]]] = []

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def _cells(self, entry: AuditEntry, at: str, others: int) -> tuple[Text, ...]:
        detail = detail_text(entry)
        width = max(self.DETAIL_MIN, self.size.width - 1 - 2 * len(self.COLUMNS) - others)
        if len(detail) > width:
            detail = detail[: width - 1] + "…"
        muted = Style(color=theme_color(self.app, "text-muted"))
        return (
            Text(at, style=muted),
            Text(in_line(entry.actor), style="bold"),
            Text(entry.action),
            Text(in_line(entry.target)),
            Text(detail, style=muted),
        )

    def show(self, entries: list[AuditEntry], zone: str, now: datetime) -> None:
        """Show ``entries``; the cursor stays on the same entry when it is still there."""
        ats = [fmt.short_time(e.at, zone, now).rsplit(" ", 1)[0] for e in entries]  # the zone is on the tab line
        others = (
            (max((len(e.actor) for e in entries), default=5))
            + (max((len(e.action) for e in entries), default=6))
            + (max((len(e.target) for e in entries), default=6))
            + max(map(len, ats), default=14)  # (a year's entry's has its year)
        )
        shown = [(e.id, self._cells(e, at, others)) for e, at in zip(entries, ats, strict=True)]
        if shown == self._shown:
            return
        selected = self.selected_entry.id if self.selected_entry is not None else None
        self.entries = list(entries)
        self._shown = shown
        self.replace_rows(shown, selected)

    @property
    def selected_entry(self) -> AuditEntry | None:
        if not self.entries or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.entries[self.cursor_row]


class AuditView(View):
    """Every operator action, newest first (the newest :data:`AUDIT_PAGE` on each refresh;
    ``]`` reads older ones). The filter (``/``) narrows it by actor, action, target or
    detail; the entry under the cursor is shown whole under the table, and ``enter``
    opens it with every field (:class:`~console.screens.audit.AuditDetails`)."""

    DEFAULT_CSS = """
    AuditView #audit-entry {
        height: auto;
        max-height: 3;
        background: $boost;
        padding: 0 1;
    }
    """

    view_id = "audit"
    topics: ClassVar[tuple[str, ...]] = ("audit",)

    KEYS = (
        Key("right_square_bracket", "older_entries", "Older", ("audit",), show=False, help="read older entries (by keyset)"),
        filter_key("the entries by actor, action, target or detail"),
        details_key("every field of the entry under the cursor"),
    )
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.entries: list[AuditEntry] = []
        """Every entry read so far, newest first."""
        self.next_before: str | None = None
        """Where the older entries start (``None``: all read)."""
        self._older_read = False

    def compose(self) -> ComposeResult:
        yield Line("AUDIT", id="audit-title", classes="section")
        yield AuditTable(id="audit-table")
        yield Static("", id="audit-entry", markup=False)

    @property
    def table(self) -> AuditTable:
        return self.query_one(AuditTable)

    def focus_main(self) -> None:
        self.table.focus()

    async def load(self) -> None:
        """The newest page, in front of the older entries read with ``]``."""
        page = await self.console.backend.audit(limit=AUDIT_PAGE)
        if not self._older_read:
            self.entries, self.next_before = page.entries, page.next_before
            return
        oldest_new = page.entries[-1].id if page.entries else ""
        older = [e for e in self.entries if e.id < oldest_new]
        self.entries = page.entries + older

    @work(exclusive=True, group="audit-older")
    async def action_older_entries(self) -> None:
        """``]``: read the next older entries."""
        if self.next_before is None:
            self.notify("No older entries.", severity="information")
            return
        went, page = await self.attempt(self.console.backend.audit(limit=AUDIT_PAGE, before=self.next_before))
        if not went or page is None:
            return
        self._older_read = True
        self.entries += page.entries
        self.next_before = page.next_before
        self.show()

    def show(self) -> None:
        console = self.console
        needle = console.filter_text.strip()
        shown = [e for e in self.entries if entry_matches(e, needle)]
        self.table.show(shown, console.display_zone, console.backend_now())
        self._show_entry()
        title = f"AUDIT {len(shown)}"
        if needle:
            title += f" of {len(self.entries)} · filter “{needle}” (esc clears)"
        title += " · newest first · " + (f"{self.shown_key('older_entries')} older" if self.next_before else "all read")
        if not self.loaded:
            title = "AUDIT · reading…"
        self._title(title)
        self.call_after_refresh(self._title, title)  # the columns' widths are known once laid out

    def _title(self, title: str) -> None:
        """The title, and the columns that do not fit (long actors or targets push DETAIL off)."""
        self.query_one("#audit-title", Line).update(Content(title + self.table.off_screen()))

    def _show_entry(self) -> None:
        """The entry under the cursor, whole, under the table (the column is cut at 80)."""
        entry = self.table.selected_entry
        text = "" if entry is None else in_line(f"{entry.actor} · {entry.action} · {entry.target}  {detail_text(entry)}".rstrip())
        self.query_one("#audit-entry", Static).update(text)

    @on(DataTable.RowHighlighted, "#audit-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_entry()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.open_details()

    def open_details(self) -> None:
        entry = self.table.selected_entry
        if entry is None:
            self.notify("No entry selected.", severity="warning")
            return
        self.app.push_screen(AuditDetails(entry, self.console.display_zone))

    def on_resize(self) -> None:
        if self.entries:
            self.table._shown = []  # the detail column's width changed
            self.show()
