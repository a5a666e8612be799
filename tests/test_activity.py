"""The activity read behind the Health view: per-minute counts aggregated by both stores
(buckets exact at minute boundaries, a bounded number of statements whatever the number of
schedules), each schedule's lateness, and the action over the API and the remote client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from backend import BadInput, Engine, ManualClock, Run, RunContext, define_queue, define_schedule
from backend.activity import Activity, QueueActivity, ScheduleActivity
from backend.api.app import create_app
from backend.client.actions import decode, encode
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend
from backend.ids import IdFactory
from backend.jobs.store import Finish, FinishKind, JobStore, NewJob, QueueSpec
from backend.model import RunStatus, Trigger
from backend.store.postgres.store import PostgresStore
from backend.store.sqlite.store import SQLiteStore
from tests import pg

NOW = "2026-03-02T08:00:30Z"
T = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
US = timedelta(microseconds=1)
TOKEN = "activity-token"


async def work(ctx: RunContext) -> None:
    pass


async def deliver(job: Any) -> None:
    pass


HOURLY = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=work)
EVERY_MINUTE = define_schedule(name="minutely", cron="* * * * *", timezone="UTC", handler=work)
QUIET = define_schedule(name="quiet", cron="0 * * * *", timezone="UTC", handler=work)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        return pg.database_for(tmp_path)
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def opened(store_url: str) -> AsyncIterator[Callable[..., Awaitable[Engine]]]:
    """Open engines (timers not armed) on a clock frozen at NOW; stopped at the end."""
    engines: list[Engine] = []

    async def make(definitions: list[Any], **kwargs: Any) -> Engine:
        name = "test" if not engines else f"test-{len(engines) + 1}"  # (one name, one engine)
        engine = Engine(definitions, store_url, clock=ManualClock(NOW), instance=name, shutdown_grace=0, **kwargs)
        engines.append(engine)
        await engine.open()
        return engine

    yield make
    for engine in engines:
        await engine.stop(grace=0)


class Ledger:
    """Writes runs straight into an engine's store, with ids in creation order."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ids = IdFactory(lambda: T)

    def run(self, name: str, slot: datetime, status: RunStatus = "succeeded", *, finished: datetime | None = None,
            trigger: Trigger = "self") -> Run:
        fired = slot + timedelta(milliseconds=2)
        return Run(id=self.ids(), name=name, scheduled_at=slot, status=status,
                   trigger=trigger, coordination_outcome="manual" if trigger == "manual" else "single",
                   instance="test", fired_at=None if status == "missed" else fired,
                   finished_at=None if status in ("missed", "running") else (finished or fired + timedelta(seconds=1)))

    async def write(self, *runs: Run) -> None:
        self.engine.store.save_runs(list(runs))
        await self.engine.flush()


# ---------------------------------------------------------------------------------------
# the stores' aggregation
# ---------------------------------------------------------------------------------------
async def test_runs_fall_in_the_minute_they_ended_exactly_at_its_boundaries(opened: Callable[..., Awaitable[Engine]]) -> None:
    engine = await opened([EVERY_MINUTE, HOURLY])
    ledger = Ledger(engine)
    start = datetime(2026, 3, 2, 7, 56, tzinfo=UTC)  # the first of the 5 minutes up to 08:00:30
    slot = start - timedelta(minutes=10)
    await ledger.write(
        ledger.run("minutely", slot, finished=start - US),  # just before the window: not counted
        ledger.run("minutely", slot, finished=start),  # its very first instant: minute 0
        ledger.run("minutely", slot, "failed", finished=start + timedelta(minutes=2) - US),  # minute 1
        ledger.run("minutely", slot, finished=start + timedelta(minutes=2)),  # minute 2
        ledger.run("minutely", slot, "failed", finished=start + timedelta(minutes=2, seconds=59)),
        ledger.run("minutely", slot, "skipped", finished=start + timedelta(minutes=2)),  # ran nothing
        ledger.run("minutely", slot, "missed"),
        ledger.run("minutely", T, "running"),
        ledger.run("minutely", slot, finished=T + timedelta(seconds=29)),  # the current minute
        ledger.run("minutely", slot, finished=T + timedelta(minutes=1) - US),  # ahead of this clock: still in it
        ledger.run("minutely", slot, finished=T + timedelta(minutes=1)),  # past the window's end
        ledger.run("hourly", T - timedelta(hours=1), "failed", finished=start + timedelta(minutes=3, seconds=1),
                   trigger="manual"),  # a manual run counts too
    )
    activity = await engine.activity.read(minutes=5)
    assert activity.start == start and activity.now == T + timedelta(seconds=30)
    minutely, hourly = activity.schedules
    assert (minutely.name, hourly.name) == ("minutely", "hourly")
    assert minutely.runs == (1, 1, 2, 0, 2)
    assert minutely.failures == (0, 1, 1, 0, 0)
    assert (minutely.total_runs, minutely.total_failures) == (6, 2)
    assert hourly.runs == (0, 0, 0, 1, 0) and hourly.failures == (0, 0, 0, 1, 0)


async def test_queues_count_attempts_failures_and_jobs_that_died_and_stayed_dead(opened: Callable[..., Awaitable[Engine]]) -> None:
    engine = await opened([define_queue(name="mail", handler=deliver), define_queue(name="idle", handler=deliver)])
    js = cast(JobStore, engine.store)
    start = datetime(2026, 3, 2, 7, 56, tzinfo=UTC)
    ids = IdFactory(lambda: T)
    await js.define_queues([QueueSpec("mail", 8, 1, 60.0), QueueSpec("idle", 1, 1, 60.0)], start, update=True)
    jobs = [NewJob(ids(), json.dumps(n), start - timedelta(minutes=5), 1) for n in range(5)]
    await js.send_jobs("mail", jobs, start - timedelta(minutes=5))
    claimed = (await js.cycle_jobs([], {"mail": 8}, "test", ids(), start - timedelta(minutes=4))).claimed
    assert len(claimed) == 5
    ends = [start - US, start, start + timedelta(minutes=1), start + timedelta(minutes=1, seconds=59), T]
    kinds: list[FinishKind] = ["succeeded", "dead", "succeeded", "dead", "dead"]
    await js.finish_jobs([
        Finish(c.id, c.queue, c.tries, kind, c.attempt, c.started_at, end, "test",
               None if kind == "succeeded" else "Boom", None if kind == "succeeded" else "boom")
        for c, end, kind in zip(claimed, ends, kinds, strict=True)
    ])  # fmt: skip
    retried = claimed[3]
    await js.retry_job("mail", retried.id, T)  # dealt with: no longer counted as dead
    activity = await engine.activity.read(minutes=5)
    by_name = {q.name: q for q in activity.queues}
    assert sorted(by_name) == ["idle", "mail"]
    mail = by_name["mail"]
    assert mail.finished == (1, 2, 0, 0, 1)
    assert mail.failed == (1, 1, 0, 0, 1)
    assert mail.dead == (1, 0, 0, 0, 1)
    assert (mail.total_finished, mail.total_failed, mail.dead_growth, mail.dead_now) == (4, 3, 2, 2)
    assert by_name["idle"] == QueueActivity("idle", (0,) * 5, (0,) * 5, (0,) * 5, 0)


async def test_lateness_counts_from_the_first_slot_after_the_newest_success(opened: Callable[..., Awaitable[Engine]]) -> None:
    never = define_schedule(name="never", cron="0 * * * *", timezone="UTC", handler=work)
    covered = define_schedule(name="covered", cron="0 * * * *", timezone="UTC", handler=work)
    engine = await opened([HOURLY, EVERY_MINUTE, QUIET, never, covered])
    ledger = Ledger(engine)
    await ledger.write(
        ledger.run("hourly", T - timedelta(hours=2)),  # 06:00 succeeded, 07:00 failed, 08:00 running
        ledger.run("hourly", T - timedelta(hours=1), "failed"),
        ledger.run("hourly", T, "running"),
        ledger.run("minutely", T),  # 08:00 succeeded; 08:01 has not come
        ledger.run("never", T - timedelta(hours=3), "failed"),  # failed since its first slot on record
        ledger.run("never", T - timedelta(hours=2), "missed"),
        ledger.run("covered", T - timedelta(hours=1), "failed"),  # 07:00 failed, but an operator's
        ledger.run("covered", T - timedelta(minutes=30), trigger="manual"),  # Run now at 07:30 worked
    )
    await engine.set_enabled("minutely", False)
    activity = await engine.activity.read()
    now = activity.now
    view = {s.name: s for s in activity.schedules}
    assert view["hourly"].last_success_at == T - timedelta(hours=2)
    assert view["hourly"].late_since == T - timedelta(hours=1)
    assert view["hourly"].lateness(now) == timedelta(hours=1, seconds=30)
    assert view["minutely"].late_since is None and view["minutely"].lateness(now) is None
    assert view["minutely"].enabled is False and view["hourly"].enabled is True
    assert view["never"].last_success_at is None and view["never"].late_since == T - timedelta(hours=3)
    assert view["covered"].late_since == T  # the 08:00 slot, the first after the manual success
    assert view["quiet"].last_success_at is None and view["quiet"].late_since is None  # no run yet
    encoded = encode(activity)
    assert [s["late_s"] for s in encoded["schedules"]] == [3630.0, None, None, 3 * 3600 + 30.0, 30.0]


# ---------------------------------------------------------------------------------------
# a bounded number of statements
# ---------------------------------------------------------------------------------------
def count_statements(engine: Engine) -> list[str]:
    """Every statement the engine's store runs from now on."""
    seen: list[str] = []
    store = engine.store
    if isinstance(store, SQLiteStore):
        read = store._read

        async def traced_read(fn: Any) -> Any:
            def traced(conn: Any) -> Any:
                conn.set_trace_callback(seen.append)
                try:
                    return fn(conn)
                finally:
                    conn.set_trace_callback(None)

            return await read(traced)

        store._read = traced_read  # type: ignore[method-assign]  # records the statements it runs
    else:
        assert isinstance(store, PostgresStore)
        with_conn = store._with_conn

        class Counting:
            def __init__(self, conn: Any) -> None:
                self.conn = conn

            def __getattr__(self, name: str) -> Any:
                return getattr(self.conn, name)

            async def execute(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
                seen.append(str(sql))
                return await self.conn.execute(sql, *args, **kwargs)

        async def counting(fn: Any, **kwargs: Any) -> Any:
            return await with_conn(lambda conn: fn(Counting(conn)), **kwargs)

        store._with_conn = counting  # type: ignore[method-assign]  # records the statements it runs
    return seen


async def test_a_read_costs_the_same_statements_for_10_or_300_schedules(opened: Callable[..., Awaitable[Engine]]) -> None:
    schedules = [define_schedule(name=f"s{n:03}", cron="* * * * *", timezone="UTC", handler=work) for n in range(300)]
    mail = define_queue(name="mail", handler=deliver)
    statements, written = {}, 0
    for count in (10, 300):
        engine = await opened([*schedules[:count], mail])  # a second engine on the same store
        ledger = Ledger(engine)
        await ledger.write(*(ledger.run(s.name, T - timedelta(minutes=m)) for s in schedules[written:count] for m in (1, 2)))
        written = count
        seen = count_statements(engine)
        activity = await engine.activity.read()
        assert len(activity.schedules) == count and all(s.total_runs == 2 for s in activity.schedules)
        assert all(s.strip().upper().startswith("SELECT") for s in seen), seen
        statements[count] = len(seen)
    # the runs' counts, the newest successes, the queues' counts, and the queue list (one
    # read on PostgreSQL, three on SQLite)
    assert statements[10] == statements[300] <= 6, statements


# ---------------------------------------------------------------------------------------
# the action: embedded, over the API, and through the remote client
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def backends(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedBackend, RemoteBackend]]:
    engine = Engine([HOURLY, EVERY_MINUTE, define_queue(name="mail", handler=deliver)],
                    f"sqlite:///{tmp_path / 'state.db'}", clock=ManualClock(NOW), instance="test", shutdown_grace=0)
    embedded = EmbeddedBackend(engine)
    await embedded.connect()
    ledger = Ledger(engine)
    await ledger.write(ledger.run("minutely", T - timedelta(minutes=1), "failed"), ledger.run("hourly", T))
    transport = httpx.ASGITransport(app=create_app(embedded, token=TOKEN))
    remote = RemoteBackend("http://schedtui.test", TOKEN, transport=transport)
    await remote.connect()
    yield embedded, remote
    await remote.close()
    await embedded.close()


async def test_the_remote_client_decodes_what_the_engine_answers(backends: tuple[EmbeddedBackend, RemoteBackend]) -> None:
    embedded, remote = backends
    assert "health" in remote.info().systems
    here = await embedded.activity(minutes=10)
    there = await remote.activity(minutes=10)
    assert isinstance(there, Activity) and there == here
    assert there.schedules[1] == ScheduleActivity(
        "minutely", True, (0,) * 8 + (1, 0), (0,) * 8 + (1, 0), None, T - timedelta(minutes=1)
    )
    assert decode(Activity, encode(here)) == here
    assert (await remote.activity()).minutes == 60


async def test_a_window_out_of_range_is_refused_naming_it(backends: tuple[EmbeddedBackend, RemoteBackend]) -> None:
    embedded, remote = backends
    for backend in (embedded, remote):
        with pytest.raises(BadInput, match=r"minutes 181 is out of range \(5-180\)"):
            await backend.activity(minutes=181)
    transport = httpx.ASGITransport(app=create_app(embedded, token=TOKEN))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://schedtui.test", headers=headers) as http:
        for bad in ("4", "soon"):
            answer = await http.get("/inspect/activity", params={"minutes": bad})
            assert answer.status_code == 422, answer.text
            assert bad in answer.json()["error"]["message"] and answer.json()["error"]["field"] == "minutes"
        answer = await http.get("/inspect/activity")
        assert answer.status_code == 200 and answer.json()["minutes"] == 60
