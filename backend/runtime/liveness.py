"""This instance's lease on the work it runs: the liveness model.

A firing member renews its lease with every heartbeat. Others take its work over (close
its runs as abandoned, retry its jobs, claim its durable executions) only once its
heartbeat is older than the **take-over window** (``abandon_after``, 30 s by default),
counted from when the store could last be written by everyone. So the member itself must
stop working before that: when it has not renewed for the **renewal bound** (two thirds
of the window, as leader-election clients default to) its lease *lapses*:

* work begun under the lapsed lease is fenced: async handlers are cancelled (recorded
  ``failed``/``lease_lost``), durable executions let go, and work claimed but not started
  never starts (each piece of work carries the lease *epoch* it was claimed under);
* a thread cannot be stopped in Python: if sync handlers are still running, the process
  ends itself (as a leader-election client does when it loses leadership), so that no
  handler of it runs beside the one that takes its work over;
* nothing new is claimed until a heartbeat renews the lease (a new epoch).

A member whose clock is off the database server's by more than a twelfth of the window lets
its lease lapse too, until they agree again (:mod:`backend.runtime.skew`); so does one whose
wall clock jumps by as much between two heartbeats (against the lease clock, which never
jumps), at once rather than at the next heartbeat: its stamps would be off from then on.

Time here is the lease clock: ``CLOCK_BOOTTIME`` where there is one (it goes on counting
while the process is stopped or the machine suspended), so a process frozen past the
bound finds its lease lapsed the moment it runs again, before it starts anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Final

__all__ = ["CLOCK_LIMIT_SHARE", "LEASE_BOUND_SHARE", "LINGER_GRACE_S", "STOP_SHARE", "WorkLease", "boot_clock", "linger_grace"]

log = logging.getLogger("schedtui.engine")

#: The renewal bound as a share of the take-over window: the rest (a third) is the margin
#: for the clocks of two machines to differ (a sixth) and for the lapse to take effect (a
#: sixth: see :data:`STOP_SHARE`).
LEASE_BOUND_SHARE: Final = 2 / 3
#: The most this instance's wall clock may be off, as a share of the window: off the
#: database server's clock (:mod:`backend.runtime.skew`), or jumped between two heartbeats.
#: Two instances each that far off, one either way, differ by twice it: the sixth of the
#: margin that is the clocks'. (It was a sixth each, the whole margin: a holder 5 s behind
#: was judged silent 30 s by a taker 5 s ahead at 20 s, as its lapse only began.)
CLOCK_LIMIT_SHARE: Final = 1 / 12
#: The share of the window a lapse has to take effect: to cancel async handlers and, for
#: those that ignore it, to end the process (see :func:`linger_grace`).
STOP_SHARE: Final = 1 / 6
#: The most a lapse waits for cancelled async handlers to return before it ends the
#: process (seconds): less with a short window (see :func:`linger_grace`).
LINGER_GRACE_S: Final = 2.0
#: How often (lease-clock seconds) the wall clock is compared with the lease clock: at the
#: lease's checks (every claim, every durable step), and by its watcher while nothing asks.
JUMP_CHECK_EVERY: Final = 0.5


def linger_grace(window: timedelta) -> float:
    """Seconds a lapse gives cancelled async handlers before it ends the process: at most
    half the stop's share of ``window`` (the other half is for noticing the lapse and
    cancelling), so that the process is gone before the others may take its work over
    whatever the window (2 s of a 6 s window ran past the take-over)."""
    return min(LINGER_GRACE_S, window.total_seconds() * STOP_SHARE / 2)


def boot_clock() -> float:
    """Seconds on a clock that never jumps and keeps counting while the process is stopped
    (``CLOCK_BOOTTIME``; ``time.monotonic`` where there is none)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class WorkLease:
    """The lease, its epochs, and what happens when it lapses (see the module).

    Contract: :meth:`holds` is true only for work claimed under the current epoch while
    the lease is fresh; a lapse moves to a new epoch at once and calls every
    :attr:`on_lapse` callback once, on the engine's loop; :meth:`fresh` stays false from
    the lapse until :meth:`renewed` is told of a renewal sent after it. With no clock the
    lease is not enforced (an engine on an injected clock, unless the test injects one).
    """

    def __init__(
        self, window: timedelta, clock: Callable[[], float] | None = boot_clock, wall: Callable[[], float] | None = None
    ) -> None:
        self.window = window
        self.bound = window.total_seconds() * LEASE_BOUND_SHARE
        self.clock = clock
        self.wall = wall
        """The wall clock the instance stamps its work with (seconds), compared with the lease
        clock for jumps (``None``: not compared, as on an injected clock)."""
        self.jump_limit = window.total_seconds() * CLOCK_LIMIT_SHARE
        self._wall_at: tuple[float, float] | None = None
        """The wall clock and the lease clock at the last renewal."""
        self._jump_checked_at = float("-inf")
        self._jumped_at = float("-inf")
        """The lease clock's reading when a jump was last found: a renewal sent before it
        renews nothing (its heartbeat, and the clock reading beside it, may be the old clock's)."""
        self._confirmed_at = float("-inf")
        """The lease clock's reading when the last heartbeat whose clock the store's agreed
        with was sent (see :attr:`wall_in_doubt`)."""
        self.jumped = asyncio.Event()
        """Set when a jump of the wall clock lapses the lease: the heartbeat, parked on that
        clock (a step back would hold it until the clock caught up), goes at once to find
        out whether the database's clock agrees with the stepped one."""
        self.renewed_at: float | None = None
        """The lease clock's reading when the last renewal that succeeded was sent."""
        self.epoch = 0
        self.lapsed = False
        self.lapses = 0
        self.enforced = False
        """Set once this instance becomes a firing member (an observer holds no lease)."""
        self.on_lapse: list[Callable[[str], None]] = []
        """Each system's way of letting go of its work, called in order at a lapse."""
        self.after_lapse: Callable[[str], None] | None = None
        """Called after them (the engine ends the process if sync handlers still run)."""
        self.on_renewed: list[Callable[[], None]] = []
        self._changed: asyncio.Event | None = None

    # -- renewing ---------------------------------------------------------------------------
    def sending(self) -> float:
        """Read the lease clock just before a renewal is sent (pass it to :meth:`renewed`);
        the wall clock beside it is where the next jump is measured from."""
        if self.clock is None:
            return 0.0
        now = self.clock()
        if self.wall is not None:
            self._wall_at = (self.wall(), now)
        return now

    def confirmed(self, sent_at: float) -> None:
        """The store's clock agreed with the wall clock read just after a heartbeat sent at
        ``sent_at`` (committed or refused): a jump found before it is confirmed."""
        self._confirmed_at = max(self._confirmed_at, sent_at)

    @property
    def wall_in_doubt(self) -> bool:
        """Whether the wall clock jumped since the store's clock last agreed with it: what
        it says may be the jump's (a stamp ahead makes another process look silent)."""
        return self._jumped_at >= self._confirmed_at and self._jumped_at > float("-inf")

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` was committed (one sent before a jump of the wall
        clock renews nothing: the jump is looked for first)."""
        self.check_jump()
        self.confirmed(sent_at)
        if (self.renewed_at is not None and sent_at < self.renewed_at) or sent_at <= self._jumped_at:
            return
        self.renewed_at = sent_at
        if self.wall is not None and self.clock is not None:
            self._wall_at = (self.wall(), self.clock())
        if self.lapsed and self._age() < self.bound:
            self.lapsed = False
            log.warning("lease renewed: this instance takes on new work again (epoch %d)", self.epoch)
        self._wake()
        for callback in self.on_renewed:
            callback()

    # -- asking -----------------------------------------------------------------------------
    def _age(self) -> float:
        if self.clock is None or self.renewed_at is None:
            return 0.0
        return self.clock() - self.renewed_at

    def fresh(self) -> bool:
        """Whether new work may be claimed now (checks for a lapse first, a jump of the wall
        clock included: a claim compares the others' stamps with it)."""
        self.check()
        self.check_jump()
        return not self.lapsed

    def holds(self, epoch: int) -> bool:
        """Whether work claimed under ``epoch`` may start (or go on) now (asked at every
        call: the wall clock is looked at every :data:`JUMP_CHECK_EVERY` at most)."""
        self.check()
        return not self.lapsed and epoch == self.epoch

    @property
    def remaining(self) -> float | None:
        """Seconds until the lease lapses unless renewed (``None``: not enforced)."""
        if not self.enforced or self.clock is None or self.renewed_at is None or self.lapsed:
            return None
        return self.bound - self._age()

    def check(self) -> None:
        """Lapse now if the bound has passed since the last renewal (asked before every
        step of every durable function: :attr:`remaining`, inlined)."""
        clock, renewed_at = self.clock, self.renewed_at
        if not self.enforced or clock is None or renewed_at is None or self.lapsed:
            return
        now = clock()
        age = now - renewed_at
        if age >= self.bound:
            self.lapse(f"it could not be renewed for {age:.1f}s (renewal bound {self.bound:g}s)")
        elif now - self._jump_checked_at >= JUMP_CHECK_EVERY and self.wall is not None:
            self.check_jump()

    def check_jump(self) -> None:
        """Lapse now if the wall clock moved, beside the lease clock, more than
        :attr:`jump_limit` since the last heartbeat (asked before one is stamped). A jump
        while lapsed sends the heartbeat at once too (the database's clock may agree now)."""
        wall, clock, then = self.wall, self.clock, self._wall_at
        if wall is None or clock is None or then is None or not self.enforced:
            return
        now = self._jump_checked_at = clock()
        wall_now = wall()
        jump = (wall_now - then[0]) - (now - then[1])
        if abs(jump) <= self.jump_limit:
            return
        self._wall_at = (wall_now, now)  # (each jump once)
        self._jumped_at = now
        self.jumped.set()
        if not self.lapsed:
            self.lapse(
                f"the wall clock jumped {jump:+.1f}s since the last heartbeat (more than {self.jump_limit:g}s: "
                "the time this instance stamps its work with is off until the database's clock confirms it)"
            )

    def lapse(self, why: str) -> None:
        """Give up the work of the current epoch (see the module); a no-op while lapsed."""
        if self.lapsed:
            return
        self.lapsed = True
        self.lapses += 1
        self.epoch += 1
        log.error(
            "LEASE LAPSED: %s; others take this instance's work over after %gs, so it stops that "
            "work now (async handlers cancelled, nothing new claimed until the lease is renewed)",
            why,
            self.window.total_seconds(),
        )
        for callback in [*self.on_lapse, *([self.after_lapse] if self.after_lapse is not None else [])]:
            try:
                callback(why)
            except Exception:  # one system failing to let go must not keep the others going
                log.exception("letting go of work after the lease lapsed failed")
        self._wake()

    # -- watching ---------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def watch(self) -> None:
        """Lapse as soon as the bound passes without a renewal (a task of the engine's, on
        real time: the engine's clock may be an injected one)."""
        self._changed = changed = asyncio.Event()
        while True:
            remaining = self.remaining
            if remaining is not None and remaining <= 0:
                self.check()
                continue
            if self.wall is not None and self.enforced:
                self.check_jump()  # a jump of the wall clock, while nothing else asks (lapsed too)
                remaining = self.remaining
                remaining = JUMP_CHECK_EVERY if remaining is None else min(remaining, JUMP_CHECK_EVERY)
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                pass
