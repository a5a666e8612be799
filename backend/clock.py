"""Time, injected: the engine and the console read the time and wait only through a Clock.

Tests hand in a :class:`ManualClock` and move it by hand, so minute, daily and DST cases
run in milliseconds and snapshots stay stable; production uses :class:`SystemClock`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Protocol

from backend.model import utc

__all__ = ["Clock", "ManualClock", "OffsetClock", "SystemClock", "follows_real_time"]

# How much earlier than its deadline SystemClock's last long sleep ends: a millisecond of
# selector rounding plus some, and the kernel's slack of 1/1000 of the timeout.
_SPIN = 0.0015
_SLACK = 0.0011


class Clock(Protocol):
    """Where the engine gets the time from.

    ``now()`` returns an aware UTC datetime. ``sleep_until(deadline)`` returns once
    ``now() >= deadline`` holds (never before), and may be cancelled.
    """

    def now(self) -> datetime: ...

    async def sleep_until(self, deadline: datetime) -> None: ...


class SystemClock:
    """The real wall clock.

    Long waits are cut into chunks of at most ``max_chunk`` seconds and the wall clock is read
    again after each one: asyncio measures delays on the monotonic clock, so without this a
    wall-clock step (NTP, a suspended VM) would go unnoticed until the sleep ended, and a
    timer may come back a little early.
    """

    def __init__(self, max_chunk: float = 60.0) -> None:
        self.max_chunk = max_chunk

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, deadline: datetime) -> None:
        while True:
            remaining = (deadline - self.now()).total_seconds()
            if remaining <= 0:
                return
            # The event loop's selector rounds its timeout up to the millisecond, and the
            # kernel lets a poll timeout expire up to 0.1 % late (timer slack): a 1 s sleep
            # ends ~1-2 ms after the deadline. So sleep to just short of it, then yield to
            # the loop until it passes (a ~2 ms spin that other tasks still run through).
            early = _SPIN + remaining * _SLACK
            if remaining > early:
                await asyncio.sleep(min(remaining - early, self.max_chunk))
            else:
                await asyncio.sleep(0)


class OffsetClock:
    """Another clock shifted by a fixed offset: a machine whose clock runs fast or slow.

    A test seam: ``schedtui serve`` uses one when ``$SCHEDTUI_CLOCK_OFFSET_MS`` (or the
    hidden ``--clock-offset-ms``) is set, so a test can run an instance 300 ms ahead of
    another and check that they still fire each slot once. Never needed in production.
    """

    def __init__(self, offset: timedelta | float, base: Clock | None = None) -> None:
        self._offset = offset if isinstance(offset, timedelta) else timedelta(seconds=offset)
        self.base: Clock = base or SystemClock()
        self._moved: asyncio.Event | None = None
        """Set when the offset changes: sleepers reckon their deadline again."""

    @property
    def offset(self) -> timedelta:
        return self._offset

    @offset.setter
    def offset(self, value: timedelta) -> None:
        """Step the clock (as NTP or a restored VM would): every sleeper wakes at its
        deadline on the stepped clock, not on the old one."""
        self._offset = value
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    def now(self) -> datetime:
        return self.base.now() + self._offset

    async def sleep_until(self, deadline: datetime) -> None:
        while self.now() < deadline:
            if self._moved is None:
                self._moved = asyncio.Event()
            sleeper = asyncio.ensure_future(self.base.sleep_until(deadline - self._offset))
            stepped = asyncio.ensure_future(self._moved.wait())
            try:
                await asyncio.wait([sleeper, stepped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                stepped.cancel()


def follows_real_time(clock: Clock) -> bool:
    """Whether ``clock`` moves with real time: the machine's clock, shifted or not (leases
    and the comparison with the database's clock mean something only then)."""
    if isinstance(clock, OffsetClock):
        return follows_real_time(clock.base)
    return isinstance(clock, SystemClock)


class ManualClock:
    """A clock that only moves when told to; for tests, demos and snapshots.

    Sleepers wake when :meth:`advance` or :meth:`set` moves the time to or past their
    deadline. ``sleepers`` tells how many are waiting, so a test can wait for a loop to
    park again instead of sleeping for real.
    """

    def __init__(self, start: datetime | str = "2026-01-01T00:00:00Z") -> None:
        if isinstance(start, str):
            start = datetime.fromisoformat(start.replace("Z", "+00:00"))
        self._now = utc(start)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def next_deadline(self) -> datetime | None:
        """The earliest deadline anyone waits for, if any."""
        live = [when for when, _, fut in self._sleepers if not fut.done()]
        return min(live) if live else None

    async def sleep_until(self, deadline: datetime) -> None:
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), fut))
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()

    def set(self, when: datetime | str) -> None:
        if isinstance(when, str):
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        when = utc(when)
        if when < self._now:
            raise ValueError(f"ManualClock cannot go back from {self._now} to {when}")
        self._now = when
        while self._sleepers and self._sleepers[0][0] <= when:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def advance(self, seconds: float | timedelta) -> datetime:
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        self.set(self._now + step)
        return self._now

    def step_back(self, seconds: float | timedelta) -> datetime:
        """Step the time back (as NTP steps a clock that ran fast): :meth:`set` refuses to,
        so that a test never does it by mistake. Sleepers wait on for their deadlines."""
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if step < timedelta(0):
            raise ValueError(f"step_back({seconds!r}): give how far back, a positive length")
        self._now -= step
        return self._now
