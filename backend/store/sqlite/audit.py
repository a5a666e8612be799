"""The audit log's SQL for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Entries are written by the store's one writer thread, each in its own transaction, and
read newest first by id (ids sort by time); retention deletes by id range.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.events.audit import AuditEntry, decode_detail, encode_detail
from backend.ids import id_floor
from backend.safetext import store_text
from backend.store.migrations import Component
from backend.store.sqlite.batches import delete_in_batches

__all__ = ["SQLiteAudit", "append_audit_in"]

T = TypeVar("T")

AUDIT_V1 = """
    CREATE TABLE audit (
        id     TEXT PRIMARY KEY,
        at     INTEGER NOT NULL,
        actor  TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT
    ) WITHOUT ROWID
"""
AUDIT_COLUMNS = "id, at, actor, action, target, detail"
APPEND_AUDIT = f"INSERT INTO audit ({AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
LIST_AUDIT = f"SELECT {AUDIT_COLUMNS} FROM audit ORDER BY id DESC LIMIT ?"
LIST_AUDIT_BEFORE = f"SELECT {AUDIT_COLUMNS} FROM audit WHERE id < ? ORDER BY id DESC LIMIT ?"
PRUNE_AUDIT = "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE id < ? ORDER BY id LIMIT ?)"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def append_audit_in(conn: sqlite3.Connection, entry: AuditEntry) -> None:
    """Write the entry in the caller's transaction (an action's own, or one of its own).
    Its actor and target are escaped as the PostgreSQL store escapes them (its detail is
    ASCII JSON already)."""
    params = (entry.id, (entry.at - _EPOCH) // _MICROSECOND, store_text(entry.actor), entry.action,
              store_text(entry.target), encode_detail(entry.detail))  # fmt: skip
    conn.execute(APPEND_AUDIT, params)


def _entry(row: tuple[Any, ...]) -> AuditEntry:
    return AuditEntry(row[0], _EPOCH + _MICROSECOND * row[1], row[2], row[3], row[4], decode_detail(row[5]))


class SQLiteAudit:
    COMPONENT = Component("audit", (AUDIT_V1,))

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def append_audit(self, entry: AuditEntry) -> None:
        await self._write(lambda c: append_audit_in(c, entry))

    async def list_audit(self, *, limit: int, before: str | None = None) -> list[AuditEntry]:
        if before:
            rows = await self._read(lambda c: c.execute(LIST_AUDIT_BEFORE, (before, limit)).fetchall())
        else:
            rows = await self._read(lambda c: c.execute(LIST_AUDIT, (limit,)).fetchall())
        return [_entry(row) for row in rows]

    async def prune_audit(self, before: datetime) -> int:
        floor = id_floor(before)
        return await delete_in_batches(self._write, lambda c, n: int(c.execute(PRUNE_AUDIT, (floor, n)).rowcount))
