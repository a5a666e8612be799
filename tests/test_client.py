"""``connect()`` and ``connect_sync()``: acting on a store from any process, no engine running."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from backend import Engine, ManualClock, RunContext, connect, connect_sync, define_schedule
from backend.errors import NotFound

CALLS: list[str] = []


async def digest(ctx: RunContext) -> None:
    CALLS.append(ctx.trigger)


def schedules() -> list[Any]:
    return [define_schedule(name="digest", cron="0 9 * * *", timezone="Europe/Berlin", handler=digest)]


async def test_connect_lists_fires_and_disables_without_arming_timers(store_url: str) -> None:
    CALLS.clear()
    async with connect(store_url, definitions=schedules(), actor="alice", create=True) as st:
        assert st.engine.timers.wheel.next_at() is None  # nothing armed, nothing fires on the clock
        [view] = await st.schedules.list()
        assert (view.name, view.enabled) == ("digest", True)
        run = await st.schedules.fire("digest")
        assert (run.status, run.trigger) == ("succeeded", "manual") and CALLS == ["manual"]
        view = await st.schedules.disable("digest", note="vendor outage")
        assert view.state_note is not None and (view.state_note.by, view.state_note.note) == ("alice", "vendor outage")
        runs, _ = await st.schedules.runs("digest")
        assert [r.id for r in runs] == [run.id]
        audit = await st.engine.audit.list()
        assert [(e.actor, e.action) for e in audit.entries] == [("alice", "schedule.disable"), ("alice", "schedule.fire")]
    # What it did is in the store for everyone: an engine opened afterwards sees it.
    engine = Engine(schedules(), store_url, clock=ManualClock("2026-03-02T08:00:00Z"))
    await engine.open()
    try:
        assert not engine.is_enabled("digest")
    finally:
        await engine.stop()


async def test_connect_plans_and_runs_a_backfill(store_url: str) -> None:
    CALLS.clear()
    async with connect(store_url, definitions=schedules(), create=True) as st:
        now = st.engine.clock.now()
        plan = await st.schedules.plan_backfill("digest", now - timedelta(days=3), now)
        assert plan.ok and plan.count == 3
        progress = await st.schedules.backfill("digest", now - timedelta(days=3), now)
        assert (progress.state, progress.fired) == ("done", 3) and CALLS == ["manual"] * 3


async def test_without_definitions_a_schedule_is_unknown_and_says_so(store_url: str) -> None:
    with pytest.raises(NotFound, match="no store at"):
        async with connect(store_url):
            pass
    async with connect(store_url, create=True) as st:
        assert await st.schedules.list() == []
        with pytest.raises(NotFound, match='no schedule named "digest"'):
            await st.schedules.fire("digest")


def test_connect_sync_blocks_and_returns_the_same_values(store_url: str) -> None:
    CALLS.clear()
    with connect_sync(store_url, definitions=schedules(), create=True) as st:
        [view] = st.schedules.list()
        assert view.name == "digest"
        run = st.schedules.fire("digest")
        assert run.status == "succeeded"
        assert st.schedules.disable("digest").enabled is False
    with connect_sync(store_url, definitions=schedules()) as st:
        assert st.schedules.get("digest").enabled is False


@pytest.mark.postgres
async def test_connect_on_postgresql(pg_url: str) -> None:
    async with connect(pg_url, definitions=schedules()) as st:
        run = await st.schedules.fire("digest")
        assert run.status == "succeeded"
    async with connect(pg_url, definitions=schedules()) as st:
        assert (await st.schedules.get_run(run.id)).status == "succeeded"
