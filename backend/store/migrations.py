"""Schema migrations per component, for both stores.

The run ledger's tables (the "core") keep their own version table, as since the first
release. Every other system (the job queue, durable functions, locks, the catalog of
stored schedules and the audit log) is a *component* with its own migrations and its own
version, so the systems evolve independently: a store mixin declares
``COMPONENT = Component("jobs", (script_v1, script_v2, …))`` and the store applies, at
open, what each component lacks, in one transaction per component (PostgreSQL: under the
migration advisory lock, so instances starting together migrate one after the other).
A store whose component is newer than this code is refused, naming the component, unless
what is newer only adds (``Component.additions``): a fleet upgrades one instance at a time.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from backend.errors import Unavailable

__all__ = ["CORE", "Component", "applied", "summary", "components_of", "migrate_postgres", "migrate_sqlite", "postgres_components_current"]

log = logging.getLogger("schedtui.store")


@dataclass(frozen=True)
class Component:
    """One system's tables: a name, and its migration scripts, oldest first (statements
    separated by ``;``). Append a script to change the schema; never edit a released one.

    ``additions`` are scripts that only add what older code does not read (a nullable
    column, an index): they are counted apart from ``migrations``, so the release before
    them still opens the store, and a fleet can be upgraded one instance at a time. They
    run after every migration; a migration appended later is written for the schema with
    them. A breaking change (a column renamed, dropped or made required; a table older code
    writes to changed in meaning) is a migration, and older releases refuse the store."""

    name: str
    migrations: tuple[str, ...]
    additions: tuple[str, ...] = ()


def components_of(cls: type) -> list[Component]:
    """The components a store class carries: every ``COMPONENT`` its classes declare,
    bases first."""
    found: list[Component] = []
    for klass in reversed(cls.__mro__):
        component = klass.__dict__.get("COMPONENT")
        if isinstance(component, Component) and component not in found:
            found.append(component)
    return found


#: The name the run ledger's own tables go by in :func:`applied` (they keep their own
#: version table, older than the components').
CORE = "core"


def applied(component: str, label: str) -> tuple[str, str]:
    """One migration applied (``("core", "version 9")``, ``("jobs", "addition 1")``):
    logged, and kept for ``schedtui migrate`` to tell (:func:`summary`)."""
    log.info("store: %s tables migrated to %s", component if component == CORE else f'"{component}"', label)
    return component, label


def summary(done: Sequence[tuple[str, str]]) -> str:
    """What :func:`applied` recorded, one phrase a component, in order: ``core to version
    7, "locks" to version 1 and addition 1``."""
    last: dict[str, dict[str, str]] = {}
    for component, label in done:
        kind, _, number = label.partition(" ")
        last.setdefault(component, {})[kind] = number
    phrases = []
    for component, reached in last.items():
        name = component if component == CORE else f'"{component}"'
        phrases.append(f"{name} to " + " and ".join(f"{kind} {number}" for kind, number in reached.items()))
    return ", ".join(phrases)


def _statements(script: str) -> Iterable[str]:
    return (statement for statement in script.split(";") if statement.strip())


def _plan(component: Component, row: Sequence[Any] | None) -> tuple[list[tuple[str, str]], bool]:
    """What ``component`` lacks, given its row ``(version, additions)`` (``None``: none
    yet): the scripts to run, each with what it brings the tables to, and whether the row
    must be written. A newer version is refused; more additions than known are not (they
    only add what this code does not read)."""
    version, added = (int(row[0]), int(row[1])) if row else (0, 0)
    if version > len(component.migrations):
        raise Unavailable(
            f'the store\'s "{component.name}" tables are at version {version}, newer than this schedtui '
            f"knows ({len(component.migrations)}); upgrade schedtui before opening it"
        )
    steps = [(f"version {n}", script) for n, script in enumerate(component.migrations[version:], start=version + 1)]
    steps += [(f"addition {n}", script) for n, script in enumerate(component.additions[added:], start=added + 1)]
    return steps, row is None or bool(steps)


def _done(component: Component, row: Sequence[Any] | None) -> tuple[str, int, int]:
    """The row to write once the plan has run (additions beyond this code's are kept)."""
    added = int(row[1]) if row else 0
    return component.name, len(component.migrations), max(added, len(component.additions))


SQLITE_TABLE = "CREATE TABLE IF NOT EXISTS schema_components (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
#: The count of additions, added to the table after its first release (older code reads
#: and writes only ``version``, and keeps working).
SQLITE_ADDITIONS = "ALTER TABLE schema_components ADD COLUMN additions INTEGER NOT NULL DEFAULT 0"
SQLITE_GET = "SELECT version, additions FROM schema_components WHERE component = ?"
SQLITE_GET_ALL = "SELECT component, version, additions FROM schema_components"
SQLITE_SET = """
    INSERT INTO schema_components (component, version, additions) VALUES (?, ?, ?)
    ON CONFLICT (component) DO UPDATE SET version = excluded.version, additions = excluded.additions
"""


def sqlite_components_current(conn: sqlite3.Connection, components: Sequence[Component]) -> bool:
    """Whether every component is at this code's version already, found by reading alone (a
    store opened to look at or act on is never migrated). A component newer than this code
    is refused, as by :func:`migrate_sqlite`."""
    if not components:
        return True
    if "additions" not in {column[1] for column in conn.execute("PRAGMA table_info(schema_components)")}:
        return False
    rows = {name: (version, added) for name, version, added in conn.execute(SQLITE_GET_ALL).fetchall()}
    return not any(_plan(component, rows.get(component.name))[1] for component in components)


def migrate_sqlite(conn: sqlite3.Connection, components: Sequence[Component]) -> list[tuple[str, str]]:
    """Bring each component up to date (inside the caller's BEGIN IMMEDIATE); what it
    applied (see :func:`applied`)."""
    done: list[tuple[str, str]] = []
    if not components:
        return done
    conn.execute(SQLITE_TABLE)
    if "additions" not in {column[1] for column in conn.execute("PRAGMA table_info(schema_components)")}:
        conn.execute(SQLITE_ADDITIONS)
    for component in components:
        row = conn.execute(SQLITE_GET, (component.name,)).fetchone()
        steps, changed = _plan(component, row)
        for label, script in steps:
            for statement in _statements(script):
                conn.execute(statement)
            done.append(applied(component.name, label))
        if changed:
            conn.execute(SQLITE_SET, _done(component, row))
    return done


PG_TABLE = "CREATE TABLE IF NOT EXISTS schedtui_schema_components (component text PRIMARY KEY, version integer NOT NULL)"
PG_ADDITIONS = "ALTER TABLE schedtui_schema_components ADD COLUMN IF NOT EXISTS additions integer NOT NULL DEFAULT 0"
PG_GET = "SELECT version, additions FROM schedtui_schema_components WHERE component = %s"
PG_SET = """
    INSERT INTO schedtui_schema_components (component, version, additions) VALUES (%s, %s, %s)
    ON CONFLICT (component) DO UPDATE SET version = excluded.version, additions = excluded.additions
"""


#: Whether the components' table is there with its ``additions`` column, as this code
#: writes it (both looked up along the ``search_path``, as the statements find them).
PG_TABLE_CURRENT = """
    SELECT to_regclass('schedtui_schema_components') IS NOT NULL AND EXISTS (
        SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('schedtui_schema_components')
        AND attname = 'additions' AND NOT attisdropped)
"""
PG_GET_ALL = "SELECT component, version, additions FROM schedtui_schema_components"


async def postgres_components_current(conn: Any, components: Sequence[Component]) -> bool:
    """Whether every component is at this code's version already, found by reading alone:
    a role that may use the tables but not change the schema (the least privilege a
    deployment gives the role its instances run as) then opens the store without a
    statement it may not run. A component newer than this code is refused, as by
    :func:`migrate_postgres`."""
    if not components:
        return True
    row = await (await conn.execute(PG_TABLE_CURRENT)).fetchone()
    if not (row and row[0]):
        return False
    rows = {name: (version, added) for name, version, added in await (await conn.execute(PG_GET_ALL)).fetchall()}
    return not any(_plan(component, rows.get(component.name))[1] for component in components)


async def migrate_postgres(conn: Any, components: Sequence[Component]) -> list[tuple[str, str]]:
    """Bring each component up to date (inside the caller's transaction, which holds the
    migration lock); what it applied (see :func:`applied`)."""
    done: list[tuple[str, str]] = []
    if not components:
        return done
    await conn.execute(PG_TABLE)
    await conn.execute(PG_ADDITIONS)
    for component in components:
        row = await (await conn.execute(PG_GET, (component.name,))).fetchone()
        steps, changed = _plan(component, row)
        for label, script in steps:
            for statement in _statements(script):
                await conn.execute(statement)
            done.append(applied(component.name, label))
        if changed:
            await conn.execute(PG_SET, _done(component, row))
    return done
