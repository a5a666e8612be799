"""Writes of the PostgreSQL store whose answer is lost after they committed.

The store sends a statement again on a fresh connection when its connection breaks with it
in flight (:meth:`~backend.store.postgres.store.PostgresStore._with_conn`): the first
sending may have committed. A relay (:mod:`tests.tcp_relay`) drops the one answer, the
commit having happened. What the caller is answered must be what the first sending did:
an operator's cancel, delete, retry or forget (of a job, an execution, an instance) is
not told "not found" or "nothing done" after doing it, a page's delivery is recorded as delivered, a claim of pages answers the
rows it took, and runs closed as abandoned are answered closed (logged, counted, told).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend import Unavailable
from backend.alerts.store import Delivery
from backend.durable.store import Finish, NewExecution, StepRecord, Suspend, Write
from backend.ids import IdFactory
from backend.jobs.model import NotDead
from backend.jobs.store import NewJob
from backend.model import BackfillProgress, Claim, Run, slot_key
from backend.scheduler.stored import StoredSchedule
from backend.store.postgres.store import PostgresStore
from tests.tcp_relay import FreezableRelay, relay_to, via
from tests.test_alerts import transition
from tests.test_jobs_store import claim, define, finish

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
RAN_AGAIN = "store connection lost"
ids = IdFactory(lambda: T0)


@pytest.fixture
def relay(pg_url: str) -> Iterator[FreezableRelay]:
    with relay_to(pg_url) as opened:
        yield opened


@pytest.fixture
async def store(pg_url: str, relay: FreezableRelay) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(via(pg_url, relay.port))
    await opened.open()
    # The queue's kept connections connected now, not in the background once a send or a
    # cycle first wants one: their set-up's answers (a `SELECT 1` among them) must not be
    # the one the relay drops (it was, on a loaded machine, and the write meant went
    # through untouched). (The checkpoints' stays unconnected: the durable writes here are
    # the pool's.)
    for lane in [*opened._senders, *opened._cyclers]:
        assert await lane.open()
    yield opened
    await opened.close()


@pytest.fixture(autouse=True)
def store_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "schedtui.store")


def sent_again(relay: FreezableRelay, caplog: pytest.LogCaptureFixture) -> bool:
    """The answer was lost and the store sent the statement again."""
    return relay.lost.is_set() and any(RAN_AGAIN in r.getMessage() for r in caplog.records)


# -- an operator's actions on jobs --------------------------------------------------------
async def test_a_cancel_whose_answer_was_lost_is_no_nothing_to_cancel(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the cancel found its job gone (its own doing) and answered False: the
    operator was told the job was not queued, and no audit entry said it was cancelled.
    A job it finds still queued it cancels; one it finds gone may be its own doing: in
    doubt, it says so."""
    js = await define(store)
    job = NewJob(ids(), "null", T0, None, key="k")
    await js.send_jobs("mail", [job], T0)
    relay.lose_reply(b"SELECT 1")  # the cancel's count
    with pytest.raises(Unavailable, match="lost the answer of a job's cancel, which may have been done all the same"):
        await js.cancel_job("mail", id=job.id)
    assert sent_again(relay, caplog)
    assert await js.get_job(job.id) is None  # cancelled, once
    assert not await js.cancel_job("mail", id=job.id)  # (asked again with its answer: nothing to cancel)


async def test_a_delete_whose_answer_was_lost_is_no_not_found(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    js = await define(store)
    job = NewJob(ids(), "null", T0, None)
    await js.send_jobs("mail", [job], T0)
    relay.lose_reply(b"queued")  # the delete's answer: the status it found
    with pytest.raises(Unavailable, match="lost the answer of a job's delete, which may have been done all the same"):
        await js.delete_job("mail", job.id)
    assert sent_again(relay, caplog)
    assert await js.get_job(job.id) is None


async def test_a_retry_whose_answer_was_lost_answers_the_job_it_put_back(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the retry found the job queued (its own doing) and raised NotDead: the
    operator was told "job … is queued, not dead: only a dead job can be retried"."""
    js = await define(store, attempts=1)
    job = NewJob(ids(), "null", T0, None)
    await js.send_jobs("mail", [job], T0)
    (c,) = await claim(js)
    await js.finish_jobs([finish(c, "dead", T0, tag="Boom")])
    later = T0 + timedelta(hours=2)
    relay.lose_reply(job.id.encode())  # the retry's answer: the job's row
    retried = await js.retry_job("mail", job.id, later)
    assert sent_again(relay, caplog)
    assert retried is not None and (retried.id, retried.status, retried.attempt, retried.run_after) == (
        job.id, "queued", 0, later
    )  # fmt: skip
    (again,) = await claim(js, at=later)
    assert (again.id, again.attempt) == (job.id, 1)


async def test_a_retry_of_a_job_not_dead_whose_answer_was_lost_answers_not_dead(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the retry of a job that was not dead took a job queued (or claimed) from
    the retry's own instant for its own doing: a send also queues its job from its instant
    (a job sent with no delay, retried as it came in). The operator was told "retried" of a
    job that never died, and an audit entry said so."""
    js = await define(store, attempts=1)
    job = NewJob(ids(), "null", T0, None)
    await js.send_jobs("mail", [job], T0)
    relay.lose_reply(b"queued")  # the retry's answer: the status it found
    with pytest.raises(NotDead, match="is queued, not dead"):
        await js.retry_job("mail", job.id, T0)
    assert sent_again(relay, caplog)
    (c,) = await claim(js)
    relay.lose_reply(b"running")
    with pytest.raises(NotDead, match="is running, not dead"):
        await js.retry_job("mail", job.id, T0)
    assert sent_again(relay, caplog)
    running = await js.get_job(job.id)
    assert running is not None and (running.status, running.attempt) == ("running", c.attempt)


async def test_a_retry_whose_answer_was_lost_after_another_in_its_instant_is_in_doubt(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Two retries of a dead job in one instant (two operators, a clock's coarse tick): the
    second, its answer lost, found the job queued again from its instant and answered it
    retried, its own doing or not (claimed since, it answered the job running). It can tell
    its own retry from another's now; another's it may not call its own, nor "not dead"."""
    js = await define(store, attempts=1)
    job = NewJob(ids(), "null", T0, None)
    await js.send_jobs("mail", [job], T0)
    (c,) = await claim(js)
    await js.finish_jobs([finish(c, "dead", T0, tag="Boom")])
    later = T0 + timedelta(hours=2)
    assert await js.retry_job("mail", job.id, later) is not None  # another operator's
    relay.lose_reply(b"queued")  # the second retry's answer: the status it found
    with pytest.raises(Unavailable, match="lost the answer of a job's retry, which may have been done all the same"):
        await js.retry_job("mail", job.id, later)
    assert sent_again(relay, caplog)
    (again,) = await claim(js, at=later)
    relay.lose_reply(b"running")
    with pytest.raises(Unavailable, match="look before retrying it again"):
        await js.retry_job("mail", job.id, later)
    assert sent_again(relay, caplog)
    assert (again.id, again.attempt) == (job.id, 1)


# -- the fleet ---------------------------------------------------------------------------------
async def test_a_forget_whose_answer_was_lost_is_no_beat_again(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the forget found no row to delete (its own doing) and answered False:
    the operator was told the instance had beaten again, nothing forgotten."""
    await store.heartbeat("lost-one", "host-a", 4242, T0)
    [beat] = [b for name, b in (await store.instances()).items() if name == "lost-one"]
    relay.lose_reply(b"DELETE 1")
    assert await store.forget_lost_instance("lost-one", beat.host, beat.pid, beat.at)
    assert sent_again(relay, caplog)
    assert "lost-one" not in await store.instances()
    # A row that changed between the look and the delete still refuses it.
    await store.heartbeat("lost-one", "host-a", 4242, T0)
    assert not await store.forget_lost_instance("lost-one", "host-a", 4242, T0 - timedelta(seconds=1))


# -- stored schedules ---------------------------------------------------------------------------
def stored(name: str, at: datetime, by: str = "ops") -> StoredSchedule:
    return StoredSchedule(
        name=name, cron="*/5 * * * *", timezone="UTC", queue=None, durable=None, payload=None, description=None,
        enabled=True, on_overlap="skip", backfill="skip", max_runtime=0.0, created_at=at, created_by=by,
        updated_at=at, updated_by=by, version=1,
    )  # fmt: skip


@pytest.mark.parametrize("change", ["create", "update", "delete"])
async def test_a_catalog_change_whose_answer_was_lost_is_answered_as_done(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    """Sent again, a create found its own row ("exists already"), an update its own new
    version ("changed by someone else", and it was applied again over itself), a delete
    its own doing ("no schedule named …")."""
    row = stored("nightly", T0)
    if change != "create":
        assert await store.create_stored_schedule(row)
    version = await store.catalog_version()
    relay.lose_reply(b"COMMIT")
    later = T0 + timedelta(minutes=1)
    result: Any
    if change == "create":
        result = await store.create_stored_schedule(row)
        assert result is True
    elif change == "update":
        wanted = replace(row, cron="0 * * * *", updated_at=later, updated_by="bob", timing_changed_at=later)
        result = await store.update_stored_schedule(wanted, 1)
        assert result is not None and (result.cron, result.version, result.updated_by) == ("0 * * * *", 2, "bob")
    else:
        assert await store.delete_stored_schedule("nightly") is True
    assert sent_again(relay, caplog)
    catalog, rows = await store.stored_schedules()
    assert catalog == version + 1  # changed once
    if change == "delete":
        assert rows == []
    else:
        assert [(r.name, r.version) for r in rows] == [("nightly", 2 if change == "update" else 1)]


# -- alerts -------------------------------------------------------------------------------------
async def queued_page(store: PostgresStore) -> str:
    await store.register_sinks([("sink-a", "https://a/…")], T0)
    tid = ids()
    assert await store.write_transitions([transition("failing:job", "firing", T0, tid)], sinks_after=T0) == ["failing:job"]
    return tid


async def test_a_transition_whose_answer_was_lost_is_answered_won_and_queued_once(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the transition found its own row and answered that it was not written:
    the instance neither logged it nor woke its delivery (the page waited for the poll)."""
    await store.register_sinks([("sink-a", "https://a/…"), ("sink-b", "https://b/…")], T0)
    tid = ids()
    relay.lose_reply(b"failing:job")  # the keys written
    won = await store.write_transitions([transition("failing:job", "firing", T0, tid)], sinks_after=T0)
    assert sent_again(relay, caplog)
    assert won == ["failing:job"]
    claimed = await store.claim_deliveries(["sink-a", "sink-b"], "i1", T0, T0 + timedelta(minutes=1), 10)
    assert sorted((d.transition, d.sink) for d in claimed) == [(tid, "sink-a"), (tid, "sink-b")]  # one page a sink
    # Another instance's same transition, proposed from the same facts, still loses.
    assert await store.write_transitions([transition("failing:job", "firing", T0, ids())], sinks_after=T0) == []


async def test_a_claim_of_pages_whose_answer_was_lost_answers_the_rows_it_took(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the claim found its rows leased (by itself) and took nothing: the page
    waited out the lease, an attempt spent."""
    tid = await queued_page(store)
    until = T0 + timedelta(minutes=1)
    relay.lose_reply(tid.encode())
    claimed = await store.claim_deliveries(["sink-a"], "i1", T0, until, 10)
    assert sent_again(relay, caplog)
    assert [(d.transition, d.attempts, d.until) for d in claimed] == [(tid, 1, until)]
    assert await store.finish_delivery(claimed[0], T0, retry_at=None, error=None)
    assert await store.claim_deliveries(["sink-a"], "i1", until, until + timedelta(minutes=1), 10) == []  # delivered once


@pytest.mark.parametrize("outcome", ["delivered", "gave_up"])
async def test_a_delivery_whose_outcome_lost_its_answer_is_recorded(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture, outcome: str
) -> None:
    """Sent again, the outcome found its row done (by itself) and answered "not recorded":
    the notifier warned that another instance might send the page again, and wrote no
    ``alert.notified`` (or ``alert.notify_failed``) entry."""
    await queued_page(store)
    (d,) = await store.claim_deliveries(["sink-a"], "i1", T0, T0 + timedelta(minutes=1), 10)
    relay.lose_reply(b"UPDATE 1")
    error = None if outcome == "delivered" else "HTTP 500"
    assert await store.finish_delivery(d, T0 + timedelta(seconds=1), retry_at=None, error=error)
    assert sent_again(relay, caplog)
    # Another claim's outcome (a later token) is still refused.
    stale = Delivery(d.transition, d.sink, d.alert_key, d.payload, d.attempts, d.token - 1, d.created_at, d.until)
    assert not await store.finish_delivery(stale, T0 + timedelta(seconds=1), retry_at=None, error=error)


# -- runs closed as abandoned -------------------------------------------------------------------
async def test_a_close_of_abandoned_runs_whose_answer_was_lost_answers_the_runs_it_closed(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the close found its runs closed (by itself) and answered none: they were
    never logged, counted or told as abandoned by anyone."""
    running = [Run(ids(), f"job-{i}", T0, "running", "self", "single", "gone-1", T0) for i in range(2)]
    store.save_runs(running)
    await store.flush()
    closing = [run.finish("failed", T0 + timedelta(minutes=5), error_tag="abandoned", error_message="gone") for run in running]
    relay.lose_reply(running[0].id.encode())
    assert await store.close_runs(closing) == {run.id for run in running}
    assert sent_again(relay, caplog)
    assert await store.close_runs(closing) == set()  # (closed: a close by another instance, then, is refused)


async def test_a_close_of_an_unrecorded_burst_whose_answer_was_lost_answers_the_runs_it_wrote(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    await store.heartbeat("gone-1", "host-a", 4242, T0)
    await store.mark_starting("gone-1", T0)
    rows = [
        Run(ids(), f"job-{i}", T0, "failed", "self", "single", "gone-1", None, T0, "abandoned", "gone") for i in range(2)
    ]
    relay.lose_reply(b"COMMIT")
    written = await store.close_unrecorded("gone-1", T0, rows)
    assert sent_again(relay, caplog)
    assert [run.id for run in written] == [run.id for run in rows]
    assert await store.close_unrecorded("gone-1", T0, rows) == []  # (the mark is cleared: nothing more)


# -- an operator's actions on durable executions ------------------------------------------------
EXECUTION = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"


async def execution_lines(store: PostgresStore) -> tuple[str, list[str]]:
    row = await store.durable_get(EXECUTION)
    assert row is not None
    return row.status, [line.message for line in row.logs or []]


@pytest.mark.parametrize("was", ["queued", "waiting", "running"])
async def test_a_cancel_of_an_execution_whose_answer_was_lost_answers_what_it_did(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture, was: str
) -> None:
    """Sent again, a cancel that ended the execution found it ended (by itself) and answered
    "has finished; there is nothing to cancel" (no durable.cancel audit entry), and one that
    asked a running execution to stop asked again, writing its log line twice."""
    await store.durable_insert(NewExecution(EXECUTION, "f", "null", T0))
    if was != "queued":
        [claimed] = await store.durable_claim("i1", ["f"], T0, T0 + timedelta(seconds=30), 1)
        lease = claimed.execution.lease
    if was == "waiting":
        nap = StepRecord(1, "nap", "sleep", "waiting", 1, T0, wake_at=T0 + timedelta(hours=1))
        suspend = Suspend("waiting", "nap", "nap", T0 + timedelta(hours=1))
        assert await store.durable_write(Write(EXECUTION, lease, T0, suspend, [nap])) is False
    now = T0 + timedelta(seconds=1)
    relay.lose_reply(b"COMMIT")
    answer = await store.durable_cancel(EXECUTION, now, "cancelled by ops")
    assert sent_again(relay, caplog)
    if was == "running":
        assert answer == ("running", "requested")
        assert await execution_lines(store) == ("running", ["cancelled by ops: asked to stop at its next step"])
    else:
        assert answer == (was, "cancelled")
        assert await execution_lines(store) == ("cancelled", ["cancelled by ops"])
    # Asked again, later (an operator who had the answer): its answer is the execution's own.
    later = await store.durable_cancel(EXECUTION, now + timedelta(seconds=1), "cancelled by ops")
    assert later == (("running", "requested") if was == "running" else ("cancelled", None))


@pytest.mark.parametrize("claimed", [False, True])
async def test_a_start_of_an_execution_whose_answer_was_lost_answers_started(
    claimed: bool, store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the start found its own row and answered a duplicate: nobody was woken
    for it, and one claimed where it was made (to run here at once) was launched nowhere
    and waited out its lease. A start of the same id made at another instant is one still."""
    claim = ("i1", T0 + timedelta(seconds=30)) if claimed else None
    relay.lose_reply(b"SELECT 1")
    assert await store.durable_insert(NewExecution(EXECUTION, "f", "null", T0), claim=claim)
    assert sent_again(relay, caplog)
    later = NewExecution(EXECUTION, "f", "null", T0 + timedelta(microseconds=1))
    assert not await store.durable_insert(later, claim=claim)


async def test_a_retry_of_an_execution_whose_answer_was_lost_answers_it_retried(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the retry found the execution queued (by itself) and answered "is queued;
    only a failed execution can be retried" (no durable.retry audit entry)."""
    await store.durable_insert(NewExecution(EXECUTION, "f", "null", T0))
    [claimed] = await store.durable_claim("i1", ["f"], T0, T0 + timedelta(seconds=30), 1)
    failed = Finish("failed", "one", error_tag="Boom", error_message="boom", failed_step="one")
    step = StepRecord(1, "one", "step", "failed", 1, T0, T0, error_tag="Boom", error_message="boom")
    assert await store.durable_write(Write(EXECUTION, claimed.execution.lease, T0, failed, [step], ["failed"])) is False
    now = T0 + timedelta(minutes=5)
    relay.lose_reply(b"COMMIT")
    assert await store.durable_retry(EXECUTION, now, "retried by ops") == "failed"
    assert sent_again(relay, caplog)
    assert await execution_lines(store) == ("queued", ["failed", "retried by ops"])
    assert await store.durable_retry(EXECUTION, now + timedelta(seconds=1), "retried by ops") == "queued"


# -- an external fire's claim given back, a dead instance's backfill ended ----------------------
async def test_a_release_of_a_claim_whose_answer_was_lost_answers_released(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the release found the claim and its run gone (by itself) and answered
    False: the stopping engine recorded the slot missed under the run id it had just freed,
    while the platform's retry fired the slot elsewhere."""
    c = Claim(slot_key("job", T0), "job", ids(), None, scheduled_at=T0, trigger="external", outcome="external")
    assert (await store.claim([c], "a", T0)).won == {c.key}
    relay.lose_reply(b"DELETE 1")
    assert await store.release_claim(c.key, c.run_id)
    assert sent_again(relay, caplog)
    assert await store.claimed_run(c.key) is None and await store.get_run(c.run_id) is None
    # The slot claimed again by another: a release of this claim now takes nothing of theirs.
    other = Claim(slot_key("job", T0), "job", ids(), None, scheduled_at=T0, trigger="external", outcome="external")
    assert (await store.claim([other], "b", T0)).won == {other.key}
    assert not await store.release_claim(c.key, c.run_id)
    assert await store.claimed_run(c.key) == other.run_id


async def test_an_end_of_a_backfill_whose_answer_was_lost_answers_ended(
    store: PostgresStore, relay: FreezableRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the end found the backfill no longer running (by itself) and answered
    False: nobody wrote its ``schedule.backfill_end`` audit entry."""
    running = BackfillProgress(ids(), "hourly", T0 - timedelta(hours=3), T0, 3, 1, 0, "running", "gone-1", T0)
    await store.start_backfill(running)
    ended = replace(running, state="abandoned", finished_at=T0 + timedelta(minutes=5), fired=2, failed=1)
    relay.lose_reply(b"UPDATE 1")
    assert await store.end_backfill(ended)
    assert sent_again(relay, caplog)
    assert await store.get_backfill(running.id) == ended
    # Another instance's end of it (its own instant) still loses.
    assert not await store.end_backfill(replace(ended, finished_at=T0 + timedelta(minutes=5, microseconds=1)))
