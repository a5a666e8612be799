"""How change signals reach the engine's bus (:mod:`backend.events.bus`) from the ledger and
from the other processes sharing the store.

* Runs: the ledger's listeners see every run version the moment it is recorded, but its
  row reaches the store a little later (group commit). :class:`RunSignals` publishes
  ``runs`` for a schedule only once the rows recorded before are committed, so whoever
  reads on a signal finds what it announced.
* PostgreSQL (:class:`PostgresRelay`): signals published here are sent to the other
  instances as one NOTIFY per batch (what gathered within :data:`NOTIFY_GATHER`), each its
  own tiny statement; at most :data:`NOTIFY_RATE` a second, with bursts of up to
  :data:`NOTIFY_BURST` (one action often signals twice: its audit entry, then its run),
  so that a quiet instance tells at once and a busy one coalesces. Every NOTIFY wakes
  every listening connection of the database (a transaction each), so a fleet of N that
  nobody watches would pay N² transactions a second for news nobody reads: only the
  signals other engines act on (:data:`ENGINE_TOPICS`, and resyncs) are always sent; the
  rest (runs, jobs, durable executions, locks, audit) only while some process of the
  database has readers, which it says by holding a connection named ``schedtui-readers``
  open (the server picks the payload as it sends). The runs' signals are not sent by the
  relay at all: the ledger's group commit carries them in its own transaction
  (:meth:`PostgresRelay.announce_runs`), so a burst costs one commit, not two. A batch
  with too many names for one notification names its topics only. The store's one
  LISTEN connection (opened when the engine starts, or when the first reader subscribes;
  the job workers' wake-ups share it) publishes what the others send. It reconnects by
  itself; while it is down the bus says so (``stream down``), and once it is back the bus
  owes its readers a resync, since notifications sent meanwhile are lost.
* SQLite (:class:`StoreWatch`): processes sharing a file cannot notify each other, but the
  file's change counter says when another process committed something; a reader is then
  told to refetch (a resync), at most every :data:`WATCH_EVERY` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from backend.errors import Unavailable
from backend.events.bus import RESYNC, TOPICS, EventBus
from backend.model import Run
from backend.runtime.loops import Loops, stop_if_cancelled

if TYPE_CHECKING:  # a type only: the scheduler builds this, not the other way round
    from backend.scheduler.ledger import RunLedger

__all__ = [
    "ENGINE_TOPICS",
    "NOTIFY_BURST",
    "NOTIFY_GATHER",
    "NOTIFY_RATE",
    "WATCH_EVERY",
    "CountingStore",
    "NotifyingStore",
    "PostgresRelay",
    "Relay",
    "RunSignals",
    "StoreWatch",
]

log = logging.getLogger("schedtui.events")

#: NOTIFYs a second one instance sends at most, in the long run …
NOTIFY_RATE = 5.0
#: … and at most this many at once after a quiet spell (a token bucket).
NOTIFY_BURST = 3
#: Seconds a notification waits for the other signals of the same moment.
NOTIFY_GATHER = 0.005
#: Seconds between two looks at an SQLite file's change counter.
WATCH_EVERY = 0.25
#: The largest notification payload sent (PostgreSQL's limit is 8,000 bytes).
MAX_PAYLOAD = 7_500
#: The topics another instance's engine acts on (a stored schedule or its enabled state
#: changed: see :meth:`backend.scheduler.catalog.Catalog.heard`): sent whether or not anyone reads.
ENGINE_TOPICS = frozenset({"schedules"})


@runtime_checkable
class NotifyingStore(Protocol):
    """A store whose processes can notify each other (PostgreSQL)."""

    async def notify_events(self, payload: str, unread: str | None = None) -> None:
        """Send ``payload`` to every listener, in a statement of its own, while some
        process has readers (see :meth:`hold_readers_mark`); otherwise send ``unread``, or
        nothing when it is ``None``. ``unread == payload``: send it whatever happens."""

    async def listen_events(self, on_payload: Callable[[str], None], on_state: Callable[[bool], None]) -> None:
        """Until cancelled: listen on a dedicated connection, call ``on_payload`` with each
        notification, ``on_state(True)`` when listening and ``on_state(False)`` when the
        connection is lost; reconnect with backoff."""

    async def hold_readers_mark(self, has_readers: Callable[[], bool], changed: asyncio.Event) -> None:
        """Until cancelled: let the other processes see whether this one has readers (they
        announce their runs only while some process has)."""


@runtime_checkable
class AnnouncingStore(Protocol):
    """A store that can tell the others of a batch of run rows in the batch's own commit."""

    announce_runs: Callable[[Sequence[Run]], str | None] | None


@runtime_checkable
class CountingStore(Protocol):
    """A store that can say whether another process committed to it (SQLite)."""

    async def change_counter(self) -> int:
        """A number that changes when another connection has committed since the last call."""


class RunSignals:
    """Publishes ``runs NAME`` once the recorded runs of NAME are committed."""

    def __init__(self, ledger: RunLedger, events: EventBus, loops: Loops) -> None:
        self.ledger = ledger
        self.events = events
        self.loops = loops
        self.announced = False
        """The store tells the other instances of the rows as it commits them (PostgreSQL):
        the signals published here are then not relayed again."""
        self._names: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._handed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        ledger.listeners.append(self._recorded)
        ledger.on_handoff.append(self._on_handoff)

    def _on_handoff(self) -> None:
        self._handed.set()

    def _recorded(self, run: Run) -> None:
        if self._task is None:
            return  # not open: nobody reads a store that is not open
        self._names[run.name] = None
        self._wake.set()

    def open(self) -> None:
        self._wake, self._handed = asyncio.Event(), asyncio.Event()  # on this open's loop
        self._names.clear()
        self._task = self.loops.keep(self._publish, "run signals")

    async def _publish(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.ledger.buffered:  # held back during a burst: wait for the hand-off
                self._handed.clear()
                if self.ledger.buffered:
                    await self._handed.wait()
            try:
                await self.ledger.store.flush()
            except Unavailable:
                pass  # the rows wait in the writer; say what changed all the same
            names, self._names = self._names, {}
            for name in names:
                self.events.publish("runs", name, announced=self.announced)

    def close(self) -> None:
        self._task = None


class PostgresRelay:
    """Signals between the instances sharing a PostgreSQL store (see the module docstring)."""

    def __init__(
        self,
        store: NotifyingStore,
        events: EventBus,
        loops: Loops,
        *,
        rate: float = NOTIFY_RATE,
        burst: int = NOTIFY_BURST,
        gather: float = NOTIFY_GATHER,
    ) -> None:
        self.store = store
        self.events = events
        self.loops = loops
        self.rate = rate
        self.burst = burst
        self.gather = gather
        self._tokens = float(burst)
        self._refilled = time.monotonic()
        self.origin = os.urandom(6).hex()
        """Names this process in its notifications, to skip its own when they come back."""
        self._pending: dict[tuple[str, str | None], None] = {}
        self._resync = False
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._marker: asyncio.Task[None] | None = None
        self._readers_changed = asyncio.Event()
        self._listened = False
        self.hearing = False
        """Whether the LISTEN connection is up: every notification sent from now on is heard."""
        self.sent = 0
        """Notifications handed to the store (sent, or dropped by the server while nobody reads)."""
        self.on_remote: Callable[[str, str | None], None] | None = None
        """Told each signal heard from another instance (``RESYNC`` when some may be lost),
        whether or not anyone subscribes to the bus: how the engine hears of changes to
        stored schedules at once."""
        events.taps.append(self._tap)

    def _tap(self, topic: str, name: str | None) -> None:
        if self._sender is None:
            return
        if topic == RESYNC:
            self._resync = True
        else:
            self._pending[(topic, name)] = None
        self._wake.set()

    def open(self) -> None:
        self._wake = asyncio.Event()
        self._sender = self.loops.keep(self._send_loop, "event notifications")
        self._readers_changed = asyncio.Event()
        self._marker = self.loops.keep(
            lambda: self.store.hold_readers_mark(lambda: self.events.subscribers > 0, self._readers_changed),
            "readers mark",
        )

    def readers_changed(self) -> None:
        """A reader came or went (on the engine's loop)."""
        self._readers_changed.set()

    def listen(self) -> None:
        """Start listening to the other instances (idempotent)."""
        if self._listener is None or self._listener.done():
            self._listener = self.loops.keep(
                lambda: self.store.listen_events(self._received, self._listening), "event listener"
            )

    def _payloads(self) -> tuple[str, str | None]:
        """What is pending: the notification for readers, and the part of it the other
        engines act on (``None``: nothing)."""
        signals, self._pending = list(self._pending), {}
        resync, self._resync = self._resync, False
        if resync:
            payload = json.dumps({"from": self.origin, "resync": True})
            return payload, payload
        full = self._encode(signals)
        engines = [signal for signal in signals if signal[0] in ENGINE_TOPICS]
        if len(engines) == len(signals):
            return full, full
        return full, self._encode(engines) if engines else None

    def _encode(self, signals: list[tuple[str, str | None]]) -> str:
        text = json.dumps({"from": self.origin, "signals": signals}, separators=(",", ":"))
        if len(text.encode()) <= MAX_PAYLOAD:
            return text
        # Too many names for one notification (a burst of a thousand runs): say which
        # topics changed, not which names. A resync would make every reader refetch
        # everything, and every instance re-read its schedules, for a burst of runs.
        topics = sorted({topic for topic, _ in signals})
        return json.dumps({"from": self.origin, "signals": [[topic, None] for topic in topics]}, separators=(",", ":"))

    def announce_runs(self, runs: Sequence[Run]) -> str | None:
        """The notification of a batch of run rows, for the store to send in the batch's
        own transaction (``None``: not open, nothing to say)."""
        if self._sender is None or not runs:
            return None
        names = dict.fromkeys(run.name for run in runs)
        return self._encode([("runs", name) for name in names])

    async def _send_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await self._wake.wait()
            # Pacing a network chatter, not engine time: the wall clock is the right one here.
            await asyncio.sleep(self.gather)
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._tokens, self._refilled = 1.0, time.monotonic()
            self._tokens -= 1
            self._wake.clear()
            await self.send_now()

    async def send_now(self) -> None:
        """Send what is pending in one notification (also at stop)."""
        if not self._pending and not self._resync:
            return
        payload, unread = self._payloads()
        try:
            await self.store.notify_events(payload, unread)
            self.sent += 1
        except Unavailable as exc:
            # The others will miss these; they resync when their own connection comes back,
            # and this one's trouble is reported by the store's health.
            log.debug("could not notify the other instances: %s", exc)

    def _received(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            if data.get("from") == self.origin:
                return
            if data.get("resync"):
                self.events.resync()
                self._heard(RESYNC, None)
                return
            for topic, name in data["signals"]:
                if topic in TOPICS and (name is None or isinstance(name, str)):
                    self.events.publish(topic, name, remote=True)
                    self._heard(topic, name)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignored a malformed event notification: %.200r", payload)
            self.events.resync()
            self._heard(RESYNC, None)

    def _heard(self, topic: str, name: str | None) -> None:
        if self.on_remote is not None:
            self.on_remote(topic, name)

    def _listening(self, up: bool) -> None:
        self.hearing = up
        first, self._listened = not self._listened, True
        if first and up and self.events.live:
            # The first connection: the readers missed nothing yet, but a change committed
            # before it was up was announced to nobody here: the engine reads once.
            self._heard(RESYNC, None)
            return
        self.events.set_live(up)
        if up:
            self._heard(RESYNC, None)

    async def stop(self) -> None:
        with contextlib.suppress(Unavailable):
            await self.send_now()
        self._sender = None
        if self._marker is not None:
            self._marker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._marker
            self._marker = None


class StoreWatch:
    """Tells readers to refetch when another process has committed to the SQLite file."""

    def __init__(self, store: CountingStore, events: EventBus, loops: Loops, *, every: float = WATCH_EVERY) -> None:
        self.store = store
        self.events = events
        self.loops = loops
        self.every = timedelta(seconds=every)
        self._task: asyncio.Task[None] | None = None

    def listen(self) -> None:
        if self._task is None or self._task.done():
            self.loops.expect("store watch")  # quiesce waits for its first look
            self._task = self.loops.keep(self._watch, "store watch")

    async def _watch(self) -> None:
        last: int | None = None
        while True:
            try:
                counter = await self.store.change_counter()
            except Unavailable:
                counter = None
            if counter is not None:
                if last is not None and counter != last:
                    self.events.resync()
                last = counter
            await self.loops.park("store watch", self.loops.clock.now() + self.every)


class Relay:
    """The engine's part that feeds its bus: run signals, and the other processes' signals
    through whatever the store offers. A subsystem of the engine (see
    :mod:`backend.runtime.subsystems`)."""

    def __init__(self, *, store: object, ledger: RunLedger, events: EventBus, loops: Loops) -> None:
        self.events = events
        self.runs = RunSignals(ledger, events, loops)
        self.postgres = PostgresRelay(store, events, loops) if isinstance(store, NotifyingStore) else None
        self.watch = StoreWatch(store, events, loops) if isinstance(store, CountingStore) else None
        self._announcing = store if self.postgres is not None and isinstance(store, AnnouncingStore) else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened = False
        events.on_subscribe = self._subscribed
        events.on_unsubscribe = self._unsubscribed

    def _on_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the engine's loop (readers subscribe from any thread)."""
        loop = self._loop
        if loop is None or not self._opened:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            action()
        else:
            with contextlib.suppress(RuntimeError):  # the engine's loop is gone: nothing to start
                loop.call_soon_threadsafe(action)

    def _subscribed(self) -> None:
        self._on_loop(self._readers_came)

    def _unsubscribed(self) -> None:
        if self.postgres is not None:
            self._on_loop(self.postgres.readers_changed)

    def _readers_came(self) -> None:
        self.listen()
        if self.postgres is not None:
            self.postgres.readers_changed()

    def listen(self) -> None:
        """Start hearing what other processes do (idempotent)."""
        if not self._opened:
            return
        if self.postgres is not None:
            self.postgres.listen()
        if self.watch is not None:
            self.watch.listen()

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._opened = True
        self.runs.open()
        if self.postgres is not None:
            self.postgres.open()
            if self._announcing is not None:
                # (Only while some process of the fleet has readers: see hold_readers_mark.)
                # The runs' notifications ride the ledger's commits (one transaction a
                # batch, not two); the run signals published here are not sent again.
                self._announcing.announce_runs = self.postgres.announce_runs
                self.runs.announced = True
        if self.events.subscribers:
            self.listen()

    def start(self) -> None:
        pass

    async def maintain(self, now: Any) -> None:
        pass

    async def stop(self, grace: float) -> None:
        self._opened = False
        self.runs.close()
        if self._announcing is not None:
            self._announcing.announce_runs = None
            self.runs.announced = False
        if self.postgres is not None:
            await self.postgres.stop()

    @property
    def idle(self) -> bool:
        return True

    def is_ours(self, id_: str) -> bool:
        return False

    @property
    def hears_others(self) -> bool:
        """Whether the other instances' changes arrive as they are made (PostgreSQL, its
        LISTEN connection up): then the state poll is only a backstop."""
        return self.postgres is not None and self.postgres.hearing

    @property
    def stream_kind(self) -> str:
        """What carries other processes' changes here: ``notify``, ``file`` or ``none``."""
        return "notify" if self.postgres is not None else "file" if self.watch is not None else "none"

