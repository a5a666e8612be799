"""The stored schedules' SQL for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Every change bumps the one-row ``schedule_catalog`` counter in the same transaction, so an
instance polling that counter (one tiny read) knows when to re-read the rows. Deleting a
schedule deletes its enabled/disabled state too: a later schedule of the same name starts
from its own definition.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.safetext import escape_text, load_json, store_text
from backend.scheduler.stored import CodeTiming, StoredSchedule
from backend.store.migrations import Component

__all__ = ["SQLiteCatalog"]

T = TypeVar("T")

CATALOG_V1 = """
    CREATE TABLE stored_schedules (
        name        TEXT PRIMARY KEY,
        cron        TEXT NOT NULL,
        timezone    TEXT NOT NULL,
        queue       TEXT,
        durable     TEXT,
        payload     TEXT NOT NULL,
        description TEXT,
        enabled     INTEGER NOT NULL,
        on_overlap  TEXT NOT NULL,
        backfill    TEXT NOT NULL,
        max_runtime REAL NOT NULL,
        created_at  INTEGER NOT NULL,
        created_by  TEXT NOT NULL,
        updated_at  INTEGER NOT NULL,
        updated_by  TEXT NOT NULL,
        version     INTEGER NOT NULL
    );
    CREATE TABLE schedule_catalog (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
    INSERT INTO schedule_catalog (id, version) VALUES (1, 0)
"""
#: A stored schedule's alert= option (JSON; NULL: the defaults).
CATALOG_V2 = "ALTER TABLE stored_schedules ADD COLUMN alert TEXT"
#: When its cron or zone last changed (microseconds; NULL: not since its creation). Older
#: releases neither read nor write it.
TIMING_CHANGED = "ALTER TABLE stored_schedules ADD COLUMN timing_changed_at INTEGER"
#: The timing each schedule defined in code last ran by, and when it last changed (NULL:
#: not since first recorded): the store's only memory of a changed deploy.
CODE_TIMINGS = """
    CREATE TABLE code_schedule_timings (name TEXT PRIMARY KEY, cron TEXT NOT NULL, timezone TEXT NOT NULL, changed_at INTEGER)
"""
#: Which instance last started with each recorded timing (NULL: a release that did not
#: say). Older releases neither read nor write it.
TIMING_RECORDER = "ALTER TABLE code_schedule_timings ADD COLUMN instance TEXT"
#: A digest of the zone's rules as the recording instance's time zone database has them
#: (see CodeTiming.rules; NULL: not said). Older releases neither read nor write it.
TIMING_RULES = "ALTER TABLE code_schedule_timings ADD COLUMN zone_rules TEXT"
GET_TIMING = "SELECT cron, timezone, changed_at, instance, zone_rules FROM code_schedule_timings WHERE name = ?"
PUT_TIMING = """
    INSERT INTO code_schedule_timings (name, cron, timezone, changed_at, instance, zone_rules) VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, timezone = excluded.timezone, changed_at = excluded.changed_at,
        instance = excluded.instance, zone_rules = excluded.zone_rules
"""
CODE_TIMINGS_READ = "SELECT name, cron, timezone, instance, zone_rules FROM code_schedule_timings"
COLUMNS = (
    "name, cron, timezone, queue, durable, payload, description, enabled, on_overlap, backfill, "
    "max_runtime, alert, created_at, created_by, updated_at, updated_by, version, timing_changed_at"
)
CATALOG_VERSION = "SELECT version FROM schedule_catalog WHERE id = 1"
BUMP = "UPDATE schedule_catalog SET version = version + 1 WHERE id = 1"
LIST = f"SELECT {COLUMNS} FROM stored_schedules ORDER BY name"
GET = f"SELECT {COLUMNS} FROM stored_schedules WHERE name = ?"
INSERT = f"INSERT INTO stored_schedules ({COLUMNS}) VALUES ({', '.join('?' * 18)}) ON CONFLICT (name) DO NOTHING"
UPDATE = """
    UPDATE stored_schedules SET cron = ?, timezone = ?, queue = ?, durable = ?, payload = ?, description = ?,
        enabled = ?, on_overlap = ?, backfill = ?, max_runtime = ?, alert = ?, updated_at = ?, updated_by = ?,
        timing_changed_at = ?, version = version + 1
    WHERE name = ? AND version = ?
"""
DELETE = "DELETE FROM stored_schedules WHERE name = ?"
DELETE_STATE = "DELETE FROM schedule_state WHERE name = ?"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _us(dt: datetime) -> int:
    return (dt - _EPOCH) // _MICROSECOND


def _timing_changed(s: StoredSchedule) -> int | None:
    return None if s.timing_changed_at is None else _us(s.timing_changed_at)


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
        created_at=_EPOCH + _MICROSECOND * row[12],
        created_by=row[13],
        updated_at=_EPOCH + _MICROSECOND * row[14],
        updated_by=row[15],
        version=int(row[16]),
        timing_changed_at=None if row[17] is None else _EPOCH + _MICROSECOND * row[17],
    )


def _definition(s: StoredSchedule) -> tuple[Any, ...]:
    return (s.cron, s.timezone, s.queue, s.durable, json.dumps(s.payload), store_text(s.description), int(s.enabled),
            s.on_overlap, s.backfill, s.max_runtime, None if s.alert is None else json.dumps(s.alert))


class SQLiteCatalog:
    """Stored schedules on SQLite: see :class:`backend.scheduler.catalog.CatalogStore` for the contract."""

    COMPONENT = Component("catalog", (CATALOG_V1, CATALOG_V2), additions=(TIMING_CHANGED, CODE_TIMINGS, TIMING_RECORDER, TIMING_RULES))

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def catalog_version(self) -> int:
        row = await self._read(lambda c: c.execute(CATALOG_VERSION).fetchone())
        return int(row[0]) if row else 0

    async def stored_schedules(self) -> tuple[int, list[StoredSchedule]]:
        def read(c: sqlite3.Connection) -> tuple[int, list[StoredSchedule]]:
            # One read transaction: the version matches the rows.
            c.execute("BEGIN")
            try:
                version = c.execute(CATALOG_VERSION).fetchone()
                rows = c.execute(LIST).fetchall()
            finally:
                c.execute("COMMIT")
            return (int(version[0]) if version else 0), [_row(r) for r in rows]

        return await self._read(read)

    async def create_stored_schedule(self, schedule: StoredSchedule) -> bool:
        s = schedule
        params = (s.name, *_definition(s), _us(s.created_at), store_text(s.created_by), _us(s.updated_at),
                  store_text(s.updated_by), s.version, _timing_changed(s))  # fmt: skip

        def create(c: sqlite3.Connection) -> bool:
            if c.execute(INSERT, params).rowcount != 1:
                return False
            c.execute(DELETE_STATE, (s.name,))  # a stale state of an older namesake
            c.execute(BUMP)
            return True

        return await self._write(create)

    async def update_stored_schedule(self, schedule: StoredSchedule, version: int) -> StoredSchedule | None:
        s = schedule
        params = (*_definition(s), _us(s.updated_at), store_text(s.updated_by), _timing_changed(s), s.name, version)

        def update(c: sqlite3.Connection) -> StoredSchedule | None:
            if c.execute(UPDATE, params).rowcount != 1:
                return None
            c.execute(BUMP)
            row = c.execute(GET, (s.name,)).fetchone()
            return _row(row) if row else None

        return await self._write(update)

    async def delete_stored_schedule(self, name: str) -> bool:
        def delete(c: sqlite3.Connection) -> bool:
            if c.execute(DELETE, (name,)).rowcount != 1:
                return False
            c.execute(DELETE_STATE, (name,))
            c.execute(BUMP)
            return True

        return await self._write(delete)

    async def record_code_timings(
        self,
        timings: list[tuple[str, str, str]],
        now: datetime,
        *,
        instance: str | None = None,
        rules: Mapping[str, str] | None = None,
    ) -> dict[str, datetime]:
        def record(c: sqlite3.Connection) -> dict[str, datetime]:
            changed: dict[str, datetime] = {}
            for name, cron, zone in timings:
                digest = (rules or {}).get(name)
                row = c.execute(GET_TIMING, (name,)).fetchone()
                if row is None:
                    c.execute(PUT_TIMING, (name, cron, zone, None, instance, digest))
                    continue
                kept = digest if digest is not None else row[4]
                if (row[0], row[1]) != (cron, zone) or (None not in (row[4], digest) and row[4] != digest):
                    c.execute(PUT_TIMING, (name, cron, zone, _us(now), instance, kept))
                    changed[name] = now
                    continue
                if (row[3], row[4]) != (instance, kept):
                    c.execute(PUT_TIMING, (name, cron, zone, row[2], instance, kept))
                if row[2] is not None:
                    changed[name] = _EPOCH + _MICROSECOND * row[2]
            return changed

        return await self._write(record) if timings else {}

    async def code_timings(self) -> dict[str, CodeTiming]:
        rows = await self._read(lambda c: c.execute(CODE_TIMINGS_READ).fetchall())
        return {name: CodeTiming(cron, zone, instance, digest) for name, cron, zone, instance, digest in rows}
