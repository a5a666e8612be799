"""The liveness model (the README's "Never twice at once"): leases a worker must hold, what a
lapse stops, handlers that outlive their deadline, PID namespaces, outages, one mode per
fleet, and who counts as firing. On the manual clock, with an injected lease clock where
a lapse is the point; the real-process versions are in ``test_liveness_fleet.py``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from backend import Engine, JobContext, ManualClock, RunContext, Unavailable, define_queue, define_schedule, open_store
from backend.client.interface import ConnectionInfo
from backend.clock import Clock
from backend.model import TAG_LEASE_LOST
from backend.runtime.liveness import WorkLease
from backend.runtime.runner import Invocation
from backend.scheduler.registry import InstanceRegistry, pid_alive
from backend.store import Beat
from console.fleet import fleet_of
from tests.conftest import fail_once
from tests.servers import dead_pid

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


class LeaseClock:
    """A lease clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Overlap:
    """Counts the handlers of a queue running at once, and the attempts of each job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.most = 0
        self.most_per_job = 0
        self.starts: list[tuple[str, int]] = []

    def enter(self, job: JobContext) -> None:
        with self.lock:
            self.running[job.id] = self.running.get(job.id, 0) + 1
            self.starts.append((job.id, job.attempt))
            self.most = max(self.most, sum(self.running.values()))
            self.most_per_job = max(self.most_per_job, self.running[job.id])

    def leave(self, job: JobContext) -> None:
        with self.lock:
            self.running[job.id] -= 1


# ---------------------------------------------------------------------------------------
# the lease itself
# ---------------------------------------------------------------------------------------
def test_a_lease_lapses_at_its_bound_once_and_a_renewal_starts_a_new_epoch() -> None:
    clock = LeaseClock()
    lease = WorkLease(timedelta(seconds=30), clock)
    lease.enforced = True
    calls: list[str] = []
    lease.on_lapse.append(lambda why: calls.append("system"))
    lease.after_lapse = lambda why: calls.append("after")
    lease.renewed(lease.sending())
    assert lease.bound == 20 and lease.holds(0)
    clock.now += 19.9
    assert lease.fresh() and lease.remaining == pytest.approx(0.1)
    clock.now += 0.1
    assert not lease.holds(0)  # the bound passed without a renewal: lapsed, a new epoch
    assert (lease.epoch, lease.lapses, calls) == (1, 1, ["system", "after"])
    lease.check()
    assert calls == ["system", "after"]  # once
    stale = clock.now - 25
    lease.renewed(stale)  # a renewal sent before the lapse, answered late, renews nothing
    assert not lease.fresh()
    lease.renewed(lease.sending())
    assert lease.fresh() and lease.holds(1) and not lease.holds(0)  # work of the old epoch never goes on


def test_a_wall_clock_that_jumps_between_heartbeats_lapses_the_lease_at_once() -> None:
    """The wall clock is what the instance stamps its heartbeats and claims with; one that
    jumps (an NTP step, a VM restored) against the lease clock, which never does, makes
    those stamps wrong before the next heartbeat could compare it with the database's."""
    clock = LeaseClock()
    wall = LeaseClock()
    wall.now = 1_800_000_000.0
    lease = WorkLease(timedelta(seconds=60), clock, wall)  # a twelfth: 5 s
    lease.enforced = True
    lease.renewed(lease.sending())
    assert lease.jump_limit == 5
    clock.now += 3
    wall.now += 3 + 4.9  # slewed a little: within the limit
    assert lease.fresh()
    clock.now += 0.2
    wall.now += 0.2 - 70  # stepped back by 70 s
    assert lease.holds(0)  # a call's check (every durable step) looks at most every half second
    clock.now += 0.3
    assert not lease.holds(0) and lease.lapses == 1
    clock.now += 0.1
    lease.renewed(lease.sending())  # the next heartbeat: the database's clock agrees with the wall clock
    assert lease.holds(1)
    wall.now -= 30
    assert not lease.fresh() and lease.lapses == 2  # a claim looks at once (it judges others' stamps by it)
    clock.now += 0.1
    lease.renewed(lease.sending())
    assert lease.fresh()
    in_flight = lease.sending()  # a heartbeat on its way when the clock jumps
    wall.now += 60  # ahead by a minute: found by the heartbeat's own look, whenever it is
    lease.check_jump()
    assert lease.lapsed and lease.lapses == 3
    lease.renewed(in_flight)  # its answer, after the jump: it renews nothing
    assert lease.lapsed
    clock.now += 0.1
    lease.renewed(lease.sending())  # one sent after it (the database's clock agreeing) does
    assert lease.fresh()
    in_flight = lease.sending()
    wall.now -= 45  # stepped while the heartbeat is on its way, and nothing looked since
    lease.renewed(in_flight)  # its answer looks for the jump first
    assert lease.lapsed and lease.lapses == 4


def test_an_unenforced_lease_never_lapses() -> None:
    lease = WorkLease(timedelta(seconds=30), None)
    lease.enforced = True
    lease.renewed(lease.sending())
    assert lease.fresh() and lease.remaining is None


async def test_a_call_claimed_before_a_lapse_never_begins(make_engine: Callable[..., Engine]) -> None:
    lease_clock = LeaseClock()
    engine = make_engine([], lease_clock=lease_clock)
    await engine.start()
    began: list[int] = []

    class Call(Invocation):
        def begin(self, now: datetime) -> Any:
            began.append(1)
            return super().begin(now)

    call = Call("test call", timedelta(seconds=10), True)
    call.gate = asyncio.get_running_loop().create_future()  # its row's commit, still to come

    async def handler(arg: Any) -> None:
        began.append(2)

    engine.runner.start(call, handler)
    lease_clock.now += 21  # the process was frozen past the bound meanwhile
    call.gate.set_result(None)
    assert call.task is not None
    await call.task
    assert began == [] and call.outcome is not None and call.outcome.error_tag == TAG_LEASE_LOST
    assert call.has_ended


# ---------------------------------------------------------------------------------------
# handlers that outlive their deadline hold their place until they return
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async ignoring its cancellation"])
async def test_a_job_past_its_deadline_keeps_its_seat_and_its_retry_waits_until_it_returns(
    make_engine: Callable[..., Engine], clock: ManualClock, kind: str
) -> None:
    seen = Overlap()
    release = threading.Event()

    def blocking(job: JobContext) -> None:
        seen.enter(job)
        try:
            if job.payload == "slow" and job.attempt == 1:
                release.wait(30)
        finally:
            seen.leave(job)

    async def stubborn(job: JobContext) -> None:
        seen.enter(job)
        try:
            if job.payload == "slow" and job.attempt == 1:
                while not release.is_set():
                    try:
                        await asyncio.sleep(0.01)
                    except asyncio.CancelledError:
                        pass  # ignores its deadline
        finally:
            seen.leave(job)

    handler: Any = blocking if kind == "sync" else stubborn
    engine = make_engine([define_queue(name="q", handler=handler, concurrency=1, attempts=3, max_runtime=2)])
    await engine.start()
    slow = await engine.jobs.send("q", "slow")
    await engine.jobs.send("q", "fast")
    await engine.quiesce(runs=False)
    while not seen.starts:
        await asyncio.sleep(0.01)
    clock.advance(3)  # past max_runtime: the watchdog settles it as a timeout ...
    await engine.quiesce(runs=False)
    clock.advance(60)  # ... and its backoff (10 s) passes: still nothing else may start
    await engine.quiesce(runs=False)
    assert seen.starts == [(slow.id, 1)]
    job = (await engine.jobs.get_job(slow.id)).job
    assert job is not None and job.status == "running"  # its seat is taken in the store too
    release.set()
    await engine.quiesce()  # it returns: the attempt is handed in, the other job runs
    clock.advance(10)
    await engine.quiesce()
    assert seen.most == 1 and seen.most_per_job == 1
    assert [attempt for _, attempt in seen.starts] == [1, 1, 2]
    attempts = (await engine.jobs.get_job(slow.id)).attempts
    assert [(a.attempt, a.status, a.error_tag) for a in attempts] == [(1, "failed", "timeout"), (2, "succeeded", None)]
    assert "s later" in (attempts[0].error_message or "") and ": it returned " in (attempts[0].error_message or "")


async def test_a_step_on_a_thread_past_its_deadline_is_retried_only_once_it_returns(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    from backend import Retry, define_durable

    release = threading.Event()
    running = [0]
    most = [0]
    calls = [0]
    guard = threading.Lock()

    def step() -> str:
        with guard:
            calls[0] += 1
            running[0] += 1
            most[0] = max(most[0], running[0])
            first = calls[0] == 1
        try:
            if first:
                release.wait(30)
            return "done"
        finally:
            with guard:
                running[0] -= 1

    async def body(ctx: Any, input: Any) -> Any:
        return await ctx.step("slow", step, retry=Retry(attempts=3, initial_delay=1, max_delay=1))

    function = define_durable(name="f", handler=body, step_timeout=2)
    engine = make_engine([function])
    await engine.start()
    started = await engine.durable.start_execution("f", None)
    await engine.quiesce(runs=False)
    while calls[0] == 0:
        await asyncio.sleep(0.01)
    for _ in range(5):  # its deadline, the retry's delay, and more: the thread still runs
        clock.advance(3)
        await engine.quiesce(runs=False)
    assert calls[0] == 1
    release.set()
    while running[0]:
        await asyncio.sleep(0.01)
    # Its retry is due already (its delay passed while the thread ran): the engine may have
    # begun it by now, so let it end before the clock moves (by the step's timeout).
    await engine.quiesce()
    for _ in range(3):
        clock.advance(2)
        await engine.quiesce()
    execution = await engine.durable.get(started.id)
    assert (execution.status, calls[0], most[0]) == ("succeeded", 2, 1)


# ---------------------------------------------------------------------------------------
# a lapse: async work stops, claimed work never starts, sync work ends the process
# ---------------------------------------------------------------------------------------
async def test_a_lapsed_lease_stops_async_jobs_claims_nothing_and_resumes_once_renewed(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    lease_clock = LeaseClock()
    started: list[tuple[str, int]] = []
    cancelled: list[int] = []
    release = asyncio.Event()

    async def handler(job: JobContext) -> None:
        started.append((job.payload, job.attempt))
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(job.attempt)
            raise

    engine = make_engine(
        [define_queue(name="q", handler=handler, concurrency=4, attempts=5)], abandon_after=30, lease_clock=lease_clock
    )
    await engine.start()
    first = await engine.jobs.send("q", "a")
    await engine.quiesce(runs=False)
    while not started:
        await asyncio.sleep(0)
    assert engine.lease.fresh()
    lease_clock.now += 20  # cut off: no renewal within the bound
    engine.lease.check()
    await engine.quiesce(runs=False)
    assert cancelled == [1] and engine.lease.lapsed
    await engine.jobs.send("q", "b")
    await engine.quiesce(runs=False)
    assert [p for p, _ in started] == ["a"]  # nothing new is claimed while lapsed
    attempts = (await engine.jobs.get_job(first.id)).attempts
    assert [(a.status, a.error_tag) for a in attempts] == [("failed", TAG_LEASE_LOST)]
    clock.advance(5)  # the next heartbeat renews the lease
    await engine.quiesce(runs=False)
    assert not engine.lease.lapsed
    while len(started) < 3:
        await asyncio.sleep(0)
    assert sorted(started) == [("a", 1), ("a", 2), ("b", 1)]
    release.set()
    await engine.quiesce()


async def test_a_lapse_with_a_sync_handler_running_ends_the_process(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    ended: list[int] = []
    lease_clock = LeaseClock()
    release, entered = threading.Event(), threading.Event()

    def handler(job: JobContext) -> None:
        entered.set()
        release.wait(30)

    engine = make_engine([define_queue(name="q", handler=handler)], lease_clock=lease_clock)
    engine.end_process = ended.append
    await engine.start()
    await engine.jobs.send("q", "x")
    await engine.quiesce(runs=False)
    await asyncio.to_thread(entered.wait, 10)
    lease_clock.now += 20
    try:
        engine.lease.check()
        assert ended == [75]  # EX_TEMPFAIL: after every system let go of what it could
        assert "ENDING THE PROCESS: 1 sync handler(s) still run and a thread cannot be stopped" in caplog.text
    finally:
        release.set()


@pytest.mark.parametrize("returns", [False, True], ids=["runs-on", "returns-in-time"])
async def test_a_sync_handler_left_running_by_a_stop_ends_the_process_when_the_lease_would_lapse(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture, returns: bool
) -> None:
    """An engine stopped while a sync handler runs (a thread cannot be stopped) stays
    registered and beats no more: the others take its job over once its heartbeat is older
    than the window. A process that went on after the stop (an embedded engine stopped and
    started again) ran the handler beside its retry. It now ends when the lease would have
    lapsed if the handler still runs; a handler that returned first ends nothing."""
    ended = threading.Event()
    codes: list[int] = []
    lease_clock = LeaseClock()
    release, entered = threading.Event(), threading.Event()

    def handler(job: JobContext) -> None:
        entered.set()
        release.wait(30)

    def end_process(code: int) -> None:
        codes.append(code)
        ended.set()

    engine = make_engine([define_queue(name="q", handler=handler)], lease_clock=lease_clock)
    engine.end_process = end_process
    await engine.start()
    await engine.jobs.send("q", "x")
    await engine.quiesce(runs=False)
    await asyncio.to_thread(entered.wait, 10)
    try:
        await engine.stop(grace=0)
        watch = engine.after_stop
        assert watch is not None and watch.is_alive() and not codes  # (within the lease: it runs on)
        if returns:
            release.set()
            await asyncio.to_thread(watch.join, 10)  # it sees the handler gone and ends
            assert not watch.is_alive()
        lease_clock.now += 20  # past the renewal bound of the 30 s window
        if returns:
            assert not codes
        else:
            assert await asyncio.to_thread(ended.wait, 10) and codes == [75]
            assert "ENDING THE PROCESS: 1 sync handler(s) still run after this engine stopped" in caplog.text
    finally:
        release.set()


async def test_a_lapse_with_an_async_handler_that_ignores_its_cancellation_ends_the_process(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    ended = asyncio.Event()
    codes: list[int] = []
    lease_clock = LeaseClock()
    release = asyncio.Event()

    async def stubborn(job: JobContext) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass

    engine = make_engine([define_queue(name="q", handler=stubborn)], lease_clock=lease_clock)

    def end_process(code: int) -> None:
        codes.append(code)
        ended.set()

    engine.end_process = end_process
    await engine.start()
    await engine.jobs.send("q", "x")
    await engine.quiesce(runs=False)
    while not engine.jobs.workers or not engine.jobs.workers.running:
        await asyncio.sleep(0)
    lease_clock.now += 20
    engine.lease.check()
    assert codes == []  # cancelled: given a moment to return
    await asyncio.wait_for(ended.wait(), 10)
    assert codes == [75] and "1 handler(s) ignored their cancellation and still run" in caplog.text
    release.set()


async def test_async_runs_of_schedules_are_stopped_at_a_lapse(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    lease_clock = LeaseClock()
    gate = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        await gate.wait()

    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=handler)], lease_clock=lease_clock)
    await engine.start()
    clock.advance(60)
    await engine.quiesce(runs=False)
    lease_clock.now += 20
    engine.lease.check()
    await engine.quiesce()
    [run] = await engine.store.list_runs("s", limit=10)
    assert (run.status, run.error_tag) == ("failed", TAG_LEASE_LOST)


async def test_a_lost_slot_whose_wait_outlasts_a_lapse_is_missed_not_started(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A slot lost while the lease lapsed is claimed once it is renewed, and waits for the
    run of its schedule still in flight here (a sync handler, which a lapse cannot stop).
    A second lapse and renewal while it waited: it started all the same, under a claim of
    the lapsed lease (found in ``cluster`` coordination, where another member had taken the
    schedule's shard meanwhile and fired its current slot: two runs at once)."""
    lease_clock = LeaseClock()
    release = threading.Event()
    started: list[datetime] = []

    def handler(ctx: RunContext) -> None:
        started.append(ctx.scheduled_at)
        release.wait(30)

    engine = make_engine(
        [define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=handler, on_overlap="skip")],
        coordination="advisoryLock", lease_clock=lease_clock, exit_when_lease_lapses=False,
    )  # fmt: skip
    await engine.start()
    clock.advance(60)  # 08:01 starts, and runs on
    await engine.quiesce(runs=False)
    while not started:
        await asyncio.sleep(0)

    def lapse_then_renew() -> None:
        lease_clock.now += 21
        engine.lease.check()
        assert engine.lease.lapsed

    lapse_then_renew()
    clock.advance(60)  # 08:02 is due while lapsed: lost
    await engine.quiesce(runs=False)
    clock.advance(5)  # renewed; the next round claims 08:02, which waits for 08:01's handler
    await engine.quiesce(runs=False)
    assert not engine.lease.lapsed
    assert any(t.get_name() == "schedtui recover s" and not t.done() for t in engine.loops.tasks)  # (waiting)
    lapse_then_renew()
    clock.advance(5)
    await engine.quiesce(runs=False)
    assert not engine.lease.lapsed
    release.set()  # 08:01's handler returns: the lost slot's wait ends
    await engine.quiesce()
    runs = {run.scheduled_at.minute: run for run in await engine.store.list_runs("s", limit=10)}
    assert started == [T0 + timedelta(minutes=1)], started
    assert runs[2].status == "missed" and "lease lapsed while this lost slot waited" in (runs[2].error_message or "")


# ---------------------------------------------------------------------------------------
# a process that fires nothing but runs a handler holds a lease too
# ---------------------------------------------------------------------------------------
def _run_now_only(handler: Callable[..., Any]) -> Any:
    return define_schedule(name="job", cron="0 0 1 1 *", timezone="UTC", handler=handler)


async def test_a_run_now_of_a_process_that_fires_nothing_is_stopped_when_its_lease_lapses(
    make_engine: Callable[..., Engine],
) -> None:
    """``schedtui fire`` (opened, not started) runs a Run now: cut off past its renewal
    bound, it stops the handler as a member does. Before, it ran on: the instances that
    fire, which judge it gone after their window, closed its run ``abandoned`` and
    started the next slot beside it. Its next Run now renews the lease first."""
    lease_clock = LeaseClock()
    release, entered = asyncio.Event(), asyncio.Event()
    ends: list[str] = []

    async def handler(ctx: RunContext) -> None:
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise
        ends.append("returned")

    cli = make_engine([_run_now_only(handler)], instance="cli", lease_clock=lease_clock)
    await cli.open()
    assert not cli.lease.enforced  # only opened: it holds nothing yet
    run = await cli.run_now("job")
    await entered.wait()
    assert cli.lease.enforced and cli.lease.fresh()
    lease_clock.now += 20  # no heartbeat for the renewal bound (two thirds of 30 s)
    cli.lease.check()
    stopped = await cli.wait_run(run.id)
    await cli.quiesce()  # (the handler's task, cancelled, has ended)
    assert (stopped.status, stopped.error_tag, ends) == ("failed", TAG_LEASE_LOST, ["cancelled"])
    assert cli.lease.lapsed
    entered.clear()
    again = await cli.run_now("job")  # renewed first: it runs
    await entered.wait()
    assert not cli.lease.lapsed
    release.set()
    assert (await cli.wait_run(again.id)).status == "succeeded" and ends == ["cancelled", "returned"]


async def test_a_lapse_during_a_sync_run_now_of_a_process_that_fires_nothing_ends_it(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    ended: list[int] = []
    lease_clock = LeaseClock()
    release, entered = threading.Event(), threading.Event()

    def handler(ctx: RunContext) -> None:
        entered.set()
        release.wait(30)

    cli = make_engine([_run_now_only(handler)], instance="cli", lease_clock=lease_clock)
    cli.end_process = ended.append
    await cli.open()
    await cli.run_now("job")
    await asyncio.to_thread(entered.wait, 10)
    lease_clock.now += 20
    try:
        cli.lease.check()
        assert ended == [75]
        assert "ENDING THE PROCESS: 1 sync handler(s) still run and a thread cannot be stopped" in caplog.text
    finally:
        release.set()


async def test_a_process_that_fires_nothing_and_cannot_write_its_heartbeat_runs_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    started: list[int] = []
    cli = make_engine([_run_now_only(lambda ctx: started.append(1))], instance="cli", lease_clock=LeaseClock())
    await cli.open()
    fail_once(cli.store, "heartbeat", Unavailable("connection refused"))
    with pytest.raises(Unavailable, match=r'cannot fire "job" here: this process\'s heartbeat could not be written'):
        await cli.run_now("job")
    assert started == [] and await cli.store.list_runs("job", limit=5) == []
    await cli.run_now("job", wait=True)  # the store answers again
    assert started == [1]


# ---------------------------------------------------------------------------------------
# who is dead: PID namespaces, zombies, outages
# ---------------------------------------------------------------------------------------
def _registry(store: Any, clock: Clock, instance: str = "me") -> InstanceRegistry:
    return InstanceRegistry(
        clock=clock, store=store, ledger=None, instance=instance,  # type: ignore[arg-type]  # no ledger: the paths tested here never use one
        heartbeat_interval=timedelta(seconds=5), abandon_after=timedelta(seconds=30),
        retention=None, claims_ttl=None, is_ours=lambda _: False,
    )  # fmt: skip


def test_a_dead_pid_proves_death_only_within_its_pid_namespace(clock: ManualClock) -> None:
    registry = _registry(None, clock)
    host, boot, namespace = registry.host.split("#")
    dead = dead_pid()
    now = clock.now()
    beats = {
        "same": Beat(registry.host, dead, now),
        "container": Beat(f"{host}#{boot}#{int(namespace) + 1}", dead, now),  # same host, another PID namespace
        "old-version": Beat(f"{host}#{boot}", dead, now),  # a heartbeat without a namespace
    }
    assert "is no longer running" in (registry.gone(beats, "same", now) or "")
    assert registry.gone(beats, "container", now) is None  # its pid means another process here
    assert registry.gone(beats, "old-version", now) is None
    later = now + timedelta(seconds=31)
    assert "has not sent a heartbeat" in (registry.gone(beats, "container", later) or "")  # only the lease decides


def test_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen(["sleep", "0"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)  # (a real process exiting: nothing to await)
        assert not pid_alive(proc.pid)  # ended, not reaped yet: its work stopped
        assert pid_alive(os.getpid())
    finally:
        proc.wait()


class Outage:
    """A store whose heartbeats fail while ``down``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name not in ("heartbeat", "heartbeat_and_unfinished"):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise Unavailable("down (test)")
            return await value(*args, **kwargs)

        return call


async def test_an_outage_is_no_evidence_of_death(clock: ManualClock, store_url: str) -> None:
    store = Outage(open_store(store_url))
    await store.open()
    try:
        registry = _registry(store, clock)
        await registry.beat(clock.now())
        beats = {"other": Beat("elsewhere#1#2", 1, clock.now())}
        clock.advance(5)
        store.down = True
        with pytest.raises(Unavailable):
            await registry.beat(clock.now(), force=True)
        clock.advance(40)  # nobody could beat for 40 s
        store.down = False
        await registry.beat(clock.now(), force=True)
        assert registry.back_at == clock.now()
        assert registry.gone(beats, "other", clock.now()) is None  # counted from when the store came back
        clock.advance(30)
        assert registry.gone(beats, "other", clock.now()) is None
        clock.advance(1)
        assert "since the store was back" in (registry.gone(beats, "other", clock.now()) or "")
    finally:
        await store.close()


class SteppedClock:
    """A wall clock that may be stepped back (a ManualClock refuses to)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    async def sleep_until(self, deadline: datetime) -> None:
        raise AssertionError("not used")


async def test_a_heartbeat_after_the_clock_stepped_back_is_due_at_once(store_url: str) -> None:
    """A clock stepped back (NTP, a VM restored) must not hold the heartbeat, and with it the
    lease's renewal, until it has caught up with the last one's time."""
    clock = SteppedClock(T0)
    store = open_store(store_url)
    await store.open()
    try:
        registry = _registry(store, clock)
        assert await registry.beat(clock.now())
        clock.at += timedelta(seconds=1)
        assert not await registry.beat(clock.now())  # within the interval: not due
        clock.at -= timedelta(minutes=10)
        assert await registry.beat(clock.now())  # due at once, not ten minutes later
        clock.at += timedelta(seconds=1)
        assert not await registry.beat(clock.now())
    finally:
        await store.close()


def held_heartbeats(store: Any) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the store's heartbeats (with the sweep) until released: ``entered`` is set when
    one is held; ``release`` lets it, and every later one, through."""
    entered, release = asyncio.Event(), asyncio.Event()
    real = store.heartbeat_and_unfinished

    async def held(*args: Any, **kwargs: Any) -> Any:
        if not release.is_set():
            entered.set()
            await release.wait()
        return await real(*args, **kwargs)

    store.heartbeat_and_unfinished = held
    return entered, release


async def test_a_heartbeat_under_way_when_the_clock_moves_on_is_followed_by_a_fresh_one(
    store_url: str, clock: ManualClock
) -> None:
    """The housekeeping round and the lease loop both beat. One of them finding the other's
    beat under way used to skip its own, though that beat carried the time before the clock
    moved: the row kept a stamp an interval old, and the fleet counted the member gone."""
    store: Any = open_store(store_url)
    await store.open()
    entered, release = held_heartbeats(store)
    try:
        registry = _registry(store, clock)
        first = asyncio.ensure_future(registry.beat_and_sweep(clock.now()))
        await asyncio.wait_for(entered.wait(), 10)  # stamped with T0, not committed yet
        clock.advance(timedelta(minutes=1))
        second = asyncio.ensure_future(registry.beat_and_sweep(clock.now()))
        await asyncio.sleep(0)  # one loop step: it runs (ready tasks go in order) until it meets the beat under way
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert (await store.instances())["me"][2] == clock.now()
        assert not await registry.beat(clock.now())  # fresh: nothing more is due
    finally:
        await store.close()


async def test_a_beat_asked_with_a_time_read_before_a_newer_beat_does_not_put_the_stamp_back(
    store_url: str, clock: ManualClock
) -> None:
    """A housekeeping round reads the time first and beats after its other reads: a beat
    of the lease loop written meanwhile is newer. The round's older time used to pass for a
    clock stepped back: it beat again with it, and the row (and the next beat's due time)
    went back a minute: the fleet counted the member gone."""
    store: Any = open_store(store_url)
    await store.open()
    try:
        registry = _registry(store, clock)
        stale = clock.now()
        clock.advance(timedelta(minutes=1))
        assert await registry.beat(clock.now())
        assert await registry.beat_and_sweep(stale) == []
        assert (await store.instances())["me"][2] == clock.now()
        assert registry.next_beat_at(clock.now()) == clock.now() + registry.heartbeat_interval
    finally:
        await store.close()


async def test_a_lease_round_the_clock_moved_past_is_followed_at_once_by_a_fresh_heartbeat(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The lease loop used to park an interval from the time it read after its round: a
    round stamped before the clock moved on left the heartbeat a minute old until the
    next interval of the new time, and the fleet (and the metrics) counted the member gone."""
    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=lambda ctx: None)],
                         state_poll_interval=3600)  # (housekeeping, which beats too, stays parked)  # fmt: skip
    await engine.start()
    await engine.quiesce()
    store: Any = engine.store
    entered, release = held_heartbeats(store)
    clock.advance(engine.registry.heartbeat_interval)  # the lease loop's round: stamped now
    await asyncio.wait_for(entered.wait(), 10)
    clock.advance(timedelta(minutes=1))  # ... and the clock moves on before it commits
    release.set()
    await engine.quiesce()
    assert (await store.instances())[engine.instance][2] == clock.now()


@pytest.mark.postgres
@pytest.mark.parametrize("named", ["", "application_name=billing"], ids=["unnamed", "named-by-its-url"])
async def test_a_fleet_session_stuck_mid_statement_on_a_silent_client_is_ended_by_a_members_beat(
    pg_url: str, clock: ManualClock, named: str
) -> None:
    """``named``: the store URL names its sessions (``?application_name=billing``, as a
    service names itself in pg_stat_activity). They go by ``schedtui billing``: named
    ``billing`` alone, a beat found none of them, and a stuck one held its locks for hours."""
    url = pg_url + (("&" if "?" in pg_url else "?") + named if named else "")
    store: Any = open_store(url)
    await store.open()
    stuck = await psycopg.AsyncConnection.connect(store._conninfo, autocommit=True)  # a member's session
    try:
        await store.heartbeat("other", "h", 1, clock.now())
        # A client of the fleet sends a statement but not the message that ends it (the
        # extended protocol's Sync): a partition, or a process frozen mid-write. The server
        # has run it and waits, holding its row lock, with no timeout of its own.
        raw = stuck.pgconn
        raw.enter_pipeline_mode()
        raw.send_query_params(b"UPDATE schedtui_instances SET pid = 2 WHERE instance = 'other'", None)
        raw.flush()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND wait_event = 'ClientRead'"
        )
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as probe:
            while (await (await probe.execute(waiting, (raw.backend_pid,))).fetchone()) != (1,):
                await asyncio.sleep(0.01)  # the server is to read it: there is nothing to await
            await probe.execute("SET lock_timeout = '200ms'")
            blocked = "UPDATE schedtui_instances SET pid = 3 WHERE instance = 'other'"
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await probe.execute(blocked)
            # A beat ends only sessions stuck for longer than the take-over window.
            work = await store.heartbeat_and_unfinished("me", "h", 1, clock.now(), stuck_after=timedelta(hours=1))
            assert work.ended_sessions == 0
            work = await store.heartbeat_and_unfinished("me", "h", 1, clock.now(), stuck_after=timedelta(0))
            assert work.ended_sessions == 1
            await probe.execute(blocked)  # the lock is free: its transaction rolled back
            assert (await (await probe.execute("SELECT pid FROM schedtui_instances WHERE instance = 'other'")).fetchone()) == (3,)
            names = await (await probe.execute(
                "SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND application_name NOT LIKE 'schedtui-%%' "
                # An autovacuum worker on this new database shows there too, unnamed.
                "AND backend_type = 'client backend'")).fetchall()  # fmt: skip
            assert names == [("schedtui billing" if named else "schedtui",)]  # the pool's, as shown to a DBA
    finally:
        await stuck.close()
        await store.close()


# ---------------------------------------------------------------------------------------
# one fleet, one coordination; who counts as firing
# ---------------------------------------------------------------------------------------
def _every_minute(seen: list[str], instance: str) -> Any:
    async def handler(ctx: RunContext) -> None:
        seen.append(instance)

    return define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=handler)


@pytest.mark.postgres
async def test_an_instance_in_another_coordination_mode_waits_loudly_and_fires_once_alone(
    make_engine: Callable[..., Engine], clock: ManualClock, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    old = make_engine([_every_minute(seen, "old")], store=pg_url, instance="old", coordination="advisoryLock")
    new = make_engine([_every_minute(seen, "new")], store=pg_url, instance="new", coordination="cluster", shard_ttl=10)
    await old.start()
    await new.start()
    assert (old.registry.role, new.registry.role) == ("firing", "waiting")
    assert "fires nothing until no such instance is left" in caplog.text
    for _ in range(18):  # three minutes, both beating every 10 s (a jump past the window
        clock.advance(10)  # would be a freeze of both: each would count the other dead)
        await old.quiesce()
        await new.quiesce()
    assert seen == ["old"] * 3
    fleet = {i.name: (i.role, i.coordination) for i in await old.store.fleet()}
    assert fleet == {"old": ("firing", "advisoryLock"), "new": ("waiting", "cluster")}
    await old.stop()  # the rolling change goes on: the last instance of the old mode leaves
    for _ in range(60):  # (a cluster member renews its shards every ttl/3)
        clock.advance(2)
        await new.quiesce()
    assert new.registry.role == "firing"
    runs = await new.store.list_runs("tick", limit=100)
    slots = [r.scheduled_at for r in runs if r.status != "missed"]
    assert len(slots) == len(set(slots))  # never two runs of one slot
    assert seen[:3] == ["old"] * 3 and "new" in seen[3:] and "old" not in seen[3:]


async def test_two_modes_on_one_embedded_store_wait_too(make_engine: Callable[..., Engine]) -> None:
    first = make_engine([], instance="a", coordination="single")
    second = make_engine([], instance="b", coordination="advisoryLock")
    await first.open()
    await second.open()
    first.registry.member = second.registry.member = True
    now = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert await first.registry.beat(now, force=True)
    assert await second.registry.beat(now, force=True)
    assert (first.registry.role, second.registry.role) == ("firing", "waiting")


async def test_a_console_or_cli_is_an_observer_and_never_counts_as_firing(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    serve = make_engine([_every_minute([], "serve")], instance="serve")
    console = make_engine([_every_minute([], "console")], instance="console")
    await serve.start()
    await console.open()
    roles = {i.name: i.role for i in await console.store.fleet()}
    assert roles == {"serve": "firing", "console": "observer"}
    info = ConnectionInfo(kind="embedded", where="test", coordination="single", instance="other-console", read_only=False, fires=False)
    views = await console.list_schedules()
    assert [i.name for i in fleet_of(await console.store.fleet(), clock.now(), info, views).firing] == ["serve"]
    await serve.stop()
    assert fleet_of(await console.store.fleet(), clock.now(), info, views).silent  # NOTHING FIRES, whoever watches


# ---------------------------------------------------------------------------------------
# the watchdog keeps watching while the engine stops
# ---------------------------------------------------------------------------------------
async def test_a_run_past_its_deadline_during_a_graceful_stop_is_a_timeout(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    async def hang(ctx: RunContext) -> None:
        await asyncio.Event().wait()

    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=hang, max_runtime=2)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce(runs=False)
    stopping = asyncio.ensure_future(engine.stop(grace=20))  # a Ctrl-C: runs in flight get their grace
    while not engine.launcher.stopping:
        await asyncio.sleep(0)
    clock.advance(3)  # ... but not past their own deadline
    await asyncio.wait_for(stopping, 10)
    reader = make_engine([], instance="reader")  # (a stopped engine does not open again)
    await reader.open()
    [run] = await reader.store.list_runs("s", limit=10)
    assert (run.status, run.error_tag) == ("failed", "timeout")


async def test_on_sqlite_the_holder_of_the_firing_lock_is_alive_however_old_its_heartbeat(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    firer = make_engine([_every_minute([], "serve")], instance="serve")
    console = make_engine([_every_minute([], "console")], instance="console")
    await firer.start()  # takes the file's firing lock
    await console.open()
    hour_later = clock.now() + timedelta(hours=1)
    beats = {"serve": Beat("elsewhere#1#2", 1, clock.now())}  # silent for an hour (a full disk, say)
    assert console.registry.gone(beats, "serve", hour_later) is None
    await firer.stop()
    assert "has not sent a heartbeat" in (console.registry.gone(beats, "serve", hour_later) or "")
