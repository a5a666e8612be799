"""Logging a store outage once, not once per failed write.

While the store is unreachable every timer firing, heartbeat and catch-up fails; logging
each would bury the log. :class:`OutageLog` logs the first failure of each kind as a
warning, then one every 60 failures (once a minute for every-second schedules), the rest at
debug level, and one line when the store answers again.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from backend.clock import Clock

__all__ = ["OutageLog"]

log = logging.getLogger("schedtui.engine")


class OutageLog:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.down_since: datetime | None = None
        self._down_at = 0.0  # (the outage's length on the monotonic clock: a wall clock stepped meanwhile made it negative)
        self._failures: dict[str, int] = {}

    def trouble(self, kind: str, what: str, exc: Exception) -> None:
        if self.down_since is None:
            self.down_since, self._down_at = self.clock.now(), time.monotonic()
        count = self._failures.get(kind, 0)
        self._failures[kind] = count + 1
        if count % 60 == 0:
            log.warning("%s (%s)", what, exc)
        else:
            log.debug("%s (%s)", what, exc)

    def back(self, lost_slots: int) -> None:
        """The store answered: log how long it was down (once per outage)."""
        if self.down_since is None:
            return
        log.info(
            "store reachable again after %.1fs; %d slot(s) that could not be claimed meanwhile will be recorded",
            time.monotonic() - self._down_at,
            lost_slots,
        )
        self.down_since = None
        self._failures.clear()
