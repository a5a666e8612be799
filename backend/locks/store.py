"""What the locks need from a store: :class:`LockStore`, implemented by both stores
(:mod:`backend.store.sqlite.locks`, :mod:`backend.store.postgres.locks`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol

from backend.locks.model import Lock, LockRelease, LocksSnapshot

__all__ = ["LockStore"]


class LockStore(Protocol):
    """The lock table, its fencing sequence and the fence counters.

    Contract (every method is one conditional statement, or one transaction):

    * ``now`` is the lock clock's time: ``None`` means the database's own clock (what
      production uses, so that instances whose clocks differ agree on expiry); a test on
      an injected clock passes that clock's time.
    * :meth:`acquire_lock` takes the lock when it has no row, was released, or its lease
      expired (``expires_at <= now``), drawing its token from the fencing sequence *when
      the row is taken*: every token a name is given is strictly greater than every token
      it was given before, by any holder, under any concurrency. Otherwise it returns
      ``None`` and changes nothing. It records ``claim`` (or nothing) on the row it takes.
    * :meth:`give_back_lock` frees the lock only while the lease that was taken with
      ``claim`` is its current one (never another holder's, nor a later lease of the same
      holder): for an acquire whose statement may have committed though its answer was
      lost, so that nobody would know the lock is held until its ttl runs out.
    * :meth:`renew_lock` extends the lease only for the current token of a held, unexpired
      lock; :meth:`release_lock` frees it only for the current token. Rows are never
      deleted (a released lock keeps its last token), so the sequence is never reset.
    * :meth:`fence_on` runs on the caller's own connection, inside the caller's
      transaction: it records ``token`` as the newest seen for ``resource`` and returns
      ``None`` if no newer token was seen for it and the lease is still the lock's current
      one; otherwise it changes nothing and returns why (a sentence). Fence counters are
      never deleted.
    * Connection trouble raises :class:`~backend.errors.Unavailable`.
    """

    async def acquire_lock(
        self, name: str, holder: str, ttl: timedelta, now: datetime | None, claim: str | None = None
    ) -> Lock | None: ...

    async def give_back_lock(self, name: str, claim: str, now: datetime | None) -> bool:
        """Whether the lease taken with ``claim`` was current and is now released."""

    async def renew_lock(self, name: str, token: int, ttl: timedelta, now: datetime | None) -> datetime | None:
        """The new expiry, or ``None`` when the lease is no longer current."""

    async def release_lock(self, name: str, token: int, now: datetime | None) -> bool: ...

    async def force_release_lock(self, name: str, now: datetime | None, token: int | None = None) -> LockRelease | None:
        """Free the lock whoever holds it (given ``token``: only while that is its token,
        else nothing changes); the lock as it was (``None``: no such lock)."""

    async def get_lock(self, name: str) -> Lock | None: ...

    async def list_locks(self, now: datetime | None) -> LocksSnapshot: ...

    async def fence_on(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        """See the class contract (an async or sync driver connection, as the store takes)."""

    def fence_on_sync(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        """:meth:`fence_on` for a synchronous connection."""
