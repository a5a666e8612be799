"""Project locks with fencing tokens (the README's "Locks").

``engine.locks`` / ``st.locks`` is a :class:`Locks`: :meth:`~Locks.with_lock` runs work
holding a lock (or returns ``acquired=False`` at once), :meth:`~Locks.hold` is the same as
an ``async with`` block, and every :class:`Lease` carries a fencing token that its holder's
writes can be checked against (:meth:`Lease.fence`). ``define_schedule(..., lock="name")``
runs a schedule's handler only while holding that lock.
"""

from backend.locks.lease import Lease, LockResult
from backend.locks.model import (
    DEFAULT_TTL,
    TAG_LEASE_LOST,
    TAG_LOCKED,
    LeaseLost,
    Lock,
    LockNotAcquired,
    LockRelease,
    LocksSnapshot,
    StaleLease,
)
from backend.locks.service import Locks
from backend.locks.store import LockStore

__all__ = [
    "DEFAULT_TTL",
    "TAG_LEASE_LOST",
    "TAG_LOCKED",
    "Lease",
    "LeaseLost",
    "Lock",
    "LockNotAcquired",
    "LockRelease",
    "LockResult",
    "LockStore",
    "Locks",
    "LocksSnapshot",
    "StaleLease",
]
