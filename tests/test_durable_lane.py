"""The connection kept for durable checkpoints on PostgreSQL (backend/store/postgres/lane.py).

A step's checkpoint goes through a connection of its own with the statement prepared on it;
it is the same fenced statement as on the pool, so a displaced owner's checkpoint is refused
there too. The lane is only a shortcut: when its connection dies, or the statement fails,
the checkpoint is run on the pool (the same outcome and the same errors as without the
lane), and a checkpoint cancelled in flight leaves the lane busy only until its reply is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from psycopg import pq

from backend import ManualClock
from backend.durable.model import Execution, StepStatus
from backend.durable.store import Claimed, Finish, NewExecution, Progress, StepRecord, Write
from backend.events.audit import AuditEntry
from backend.store.postgres.lane import LaneFailed
from backend.store.postgres.store import PostgresStore
from tests.servers import until

pytestmark = pytest.mark.postgres

ID = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(pg_url)
    await opened.open()
    yield opened
    await opened.close()


async def claimed(store: PostgresStore, instance: str, now: datetime) -> Claimed:
    [claim] = await store.durable_claim(instance, ["f"], now, now + timedelta(seconds=30), 1)
    return claim


def checkpoint(claim: Claimed, seq: int, name: str, now: datetime) -> Write:
    step = StepRecord(seq, name, "step", "succeeded", 1, now, now, output=f'"{name}"')
    return Write(claim.execution.id, claim.execution.lease, now, Progress(name, now + timedelta(seconds=30)), [step])


async def execution(store: PostgresStore) -> Execution:
    """The execution's row (there is one: it was started)."""
    row = await store.durable_get(ID)
    assert row is not None
    return row


async def steps_of(store: PostgresStore) -> list[str]:
    steps = (await execution(store)).steps
    assert steps is not None
    return [step.name for step in steps]


class Counted:
    """How many calls went through the lane since the last look."""

    def __init__(self, store: PostgresStore) -> None:
        assert store._checkpoints is not None
        self.lane = store._checkpoints
        self.seen = self.lane.calls

    def __call__(self) -> int:
        calls, self.seen = self.lane.calls - self.seen, self.lane.calls
        return calls


async def claimed_on_lane(store: PostgresStore, now: datetime) -> tuple[Counted, Claimed]:
    """The lane open, an execution started and claimed by "a": the lane's counter (read
    once, so it counts from here) and the claim."""
    assert store._checkpoints is not None and await store._checkpoints.open()
    on_lane = Counted(store)
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    claim = await claimed(store, "a", now)
    on_lane()
    return on_lane, claim


async def test_a_checkpoint_on_the_lane_is_refused_once_the_lease_has_moved(store: PostgresStore, clock: ManualClock) -> None:
    assert store._checkpoints is not None and await store._checkpoints.open()
    on_lane = Counted(store)
    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    first = await claimed(store, "a", now)
    assert on_lane() == 1  # the insert
    assert await store.durable_write(checkpoint(first, 1, "one", now)) is False
    assert on_lane() == 1 and await steps_of(store) == ["one"]
    later = now + timedelta(seconds=31)  # a's lease expired: b claims it
    second = await claimed(store, "b", later)
    assert second.execution.lease == first.execution.lease + 1
    assert await store.durable_write(checkpoint(first, 2, "two", later)) is None  # a, displaced
    assert on_lane() == 1 and await steps_of(store) == ["one"]  # nothing of it landed
    assert await store.durable_write(checkpoint(second, 2, "two", later)) is False
    assert on_lane() == 1 and await steps_of(store) == ["one", "two"]
    # the execution's row is not written by a checkpoint: the step it is at is its newest one's
    assert (await execution(store)).current_step == "two"
    # an operator's cancellation comes back with the next checkpoint
    assert await store.durable_cancel(ID, later, "cancelled by ops") == ("running", "requested")
    assert await store.durable_write(checkpoint(second, 3, "three", later)) is True
    assert on_lane() == 1 and await steps_of(store) == ["one", "two", "three"]  # the step is kept all the same
    # the end: refused to a displaced owner too, one log line with it
    end = Finish("succeeded", "three", output="3")
    assert await store.durable_write(Write(ID, first.execution.lease, later, end, [], ["succeeded"])) is None
    assert on_lane() == 1 and (await execution(store)).status == "running"
    assert await store.durable_write(Write(ID, second.execution.lease, later, end, [], ["succeeded"])) is not None
    assert on_lane() == 1
    done = await store.durable_get(ID)
    assert done is not None and (done.status, done.output, done.finished_at) == ("succeeded", 3, later)
    assert [line.message for line in done.logs or []][-1] == "succeeded"


async def test_a_checkpoint_meeting_a_takeover_in_flight_waits_for_it_and_is_refused(
    store: PostgresStore, clock: ManualClock, pg_url: str
) -> None:
    """The fence reads the execution's row under a lock. A take-over not yet committed when
    a checkpoint arrives makes it wait; once the take-over commits, the checkpoint is
    refused. (Read without the lock, the statement's snapshot would still show the old
    lease, and the displaced owner's step would land after the take-over.)"""
    lane = store._checkpoints
    assert lane is not None and await lane.open()
    on_lane = Counted(store)
    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    first = await claimed(store, "a", now)
    on_lane()
    with psycopg.connect(pg_url) as takeover, psycopg.connect(pg_url, autocommit=True) as admin:
        takeover.execute(
            "UPDATE schedtui_durable_executions SET lease = lease + 1, instance = 'b' WHERE id = %s", (ID,)
        )  # in a transaction, not committed yet
        pending = asyncio.ensure_future(store.durable_write(checkpoint(first, 1, "one", now)))

        def waiting_for_the_row() -> bool:
            pid = lane.pid
            row = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            return row is not None and row[0] == "Lock"

        await until(waiting_for_the_row, "the checkpoint to wait for the take-over's lock")
        assert not pending.done()
        takeover.commit()
    assert await pending is None  # displaced
    assert on_lane() == 1 and await steps_of(store) == []


async def test_a_retried_step_is_written_again_on_the_lane(store: PostgresStore, clock: ManualClock) -> None:
    """A later attempt (and an at-most-once step's end) upserts the step's row on the lane."""
    now = clock.now()
    on_lane, claim = await claimed_on_lane(store, now)
    waiting = StepRecord(1, "one", "step", "waiting", 1, now, now, wake_at=now, error_tag="boom", error_message="no")
    lease = claim.execution.lease
    assert await store.durable_write(Write(ID, lease, now, Progress("one", now + timedelta(seconds=30)), [waiting])) is False
    on_lane()
    commits = store.commits
    done = StepRecord(1, "one", "step", "succeeded", 2, now, now, output="1")
    assert await store.durable_write(Write(ID, lease, now, Progress("one", now + timedelta(seconds=30)), [done])) is False
    assert on_lane() == 1 and store.commits == commits + 1  # one commit, on the lane
    row = await store.durable_get(ID)
    assert row is not None and row.steps is not None and len(row.steps) == 1
    step = row.steps[0]
    assert (step.status, step.attempt, step.wake_at, step.error_tag) == ("succeeded", 2, None, None)


async def test_a_checkpoints_times_on_the_lane_read_back_to_the_microsecond(store: PostgresStore, clock: ManualClock) -> None:
    """The lane sends a checkpoint's timestamps in the server's binary form: the instants
    read back are the ones given, to the microsecond, whatever their offset or year."""
    now = clock.now()
    on_lane, claim = await claimed_on_lane(store, now)
    india = timezone(timedelta(hours=5, minutes=30))
    times = [
        (datetime(2026, 3, 29, 1, 59, 59, 999999, tzinfo=UTC), datetime(2026, 3, 29, 7, 30, 0, 1, tzinfo=india),
         datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        (datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC), None),
    ]  # fmt: skip
    for seq, (started, finished, wake) in enumerate(times, start=1):
        status: StepStatus = "waiting" if wake is not None else "succeeded"
        record = StepRecord(seq, f"s{seq}", "step", status, 1, started, finished, wake_at=wake)
        write = Write(ID, claim.execution.lease, now, Progress(f"s{seq}", now + timedelta(seconds=30)), [record])
        assert await store.durable_write(write) is False
    assert on_lane() == len(times)
    row = await store.durable_get(ID)
    assert row is not None and row.steps is not None
    assert [(s.started_at, s.finished_at, s.wake_at) for s in row.steps] == times


async def test_a_start_on_the_lane_is_claimed_audited_and_logged_in_one_statement(
    store: PostgresStore, clock: ManualClock
) -> None:
    assert store._checkpoints is not None and await store._checkpoints.open()
    on_lane = Counted(store)
    now = clock.now()
    audit = AuditEntry("01JD3Z6Q0V9W4C7PAXH3KJ1M2C", now, "ops", "durable.start", ID, {"function": "f"})
    new = NewExecution(ID, "f", '{"pages": 3}', now)
    claim = ("a", now + timedelta(seconds=30))
    commits = store.commits
    assert await store.durable_insert(new, claim=claim, audit=audit, log="started on a") is True
    assert on_lane() == 1 and store.commits == commits + 1
    row = await store.durable_get(ID)
    assert row is not None and (row.status, row.instance, row.input) == ("running", "a", {"pages": 3})
    assert [line.message for line in row.logs or []] == ["started on a"]
    assert [e.id for e in await store.list_audit(limit=10)] == [audit.id]
    # held by a's lease 1: nobody claims it before it ends
    assert await store.durable_claim("b", ["f"], now, now + timedelta(seconds=30), 1) == []
    step = StepRecord(1, "one", "step", "succeeded", 1, now, now, output="1")
    assert await store.durable_write(Write(ID, 1, now, Progress("one", now), [step])) is False
    # the same id again: nothing written, no second entry, no second line
    again = AuditEntry("01JD3Z6Q0V9W4C7PAXH3KJ1M2D", now, "ops", "durable.start", ID, {"function": "f"})
    assert await store.durable_insert(new, claim=claim, audit=again, log="started on a") is False
    assert [e.id for e in await store.list_audit(limit=10)] == [audit.id]
    assert [line.message for line in (await execution(store)).logs or []] == ["started on a"]


async def test_a_start_whose_reply_was_lost_after_it_committed_is_still_this_starts(
    store: PostgresStore, clock: ManualClock
) -> None:
    """The pool runs the insert again and finds the row: the one this start claimed, so it
    runs here (it is not a duplicate left to wait out its lease)."""
    lane = store._checkpoints
    assert lane is not None and await lane.open()
    call = lane.call

    async def reply_lost(key: str, params: Sequence[bytes | None], formats: Sequence[int] | None = None) -> pq.abc.PGresult:
        await call(key, params, formats)
        raise LaneFailed("the connection broke before the reply")

    now = clock.now()
    claim = ("a", now + timedelta(seconds=30))
    lane.call = reply_lost  # type: ignore[method-assign]  # a lane whose reply is lost
    assert await store.durable_insert(NewExecution(ID, "f", "null", now), claim=claim, log="started on a") is True
    lane.call = call  # type: ignore[method-assign]  # the lane's own again
    row = await store.durable_get(ID)
    assert row is not None and (row.status, row.instance) == ("running", "a")
    assert [line.message for line in row.logs or []] == ["started on a"]
    # a start of the same id, however alike, is a duplicate when nothing was lost
    assert await store.durable_insert(NewExecution(ID, "f", "null", now), claim=claim, log="started on a") is False


async def test_a_first_attempt_whose_row_is_there_after_all_is_upserted_on_the_pool(
    store: PostgresStore, clock: ManualClock
) -> None:
    """A first attempt goes as a plain insert; should its row be there (a reply lost after
    it committed, and the same checkpoint sent again), the upsert runs on the pool."""
    now = clock.now()
    on_lane, claim = await claimed_on_lane(store, now)
    assert await store.durable_write(checkpoint(claim, 1, "one", now)) is False
    commits = store.commits
    assert await store.durable_write(checkpoint(claim, 1, "one", now)) is False  # the plain insert fails: the pool's upsert
    assert on_lane() == 2 and store.commits == commits + 1
    assert await steps_of(store) == ["one"]


async def test_when_the_lane_dies_the_pool_takes_the_checkpoint(store: PostgresStore, clock: ManualClock, pg_url: str) -> None:
    lane = store._checkpoints
    assert lane is not None and await lane.open()
    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    claim = await claimed(store, "a", now)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lane.pid,))
    assert await store.durable_write(checkpoint(claim, 1, "one", now)) is False
    assert await steps_of(store) == ["one"]
    assert not lane.connected  # let go of; it connects again when asked
    assert await lane.open()
    calls = lane.calls
    assert await store.durable_write(checkpoint(claim, 2, "two", now)) is False
    assert lane.calls == calls + 1 and await steps_of(store) == ["one", "two"]


async def test_a_failing_statement_fails_as_on_the_pool_and_keeps_the_lane(
    store: PostgresStore, clock: ManualClock, pg_url: str
) -> None:
    lane = store._checkpoints
    assert lane is not None and await lane.open()
    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    claim = await claimed(store, "a", now)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("ALTER TABLE schedtui_durable_steps ADD CONSTRAINT no_boom CHECK (name <> 'boom')")
    on_lane = Counted(store)
    with pytest.raises(psycopg.errors.CheckViolation):
        await store.durable_write(checkpoint(claim, 1, "boom", now))
    assert on_lane() == 1 and lane.connected and await steps_of(store) == []
    assert await store.durable_write(checkpoint(claim, 1, "one", now)) is False
    assert on_lane() == 1 and await steps_of(store) == ["one"]


async def test_a_checkpoint_cancelled_in_flight_frees_the_lane_once_its_reply_is_read(
    store: PostgresStore, clock: ManualClock, pg_url: str
) -> None:
    lane = store._checkpoints
    assert lane is not None and await lane.open()
    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    claim = await claimed(store, "a", now)
    async with await psycopg.AsyncConnection.connect(pg_url) as locker:  # holds the execution's row
        await locker.execute("SELECT 1 FROM schedtui_durable_executions WHERE id = %s FOR UPDATE", (ID,))
        write = asyncio.ensure_future(store.durable_write(checkpoint(claim, 1, "one", now)))

        async def waiting_on_the_row() -> bool:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                cur = await admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (lane.pid,))
                row = await cur.fetchone()
                return row is not None and row[0] == "Lock"

        await until(waiting_on_the_row, "the lane's statement to wait for the row")
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert lane.connected and not lane.available()  # its reply is still to come
        await locker.commit()
    await until(lane.available, "the lane to read the cancelled call's reply")
    # the statement ran to its end on the server (as a cancelled one on the pool may): the
    # same fenced write as any, under the lease it was sent with
    assert await steps_of(store) == ["one"]
    calls = lane.calls
    assert await store.durable_write(checkpoint(claim, 2, "two", now)) is False
    assert lane.calls == calls + 1 and await steps_of(store) == ["one", "two"]


def lose_the_answer_once(monkeypatch: pytest.MonkeyPatch, *statements: str) -> list[str]:
    """The first of ``statements`` the pool runs commits (its connections are in autocommit),
    and its answer is lost, as when the connection breaks on its way back: the list it
    returns holds it then."""
    real = psycopg.AsyncConnection.execute
    lost: list[str] = []

    async def answer_lost(self: psycopg.AsyncConnection[object], query: object, *args: object, **kwargs: object) -> object:
        cursor = await real(self, query, *args, **kwargs)  # type: ignore[call-overload]
        if any(query is statement for statement in statements) and not lost:
            lost.append(str(query))
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursor

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", answer_lost)
    return lost


@pytest.mark.parametrize("then", ["progress", "wait", "end"])
async def test_a_write_whose_answer_was_lost_after_it_committed_is_neither_written_twice_nor_taken_for_a_lost_lease(
    store: PostgresStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """The connection breaks once the write has committed, before its answer: the pool
    sends it again on a fresh connection. Sent again as it was, a progress wrote its log
    lines twice, and a wait or an end found the execution no longer running and answered
    that its lease was lost (its instance let go of an execution that had ended well). It
    looks first, and answers as the write did."""
    from backend.durable.store import Suspend
    from backend.store.postgres import durable

    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    claim = await claimed(store, "a", now)
    step = StepRecord(1, "one", "step", "succeeded", 1, now, now, output='"one"')
    endings: dict[str, Progress | Suspend | Finish] = {
        "progress": Progress("one", now + timedelta(seconds=30)),
        "wait": Suspend("waiting", "nap", "sleep:nap", now + timedelta(hours=1)),
        "end": Finish("succeeded", "one", output='"done"'),
    }
    ending = endings[then]
    lost = lose_the_answer_once(monkeypatch, durable.PROGRESS, durable.SUSPEND, durable.FINISH)
    assert await store.durable_write(Write(ID, claim.execution.lease, now, ending, [step], ["a line"])) is False
    assert lost  # (the answer was lost once, and the write sent again)
    row = await execution(store)
    assert [line.message for line in row.logs or []] == ["a line"]
    assert row.status == {"progress": "running", "wait": "waiting", "end": "succeeded"}[then]
    assert await steps_of(store) == ["one"]


async def test_an_end_whose_reply_on_the_lane_was_lost_after_it_committed_is_this_ends(
    store: PostgresStore, clock: ManualClock
) -> None:
    """The end goes on the lane; its reply is lost after it committed, and the pool runs it
    again: it finds the execution ended, by this end, and says so (not a lost lease)."""
    now = clock.now()
    _, claim = await claimed_on_lane(store, now)
    lane = store._checkpoints
    assert lane is not None
    call = lane.call

    async def reply_lost(key: str, params: Sequence[bytes | None], formats: Sequence[int] | None = None) -> pq.abc.PGresult:
        await call(key, params, formats)
        raise LaneFailed("the connection broke before the reply")

    lane.call = reply_lost  # type: ignore[method-assign]
    end = Write(ID, claim.execution.lease, now, Finish("succeeded", None, output='"done"'), [], ["succeeded"])
    assert await store.durable_write(end) is False
    lane.call = call  # type: ignore[method-assign]
    row = await execution(store)
    assert (row.status, [line.message for line in row.logs or []]) == ("succeeded", ["succeeded"])


async def test_a_claim_whose_answer_was_lost_after_it_committed_fails_so_that_what_it_took_is_given_back(
    store: PostgresStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent again, a claim whose first sending committed took nothing more, and what the
    first took stayed running under this instance, run by nobody, until its lease ran out.
    It fails instead (the store cannot say what it took), and the executor's give-back of
    that claim id hands the execution back at once."""
    from backend import Unavailable
    from backend.store.postgres import durable

    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    lost = lose_the_answer_once(monkeypatch, durable.CLAIM)
    until = now + timedelta(seconds=30)
    with pytest.raises(Unavailable, match="lost the answer of a claim"):
        await store.durable_claim("a", ["f"], now, until, 1, claim="claim-1")
    assert lost
    assert (await execution(store)).status == "running"  # (the first sending took it)
    assert await store.durable_give_back("a", "claim-1", until, now) == 1
    [again] = await store.durable_claim("a", ["f"], now, until, 1, claim="claim-2")
    assert again.execution.id == ID


async def test_a_signal_whose_answer_was_lost_after_it_was_kept_is_not_answered_a_duplicate(
    store: PostgresStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first signal of its name, kept, its answer lost: sent again by the store, it
    found itself and was answered a duplicate of a signal never sent before. It finds
    itself as itself; another signal of that name is still a duplicate."""
    from backend.store.postgres import durable

    now = clock.now()
    await store.durable_insert(NewExecution(ID, "f", "null", now))
    lost = lose_the_answer_once(monkeypatch, durable.SIGNAL)
    assert await store.durable_signal(ID, "go", '{"by": "ops"}', now) == ("queued", False)
    assert lost
    assert await store.durable_signal(ID, "go", '{"by": "ops"}', now + timedelta(seconds=1)) == ("queued", True)
    logs = [line.message for line in (await execution(store)).logs or []]
    assert logs.count("signal go received") == 1
