"""The operations console: a Textual app over one :class:`~backend.interface.Backend`.

The app knows nothing but the shared backend interface (embedded engine or remote server)
and an injected :class:`~backend.clock.Clock`:

* every backend call runs in a Textual worker, never in a message handler, so the UI keeps
  drawing while a call is in flight (the embedded backend runs its engine on a thread of its
  own, so a handler burning CPU cannot hold up the countdowns either);
* countdowns and ages are recomputed on every tick from absolute instants against
  ``clock.now()``; auto-refresh and reconnect backoff are due by the same clock, so a test
  that freezes a :class:`~backend.clock.ManualClock` gets a frozen, repeatable screen;
* every :class:`~backend.errors.SchedtuiError` becomes a notification with its title and
  message; a lost connection is shown in the header, the data is marked stale, and the app
  reconnects with backoff by itself.

The caller owns the backend's lifetime: it hands in a backend that is not yet connected, the
app connects it, and the caller closes it after the app has exited (or passes
``close_backend_on_exit=True``).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Input, Static

from backend.clock import Clock, SystemClock
from backend.errors import SchedtuiError, Unauthorized, Unavailable
from backend.interface import Backend, ConnectionInfo, RunsPage
from backend.model import BackfillProgress, Run, ScheduleView

from . import format as fmt
from .commands import ConsoleCommands
from .screens.backfill import BackfillScreen
from .screens.details import RunDetails
from .screens.help import HelpScreen
from .screens.prompt import NotePrompt
from .widgets import (
    ConsoleHeader,
    DetailBar,
    RunsTable,
    RunTimeline,
    SchedulesTable,
    UpcomingLine,
)

__all__ = ["PAGE_SIZE", "SchedtuiApp", "parse_keymap", "short_where"]

PAGE_SIZE = 50
"""Runs per page (the timeline shows the newest page)."""

BACKOFF_SECONDS = (1, 2, 4, 8, 15, 30)
"""Delays between reconnect attempts; the last one repeats."""


def short_where(info: ConnectionInfo) -> str:
    """Where the backend is, short enough for the header: a store path relative to the
    working directory (or ``~``) when it is under it; a URL as it is."""
    if info.kind != "embedded" or "://" in info.where:
        return info.where
    path = Path(info.where)
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            return prefix + str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return info.where


def parse_keymap(text: str) -> dict[str, str]:
    """``run_now=R,backfill=B`` (``$SCHEDTUI_KEYMAP``) into a Textual keymap."""
    keymap: dict[str, str] = {}
    for item in text.replace(";", ",").split(","):
        if "=" in item:
            binding_id, _, keys = item.partition("=")
            if binding_id.strip() and keys.strip():
                keymap[binding_id.strip()] = keys.strip()
    return keymap


class SchedtuiApp(App[None]):
    """The schedtui operations console (see the module docstring)."""

    CSS_PATH = "console.tcss"
    TITLE = "schedtui"
    COMMANDS = App.COMMANDS | {ConsoleCommands}

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "run_now", "Run now", id="run_now"),
        Binding("e", "toggle_enabled", "On/off", id="toggle_enabled"),
        Binding("b", "backfill", "Backfill", id="backfill"),
        Binding("enter", "run_details", "Details", id="run_details", show=False),
        Binding("slash", "filter", "Filter", id="filter"),
        Binding("p", "toggle_pause", "Pause", id="toggle_pause"),
        Binding("ctrl+r", "refresh", "Refresh", id="refresh"),
        Binding("right_square_bracket", "older_runs", "Older runs", id="older_runs", show=False),
        Binding("left_square_bracket", "newer_runs", "Newer runs", id="newer_runs", show=False),
        Binding("escape", "clear_filter", "Clear filter", id="clear_filter", show=False),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    PALETTE_ACTIONS: ClassVar[list[tuple[str, str, str]]] = [
        ("run_now", "Run now: {name}", "fire it once, now, as a manual run (r)"),
        ("toggle_enabled", "Enable/disable: {name}", "toggle; disabling asks for an optional note (e)"),
        ("backfill", "Backfill: {name}", "fire the slots of a past range (b)"),
        ("run_details", "Run details", "every field of the selected run (enter)"),
        ("older_runs", "Older runs", "the next page of runs, further back (])"),
        ("newer_runs", "Newer runs", "back towards the newest runs ([)"),
        ("filter", "Filter schedules", "show only the schedules matching a text (/)"),
        ("toggle_pause", "Pause or resume auto-refresh", "countdowns keep ticking (p)"),
        ("refresh", "Refresh now", "read everything again (ctrl+r)"),
        ("help", "Help: keys and legend", "statuses and outcomes explained (?)"),
    ]
    """(action, title, help) offered by name in the command palette."""

    class Refreshed(Message):
        """Posted after every successful refresh (tests and the benchmark wait on it)."""

    class RunShown(Message):
        """Posted once a run started with Run now is on screen."""

        def __init__(self, run: Run) -> None:
            super().__init__()
            self.run = run

    selected_name: reactive[str | None] = reactive(None, init=False)
    """The schedule under the cursor; its runs and next fire times are shown."""
    paused: reactive[bool] = reactive(False, init=False)
    """Auto-refresh paused (``p``); countdowns keep ticking."""
    read_only: reactive[bool] = reactive(False, init=False)
    """Actions do nothing but say why (``--read-only`` or a read token)."""
    filter_text: reactive[str] = reactive("", init=False)
    """Only schedules whose name, cron, zone or description contain this are shown."""

    def __init__(
        self,
        backend: Backend,
        clock: Clock | None = None,
        *,
        where: str | None = None,
        refresh_interval: float = 1.0,
        read_only: bool = False,
        keymap: dict[str, str] | None = None,
        after_connect: Callable[[Backend], Awaitable[None]] | None = None,
        close_backend_on_exit: bool = False,
    ) -> None:
        super().__init__()
        self.backend = backend
        """The only thing the console talks to."""
        self.clock: Clock = clock or SystemClock()
        """Where every countdown, age and refresh deadline gets the time."""
        self.where = where
        """What the header shows as the backend's location (default: :func:`short_where`)."""
        self.refresh_interval = timedelta(seconds=refresh_interval)
        self.read_only_flag = read_only
        """Read-only because the operator asked for it (as opposed to a read token)."""
        self.after_connect = after_connect
        self.close_backend_on_exit = close_backend_on_exit
        self.info: ConnectionInfo | None = None
        """What the backend said on the last successful connect."""
        self.views: list[ScheduleView] = []
        """Every schedule, as of the last refresh, in the backend's order."""
        self.page: RunsPage | None = None
        """The runs page on screen for the selected schedule."""
        self.recent: list[Run] = []
        """The newest page of the selected schedule (the timeline)."""
        self._pages: list[str | None] = [None]
        self._snapshot_now: datetime | None = None
        self._snapshot_at: datetime | None = None
        self._next_refresh: datetime | None = None
        self._retry_at: datetime | None = None
        self._failures = 0
        self._refreshing = False
        self._refresh_again = False
        self._lost_reported = False
        self._connected_once = False
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            self.animation_level = "none"  # over SSH and in tmux: no animations unless asked
        if keymap:
            self.set_keymap(keymap)

    # ------------------------------------------------------------------------------------
    # layout
    # ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield ConsoleHeader(id="header")
        yield Input(placeholder="filter schedules by name, cron, zone or description", id="filter")
        with Vertical(id="main"):
            yield Static("SCHEDULES", id="schedules-title", classes="section")
            yield SchedulesTable(id="schedules")
            yield DetailBar(id="detail")
            yield RunTimeline(id="timeline")
            yield UpcomingLine(id="upcoming")
            yield RunsTable(id="runs")
        with Horizontal(id="footer-bar"):
            yield Static("", id="mode")
            yield Footer(id="footer", compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        header = self.query_one(ConsoleHeader)
        header.now = self.clock.now()
        self.query_one("#filter", Input).display = False
        self.query_one(SchedulesTable).focus()
        self._update_read_only()
        self.set_interval(0.5, self.tick, name="tick")
        self.refresh_data()

    async def on_unmount(self) -> None:
        if self.close_backend_on_exit:
            try:
                await self.backend.close()
            except SchedtuiError:
                pass

    # ------------------------------------------------------------------------------------
    # time
    # ------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Recompute countdowns and ages from ``clock.now()``; start a refresh when one is
        due. A timer calls this twice a second; a test that moves a ManualClock calls it."""
        now = self.clock.now()
        try:
            header = self.query_one(ConsoleHeader)
            table = self.query_one(SchedulesTable)
        except NoMatches:  # a last tick while the app shuts down
            return
        header.now = now
        table.tick(now)
        if self._refreshing:
            return
        if self._retry_at is not None:
            if now >= self._retry_at:
                self.refresh_data()
        elif not self.paused and self._next_refresh is not None and now >= self._next_refresh:
            self.refresh_data()

    def backend_now(self) -> datetime:
        """The backend's clock, estimated: its ``now`` at the last snapshot plus the time
        since (so ``now`` typed in the backfill dialog is never ahead of the server)."""
        if self._snapshot_now is None or self._snapshot_at is None:
            return self.clock.now()
        return self._snapshot_now + (self.clock.now() - self._snapshot_at)

    # ------------------------------------------------------------------------------------
    # refreshing
    # ------------------------------------------------------------------------------------
    def request_refresh(self) -> None:
        """Refresh as soon as the refresh in flight (if any) is done."""
        if self._refreshing:
            self._refresh_again = True
        else:
            self.refresh_data()

    @work(group="refresh", exit_on_error=False)
    async def refresh_data(self) -> None:
        """Connect if need be, then read the schedules and the selected schedule's runs."""
        if self._refreshing:
            self._refresh_again = True
            return
        self._refreshing = True
        try:
            while True:
                self._refresh_again = False
                await self._refresh_once()
                if not self._refresh_again:
                    break
        finally:
            self._refreshing = False

    async def _refresh_once(self) -> None:
        try:
            if self.info is None or self._retry_at is not None:
                info = await self.backend.connect()
                await self._connected(info)
            snapshot = await self.backend.list_schedules()
            name = self.selected_name
            recent: RunsPage | None = None
            page: RunsPage | None = None
            upcoming: list[datetime] | None = None
            if name is not None and any(v.name == name for v in snapshot.schedules):
                recent, page, upcoming = await self._fetch_detail(name)
        except Unavailable as exc:
            self._lost(exc)
            return
        except Unauthorized as exc:
            self._give_up(exc)
            return
        except SchedtuiError as exc:
            if self.info is None:
                self._give_up(exc)
            else:
                self.report(exc)
                self._next_refresh = self.clock.now() + self.refresh_interval
            return
        except Exception as exc:  # never a traceback on the operator's screen
            self.log.error(f"refresh failed: {exc!r}")
            self.report(exc)
            self._next_refresh = self.clock.now() + self.refresh_interval
            return
        now = self.clock.now()
        self._snapshot_now, self._snapshot_at = snapshot.now, now
        if self._retry_at is not None or self._lost_reported:
            if self._lost_reported:
                self.notify("Connection is back; data is fresh again.", title="Reconnected")
            self._lost_reported = False
        self._retry_at = None
        self._failures = 0
        self._next_refresh = now + self.refresh_interval
        header = self.query_one(ConsoleHeader)
        header.state = "live"
        header.last_ok = now
        header.retry_at = None
        header.now = now
        self.query_one("#main").remove_class("-stale")
        self.views = snapshot.schedules
        self._show_schedules()
        if name is not None and name == self.selected_name and recent is not None and page is not None:
            self._show_detail(name, recent, page, upcoming or [])
        self.post_message(self.Refreshed())

    async def _connected(self, info: ConnectionInfo) -> None:
        first = self.info is None
        self.info = info
        header = self.query_one(ConsoleHeader)
        header.info = info
        header.where = self.where or short_where(info)
        self.read_only = self.read_only_flag or info.read_only or self.backend.read_only
        if first and self.after_connect is not None:
            try:
                await self.after_connect(self.backend)
            except SchedtuiError as exc:
                self.report(exc)

    def _lost(self, exc: Unavailable) -> None:
        now = self.clock.now()
        delay = BACKOFF_SECONDS[min(self._failures, len(BACKOFF_SECONDS) - 1)]
        self._failures += 1
        self._retry_at = now + timedelta(seconds=delay)
        header = self.query_one(ConsoleHeader)
        header.state = "lost"
        header.retry_at = self._retry_at
        header.now = now
        self.query_one("#main").add_class("-stale")
        if not self._lost_reported:
            self._lost_reported = True
            self.notify(f"{exc.message}. Retrying by itself; the data on screen is stale.", title=exc.title,
                        severity="error", markup=False)

    def _give_up(self, exc: SchedtuiError) -> None:
        """A connect that cannot succeed by retrying (a wrong token): say so and wait for ctrl+r."""
        self._retry_at = None
        self._next_refresh = None
        header = self.query_one(ConsoleHeader)
        header.state = "error" if self.info is None else "lost"
        if self.info is not None:
            self.query_one("#main").add_class("-stale")
        self.report(exc)

    def report(self, exc: BaseException) -> None:
        """Show an error as a notification: its title and its message, never a traceback."""
        if isinstance(exc, SchedtuiError):
            self.notify(exc.message, title=exc.title, severity="error", markup=False, timeout=8)
        else:
            self.notify(f"{type(exc).__name__}: {exc}", title="Unexpected error", severity="error", markup=False)

    # ------------------------------------------------------------------------------------
    # showing
    # ------------------------------------------------------------------------------------
    def _visible_views(self) -> list[ScheduleView]:
        needle = self.filter_text.strip().lower()
        if not needle:
            return self.views
        return [
            v
            for v in self.views
            if needle in v.name.lower()
            or needle in v.cron.lower()
            or needle in v.timezone.lower()
            or needle in (v.description or "").lower()
        ]

    @property
    def schedule_names(self) -> list[str]:
        """Every schedule's name, in the backend's order."""
        return [v.name for v in self.views]

    def view_of(self, name: str | None) -> ScheduleView | None:
        return next((v for v in self.views if v.name == name), None)

    def _show_schedules(self) -> None:
        table = self.query_one(SchedulesTable)
        visible = self._visible_views()
        table.show(visible, self.clock.now())
        title = f"SCHEDULES {len(visible)}"
        if self.filter_text:
            title += f" of {len(self.views)} · filter “{self.filter_text}” (esc clears)"
        self.query_one("#schedules-title", Static).update(title)
        self.selected_name = table.selected_name
        view = self.view_of(self.selected_name)
        detail = self.query_one(DetailBar)
        if view is not None and view != detail.view:
            detail.view = view

    def _show_detail(self, name: str, recent: RunsPage, page: RunsPage, upcoming: list[datetime]) -> None:
        view = self.view_of(name)
        zone = view.timezone if view is not None else "UTC"
        self.recent = recent.runs
        self.page = page
        self.query_one(RunTimeline).runs = recent.runs
        self.query_one(RunsTable).show(page.runs, zone)
        line = self.query_one(UpcomingLine)
        line.zone = zone
        line.slots = upcoming
        if view is not None and not view.enabled:
            line.note = "disabled: will not fire"
        elif view is not None and view.trigger == "external":
            line.note = "fired by the platform's scheduler"
        else:
            line.note = ""
        self.query_one(DetailBar).page = "" if len(self._pages) == 1 else f"page {len(self._pages)} · [ newer"

    def watch_selected_name(self, old: str | None, new: str | None) -> None:
        if old == new:
            return
        self._pages = [None]
        self.query_one(DetailBar).view = self.view_of(new)
        if new is None:
            self.query_one(RunTimeline).runs = []
            self.query_one(RunsTable).show([], "UTC")
            self.query_one(UpcomingLine).slots = []
            return
        self.load_detail(new)

    async def _fetch_detail(self, name: str) -> tuple[RunsPage, RunsPage, list[datetime]]:
        """A schedule's newest runs (for the timeline), the page of runs on screen (the same,
        unless the operator paged back), and its next slots."""
        recent = await self.backend.list_runs(name, limit=PAGE_SIZE)
        before = self._pages[-1]
        page = recent if before is None else await self.backend.list_runs(name, limit=PAGE_SIZE, before=before)
        return recent, page, await self.backend.upcoming(name, 5)

    @work(exclusive=True, group="detail", exit_on_error=False)
    async def load_detail(self, name: str) -> None:
        """Read the selected schedule's newest runs (or the page on screen) and next slots."""
        try:
            recent, page, upcoming = await self._fetch_detail(name)
        except Unavailable as exc:
            self._lost(exc)
            return
        except SchedtuiError as exc:
            self.report(exc)
            return
        if name == self.selected_name:
            self._show_detail(name, recent, page, upcoming)

    @on(DataTable.RowHighlighted, "#schedules")
    def _schedule_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.selected_name = event.row_key.value

    @on(DataTable.RowSelected)
    def _row_selected(self) -> None:
        self.action_run_details()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.display = False
        self.query_one(SchedulesTable).focus()

    def watch_filter_text(self) -> None:
        self._show_schedules()

    def watch_read_only(self) -> None:
        self._update_read_only()

    def watch_paused(self, paused: bool) -> None:
        self.query_one(ConsoleHeader).paused = paused

    def _update_read_only(self) -> None:
        self.query_one(ConsoleHeader).read_only = self.read_only
        mode = self.query_one("#mode", Static)
        mode.update(" READ-ONLY: r e b disabled " if self.read_only else "")
        mode.display = self.read_only

    # ------------------------------------------------------------------------------------
    # actions
    # ------------------------------------------------------------------------------------
    def _read_only_reason(self) -> str | None:
        if not self.read_only:
            return None
        if self.read_only_flag:
            return "the console was started with --read-only"
        if self.info is not None and self.info.kind == "remote":
            return "the token may only read"
        return "the backend is read-only"

    def _target(self, action: str, *, acting: bool = True) -> ScheduleView | None:
        """The selected schedule, if ``action`` may go ahead; otherwise say why not."""
        if acting and self.read_only:
            self.notify(f"{action} does nothing here: {self._read_only_reason()}.", title="Read-only", severity="warning")
            return None
        if self.info is None:
            self.notify(f"{action}: not connected yet.", title="Not connected", severity="warning")
            return None
        view = self.view_of(self.selected_name)
        if view is None:
            self.notify(f"{action}: no schedule selected.", severity="warning")
        return view

    def action_run_now(self) -> None:
        """``r``: fire the selected schedule once, now; no dialog."""
        view = self._target("Run now")
        if view is not None:
            self._run_now(view.name)

    @work(group="action", exit_on_error=False)
    async def _run_now(self, name: str) -> None:
        try:
            run = await self.backend.run_now(name)
        except SchedtuiError as exc:
            self.report(exc)
            return
        self.notify(f"{name}: run {run.id}", title="Run now: fired")
        self._show_new_run(run)
        self.post_message(self.RunShown(run))
        self._follow_run(run, name)
        self.request_refresh()

    def _show_new_run(self, run: Run) -> None:
        """Put a run on screen at once (the next refresh confirms it)."""
        view = self.view_of(run.name)
        if view is not None:
            self.views = [replace(v, last_run=run) if v.name == run.name else v for v in self.views]
            self._show_schedules()
        if run.name != self.selected_name:
            return
        self.recent = [run, *[r for r in self.recent if r.id != run.id]][:PAGE_SIZE]
        self.query_one(RunTimeline).runs = self.recent
        if len(self._pages) == 1:
            self.query_one(RunsTable).show(self.recent, view.timezone if view is not None else "UTC")

    @work(group="follow", exit_on_error=False)
    async def _follow_run(self, run: Run, name: str) -> None:
        try:
            final = await self.backend.wait_run(run.id)
        except SchedtuiError as exc:
            self.report(exc)
            return
        glyph = fmt.STATUS_GLYPHS.get(final.status, "?")
        detail = f" [{final.error_tag}] {final.error_message}" if final.error_tag else ""
        self.notify(
            f"{name}: run {final.id} {glyph} {final.status} in {fmt.duration(final.duration_ms)}{detail}",
            title="Run finished",
            severity="information" if final.status == "succeeded" else "warning",
            markup=False,
        )
        self.request_refresh()

    def action_toggle_enabled(self) -> None:
        """``e``: enable or disable; disabling asks for an optional note (Enter skips it)."""
        view = self._target("Enable/disable")
        if view is None:
            return
        if not view.enabled:
            self._set_enabled(view.name, True, None)
            return

        def disable(note: str | None) -> None:
            if note is not None:
                self._set_enabled(view.name, False, note or None)

        self.push_screen(NotePrompt(view.name), disable)

    @work(group="action", exit_on_error=False)
    async def _set_enabled(self, name: str, enabled: bool, note: str | None) -> None:
        try:
            view = await self.backend.set_enabled(name, enabled, note=note)
        except SchedtuiError as exc:
            self.report(exc)
            return
        if view.enabled:
            nxt = f"; next fire {fmt.countdown(view.next_fire_at, self.clock.now())}" if view.next_fire_at else ""
            self.notify(f"{name} enabled{nxt}", title="Enabled")
        else:
            self.notify(f"{name} disabled" + (f": {note}" if note else ""), title="Disabled", markup=False)
        self.views = [view if v.name == name else v for v in self.views]
        self._show_schedules()
        self.query_one(DetailBar).view = view
        self.request_refresh()

    def action_backfill(self) -> None:
        """``b``: the backfill dialog for the selected schedule."""
        view = self._target("Backfill")
        if view is None:
            return

        def finished(progress: BackfillProgress) -> None:
            self.notify(
                f"{progress.name}: {progress.fired} fired, {progress.succeeded} succeeded, "
                f"{progress.failed} failed, {progress.remaining} remaining ({progress.state})",
                title="Backfill finished",
                severity="information" if progress.state == "done" and not progress.failed else "warning",
            )
            self.request_refresh()

        self.push_screen(BackfillScreen(self.backend, view, self.backend_now, on_finished=finished))

    def action_run_details(self) -> None:
        """``enter``: every field of the run under the runs table's cursor."""
        runs = self.query_one(RunsTable)
        run = runs.selected_run
        if run is None:
            self.notify("No run selected (this schedule has no runs yet).", severity="warning")
            return
        view = self.view_of(run.name)
        self.push_screen(RunDetails(self.backend, run, view.timezone if view is not None else "UTC"))

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

    def action_filter(self) -> None:
        """``/``: filter the schedules."""
        field = self.query_one("#filter", Input)
        field.display = True
        field.focus()

    def action_clear_filter(self) -> None:
        field = self.query_one("#filter", Input)
        if field.display or self.filter_text:
            field.value = ""
            field.display = False
            self.query_one(SchedulesTable).focus()

    def action_toggle_pause(self) -> None:
        """``p``: pause or resume auto-refresh."""
        self.paused = not self.paused
        if self.paused:
            self.notify("Auto-refresh paused; countdowns keep ticking. p resumes, ctrl+r refreshes once.", title="Paused")
        else:
            self.notify("Auto-refresh resumed.", title="Resumed")
            self.request_refresh()

    def action_refresh(self) -> None:
        """``ctrl+r``: read everything again now (and retry a lost connection now)."""
        if self._retry_at is not None:
            self._retry_at = self.clock.now()
        if self.info is None:
            self.query_one(ConsoleHeader).state = "connecting"
        self.request_refresh()

    def action_help(self) -> None:
        """``?``: keys and the legend."""
        keys = []
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.action in ("clear_filter",):
                continue
            bound = self._bound_key(binding)
            keys.append((bound, binding.description))
        keys.append(("ctrl+p", "command palette: every action by name, go to a schedule"))
        self.push_screen(HelpScreen(keys, self._read_only_reason()))

    def _bound_key(self, binding: Binding) -> str:
        """The key a binding has now (a keymap may have moved it), as the footer shows keys."""
        for active in self.screen.active_bindings.values():
            if active.binding.id is not None and active.binding.id == binding.id:
                return self.get_key_display(active.binding)
        return self.get_key_display(binding)

    def action_select(self, name: str) -> None:
        """Move the cursor to a schedule (the palette's "Go to schedule")."""
        table = self.query_one(SchedulesTable)
        if name not in table.views:
            self.action_clear_filter()
        try:
            table.move_cursor(row=table.get_row_index(name), animate=False)
        except Exception:
            self.notify(f"no schedule named {name}", severity="warning")
            return
        table.focus()
