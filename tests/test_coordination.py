"""Several engines on one store with ``advisoryLock``, on a manual clock, against every store.

Each test runs on SQLite and on PostgreSQL (a fresh database per test): overlap policies
that hold across instances, fail-closed claims and the recovery of the slots they lost,
abandoned runs of instances on other machines, the claims sweep, and boot catch-up by
several instances at once. The real-process, real-clock versions are in test_fleet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock, Run, RunContext, Schedule, Unavailable, define_schedule
from backend.model import Claim, ClaimResult, slot_key
from backend.scheduler.coordination.slots import ClaimCoordinator
from backend.store import Store, open_store
from tests.conftest import all_runs, expect, fail_once
from tests.test_engine import LostAnswers
from tests.test_runtime_schedules import HeldSends, queue, spec

UTC = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Overrides conftest's: every engine of a test shares this store."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def schedule(name: str = "job", cron: str = "* * * * *", handler: Any = None, **kwargs: Any) -> Schedule:
    async def noop(ctx: RunContext) -> None:
        pass

    return define_schedule(name=name, cron=cron, timezone="UTC", handler=handler or noop, **kwargs)


class Gate:
    """A handler that blocks until released; counts how many run at once (across engines)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[tuple[datetime, str]] = []
        self.running = 0
        self.most = 0
        self.entered = asyncio.Event()

    async def __call__(self, ctx: RunContext) -> None:
        self.started.append((ctx.scheduled_at, ctx.run_id))
        self.running += 1
        self.most = max(self.most, self.running)
        self.entered.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1


class Loser(ClaimCoordinator):
    """advisoryLock, except that this instance loses every claim once ``losing`` is set:
    forces another instance to win the next slot."""

    losing = False

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        if self.losing:
            return ClaimResult(frozenset())
        return await super().claim(claims, instance, now)


def noting(
    into: list[Any], instance: str, note: Callable[[RunContext, str], Any] | None = None, gate: Gate | None = None
) -> Any:
    """A handler for ``instance`` that appends ``note(ctx, instance)`` to ``into`` (by default
    ``(instance, slot)``), then waits on ``gate`` if given."""

    async def handler(ctx: RunContext) -> None:
        into.append(note(ctx, instance) if note is not None else (instance, ctx.scheduled_at))
        if gate is not None:
            await gate(ctx)

    return handler


async def settle(clock: ManualClock, *engines: Engine, runs: bool = True) -> None:
    for engine in engines:
        await engine.quiesce(runs=runs)


def by_slot(runs: list[Run]) -> dict[datetime, list[Run]]:
    slots: dict[datetime, list[Run]] = {}
    for r in runs:
        slots.setdefault(r.scheduled_at, []).append(r)
    return slots


# ---------------------------------------------------------------------------------------
# overlap across instances
# ---------------------------------------------------------------------------------------
async def test_skip_counts_a_run_in_flight_on_another_instance(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    gate = Gate()
    a = make_engine([schedule(handler=gate)], instance="a", coordination="advisoryLock", abandon_after=3600)
    b = make_engine([schedule(handler=gate)], instance="b", coordination="advisoryLock", abandon_after=3600)
    a.coordinator = Loser(a.store)
    await a.start()
    clock.advance(60)  # 08:01, only a runs timers yet: a wins and its run blocks
    await gate.entered.wait()
    await b.start()
    a.coordinator.losing = True
    skipped = expect(b, lambda r: r.status == "skipped")
    clock.advance(60)  # 08:02: b wins, but a's run is in flight
    run = await skipped
    assert (run.scheduled_at, run.instance, run.coordination_outcome) == (at("2026-03-02T08:02:00Z"), "b", "wonLock")
    assert run.error_tag == "overlap" and "on another instance" in (run.error_message or "")
    assert gate.started[0][1] in (run.error_message or "")
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(60)  # 08:03: nothing in flight any more: b runs it
    await settle(clock, a, b)
    runs = await all_runs(b, "job")
    assert [(r.scheduled_at.minute, r.status, r.instance) for r in runs] == [
        (1, "succeeded", "a"),
        (2, "skipped", "b"),
        (3, "succeeded", "b"),
    ]
    assert gate.most == 1


async def test_a_run_started_after_its_claim_answer_was_lost_keeps_the_overlap_policy_across_instances(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Under ``skip``, the 09:00 run of an external schedule still runs on b when a's claim
    of 10:00 loses its answer. The call that then finds its own claim and starts the run
    sees the run in flight elsewhere, as the claim's answer would have said: 10:00 is
    recorded skipped. (It ran beside 09:00's: the run it started had no word of b's.)"""
    gate = Gate()
    job = schedule(cron="0 * * * *", handler=gate, trigger="external", max_runtime=7200)
    a = make_engine([job], instance="a", coordination="advisoryLock", abandon_after=3600)
    b = make_engine([job], instance="b", coordination="advisoryLock", abandon_after=3600)
    await a.start()
    await b.start()
    clock.set("2026-03-02T09:00:30Z")
    first = await b.fire_external("job")
    await asyncio.wait_for(gate.entered.wait(), 10)  # (the timeout only bounds a broken test)
    assert first.created and [s for s, _ in gate.started] == [at("2026-03-02T09:00:00Z")]
    clock.set("2026-03-02T10:00:30Z")
    a.store.claim = LostAnswers(a.store.claim)  # type: ignore[method-assign]
    second = await a.fire_external("job")
    assert second.created and second.run is not None
    await settle(clock, a, runs=False)  # (without waiting for runs: 09:00's holds on)
    assert gate.most == 1, "the 10:00 run ran beside 09:00's, on another instance"
    assert second.run.status == "skipped" and first.run_id in (second.run.error_message or "")
    gate.release.set()
    await settle(clock, a, b)


async def test_queue_waits_for_the_run_on_another_instance(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    gate = Gate()
    a = make_engine([schedule(handler=gate, on_overlap="queue")], instance="a", coordination="advisoryLock", abandon_after=3600)
    b = make_engine([schedule(handler=gate, on_overlap="queue")], instance="b", coordination="advisoryLock", abandon_after=3600)
    a.coordinator = Loser(a.store)
    await a.start()
    clock.advance(60)
    await gate.entered.wait()
    await b.start()
    a.coordinator.losing = True
    for _ in range(2):  # 08:02 and 08:03 come due while a's 08:01 runs: b queues both
        clock.advance(60)
        await settle(clock, a, b, runs=False)
    assert [slot.minute for slot, _ in gate.started] == [1]
    running = await b.store.running_runs()
    # b's queued slots are visible as claimed-but-not-started placeholders.
    assert sorted((r.scheduled_at.minute, r.instance, r.fired_at is None) for r in running) == [
        (1, "a", False),
        (2, "b", True),
        (3, "b", True),
    ]
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)  # b's housekeeping sees a's run finished and starts the queue, in order
    await settle(clock, a, b)
    assert [slot.minute for slot, _ in gate.started] == [1, 2, 3]
    assert gate.most == 1
    runs = await all_runs(b, "job")
    assert [(r.scheduled_at.minute, r.status, r.instance) for r in runs] == [
        (1, "succeeded", "a"),
        (2, "succeeded", "b"),
        (3, "succeeded", "b"),
    ]


@pytest.mark.parametrize("coordination", ["advisoryLock", "single"])
async def test_run_now_on_one_instance_counts_as_in_flight_for_the_others(
    make_engine: Callable[..., Engine], clock: ManualClock, coordination: str
) -> None:
    """Also under ``single``: a is then a process that fires nothing (``schedtui fire`` in
    another shell while ``serve`` fires), whose Run now b's 08:01 once started beside."""
    gate = Gate()
    a = make_engine([schedule(handler=gate)], instance="a", coordination=coordination, abandon_after=3600)
    b = make_engine([schedule(handler=gate)], instance="b", coordination=coordination, abandon_after=3600)
    await a.open()  # acts on the store, arms nothing (like a CLI verb)
    await b.start()
    manual = await a.run_now("job")
    assert (manual.trigger, manual.coordination_outcome) == ("manual", "manual")
    assert await b.store.count_claims() == 0  # Run now never claims
    skipped = expect(b, lambda r: r.status == "skipped")
    clock.advance(60)
    assert manual.id in ((await skipped).error_message or "")
    assert gate.most == 1
    gate.release.set()
    await settle(clock, a, b)
    assert [(r.trigger, r.status) for r in await all_runs(b, "job")] == [("manual", "succeeded"), ("self", "skipped")]


@pytest.mark.parametrize("coordination", ["advisoryLock", "single"])
async def test_a_run_now_whose_row_the_store_refuses_does_not_start(
    make_engine: Callable[..., Engine], clock: ManualClock, coordination: str
) -> None:
    """The store refuses the commit of the row of a's Run now (a fires nothing; a full
    disk, a lost connection): it must not start, for b, which fires, could not count it
    in flight. Before, it started anyway."""
    gate = Gate()
    a = make_engine([schedule(handler=gate)], instance="a", coordination=coordination)
    b = make_engine([schedule(handler=gate)], instance="b", coordination=coordination)
    await a.open()
    await b.start()
    fail_once(a.store, "flush", Unavailable("cannot be written: database or disk is full (test)"))
    manual = await a.run_now("job")
    assert gate.started == []
    assert (manual.status, manual.error_tag, manual.fired_at) == ("failed", "unavailable", None)
    assert "not started: its row could not be committed" in (manual.error_message or "")
    ran = expect(b, lambda r: r.status == "succeeded")
    gate.release.set()
    clock.advance(60)  # b's 08:01 runs: nothing is in flight
    assert (await ran).scheduled_at == at("2026-03-02T08:01:00Z")
    await a.flush()
    assert (await b.get_run(manual.id)).status == "failed"


async def run_now_from_a_process_that_fires_nothing(
    make_engine: Callable[..., Engine], job: Schedule, gate: Gate, coordination: str, abandon_after: float = 3600
) -> tuple[Engine, Engine, Run]:
    """b fires ``job``; a, opened but not started (``schedtui fire`` in another shell),
    starts a Run now of it, whose handler (``gate``) has entered: (a, b, that run)."""
    a = make_engine([job], instance="a", coordination=coordination, abandon_after=abandon_after)
    b = make_engine([job], instance="b", coordination=coordination, abandon_after=abandon_after)
    await b.start()
    await a.open()
    manual = await a.run_now("job")
    await gate.entered.wait()
    return a, b, manual


@pytest.mark.parametrize("coordination", ["advisoryLock", "single"])
async def test_a_run_now_longer_than_the_take_over_window_keeps_its_process_alive_to_the_fleet(
    make_engine: Callable[..., Engine], clock: ManualClock, coordination: str
) -> None:
    """a fires nothing (``schedtui fire``) and its Run now runs 12 minutes, past b's
    take-over window of 5: a's heartbeat goes on while it runs, so b never takes it for
    gone (before, b closed the run ``abandoned`` and started the next slot beside it)."""
    gate = Gate()
    a, b, manual = await run_now_from_a_process_that_fires_nothing(
        make_engine, schedule(handler=gate, max_runtime=7200), gate, coordination, abandon_after=300
    )
    for _ in range(12):
        clock.advance(60)
        await settle(clock, a, b, runs=False)
    assert (await b.get_run(manual.id)).status == "running"
    assert gate.most == 1
    timed = [r for r in await all_runs(b, "job") if r.trigger == "self"]
    assert len(timed) == 12 and {r.status for r in timed} == {"skipped"}
    gate.release.set()
    await settle(clock, a, b)
    assert (await b.get_run(manual.id)).status == "succeeded"


@pytest.mark.parametrize("backfill", ["skip", "all"])
async def test_a_catch_up_under_single_meets_a_run_now_of_a_process_that_fires_nothing(
    make_engine: Callable[..., Engine], clock: ManualClock, backfill: str
) -> None:
    """b (``single``) finds itself behind (the clock jumped three slots) while a's Run now
    runs: the catch-up's slots are recorded skipped, naming it, never started beside it
    (the stateful test found the catch-up asking nobody)."""
    gate = Gate()
    a, b, manual = await run_now_from_a_process_that_fires_nothing(
        make_engine, schedule(handler=gate, backfill=backfill), gate, "single"
    )
    clock.advance(150)  # 08:02:30: 08:01 and 08:02 are due at once
    await settle(clock, a, b, runs=False)
    assert gate.most == 1 and len(gate.started) == 1
    timed = [r for r in await all_runs(b, "job") if r.trigger == "self"]
    assert timed and {r.status for r in timed} <= {"skipped", "missed"}
    assert any(r.status == "skipped" and manual.id in (r.error_message or "") for r in timed)
    gate.release.set()
    await settle(clock, a, b)


async def test_a_slot_queued_behind_its_own_run_waits_for_a_run_now_of_a_process_that_fires_nothing(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Under ``single``, b's 08:02 queues behind b's own 08:01; a (which fires nothing)
    starts a Run now meanwhile. When 08:01 ends, 08:02 reads the store before it starts:
    it waits for the Run now (before, it started beside it; the stateful test found it)."""
    own, manual_gate = Gate(), Gate()

    def handler(ctx: RunContext) -> Any:
        return (own if ctx.trigger == "self" else manual_gate)(ctx)

    job = schedule(handler=handler, on_overlap="queue")
    a = make_engine([job], instance="a", coordination="single", abandon_after=3600)
    b = make_engine([job], instance="b", coordination="single", abandon_after=3600)
    await b.start()
    clock.advance(60)  # 08:01 starts on b, and holds
    await own.entered.wait()
    clock.advance(60)  # 08:02 queues behind it
    await settle(clock, b, runs=False)
    await a.open()
    manual = await a.run_now("job")
    await manual_gate.entered.wait()
    first_ended = expect(b, lambda r: r.trigger == "self" and r.status == "succeeded")
    own.release.set()  # 08:01 ends: 08:02 must now wait for a's Run now
    await first_ended
    await settle(clock, a, b, runs=False)
    assert [slot for slot, _ in own.started] == [at("2026-03-02T08:01:00Z")]
    manual_gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)  # b's housekeeping reads the Run now ended, and starts 08:02
    await settle(clock, a, b)
    assert [slot for slot, _ in own.started] == [at("2026-03-02T08:01:00Z"), at("2026-03-02T08:02:00Z")]
    runs = {r.id: r for r in await all_runs(b, "job")}
    ended = runs[manual.id].finished_at
    (second,) = [r for r in runs.values() if r.trigger == "self" and r.scheduled_at == at("2026-03-02T08:02:00Z")]
    assert ended is not None and second.fired_at is not None and second.fired_at >= ended


@pytest.mark.parametrize("coordination", ["advisoryLock", "single"])
async def test_a_queued_slot_waits_for_a_run_now_of_a_process_that_fires_nothing(
    make_engine: Callable[..., Engine], clock: ManualClock, coordination: str
) -> None:
    """Under ``queue``, b's 08:01 waits for a's Run now (a fires nothing), and starts once
    b's housekeeping reads it finished; 08:02, due meanwhile, queues behind it."""
    gate = Gate()
    a, b, manual = await run_now_from_a_process_that_fires_nothing(
        make_engine, schedule(handler=gate, on_overlap="queue"), gate, coordination
    )
    for _ in range(2):
        clock.advance(60)
        await settle(clock, a, b, runs=False)
    assert gate.started == [(manual.scheduled_at, manual.id)] and gate.most == 1
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)  # b's housekeeping sees the Run now finished, and starts its queue in order
    await settle(clock, a, b)
    assert [slot for slot, _ in gate.started[1:]] == [at("2026-03-02T08:01:00Z"), at("2026-03-02T08:02:00Z")]
    assert gate.most == 1
    runs = await all_runs(b, "job")
    assert [(r.trigger, r.status) for r in runs] == [("manual", "succeeded"), ("self", "succeeded"), ("self", "succeeded")]


@pytest.mark.parametrize(("coordination", "on_overlap", "holds"), [
    ("advisoryLock", "skip", True), ("advisoryLock", "queue", True), ("advisoryLock", "parallel", False),
    ("single", "skip", True), ("single", "parallel", False), ("cluster", "queue", True),
])  # fmt: skip
async def test_a_run_now_holds_its_schedules_turn_from_its_first_row(
    make_engine: Callable[..., Engine], clock: ManualClock, coordination: str, on_overlap: str, holds: bool
) -> None:
    """The row a Run now commits before its handler starts holds the schedule's turn
    (``held``), so that the other instances count it in flight from that commit, whatever
    slot they decide for (the store commits it under the turn's lock: see test_store.py);
    its started and finished rows let go. Under ``single`` too: the firing process counts
    the Run nows of processes that fire nothing; and under ``cluster``, whose owner's claim
    of a slot due before the Run now's row was committed once missed a row with no
    ``fired_at`` yet placed after that slot. Not where no turn is kept (``parallel``)."""
    gate = Gate()
    a = make_engine([schedule(handler=gate, on_overlap=on_overlap)], instance="a", coordination=coordination)
    await a.open()
    handed: list[Run] = []
    save_runs = a.store.save_runs

    def spy(runs: Sequence[Run]) -> None:
        handed.extend(runs)
        save_runs(runs)

    a.store.save_runs = spy  # type: ignore[method-assign]  # (watching what the engine hands in)
    manual = await a.run_now("job")
    gate.release.set()
    await a.run_now("job", wait=True)
    versions = [(r.fired_at is not None, r.status, r.held) for r in handed if r.id == manual.id]
    assert versions[0] == (False, "running", holds)
    assert all(not held for started, _, held in versions if started)
    assert (await a.get_run(manual.id)).held is False


async def test_a_fleet_fires_each_slot_once_after_disable_and_enable_within_an_interval(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A regression, in a fleet: after a disable/enable between two slots the re-enabled
    instance's timer held the armed slot twice, its claim batch carried the slot's key
    twice, and both counted as won."""
    fired: list[tuple[str, datetime]] = []

    def handler_for(name: str) -> Any:
        return noting(fired, name)

    a, b = (
        # The clock jumps a minute at a time: a long abandon window, or one instance may
        # take the other for gone and close its run in flight.
        make_engine(
            [schedule(handler=handler_for(n), on_overlap="parallel")], instance=n, coordination="advisoryLock", abandon_after=3600
        )
        for n in "ab"
    )
    await a.start()
    await b.start()
    clock.advance(30)
    for _ in range(3):  # three cycles on a, all between 08:00 and 08:01
        await a.set_enabled("job", False)
        await a.set_enabled("job", True)
    await settle(clock, a, b)
    for _ in range(4):
        clock.advance(60)
        await settle(clock, a, b)
    slots = [at(f"2026-03-02T08:0{m}:00Z") for m in range(1, 5)]
    assert sorted(slot for _, slot in fired) == slots
    runs = await all_runs(a, "job")
    assert sorted((r.scheduled_at, r.status) for r in runs) == [(slot, "succeeded") for slot in slots]
    assert await a.store.running_runs() == []


async def test_an_enable_heard_late_by_the_instance_left_catches_up_the_slots_due_since_it(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Found by the state machine: b enables a schedule a had disabled, then stops before
    its first slot; a hears of the enable only after a stall (the clock jumps), and armed
    from then on, leaving the slots due since the enable without a row (a schedule that
    never ran has no ledger to catch up from). a arms it from the enable: its timer is
    found behind, and catches them up by the backfill policy. (On PostgreSQL a may hear of
    it sooner, by a signal: the same rows.)"""
    a, b = (
        make_engine([schedule(backfill="all")], instance=n, coordination="advisoryLock", abandon_after=3600)
        for n in "ab"
    )
    await a.start()
    await b.start()
    clock.advance(23)
    await settle(clock, a, b)
    await a.set_enabled("job", False)
    await b.set_enabled("job", True)  # b arms 08:01, and stops before it
    await b.stop(grace=0)
    clock.advance(150)  # a's next state poll is at 08:02:53
    await settle(clock, a)
    runs = await all_runs(a, "job")
    assert [(r.scheduled_at, r.status, r.instance) for r in runs] == [
        (at("2026-03-02T08:01:00Z"), "succeeded", "a"),
        (at("2026-03-02T08:02:00Z"), "succeeded", "a"),
    ]
    assert a.next_fire_at("job") == at("2026-03-02T08:03:00Z")


# ---------------------------------------------------------------------------------------
# fail closed
# ---------------------------------------------------------------------------------------
class Outage:
    """Wraps a store; while ``down``, every call that reaches the server raises Unavailable
    (the writer keeps its runs, like the real stores do). ``lose_reply`` makes the next
    claim commit and then fail, as when a connection drops after the commit. The calls
    named in ``refused`` raise while the others go through (a full disk: a claim inserts,
    a heartbeat updates in place)."""

    CALLS = {
        "claim", "claimed_run", "get_states", "set_state", "heartbeat", "heartbeat_and_unfinished", "instances", "running_runs",
        "unfinished_work",
        "running_backfills", "last_slots", "last_runs", "list_runs", "get_run", "close_runs", "prune_runs",
        "prune_claims", "count_claims", "update_backfill",
    }  # fmt: skip

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.down = False
        self.lose_reply = False
        self.down_after_lost_reply = False  # and stays down (until the test brings it back)
        self.refused: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name not in self.CALLS:
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise Unavailable("the store is down (test)")
            if name in self.refused:
                raise Unavailable("could not extend file: No space left on device (test)")
            result = await value(*args, **kwargs)
            if name == "claim" and self.lose_reply:
                self.lose_reply = False
                self.down = self.down_after_lost_reply
                raise Unavailable("connection lost after commit (test)")
            return result

        return call


async def test_no_claim_no_fire_and_the_lost_slots_are_recorded_once_back(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    fired: list[tuple[str, datetime]] = []

    def handler_for(name: str) -> Any:
        return noting(fired, name)

    stores = [Outage(open_store(store_url)) for _ in range(2)]
    a, b = (
        # abandon_after: the clock jumps a minute at a time, and a closed run stays closed
        # (an instance whose heartbeat looks a minute old would see the other's run abandoned).
        make_engine([schedule(handler=handler_for(n))], instance=n, coordination="advisoryLock", store=s, abandon_after=3600)
        for n, s in zip("ab", stores, strict=False)
    )
    await a.start()
    await b.start()
    clock.advance(60)
    await settle(clock, a, b)
    caplog.set_level(logging.INFO, "schedtui")
    for s in stores:
        s.down = True
    for _ in range(3):  # 08:02, 08:03, 08:04: nobody can claim, nobody fires
        clock.advance(60)
        await settle(clock, a, b)
    assert [slot.minute for _, slot in fired] == [1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot claim" in r.getMessage()]
    assert len(warnings) == 2 * 3  # one a minute per instance (08:02, 08:03, 08:04), not one per failed claim
    for s in stores:
        s.down = False
    clock.advance(1)  # housekeeping: the store is back, lost slots are claimed and recorded
    await settle(clock, a, b)
    clock.advance(59)  # 08:05 fires as usual
    await settle(clock, a, b)
    runs = await all_runs(a, "job")
    # backfill="skip": the slots whose next one was due by then are missed; 08:04, still
    # the current slot at 08:04:01, fires late (as the current slot of an engine behind).
    assert {slot: [r.status for r in rs] for slot, rs in by_slot(runs).items()} == {
        at("2026-03-02T08:01:00Z"): ["succeeded"],
        at("2026-03-02T08:02:00Z"): ["missed"],
        at("2026-03-02T08:03:00Z"): ["missed"],
        at("2026-03-02T08:04:00Z"): ["succeeded"],
        at("2026-03-02T08:05:00Z"): ["succeeded"],
    }
    assert {r.coordination_outcome for r in runs} == {"wonLock"}
    assert [slot.minute for _, slot in fired] == [1, 4, 5]
    late = by_slot(runs)[at("2026-03-02T08:04:00Z")][0]
    assert late.fired_at == at("2026-03-02T08:04:01Z")
    assert "unreachable" in (runs[1].error_message or "")
    assert "store reachable again" in caplog.text


async def test_lost_slots_follow_the_backfill_policy(make_engine: Callable[..., Engine], clock: ManualClock, store_url: str) -> None:
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    store = Outage(open_store(store_url))
    engine = make_engine([schedule(handler=handler, backfill="latest")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    store.down = True
    for _ in range(3):
        clock.advance(60)
        await engine.quiesce()
    store.down = False
    clock.advance(1)
    await engine.quiesce()
    assert fired == [at("2026-03-02T08:03:00Z")]  # latest: the newest lost slot fires
    assert [(r.scheduled_at.minute, r.status) for r in sorted(await all_runs(engine, "job"), key=lambda r: r.scheduled_at)] == [
        (1, "missed"),
        (2, "missed"),
        (3, "succeeded"),
    ]


async def test_a_store_that_takes_heartbeats_but_no_claims_is_warned_of_once_a_minute(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an outside attack (the host runs out: PostgreSQL on a full disk): reads and
    the heartbeat went through, claims did not. Each housekeeping round that succeeded
    ended the outage: a `cannot claim` warning and a false `store reachable again` every
    second, for every instance."""
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(cron="* * * * * *")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    caplog.set_level(logging.INFO, "schedtui")
    store.refused = {"claim"}
    for _ in range(59):  # a slot a second, a housekeeping round a second: each claim fails
        clock.advance(1)
        await engine.quiesce()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot claim" in r.getMessage()]
    assert len(warnings) == 1
    assert "reachable again" not in caplog.text
    store.refused = set()
    clock.advance(1)
    await engine.quiesce()
    back = [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(back) == 1
    assert "59 slot(s) that could not be claimed" in back[0]


async def test_a_catch_up_that_wins_nothing_while_the_store_is_down_says_nothing(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an outside attack (the host runs out): while PostgreSQL was down, every
    schedule logged `caught up: 0 slot(s) recorded missed, 0 fired` every 2 s (an engine
    behind catches up; its claims fail, so it records and fires nothing)."""
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(cron="* * * * * *")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    caplog.set_level(logging.INFO, "schedtui")
    store.down = True
    for _ in range(3):  # 3 s a step: behind each time, a catch-up whose claims fail
        clock.advance(3)
        await engine.quiesce()
    assert "cannot claim" in caplog.text
    assert "caught up" not in caplog.text
    store.down = False
    clock.advance(3)
    await engine.quiesce()
    assert "caught up" in caplog.text  # (what it does record or fire is still said)


async def test_slots_lost_by_a_clock_that_was_ahead_are_not_recorded_once_it_is_right(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Found by an outside attack (3 of 3, real serve processes on PostgreSQL): an instance
    whose wall clock was stepped an hour ahead could not claim (its lease lapsed), and
    remembered the hour's slots as lost; its clock set right, it claimed and recorded them
    ``missed`` ("the store was unreachable"), slots still to come, and the healthy instances
    of the fleet were shut out of every one of them."""
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(backfill="latest")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    store.down = True  # (as the lapsed lease refuses its claims)
    clock.advance(60)
    await engine.quiesce()
    clock.set("2026-03-02T09:01:30Z")  # stepped an hour ahead: an hour of slots look due, and fail
    await engine.quiesce()
    clock.step_back(3600 - 10)  # set right: 08:01:40
    store.down = False
    clock.advance(1)  # housekeeping: the lost slots are claimed and recorded
    await engine.quiesce()
    await engine.stop()  # (a stop records what is left too)
    reader = make_engine([schedule()], instance="reader", coordination="advisoryLock")
    await reader.open()
    runs = await all_runs(reader, "job")
    assert runs and max(r.scheduled_at for r in runs) <= at("2026-03-02T08:01:00Z"), sorted(r.scheduled_at for r in runs)[-3:]


async def outage_until_just_before(clock: ManualClock, when: datetime, stores: list[Outage], *engines: Engine) -> None:
    """Take the store down now (on a whole second) and bring it back half a second before
    ``when``, advancing in one-second steps from half past: every instance's housekeeping
    (once a second) last ran just before the store came back, so the slot at ``when`` is
    claimed before the lost ones are recovered, at the next round, half a second later."""
    for s in stores:
        s.down = True
    clock.advance(0.5)
    while clock.now() < when - timedelta(seconds=0.5):
        clock.advance(1)
        await settle(clock, *engines, runs=False)
    assert clock.now() == when - timedelta(seconds=0.5)
    for s in stores:
        s.down = False


async def test_lost_slots_wait_for_the_run_in_flight_instead_of_being_skipped(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """A regression: the slots lost to an outage were handed to the overlap policy while
    the live timer's first run after the outage was in flight, so ``skip`` recorded them all
    skipped and none ran. They wait for it instead, then run one at a time, in order."""
    gate = Gate()
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(handler=gate, backfill="all")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    await outage_until_just_before(clock, at("2026-03-02T08:04:00Z"), [store], engine)  # 08:01-08:03 lost
    clock.advance(0.5)  # 08:04 is claimed and starts (and holds on the gate)
    await gate.entered.wait()
    clock.advance(0.5)  # housekeeping: the store is back, the lost slots are won
    await engine.quiesce(runs=False)
    assert [slot.minute for slot, _ in gate.started] == [4]
    gate.release.set()
    await engine.quiesce()
    assert [slot.minute for slot, _ in gate.started] == [4, 1, 2, 3]
    assert gate.most == 1
    runs = await all_runs(engine, "job")
    assert sorted((r.scheduled_at.minute, r.status) for r in runs) == [(m, "succeeded") for m in range(1, 5)]


@pytest.mark.parametrize("change", ["update", "delete", "disable"])
async def test_lost_slots_of_a_stored_schedule_changed_while_they_wait_follow_the_change(
    make_engine: Callable[..., Engine],
    clock: ManualClock,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    """The lost slots (backfill="all") wait for the timer's run in flight, then fire one
    after another. They fired by the definition they were won with: a schedule deleted or
    disabled meanwhile fired them all the same (jobs sent for a schedule that was gone);
    and, changed before they were won, they waited for the old definition's run in a busy
    loop (the run was looked for by definition: a thousand rounds of the loop a second)."""
    store = Outage(open_store(store_url))
    engine = make_engine([queue()], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec(backfill="all", payload={"v": 1}))
    sends = HeldSends(monkeypatch, trigger="self")
    rounds: list[str] = []
    waits = engine.launcher.waits

    def counted(run_id: str | None) -> None:
        rounds.append(str(run_id))
        waits(run_id)

    monkeypatch.setattr(engine.launcher, "waits", counted)
    await outage_until_just_before(clock, at("2026-03-02T08:04:00Z"), [store], engine)  # 08:01-08:03 lost
    clock.advance(0.5)  # 08:04 starts, and holds
    await sends.entered.wait()
    if change == "update":
        await engine.update_schedule("reap", {"payload": {"v": 2}})
    clock.advance(0.5)  # housekeeping: the lost slots are won, and wait for 08:04
    await engine.quiesce(runs=False)
    if change == "delete":
        await engine.delete_schedule("reap")
    elif change == "disable":
        await engine.set_enabled("reap", False)
    for _ in range(3):
        clock.advance(1)
        await engine.quiesce(runs=False)
    sends.go.set()
    await engine.quiesce()
    if change == "update":
        assert sends.sent == [("08:04", {"v": 1}), ("08:01", {"v": 2}), ("08:02", {"v": 2}), ("08:03", {"v": 2})]
        assert len(rounds) < 10, f"the lost slots waited in a busy loop: {len(rounds)} rounds"
    else:
        assert sends.sent == [("08:04", {"v": 1})]
        runs = {r.scheduled_at.minute: r.status for r in await all_runs(engine, "reap")}
        assert runs == {1: "missed", 2: "missed", 3: "missed", 4: "succeeded"}


async def test_queued_lost_slots_go_ahead_of_the_newer_slots_waiting(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    gate = Gate()
    store = Outage(open_store(store_url))
    # Housekeeping every 130 s, so its rounds fall between the slots: 08:00:00, 08:02:10,
    # 08:04:20 (the store is still down), 08:06:30 (it is back).
    engine = make_engine(
        [schedule(handler=gate, backfill="all", on_overlap="queue")], coordination="advisoryLock", store=store, state_poll_interval=130
    )
    await engine.start()
    await engine.quiesce()
    store.down = True
    for moment in ("08:01:00", "08:02:00", "08:02:10", "08:03:00", "08:04:00", "08:04:20"):  # 08:01-08:04 are lost
        clock.set(f"2026-03-02T{moment}Z")
        await engine.quiesce(runs=False)
    store.down = False
    clock.set("2026-03-02T08:05:00Z")  # 08:05 runs (and holds on the gate)
    await gate.entered.wait()
    clock.set("2026-03-02T08:06:00Z")  # 08:06 queues behind it
    await engine.quiesce(runs=False)
    clock.set("2026-03-02T08:06:30Z")  # the lost slots are won, and queue ahead of 08:06
    await engine.quiesce(runs=False)
    assert [slot.minute for slot, _ in gate.started] == [5]
    gate.release.set()
    await engine.quiesce()
    assert [slot.minute for slot, _ in gate.started] == [5, 1, 2, 3, 4, 6]
    assert gate.most == 1


async def _gated_pair(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, gate: Gate, started: list[tuple[int, str]],
    b_coordinator: type[ClaimCoordinator], **kwargs: Any,
) -> tuple[Engine, Engine, list[Outage]]:
    """Instances a (a :class:`Loser`) and b (``b_coordinator``), started, each with the
    schedule ``job`` (``kwargs``), whose runs note ``(minute, instance)`` in ``started`` and
    wait on ``gate``; and their stores."""

    def handler_for(instance: str) -> Any:
        return noting(started, instance, lambda ctx, i: (ctx.scheduled_at.minute, i), gate)

    stores = [Outage(open_store(store_url)) for _ in range(2)]
    a, b = (
        make_engine([schedule(handler=handler_for(n), **kwargs)], instance=n, coordination="advisoryLock", store=s, abandon_after=3600)
        for n, s in zip("ab", stores, strict=False)
    )
    a.coordinator, b.coordinator = Loser(stores[0]), b_coordinator(stores[1])
    await a.start()
    await b.start()
    await settle(clock, a, b)
    return a, b, stores


async def test_lost_slots_wait_for_a_run_in_flight_on_another_instance(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    gate, started = Gate(), list[tuple[int, str]]()
    a, b, stores = await _gated_pair(make_engine, clock, store_url, gate, started, Loser, backfill="latest")
    assert isinstance(a.coordinator, Loser) and isinstance(b.coordinator, Loser)
    await outage_until_just_before(clock, at("2026-03-02T08:04:00Z"), stores, a, b)
    a.coordinator.losing = True
    clock.advance(0.5)  # 08:04: b wins it and runs it
    await gate.entered.wait()
    a.coordinator.losing, b.coordinator.losing = False, True
    clock.advance(0.5)  # a wins the lost slots; b's 08:04 is in flight: a waits for it
    await settle(clock, a, b, runs=False)
    assert started == [(4, "b")]
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)  # a's next look at the ledger finds b's run finished
    await settle(clock, a, b)
    assert started == [(4, "b"), (3, "a")]  # latest: the newest lost slot
    assert gate.most == 1
    runs = await all_runs(a, "job")
    assert sorted((r.scheduled_at.minute, r.status, r.instance) for r in runs) == [
        (1, "missed", "a"),
        (2, "missed", "a"),
        (3, "succeeded", "a"),
        (4, "succeeded", "b"),
    ]


async def test_lost_slots_waiting_on_another_instance_and_then_on_a_run_here_leave_the_engine_idle(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Found by the state machine (2,000 examples): lost slots parked until the next
    housekeeping round (a run in flight on another instance), woken by it, then waiting for
    a run started here meanwhile (a Run now) left quiesce() waiting for a poke that never
    came: the engine looked busy for good."""
    gate = Gate()
    started: list[tuple[int, str, str]] = []

    def handler_for(instance: str) -> Any:
        return noting(started, instance, lambda ctx, i: (ctx.scheduled_at.minute, ctx.trigger, i), gate)

    stores = [Outage(open_store(store_url)) for _ in range(2)]
    a, b = (
        make_engine(
            [schedule(handler=handler_for(n), backfill="latest")], instance=n, coordination="advisoryLock", store=s, abandon_after=3600
        )
        for n, s in zip("ab", stores, strict=False)
    )
    a.coordinator, b.coordinator = Loser(stores[0]), Loser(stores[1])
    await a.start()
    await b.start()
    await settle(clock, a, b)
    await outage_until_just_before(clock, at("2026-03-02T08:04:00Z"), stores, a, b)
    a.coordinator.losing = True
    clock.advance(0.5)  # 08:04: b wins it and runs it
    await gate.entered.wait()
    a.coordinator.losing, b.coordinator.losing = False, True
    clock.advance(0.5)  # a wins the lost slots; b's 08:04 is in flight: a parks until the next round
    await settle(clock, a, b, runs=False)
    await a.run_now("job")  # a run of the schedule here, in flight (it holds on the gate)
    clock.advance(1)  # the next round wakes the lost slots, which now wait for the Run now
    await asyncio.wait_for(a.quiesce(runs=False), 10)  # the timeout only bounds the failure
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)
    await settle(clock, a, b)
    assert [(minute, trigger) for minute, trigger, _ in started] == [(4, "self"), (4, "manual"), (3, "self")]


class HeldClaims(ClaimCoordinator):
    """advisoryLock, except that once ``hold`` is set the next claim won is committed and
    then its reply waits for ``release`` (the slot is visibly taken, its run not started
    yet); meanwhile this instance loses every other claim."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.hold = False
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        if self.holding.is_set() and not self.release.is_set():
            return ClaimResult(frozenset())
        result = await super().claim(claims, instance, now)
        if self.hold and result.won and not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        return result


async def test_a_claim_committed_but_not_answered_yet_is_not_taken_for_abandoned(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Found with the test below: the run ids of a claim were remembered as this instance's
    only once its reply was back; a housekeeping round in between found the claim's
    committed placeholder, saw no run of that id here, and closed it as abandoned."""
    engine = make_engine([schedule()], coordination="advisoryLock")
    held = HeldClaims(engine.store)
    held.hold = True
    engine.coordinator = held
    await engine.start()
    await engine.quiesce()
    clock.advance(60)  # 08:01 is claimed; the reply waits
    await held.holding.wait()
    assert [r.scheduled_at.minute for r in await engine.store.running_runs()] == [1]
    assert await engine.close_abandoned() == []
    held.release.set()
    await engine.quiesce()
    assert [(r.scheduled_at.minute, r.status) for r in await all_runs(engine, "job")] == [(1, "succeeded")]


async def _older_recovered_after_a_newer_claim(clock: ManualClock, stores: list[Outage], a: Engine, b: Engine) -> None:
    """08:01 is lost by both; at 08:02 b claims it, and its run waits for the claim's reply;
    then a (which lost every claim meanwhile) recovers 08:01, while b is still claiming."""
    assert isinstance(a.coordinator, Loser) and isinstance(b.coordinator, HeldClaims)
    await outage_until_just_before(clock, at("2026-03-02T08:02:00Z"), stores, a, b)  # 08:01 lost by both
    a.coordinator.losing = True
    b.coordinator.hold = True
    clock.advance(0.5)  # 08:02: b claims it; its run waits for the claim's reply
    await b.coordinator.holding.wait()
    a.coordinator.losing = False
    clock.advance(0.5)


async def test_lost_slots_wait_for_a_newer_slot_claimed_on_another_instance(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """A newer slot claimed by another instance, its run about to start: the lost slots
    wait for it too (its claim took the schedule's turn; see the next test)."""
    gate, started = Gate(), list[tuple[int, str]]()
    a, b, stores = await _gated_pair(make_engine, clock, store_url, gate, started, HeldClaims, backfill="all")
    assert isinstance(a.coordinator, Loser) and isinstance(b.coordinator, HeldClaims)
    await _older_recovered_after_a_newer_claim(clock, stores, a, b)  # a must wait for b's 08:02
    # Waiting, a is idle; started, its run would hold on the gate (the timeout only bounds that).
    await asyncio.wait_for(a.quiesce(), 10)
    assert started == []
    gate.release.set()
    b.coordinator.release.set()
    await settle(clock, a, b)
    clock.advance(1)  # a's next look at the ledger finds b's run finished
    await settle(clock, a, b)
    assert started == [(2, "b"), (1, "a")]
    assert gate.most == 1


async def _b_ends_then_a_takes_its_turn(clock: ManualClock, gate: Gate, a: Engine, b: Engine) -> None:
    """b's run (on the gate) ends; at a's next look at the ledger, a takes its turn and its
    run starts, never beside b's."""
    gate.release.set()
    await settle(clock, a, b)
    clock.advance(1)
    await settle(clock, a, b)
    assert gate.most == 1


async def test_a_queued_lost_slot_claimed_after_a_newer_slot_elsewhere_waits_for_its_run(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """The state machine's case (two runs of a ``queue`` schedule at once in a fleet): b
    claims 08:02 and is about to start it; a then claims the lost 08:01 (older). a's claim
    saw b's placeholder not started and newer, so nothing in flight: it started 08:01, and b
    started 08:02 beside it. b's claim now takes the schedule's turn with the slot: a's 08:01
    waits, then takes its turn once b's run has ended."""
    gate, started = Gate(), list[tuple[int, str]]()
    a, b, stores = await _gated_pair(make_engine, clock, store_url, gate, started, HeldClaims, backfill="all", on_overlap="queue")
    assert isinstance(a.coordinator, Loser) and isinstance(b.coordinator, HeldClaims)
    await _older_recovered_after_a_newer_claim(clock, stores, a, b)
    await asyncio.wait_for(a.quiesce(runs=False), 10)
    assert started == []  # queued behind b's 08:02
    b.coordinator.release.set()
    await gate.entered.wait()
    await settle(clock, a, b, runs=False)
    assert started == [(2, "b")]
    await _b_ends_then_a_takes_its_turn(clock, gate, a, b)
    assert started == [(2, "b"), (1, "a")]
    runs = await a.store.list_runs("job", limit=10)
    assert sorted((r.scheduled_at.minute, r.instance, r.status) for r in runs if r.trigger == "self") == [
        (1, "a", "succeeded"), (2, "b", "succeeded")
    ]  # fmt: skip


async def test_a_queued_slot_whose_turn_is_refused_waits_at_the_head_of_its_queue(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """A queued slot that starts later than its claim takes its turn first; refused (a run
    of the schedule started elsewhere since its claim), it goes back to the head of its
    queue to wait for that run, and takes its turn once that run has ended."""
    gate, started = Gate(), list[tuple[int, str]]()
    a, b, _ = await _gated_pair(make_engine, clock, store_url, gate, started, Loser, on_overlap="queue")
    assert isinstance(a.coordinator, Loser)
    a.coordinator.losing = True
    clock.advance(60)  # 08:01: b wins it, and its run holds on the gate
    await gate.entered.wait()
    a.coordinator.losing = False
    job = a.schedules["job"]
    # a holds 08:02 claimed without its turn (as a lost slot, or a catch-up's older one is),
    # and lets it go as if the run before it here had just ended:
    (owned, busy) = await a.claims.claim([(job, at("2026-03-02T08:02:00Z"))], clock.now())
    [(_, slot, run_id)] = owned
    assert run_id not in a.launcher.turns and set(busy) == {"job"}
    a.launcher.launch(job, slot, "self", a.claims.coordinator.outcome, run_id)
    await settle(clock, a, b, runs=False)
    assert started == [(1, "b")]  # refused: b's 08:01 runs
    assert [entry[3] for entry in a.launcher.waiting["job"]] == [run_id] and a.launcher.remote["job"] == busy["job"]
    await _b_ends_then_a_takes_its_turn(clock, gate, a, b)
    assert started == [(1, "b"), (2, "a")]


async def test_slots_lost_to_an_outage_are_recorded_by_a_stop_before_the_next_housekeeping(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Found by the state machine: the slots an instance could not claim were only kept in
    memory until its next housekeeping round; stopping before that lost them for good (the
    next start catches up only from the newest slot in the ledger)."""
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(cron="*/20 * * * * *", backfill="all")], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    store.down = True
    clock.advance(20)  # 08:00:20 cannot be claimed
    await engine.quiesce()
    store.down = False
    await engine.stop()  # at once: no housekeeping round since the store came back
    reader = make_engine([schedule()], coordination="advisoryLock")
    await reader.open()
    runs = await all_runs(reader, "job")
    assert [(r.scheduled_at, r.status) for r in runs] == [(at("2026-03-02T08:00:20Z"), "missed")]
    assert "stopped" in (runs[0].error_message or "")


@pytest.mark.parametrize("grace", [5, 0])
async def test_a_stop_with_a_grace_starts_the_current_slot_whose_claim_answer_was_lost(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, grace: float
) -> None:
    """a's claim of 08:01 commits and its answer is lost; b lost the slot to it. A SIGTERM
    lands before a's next housekeeping round (a rolling restart). b never claims the slot
    again, so a stop that recorded it ``missed`` left it run nowhere: with a grace, a starts
    it (once, under the claim's run id) and waits for it; with none, ``missed`` it is."""
    fired: list[tuple[datetime, str]] = []

    def handler_for(name: str) -> Any:
        return noting(fired, name, lambda ctx, i: (ctx.scheduled_at, i))

    store = Outage(open_store(store_url))
    a = make_engine([schedule(handler=handler_for("a"))], instance="a", coordination="advisoryLock", store=store,
                    abandon_after=3600)  # fmt: skip
    b = make_engine([schedule(handler=handler_for("b"))], instance="b", coordination="advisoryLock", abandon_after=3600)
    b.coordinator = Loser(b.store)
    b.coordinator.losing = True  # a's claim committed first
    await a.start()
    await b.start()
    await settle(clock, a, b)
    store.lose_reply = store.down_after_lost_reply = True
    clock.advance(60)
    await settle(clock, a, b)
    assert fired == [] and a.claims.lost_count == 1
    store.down = False  # back, but no housekeeping round has run since: the stop comes first
    await a.stop(grace=grace)
    b.coordinator.losing = False
    clock.advance(60)  # b goes on (08:02)
    await settle(clock, b)
    runs = {r.scheduled_at.minute: r for r in await all_runs(b, "job")}
    assert sorted(runs) == [1, 2]
    first = runs[1]
    assert (first.instance, first.trigger, first.coordination_outcome) == ("a", "self", "wonLock")
    assert await b.store.claimed_run(slot_key("job", at("2026-03-02T08:01:00Z"))) == first.id
    if grace:
        assert first.status == "succeeded"
        assert fired == [(at("2026-03-02T08:01:00Z"), "a"), (at("2026-03-02T08:02:00Z"), "b")]
    else:
        assert (first.status, first.error_message) == (
            "missed", "not fired: the store was unreachable when it was due (the engine stopped before it could fire it)"
        )
        assert fired == [(at("2026-03-02T08:02:00Z"), "b")]


async def test_a_stop_with_a_grace_starts_only_the_current_one_of_the_slots_lost_to_an_outage(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Under ``backfill="all"`` too: a stop starts no backfill; the slot due now is not a
    backfill, and it starts within the grace."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    store = Outage(open_store(store_url))
    engine = make_engine([schedule(cron="*/20 * * * * *", backfill="all", handler=handler)], coordination="advisoryLock",
                         store=store)  # fmt: skip
    await engine.start()
    await engine.quiesce()
    store.down = True
    clock.advance(20)  # 08:00:20 and 08:00:40 cannot be claimed
    await engine.quiesce()
    clock.advance(20)
    await engine.quiesce()
    store.down = False
    await engine.stop(grace=5)
    assert fired == [at("2026-03-02T08:00:40Z")]
    reader = make_engine([schedule()], coordination="advisoryLock")
    await reader.open()
    assert [(r.scheduled_at.second, r.status) for r in await all_runs(reader, "job")] == [(20, "missed"), (40, "succeeded")]


async def test_a_range_backfill_goes_on_through_an_outage_and_records_its_end_once_back(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Found by the state machine: the progress update after each slot raised Unavailable
    while the store was down, which ended the backfill task there (a logged traceback), the
    rest never fired, and its row stayed 'running', refusing every later backfill of that
    schedule for as long as the instance lived."""
    gate = Gate()
    store = Outage(open_store(store_url))
    engine = make_engine([schedule(handler=gate)], store=store)
    await engine.start()
    progress = await engine.start_backfill("job", at("2026-03-02T07:56:00Z"), at("2026-03-02T07:59:00Z"))
    await gate.entered.wait()
    store.down = True
    gate.release.set()
    done = await engine.wait_backfill(progress.id)
    assert (done.state, done.fired, done.failed) == ("done", 3, 0)
    assert [slot.minute for slot, _ in gate.started] == [57, 58, 59]
    store.down = False
    clock.advance(1)  # housekeeping writes the end it could not write
    await engine.quiesce()
    stored = await engine.store.get_backfill(progress.id)
    assert stored is not None and stored.state == "done"
    again = await engine.start_backfill("job", at("2026-03-02T07:56:00Z"), at("2026-03-02T07:57:00Z"))
    assert (await engine.wait_backfill(again.id)).state == "done"


async def test_a_claim_whose_reply_was_lost_is_recognised_as_ours_and_fires_late(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """The claim of 08:01 commits (with its placeholder row) and its answer is lost. The
    next housekeeping round wins it again under the same run id, as this instance's own
    (not a dead instance's run to close), and, the slot being still the current one, fires
    it late, once. (It used to be recorded missed under the default backfill, "skip": a
    daily job lost for a day to one dropped answer.)"""
    fired: list[tuple[datetime, datetime]] = []

    async def handler(ctx: RunContext) -> None:
        fired.append((ctx.scheduled_at, clock.now()))

    store = Outage(open_store(store_url))
    engine = make_engine([schedule(handler=handler)], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    store.lose_reply = True
    clock.advance(60)
    await engine.quiesce()
    clock.advance(1)  # housekeeping has run since (at 08:01:00 or now)
    await engine.quiesce()
    assert [slot for slot, _ in fired] == [at("2026-03-02T08:01:00Z")]
    assert fired[0][1] <= at("2026-03-02T08:01:01Z")
    clock.advance(59)  # 08:02 as usual
    await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert [(r.scheduled_at.minute, r.status, r.instance) for r in runs] == [(1, "succeeded", "test-0"), (2, "succeeded", "test-0")]
    assert await engine.store.claimed_run(slot_key("job", at("2026-03-02T08:01:00Z"))) == runs[0].id
    assert engine.stats["abandoned"] == 0


async def test_lost_slots_won_back_once_the_next_slot_is_due_are_missed_under_skip(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    """Only the current slot fires late: once the next one has come due (and fired on time),
    the slots lost before it are missed, as the policy says."""
    fired: list[datetime] = []

    async def handler(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at)

    store = Outage(open_store(store_url))
    engine = make_engine([schedule(handler=handler)], coordination="advisoryLock", store=store)
    await engine.start()
    await engine.quiesce()
    await outage_until_just_before(clock, at("2026-03-02T08:04:00Z"), [store], engine)  # 08:01-08:03 lost
    clock.advance(0.5)  # 08:04 is claimed and fires on time
    await engine.quiesce()
    clock.advance(0.5)  # housekeeping: the lost slots are won back, 08:04 being current
    await engine.quiesce()
    assert fired == [at("2026-03-02T08:04:00Z")]
    runs = await all_runs(engine, "job")
    assert sorted((r.scheduled_at.minute, r.status) for r in runs) == [(1, "missed"), (2, "missed"), (3, "missed"), (4, "succeeded")]


# ---------------------------------------------------------------------------------------
# abandoned runs, across machines
# ---------------------------------------------------------------------------------------
async def test_runs_of_an_instance_on_another_machine_are_closed_once_its_heartbeat_is_stale(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    live = make_engine([schedule()], instance="live", coordination="advisoryLock", abandon_after=30, heartbeat_interval=5)
    await live.open()
    # Another machine: its pid happens to be alive here, which proves nothing about it.
    await live.store.heartbeat("far:1", "far-host#0000", os.getpid(), clock.now())
    stuck = Run(id=live.new_id(), name="job", scheduled_at=clock.now(), status="running", trigger="self",
                coordination_outcome="wonLock", instance="far:1", fired_at=clock.now())  # fmt: skip
    live.store.save_runs([stuck])
    await live.store.flush()
    await live.start()
    closed_at = None
    for second in range(1, 60):
        clock.advance(1)
        await live.quiesce()
        run = await live.store.get_run(stuck.id)
        assert run is not None
        if run.status != "running":
            closed_at = second
            break
    # Stale after abandon_after (30 s); noticed at the next heartbeat round (every 5 s).
    assert closed_at is not None and 30 < closed_at <= 30 + 5 + 1
    assert run is not None
    assert (run.status, run.error_tag) == ("failed", "abandoned")
    assert "has not sent a heartbeat" in (run.error_message or "")


# ---------------------------------------------------------------------------------------
# claims retention, boot catch-up, defaults
# ---------------------------------------------------------------------------------------
async def test_claims_are_swept_after_the_ttl_also_for_schedules_gone_since(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "schedtui")
    # Claims of schedules that no longer exist (renamed, deleted): nobody prunes them but the sweep.
    earlier = open_store(store_url)
    await earlier.open()
    for hours_ago in (5, 2):
        when = clock.now() - timedelta(hours=hours_ago)
        key = slot_key(f"renamed{hours_ago}", when)
        await earlier.claim([Claim(key, f"renamed{hours_ago}", f"01J{hours_ago:023d}")], "gone:1", when)
    await earlier.close()
    engine = make_engine([schedule(cron="*/10 * * * *")], coordination="advisoryLock", claims_ttl=timedelta(hours=3))
    await engine.start()  # the sweep runs at start, then hourly
    assert "claims older than 3h are swept hourly" in caplog.text
    assert await engine.store.claimed_run(slot_key("renamed5", clock.now() - timedelta(hours=5))) is None
    renamed2 = slot_key("renamed2", clock.now() - timedelta(hours=2))
    for _ in range(6):  # an hour in 10-minute steps: the schedule's own claims stay bounded
        clock.advance(600)
        await engine.quiesce()
    assert await engine.store.claimed_run(renamed2) is not None  # just 3 h old at 09:00's sweep
    for _ in range(6):  # the next hourly sweep, at 10:00, takes it
        clock.advance(600)
        await engine.quiesce()
    assert await engine.store.claimed_run(renamed2) is None
    # Winners kept an hour of their own schedule's claims (6 or 7 ten-minute slots).
    assert 6 <= await engine.store.count_claims() <= 7


async def test_instances_booting_together_catch_each_missed_slot_up_once(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    fired: list[tuple[str, datetime]] = []

    def handler_for(name: str) -> Any:
        return noting(fired, name)

    engines = [
        make_engine([schedule("daily", "0 6 * * *", handler=handler_for(n), backfill="latest")], instance=n, coordination="advisoryLock")
        for n in ("a", "b", "c")
    ]
    await engines[0].open()
    three_days_ago = at("2026-02-27T06:00:00Z")
    engines[0].store.save_runs([Run(id=engines[0].new_id(), name="daily", scheduled_at=three_days_ago, status="succeeded",
                                    trigger="self", coordination_outcome="wonLock", instance="old")])  # fmt: skip
    await engines[0].store.flush()
    await asyncio.gather(*(e.start() for e in engines))
    await settle(clock, *engines)
    runs = await all_runs(engines[0], "daily")
    assert sorted((r.scheduled_at, r.status) for r in runs) == [
        (at("2026-02-27T06:00:00Z"), "succeeded"),
        (at("2026-02-28T06:00:00Z"), "missed"),
        (at("2026-03-01T06:00:00Z"), "missed"),
        (at("2026-03-02T06:00:00Z"), "succeeded"),
    ]
    assert [slot for _, slot in fired] == [at("2026-03-02T06:00:00Z")]


def recording_fleet(
    make_engine: Callable[..., Engine], cron: str = "* * * * *"
) -> tuple[list[tuple[str, datetime]], Callable[..., Engine]]:
    """The slots each instance fired (its name, the slot), and a maker of advisoryLock
    instances of one ``backfill="skip"`` schedule that record them there."""
    fired: list[tuple[str, datetime]] = []

    def engine(name: str, **kwargs: Any) -> Engine:
        async def handler(ctx: RunContext) -> None:
            fired.append((name, ctx.scheduled_at))

        return make_engine([schedule(cron=cron, handler=handler, backfill="skip")], instance=name,
                           coordination="advisoryLock", **kwargs)  # fmt: skip

    return fired, engine


async def test_an_instance_started_just_after_a_slot_leaves_it_to_the_fleet_not_missed(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """b starts 0.1 s after 08:02, which a (its clock 0.3 s behind) has not fired yet. b's
    catch-up recorded the slot ``missed`` (backfill skip), a's claim of it then lost, and
    it ran nowhere: a rolling restart took the current slot from the fleet."""
    from backend.clock import OffsetClock

    fired, engine = recording_fleet(make_engine)

    a = engine("a", clock=OffsetClock(-0.3, clock))
    await a.start()
    for step in (0.3, 60):  # 08:00, then 08:01 by a's clock: a runs them
        clock.advance(step)
        await settle(clock, a)
    clock.advance(59.8)  # 08:02:00.1, and 08:01:59.8 by a's clock
    b = engine("b")
    await b.start()
    await settle(clock, a, b)
    clock.advance(0.5)  # a's clock passes 08:02: its claim of the slot
    await settle(clock, a, b)
    runs = await all_runs(a, "job")
    slots = [at(f"2026-03-02T08:0{minute}:00Z") for minute in range(3)]
    assert [(r.scheduled_at, r.status) for r in runs] == [(slot, "succeeded") for slot in slots]
    assert [slot for _, slot in fired] == slots


async def test_an_instance_started_with_its_clock_ahead_leaves_every_slot_of_the_grace_to_the_fleet(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """b starts with its clock 1.9 s ahead of a's (within what the clocks may differ by) when
    a has just fired 08:00:01 of an every-second schedule: by b's clock 08:00:02 and :03 are
    due. Only the newest was current; b's catch-up recorded 08:00:02 ``missed`` before a
    came to it, and that slot ran nowhere (each of four restarts of a real fleet lost one).
    Every slot due within the grace is current: each runs once, the claim deciding where."""
    from backend.clock import OffsetClock

    fired, engine = recording_fleet(make_engine, cron="* * * * * *")

    clock.set(at("2026-03-02T08:00:00.5Z"))
    a = engine("a")
    await a.start()
    clock.advance(0.6)  # 08:00:01.1: a fires 08:00:01
    await settle(clock, a)
    b = engine("b", clock=OffsetClock(1.9, clock))  # 08:00:03.0 by its clock
    await b.start()
    await settle(clock, a, b)
    for _ in range(4):  # to 08:00:03.1: a comes to :02 and :03, b to :04 and :05
        clock.advance(0.5)
        await settle(clock, a, b)
    runs = await all_runs(a, "job")
    slots = [at(f"2026-03-02T08:00:0{second}Z") for second in range(1, 6)]
    assert [(r.scheduled_at, r.status) for r in runs] == [(slot, "succeeded") for slot in slots]
    assert sorted(slot for _, slot in fired) == slots


async def test_default_coordination_comes_from_the_store(make_engine: Callable[..., Engine], store_url: str) -> None:
    engine = make_engine([schedule()])
    expected = "advisoryLock" if store_url.startswith("postgresql") else "single"
    assert engine.coordination == expected
    assert make_engine([schedule()], coordination="single").coordination == "single"


async def test_offset_clock_runs_ahead_or_behind_its_base(clock: ManualClock) -> None:
    """The seam the clock-skew fleet test starts `serve` with (SCHEDTUI_CLOCK_OFFSET_MS)."""
    from backend.clock import OffsetClock

    ahead, behind = OffsetClock(timedelta(milliseconds=300), clock), OffsetClock(-0.3, clock)
    assert ahead.now() - clock.now() == timedelta(milliseconds=300) == clock.now() - behind.now()
    slot = clock.now() + timedelta(seconds=1)

    async def wait(c: OffsetClock) -> None:
        await c.sleep_until(slot)
        assert c.now() >= slot  # never before its own reading of the slot

    early, late = asyncio.ensure_future(wait(ahead)), asyncio.ensure_future(wait(behind))
    while clock.sleepers < 2:  # both parked on the base clock
        await asyncio.sleep(0)
    clock.advance(0.7)  # the fast clock reads the slot 300 ms early...
    await asyncio.wait_for(early, 5)
    assert not late.done()  # ...the slow one 300 ms late
    clock.advance(0.6)
    await asyncio.wait_for(late, 5)


# ---------------------------------------------------------------------------------------
# a finish that waits in the writer (a short PostgreSQL restart)
# ---------------------------------------------------------------------------------------
class HeldBack:
    """Holds a PostgreSQL store's ledger writer back, as a restart of the server does: while
    ``down``, its writes fail (the rows stay in the writer, which then waits out its retry
    backoff, made an hour long here); ``committed`` is set by its next write that commits."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        from backend.store.postgres import ledger as postgres_ledger

        monkeypatch.setattr(postgres_ledger, "_RETRY_MIN", 3600.0)
        monkeypatch.setattr(postgres_ledger, "_RETRY_MAX", 3600.0)
        self.down = True
        self.failed = asyncio.Event()
        self.committed = asyncio.Event()
        upsert = store._upsert

        async def held_back(conn: Any, runs: list[Run]) -> None:
            if self.down:
                self.failed.set()
                raise Unavailable("the server restarted (test)")
            await upsert(conn, runs)
            self.committed.set()

        monkeypatch.setattr(store, "_upsert", held_back)


@pytest.mark.postgres
async def test_a_finish_waiting_in_the_writer_reaches_the_store_at_this_instances_next_statement(
    pg_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """advisoryLock, every-second schedules, a sub-second PostgreSQL restart: a's run
    finished while its writer could not write, and the writer waits out its backoff.
    Another instance, b (its claims sent here by hand), claims each slot before a does. Once
    a's own claim has gone through (and lost), a's finish is written, so b's next claim does
    not report a's run in flight (b recorded `skipped: overlap` against such runs for every
    slot until a's writer retried: 101 of them). A claim of b's before any statement of a's
    has gone through since the restart cannot be helped: nothing of a's reached the store."""
    a = Engine([schedule(cron="* * * * * *")], pg_url, clock=clock, instance="a", coordination="advisoryLock",
               shutdown_grace=0, abandon_after=3600)  # fmt: skip
    other = open_store(pg_url)
    await other.open()

    async def b_claims(slot: str) -> ClaimResult:
        when = at(slot)
        return await other.claim([Claim(slot_key("job", when), "job", f"b-{slot}", scheduled_at=when)], "b", when)

    try:
        held = HeldBack(a.store, monkeypatch)
        await a.start()
        finished = expect(a, lambda r: r.status != "running")
        clock.set(at("2026-03-02T08:00:01Z"))  # a alone: it claims 08:00:01 and runs it
        ran = await finished
        assert (ran.scheduled_at, ran.status) == (at("2026-03-02T08:00:01Z"), "succeeded")
        await held.failed.wait()
        held.down = False  # the server is back; a's writer waits out its backoff
        assert (await b_claims("2026-03-02T08:00:02Z")).won  # b first
        clock.set(at("2026-03-02T08:00:02Z"))  # a claims 08:00:02 too, and loses it
        await a.loops.quiesce(lambda: True, nothing)  # (not a.quiesce(): its flush would wake the writer)
        with contextlib.suppress(TimeoutError):  # (the bound only stops a broken test)
            await asyncio.wait_for(held.committed.wait(), 10)
        claimed = await b_claims("2026-03-02T08:00:03Z")
        assert claimed.won and claimed.busy == {}, f"b's claim reports a's run {claimed.busy} in flight"
    finally:
        await other.close()
        await a.stop(grace=0)


async def nothing() -> None:
    pass


@pytest.mark.postgres
async def test_the_ledger_writer_retries_at_once_when_the_store_answers_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its retry backoff is no reason to keep finished runs from the other instances: any
    statement of this process that goes through wakes it."""
    store: Any = open_store(pg_url)
    await store.open()
    try:
        held = HeldBack(store, monkeypatch)
        run = Run("01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "job", at("2026-03-02T08:00:00Z"), "succeeded", "self", "wonLock", "a",
                  at("2026-03-02T08:00:00Z"), at("2026-03-02T08:00:01Z"))  # fmt: skip
        store.save_runs([run])
        await held.failed.wait()
        held.down = False
        await store.instances()  # any statement
        await asyncio.wait_for(held.committed.wait(), 10)  # the bound only stops a broken test
        assert store.health().ok
        assert (await store.get_run(run.id)).status == "succeeded"
    finally:
        await store.close()
