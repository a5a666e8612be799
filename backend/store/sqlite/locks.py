"""The locks' SQL for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Every write is one transaction of the store's writer thread (``BEGIN IMMEDIATE``: one
writer across every process sharing the file), so "read the row, draw a token, take it"
is atomic. Tokens come from a one-row sequence table. Times are integer microseconds;
there is no database clock apart from the machine's, so ``now=None`` reads that.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.locks.model import Lock, LockRelease, LocksSnapshot
from backend.safetext import store_text
from backend.store.migrations import Component

__all__ = ["SQLiteLocks"]

T = TypeVar("T")

LOCKS_V1 = """
    CREATE TABLE locks (
        name        TEXT PRIMARY KEY,
        holder      TEXT,
        token       INTEGER NOT NULL,
        acquired_at INTEGER NOT NULL,
        renewed_at  INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL
    );
    CREATE TABLE lock_tokens (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
    INSERT INTO lock_tokens (id, value) VALUES (1, 0);
    CREATE TABLE lock_fences (
        resource  TEXT PRIMARY KEY,
        token     INTEGER NOT NULL,
        fenced_at INTEGER NOT NULL
    )
"""
#: The claim an acquire draws, so that one whose answer was lost can give back what it
#: took (and only that: an acquire of an older schedtui, which the addition leaves
#: working, leaves the column as it was, so a give-back is tried only within the lease's
#: ttl, see Locks.maintain).
LOCK_CLAIMS = "ALTER TABLE locks ADD COLUMN claim TEXT"
LOCK_COLUMNS = "name, holder, token, acquired_at, renewed_at, expires_at"
GET_LOCK = f"SELECT {LOCK_COLUMNS} FROM locks WHERE name = ?"
LIST_LOCKS = f"SELECT {LOCK_COLUMNS} FROM locks ORDER BY name"
#: Held: a holder, and a lease not yet expired (a released lock is free at once, even
#: for a caller whose clock reads before the release: a clock stepped back).
IS_TAKEN = "SELECT 1 FROM locks WHERE name = ? AND holder IS NOT NULL AND expires_at > ?"
NEXT_TOKEN = "UPDATE lock_tokens SET value = value + 1 WHERE id = 1 RETURNING value"
TAKE_LOCK = f"""
    INSERT INTO locks ({LOCK_COLUMNS}, claim) VALUES (?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token,
        acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
        claim = excluded.claim
"""
RENEW_LOCK = """
    UPDATE locks SET renewed_at = ?, expires_at = ?
    WHERE name = ? AND token = ? AND holder IS NOT NULL AND expires_at > ?
    RETURNING expires_at
"""
RELEASE_LOCK = """
    UPDATE locks SET holder = NULL, expires_at = min(expires_at, ?)
    WHERE name = ? AND token = ? AND holder IS NOT NULL
"""
GIVE_BACK_LOCK = """
    UPDATE locks SET holder = NULL, expires_at = min(expires_at, ?)
    WHERE name = ? AND claim = ? AND holder IS NOT NULL
"""
FORCE_RELEASE = "UPDATE locks SET holder = NULL, expires_at = min(expires_at, ?) WHERE name = ? AND holder IS NOT NULL"
#: In the caller's transaction: the lease must be the lock's current one, and no newer
#: token may have been seen for the resource (an equal one is the same holder again).
FENCE = """
    INSERT INTO lock_fences (resource, token, fenced_at)
    SELECT ?, ?, ? WHERE EXISTS (
        SELECT 1 FROM locks WHERE name = ? AND token = ? AND holder IS NOT NULL AND expires_at > ?
    )
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token, fenced_at = excluded.fenced_at
    WHERE lock_fences.token <= excluded.token
    RETURNING token
"""
FENCE_WHY = "SELECT (SELECT token FROM lock_fences WHERE resource = ?), (SELECT token FROM locks WHERE name = ?)"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _us(dt: datetime) -> int:
    return (dt - _EPOCH) // _MICROSECOND


def _dt(us: int) -> datetime:
    return _EPOCH + _MICROSECOND * us


def _lock(row: tuple[Any, ...]) -> Lock:
    return Lock(row[0], row[1], int(row[2]), _dt(row[3]), _dt(row[4]), _dt(row[5]))


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def stale_reason(token: int, seen: int | None, current: int | None) -> str:
    """Why a fence refused ``token`` (both stores say it alike)."""
    if seen is not None and seen > token:
        return f"token {seen} has already written to it"
    if current is None:
        return "the lock has no row"
    if current > token:
        return f"the lock was taken over since (token {current})"
    return "the lease expired or was released"


class SQLiteLocks:
    """Locks on SQLite: see :class:`backend.locks.store.LockStore` for the contract."""

    COMPONENT = Component("locks", (LOCKS_V1,), additions=(LOCK_CLAIMS,))

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def acquire_lock(
        self, name: str, holder: str, ttl: timedelta, now: datetime | None, claim: str | None = None
    ) -> Lock | None:
        at = _now(now)
        at_us, until_us = _us(at), _us(at + ttl)

        def take(c: sqlite3.Connection) -> Lock | None:
            if c.execute(IS_TAKEN, (name, at_us)).fetchone() is not None:
                return None
            token = int(c.execute(NEXT_TOKEN).fetchone()[0])
            c.execute(TAKE_LOCK, (name, store_text(holder), token, at_us, at_us, until_us, claim))  # (a caller's text)
            return Lock(name, holder, token, _dt(at_us), _dt(at_us), _dt(until_us))

        return await self._write(take)

    async def renew_lock(self, name: str, token: int, ttl: timedelta, now: datetime | None) -> datetime | None:
        at = _now(now)
        params = (_us(at), _us(at + ttl), name, token, _us(at))
        row = await self._write(lambda c: c.execute(RENEW_LOCK, params).fetchone())
        return _dt(row[0]) if row else None

    async def release_lock(self, name: str, token: int, now: datetime | None) -> bool:
        params = (_us(_now(now)), name, token)
        return await self._write(lambda c: c.execute(RELEASE_LOCK, params).rowcount == 1)

    async def give_back_lock(self, name: str, claim: str, now: datetime | None) -> bool:
        params = (_us(_now(now)), name, claim)
        return await self._write(lambda c: c.execute(GIVE_BACK_LOCK, params).rowcount == 1)

    async def force_release_lock(self, name: str, now: datetime | None, token: int | None = None) -> LockRelease | None:
        at_us = _us(_now(now))

        def release(c: sqlite3.Connection) -> LockRelease | None:
            row = c.execute(GET_LOCK, (name,)).fetchone()
            if row is None:
                return None
            lock = _lock(row)
            if token is None or lock.token == token:
                c.execute(FORCE_RELEASE, (at_us, name))
            return LockRelease(lock, _dt(at_us))

        return await self._write(release)

    async def get_lock(self, name: str) -> Lock | None:
        row = await self._read(lambda c: c.execute(GET_LOCK, (name,)).fetchone())
        return _lock(row) if row else None

    async def list_locks(self, now: datetime | None) -> LocksSnapshot:
        rows = await self._read(lambda c: c.execute(LIST_LOCKS).fetchall())
        return LocksSnapshot(_now(now), [_lock(row) for row in rows])

    async def fence_on(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        return self.fence_on_sync(conn, resource, name, token, now)

    def fence_on_sync(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"a SQLite store fences on a sqlite3 connection to its file, not {type(conn).__name__}")
        at_us = _us(_now(now))
        if conn.execute(FENCE, (resource, token, at_us, name, token, at_us)).fetchone() is not None:
            return None
        seen, current = conn.execute(FENCE_WHY, (resource, name)).fetchone()
        return stale_reason(token, seen, current)
