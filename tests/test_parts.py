"""The engine's smaller parts on their own: the registry's verdicts, the ledger's hand-off,
schedule states, and the loops' parking (the timers and the runner: tests/test_runner.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend import ManualClock, RunContext, define_schedule, open_store
from backend.clock import OffsetClock
from backend.model import InstanceInfo, Run, RunStatus, ScheduleState
from backend.runtime.loops import Loops
from backend.scheduler.ledger import RunLedger
from backend.scheduler.registry import FORGET_SILENT, PRUNE_ROUND, InstanceRegistry, host_identity
from backend.scheduler.states import ScheduleStates
from backend.store import Beat
from console.cli.fleet import Instances, instances_table

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def run(id_: str, status: RunStatus = "running") -> Run:
    return Run(id_, "job", T0, status, "self", "single", "me")


# ---------------------------------------------------------------------------------------
# the registry: who is gone
# ---------------------------------------------------------------------------------------
def registry(store: Any = None, window: float = 30) -> InstanceRegistry:
    clock = ManualClock(T0)
    return InstanceRegistry(
        clock=clock,
        store=store,
        ledger=RunLedger(store),
        instance="me",
        heartbeat_interval=timedelta(seconds=5),
        abandon_after=timedelta(seconds=window),
        retention=None,
        claims_ttl=None,
        is_ours=lambda _: False,
    )


def test_gone_judges_pids_only_on_the_same_host_and_heartbeats_everywhere() -> None:
    reg = registry()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    here, fresh, stale = host_identity(), T0 - timedelta(seconds=5), T0 - timedelta(seconds=31)
    beats = {
        "alive-here": Beat(here, os.getpid(), fresh),
        "dead-here": Beat(here, dead_pid, fresh),
        "dead-pid-elsewhere": Beat("other#boot", dead_pid, fresh),
        "silent-elsewhere": Beat("other#boot", 1, stale),
    }
    assert reg.gone(beats, "alive-here", T0) is None
    assert "is no longer running" in (reg.gone(beats, "dead-here", T0) or "")
    assert reg.gone(beats, "dead-pid-elsewhere", T0) is None  # another machine's pid proves nothing
    assert "has not sent a heartbeat" in (reg.gone(beats, "silent-elsewhere", T0) or "")
    assert "no longer registered" in (reg.gone(beats, "unknown", T0) or "")
    assert "earlier process with this instance name" in (reg.gone(beats, "me", T0) or "")


async def test_the_retention_sweep_takes_a_bounded_part_a_round_until_none_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The whole backlog in one go at start held the first firing (and every write) 25 s.
    calls: list[int | None] = []
    left = [PRUNE_ROUND + PRUNE_ROUND // 2]

    class Backlog:
        async def prune_runs(self, created_before: datetime, limit: int | None = None, keep: Collection[str] = ()) -> int:
            calls.append(limit)
            removed = min(left[0], limit if limit is not None else left[0])
            left[0] -= removed
            return removed

    reg = registry(Backlog())
    reg.retention = timedelta(days=30)
    with caplog.at_level(logging.INFO, "schedtui"):
        for _ in range(4):
            await reg.prune(T0)
    assert calls == [PRUNE_ROUND, PRUNE_ROUND]  # the third round: the hour's sweep is done
    assert [r.getMessage() for r in caplog.records] == [f"retention: removed {PRUNE_ROUND * 3 // 2} run(s) older than 30 days, 0:00:00"]


async def test_a_member_forgets_instances_silent_for_a_day_once_their_last_burst_is_closed(store_url: str) -> None:
    # Every crashed instance stayed registered, listed `firing`, for ever.
    store = open_store(store_url)
    await store.open()
    try:
        old, recent = T0 - FORGET_SILENT - timedelta(seconds=1), T0 - FORGET_SILENT + timedelta(seconds=1)
        for name, at in (("crashed", old), ("crashed-mid-burst", old), ("frozen-a-while", recent)):
            await store.heartbeat(name, "host#1", 4242, at)
        await store.mark_starting("crashed-mid-burst", old)
        reg = registry(store)
        await reg.prune(T0)
        assert set(await store.instances()) == {"crashed", "crashed-mid-burst", "frozen-a-while"}  # not a member: reads only
        reg.member = True
        reg._last_prune = None
        await reg.prune(T0)
        assert set(await store.instances()) == {"crashed-mid-burst", "frozen-a-while"}
    finally:
        await store.close()


def test_the_instances_table_shows_one_silent_past_the_take_over_window_as_gone() -> None:
    now = T0
    table = instances_table(Instances(now, [
        InstanceInfo("alive", "h", 1, now - timedelta(seconds=5), role="firing"),
        InstanceInfo("killed", "h", 2, now - timedelta(minutes=33), role="firing"),
        InstanceInfo("console", "h", 3, now - timedelta(minutes=33), role="observer"),  # beats once: never gone
    ]))  # fmt: skip
    alive, killed, console = table.splitlines()[1:]
    assert alive.split()[:2] == ["alive", "firing"]
    assert killed.split()[:4] == ["killed", "✗", "gone", "(firing)"]
    assert console.split()[:2] == ["console", "observer"]


def test_an_instance_is_judged_by_when_it_beat_on_the_database_servers_clock() -> None:
    """Its stamps are its clock's: one 45 s behind that beat just now showed as ``✗ gone
    (firing) 49s ago``, and one five minutes ahead that crashed two minutes ago as beating
    ``in 3m``. Each stamp is taken back by the offset the instance recorded."""
    now = T0
    table = instances_table(Instances(now, [
        InstanceInfo("behind", "h", 1, now - timedelta(seconds=45), role="firing", clock_offset_s=-45.0, clock_off=True),
        InstanceInfo("crashed", "h", 2, now + timedelta(minutes=3), role="firing", clock_offset_s=300.0, clock_off=True),
    ]))  # fmt: skip
    behind, crashed = table.splitlines()[1:]
    assert behind.split()[:4] == ["behind", "firing", "0s", "ago"], behind
    assert crashed.split()[:6] == ["crashed", "✗", "gone", "(firing)", "2m", "ago"], crashed
def test_gone_judges_an_instance_by_its_own_window_or_the_judges_if_longer() -> None:
    """A fleet whose --abandon-after differs (a rolling change of it): an instance stops its
    own work at two thirds of its own window, so a judge with a shorter one took the work of
    a live instance after a pause of a few seconds, and ran it beside it."""
    long_window = {f"silent {s}s": Beat("other#boot", 1, T0 - timedelta(seconds=s), 30) for s in (7, 29, 31)}
    short = registry(window=6)
    assert short.gone(long_window, "silent 7s", T0) is None
    assert short.gone(long_window, "silent 29s", T0) is None
    assert "has not sent a heartbeat" in (short.gone(long_window, "silent 31s", T0) or "")
    brief = {"other": Beat("other#boot", 1, T0 - timedelta(seconds=7), 6)}
    assert registry(window=30).gone(brief, "other", T0) is None  # the judge's own window, if longer
    assert "has not sent a heartbeat" in (registry(window=6).gone(brief, "other", T0) or "")
    older = {"other": Beat("other#boot", 1, T0 - timedelta(seconds=7))}  # a row without its window
    assert "has not sent a heartbeat" in (registry(window=6).gone(older, "other", T0) or "")


async def test_close_abandoned_writes_only_runs_still_running(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        reg = registry(store)
        store.save_runs([run("A"), run("B", "succeeded")])
        await store.flush()
        closed = await reg.close_abandoned()  # "me" is this name: an earlier process stopped
        assert [(r.id, r.status, r.error_tag) for r in closed] == [("A", "failed", "abandoned")]
        assert await reg.close_abandoned() == []  # closed once
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_dead_instances_burst_is_closed_in_one_write(kind: str, request: pytest.FixtureRequest) -> None:
    # A sweep that found a burst of runs left running (a dead member's, or one of ours read
    # just as it finished) wrote one statement per run: 250 transactions in one fleet run.
    store = open_store(request.getfixturevalue("pg_url" if kind == "postgres" else "store_url"))
    await store.open()
    try:
        reg = registry(store)
        await store.heartbeat("alive", "elsewhere", 1, T0)
        dead = [dataclasses.replace(run(f"d{i:02d}"), name=f"tick{i}", instance="dead") for i in range(50)]
        alive = dataclasses.replace(run("a"), instance="alive")
        store.save_runs([*dead, alive, run("done", "succeeded")])
        await store.flush()
        calls: list[int] = []
        close_runs = store.close_runs

        async def counted(runs: Any) -> set[str]:
            calls.append(len(runs))
            return await close_runs(runs)

        store.close_runs = counted  # type: ignore[method-assign]  # counts the runs closed per call
        closed = await reg.close_abandoned()
        assert sorted(r.id for r in closed) == [r.id for r in dead]
        assert all(r.error_tag == "abandoned" and "no longer registered" in (r.error_message or "") for r in closed)
        assert calls == [50]
        assert [r.id for r in await store.running_runs()] == ["a"]
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_the_periodic_round_is_one_call_that_beats_and_sweeps(kind: str, request: pytest.FixtureRequest) -> None:
    # A member's heartbeat and its abandoned-work sweep were two transactions every few
    # seconds, on every member of a fleet: now one, and only when the heartbeat is due.
    url = request.getfixturevalue("pg_url" if kind == "postgres" else "store_url")
    store = open_store(url)
    await store.open()
    try:
        reg = registry(store)
        calls: list[str] = []
        inside: list[str] = []  # SQLite's round is made of the other three: count the outer call
        for name in ("heartbeat", "unfinished_work", "instances", "heartbeat_and_unfinished"):
            method = getattr(store, name)

            async def counted(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
                if not inside:
                    calls.append(_name)
                inside.append(_name)
                try:
                    return await _method(*args, **kwargs)
                finally:
                    inside.pop()

            setattr(store, name, counted)
        store.save_runs([run("A")])  # left running by "me": an earlier process of this name
        await store.flush()
        closed = await reg.beat_and_sweep(T0)
        assert [(r.id, r.error_tag) for r in closed] == [("A", "abandoned")]
        assert calls == ["heartbeat_and_unfinished"]
        assert (await store.instances())["me"][2] == T0  # the heartbeat was written
        assert await reg.beat_and_sweep(T0 + timedelta(seconds=4)) == []  # not due yet: nothing asked
        assert calls == ["heartbeat_and_unfinished", "instances"]
        await reg.beat_and_sweep(T0 + timedelta(seconds=5))
        assert calls[-1] == "heartbeat_and_unfinished" and (await store.instances())["me"][2] == T0 + timedelta(seconds=5)
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------
# the ledger: order and the burst hold
# ---------------------------------------------------------------------------------------
class RecordingStore:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def save_runs(self, runs: list[Run]) -> None:
        self.batches.append([f"{r.id}:{r.status}" for r in runs])


async def test_a_held_ledger_hands_the_whole_burst_over_at_once_in_order() -> None:
    store = RecordingStore()
    ledger = RunLedger(store)  # type: ignore[arg-type]  # a stand-in that only records what it is handed
    seen: list[str] = []
    ledger.listeners.append(lambda r: seen.append(r.id))

    def failing(r: Run) -> None:
        raise ZeroDivisionError("division by zero")  # as 1 / 0 does

    ledger.listeners.append(failing)  # a failing listener is logged, never fatal
    with ledger.hold():
        ledger.record(run("A"))
        await asyncio.sleep(0)
        ledger.record(run("B"))
        await asyncio.sleep(0)
        assert store.batches == []  # nothing handed over while held
        ledger.record(run("A", "succeeded"))
    assert store.batches == [["A:running", "B:running", "A:succeeded"]]
    assert seen == ["A", "B", "A"]
    ledger.record(run("C"))
    await asyncio.sleep(0)
    assert store.batches[-1] == ["C:running"]


# ---------------------------------------------------------------------------------------
# schedule states
# ---------------------------------------------------------------------------------------
async def test_states_report_each_change_once_whoever_made_it(store_url: str) -> None:
    async def noop(ctx: RunContext) -> None:
        pass

    job = define_schedule(name="job", cron="* * * * *", timezone="UTC", handler=noop)
    store = open_store(store_url)
    await store.open()
    try:
        states = ScheduleStates(store, {"job": job})
        changes: list[bool] = []
        states.on_change = lambda schedule, state: changes.append(state.enabled)
        await states.load()
        assert states.is_enabled("job")
        await store.set_state(ScheduleState("job", False, "someone else", T0))
        await states.refresh()
        await states.refresh()
        await states.set("job", False, at=T0, by="me", note="again")  # already disabled: no change
        await states.set("job", True, at=T0, by="me")
        assert changes == [False, True]
        with pytest.raises(Exception, match="longer than 1000"):
            await states.set("job", False, at=T0, by="me", note="x" * 1001)
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------
# loops
# ---------------------------------------------------------------------------------------
async def test_a_loop_is_idle_only_while_parked_with_nothing_due() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    wake = asyncio.Event()
    loops.expect("worker")
    assert not loops.idle()  # expected but not parked yet
    rounds: list[datetime] = []

    async def worker() -> None:
        while True:
            rounds.append(clock.now())
            await loops.park("worker", clock.now() + timedelta(seconds=10), wake)

    loops.spawn(worker(), "worker")

    async def nothing() -> None:
        pass

    await loops.quiesce(lambda: True, nothing)
    assert rounds == [T0]
    assert not loops.needs_wake("worker", T0 + timedelta(seconds=20))  # it wakes before that anyway
    assert loops.needs_wake("worker", T0 + timedelta(seconds=5))
    clock.advance(10)
    await loops.quiesce(lambda: True, nothing)
    wake.set()
    await loops.quiesce(lambda: True, nothing)
    assert rounds == [T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=10)]
    await loops.cancel_all()


async def test_a_park_returns_at_its_time_or_its_wake_and_leaves_no_sleeper_behind() -> None:
    """Every way a park ends: its wake already set (at once, cleared), set while it waits,
    its time reached on the clock, and cancelled; none leaves a sleeper on the clock."""
    clock = ManualClock(T0)
    loops = Loops(clock)
    wake = asyncio.Event()

    async def asleep() -> None:
        while clock.sleepers == 0:
            await asyncio.sleep(0)

    wake.set()
    await loops.park("p", T0 + timedelta(seconds=5), wake)
    assert not wake.is_set() and clock.sleepers == 0
    parked = asyncio.ensure_future(loops.park("p", T0 + timedelta(seconds=5), wake))
    await asyncio.wait_for(asleep(), 5)
    wake.set()
    await parked
    assert not wake.is_set() and clock.sleepers == 0
    for timed, wakes in ((True, wake), (True, None), (False, wake)):
        until = clock.now() + timedelta(seconds=5) if timed else None
        parked = asyncio.ensure_future(loops.park("p", until, wakes))
        await asyncio.sleep(0)
        assert not parked.done()
        if until is not None:
            await asyncio.wait_for(asleep(), 5)
            clock.advance(5)
        else:
            wake.set()
        await parked
        assert clock.sleepers == 0
    parked = asyncio.ensure_future(loops.park("p", clock.now() + timedelta(seconds=5), wake))
    await asyncio.wait_for(asleep(), 5)
    parked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await parked
    await asyncio.sleep(0)
    assert clock.sleepers == 0 and not loops._parking["p"].parked


async def test_a_loop_parked_on_the_real_clock_wakes_when_that_clock_steps_back() -> None:
    """Parked a fifth of a second on the machine's clock, a loop whose clock then stepped a
    minute back (NTP fixing a clock that was ahead) idled that minute: it delivered no page
    and claimed no job. It wakes once the span it parked for has passed, and reads the clock
    again; on a clock that does not step (an injected one) nothing changes."""
    clock = OffsetClock(timedelta(0))
    loops = Loops(clock)
    parked = asyncio.ensure_future(loops.park("p", clock.now() + timedelta(seconds=0.2)))
    await asyncio.sleep(0)
    clock.offset = timedelta(seconds=-60)
    await asyncio.wait_for(parked, 5)  # (without the bound: a minute)
    manual = ManualClock(T0)
    still = asyncio.ensure_future(Loops(manual).park("p", T0 + timedelta(seconds=0.2)))
    await asyncio.sleep(0.5)
    assert not still.done()
    manual.advance(0.2)
    await asyncio.wait_for(still, 5)


async def test_a_loop_whose_work_lost_a_cancellation_still_stops() -> None:
    # A cancellation can be lost inside a loop's work: Python 3.11's asyncio.wait_for drops
    # one that arrives as its inner future finishes (connection pools wait through it), and
    # a driver may turn it into an error the loop catches. Parking must not then wait for
    # ever: stop() would hang on the loop.
    loops = Loops(ManualClock())
    swallowed = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # lost, as described above

    async def loop() -> None:
        while True:
            await work()
            await loops.park("lossy", None)

    loops.spawn(loop(), "lossy")
    await asyncio.sleep(0)
    await asyncio.wait_for(loops.cancel_all(), 5)
    assert swallowed.is_set() and not loops.tasks


async def test_a_stop_ends_a_loop_whose_cancellation_was_dropped_in_its_work(clock: ManualClock) -> None:
    # Python 3.11's asyncio.wait_for (psycopg's pool uses it) can drop a cancellation; a
    # loop that then waits again on its own event hung the engine's stop (a durable test on
    # PostgreSQL hung one run in five, in the relay's notification loop).
    loops = Loops(clock)
    dropped = asyncio.Event()

    async def loop_that_loses_one_cancellation() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if dropped.is_set():
                    raise
                dropped.set()  # as if a driver's wait_for had swallowed it: the loop goes on

    loops.spawn(loop_that_loses_one_cancellation(), "careless")
    await asyncio.sleep(0)
    await asyncio.wait_for(loops.cancel_all(), 10)  # the timeout only bounds a broken test
    assert dropped.is_set() and not loops.tasks


async def test_a_kept_loop_that_raises_starts_again_after_a_pause_that_doubles(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A long-lived loop's round that raises what it did not expect (a store error of a
    kind it does not handle, a bug) must not end the loop for good: the lease, the timers
    and the workers would stop while the process looks alive. It starts again after 1 s,
    then 2 s, 4 s…, parked meanwhile (so quiesce() returns), the first failure logged
    with its traceback."""
    loops = Loops(clock)
    loops.expect("worker")
    calls: list[datetime] = []

    async def worker() -> None:
        calls.append(clock.now())
        if len(calls) <= 3:
            raise RuntimeError(f"round {len(calls)} broke")
        await loops.park("worker", None)

    async def nothing() -> None:
        pass

    loops.keep(worker, "worker")
    await asyncio.wait_for(loops.quiesce(lambda: True, nothing), 10)  # the timeout only bounds a broken test
    assert calls == [T0]
    for pause in (1, 2, 4):
        clock.advance(pause - 0.5)
        await asyncio.wait_for(loops.quiesce(lambda: True, nothing), 10)
        assert len(calls) == {1: 1, 2: 2, 4: 3}[pause]  # not yet
        clock.advance(0.5)
        await asyncio.wait_for(loops.quiesce(lambda: True, nothing), 10)
    assert [(c - T0).total_seconds() for c in calls] == [0, 1, 3, 7]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "worker failed (RuntimeError: round 1 broke" in errors[0].getMessage()
    assert "starts again in 1s" in errors[0].getMessage() and errors[0].exc_info is not None
    assert len(loops.tasks) == 1  # the same task, still running
    await loops.cancel_all()


async def test_a_kept_loop_that_never_parks_starts_again_on_the_clock(clock: ManualClock) -> None:
    loops = Loops(clock)
    calls: list[datetime] = []
    stop = asyncio.Event()

    async def listener() -> None:
        calls.append(clock.now())
        if len(calls) == 1:
            raise ValueError("a reply it did not expect")
        await stop.wait()

    loops.keep(listener, "listener")
    while clock.sleepers == 0:
        await asyncio.sleep(0)
    assert calls == [T0] and "listener" not in loops._parking  # quiesce() never waits for it
    clock.advance(1)
    while len(calls) < 2:
        await asyncio.sleep(0)
    assert calls == [T0, T0 + timedelta(seconds=1)]
    await loops.cancel_all()
    assert not loops.tasks
