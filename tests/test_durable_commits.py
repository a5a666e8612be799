"""A commit the server has answered must survive the server's crash: a claim, a checkpoint,
a lock's token or a fence lost after its answer would fire a slot twice, run a finished
step again or hand a lock to two holders. ``synchronous_commit = off`` for a role or a
database (a common setting for speed) answers commits before they are on disk; the store
turns it back on for every session of its own and says so, and says what to set where it
cannot (behind a transaction pooler)."""

from __future__ import annotations

import logging

import psycopg
import pytest

from backend.store import open_store
from backend.store.postgres.lane import Lane
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests.pooler import Pooler
from tests.test_pooler import pooled, problems, set_timeouts

pytestmark = pytest.mark.postgres

SETTING = "SELECT current_setting('synchronous_commit')"


def set_synchronous_commit(url: str, value: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {value}')


async def sessions_setting(store: PostgresStore) -> set[str]:
    """``synchronous_commit`` in the store's pool and in a session opened as each of its
    lanes opens its own (the checkpoints', the sends', the cycles')."""
    assert store._pool is not None
    seen = set()
    async with store._pool.connection() as conn:
        row = await (await conn.execute(SETTING)).fetchone()
        assert row is not None
        seen.add(row[0])
    lanes = [store._checkpoints, *store._senders, *store._cyclers]
    assert lanes and all(lane is not None for lane in lanes)
    for lane in lanes:
        assert lane is not None
        probe = Lane(store._conninfo, "probe", {"s": SETTING}, lane.configure)
        try:
            assert await probe.open()
            result = await probe.call("s", [])
            value = result.get_value(0, 0)
            assert value is not None
            seen.add(value.decode())
        finally:
            await probe.close()
    return seen


async def test_a_database_whose_commits_are_not_durable_gets_them_durable_in_every_session_of_the_store(
    pg_server: pg.PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg_server.create_database(migrated=True)
    set_synchronous_commit(url, "off")
    caplog.set_level(logging.INFO)
    store = PostgresStore(url)
    await store.open()
    try:
        assert await sessions_setting(store) == {"on"}
    finally:
        await store.close()
    (warning,) = problems(caplog)
    assert "has synchronous_commit = off for this role or database: schedtui turns it on for its own connections" in warning
    # Other clients of the database keep what it says.
    with psycopg.connect(url) as conn:
        assert conn.execute(SETTING).fetchone() == ("off",)


@pytest.mark.parametrize("value", ["on", "local", "remote_write", "remote_apply"])
async def test_any_setting_that_flushes_the_commit_first_is_kept_and_nothing_is_said(
    pg_server: pg.PgServer, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    url = pg_server.create_database(migrated=True)
    set_synchronous_commit(url, value)
    caplog.set_level(logging.INFO)
    store = PostgresStore(url)
    await store.open()
    try:
        assert await sessions_setting(store) == {value}
    finally:
        await store.close()
    assert problems(caplog) == []


async def test_behind_a_transaction_pooler_it_is_left_as_it_is_and_the_operator_is_told_what_to_set(
    pg_pooler: Pooler, pg_server: pg.PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg_server.create_database(migrated=True)
    set_timeouts(url)  # (the warning about those is another test's)
    set_synchronous_commit(url, "off")
    caplog.set_level(logging.INFO)
    store = open_store(pooled(pg_pooler, url))
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        await store.server_clock()
    finally:
        await store.close()
    (warning,) = problems(caplog)
    assert "behind a transaction pooler schedtui cannot turn it on for its own sessions" in warning
    assert "ALTER ROLE … SET synchronous_commit = on" in warning and "Behind PgBouncer" in warning
    # Nothing set on the server connections that the pooler's other clients get.
    with psycopg.connect(pg_pooler.url(url)) as one, psycopg.connect(pg_pooler.url(url)) as two:
        assert [conn.execute(SETTING).fetchone() for conn in (one, two)] == [("off",), ("off",)]
