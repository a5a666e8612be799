"""Change signals: one "something changed" bus per engine.

The engine and its subsystems :meth:`~EventBus.publish` a small signal whenever something
an operator may be looking at changes: ``runs`` (a run of the named schedule started or
ended), ``schedules`` (its state or definition), ``jobs`` (a queue), ``durable`` (a
function), ``locks`` (a lock), ``audit`` (a new entry). A signal names what changed, never
the data: whoever wants the data reads it. Signals published here reach the other
instances sharing a PostgreSQL store (:mod:`backend.events.relay`), and theirs arrive here.

Subscribers (the API's event stream, the embedded console) each get a
:class:`Subscription`: a bounded, coalescing inbox. Publishing never waits for a
subscriber: it only notes the signal in each inbox (the same signal twice is kept once),
and an inbox that would grow past its bound is emptied and owes a ``resync`` instead
("refetch everything"). So a slow reader costs at most its bound in memory and one full
refetch, and never slows the engine.

Every signal carries an id, ``EPOCH-SEQ`` (the epoch is this bus's, chosen at random when
it is made). A subscriber that reconnects with the last id it saw (SSE's
``Last-Event-ID``) gets what it missed, from the bus's recent history, or a ``resync``
when that is gone or the id is from another epoch (another instance, a restarted one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

__all__ = ["READY", "RESYNC", "STREAM", "TOPICS", "EventBus", "Signal", "SignalJson", "Subscription"]

#: What a signal can be about.
TOPICS: tuple[str, ...] = ("runs", "schedules", "jobs", "durable", "locks", "audit", "alerts")
#: Refetch everything: signals were lost (a slow reader, a reconnect, another epoch).
RESYNC = "resync"
#: Whether signals from other instances arrive: name ``up`` or ``down``. While down, a
#: reader must poll for what other instances do (this instance's own signals still come).
STREAM = "stream"

#: A reader's stream is up (the first signal a reader gets; name: how other instances'
#: changes reach this one: ``notify`` (PostgreSQL), ``file`` (SQLite) or ``none``).
READY = "ready"

#: Signals an inbox holds before it gives them up for one resync.
DEFAULT_INBOX = 256
#: Signals the bus remembers for readers that reconnect.
DEFAULT_HISTORY = 4096


class SignalJson(TypedDict):
    """A change signal: ``topic`` says what kind of thing changed (``runs``, ``schedules``,
    ``jobs``, ``durable``, ``locks``, ``audit``, ``alerts``; ``resync``: refetch everything),
    ``name`` which one (``null``: not one in particular); never the data itself."""

    id: str
    topic: str
    name: str | None


@dataclass(frozen=True, slots=True)
class Signal:
    """``topic`` is one of :data:`TOPICS`, :data:`RESYNC` or :data:`STREAM`; ``name`` is
    the schedule, queue, function or lock concerned (``None``: not one in particular)."""

    id: str
    topic: str
    name: str | None = None

    def to_json(self) -> SignalJson:
        return {"id": self.id, "topic": self.topic, "name": self.name}


def _parse_id(text: str) -> tuple[str, int] | None:
    epoch, _, seq = text.rpartition("-")
    if not epoch or not seq.isdigit():
        return None
    return epoch, int(seq)


class Subscription:
    """One reader's inbox. Filled from any thread; read with :meth:`get` on the event loop
    that made it. Contract: every signal published after the subscription was made is in
    a later batch, or a ``resync`` is (a batch holds signals in publishing order, each
    once, with its latest id)."""

    def __init__(self, bus: EventBus, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._bus = bus
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._limit = limit
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str | None], int] = {}
        self._stream: tuple[int, str] | None = None
        self._resync: int | None = None
        self._wake = asyncio.Event()
        self._woken = False
        self.closed = False
        self.start_id = ""
        """The bus's last id when this inbox was made: a reader resuming from it misses nothing."""
        self.overflows = 0
        """How often this inbox gave its signals up for a resync."""

    def _offer(self, seq: int, topic: str, name: str | None) -> None:
        """Note a signal (called by the bus, on any thread; never blocks)."""
        with self._lock:
            if self.closed:
                return
            if topic == STREAM:
                self._stream = (seq, name or "")
            elif topic == RESYNC:
                self._pending.clear()
                self._resync = seq
            elif self._resync is not None:
                self._resync = seq  # a refetch is owed anyway: it will cover this one
            else:
                key = (topic, name)
                if key not in self._pending and len(self._pending) >= self._limit:
                    self._pending.clear()
                    self._resync = seq
                    self.overflows += 1
                else:
                    self._pending.pop(key, None)  # keep publishing order: the latest last
                    self._pending[key] = seq
            if self._woken:
                return
            self._woken = True
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the reader's loop is closed: nobody reads this any more
                self.close()

    def _take(self) -> list[Signal]:
        epoch = self._bus.epoch
        with self._lock:
            self._woken = False
            self._wake.clear()
            items: list[tuple[int, str, str | None]] = []
            if self._resync is not None:
                items.append((self._resync, RESYNC, None))
            else:
                items.extend((seq, topic, name) for (topic, name), seq in self._pending.items())
            if self._stream is not None:
                items.append((self._stream[0], STREAM, self._stream[1]))
            self._pending.clear()
            self._resync = None
            self._stream = None
        items.sort(key=lambda item: item[0])
        return [Signal(f"{epoch}-{seq}", topic, name) for seq, topic, name in items]

    async def get(self, timeout: float | None = None) -> list[Signal]:
        """The next batch of signals; ``[]`` when ``timeout`` seconds pass without one."""
        if not self._woken:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
        return self._take()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._bus._forget(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """The engine's change signals (see the module docstring). Thread-safe."""

    def __init__(self, *, history: int = DEFAULT_HISTORY) -> None:
        self.epoch = os.urandom(4).hex()
        self._lock = threading.Lock()
        self._seq = 0
        self._history: deque[tuple[int, str, str | None]] = deque(maxlen=history)
        self._subscriptions: list[Subscription] = []
        self.taps: list[Callable[[str, str | None], None]] = []
        """Called with each signal published here (not those relayed from elsewhere), on
        the publisher's thread: how the relay learns what to tell other instances."""
        self.on_subscribe: Callable[[], None] | None = None
        """Called (on the subscriber's thread) when a subscription is made: the engine
        starts listening to other instances then, not before anyone wants to hear."""
        self.on_unsubscribe: Callable[[], None] | None = None
        """Called (on the closing thread) when a subscription is closed."""
        self.live = True
        """Whether signals from other instances arrive (see :data:`STREAM`)."""

    @property
    def last_id(self) -> str:
        return f"{self.epoch}-{self._seq}"

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def publish(self, topic: str, name: str | None = None, *, remote: bool = False, announced: bool = False) -> None:
        """Tell every subscriber that ``topic``/``name`` changed; ``remote`` for a signal
        relayed from another instance, ``announced`` for one the other instances were told
        of already (neither is relayed on). Never blocks."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._history.append((seq, topic, name))
            subscriptions = self._subscriptions
        for subscription in subscriptions:
            subscription._offer(seq, topic, name)
        if not remote and not announced:
            for tap in self.taps:
                tap(topic, name)

    def resync(self) -> None:
        """Tell every subscriber to refetch everything (signals may have been lost)."""
        self.publish(RESYNC, remote=True)

    def set_live(self, live: bool) -> None:
        """Say whether signals from other instances arrive; coming back up owes a resync."""
        if live == self.live:
            return
        self.live = live
        self.publish(STREAM, "up" if live else "down", remote=True)
        if live:
            self.resync()

    def subscribe(self, *, since: str | None = None, limit: int = DEFAULT_INBOX) -> Subscription:
        """A new inbox, read on the running event loop. ``since``: the last id a reader
        saw before it reconnected; what it missed is put in the inbox at once (or a
        resync, when that is no longer known)."""
        subscription = Subscription(self, asyncio.get_running_loop(), limit)
        with self._lock:
            subscription.start_id = f"{self.epoch}-{self._seq}"
            if since is not None:
                missed = self._missed_since(since)
                if missed is None:
                    subscription._offer(self._seq, RESYNC, None)
                else:
                    for seq, topic, name in missed:
                        subscription._offer(seq, topic, name)
            self._subscriptions = [*self._subscriptions, subscription]  # publishers iterate a snapshot
        if self.on_subscribe is not None:
            self.on_subscribe()
        return subscription

    def _missed_since(self, since: str) -> list[tuple[int, str, str | None]] | None:
        parsed = _parse_id(since)
        if parsed is None or parsed[0] != self.epoch or parsed[1] > self._seq:
            return None
        seq = parsed[1]
        if seq < self._seq and (not self._history or self._history[0][0] > seq + 1):
            return None  # older than what the bus remembers
        return [item for item in self._history if item[0] > seq]

    def _forget(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if s is not subscription]
        if self.on_unsubscribe is not None:
            self.on_unsubscribe()
