"""Schema migrations per component, for both stores.

The run ledger's tables (the "core") keep their own version table, as since the first
release. Every other system (the job queue, durable functions, locks, the catalog of
stored schedules and the audit log) is a *component* with its own migrations and its own
version, so the systems evolve independently: a store mixin declares
``COMPONENT = Component("jobs", (script_v1, script_v2, …))`` and the store applies, at
open, what each component lacks, in one transaction per component (PostgreSQL: under the
migration advisory lock, so instances starting together migrate one after the other).
A store whose component is newer than this code is refused, naming the component.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from backend.errors import Unavailable

__all__ = ["Component", "components_of", "migrate_postgres", "migrate_sqlite"]

log = logging.getLogger("schedtui.store")


@dataclass(frozen=True)
class Component:
    """One system's tables: a name, and its migration scripts, oldest first (statements
    separated by ``;``). Append a script to change the schema; never edit a released one."""

    name: str
    migrations: tuple[str, ...]


def components_of(cls: type) -> list[Component]:
    """The components a store class carries: every ``COMPONENT`` its classes declare,
    bases first."""
    found: list[Component] = []
    for klass in reversed(cls.__mro__):
        component = klass.__dict__.get("COMPONENT")
        if isinstance(component, Component) and component not in found:
            found.append(component)
    return found


def _statements(script: str) -> Iterable[str]:
    return (statement for statement in script.split(";") if statement.strip())


def _check(component: Component, version: int) -> None:
    if version > len(component.migrations):
        raise Unavailable(
            f'the store\'s "{component.name}" tables are at version {version}, newer than this schedtui '
            f"knows ({len(component.migrations)}); upgrade schedtui before opening it"
        )


SQLITE_TABLE = "CREATE TABLE IF NOT EXISTS schema_components (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
SQLITE_GET = "SELECT version FROM schema_components WHERE component = ?"
SQLITE_SET = """
    INSERT INTO schema_components (component, version) VALUES (?, ?)
    ON CONFLICT (component) DO UPDATE SET version = excluded.version
"""


def migrate_sqlite(conn: sqlite3.Connection, components: Sequence[Component]) -> None:
    """Bring each component up to date (inside the caller's BEGIN IMMEDIATE)."""
    if not components:
        return
    conn.execute(SQLITE_TABLE)
    for component in components:
        row = conn.execute(SQLITE_GET, (component.name,)).fetchone()
        version = int(row[0]) if row else 0
        _check(component, version)
        for number, script in enumerate(component.migrations[version:], start=version + 1):
            for statement in _statements(script):
                conn.execute(statement)
            log.info('store: "%s" tables migrated to version %d', component.name, number)
        if version != len(component.migrations):
            conn.execute(SQLITE_SET, (component.name, len(component.migrations)))


PG_TABLE = "CREATE TABLE IF NOT EXISTS schedtui_schema_components (component text PRIMARY KEY, version integer NOT NULL)"
PG_GET = "SELECT version FROM schedtui_schema_components WHERE component = %s"
PG_SET = """
    INSERT INTO schedtui_schema_components (component, version) VALUES (%s, %s)
    ON CONFLICT (component) DO UPDATE SET version = excluded.version
"""


async def migrate_postgres(conn: Any, components: Sequence[Component]) -> None:
    """Bring each component up to date (inside the caller's transaction, which holds the
    migration lock)."""
    if not components:
        return
    await conn.execute(PG_TABLE)
    for component in components:
        row = await (await conn.execute(PG_GET, (component.name,))).fetchone()
        version = int(row[0]) if row else 0
        _check(component, version)
        for number, script in enumerate(component.migrations[version:], start=version + 1):
            for statement in _statements(script):
                await conn.execute(statement)
            log.info('store: "%s" tables migrated to version %d', component.name, number)
        if version != len(component.migrations):
            await conn.execute(PG_SET, (component.name, len(component.migrations)))
