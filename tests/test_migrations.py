"""Schema migrations per component (backend/store/migrations.py), on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend import Unavailable
from backend.store.migrations import Component
from backend.store.postgres.store import PostgresStore
from backend.store.sqlite.store import SQLiteStore
from tests import pg

V1 = "CREATE TABLE {t} (id TEXT PRIMARY KEY); CREATE INDEX {t}_by_id ON {t} (id)"
V2 = "ALTER TABLE {t} ADD COLUMN note TEXT"


def store_class(kind: str, *scripts: str) -> type:
    """A store class carrying one extra component, as a system's mixin would."""
    table = "widgets" if kind == "sqlite" else "schedtui_widgets"
    base = SQLiteStore if kind == "sqlite" else PostgresStore

    class Widgets:
        COMPONENT = Component("widgets", tuple(script.format(t=table) for script in scripts))

    return type("WidgetStore", (Widgets, base), {})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        return "postgres", pg.database_for(tmp_path)
    return "sqlite", str(tmp_path / "state.db")


async def versions(store: object) -> dict[str, int]:
    if isinstance(store, SQLiteStore):
        rows = await store._read(lambda c: c.execute("SELECT component, version FROM schema_components").fetchall())
    else:
        assert isinstance(store, PostgresStore)
        rows = await store._fetchall("SELECT component, version FROM schedtui_schema_components")
    # Only the test's own component: the stores carry the systems' components as well.
    return {name: version for name, version in rows if name == "widgets"}


async def test_a_component_migrates_on_its_own_and_refuses_a_newer_schema(where: tuple[str, str]) -> None:
    kind, location = where
    first = store_class(kind, V1)(location)
    await first.open()
    assert (await versions(first))["widgets"] == 1  # beside the real components
    await first.close()

    second = store_class(kind, V1, V2)(location)  # a newer release adds a column
    await second.open()
    assert (await versions(second))["widgets"] == 2
    if isinstance(second, SQLiteStore):
        await second._write(lambda c: c.execute("INSERT INTO widgets (id, note) VALUES ('a', 'b')"))
    else:
        await second._execute("INSERT INTO schedtui_widgets (id, note) VALUES ('a', 'b')")
    await second.close()

    again = store_class(kind, V1, V2)(location)  # nothing to do: opens as it is
    await again.open()
    await again.close()

    older = store_class(kind, V1)(location)  # an older release must not touch it
    with pytest.raises(Unavailable, match='"widgets" tables are at version 2, newer than this schedtui knows'):
        await older.open()
    await older.close()
