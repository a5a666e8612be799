"""The locks' SQL for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

Acquire, renew and release are each one conditional statement, on the database's clock
(``statement_timestamp()``) unless a test hands in an injected time. Tokens come from the
sequence ``schedtui_lock_tokens``, drawn by the statement that takes the row: an
``UPDATE`` draws it while holding the row's lock (a concurrent taker waits, re-checks the
row and, having lost, draws nothing that counts), and the first ``INSERT`` of a name draws
the first token it will ever have. Lock rows are never deleted, so a name's tokens only
grow. A failed attempt on a held lock is a pure read: no row lock, no commit to flush.

The store sends a statement again on a fresh connection when its connection breaks with
it in flight (:meth:`~backend.store.postgres.store.PostgresStore._with_conn`), and the
first sending may have committed, its answer lost. Sent again as it is, an acquire found
its own lock held and answered "held by another" (the lock then stayed taken, by nobody
who knew it, for its ttl: a locked schedule skipped its own slots), a release found its
own lock free and said the lease had been lost (work that succeeded was reported
``LeaseLost``), and a forced release freed whoever had taken the lock since. So the
second sending of each asks what the first did (see :meth:`PostgresLocks._again`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.locks.model import Lock, LockRelease, LocksSnapshot
from backend.safetext import store_text
from backend.store import store_unavailable
from backend.store.migrations import Component
from backend.store.sqlite.locks import stale_reason

__all__ = ["PostgresLocks"]

T = TypeVar("T")

LOCKS_V1 = """
    CREATE SEQUENCE schedtui_lock_tokens;
    CREATE TABLE schedtui_locks (
        name        text PRIMARY KEY,
        holder      text,
        token       bigint NOT NULL,
        acquired_at timestamptz NOT NULL,
        renewed_at  timestamptz NOT NULL,
        expires_at  timestamptz NOT NULL
    );
    CREATE TABLE schedtui_lock_fences (
        resource  text PRIMARY KEY,
        token     bigint NOT NULL,
        fenced_at timestamptz NOT NULL
    )
"""
#: The claim an acquire draws, so that one whose answer was lost can give back what it
#: took (and only that: an acquire of an older schedtui, which the addition leaves
#: working, leaves the column as it was, so a give-back is tried only within the lease's
#: ttl, see Locks.maintain).
LOCK_CLAIMS = "ALTER TABLE schedtui_locks ADD COLUMN claim text"
LOCK_COLUMNS = "name, holder, token, acquired_at, renewed_at, expires_at"
#: The lock clock: the injected time when one is given, else the database's.
_NOW = "(SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)"
ACQUIRE = f"""
    WITH t AS {_NOW},
    taken AS (
        UPDATE schedtui_locks l SET holder = %(holder)s, token = nextval('schedtui_lock_tokens'),
            acquired_at = t.now, renewed_at = t.now, expires_at = t.now + %(ttl)s, claim = %(claim)s
        FROM t WHERE l.name = %(name)s AND (l.holder IS NULL OR l.expires_at <= t.now)  -- released, or expired
        RETURNING l.token, l.acquired_at, l.expires_at
    ),
    added AS (
        INSERT INTO schedtui_locks ({LOCK_COLUMNS}, claim)
        SELECT %(name)s, %(holder)s, nextval('schedtui_lock_tokens'), t.now, t.now, t.now + %(ttl)s, %(claim)s FROM t
        WHERE NOT EXISTS (SELECT 1 FROM schedtui_locks WHERE name = %(name)s)
        ON CONFLICT (name) DO NOTHING
        RETURNING token, acquired_at, expires_at
    )
    SELECT * FROM taken UNION ALL SELECT * FROM added
"""
RENEW = f"""
    UPDATE schedtui_locks l SET renewed_at = t.now, expires_at = t.now + %(ttl)s
    FROM {_NOW} t
    WHERE l.name = %(name)s AND l.token = %(token)s AND l.holder IS NOT NULL AND l.expires_at > t.now
    RETURNING l.expires_at
"""
#: A holder's own release commits without waiting for the disk (``synchronous_commit``
#: off for this one transaction): were it lost in a database crash, the lock would only
#: stay taken until its lease expires, which is safe; and the next durable commit on the
#: server flushes it anyway. Taking a lock, renewing it and a forced release stay durable.
#: It clears the claim, which a forced release leaves: a release sent again after its answer
#: was lost tells its own (:data:`RELEASED`) from an operator's.
RELEASE = f"""
    UPDATE schedtui_locks l SET holder = NULL, expires_at = least(l.expires_at, t.now), claim = NULL
    FROM {_NOW} t, (SELECT set_config('synchronous_commit', 'off', true)) AS no_wait
    WHERE l.name = %(name)s AND l.token = %(token)s AND l.holder IS NOT NULL
"""
#: The lease taken with this claim, still held: what an acquire whose answer was lost took.
TAKEN_WITH = """
    SELECT token, acquired_at, expires_at FROM schedtui_locks
    WHERE name = %(name)s AND claim = %(claim)s AND holder IS NOT NULL
"""
#: The lease of this token released by its holder (not by force: that leaves the claim).
RELEASED = "SELECT 1 FROM schedtui_locks WHERE name = %(name)s AND token = %(token)s AND holder IS NULL AND claim IS NULL"
GIVE_BACK = f"""
    UPDATE schedtui_locks l SET holder = NULL, expires_at = least(l.expires_at, t.now)
    FROM {_NOW} t WHERE l.name = %(name)s AND l.claim = %(claim)s AND l.holder IS NOT NULL
"""
LOCK_FOR_RELEASE = f"""
    SELECT {LOCK_COLUMNS}, t.now FROM schedtui_locks, {_NOW} t WHERE name = %(name)s FOR UPDATE OF schedtui_locks
"""
FORCE_RELEASE = f"""
    UPDATE schedtui_locks l SET holder = NULL, expires_at = least(l.expires_at, t.now)
    FROM {_NOW} t WHERE l.name = %(name)s AND l.holder IS NOT NULL
"""
GET_LOCK = f"SELECT {LOCK_COLUMNS} FROM schedtui_locks WHERE name = %s"
LIST_LOCKS = f"SELECT {LOCK_COLUMNS} FROM schedtui_locks ORDER BY name COLLATE \"C\""
LOCK_CLOCK = f"SELECT now FROM {_NOW} t"
#: In the caller's transaction: the lease must be the lock's current one, and no newer
#: token may have been seen for the resource (an equal one is the same holder again). The
#: fence row stays locked until the caller commits, so a newer holder's fence waits for
#: it, and a fence waiting on a newer holder's row finds its token and refuses.
FENCE = f"""
    WITH t AS {_NOW}
    INSERT INTO schedtui_lock_fences AS f (resource, token, fenced_at)
    SELECT %(resource)s, %(token)s, t.now FROM t
    WHERE EXISTS (
        SELECT 1 FROM schedtui_locks l
        WHERE l.name = %(name)s AND l.token = %(token)s AND l.holder IS NOT NULL AND l.expires_at > t.now
    )
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token, fenced_at = excluded.fenced_at
    WHERE f.token <= excluded.token
    RETURNING f.token
"""
FENCE_WHY = """
    SELECT (SELECT token FROM schedtui_lock_fences WHERE resource = %(resource)s),
           (SELECT token FROM schedtui_locks WHERE name = %(name)s)
"""


def _utc(dt: datetime) -> datetime:
    return dt.astimezone(UTC)


def _lock(row: Sequence[Any]) -> Lock:
    return Lock(row[0], row[1], int(row[2]), _utc(row[3]), _utc(row[4]), _utc(row[5]))


class PostgresLocks:
    """Locks on PostgreSQL: see :class:`backend.locks.store.LockStore` for the contract."""

    COMPONENT = Component("locks", (LOCKS_V1,), additions=(LOCK_CLAIMS,))

    if TYPE_CHECKING:
        commits: int
        where: str

        async def _with_conn(self, fn: Callable[[Any], Awaitable[T]], *, wait: float = ...) -> T: ...

        async def _again(self, first: Callable[[Any], Awaitable[T]], again: Callable[[Any], Awaitable[T]]) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

    async def _one(self, sql: str, params: dict[str, Any], *, writes: bool = True) -> tuple[Any, ...] | None:
        async def go(conn: Any) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = await (await conn.execute(sql, params)).fetchone()
            return row

        row = await self._with_conn(go)
        if writes:
            self.commits += 1
        return row

    async def acquire_lock(
        self, name: str, holder: str, ttl: timedelta, now: datetime | None, claim: str | None = None
    ) -> Lock | None:
        params = {"name": name, "holder": store_text(holder), "ttl": ttl, "now": now, "claim": claim}  # (a caller's text)

        async def first(conn: Any) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = await (await conn.execute(ACQUIRE, params)).fetchone()
            return row

        async def again(conn: Any) -> tuple[Any, ...] | None:
            # Found held, it may be this very acquire's: the first sending committed. The
            # claim tells (without one, nothing does: in doubt, as a lost answer is).
            if claim is None:
                raise store_unavailable(self.where, "{store} lost the answer of a lock's acquire, which may have committed")
            row = await first(conn)
            if row is None:
                row = await (await conn.execute(TAKEN_WITH, params)).fetchone()
            return row

        row = await self._again(first, again)
        if row is None:
            return None
        token, acquired_at, expires_at = row
        return Lock(name, holder, int(token), _utc(acquired_at), _utc(acquired_at), _utc(expires_at))

    async def renew_lock(self, name: str, token: int, ttl: timedelta, now: datetime | None) -> datetime | None:
        row = await self._one(RENEW, {"name": name, "token": token, "ttl": ttl, "now": now})
        return _utc(row[0]) if row else None

    async def release_lock(self, name: str, token: int, now: datetime | None) -> bool:
        params = {"name": name, "token": token, "now": now}

        async def first(conn: Any) -> bool:
            return bool((await conn.execute(RELEASE, params)).rowcount == 1)

        async def again(conn: Any) -> bool:
            # Found free, it may be this very release's doing (then the claim is cleared),
            # not an operator's: the lease was not lost.
            return await first(conn) or await (await conn.execute(RELEASED, params)).fetchone() is not None

        return await self._again(first, again)

    async def give_back_lock(self, name: str, claim: str, now: datetime | None) -> bool:
        async def go(conn: Any) -> bool:
            return bool((await conn.execute(GIVE_BACK, {"name": name, "claim": claim, "now": now})).rowcount == 1)

        given_back = await self._with_conn(go)
        self.commits += 1
        return given_back

    async def force_release_lock(self, name: str, now: datetime | None, token: int | None = None) -> LockRelease | None:
        async def release(conn: Any, again: bool) -> LockRelease | None:
            async with conn.transaction():
                row = await (await conn.execute(LOCK_FOR_RELEASE, {"name": name, "now": now})).fetchone()
                if row is None:
                    return None
                lock = _lock(row)
                if again and (token is None or lock.token != token or lock.holder is None):
                    # The first sending may have freed the lock: whoever holds it now may
                    # have taken it since (released again, their lease would be), and one
                    # found free or under another token may be its doing, not a refusal.
                    # Only the lease of the token given, still held, is surely untouched.
                    raise store_unavailable(
                        self.where, "{store} lost the answer of a lock's release, which may have been done all the "
                        "same: look before releasing it again"
                    )  # fmt: skip
                if token is None or lock.token == token:
                    await conn.execute(FORCE_RELEASE, {"name": name, "now": row[6]})
                return LockRelease(lock, _utc(row[6]))

        return await self._again(lambda conn: release(conn, False), lambda conn: release(conn, True))

    async def get_lock(self, name: str) -> Lock | None:
        rows = await self._fetchall(GET_LOCK, (name,))
        return _lock(rows[0]) if rows else None

    async def list_locks(self, now: datetime | None) -> LocksSnapshot:
        async def go(conn: Any) -> LocksSnapshot:
            async with conn.transaction():  # one snapshot: the rows and the clock together
                rows = await (await conn.execute(LIST_LOCKS)).fetchall()
                clock = await (await conn.execute(LOCK_CLOCK, {"now": now})).fetchone()
            return LocksSnapshot(_utc(clock[0]), [_lock(row) for row in rows])

        return await self._with_conn(go)

    async def fence_on(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        params = {"resource": resource, "name": name, "token": token, "now": now}
        if await (await conn.execute(FENCE, params)).fetchone() is not None:
            return None
        seen, current = await (await conn.execute(FENCE_WHY, params)).fetchone()
        return stale_reason(token, seen, current)

    def fence_on_sync(self, conn: Any, resource: str, name: str, token: int, now: datetime | None) -> str | None:
        params = {"resource": resource, "name": name, "token": token, "now": now}
        if conn.execute(FENCE, params).fetchone() is not None:
            return None
        seen, current = conn.execute(FENCE_WHY, params).fetchone()
        return stale_reason(token, seen, current)
