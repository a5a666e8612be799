"""The ``cluster`` coordination's SQL for the PostgreSQL store (a mixin of
:class:`~backend.store.postgres.store.PostgresStore`).

Shards are locks of the lock table (``cluster:shard:NN``), taken, renewed and released in
batches; every batch takes its row locks in name order, so concurrent batches never
deadlock, and a take skips rows another instance is taking right now (``SKIP LOCKED``).
:data:`CLUSTER_CLAIM` is how an owner fires: the run rows of a burst are inserted only
for shards whose token is still current, holding their lock rows (``FOR SHARE``) until
the rows are committed, so a take-over waits for them, or they wait for the take-over
and find their token stale. No claims table is written in this mode.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.locks.model import Lock
from backend.model import Claim, ClaimResult
from backend.store import Beat
from backend.store.postgres.locks import _NOW
from backend.store.postgres.sql import BUSY_ELSEWHERE

__all__ = ["ClusterState", "PostgresCluster"]

T = TypeVar("T")

#: Takes the free or expired shards among ``names`` under a claim drawn for the call, and
#: answers them with those the same call's sending before this one took (``before``): the
#: store sends a statement again on a fresh connection when its connection broke with it in
#: flight, and the first sending may have committed, its answer lost. Sent again as it
#: was, it found those shards held and took nothing; the member then held them without
#: knowing it, unrenewed and unfired, until their lease ran out (its member lock too: out
#: of the fleet for a lease). ``before`` reads the statement's snapshot, which has only
#: what committed before it; a shard it takes now was expired there, so none is answered
#: twice.
ACQUIRE_SHARDS = f"""
    WITH t AS {_NOW},
    free AS (
        SELECT l.name FROM schedtui_locks l, t
        WHERE l.name = ANY(%(names)s::text[]) AND l.expires_at <= t.now
        ORDER BY l.name FOR UPDATE OF l SKIP LOCKED
    ),
    taken AS (
        UPDATE schedtui_locks l SET holder = %(holder)s, token = nextval('schedtui_lock_tokens'),
            acquired_at = t.now, renewed_at = t.now, expires_at = t.now + %(ttl)s, claim = %(claim)s
        FROM t, free f WHERE l.name = f.name
        RETURNING l.name, l.token, l.expires_at
    ),
    added AS (
        INSERT INTO schedtui_locks (name, holder, token, acquired_at, renewed_at, expires_at, claim)
        SELECT n.name, %(holder)s, nextval('schedtui_lock_tokens'), t.now, t.now, t.now + %(ttl)s, %(claim)s
        FROM t, unnest(%(names)s::text[]) AS n(name)
        WHERE NOT EXISTS (SELECT 1 FROM schedtui_locks l WHERE l.name = n.name)
        ORDER BY n.name
        ON CONFLICT (name) DO NOTHING
        RETURNING name, token, expires_at
    ),
    before AS (
        SELECT l.name, l.token, l.expires_at FROM schedtui_locks l, t
        WHERE l.name = ANY(%(names)s::text[]) AND l.claim = %(claim)s AND l.holder = %(holder)s
            AND l.expires_at > t.now
    )
    SELECT * FROM taken UNION ALL SELECT * FROM added UNION ALL SELECT * FROM before
"""
RENEW_SHARDS = f"""
    WITH t AS {_NOW},
    mine AS (
        SELECT l.name FROM schedtui_locks l, t, unnest(%(names)s::text[], %(tokens)s::bigint[]) AS h(name, token)
        WHERE l.name = h.name AND l.token = h.token AND l.holder IS NOT NULL AND l.expires_at > t.now
        ORDER BY l.name FOR UPDATE OF l
    )
    UPDATE schedtui_locks l SET renewed_at = t.now, expires_at = t.now + %(ttl)s
    FROM t, mine m WHERE l.name = m.name
    RETURNING l.name, l.expires_at
"""
#: Giving shards back commits without waiting for the disk: lost in a crash, a shard
#: would only stay taken until its lease expires.
RELEASE_SHARDS = f"""
    WITH t AS {_NOW},
    mine AS (
        SELECT l.name FROM schedtui_locks l, unnest(%(names)s::text[], %(tokens)s::bigint[]) AS h(name, token)
        WHERE l.name = h.name AND l.token = h.token AND l.holder IS NOT NULL
        ORDER BY l.name FOR UPDATE OF l
    )
    UPDATE schedtui_locks l SET holder = NULL, expires_at = least(l.expires_at, t.now)
    FROM t, mine m, (SELECT set_config('synchronous_commit', 'off', true)) AS no_wait
    WHERE l.name = m.name
"""
#: Shards a previous process of the same instance name left behind (it died holding them).
RELEASE_LEFTOVERS = f"""
    WITH t AS {_NOW},
    left_over AS (
        SELECT l.name FROM schedtui_locks l
        WHERE l.name LIKE %(prefix)s AND l.holder = %(holder)s AND l.token <> ALL(%(tokens)s::bigint[])
        ORDER BY l.name FOR UPDATE OF l
    )
    UPDATE schedtui_locks l SET holder = NULL, expires_at = least(l.expires_at, t.now)
    FROM t, left_over o WHERE l.name = o.name
"""
#: The cluster's lock rows (shards and members), every registered instance and the lock
#: clock, in one round trip.
CLUSTER_STATE = f"""
    SELECT 'lock', l.name, l.holder, l.token, l.acquired_at, l.renewed_at, l.expires_at, NULL::int,
        NULL::double precision
    FROM schedtui_locks l WHERE l.name LIKE %(prefix)s
    UNION ALL
    SELECT 'instance', i.instance, i.host, NULL, NULL, NULL, i.heartbeat_at, i.pid, i.abandon_after
    FROM schedtui_instances i
    UNION ALL
    SELECT 'now', NULL, NULL, NULL, NULL, NULL, t.now, NULL, NULL FROM {_NOW} t
"""
#: A burst of an owner's due slots, in one statement: a run row (``running``, no
#: ``fired_at`` yet) for each slot whose shard token is current and that has no run yet;
#: the run ids won (new rows, or rows of an earlier attempt whose answer was lost; no join
#: back to the claims, which the planner would make quadratic), the
#: shards whose token is no longer current, and per schedule won a run in flight on
#: another instance (a previous owner's), as the claims table's statement reports it.
CLUSTER_CLAIM = f"""
    WITH t AS {_NOW},
    wanted AS (
        SELECT * FROM json_to_recordset(%(claims)s::json) AS w(
            key text, name text, run_id text, slot timestamptz, trigger text, outcome text, lock text, token bigint)
    ),
    fenced AS (
        SELECT l.name, l.token FROM schedtui_locks l, t
        WHERE l.name IN (SELECT lock FROM wanted) AND l.holder IS NOT NULL AND l.expires_at > t.now
        ORDER BY l.name FOR SHARE OF l
    ),
    current AS (
        SELECT w.* FROM wanted w JOIN fenced f ON f.name = w.lock AND f.token = w.token
    ),
    inserted AS (
        INSERT INTO schedtui_runs (id, name, scheduled_at, status, trigger, outcome, instance)
        SELECT c.run_id, c.name, c.slot, 'running', c.trigger, c.outcome, %(instance)s FROM current c
        WHERE (
            SELECT 1 FROM schedtui_runs r
            WHERE r.name = c.name AND r.scheduled_at = c.slot AND r.trigger <> 'manual' LIMIT 1
        ) IS NULL
        ON CONFLICT (id) DO NOTHING
        RETURNING id, name, scheduled_at
    ),
    mine AS (
        SELECT c.run_id AS id, c.name, c.slot AS scheduled_at FROM current c
        WHERE (SELECT r.instance FROM schedtui_runs r WHERE r.id = c.run_id) = %(instance)s
    ),
    won AS (
        SELECT id, name, scheduled_at FROM inserted UNION ALL SELECT id, name, scheduled_at FROM mine
    )
    SELECT 'won', id FROM won
    UNION ALL
    SELECT DISTINCT 'stale', w.lock FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM fenced f WHERE f.name = w.lock AND f.token = w.token)
    UNION ALL
    SELECT 'busy:' || f.name, b.id
    FROM (SELECT name, min(scheduled_at) AS first FROM won GROUP BY name) f
    CROSS JOIN LATERAL ({BUSY_ELSEWHERE}) b
"""


def _utc(dt: datetime) -> datetime:
    return dt.astimezone(UTC)


class ClusterState:
    """One read of the cluster: its lock rows by name (shards and member locks), every
    registered instance (``{name: Beat}``) and the lock clock's now."""

    __slots__ = ("instances", "locks", "now")

    def __init__(self, locks: dict[str, Lock], instances: dict[str, Beat], now: datetime) -> None:
        self.locks = locks
        self.instances = instances
        self.now = now


class PostgresCluster:
    """The shards of ``cluster`` coordination; see :mod:`backend.scheduler.coordination.cluster` for the contract."""

    if TYPE_CHECKING:
        commits: int

        async def _with_conn(self, fn: Callable[[Any], Awaitable[T]], *, wait: float = ...) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

    async def _rows(self, sql: str, params: dict[str, Any], *, writes: bool) -> list[tuple[Any, ...]]:
        rows = await self._fetchall(sql, params)
        if writes:
            self.commits += 1
        return rows

    async def acquire_shards(
        self, names: Sequence[str], holder: str, ttl: timedelta, now: datetime | None
    ) -> dict[str, tuple[int, datetime]]:
        """Take the shards among ``names`` that are free or expired: ``{name: (token, expires_at)}``
        (and those a sending of it whose answer was lost took: see ACQUIRE_SHARDS)."""
        params = {"names": list(names), "holder": holder, "ttl": ttl, "now": now, "claim": secrets.token_hex(12)}
        rows = await self._rows(ACQUIRE_SHARDS, params, writes=True)
        return {name: (int(token), _utc(expires)) for name, token, expires in rows}

    async def release_shards(self, held: dict[str, int], now: datetime | None) -> None:
        params = {"names": list(held), "tokens": list(held.values()), "now": now}
        await self._rows_none(RELEASE_SHARDS, params)

    async def release_leftover_shards(self, prefix: str, holder: str, keep: Sequence[int], now: datetime | None) -> None:
        params = {"prefix": prefix + "%", "holder": holder, "tokens": list(keep), "now": now}
        await self._rows_none(RELEASE_LEFTOVERS, params)

    async def _rows_none(self, sql: str, params: dict[str, Any]) -> None:
        async def go(conn: Any) -> None:
            await conn.execute(sql, params)

        await self._with_conn(go)
        self.commits += 1

    async def cluster_state(self, prefix: str, now: datetime | None) -> ClusterState:
        return _state(await self._fetchall(CLUSTER_STATE, {"prefix": prefix + "%", "now": now}))

    async def renew_and_read(
        self, held: dict[str, int], ttl: timedelta, prefix: str, now: datetime | None
    ) -> tuple[dict[str, datetime], ClusterState]:
        """:meth:`renew_shards` (when ``held`` is not empty), then :meth:`cluster_state`, in
        one transaction: a member's round costs the database one commit."""

        async def go(conn: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            async with conn.transaction():
                renewed: list[tuple[Any, ...]] = []
                if held:
                    params = {"names": list(held), "tokens": list(held.values()), "ttl": ttl, "now": now}
                    renewed = await (await conn.execute(RENEW_SHARDS, params)).fetchall()
                state = await (await conn.execute(CLUSTER_STATE, {"prefix": prefix + "%", "now": now})).fetchall()
            return renewed, state

        renewed, state = await self._with_conn(go)
        if held:
            self.commits += 1
        return {name: _utc(expires) for name, expires in renewed}, _state(state)

    async def cluster_claim(
        self, claims: Sequence[Claim], fences: dict[str, tuple[str, int]], instance: str, now: datetime | None
    ) -> tuple[ClaimResult, set[str]]:
        """Insert the run rows of ``claims`` whose shard token (``fences``: schedule name ->
        (shard lock, token)) is current; the result, and the shard locks found stale."""
        doc = json.dumps(
            [
                {
                    "key": c.key,
                    "name": c.name,
                    "run_id": c.run_id,
                    "slot": c.scheduled_at.isoformat() if c.scheduled_at else None,
                    "trigger": c.trigger,
                    "outcome": c.outcome,
                    "lock": fences[c.name][0],
                    "token": fences[c.name][1],
                }
                for c in claims
            ],
            separators=(",", ":"),
        )
        rows = await self._rows(CLUSTER_CLAIM, {"claims": doc, "instance": instance, "now": now}, writes=True)
        keys = {c.run_id: c.key for c in claims}
        won = frozenset(keys[value] for kind, value in rows if kind == "won")
        stale = {value for kind, value in rows if kind == "stale"}
        busy = {kind[len("busy:") :]: value for kind, value in rows if kind.startswith("busy:")}
        return ClaimResult(won, busy), stale


def _state(rows: list[tuple[Any, ...]]) -> ClusterState:
    locks: dict[str, Lock] = {}
    instances: dict[str, Beat] = {}
    clock: datetime | None = None
    for kind, name, holder, token, acquired, renewed, at, pid, window in rows:
        if kind == "lock":
            locks[name] = Lock(name, holder, int(token), _utc(acquired), _utc(renewed), _utc(at))
        elif kind == "instance":
            instances[name] = Beat(holder, int(pid), _utc(at), window)
        else:
            clock = _utc(at)
    assert clock is not None
    return ClusterState(locks, instances, clock)
