"""The selected schedule: its detail bar, recent runs, next fire times and runs table."""

from __future__ import annotations

from datetime import datetime, timedelta

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from backend.model import Run, ScheduleView
from backend.safetext import in_line
from console import format as fmt
from console.fleet import Durations
from console.widgets.palette import outcome_text, status_cell, status_text, theme_color
from console.widgets.schedules import FreshTable

__all__ = ["DetailBar", "RecentRuns", "RunsTable", "UpcomingLine", "lag"]


def lag(run: Run) -> str:
    """How late the handler started after its slot (``+4ms``), ``-`` when it never started."""
    if run.fired_at is None:
        return "-"
    ms = round((run.fired_at - run.scheduled_at) / timedelta(milliseconds=1))
    return ("+" if ms >= 0 else "-") + fmt.duration(abs(ms))


def run_duration(run: Run, max_runtime_s: float, now: datetime) -> str:
    """``310ms``; a running run's elapsed time against its watchdog: ``12s of 30m``."""
    if run.status == "running" and run.fired_at is not None:
        elapsed = fmt.compact_delta(max(now - run.fired_at, timedelta(0))).split(" ")[0]
        budget = fmt.compact_delta(timedelta(seconds=max_runtime_s)).split(" ")[0]
        return f"{elapsed} of {budget}"
    return fmt.duration(run.duration_ms)


class DetailBar(Widget):
    """The selected schedule: name, cron and its zone, policies, typical durations; then
    why it is off (who, when, the whole note) or overdue, or its description."""

    DEFAULT_CSS = """
    DetailBar {
        height: auto;
        max-height: 3;
        background: $boost;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    # The line count follows these (a note, an overdue line, a description): re-lay out.
    view: reactive[ScheduleView | None] = reactive(None, layout=True)
    """The schedule shown."""
    page: reactive[str] = reactive("")
    """Which page of runs is on screen (empty on the newest)."""
    durations: reactive[Durations | None] = reactive(None)
    """p50/p95 of the runs on screen."""
    overdue_since: reactive[datetime | None] = reactive(None, layout=True)
    zone: reactive[str] = reactive("UTC")
    """The display zone (the operator's, or UTC) for when it was disabled."""
    now: reactive[datetime | None] = reactive(None)

    def render(self) -> Content:
        view = self.view
        if view is None:
            return Content.from_markup("[$text-muted]no schedule selected[/]")
        sep = (" · ", "$text-muted")
        parts: list[str | tuple[str, str] | Content] = [
            (view.name, "bold"), sep, view.cron, " ", (view.timezone, "$text-muted"), sep,
            ("overlap ", "$text-muted"), view.on_overlap, sep, ("catch-up ", "$text-muted"), view.backfill, sep,
            ("watchdog ", "$text-muted"), fmt.compact_delta(timedelta(seconds=view.max_runtime_s)),
        ]
        if view.source == "store":  # first after the name: it says E and D apply
            target = f" → {view.target.kind} {view.target.name}" if view.target is not None else ""
            parts[2:2] = [("stored", "bold $text-accent"), target, sep]
        if self.durations is not None:
            d = self.durations
            parts += [sep, ("p50 ", "$text-muted"), fmt.duration(d.p50_ms), (" p95 ", "$text-muted"),
                      fmt.duration(d.p95_ms), (f" ({d.count} run{'s' if d.count != 1 else ''})", "$text-muted")]
        if self.page:
            parts += [sep, (self.page, "bold $text-accent")]
        lines = [Content.assemble(*parts)]
        now = self.now
        if view.problem is not None:
            # First: nothing else about it holds while it does not run. Why, over the two
            # lines left (a bound's message is longer than a narrow terminal).
            head = ("✗ not valid here", "bold reverse $text-error"), ("; not run: E edits, D deletes · ", "$text-muted")
            room = self.size.width - 2 - sum(len(text) for text, _ in head)
            problem, cut = view.problem, len(view.problem)
            if 0 < room < cut:
                cut = problem.rfind(" ", 0, room + 1)  # (between words)
                cut = cut if cut > 0 else room
            first, rest = problem[:cut], problem[cut:].lstrip()
            lines.append(Content.assemble(*head, first))
            if rest:
                lines.append(Content(rest))
        elif not view.enabled:
            note = view.state_note
            if note is not None:
                when = fmt.short_time(note.at, self.zone, now)
                ago = f", {fmt.age(note.at, now)} ago" if now is not None else ""
                # The note first: a narrow terminal cuts the end of the line, and why it is
                # off matters more than who said so and when.
                lines.append(Content.assemble(
                    ("○ disabled", "bold $text-warning"), (": " + in_line(note.note)) if note.note else "",
                    (f" (by {in_line(note.by)} at {when}{ago})", "$text-muted") if note.note
                    else f" by {in_line(note.by)} at {when}{ago}",
                ))
            else:
                lines.append(Content.assemble(("○ disabled in its definition", "bold $text-warning")))
        elif self.overdue_since is not None:
            late = f" ({fmt.age(self.overdue_since, now)} ago)" if now is not None else ""
            lines.append(Content.assemble(
                ("⚠ overdue", "bold reverse $text-warning"),
                f" no run for the slot of {fmt.short_time(self.overdue_since, self.zone, now)}{late} or since:"
                " is an engine firing it?",
            ))
        elif view.description:
            lines.append(Content.assemble((in_line(view.description), "$text-muted")))
        return Content("\n").join(lines)


class RecentRuns(Widget):
    """The newest runs as a strip of glyphs, oldest left (by scheduled time)."""

    DEFAULT_CSS = """
    RecentRuns {
        height: 1;
        padding: 0 1;
    }
    """

    runs: reactive[list[Run]] = reactive(list)
    """Newest first, as the backend pages them (drawn again only when they differ: every
    refresh and every filter key sets them)."""

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
    """The next five fire times, in the schedule's own zone (where its cron is read)."""

    DEFAULT_CSS = """
    UpcomingLine {
        height: 1;
        padding: 0 1;
    }
    """

    slots: reactive[list[datetime]] = reactive(list)
    """(Drawn again only when they differ: every refresh and every filter key sets them.)"""
    zone: reactive[str] = reactive("UTC")
    note: reactive[str] = reactive("")
    """Why the slots will not fire by themselves (disabled, external), if so."""

    def render(self) -> Content:
        if not self.slots:
            return Content.from_markup("[$text-muted]next    -[/]")
        tz = fmt.zone_of(self.zone)
        local = [s.astimezone(tz) for s in self.slots]
        same_day = all(t.date() == local[0].date() for t in local)
        if same_day:
            shown = [local[0].strftime("%m-%d %H:%M:%S")] + [t.strftime("%H:%M:%S") for t in local[1:]]
        elif all(t.year == local[0].year for t in local):
            shown = [t.strftime("%m-%d %H:%M") for t in local]
        else:  # (a yearly schedule's five were the same "01-01 00:00" five times)
            shown = [t.strftime("%Y-%m-%d %H:%M") for t in local]
        parts: list[str | tuple[str, str]] = [("next    ", "$text-muted")]
        if self.note:  # first: a narrow terminal cuts the end of the line
            parts.append((f"({self.note}) ", "$text-warning"))
        for i, text in enumerate(shown):
            if i:
                parts.append((" · ", "$text-muted"))
            parts.append(text)
        parts.append((f" {local[0].strftime('%Z')} (its zone)", "$text-muted"))
        return Content.assemble(*parts)


class RunsTable(FreshTable):
    """One page of the selected schedule's runs, newest first by scheduled time. Times are
    in the display zone; the error column takes the room the others leave (and at least
    :data:`ERROR_MIN`), so it stays on screen at 80 columns."""

    DEFAULT_CSS = """
    RunsTable {
        height: 1fr;
    }
    """

    BINDINGS = [
        Binding("home", "scroll_top", "First", show=False),
        Binding("end", "scroll_bottom", "Last", show=False),
    ]

    COLUMNS = (
        ("scheduled", "SCHEDULED AT"),
        ("status", "STATUS"),
        ("outcome", "OUTCOME"),
        ("duration", "DURATION"),
        ("lag", "LAG"),
        ("error", "ERROR"),
        ("instance", "INSTANCE"),
    )
    ERROR_MIN = 8
    _ERROR = 5
    """The error column's place: the columns before it are drawn whole, it takes the room
    they leave (so a lag is never cut: ``+23ms`` cut to ``+23m`` reads as minutes)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.runs: list[Run] = []
        """The runs shown, newest first."""
        self._shown: list[tuple[str, tuple[Text | str, ...]]] = []
        self._max_runtime_s = 1800.0
        self._width = 80
        """The width it had when last shown with one (80 until laid out)."""

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected_run(self) -> Run | None:
        if not self.runs or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.runs[self.cursor_row]

    def _error_width(self, rows: list[tuple[Text, ...]]) -> int:
        """The room the columns before the error leave it, as wide as their widest cell."""
        used = 0
        for index, (_, label) in enumerate(self.COLUMNS[: self._ERROR]):
            used += max([len(label), *(cell_len(row[index].plain) for row in rows)]) + 2  # (its padding)
        # Hidden (its view switched away from), it has no width: it keeps the last one, and
        # its cells stay as drawn.
        self._width = self.size.width or self._width
        return max(self.ERROR_MIN, self._width - 1 - used - 2)

    def _cells(self, run: Run, zone: str, now: datetime) -> tuple[Text, ...]:
        """The run's cells, its error whole (cut to the room left by :meth:`_fitted`)."""
        error = " ".join(filter(None, [run.error_tag and f"[{run.error_tag}]", run.error_message]))
        error = in_line(error.replace("\n", " "))  # (a subprocess's colours, as their escapes)
        # Text, never str: a str cell is parsed as markup on every measure and render.
        return (
            Text(fmt.short_time(run.scheduled_at, zone, now)),
            status_text(self.app, run.status),
            outcome_text(self.app, run.coordination_outcome),
            Text(run_duration(run, self._max_runtime_s, now)),
            Text(lag(run)),
            Text(error, style=Style(color=theme_color(self.app, "text-error"))),
            Text(in_line(run.instance)),
        )

    def show(self, runs: list[Run], zone: str, now: datetime, max_runtime_s: float = 1800.0) -> None:
        """Show ``runs``. A cursor on the newest run stays on the newest (new runs come in
        at the top, in sight); one the operator moved down stays on the same run, if it is
        still there."""
        self._max_runtime_s = max_runtime_s
        rows = [self._cells(run, zone, now) for run in runs]
        width = self._error_width(rows)
        shown: list[tuple[str, tuple[Text | str, ...]]] = []
        for run, cells in zip(runs, rows, strict=True):
            error = cells[self._ERROR]
            if error.cell_len > width:
                error = Text(error.plain[: width - 1] + "…", style=error.style)
            shown.append((run.id, (*cells[: self._ERROR], error, *cells[self._ERROR + 1 :])))
        if shown == self._shown:
            return
        selected = self.selected_run.id if self.selected_run is not None and self.cursor_row > 0 else None
        same_rows = [key for key, _ in shown] == [key for key, _ in self._shown]
        self.runs = list(runs)
        if same_rows:
            for (key, new), (_, old) in zip(shown, self._shown, strict=False):
                for (column, _), new_cell, old_cell in zip(self.COLUMNS, new, old, strict=False):
                    if new_cell != old_cell:
                        self.update_cell(key, column, new_cell, update_width=True)
            self._shown = shown
            return
        self._shown = shown
        self.replace_rows(shown, selected)
