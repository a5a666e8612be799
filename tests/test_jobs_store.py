"""The job queue's store contract (:class:`backend.jobs.store.JobStore`), written once and
run against both stores (SQLite and a real PostgreSQL), through the protocol only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from backend import NotFound
from backend.ids import IdFactory
from backend.jobs.definition import MAX_HELD
from backend.jobs.model import NotDead, QueueFull
from backend.jobs.store import Claimed, Finish, FinishKind, Handover, JobStore, NewJob, QueueSpec, RunningJob
from backend.store import Store
from tests.test_store import new_store, store, store_kind  # noqa: F401 - the fixtures

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


class Ids:
    def __init__(self) -> None:
        self.make = IdFactory(lambda: T0)

    def __call__(self) -> str:
        return self.make()


ids = Ids()


def jobs_of(store: Store) -> JobStore:
    return cast(JobStore, store)


def new(
    payload: Any = None, *, at: datetime = T0, key: str | None = None, attempts: int | None = None, job_id: str | None = None
) -> NewJob:
    return NewJob(job_id or ids(), json.dumps(payload), at, attempts, key)


async def define(store: Store, name: str = "mail", concurrency: int = 2, attempts: int = 3) -> JobStore:
    js = jobs_of(store)
    await js.define_queues([QueueSpec(name, concurrency, attempts, 900.0)], T0, update=True)
    return js


def finish(c: Claimed, kind: FinishKind, at: datetime, *, retry_at: datetime | None = None, tag: str | None = None) -> Finish:
    return Finish(c.id, c.queue, c.tries, kind, c.attempt, c.started_at, at, "worker-a", tag, tag and f"{tag}!", retry_at)


async def claim(js: JobStore, n: int = 10, *, queue: str = "mail", at: datetime = T0, instance: str = "worker-a") -> list[Claimed]:
    cycle = await js.cycle_jobs([], {queue: n}, instance, ids(), at)
    return cycle.claimed


# ---------------------------------------------------------------------------------------
# queues
# ---------------------------------------------------------------------------------------
async def test_queues_are_recorded_updated_only_when_asked_and_keep_their_pause(store: Store) -> None:
    js = jobs_of(store)
    await js.define_queues([QueueSpec("mail", 4, 3, 900.0), QueueSpec("audio", 1, 5, 60.0)], T0, update=False)
    assert await js.pause_queue("mail", True, "alice", T0)
    await js.define_queues([QueueSpec("mail", 8, 3, 900.0)], T0, update=False)  # a reader: adds, never overwrites
    views = {v.name: v for v in await js.queue_views(T0)}
    assert (views["mail"].concurrency, views["mail"].paused) == (4, True)
    await js.define_queues([QueueSpec("mail", 8, 3, 900.0)], T0, update=True)  # serve: its settings win
    views = {v.name: v for v in await js.queue_views(T0)}
    assert [*views] == ["audio", "mail"]
    assert (views["mail"].concurrency, views["mail"].paused) == (8, True)  # the pause stays
    assert not await js.pause_queue("nope", True, "alice", T0)


async def test_a_send_to_an_unknown_queue_is_refused(store: Store) -> None:
    with pytest.raises(NotFound, match='no queue named "ghost"'):
        await jobs_of(store).send_jobs("ghost", [new()], T0)


# ---------------------------------------------------------------------------------------
# sending
# ---------------------------------------------------------------------------------------
async def test_a_send_stores_every_field_and_takes_the_queue_default_attempts(store: Store) -> None:
    js = await define(store, attempts=4)
    a, b = new({"order": 42, "é": [1.5, None]}, key="receipt:42"), new("x", at=T0 + timedelta(hours=1), attempts=9)
    sent = await js.send_jobs("mail", [a, b], T0)
    assert [(s.id, s.duplicate) for s in sent] == [(a.id, False), (b.id, False)]
    job = await js.get_job(a.id)
    assert job is not None
    assert (job.queue, job.status, job.payload, job.key, job.cron) == (
        "mail", "queued", {"order": 42, "é": [1.5, None]}, "receipt:42", None
    )
    assert (job.attempt, job.max_attempts, job.run_after, job.created_at, job.started_at) == (0, 4, T0, T0, None)
    other = await js.get_job(b.id)
    assert other is not None and (other.max_attempts, other.run_after) == (9, T0 + timedelta(hours=1))
    assert await js.get_job(ids()) is None


async def test_a_key_held_by_a_queued_running_or_dead_job_queues_nothing(store: Store) -> None:
    js = await define(store, attempts=1)
    first = new(1, key="k")
    await js.send_jobs("mail", [first], T0)
    again = await js.send_jobs("mail", [new(2, key="k")], T0)
    assert [(s.id, s.duplicate) for s in again] == [(first.id, True)]
    (c,) = await claim(js)
    assert (await js.send_jobs("mail", [new(3, key="k")], T0))[0].id == first.id  # running
    await js.cycle_jobs([finish(c, "dead", T0, tag="Boom")], {}, "worker-a", ids(), T0)
    assert (await js.send_jobs("mail", [new(4, key="k")], T0))[0].id == first.id  # dead
    assert len(await js.list_jobs("mail", status=None, limit=10, before=None)) == 1
    # Another queue's key space is its own.
    await define(store, "other")
    assert not (await js.send_jobs("other", [new(5, key="k")], T0))[0].duplicate


async def test_a_key_is_free_again_once_its_job_is_gone(store: Store) -> None:
    js = await define(store)
    first = new(1, key="k")
    await js.send_jobs("mail", [first], T0)
    (c,) = await claim(js)
    await js.cycle_jobs([finish(c, "succeeded", T0)], {}, "worker-a", ids(), T0)
    second = new(2, key="k")
    assert [(s.id, s.duplicate) for s in await js.send_jobs("mail", [second], T0)] == [(second.id, False)]
    assert await js.cancel_job("mail", key="k")
    third = new(3, key="k")
    assert not (await js.send_jobs("mail", [third], T0))[0].duplicate


async def test_a_batch_with_one_key_twice_queues_the_first_and_a_resend_of_an_id_is_not_a_duplicate(store: Store) -> None:
    js = await define(store)
    a, b, c = new(1, key="k"), new(2, key="k"), new(3)
    sent = await js.send_jobs("mail", [a, b, c], T0)
    assert [(s.id, s.duplicate) for s in sent] == [(a.id, False), (a.id, True), (c.id, False)]
    # The same ids again (a send whose answer was lost, retried): no duplicates, nothing new.
    sent = await js.send_jobs("mail", [a, c], T0)
    assert [(s.id, s.duplicate) for s in sent] == [(a.id, False), (c.id, False)]
    assert len(await js.list_jobs("mail", status=None, limit=10, before=None)) == 2


async def test_a_queue_holds_at_most_ten_thousand_queued_and_dead_jobs(store: Store) -> None:
    js = await define(store, concurrency=1, attempts=1)
    await js.send_jobs("mail", [new(i, key="dup" if i == 5 else None) for i in range(MAX_HELD - 1)], T0)
    (c,) = await claim(js, 1)
    await js.cycle_jobs([finish(c, "dead", T0, tag="Boom")], {}, "worker-a", ids(), T0)  # dead jobs count too
    before = len(await js.list_jobs("mail", status=None, limit=1000, before=None))
    full = r'queue "mail" is full: it holds 9,999 queued and dead jobs and the limit is 10,000; 2 more'
    with pytest.raises(QueueFull, match=full) as info:
        await js.send_jobs("mail", [new("a"), new("b")], T0)  # all or nothing
    assert info.value.code == "queue_full" and info.value.count == 9_999
    assert len(await js.list_jobs("mail", status=None, limit=1000, before=None)) == before
    last = new("last")
    assert not (await js.send_jobs("mail", [last], T0))[0].duplicate  # the 10,000th fits
    with pytest.raises(QueueFull):
        await js.send_jobs("mail", [new("one too many")], T0)
    # A duplicate adds nothing, so it is answered even when the queue is full.
    assert (await js.send_jobs("mail", [new("again", key="dup")], T0))[0].duplicate
    (running,) = await claim(js, 1)  # running jobs do not count: one frees room
    assert running.id
    assert not (await js.send_jobs("mail", [new("fits again")], T0))[0].duplicate
    # The running job dies: the queue holds one over its limit (a retry or a death is never
    # refused). A send that adds nothing is still answered: a key held, an id sent before.
    await js.cycle_jobs([finish(running, "dead", T0, tag="Boom")], {}, "worker-a", ids(), T0)
    assert (await js.send_jobs("mail", [new("again 2", key="dup")], T0))[0].duplicate
    assert [(s.id, s.duplicate) for s in await js.send_jobs("mail", [last], T0)] == [(last.id, False)]
    with pytest.raises(QueueFull, match="it holds 10,001 queued and dead jobs"):
        await js.send_jobs("mail", [new("one over"), new("again 3", key="dup")], T0)


# ---------------------------------------------------------------------------------------
# the worker cycle
# ---------------------------------------------------------------------------------------
async def test_a_claim_takes_the_oldest_due_jobs_up_to_the_free_seats(store: Store) -> None:
    js = await define(store, concurrency=2)
    late, old = new("late", at=T0), new("old", at=T0 - timedelta(minutes=5))
    newer, future = new("newer", at=T0 - timedelta(minutes=1)), new("future", at=T0 + timedelta(seconds=90))
    await js.send_jobs("mail", [late, old, newer, future], T0)
    cycle = await js.cycle_jobs([], {"mail": 5}, "worker-a", "tok-1", T0)
    assert [c.id for c in cycle.claimed] == [old.id, newer.id]  # two seats
    assert cycle.next_at == {"mail": T0 + timedelta(seconds=90)}
    c = cycle.claimed[0]
    assert (c.queue, json.loads(c.payload), c.attempt, c.max_attempts, c.tries, c.started_at) == ("mail", "old", 1, 3, 1, T0)
    running = {r.id: r for r in await js.running_jobs()}
    assert set(running) == {old.id, newer.id}
    assert (running[old.id].instance, running[old.id].token, running[old.id].tries) == ("worker-a", "tok-1", 1)
    assert (await claim(js)) == []  # no seat left
    # A finish frees its seat within the same cycle.
    cycle = await js.cycle_jobs([finish(c, "succeeded", T0)], {"mail": 5}, "worker-a", "tok-2", T0)
    assert cycle.applied == [True] and [x.id for x in cycle.claimed] == [late.id]
    assert await js.get_job(old.id) is None
    assert await claim(js, at=T0 + timedelta(seconds=89)) == []
    view = (await js.queue_views(T0))[0]
    assert (view.queued, view.running, view.dead) == (1, 2, 0)


async def test_jobs_claimed_ahead_hold_no_seat_until_a_handover_after_the_finish_that_frees_one(store: Store) -> None:
    js = await define(store, concurrency=1)
    jobs = [new(n, at=T0 - timedelta(seconds=4 - n)) for n in range(4)]
    await js.send_jobs("mail", jobs, T0)
    if not js.job_reservations:  # a store that claims nothing ahead takes only what has a seat
        cycle = await js.cycle_jobs([], {"mail": 1}, "worker-a", "tok-1", T0, ahead={"mail": 2})
        assert [(c.id, c.seat is not None) for c in cycle.claimed] == [(jobs[0].id, True)]
        return
    cycle = await js.cycle_jobs([], {"mail": 1}, "worker-a", "tok-1", T0, ahead={"mail": 2})
    assert {c.id for c in cycle.claimed} == {j.id for j in jobs[:3]}  # the oldest three
    (first,) = [c for c in cycle.claimed if c.seat is not None]
    a, b = sorted((c for c in cycle.claimed if c.seat is None), key=lambda c: c.id)
    assert first.seat == 1
    assert (a.attempt, a.tries) == (1, 1)  # claimed: its own fencing token from now on
    view = (await js.queue_views(T0))[0]
    assert (view.queued, view.running) == (3, 1)  # ahead of a seat, a job shows as queued
    # A handover onto a seat another running job holds is refused (its finish did not apply).
    cycle = await js.cycle_jobs([], {}, "worker-a", "tok-2", T0, handovers=[Handover(a.id, a.tries, 1)])
    assert cycle.handed == [False]
    # The finish frees the seat, then the handover takes it, in one transaction.
    cycle = await js.cycle_jobs([finish(first, "succeeded", T0)], {}, "worker-a", "tok-3", T0, handovers=[Handover(a.id, a.tries, 1)])
    assert (cycle.applied, cycle.handed) == ([True], [True])
    # The same cycle again (its answer was lost): the finish does not apply twice but is
    # answered as the first sending was (its attempt's record is there), and the handover
    # finds the job on that seat already: moved (a "no" stopped the job it ran).
    cycle = await js.cycle_jobs([finish(first, "succeeded", T0)], {}, "worker-a", "tok-5", T0, handovers=[Handover(a.id, a.tries, 1)])
    assert (cycle.applied, cycle.handed) == ([True], [True])
    _, attempts = await js.job_attempts(first.id)
    assert [(at.attempt, at.status) for at in attempts] == [(1, "succeeded")]
    cycle = await js.cycle_jobs([], {}, "worker-a", "tok-6", T0, handovers=[Handover(a.id, a.tries + 1, 1)])
    assert cycle.handed == [False]  # (under other tries, it is not that claim's)
    running = {r.id: r for r in await js.running_jobs()}
    assert (running[a.id].seat, running[b.id].seat) == (1, None)
    assert await claim(js) == []  # the seat is a's: nothing is claimed beside it
    # Claimed ahead and never started: it goes back untouched, no attempt used.
    cycle = await js.cycle_jobs([finish(b, "release", T0)], {}, "worker-a", "tok-4", T0)
    assert cycle.applied == [True]
    back = await js.get_job(b.id)
    assert back is not None and (back.status, back.attempt) == ("queued", 0)
    assert (await js.job_attempts(b.id))[1] == []


async def test_a_failed_attempt_is_retried_then_dead_and_every_attempt_is_recorded(store: Store) -> None:
    js = await define(store, attempts=2)
    job = new({"n": 1})
    await js.send_jobs("mail", [job], T0)
    (c1,) = await claim(js)
    retry_at = T0 + timedelta(seconds=10)
    await js.cycle_jobs([finish(c1, "retry", T0 + timedelta(seconds=1), retry_at=retry_at, tag="Timeout")], {}, "worker-a", ids(), T0)
    queued = await js.get_job(job.id)
    assert queued is not None
    assert (queued.status, queued.attempt, queued.run_after, queued.error_tag, queued.error_message) == (
        "queued", 1, retry_at, "Timeout", "Timeout!"
    )
    assert await claim(js, at=retry_at - timedelta(microseconds=1)) == []
    (c2,) = await claim(js, at=retry_at)
    assert (c2.attempt, c2.tries) == (2, 2)
    await js.cycle_jobs([finish(c2, "dead", retry_at + timedelta(seconds=2), tag="Boom")], {}, "worker-a", ids(), T0)
    dead = await js.get_job(job.id)
    assert dead is not None and (dead.status, dead.attempt, dead.error_tag) == ("dead", 2, "Boom")
    queue, attempts = await js.job_attempts(job.id)
    assert queue == "mail"
    assert [(a.attempt, a.status, a.error_tag, a.started_at, a.finished_at, a.instance) for a in attempts] == [
        (1, "failed", "Timeout", T0, T0 + timedelta(seconds=1), "worker-a"),
        (2, "failed", "Boom", retry_at, retry_at + timedelta(seconds=2), "worker-a"),
    ]
    assert await claim(js, at=T0 + timedelta(days=1)) == []  # dead jobs are never claimed


async def test_a_late_result_of_a_displaced_attempt_changes_nothing(store: Store) -> None:
    js = await define(store)
    job = new()
    await js.send_jobs("mail", [job], T0)
    (c1,) = await claim(js, instance="frozen")
    # Another instance closes it as abandoned and retries it; someone claims it again.
    later = T0 + timedelta(seconds=40)
    abandoned = Finish(c1.id, "mail", c1.tries, "retry", 1, T0, later, "frozen", "abandoned", "gone", later)
    assert await js.finish_jobs([abandoned]) == [True]
    assert await js.finish_jobs([abandoned]) == [True]  # sent again (a lost answer): as before, nothing changed
    second = replace(abandoned, finished_at=later + timedelta(seconds=1), retry_at=later + timedelta(seconds=1))
    assert await js.finish_jobs([second]) == [False]  # a second rescuer: nothing
    (c2,) = await claim(js, at=T0 + timedelta(seconds=41), instance="worker-b")
    late = finish(c1, "succeeded", T0 + timedelta(seconds=50))
    assert (await js.cycle_jobs([late], {}, "frozen", ids(), T0)).applied == [False]
    running = await js.get_job(job.id)
    assert running is not None and (running.status, running.attempt, running.instance) == ("running", 2, "worker-b")
    _, attempts = await js.job_attempts(job.id)
    assert [(a.attempt, a.status, a.error_tag) for a in attempts] == [(1, "failed", "abandoned")]
    await js.finish_jobs([finish(c2, "succeeded", T0 + timedelta(seconds=42))])
    # Once the job is gone, the late finish of attempt 1 finds attempt 1 recorded: still nothing.
    assert await js.finish_jobs([late]) == [False]
    _, attempts = await js.job_attempts(job.id)
    assert [(a.attempt, a.status) for a in attempts] == [(1, "failed"), (2, "succeeded")]


async def test_a_released_job_is_back_as_it_was(store: Store) -> None:
    js = await define(store)
    job = new()
    await js.send_jobs("mail", [job], T0)
    (c,) = await claim(js)
    assert await js.finish_jobs([finish(c, "release", T0)]) == [True]
    back = await js.get_job(job.id)
    # (never started: no start or instance shows, as before the claim)
    assert back is not None and (back.status, back.attempt, back.started_at, back.instance) == ("queued", 0, None, None)
    assert (await js.job_attempts(job.id))[1] == []
    (again,) = await claim(js)
    assert (again.attempt, again.tries) == (1, 2)
    # After an attempt that ran, a release shows that attempt's start and instance again.
    later = T0 + timedelta(seconds=5)
    await js.finish_jobs([finish(again, "retry", T0 + timedelta(seconds=1), retry_at=later, tag="Boom")])
    (third,) = await claim(js, at=later, instance="worker-b")
    assert await js.finish_jobs([finish(third, "release", later)]) == [True]
    back = await js.get_job(job.id)
    assert back is not None and (back.status, back.attempt, back.started_at, back.instance) == ("queued", 1, T0, "worker-a")


async def test_a_swept_finish_of_a_job_gone_since_its_read_records_nothing(store: Store) -> None:
    """A sweep read the job running under its first claim; the claim went back untouched,
    the job ran again and succeeded (gone). The sweep's finish, made from that read, finds
    nothing to close and records nothing."""
    js = await define(store)
    job = new()
    await js.send_jobs("mail", [job], T0)
    (c1,) = await claim(js)
    at = T0 + timedelta(seconds=40)
    swept = Finish(c1.id, "mail", c1.tries, "retry", 1, T0, at, "worker-a", "abandoned", "gone", at, swept=True)
    assert await js.finish_jobs([finish(c1, "release", T0)]) == [True]
    (c2,) = await claim(js, at=T0 + timedelta(seconds=1))
    await js.finish_jobs([finish(c2, "succeeded", T0 + timedelta(seconds=2))])
    assert await js.finish_jobs([swept]) == [False]
    _, attempts = await js.job_attempts(job.id)
    assert [(a.attempt, a.status) for a in attempts] == [(1, "succeeded")]


async def test_a_paused_queue_gives_nothing_until_resumed(store: Store) -> None:
    js = await define(store)
    await js.send_jobs("mail", [new()], T0)
    await js.pause_queue("mail", True, "alice", T0)
    assert await claim(js) == []
    assert (await js.queue_views(T0))[0].paused
    await js.pause_queue("mail", False, "alice", T0)
    assert len(await claim(js)) == 1


def seat_of(job: RunningJob) -> int:
    """The seat of a running job that holds one (one that holds none fails the test)."""
    assert job.seat is not None
    return job.seat


async def test_a_lowered_cap_drains_before_anything_is_claimed(store: Store) -> None:
    js = await define(store, concurrency=3)
    await js.send_jobs("mail", [new(i) for i in range(6)], T0)
    claimed = {c.id: c for c in await claim(js)}
    seats = {r.id: seat_of(r) for r in await js.running_jobs()}
    assert sorted(seats.values()) == [1, 2, 3]
    await define(store, concurrency=2)
    high = next(job_id for job_id, seat in seats.items() if seat == 3)
    await js.finish_jobs([finish(c, "succeeded", T0) for job_id, c in claimed.items() if job_id != high])
    assert await claim(js) == []  # seats 1 and 2 are free, but seat 3 is held above the cap
    await js.finish_jobs([finish(claimed[high], "succeeded", T0)])
    assert sorted(seat_of(r) for r in await js.running_jobs()) == []
    assert len(await claim(js)) == 2


async def test_two_claimers_never_hold_more_seats_than_the_cap(new_store: Callable[[], Store]) -> None:
    stores = [new_store() for _ in range(3)]
    for s in stores:
        await s.open()
    js = await define(stores[0], concurrency=4)
    await js.send_jobs("mail", [new(i) for i in range(40)], T0)
    got = await asyncio.gather(*(jobs_of(s).cycle_jobs([], {"mail": 4}, f"w{i}", ids(), T0) for i, s in enumerate(stores)))
    claimed = [c for cycle in got for c in cycle.claimed]
    assert 1 <= len(claimed) <= 4
    assert len({c.id for c in claimed}) == len(claimed)
    assert len(await js.running_jobs()) == len(claimed)


# ---------------------------------------------------------------------------------------
# operator actions
# ---------------------------------------------------------------------------------------
async def test_cancel_takes_only_a_queued_job_by_id_or_key(store: Store) -> None:
    js = await define(store, concurrency=1)
    a, b = new(1, key="ka"), new(2, key="kb")
    await js.send_jobs("mail", [a, b], T0)
    (c,) = await claim(js)
    assert c.id == a.id
    assert not await js.cancel_job("mail", id=a.id)  # running: it finishes
    assert not await js.cancel_job("mail", key="ka")
    assert not await js.cancel_job("other", id=b.id)  # another queue's
    assert await js.cancel_job("mail", id=b.id)
    assert not await js.cancel_job("mail", id=b.id)
    assert await js.get_job(b.id) is None


async def test_delete_of_a_running_job_keeps_its_seat_frees_its_key_and_drops_its_result(store: Store) -> None:
    js = await define(store, concurrency=1)
    a, b = new(1, key="k"), new(2)
    await js.send_jobs("mail", [a, b], T0)
    (c,) = await claim(js)
    assert await js.delete_job("mail", a.id)
    assert await js.get_job(a.id) is None  # gone from view
    assert not await js.delete_job("mail", a.id)
    assert (await js.queue_views(T0))[0].running == 1  # its handler still runs: its seat is held
    assert await claim(js) == []
    fresh = new(3, key="k")
    assert not (await js.send_jobs("mail", [fresh], T0))[0].duplicate  # its key is free
    assert await js.finish_jobs([finish(c, "retry", T0, retry_at=T0, tag="Boom")]) == [True]
    assert await js.get_job(a.id) is None and (await js.job_attempts(a.id))[1][0].status == "failed"
    assert [x.id for x in await claim(js)] == [b.id]
    assert await js.delete_job("mail", fresh.id)  # queued: simply gone
    assert await js.get_job(fresh.id) is None


async def test_retry_puts_a_dead_job_back_with_fresh_attempts(store: Store) -> None:
    js = await define(store, attempts=1)
    job = new(key="k")
    await js.send_jobs("mail", [job], T0)
    (c,) = await claim(js)
    with pytest.raises(NotDead, match="is running, not dead"):
        await js.retry_job("mail", job.id, T0)
    await js.finish_jobs([finish(c, "dead", T0, tag="Boom")])
    later = T0 + timedelta(hours=2)
    retried = await js.retry_job("mail", job.id, later)
    assert retried is not None
    assert (retried.status, retried.attempt, retried.max_attempts, retried.run_after, retried.error_tag) == ("queued", 0, 1, later, None)
    assert await js.retry_job("mail", ids(), later) is None
    (again,) = await claim(js, at=later)
    assert (again.attempt, again.tries) == (1, 2)
    await js.finish_jobs([finish(again, "succeeded", later)])
    _, attempts = await js.job_attempts(job.id)
    assert [(a.attempt, a.status) for a in attempts] == [(1, "failed"), (1, "succeeded")]


async def test_lists_page_newest_first_by_status_and_counts_add_up(store: Store) -> None:
    js = await define(store, concurrency=2, attempts=1)
    made = [new(i, at=T0 - timedelta(minutes=10 - i)) for i in range(7)]
    await js.send_jobs("mail", made, T0)
    claimed = await claim(js)
    await js.finish_jobs([finish(claimed[0], "dead", T0, tag="Boom")])
    page = await js.list_jobs("mail", status=None, limit=3, before=None)
    assert [j.id for j in page] == [m.id for m in made[::-1][:3]]
    rest = await js.list_jobs("mail", status=None, limit=10, before=page[-1].id)
    assert [j.id for j in rest] == [m.id for m in made[::-1][3:]]
    assert [j.id for j in await js.list_jobs("mail", status="dead", limit=10, before=None)] == [made[0].id]
    assert [j.id for j in await js.list_jobs("mail", status="running", limit=10, before=None)] == [made[1].id]
    view = (await js.queue_views(T0))[0]
    assert (view.name, view.concurrency, view.queued, view.running, view.dead) == ("mail", 2, 5, 1, 1)
    assert view.oldest_queued_at == T0 - timedelta(minutes=8)  # the longest-waiting due job


async def test_retention_deletes_old_dead_jobs_and_attempts(store: Store) -> None:
    js = await define(store, concurrency=4, attempts=1)
    plain, cron = new("plain"), NewJob(ids(), "null", T0, 1, None, "nightly")
    await js.send_jobs("mail", [plain, cron], T0)
    for c in await claim(js):
        await js.finish_jobs([finish(c, "dead", T0, tag="Boom")])
    assert await js.prune_jobs(T0 - timedelta(days=7), T0 - timedelta(days=1), T0 - timedelta(days=7)) == 0
    day = T0 + timedelta(days=1, seconds=1)
    assert await js.prune_jobs(day - timedelta(days=7), day - timedelta(days=1), day - timedelta(days=7)) == 1
    assert await js.get_job(cron.id) is None and await js.get_job(plain.id) is not None
    week = T0 + timedelta(days=7, seconds=1)
    assert await js.prune_jobs(week - timedelta(days=7), week - timedelta(days=1), week - timedelta(days=7)) == 3
    assert await js.get_job(plain.id) is None
    assert (await js.job_attempts(plain.id)) == (None, [])


# ---------------------------------------------------------------------------------------
# PostgreSQL: concurrent senders, notifications
# ---------------------------------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
async def test_fifty_concurrent_sends_of_one_key_give_one_job(new_store: Callable[[], Store]) -> None:
    stores = [new_store() for _ in range(5)]
    for s in stores:
        await s.open()
    js = await define(stores[0])
    sends = [jobs_of(stores[i % 5]).send_jobs("mail", [new(i, key="once")], T0) for i in range(50)]
    answers = [a[0] for a in await asyncio.gather(*sends)]
    winners = [a for a in answers if not a.duplicate]
    assert len(winners) == 1
    assert {a.id for a in answers} == {winners[0].id}
    assert len(await js.list_jobs("mail", status=None, limit=100, before=None)) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
async def test_a_notification_reaches_a_listener_of_another_store(new_store: Callable[[], Store]) -> None:
    sender, listener = new_store(), new_store()
    await sender.open()
    await listener.open()
    heard: asyncio.Queue[str | None] = asyncio.Queue()
    watch = asyncio.ensure_future(jobs_of(listener).watch_jobs(heard.put_nowait))
    try:
        assert await asyncio.wait_for(heard.get(), 10) is None  # connected: "look at everything"
        await jobs_of(sender).notify_jobs(["mail", "audio"])
        assert {await asyncio.wait_for(heard.get(), 10), await asyncio.wait_for(heard.get(), 10)} == {"mail", "audio"}
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)


async def test_concurrent_sends_near_the_limit_fill_it_exactly(new_store: Callable[[], Store]) -> None:
    stores = [new_store() for _ in range(5)]
    for s in stores:
        await s.open()
    js = await define(stores[0])
    await js.send_jobs("mail", [new(i) for i in range(MAX_HELD - 10)], T0)
    answers = await asyncio.gather(
        *(jobs_of(stores[i % 5]).send_jobs("mail", [new(f"late {i}")], T0) for i in range(50)), return_exceptions=True
    )
    refused = [a for a in answers if isinstance(a, QueueFull)]
    assert len(refused) == 40 and all(isinstance(a, list) for a in answers if a not in refused)
    assert len(await js.list_jobs("mail", status="queued", limit=1000, before=None)) == 1000
    views = await js.queue_views(T0)
    assert views[0].queued == MAX_HELD


# ---------------------------------------------------------------------------------------
# jobs claimed ahead (PostgreSQL) are queued to everything but the worker holding them
# ---------------------------------------------------------------------------------------
async def claim_ahead(js: JobStore, n: int, *, at: datetime = T0) -> list[Claimed]:
    """Jobs claimed ahead, no seat (a store that claims nothing ahead: none)."""
    cycle = await js.cycle_jobs([], {}, "worker-a", ids(), at, ahead={"mail": n})
    assert all(c.seat is None for c in cycle.claimed)
    return cycle.claimed


async def test_jobs_claimed_ahead_are_counted_by_the_limit_as_the_view_counts_them(store: Store) -> None:
    js = await define(store, concurrency=1, attempts=1)
    await js.send_jobs("mail", [new(i) for i in range(MAX_HELD)], T0)
    ahead = await claim_ahead(js, 64)
    assert len(ahead) == (64 if js.job_reservations else 0)
    view = (await js.queue_views(T0))[0]
    assert view.queued == MAX_HELD
    with pytest.raises(QueueFull, match="it holds 10,000 queued and dead jobs"):
        await js.send_jobs("mail", [new("one too many")], T0)
    with pytest.raises(QueueFull, match="it holds 10,000 queued and dead jobs"):
        await js.send_jobs("mail", [new("one"), new("two", key="k")], T0)


async def test_jobs_claimed_ahead_list_cancel_and_delete_as_queued_jobs(store: Store) -> None:
    js = await define(store, concurrency=1)
    jobs = [new(n, at=T0 - timedelta(seconds=5 - n), key=f"k{n}") for n in range(5)]
    await js.send_jobs("mail", jobs, T0)
    (running,) = await claim(js, 1)
    ahead = await claim_ahead(js, 4)
    if js.job_reservations:
        assert [c.id for c in ahead] == [j.id for j in jobs[1:]]  # oldest due first
    listed = await js.list_jobs("mail", status=None, limit=10, before=None)
    shown = [(j.id, j.status, j.attempt, j.started_at, j.instance) for j in sorted(listed, key=lambda j: j.id)]
    assert shown == [(jobs[0].id, "running", 1, T0, "worker-a")] + [(j.id, "queued", 0, None, None) for j in jobs[1:]]
    queued = await js.list_jobs("mail", status="queued", limit=10, before=None)
    assert sorted(j.id for j in queued) == sorted(j.id for j in jobs[1:])
    assert [j.id for j in await js.list_jobs("mail", status="running", limit=10, before=None)] == [running.id]
    shown_one = await js.get_job(jobs[1].id)
    assert shown_one is not None and (shown_one.status, shown_one.attempt, shown_one.started_at) == ("queued", 0, None)
    view = (await js.queue_views(T0))[0]
    assert (view.queued, view.running, view.oldest_queued_at) == (4, 1, jobs[1].run_after)
    # Cancel by id, by key, and delete: each as for a queued job; a running one is no
    # cancel's (its worker hands back, or never starts, what it holds: see the workers).
    assert await js.cancel_job("mail", id=jobs[1].id)
    assert await js.cancel_job("mail", key="k2")
    assert not await js.cancel_job("mail", key="k2")
    assert not await js.cancel_job("mail", id=jobs[0].id)
    assert await js.delete_job("mail", jobs[3].id)
    assert sorted(j.id for j in await js.list_jobs("mail", status=None, limit=10, before=None)) == [jobs[0].id, jobs[4].id]
    view = (await js.queue_views(T0))[0]
    assert (view.queued, view.running) == (1, 1)
    # Their keys are free at once; given back by their worker, the rows are gone.
    assert not (await js.send_jobs("mail", [new("again", key="k1")], T0))[0].duplicate
    back = [finish(c, "release", T0) for c in ahead]
    await js.cycle_jobs(back, {}, "worker-a", ids(), T0)
    assert {r.id for r in await js.running_jobs()} == {running.id}
    for job in jobs[1:4]:
        assert await js.get_job(job.id) is None and (await js.job_attempts(job.id))[1] == []


async def test_a_batch_of_ten_thousand_keyed_jobs_is_sent_at_once(store: Store) -> None:
    """A send's checks (ids sent before, keys held, keys taken earlier in the batch) are
    joins, not a subquery per job: the largest batch takes a moment, not the statement's
    timeout (30 s)."""
    js = await define(store)
    await js.send_jobs("mail", [new("held", key="k7")], T0)
    batch = [new(i, key=f"k{i % 9_999}") for i in range(MAX_HELD - 1)] + [new("no key")]
    loop = asyncio.get_running_loop()
    began = loop.time()
    sent = await js.send_jobs("mail", batch, T0)
    took = loop.time() - began
    assert took < 10, f"{took:.1f}s"
    assert [s.duplicate for s in sent].count(True) == 1  # k7 was held: that one is a duplicate
    assert sent[7].duplicate and sent[8].id == batch[8].id
    assert (await js.queue_views(T0))[0].queued == MAX_HELD
