"""How the console keeps what it shows true: it connects, reads, follows the backend's
change signals, and says what a failure means (a part of :class:`~console.app.SchedtuiApp`).

When to read, and as of when the data is true, is the :class:`~console.link.Link`'s to
decide (plain state, no widgets); this part reads, in workers, and shows what it read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App
from textual.css.query import NoMatches
from textual.message import Message

from backend.client.interface import Backend, ConnectionInfo
from backend.clock import Clock
from backend.errors import Forbidden, NotFound, SchedtuiError, Unauthorized, Unavailable
from backend.events.bus import READY, RESYNC, STREAM, Signal
from backend.model import InstanceInfo, ScheduleView
from console.fleet import Fleet, fleet_of
from console.heap import Collector, freeze_heap
from console.link import Link
from console.widgets import ConsoleHeader, FleetBanner
from console.widgets.header import EVENTS_LATE
from console.workers import work

if TYPE_CHECKING:
    from console.views import View

__all__ = ["EVENTS_IDLE", "Reading", "short_where"]

EVENTS_IDLE = 15.0
"""Seconds of a quiet embedded stream after which it says it is still there."""


def short_where(info: ConnectionInfo) -> str:
    """Where the backend is, short enough for the header: a store path relative to the
    working directory (or ``~``) when it is under it; a URL as it is."""
    if info.kind != "embedded" or "://" in info.where:
        return info.where
    path = Path(info.where)
    for base, prefix in ((Path.cwd, ""), (Path.home, "~/")):
        try:
            return prefix + str(path.resolve().relative_to(base().resolve()))
        except (ValueError, OSError, RuntimeError):
            # (not under it; a working folder deleted since; no home: a user id with no
            # entry in /etc/passwd and no $HOME, as a container's arbitrary one)
            continue
    return info.where


class Reading(App[None]):
    """The console's reads and its connection (see the module docstring): a part of the
    app, which sets up what is declared here (:meth:`SchedtuiApp.__init__`; this part's own
    state in :meth:`_init_reading`)."""

    class Refreshed(Message):
        """Posted after every successful refresh (tests and the benchmark wait on it)."""

    backend: Backend
    clock: Clock
    link: Link
    where: str | None
    read_only_flag: bool
    read_only: bool
    paused: bool
    live_events: bool
    after_connect: Callable[[Backend], Awaitable[None]] | None
    info: ConnectionInfo | None
    """What the backend said on the last successful connect."""
    views: list[ScheduleView]
    """Every schedule, as of the last refresh, in the backend's order."""
    instances: list[InstanceInfo] | None
    """The registered engines, as of the last read (``None``: the backend cannot say)."""
    fleet: Fleet | None
    alerting: int | None
    """How many alerts fire, as of the last read (``None``: the backend cannot say)."""
    collector: Collector
    _freeze_heap: bool
    _refreshing: bool
    _refresh_again: bool
    _refreshed_at: datetime | None
    _signalled: bool
    _events_task: asyncio.Task[None] | None
    _probed_silence: datetime | None

    def _init_reading(self) -> None:
        self.instances = None
        self.fleet = None
        self.alerting = None
        self._refreshing = False
        self._refresh_again = False
        self._refreshed_at = None
        """When the last refresh started (the console's clock)."""
        self._signalled = False
        """Signals arrived that a refresh held back by the view's ``signalled_every`` owes."""
        self._events_task = None
        self._probed_silence = None
        """The last signal after whose silence the server was asked whether it is there."""

    if TYPE_CHECKING:  # the app's

        @property
        def active_view(self) -> View: ...

        def data_now(self) -> datetime: ...

        def _update_tabs(self) -> None: ...

    # ------------------------------------------------------------------------------------
    # refreshing
    # ------------------------------------------------------------------------------------
    def request_refresh(self) -> None:
        """Refresh as soon as the refresh in flight (if any) is done."""
        if self._refreshing:
            self._refresh_again = True
        else:
            self.refresh_data()

    @work(group="refresh")
    async def refresh_data(self) -> None:
        """Connect if need be, then read the schedules, the heartbeats (every few seconds)
        and what the view on screen shows."""
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
        view = self.active_view
        self._refreshed_at, self._signalled = self.clock.now(), False
        try:
            if self.info is None or self.link.retry_at is not None:
                info = await self.backend.connect()
                await self._connected(info)
            snapshot = await self.backend.list_schedules()
            # The server's clock first: the heartbeats' ages are judged against it (read
            # before it, the first refresh judged them by this machine's clock, and a server
            # 90 s behind showed "nothing is firing" for the first 20 s).
            self.link.snapshot(snapshot.now)
            await self._read_instances()
            self.views = snapshot.schedules
            await view.load()
            view.loaded = True
        except Unavailable as exc:
            self.connection_lost(exc)
            return
        except (Unauthorized, Forbidden) as exc:  # a read refused: the token is wrong or missing
            self._token_refused(exc)
            return
        except SchedtuiError as exc:
            if self.info is None:
                self._give_up(exc)
            else:
                self.report(exc)
                self.link.read_failed()
            return
        except Exception as exc:  # never a traceback on the operator's screen
            self.log.error(f"refresh failed: {exc!r}")
            self.report(exc)
            self.link.read_failed()
            return
        now = self.clock.now()
        if self.link.refreshed():
            self.notify("Connection is back; data is fresh again.", title="Reconnected")
        header = self.query_one(ConsoleHeader)
        if header.state != "dropped" or self.link.events_live:  # dropped: until the stream is back
            header.state = "live"
        header.last_ok = now
        header.retry_at = None
        header.now = now
        self._update_fleet()
        self.query_one("#main").remove_class("-stale")
        if view is self.active_view:
            view.show()
        if self._freeze_heap:
            self._freeze_heap = False
            self.call_after_refresh(self._freeze)
        self.post_message(self.Refreshed())

    def _freeze(self) -> None:
        freeze_heap()
        self.collector.start()

    async def _read_instances(self, *, force: bool = False) -> None:
        now = self.clock.now()
        if not force and not self.link.instances_due(now):
            return
        try:
            self.instances = await self.backend.instances()
        except NotFound:  # a server older than this console: it cannot say who fires
            self.instances = None
        self.link.instances_read(now)
        await self._read_alerts()

    async def _read_alerts(self) -> None:
        """How many alerts fire now, for the header (read with the heartbeats, and when a
        change signal says an alert changed)."""
        if self.info is None or "alerts" not in self.info.systems:
            self.alerting = None
            return
        try:
            self.alerting = (await self.backend.alerts()).firing
        except NotFound:  # a server older than this console
            self.alerting = None

    @work(group="alerts", exclusive=True)
    async def refresh_alerts(self) -> None:
        """Read the alert count alone (an alert changed)."""
        try:
            await self._read_alerts()
        except SchedtuiError:
            return  # the next full refresh reports it
        self.query_one(ConsoleHeader).alerting = self.alerting

    def _update_fleet(self) -> None:
        """Who fires, as of when the heartbeats were read (not later: an engine that beat
        then is not accused of silence because the console has not looked since)."""
        if self.info is not None and self.instances is not None:
            self.fleet = fleet_of(self.instances, self.link.instances_now or self.data_now(), self.info, self.views)
        header = self.query_one(ConsoleHeader)
        header.fleet = self.fleet
        header.alerting = self.alerting
        self.query_one(FleetBanner).fleet = self.fleet

    @work(group="instances", exclusive=True)
    async def refresh_instances(self) -> None:
        """Read the heartbeats alone (while change signals keep the rest fresh)."""
        self.link.instances_at = self.clock.now()  # once per period, even when it fails
        try:
            await self._read_instances(force=True)
        except SchedtuiError:
            return  # the next full refresh reports it
        self._update_fleet()

    # ------------------------------------------------------------------------------------
    # change signals
    # ------------------------------------------------------------------------------------
    def _start_events(self) -> None:
        """Follow the backend's change signals (an asyncio task, not a worker: it never ends
        by itself, and tests wait for the workers)."""
        if not self.live_events or (self._events_task is not None and not self._events_task.done()):
            return
        self.link.stream_opened()
        self._events_task = asyncio.ensure_future(self._follow_events())

    async def _follow_events(self) -> None:
        why = "the event stream ended"
        try:
            async for batch in self.backend.changes(since=self.link.event_id, idle=EVENTS_IDLE):
                self.on_signals(batch)
        except SchedtuiError as exc:
            why = exc.message
        except Exception as exc:  # never let it take the console down
            self.log.error(f"event stream failed: {exc!r}")
            why = f"{type(exc).__name__}: {exc}"
        self._events_down(why)

    def on_signals(self, batch: list[Signal]) -> None:
        """Act on a batch of change signals: read again what they name, if it is on screen."""
        refresh = alerts = False
        feed: bool | None = None
        self.query_one(ConsoleHeader).last_signal = self.clock.now()  # (a ping too: the server is there)
        topics = ("runs", "schedules", *self.active_view.topics)
        for signal in batch:
            alerts = alerts or signal.topic == "alerts"
            if signal.id:
                self.link.event_id = signal.id
            if signal.topic == READY:
                feed, refresh = True, True  # and read what changed while the stream was not there
                self.link.stream_ready()
            elif signal.topic == STREAM:
                feed, refresh = signal.name == "up", True
            elif signal.topic == RESYNC or signal.topic in topics:
                refresh = True
        if feed is not None:
            self._set_feed(feed)
        if refresh and not self.paused and self.info is not None:
            if self._signal_held():
                self._signalled = True  # (answered by the tick once due)
            else:
                self.request_refresh()
        if alerts and not self.paused and self.info is not None:
            self.refresh_alerts()

    def _signal_held(self) -> bool:
        """Whether a refresh a signal asks for waits for the view's ``signalled_every``."""
        every, last = self.active_view.signalled_every, self._refreshed_at
        return bool(every) and last is not None and (self.clock.now() - last).total_seconds() < every

    def refresh_signalled(self) -> bool:
        """Start the refresh that held-back signals owe, once the view's interval has passed
        (the app's tick asks); whether it did."""
        if self._signalled and not self._signal_held() and not self.paused and self.info is not None:
            self._signalled = False
            self.request_refresh()
            return True
        return False

    def probe_silence(self, now: datetime) -> bool:
        """Read the store once when the event stream has been silent past
        :data:`~console.widgets.header.EVENTS_LATE` (the app's tick asks); whether it did.
        A frozen server keeps the stream open saying nothing, and the stream is given up
        only after 40 s: the read's timeout (10 s) says it is lost at about 30 s, not 50."""
        last = self.query_one(ConsoleHeader).last_signal
        if not self.link.events_live or last is None or now - last <= EVENTS_LATE or self._probed_silence == last:
            return False
        if self.paused or self.info is None:
            return False
        self._probed_silence = last
        self.request_refresh()
        return True

    def _set_feed(self, events: bool) -> None:
        if not self.link.set_feed(events):
            return
        header = self.query_one(ConsoleHeader)
        header.feed = "events" if events else "polling"
        if events and header.state == "dropped":
            header.state = "live"

    def _events_down(self, why: str) -> None:
        """The stream ended: poll until it is back (tried again with backoff). A stream that
        was flowing broke: that is news at once. The header says so (not live, until the
        stream is back or the connection is lost), the server is asked at once whether it
        is still there, and the stream is tried again at once."""
        try:
            header = self.query_one(ConsoleHeader)
        except NoMatches:  # the app is shutting down
            return
        flowing, delay = self.link.stream_down()
        if flowing:
            header.feed = "polling"
            if header.state == "live":
                header.state = "dropped"
                self.request_refresh()
        self.log.info(f"event stream down ({why}); polling, trying it again in {delay}s")

    async def _connected(self, info: ConnectionInfo) -> None:
        first = self.info is None
        self.info = info
        header = self.query_one(ConsoleHeader)
        header.info = info
        header.where = self.where or short_where(info)
        self.read_only = self.read_only_flag or info.read_only or self.backend.read_only
        self._update_tabs()
        self._start_events()
        if first and self.after_connect is not None:
            try:
                await self.after_connect(self.backend)
            except SchedtuiError as exc:
                self.report(exc)

    def connection_lost(self, exc: Unavailable) -> None:
        """Show the data as stale and retry with backoff (said once, not at every retry)."""
        first = self.link.lost()
        header = self.query_one(ConsoleHeader)
        header.state = "lost"
        header.retry_at = self.link.retry_at
        header.now = self.clock.now()
        self.query_one("#main").add_class("-stale")
        if first:
            said = exc.message if exc.message.endswith((".", "?", "!")) else f"{exc.message}."  # (a sentence of its own)
            self.notify(f"{said} Retrying by itself; the data on screen is stale.", title=exc.title,
                        severity="error", markup=False)

    def _token_refused(self, exc: SchedtuiError) -> None:
        """The server refused the token, or wanted one: no retry helps (ctrl+r tries once
        more). The header says so until a refresh succeeds, with how to give one."""
        self.link.stopped()
        header = self.query_one(ConsoleHeader)
        sent = exc.token_sent if isinstance(exc, Unauthorized) and exc.token_sent is not None else True
        header.token_sent = sent
        header.state = "refused"
        if self.info is not None:
            self.query_one("#main").add_class("-stale")
        what = "refused the token" if sent else "wants a token and none was given"
        self.notify(f"The server {what}. Restart the console with --token-file PATH (or $SCHEDTUI_TOKEN) "
                    "holding a token it accepts.", title="Token refused" if sent else "No token",
                    severity="error", markup=False, timeout=15)  # fmt: skip

    def _give_up(self, exc: SchedtuiError) -> None:
        """A connect that cannot succeed by retrying (a wrong token): say so and wait for ctrl+r."""
        self.link.stopped()
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

