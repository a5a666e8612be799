"""Schema migrations per component (backend/store/migrations.py), on both stores."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backend import BadInput, Unavailable, connect
from backend.store.migrations import Component
from backend.store.postgres.store import PostgresStore
from backend.store.sqlite.sql import MIGRATIONS
from backend.store.sqlite.store import SQLiteStore
from tests import pg
from tests.servers import run_main

V1 = "CREATE TABLE {t} (id TEXT PRIMARY KEY); CREATE INDEX {t}_by_id ON {t} (id)"
V2 = "ALTER TABLE {t} ADD COLUMN note TEXT"


def store_class(kind: str, *scripts: str, additions: tuple[str, ...] = ()) -> type:
    """A store class carrying one extra component, as a system's mixin would."""
    table = "widgets" if kind == "sqlite" else "schedtui_widgets"
    base = SQLiteStore if kind == "sqlite" else PostgresStore

    class Widgets:
        COMPONENT = Component("widgets", tuple(script.format(t=table) for script in scripts),
                              tuple(script.format(t=table) for script in additions))  # fmt: skip

    return type("WidgetStore", (Widgets, base), {})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        return "postgres", pg.database_for(tmp_path)
    return "sqlite", str(tmp_path / "state.db")


async def versions(store: object, columns: str = "version") -> dict[str, Any]:
    if isinstance(store, SQLiteStore):
        rows = await store._read(lambda c: c.execute(f"SELECT component, {columns} FROM schema_components").fetchall())
    else:
        assert isinstance(store, PostgresStore)
        rows = await store._fetchall(f"SELECT component, {columns} FROM schedtui_schema_components")
    # Only the test's own component: the stores carry the systems' components as well.
    return {row[0]: row[1] if len(row) == 2 else tuple(row[1:]) for row in rows if row[0] == "widgets"}


def executing(statement: str) -> Callable[[sqlite3.Connection], Any]:
    def execute(conn: sqlite3.Connection) -> Any:
        return conn.execute(statement)

    return execute


async def write_note(store: object) -> None:
    if isinstance(store, SQLiteStore):
        await store._write(lambda c: c.execute("INSERT INTO widgets (id, note) VALUES ('a', 'b')"))
    else:
        assert isinstance(store, PostgresStore)
        await store._execute("INSERT INTO schedtui_widgets (id, note) VALUES ('a', 'b')")


async def test_a_component_migrates_on_its_own_and_refuses_a_newer_schema(where: tuple[str, str]) -> None:
    kind, location = where
    first = store_class(kind, V1)(location)
    await first.open()
    assert (await versions(first))["widgets"] == 1  # beside the real components
    await first.close()

    second = store_class(kind, V1, V2)(location)  # a newer release adds a column
    await second.open()
    assert (await versions(second))["widgets"] == 2
    await write_note(second)
    await second.close()

    again = store_class(kind, V1, V2)(location)  # nothing to do: opens as it is
    await again.open()
    await again.close()

    older = store_class(kind, V1)(location)  # an older release must not touch it
    with pytest.raises(Unavailable, match='"widgets" tables are at version 2, newer than this schedtui knows'):
        await older.open()
    await older.close()


async def open_with_the_addition(kind: str, location: str) -> None:
    """Open with V2 as an addition: the column is there, the version is still 1."""
    newer = store_class(kind, V1, additions=(V2,))(location)
    await newer.open()
    assert (await versions(newer, "version, additions"))["widgets"] == (1, 1)
    await write_note(newer)
    await newer.close()


async def test_an_addition_leaves_the_release_before_it_opening_the_store(where: tuple[str, str]) -> None:
    """A column that older code does not read is an addition: it keeps the version, so a
    fleet upgrades one instance at a time (an older instance that restarts meanwhile opens
    the store, where a migration would make it refuse)."""
    kind, location = where
    first = store_class(kind, V1)(location)
    await first.open()
    await first.close()

    await open_with_the_addition(kind, location)

    for older in (store_class(kind, V1)(location), store_class(kind, V1, additions=(V2,))(location)):
        await older.open()  # the release before, and the same one again: nothing to do, no refusal
        assert (await versions(older, "version, additions"))["widgets"] == (1, 1)
        await older.close()

    later = store_class(kind, V1, "CREATE INDEX {t}_by_note ON {t} (note)", additions=(V2,))(location)
    await later.open()  # a migration after an addition is written for the schema with it
    assert (await versions(later, "version, additions"))["widgets"] == (2, 1)
    await later.close()


async def test_a_store_from_before_additions_were_counted_takes_them(where: tuple[str, str]) -> None:
    """The table of component versions had no count of additions in the releases before:
    it gains one, and their components take the additions of this one."""
    kind, location = where
    first = store_class(kind, V1)(location)
    await first.open()
    prefix = "" if kind == "sqlite" else "schedtui_"
    before = [f"ALTER TABLE {prefix}schema_components DROP COLUMN additions",  # as those releases made them
              f"ALTER TABLE {prefix}locks DROP COLUMN claim", f"ALTER TABLE {prefix}durable_executions DROP COLUMN claim",
              f"ALTER TABLE {prefix}durable_steps DROP COLUMN gathered",
              f"ALTER TABLE {prefix}stored_schedules DROP COLUMN timing_changed_at",
              f"DROP TABLE {prefix}code_schedule_timings"]  # fmt: skip
    for statement in before:
        if isinstance(first, SQLiteStore):
            await first._write(executing(statement))
        else:
            assert isinstance(first, PostgresStore)
            await first._execute(statement)
    await first.close()

    await open_with_the_addition(kind, location)


# ---------------------------------------------------------------------------------------
# a look is a read: only serve, migrate (and a firing console) change the schema
# ---------------------------------------------------------------------------------------
def schema_of(db: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() + [
            tuple(conn.execute("SELECT version FROM schema_version").fetchall())
        ]


def test_a_verb_leaves_an_older_store_as_it_is_and_says_to_migrate_it(tmp_path: Path) -> None:
    # `--read-only list` migrated it: under a running serve of an older release.
    db = tmp_path / "state.db"
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for script in MIGRATIONS[:-1]:
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (?)", (len(MIGRATIONS) - 1,))
    before = schema_of(db)
    (tmp_path / "schedules").mkdir()
    store = ("--schedules", "schedules", "--store", f"sqlite:///{db}")
    for verb in (("--read-only", "list"), ("list",), ("disable", "tick")):
        done = run_main(tmp_path, *verb, *store)
        assert (done.returncode, done.stderr) == (1, (
            f'schedtui: the store "{db}" was made by an older schedtui (its schema is behind this one\'s): upgrade it '
            "with `schedtui migrate` (or by starting `schedtui serve`) first; a command that reads or acts leaves it as it is\n"
        ))  # fmt: skip
        assert schema_of(db) == before
    assert run_main(tmp_path, "migrate", *store[2:]).returncode == 0
    assert run_main(tmp_path, "list", *store).returncode == 0


def test_an_empty_file_is_no_store_and_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    (tmp_path / "schedules").mkdir()
    done = run_main(tmp_path, "runs", "tick", "--schedules", "schedules", "--store", f"sqlite:///{empty}")
    assert (done.returncode, done.stderr) == (2, (
        f'schedtui: the file "{empty}" is empty, not a schedtui store; check --store (only `schedtui serve` and '
        "`schedtui demo` create a store)\n"
    ))  # fmt: skip
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "schedules"]


def another_apps_database(path: Path) -> bytes:
    """An SQLite file made by another application (a table of its own, a rollback journal,
    as SQLite makes it by default): its bytes."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('a')")
        conn.commit()
    made = path.read_bytes()
    assert made[18:20] == b"\x01\x01"  # (rollback journal; WAL is 2, 2)
    return made


def test_another_applications_database_is_refused_and_left_byte_for_byte(tmp_path: Path) -> None:
    # A verb switched it to WAL (its header's bytes 18-19, for good) before refusing it.
    db = tmp_path / "otherapp.db"
    made = another_apps_database(db)
    (tmp_path / "schedules").mkdir()
    store = ("--schedules", "schedules", "--store", f"sqlite:///{db}")
    for verb in (("audit",), ("--read-only", "list"), ("list",), ("disable", "tick")):
        done = run_main(tmp_path, *verb, *store)
        assert (done.returncode, done.stderr) == (2, (
            f'schedtui: the file "{db}" is not a schedtui store (an SQLite file without its tables); check --store\n'
        )), verb  # fmt: skip
        assert db.read_bytes() == made, verb
        assert sorted(p.name for p in tmp_path.iterdir()) == ["otherapp.db", "schedules"], verb


def test_serve_and_migrate_make_no_store_in_another_applications_database(tmp_path: Path) -> None:
    # Their tables went in beside the application's (and the file was switched to WAL).
    db = tmp_path / "otherapp.db"
    made = another_apps_database(db)
    (tmp_path / "schedules").mkdir()
    for verb in (("migrate",), ("serve", "--schedules", "schedules")):
        done = run_main(tmp_path, *verb, "--store", f"sqlite:///{db}")
        assert (done.returncode, done.stderr.splitlines()[-1:]) == (2, [
            f'schedtui: the file "{db}" is another application\'s SQLite database (its tables: users), not a '
            "schedtui store: a store is not made in it; check --store"
        ]), verb  # fmt: skip
        assert db.read_bytes() == made, verb
        assert sorted(p.name for p in tmp_path.iterdir()) == ["otherapp.db", "schedules"], verb


async def test_a_store_is_made_in_a_database_without_tables(tmp_path: Path) -> None:
    db = tmp_path / "blank.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 1")  # (a database file, no table in it)
    assert db.stat().st_size > 0
    store = SQLiteStore(db)
    await store.open()
    try:
        assert await store._read(lambda c: c.execute("SELECT version FROM schema_version").fetchone()) == (len(MIGRATIONS),)
    finally:
        await store.close()


async def test_the_store_api_refuses_another_applications_database_and_leaves_it_as_it_is(tmp_path: Path) -> None:
    db = tmp_path / "otherapp.db"
    made = another_apps_database(db)
    said = f'the file "{db}" is not a schedtui store (an SQLite file without its tables); check --store'
    with pytest.raises(BadInput, match="^" + re.escape(said) + "$"):
        await SQLiteStore(db, create=False).open()
    # the process that fires a store it did not create looks before it takes the firing lock
    firer = SQLiteStore(db, create=False)
    with pytest.raises(BadInput, match="^" + re.escape(said) + "$"):
        await firer.take_firing_lock("a")
    with pytest.raises(BadInput, match="^" + re.escape(said) + "$"):
        async with connect(f"sqlite:///{db}"):
            pass
    assert db.read_bytes() == made
    assert [p.name for p in tmp_path.iterdir()] == ["otherapp.db"]


async def test_a_store_copied_in_rollback_mode_opens_and_is_written_in_wal_again(tmp_path: Path) -> None:
    # VACUUM INTO (a backup) writes a rollback-journal file: schedtui's own, so it is opened
    # to write (in WAL, as every store) once known to be one.
    made = SQLiteStore(tmp_path / "state.db")
    await made.open()
    await made.close()
    copy = tmp_path / "copy.db"
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as conn:
        conn.execute("VACUUM INTO ?", (str(copy),))
    assert copy.read_bytes()[18:20] == b"\x01\x01"
    store = SQLiteStore(copy, create=False)
    await store.open()
    try:
        await store.take_firing_lock("a")
        await store._write(executing("UPDATE schema_version SET version = version"))
        assert await store._read(lambda c: c.execute("SELECT version FROM schema_version").fetchone()) == (len(MIGRATIONS),)
    finally:
        await store.close()
    assert copy.read_bytes()[18:20] == b"\x02\x02"


@pytest.mark.parametrize("content", [b"hello, not a database\n", bytes(range(256)) * 16], ids=["text", "bytes"])
@pytest.mark.parametrize("verb", [("audit",), ("serve",)])
def test_a_file_that_is_no_sqlite_database_is_bad_input_as_an_empty_one_is(
    tmp_path: Path, content: bytes, verb: tuple[str, ...]
) -> None:
    """Text or other bytes as ``--store``: "cannot open the store …: file is not a database"
    and exit 1 (as for a store out of reach), where an empty file and another application's
    SQLite file are exit 2 (found by an outside attack). Serve refuses it too, and leaves it as it was."""
    other = tmp_path / "other.db"
    other.write_bytes(content)
    (tmp_path / "schedules").mkdir()
    done = run_main(tmp_path, *verb, "--schedules", "schedules", "--store", f"sqlite:///{other}")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", (
        f'schedtui: the file "{other}" is not a schedtui store, nor any SQLite database (SQLite: file is not a '
        "database: a file of another kind, or one damaged or encrypted); check --store\n"
    ))  # fmt: skip
    assert other.read_bytes() == content
