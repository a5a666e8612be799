"""Logging a store outage once, not once per failed write.

While the store is unreachable every timer firing, heartbeat and catch-up fails; logging
each would bury the log. :class:`OutageLog` logs the first failure of each kind as a
warning, then at most one a minute (by the engine's clock), the rest at debug level, and
one line once every kind that failed works again.

A kind's trouble ends only with a success of that kind: a store with a full disk still
takes reads and in-place updates (the heartbeat, the housekeeping round) while every insert
(a claim, a job cycle) fails, and a housekeeping round that ended every kind's trouble
started each kind's count again, a warning and a false "reachable again" every second.
The warnings are spaced by time, not counted: one every 60 failures let the claims, which
fail twice a second there (the timer's and the lost slots' recovery), warn every 30 s.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from backend.clock import Clock

__all__ = ["OutageLog"]

log = logging.getLogger("schedtui.engine")

WARN_EVERY = timedelta(minutes=1)


class OutageLog:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.down_since: datetime | None = None
        self._down_at = 0.0  # (the outage's length on the monotonic clock: a wall clock stepped meanwhile made it negative)
        self._warned: dict[str, datetime] = {}
        """The kinds failing now: when each was last warned of."""
        self._lost_slots = 0

    def trouble(self, kind: str, what: str, exc: Exception) -> None:
        now = self.clock.now()
        if self.down_since is None:
            self.down_since, self._down_at = now, time.monotonic()
        warned = self._warned.get(kind)
        if warned is None or not timedelta(0) <= now - warned < WARN_EVERY:  # (or a clock stepped back)
            self._warned[kind] = now
            log.warning("%s (%s)", what, exc)
        else:
            log.debug("%s (%s)", what, exc)

    def back(self, kind: str, lost_slots: int | None = None) -> None:
        """A call of ``kind`` went through: that kind's trouble is over (``lost_slots``, from
        the claims: the slots they could not claim meanwhile). Once no kind fails any more,
        log how long the store was down (once per outage)."""
        if self._warned.pop(kind, None) is None:
            return  # it was not failing (another kind may be)
        if lost_slots is not None:
            self._lost_slots = lost_slots
        if self._warned or self.down_since is None:
            return
        log.info(
            "store reachable again after %.1fs; %d slot(s) that could not be claimed meanwhile will be recorded",
            time.monotonic() - self._down_at,
            self._lost_slots,
        )
        self.down_since = None
        self._lost_slots = 0
