"""One timing per schedule across a fleet (backend/scheduler/timings.py): instances that
run two versions of a schedule's timing (a rolling deploy that moves a daily job from 02:00
to 03:00, a canary) each claimed their own timing's slots under ``advisoryLock``, and the
job ran at both, every day, for as long as both versions ran."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock, Run, RunContext, Schedule, define_schedule
from backend.model import CoordinationMode
from backend.scheduler.timings import zone_rules
from backend.store import Membership
from tests.conftest import all_runs
from tests.servers import until


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every engine of a test shares this store (SQLite: engines of one process, which
    claims coordinate as they do a fleet's)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


#: The take-over window: longer than the clock's steps, which move every instance's heartbeat
#: ten minutes at once (a window of 30 s would judge each dead at each step).
WINDOW = 3600


def daily(cron: str, zone: str = "UTC") -> Schedule:
    async def export(ctx: RunContext) -> None:
        pass

    return define_schedule(name="export", cron=cron, timezone=zone, handler=export)


def engine(url: str, clock: ManualClock, cron: str, instance: str, coordination: CoordinationMode = "advisoryLock") -> Engine:
    """An instance running ``export`` by ``cron`` (UTC)."""
    return Engine([daily(cron)], url, clock=clock, instance=instance, coordination=coordination, abandon_after=WINDOW)


async def days(clock: ManualClock, engines: list[Engine], count: float) -> None:
    """Move the clock on ``count`` days in steps of ten minutes, each engine settled after each."""
    for _ in range(int(count * 144)):
        clock.advance(600)
        for engine in engines:
            await engine.quiesce()


def per_day(runs: list[Run]) -> Counter[str]:
    return Counter(f"{r.scheduled_at:%m-%d}" for r in runs)


async def test_two_versions_of_a_schedules_timing_fire_one_of_them_at_a_time(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "schedtui.engine")
    clock = ManualClock("2026-03-02T00:30:00Z")
    old = engine(store_url, clock, "0 2 * * *", "web-1")
    new = engine(store_url, clock, "0 3 * * *", "web-2")
    await old.start()
    try:
        await days(clock, [old], 1)  # 03-02 02:00 by the only version there is
        await new.start()  # the deploy's first instance, at 00:30 on 03-03
        try:
            await days(clock, [old, new], 2)  # 03-03 and 03-04: both versions run
            runs = await all_runs(old, "export")
            assert [(f"{r.scheduled_at:%m-%d %H:%M}", r.instance) for r in runs] == [
                ("03-02 02:00", "web-1"), ("03-03 03:00", "web-2"), ("03-04 03:00", "web-2")
            ]  # fmt: skip
            assert old.fleet_timings.leaves("export") and not new.fleet_timings.leaves("export")
            [said] = [r.getMessage() for r in caplog.records if "fires none of its slots" in r.getMessage()]
            assert said.startswith('schedule "export" runs by "0 2 * * *" (UTC) here, and by "0 3 * * *" (UTC) on web-2')
        finally:
            await new.stop()  # the canary taken away: its timing's instance is gone
        await days(clock, [old], 1.5)
        runs = await all_runs(old, "export")
        assert [(f"{r.scheduled_at:%m-%d %H:%M}", r.instance) for r in runs][3:] == [
            ("03-05 02:00", "web-1"), ("03-06 02:00", "web-1")
        ]  # fmt: skip
        assert not old.fleet_timings.leaves("export")
        assert any('web-2, the last instance to start with its timing "0 3 * * *" (UTC), is gone' in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        assert set(per_day(runs).values()) == {1}
    finally:
        await old.stop()


async def test_an_instance_of_the_first_timing_starting_again_takes_the_schedule_back(store_url: str) -> None:
    """The last instance to start with another timing is the fleet's: a rolled-back deploy,
    or an old instance restarted mid-deploy, takes the schedule back, and the new version's
    instances leave it; one timing still fires a day."""
    clock = ManualClock("2026-03-02T00:30:00Z")
    new = engine(store_url, clock, "0 3 * * *", "web-2")
    old = engine(store_url, clock, "0 2 * * *", "web-1")
    await new.start()
    await old.start()  # recorded last: the fleet's timing is 02:00 now
    try:
        await days(clock, [old, new], 2)
        runs = await all_runs(old, "export")
        assert [(f"{r.scheduled_at:%m-%d %H:%M}", r.instance) for r in runs] == [
            ("03-02 02:00", "web-1"), ("03-03 02:00", "web-1")
        ]  # fmt: skip
        assert new.fleet_timings.leaves("export")
    finally:
        await old.stop()
        await new.stop()


@pytest.mark.parametrize("written", ["0 2 * * *", "00 02 * * *", "0 2 * * 0-6"])
async def test_instances_of_one_timing_leave_nothing(store_url: str, written: str) -> None:
    """Written another way (leading zeros, every weekday by a range), a timing is the same:
    taken for another, the instances of one of the spellings left the schedule to the other's.
    (``0 0 2 * * *`` is another: six fields follow real time through a DST change.)"""
    clock = ManualClock("2026-03-02T00:30:00Z")
    one = engine(store_url, clock, "0 2 * * *", "web-1")
    two = engine(store_url, clock, written, "web-2")
    await one.start()
    await two.start()
    try:
        await days(clock, [one, two], 2)
        runs = await all_runs(one, "export")
        assert [f"{r.scheduled_at:%m-%d %H:%M}" for r in runs] == ["03-02 02:00", "03-03 02:00"]
        assert not one.fleet_timings.leaves("export") and not two.fleet_timings.leaves("export")
    finally:
        await one.stop()
        await two.stop()


@pytest.mark.postgres
async def test_a_deploys_first_instance_tells_the_others_at_once(pg_url: str) -> None:
    """Its start signals ``schedules`` (NOTIFY): the others look at the fleet's timings at
    their next round, not a minute later (the backstop: a read of the store each look)."""
    clock = ManualClock("2026-03-02T00:30:00Z")
    old = engine(pg_url, clock, "0 2 * * *", "web-1")
    new = engine(pg_url, clock, "0 3 * * *", "web-2")
    await old.start()
    try:
        relay = old.relay.postgres
        assert relay is not None
        await until(lambda: relay.hearing, "web-1 to listen")  # (its first connection: a resync, a look)
        await old.fleet_timings.review(clock.now(), force=True)  # a look at nothing to leave
        assert not old.fleet_timings.stale
        await new.start()
        try:
            await until(lambda: old.fleet_timings.stale, "web-1 to hear of the new timing")
            clock.advance(1)
            await old.quiesce()
            assert old.fleet_timings.leaves("export")
        finally:
            await new.stop()
    finally:
        await old.stop()


@pytest.mark.postgres
async def test_a_timing_whose_last_instance_fires_nothing_is_not_waited_for(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The last instance to start with the other timing is alive but fires nothing: it came
    in another coordination mode and waits for this one's fleet to leave (a rolling change
    of mode with the deploy). Left to it, the schedule fired nowhere."""
    clock = ManualClock("2026-03-02T00:30:00Z")
    old = engine(pg_url, clock, "0 2 * * *", "web-1")
    new = engine(pg_url, clock, "0 3 * * *", "web-2", "cluster")
    await old.start()
    await new.start()
    try:
        await days(clock, [old, new], 2)
        assert new.registry.role == "waiting"
        runs = await all_runs(old, "export")
        assert [(f"{r.scheduled_at:%m-%d %H:%M}", r.instance) for r in runs] == [
            ("03-02 02:00", "web-1"), ("03-03 02:00", "web-1")
        ]  # fmt: skip
        assert any("web-2, the last instance to start with its timing \"0 3 * * *\" (UTC), fires nothing (its role is "
                   "waiting)" in r.getMessage() for r in caplog.records)  # fmt: skip
    finally:
        await old.stop()
        await new.stop()


@pytest.mark.postgres
async def test_under_cluster_coordination_nothing_is_left(pg_url: str) -> None:
    """``cluster`` fires each schedule on its shard's owner only: one timing at a time
    already; the owner fires by its own, while the instance of the other timing lives and
    fires too (a rolling deploy that moves a cron: the owner left its shards' schedules to
    the other timing's instance, which does not own them, and nobody fired them for the
    whole deploy: outside attack, code changes between deploys, part two). (Before, the
    other timing's instance here was dead: the owner took the schedule for that reason.)"""
    clock = ManualClock("2026-03-02T00:30:00Z")
    member = engine(pg_url, clock, "0 2 * * *", "web-1", "cluster")
    await member.start()
    try:
        store: Any = member.store
        await store.heartbeat("web-9", "h", 9, clock.now(), Membership("firing", "cluster", clock.now()))
        await member.catalog.store.record_code_timings([("export", "0 3 * * *", "UTC")], clock.now(), instance="web-9")
        await member.fleet_timings.review(clock.now(), force=True)
        assert not member.fleet_timings.leaves("export")
    finally:
        await member.stop()



async def test_a_look_the_store_did_not_answer_is_taken_again_next_round(store_url: str) -> None:
    """A signal heard, then the store unreachable for the look: the next round looks again,
    not a minute later."""
    from backend import Unavailable

    clock = ManualClock("2026-03-02T00:30:00Z")
    member = engine(store_url, clock, "0 2 * * *", "web-1")
    await member.start()
    try:
        await days(clock, [member], 0.01)
        store = member.catalog.store
        real = store.code_timings
        calls: list[str] = []

        async def down() -> Any:
            calls.append("down")
            raise Unavailable("the store is unreachable")

        store.code_timings = down  # type: ignore[method-assign]
        member.fleet_timings.heard("schedules", None)
        with pytest.raises(Unavailable):
            await member.fleet_timings.review(clock.now())
        assert member.fleet_timings.stale and calls == ["down"]

        async def up() -> Any:
            calls.append("up")
            return await real()

        store.code_timings = up  # type: ignore[method-assign]
        await member.fleet_timings.review(clock.now())  # the next round: not a minute later
        # (It looked; whether it is stale again after depends on what the fleet signals
        # meanwhile: on PostgreSQL a notification may land after the look.)
        assert calls == ["down", "up"]
    finally:
        await member.stop()


async def test_the_same_timing_by_another_time_zone_database_is_another_timing(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two machines whose time zone databases differ on a zone (a rolling OS upgrade across
    a change of its rules, as Mexico's end of daylight saving time in 2022) fire one local
    time at two instants: a timing is its expression, its zone and the zone's rules. (One
    process has one database: the second instance's rules are said for it here.)"""
    clock = ManualClock("2026-03-02T00:30:00Z")
    old = engine(store_url, clock, "0 2 * * *", "web-1")
    new = engine(store_url, clock, "0 2 * * *", "web-2")
    mine = new.code_timings()
    new.code_timings = lambda: {name: (cron, zone, "another-tzdata") for name, (cron, zone, _) in mine.items()}  # type: ignore[method-assign]
    assert mine["export"][2] == zone_rules("UTC") != "another-tzdata"
    await old.start()
    await new.start()
    try:
        await days(clock, [old, new], 1)
        assert old.fleet_timings.leaves("export") and not new.fleet_timings.leaves("export")
        assert any("by another time zone database's rules" in r.getMessage() for r in caplog.records)
        assert [r.instance for r in await all_runs(old, "export")] == ["web-2"]
    finally:
        await old.stop()
        await new.stop()


def test_a_zones_rules_digest_says_its_offsets_and_nothing_else() -> None:
    """Zones that keep the same offsets over the span share a digest (Paris and Berlin);
    others do not (London, an hour behind them)."""
    assert zone_rules("Europe/Paris") == zone_rules("Europe/Berlin") != zone_rules("Europe/London")
