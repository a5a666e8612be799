"""The audit log's SQL for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

One statement per call, on a pooled connection in autocommit mode; entries are read newest
first by id (ids sort by time, hence ``COLLATE "C"``); retention deletes by id range.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from backend.events.audit import AuditEntry, decode_detail, encode_detail
from backend.ids import id_floor
from backend.safetext import store_text as _text
from backend.store.migrations import Component

__all__ = ["APPEND_AUDIT_FROM", "PostgresAudit", "audit_params"]

AUDIT_V1 = """
    CREATE TABLE schedtui_audit (
        id     text COLLATE "C" PRIMARY KEY,
        at     timestamptz NOT NULL,
        actor  text NOT NULL,
        action text NOT NULL,
        target text NOT NULL,
        detail json
    )
"""
AUDIT_COLUMNS = "id, at, actor, action, target, detail::text"
APPEND_AUDIT = """
    INSERT INTO schedtui_audit (id, at, actor, action, target, detail) VALUES (%s, %s, %s, %s, %s, %s::json)
    ON CONFLICT (id) DO NOTHING
"""
#: The entry of an action written by the action's own statement (a CTE of it): one row per
#: row of ``{source}`` (the action's, when it took effect), from six positional parameters
#: (:func:`audit_params`); none when there is no entry (its id NULL).
APPEND_AUDIT_FROM = """
    INSERT INTO schedtui_audit (id, at, actor, action, target, detail)
    SELECT v.id, v.at, v.actor, v.action, v.target, v.detail
    FROM {source}, (VALUES (%s::text, %s::timestamptz, %s::text, %s::text, %s::text, %s::json))
        AS v(id, at, actor, action, target, detail)
    WHERE v.id IS NOT NULL ON CONFLICT (id) DO NOTHING
"""
LIST_AUDIT = f"SELECT {AUDIT_COLUMNS} FROM schedtui_audit ORDER BY id DESC LIMIT %s"
LIST_AUDIT_BEFORE = f"SELECT {AUDIT_COLUMNS} FROM schedtui_audit WHERE id < %s ORDER BY id DESC LIMIT %s"
PRUNE_AUDIT = "DELETE FROM schedtui_audit WHERE id < %s"


def _entry(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(row[0], row[1].astimezone(UTC), row[2], row[3], row[4], decode_detail(row[5]))


def audit_params(entry: AuditEntry | None) -> tuple[Any, ...]:
    """The parameters of :data:`APPEND_AUDIT_FROM` (``None``: no entry)."""
    if entry is None:
        return (None,) * 6
    return entry.id, entry.at, _text(entry.actor), entry.action, _text(entry.target), encode_detail(entry.detail)




class PostgresAudit:
    COMPONENT = Component("audit", (AUDIT_V1,))

    if TYPE_CHECKING:

        async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

    async def append_audit(self, entry: AuditEntry) -> None:
        detail = encode_detail(entry.detail)
        await self._execute(
            APPEND_AUDIT, (entry.id, entry.at, _text(entry.actor), entry.action, _text(entry.target), detail)
        )

    async def list_audit(self, *, limit: int, before: str | None = None) -> list[AuditEntry]:
        if before:
            rows = await self._fetchall(LIST_AUDIT_BEFORE, (before, limit))
        else:
            rows = await self._fetchall(LIST_AUDIT, (limit,))
        return [_entry(row) for row in rows]

    async def prune_audit(self, before: datetime) -> int:
        return await self._execute(PRUNE_AUDIT, (id_floor(before),))
