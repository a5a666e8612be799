"""The engine on a manual clock: timers, overlap, watchdog, catch-up, operator actions."""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend import (
    BadInput,
    Engine,
    ManualClock,
    NotFound,
    Refused,
    RunContext,
    Unavailable,
    define_schedule,
)
from backend.model import Claim, ClaimResult, Run
from backend.observability.capture import LOG_FORMAT
from backend.runtime.ownthread import in_own_thread
from backend.safetext import TerminalFormatter
from backend.store import open_store
from tests.conftest import all_runs, expect, fail_once
from tests.late_answers import LateAnswer, lapse_and_renew

MakeEngine = Callable[..., Engine]  # the make_engine fixture (tests/conftest.py)

UTC = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def schedule(name: str = "job", cron: str = "* * * * *", handler: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
    async def noop(ctx: RunContext) -> None:
        pass

    return define_schedule(name=name, cron=cron, timezone=kwargs.pop("timezone", "UTC"), handler=handler or noop, **kwargs)


def summary(runs: list[Run]) -> list[tuple[str, str, str]]:
    return [(r.scheduled_at.strftime("%H:%M:%S"), r.status, r.trigger) for r in runs]


# ---------------------------------------------------------------------------------------
# timers
# ---------------------------------------------------------------------------------------
async def test_minute_schedule_fires_each_slot_with_a_full_context(make_engine: MakeEngine, clock: ManualClock) -> None:
    seen: list[RunContext] = []

    async def handler(ctx: RunContext) -> None:
        seen.append(ctx)

    engine = make_engine([schedule(handler=handler, payload={"k": 1}, max_runtime=90)])
    await engine.start()
    await engine.quiesce()
    assert engine.next_fire_at("job") == at("2026-03-02T08:01:00Z")
    for _ in range(3):
        clock.advance(60)
        await engine.quiesce()
    assert [c.scheduled_at for c in seen] == [at("2026-03-02T08:01:00Z"), at("2026-03-02T08:02:00Z"), at("2026-03-02T08:03:00Z")]
    first = seen[0]
    assert (first.name, first.trigger, first.payload) == ("job", "self", {"k": 1})
    assert first.fired_at == at("2026-03-02T08:01:00Z")
    assert first.deadline == first.fired_at + timedelta(seconds=90)
    runs = await all_runs(engine, "job")
    assert [r.id for r in runs] == [c.run_id for c in seen]
    assert {(r.status, r.coordination_outcome, r.instance) for r in runs} == {("succeeded", "single", "test-0")}


async def test_scheduled_at_comes_from_the_cron_not_the_clock(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="*/15 * * * *")])
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:15:00.750Z")  # woke 750 ms late
    await engine.quiesce()
    (run,) = await all_runs(engine, "job")
    assert run.scheduled_at == at("2026-03-02T08:15:00Z")
    assert run.fired_at == at("2026-03-02T08:15:00.750Z")


async def test_a_raising_handler_never_stops_the_chain(make_engine: MakeEngine, clock: ManualClock) -> None:
    async def boom(ctx: RunContext) -> None:
        raise ConnectionRefusedError("smtp refused")

    engine = make_engine([schedule(handler=boom)])
    await engine.start()
    for _ in range(3):
        clock.advance(60)
        await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert [(r.status, r.error_tag, r.error_message) for r in runs] == [("failed", "ConnectionRefusedError", "smtp refused")] * 3
    assert engine.next_fire_at("job") == at("2026-03-02T08:04:00Z")


async def test_sync_handlers_run_on_a_thread(make_engine: MakeEngine, clock: ManualClock) -> None:
    threads: list[str] = []

    def handler(ctx: RunContext) -> None:
        threads.append(threading.current_thread().name)

    engine = make_engine([schedule(handler=handler)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    assert threads == ["schedtui-run-job"]
    assert [r.status for r in await all_runs(engine, "job")] == ["succeeded"]


class EarlyClock(ManualClock):
    """A clock whose first sleep returns at once, as asyncio timers sometimes do."""

    early_wakes = 0

    async def sleep_until(self, deadline: datetime) -> None:
        if self.early_wakes == 0 and deadline > self.now():
            self.early_wakes += 1
            return
        await super().sleep_until(deadline)


async def test_an_early_wake_never_fires_before_the_slot(make_engine: MakeEngine) -> None:
    clock = EarlyClock("2026-03-02T08:00:00Z")
    engine = make_engine([schedule()], clock=clock)
    await engine.start()
    await engine.quiesce()
    assert clock.early_wakes == 1
    assert await all_runs(engine, "job") == []
    clock.advance(60)
    await engine.quiesce()
    assert len(await all_runs(engine, "job")) == 1


async def test_yearly_schedule_waits_through_a_long_gap(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="0 0 1 1 *")])
    await engine.start()
    await engine.quiesce()
    assert engine.next_fire_at("job") == at("2027-01-01T00:00:00Z")
    clock.set("2026-12-31T23:59:59Z")
    await engine.quiesce()
    assert await all_runs(engine, "job") == []
    clock.set("2027-01-01T00:00:00Z")
    await engine.quiesce()
    assert [r.scheduled_at for r in await all_runs(engine, "job")] == [at("2027-01-01T00:00:00Z")]


async def test_a_schedule_with_no_slot_left_has_no_next_firing_and_stops_no_other(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    # The end of the calendar: "last" has one slot left (9999-12-31 00:00 UTC), "none"
    # (midnight at UTC+14) none at all; "minutely" goes on until the end.
    clock.set("9999-12-30T23:58:30Z")
    engine = make_engine(
        [schedule("last", cron="0 0 * * *"), schedule("none", cron="0 0 * * *", timezone="Pacific/Kiritimati"),
         schedule("minutely")]  # fmt: skip
    )
    await engine.start()
    await asyncio.wait_for(engine.quiesce(), 10)
    assert engine.next_fire_at("none") is None
    assert engine.upcoming("none") == []
    assert engine.next_fire_at("last") == at("9999-12-31T00:00:00Z")
    assert engine.upcoming("last") == [at("9999-12-31T00:00:00Z")]
    clock.set("9999-12-31T00:02:00Z")
    await asyncio.wait_for(engine.quiesce(), 10)
    assert [r.scheduled_at for r in await all_runs(engine, "last")] == [at("9999-12-31T00:00:00Z")]
    assert [r.scheduled_at.strftime("%H:%M") for r in await all_runs(engine, "minutely")] == ["23:59", "00:00", "00:01", "00:02"]
    views = {view.name: view for view in await engine.list_schedules()}
    assert views["last"].next_fire_at is None and views["none"].next_fire_at is None
    assert views["minutely"].next_fire_at == at("9999-12-31T00:03:00Z")


async def test_external_schedules_get_no_timer(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(trigger="external")])
    await engine.start()
    clock.advance(600)
    await engine.quiesce()
    assert await all_runs(engine, "job") == []
    assert engine.next_fire_at("job") is None


async def test_dst_fixed_time_fires_once_on_both_transition_days(make_engine: MakeEngine) -> None:
    clock = ManualClock("2026-03-28T12:00:00Z")
    engine = make_engine([schedule(cron="30 2 * * *", timezone="Europe/Berlin")], clock=clock)
    await engine.start()
    for _day in range(2):
        clock.advance(timedelta(days=1))
        await engine.quiesce()
    # 2026-03-29: 02:30 does not exist in Berlin; it fires once at 03:00 CEST (01:00 UTC).
    assert [r.scheduled_at for r in await all_runs(engine, "job")] == [at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]


async def test_long_running_engine_fires_a_fall_back_hour_twice_for_hourly(make_engine: MakeEngine) -> None:
    clock = ManualClock("2026-10-24T23:30:00Z")
    engine = make_engine([schedule(cron="0 * * * *", timezone="Europe/Berlin")], clock=clock)
    await engine.start()
    for _ in range(4):
        clock.advance(3600)
        await engine.quiesce()
    # 02:00 CEST (00:00 UTC) and 02:00 CET (01:00 UTC) are both real instants.
    assert [r.scheduled_at for r in await all_runs(engine, "job")] == [
        at("2026-10-25T00:00:00Z"),
        at("2026-10-25T01:00:00Z"),
        at("2026-10-25T02:00:00Z"),
        at("2026-10-25T03:00:00Z"),
    ]


# ---------------------------------------------------------------------------------------
# overlap
# ---------------------------------------------------------------------------------------
class Gate:
    """A handler that blocks until released; counts how many run at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[datetime] = []
        self.running = 0
        self.most = 0
        self.entered = asyncio.Event()

    async def __call__(self, ctx: RunContext) -> None:
        self.started.append(ctx.scheduled_at)
        self.running += 1
        self.most = max(self.most, self.running)
        self.entered.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1


async def test_overlap_skip_records_a_skipped_run(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap="skip")])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    skipped = expect(engine, lambda r: r.status == "skipped")
    clock.advance(60)
    run = await skipped
    assert run.scheduled_at == at("2026-03-02T08:02:00Z")
    assert run.error_tag == "overlap" and run.error_message and "still in flight" in run.error_message
    gate.release.set()
    await engine.quiesce()
    clock.advance(60)
    await engine.quiesce()
    assert summary(await all_runs(engine, "job")) == [
        ("08:01:00", "succeeded", "self"),
        ("08:02:00", "skipped", "self"),
        ("08:03:00", "succeeded", "self"),
    ]
    assert gate.most == 1


async def test_overlap_queue_runs_in_order_never_concurrently(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap="queue")])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    for _ in range(2):
        clock.advance(60)
        await engine.quiesce(runs=False)
    assert gate.started == [at("2026-03-02T08:01:00Z")]
    gate.release.set()
    await engine.quiesce()
    assert gate.started == [at("2026-03-02T08:01:00Z"), at("2026-03-02T08:02:00Z"), at("2026-03-02T08:03:00Z")]
    assert gate.most == 1
    assert [r.status for r in await all_runs(engine, "job")] == ["succeeded"] * 3


async def test_overlap_queue_a_slot_seen_late_waits_behind_a_run_now_started_meanwhile(make_engine: MakeEngine, clock: ManualClock) -> None:
    """The clock jumps over two slots: the older fires late, the newer is queued behind it.
    A Run now started meanwhile is a run in flight too, so when the older run ends the
    queued slot waits for it, then starts: never beside it, never lost. (The invariants
    machine once took this wait for a slot left without a row: it dated the slot by its
    cron time, not by when the clock reached it.)"""

    async def slow(ctx: RunContext) -> None:
        await clock.sleep_until(ctx.fired_at + timedelta(seconds=200))

    engine = make_engine([schedule(handler=slow, on_overlap="queue", backfill="all", max_runtime=600)])
    await engine.start()
    await engine.quiesce(runs=False)
    clock.advance(150)  # 08:02:30: 08:01 and 08:02 are due at once
    await engine.quiesce(runs=False)
    clock.advance(60)  # 08:03:30
    await engine.quiesce(runs=False)
    manual = await engine.run_now("job")  # its handler returns at 08:06:50
    older_ends = expect(engine, lambda r: r.trigger == "self" and r.status == "succeeded")
    clock.advance(150)  # 08:06:00: 08:01's handler returned at 08:05:50
    await older_ends
    await engine.quiesce(runs=False)
    assert summary(await all_runs(engine, "job")) == [("08:01:00", "succeeded", "self"), ("08:03:30", "running", "manual")]
    queued_starts = expect(engine, lambda r: r.scheduled_at == at("2026-03-02T08:02:00Z"))
    clock.advance(60)  # 08:07:00: the Run now has ended; the queued slot starts
    queued = await queued_starts
    assert (await engine.wait_run(manual.id)).finished_at == at("2026-03-02T08:07:00Z")
    assert (queued.status, queued.trigger, queued.fired_at) == ("running", "self", at("2026-03-02T08:07:00Z"))
    assert summary(await all_runs(engine, "job")) == [  # by id: the queued slot's was made with the older one's
        ("08:01:00", "succeeded", "self"),
        ("08:02:00", "running", "self"),
        ("08:03:30", "succeeded", "manual"),
    ]


async def test_overlap_parallel_starts_at_once(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap="parallel")])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    second = expect(engine, lambda r: r.status == "running" and r.scheduled_at.minute == 2)
    clock.advance(60)
    await second
    await asyncio.sleep(0)
    assert gate.running == 2
    gate.release.set()
    await engine.quiesce()
    assert gate.most == 2


# ---------------------------------------------------------------------------------------
# watchdog
# ---------------------------------------------------------------------------------------
async def test_watchdog_cancels_an_async_handler(make_engine: MakeEngine, clock: ManualClock) -> None:
    cancelled = asyncio.Event()

    async def hang(ctx: RunContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    engine = make_engine([schedule(cron="0 * * * *", handler=hang, max_runtime=120)])
    await engine.start()
    started = expect(engine, lambda r: r.status == "running")
    clock.set("2026-03-02T09:00:00Z")
    await started
    clock.advance(119)
    await engine.quiesce(runs=False)
    assert [r.status for r in await all_runs(engine, "job")] == ["running"]
    timed_out = expect(engine, lambda r: r.status == "failed")
    clock.advance(1)
    run = await timed_out
    await cancelled.wait()
    assert (run.error_tag, run.duration_ms) == ("timeout", 120_000)
    await engine.quiesce()
    assert [(r.status, r.error_tag) for r in await all_runs(engine, "job")] == [("failed", "timeout")]


async def test_a_sync_handler_past_its_deadline_is_a_timeout_and_keeps_its_place(make_engine: MakeEngine, clock: ManualClock) -> None:
    release, entered, finished = threading.Event(), threading.Event(), threading.Event()

    def hang(ctx: RunContext) -> None:
        entered.set()
        release.wait(30)
        finished.set()

    engine = make_engine([schedule(cron="0 * * * *", handler=hang, max_runtime=60)])
    await engine.start()
    clock.set("2026-03-02T09:00:00Z")
    await asyncio.to_thread(entered.wait, 10)
    timed_out = expect(engine, lambda r: r.status == "failed")
    clock.advance(60)
    run = await timed_out
    assert run.error_tag == "timeout"
    assert "runs on until it returns (a thread cannot be stopped), holding its place" in (run.error_message or "")
    # A thread cannot be killed: while it runs on, it is still in flight, so the next slot
    # is skipped (on_overlap="skip") rather than run beside it.
    clock.set("2026-03-02T10:00:00Z")
    await engine.quiesce(runs=False)
    await engine.flush()
    runs = await all_runs(engine, "job")
    assert [(r.status, r.error_tag) for r in runs] == [("failed", "timeout"), ("skipped", "overlap")]
    assert runs[1].error_message is not None and f"run {run.id} (recorded timeout" in runs[1].error_message
    # When it ends on its own, the ledger keeps the timeout, and the next slot runs.
    release.set()
    await asyncio.to_thread(finished.wait, 10)
    await engine.quiesce()
    clock.set("2026-03-02T11:00:00Z")
    await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert [(r.status, r.error_tag) for r in runs] == [("failed", "timeout"), ("skipped", "overlap"), ("succeeded", None)]


# ---------------------------------------------------------------------------------------
# catch-up at boot
# ---------------------------------------------------------------------------------------
async def _seed_last_run(engine: Engine, name: str, slot: datetime) -> None:
    await engine.open()
    engine.store.save_runs(
        [
            Run(
                id=engine.new_id(),
                name=name,
                scheduled_at=slot,
                status="succeeded",
                trigger="self",
                coordination_outcome="single",
                instance="earlier",
                fired_at=slot,
                finished_at=slot,
            )
        ]
    )
    await engine.store.flush()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", [("03-02", "missed"), ("03-03", "missed"), ("03-04", "missed"), ("03-05", "missed")]),
        ("latest", [("03-02", "missed"), ("03-03", "missed"), ("03-04", "missed"), ("03-05", "succeeded")]),
        ("all", [("03-02", "succeeded"), ("03-03", "succeeded"), ("03-04", "succeeded"), ("03-05", "succeeded")]),
    ],
)
async def test_boot_catch_up_policies(make_engine: MakeEngine, clock: ManualClock, policy: str, expected) -> None:  # type: ignore[no-untyped-def]
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    clock.set("2026-03-05T12:00:00Z")
    engine = make_engine([schedule(cron="0 9 * * *", handler=handler, backfill=policy)])
    await _seed_last_run(engine, "job", at("2026-03-01T09:00:00Z"))
    await engine.start()
    await engine.quiesce()
    runs = (await all_runs(engine, "job"))[1:]
    assert [(r.scheduled_at.strftime("%m-%d"), r.status) for r in runs] == expected
    missed_slots = [at(f"2026-03-0{day}T09:00:00Z") for day in (2, 3, 4, 5)]
    assert [r.scheduled_at for r in runs] == missed_slots
    assert fired == {"skip": [], "latest": missed_slots[-1:], "all": missed_slots}[policy]
    assert {r.trigger for r in runs} == {"self"}
    assert engine.next_fire_at("job") == at("2026-03-06T09:00:00Z")


async def test_a_boot_at_a_slot_instant_fires_that_slot_and_records_only_the_late_ones(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The slot due the very instant the engine starts (or takes a cluster shard over) is
    not late: it fires under ``skip`` too (the timer, armed after that instant, would
    not), and only the slots before it are recorded missed."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    clock.set("2026-03-05T09:00:00Z")
    engine = make_engine([schedule(cron="0 9 * * *", handler=handler, backfill="skip")])
    await _seed_last_run(engine, "job", at("2026-03-03T09:00:00Z"))
    await engine.start()
    await engine.quiesce()
    runs = (await all_runs(engine, "job"))[1:]
    assert [(r.scheduled_at.strftime("%m-%d"), r.status) for r in runs] == [("03-04", "missed"), ("03-05", "succeeded")]
    assert fired == [at("2026-03-05T09:00:00Z")]
    assert engine.next_fire_at("job") == at("2026-03-06T09:00:00Z")


@pytest.mark.parametrize("ran_from", ["09:15", "09:45"])
async def test_a_start_after_the_clock_was_stepped_back_fires_no_recorded_slot_again(
    make_engine: MakeEngine, clock: ManualClock, ran_from: str
) -> None:
    """The clock ran fast and fired the slots from ``ran_from`` to 10:00, then NTP stepped
    it back to 09:00:30 before this start: those slots ran already and are passed over;
    the slots before them never ran and fire as usual (passing over everything up to
    10:00 would lose them), and so do those after."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    clock.set("2026-03-02T09:00:30Z")
    engine = make_engine([schedule(cron="*/15 * * * *", handler=handler, backfill="all")])
    ran = list(schedule(cron="*/15 * * * *").cron.occurrences(at(f"2026-03-02T{ran_from}:00Z") - timedelta(seconds=1),
                                                              at("2026-03-02T10:00:00Z")))  # fmt: skip
    for slot in ran:
        await _seed_last_run(engine, "job", slot)
    await engine.start()
    await engine.quiesce()
    for _ in range(7):
        clock.advance(15 * 60)
        await engine.quiesce()
    every = [at(f"2026-03-02T{t}:00Z") for t in ("09:15", "09:30", "09:45", "10:00", "10:15", "10:30", "10:45")]
    assert fired == [slot for slot in every if slot not in ran]
    assert engine.next_fire_at("job") == at("2026-03-02T11:00:00Z")
    runs = await all_runs(engine, "job")
    assert sorted(r.scheduled_at for r in runs) == every  # each slot once


async def test_a_start_after_the_clock_was_stepped_back_catches_up_from_where_it_ran_before_now(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """Found by the engine machine once it stepped the clock back: the schedule ran 08:45 by
    this clock, and 09:15 and 09:30 by the clock before it was stepped back; the instance
    was down over 09:00. The start caught up from the newest recorded slot, 09:30, which
    lies ahead: 09:00 got no row at all. It now catches up from 08:45 (09:00 is recorded
    missed, backfill=skip), and still passes over 09:15 and 09:30."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    clock.set("2026-03-02T09:10:00Z")
    engine = make_engine([schedule(cron="*/15 * * * *", handler=handler, backfill="skip")])
    for slot in ("08:45", "09:15", "09:30"):
        await _seed_last_run(engine, "job", at(f"2026-03-02T{slot}:00Z"))
    await engine.start()
    await engine.quiesce()
    for _ in range(3):
        clock.advance(15 * 60)
        await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert sorted((r.scheduled_at.strftime("%H:%M"), r.status) for r in runs) == [
        ("08:45", "succeeded"), ("09:00", "missed"), ("09:15", "succeeded"), ("09:30", "succeeded"), ("09:45", "succeeded")
    ]  # fmt: skip
    assert fired == [at("2026-03-02T09:45:00Z")]


@pytest.mark.parametrize(("ahead", "warned"), [(0.25, False), (4.0, False), (6.0, True)])
async def test_a_start_warns_of_a_clock_stepped_back_only_past_what_two_clocks_may_differ_by(
    make_engine: MakeEngine, clock: ManualClock, caplog: pytest.LogCaptureFixture, ahead: float, warned: bool
) -> None:
    """Another instance's clock 250 ms ahead fired a slot this one's had not reached when it
    started: a fleet test's log had "was the clock stepped back?" for it. Two clocks may
    differ by twice the limit each is held to (2.5 s of a 30 s window): only past it is it
    a warning; the slot is passed over either way."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    slot = at("2026-03-02T09:00:10Z")
    clock.set(slot - timedelta(seconds=ahead))
    engine = make_engine([schedule(cron="*/10 * * * * *", handler=handler)], abandon_after=30)
    await _seed_last_run(engine, "job", slot)
    with caplog.at_level(logging.INFO, logger="schedtui.engine"):
        await engine.start()
        await engine.quiesce()
    said = [r for r in caplog.records if "newest recorded slot" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING if warned else logging.INFO]
    assert ("was the clock stepped back?" in said[0].getMessage()) == warned
    clock.set(slot + timedelta(seconds=10))
    await engine.quiesce()
    assert fired == [slot + timedelta(seconds=10)]  # the recorded one passed over


async def test_a_deploy_that_changes_a_schedules_timing_catches_up_no_slot_from_before_it(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """As for a stored schedule changed: the catch-up starts from the change, which for
    code is the first start with the new cron or zone (the store records each one's)."""
    clock.set("2026-03-02T08:09:00Z")
    first = make_engine([schedule(cron="10 * * * *", backfill="all")])
    await first.start()
    clock.set("2026-03-02T08:10:00Z")
    await first.quiesce()  # 08:10 fires
    await first.stop()
    clock.set("2026-03-02T08:20:00Z")  # deployed with another cron: 08:15 is past, and was never due
    second = make_engine([schedule(cron="15,25 * * * *", backfill="all")])
    await second.start()
    await second.quiesce()
    await second.stop()
    clock.set("2026-03-02T08:30:00Z")  # 08:25 came due after the change, while none ran
    third = make_engine([schedule(cron="15,25 * * * *", backfill="all")])
    await third.start()
    await third.quiesce()
    assert [r.scheduled_at.strftime("%H:%M") for r in await all_runs(third, "job")] == ["08:10", "08:25"]


async def test_a_deploy_that_only_rewrites_a_schedules_timing_catches_up_what_it_missed(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The same timing written another way (six fields with 0 seconds, the zone ``UTC`` as
    ``Etc/UTC``) was taken for a change: the catch-up started from the deploy, and the slots
    missed while none ran got no run and no ``missed`` row (outside attack: code changes
    between deploys). It is the same timing; the store keeps it as first recorded."""
    clock.set("2026-03-02T08:09:00Z")
    first = make_engine([schedule(cron="10,40 * * * *", backfill="all")])
    await first.start()
    clock.set("2026-03-02T08:10:00Z")
    await first.quiesce()
    await first.stop()
    clock.set("2026-03-02T09:20:00Z")  # down through 08:40 and 09:10
    second = make_engine([schedule(cron="0 10,40 * * * *", timezone="Etc/UTC", backfill="all")])
    await second.start()
    await second.quiesce()
    assert [r.scheduled_at.strftime("%H:%M") for r in await all_runs(second, "job")] == ["08:10", "08:40", "09:10"]
    recorded = (await second.catalog.store.code_timings())["job"]
    assert (recorded.cron, recorded.timezone, recorded.instance) == ("10,40 * * * *", "UTC", second.instance)


async def test_catch_up_walk_is_capped(make_engine: MakeEngine, clock: ManualClock) -> None:
    clock.set("2026-03-02T12:00:30Z")
    engine = make_engine([schedule(cron="* * * * *", backfill="skip")], catch_up_limit=1000)
    await _seed_last_run(engine, "job", at("2026-02-20T00:00:00Z"))
    await engine.start()
    await engine.quiesce()
    missed = [r for r in await all_runs(engine, "job") if r.status == "missed"]
    assert len(missed) == 1000
    assert max(r.scheduled_at for r in missed) == at("2026-03-02T12:00:00Z")  # the newest are kept


@pytest.mark.parametrize("backfill", ["latest", "skip"])
async def test_a_running_engine_far_behind_handles_the_newest_slots(make_engine: MakeEngine, clock: ManualClock, backfill: str) -> None:
    """Found by an outside attack (2 of 2): a serve whose clock stepped a day ahead (a VM
    resumed after a night) walked forward from its armed slot, so the 1,000 *oldest* slots
    were handled: ``latest`` fired a run for a slot hours old, and the current slots were
    skipped beside it."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    engine = make_engine([schedule(cron="* * * * *", handler=handler, backfill=backfill)], catch_up_limit=1000)
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-03T08:00:30Z")  # a day on: 1,440 slots behind
    await engine.quiesce()
    runs = await all_runs(engine, "job")
    missed = sorted(r.scheduled_at for r in runs if r.status == "missed")
    assert len(missed) == 999 and missed[-1] == at("2026-03-03T07:59:00Z")  # the newest thousand, less the one fired
    assert fired == [at("2026-03-03T08:00:00Z")]  # the newest, as a live engine behind fires it; never one hours old
    clock.set("2026-03-03T08:01:00Z")
    await engine.quiesce()
    assert fired[-1] == at("2026-03-03T08:01:00Z")  # on its timer again


async def test_catch_up_finishes_before_the_live_timer_arms(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    clock.set("2026-03-02T08:00:30Z")
    engine = make_engine([schedule(cron="* * * * *", handler=gate, backfill="all", on_overlap="parallel")])
    await _seed_last_run(engine, "job", at("2026-03-02T07:57:00Z"))
    await engine.start()
    await gate.entered.wait()
    assert engine.next_fire_at("job") == at("2026-03-02T08:01:00Z")  # not armed: computed
    clock.set("2026-03-02T08:01:00Z")
    await engine.quiesce(runs=False)
    assert gate.running == 1
    gate.release.set()
    await engine.quiesce()
    assert gate.most == 1  # even with on_overlap=parallel: the catch-up's runs one at a time, in order
    # (the timer's 08:01 after the catch-up's last run has started)
    assert gate.started == [at("2026-03-02T07:58:00Z"), at("2026-03-02T07:59:00Z"), at("2026-03-02T08:00:00Z"), at("2026-03-02T08:01:00Z")]


def count_claims(engine: Engine) -> list[int]:
    """From now on, the size of each claim batch the engine sends its store."""
    claims: list[int] = []
    claim = engine.store.claim

    async def counting_claims(batch: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        claims.append(len(batch))
        return await claim(batch, instance, now)

    engine.store.claim = counting_claims  # type: ignore[method-assign,assignment]  # counts the batches (a function for a method)
    return claims


@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_boot_reads_where_every_schedule_left_off_in_one_query(
    make_engine: MakeEngine, clock: ManualClock, coordination: str
) -> None:
    # A thousand schedules starting (or a shard of them taken over) used to cost a thousand
    # reads and a thousand claims (on PostgreSQL, a transaction each); each still catches
    # up from its own last slot.
    clock.set("2026-03-02T12:00:30Z")
    schedules = [schedule(name=f"s{i:02d}", cron="* * * * *", backfill="skip") for i in range(30)]
    engine = make_engine(schedules, coordination=coordination)
    await engine.open()
    for i in range(0, 30, 2):  # the even ones ran i minutes before now; the odd ones never
        await _seed_last_run(engine, f"s{i:02d}", at("2026-03-02T12:00:00Z") - timedelta(minutes=i))
    reads: list[list[str]] = []
    last_slots = engine.store.last_slots

    async def counting(names: Any, *, until: datetime | None = None) -> dict[str, datetime]:
        reads.append(sorted(names))
        return await last_slots(names, until=until)

    engine.store.last_slots = counting  # type: ignore[method-assign]
    claims = count_claims(engine)
    await engine.start()
    await engine.quiesce()
    assert reads == [sorted(s.name for s in schedules)]
    assert claims == ([] if coordination == "single" else [sum(range(0, 30, 2))])  # one claim for every missed slot
    for i in range(30):
        missed = [r for r in await all_runs(engine, f"s{i:02d}") if r.status == "missed"]
        assert len(missed) == (i if i % 2 == 0 else 0), f"s{i:02d}"
        assert engine.next_fire_at(f"s{i:02d}") == at("2026-03-02T12:01:00Z")


async def test_a_new_schedule_has_nothing_to_catch_up(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(backfill="all")])
    await engine.start()
    await engine.quiesce()
    assert await all_runs(engine, "job") == []


async def test_live_engine_behind_fires_the_current_slot(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="*/10 * * * * *", backfill="skip")])
    await engine.start()
    await engine.quiesce()
    clock.advance(35)  # a suspended VM: three slots passed at once
    await engine.quiesce()
    assert summary(await all_runs(engine, "job")) == [
        ("08:00:10", "missed", "self"),
        ("08:00:20", "missed", "self"),
        ("08:00:30", "succeeded", "self"),
    ]
    assert engine.next_fire_at("job") == at("2026-03-02T08:00:40Z")


@pytest.mark.parametrize(
    ("overlap", "backfill", "expected"),
    [
        # skip: the slot that fires when the engine finds itself behind is skipped like any
        # other while 08:01 is in flight.
        ("skip", "skip", [("08:01:00", "succeeded"), ("08:02:00", "missed"), ("08:03:00", "skipped")]),
        # queue: the caught-up slots wait for 08:01, then run one at a time, in order.
        ("queue", "all", [("08:01:00", "succeeded"), ("08:02:00", "succeeded"), ("08:03:00", "succeeded")]),
    ],
)
async def test_an_engine_behind_keeps_the_overlap_policy_for_the_slots_it_catches_up(
    make_engine: MakeEngine, clock: ManualClock, overlap: str, backfill: str, expected: list[tuple[str, str]]
) -> None:
    """Found by the state machine (tests/test_invariants.py): the catch-up of an engine that
    found itself behind started its slots whatever was in flight."""
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap=overlap, backfill=backfill)])
    await engine.start()
    clock.advance(60)  # 08:01 runs, and holds
    await gate.entered.wait()
    clock.advance(150)  # 08:03:30: a suspended VM; 08:02 and 08:03 passed at once
    await engine.quiesce(runs=False)
    assert gate.running == 1
    gate.release.set()
    await engine.quiesce()
    assert gate.most == 1
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    assert [(r.scheduled_at.strftime("%H:%M:%S"), r.status) for r in runs] == expected
    assert [slot.strftime("%H:%M") for slot in gate.started] == [slot[:5] for slot, status in expected if status == "succeeded"]


async def test_a_schedule_disabled_while_due_slots_are_claimed_does_not_stop_the_timers(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """Found by the state machine: a schedule found behind was disarmed (disabled) while the
    timer loop awaited the claim of another schedule's due slot; the loop then failed on it
    (KeyError) and died, and nothing fired any more."""
    from backend.scheduler.coordination.slots import ClaimCoordinator

    class SlowClaims(ClaimCoordinator):
        def __init__(self, store: Any) -> None:
            super().__init__(store)
            self.waiting = asyncio.Event()
            self.release = asyncio.Event()

        async def claim(self, claims, instance, now):  # type: ignore[no-untyped-def]
            self.waiting.set()
            await self.release.wait()
            return await super().claim(claims, instance, now)

    fired: list[str] = []

    def handler_for(name: str) -> Any:
        async def handler(ctx: RunContext) -> None:
            fired.append(f"{name} {ctx.scheduled_at:%H:%M:%S}")

        return handler

    engine = make_engine([schedule("minute", handler=handler_for("minute")), schedule("ten", "*/10 * * * * *", handler=handler_for("ten"))])
    claims = SlowClaims(engine.store)
    engine.coordinator = claims
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:01:05Z")  # "minute" is due; "ten" is behind (08:00:10 ... 08:01:00)
    await claims.waiting.wait()
    await engine.set_enabled("ten", False)
    claims.release.set()
    clock.set("2026-03-02T08:02:00Z")
    # A dead timer loop never parks again: the timeout only bounds that failure.
    await asyncio.wait_for(engine.quiesce(), 10)
    assert fired == ["minute 08:01:00", "minute 08:02:00"]


@pytest.mark.parametrize("stop", [False, True])
@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_slots_held_by_a_catch_up_are_recorded_when_the_schedule_is_disabled_meanwhile(
    make_engine: MakeEngine, clock: ManualClock, coordination: str, stop: bool
) -> None:
    """Found by the state machine: a catch-up held the schedule's timer until its last run
    ended; the slots due meanwhile were handled when it re-armed. Disabled before that, the
    schedule was not re-armed, and those slots (due while it was enabled) got no row. (A
    skip schedule's timer is armed again once the last run has started: the slot due while
    it runs is skipped, as the timer's would be.)"""
    gate = Gate()
    engine = make_engine([schedule(handler=gate)], coordination=coordination)
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:02:30Z")  # behind: 08:01 missed, 08:02 runs (and holds)
    await gate.entered.wait()
    clock.set("2026-03-02T08:03:30Z")  # 08:03 comes due while the catch-up holds the timer
    await engine.quiesce(runs=False)
    await engine.set_enabled("job", False)
    if stop:  # and stopped before the catch-up ends: the next start would not look for 08:03
        await engine.stop(grace=0)
        engine = make_engine([schedule()], coordination=coordination)
        await engine.open()
    gate.release.set()
    await engine.quiesce()
    clock.set("2026-03-02T08:06:00Z")
    await engine.quiesce()
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    assert [(r.scheduled_at.strftime("%H:%M"), r.status) for r in runs] == [
        ("08:01", "missed"),
        ("08:02", "failed" if stop else "succeeded"),
        ("08:03", "skipped"),  # due while enabled, while 08:02 ran; nothing after the disable
    ]


@pytest.mark.parametrize("on_overlap", ["skip", "parallel"])
@pytest.mark.parametrize("backfill", ["skip", "latest", "all"])
@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_after_a_catch_up_a_schedule_whose_runs_outlast_its_interval_is_on_its_timer_again(
    make_engine: MakeEngine, clock: ManualClock, coordination: str, backfill: str, on_overlap: str
) -> None:
    """Found by an outside attack: a catch-up waited for the run it fired; the slots due
    meanwhile came due behind it and were caught up in turn (recorded missed, the newest
    fired late), after each run, for good: a skip schedule whose runs outlast its interval
    never came back to its timer after a restart, a pause or a shard's take-over. A
    ``parallel`` one, the same: its slots due during that run are the timer's, on time."""
    release, entered = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        if ctx.scheduled_at == at("2026-03-02T08:02:00Z"):  # the catch-up's last run outlasts the interval
            entered.set()
            await release.wait()

    engine = make_engine([schedule(handler=handler, backfill=backfill, on_overlap=on_overlap)], coordination=coordination)
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:02:30Z")  # behind: a catch-up fires the newest slot, 08:02 (all: 08:01 first)
    await entered.wait()
    for minute in (3, 4, 5):  # each due while 08:02 still runs
        clock.set(f"2026-03-02T08:0{minute}:00Z")
        await engine.quiesce(runs=False)
    release.set()
    await engine.quiesce()
    clock.set("2026-03-02T08:06:00Z")
    await engine.quiesce()
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    beside = "skipped" if on_overlap == "skip" else "succeeded"  # the overlap policy's: never "missed"
    assert [(r.scheduled_at.strftime("%H:%M"), r.status) for r in runs] == [
        ("08:01", "succeeded" if backfill == "all" else "missed"),
        ("08:02", "succeeded"),
        ("08:03", beside),
        ("08:04", beside),
        ("08:05", beside),
        ("08:06", "succeeded"),  # on time again
    ]
    for run in runs[2:]:  # the timer's, never late
        assert run.fired_at == run.scheduled_at, run


@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_a_schedule_re_enabled_during_a_catch_up_records_each_slot_once(
    make_engine: MakeEngine, clock: ManualClock, coordination: str
) -> None:
    """Found by the state machine: disabled, re-enabled (its timer armed again) and disabled
    again while a catch-up held it, a schedule got a second row for the slot its timer had
    fired, and rows for slots that passed while it was disabled."""
    gate = Gate()
    engine = make_engine([schedule(handler=gate)], coordination=coordination)
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:02:30Z")  # behind: 08:01 missed, 08:02 runs (and holds)
    await gate.entered.wait()
    for moment, enabled in (("08:03:30", False), ("08:04:30", True), ("08:05:30", False)):
        clock.set(f"2026-03-02T{moment}Z")
        await engine.quiesce(runs=False)
        await engine.set_enabled("job", enabled)
    gate.release.set()
    await engine.quiesce()
    clock.set("2026-03-02T08:07:00Z")
    await engine.quiesce()
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    assert [(r.scheduled_at.strftime("%H:%M"), r.status) for r in runs] == [
        ("08:01", "missed"),
        ("08:02", "succeeded"),
        ("08:03", "skipped"),  # the timer's (armed once 08:02 started), due before the first disable
        ("08:05", "skipped"),  # the timer's again, while 08:02 still ran; 08:04 was disabled
    ]


async def test_a_catch_up_started_by_a_re_enabled_timer_leaves_the_first_ones_slots_alone(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """Found by the state machine: paused (disabled and enabled again) while a catch-up
    held it, a schedule's re-armed timer found itself behind and started a second
    catch-up, which took over the first one's note of the disable: the slots the first
    one held before the disable got no row."""
    gate = Gate()
    engine = make_engine([schedule(handler=gate, backfill="all")])
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-02T08:03:30Z")  # behind: 08:01, 08:02, 08:03 to fire in order; 08:01 holds
    await gate.entered.wait()
    clock.set("2026-03-02T08:04:30Z")  # 08:04 comes due while the catch-up holds the timer
    await engine.quiesce(runs=False)
    await engine.set_enabled("job", False)
    await engine.set_enabled("job", True)  # armed again, for 08:05
    clock.set("2026-03-02T08:06:30Z")  # the timer is behind: a second catch-up (08:05, 08:06)
    await engine.quiesce(runs=False)
    gate.release.set()
    await engine.quiesce()
    clock.set("2026-03-02T08:07:00Z")
    await engine.quiesce()
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    assert [(r.scheduled_at.strftime("%H:%M"), r.status) for r in runs] == [
        ("08:01", "succeeded"),
        ("08:02", "succeeded"),
        ("08:03", "succeeded"),
        ("08:04", "missed"),  # held by the first catch-up, due before the pause
        ("08:05", "skipped"),  # the second's, while 08:01 still ran
        ("08:06", "skipped"),
        ("08:07", "succeeded"),
    ]


@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_a_queue_catch_up_keeps_slot_order_with_the_timers_slots(
    make_engine: MakeEngine, clock: ManualClock, coordination: str
) -> None:
    """Found by the state machine (2,000 examples): a catch-up of a ``queue`` schedule ran
    its slots one by one; a timer slot queued meanwhile (the schedule paused and armed
    again) started as soon as the catch-up's run ended, ahead of the catch-up's older
    slots. The catch-up's slots now join the queue in slot order."""
    gate = Gate()
    clock.set("2026-03-02T08:00:30Z")
    engine = make_engine([schedule(handler=gate, on_overlap="queue", backfill="all")], coordination=coordination)
    await _seed_last_run(engine, "job", at("2026-03-02T07:57:00Z"))
    await engine.start()
    await gate.entered.wait()  # 07:58 runs; 07:59 and 08:00 wait their turn
    await engine.set_enabled("job", False)
    await engine.set_enabled("job", True)  # armed again, for 08:01
    clock.set("2026-03-02T08:01:00Z")  # 08:01 queues
    await engine.quiesce(runs=False)
    gate.release.set()
    await engine.quiesce()
    assert [slot.strftime("%H:%M") for slot in gate.started] == ["07:58", "07:59", "08:00", "08:01"]
    assert gate.most == 1
    runs = sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)
    assert [(r.scheduled_at.strftime("%H:%M"), r.status) for r in runs][1:] == [
        (m, "succeeded") for m in ("07:58", "07:59", "08:00", "08:01")
    ]


async def test_schedules_found_behind_together_claim_their_slots_together(make_engine: MakeEngine, clock: ManualClock) -> None:
    # A stalled process finds its whole burst behind: one claim for all their slots, not
    # one per schedule (on PostgreSQL, a transaction each, when it can least afford them).
    engine = make_engine(
        [schedule(name=f"s{i:02d}", cron="*/10 * * * * *", backfill="skip") for i in range(20)], coordination="advisoryLock"
    )
    await engine.start()
    await engine.quiesce()
    claims = count_claims(engine)
    clock.advance(35)  # a suspended VM: three slots of each passed at once
    await engine.quiesce()
    assert claims == [20 * 3]
    for i in range(20):
        assert summary(await all_runs(engine, f"s{i:02d}")) == [
            ("08:00:10", "missed", "self"), ("08:00:20", "missed", "self"), ("08:00:30", "succeeded", "self"),
        ]  # fmt: skip


CLAIMED_SLOT = at("2026-03-02T08:00:01Z")


async def stop_with_a_claim_on_its_way(
    engine: Engine, clock: ManualClock, grace: float, *, lapse: bool = False, advance: float = 1
) -> asyncio.Future[None]:
    """Start ``engine``, let its claim of the slots ``advance`` seconds bring commit with
    the answer held, begin ``stop(grace)`` (after the lease lapsed and was renewed, with
    ``lapse``), and hand the answer back once the stop has asked its loops to stop.
    Returns the stop, under way."""
    await engine.start()
    await engine.quiesce()
    engine.store.claim = late = LateAnswer(engine.store.claim)  # type: ignore[method-assign]  # answers late
    clock.advance(advance)
    await late.committed()
    if lapse:
        lapse_and_renew(engine)
    stopping = asyncio.ensure_future(engine.stop(grace))
    while not any(task.cancelling() for task in engine.loops.tasks):
        await asyncio.sleep(0)  # until the stop has asked its loops to stop
    late.let_go()
    return stopping


async def runs_after_the_stop(store_url: str, slots: Sequence[datetime] = (CLAIMED_SLOT,)) -> list[Run]:
    """The runs of "tick" at ``slots``, read from the store the stopped engine closed."""
    store = open_store(store_url)
    await store.open()
    try:
        return sorted((r for r in await store.list_runs("tick", limit=50) if r.scheduled_at in slots), key=lambda r: r.scheduled_at)
    finally:
        await store.close()


def recording(fired: list[datetime]) -> Callable[[RunContext], Awaitable[None]]:
    async def tick(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    return tick


async def test_a_stop_while_a_claim_is_on_its_way_records_what_it_won_as_missed(
    make_engine: MakeEngine, clock: ManualClock, store_url: str
) -> None:
    # The claim committed, its answer was still on the way when the engine stopped: its
    # run rows stayed "running" for good (a CI run of the cluster fleet test found one).
    engine = make_engine([schedule(name="tick", cron="* * * * * *")], coordination="advisoryLock")
    await (await stop_with_a_claim_on_its_way(engine, clock, 0))
    assert [(r.status, r.error_message) for r in await runs_after_the_stop(store_url)] == [
        ("missed", "not fired: the engine stopped while this slot was being claimed")
    ]


async def test_a_graceful_stop_while_a_claim_is_on_its_way_runs_what_it_won_within_the_grace(
    make_engine: MakeEngine, clock: ManualClock, store_url: str
) -> None:
    # A rolling restart: SIGTERM lands while this instance's claim of a slot is on its way.
    # The other instances lost that slot to this one: recorded missed, it would run nowhere.
    # The stop's grace covers it as it covers the runs in flight (a fleet test saw one).
    fired: list[datetime] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def tick(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)
        started.set()
        await release.wait()  # still running when the stop begins to wait for its runs

    engine = make_engine([schedule(name="tick", cron="* * * * * *", handler=tick)], coordination="advisoryLock")
    stopping = await stop_with_a_claim_on_its_way(engine, clock, 30)
    either: list[asyncio.Future[Any]] = [stopping, asyncio.ensure_future(started.wait())]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    assert fired == [CLAIMED_SLOT]
    assert not stopping.done()  # the stop waits for it, within its grace
    release.set()
    await stopping
    assert fired == [CLAIMED_SLOT]
    runs = await runs_after_the_stop(store_url)
    assert [(r.status, r.trigger, r.coordination_outcome) for r in runs] == [("succeeded", "self", "wonLock")]


async def test_a_graceful_stop_records_a_slot_claimed_as_its_lease_lapsed_missed_not_fired(
    make_engine: MakeEngine, clock: ManualClock, store_url: str
) -> None:
    # The same, but the lease lapsed while the claim was on its way: another instance may
    # take the run over, so the grace does not start it.
    fired: list[datetime] = []
    engine = make_engine([schedule(name="tick", cron="* * * * * *", handler=recording(fired))], coordination="advisoryLock")
    await (await stop_with_a_claim_on_its_way(engine, clock, 30, lapse=True))
    assert CLAIMED_SLOT not in fired
    assert [(r.status, r.error_message) for r in await runs_after_the_stop(store_url)] == [
        ("missed", "not fired: this instance's lease lapsed while this slot was being claimed")
    ]


async def test_a_graceful_stop_while_a_catch_ups_claim_is_on_its_way_fires_its_current_slot_only(
    make_engine: MakeEngine, clock: ManualClock, store_url: str
) -> None:
    # A catch-up's claim holds slots its policy records missed, and the ones it fires run
    # one after another; cut short by the stop, the older ones are what a catch-up had not
    # started yet (recorded missed). Its current slot is the timer's: the other instances
    # lost it to this one, so recorded missed it would run nowhere (the engine's state
    # machine found a restart stopped again during its start's catch-up doing so).
    fired: list[datetime] = []
    engine = make_engine([schedule(name="tick", cron="*/10 * * * * *", handler=recording(fired), backfill="all")],
                         coordination="advisoryLock")  # fmt: skip
    await (await stop_with_a_claim_on_its_way(engine, clock, 30, advance=35))  # found behind: a catch-up
    current = at("2026-03-02T08:00:30Z")
    assert fired == [current]
    slots = [at(f"2026-03-02T08:00:{s}Z") for s in (10, 20, 30)]
    why = "not fired: the engine stopped while this slot was being claimed"
    assert [(r.scheduled_at, r.status, r.error_message) for r in await runs_after_the_stop(store_url, slots)] == [
        (slots[0], "missed", why), (slots[1], "missed", why), (current, "succeeded", None),
    ]


@pytest.mark.parametrize(("backfill", "fires"), [("skip", False), ("latest", True)])
async def test_a_graceful_stop_cutting_a_starts_catch_up_short_starts_only_what_its_policy_fires(
    make_engine: MakeEngine, clock: ManualClock, store_url: str, backfill: str, fires: bool
) -> None:
    # At a start 5 s after its newest missed slot (late: not the timer's), a catch-up fires
    # that slot by "latest" and records it missed by "skip"; a stop cutting its claim short
    # starts it only in the first case (a late firing "skip" was chosen to avoid).
    fired: list[datetime] = []
    clock.set("2026-03-02T08:00:35Z")
    engine = make_engine([schedule(name="tick", cron="*/10 * * * * *", handler=recording(fired), backfill=backfill)],
                         coordination="advisoryLock")  # fmt: skip
    await _seed_last_run(engine, "tick", at("2026-03-02T08:00:00Z"))
    engine.store.claim = late = LateAnswer(engine.store.claim)  # type: ignore[method-assign]  # answers late
    await engine.start()
    await late.committed()
    stopping = asyncio.ensure_future(engine.stop(30))
    while not any(task.cancelling() for task in engine.loops.tasks):
        await asyncio.sleep(0)  # until the stop has asked its loops to stop
    late.let_go()
    await stopping
    newest = at("2026-03-02T08:00:30Z")
    assert fired == ([newest] if fires else [])
    runs = await runs_after_the_stop(store_url, [at(f"2026-03-02T08:00:{s}Z") for s in (10, 20, 30)])
    assert [r.status for r in runs] == ["missed", "missed", "succeeded" if fires else "missed"]


async def test_a_slot_claimed_under_a_lease_that_lapsed_while_the_answer_was_on_its_way_is_missed_not_fired(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    # The claim committed; its answer came back after the lease lapsed and was renewed (a
    # partition that healed, a frozen process): another instance may have taken the run
    # over in between, so its handler must not start here under the new epoch.
    fired: list[datetime] = []

    async def tick(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    engine = make_engine([schedule(name="tick", cron="* * * * * *", handler=tick)], coordination="advisoryLock")
    await engine.start()
    await engine.quiesce()
    engine.store.claim = late = LateAnswer(engine.store.claim)  # type: ignore[method-assign]  # answers late
    clock.advance(1)
    await late.committed()
    lapse_and_renew(engine)
    late.let_go()
    await engine.quiesce()
    slot = at("2026-03-02T08:00:01Z")
    runs = [r for r in await all_runs(engine, "tick") if r.scheduled_at == slot]
    assert [(r.status, r.error_message) for r in runs] == [
        ("missed", "not fired: this instance's lease lapsed while this slot was being claimed")
    ]
    assert slot not in fired
    clock.advance(1)  # the next slot fires as usual
    await engine.quiesce()
    assert fired[-1] == at("2026-03-02T08:00:02Z")


async def test_slots_queued_behind_a_run_when_the_lease_lapses_never_start_under_it(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """Found by an outside tester with SIGSTOP: a slot queued (``queue``) behind a run was
    claimed under the lease; frozen past its bound, the instance came back, renewed it, and
    started the queued slot once the run ended, beside the run another instance had started
    since (it had closed this one abandoned)."""
    gate = Gate()
    engine = make_engine([schedule(name="q", cron="* * * * * *", handler=gate, on_overlap="queue")],
                         coordination="advisoryLock")  # fmt: skip
    await engine.start()
    await engine.quiesce()
    clock.advance(1)
    await gate.entered.wait()
    clock.advance(1)  # queued behind the run in flight
    await engine.quiesce(runs=False)
    lapse_and_renew(engine)
    gate.release.set()
    await engine.quiesce()
    queued = at("2026-03-02T08:00:02Z")
    assert queued not in gate.started
    [run] = [r for r in await all_runs(engine, "q") if r.scheduled_at == queued]
    assert (run.status, run.error_message) == ("missed", "not started: this instance's lease lapsed while this slot was queued")
    clock.advance(1)  # the next slot fires as usual
    await engine.quiesce()
    assert gate.started[-1] == at("2026-03-02T08:00:03Z")


async def test_catch_ups_overlapping_after_pauses_never_fire_a_slot_twice(make_engine: MakeEngine, clock: ManualClock) -> None:
    """Found by the state machine: paused during a catch-up, a schedule is armed again and
    may start another catch-up while the first still runs. One that ended while a newer
    one held the schedule re-armed it from its own, older, last slot, and the slots after
    it were caught up a second time."""
    release: dict[int, asyncio.Event] = {}
    fired: list[int] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at.minute)
        await release.setdefault(ctx.scheduled_at.minute, asyncio.Event()).wait()

    def free(minute: int) -> None:
        release.setdefault(minute, asyncio.Event()).set()

    engine = make_engine([schedule(handler=handler, backfill="all", on_overlap="parallel")])
    await engine.start()
    await engine.quiesce()
    for moment in ("08:02:30", "08:04:30"):  # each time behind: a catch-up, then a pause
        clock.set(f"2026-03-02T{moment}Z")
        await engine.quiesce(runs=False)
        await engine.set_enabled("job", False)
        await engine.set_enabled("job", True)
    clock.set("2026-03-02T08:06:30Z")  # behind once more, unpaused
    await engine.quiesce(runs=False)
    assert fired == [1, 3, 5]  # three catch-ups at once: (1, 2), (3, 4), (5, 6)
    free(3)
    free(4)  # the middle one ends while the newest holds the schedule
    await engine.quiesce(runs=False)
    for minute in range(1, 8):
        free(minute)
    await engine.quiesce()
    clock.set("2026-03-02T08:07:00Z")
    await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert sorted(r.scheduled_at.minute for r in runs) == [1, 2, 3, 4, 5, 6, 7]
    assert sorted(fired) == [1, 2, 3, 4, 5, 6, 7]


# ---------------------------------------------------------------------------------------
# crash, stop, retention
# ---------------------------------------------------------------------------------------
async def test_a_run_left_running_by_a_dead_process_is_closed_as_abandoned(make_engine: MakeEngine, clock: ManualClock) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    first = make_engine([schedule()], instance="crashed")
    await first.open()
    await first.store.heartbeat("crashed", first.host, dead_pid, clock.now())
    first.store.save_runs(
        [Run(id=first.new_id(), name="job", scheduled_at=clock.now(), status="running", trigger="self",
             coordination_outcome="single", instance="crashed", fired_at=clock.now())]
    )
    await first.store.flush()
    second = make_engine([schedule()], instance="survivor")
    await second.open()
    (run,) = await all_runs(second, "job")
    assert (run.status, run.error_tag) == ("failed", "abandoned")
    assert str(dead_pid) in (run.error_message or "")


async def test_a_live_instance_run_is_not_abandoned(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    first = make_engine([schedule(handler=gate)], instance="alive")
    await first.start()
    clock.advance(60)
    await gate.entered.wait()
    await first.quiesce(runs=False)  # it has sent its heartbeat for the new time
    second = make_engine([schedule()], instance="other")
    await second.open()
    assert [r.status for r in await all_runs(second, "job")] == ["running"]
    gate.release.set()


async def test_stop_waits_for_runs_in_flight(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate)])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    stopping = asyncio.ensure_future(engine.stop(grace=30))
    await asyncio.sleep(0)
    assert not stopping.done()
    gate.release.set()
    await stopping
    reopened = make_engine([schedule()])
    await reopened.open()
    assert [r.status for r in await all_runs(reopened, "job")] == ["succeeded"]


async def test_stop_without_grace_records_runs_in_flight_as_interrupted(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap="queue")])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    clock.advance(60)  # queued behind the first
    await engine.quiesce(runs=False)
    await engine.stop(grace=0)
    reopened = make_engine([schedule()])
    await reopened.open()
    assert [(r.status, r.error_tag) for r in await all_runs(reopened, "job")] == [("failed", "interrupted"), ("missed", None)]


@pytest.mark.parametrize("coordination", ["single", "advisoryLock"])
async def test_stop_records_the_slots_a_catch_up_had_not_started_yet(
    make_engine: MakeEngine, clock: ManualClock, store_url: str, coordination: str
) -> None:
    """Found by the state machine: a catch-up firing its slots in order was cancelled by
    stop() and its later slots were left without a row (single) or with their claim's
    placeholder row left ``running`` (advisoryLock)."""
    gate = Gate()
    clock.set("2026-03-02T08:00:30Z")
    engine = make_engine([schedule(handler=gate, backfill="all")], coordination=coordination)
    await _seed_last_run(engine, "job", at("2026-03-02T07:57:00Z"))
    await engine.start()
    await gate.entered.wait()  # 07:58 runs; 07:59 and 08:00 wait their turn
    await engine.stop(grace=0)
    ledger = open_store(store_url)  # as it was left, before anyone closes abandoned runs
    await ledger.open()
    try:
        assert await ledger.running_runs() == []
        runs = sorted((await ledger.list_runs("job", limit=10))[:-1], key=lambda r: r.scheduled_at)
    finally:
        await ledger.close()
    assert [(r.scheduled_at.strftime("%H:%M"), r.status, r.error_tag) for r in runs] == [
        ("07:58", "failed", "interrupted"),
        ("07:59", "missed", None),
        ("08:00", "missed", None),
    ]
    assert "stopped" in (runs[1].error_message or "")


async def test_retention_prunes_old_runs(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="0 * * * *")], retention=timedelta(days=1))
    await engine.start()
    for _ in range(30):
        clock.advance(3600)
        await engine.quiesce()
    await engine.maintain()
    runs = await all_runs(engine, "job")
    assert 23 <= len(runs) <= 25
    assert min(r.scheduled_at for r in runs) >= clock.now() - timedelta(days=1, hours=1)


async def test_retention_never_makes_a_rare_schedule_forget_its_last_slot(make_engine: MakeEngine, clock: ManualClock) -> None:
    """A monthly schedule with the default 30 days kept: its January run is older than
    that when February's slot is missed; pruning it would leave nothing to catch up from,
    and February's slot would be neither fired nor recorded missed."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    clock.set("2027-01-01T09:00:00Z")
    engine = make_engine([schedule(cron="0 9 1 * *", handler=handler, backfill="all")], retention=timedelta(days=30))
    await _seed_last_run(engine, "job", at("2027-01-01T09:00:00Z"))
    clock.set("2027-02-01T10:00:00Z")  # down over February's slot
    await engine.maintain()  # housekeeping prunes before the catch-up reads
    await engine.start()
    await engine.quiesce()
    assert fired == [at("2027-02-01T09:00:00Z")]
    runs = await all_runs(engine, "job")
    assert [(r.scheduled_at, r.status) for r in runs] == [
        (at("2027-01-01T09:00:00Z"), "succeeded"), (at("2027-02-01T09:00:00Z"), "succeeded"),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------
# operator actions
# ---------------------------------------------------------------------------------------
async def test_run_now_always_runs_even_disabled_and_overlapping(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(handler=gate, on_overlap="skip")])
    await engine.start()
    clock.advance(60)
    await gate.entered.wait()
    await engine.set_enabled("job", False)
    run = await engine.run_now("job")
    assert (run.trigger, run.coordination_outcome, run.status) == ("manual", "manual", "running")
    assert (await engine.store.get_run(run.id)) is not None  # committed before returning
    gate.release.set()
    assert (await engine.wait_run(run.id)).status == "succeeded"
    with pytest.raises(NotFound, match='"nope"'):
        await engine.run_now("nope")


async def test_a_run_now_waited_for_returns_its_run_when_the_engine_stops_while_it_runs(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console quitting with a Run now in flight: the stop let the run finish within its
    grace, wrote its row and closed the store before ``run_now(wait=True)`` flushed, which
    then raised that the store was not open (seen in CI). The order is forced here: the
    caller's flush comes after the stop."""
    gate = Gate()
    engine = make_engine([schedule(handler=gate)])
    await engine.start()
    waiting = asyncio.ensure_future(engine.run_now("job", wait=True))
    await gate.entered.wait()
    stopping = asyncio.ensure_future(engine.stop(grace=30))
    flush = engine.flush

    async def after_the_stop() -> None:
        if asyncio.current_task() is waiting:
            await stopping
        await flush()

    monkeypatch.setattr(engine, "flush", after_the_stop)
    gate.release.set()
    run = await waiting
    assert (run.trigger, run.status) == ("manual", "succeeded")
    await stopping


async def test_a_run_now_waited_for_returns_when_its_audit_entry_comes_as_the_store_closes(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same quit on a loaded machine: the Run now's audit entry, written after its run
    had started, reached the SQLite store once the stop had told its writer to end, and
    waited for ever (``run_now(wait=True)`` never returned; seen under load). The order is
    forced here: the entry's write comes once the writer has ended, before the close is over."""
    gate = Gate()
    engine = make_engine([schedule(handler=gate)])
    await engine.start()
    writer_ended = asyncio.Event()

    async def then(fn: Callable[..., Any], *args: Any, name: str = "schedtui call") -> Any:
        result = await in_own_thread(fn, *args, name=name)
        if getattr(fn, "__name__", None) == "join":  # the store's writer has ended
            writer_ended.set()
            for _ in range(3):  # (the entry's write goes first)
                await asyncio.sleep(0)
        return result

    monkeypatch.setattr("backend.store.sqlite.store.in_own_thread", then)
    append = engine.store.append_audit  # type: ignore[attr-defined]

    async def late(entry: Any) -> None:
        await writer_ended.wait()
        await append(entry)

    monkeypatch.setattr(engine.store, "append_audit", late)
    waiting = asyncio.ensure_future(engine.run_now("job", wait=True))
    await gate.entered.wait()
    stopping = asyncio.ensure_future(engine.stop(grace=30))
    gate.release.set()
    run = await asyncio.wait_for(waiting, 10)  # (without the fix: for ever)
    assert (run.trigger, run.status) == ("manual", "succeeded")
    await stopping


async def test_a_failed_runs_log_line_sends_no_escape_sequence_and_forges_no_line(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """serve's line for a failed run quotes its handler's error: an OSC sequence in it
    reached the terminal of whoever followed the log (a clipboard write, a title), and a
    newline in it made a line that looked like the engine's own (outside security review)."""
    forged = "2026-12-07 00:00:00,000 INFO schedtui.engine: run X of job succeeded"

    async def vendor(ctx: RunContext) -> None:
        raise RuntimeError(f"vendor said: \x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;owned\x07\n{forged}")

    stream = io.StringIO()
    followed = logging.StreamHandler(stream)
    followed.setFormatter(TerminalFormatter(LOG_FORMAT))
    engine_log = logging.getLogger("schedtui.engine")
    engine_log.addHandler(followed)
    try:
        with caplog.at_level(logging.INFO, logger="schedtui.engine"):
            engine = make_engine([schedule(handler=vendor)])
            await engine.start()
            run = await engine.wait_run((await engine.run_now("job")).id)
    finally:
        engine_log.removeHandler(followed)
    assert run.status == "failed" and run.error_message is not None and "\x1b]52" in run.error_message  # (the ledger's, whole)
    text = stream.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    [line] = [line for line in text.splitlines() if " failed: RuntimeError: " in line]
    assert line.endswith(f"vendor said: \\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b]0;owned\\x07\\x0a{forged}")
    assert not any(line.startswith(forged) for line in text.splitlines())  # the traceback's lines are indented
    assert any(line.startswith("  Traceback (most recent call last):") for line in text.splitlines())


async def test_disable_persists_and_enable_skips_the_disabled_slots(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(backfill="all")])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    view = await engine.set_enabled("job", False, note="maintenance window", by="alice")
    assert (view.enabled, view.next_fire_at) == (False, None)
    assert view.state_note is not None and (view.state_note.by, view.state_note.note) == ("alice", "maintenance window")
    clock.advance(300)
    await engine.quiesce()
    assert len(await all_runs(engine, "job")) == 1
    await engine.stop()
    # A restart keeps it disabled; enabling arms the next future slot, nothing is caught up.
    clock.advance(300)
    again = make_engine([schedule(backfill="all")])
    await again.start()
    await again.quiesce()
    assert not again.is_enabled("job") and again.next_fire_at("job") is None
    await again.set_enabled("job", True)
    assert again.next_fire_at("job") == at("2026-03-02T08:12:00Z")
    await again.stop()
    third = make_engine([schedule(backfill="all")])
    clock.advance(60)
    await third.start()
    await third.quiesce()
    # The one slot after enabling was missed while down: caught up; the disabled ones were not.
    assert [r.scheduled_at for r in await all_runs(third, "job")] == [at("2026-03-02T08:01:00Z"), at("2026-03-02T08:12:00Z")]


async def test_disable_then_enable_within_one_interval_keeps_one_firing_per_slot(make_engine: MakeEngine, clock: ManualClock) -> None:
    """A regression: each disable/enable cycle between two slots used to add a timer
    entry for the armed slot, so every later slot fired once more per cycle, forever."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    engine = make_engine([schedule(handler=handler, on_overlap="parallel")])
    await engine.start()
    clock.advance(60)  # 08:01 fires
    await engine.quiesce()
    for _ in range(2):  # two cycles, both before 08:02
        clock.advance(10)
        await engine.set_enabled("job", False, note="a moment")
        await engine.set_enabled("job", True)
        await engine.quiesce()
    assert engine.next_fire_at("job") == at("2026-03-02T08:02:00Z")
    for _ in range(3):
        clock.advance(60)
        await engine.quiesce()
    assert fired == [at(f"2026-03-02T08:0{m}:00Z") for m in range(1, 5)]
    runs = await all_runs(engine, "job")
    assert summary(runs) == [(f"08:0{m}:00", "succeeded", "self") for m in range(1, 5)]


async def test_enabling_an_enabled_schedule_changes_nothing(make_engine: MakeEngine, clock: ManualClock) -> None:
    """Found by the state machine: "enable" on a schedule that was already enabled wrote a
    new state, and the next start's catch-up then began at that moment (as after a real
    re-enable), silently dropping the slots missed before it."""
    engine = make_engine([schedule(backfill="all")])
    await engine.start()
    clock.set("2026-03-02T08:01:30Z")
    await engine.quiesce()
    await engine.stop()
    clock.set("2026-03-02T08:04:30Z")  # 08:02-08:04 missed while down; then a redundant enable
    cli = make_engine([schedule(backfill="all")], instance="cli")
    await cli.open()
    view = await cli.set_enabled("job", True)
    assert view.enabled and view.state_note is None
    await cli.stop()
    clock.set("2026-03-02T08:05:10Z")
    again = make_engine([schedule(backfill="all")])
    await again.start()
    await again.quiesce()
    assert summary(await all_runs(again, "job")) == [(f"08:0{m}:00", "succeeded", "self") for m in range(1, 6)]


async def test_a_running_engine_notices_a_disable_from_another_process(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule()])
    await engine.start()
    await engine.quiesce()
    other = make_engine([schedule()], instance="cli")
    await other.open()
    await other.set_enabled("job", False, note="from the CLI")
    clock.advance(1)  # the next state poll
    await engine.quiesce()
    assert not engine.is_enabled("job")
    clock.advance(120)
    await engine.quiesce()
    assert await all_runs(engine, "job") == []


async def test_a_state_poll_slower_than_its_interval_does_not_push_the_next_one_out(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The polls are counted from when each began: a change committed after a slow round
    read the states is seen by the next round at its time. (Found by CI: the first round,
    still reading when the clock moved, parked a whole interval from its end, and a disable
    made meanwhile was not heard at the next poll.)"""
    engine = make_engine([schedule()])
    await engine.start()
    await engine.quiesce()
    other = make_engine([schedule()], instance="cli")
    await other.open()
    store: Any = engine.states.store
    real = store.get_states
    reading, gate = asyncio.Event(), asyncio.Event()

    async def held() -> Any:
        states = await real()
        reading.set()
        await gate.wait()
        return states

    store.get_states = held
    clock.advance(1)  # a round begins, reads, and is held
    await reading.wait()
    store.get_states = real
    await other.set_enabled("job", False)  # after its read
    clock.advance(1)  # the next round is due
    gate.set()
    await engine.quiesce()
    assert not engine.is_enabled("job")


async def test_an_enable_from_another_process_heard_after_a_slot_came_due_fires_it(make_engine: MakeEngine, clock: ManualClock) -> None:
    """Found by the state machine: a running engine armed an enable made elsewhere from the
    moment it heard of it (its next state poll), so a slot due in between, while the
    schedule was enabled, got no row at all. It is armed from the enable: the slot is
    fired late, as a timer woken late fires it (``backfill`` is about slots behind)."""
    engine = make_engine([schedule(backfill="skip")])
    await engine.start()
    other = make_engine([schedule(backfill="skip")], instance="cli")
    await other.open()
    await other.set_enabled("job", False)
    clock.advance(1)  # the next state poll
    await engine.quiesce()
    assert not engine.is_enabled("job")
    clock.set("2026-03-02T08:00:59.5Z")
    await engine.quiesce()
    await other.set_enabled("job", True)  # half a second before 08:01
    clock.advance(1)  # heard at the next state poll, at 08:01:00.5
    await engine.quiesce()
    assert engine.is_enabled("job")
    assert summary(await all_runs(engine, "job")) == [("08:01:00", "succeeded", "self")]
    assert engine.next_fire_at("job") == at("2026-03-02T08:02:00Z")


# ---------------------------------------------------------------------------------------
# range backfill
# ---------------------------------------------------------------------------------------
async def test_backfill_fires_each_slot_in_order_and_survives_a_failure(make_engine: MakeEngine, clock: ManualClock) -> None:
    seen: list[tuple[datetime, str]] = []

    async def handler(ctx: RunContext) -> None:
        seen.append((ctx.scheduled_at, ctx.trigger))
        if ctx.scheduled_at.hour == 3:
            raise ValueError("bad hour")

    engine = make_engine([schedule(cron="0 * * * *", handler=handler)])
    await engine.open()
    plan = await engine.plan_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T06:00:00Z"))
    assert (plan.count, plan.first, plan.last, plan.refusal) == (6, at("2026-03-02T01:00:00Z"), at("2026-03-02T06:00:00Z"), None)
    progress = await engine.start_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T06:00:00Z"))
    done = await engine.wait_backfill(progress.id)
    assert (done.state, done.fired, done.failed, done.remaining) == ("done", 6, 1, 0)
    assert seen == [(at(f"2026-03-02T0{h}:00:00Z"), "manual") for h in range(1, 7)]
    runs = await all_runs(engine, "job")
    assert [(r.status, r.coordination_outcome) for r in runs].count(("failed", "manual")) == 1
    assert (await engine.backfill_progress(progress.id)).fired == 6
    again = await engine.plan_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T06:00:00Z"))
    assert (again.count, again.already_succeeded, again.on_overlap) == (6, 5, "skip")  # the failed one runs again


@pytest.mark.parametrize(
    ("start", "end", "kwargs", "reason", "count"),
    [
        ("2026-03-02T06:00:00Z", "2026-03-02T00:00:00Z", {}, "reversed range", 0),
        ("2026-03-02T06:00:00Z", "2026-03-02T06:00:00Z", {}, "empty range", 0),
        ("2026-03-02T06:00:00Z", "2026-03-02T09:00:00Z", {}, "reaches into the future", 3),
        ("2026-03-02T06:10:00Z", "2026-03-02T06:20:00Z", {}, "no slots in range", 0),
        ("2026-02-27T00:00:00Z", "2026-03-02T00:00:00Z", {}, "needs confirmation", 72),
        ("2026-01-01T00:00:00Z", "2026-03-02T00:00:00Z", {"confirm": True}, "over the limit", 1440),
        ("2025-01-01T00:00:00Z", "2026-03-02T00:00:00Z", {"confirm": True, "limit": 10_000}, "over the limit", 10_001),
    ],
)
async def test_backfill_refusals_fire_nothing(make_engine: MakeEngine, clock: ManualClock, start, end, kwargs, reason, count) -> None:  # type: ignore[no-untyped-def]
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    engine = make_engine([schedule(cron="0 * * * *", handler=handler)])
    await engine.open()
    plan = await engine.plan_backfill("job", at(start), at(end), **kwargs)
    assert not plan.ok and plan.count == count and plan.reason == reason
    with pytest.raises(Refused) as info:
        await engine.start_backfill("job", at(start), at(end), **kwargs)
    assert info.value.reason == reason and info.value.count == count
    assert f"{count:,}" in info.value.message or count == 0 or count > 10_000
    await engine.quiesce()
    assert fired == [] and await all_runs(engine, "job") == []


async def test_backfill_confirmation_and_limits(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="0 * * * *")])
    await engine.open()
    start, end = at("2026-02-27T00:00:00Z"), at("2026-03-02T00:00:00Z")
    assert (await engine.plan_backfill("job", start, end, confirm=True)).ok
    assert (await engine.plan_backfill("job", at("2026-01-01T00:00:00Z"), end, confirm=True, limit=2000)).ok
    with pytest.raises(BadInput, match="10,000"):
        await engine.plan_backfill("job", start, end, limit=10_001)
    with pytest.raises(BadInput, match="has no timezone"):
        await engine.plan_backfill("job", datetime(2026, 3, 1), end)
    exceeding = await engine.plan_backfill("job", at("2024-01-01T00:00:00Z"), end, confirm=True, limit=10_000)
    assert exceeding.count_exceeds and exceeding.count_text() == "more than 10,000"


async def test_a_backfills_plan_walks_its_slots_off_the_engines_loop(
    make_engine: MakeEngine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk of 10,000 slots takes about 0.1 s of CPU: on the loop, a client asking for
    plans one after another (a read token may) made a 1-second schedule fire up to 2.7 s
    late (an outside attack). Every walk of a plan (its slots, the live slots it estimates)
    and of a start now runs on another thread."""
    from backend import cron as cron_module

    loop_thread = threading.get_ident()
    walked_on: list[int] = []
    occurrences = cron_module.Cron.occurrences

    def recorded(self: Any, start: datetime, end: datetime) -> Iterator[datetime]:
        for slot in occurrences(self, start, end):
            walked_on.append(threading.get_ident())
            yield slot

    monkeypatch.setattr(cron_module.Cron, "occurrences", recorded)
    engine = make_engine([schedule(cron="0 * * * *")])
    await engine.open()
    end = at("2026-03-02T00:00:00Z")
    assert (await engine.plan_backfill("job", at("2026-02-20T00:00:00Z"), end, confirm=True)).ok
    await engine.plan_backfill("job", at("2024-01-01T00:00:00Z"), end, confirm=True)  # (refused: over the limit)
    progress = await engine.start_backfill("job", at("2026-03-01T20:00:00Z"), end)
    assert (await engine.wait_backfill(progress.id)).fired == 4
    assert len(walked_on) > 10_000 and loop_thread not in walked_on


async def test_one_backfill_per_schedule_and_progress_while_running(make_engine: MakeEngine, clock: ManualClock) -> None:
    gate = Gate()
    engine = make_engine([schedule(cron="0 * * * *", handler=gate)])
    await engine.open()
    progress = await engine.start_backfill("job", at("2026-03-02T00:00:00Z"), at("2026-03-02T03:00:00Z"))
    await gate.entered.wait()
    with pytest.raises(Refused, match="already running"):
        await engine.start_backfill("job", at("2026-03-01T00:00:00Z"), at("2026-03-01T03:00:00Z"))
    # Another process sees it too.
    other = make_engine([schedule(cron="0 * * * *")], instance="cli")
    await other.open()
    with pytest.raises(Refused, match="already running"):
        await other.start_backfill("job", at("2026-03-01T00:00:00Z"), at("2026-03-01T03:00:00Z"))
    now = await engine.backfill_progress(progress.id)
    assert (now.fired, now.remaining, now.state, now.current) == (0, 3, "running", at("2026-03-02T01:00:00Z"))
    gate.release.set()
    done = await engine.wait_backfill(progress.id)
    assert (done.fired, done.failed, done.state) == (3, 0, "done")
    assert (await other.backfill_progress(progress.id)).state == "done"


# ---------------------------------------------------------------------------------------
# coordination through the store's claims, and external firing
# ---------------------------------------------------------------------------------------
async def test_two_engines_with_claims_fire_each_slot_once(make_engine: MakeEngine, clock: ManualClock) -> None:
    fired: list[tuple[str, datetime]] = []

    def handler_for(instance: str):  # type: ignore[no-untyped-def]
        async def handler(ctx: RunContext) -> None:
            fired.append((instance, ctx.scheduled_at))

        return handler

    a = make_engine([schedule(handler=handler_for("a"))], instance="a", coordination="advisoryLock")
    b = make_engine([schedule(handler=handler_for("b"))], instance="b", coordination="advisoryLock")
    await a.start()
    await b.start()
    for _ in range(5):
        clock.advance(60)
        await a.quiesce()
        await b.quiesce()
    assert sorted(slot for _, slot in fired) == [at(f"2026-03-02T08:0{m}:00Z") for m in range(1, 6)]
    runs = await all_runs(a, "job")
    assert len(runs) == 5 and {r.coordination_outcome for r in runs} == {"wonLock"}
    assert {r.instance for r in runs} <= {"a", "b"}


async def test_external_fire_runs_the_due_slot_once_per_slot(make_engine: MakeEngine, clock: ManualClock) -> None:
    calls: list[tuple[datetime, str]] = []

    async def handler(ctx: RunContext) -> None:
        calls.append((ctx.scheduled_at, ctx.trigger))

    engine = make_engine([schedule(cron="0 * * * *", handler=handler, trigger="external"), schedule("timer", cron="0 * * * *")])
    await engine.start()
    clock.set("2026-03-02T09:00:30Z")
    first = await engine.fire_external("job")
    assert first.created and first.run is not None
    assert (first.run.scheduled_at, first.run.trigger, first.run.coordination_outcome) == (
        at("2026-03-02T09:00:00Z"), "external", "external"
    )
    await engine.quiesce()
    clock.set("2026-03-02T09:25:00Z")  # a platform retry, past the tolerance: same run
    retry = await engine.fire_external("job")
    assert (retry.created, retry.run_id) == (False, first.run_id)
    assert retry.run is not None and retry.run.status == "succeeded"
    assert calls == [(at("2026-03-02T09:00:00Z"), "external")]
    clock.set("2026-03-02T10:11:00Z")  # the 10:00 slot was never fired and is 11 minutes old
    with pytest.raises(Refused, match="no slot") as late:
        await engine.fire_external("job")
    assert late.value.reason == "no slot due"
    assert "is 11m old (tolerance 10m)" in late.value.message  # (was "is 0:11:00 old (tolerance 0:10:00)")
    with pytest.raises(Refused, match="trigger=self"):
        await engine.fire_external("timer")
    clock.set("2026-03-02T11:00:05Z")
    # Allowed, a self schedule's external fire is refused all the same where the timer
    # claims no slot in the store (single, here): the call and the timer both ran the slot.
    with pytest.raises(Refused, match="coordination single claims no slot in the store") as twice:
        await engine.fire_external("timer", allow_self=True)
    assert twice.value.reason == "would run twice"
    with pytest.raises(NotFound):
        await engine.fire_external("nope")


@pytest.mark.parametrize(("where", "coordination"), [("sqlite", "single"), ("postgres", "single")])
async def test_an_external_call_for_a_slot_the_timer_fired_before_a_deploy_made_it_external_runs_nothing(
    make_engine: MakeEngine, clock: ManualClock, request: pytest.FixtureRequest, where: str, coordination: str
) -> None:
    """A deploy from ``trigger="self"`` to ``external``: the old release's timer fired the
    slot (under ``single``, or ``cluster`` on its shard), and the platform's call for it on
    the new release ran it again, 202 created (outside attack: code changes between
    deploys, 8 of 8 slots twice). A call answers with the run the slot has, whoever fired it.
    (``cluster`` claims no key either: its runs are refused by the same check.)"""
    url = request.getfixturevalue("pg_url") if where == "postgres" else None
    calls: list[tuple[datetime, str]] = []

    async def handler(ctx: RunContext) -> None:
        calls.append((ctx.scheduled_at, ctx.trigger))

    clock.set("2026-03-02T08:59:00Z")
    at_store = {"store": url} if url is not None else {}
    old = make_engine([schedule(cron="0 * * * *", handler=handler)], coordination=coordination, instance="old", **at_store)
    await old.start()
    await old.quiesce()
    clock.set("2026-03-02T09:00:00Z")
    await old.quiesce()
    [fired] = await all_runs(old, "job")
    await old.stop()
    assert fired.coordination_outcome == coordination
    new = make_engine([schedule(cron="0 * * * *", handler=handler, trigger="external")],
                      coordination="advisoryLock" if url is not None else "single", instance="new", **at_store)  # fmt: skip
    await new.start()
    clock.set("2026-03-02T09:00:30Z")
    call = await new.fire_external("job")
    assert (call.created, call.run_id) == (False, fired.id)
    await new.quiesce()
    assert calls == [(at("2026-03-02T09:00:00Z"), "self")]


@pytest.mark.parametrize("first", ["timer", "call"])
async def test_an_allowed_external_fire_of_a_self_schedule_and_its_timer_run_a_slot_once(
    make_engine: MakeEngine, clock: ManualClock, first: str
) -> None:
    """Under advisoryLock the timer claims each slot in the store, as the call does: the
    call answers with the timer's run (or the timer finds the call's claim), in either order."""
    calls: list[tuple[datetime, str]] = []

    async def handler(ctx: RunContext) -> None:
        calls.append((ctx.scheduled_at, ctx.trigger))

    engine = make_engine([schedule("timer", cron="0 * * * *", handler=handler)], coordination="advisoryLock")
    await engine.start()
    await engine.quiesce()
    if first == "timer":
        clock.set("2026-03-02T09:00:00Z")
        await engine.quiesce()
        answer = await engine.fire_external("timer", allow_self=True)
        assert not answer.created
    else:  # 3 s early (a platform's clock runs fast): it waits for the slot, as the timer does
        clock.set("2026-03-02T08:59:57Z")
        calling = asyncio.ensure_future(engine.fire_external("timer", allow_self=True))
        await engine.quiesce(runs=False)
        clock.set("2026-03-02T09:00:00Z")
        answer = await calling
    await engine.quiesce()
    assert len(calls) == 1 and calls[0][0] == at("2026-03-02T09:00:00Z")
    runs = await all_runs(engine, "timer")
    assert [run.id for run in runs if run.scheduled_at == at("2026-03-02T09:00:00Z")] == [answer.run_id]


async def external_pair(make_engine: MakeEngine, *, poll: float) -> tuple[list[datetime], Engine, Engine]:
    """An hourly external schedule on two engines of one store: ``a`` started (its states
    polled every ``poll`` seconds), ``b`` opened; and the slots its handler runs."""
    calls: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        calls.append(ctx.scheduled_at)

    job = schedule(cron="0 * * * *", handler=handler, trigger="external")
    a = make_engine([job], instance="a", state_poll_interval=poll)
    b = make_engine([job], instance="b")
    await a.start()
    await b.open()
    return calls, a, b


async def test_an_external_call_for_a_disabled_schedule_fires_nothing_whoever_disabled_it(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """An operator's disable stops the platform's calls too, from the moment it is written:
    the call reads the state from the store (here it reaches an instance that has not polled
    since another one disabled the schedule). A retry of a slot fired before the disable
    still gets its run back; after an enable, the next slot fires. (Calls ran a disabled
    external schedule: a disable stopped only its timer, which it has none of.)"""
    calls, engine, other = await external_pair(make_engine, poll=3600)
    clock.set("2026-03-02T09:00:30Z")
    fired = await engine.fire_external("job")
    await engine.quiesce()
    await other.set_enabled("job", False, note="incident 42")
    assert engine.is_enabled("job")  # not heard of yet: its next poll is an hour away
    again = await engine.fire_external("job")  # the platform retries the 09:00 call
    assert (again.created, again.run_id) == (False, fired.run_id)
    clock.set("2026-03-02T10:00:10Z")
    with pytest.raises(Refused, match=r'"job" is disabled by .* \(incident 42\): this call fired nothing') as refused:
        await engine.fire_external("job")
    assert refused.value.reason == "disabled"
    assert not engine.is_enabled("job")
    await engine.quiesce()
    assert [r.scheduled_at for r in await all_runs(engine, "job")] == [at("2026-03-02T09:00:00Z")]
    await other.set_enabled("job", True)
    clock.set("2026-03-02T11:00:10Z")
    assert (await engine.fire_external("job")).created
    await engine.quiesce()
    assert calls == [at("2026-03-02T09:00:00Z"), at("2026-03-02T11:00:00Z")]


async def test_an_external_fire_claimed_across_a_lapse_starts_its_run_once_the_lease_holds_again(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The claim committed, its answer came back after the lease lapsed. Nothing starts
    under the old epoch; the call finds its own claim, and starts the run once the lease
    holds again if nobody closed it meanwhile: here at once (renewed), and, while the lease
    stays lapsed, the call answers 503 and the instance's next round starts it. (The claim
    was given back: a retry that had reached another instance meanwhile had been answered
    with that run, and the slot then never ran.)"""
    calls, engine, other = await external_pair(make_engine, poll=1)
    clock.set("2026-03-02T09:00:30Z")
    await engine.quiesce()
    real = engine.store.claim
    engine.store.claim = late = LateAnswer(real)  # type: ignore[method-assign]  # its answer comes late
    firing = asyncio.ensure_future(engine.fire_external("job"))
    await late.committed()
    found = await other.fire_external("job")  # the platform's retry, elsewhere, meanwhile
    assert not found.created and found.run is not None and found.run.fired_at is None
    lapse_and_renew(engine)
    late.let_go()
    fired = await firing
    assert (fired.created, fired.run_id) == (True, found.run_id)
    await engine.quiesce()
    assert calls == [at("2026-03-02T09:00:00Z")]
    # The lease still lapsed when the answer comes: 503, and the next round starts it.
    clock.set("2026-03-02T10:00:30Z")
    await engine.quiesce()
    engine.store.claim = late = LateAnswer(real)  # type: ignore[method-assign]
    firing = asyncio.ensure_future(engine.fire_external("job"))
    await late.committed()
    engine.lease.lapse("cut off (test)")
    late.let_go()
    with pytest.raises(Unavailable, match="lease has lapsed; try again"):
        await firing
    engine.store.claim = real  # type: ignore[method-assign]
    assert calls == [at("2026-03-02T09:00:00Z")]
    engine.lease.renewed(engine.lease.sending())
    clock.advance(1)
    await engine.quiesce()  # a housekeeping round
    assert calls == [at("2026-03-02T09:00:00Z"), at("2026-03-02T10:00:00Z")]
    runs = await all_runs(engine, "job")
    assert sorted((r.scheduled_at, r.status) for r in runs) == [
        (at("2026-03-02T09:00:00Z"), "succeeded"), (at("2026-03-02T10:00:00Z"), "succeeded")
    ]


class LostAnswers:
    """A store method whose answer is lost ``times`` times after it took effect (the
    connection broke after the commit): the call raises :class:`Unavailable`."""

    def __init__(self, method: Callable[..., Any], times: int = 1) -> None:
        self.method = method
        self.times = times

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.method(*args, **kwargs)
        if self.times:
            self.times -= 1
            raise Unavailable("the connection broke after the commit (test)")
        return result


async def test_an_external_claim_whose_answer_was_lost_is_started_by_the_call_that_made_it(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The claim committed, its answer never came back: its placeholder names a run id only
    this call knows. The call looks, finds its own claim, and starts it. (It answered with
    that unstarted run as someone else's, ``created: false``; every retry got it back too,
    and the slot never ran: an hour later it was closed as abandoned.)"""
    calls, engine, _ = await external_pair(make_engine, poll=1)
    clock.set("2026-03-02T09:00:30Z")
    engine.store.claim = LostAnswers(engine.store.claim)  # type: ignore[method-assign]
    firing = await engine.fire_external("job")
    assert firing.created and firing.run is not None
    await engine.quiesce()
    retry = await engine.fire_external("job")
    assert (retry.created, retry.run_id) == (False, firing.run_id)
    runs = await all_runs(engine, "job")
    assert [(r.id, r.status, r.trigger) for r in runs] == [(firing.run_id, "succeeded", "external")]
    assert calls == [at("2026-03-02T09:00:00Z")]


async def test_an_unanswered_external_claim_that_a_retry_found_elsewhere_is_started_by_its_claimer(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The claim committed and the store went away before the call could look: 503. The
    platform's retry reached another instance, which found the claim's run and answered
    with it; the instance that claimed it starts it at its next housekeeping round. Once
    the slot is older than the tolerance, such a run is recorded missed instead; and one
    still unanswered when its engine stops is given back, so that a retry fires the slot."""
    calls, a, b = await external_pair(make_engine, poll=1)
    real_claim, real_lookup = a.store.claim, a.store.claimed_run

    async def unanswered_call(when: str) -> None:
        """At ``when``, a call whose claim commits with its answer lost, and whose look
        after it finds the store gone: 503 (the look before it, a retry's check, answers)."""
        clock.set(when)
        await a.quiesce()  # (its housekeeping round of this instant is over: the next is a second away)
        looked = 0

        async def lookup(key: str) -> str | None:
            nonlocal looked
            looked += 1
            if looked > 1:
                raise Unavailable("the store is down (test)")
            return await real_lookup(key)

        a.store.claim = LostAnswers(real_claim)  # type: ignore[method-assign]
        a.store.claimed_run = lookup  # type: ignore[method-assign]
        with pytest.raises(Unavailable, match="down"):
            await a.fire_external("job")
        a.store.claim, a.store.claimed_run = real_claim, real_lookup  # type: ignore[method-assign]

    await unanswered_call("2026-03-02T09:00:30Z")
    found = await b.fire_external("job")  # the platform's retry
    assert not found.created and found.run is not None and found.run.fired_at is None
    assert calls == []
    clock.advance(1)
    await a.quiesce()  # a housekeeping round
    assert calls == [at("2026-03-02T09:00:00Z")]
    runs = await all_runs(a, "job")
    assert [(r.id, r.status) for r in runs] == [(found.run_id, "succeeded")]
    # Past the tolerance: recorded missed, with why.
    await unanswered_call("2026-03-02T10:00:30Z")
    clock.set("2026-03-02T10:11:00Z")
    await a.quiesce()
    late = next(r for r in await all_runs(a, "job") if r.scheduled_at == at("2026-03-02T10:00:00Z"))
    assert (late.scheduled_at, late.status, late.trigger) == (at("2026-03-02T10:00:00Z"), "missed", "external")
    assert late.error_message == "not fired: its claim's answer was lost, and no call came back for it within 0:10:00"
    # Unanswered when the engine stops: given back, and a retry after the restart fires it.
    await unanswered_call("2026-03-02T11:00:30Z")
    await a.stop()
    assert sorted(r.scheduled_at for r in await all_runs(b, "job")) == [at("2026-03-02T09:00:00Z"), at("2026-03-02T10:00:00Z")]
    again = make_engine(list(a.schedules.values()), instance="a2")
    await again.start()
    retry = await again.fire_external("job")
    assert retry.created
    await again.quiesce()
    assert calls == [at("2026-03-02T09:00:00Z"), at("2026-03-02T11:00:00Z")]


async def test_an_external_call_whose_run_cannot_be_written_yet_says_it_fired(
    make_engine: MakeEngine, clock: ManualClock
) -> None:
    """The claim went through, the run started, and its row waits in the writer (a full
    disk, an outage since the claim): the call answers that it fired, not 503, which told
    the platform nothing ran (the machine's deep run found it on a full disk)."""
    calls, engine, _ = await external_pair(make_engine, poll=1)
    clock.set("2026-03-02T09:00:30Z")
    fail_once(engine.ledger, "flush", Unavailable("the disk is full (test)"))
    firing = await engine.fire_external("job")
    assert firing.created
    await engine.quiesce()
    retry = await engine.fire_external("job")
    assert (retry.created, retry.run_id) == (False, firing.run_id)
    assert calls == [at("2026-03-02T09:00:00Z")]


async def test_an_external_call_slightly_early_waits_for_its_slot(make_engine: MakeEngine, clock: ManualClock) -> None:
    engine = make_engine([schedule(cron="0 * * * *", trigger="external")])
    await engine.start()
    clock.set("2026-03-02T08:59:58Z")  # the platform's clock runs two seconds fast
    call = asyncio.ensure_future(engine.fire_external("job"))
    await engine.quiesce(runs=False)
    assert not call.done()
    clock.set("2026-03-02T09:00:00Z")
    firing = await call
    assert firing.created and firing.run is not None
    assert (firing.run.scheduled_at, firing.run.fired_at) == (at("2026-03-02T09:00:00Z"), at("2026-03-02T09:00:00Z"))
