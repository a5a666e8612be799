"""The locks for synchronous code (``st.locks`` of :func:`~backend.client.connection.connect_sync`).

The work runs in the caller's thread; the lease is taken, renewed and released on the
client's event loop thread. Sync work cannot be cancelled: a lost lease sets
``lease.lost`` (a :class:`threading.Event`) for the work to check, its fences are refused
from then on, and ``with_lock`` reports :class:`LeaseLost` (``hold`` raises it at the end).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from backend.locks.lease import Lease, LockResult
from backend.locks.model import DEFAULT_TTL, LeaseLost, LockNotAcquired, LockRelease, LocksSnapshot

if TYPE_CHECKING:  # (the service builds these: see Locks.sync)
    from backend.locks.service import Locks

__all__ = ["SyncLease", "SyncLocks"]

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, Any]], Any]


class SyncLease:
    """A :class:`~backend.locks.Lease` seen from a synchronous caller."""

    def __init__(self, lease: Lease, run: Run) -> None:
        self._lease = lease
        self._run = run
        self.name = lease.name
        self.token = lease.token
        self.holder = lease.holder
        self.ttl = lease.ttl
        self.lost: threading.Event = lease._lost_flag

    @property
    def lost_reason(self) -> str | None:
        return self._lease.lost_reason

    @property
    def held(self) -> bool:
        return self._lease.held

    def fence(self, conn: Any, resource: str) -> None:
        """:meth:`Lease.fence` on a synchronous connection, in the caller's transaction."""
        self._lease.fence_sync(conn, resource)

    def release(self) -> None:
        self._run(self._lease.release())


class SyncLocks:
    """:class:`~backend.locks.Locks` with blocking methods."""

    def __init__(self, locks: Locks, run: Run) -> None:
        self._locks = locks
        self._run = run

    def acquire(self, name: str, ttl: float | Any = DEFAULT_TTL) -> SyncLease | None:
        lease = self._run(self._locks.acquire(name, ttl))
        return SyncLease(lease, self._run) if lease is not None else None

    def with_lock(self, name: str, work: Callable[[SyncLease], T], ttl: float | Any = DEFAULT_TTL) -> LockResult:
        """Run ``work(lease)`` in this thread while holding the lock (see the module docstring)."""
        lease = self.acquire(name, ttl)
        if lease is None:
            return LockResult(False)
        value: Any = None
        error: BaseException | None = None
        try:
            value = work(lease)
        except Exception as exc:
            error = exc
        finally:
            lease.release()
        if lease.lost.is_set() and error is None:
            error = LeaseLost(f'the lease of lock "{name}" was lost while the work ran: {lease.lost_reason}')
        return LockResult(True, value, error, lease.token)

    @contextlib.contextmanager
    def hold(self, name: str, ttl: float | Any = DEFAULT_TTL) -> Iterator[SyncLease]:
        """``with st.locks.hold(name, ttl) as lease:``; :class:`LockNotAcquired` if it is held
        elsewhere, :class:`LeaseLost` at the end if the lease was lost meanwhile."""
        lease = self.acquire(name, ttl)
        if lease is None:
            raise LockNotAcquired(self._run(self._locks.describe_holder(name)))
        try:
            yield lease
        finally:
            lease.release()
        if lease.lost.is_set():
            raise LeaseLost(f'the lease of lock "{name}" was lost while the block ran: {lease.lost_reason}')

    def list(self) -> LocksSnapshot:
        result: LocksSnapshot = self._run(self._locks.list())
        return result

    def release(self, name: str) -> LockRelease:
        result: LockRelease = self._run(self._locks.release(name))
        return result
