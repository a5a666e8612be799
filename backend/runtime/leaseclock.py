"""Durations a lease is measured in, on a clock that never jumps.

A lease this process holds (a lock's, a shard's) is surely its own for its ttl counted from
when the request that took or renewed it was sent: a *duration*, which a step of the wall
clock (NTP, a restored VM) must not stretch or shorten. Measured on the wall clock, a step
back of a minute held the next renewal back a minute; the lease expired in the store, and
another process took it over while this one still believed it held it.

:class:`LeaseClock` reads :func:`~backend.runtime.liveness.boot_clock` on an engine whose
clock follows real time, and the injected clock's own time otherwise (tests move it, and
:meth:`~backend.runtime.loops.Loops.quiesce` sees the waits).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from backend.clock import Clock, follows_real_time
from backend.runtime.liveness import boot_clock
from backend.runtime.loops import Loops

__all__ = ["LeaseClock"]


class LeaseClock:
    """Seconds that never jump (see the module), and waits measured in them.

    Contract: :meth:`now` never goes back on real time; :meth:`park` returns by the time
    :meth:`now` reads ``until`` (perhaps early, never late by a wall-clock step), and
    :meth:`sleep_until` once it does."""

    def __init__(self, clock: Clock, loops: Loops) -> None:
        self.clock = clock
        self.loops = loops
        self.real_time = follows_real_time(clock)

    def now(self) -> float:
        return boot_clock() if self.real_time else self.clock.now().timestamp()

    async def park(self, name: str, until: float, wake: asyncio.Event | None = None) -> None:
        """Park the loop ``name`` (on the engine's clock, so that a quiesce sees it) until
        :meth:`now` reads ``until``, or ``wake`` is set. On real time the wait is bounded
        on the event loop's monotonic clock too: parked on the wall clock alone, a step back
        would hold it by the step's size."""
        left = max(0.0, until - self.now())
        parked = self.loops.park(name, self.clock.now() + timedelta(seconds=left), wake)
        if not self.real_time:
            await parked
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await parked

    async def sleep_until(self, until: float) -> None:
        """Return once :meth:`now` reads ``until``."""
        while (left := until - self.now()) > 0:
            if self.real_time:
                await asyncio.sleep(left)
            else:
                await self.clock.sleep_until(self.clock.now() + timedelta(seconds=left))
