"""The operations console: a Textual app over one :class:`~backend.client.interface.Backend`.

The app knows nothing but the shared backend interface (embedded engine or remote server)
and an injected :class:`~backend.clock.Clock`:

* numbered views (:mod:`console.views`): ``1`` schedules, ``2`` timeline, ``3``-``7`` the
  jobs, durable, locks, audit and health views when the backend offers their systems; each
  view keeps its selection while another is on screen;
* every backend call runs in a Textual worker, never in a message handler, so the UI keeps
  drawing while a call is in flight (the embedded backend runs its engine on a thread of its
  own, so a handler burning CPU cannot hold up the countdowns either);
* countdowns and ages are recomputed on every tick from absolute instants against
  ``clock.now()``; auto-refresh and reconnect backoff are due by the same clock, so a test
  that freezes a :class:`~backend.clock.ManualClock` gets a frozen, repeatable screen;
* every :class:`~backend.errors.SchedtuiError` becomes a notification with its title and
  message; a lost connection is shown in the header, the data is marked stale, and the app
  reconnects with backoff by itself (at most 5 s apart); a token the server refuses (or
  one it wants and did not get) stays in the header, with how to give one;
* the data stays fresh by change signals (:meth:`~backend.client.interface.Backend.changes`: the
  server's event stream, or the embedded engine's bus): a signal that names what is on
  screen makes the app read it again, and nothing is read while nothing changes (the
  heartbeats excepted, and everything now and then). While the stream is down the app
  polls every ``refresh_interval`` and tries the stream again with backoff; the header says
  which (``● live (events)`` or ``(polling)``). A stream that breaks is news at once: the
  header stops saying live and the server is asked at once; a reconnect opens the stream
  again at once. When to read, and as of when the data is true, is decided by the app's
  :class:`~console.link.Link` (plain state, no widgets); the app reads and shows.

The app is in four parts: this module (the layout, the views, the filter, what the
view keys do), :mod:`console.reading` (connecting, reading, following change signals),
:mod:`console.schedule_actions` (the actions on the schedule selected) and
:mod:`console.keyboard` (every key by its action, read-only refusals, the help's lists).

The caller owns the backend's lifetime: it hands in a backend that is not yet connected, the
app connects it, and the caller closes it after the app has exited (or passes
``close_backend_on_exit=True``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import ClassVar

from textual import events, on
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.filter import LineFilter
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, Input, Static, TextArea

from backend.client.interface import SYSTEMS, Backend
from backend.clock import Clock, SystemClock
from backend.errors import BadInput, SchedtuiError
from backend.model import Run, ScheduleView
from backend.safetext import printable
from console import format as fmt
from console.commands import ConsoleCommands
from console.driver import batched
from console.fleet import CronCache, Overdue
from console.heap import Collector, freeze_heap, lines_without_cycles
from console.keyboard import NAVIGATION, Keyboard
from console.keygate import KeyGate
from console.keys import Key, bindings
from console.link import LATE_AFTER, Link
from console.reading import Reading, short_where
from console.schedule_actions import ScheduleActions
from console.screens.details import RunDetails
from console.unprintable import Unprintable
from console.views import VIEWS, UnavailableView, View, view_spec
from console.views.schedules import PAGE_SIZE, last_status_is
from console.widgets import ConsoleHeader, FleetBanner
from console.widgets.bounded import LINE_CHARS, BoundedInput
from console.widgets.command_line import CommandLine, commands_of
from console.widgets.footer import KeyFooter
from console.widgets.tabs import ViewTabs

__all__ = ["NAVIGATION", "PAGE_SIZE", "STATUS_FILTERS", "SchedtuiApp", "freeze_heap", "parse_keymap", "short_where"]

STATUS_FILTERS = ("failed", "succeeded", "skipped", "missed", "running", "overdue", "disabled", "enabled", "manual")
"""Filter words that also match by state: ``/failed`` shows the schedules whose last run
failed (besides those whose name, cron, zone or description contain the word)."""


def parse_keymap(text: str) -> dict[str, str]:
    """``run_now=R,backfill=B`` (``$SCHEDTUI_KEYMAP``) into a Textual keymap. Refused
    (:class:`~backend.errors.BadInput`, naming it) rather than half taken: an item without
    ``=`` or without a key, an id no key has, a key two ids would share, and a key of the
    console's own (``q``, ``1``-``7``, ``?``…) given to another id: ``run_now=q`` made
    ``q`` fire the selected schedule, without a word."""
    ids = {key.binding_id for key in _every_key()}
    own = {key.key: key.binding_id for key in SchedtuiApp.KEYS}
    keymap: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.replace(";", ",").split(","))):
        binding_id, equals, key = (part.strip() for part in item.partition("="))
        if not equals or not binding_id or not key:
            raise BadInput(f"SCHEDTUI_KEYMAP: {printable(item, 60)!r} is not ID=KEY (such as run_now=R)")
        if binding_id not in ids:
            raise BadInput(f"SCHEDTUI_KEYMAP: no key has the id {printable(binding_id, 60)!r} (the ids are in the "
                           "README's table of keys, and in the help)")  # fmt: skip
        taken = own.get(key) or next((other for other, given in keymap.items() if given == key), None)
        if taken is not None and taken != binding_id:
            raise BadInput(f"SCHEDTUI_KEYMAP: {printable(key, 20)!r} is the key of {taken}; give {binding_id} another")
        keymap[binding_id] = key
    _check_views(keymap)
    return keymap


def _check_views(keymap: dict[str, str]) -> None:
    """Refuse a key given to an id that another key of the same view has (the app's keys
    count on every view), or that the view moves by: ``run_now=e`` made ``e`` fire the
    selected schedule, the disable it was left without a key, without a word. The views
    share keys between them (``x`` deletes a job, releases a lock)."""
    for spec in VIEWS:
        if spec.make is None:
            continue
        place: dict[str, str] = {}
        for key in (*SchedtuiApp.KEYS, *spec.make.KEYS):
            binding_id = key.binding_id
            for pressed in [keymap[binding_id]] if binding_id in keymap else key.key.split(","):
                other = place.setdefault(pressed, binding_id)
                if other != binding_id and (binding_id in keymap or other in keymap):
                    given, taken = (binding_id, other) if binding_id in keymap else (other, binding_id)
                    raise BadInput(f"SCHEDTUI_KEYMAP: {printable(pressed, 20)!r} is the key of {taken} on the "
                                   f"{spec.title} view; give {given} another")  # fmt: skip
        for keys, what in NAVIGATION.get(spec.id, ()):
            for pressed in keys:
                moved = place.get(pressed)
                if moved is not None and moved in keymap:
                    raise BadInput(f"SCHEDTUI_KEYMAP: {printable(pressed, 20)!r} is the {spec.title} view's key: "
                                   f"{what.split(' (')[0]}; give {moved} another")  # fmt: skip


def _every_key() -> tuple[Key, ...]:
    """The app's keys and every view's."""
    return (*SchedtuiApp.KEYS, *(key for spec in VIEWS if spec.make is not None for key in spec.make.KEYS))


def _view_keys() -> tuple[Key, ...]:
    """``1``…``7``; the footer shows them as one entry, ``1-7 Views``."""
    return tuple(
        Key(spec.key, f"show_view('{spec.id}')", "Views" if i == 0 else spec.title, id=f"view_{spec.id}", title=spec.title,
            help=f"{spec.title}: {spec.help}", show=i == 0, key_display=f"1-{len(VIEWS)}" if i == 0 else None)
        for i, spec in enumerate(VIEWS)
    )  # fmt: skip


class SchedtuiApp(Reading, ScheduleActions, Keyboard):
    """The schedtui operations console (see the module docstring)."""

    CSS_PATH = "console.tcss"
    TITLE = "schedtui"
    COMMANDS = App.COMMANDS | {ConsoleCommands}

    KEYS: ClassVar[tuple[Key, ...]] = (
        *_view_keys(),
        Key("z", "toggle_zone", "Zone", help="times in UTC / in your zone"),
        Key("p", "toggle_pause", "Pause", help="pause auto-refresh (countdowns keep ticking)"),
        Key("ctrl+r", "refresh", "Refresh", help="refresh now (and retry a lost connection)"),
        Key("escape", "clear_filter", "Clear filter", show=False, help="clear the filter"),
        Key("question_mark", "help", "Help", help="this help"),
        Key("q", "quit", "Quit", help="quit (asks while a backfill started here runs)"),
        # (priority: on a pop-up, the screen's copy key would take it first)
        Key("ctrl+c", "quit", "Quit", id="quit_ctrl_c", show=False, priority=True, help="quit, as q does"),
        Key("colon", "command_line", "Command", show=False, priority=True,
            help="command line: :jobs, :locks … (a view by name), :help, :q"),
    )
    """The keys of every view; each view adds its own (:attr:`console.views.base.View.KEYS`)."""
    BINDINGS: ClassVar[list[BindingType]] = bindings(KEYS)

    PALETTE_ACTIONS: ClassVar[list[tuple[str, str, str]]] = [
        ("run_now", "Run now: {name}", "fire it once, now, as a manual run"),
        ("toggle_enabled", "Enable/disable: {name}", "toggle; disabling asks for an optional note"),
        ("backfill", "Backfill: {name}", "fire the slots of a past range (or see the one running)"),
        ("stop_backfill", "Stop backfill: {name}", "stop the backfill running for it, wherever it runs (asks)"),
        ("run_details", "Run details", "every field of the selected run"),
        ("filter", "Filter schedules", "by name, cron, zone, description, or a state: failed, overdue, disabled…"),
        ("toggle_zone", "Show times in UTC / in my zone", "the zone every time on screen is shown in"),
        ("toggle_pause", "Pause or resume auto-refresh", "countdowns keep ticking"),
        ("refresh", "Refresh now", "read everything again"),
        ("help", "Help: keys and legend", "statuses, outcomes and timeline marks explained"),
    ]
    """(action, title, help) offered by name in the command palette (the views are added; the
    key that runs the action, as bound now, follows the help: :meth:`palette_key`)."""

    class RunShown(Message):
        """Posted once a run started with Run now is on screen."""

        def __init__(self, run: Run) -> None:
            super().__init__()
            self.run = run

    paused: reactive[bool] = reactive(False, init=False)
    """Auto-refresh paused (``p``); countdowns keep ticking."""
    read_only: reactive[bool] = reactive(False, init=False)
    """Actions do nothing but say why (``--read-only`` or a read token)."""
    filter_text: reactive[str] = reactive("", init=False)
    """Only schedules matching this are shown (see :meth:`visible_views`)."""
    utc: reactive[bool] = reactive(False, init=False)
    """Times are shown in UTC rather than in the operator's zone (``z``)."""
    active_view_id: reactive[str] = reactive("schedules", init=False)

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
        operator_zone: str | None = None,
        live_events: bool = True,
        freeze_heap: bool = False,
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
        self.operator_zone = operator_zone or fmt.operator_zone()
        """The zone times are shown in unless ``z`` switched to UTC."""
        self.info = None
        self.views = []
        self.crons = CronCache()
        self.overdue = Overdue(self.crons)
        self._init_reading()
        self._init_actions()
        self.link = Link(self.clock, self.refresh_interval)
        """When to read again, and as of when the data on screen is true (:mod:`console.link`)."""
        self.live_events = live_events
        """Follow the backend's change signals (off: poll every ``refresh_interval``)."""
        self._freeze_heap = freeze_heap
        """Freeze the heap once the first screen is drawn (:func:`freeze_heap`) and pace the
        full collections from then on (:attr:`collector`): for the console's own process
        (``schedtui console``), not for tests that run many apps in one."""
        self.collector = Collector()
        lines_without_cycles()
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            self.animation_level = "none"  # over SSH and in tmux: no animations unless asked
        if keymap:
            self.set_keymap(keymap)
        self.key_gate = KeyGate(self, super().on_event)
        """Routes each key once the one before has done what it does (:mod:`console.keygate`)."""
        self.unprintable = Unprintable()
        """Applied to every line drawn: no stored text's escape sequence reaches the terminal."""

    def get_line_filters(self) -> Sequence[LineFilter]:
        return [*super().get_line_filters(), self.unprintable]

    # ------------------------------------------------------------------------------------
    # layout
    # ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield ConsoleHeader(id="header")
        yield FleetBanner(id="fleet-banner")
        yield ViewTabs(id="tabs")
        yield BoundedInput(placeholder="filter by name, cron, zone, description, or failed / overdue / disabled …", id="filter",
                           limit=LINE_CHARS, unit="characters", what="The filter")
        yield CommandLine(commands_of((spec.id, spec.key) for spec in VIEWS), id="command")
        with ContentSwitcher(initial="schedules", id="main"):
            for spec in VIEWS:
                if spec.make is not None:
                    yield spec.make()  # a view's id is its spec's
                else:
                    yield UnavailableView(
                        f"{spec.key} {spec.title}",
                        f"This schedtui has no {spec.system} system yet; the view comes with it ({spec.help}).",
                        id=spec.id,
                    )
        with Horizontal(id="footer-bar"):
            yield Static("", id="mode")
            yield KeyFooter(id="footer")

    def on_mount(self) -> None:
        header = self.query_one(ConsoleHeader)
        header.now = self.clock.now()
        header.late_after = self.refresh_interval + LATE_AFTER
        self.query_one("#filter", Input).display = False
        self.query_one(CommandLine).display = False
        self._update_tabs()
        self.active_view.focus_main()
        self._update_read_only()
        self.set_interval(0.5, self.tick, name="tick")
        self.refresh_data()

    def get_driver_class(self) -> type[Driver]:
        return batched(super().get_driver_class())  # a paste of many keys wakes the loop once (console.driver)

    async def on_event(self, event: events.Event) -> None:
        if self.key_gate.takes(event):
            self.collector.busy()
            self.key_gate.arrive(event)
            return
        await super().on_event(event)

    async def on_unmount(self) -> None:
        self.collector.stop()
        await self.key_gate.close()
        if self._events_task is not None:
            self._events_task.cancel()
            await asyncio.gather(self._events_task, return_exceptions=True)
        if self.close_backend_on_exit:
            try:
                await self.backend.close()
            except SchedtuiError:
                pass

    @property
    def active_view(self) -> View:
        view = self.query_one(f"#{self.active_view_id}")
        assert isinstance(view, View)
        return view

    def view_widget(self, view_id: str) -> View:
        view = self.query_one(f"#{view_id}")
        assert isinstance(view, View)
        return view

    def _update_tabs(self) -> None:
        systems = self.info.systems if self.info is not None else SYSTEMS
        tabs = self.query_one(ViewTabs)
        tabs.tabs = tuple((s.id, s.key, s.title, s.make is not None and s.system in systems) for s in VIEWS)
        tabs.active = self.active_view_id
        tabs.zone = self.display_zone

    # ------------------------------------------------------------------------------------
    # time
    # ------------------------------------------------------------------------------------
    @property
    def display_zone(self) -> str:
        """The zone every time on screen is shown in (each schedule's cron and next fires
        excepted: those are in the schedule's own zone)."""
        return "UTC" if self.utc else self.operator_zone

    def tick(self) -> None:
        """Recompute countdowns and ages from ``clock.now()``; start a refresh when one is
        due. A timer calls this twice a second; a test that moves a ManualClock calls it."""
        now = self.clock.now()
        try:
            header = self.query_one(ConsoleHeader)
            view = self.active_view
        except NoMatches:  # a last tick while the app shuts down
            return
        header.now = now
        self.query_one(FleetBanner).now = now
        view.tick(now)
        self.collector.tick()
        if self.link.stream_due(connected=self.info is not None):
            self._start_events()
        if self._refreshing:
            return
        if self.refresh_signalled() or self.probe_silence(now):
            return
        due = self.link.due(paused=self.paused)
        if due == "refresh":
            self.refresh_data()
        elif due == "instances":
            self.refresh_instances()

    def backend_now(self) -> datetime:
        """The backend's clock, estimated (see :meth:`console.link.Link.backend_now`)."""
        return self.link.backend_now()

    def data_now(self) -> datetime:
        """The backend's time as of which the data on screen is true (see
        :meth:`console.link.Link.data_now`)."""
        return self.link.data_now(paused=self.paused)

    # ------------------------------------------------------------------------------------
    # data for the views
    # ------------------------------------------------------------------------------------
    def visible_views(self) -> list[ScheduleView]:
        """The schedules the filter lets through: its text in the name, cron, zone or
        description, or a state word (:data:`STATUS_FILTERS`) that the schedule is in."""
        needle = self.filter_text.strip().lower()
        if not needle:
            return self.views
        now = self.data_now()

        def state_matches(view: ScheduleView) -> bool:
            if needle in ("failed", "succeeded", "skipped", "missed", "running"):
                return last_status_is(view, needle)
            if needle == "overdue":
                return self.overdue.since(view, now) is not None
            if needle in ("disabled", "off"):
                return not view.enabled
            if needle in ("enabled", "on"):
                return view.enabled
            if needle == "manual":
                return view.latest_manual is not None
            return False

        return [
            v
            for v in self.views
            if needle in v.name.lower()
            or needle in v.cron.lower()
            or needle in v.timezone.lower()
            or needle in (v.description or "").lower()
            or state_matches(v)
        ]

    @property
    def schedule_names(self) -> list[str]:
        """Every schedule's name, in the backend's order."""
        return [v.name for v in self.views]

    def view_of(self, name: str | None) -> ScheduleView | None:
        return next((v for v in self.views if v.name == name), None)

    @property
    def selected_name(self) -> str | None:
        """The schedule the view on screen has selected."""
        return self.active_view.selected_schedule()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.display = False
        self.active_view.focus_main()

    def watch_filter_text(self) -> None:
        self.active_view.show()

    def watch_read_only(self) -> None:
        self._update_read_only()

    def watch_active_view_id(self) -> None:
        self._update_read_only()

    def watch_paused(self, paused: bool) -> None:
        self.query_one(ConsoleHeader).paused = paused

    def watch_utc(self) -> None:
        self._update_tabs()
        self.active_view.show()

    def _update_read_only(self) -> None:
        self.query_one(ConsoleHeader).read_only = self.read_only
        mode = self.query_one("#mode", Static)
        mode.update(" READ-ONLY ")  # the footer leaves out the keys it refuses; ? lists them
        mode.display = self.read_only
        self.refresh_bindings()  # the footer leaves out the keys that act, or brings them back

    # ------------------------------------------------------------------------------------
    # keys
    # ------------------------------------------------------------------------------------
    def _target(self, action: str) -> ScheduleView | None:
        """The selected schedule, if ``action`` may go ahead; otherwise say why not."""
        if not self.may_act(action) or not self.active_view.selection_holds(action):
            return None
        view = self.view_of(self.selected_name)
        if view is None:
            self.notify(f"{action}: no schedule selected.", severity="warning")
        return view

    def action_show_view(self, view_id: str) -> None:
        """``1``…``7``: show a view (it comes back as it was left)."""
        spec = view_spec(view_id)
        systems = self.info.systems if self.info is not None else SYSTEMS
        if spec.make is not None and spec.system not in systems:
            self.notify(f"{spec.title}: this backend does not offer {spec.system}.", title="Not available",
                        severity="warning")
            return
        self.query_one(ContentSwitcher).current = view_id
        self.active_view_id = view_id
        self._update_tabs()
        view = self.active_view
        view.focus_main()
        if self.views:
            view.show()
        # Read afresh once the view is on screen: the backend's reads (an embedded engine's
        # on a thread of its own) held the interpreter lock half the time the first frame
        # was being drawn, and the view shows what it had meanwhile.
        self.call_after_refresh(self.request_refresh)

    def action_toggle_zone(self) -> None:
        """``z``: times in UTC, or in the operator's zone."""
        self.utc = not self.utc
        self.notify(f"Times are shown in {self.display_zone}; schedules' crons and next fires in their own zones.",
                    title="Zone")

    def action_run_details(self) -> None:
        """``enter``: the details of what is under the cursor of the view on screen."""
        self.active_view.open_details()

    def show_run(self, run: Run) -> None:
        """The run details screen (times in the display zone and the schedule's own)."""
        view = self.view_of(run.name)
        self.push_screen(RunDetails(self.backend, run, view.timezone if view is not None else "UTC", self.display_zone))

    def action_filter(self) -> None:
        """``/``: filter the schedules (also by state: ``failed``, ``overdue``, ``disabled``…)."""
        field = self.query_one("#filter", Input)
        field.display = True
        field.focus()

    def action_clear_filter(self) -> None:
        field = self.query_one("#filter", Input)
        if field.display or self.filter_text:
            field.value = ""
            field.display = False
            # Every row back now, not once the field says it changed: in the frame that
            # hides the field, not in a second one.
            self.filter_text = ""
            self.active_view.focus_main()

    def action_command_line(self) -> None:
        """``:``: the command line (:mod:`console.widgets.command_line`). A priority key,
        so that ``:jobs`` typed at once lands in the line; in a text field or a dialog the
        ``:`` is theirs."""
        if len(self.screen_stack) > 1 or isinstance(self.focused, (Input, TextArea)):
            raise SkipAction()
        self.query_one(CommandLine).open()

    @on(CommandLine.Run)
    async def _command_run(self, event: CommandLine.Run) -> None:
        await self.run_action(event.action)

    @on(CommandLine.Refused)
    def _command_refused(self, event: CommandLine.Refused) -> None:
        self.notify(event.why, title="Command", severity="warning", markup=False)

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
        self.link.asked()
        if self.info is None:
            self.query_one(ConsoleHeader).state = "connecting"
        if self.link.events_retry_at is not None and self.info is not None:
            self._start_events()  # and the event stream, now
        self.request_refresh()

    def action_select(self, name: str) -> None:
        """Move the cursor to a schedule (the palette's "Go to schedule")."""
        view = self.active_view
        if name not in {v.name for v in self.visible_views()}:
            self.action_clear_filter()
            view.show()
        if not view.select(name):
            self.notify(f"no schedule named {name}", severity="warning")
            return
        view.focus_main()
