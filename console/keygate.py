"""Every key reaches the widget the key before it left the focus on, however fast it comes.

Textual routes a key to the focused widget the moment it reads it, but resolves most
bindings (``tab``, ``enter`` in a field, ``n`` on a table) only once the key has bubbled from
that widget back to the app, one message queue after another. Keys read meanwhile (typed
fast, on a loaded machine, or delivered by the terminal in one read) go to the focus of
before: what is typed after ``tab`` lands in the field being left, what is typed after ``n``
reaches the table under the form (where ``r`` is Run now), and the ``y`` typed after
``enter`` in a count goes to the count rather than to the question it opened.

:class:`KeyGate` holds every key that follows one which may move the focus or change the
screen until the app has done all that key does: every message queue of the app and of the
screen on top has run dry (a screen it opened has mounted and focused its first field, a
field's ``Submitted`` has been handled). A printable character typed into a text field
moves nothing (the field takes it), so it passes straight through: typing costs nothing.
Characters typed in a row into a field that takes a burst (a payload: a paste without
bracketed paste is one key per character) reach it as one paste. Nothing here waits on a
clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeGuard

from textual import events
from textual.app import App, ScreenStackError
from textual.message_pump import MessagePump
from textual.widgets import Input, TextArea

from console.widgets.bounded import Bounded

__all__ = ["MAX_ROUNDS", "KeyGate", "quiet"]

MAX_ROUNDS = 64
"""A guard, not a clock: rounds of draining before a held key goes on regardless (a widget
that posts to itself for ever, such as an animation, would otherwise hold the keys back)."""

Typed = events.Key | events.Paste


def _busy(pump: MessagePump) -> bool:
    """Whether ``pump`` has a message queued or in hand. An idle pump waits on its empty
    queue's event; one handling a message (or not started) does not. (An idle pump is
    drained already: sending each of a screen's hundreds of widgets a callback, every
    round, to learn that took more of the loop than the keys: half of the time to show
    the ``/`` filter at 1,000 schedules.)"""
    queue: object = pump._message_queue
    values = getattr(queue, "values", None)
    event = getattr(queue, "ready_event", None)
    if values is None or not isinstance(event, asyncio.Event):
        return True  # a queue of another kind: ask it
    return bool(values) or not getattr(event, "_waiters", None)


def _drained(pump: MessagePump) -> asyncio.Future[None]:
    """Done once ``pump`` has handled every message queued on it now."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def mark() -> None:
        if not done.done():
            done.set_result(None)

    if not pump.call_later(mark):
        mark()  # closing: it takes nothing more, so there is nothing to wait for
    return done


async def quiet(app: App[Any]) -> int:
    """Until every message queue of ``app`` and of the screen on top is empty, the same
    screen is on top and no widget was added meanwhile; returns the rounds it took. A
    message one queue hands to another (a key bubbling up, ``Submitted``, the callback
    that focuses a new screen's field) is caught by the next round."""
    for rounds in range(1, MAX_ROUNDS + 1):
        screen = app.screen
        pumps: list[MessagePump] = [app, *screen.walk_children(with_self=True)]
        # The app's queue always (a round trip: what a worker or the driver posts meanwhile
        # lands), the widgets' while they have work.
        await asyncio.gather(*(_drained(pump) for pump in pumps if pump is app or _busy(pump)))
        if app.screen is not screen:
            continue
        now = [app, *screen.walk_children(with_self=True)]
        if len(now) == len(pumps) and all(a is b for a, b in zip(now, pumps, strict=True)) and not any(
            pump.message_queue_size for pump in now
        ):
            return rounds
    return MAX_ROUNDS


class KeyGate:
    """The app's keys, routed in the order typed, each once the one before has settled.

    ``route`` is what the app does with a key it reads (Textual's own routing); the app
    hands every key and paste it reads to :meth:`arrive` instead of routing it itself."""

    def __init__(self, app: App[Any], route: Callable[[events.Event], Awaitable[None]]) -> None:
        self.app = app
        self.route = route
        self.held: deque[Typed] = deque()
        """Keys read but not routed yet, oldest first."""
        self.settling: asyncio.Task[int] | None = None
        """Waiting for the app to finish with the last key routed (``None``: open)."""
        self._called = False
        self._done = asyncio.Event()
        self._done.set()

    @staticmethod
    def takes(event: events.Event) -> TypeGuard[Typed]:
        """A key or a paste read from the terminal (not one already routed)."""
        return isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded

    def arrive(self, event: Typed) -> None:
        self.held.append(event)
        self._done.clear()
        if self.settling is None and not self._called:
            # Routed once the app has read the keys already waiting for it: a burst of
            # text for a field that takes one goes in as one edit (:meth:`_next`).
            self._called = self.app.call_later(self._drain)

    async def done(self) -> None:
        """Until every key read so far has been routed and the app has finished with it
        (text typed into a field: routed)."""
        await self._done.wait()

    def passes(self, event: Typed) -> bool:
        """Whether ``event`` leaves focus and screen as they are: text typed or pasted into
        the text field that has the focus (the field takes it; it binds nothing)."""
        if not isinstance(self.app.focused, (Input, TextArea)):
            return False
        return isinstance(event, events.Paste) or event.is_printable

    def _next(self) -> Typed:
        """The next key to route; characters typed in a row into a field that takes a burst
        (:class:`~console.widgets.bounded.Bounded`: keys it takes as text) as one paste of
        them all."""
        event = self.held.popleft()
        field = self.app.focused
        if not (isinstance(event, events.Key) and isinstance(field, Bounded)):
            return event
        first = field.burst(event)
        if first is None:
            return event
        text = [first]
        while self.held and isinstance(key := self.held[0], events.Key) and (more := field.burst(key)) is not None:
            self.held.popleft()
            text.append(more)
        if len(text) == 1:
            return event
        burst = events.Paste("".join(text))
        burst.set_sender(self.app)
        return burst

    async def _drain(self) -> None:
        self._called = False
        while self.held and self.settling is None:
            event = self._next()
            passes = self.passes(event)
            await self.route(event)
            if not passes:
                self.settling = asyncio.create_task(self._settle())
        if not self.held and self.settling is None:
            self._done.set()

    async def _settle(self) -> int:
        try:
            return await quiet(self.app)
        except ScreenStackError:
            return 0  # the app is leaving: no screen left to settle
        finally:
            if not self.app.call_later(self._reopen):
                self.settling = None  # the app is leaving: nothing more will be routed
                self.held.clear()
                self._done.set()

    async def _reopen(self) -> None:
        self.settling = None
        await self._drain()

    async def close(self) -> None:
        """Stop waiting (the app is leaving)."""
        task, self.settling = self.settling, None
        self.held.clear()
        self._done.set()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
