"""The workers' cycles on PostgreSQL through the connections kept for them
(backend/store/postgres/jobs.py, backend/store/postgres/lane.py), and what a claim takes.

A cycle (finishes, handovers, claim) goes through a free cycle connection: its statements
prepared there on generic plans, their answers read from text. It must answer exactly what
the pool's path answers, and fall back to the pool when it cannot go there. A claim takes
a seat lock per job it can claim, not per seat of the queue. A cycle whose answer was lost
after it committed, run again by the store, is in doubt, and the worker is told: what the
first sending claimed goes back untouched, and an end it applied is no late result.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from backend import Engine, JobContext, ManualClock, define_queue
from backend.ids import IdFactory
from backend.jobs.model import JobDetail
from backend.jobs.store import Claimed, Finish, FinishKind, NewJob, QueueSpec
from backend.store.postgres.jobs import CLAIM, CYCLE_LANE_STATEMENTS
from backend.store.postgres.lane import Lane
from backend.store.postgres.store import PostgresStore
from tests.tcp_relay import relay_to, via

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
    # Applied once: sent again, each is answered as then (its attempt's record is there),
    # and nothing changes (compared with the pool's below).
    assert again.applied == [True, True, True]
    store._cyclers = []
    try:
        pool_finishes = finishes(on_pool.claimed)
        assert (await store.cycle_jobs(pool_finishes, {}, "w-1", "t-5", ended)).applied == [True, True, True]
        assert (await store.cycle_jobs(pool_finishes, {}, "w-1", "t-6", ended)).applied == [True, True, True]
        late = [replace(f, finished_at=f.finished_at + timedelta(microseconds=1)) for f in pool_finishes]
        assert (await store.cycle_jobs(late, {}, "w-1", "t-7", ended)).applied == [False, False, False]  # not these
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


#: What the store logs as it runs a cycle again, by where the first sending's answer was lost.
RUN_AGAIN = {"lane": "the schedtui_cycle connection failed", "pool": "store connection lost"}


@pytest.mark.parametrize("where", ["lane", "pool"])
async def test_a_claim_whose_answer_was_lost_and_that_the_store_ran_again_gives_its_job_back_untouched(
    where: str, pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim commits and its answer is lost (the connection breaks after the commit);
    the store runs the cycle again (on the pool), which finds the job taken. The worker,
    told the cycle was in doubt, has the sweep give the job back untouched: it runs once,
    as its first attempt. (It was left `running` under a token no longer in flight, and the
    sweep closed it as abandoned: dead, for a job of one attempt, its handler never run.)"""
    caplog.set_level(logging.INFO, "schedtui.store")
    calls: list[tuple[str, int]] = []

    async def handler(job: JobContext) -> None:
        calls.append((job.id, job.attempt))

    with relay_to(pg_url) as relay:
        engine = make_engine([define_queue(name="mail", handler=handler, attempts=1)], abandon_after=30,
                             store=via(pg_url, relay.port))  # fmt: skip
        await engine.open()
        store = engine.store
        assert isinstance(store, PostgresStore)
        if where == "pool":
            store._cyclers = []
        sent = await engine.jobs.send("mail", "x", delay=1)  # (due once the relay waits for its claim)
        await engine.start()
        if where == "lane":
            assert await store._cyclers[0].open()  # (the first free one takes the cycle)
        relay.lose_reply(sent.id.encode())  # the claim's answer names it
        for _ in range(30):
            clock.advance(1)  # (the sweep runs with the housekeeping, every second)
            await engine.quiesce()
            if calls or (await engine.jobs.get_job(sent.id)).job is None:
                break
        assert relay.lost.is_set()
        assert [r for r in caplog.records if RUN_AGAIN[where] in r.getMessage()]
        assert calls == [(sent.id, 1)]
        found = await engine.jobs.get_job(sent.id)
        assert found.job is None  # succeeded: gone
        assert [(a.attempt, a.status, a.error_tag) for a in found.attempts] == [(1, "succeeded", None)]
        await engine.stop(grace=0)


#: What the store logs as it sends an end again; a stop hands its ends in on the pool.
RUN_AGAIN["stop"] = RUN_AGAIN["pool"]


@pytest.mark.parametrize("where", ["lane", "pool", "stop"])
async def test_an_end_whose_answer_was_lost_and_that_the_store_ran_again_is_applied_once_and_no_late_result(
    where: str, pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A cycle carries a succeeded attempt's end (or a stop hands it in alone, the handler
    having ended within its grace), commits, and its answer is lost; run again by the
    store, the end finds its job gone and its own record: it is answered as applied, as
    the first sending was. No warning of a late result, and the attempt is counted (the
    metrics') once."""
    caplog.set_level(logging.INFO)
    started, go = asyncio.Event(), asyncio.Event()
    calls: list[tuple[str, int]] = []

    async def handler(job: JobContext) -> None:
        calls.append((job.id, job.attempt))
        started.set()
        await go.wait()

    with relay_to(pg_url) as relay:
        engine = make_engine([define_queue(name="mail", handler=handler, attempts=1)], abandon_after=30,
                             store=via(pg_url, relay.port))  # fmt: skip
        await engine.open()
        store = engine.store
        assert isinstance(store, PostgresStore)
        if where == "pool":
            store._cyclers = []
        metered: list[Finish] = []
        engine.jobs.meters.append(metered.append)
        sent = await engine.jobs.send("mail", "x")
        await engine.start()
        if where == "lane":
            assert await store._cyclers[0].open()
        await asyncio.wait_for(started.wait(), 10)  # (the timeouts only bound a broken test)
        workers = engine.jobs.workers
        assert workers is not None
        await until(lambda: not (workers.inflight or workers.handovers or workers.inflight_handovers))
        await engine.quiesce(runs=False)  # (the housekeeping's first round read the job running: not that answer)
        relay.lose_reply(sent.id.encode())  # the end's answer names it
        if where == "stop":
            stopping = asyncio.ensure_future(engine.stop(grace=10))
            await until(lambda: workers.stopping)
            go.set()
            await asyncio.wait_for(stopping, 10)
            assert relay.lost.is_set()
        else:
            go.set()
            await until(relay.lost.is_set)
            for _ in range(3):
                clock.advance(1)
                await engine.quiesce()
        assert [r for r in caplog.records if RUN_AGAIN[where] in r.getMessage()]
        assert calls == [(sent.id, 1)]
        found = await engine.jobs.get_job(sent.id) if where != "stop" else await after_stop(pg_url, sent.id)
        assert found.job is None  # succeeded: gone
        assert [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded")]
        assert not [r for r in caplog.records if "late result" in r.getMessage()]
        assert [(f.id, f.kind) for f in metered] == [(sent.id, "succeeded")]
        await engine.stop(grace=0)


async def after_stop(pg_url: str, job_id: str) -> JobDetail:
    """A job as the store holds it, read by a store of its own (the engine's is closed)."""
    checker = PostgresStore(pg_url)
    await checker.open()
    try:
        return JobDetail(job_id, "mail", await checker.get_job(job_id), (await checker.job_attempts(job_id))[1])
    finally:
        await checker.close()


async def until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait on the loop until ``done()``; the timeout only bounds a broken test."""

    async def poll() -> None:
        while not done():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)
