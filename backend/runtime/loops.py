"""The engine's background tasks, and knowing when they are all idle.

:class:`Loops` starts the engine's long-lived tasks (timers, watchdog, housekeeping,
catch-ups, backfills) and lets each of them *park*: sleep on the injected clock until a
deadline, or until someone hands it new work through an event. A loop that is parked with
no deadline already due is idle. :meth:`Loops.quiesce` waits until every loop is idle and
the caller's own condition holds: on a :class:`~backend.clock.ManualClock` that is "the
engine has done everything the current time calls for", which is how the tests move time
without ever sleeping for real.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from backend.clock import Clock, follows_real_time

T = TypeVar("T")

__all__ = ["RESTART_AFTER_MAX", "Loops", "call_from_thread", "stop_if_cancelled"]

log = logging.getLogger("schedtui.engine")

#: Seconds a stop waits for a cancelled task before cancelling it again.
CANCEL_AGAIN = 0.5
#: The longest pause (seconds) before a long-lived loop that raised starts again: the
#: pause doubles from one second with each failure in a row.
RESTART_AFTER_MAX = 60.0
#: A loop that ran this long (seconds, on the clock) before it raised starts its count of
#: failures in a row afresh.
_HEALTHY_FOR = 300.0
#: Seconds past a park's span (on the event loop's clock, which never steps) after which a
#: loop parked on the real wall clock wakes even if that clock has not reached its deadline.
STEP_SLACK = 0.1


@dataclass
class _Parking:
    """Where one loop is parked."""

    parked: bool = False
    until: datetime | None = None
    wake: asyncio.Event | None = None
    """Set by whoever has new work for the loop; a set event means it is not idle."""


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def call_from_thread(loop: asyncio.AbstractEventLoop | None, call: Coroutine[Any, Any, T], instead: str) -> T:
    """Run ``call`` on the engine's ``loop`` and block this thread until it is done (what
    a plain ``def`` handler's blocking helpers do). Refused on that loop itself, naming
    ``instead`` (waiting there would block the loop that must do the work), and once the
    engine has stopped."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or loop.is_closed() or running is loop:
        call.close()
        if running is loop:
            raise RuntimeError(f"on the engine's loop, {instead}")
        raise RuntimeError("the engine is not running")
    return asyncio.run_coroutine_threadsafe(call, loop).result()


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task is being cancelled. A loop that waits
    on its own event calls it before each wait: Python 3.11's ``asyncio.wait_for`` (psycopg's
    pool uses it) can drop a cancellation in the loop's work, which would then wait for ever
    and hang the engine's stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Loops:
    """Spawns the engine's tasks and tracks which of them are parked.

    Contract: a loop registered with :meth:`expect` counts as busy until it first parks;
    :meth:`park` returns when ``until`` has passed on the clock or ``wake`` was set (and
    clears ``wake``), or, on the real clock, once as long as ``until`` was away has passed
    (the wall clock stepped back meanwhile): a parked loop reads the clock again before it
    acts; :meth:`poke` must be called whenever something that :meth:`quiesce`'s condition
    reads may have changed.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._steps_back = follows_real_time(clock)
        """Whether the clock may step back (the machine's, which NTP or an operator sets):
        a loop parked until a time it then reads as a minute away would idle that minute
        (an instance whose clock was fixed a minute back delivered no page, claimed no job
        for a minute)."""
        self._parking: dict[str, _Parking] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._poke = asyncio.Event()
        self._hurried = asyncio.Event()

    def reset(self) -> None:
        """Forget every loop (for an engine opened again, possibly on another event loop)."""
        self._parking.clear()
        self._poke = asyncio.Event()
        self._hurried = asyncio.Event()

    # -- a stop's grace -----------------------------------------------------------------------
    def hurry(self) -> None:
        """The stop under way is to wait no longer (a second Ctrl-C): every wait of
        :meth:`within_grace`, begun or to come, ends at once."""
        self._hurried.set()

    async def within_grace(self, aws: Collection[asyncio.Future[Any]], grace: float) -> None:
        """Wait until every one of ``aws`` is done, ``grace`` seconds at most, and no longer
        once :meth:`hurry` is called. Cancels none of them: what is still running is the
        caller's to end."""
        if not aws or grace <= 0 or self._hurried.is_set():
            return
        every = asyncio.ensure_future(asyncio.wait(aws))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait({every, hurried}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            every.cancel()  # (cancelling asyncio.wait cancels none of what it waits for)
            hurried.cancel()

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        return self._track(asyncio.ensure_future(coro), name)

    def _track(self, task: asyncio.Task[Any], name: str) -> asyncio.Task[Any]:
        task.set_name(f"schedtui {name}")
        self.tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s crashed", name, exc_info=t.exception())
            self.poke()

        task.add_done_callback(done)
        return task

    def keep(self, loop: Callable[[], Awaitable[Any]], name: str, *, parks_as: str | None = None) -> asyncio.Task[Any]:
        """Spawn a long-lived loop that must not end: ``loop()`` is called again whenever it
        raises (anything but a cancellation), after a pause that doubles from one second to
        :data:`RESTART_AFTER_MAX`, spent parked as ``parks_as`` (the name the loop parks
        under, ``name`` by default) if the loop parks at all. A store error a loop did not expect, or a bug in one of
        its rounds, fails that round: it must never stop the instance's lease, timers or
        workers for good while the process looks alive. The first failure is logged with
        its traceback, then every tenth while they go on.

        It runs in a context of its own, empty: one started from a handler's (a run's first
        print starts the log writer, a handler's send the jobs notifier) or a request's
        would carry that caller's context variables for good: the run's capture, which
        took the loop's warnings minutes later for that ended run's late output, or the
        request's actor."""
        kept = self._kept(loop, name, parks_as or name)
        return self._track(asyncio.get_running_loop().create_task(kept, context=contextvars.Context()), name)

    async def _kept(self, loop: Callable[[], Awaitable[Any]], name: str, parks_as: str) -> None:
        failures = 0
        while True:
            began = self.clock.now()
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if (self.clock.now() - began).total_seconds() >= _HEALTHY_FOR:
                    failures = 0
                failures += 1
                pause = min(RESTART_AFTER_MAX, 2.0 ** (failures - 1))
                if failures % 10 == 1:
                    log.error(
                        "%s failed (%s, %d time(s) in a row); it starts again in %gs",
                        name, f"{type(exc).__name__}: {exc}", failures, pause, exc_info=exc,
                    )  # fmt: skip
                else:
                    log.debug("%s failed again (%s: %s)", name, type(exc).__name__, exc)
            again = self.clock.now() + timedelta(seconds=pause)
            if parks_as in self._parking:
                await self.park(parks_as, again)  # idle meanwhile, for quiesce()
            else:
                await self.clock.sleep_until(again)  # a loop quiesce() does not wait for

    async def cancel_all(self, keep: Collection[asyncio.Task[Any]] = ()) -> None:
        """Cancel every task (but those in ``keep``) and wait until all have ended. One whose
        cancellation was dropped in its work (see :func:`stop_if_cancelled`) is cancelled
        again, every :data:`CANCEL_AGAIN` seconds, instead of hanging the stop."""
        while pending := [task for task in self.tasks if not task.done() and task not in keep]:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=CANCEL_AGAIN)
        await asyncio.gather(*(task for task in self.tasks if task not in keep), return_exceptions=True)

    def expect(self, name: str) -> None:
        """Count the loop ``name`` as busy until it first parks."""
        self._parking[name] = _Parking()

    def forget(self, name: str) -> None:
        self._parking.pop(name, None)

    def needs_wake(self, name: str, at: datetime) -> bool:
        """Whether new work due at ``at`` needs the loop ``name`` woken: unless it is parked
        until ``at`` or earlier anyway."""
        state = self._parking.get(name)
        return state is None or not state.parked or state.until is None or at < state.until

    def poke(self) -> None:
        self._poke.set()

    def idle(self) -> bool:
        return not self.busy()

    def busy(self) -> list[str]:
        """The loops that are not idle, each with why (what a quiesce that never ends is
        waiting for): not parked, parked until a time already due, or woken."""
        now = self.clock.now()
        busy = []
        for name, state in self._parking.items():
            if not state.parked:
                busy.append(f"{name} (running)")
            elif state.until is not None and state.until <= now:
                busy.append(f"{name} (due at {state.until.isoformat()})")
            elif state.wake is not None and state.wake.is_set():
                busy.append(f"{name} (woken)")
        return busy

    async def quiesce(self, settled: Callable[[], bool], flush: Callable[[], Awaitable[None]]) -> None:
        """Wait until every loop is idle and ``settled()`` holds, then ``flush()``; repeat
        until both still hold after the flush."""
        while True:
            self._poke.clear()
            if self.idle() and settled():
                await flush()
                if self.idle() and settled():
                    return
                continue
            await self._poke.wait()

    async def park(self, name: str, until: datetime | None, wake: asyncio.Event | None = None) -> None:
        """Sleep on the clock until ``until`` (or forever), or until ``wake`` is set.

        A task being cancelled does not park: its cancellation may have been lost in its
        work (Python 3.11's ``asyncio.wait_for`` can drop one), and parking would then
        wait for ever instead of ending the loop."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        state = self._parking.setdefault(name, _Parking())
        state.parked, state.until, state.wake = True, until, wake
        self.poke()
        bound: asyncio.TimerHandle | None = None
        try:
            waiters: list[asyncio.Future[Any]] = []
            if until is not None:
                waiters.append(asyncio.ensure_future(self.clock.sleep_until(until)))
                if self._steps_back:  # (a future and a timer: no task of its own on a hot path)
                    span = max((until - self.clock.now()).total_seconds(), 0.0)
                    stepped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    bound = asyncio.get_running_loop().call_later(span + STEP_SLACK, _settle, stepped)
                    waiters.append(stepped)
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            if not waiters:
                await asyncio.Future()  # until cancelled
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if wake is not None:
                wake.clear()
        finally:
            if bound is not None:
                bound.cancel()
            state.parked = False
