"""The schedules table: one row per schedule, its countdown recomputed on every tick."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widgets import DataTable

from backend.model import ScheduleView

from .. import format as fmt
from .palette import OUTCOME_COLORS, status_text, theme_color

__all__ = ["SchedulesTable"]

NOTE_WIDTH = 18
"""How much of a disabled schedule's note the table shows (the detail bar shows it all)."""


class SchedulesTable(DataTable[Text | str]):
    """Schedules, most telling columns first so that 80 columns show what matters.

    :meth:`show` diffs against what is on screen (cursor and scroll stay put); :meth:`tick`
    recomputes the countdowns of the visible rows from the absolute ``next_fire_at``.
    """

    DEFAULT_CSS = """
    SchedulesTable {
        height: auto;
        max-height: 45%;
        min-height: 4;
    }
    """

    COLUMNS = (
        ("name", "NAME", None),
        ("next", "NEXT FIRE", 11),
        ("last", "LAST RUN", None),
        ("enabled", "ENABLED", None),
        ("cron", "CRON", None),
        ("tz", "TIMEZONE", None),
        ("trigger", "TRIGGER", None),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.views: dict[str, ScheduleView] = {}
        """The schedules shown, by name."""
        self._shown: dict[str, tuple[Text | str, ...]] = {}
        self._now: datetime | None = None

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected_name(self) -> str | None:
        """The name under the cursor, if any."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None

    def _cells(self, view: ScheduleView, now: datetime) -> tuple[Text | str, ...]:
        last = view.last_run
        if last is None:
            last_cell: Text | str = Text("-", style=theme_color(self.app, "text-muted"))
        else:
            label = f"{last.status} {fmt.duration(last.duration_ms)}" if last.duration_ms is not None else last.status
            # The outcome's glyph too: who fired it (●◆⇲✎, see the legend under ?).
            last_cell = status_text(self.app, last.status, label) + Text(" ") + Text(
                fmt.OUTCOME_GLYPHS.get(last.coordination_outcome, "?"),
                style=theme_color(self.app, OUTCOME_COLORS.get(last.coordination_outcome, "foreground")),
            )
        if view.enabled:
            enabled: Text | str = Text("● on", style=theme_color(self.app, "text-success"))
        else:
            note = view.state_note.note if view.state_note and view.state_note.note else ""
            if len(note) > NOTE_WIDTH:
                note = note[: NOTE_WIDTH - 1] + "…"
            enabled = Text(f"○ off{': ' + note if note else ''}", style=theme_color(self.app, "text-warning"))
        return (
            Text(view.name, style="bold"),
            self._countdown(view, now),
            last_cell,
            enabled,
            view.cron,
            view.timezone,
            view.trigger,
        )

    def _countdown(self, view: ScheduleView, now: datetime) -> Text | str:
        if not view.enabled:
            return Text("disabled", style=theme_color(self.app, "text-muted"))
        if view.next_fire_at is None:
            return Text("external", style=theme_color(self.app, "text-muted"))
        return fmt.countdown(view.next_fire_at, now)

    def show(self, views: list[ScheduleView], now: datetime) -> None:
        """Show ``views`` (already filtered), keeping the cursor on the same schedule."""
        self._now = now
        names = [v.name for v in views]
        previous = self.views
        self.views = {v.name: v for v in views}
        if names != list(self._shown):
            selected = self.selected_name
            self.clear()
            self._shown = {}
            for view in views:
                cells = self._cells(view, now)
                self._shown[view.name] = cells
                self.add_row(*cells, key=view.name)
            if selected in self._shown:
                self.move_cursor(row=self.get_row_index(selected), animate=False)
            return
        for view in views:
            if view == previous.get(view.name):
                continue  # unchanged (its countdown is the tick's business)
            cells = self._cells(view, now)
            old = self._shown[view.name]
            for (key, _, width), new_cell, old_cell in zip(self.COLUMNS, cells, old):
                if new_cell != old_cell:
                    self.update_cell(view.name, key, new_cell, update_width=width is None)
            self._shown[view.name] = cells

    def tick(self, now: datetime) -> None:
        """Recompute the countdowns of the rows on screen (others follow when scrolled to)."""
        self._now = now
        if not self._shown:
            return
        first = max(0, int(self.scroll_y) - 1)
        last = first + self.size.height + 1
        names = list(self._shown)
        for name in names[first:last]:
            view = self.views.get(name)
            if view is None:
                continue
            cell = self._countdown(view, now)
            cells = self._shown[name]
            if cells[1] != cell:
                self.update_cell(name, "next", cell)
                self._shown[name] = (cells[0], cell, *cells[2:])
