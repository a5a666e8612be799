"""A deployment whose instances run as a role that may use schedtui's tables but not change
the schema (the least privilege a DBA gives a service; PostgreSQL 15 and later give no
one but the owner the right to create tables in ``public``), while the schema's owner
migrates, once per release, with ``schedtui migrate``.

Before, every open sent ``CREATE TABLE IF NOT EXISTS`` and ``ALTER TABLE … ADD COLUMN IF
NOT EXISTS``, which need that right whether or not the table is there: such a role could
not open a store that was fully migrated. A grant missing at run time (a table an upgrade
added that the role's grants do not cover) surfaced as a raw driver error; it is an
outage now, told by the health check, and the work resumes once it is granted."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

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
from backend.durable import DurableContext, define_durable
from console.cli.main import main
from tests import pg

#: What the README tells a DBA to grant the instances' role (beside USAGE on the schema,
#: which PostgreSQL gives everyone on ``public``).
USE_THE_TABLES = (
    "GRANT USAGE ON SCHEMA public TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
    "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}",
)

_numbers = itertools.count(1)


def _as(url: str, role: str) -> str:
    """The same database's URL, for another role."""
    params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    params.update(user=role, password="role-password")
    return "postgresql://?" + urlencode(params)


def _run(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def role(pg_server: pg.PgServer) -> Iterator[str]:
    """A role of its own (roles are the cluster's, shared by every test), dropped after."""
    name = f"schedtui_app_{os.getpid()}_{next(_numbers)}"
    _run(pg_server.dsn, f"CREATE ROLE {name} LOGIN PASSWORD 'role-password'")
    yield name
    for database in [d for d in pg_server.created]:  # what it was granted, wherever
        try:
            _run(pg_server.url(database), f"DROP OWNED BY {name}")
        except psycopg.Error:
            pass  # (a database a test dropped)
    _run(pg_server.dsn, f"DROP ROLE IF EXISTS {name}")


def _revoke_create_on_public(url: str) -> None:
    """What PostgreSQL 15 does by default, done explicitly: the test means the same on an
    older server."""
    _run(url, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")


async def test_a_role_that_may_only_use_the_tables_opens_a_migrated_store_and_runs_every_system(
    pg_url: str, role: str, clock: ManualClock
) -> None:
    _revoke_create_on_public(pg_url)
    _run(pg_url, *(s.format(role=role) for s in USE_THE_TABLES))
    fired: list[str] = []
    ran: list[Any] = []

    async def tick(ctx: RunContext) -> None:
        fired.append(ctx.scheduled_at.isoformat())

    async def handler(job: JobContext) -> None:
        ran.append(job.payload)

    async def body(ctx: DurableContext, input: Any) -> Any:
        one = await ctx.step("one", _value, 1)
        return one + 1

    engine = Engine(
        [
            define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=tick),
            define_queue(name="q", handler=handler),
            define_durable(name="f", handler=body),
        ],
        _as(pg_url, role),
        clock=clock,
        instance="least-privilege",
        shutdown_grace=0,
    )
    await engine.start()
    try:
        assert engine.store.migrated == []  # nothing to do, and nothing it may not do was sent
        clock.advance(60)
        await asyncio.wait_for(engine.quiesce(), 20)
        await engine.jobs.send("q", "a job")
        started = await engine.durable.start_execution("f")
        lease = await engine.locks.acquire("nightly", ttl=30)
        assert lease is not None
        await engine.set_enabled("tick", False, note="paused by the test")
        for _ in range(3):  # heartbeats, housekeeping, metrics, alerts: a few rounds of each
            clock.advance(10)
            await asyncio.wait_for(engine.quiesce(), 20)
        await lease.release()
        assert fired == ["2026-03-02T08:01:00+00:00"]
        assert ran == ["a job"]
        assert (await engine.durable.get(started.id)).output == 2
        assert engine.store.health().state == "ok"
        assert engine.lease.fresh()
    finally:
        await engine.stop()


async def _value(n: int) -> int:
    return n


async def test_a_role_that_may_not_create_the_tables_is_told_to_migrate_and_migrate_makes_them(
    pg_server: pg.PgServer, role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pg_server.create_database("roles")  # empty: its tables need creating
    _revoke_create_on_public(url)
    refused = await _refusal(_as(url, role))
    message = refused.message
    assert "permission denied for schema public" in message
    assert f'the role "{role}" may not create tables in schema "public"' in message
    assert "run `schedtui migrate` once with a role that may" in message
    assert "role-password" not in message
    assert refused.public == (
        "cannot set up the store: its tables need creating or migrating to this release, and its role may not"
    )  # (no role, host or database named to a client)
    # The owner migrates; the role, granted the use of the tables, then opens the store.
    await asyncio.to_thread(_migrate_cli, url, capsys, 'migrated the store "', 'core to version ')
    await asyncio.to_thread(_migrate_cli, url, capsys, "is up to date: nothing to migrate")
    _run(url, *(s.format(role=role) for s in USE_THE_TABLES))
    store = open_store(_as(url, role))
    await store.open()
    try:
        assert store.migrated == []
    finally:
        await store.close()


async def _refusal(url: str) -> Unavailable:
    """Why a store on ``url`` cannot open."""
    with pytest.raises(Unavailable) as refused:
        await open_store(url).open()
    return refused.value


def _migrate_cli(url: str, capsys: pytest.CaptureFixture[str], *said: str) -> None:
    assert main(["migrate", "--store", url]) == 0
    out = capsys.readouterr().out
    assert all(part in out for part in said), out


async def test_a_role_that_may_not_use_the_tables_is_told_what_to_grant(pg_url: str, role: str) -> None:
    message = (await _refusal(_as(pg_url, role))).message
    assert "permission denied for table schedtui_schema_version" in message
    assert f'the role "{role}" may not use schedtui\'s tables: GRANT SELECT, INSERT, UPDATE, DELETE' in message


async def test_a_table_the_grants_do_not_cover_is_an_outage_until_it_is_granted(pg_url: str, role: str) -> None:
    _run(pg_url, *(s.format(role=role) for s in USE_THE_TABLES))
    _run(pg_url, f"REVOKE ALL ON schedtui_jobs FROM {role}")  # as a table an upgrade added
    async def handler(job: JobContext) -> None:
        pass

    async with connect(_as(pg_url, role), definitions=[define_queue(name="q", handler=handler)]) as store:
        with pytest.raises(Unavailable, match="permission denied for table schedtui_jobs") as refused:
            await store.jobs.send("q", 1)  # not a psycopg error: the API answers 503, not 500
        assert refused.value.public.endswith("permission denied for table schedtui_jobs")
        health = store.engine.store.health()
        assert health.state == "failing" and "permission denied for table schedtui_jobs" in (health.error or "")
        _run(pg_url, f"GRANT SELECT, INSERT, UPDATE, DELETE ON schedtui_jobs TO {role}")
        sent = await store.jobs.send("q", 2)
        assert sent.id
        assert store.engine.store.health().state == "ok"
