"""View 2: the fleet timeline, every schedule's runs on one time axis."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from textual import on
from textual.app import ComposeResult
from textual.content import Content

from backend.model import Run, ScheduleView
from console import format as fmt
from console.fleet import Overdue
from console.keys import Key, bindings
from console.timeline import DEFAULT_ZOOM, ZOOMS, Window, kind_of, zoom_label
from console.views.base import SCHEDULE_KEYS, View, details_key, filter_key
from console.views.selection import SelectionLeft
from console.widgets import TimelineGrid
from console.widgets.line import Line
from console.widgets.palette import KIND_MEANINGS
from console.widgets.runs import run_duration
from console.workers import work

__all__ = ["OverdueNames", "TimelineView"]


class OverdueNames:
    """The names of the schedules overdue at ``now``, judged when a row is drawn: only the
    rows on screen are asked about. (Judged all at once on every show, right after a minute
    boundary that was a cron walk for each of a thousand schedules when the view was
    switched to.)"""

    def __init__(self, rows: list[ScheduleView], overdue: Overdue, now: datetime) -> None:
        self._rows = {view.name: view for view in rows}
        self._overdue = overdue
        self._now = now
        self._known: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or name not in self._rows:
            return False
        known = self._known.get(name)
        if known is None:
            known = self._known[name] = self._overdue.since(self._rows[name], self._now) is not None
        return known


class TimelineView(View):
    """A row per schedule (the filter applies), time across: each run at its scheduled
    time, the worst status where runs share a cell, slots without a run, "now", and the
    next fires to its right. Only the rows on screen are read, for the window on screen."""

    view_id = "timeline"

    KEYS = (
        Key("h", "pan(-1)", "Earlier", ("runs_between",), id="timeline_earlier", help="pan a quarter of the window earlier"),
        Key("l", "pan(1)", "Later", ("runs_between",), id="timeline_later", help="pan a quarter of the window later"),
        Key("plus,equals_sign", "zoom(-1)", "Zoom in", ("runs_between",), id="timeline_zoom_in", key_display="+",
            help="zoom in (down to 15 minutes)"),
        Key("minus", "zoom(1)", "Zoom out", ("runs_between",), id="timeline_zoom_out", key_display="-",
            help="zoom out (up to 7 days)"),
        Key("0", "follow_now", "Back to now", ("runs_between",), id="timeline_now", show=False, help="back to following now"),
        *SCHEDULE_KEYS,
        filter_key("the rows: a text, or failed, overdue, disabled, running…"),
        details_key("the run under the cursor (the worst, where several share a cell)"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.zoom = DEFAULT_ZOOM
        """Index into :data:`~console.timeline.ZOOMS`."""
        self.following = True
        """The window keeps "now" a fifth from its right edge; panning stops that (``0`` resumes)."""
        self.center: datetime | None = None
        """The window's centre while not following."""
        self.runs: dict[str, list[Run]] = {}
        """Runs loaded, per schedule, for :attr:`loaded_for`."""
        self.loaded_for: tuple[Window, frozenset[str]] | None = None
        self.left = SelectionLeft(self.notify, "was deleted")
        """The selected schedule gone from under the cursor by itself, as on the Schedules
        view (see its module): ``r`` pressed just then fired another schedule."""

    def compose(self) -> ComposeResult:
        yield Line("TIMELINE", id="timeline-title", classes="section")
        yield TimelineGrid(self.console.crons, id="timeline-grid")
        yield Line("", id="timeline-info")

    @property
    def grid(self) -> TimelineGrid:
        return self.query_one(TimelineGrid)

    def focus_main(self) -> None:
        self.grid.focus()

    def selected_schedule(self) -> str | None:
        return self.grid.selected_name

    def select(self, name: str) -> bool:
        self.left.moved = None
        return self.grid.select_name(name)

    def selection_holds(self, action: str) -> bool:
        return self.left.holds(action)

    @property
    def limit_per_name(self) -> int:
        """Enough runs for eight in every cell; a row with exactly this many is
        drawn as known only from its oldest loaded run on (zoom in for the rest)."""
        return min(1000, max(200, 8 * self.grid.cells))

    def window(self, now: datetime) -> Window:
        span, cells = ZOOMS[self.zoom], self.grid.cells
        if self.following or self.center is None:
            return Window.following(now, span, cells)
        return Window.around(self.center, span, cells)

    def _names_on_screen(self) -> list[str]:
        grid = self.grid
        rows = self.console.visible_views()
        top = int(grid.scroll_y)
        # Not laid out yet (the view was just switched to): no more rows than the screen has.
        height = max(1, (grid.size.height or self.app.size.height) - 1)
        on_screen = rows[top : top + height]
        return [v.name for v in on_screen]

    # -- data ---------------------------------------------------------------------------
    async def load(self) -> None:
        window = self.window(self.console.backend_now())
        names = self._names_on_screen()
        if not names:
            self.runs, self.loaded_for = {}, (window, frozenset())
            return
        found = await self.console.backend.runs_between(
            names, window.start, window.end, limit_per_name=self.limit_per_name
        )
        self.runs, self.loaded_for = found, (window, frozenset(names))

    @work(exclusive=True, group="timeline")
    async def reload(self) -> None:
        """Read again for what is on screen now (after a pan, a zoom or a scroll)."""
        went, _ = await self.attempt(self.load())
        if not went:
            return
        self.show()

    def _stale(self, window: Window) -> bool:
        if self.loaded_for is None:
            return True
        loaded_window, loaded_names = self.loaded_for
        if loaded_window.cell != window.cell or loaded_window.start > window.start or loaded_window.end < window.end:
            # Following now moves the window a cell at a time: what is loaded still covers
            # all but the newest cell, which the next refresh brings.
            if not (self.following and loaded_window.cell == window.cell and window.start - loaded_window.start <= window.cell * 2):
                return True
        return not set(self._names_on_screen()) <= loaded_names

    # -- drawing ------------------------------------------------------------------------
    def show(self) -> None:
        console = self.console
        now = console.backend_now()
        window = self.window(now)
        rows = console.visible_views()
        overdue = OverdueNames(rows, console.overdue, console.data_now())
        before = self.grid.selected_name
        self.grid.show(rows, self.runs, window, now, console.display_zone, limit=self.limit_per_name, overdue=overdue)
        landed = self.grid.selected_name
        self.left.redrawn(before, landed, exists=before is not None and console.view_of(before) is not None,
                          filter_text=console.filter_text)  # fmt: skip
        self._title(window, len(rows), now)
        if self._stale(window):
            self.reload()

    def _title(self, window: Window, shown: int, now: datetime) -> None:
        console = self.console
        zone = console.display_zone
        start, end = (fmt.short_time(at, zone, now, seconds=False).rsplit(" ", 1)[0] for at in (window.start, window.end))
        span = f"{start} – {end} {fmt.zone_abbr(zone, window.end)}"
        mode = "following now" if self.following else "panned · 0 returns to now"
        title = f"TIMELINE {shown} schedules · {zoom_label(ZOOMS[self.zoom])} · {span} · {mode}"
        if console.filter_text:
            title += f" · filter “{console.filter_text}”"
        self.query_one("#timeline-title", Line).update(Content(title))

    def tick(self, now: datetime) -> None:
        now = self.console.backend_now()  # (what the server's times are counted against)
        grid = self.grid
        if grid.window is None:
            return
        if self.window(now) != grid.window:
            self.show()  # following: the window moved by a cell
        else:
            grid.refresh_now(now)

    @on(TimelineGrid.CursorMoved)
    def _cursor_moved(self) -> None:
        self.left.chosen(self.grid.selected_name)
        self._info()
        if self.grid.window is not None and self._stale(self.grid.window):
            self.reload()

    def _info(self) -> None:
        info = self.query_one("#timeline-info", Line)
        console = self.console
        cursor = self.grid.cursor
        if cursor is None:
            info.update(Content.styled("no schedules to show" + (" (filter on)" if console.filter_text else ""), "$text-muted"))
            return
        view, cell, index = cursor
        zone = console.display_zone
        head: list[str | tuple[str, str]] = [(view.name, "bold"), ("  ", "")]
        if cell is None or index is None:
            key = self.shown_key
            hint = (f"←/→ a run · {key('run_details')} its details · {key('timeline_earlier')}/{key('timeline_later')} pan · "
                    f"{key('timeline_zoom_in')}/{key('timeline_zoom_out')} zoom · {key('help')} legend")
            info.update(Content.assemble(*head, (hint, "$text-muted")))
            return
        assert self.grid.window is not None
        now = console.backend_now()
        at = fmt.short_time(self.grid.window.cell_start(index), zone, now)
        run = cell.worst
        if run is None:
            what = "a slot with no run: missed without a record (was an engine firing?)" if cell.gap else "next fire"
            info.update(Content.assemble(*head, f"{at}  ", (what, "bold $text-warning" if cell.gap else "$text-muted")))
            return
        glyph = fmt.STATUS_GLYPHS.get(run.status, "?")
        style = "bold reverse $text-error" if run.status == "failed" else "bold"
        parts: list[str | tuple[str, str]] = [
            *head, fmt.short_time(run.scheduled_at, zone, now), "  ", (f"{glyph} {run.status}", style), "  ",
            f"{fmt.OUTCOME_GLYPHS.get(run.coordination_outcome, '?')} {run.coordination_outcome}",
            ("  ", ""), (KIND_MEANINGS[kind_of(run)], "$text-muted"), "  ", run.instance, "  ",
            run_duration(run, view.max_runtime_s, now),
        ]
        if run.error_tag or run.error_message:
            parts += ["  ", (f"[{run.error_tag}] {run.error_message or ''}".strip(), "$text-error")]
        if len(cell.runs) > 1:
            counts = Counter(r.status for r in cell.runs)
            summary = ", ".join(f"{n} {status}" for status, n in counts.most_common())
            parts += [("  ", ""), (f"{len(cell.runs)} runs in this cell: {summary} (+ zooms in)", "$text-muted")]
        info.update(Content.assemble(*parts))

    # -- keys ---------------------------------------------------------------------------
    def action_pan(self, direction: int) -> None:
        """``h``/``l``: a quarter of the window earlier or later."""
        now = self.console.backend_now()
        current = self.window(now)
        self.center = current.center + ZOOMS[self.zoom] / 4 * direction
        following = Window.following(now, ZOOMS[self.zoom], self.grid.cells)
        self.following = direction > 0 and self.center >= following.center
        self.show()

    def action_zoom(self, direction: int) -> None:
        """``+``/``-``: a shorter or longer span (15 minutes to 7 days)."""
        zoom = max(0, min(len(ZOOMS) - 1, self.zoom + direction))
        if zoom == self.zoom:
            self.notify(f"Already at {zoom_label(ZOOMS[zoom])}, the {'narrowest' if direction < 0 else 'widest'} span.")
            return
        now = self.console.backend_now()
        if not self.following:
            self.center = self.window(now).center
        self.zoom = zoom
        self.show()

    def action_follow_now(self) -> None:
        """``0``: back to following now."""
        self.following = True
        self.show()

    def open_details(self) -> None:
        run = self.grid.selected_run
        if run is None:
            self.notify("No run under the cursor: ←/→ move between runs.", severity="warning")
            return
        cursor = self.grid.cursor
        if cursor is not None and cursor[1] is not None and len(cursor[1].runs) > 1:
            self.notify(f"{len(cursor[1].runs)} runs share this cell; showing the worst. + zooms in.")
        self.console.show_run(run)

    def on_resize(self) -> None:
        if self.console.views:
            self.show()
