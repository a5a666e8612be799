"""The workers' cycles on PostgreSQL through the connections kept for them
(backend/store/postgres/jobs.py, backend/store/postgres/lane.py), and what a claim takes.

A cycle (finishes, handovers, claim) goes through a free cycle connection: its statements
prepared there on generic plans, their answers read from text. It must answer exactly what
the pool's path answers, and fall back to the pool when it cannot go there. A claim takes
a seat lock per job it can claim, not per seat of the queue.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from backend import Engine, define_queue
from backend.ids import IdFactory
from backend.jobs.store import Claimed, Finish, FinishKind, NewJob, QueueSpec
from backend.store.postgres.jobs import CLAIM, CYCLE_LANE_STATEMENTS
from backend.store.postgres.lane import Lane
from backend.store.postgres.store import PostgresStore

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 8, 0, 0, 123456, tzinfo=UTC)
ids = IdFactory(lambda: T0)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(pg_url)
    await opened.open()
    await opened.define_queues([QueueSpec(q, 4, 3, 900.0) for q in ("lane", "pool")], T0, update=True)
    yield opened
    await opened.close()


def cycle_calls(store: PostgresStore) -> int:
    return sum(lane.calls for lane in store._cyclers)


async def send_twins(store: PostgresStore, queue: str) -> list[str]:
    """The same four jobs in ``queue``: odd text, a key, a cron, attempts; one not due yet."""
    jobs = [
        NewJob(ids(), json.dumps({"note": "é ✓ \\u0000 \"q\""}), T0, None),
        NewJob(ids(), "[1, 2]", T0, 5, key="k-1"),
        NewJob(ids(), "null", T0 + timedelta(microseconds=1), None, cron="*/5 * * * *"),
        NewJob(ids(), "{}", T0 + timedelta(minutes=7, microseconds=9), None),
    ]
    sent = await store.send_jobs(queue, jobs, T0 - timedelta(seconds=1, microseconds=3))
    return [s.id for s in sent]


def comparable(claimed: list[Claimed]) -> list[Claimed]:
    return sorted((replace(c, id="", queue="", seat=None) for c in claimed), key=lambda c: c.payload)


async def test_a_cycle_on_its_connection_answers_what_the_pools_answers(store: PostgresStore) -> None:
    lane_ids = await send_twins(store, "lane")
    pool_ids = await send_twins(store, "pool")
    now = T0 + timedelta(seconds=2, microseconds=5)
    assert await store._cyclers[0].open()
    calls = cycle_calls(store)
    on_lane = await store.cycle_jobs([], {"lane": 4}, "w-1", "t-1", now)
    assert cycle_calls(store) == calls + 1
    cyclers, store._cyclers = store._cyclers, []  # the pool's path
    try:
        on_pool = await store.cycle_jobs([], {"pool": 4}, "w-1", "t-2", now)
    finally:
        store._cyclers = cyclers
    assert len(on_lane.claimed) == 3 and comparable(on_lane.claimed) == comparable(on_pool.claimed)
    assert {c.id for c in on_lane.claimed} == set(lane_ids[:3])
    seats = {c.seat for c in on_lane.claimed}
    assert len(seats) == 3 and seats <= {1, 2, 3, 4}
    assert on_lane.next_at == {"lane": T0 + timedelta(minutes=7, microseconds=9)} and on_pool.next_at == {"pool": on_lane.next_at["lane"]}
    assert all(c.started_at == now and c.created_at == T0 - timedelta(seconds=1, microseconds=3) for c in on_lane.claimed)

    # Every kind of finish through the connection, as the pool applies them.
    ended = now + timedelta(seconds=1)
    kinds: list[FinishKind] = ["succeeded", "retry", "dead"]

    def finishes(claimed: list[Claimed]) -> list[Finish]:
        by_payload = sorted(claimed, key=lambda c: c.payload)
        return [
            Finish(c.id, c.queue, c.tries, kind, c.attempt, c.started_at, ended, "w-1", None if kind == "succeeded" else "Boom",
                   None if kind == "succeeded" else "it went wrong: é", ended + timedelta(minutes=1) if kind == "retry" else None)
            for c, kind in zip(by_payload, kinds, strict=True)
        ]  # fmt: skip

    lane_finishes = finishes(on_lane.claimed)
    done = await store.cycle_jobs(lane_finishes, {}, "w-1", "t-3", ended)
    assert done.applied == [True, True, True] and cycle_calls(store) == calls + 2
    again = await store.cycle_jobs(lane_finishes, {}, "w-1", "t-4", ended)
    assert again.applied == [False, False, False]  # applied once: run again, nothing changes
    store._cyclers = []
    try:
        await store.cycle_jobs(finishes(on_pool.claimed), {}, "w-1", "t-5", ended)
    finally:
        store._cyclers = cyclers
    for lane_id, pool_id in zip(lane_ids, pool_ids, strict=True):
        lane_job, pool_job = await store.get_job(lane_id), await store.get_job(pool_id)
        if lane_job is None or pool_job is None:
            assert lane_job is None and pool_job is None  # succeeded: gone from both
            continue
        shown = (lane_job.status, lane_job.run_after, lane_job.error_message)
        assert shown == (pool_job.status, pool_job.run_after, pool_job.error_message)
        (_, lane_attempts), (_, pool_attempts) = await store.job_attempts(lane_id), await store.job_attempts(pool_id)
        assert [(a.status, a.finished_at) for a in lane_attempts] == [(a.status, a.finished_at) for a in pool_attempts]


async def test_a_cycle_goes_through_the_pool_when_no_cycle_connection_is_free(store: PostgresStore) -> None:
    [job] = await store.send_jobs("lane", [NewJob(ids(), "1", T0, None)], T0)
    lanes = store._cyclers
    assert all(not lane.connected for lane in lanes)  # none opened yet: the first cycles use the pool
    cycle = await store.cycle_jobs([], {"lane": 1}, "w-1", "t-1", T0)
    assert [c.id for c in cycle.claimed] == [job.id] and cycle_calls(store) == 0


async def test_a_cycle_connections_statements_run_on_generic_plans(store: PostgresStore, pg_url: str) -> None:
    """FINISH_SUCCEEDED was planned again at every call on custom plans (see CYCLE_CONFIGURE)."""
    ask = "SELECT custom_plans, generic_plans FROM pg_prepared_statements WHERE name = 'probe_succeeded'"
    statements = {**CYCLE_LANE_STATEMENTS, "plans": ask}
    probe = Lane(store._conninfo, "probe", statements, store._configure_cycle)
    try:
        assert await probe.open()
        at = T0.isoformat().encode()
        for n in range(8):
            await probe.call("succeeded", [b'{"none-%d"}' % n, b"{1}", b'{"lane"}', b"{1}", b'{"%s"}' % at, b'{"%s"}' % at, b'{"w"}'])
        plans = await probe.call("plans", [])
        assert (plans.get_value(0, 0), plans.get_value(0, 1)) == (b"0", b"8")
    finally:
        await probe.close()


def claim_in_a_transaction(pg_url: str, queue: str, wanted: int, now: datetime) -> tuple[int, int]:
    """CLAIM in a transaction left open: (jobs claimed, advisory locks this session holds)."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(CLAIM, {"wanted": json.dumps([{"queue": queue, "n": wanted, "r": 0}]), "now": now,
                                  "instance": "w", "token": "t", "spin": 3}).fetchall()  # fmt: skip
        locks = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()
        conn.rollback()
    assert locks is not None
    return sum(1 for row in rows if row[0] == "job"), locks[0]


async def test_a_claim_locks_a_seat_per_job_it_can_take_not_per_seat_of_the_queue(store: PostgresStore, pg_url: str) -> None:
    await store.define_queues([QueueSpec("wide", 16, 3, 900.0)], T0, update=True)
    assert claim_in_a_transaction(pg_url, "wide", 16, T0) == (0, 0)
    await store.send_jobs("wide", [NewJob(ids(), "1", T0, None)], T0)
    assert claim_in_a_transaction(pg_url, "wide", 16, T0) == (1, 1)
    await store.send_jobs("wide", [NewJob(ids(), "1", T0, None) for _ in range(2)], T0)
    await store.send_jobs("wide", [NewJob(ids(), "1", T0 + timedelta(hours=1), None)], T0)  # not due: no seat for it
    assert claim_in_a_transaction(pg_url, "wide", 16, T0) == (3, 3)
    assert claim_in_a_transaction(pg_url, "wide", 2, T0) == (2, 2)
    # with every seat but two taken, a claim asking for 16 gets two, and locks two
    await store.send_jobs("wide", [NewJob(ids(), "1", T0, None) for _ in range(14)], T0)
    assert len((await store.cycle_jobs([], {"wide": 14}, "w-1", "t-1", T0)).claimed) == 14
    assert claim_in_a_transaction(pg_url, "wide", 16, T0) == (2, 2)


async def test_when_its_connection_dies_a_cycle_runs_on_the_pool_and_the_connection_comes_back(
    store: PostgresStore, pg_url: str
) -> None:
    sent = await store.send_jobs("lane", [NewJob(ids(), "1", T0, None), NewJob(ids(), "2", T0, None)], T0)
    store._cyclers = store._cyclers[:1]
    lane = store._cyclers[0]
    assert await lane.open()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lane.pid,))
    first = await store.cycle_jobs([], {"lane": 1}, "w-1", "t-1", T0)  # the lane fails: the pool claims
    assert len(first.claimed) == 1 and not lane.connected
    assert await lane.open()  # (connected again when next asked, at most every few seconds)
    calls = lane.calls
    [claimed] = first.claimed
    done = Finish(claimed.id, claimed.queue, claimed.tries, "succeeded", claimed.attempt, claimed.started_at, T0, "w-1")
    second = await store.cycle_jobs([done], {"lane": 1}, "w-1", "t-2", T0)
    assert second.applied == [True] and len(second.claimed) == 1 and lane.calls == calls + 1
    assert {c.id for c in first.claimed + second.claimed} == {s.id for s in sent}


async def test_workers_start_opening_a_cycle_connection_per_stream_as_they_start(pg_url: str) -> None:
    """An engine that runs queues has its cycle connections on their way as its workers
    start, one per stream (the first claims would otherwise go to the pool while they
    opened); the one more, for overlapping cycles, opens when a cycle needs it. An
    engine without queues opens none."""

    async def nothing(ctx: Any) -> None:
        pass

    workers = Engine([define_queue(name="mail", handler=nothing)], pg_url, instance="workers", shutdown_grace=0)
    idle = Engine([], pg_url, instance="no-queues", shutdown_grace=0)
    await workers.start()
    await idle.start()
    try:
        for engine, opening in ((workers, PostgresStore.job_streams), (idle, 0)):
            store = engine.store
            assert isinstance(store, PostgresStore)
            assert [lane.opening for lane in store._cyclers] == [n < opening for n in range(len(store._cyclers))]
            assert not any(lane.opening for lane in store._senders)
    finally:
        await workers.stop()
        await idle.stop()
