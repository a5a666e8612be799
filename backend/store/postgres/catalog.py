"""The stored schedules' SQL for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

As on SQLite, every change bumps the one-row catalog counter in its transaction; instances
compare it on their state poll, and are woken sooner by the ``schedules`` change signal
that the engine's relay NOTIFYs to them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from backend.safetext import escape_text, load_json, store_text
from backend.scheduler.stored import CodeTiming, StoredSchedule
from backend.store.migrations import Component

__all__ = ["PostgresCatalog"]

T = TypeVar("T")

CATALOG_V1 = """
    CREATE TABLE schedtui_stored_schedules (
        name        text PRIMARY KEY,
        cron        text NOT NULL,
        timezone    text NOT NULL,
        queue       text,
        durable     text,
        payload     text NOT NULL,
        description text,
        enabled     boolean NOT NULL,
        on_overlap  text NOT NULL,
        backfill    text NOT NULL,
        max_runtime double precision NOT NULL,
        created_at  timestamptz NOT NULL,
        created_by  text NOT NULL,
        updated_at  timestamptz NOT NULL,
        updated_by  text NOT NULL,
        version     bigint NOT NULL
    );
    CREATE TABLE schedtui_schedule_catalog (id integer PRIMARY KEY CHECK (id = 1), version bigint NOT NULL);
    INSERT INTO schedtui_schedule_catalog (id, version) VALUES (1, 0)
"""
#: A stored schedule's alert= option (JSON; NULL: the defaults).
CATALOG_V2 = "ALTER TABLE schedtui_stored_schedules ADD COLUMN alert text"
#: When its cron or zone last changed (NULL: not since its creation). Older releases
#: neither read nor write it.
TIMING_CHANGED = "ALTER TABLE schedtui_stored_schedules ADD COLUMN timing_changed_at timestamptz"
#: The timing each schedule defined in code last ran by, and when it last changed (NULL:
#: not since first recorded): the store's only memory of a changed deploy.
CODE_TIMINGS = """
    CREATE TABLE schedtui_code_schedule_timings (
        name text PRIMARY KEY, cron text NOT NULL, timezone text NOT NULL, changed_at timestamptz
    )
"""
#: Which instance last started with each recorded timing (NULL: a release that did not
#: say). Older releases neither read nor write it.
TIMING_RECORDER = "ALTER TABLE schedtui_code_schedule_timings ADD COLUMN instance text"
#: A digest of the zone's rules as the recording instance's time zone database has them
#: (see CodeTiming.rules; NULL: not said). Older releases neither read nor write it.
TIMING_RULES = "ALTER TABLE schedtui_code_schedule_timings ADD COLUMN zone_rules text"
#: One statement: the rows as they were (the CTE's snapshot) for the rows kept, the rows
#: written for the others: each with the recording instance, its change time moved to now
#: where the timing changed. An instance that changes a row another changed the same way a
#: moment before keeps its change time, and becomes its instance.
RECORD_TIMINGS = """
    WITH given AS (
        SELECT * FROM unnest(%(names)s::text[], %(crons)s::text[], %(zones)s::text[], %(rules)s::text[])
            AS g(name, cron, timezone, zone_rules)
    ),
    put AS (
        INSERT INTO schedtui_code_schedule_timings AS t (name, cron, timezone, changed_at, instance, zone_rules)
        SELECT name, cron, timezone, NULL, %(instance)s, zone_rules FROM given
        ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, timezone = excluded.timezone,
            instance = excluded.instance, zone_rules = coalesce(excluded.zone_rules, t.zone_rules),
            changed_at = CASE WHEN (t.cron, t.timezone) IS DISTINCT FROM (excluded.cron, excluded.timezone)
                OR t.zone_rules <> excluded.zone_rules THEN %(now)s ELSE t.changed_at END
        WHERE (t.cron, t.timezone, t.instance) IS DISTINCT FROM (excluded.cron, excluded.timezone, excluded.instance)
            OR t.zone_rules IS DISTINCT FROM coalesce(excluded.zone_rules, t.zone_rules)
        RETURNING t.name, t.changed_at
    )
    SELECT name, changed_at FROM put WHERE changed_at IS NOT NULL
    UNION ALL
    SELECT t.name, t.changed_at FROM schedtui_code_schedule_timings t JOIN given USING (name)
    WHERE t.changed_at IS NOT NULL AND t.name NOT IN (SELECT name FROM put)
"""
CODE_TIMINGS_READ = "SELECT name, cron, timezone, instance, zone_rules FROM schedtui_code_schedule_timings"
COLUMNS = (
    "name, cron, timezone, queue, durable, payload, description, enabled, on_overlap, backfill, "
    "max_runtime, alert, created_at, created_by, updated_at, updated_by, version, timing_changed_at"
)
CATALOG_VERSION = "SELECT version FROM schedtui_schedule_catalog WHERE id = 1"
BUMP = "UPDATE schedtui_schedule_catalog SET version = version + 1 WHERE id = 1"
LIST = f"SELECT {COLUMNS} FROM schedtui_stored_schedules ORDER BY name"
INSERT = f"""
    INSERT INTO schedtui_stored_schedules ({COLUMNS}) VALUES ({', '.join(['%s'] * 18)})
    ON CONFLICT (name) DO NOTHING
"""
UPDATE = f"""
    UPDATE schedtui_stored_schedules SET cron = %s, timezone = %s, queue = %s, durable = %s, payload = %s,
        description = %s, enabled = %s, on_overlap = %s, backfill = %s, max_runtime = %s, alert = %s, updated_at = %s,
        updated_by = %s, timing_changed_at = %s, version = version + 1
    WHERE name = %s AND version = %s
    RETURNING {COLUMNS}
"""
DELETE = "DELETE FROM schedtui_stored_schedules WHERE name = %s"
#: The row a create made, as it made it (a create sent again after its answer was lost).
CREATED = """
    SELECT 1 FROM schedtui_stored_schedules
    WHERE name = %s AND version = 1 AND created_at = %s AND created_by = %s AND updated_at = %s
"""
#: The row an update made from ``version`` (an update sent again after its answer was lost).
UPDATED = f"""
    SELECT {COLUMNS} FROM schedtui_stored_schedules
    WHERE name = %s AND version = %s + 1 AND updated_at = %s AND updated_by = %s
"""

DELETE_STATE = "DELETE FROM schedtui_schedule_state WHERE name = %s"


def _utc(dt: datetime) -> datetime:
    return dt.astimezone(UTC)


def _row(row: tuple[Any, ...]) -> StoredSchedule:
    return StoredSchedule(
        name=row[0],
        cron=row[1],
        timezone=row[2],
        queue=row[3],
        durable=row[4],
        payload=load_json(row[5]),  # as every stored text: escaped where it is not text
        description=None if row[6] is None else escape_text(row[6]),
        enabled=bool(row[7]),
        on_overlap=row[8],
        backfill=row[9],
        max_runtime=float(row[10]),
        alert=None if row[11] is None else json.loads(row[11]),
        created_at=_utc(row[12]),
        created_by=row[13],
        updated_at=_utc(row[14]),
        updated_by=row[15],
        version=int(row[16]),
        timing_changed_at=None if row[17] is None else _utc(row[17]),
    )


def _definition(s: StoredSchedule) -> tuple[Any, ...]:
    return (s.cron, s.timezone, s.queue, s.durable, json.dumps(s.payload), store_text(s.description), s.enabled,
            s.on_overlap, s.backfill, s.max_runtime, None if s.alert is None else json.dumps(s.alert))


class PostgresCatalog:
    """Stored schedules on PostgreSQL: see :class:`backend.scheduler.catalog.CatalogStore` for the contract."""

    COMPONENT = Component("catalog", (CATALOG_V1, CATALOG_V2), additions=(TIMING_CHANGED, CODE_TIMINGS, TIMING_RECORDER, TIMING_RULES))

    if TYPE_CHECKING:
        commits: int

        async def _with_conn(self, fn: Callable[[Any], Awaitable[T]], *, wait: float = ...) -> T: ...

    async def catalog_version(self) -> int:
        async def go(conn: Any) -> int:
            row = await (await conn.execute(CATALOG_VERSION)).fetchone()
            return int(row[0]) if row else 0

        return await self._with_conn(go)

    async def stored_schedules(self) -> tuple[int, list[StoredSchedule]]:
        async def go(conn: Any) -> tuple[int, list[StoredSchedule]]:
            # REPEATABLE READ: the version and the rows are of one instant.
            async with conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                version = await (await conn.execute(CATALOG_VERSION)).fetchone()
                rows = await (await conn.execute(LIST)).fetchall()
            return (int(version[0]) if version else 0), [_row(r) for r in rows]

        return await self._with_conn(go)

    async def _change(self, fn: Callable[[Any], Awaitable[T]], again: Callable[[Any], Awaitable[T]] | None = None) -> T:
        """``fn`` in a transaction; ``again`` in its place when the store sends it a second
        time (its connection broke with it in flight: the first sending may have committed,
        its answer lost). Sent again as they were, a create answered "exists already", an
        update "changed by someone else" (and was applied once more, over itself) and a
        delete "no schedule": each looks for its own doing first."""
        runs = 0

        async def go(conn: Any) -> T:
            nonlocal runs
            runs += 1
            async with conn.transaction():
                return await (fn if runs == 1 or again is None else again)(conn)

        result = await self._with_conn(go)
        self.commits += 1
        return result

    async def create_stored_schedule(self, schedule: StoredSchedule) -> bool:
        s = schedule
        params = (s.name, *_definition(s), s.created_at, store_text(s.created_by), s.updated_at, store_text(s.updated_by),
                  s.version, s.timing_changed_at)  # fmt: skip

        async def create(conn: Any) -> bool:
            if (await conn.execute(INSERT, params)).rowcount != 1:
                return False
            await conn.execute(DELETE_STATE, (s.name,))  # a stale state of an older namesake
            await conn.execute(BUMP)
            return True

        async def again(conn: Any) -> bool:
            made = (s.name, s.created_at, store_text(s.created_by), s.updated_at)
            return await create(conn) or await (await conn.execute(CREATED, made)).fetchone() is not None

        return await self._change(create, again)

    async def update_stored_schedule(self, schedule: StoredSchedule, version: int) -> StoredSchedule | None:
        s = schedule
        params = (*_definition(s), s.updated_at, store_text(s.updated_by), s.timing_changed_at, s.name, version)

        async def update(conn: Any) -> StoredSchedule | None:
            row = await (await conn.execute(UPDATE, params)).fetchone()
            if row is None:
                return None
            await conn.execute(BUMP)
            return _row(row)

        async def again(conn: Any) -> StoredSchedule | None:
            row = await (await conn.execute(UPDATED, (s.name, version, s.updated_at, store_text(s.updated_by)))).fetchone()
            return _row(row) if row is not None else await update(conn)

        return await self._change(update, again)

    async def delete_stored_schedule(self, name: str) -> bool:
        async def delete(conn: Any) -> bool:
            if (await conn.execute(DELETE, (name,))).rowcount != 1:
                return False
            await conn.execute(DELETE_STATE, (name,))
            await conn.execute(BUMP)
            return True

        async def again(conn: Any) -> bool:
            # Found gone, it is this delete's doing most likely (the operator's read found it
            # a moment before): deleted, as asked, rather than "no schedule".
            await delete(conn)
            return True

        return await self._change(delete, again)

    async def record_code_timings(
        self,
        timings: list[tuple[str, str, str]],
        now: datetime,
        *,
        instance: str | None = None,
        rules: Mapping[str, str] | None = None,
    ) -> dict[str, datetime]:
        if not timings:
            return {}
        names, crons, zones = (list(column) for column in zip(*timings, strict=True))
        digests = [(rules or {}).get(name) for name in names]
        params = {"names": names, "crons": crons, "zones": zones, "rules": digests, "now": now, "instance": instance}

        async def record(conn: Any) -> dict[str, datetime]:
            rows = await (await conn.execute(RECORD_TIMINGS, params)).fetchall()
            return {name: _utc(changed) for name, changed in rows}

        return await self._change(record)

    async def code_timings(self) -> dict[str, CodeTiming]:
        async def read(conn: Any) -> dict[str, CodeTiming]:
            rows = await (await conn.execute(CODE_TIMINGS_READ)).fetchall()
            return {name: CodeTiming(cron, zone, instance, digest) for name, cron, zone, instance, digest in rows}

        return await self._with_conn(read)
