"""An instance whose clock is off the database server's (backend/runtime/skew.py).

Heartbeats are stamped and judged by each instance's own clock, so a clock far off breaks
"never twice at once" either way: one behind looks dead to the others while it works, one
ahead judges the others dead too early. Each heartbeat on PostgreSQL reads the server's
clock too; past a twelfth of the take-over window the instance's lease lapses until they
agree, and it closes none of the others' work meanwhile. These tests run engines on the
real clock shifted by an :class:`~backend.clock.OffsetClock` (the clock a badly synced
machine would have), with a short window (3 s: the limit is 0.5 s).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from backend import Engine, JobContext, Refused, RunContext, connect, define_queue, define_schedule
from backend.alerts.conditions import not_firing
from backend.alerts.notifier import AlertSettings
from backend.clock import ManualClock, OffsetClock, SystemClock, follows_real_time
from backend.model import InstanceInfo
from backend.observability.metrics import EngineMetrics
from backend.runtime.liveness import STOP_SHARE, WorkLease, linger_grace
from backend.runtime.skew import ClockCheck, ClockReading
from tests.servers import until

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WINDOW = 3.0  # --abandon-after: the clock may be off by 0.5 s


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# ---------------------------------------------------------------------------------------
# the reading and the verdict
# ---------------------------------------------------------------------------------------
def test_a_reading_is_the_offset_from_the_middle_of_its_round_trip() -> None:
    ahead = ClockReading.between(at(10.0), at(0.0), at(10.2))  # the server read 0 while this clock read 10-10.2
    assert ahead.offset == pytest.approx(10.1) and ahead.uncertainty == pytest.approx(0.1)
    behind = ClockReading.between(at(0.0), at(7.0), at(0.02))
    assert behind.offset == pytest.approx(-6.99) and behind.uncertainty == pytest.approx(0.01)


def test_the_verdict_changes_only_on_readings_that_surely_cross_the_limit() -> None:
    check = ClockCheck(timedelta(seconds=60))  # a twelfth: 5 s
    assert check.limit == 5.0 and not check.off and check.offset is None
    assert not check.judge(ClockReading(4.9, 0.0)) and not check.off
    assert check.judge(ClockReading(-6.0, 0.5)) and check.off  # surely over, behind
    assert "6.0s behind the database server's" in check.describe()
    assert not check.judge(ClockReading(5.2, 0.4)) and check.off  # 4.8-5.6: cannot tell, kept
    assert not check.judge(ClockReading(7.0, 0.1)) and check.off  # still off, no change to say
    assert check.judge(ClockReading(0.3, 0.2)) and not check.off
    assert "agrees with the database server's again (+0.300s)" in check.describe()
    assert not check.judge(ClockReading(4.8, 0.4)) and not check.off  # 4.4-5.2: cannot tell, kept
    assert check.offset == 4.8


@pytest.mark.parametrize("window", [1, 6, 30, 300, 86_400])
def test_the_margin_holds_two_clocks_off_either_way_and_the_stop(window: int) -> None:
    """The latest a holder's work runs after its last renewal: the renewal bound, then the
    lapse's stop (a handler that ignores its cancellation, then the process's end). The
    earliest another takes it over: the window, less the holder's clock behind by the limit
    and the taker's ahead by as much. The first comes before the second, whatever the window."""
    span = timedelta(seconds=window)
    lease, check = WorkLease(span), ClockCheck(span)
    assert lease.jump_limit == check.limit
    holder_gone = lease.bound + linger_grace(span)
    taken_over = window - 2 * check.limit
    assert holder_gone < taken_over - window * STOP_SHARE / 2 + 1e-9, (holder_gone, taken_over)


def test_only_a_clock_on_real_time_is_compared_with_the_databases() -> None:
    assert follows_real_time(SystemClock()) and follows_real_time(OffsetClock(-3.0))
    assert not follows_real_time(ManualClock()) and not follows_real_time(OffsetClock(1.0, ManualClock()))


# ---------------------------------------------------------------------------------------
# the heartbeat row's account of it
# ---------------------------------------------------------------------------------------
def test_an_instance_row_carries_its_clock_in_json_and_an_older_servers_json_reads_without_it() -> None:
    off = InstanceInfo("web-2", "h", 2, at(0), role="firing", coordination="advisoryLock", clock_offset_s=-61.04,
                       clock_off=True)  # fmt: skip
    data = off.to_json(at(1))
    assert (data["clock_offset_s"], data["clock_off"]) == (-61.04, True)
    assert data["stands_down"] == (
        "its clock is 61.0s behind the database server's: it fires nothing and takes no work until they agree "
        "(fix its time sync)"
    )
    assert InstanceInfo.from_json(data) == off
    observer = InstanceInfo("console", "h", 3, at(0), role="observer", clock_offset_s=70.0, clock_off=True)
    assert observer.to_json(at(1))["stands_down"] is None  # it takes no work anyway
    older = {k: v for k, v in data.items() if k not in ("clock_offset_s", "clock_off", "stands_down")}
    read = InstanceInfo.from_json(older)
    assert (read.clock_offset_s, read.clock_off, read.stands_down) == (None, False, False)


async def test_an_instance_on_sqlite_leaves_its_clock_unmeasured(tmp_path: Any) -> None:
    """One machine's file: no server clock to compare with (nor a fleet to mislead)."""
    engine = Engine([], f"sqlite:///{tmp_path}/state.db", instance="solo", heartbeat_interval=0.2, shutdown_grace=0)
    await engine.start()
    try:
        assert engine.registry.clock_check is None
        await engine.registry.beat(engine.clock.now(), force=True)
        (row,) = await engine.store.fleet()
        assert (row.name, row.clock_offset_s, row.clock_off) == ("solo", None, False)
    finally:
        await engine.stop(grace=0)


# ---------------------------------------------------------------------------------------
# engines on PostgreSQL, on the real clock
# ---------------------------------------------------------------------------------------
async def own_row(engine: Engine, wanted: Callable[[InstanceInfo], bool], what: str) -> InstanceInfo:
    """The engine's heartbeat row once it is as ``wanted`` (a heartbeat carries the reading
    taken after the one before it)."""
    deadline = asyncio.get_running_loop().time() + 15.0
    while True:
        (row,) = [i for i in await engine.store.fleet() if i.name == engine.instance]
        if wanted(row):
            return row
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the row: {row}")
        await asyncio.sleep(0.02)


def counted_readings(engine: Engine) -> list[float]:
    """Count the engine's readings of the server's clock (one per heartbeat)."""
    store: Any = engine.store
    read = store.server_clock
    readings: list[float] = []

    async def counting() -> datetime:
        server: datetime = await read()
        readings.append(server.timestamp())
        return server

    store.server_clock = counting
    return readings


pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("offset", [60, -60], ids=["ahead", "behind"])
async def test_a_member_whose_clock_is_off_stops_takes_nothing_and_resumes_once_the_clocks_agree(
    pg_url: str, caplog: pytest.LogCaptureFixture, offset: int
) -> None:
    caplog.set_level(logging.INFO, logger="schedtui")
    started: list[str] = []

    async def handler(job: JobContext) -> None:
        started.append(job.payload)

    queue = define_queue(name="q", handler=handler)
    clock = OffsetClock(timedelta(seconds=offset))  # a minute ahead of the database, or behind it
    engine = Engine([queue], pg_url, clock=clock, instance="off", abandon_after=WINDOW, heartbeat_interval=0.2,
                    shutdown_grace=0)  # fmt: skip
    readings = counted_readings(engine)
    await engine.start()
    try:
        check = engine.registry.clock_check
        assert check is not None and check.off and abs((check.offset or 0) - offset) < 1.0
        assert engine.lease.lapsed and engine.lease.lapses == 1 and not engine.lease.fresh()
        metrics = EngineMetrics(engine)  # what a scrape says of it
        text = generate_latest(metrics.registry).decode()
        metrics.close()
        scraped = re.search(r"^schedtui_clock_offset_seconds (\S+)$", text, re.MULTILINE)
        assert scraped is not None and abs(float(scraped.group(1)) - offset) < 1.0, text
        assert re.search(r"^schedtui_lease_lapses_total 1\.0$", text, re.MULTILINE), text
        # Its heartbeat row tells the fleet which instance stands down, and by how much.
        row = await own_row(engine, lambda i: i.clock_off, "the row to say the clock is off")
        assert row.role == "firing" and row.stands_down and abs((row.clock_offset_s or 0) - offset) < 1.0
        # ... and the fleet's counts: it is no firing member, and the fleet pages for it.
        metrics = EngineMetrics(engine)
        text = (await metrics.render()).decode()  # a scrape (it waits for the store's first read)
        metrics.close()
        assert re.search(r'^schedtui_instances\{role="firing"\} 0\.0$', text, re.MULTILINE), text
        assert re.search(r'^schedtui_instances\{role="standing_down"\} 1\.0$', text, re.MULTILINE), text
        now = engine.registry.store_time(engine.clock.now())  # (what its alerting judges by)
        paged = not_firing(await engine.store.fleet(), now, timedelta(seconds=WINDOW))
        assert paged is not None and paged.summary.startswith("no instance fires: off stands down, its clock is 60.")
        health = (await engine.health()).to_json()  # what /healthz says of it
        assert health["instances"] is not None
        (said,) = [i for i in health["instances"] if i["name"] == "off"]
        where = "ahead of" if offset > 0 else "behind"
        assert said["clock_off"] and said["clock_offset_s"] is not None and abs(said["clock_offset_s"] - offset) < 1.0
        reason = said["stands_down"]
        assert reason is not None and reason.startswith("its clock is 60.") and f"{where} the database server's" in reason
        assert InstanceInfo.from_json(said).stands_down  # what a remote client reads back
        async with connect(pg_url, definitions=[queue]) as client:  # an observer on this machine's clock
            sent = await client.engine.jobs.send("q", "a")
        seen = len(readings)
        await until(lambda: len(readings) >= seen + 3, "three more heartbeats")
        assert started == [] and engine.lease.lapsed and engine.lease.lapses == 1  # one lapse, held
        detail = await engine.jobs.get_job(sent.id)
        assert detail.job is not None and detail.job.status == "queued" and detail.attempts == []
        clock.offset = timedelta(0)  # its time sync is fixed
        await until(lambda: not engine.lease.lapsed, "the lease renewed")
        await until(lambda: started == ["a"], "the job to run")
        assert not check.off and check.offset is not None and abs(check.offset) < 0.5  # 0.0 is a reading
        row = await own_row(engine, lambda i: not i.clock_off, "the row to say the clocks agree")
        assert row.clock_offset_s is not None and abs(row.clock_offset_s) < 0.5 and row.clock_text() is None
    finally:
        await engine.stop(grace=0)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("CLOCK: this instance's clock is 60.") and f"{where} the database server's" in m
               for m in messages), messages  # fmt: skip
    assert any(m.startswith("LEASE LAPSED: this instance's clock is 60.") for m in messages), messages
    assert any("agrees with the database server's again" in m for m in messages), messages


async def test_an_instance_whose_clock_is_ahead_closes_no_live_instances_runs(pg_url: str) -> None:
    """Its clock a minute ahead, every other instance's heartbeat looks a minute old: without
    the comparison it would close their runs in flight as abandoned at its first look."""
    release = asyncio.Event()

    async def slow(ctx: RunContext) -> None:
        await release.wait()

    schedule = define_schedule(name="slow", cron="0 0 1 1 *", timezone="UTC", handler=slow)
    live = Engine([schedule], pg_url, instance="live", abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0)
    ahead = Engine([schedule], pg_url, clock=OffsetClock(timedelta(seconds=60)), instance="ahead", abandon_after=WINDOW,
                   heartbeat_interval=0.2, shutdown_grace=0)  # fmt: skip
    await live.start()
    try:
        run = await live.run_now("slow", wait=False)
        readings = counted_readings(ahead)
        await ahead.start()  # opening closes what dead instances left: none of it is
        await until(lambda: len(readings) >= 4, "a few heartbeats (and sweeps) of the instance ahead")
        assert ahead.registry.clock_off
        still = await live.store.get_run(run.id)
        assert still is not None and still.status == "running"
        release.set()

        async def ended() -> bool:  # (its end is written after the launcher lets go of it)
            got = await live.store.get_run(run.id)
            return got is not None and got.status != "running"

        await until(ended, "the run's end to be written")
        finished = await live.store.get_run(run.id)
        assert finished is not None and finished.status == "succeeded"
    finally:
        release.set()
        await ahead.stop(grace=0)
        await live.stop(grace=0)


async def test_a_clock_stepped_back_while_a_job_runs_stops_it_before_a_heartbeat_stamps_it(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The wall clock stepped back a minute (an NTP step) while a job runs: the lease clock
    does not jump, so the lease lapses (within half a second, or before the next heartbeat,
    whichever comes first) before a heartbeat is stamped with the wrong time, and the job
    stops (``lease_lost``) rather than run on beside a take-over."""
    caplog.set_level(logging.INFO, logger="schedtui")
    running = asyncio.Event()
    cancelled: list[str] = []

    async def handler(job: JobContext) -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    clock = OffsetClock(timedelta(0))
    engine = Engine([define_queue(name="q", handler=handler)], pg_url, clock=clock, instance="stepped", abandon_after=60,
                    heartbeat_interval=30, shutdown_grace=0)  # fmt: skip
    await engine.start()
    try:
        job = await engine.jobs.send("q", "a")
        await asyncio.wait_for(running.wait(), 10)
        clock.offset = timedelta(seconds=-70)
        await until(lambda: cancelled == [job.id], "the job to stop", timeout=5)
        assert engine.lease.lapsed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15  # (the attempt's end is written after its handler stopped)
        while not (detail := await engine.jobs.get_job(job.id)).attempts and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert [(a.status, a.error_tag) for a in detail.attempts] == [("failed", "lease_lost")]
    finally:
        await engine.stop(grace=0)
    lapses = [r.getMessage() for r in caplog.records if r.getMessage().startswith("LEASE LAPSED")]
    assert len(lapses) == 1 and lapses[0].startswith("LEASE LAPSED: the wall clock jumped -70."), lapses


async def test_an_instance_whose_clock_jumps_ahead_closes_no_live_instances_jobs(pg_url: str) -> None:
    """A clock that jumps a minute ahead sees every other heartbeat a minute old: its very
    next look for dead instances' jobs (before any heartbeat or watcher could notice) must
    not close a live instance's job in flight, which would retry it beside itself."""
    release = asyncio.Event()
    started: list[str] = []

    async def handler(job: JobContext) -> None:
        started.append(job.id)
        await release.wait()

    queue = define_queue(name="q", handler=handler)
    live = Engine([queue], pg_url, instance="live", abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0)
    clock = OffsetClock(timedelta(0))
    jumpy = Engine([queue], pg_url, clock=clock, instance="jumpy", abandon_after=WINDOW, heartbeat_interval=0.2,
                   shutdown_grace=0)  # fmt: skip
    await live.start()
    try:
        job = await live.jobs.send("q", "a")
        await until(lambda: started == [job.id], "the job to start on the live instance")
        await jumpy.start()
        assert await jumpy.jobs.rescue(jumpy.clock.now()) == 0  # the clocks agree: the live one is alive
        clock.offset = timedelta(seconds=70)
        assert await jumpy.jobs.rescue(jumpy.clock.now()) == 0  # judged by a jumped clock: nobody is dead
        assert jumpy.lease.lapsed
        detail = await live.jobs.get_job(job.id)
        assert detail.job is not None and (detail.job.status, detail.job.instance, detail.attempts) == ("running", "live", [])
        release.set()
        await until(lambda: live.jobs.idle, "the job to end")
        detail = await live.jobs.get_job(job.id)
        assert [(a.status, a.instance) for a in detail.attempts] == [("succeeded", "live")]
    finally:
        release.set()
        await jumpy.stop(grace=0)
        await live.stop(grace=0)


class Receiver:
    """A webhook: the requests it was sent."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200)


async def dead_job(engine: Engine, queue: str = "mail") -> None:
    """A job of ``queue`` sent to ``engine``, which it runs, and which dies."""
    sent = await engine.jobs.send(queue, "hello")

    async def dead() -> bool:
        detail = await engine.jobs.get_job(sent.id)
        return detail.job is not None and detail.job.status == "dead"

    await until(dead, "the job to die")


async def test_an_instance_whose_clock_is_ahead_judges_alerts_by_the_databases_time(pg_url: str) -> None:
    """Standing down for its clock, an instance judged the alert conditions on that clock: a
    minute ahead, the live instance's heartbeats looked a minute old to it, and it paged "no
    instance fires" beside it, stamped in the future (which the live one could not resolve).
    It judges by the database server's time, and its own webhook gets the fleet's page."""

    async def broken(job: JobContext) -> None:
        raise RuntimeError("the dependency went away")

    queue = define_queue(name="mail", handler=broken, attempts=1, alert={"dead_jobs": 1})
    live_hook, ahead_hook = Receiver(), Receiver()
    live = Engine([queue], pg_url, instance="live", abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0,
                  alerting=AlertSettings(sinks=("https://live.example.test/hook",), poll=0.2),
                  alert_transport=httpx.MockTransport(live_hook))  # fmt: skip
    ahead = Engine([queue], pg_url, clock=OffsetClock(timedelta(seconds=60)), instance="ahead", abandon_after=WINDOW,
                   heartbeat_interval=0.2, shutdown_grace=0,
                   alerting=AlertSettings(sinks=("https://ahead.example.test/hook",), poll=0.2),
                   alert_transport=httpx.MockTransport(ahead_hook))  # fmt: skip
    await live.start()
    await ahead.start()
    try:
        assert ahead.registry.clock_off
        judged = await ahead.alerts.evaluate()  # by its clock the live heartbeat is a minute old
        assert "not_firing" not in {f.condition for f in judged.findings.values()}, judged.findings
        await dead_job(live)
        await ahead.alerts.evaluate()  # (or the live one's round: one of them writes it)
        await until(lambda: len(live_hook.requests) == 1 and len(ahead_hook.requests) == 1, "each webhook's page")
        page = await live.alerts.page()
        assert [a.key for a in page.alerts] == ["dead_jobs:mail"]
        (alert,) = page.alerts
        assert abs((alert.since - datetime.now(UTC)).total_seconds()) < 30  # stamped by the database's time
    finally:
        await ahead.stop(grace=0)
        await live.stop(grace=0)


async def test_an_instance_whose_clock_is_behind_takes_delivery_leases_by_the_databases_time(pg_url: str) -> None:
    """Two minutes behind, an instance's delivery lease (a minute, on its clock) had run out
    by the others' clocks when it took it: while its POST was on its way another instance
    claimed the same page and sent it again (ten pages of twelve sent twice)."""

    async def broken(job: JobContext) -> None:
        raise RuntimeError("the dependency went away")

    queue = define_queue(name="mail-2", handler=broken, attempts=1, alert={"dead_jobs": 1})
    hook = "https://hooks.example.test/one"
    answered = asyncio.Event()
    slow: list[Any] = []
    quick = Receiver()

    async def hangs(request: httpx.Request) -> httpx.Response:
        slow.append(request)
        await answered.wait()
        return httpx.Response(200)

    live = Engine([queue], pg_url, instance="live", abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0,
                  alerting=AlertSettings(sinks=(hook,), poll=3600, interval=3600),
                  alert_transport=httpx.MockTransport(quick))  # fmt: skip
    behind = Engine([queue], pg_url, clock=OffsetClock(timedelta(seconds=-120)), instance="behind",
                    abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0,
                    alerting=AlertSettings(sinks=(hook,), poll=0.2, interval=3600),
                    alert_transport=httpx.MockTransport(hangs))  # fmt: skip
    await live.start()
    await behind.start()
    try:
        assert behind.registry.clock_off
        # (Each one's first round, at its start, before the dead job: a loaded machine ran the
        # live one's after it, and that one wrote the page.)
        await until(lambda: live.alerts.last_round is not None and behind.alerts.last_round is not None, "the first rounds")
        await dead_job(live, "mail-2")
        done = await behind.alerts.evaluate()
        assert [a.key for a in done.won] == ["dead_jobs:mail-2"]
        await until(lambda: len(slow) == 1, "its POST on its way")
        live_notifier = live.alerts.notifier
        assert live_notifier is not None
        assert await live_notifier.deliver_due() == 0 and quick.requests == []  # leased, by the database's time
        answered.set()
    finally:
        answered.set()
        await behind.stop(grace=0)
        await live.stop(grace=0)


@pytest.mark.parametrize("offset", [300, -300], ids=["ahead", "behind"])
async def test_a_client_whose_clock_is_off_stamps_what_it_sends_by_the_databases_clock(pg_url: str, offset: int) -> None:
    """A web process five minutes ahead held every job it sent five minutes (its due time
    stamped by its clock); one behind ran a job sent with a minute's delay at once. A
    client whose clock is off the database's stamps its sends by the database's clock."""
    started: list[str] = []

    async def handler(job: JobContext) -> None:
        started.append(job.payload)

    queue = define_queue(name="q", handler=handler)
    live = Engine([queue], pg_url, instance="live", abandon_after=WINDOW, heartbeat_interval=0.2, shutdown_grace=0)
    web = Engine([queue], pg_url, clock=OffsetClock(timedelta(seconds=offset)), instance="web", abandon_after=WINDOW)
    await live.start()
    await web.open()  # (what connect() does: it sends, runs nothing)
    try:
        assert web.registry.clock_off
        later = await web.jobs.send("q", "later", delay=60)
        detail = await live.jobs.get_job(later.id)
        assert detail.job is not None
        due_in = (detail.job.run_after - datetime.now(UTC)).total_seconds()
        # (Within a second of 60: the offset it subtracts is read to within half a round
        # trip, so its due time may land a few ms past the 60 s; 5 minutes off was the fault.)
        assert 55 < due_in <= 61, due_in
        await web.jobs.send("q", "now")
        await until(lambda: started == ["now"], "the job sent without a delay to run")
    finally:
        await web.stop()
        await live.stop(grace=0)


async def test_a_process_that_fires_nothing_and_whose_clock_is_off_runs_no_handler(pg_url: str) -> None:
    """``schedtui fire`` on a machine whose clock is a minute behind the database's: its
    heartbeat would look a minute old to the instances that fire, which would close its
    Run now as abandoned and start the next run beside it. It refuses the Run now, saying
    why; once its time sync is fixed, it runs it."""
    started: list[int] = []
    job = define_schedule(name="job", cron="0 0 1 1 *", timezone="UTC", handler=lambda ctx: started.append(1))
    clock = OffsetClock(timedelta(seconds=-60))
    cli = Engine([job], pg_url, clock=clock, instance="cli", abandon_after=WINDOW, shutdown_grace=0)
    await cli.open()
    try:
        with pytest.raises(Refused, match=r"cannot fire \"job\" here: its heartbeat does not renew this process's "
                                          r"lease \(this instance's clock is 60\.\d+s behind the database server's"):  # fmt: skip
            await cli.run_now("job")
        assert started == [] and await cli.store.list_runs("job", limit=5) == []
        clock.offset = timedelta(0)
        assert (await cli.run_now("job", wait=True)).status == "succeeded" and started == [1]
        beating = [task.get_name() for task in cli.loops.tasks].count("schedtui heartbeat")
        assert beating == 1, "one heartbeat loop, whatever was refused before it"
    finally:
        await cli.stop()
