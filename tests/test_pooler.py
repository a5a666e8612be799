"""The PostgreSQL store behind a real PgBouncer in transaction pooling mode (see
:mod:`tests.pooler`, :mod:`backend.store.postgres.pooler`): what the URL says, the refusal
to open when it does not say it, nothing set that leaks to the pooler's other clients,
two engines running a schedule's slots, a queue's jobs and a durable function's steps once
each with a fenced lock, and two real ``serve`` processes firing every slot once."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from backend import (
    BadInput,
    DurableContext,
    Engine,
    ManualClock,
    RunContext,
    StaleLease,
    Unavailable,
    define_durable,
    define_queue,
    define_schedule,
)
from backend.ids import IdFactory
from backend.jobs import JobContext
from backend.model import Run
from backend.store import open_store
from backend.store.postgres import store as store_module
from backend.store.postgres.pooler import PoolerSettings, split_url
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests import pooler as pooler_module
from tests.pooler import Pooler
from tests.servers import poll
from tests.test_events import listening, pairs, until
from tests.test_fleet import Fleet, assert_once_and_contiguous, by_name

SHOWN = "postgresql://db/x"


def pooled(pooler: Pooler, direct_url: str, *extra: str) -> str:
    """The store URL of ``direct_url``'s database through the pooler, saying so."""
    url = pooler.url(direct_url)
    return url + ("&" if "?" in url else "?") + "&".join(("pooler=transaction", *extra))


def set_timeouts(direct_url: str) -> None:
    """What the README asks of the operator behind a transaction pooler (per database here)."""
    name = psycopg.conninfo.conninfo_to_dict(direct_url)["dbname"]
    with psycopg.connect(direct_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '30s'")
        conn.execute(f"ALTER DATABASE \"{name}\" SET idle_in_transaction_session_timeout = '60s'")


async def noop(ctx: RunContext) -> None:
    pass


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("schedtui")]


# ---------------------------------------------------------------------------------------
# the URL
# ---------------------------------------------------------------------------------------
def test_the_pooler_parameters_are_taken_out_of_the_url_and_the_rest_reaches_libpq_as_written() -> None:
    url = "postgresql://u:p@bouncer:6432/app?sslmode=require&pooler=transaction&password=a%20b&listen_host=db&listen_port=5432"
    assert split_url(url, SHOWN) == (
        "postgresql://u:p@bouncer:6432/app?sslmode=require&password=a%20b",
        PoolerSettings("transaction", "db", 5432),
    )
    assert split_url("postgresql://bouncer/app?pooler=session", SHOWN) == ("postgresql://bouncer/app", PoolerSettings("session"))
    assert split_url("postgresql://db/app?sslmode=disable", SHOWN) == ("postgresql://db/app?sslmode=disable", PoolerSettings())
    assert split_url("postgresql://db/app", SHOWN)[1] == PoolerSettings()


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("pooler=statement", "pooler='statement' is not a pooling mode"),
        ("pooler=", "pooler='' is not a pooling mode"),
        ("listen_port=0", "listen_port='0' is not a port number"),
        ("listen_port=54x", "listen_port='54x' is not a port number"),
        ("listen_host=", "listen_host is empty"),
    ],
)
def test_a_bad_pooler_parameter_is_refused_naming_it(query: str, named: str) -> None:
    with pytest.raises(BadInput, match=f'bad store URL "postgresql://bouncer/app\\?{query}": {named}'):
        open_store(f"postgresql://bouncer/app?{query}")


# ---------------------------------------------------------------------------------------
# opening
# ---------------------------------------------------------------------------------------
@pytest.mark.postgres
async def test_a_store_behind_a_transaction_pooler_it_was_not_told_of_refuses_to_open_naming_the_fix(
    pg_pooler: Pooler, pg_url: str
) -> None:
    store = open_store(pg_pooler.url(pg_url))
    with pytest.raises(Unavailable) as refused:
        await store.open()
    message = str(refused.value)
    assert "two of its connections were served by one server session" in message, message
    assert "add pooler=transaction to the store URL" in message and "Behind PgBouncer" in message
    assert refused.value.public is not None and "127.0.0.1" not in refused.value.public  # (an API client's words)
    await store.close()
    direct = open_store(pg_url)  # the server itself: never taken for a pooler
    await direct.open()
    await direct.close()


@pytest.mark.postgres
async def test_a_prepared_statement_lost_behind_a_pooler_the_check_missed_names_the_fix(
    pg_pooler: Pooler, pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooler that served the check's two connections from two server sessions is not
    caught at open; psycopg's statements then collide on the shared ones."""

    async def nothing_shared(*args: Any) -> None:
        return None

    monkeypatch.setattr(store_module, "detect_sharing", nothing_shared)
    store = open_store(pg_pooler.url(pg_url))
    assert isinstance(store, PostgresStore)
    await store.open()
    failures = []
    try:
        for _ in range(20):  # past psycopg's automatic prepare (5) on each pool connection
            try:
                await store.server_clock()
            except (psycopg.Error, Unavailable) as exc:
                failures.append(str(exc))
    finally:
        await store.close()
    assert failures and all("prepared statement" in f for f in failures), failures
    (hint,) = problems(caplog)
    assert "lost track of a prepared statement" in hint and "add pooler=transaction to the store URL" in hint, hint


@pytest.mark.postgres
async def test_behind_a_transaction_pooler_the_store_sets_nothing_that_leaks_and_says_what_the_operator_must_set(
    pg_pooler: Pooler, pg_server: pg.PgServer, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = open_store(pooled(pg_pooler, pg_url))
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        for _ in range(12):  # past psycopg's automatic prepare (5), on both server connections
            await asyncio.gather(store.server_clock(), store.instances(), store.count_claims())
    finally:
        await store.close()
    (warning,) = problems(caplog)
    assert "statement_timeout and idle_in_transaction_session_timeout are unlimited" in warning
    assert "ALTER ROLE … SET statement_timeout = '30s'" in warning and "Behind PgBouncer" in warning
    # The pooler's other clients find the server connections as the server made them.
    with psycopg.connect(pg_pooler.url(pg_url)) as one, psycopg.connect(pg_pooler.url(pg_url)) as two:
        seen = [conn.execute("SHOW statement_timeout").fetchone() for conn in (one, two)]  # two transactions at once:
        assert seen == [("0",), ("0",)]  # both server connections of the pool
    # Set for a database before its first server connection (a setting applies from the
    # next connection on: the pooler's older ones keep what they started with).
    other = pg_server.create_database(migrated=True)
    set_timeouts(other)
    caplog.clear()
    store = open_store(pooled(pg_pooler, other))
    await store.open()
    await store.close()
    assert problems(caplog) == []


@pytest.mark.postgres
async def test_behind_a_transaction_pooler_a_lock_timeout_of_the_role_is_named_at_open(
    pg_pooler: Pooler, pg_server: pg.PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Connected directly, the store lifts a role's ``lock_timeout`` for its own sessions
    (tests/test_server_faults.py); behind a transaction pooler it cannot, and says so."""
    url = pg_server.create_database(migrated=True)
    set_timeouts(url)
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '5s'")
    store = open_store(pooled(pg_pooler, url))
    await store.open()
    await store.close()
    (warning,) = problems(caplog)
    assert "cannot lift the server's lock_timeout (5s for this role and database)" in warning
    assert "ALTER ROLE … SET lock_timeout = 0" in warning and "Behind PgBouncer" in warning


@pytest.fixture
def session_pooler(pg_server: pg.PgServer) -> Iterator[Pooler]:
    """A PgBouncer in session mode with four server connections per database."""
    running = pooler_module.started(pg_server, pool_mode="session", pool_size=4)
    yield running
    running.stop()


@pytest.mark.postgres
async def test_behind_a_session_pooler_out_of_server_connections_the_store_says_so_not_down(
    session_pooler: Pooler, pg_server: pg.PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In session mode every client connection holds a server connection for its life: a
    second process that finds none free was told the server was "down or unreachable"
    (its connections get in, and no statement is ever served). Both at open and in the
    probe behind a later pool timeout, the store says what it is."""
    monkeypatch.setitem(store_module._CONNINFO_DEFAULTS, "connect_timeout", "1")
    direct = pg_server.create_database(migrated=True)
    url = session_pooler.url(direct)
    url += ("&" if "?" in url else "?") + "pooler=session"
    first = open_store(url)
    assert isinstance(first, PostgresStore)
    await first.open()  # (its pool's two connections hold two of the four)
    held = []
    try:
        held.append(await psycopg.AsyncConnection.connect(session_pooler.url(direct), autocommit=True))
        await held[-1].execute("SELECT 1")  # the third; the second process's first takes the fourth
        second = open_store(url)
        with pytest.raises(Unavailable) as refused:
            await second.open()
        for said in (str(refused.value), refused.value.public or ""):
            assert "the server accepts connections but served none of the pool's within 3 s" in said, said
            assert "no server connection free" in said and "Behind PgBouncer" in said, said
            assert "down or unreachable" not in said
        held.append(await psycopg.AsyncConnection.connect(session_pooler.url(direct), autocommit=True))
        await held[-1].execute("SELECT 1")  # now all four
        pool = first._pool
        assert pool is not None
        why = await first._no_connection(pool, PoolTimeout("no connection in 3 s"), 3.0)
        assert "served none of the pool's within 3 s" in first._why(why), first._why(why)
    finally:
        for conn in held:
            await conn.close()
        await first.close()


# ---------------------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------------------
@pytest.mark.postgres
async def test_two_engines_behind_a_transaction_pooler_run_each_slot_job_and_step_once_and_fence_a_lock(
    pg_pooler: Pooler, pg_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    set_timeouts(pg_url)
    # No psycopg pipeline behind the pooler: its Flush after the Sync could reach PgBouncer
    # once the server was let go, and tie a server connection to an idle client (this test
    # then stalled 120 s, PgBouncer's query_wait_timeout, on a loaded machine).
    pipelines: list[object] = []
    pipeline = psycopg.AsyncConnection.pipeline

    def counted(self: psycopg.AsyncConnection[Any]) -> Any:
        pipelines.append(self)
        return pipeline(self)

    monkeypatch.setattr(psycopg.AsyncConnection, "pipeline", counted)
    calls: Counter[tuple[Any, ...]] = Counter()

    async def tick(ctx: RunContext) -> None:
        calls["tick", ctx.scheduled_at] += 1

    async def work(job: JobContext) -> None:
        calls["job", job.payload] += 1

    async def steps(ctx: DurableContext, input: Any) -> int:
        for i in range(12):  # a checkpoint statement run more often than psycopg's prepare threshold
            await ctx.step(f"s{i}", lambda i=i: calls.update([("step", input, i)]))
        return 12

    definitions = [
        define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=tick),
        define_queue(name="q", handler=work, concurrency=3),
        define_durable(name="f", handler=steps),
    ]
    url = pooled(pg_pooler, pg_url)
    # (Each minute's jump leaves the other's heartbeat a minute old until it beats: not abandoned.)
    a, b = (Engine(definitions, url, clock=clock, instance=name, shutdown_grace=0, abandon_after=600) for name in ("a", "b"))
    try:
        await a.start()
        await b.start()
        for i in range(30):
            await (a if i % 2 else b).jobs.send("q", i)
        started = [(await (a if n % 2 else b).durable.start_execution("f", n)).id for n in range(4)]

        async def done() -> bool:
            executions = [await a.durable.get(id_) for id_ in started]
            return all(e.status == "succeeded" for e in executions) and sum(k[0] == "job" for k in calls) == 30

        for _ in range(20):  # (a job or an execution the other engine is polling for: its poll is due in 1 s)
            await a.quiesce()
            await b.quiesce()
            if await done():
                break
            clock.advance(1)
        assert await done()

        # The lock: one holder at a time, and a write fenced by an older token is refused.
        first = await a.locks.acquire("rollup", ttl=30)
        assert first is not None and await b.locks.acquire("rollup", ttl=30) is None
        async with await psycopg.AsyncConnection.connect(pg_pooler.url(pg_url), prepare_threshold=None) as conn:
            async with conn.transaction():
                await first.fence(conn, "rollup-table")
            await first.release()
            second = await b.locks.acquire("rollup", ttl=30)
            assert second is not None and second.token > first.token
            async with conn.transaction():
                await second.fence(conn, "rollup-table")
            with pytest.raises(StaleLease, match="refused"):
                async with conn.transaction():
                    await first.fence(conn, "rollup-table")
        await second.release()

        slots_from = clock.now()
        for _ in range(10):
            clock.advance(60)
            await a.quiesce()
            await b.quiesce()
        runs = [r for r in await a.store.list_runs("tick", limit=100) if r.trigger == "self"]
    finally:
        await a.stop(grace=0)
        await b.stop(grace=0)

    slots = sorted(r.scheduled_at for r in runs)
    t0 = slots_from.replace(second=0) + timedelta(minutes=1)
    assert slots == [t0 + timedelta(minutes=m) for m in range(10)]  # each slot once, none missing
    assert [(r.scheduled_at, r.status, r.error_message) for r in runs if r.status != "succeeded"] == []
    assert {r.instance for r in runs} <= {"a", "b"}
    assert {k: v for k, v in calls.items() if k[0] == "tick"} == {("tick", s): 1 for s in slots}
    assert {k: v for k, v in calls.items() if k[0] == "job"} == {("job", i): 1 for i in range(30)}
    assert {k: v for k, v in calls.items() if k[0] == "step"} == {("step", n, i): 1 for n in range(4) for i in range(12)}
    assert problems(caplog) == []
    assert "not listening" not in caplog.text and "where LISTEN hears nothing" in caplog.text
    assert pipelines == []


@pytest.mark.postgres
async def test_behind_a_transaction_pooler_listen_host_and_port_hear_the_other_instances_at_once(
    pg_pooler: Pooler, pg_url: str
) -> None:
    direct = psycopg.conninfo.conninfo_to_dict(pg_url)
    set_timeouts(pg_url)
    schedules = [define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=noop)]
    hearing = Engine(schedules, pooled(pg_pooler, pg_url, f"listen_host={direct['host']}", f"listen_port={direct['port']}"),
                     instance="a", shutdown_grace=0)  # fmt: skip
    deaf = Engine(schedules, pooled(pg_pooler, pg_url), instance="b", shutdown_grace=0)
    await hearing.open()
    await deaf.open()
    try:
        inbox = hearing.events.subscribe()
        await listening(pg_url)  # its LISTEN connection and its readers mark, on the server itself
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # (the relay notes it once its LISTEN has answered)
        while not hearing.relay.hears_others and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert hearing.relay.hears_others and not deaf.relay.hears_others
        await deaf.set_enabled("hourly", False)  # its NOTIFY goes through the pooler
        got = await until(inbox.get, lambda batch: ("audit", "hourly") in pairs(batch))
        assert ("schedules", "hourly") in pairs(got)
    finally:
        await hearing.stop(0)
        await deaf.stop(0)


# ---------------------------------------------------------------------------------------
# serve processes
# ---------------------------------------------------------------------------------------
BEHIND = """
    from backend import define_schedule

    async def tick(ctx):
        pass

    back = define_schedule(name="back", cron="* * * * * *", timezone="UTC", handler=tick, backfill="all")
"""


@pytest.mark.postgres
@pytest.mark.slow
def test_two_serve_processes_behind_a_transaction_pooler_fire_every_slot_once(
    pg_pooler: Pooler, pg_url: str, tmp_path: Path
) -> None:
    """Three minutes of slots caught up at boot by both at once (``backfill="all"``: their
    claims race), then live slots on clocks 250 ms apart, every statement through the pooler."""
    set_timeouts(pg_url)
    seeded = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)

    async def seed() -> None:
        store = open_store(pg_url)
        await store.open()
        store.save_runs([Run(id=IdFactory(lambda: seeded)(), name="back", scheduled_at=seeded, status="succeeded",
                             trigger="self", coordination_outcome="wonLock", instance="long-gone:1")])  # fmt: skip
        await store.close()

    asyncio.run(seed())
    fleet = Fleet(tmp_path, pooled(pg_pooler, pg_url), ticks=4, read_url=pg_url)
    (tmp_path / "schedules" / "behind.cron.py").write_text(textwrap.dedent(BEHIND))
    try:
        one, two = fleet.start("a", offset_ms=250, wait=False), fleet.start("b", wait=False)
        fleet.wait_ready(one, two)
        booted = datetime.now(UTC)
        poll(lambda: fleet.slots("tick00", since=booted) >= 5, timeout=30, what="5 s of live slots")
        poll(lambda: fleet.slots("back") >= 185, timeout=30, what="the catch-up and 5 live slots of back")
        fleet.stop_all()
    finally:
        fleet.kill_all()
    fleet.assert_healthy_logs()
    for instance in fleet.instances:
        log = instance.log()
        assert "where LISTEN hears nothing" in log, log
        troubles = [line for line in log.splitlines() if (" WARNING " in line or " ERROR " in line) and "CLOCK IS SHIFTED" not in line]
        assert troubles == [], f"{instance.name}:\n{log}"
        for trouble in ("prepared statement", "unavailable", "connection lost", "could not be opened"):
            assert trouble not in log, f"{instance.name}: {trouble}:\n{log}"
    runs = by_name(fleet.runs())
    assert sorted(runs) == ["back", "tick00", "tick01", "tick02", "tick03"]
    for mine in runs.values():
        assert_once_and_contiguous(mine)
        # A slot whose run of the same schedule still ran (a busy machine, a catch-up beside
        # the live slots) is skipped by its overlap policy: still once, by one claim.
        outcomes = {(r.status, r.coordination_outcome) for r in mine}
        assert ("succeeded", "wonLock") in outcomes and outcomes <= {("succeeded", "wonLock"), ("skipped", "wonLock")}
    assert runs["back"][0].scheduled_at == seeded and len(runs["back"]) >= 185
    assert {r.instance for rs in runs.values() for r in rs if r.scheduled_at > seeded} <= {"a", "b"}
