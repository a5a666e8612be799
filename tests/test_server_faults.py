"""What a production PostgreSQL server does that a test server does not, and what the
engine's long-lived loops must outlive: a round that raises what the loop did not expect;
a server that takes no writes (the old primary after a failover, a standby a pooler still
sends to); sessions the server ends for idling; sessions that default to another
isolation level; a role's ``lock_timeout``. Before, the first two ended the loop that met
them for good (the lease loop first: the instance's lease lapsed for ever and it stopped
all its work while the process and its health check looked alive), the third failed the
call that found the dead connection, the fourth failed claims and sends with
serialization errors, and the fifth failed the store's waits for its own locks (a start
while another instance migrated, a run's turn)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from backend import (
    Engine,
    JobContext,
    ManualClock,
    RunContext,
    Unavailable,
    connect,
    define_queue,
    define_schedule,
    open_store,
)
from backend.jobs.cycles import RETRY_AFTER_TROUBLE
from tests import pg
from tests.test_liveness import LeaseClock


async def _settle(engine: Engine) -> None:
    await asyncio.wait_for(engine.quiesce(runs=False), 20)  # the timeout only bounds a broken test


async def test_a_lease_round_that_raises_what_it_did_not_expect_does_not_end_the_lease(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    lease_clock = LeaseClock()
    ran: list[Any] = []

    async def handler(job: JobContext) -> None:
        ran.append(job.payload)

    engine = make_engine([define_queue(name="q", handler=handler)], abandon_after=30, lease_clock=lease_clock)
    await engine.start()
    await _settle(engine)
    store = engine.registry.store
    real = store.heartbeat_and_unfinished
    broken = True

    async def beat(*args: Any, **kwargs: Any) -> Any:
        if broken:
            raise RuntimeError("a reply the heartbeat did not expect")
        return await real(*args, **kwargs)

    store.heartbeat_and_unfinished = beat  # type: ignore[method-assign]  # fails while broken
    for step in (5, 1):  # the next beat fails, and so does the first one after a pause of 1 s
        clock.advance(step)
        lease_clock.now += step
        await _settle(engine)
    assert engine.lease.renewed_at == lease_clock.now - 6
    broken = False
    clock.advance(2)  # the second pause
    lease_clock.now += 2
    await _settle(engine)
    assert engine.lease.renewed_at == lease_clock.now  # the lease loop beat again
    lease_clock.now += 15  # past the bound of the lease it held before the failures
    engine.lease.check()
    assert not engine.lease.lapsed
    await engine.jobs.send("q", "after")
    await asyncio.wait_for(engine.quiesce(), 20)
    assert ran == ["after"]
    failed = sorted(r.getMessage().split(" (")[0] for r in caplog.records if r.levelname == "ERROR")
    assert "lease failed" in failed and set(failed) <= {"lease failed", "maintenance failed"}  # (it beats too)
    assert len(failed) == len(set(failed))  # the second failure in a row is not logged again


def _set_read_only(server: pg.PgServer, url: str, on: bool) -> None:
    """The database answers as a standby would: every write fails with SQLSTATE 25006. Its
    open sessions are ended so that the new setting reaches every connection."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        setting = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
        conn.execute(f'ALTER DATABASE "{name}" {setting}')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


async def test_a_server_that_takes_no_writes_is_an_outage_not_a_crash(
    pg_server: pg.PgServer, pg_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[Any] = []

    async def handler(job: JobContext) -> None:
        ran.append(job.payload)

    engine = Engine([define_queue(name="q", handler=handler)], pg_url, clock=clock, instance="standby-test")
    await engine.start()
    try:
        await engine.jobs.send("q", 1)
        await asyncio.wait_for(engine.quiesce(), 20)
        caplog.clear()
        async with connect(pg_url) as st:
            _set_read_only(pg_server, pg_url, True)
            with pytest.raises(Unavailable, match="read-only transaction"):
                await st.jobs.send("q", 2)  # a send is told the store is unavailable: not a psycopg error
        for _ in range(3):  # heartbeats, housekeeping, job cycles all fail meanwhile
            clock.advance(5)
            await _settle(engine)
        health = engine.store.health()
        assert health.state == "failing" and "takes no writes" in (health.error or "")
        _set_read_only(pg_server, pg_url, False)
        for _ in range(2):
            clock.advance(5)
            await _settle(engine)
        assert engine.store.health().state == "ok"
        assert engine.lease.fresh()
        await engine.jobs.send("q", 3)
        for _ in range(3):
            await asyncio.wait_for(engine.quiesce(), 20)
            if ran == [1, 3]:
                break
            # A cycle that met one of the outage's dropped connections late (a loaded
            # machine) waits out its retry on the engine's clock: seen once in CI.
            clock.advance(RETRY_AFTER_TROUBLE)
        assert ran == [1, 3]
        failed = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("schedtui")]
        assert failed == []  # no loop crashed or was started again: each met an outage it knows
        assert any("store unavailable" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    finally:
        _set_read_only(pg_server, pg_url, False)
        await engine.stop()


def test_a_session_the_server_ended_for_idling_is_a_lost_connection() -> None:
    from backend.store.postgres.store import _connection_lost

    # idle_session_timeout (PostgreSQL 14+) ends a pooled connection left idle; the next
    # statement sent there never ran, so it is sent again on a fresh connection.
    assert _connection_lost(psycopg.errors.IdleSessionTimeout("terminating connection due to idle-session timeout"))
    assert _connection_lost(psycopg.errors.IdleInTransactionSessionTimeout("idle-in-transaction timeout"))
    assert not _connection_lost(psycopg.errors.ReadOnlySqlTransaction("read-only"))  # an outage, not retried at once


async def test_pooled_connections_the_server_ended_for_idling_are_replaced_not_reported(
    pg_server: pg.PgServer, pg_url: str
) -> None:
    name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '100ms'")
        store = open_store(pg_url)
        await store.open()
        try:
            pids = [row[0] for row in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'schedtui'", (name,)
            ).fetchall()]  # fmt: skip
            assert pids  # the pool's, idle
            admin.execute(f'ALTER DATABASE "{name}" RESET idle_session_timeout')  # the new ones may idle
            while admin.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall():
                await asyncio.sleep(0.02)  # (the server ends them 100 ms after their last statement)
            for _ in range(3):  # every dead connection the pool hands out is replaced, the call sent again
                assert await store.get_states() == {}
        finally:
            await store.close()


def _set_lock_timeout(server: pg.PgServer, url: str, value: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '{value}'")


async def _still_waiting_past(holder: psycopg.AsyncConnection[Any], url: str, waiter: asyncio.Future[Any]) -> None:
    """Once the store waits for the lock ``holder`` holds, let the database's lock_timeout
    (10 ms) pass twenty times over, and find the store still waiting (on the server too)."""
    from tests.test_store import waiting_for_an_advisory_lock

    await asyncio.wait_for(waiting_for_an_advisory_lock(url), 10)
    await holder.execute("SELECT pg_sleep(0.2)")  # (the time a timeout needs: what is tested)
    assert not waiter.done(), waiter.result() if not waiter.exception() else waiter.exception()
    row = await (await holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).fetchone()
    assert row == (1,)


async def test_a_lock_timeout_of_the_role_does_not_fail_a_start_while_another_instance_migrates(
    pg_server: pg.PgServer,
) -> None:
    """A ``lock_timeout`` for schedtui's role or database (a DBA's guard for their own
    migrations): an instance that started while another was migrating the tables waited
    for that migration's lock, and failed to open past the timeout (``canceling statement
    due to lock timeout``): a rolling upgrade's instances crashed at start."""
    from backend.store.postgres.sql import LOCK_CLASS, LOCK_MIGRATE, MIGRATE_LOCK

    url = pg_server.create_database("lock_timeout")  # empty: the store must migrate it
    _set_lock_timeout(pg_server, url, "10ms")
    store = open_store(url)
    async with await psycopg.AsyncConnection.connect(url) as other:  # another instance, migrating
        await other.execute(MIGRATE_LOCK, (LOCK_CLASS, LOCK_MIGRATE))
        opening = asyncio.ensure_future(store.open())
        try:
            await _still_waiting_past(other, url, opening)
            await other.rollback()
            await asyncio.wait_for(opening, 30)  # (bounds a broken test)
            assert await store.get_states() == {}
        finally:
            await store.close()


async def test_a_lock_timeout_of_the_role_does_not_fail_a_runs_wait_for_its_turn(
    pg_server: pg.PgServer, pg_url: str
) -> None:
    """Under ``advisoryLock`` a run takes its schedule's turn before it starts, waiting for
    another instance's turn or claim of that schedule in flight: past a role's
    ``lock_timeout`` the run was recorded failed (``not started: cannot take its turn``)."""
    from backend.store.postgres.sql import TURN_LOCK
    from tests.test_store import T0, Ids, claim

    _set_lock_timeout(pg_server, pg_url, "10ms")
    store = open_store(pg_url)
    await store.open()
    try:
        mine = claim(Ids(), "q", T0)
        await store.claim([mine], "a", T0)
        async with await psycopg.AsyncConnection.connect(pg_url) as other:  # another instance's turn, in flight
            await other.execute(TURN_LOCK, {"name": "q"})
            turn = asyncio.ensure_future(store.take_turn(mine.run_id, "q", T0, "a"))
            await _still_waiting_past(other, pg_url, turn)
            await other.rollback()
            assert (await asyncio.wait_for(turn, 10)).taken
    finally:
        await store.close()


def _set_isolation(server: pg.PgServer, url: str, level: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{level}'")


async def test_sessions_that_default_to_repeatable_read_are_made_read_committed(pg_server: pg.PgServer) -> None:
    """A role or database set to ``repeatable read`` (or ``serializable``) by default: a
    transaction that reads after taking a lock would read a snapshot from before the lock
    (two first opens migrating at once), and a fenced write racing an update fails with a
    serialization error instead of re-checking the row (fifty sends of one key)."""
    from tests.test_jobs_store import T0, define, jobs_of, new

    url = pg_server.create_database("isolation")  # empty: the first opens migrate it
    _set_isolation(pg_server, url, "repeatable read")
    stores = [open_store(url) for _ in range(5)]
    try:
        await asyncio.wait_for(asyncio.gather(*(store.open() for store in stores)), 60)  # (bounds a broken test)
        js = await define(stores[0])
        sends = [jobs_of(stores[i % 5]).send_jobs("mail", [new(i, key="once")], T0) for i in range(50)]
        answers = [a[0] for a in await asyncio.gather(*sends)]
        assert len({a.id for a in answers}) == 1 and sum(not a.duplicate for a in answers) == 1
        assert len(await js.list_jobs("mail", status=None, limit=100, before=None)) == 1
    finally:
        for store in stores:
            await store.close()


async def test_behind_a_transaction_pooler_another_default_isolation_is_refused_at_open(
    pg_server: pg.PgServer, pg_url: str
) -> None:
    _set_isolation(pg_server, pg_url, "serializable")
    store = open_store(pg_url + ("&" if "?" in pg_url else "?") + "pooler=transaction")
    with pytest.raises(Unavailable, match="default to serializable isolation") as refused:
        await store.open()
    assert "default_transaction_isolation = 'read committed'" in str(refused.value)
    assert "127.0.0.1" not in refused.value.public  # (the API's words name no host)


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
async def test_a_database_that_is_not_utf8_is_refused_at_open(pg_server: pg.PgServer, encoding: str) -> None:
    """Before, the store opened and the engine started; then a LATIN1 database failed every
    write of a character it has no byte for (a payload, a handler's error) and a SQL_ASCII
    one every statement with text, each with a driver error (an API 500)."""
    name = f"schedtui_enc_{encoding.lower()}_{os.getpid()}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'")
    pg_server.created.append(name)
    with pytest.raises(Unavailable, match=f"its database's encoding is {encoding}") as refused:
        async with connect(pg_server.url(name)):
            pass
    assert "ENCODING 'UTF8'" in str(refused.value)
    assert refused.value.public.endswith(f"the database's encoding is {encoding} (UTF8 is needed)")


@pytest.mark.parametrize("pooled", [False, True], ids=["direct", "pooler=transaction"])
async def test_a_date_style_other_than_iso_is_read_as_iso(
    pg_server: pg.PgServer, pg_url: str, clock: ManualClock, pooled: bool
) -> None:
    """psycopg reads timestamps in ISO text only: a role or database with ``DateStyle =
    'SQL, DMY'`` (a European DBA's choice) failed the store's first read of one at open
    (``NotImplementedError: can't parse timestamptz with DateStyle 'SQL, DMY'``)."""
    name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET DateStyle = 'SQL, DMY'")
    url = pg_url + ("&" if "?" in pg_url else "?") + "pooler=transaction" if pooled else pg_url
    ran: list[Any] = []

    async def handler(job: JobContext) -> None:
        ran.append(job.payload)

    engine = Engine([define_queue(name="q", handler=handler)], url, clock=clock, instance="dates")
    await engine.start()
    try:
        sent = await engine.jobs.send("q", "dated", delay=60)
        job = (await engine.jobs.get_job(sent.id)).job
        assert job is not None and (job.created_at, job.run_after) == (clock.now(), clock.now() + timedelta(seconds=60))
        clock.advance(60)
        await asyncio.wait_for(engine.quiesce(), 20)
        assert ran == ["dated"]
    finally:
        await engine.stop()


async def test_a_timer_round_that_raises_leaves_its_schedules_armed_for_their_next_slot(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The timers loop pops a slot's schedules, then claims and fires them. A round that
    raised in between (started again by its loop) left them armed at the popped slot with
    no timer: they never fired again."""
    fired: list[str] = []

    def tick(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at.strftime("%H:%M"))

    engine = make_engine([define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=tick)])
    await engine.start()
    await _settle(engine)
    real = engine.launcher.placement.mark_starting
    broken = True

    async def mark(*args: Any, **kwargs: Any) -> Any:
        if broken:
            raise RuntimeError("a store reply the timers did not expect")
        return await real(*args, **kwargs)

    engine.launcher.placement.mark_starting = mark  # type: ignore[method-assign]  # fails while broken
    clock.advance(60)  # 08:01: its round raises
    await _settle(engine)
    broken = False
    for _ in range(2):  # 08:02, 08:03
        clock.advance(60)
        await asyncio.wait_for(engine.quiesce(), 20)
    assert fired == ["08:02", "08:03"]
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.levelname == "ERROR"] == ["timers failed"]


async def test_a_stop_while_serve_waits_for_another_instances_migration_ends_it(pg_server: pg.PgServer, tmp_path: Any) -> None:
    """Found by an outside attack (2 of 2): SIGTERM, twice too, was ignored while serve
    waited at start for the migration lock another instance held (its owner's ``migrate``
    in a long transaction); it ended 30 s later on a statement timeout, and ``docker stop``
    would have killed it meanwhile."""
    import signal
    import subprocess
    import sys

    from backend.store.postgres.sql import LOCK_CLASS, LOCK_MIGRATE, MIGRATE_LOCK
    from tests.servers import cli_env
    from tests.test_store import waiting_for_an_advisory_lock

    url = pg_server.create_database("stop_at_start")  # empty: serve must migrate it
    (tmp_path / "schedules").mkdir()
    async with await psycopg.AsyncConnection.connect(url) as other:  # another instance, migrating
        await other.execute(MIGRATE_LOCK, (LOCK_CLASS, LOCK_MIGRATE))
        serve = subprocess.Popen([sys.executable, "-m", "console.cli", "serve", "--store", url, "--port", "0"],
                                 cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=pg.die_with_parent)  # fmt: skip
        try:
            await asyncio.wait_for(waiting_for_an_advisory_lock(url), 30)
            serve.send_signal(signal.SIGTERM)
            out, err = await asyncio.to_thread(serve.communicate, timeout=20)
        finally:
            serve.kill()
        await other.rollback()
    assert serve.returncode == 0, err
    assert "stopped during start-up: nothing was fired" in err
    assert "Traceback" not in err and "serving" not in out
    async with await psycopg.AsyncConnection.connect(url) as conn:  # its waiting statement went with it
        row = await (await conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).fetchone()
        assert row == (0,)
