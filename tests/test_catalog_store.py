"""The stored schedules' store contract, on SQLite and PostgreSQL alike: rows round-trip,
names are unique, updates are compare-and-set on the row's version, every change bumps the
catalog version (what other instances poll), and a delete takes the schedule's state along."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from backend.model import ScheduleState
from backend.scheduler.catalog import CatalogStore
from backend.scheduler.stored import CodeTiming, StoredSchedule
from backend.store import Store
from tests.test_store import new_store, store, store_kind  # noqa: F401 - fixtures

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def row(name: str = "reap", **changes: Any) -> StoredSchedule:
    base = StoredSchedule(
        name=name, cron="*/15 * * * *", timezone="Europe/Berlin", queue="mail", durable=None,
        payload={"older_than": "7d", "n": [1, 2]}, description="old sessions", enabled=True,
        on_overlap="queue", backfill="latest", max_runtime=90.5,
        created_at=T0, created_by="alice", updated_at=T0, updated_by="alice", version=1,
    )  # fmt: skip
    return replace(base, **changes)


async def test_rows_round_trip_and_every_change_bumps_the_version(store: Store) -> None:  # noqa: F811
    catalog = cast(CatalogStore, store)
    start = await catalog.catalog_version()
    assert await catalog.stored_schedules() == (start, [])
    assert await catalog.create_stored_schedule(row())
    assert not await catalog.create_stored_schedule(row(cron="* * * * *"))  # the name is taken
    assert await catalog.create_stored_schedule(row("other", queue=None, durable="flow", payload=None, description=None))
    version, rows = await catalog.stored_schedules()
    assert version == start + 2 == await catalog.catalog_version()
    assert rows == [row("other", queue=None, durable="flow", payload=None, description=None), row()]

    later = T0 + timedelta(minutes=5)
    wanted = row(cron="0 * * * *", enabled=False, updated_at=later, updated_by="bob", timing_changed_at=later)
    updated = await catalog.update_stored_schedule(wanted, 1)
    assert updated == replace(wanted, version=2)
    assert await catalog.update_stored_schedule(wanted, 1) is None  # changed meanwhile: refused
    assert await catalog.catalog_version() == start + 3
    assert (await catalog.stored_schedules())[1][1] == updated

    await store.set_state(ScheduleState("reap", False, "bob", later))
    assert await catalog.delete_stored_schedule("reap")
    assert not await catalog.delete_stored_schedule("reap")
    assert "reap" not in await store.get_states()
    version, rows = await catalog.stored_schedules()
    assert version == start + 4 and [r.name for r in rows] == ["other"]
    assert await catalog.update_stored_schedule(updated, 2) is None  # gone


async def test_another_connection_sees_the_change(new_store: Callable[[], Store]) -> None:  # noqa: F811
    one, two = new_store(), new_store()
    await one.open()
    await two.open()
    before = await cast(CatalogStore, two).catalog_version()
    assert await cast(CatalogStore, one).create_stored_schedule(row())
    assert await cast(CatalogStore, two).catalog_version() == before + 1
    assert [r.name for r in (await cast(CatalogStore, two).stored_schedules())[1]] == ["reap"]


async def test_code_timings_say_when_each_changed(store: Store) -> None:  # noqa: F811
    catalog = cast(CatalogStore, store)
    first = [("a", "0 9 * * *", "UTC"), ("b", "* * * * *", "UTC")]
    assert await catalog.record_code_timings(first, T0) == {}  # first recorded: no change known
    assert await catalog.record_code_timings(first, T0 + timedelta(hours=1)) == {}
    moved = [("a", "0 9 * * *", "UTC"), ("b", "* * * * *", "Europe/Berlin")]
    later = T0 + timedelta(hours=2)
    assert await catalog.record_code_timings(moved, later) == {"b": later}
    again = [("a", "5 9 * * *", "UTC"), ("b", "* * * * *", "Europe/Berlin"), ("c", "0 0 * * *", "UTC")]
    last = T0 + timedelta(hours=3)
    assert await catalog.record_code_timings(again, last) == {"a": last, "b": later}
    assert await catalog.record_code_timings([], last) == {}
    assert await catalog.code_timings() == {
        "a": CodeTiming("5 9 * * *", "UTC", None), "b": CodeTiming("* * * * *", "Europe/Berlin", None),
        "c": CodeTiming("0 0 * * *", "UTC", None),
    }  # fmt: skip


async def test_code_timings_name_the_last_instance_to_start_with_them(store: Store) -> None:  # noqa: F811
    """What a fleet member needs to fire a schedule by one timing (see FleetTimings): the
    timing recorded last, and the last instance to start with it."""
    catalog = cast(CatalogStore, store)
    old, new = [("a", "0 2 * * *", "UTC")], [("a", "0 3 * * *", "UTC")]
    assert await catalog.record_code_timings(old, T0, instance="web-1") == {}
    assert await catalog.code_timings() == {"a": CodeTiming("0 2 * * *", "UTC", "web-1")}
    assert await catalog.record_code_timings(new, T0 + timedelta(hours=1), instance="web-2") == {"a": T0 + timedelta(hours=1)}
    assert await catalog.code_timings() == {"a": CodeTiming("0 3 * * *", "UTC", "web-2")}
    # Another instance starting with the same timing becomes its instance; the change stays.
    assert await catalog.record_code_timings(new, T0 + timedelta(hours=2), instance="web-3") == {"a": T0 + timedelta(hours=1)}
    assert await catalog.code_timings() == {"a": CodeTiming("0 3 * * *", "UTC", "web-3")}


async def test_code_timings_keep_the_zones_rules_and_a_change_of_them_is_a_change(store: Store) -> None:  # noqa: F811
    """The same expression and zone by another time zone database's rules fire at other
    instants: a change, where both sides said their rules (a release that did not say
    changes nothing)."""
    catalog = cast(CatalogStore, store)
    timing = [("a", "0 2 * * *", "America/Mexico_City")]
    assert await catalog.record_code_timings(timing, T0, instance="web-1", rules={"a": "2022a"}) == {}
    assert await catalog.code_timings() == {"a": CodeTiming("0 2 * * *", "America/Mexico_City", "web-1", "2022a")}
    assert await catalog.record_code_timings(timing, T0 + timedelta(hours=1), instance="web-2") == {}  # (not said)
    assert await catalog.code_timings() == {"a": CodeTiming("0 2 * * *", "America/Mexico_City", "web-2", "2022a")}
    later = T0 + timedelta(hours=2)
    assert await catalog.record_code_timings(timing, later, instance="web-3", rules={"a": "2022g"}) == {"a": later}
    assert await catalog.code_timings() == {"a": CodeTiming("0 2 * * *", "America/Mexico_City", "web-3", "2022g")}
