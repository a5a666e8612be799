"""The console's link to its backend: when to read again, how long to wait after a
failure, and as of when the data on screen is true.

Plain state and decisions on the app's clock, with no widget and no worker: the app reads
(in its workers), tells the link how each read went, and shows what the link says. So a
backoff, a stream that breaks, or a pause is a sequence of calls a test can make on a
:class:`~backend.clock.ManualClock` without drawing a screen.

Two feeds keep the data fresh. While the backend's change signals flow (``events_live``),
the data on screen is true as of now and is read again only when a signal names it (the
heartbeats excepted, every :data:`INSTANCES_LIVE_EVERY`, and everything every
:data:`KEEP_FRESH`). Otherwise the app polls every ``refresh_interval`` and tries the stream
again with backoff. A read that fails is tried again with backoff (:data:`BACKOFF_SECONDS`),
and said once, not at every retry.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from backend.clock import Clock

__all__ = ["BACKOFF_SECONDS", "INSTANCES_EVERY", "INSTANCES_LIVE_EVERY", "KEEP_FRESH", "LATE_AFTER", "Link"]

BACKOFF_SECONDS = (1, 2, 5)
"""Delays between reconnect attempts (and event stream attempts); the last one repeats. A
server back after a restart is found within 5 s (it took up to 30)."""

LATE_AFTER = timedelta(seconds=5)
"""While polling, a last good refresh older than the refresh interval and this much more
says the server does not answer (the header stops saying live)."""

INSTANCES_EVERY = timedelta(seconds=5)
"""How often the heartbeats are read while polling (they change every 5 s at most)."""

INSTANCES_LIVE_EVERY = timedelta(seconds=20)
"""How often the heartbeats are read while change signals flow (no signal says an engine
stopped beating; an engine counts as firing for 30 s after its last beat)."""

KEEP_FRESH = timedelta(seconds=120)
"""While change signals flow, everything is read again this often anyway."""


def _backoff(failures: int) -> int:
    return BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]


class Link:
    """The state of the console's link to its backend (see the module docstring)."""

    def __init__(self, clock: Clock, refresh_interval: timedelta) -> None:
        self.clock = clock
        self.refresh_interval = refresh_interval
        self.snapshot_now: datetime | None = None
        """The backend's clock at the last snapshot of the schedules."""
        self.snapshot_at: datetime | None = None
        """This clock then."""
        self.instances_at: datetime | None = None
        """This clock at the last read of the heartbeats."""
        self.instances_now: datetime | None = None
        """The backend's clock (estimated) then: the fleet's ages are judged against it."""
        self.next_refresh: datetime | None = None
        """When everything is read again (``None``: only when asked)."""
        self.retry_at: datetime | None = None
        """The connection is lost: when the next attempt is made."""
        self.failures = 0
        """Failed reads in a row (the next backoff)."""
        self.lost_reported = False
        """The loss was said: the read that succeeds next says it is back."""
        self.events_live = False
        """Change signals flow now: the data on screen is true as of now."""
        self.event_id: str | None = None
        """The last signal's id: a new stream resumes after it."""
        self.events_retry_at: datetime | None = None
        """The stream is down: when it is tried again."""
        self.events_failures = 0

    # -- time ------------------------------------------------------------------------------
    def backend_now(self) -> datetime:
        """The backend's clock, estimated: its ``now`` at the last snapshot plus the time
        since (so ``now`` typed in the backfill dialog is never ahead of the server)."""
        if self.snapshot_now is None or self.snapshot_at is None:
            return self.clock.now()
        return self.snapshot_now + (self.clock.now() - self.snapshot_at)

    def data_now(self, *, paused: bool) -> datetime:
        """The backend's time as of which the data on screen is true: when it was read
        (overdue is judged against it, so paused or stale data accuses no one), or now,
        while change signals flow (no signal: nothing changed)."""
        if self.events_live and not paused and self.snapshot_now is not None:
            return self.backend_now()
        return self.snapshot_now or self.clock.now()

    # -- what is due -------------------------------------------------------------------------
    def due(self, *, paused: bool) -> Literal["refresh", "instances"] | None:
        """What the clock says to read now, if anything: everything (a retry, or the next
        poll), or the heartbeats alone (while signals keep the rest fresh)."""
        now = self.clock.now()
        if self.retry_at is not None:
            return "refresh" if now >= self.retry_at else None
        if not paused and self.next_refresh is not None and now >= self.next_refresh:
            return "refresh"
        if (
            self.events_live
            and not paused
            and self.instances_at is not None
            and now - self.instances_at >= INSTANCES_LIVE_EVERY
        ):
            return "instances"
        return None

    def stream_due(self, *, connected: bool) -> bool:
        """Whether to open the event stream again now (it is down, its backoff is over,
        and the backend answers)."""
        return (
            self.events_retry_at is not None
            and self.clock.now() >= self.events_retry_at
            and connected
            and self.retry_at is None
        )

    def instances_due(self, now: datetime) -> bool:
        """Whether a full refresh at ``now`` reads the heartbeats too (every :data:`INSTANCES_EVERY`)."""
        return self.instances_at is None or now - self.instances_at >= INSTANCES_EVERY

    # -- how a read went ---------------------------------------------------------------------
    def snapshot(self, backend_now: datetime) -> None:
        """The schedules were read: the backend's clock said ``backend_now``."""
        self.snapshot_now, self.snapshot_at = backend_now, self.clock.now()

    def instances_read(self, at: datetime) -> None:
        """The heartbeats were read, asked for at ``at``."""
        self.instances_at = at
        self.instances_now = self.backend_now()

    def refreshed(self) -> bool:
        """A refresh succeeded: whether the connection is back after a loss that was said."""
        back, self.lost_reported = self.lost_reported, False
        self.retry_at = None
        self.failures = 0
        self.next_refresh = self.clock.now() + (KEEP_FRESH if self.events_live else self.refresh_interval)
        return back

    def read_failed(self) -> None:
        """A read failed, not for the connection (an error to report): polled again later."""
        self.next_refresh = self.clock.now() + self.refresh_interval

    def lost(self) -> bool:
        """The backend could not be reached: retried with backoff (:attr:`retry_at`).
        Whether to say so (the first time only)."""
        self.retry_at = self.clock.now() + timedelta(seconds=_backoff(self.failures))
        self.failures += 1
        first, self.lost_reported = not self.lost_reported, True
        return first

    def asked(self) -> None:
        """The operator asked for a read now (``ctrl+r``): a lost connection is retried now,
        and the heartbeats are read with the rest."""
        if self.retry_at is not None:
            self.retry_at = self.clock.now()
        self.instances_at = None

    def stopped(self) -> None:
        """No retry helps (a token refused, a connect that cannot succeed): nothing is read
        until asked (``ctrl+r``)."""
        self.retry_at = None
        self.next_refresh = None

    # -- the event stream --------------------------------------------------------------------
    def stream_opened(self) -> None:
        self.events_retry_at = None

    def stream_ready(self) -> None:
        """The stream said it is there (its first signal): a later break starts its backoff over."""
        self.events_failures = 0

    def set_feed(self, events: bool) -> bool:
        """Signals flow (or stop flowing); whether that changed. The next full read moves
        to the new feed's period."""
        if events == self.events_live:
            return False
        self.events_live = events
        if self.next_refresh is not None:
            self.next_refresh = self.clock.now() + (KEEP_FRESH if events else self.refresh_interval)
        return True

    def stream_down(self) -> tuple[bool, int]:
        """The stream ended: whether it was flowing (that is news: tried again at once),
        and the seconds until it is tried again (backoff when it never got going)."""
        flowing = self.events_live
        self.set_feed(False)
        if flowing:
            self.events_failures = 0
            delay = 0
        else:
            delay = _backoff(self.events_failures)
            self.events_failures += 1
        self.events_retry_at = self.clock.now() + timedelta(seconds=delay)
        return flowing, delay
