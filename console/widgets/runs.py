"""The selected schedule: its detail bar, run timeline, next fire times and runs table."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from rich.text import Text
from textual.content import Content
from textual.markup import escape
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable

from backend.model import Run, ScheduleView

from .. import format as fmt
from .palette import outcome_text, status_cell, status_text, theme_color

__all__ = ["DetailBar", "RunTimeline", "RunsTable", "UpcomingLine", "lag", "short_time"]


def short_time(dt: datetime | None, zone: str) -> str:
    """``03-02 09:00:00 CET``: month-day and time in the schedule's zone."""
    if dt is None:
        return "-"
    return dt.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M:%S %Z")


def lag(run: Run) -> str:
    """How late the handler started after its slot (``+4ms``), ``-`` when it never started."""
    if run.fired_at is None:
        return "-"
    ms = round((run.fired_at - run.scheduled_at) / timedelta(milliseconds=1))
    return ("+" if ms >= 0 else "-") + fmt.duration(abs(ms))


class DetailBar(Widget):
    """One line about the selected schedule: name, cron and zone, policies, description, note."""

    DEFAULT_CSS = """
    DetailBar {
        height: 1;
        background: $boost;
        padding: 0 1;
    }
    """

    view: reactive[ScheduleView | None] = reactive(None)
    """The schedule shown."""
    page: reactive[str] = reactive("")
    """Which page of runs is on screen (empty on the newest)."""

    def render(self) -> Content:
        view = self.view
        if view is None:
            return Content.from_markup("[$text-muted]no schedule selected[/]")
        parts = [
            f"[b]{escape(view.name)}[/b]",
            f"{escape(view.cron)} [$text-muted]{escape(view.timezone)}[/]",
            f"[$text-muted]overlap[/] {view.on_overlap}",
            f"[$text-muted]catch-up[/] {view.backfill}",
            f"[$text-muted]watchdog[/] {fmt.compact_delta(timedelta(seconds=view.max_runtime_s))}",
        ]
        if not view.enabled and view.state_note is not None:
            note = f": {view.state_note.note}" if view.state_note.note else ""
            parts.append(f"[$text-warning]disabled by {escape(view.state_note.by)}{escape(note)}[/]")
        elif view.description:
            parts.append(f"[$text-muted]{escape(view.description)}[/]")
        if self.page:
            parts.append(f"[b $text-accent]{escape(self.page)}[/]")
        return Content.from_markup(" · ".join(parts))


class RunTimeline(Widget):
    """The recent runs as a strip of cells, oldest left, newest right; each cell carries
    its status's glyph and colour, so it reads with and without colour."""

    DEFAULT_CSS = """
    RunTimeline {
        height: 1;
        padding: 0 1;
    }
    """

    runs: reactive[list[Run]] = reactive(list, always_update=True)
    """Newest first, as the backend pages them."""
    stale: reactive[bool] = reactive(False)

    def render(self) -> Text:
        label = Text("recent ", style=theme_color(self.app, "text-muted"))
        room = max(0, (self.size.width - len(label.plain) - 12) // 2)
        shown = list(reversed(self.runs[:room]))
        if not shown:
            return label + Text("no runs yet", style=theme_color(self.app, "text-muted"))
        strip = Text()
        for run in shown:
            strip.append_text(status_cell(self.app, run.status))
            strip.append(" ")
        return label + strip + Text(" ◂ newest", style=theme_color(self.app, "text-muted"))


class UpcomingLine(Widget):
    """The next five fire times in the schedule's zone."""

    DEFAULT_CSS = """
    UpcomingLine {
        height: 1;
        padding: 0 1;
    }
    """

    slots: reactive[list[datetime]] = reactive(list, always_update=True)
    zone: reactive[str] = reactive("UTC")
    note: reactive[str] = reactive("")
    """Why the slots will not fire by themselves (disabled, external), if so."""

    def render(self) -> Content:
        if not self.slots:
            return Content.from_markup("[$text-muted]next    -[/]")
        tz = ZoneInfo(self.zone)
        local = [s.astimezone(tz) for s in self.slots]
        same_day = all(t.date() == local[0].date() for t in local)
        if same_day:
            shown = [local[0].strftime("%m-%d %H:%M:%S")] + [t.strftime("%H:%M:%S") for t in local[1:]]
        else:
            shown = [t.strftime("%m-%d %H:%M") for t in local]
        abbr = local[0].strftime("%Z")
        note = f" [$text-warning]({escape(self.note)})[/]" if self.note else ""
        return Content.from_markup(
            "[$text-muted]next[/]    " + " [$text-muted]·[/] ".join(shown) + f" [$text-muted]{escape(abbr)}[/]{note}"
        )


class RunsTable(DataTable[Text | str]):
    """One page of the selected schedule's runs, newest first."""

    DEFAULT_CSS = """
    RunsTable {
        height: 1fr;
    }
    """

    COLUMNS = (
        ("scheduled", "SCHEDULED AT"),
        ("status", "STATUS"),
        ("outcome", "OUTCOME"),
        ("lag", "LAG"),
        ("duration", "DURATION"),
        ("instance", "INSTANCE"),
        ("error", "ERROR"),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.runs: list[Run] = []
        """The runs shown, newest first."""
        self._zone = "UTC"
        self._shown: list[tuple[str, tuple[Text | str, ...]]] = []

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected_run(self) -> Run | None:
        if not self.runs or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.runs[self.cursor_row]

    def _cells(self, run: Run, zone: str) -> tuple[Text | str, ...]:
        error = " ".join(filter(None, [run.error_tag and f"[{run.error_tag}]", run.error_message]))
        return (
            short_time(run.scheduled_at, zone),
            status_text(self.app, run.status),
            outcome_text(self.app, run.coordination_outcome),
            lag(run),
            fmt.duration(run.duration_ms),
            run.instance,
            Text(error, style=theme_color(self.app, "text-error")) if error else "",
        )

    def show(self, runs: list[Run], zone: str) -> None:
        """Show ``runs``; the cursor stays on the same run when it is still there."""
        shown = [(run.id, self._cells(run, zone)) for run in runs]
        if shown == self._shown and zone == self._zone:
            return
        selected = self.selected_run.id if self.selected_run is not None else None
        same_rows = [key for key, _ in shown] == [key for key, _ in self._shown]
        self._zone = zone
        self.runs = list(runs)
        if same_rows:
            for (key, cells), (_, old) in zip(shown, self._shown):
                for (column, _), new_cell, old_cell in zip(self.COLUMNS, cells, old):
                    if new_cell != old_cell:
                        self.update_cell(key, column, new_cell, update_width=True)
            self._shown = shown
            return
        self.clear()
        self._shown = shown
        for key, cells in shown:
            self.add_row(*cells, key=key)
        if selected is not None and any(key == selected for key, _ in shown):
            self.move_cursor(row=self.get_row_index(selected), animate=False)
