"""A held lock (:class:`Lease`) and what :meth:`~backend.locks.Locks.with_lock` returns."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from backend.locks.model import Lock, StaleLease
from backend.model import iso
from backend.runtime.leaseclock import LeaseClock

if TYPE_CHECKING:
    from backend.locks.service import Locks

__all__ = ["Lease", "LockResult"]


class Lease:
    """The right to a lock until it is released or lost, and its fencing token.

    The lease is renewed in the background every ``ttl/3``. If it cannot be renewed before
    it expires (another holder took it over, an operator released it by force, or the
    store did not answer in time), :attr:`lost` is set, with :attr:`lost_reason`; whoever
    runs the protected work is told (``with_lock`` and ``hold`` cancel async work). The
    release checks it once more: a lease that is no longer the lock's current one by then
    (released by force since the last renewal) is lost too, so the work that just ended is
    not reported done under the lock.

    :attr:`token` is strictly greater than every token the lock was given before. Pass it
    to whatever the work writes, or let the store check it: :meth:`fence` in the caller's
    own transaction refuses the write (:class:`StaleLease`) once a newer token has been
    seen for that resource or the lease is no longer the lock's current one.
    """

    def __init__(self, locks: Locks, lock: Lock, ttl: timedelta, asked_at: int) -> None:
        assert lock.holder is not None
        self._locks = locks
        self.name = lock.name
        self.token = lock.token
        self.holder: str = lock.holder
        self.ttl = ttl
        self.acquired_at = lock.acquired_at
        self.expires_at = lock.expires_at
        """Until when the store holds it for us (on the lock clock), as of the last renewal."""
        self.deadline = asked_at + LeaseClock.span(ttl)
        """Until when it is surely ours, on this process's lease clock (nanoseconds on a clock
        that never jumps: see :meth:`~backend.locks.Locks.lease_now`): the start of the request
        that took or last renewed it, plus the ttl (the store's expiry can only be later). A
        step of the wall clock moves neither: a step back held the renewals back by its
        size, and another process took the lock over while this one still believed it held."""
        self.renewed_at = asked_at
        """When the request of the last renewal began, on the lease clock."""
        self.lost = asyncio.Event()
        """Set when the lease could not be renewed in time; readable from any thread."""
        self.lost_reason: str | None = None
        self.released = False
        self._lost_flag = threading.Event()
        self._stop = asyncio.Event()
        self._on_lost: list[Callable[[str], None]] = []

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self.released else "held"
        return f"<Lease {self.name!r} token={self.token} {state} until {iso(self.expires_at)}>"

    @property
    def held(self) -> bool:
        return not self.released and not self.lost.is_set()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (on the event loop) if the lease is lost."""
        if self.lost.is_set():
            callback(self.lost_reason or "lost")
        else:
            self._on_lost.append(callback)

    async def fence(self, conn: Any, resource: str) -> None:
        """Check this lease against ``resource`` inside the caller's transaction on ``conn``
        (a psycopg ``AsyncConnection`` to the store's database; a ``sqlite3`` connection to
        the store's file), and record the token as the newest seen for it. Raises
        :class:`StaleLease` when a newer token has been seen for ``resource`` or the lease
        is no longer current: roll the transaction back. Fence counters are never deleted.

        The store decides, not this process: a lease it still holds as current is current,
        and one taken over, released or expired is refused, whatever this process believes."""
        why = await self._locks.store.fence_on(conn, resource, self.name, self.token, self._locks.lock_now())
        self._refuse(resource, why)

    def fence_sync(self, conn: Any, resource: str) -> None:
        """:meth:`fence` on a synchronous connection (psycopg ``Connection``, ``sqlite3``)."""
        why = self._locks.store.fence_on_sync(conn, resource, self.name, self.token, self._locks.lock_now())
        self._refuse(resource, why)

    def _refuse(self, resource: str, why: str | None) -> None:
        if why is not None:
            raise StaleLease(
                f'write to "{resource}" refused for lock "{self.name}" token {self.token}: {why}'
            )

    async def release(self) -> None:
        """Give the lock back (once; later calls do nothing)."""
        await self._locks.release_lease(self)


@dataclass(frozen=True, slots=True)
class LockResult:
    """What :meth:`~backend.locks.Locks.with_lock` did: ``acquired`` false means another
    holder had the lock and ``work`` did not run. Otherwise ``value`` is what ``work``
    returned, or ``error`` what it raised (:class:`~backend.locks.LeaseLost` when the
    lease was lost while it ran, or found released by force when it ended: ``value`` is
    then what the work returned, unprotected); errors are returned, not raised."""

    acquired: bool
    value: Any = None
    error: BaseException | None = None
    token: int | None = None
