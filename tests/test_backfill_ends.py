"""How range backfills end, and what they do to the live slots, on both stores.

Every end is recorded in the audit log (``schedule.backfill_end``) with the counts the
ledger holds once every run the backfill started has ended: done, cancelled (after the run
in flight), abandoned by a stop (its run in flight interrupted), or left by a dead instance
and closed by another one's sweep (once, whoever sweeps). A plan says how many live slots
the backfill may skip under the schedule's overlap policy, and a real backfill skips that
many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock, RunContext, define_schedule
from backend.events.audit import AuditEntry, acting_as, os_user
from backend.model import BackfillProgress, Run, RunStatus, Trigger
from backend.store import open_store
from tests.conftest import all_runs


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Overrides conftest's: every engine of a test shares this store."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


class Gate:
    """A handler that blocks until released (or until its engine stops)."""

    def __init__(self, fail_hour: int | None = None) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.fail_hour = fail_hour

    async def __call__(self, ctx: RunContext) -> None:
        self.entered.set()
        if ctx.scheduled_at.hour == self.fail_hour:
            raise ValueError("bad hour")
        await self.release.wait()


def hourly(handler: Any, **kwargs: Any) -> Any:
    return define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=handler, **kwargs)


async def stored(store_url: str) -> tuple[list[AuditEntry], Any]:
    """The audit log (newest first) and the store, read after the engines stopped."""
    store: Any = open_store(store_url)
    await store.open()
    entries = await store.list_audit(limit=20)
    return entries, store


def ends(entries: list[AuditEntry]) -> list[dict[str, Any] | None]:
    return [e.detail for e in entries if e.action == "schedule.backfill_end"]


async def test_a_backfill_that_runs_to_its_end_records_it_with_each_failure(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    gate = Gate(fail_hour=2)
    gate.release.set()
    engine = make_engine([hourly(gate)])
    await engine.open()
    with acting_as("alice"):
        progress = await engine.start_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T03:00:00Z"))
    done = await engine.wait_backfill(progress.id)
    assert (done.state, done.fired, done.failed) == ("done", 3, 1)
    entries = (await engine.audit.list()).entries
    assert [(e.actor, e.action) for e in entries] == [("alice", "schedule.backfill_end"), ("alice", "schedule.backfill")]
    assert entries[0].detail == {"backfill_id": progress.id, "state": "done", "total": 3, "fired": 3, "succeeded": 2,
                                 "failed": 1, "not_fired": 0, "failed_by": {"ValueError": 1}}  # fmt: skip


async def test_cancelling_then_quitting_records_the_run_the_stop_interrupted(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """The console's q, then c (stop it and quit): the cancel is recorded at once, and the
    end once the stop has interrupted the run in flight (it used to say fired=0 failed=0
    while the ledger held that run failed)."""
    gate = Gate()  # never released: the run in flight is still running when the engine stops
    engine = make_engine([hourly(gate)])
    await engine.open()
    progress = await engine.start_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T06:00:00Z"))
    await gate.entered.wait()
    with acting_as("carol"):
        cancelled = await engine.cancel_backfill(progress.id)
    assert (cancelled.state, cancelled.fired, cancelled.remaining) == ("cancelled", 0, 6)
    in_flight = engine.backfills.jobs[progress.id].runs[0].run_id
    await engine.stop(grace=0)

    entries, store = await stored(store_url)
    try:
        assert [(e.actor, e.action) for e in entries] == [
            (os_user(), "schedule.backfill_end"), ("carol", "schedule.backfill_cancel"), (os_user(), "schedule.backfill"),
        ]  # fmt: skip
        assert entries[1].detail == {"backfill_id": progress.id, "finished": 0, "in_flight": in_flight, "not_fired": 5}
        assert entries[0].detail == {"backfill_id": progress.id, "state": "cancelled", "total": 6, "fired": 1,
                                     "succeeded": 0, "failed": 1, "not_fired": 5, "failed_by": {"interrupted": 1}}  # fmt: skip
        run = await store.get_run(in_flight)
        assert (run.status, run.error_tag) == ("failed", "interrupted")  # what the end says, the ledger says
        row = await store.get_backfill(progress.id)
        assert (row.state, row.fired, row.failed, row.remaining) == ("cancelled", 1, 1, 5)
    finally:
        await store.close()


async def test_a_cancelled_backfill_ends_when_its_run_in_flight_ends(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    gate = Gate()
    engine = make_engine([hourly(gate)])
    await engine.open()
    progress = await engine.start_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T06:00:00Z"))
    await gate.entered.wait()
    await engine.cancel_backfill(progress.id)
    assert ends((await engine.audit.list()).entries) == []  # its run is still in flight
    gate.release.set()
    ended = await engine.backfills.ended(progress.id)
    assert (ended.state, ended.fired, ended.failed, ended.remaining) == ("cancelled", 1, 0, 5)
    assert ends((await engine.audit.list()).entries) == [
        {"backfill_id": progress.id, "state": "cancelled", "total": 6, "fired": 1, "succeeded": 1, "failed": 0,
         "not_fired": 5},
    ]  # fmt: skip
    assert (await engine.backfill_progress(progress.id)).fired == 1


async def test_quitting_abandons_a_running_backfill_and_records_how_far_it_got(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """The console's q (quit anyway) with an embedded engine: it used to leave only the
    start in the audit log."""
    gate = Gate()
    engine = make_engine([hourly(gate)])
    await engine.open()
    progress = await engine.start_backfill("job", at("2026-03-01T12:00:00Z"), at("2026-03-02T00:00:00Z"))
    await gate.entered.wait()
    await engine.stop(grace=0)

    entries, store = await stored(store_url)
    try:
        assert ends(entries) == [{"backfill_id": progress.id, "state": "abandoned", "total": 12, "fired": 1,
                                  "succeeded": 0, "failed": 1, "not_fired": 11, "failed_by": {"interrupted": 1}}]  # fmt: skip
        row = await store.get_backfill(progress.id)
        assert (row.state, row.fired, row.failed) == ("abandoned", 1, 1)
    finally:
        await store.close()


async def test_a_dead_instances_backfill_is_closed_once_with_its_ledgers_counts(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """A process killed mid-backfill: two live instances sweep what it left; the backfill
    is closed and its end recorded once, counting its runs as the ledger has them."""
    live = [make_engine([hourly(Gate())], instance=f"live-{n}", abandon_after=30, heartbeat_interval=5) for n in (1, 2)]
    for engine in live:
        await engine.open()
    store = live[0].store
    dead, ids = "far:1", live[0].new_id
    await store.heartbeat(dead, "far-host#0000", 1, clock.now())
    progress = BackfillProgress(id=ids(), name="job", start=at("2026-03-02T00:00:00Z"), end=at("2026-03-02T04:00:00Z"),
                                total=4, fired=1, failed=0, state="running", instance=dead, started_at=clock.now(),
                                current=at("2026-03-02T02:00:00Z"))  # fmt: skip
    await store.start_backfill(progress)

    def ran(hour: int, status: RunStatus, instance: str = dead, trigger: Trigger = "manual") -> Run:
        slot = at(f"2026-03-02T0{hour}:00:00Z")
        return Run(ids(), "job", slot, status, trigger, "manual" if trigger == "manual" else "single", instance,
                   clock.now(), None if status == "running" else clock.now())  # fmt: skip

    store.save_runs([ran(1, "succeeded"), ran(2, "running"), ran(2, "succeeded", trigger="self"),
                     ran(3, "succeeded", instance="live-1")])  # fmt: skip
    await store.flush()
    clock.advance(60)  # its heartbeat is a minute old: it is gone
    await asyncio.gather(*(engine.close_abandoned() for engine in live))
    await asyncio.gather(*(engine.close_abandoned() for engine in live))  # and again: nothing more
    entries = (await live[1].audit.list()).entries
    closing = entries[0].detail
    assert closing is not None
    assert ends(entries) == [{"backfill_id": progress.id, "state": "abandoned", "total": 4, "fired": 2, "succeeded": 1,
                              "failed": 1, "not_fired": 2, "failed_by": {"abandoned": 1},
                              "closed_by": closing["closed_by"]}]  # fmt: skip
    row = await store.get_backfill(progress.id)
    assert row is not None and (row.state, row.fired, row.failed) == ("abandoned", 2, 1)


# ---------------------------------------------------------------------------------------
# the live slots a backfill displaces
# ---------------------------------------------------------------------------------------
def minutely(clock: ManualClock, seconds: float, **kwargs: Any) -> Any:
    async def work(ctx: RunContext) -> None:
        await clock.sleep_until(ctx.fired_at + timedelta(seconds=seconds))

    return define_schedule(name="job", cron="* * * * *", timezone="UTC", handler=work, **kwargs)


async def history(engine: Engine, clock: ManualClock, seconds: list[float]) -> None:
    """Runs of the schedule that took ``seconds`` each (Run now's, an hour ago)."""
    base = clock.now() - timedelta(hours=1)
    rows = []
    for n, took in enumerate(seconds):
        fired = base + timedelta(minutes=5 * n)
        rows.append(Run(engine.new_id(), "job", fired, "succeeded", "manual", "manual", "earlier", fired,
                        fired + timedelta(seconds=took)))  # fmt: skip
    engine.store.save_runs(rows)
    await engine.store.flush()


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("skip", "may skip up to 16 live slots (on_overlap skip): due while it runs (about 16m 40s, 1m 40s a run)"),
        ("queue", "may delay up to 16 live slots (on_overlap queue: fired late, not skipped): due while it runs (about 16m 40s"),
        ("parallel", "16 live slots due while it runs fire beside it (on_overlap parallel; about 16m 40s, 1m 40s a run)"),
    ],
)
async def test_the_plan_says_how_many_live_slots_it_may_displace(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, policy: str, says: str
) -> None:
    engine = make_engine([minutely(clock, 100, on_overlap=policy)])
    await engine.open()
    start, end = at("2026-03-02T07:00:00Z"), at("2026-03-02T07:10:00Z")
    unknown = await engine.plan_backfill("job", start, end)
    assert (unknown.on_overlap, unknown.run_seconds, unknown.live_slots) == (policy, None, None)
    assert "how long it runs is unknown" in (unknown.live_effect() or "")
    await history(engine, clock, [90, 100, 400, 100, 110])  # the median: 100 s a run
    plan = await engine.plan_backfill("job", start, end)
    assert (plan.count, plan.run_seconds, plan.duration_seconds, plan.live_slots) == (10, 100, 1000, 16)
    assert says in (plan.live_effect() or "")
    await engine.set_enabled("job", False)
    assert (await engine.plan_backfill("job", start, end)).live_slots == 0  # a disabled schedule fires none
    refused = await engine.plan_backfill("job", end, start)
    assert refused.live_effect() is None  # nothing to say of a plan that may not start


async def test_quiesce_without_runs_waits_for_a_backfill_between_its_runs(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Between two runs a backfill writes its progress and launches the next: what the
    current time calls for, as a timer's firing, so ``quiesce(runs=False)`` waits for it
    (it returned while a write was on its way: a test moving the clock on meanwhile
    started the next run a step later, and a backfill test failed one run in eight on a
    loaded machine). Here the progress's write takes 200 rounds of the event loop."""
    engine = make_engine([minutely(clock, 0)])
    await engine.start()
    update_backfill = engine.store.update_backfill

    async def slow(progress: BackfillProgress) -> None:
        for _ in range(200):
            await asyncio.sleep(0)
        await update_backfill(progress)

    engine.store.update_backfill = slow  # type: ignore[method-assign]  # (a slow store, on the loop's rounds)
    progress = await engine.start_backfill("job", at("2026-03-02T07:00:00Z"), at("2026-03-02T07:03:00Z"))
    await engine.quiesce(runs=False)
    ended = await engine.backfill_progress(progress.id)
    assert (ended.state, ended.fired) == ("done", 3)


async def test_a_backfill_skips_as_many_live_slots_as_its_plan_said(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    engine = make_engine([minutely(clock, 100)])  # on_overlap skip (the default)
    await engine.open()
    await history(engine, clock, [100, 100, 100])
    await engine.start()
    plan = await engine.plan_backfill("job", at("2026-03-02T07:00:00Z"), at("2026-03-02T07:10:00Z"))
    assert plan.live_slots == 16
    progress = await engine.start_backfill("job", plan.start, plan.end)
    while (ended := await engine.backfill_progress(progress.id)).state == "running":
        clock.advance(10)
        await engine.quiesce(runs=False)
    await engine.quiesce(runs=False)
    assert ended.finished_at is not None
    # The live slots due while its runs ran (the loop may step past its end: a slot after
    # that runs as usual; so may one after its last run ended and before the backfill's end
    # was stamped, which the loop may also step past).
    runs = await all_runs(engine, "job")
    last_ended = max(r.finished_at for r in runs if r.trigger == "manual" and r.finished_at is not None)
    live = [r for r in runs if r.trigger == "self" and r.scheduled_at < last_ended]
    skipped = [r for r in live if r.status == "skipped"]
    assert len(skipped) == plan.live_slots and len(live) == len(skipped)  # every live slot met a backfill run
