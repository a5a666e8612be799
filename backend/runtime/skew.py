"""This instance's clock against the store's: the lease's other assumption.

Heartbeats are stamped, and the others' heartbeat ages judged, by each instance's own
clock. The lease's margin (a third of the take-over window, see
:mod:`backend.runtime.liveness`) covers the lapse taking effect and clocks that differ a
little. A clock far off breaks the promise either way: one *behind* stamps heartbeats that
look old, so the others take its work over while it still runs it; one *ahead* judges the
others dead too early and takes theirs (or closes their runs as abandoned).

So every heartbeat on a shared store (PostgreSQL) also reads the database server's clock,
the one clock every instance can be compared with. An instance whose clock differs from
it by more than a twelfth of the window (2.5 s of the default 30) lets its lease lapse at once
(it stops its work, as a partitioned instance does), renews it only once the clocks agree
again, and meanwhile closes no other instance's work. The reading's uncertainty is half
its round trip: a reading too slow to tell keeps the previous verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from backend.runtime.liveness import CLOCK_LIMIT_SHARE

__all__ = ["ClockCheck", "ClockReading"]

@dataclass(frozen=True)
class ClockReading:
    """One comparison: ``offset`` is this instance's clock minus the server's (seconds;
    positive: ahead), within ``uncertainty`` either way (half the round trip)."""

    offset: float
    uncertainty: float

    @classmethod
    def between(cls, before: datetime, server: datetime, after: datetime) -> ClockReading:
        """The server read ``server`` somewhere between this clock's ``before`` and ``after``."""
        half = (after - before).total_seconds() / 2
        middle = before + timedelta(seconds=half)
        return cls((middle - server).total_seconds(), abs(half))


class ClockCheck:
    """The verdict on this instance's clock, kept across heartbeats.

    Contract: :meth:`judge` takes each reading; :attr:`off` is true from a reading that
    surely exceeds :attr:`limit` until one that surely does not (a reading whose
    uncertainty straddles the limit changes nothing). :attr:`offset` is the newest
    reading's offset (``None`` before the first)."""

    def __init__(self, window: timedelta) -> None:
        self.limit = window.total_seconds() * CLOCK_LIMIT_SHARE
        self.offset: float | None = None
        self.off = False

    def judge(self, reading: ClockReading) -> bool:
        """Take a reading; whether the verdict changed (then :meth:`describe` says why)."""
        self.offset = reading.offset
        size = abs(reading.offset)
        if size - reading.uncertainty > self.limit:
            off = True
        elif size + reading.uncertainty <= self.limit:
            off = False
        else:
            return False  # too slow a reading to tell
        changed, self.off = off != self.off, off
        return changed

    def describe(self) -> str:
        """The verdict in words (for the log and the lapse's reason)."""
        offset = self.offset or 0.0
        where = "ahead of" if offset > 0 else "behind"
        if self.off:
            return (
                f"this instance's clock is {abs(offset):.1f}s {where} the database server's, more than the "
                f"{self.limit:g}s allowed (a twelfth of the take-over window)"
            )
        return f"this instance's clock agrees with the database server's again ({offset:+.3f}s)"
