"""Durations a lease is measured in, on a clock that never jumps.

A lease this process holds (a lock's, a shard's) is surely its own for its ttl counted from
when the request that took or renewed it was sent: a *duration*, which a step of the wall
clock (NTP, a restored VM) must not stretch or shorten. Measured on the wall clock, a step
back of a minute held the next renewal back a minute; the lease expired in the store, and
another process took it over while this one still believed it held it.

:class:`LeaseClock` reads ``CLOCK_BOOTTIME`` on an engine whose clock follows real time,
and the injected clock's own time otherwise (tests move it, and
:meth:`~backend.runtime.loops.Loops.quiesce` sees the waits). Its readings are whole
nanoseconds: on an injected clock, a renewal due a third of a ttl after a reading is due
exactly when the clock has moved that far (in float seconds a third of the time it was a
nanosecond short, and the renewal loop spun on a wait too short to be one).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

from backend.clock import Clock, follows_real_time
from backend.runtime.loops import Loops

__all__ = ["LeaseClock"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _boot_ns() -> int:
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime_ns(boottime) if boottime is not None else time.monotonic_ns()


class LeaseClock:
    """Nanoseconds that never jump (see the module), and waits measured in them.

    Contract: :meth:`now` never goes back on real time; :meth:`park` returns by the time
    :meth:`now` reads ``until`` (perhaps early, never late by a wall-clock step), and
    :meth:`sleep_until` once it does."""

    def __init__(self, clock: Clock, loops: Loops) -> None:
        self.clock = clock
        self.loops = loops
        self.real_time = follows_real_time(clock)

    @staticmethod
    def span(length: timedelta) -> int:
        """``length`` in nanoseconds (exact: a timedelta is whole microseconds)."""
        return length // _MICROSECOND * 1000

    def now(self) -> int:
        if self.real_time:
            return _boot_ns()
        return (self.clock.now() - _EPOCH) // _MICROSECOND * 1000

    def _wait(self, until: int) -> timedelta:
        """What is left until ``until``, on the engine's clock (at least a microsecond: the
        injected clock moves in them)."""
        return max(_MICROSECOND, timedelta(microseconds=-(-(until - self.now()) // 1000)))

    async def park(self, name: str, until: int, wake: asyncio.Event | None = None) -> None:
        """Park the loop ``name`` (on the engine's clock, so that a quiesce sees it) until
        :meth:`now` reads ``until``, or ``wake`` is set. On real time the wait is bounded
        on the event loop's monotonic clock too: parked on the wall clock alone, a step back
        would hold it by the step's size."""
        # (Due already: parked until now all the same, so that a quiesce sees the loop go on.)
        left = self._wait(until) if self.now() < until else timedelta(0)
        parked = self.loops.park(name, self.clock.now() + left, wake)
        if not self.real_time or not left:
            await parked
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left.total_seconds()):
                await parked

    async def sleep_until(self, until: int) -> None:
        """Return once :meth:`now` reads ``until``."""
        while self.now() < until:
            left = self._wait(until)
            if self.real_time:
                await asyncio.sleep(left.total_seconds())
            else:
                await self.clock.sleep_until(self.clock.now() + left)
