"""Sends on PostgreSQL through the connections kept for them (backend/store/postgres/jobs.py,
backend/store/postgres/lane.py).

A send goes through a free sender's connection: its lock and insert prepared and pipelined,
and the wake-up of other processes' workers in a transaction of its own right after the
send's commit, in the same round trip. The connection is only a shortcut: when it dies, the
send runs on the pool, once (a job sent again finds its own row by its id, or its attempts
once it ran), and the wake-up goes through the caller's notifier.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from backend import Engine, JobContext, ManualClock, connect, define_queue
from backend.ids import IdFactory
from backend.jobs.definition import MAX_HELD
from backend.jobs.store import NewJob, QueueSpec
from backend.store.postgres.lane import Lane, LaneFailed
from backend.store.postgres.store import PostgresStore
from tests.tcp_relay import relay_to, via

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
ids = IdFactory(lambda: T0)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(pg_url)
    await opened.open()
    await opened.define_queues([QueueSpec("mail", 2, 3, 900.0)], T0, update=True)
    yield opened
    await opened.close()


def lane_calls(store: PostgresStore) -> int:
    return sum(lane.calls for lane in store._senders)


async def test_a_send_goes_through_a_senders_connection_and_wakes_a_listener_in_its_round_trip(
    store: PostgresStore, pg_url: str
) -> None:
    listener = PostgresStore(pg_url)
    await listener.open()
    heard: asyncio.Queue[str | None] = asyncio.Queue()
    watch = asyncio.ensure_future(listener.watch_jobs(heard.put_nowait))
    try:
        assert await asyncio.wait_for(heard.get(), 10) is None  # connected
        assert await store._senders[0].open()
        later: list[str] = []
        calls = lane_calls(store)
        [sent] = await store.send_jobs("mail", [NewJob(ids(), json.dumps({"n": 1}), T0, None, "k")], T0, wake_later=later.append)
        assert lane_calls(store) == calls + 1 and not sent.duplicate
        assert await asyncio.wait_for(heard.get(), 10) == "mail"
        assert later == []  # woken by the send itself
        # the same key again: the duplicate answers the first job, on the lane as well
        [again] = await store.send_jobs("mail", [NewJob(ids(), "null", T0, None, "k")], T0, wake_later=later.append)
        assert again.duplicate and again.id == sent.id and lane_calls(store) == calls + 2
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await listener.close()


async def test_when_the_senders_connection_dies_the_pool_sends_the_job_once(store: PostgresStore, pg_url: str) -> None:
    lane = store._senders[0]
    assert await lane.open()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lane.pid,))
    later: list[str] = []
    job = NewJob(ids(), "null", T0, None, None)
    [sent] = await store.send_jobs("mail", [job], T0, wake_later=later.append)
    assert sent.id == job.id and not sent.duplicate
    assert later == ["mail"]  # the pool's send: the caller's notifier wakes the others
    assert not lane.connected
    views = await store.queue_views(T0)
    assert [(v.name, v.queued) for v in views] == [("mail", 1)]
    # sent again (its answer lost): its own row, not a duplicate, nothing more queued
    assert await lane.open()
    [resent] = await store.send_jobs("mail", [job], T0, wake_later=later.append)
    assert resent.id == job.id and not resent.duplicate and later == ["mail"]
    assert [v.queued for v in await store.queue_views(T0)] == [1]


async def test_a_pipelined_call_is_one_transaction_and_the_statement_after_it_runs_apart(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE lane_probe (n int PRIMARY KEY)")

    async def nothing(conn: psycopg.AsyncConnection[object]) -> None:
        return None

    statements = {"add": "INSERT INTO lane_probe VALUES (%s::int)", "count": "SELECT count(*) FROM lane_probe",
                  "xid": "SELECT txid_current()::text"}  # fmt: skip
    lane = Lane(pg_url, "probe", statements, nothing)
    try:
        assert await lane.open()
        *added, after = await lane.call_many([("add", [b"1"]), ("add", [b"2"])], then=("count", []))
        assert len(added) == 2 and after.get_value(0, 0) == b"2"
        # The statement after runs in a transaction of its own, once the first has committed.
        first, then = await lane.call_many([("xid", [])], then=("xid", []))
        xid, xid_after = first.get_value(0, 0), then.get_value(0, 0)
        assert xid is not None and xid_after is not None and xid != xid_after
        with psycopg.connect(pg_url, autocommit=True) as admin:
            assert admin.execute("SELECT txid_status(%s::bigint)", (xid.decode(),)).fetchone() == ("committed",)
        # A statement that fails rolls back the first transaction, and the one after does not run
        # (they go in one write, up to one Sync); the lane is left as it was, and is kept.
        with pytest.raises(LaneFailed, match="duplicate key"):
            await lane.call_many([("add", [b"3"]), ("add", [b"1"])], then=("add", [b"4"]))
        assert lane.connected and lane.available()
        # The statement after failing leaves the first one committed.
        with pytest.raises(LaneFailed, match="duplicate key"):
            await lane.call_many([("add", [b"5"])], then=("add", [b"2"]))
        assert lane.connected and lane.available()
        [count] = await lane.call_many([("count", [])])
        assert count.get_value(0, 0) == b"3"  # 1, 2 and 5; 3 rolled back, 4 never ran
    finally:
        await lane.close()


async def test_a_reply_awaited_after_the_connection_was_let_go_is_in_doubt(pg_url: str) -> None:
    """Sent, then its connection let go (the reader found it broken) before the reply was
    awaited: the call fails LaneFailed (it may have committed: the caller takes it as in
    doubt), not an AssertionError, which the sends took for "not sent" and sent their jobs
    again (a job inserted twice, run twice)."""
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE lane_doubt (n int PRIMARY KEY)")

    async def nothing(conn: psycopg.AsyncConnection[object]) -> None:
        return None

    lane = Lane(pg_url, "probe", {"add": "INSERT INTO lane_doubt VALUES (%s::int)"}, nothing)
    try:
        assert await lane.open()
        reply = lane.start_many([("add", [b"1"])])
        lane._broken(OSError("the connection broke (test)"))  # (what the reader does when it finds so)
        with pytest.raises(LaneFailed):
            await reply
    finally:
        await lane.close()


async def test_sends_that_find_every_senders_connection_busy_go_together_and_each_gets_its_answers(
    store: PostgresStore,
) -> None:
    store._senders = store._senders[:1]  # one connection: the sends beside it must wait for it
    lane = store._senders[0]
    assert await lane.open()
    later: list[str] = []
    calls = lane.calls
    batches = [
        [NewJob(ids(), json.dumps(i), T0, None, f"k{i % 7}"), NewJob(ids(), "null", T0, None, None)] for i in range(30)
    ]
    answers = await asyncio.gather(*(store.send_jobs("mail", b, T0, wake_later=later.append) for b in batches))
    # the first went alone; the others waited for it and went in shared sends of at most 100 jobs
    assert 2 <= lane.calls - calls < 30 and later == []
    for i, (batch, sent) in enumerate(zip(batches, answers, strict=True)):
        assert len(sent) == 2 and sent[1].id == batch[1].id and not sent[1].duplicate
        if i < 7:
            assert sent[0].id == batch[0].id and not sent[0].duplicate  # the first of its key
        else:
            assert sent[0].duplicate and sent[0].id == batches[i % 7][0].id
    assert [v.queued for v in await store.queue_views(T0)] == [30 + 7]


async def test_waiting_sends_go_alone_on_the_pool_when_their_shared_send_does_not_fit(
    store: PostgresStore, pg_url: str
) -> None:
    store._senders = store._senders[:1]
    lane = store._senders[0]
    assert await lane.open()
    filler = [NewJob(ids(), "null", T0, None, None) for _ in range(MAX_HELD - 2_000 - 5)]
    await store.send_jobs("mail", filler, T0)
    batches = [[NewJob(ids(), "null", T0, None, None)] for _ in range(10)]
    answers = await asyncio.gather(*(store.send_jobs("mail", b, T0) for b in batches))
    assert [a[0].id for a in answers] == [b[0].id for b in batches]  # past the shared room: each alone, all taken
    assert [v.queued for v in await store.queue_views(T0)] == [MAX_HELD - 2_000 + 5]


async def test_one_job_without_a_key_is_sent_by_its_own_statement_which_answers_as_the_batchs_does(
    store: PostgresStore, pg_url: str
) -> None:
    """SEND_ONE against SEND, row for row, on the same states: a new job, one sent again,
    a queue that does not exist, a queue at its limit (a new job does not fit; one sent
    again does), and the queue's default attempts or the job's own."""
    from backend.store.postgres.jobs import SEND_LANE_STATEMENTS, _send_rows

    lane = Lane(pg_url, "twin", SEND_LANE_STATEMENTS, store._configure)
    await store.define_queues([QueueSpec("batch", 2, 4, 900.0)], T0, update=True)
    at = T0.isoformat().encode()

    async def both(queue: str, job: NewJob, limit: int) -> list[tuple[object, ...]]:
        answers = []
        for key, twin in (("send_one", queue), ("send", "batch" if queue == "one" else f"{queue}-b")):
            if key == "send_one":
                params = [twin.encode(), job.id.encode(), job.payload.encode(), None if job.cron is None else job.cron.encode(),
                          None if job.attempts is None else b"%d" % job.attempts, job.run_after.isoformat().encode(), at,
                          b"%d" % limit]  # fmt: skip
            else:
                batch = [{"n": 0, "id": job.id + "-b", "payload": job.payload, "key": None, "cron": job.cron,
                          "attempts": job.attempts, "run_after": job.run_after.isoformat()}]  # fmt: skip
                params = [twin.encode(), json.dumps(batch).encode(), at, b"%d" % limit]
            [result] = await lane.call_many([(key, params)])
            rows = _send_rows(result)
            answers.append([(row[0].removesuffix("-b") if row[0] else None, *row[1:]) for row in rows])
        assert answers[0] == answers[1]
        return answers[0]

    try:
        assert await lane.open()
        await store.define_queues([QueueSpec("one", 2, 4, 900.0)], T0, update=True)
        job = NewJob(ids(), json.dumps({"é": "✓"}), T0, None, cron="*/5 * * * *")
        assert await both("one", job, 10) == [(job.id, False, True, True, 0, 1, 1)]
        assert await both("one", job, 10) == [(job.id, False, True, True, 1, 0, 0)]  # sent again: found, not added
        assert await both("one", job, 1) == [(job.id, False, True, True, 1, 0, 0)]  # at the limit, it is there already
        other = NewJob(ids(), "7", T0 + timedelta(minutes=1), 9)
        assert await both("one", other, 1) == [(other.id, False, True, False, 1, 1, 0)]  # a new one does not fit
        assert await both("one", other, 2) == [(other.id, False, True, True, 1, 1, 1)]
        lost = NewJob(ids(), "null", T0, None)
        assert await both("nowhere", lost, 2) == [(lost.id, False, False, False, 0, 1, 0)]
        for sent in (job, other):
            mine, twin = await store.get_job(sent.id), await store.get_job(sent.id + "-b")
            assert mine is not None and twin is not None
            assert (mine.payload, mine.cron, mine.max_attempts, mine.run_after, mine.created_at) == (
                twin.payload, twin.cron, twin.max_attempts, twin.run_after, twin.created_at)
        first, second = await store.get_job(job.id), await store.get_job(other.id)
        assert first is not None and second is not None
        assert first.max_attempts == 4 and second.max_attempts == 9
    finally:
        await lane.close()


async def test_a_send_of_one_job_without_a_key_goes_by_the_one_jobs_statement(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[str] = []
    inner = Lane.start_many

    def spy(self: Lane, calls: Any, then: Any = None) -> Any:
        used.extend(key for key, _ in calls)
        return inner(self, calls, then)

    monkeypatch.setattr(Lane, "start_many", spy)
    assert await store._senders[0].open()
    await store.send_jobs("mail", [NewJob(ids(), "1", T0, None)], T0)
    await store.send_jobs("mail", [NewJob(ids(), "1", T0, None, "k")], T0)
    await store.send_jobs("mail", [NewJob(ids(), "1", T0, None), NewJob(ids(), "2", T0, None)], T0)
    assert used == ["lock", "send_one", "lock", "send", "lock", "send"]


async def test_a_client_starts_opening_its_first_senders_connection_as_it_opens(pg_url: str) -> None:
    """connect(): the first sender's connection is on its way before any send (a burst of
    sends right after start would otherwise go to the pool while it opened beside them);
    the other senders' wait until sends overlap. The first send then goes through it."""

    async def nothing(ctx: Any) -> None:
        pass

    async with connect(pg_url, definitions=[define_queue(name="mail", handler=nothing)]) as st:
        store = st.engine.store
        assert isinstance(store, PostgresStore)
        first, *others = store._senders
        assert first.opening and not any(lane.opening for lane in others)
        assert not any(lane.opening for lane in store._cyclers)  # a client runs no workers
        assert await first.open()
        await st.jobs.send("mail", {"n": 1})
        assert first.calls == 1 and not any(lane.opening for lane in others)


async def test_a_store_opened_for_reading_opens_no_senders_connection(pg_url: str) -> None:
    """The hint is the client's: a store opened otherwise (an engine, the CLI, the API)
    opens a sender's connection only when a send needs one."""
    opened = PostgresStore(pg_url)
    await opened.open()
    try:
        await opened.queue_views(T0)
        assert not any(lane.opening for lane in opened._senders)
    finally:
        await opened.close()


@pytest.mark.parametrize("where", ["lane", "pool", "shared"])
async def test_a_send_whose_answer_was_lost_is_not_queued_again_when_its_job_ran_and_went_meanwhile(
    where: str, pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A send commits and its answer is lost in a network blip; a worker elsewhere runs the
    job (woken by the send's own wake-up, or its poll) and it goes (succeeded) before the
    store sends it again. The repeat finds it by its attempts: it answers its id (not a
    duplicate) and queues nothing; the job ran once. (It was queued again and ran twice,
    its second attempt's record dropped.) On a sender's connection, on the pool, and in a
    send that rode with others on a sender's connection."""
    ran: list[tuple[str, int]] = []

    async def handler(job: JobContext) -> None:
        ran.append((job.id, job.attempt))

    worker = make_engine([define_queue(name="mail", handler=handler)], store=pg_url)
    await worker.start()
    with relay_to(pg_url) as relay:
        sender = PostgresStore(via(pg_url, relay.port))
        await sender.open()
        try:
            if where == "pool":
                sender._senders = []
            else:
                sender._senders = sender._senders[:1]  # (the send that goes first holds it: the next one rides)
                assert await sender._senders[0].open()
            first, job = NewJob(ids(), "0", T0, None), NewJob(ids(), "1", T0, None)
            relay.lose_reply(job.id.encode(), freeze=True)
            later: list[str] = []
            sends = [job] if where != "shared" else [first, job]
            sending = asyncio.gather(*(sender.send_jobs("mail", [j], T0, wake_later=later.append) for j in sends))
            await asyncio.wait_for(asyncio.to_thread(relay.lost.wait), 10)  # (the timeouts only bound a broken test)
            for _ in range(10):
                clock.advance(1)
                await worker.quiesce()
                found = await worker.jobs.get_job(job.id)
                if found.job is None and found.attempts:
                    break
            assert found.job is None and found.attempts  # it ran and went, the repeat still waiting for the network
            relay.thaw()
            answers = await asyncio.wait_for(sending, 10)
            assert [(s.id, s.duplicate) for [s] in answers] == [(j.id, False) for j in sends]
            if where == "shared":
                assert sender._senders[0].calls == 2  # the first alone, then the one that rode
            for _ in range(3):
                clock.advance(1)
                await worker.quiesce()
            assert sorted(ran) == sorted((j.id, 1) for j in sends)
            found = await worker.jobs.get_job(job.id)
            assert found.job is None and [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded")]
        finally:
            await sender.close()
