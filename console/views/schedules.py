"""View 1: every schedule, and the selected one's settings, recent runs, next fires and runs.

``l`` shows a run's log: the run under the cursor of the runs table when it has the focus,
else the selected schedule's newest run.

``n`` creates a schedule at run time (a form previewing its next fires), ``E`` edits a
stored one, ``D`` deletes a stored one (after :class:`~console.screens.confirm.Confirm`).
Schedules written in code can only be enabled or disabled (``e``): ``E`` and ``D`` say so.
While the console is read-only, the keys that act say why they do nothing (see
:mod:`console.keys`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from textual import on
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import DataTable

from backend.client.interface import RunsPage
from backend.errors import SchedtuiError, Unavailable
from backend.model import Run, ScheduleView
from backend.observability.logs import RunLog
from console import format as fmt
from console.fleet import durations
from console.keys import Key, action_key, bindings
from console.screens.confirm import Confirm
from console.screens.log import LogScreen
from console.screens.schedule_form import DEFINED_IN_CODE, ScheduleForm, defined_in_code, stored_fields
from console.views.base import SCHEDULE_KEYS, View, details_key, filter_key
from console.views.selection import SelectionLeft
from console.widgets import DetailBar, RecentRuns, RunsTable, SchedulesTable, UpcomingLine
from console.widgets.line import Line
from console.workers import work

__all__ = ["PAGE_SIZE", "SchedulesView", "last_status_is"]

PAGE_SIZE = 50
"""Runs per page (the recent strip and the typical durations use the newest page)."""


def last_status_is(view: ScheduleView, status: str) -> bool:
    """Whether its last run, or its newest manual run, is in ``status`` (``failed``: the
    schedule is failing; the ``/failed`` filter and the title's count agree)."""
    return (view.last_run is not None and view.last_run.status == status) or (
        view.latest_manual is not None and view.latest_manual.status == status
    )


class SchedulesView(View):
    """The schedules table; under it the selected schedule's detail bar, its newest runs as
    a strip, its next fire times and a page of its runs (``]``/``[`` page by keyset)."""

    view_id = "schedules"

    KEYS = (
        action_key("create_schedule", "n", "New", title="Create schedule",
                   help="create a schedule at run time (its next fires previewed as you type)"),
        *SCHEDULE_KEYS,
        filter_key("the schedules: a text, or failed, overdue, disabled, running…"),
        action_key("update_schedule", "E", "Edit", title="Edit schedule", show=False,
                   help="edit the selected stored schedule (one in code: e only)"),
        action_key("delete_schedule", "D", "Delete", title="Delete schedule", show=False,
                   help="delete the selected stored schedule"),
        Key("right_square_bracket", "older_runs", "Older runs", ("list_runs",), show=False,
            help="older runs (the next page, by keyset)"),
        Key("left_square_bracket", "newer_runs", "Newer runs", ("list_runs",), show=False,
            help="newer runs (back towards the newest page)"),
        details_key("the selected run's details"),
        action_key("run_log", "l", "Log", title="Run log",
                   help="the log of the run under the cursor (on a schedule: its newest run)"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.selected_name: str | None = None
        """The schedule under the cursor; its runs and next fire times are shown."""
        self.page: RunsPage | None = None
        """The runs page on screen for the selected schedule."""
        self.recent: list[Run] = []
        """The newest page of the selected schedule (the strip and the durations)."""
        self._pages: list[str | None] = [None]
        self._detail: tuple[str, RunsPage, RunsPage, list[datetime]] | None = None
        self.left = SelectionLeft(self.notify, "was deleted elsewhere")
        """The selected schedule gone from under the cursor by itself (see its module)."""
        self._deleting: str | None = None
        """The schedule this console is deleting (its row going is no surprise)."""

    def compose(self) -> ComposeResult:
        console = self.console
        yield Line("SCHEDULES", id="schedules-title", classes="section")
        yield SchedulesTable(console.crons, console.overdue, id="schedules")
        yield DetailBar(id="detail")
        yield RecentRuns(id="recent")
        yield UpcomingLine(id="upcoming")
        yield RunsTable(id="runs")

    @property
    def table(self) -> SchedulesTable:
        return self.query_one(SchedulesTable)

    def focus_main(self) -> None:
        self.table.focus()

    def selected_schedule(self) -> str | None:
        return self.selected_name

    def select(self, name: str) -> bool:
        table = self.table
        if name not in table.views:
            return False
        table.move_cursor(row=table.get_row_index(name), animate=False, scroll=True)
        self.left.moved = None
        self._select(name)
        return True

    def selection_holds(self, action: str) -> bool:
        return self.left.holds(action)

    # -- data ---------------------------------------------------------------------------
    async def load(self) -> None:
        name = self.selected_name
        if name is not None and self.console.view_of(name) is not None:
            recent, page, upcoming = await self._fetch_detail(name)
            self._detail = (name, recent, page, upcoming)

    async def _fetch_detail(self, name: str) -> tuple[RunsPage, RunsPage, list[datetime]]:
        """A schedule's newest runs (the strip), the page of runs on screen (the same,
        unless the operator paged back), and its next slots."""
        backend = self.console.backend
        recent = await backend.list_runs(name, limit=PAGE_SIZE)
        before = self._pages[-1]
        page = recent if before is None else await backend.list_runs(name, limit=PAGE_SIZE, before=before)
        return recent, page, await backend.upcoming(name, 5)

    @work(exclusive=True, group="detail")
    async def load_detail(self, name: str) -> None:
        """Read the selected schedule's newest runs (or the page on screen) and next slots."""
        went, detail = await self.attempt(self._fetch_detail(name))
        if not went or detail is None:
            return
        recent, page, upcoming = detail
        if name == self.selected_name:
            self._detail = (name, recent, page, upcoming)
            self._show_detail()

    # -- drawing ------------------------------------------------------------------------
    def show(self) -> None:
        console = self.console
        table = self.table
        visible = console.visible_views()
        before = self.selected_name
        table.show(visible, console.backend_now(), console.data_now())
        failing = sum(1 for view in visible if last_status_is(view, "failed"))
        self._title(len(visible), failing)
        self.call_after_refresh(self._title, len(visible), failing)  # hidden columns: once laid out
        landed = table.selected_name
        self.left.redrawn(None if before == self._deleting else before, landed,
                          exists=before is not None and console.view_of(before) is not None,
                          filter_text=console.filter_text)  # fmt: skip
        self._select(landed)
        view = console.view_of(self.selected_name)
        detail = self.query_one(DetailBar)
        if view is not None and view != detail.view:
            detail.view = view
        self._show_detail()

    def _title(self, shown: int, failing: int) -> None:
        console = self.console
        title = Content(f"SCHEDULES {shown}")
        if console.filter_text:
            title += f" of {len(console.views)} · filter “{console.filter_text}” (esc clears)"
        if failing:
            title += Content.assemble(" · ", (f"✗ {failing} failing", "$text-error"))
        title += self.table.off_screen()
        self.query_one("#schedules-title", Line).update(title)

    def _show_detail(self) -> None:
        console = self.console
        name = self.selected_name
        detail = self.query_one(DetailBar)
        now = console.backend_now()
        detail.zone, detail.now = console.display_zone, now
        if self._detail is None or name is None or self._detail[0] != name:
            return
        _, recent, page, upcoming = self._detail
        view = console.view_of(name)
        zone = view.timezone if view is not None else "UTC"
        self.recent = recent.runs
        self.page = page
        self.query_one(RecentRuns).runs = recent.runs
        self.query_one(RunsTable).show(page.runs, console.display_zone, now, view.max_runtime_s if view else 1800.0)
        line = self.query_one(UpcomingLine)
        line.zone = zone
        line.slots = upcoming
        if view is not None and not view.enabled:
            line.note = "disabled: will not fire"
        elif view is not None and view.trigger == "external":
            line.note = "fired by the platform's scheduler"
        else:
            line.note = ""
        detail.durations = durations(recent.runs)
        detail.overdue_since = console.overdue.since(view, console.data_now()) if view is not None else None
        detail.page = "" if len(self._pages) == 1 else f"page {len(self._pages)} · {self.shown_key('newer_runs')} newer"

    def tick(self, now: datetime) -> None:
        now = self.console.backend_now()  # (what the server's times are counted against)
        self.table.tick(now, self.console.data_now())
        detail = self.query_one(DetailBar)
        detail.now = now
        runs = self.query_one(RunsTable)
        if any(r.status == "running" for r in runs.runs):
            view = self.console.view_of(self.selected_name)
            runs.show(runs.runs, self.console.display_zone, now, view.max_runtime_s if view else 1800.0)

    def show_new_run(self, run: Run) -> None:
        """Put a run started here on screen at once (the next refresh confirms it)."""
        console = self.console
        if run.name != self.selected_name or self._detail is None:
            return
        name, recent, page, upcoming = self._detail
        runs = [run, *[r for r in recent.runs if r.id != run.id]][:PAGE_SIZE]
        fresh = replace(recent, runs=runs)
        self._detail = (name, fresh, fresh if len(self._pages) == 1 else page, upcoming)
        self._show_detail()
        console.post_message(console.RunShown(run))

    # -- selection and paging -----------------------------------------------------------
    def _select(self, name: str | None) -> None:
        if name == self.selected_name:
            return
        self.selected_name = name
        self._pages = [None]
        self.query_one(DetailBar).view = self.console.view_of(name)
        if name is None:
            self._detail = None
            self.recent, self.page = [], None
            self.query_one(RecentRuns).runs = []
            self.query_one(RunsTable).show([], self.console.display_zone, self.console.backend_now())
            self.query_one(UpcomingLine).slots = []
            return
        self.load_detail(name)

    @on(DataTable.RowHighlighted, "#schedules")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        name = getattr(event.row_key, "value", None)  # (no row: a key moved in an empty table)
        self.left.chosen(name)
        self._select(name)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.open_details()

    def open_details(self) -> None:
        run = self.query_one(RunsTable).selected_run
        if run is None:
            self.notify("No run selected (this schedule has no runs yet).", severity="warning")
            return
        self.console.show_run(run)

    def action_run_log(self) -> None:
        """``l``: the log of the run under the cursor of the runs (else the schedule's newest run)."""
        runs = self.query_one(RunsTable)
        if not self.selection_holds("Run log"):
            return
        run = runs.selected_run if runs.has_focus else (self.recent[0] if self.recent else None)
        if run is None:
            self.notify("No run to show the log of (this schedule has no runs yet).", severity="warning")
            return
        backend, run_id = self.console.backend, run.id

        async def read(after: int) -> RunLog:
            return await backend.run_log(run_id, after=after)

        when = fmt.local_time(run.scheduled_at, self.console.display_zone)
        self.app.push_screen(LogScreen(read, f"Log of {run.name} · run {run_id} · {when}"))

    def action_older_runs(self) -> None:
        """``]``: the next page of runs, further back (by keyset)."""
        if self.page is None or self.page.next_before is None or self.selected_name is None:
            self.notify("No older runs.", severity="information")
            return
        self._pages.append(self.page.next_before)
        self.load_detail(self.selected_name)

    def action_newer_runs(self) -> None:
        """``[``: back towards the newest page."""
        if len(self._pages) == 1 or self.selected_name is None:
            self.notify("Already on the newest runs.", severity="information")
            return
        self._pages.pop()
        self.load_detail(self.selected_name)

    def on_resize(self) -> None:
        if self.console.views:
            views = self.table.views.values()
            self._title(len(views), sum(1 for view in views if last_status_is(view, "failed")))

    # -- creating, editing, deleting ----------------------------------------------------
    def _stored(self, action: str) -> ScheduleView | None:
        """The selected schedule, if ``action`` may go ahead on it: writable, connected, and
        a stored one (a schedule in code is refused, saying so)."""
        console = self.console
        if not console.may_act(action) or not self.selection_holds(action):
            return None
        view = console.view_of(self.selected_name)
        if view is None:
            self.notify(f"{action}: no schedule selected.", severity="warning")
            return None
        if view.source != "store":
            self.notify(defined_in_code(view.name), title=DEFINED_IN_CODE, severity="warning", markup=False)
            return None
        return view

    def action_create_schedule(self) -> None:
        """``n``: the form for a new schedule."""
        if self.console.may_act("Create schedule"):
            self.open_form(None)

    def action_update_schedule(self) -> None:
        """``E``: the form, filled in from the selected stored schedule."""
        view = self._stored("Edit schedule")
        if view is not None:
            self.open_form(view)

    def open_form(self, editing: ScheduleView | None) -> None:
        """Show the form at once (what is typed next goes into it), then offer it the targets
        the backend knows: the queues, and the durable functions that have run."""
        console = self.console
        zone = editing.timezone if editing is not None else "UTC"

        def saved(view: ScheduleView | None) -> None:
            if view is not None:
                self._saved(view, created=editing is None)

        form = ScheduleForm(console.backend, console.backend_now, editing=editing, zone=zone)
        self.app.push_screen(form, saved)
        self._offer_targets(form)

    @work(exclusive=True, group="schedule-form-open")
    async def _offer_targets(self, form: ScheduleForm) -> None:
        console = self.console
        backend = console.backend
        systems = console.info.systems if console.info is not None else ()
        queues: list[str] = []
        functions: list[str] = []
        try:
            if "jobs" in systems:
                queues = [q.name for q in await backend.list_queues()]
            if "durable" in systems:
                page = await backend.list_executions(limit=200)
                functions = sorted({e.function for e in page.executions})
        except Unavailable as exc:
            console.connection_lost(exc)
        except SchedtuiError as exc:
            console.report(exc)  # the form stays: a target can be typed
        if form.is_attached:
            form.offer(queues, functions)

    def _saved(self, view: ScheduleView, *, created: bool) -> None:
        console = self.console
        target = f" → {view.target.kind} {view.target.name}" if view.target is not None else ""
        if not view.enabled:
            when = "; disabled"
        elif view.next_fire_at is not None:
            when = f"; next fire {fmt.countdown(view.next_fire_at, console.backend_now())}"
        else:
            when = ""
        # What the backend stored, field by field: a field that went missing shows here.
        self.notify(f"{view.name}{target}{when}\n{stored_fields(view)}", title="Created" if created else "Saved",
                    markup=False)
        if created:
            console.views = [*[v for v in console.views if v.name != view.name], view]
        else:
            console.views = [view if v.name == view.name else v for v in console.views]
        self.show()
        self.select(view.name)
        console.request_refresh()

    def action_delete_schedule(self) -> None:
        """``D``: delete the selected stored schedule, once confirmed."""
        view = self._stored("Delete schedule")
        if view is None:
            return

        def answer(go: bool | None) -> None:
            if go:
                self._delete(view.name)

        facts = [f"It starts {view.target.kind} {view.target.name} on every slot."] if view.target is not None else []
        self.app.push_screen(Confirm.of("delete_schedule", {"name": view.name}, facts=facts), answer)

    @work(group="schedule-delete")
    async def _delete(self, name: str) -> None:
        console = self.console
        self._deleting = name  # (a refresh may show its row gone before the answer is here)
        try:
            try:
                await console.backend.delete_schedule(name)
            except SchedtuiError as exc:
                console.report(exc)
                return
            self.notify(f"{name} deleted; its runs stay in the ledger", title="Deleted", markup=False)
            console.views = [v for v in console.views if v.name != name]
            self.show()
        finally:
            self._deleting = None
        console.request_refresh()
