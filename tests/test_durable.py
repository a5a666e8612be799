"""Durable functions on the injected clock, over both stores: steps that never run twice,
durable retries, sleeps and signal waits that hold no worker, at-most-once steps, replay
checks, the lifetime bound, cancellation, retry, schedules that start executions, leases.

Time only moves when a test moves the ManualClock; ``engine.quiesce()`` waits until the
engine has done what the new time calls for. A three-day wait takes milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from backend import BadInput, DefinitionError, Engine, ManualClock, NotFound, Refused, Unavailable, define_schedule
from backend.definitions import discover_definitions
from backend.durable import DurableContext, Retry, Started, StepFailed, define_durable, execution_id_for_slot
from backend.durable.lines import ExecutionLines
from backend.durable.store import (
    LOG_LINES,
    DurableStore,
    Finish,
    NewExecution,
    Progress,
    StepRecord,
    Write,
    signals_from_json,
)
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests.durable_helpers import crash, durable_url, engines  # noqa: F401 - fixtures
from tests.late_answers import LateAnswer, lapse_and_renew
from tests.odd_exceptions import ODD_EXCEPTIONS, StrRaises, tag_of
from tests.servers import until as until_true

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CALLS: Counter[str] = Counter()


def count(name: str, value: Any = None) -> Callable[..., Any]:
    """A step function that counts its calls and returns ``value``."""

    def step(*args: Any) -> Any:
        CALLS[name] += 1
        return value

    return step


def fails_first(name: str, failures: int, value: Any) -> Callable[..., Any]:
    """A step function that raises ``RuntimeError(name)`` on its first ``failures`` calls,
    then returns ``value``, counting its calls (``CALLS[name]``)."""

    def step(*args: Any) -> Any:
        CALLS[name] += 1
        if CALLS[name] <= failures:
            raise RuntimeError(name)
        return value

    return step


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


# ---------------------------------------------------------------------------------------
# definitions
# ---------------------------------------------------------------------------------------
def test_the_durable_public_names_come_from_backend_too() -> None:
    import backend
    import backend.durable

    names = ["DurableContext", "DurableFunction", "Execution", "ExecutionLog", "ExecutionsPage", "Retry", "Signalled",
             "Started", "StepFailed", "StepView", "define_durable"]  # fmt: skip
    for name in names:
        assert name in backend.__all__
        assert getattr(backend, name) is getattr(backend.durable, name)
    from backend import Retry, define_durable  # as the README writes it

    assert (Retry, define_durable) == (backend.durable.Retry, backend.durable.define_durable)


def test_define_durable_refuses_what_cannot_run() -> None:
    async def body(ctx: DurableContext, input: Any) -> None:
        pass

    def sync_body(ctx: DurableContext, input: Any) -> None:
        pass

    assert define_durable(name="ok", handler=body).name == "ok"
    with pytest.raises(DefinitionError, match=r"define_durable\('bad name'\): invalid name"):
        define_durable(name="bad name", handler=body)
    with pytest.raises(DefinitionError, match="sync_body must be an async def"):
        define_durable(name="s", handler=sync_body)  # type: ignore[arg-type]  # the refused handler is the point
    with pytest.raises(DefinitionError, match="step_timeout 0 must be a number of seconds or a timedelta, more than 0"):
        define_durable(name="t", handler=body, step_timeout=0)
    with pytest.raises(DefinitionError, match="Retry attempts 0"):
        Retry(attempts=0)
    with pytest.raises(DefinitionError, match="max_delay 1s is shorter than initial_delay 10s"):
        Retry(initial_delay=10, max_delay=1)
    assert [Retry(5, 10, 300).delay_after(n).total_seconds() for n in (1, 2, 3, 6)] == [10, 20, 40, 300]


def test_schedule_targets_a_durable_function_by_name(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="give a handler or durable=, not both"):
        define_schedule(name="n", cron="0 2 * * *", timezone="UTC", handler=lambda ctx: None, durable="f")
    with pytest.raises(DefinitionError, match="handler None is not callable"):
        define_schedule(name="n", cron="0 2 * * *", timezone="UTC")
    nightly = define_schedule(name="n", cron="0 2 * * *", timezone="UTC", durable="nightly-sync")
    with pytest.raises(BadInput, match='schedule "n" targets durable function "nightly-sync", which is not defined'):
        Engine([nightly], f"sqlite:///{tmp_path / 's.db'}")


def test_durable_files_are_discovered(tmp_path: Path) -> None:
    (tmp_path / "sync.durable.py").write_text(
        textwrap.dedent(
            """
            from backend import define_schedule
            from backend.durable import define_durable

            async def body(ctx, input):
                return await ctx.step("one", lambda: 1)

            sync = define_durable(name="nightly-sync", handler=body)
            nightly = define_schedule(name="nightly", cron="0 2 * * *", timezone="UTC", durable="nightly-sync")
            """
        )
    )
    found = discover_definitions(tmp_path)
    assert sorted(type(item).__name__ for item in found.items) == ["DurableFunction", "Schedule"]
    engine = Engine(found, f"sqlite:///{tmp_path / 's.db'}")
    assert list(engine.durable.functions) == ["nightly-sync"]


# ---------------------------------------------------------------------------------------
# steps, checkpoints, replay
# ---------------------------------------------------------------------------------------
async def test_steps_run_once_and_replay_from_checkpoints(engines: Callable[..., Engine], clock: ManualClock) -> None:
    async def body(ctx: DurableContext, input: Any) -> Any:
        one = await ctx.step("one", count("one", {"n": 1, "t": (1, 2)}))
        two = await ctx.step("two", count("two", [one["n"] + 1]))
        await ctx.sleep("nap", 60)
        three = await ctx.step("three", count("three", "x"))
        return {"one": one, "two": two, "three": three, "input": input}

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f", {"k": "v"})
    await engine.quiesce()
    waiting = await engine.durable.get(started.id)
    assert (waiting.status, waiting.waiting_for, waiting.wake_at) == ("waiting", "sleep:nap", clock.now() + timedelta(seconds=60))
    assert not engine.durable.executor.running and not engine.runner.in_flight  # the sleep holds no worker
    clock.advance(60)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.status == "succeeded"
    # A step returns its value as JSON decodes it, live and on replay alike (the tuple is a list).
    assert done.output == {"one": {"n": 1, "t": [1, 2]}, "two": [2], "three": "x", "input": {"k": "v"}}
    assert CALLS == {"one": 1, "two": 1, "three": 1}
    assert [(s.seq, s.name, s.kind, s.status, s.attempt) for s in done.steps or []] == [
        (1, "one", "step", "succeeded", 1),
        (2, "two", "step", "succeeded", 1),
        (3, "nap", "sleep", "succeeded", 1),
        (4, "three", "step", "succeeded", 1),
    ]


async def test_a_chatty_executions_log_is_its_newest_lines_in_memory_and_in_the_store(
    engines: Callable[..., Engine], durable_url: str
) -> None:
    # 5,000 lines before each step were all held until the checkpoint and all stored (96 MB
    # for one execution), though only the newest 500 could ever be read.
    async def body(ctx: DurableContext, input: Any) -> int:
        for i in range(3):
            for j in range(1200):
                ctx.log(f"step {i} line {j}")
            await ctx.step(f"s{i}", count("s"))
        return 3

    engine = engines([define_durable(name="f", handler=body)])
    store: Any = engine.store
    written: list[int] = []
    write = store.durable_write

    async def counted_write(w: Write) -> Any:
        written.append(len(w.logs))
        return await write(w)

    store.durable_write = counted_write
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.status == "succeeded"
    assert max(written) <= 2 * LOG_LINES
    lines = [line.message for line in done.logs or []]
    assert len(lines) == LOG_LINES and "step 2 line 1199" in lines and "step 2 line 0" not in lines
    if durable_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(durable_url.removeprefix("sqlite:///"))) as conn:
            assert conn.execute("SELECT count(*) FROM durable_logs WHERE execution_id = ?", (started.id,)).fetchone() == (
                LOG_LINES,
            )


async def test_a_line_logged_again_as_the_code_replays_is_in_the_log_once(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The code runs again from its start when it resumes after a sleep: each line it logs
    before the sleep was in the log twice, as if the work had been done twice."""

    async def body(ctx: DurableContext, input: Any) -> int:
        ctx.log("top of the function")
        await ctx.step("one", count("one"))
        ctx.log("between one and the nap")
        await ctx.sleep("nap", 60)
        ctx.log("after the nap")
        await ctx.step("two", count("two"))
        return 2

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    clock.advance(60)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.status == "succeeded"
    mine = ["top of the function", "between one and the nap", "after the nap"]
    assert [line.message for line in done.logs or [] if line.message in mine] == mine


async def test_one_commit_per_finished_step(engines: Callable[..., Engine]) -> None:
    async def body(ctx: DurableContext, input: Any) -> int:
        for i in range(20):
            await ctx.step(f"s{i}", count("s"))
        return 20

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    store: Any = engine.store
    claims: list[Any] = []
    inserts: list[tuple[Any, int]] = []
    writes: list[tuple[Write, int]] = []
    insert, claim, write = store.durable_insert, store.durable_claim, store.durable_write
    # The store's commit counter is shared: a claim round, the event relay's NOTIFY or the
    # start's audit entry may commit while a checkpoint is on its way. One lock keeps them
    # out of a write's window, so each write's count is its own.
    alone = asyncio.Lock()

    async def counted_claim(*args: Any) -> Any:
        async with alone:
            claims.append(await claim(*args))
        return claims[-1]

    async def counted_insert(new: Any, **kwargs: Any) -> Any:
        async with alone:
            before = store.commits
            result = await insert(new, **kwargs)
            inserts.append((kwargs.get("claim"), store.commits - before))
        return result

    async def counted_write(w: Write) -> Any:
        async with alone:
            before = store.commits
            result = await write(w)
            writes.append((w, store.commits - before))
        return result

    def serialised(method: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            async with alone:
                return await method(*args, **kwargs)

        return call

    store.durable_insert, store.durable_claim, store.durable_write = counted_insert, counted_claim, counted_write
    for name in ("notify_events", "append_audit"):
        if hasattr(store, name):  # SQLite has no NOTIFY
            setattr(store, name, serialised(getattr(store, name)))
    await engine.durable.start_execution("f")
    await engine.quiesce()
    # The start inserts the execution claimed by this instance, with its audit entry, in one
    # commit (no claim); then each of the 20 steps is one write of one commit, and the
    # finish another: no read per step.
    assert [(claimed[0], commits) for claimed, commits in inserts] == [(engine.instance, 1)]
    assert [len(c) for c in claims if c] == []
    assert [(len(w.steps), commits) for w, commits in writes] == [(1, 1)] * 20 + [(0, 1)]
    assert (await engine.durable.get(started.id)).status == "succeeded"


async def test_a_start_runs_where_it_is_made_when_there_is_room_and_is_queued_otherwise(
    engines: Callable[..., Engine],
) -> None:
    release, entered = asyncio.Event(), asyncio.Event()

    async def held() -> str:
        CALLS["held"] += 1
        entered.set()
        await release.wait()
        return "ok"

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("held", held)

    function = define_durable(name="f", handler=body)
    observer = engines([function], instance="o")
    await observer.open()  # defines it, runs nothing: its start waits in the queue
    queued = await observer.durable.start_execution("f")
    assert (await observer.durable.get(queued.id)).status == "queued"
    a = engines([function], instance="a")
    a.durable.executor.concurrency = 2
    await a.start()
    await entered.wait()  # the queued one is claimed and runs
    here = await a.durable.start_execution("f")  # room for one more: claimed by its own insert
    row = await a.durable.get(here.id)
    assert (row.status, row.instance) == ("running", "a")
    full = await a.durable.start_execution("f")  # no room: queued, claimed when a place is free
    assert (await a.durable.get(full.id)).status == "queued"
    duplicate = await a.durable.start_execution("f", id=here.id)
    assert duplicate.duplicate and a.durable.executor._reserved == 0
    release.set()
    await a.quiesce()
    for started in (queued, here, full):
        done = await a.durable.get(started.id)
        assert (done.status, done.output, done.instance) == ("succeeded", "ok", "a")
    assert CALLS["held"] == 3
    assert [line.message for line in (await a.durable.get(here.id)).logs or []][0] == "started on a"
    # each start is audited once, in the statement that inserted it (the duplicate: not at all)
    starts = [e.target for e in (await a.audit.list()).entries if e.action == "durable.start"]
    assert sorted(starts) == sorted([queued.id, here.id, full.id])


async def test_a_start_being_inserted_as_its_instance_stops_goes_back_to_the_queue(
    engines: Callable[..., Engine],
) -> None:
    first_run = asyncio.Event()

    async def body(ctx: DurableContext, input: Any) -> Any:
        if not first_run.is_set():  # a's run waits in its own code, before any step
            first_run.set()
            await asyncio.Event().wait()
        return await ctx.step("one", count("one", 1))

    function = define_durable(name="f", handler=body)
    a = engines([function], instance="a")
    await a.start()
    store: Any = a.store
    insert, inserting, go_on = store.durable_insert, asyncio.Event(), asyncio.Event()

    async def slow_insert(*args: Any, **kwargs: Any) -> Any:
        inserting.set()
        await go_on.wait()
        return await insert(*args, **kwargs)

    store.durable_insert = slow_insert
    executor = a.durable.executor
    stop, stop_began = executor.stop, asyncio.Event()

    async def observed_stop(grace: float) -> None:
        stop_began.set()
        await stop(grace)

    executor.stop = observed_stop  # type: ignore[method-assign]  # notes when the stop begins
    start = asyncio.ensure_future(a.durable.start_execution("f"))
    await inserting.wait()
    stopping = asyncio.ensure_future(a.stop(grace=0))
    await stop_began.wait()  # the executor's stop() has begun: it waits for the start in flight
    assert executor.stopping and executor._reserved == 1 and not stopping.done()
    go_on.set()
    started = await start
    await stopping  # waited for the run, interrupted it and let go of the execution
    assert first_run.is_set()
    b = engines([function], instance="b")
    await b.open()
    row = await b.durable.get(started.id)
    assert row.status == "queued" and CALLS == {}  # let go of before its first step
    await b.start()
    await b.quiesce()
    assert (await b.durable.get(started.id)).output == 1 and CALLS == {"one": 1}


async def _one_step(ctx: DurableContext, input: Any) -> Any:
    return await ctx.step("one", count("one", 1))


async def test_an_execution_claimed_under_a_lease_that_lapsed_while_the_answer_was_on_its_way_does_not_run_under_that_claim(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The claim commits; its answer comes back after this instance's lease lapsed and was
    renewed. Another instance may have claimed the execution in between: no step runs
    here under that claim. The next round gives it back and claims it again (it waited
    out its 30 s lease before)."""
    function = define_durable(name="f", handler=_one_step)
    a = engines([function], instance="a")
    await a.open()
    started = await a.durable.start_execution("f")  # queued: the executor is not running yet
    store: Any = a.store
    store.durable_claim = late = LateAnswer(store.durable_claim, bool)
    await a.start()
    await late.committed()
    lapse_and_renew(a)
    late.let_go()
    await a.quiesce()  # no time passes
    execution = await a.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 1, {"one": 1})


class LoseClaimAnswer:
    """The store's durable claim commits, then its answer is lost, once (when it took
    something)."""

    def __init__(self, store: Any) -> None:
        self.claim = store.durable_claim
        self.lost: list[Any] = []

    async def __call__(self, *args: Any) -> Any:
        claimed = await self.claim(*args)
        if claimed and not self.lost:
            self.lost.extend(claimed)
            raise Unavailable("the connection broke before the answer came back (test)")
        return claimed


async def test_an_execution_taken_by_a_claim_whose_answer_was_lost_is_given_back_and_runs_at_once(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """It used to stay `running` under this instance, run by nobody, until its 30 s lease
    ran out."""
    function = define_durable(name="f", handler=_one_step)
    a = engines([function], instance="a")
    await a.open()
    started = await a.durable.start_execution("f")  # queued: the executor is not running yet
    store: Any = a.store
    store.durable_claim = lost = LoseClaimAnswer(store)
    await a.start()
    await a.quiesce()
    assert [c.execution.id for c in lost.lost] == [started.id] and CALLS == {}
    clock.advance(1)  # the next round (a poll later)
    await a.quiesce()
    execution = await a.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 1, {"one": 1})


async def test_a_full_disk_that_refuses_every_give_back_is_logged_once_a_minute(
    engines: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an outside attack (the host runs out: SQLite on a full disk): every round's
    failed claim is given back by the next, which failed too, and logged `could not give
    back what a claim nobody runs here took (...database or disk is full...)` every second
    for the whole outage."""
    a = engines([define_durable(name="f", handler=_one_step)], instance="a")
    await a.open()
    store: Any = a.store

    async def full(*args: Any) -> Any:
        raise Unavailable("database or disk is full (test)")

    store.durable_claim = store.durable_give_back = full
    caplog.set_level(logging.DEBUG, "schedtui")
    await a.start()
    await a.quiesce()
    for _ in range(59):
        clock.advance(1)
        await a.quiesce()
    tries = [r for r in caplog.records if "could not give back" in r.getMessage()]
    assert len(tries) >= 30  # a try a round
    assert [r.levelno for r in tries if r.levelno >= logging.INFO] == [logging.WARNING]


async def test_a_stop_waits_for_a_claim_on_its_way_before_it_gives_back_what_it_took(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """A stop cancels the executor's loop while its claim is on its way, and the server
    commits that claim only after the stop has begun (it runs on whatever the client does).
    The stop gave back what the claim took at once: before the claim had committed, so it
    found nothing, and the execution stayed claimed by a stopped instance, run by nobody,
    for its 30 s lease. It now waits for the claim's answer first."""
    function = define_durable(name="f", handler=_one_step)
    a = engines([function], instance="a")
    await a.open()
    started = await a.durable.start_execution("f")  # queued: the executor is not running yet
    store: Any = a.store
    claim, sent, commit = store.durable_claim, asyncio.Event(), asyncio.Event()
    on_the_server: list[asyncio.Future[Any]] = []

    async def on_the_wire(*args: Any) -> Any:
        async def server() -> Any:
            await commit.wait()
            return await claim(*args)

        on_the_server.append(asyncio.ensure_future(server()))  # (a cancelled client does not stop it)
        sent.set()
        return await asyncio.shield(on_the_server[-1])

    store.durable_claim = on_the_wire
    executor = a.durable.executor
    stop = executor.stop

    async def commit_once_stopping(grace: float) -> None:
        commit.set()
        await stop(grace)

    executor.stop = commit_once_stopping  # type: ignore[method-assign]
    await a.start()
    await asyncio.wait_for(sent.wait(), 10)  # (the timeouts only bound a broken test)
    await asyncio.wait_for(a.stop(grace=0), 10)
    assert [c.execution.id for c in on_the_server[0].result()] == [started.id] and CALLS == {}
    b = engines([function], instance="b")
    await b.start()
    await b.quiesce()  # the same instant: not a lease later
    execution = await b.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 1, {"one": 1})


async def test_a_give_back_frees_only_what_its_claim_took_and_still_holds(engines: Callable[..., Engine], clock: ManualClock) -> None:
    engine = engines([])
    await engine.open()
    store = cast(DurableStore, engine.store)
    now = clock.now()
    until = now + timedelta(seconds=30)
    ids = ["01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "01JD3Z6Q0V9W4C7PAXH3KJ1M2C"]
    for id_ in ids:
        await store.durable_insert(NewExecution(id_, "f", "null", now))
    [first] = await store.durable_claim("a", ["f"], now, until, 1, "claim-1")
    [second] = await store.durable_claim("a", ["f"], now, until, 1, "claim-2")  # the same instant, another claim
    assert await store.durable_give_back("b", "claim-1", until, now) == 0  # another instance's name
    assert await store.durable_give_back("a", "claim-1", until + timedelta(seconds=1), now) == 0  # another lease
    assert await store.durable_give_back("a", "claim-1", until, now) == 1
    assert await store.durable_give_back("a", "claim-1", until, now) == 0  # once
    # Given back: claimable at once, by anyone; the other claim's execution is untouched.
    [again] = await store.durable_claim("b", ["f"], now, until, 10, "claim-3")
    assert again.execution.id == first.execution.id and again.execution.lease == first.execution.lease + 1
    assert await store.durable_give_back("a", "claim-1", until, now) == 0  # b's now
    step = StepRecord(1, "one", "step", "succeeded", 1, now, now, output="1")
    assert await store.durable_write(Write(again.execution.id, again.execution.lease, now, Progress("one", until), [step])) is False
    assert await store.durable_write(Write(second.execution.id, second.execution.lease, now, Progress("one", until), [step])) is False


async def _the_same_step_twice(ctx: DurableContext, input: Any) -> Any:
    await ctx.step("one", count("one", 1))
    return await ctx.step("one", count("one", 1))  # a name used twice: the execution fails


async def test_an_instance_says_at_its_start_which_durable_functions_it_runs(
    engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """As it says its queues: an operator reading a serve's start-up log saw its schedules
    and queues, and nothing of the durable functions it would run."""
    caplog.set_level("INFO", logger="schedtui.durable")
    a = engines([define_durable(name=name, handler=_the_same_step_twice) for name in ("sync", "release")])
    await a.start()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("running ")]
    assert said == [f"running 2 durable function(s), {a.durable.executor.concurrency} execution(s) at once here: release, sync"]


async def test_an_end_that_finds_its_lease_taken_is_not_written_and_the_run_stops_quietly(
    engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """The code ended badly (here a step name used twice) and the write of that end finds
    the lease taken by another claim: nothing is written, and the run stops as any run
    that lost its lease. (An assertion failed inside the executor: "the executor failed".)"""
    function = define_durable(name="f", handler=_the_same_step_twice)
    a = engines([function], instance="a")
    await a.open()
    store: Any = a.store
    real_write = store.durable_write
    ends: list[Any] = []

    async def taken_at_the_end(write: Any) -> Any:
        if type(write.then).__name__ == "Finish":
            ends.append(write.then)
            return None  # another claim holds the lease now
        return await real_write(write)

    store.durable_write = taken_at_the_end
    started = await a.durable.start_execution("f")
    await a.start()
    await a.quiesce()
    assert [e.error_tag for e in ends] == ["nondeterministic"]
    assert not [r for r in caplog.records if "executor failed" in r.getMessage()]
    assert (await a.durable.get(started.id)).status == "running"  # left to its lease: nothing written
    assert a.durable.executor.idle


async def test_a_start_claimed_under_a_lease_that_lapsed_while_it_was_inserted_does_not_run_under_that_claim(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The same for a start that runs where it is made: its insert claims it; the lease
    lapses and is renewed before the insert's answer is back. It is not run under the
    insert's claim: the next round gives it back and claims it (it waited out its lease)."""
    function = define_durable(name="f", handler=_one_step)
    a = engines([function], instance="a")
    await a.start()
    store: Any = a.store
    store.durable_insert = late = LateAnswer(store.durable_insert)
    starting = asyncio.ensure_future(a.durable.start_execution("f"))
    await late.committed()
    lapse_and_renew(a)
    late.let_go()
    started = await starting
    await a.quiesce()  # no time passes
    execution = await a.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 1, {"one": 1})


async def test_a_start_claimed_where_it_is_made_whose_answer_was_lost_is_given_back_and_runs(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The insert claims the execution for this instance and commits; the answer is lost,
    so the caller sees Unavailable. The execution used to stay `running` here, run by
    nobody, until its 30 s lease ran out; the next round gives it back and runs it."""
    function = define_durable(name="f", handler=_one_step)
    a = engines([function], instance="a")
    await a.start()
    store: Any = a.store
    insert = store.durable_insert
    inserted: list[str] = []

    async def lost(new: Any, **kwargs: Any) -> bool:
        assert await insert(new, **kwargs)
        inserted.append(new.id)
        raise Unavailable("the connection broke before the answer came back (test)")

    store.durable_insert = lost
    with pytest.raises(Unavailable):
        await a.durable.start_execution("f")
    del store.durable_insert
    [execution_id] = inserted
    assert (await a.durable.get(execution_id)).status == "running" and CALLS == {}
    clock.advance(1)  # the next round
    await a.quiesce()
    execution = await a.durable.get(execution_id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 1, {"one": 1})


async def _two_steps_with_a_gate(ctx: DurableContext, gate: Any) -> Any:
    await ctx.step("one", count("one", 1))
    reached, open_ = GATES[gate]
    reached.set()  # (step one is checkpointed)
    await open_.wait()  # its code between two steps, slow
    return await ctx.step("two", count("two", 2))


GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


async def _held_between_steps(engines: Callable[..., Engine], gate: str) -> tuple[Engine, Started, asyncio.Event]:
    """Instance "a" running an execution of ``_two_steps_with_a_gate`` held after its first
    step (checkpointed), and the event that lets it go on."""
    GATES[gate] = reached, go_on = asyncio.Event(), asyncio.Event()
    a = engines([define_durable(name="f", handler=_two_steps_with_a_gate)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f", gate)
    await asyncio.wait_for(reached.wait(), 10)  # (the timeouts only bound a broken test)
    return a, started, go_on


async def _until(done: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not done():
            await asyncio.sleep(0)

    await asyncio.wait_for(wait(), 10)  # (the timeout only bounds a broken test)


@pytest.mark.parametrize("stuck", [False, True], ids=["renewals-fail", "renewal-hangs"])
async def test_a_run_whose_lease_was_not_renewed_in_time_starts_no_step_after_it_may_have_run_out(
    engines: Callable[..., Engine], clock: ManualClock, stuck: bool
) -> None:
    """The instance is alive (its heartbeat renews its own lease) but the execution's lease
    is not renewed: the renewal fails, or hangs (a slow store). Past the lease, less the
    margin for the others' clocks, another instance may claim it: no step starts here; it
    is claimed again once its lease has run out, and each step runs once."""
    a, started, gate = await _held_between_steps(engines, "g")
    store: Any = a.store
    renew, hang = store.durable_renew, asyncio.Event()
    tries: list[str] = []

    async def not_renewed(*args: Any) -> Any:
        tries.append("loop" if not tries else "step")
        if stuck and len(tries) == 1:
            await hang.wait()  # the executor's own renewal never answers
        raise Unavailable("the store does not answer (test)")

    store.durable_renew = not_renewed
    executor = a.durable.executor
    clock.advance(26)  # past the lease (30 s) less the margin for clocks (5 s)
    await _until(lambda: bool(tries))  # the executor tried to renew
    gate.set()  # the code reaches its next step
    await _until(lambda: not executor.running)
    assert CALLS == {"one": 1}  # step two did not start
    assert tries == (["loop", "step"] if stuck else ["loop"])
    store.durable_renew = renew
    hang.set()
    clock.advance(5)  # its lease has run out: claimed again (here), step one replayed
    await a.quiesce()
    execution = await a.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 2, {"one": 1, "two": 1})


async def test_a_claim_whose_answer_comes_after_the_executions_lease_ran_out_runs_no_step(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """A slow store, not a lapse: the claim commits, its answer takes longer than the
    execution's lease, and another instance claims the execution meanwhile and runs it.
    The late answer's run starts no step: the step finds the lease gone when it renews."""
    GATES["g"] = reached, gate = asyncio.Event(), asyncio.Event()
    function = define_durable(name="f", handler=_two_steps_with_a_gate)
    a = engines([function], instance="a")
    await a.open()
    started = await a.durable.start_execution("f", "g")  # queued: no executor runs yet
    store: Any = a.store
    store.durable_claim = late = LateAnswer(store.durable_claim, bool)
    await a.start()
    await late.committed()
    clock.advance(31)  # the execution's lease (30 s) runs out; a's answer is still on its way
    b = engines([function], instance="b")
    await b.start()
    await asyncio.wait_for(reached.wait(), 10)  # b claimed it and ran step one
    late.let_go()
    executor = a.durable.executor
    await _until(lambda: not executor.running)
    assert CALLS == {"one": 1}  # a ran nothing
    gate.set()
    await b.quiesce()
    execution = await b.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 2, {"one": 1, "two": 1})


async def test_a_step_past_its_runs_lease_renews_it_first_and_runs(engines: Callable[..., Engine], clock: ManualClock) -> None:
    """The executor's renewal hangs; the code reaches its next step past the lease: the
    step renews the lease itself (the store answers it) and runs, in the same claim."""
    a, started, gate = await _held_between_steps(engines, "g")
    store: Any = a.store
    renew, hang = store.durable_renew, asyncio.Event()
    tries: list[str] = []

    async def first_hangs(*args: Any) -> Any:
        tries.append("loop" if not tries else "step")
        if len(tries) == 1:
            await hang.wait()
        return await renew(*args)

    store.durable_renew = first_hangs
    clock.advance(26)
    await _until(lambda: bool(tries))
    gate.set()
    await _until(lambda: CALLS["two"] == 1)
    assert tries == ["loop", "step"]
    hang.set()
    await a.quiesce()
    execution = await a.durable.get(started.id)
    assert (execution.status, execution.output, CALLS) == ("succeeded", 2, {"one": 1, "two": 1})
    assert execution.logs is not None and not [line for line in execution.logs if "resumed" in line.message]


async def test_a_failed_step_retries_after_durable_waits_that_hold_no_worker(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    async def flaky() -> str:
        CALLS["fetch"] += 1
        if CALLS["fetch"] < 3:
            raise ConnectionError(f"502 from partner (call {CALLS['fetch']})")
        return "page"

    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("before", count("before"))
        return await ctx.step("fetch-31", flaky, retry=Retry(attempts=5, initial_delay=10, max_delay=300))

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    first = await engine.durable.get(started.id)
    assert (first.status, first.waiting_for, first.wake_at) == ("waiting", "retry:fetch-31", clock.now() + timedelta(seconds=10))
    step = (first.steps or [])[-1]
    assert (step.status, step.attempt, step.error_tag, step.error_message) == (
        "waiting", 1, "ConnectionError", "502 from partner (call 1)"
    )
    assert not engine.durable.executor.running and not engine.runner.in_flight
    clock.advance(9)
    await engine.quiesce()
    assert CALLS["fetch"] == 1  # not before its time
    clock.advance(1)
    await engine.quiesce()
    second = await engine.durable.get(started.id)
    assert (second.waiting_for, second.wake_at) == ("retry:fetch-31", clock.now() + timedelta(seconds=20))  # doubled
    clock.advance(20)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", "page")
    assert CALLS == {"before": 1, "fetch": 3}
    last = (done.steps or [])[-1]
    assert (last.status, last.attempt, last.error_tag, last.error_message) == (
        "succeeded", 3, "ConnectionError", "attempt 2 failed: 502 from partner (call 2)"
    )  # the timeline shows that it took retries, and why
    assert any("attempt 1 of 5 failed" in line.message for line in done.logs or [])


async def test_retry_false_fails_at_once_and_retry_runs_the_failed_step_again(
    engines: Callable[..., Engine],
) -> None:
    fail = {"on": True}

    def send() -> str:
        CALLS["send"] += 1
        if fail["on"]:
            raise RuntimeError("mail server down")
        return "sent"

    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("prepare", count("prepare", 1))
        return await ctx.step("send", send, retry=False)

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag) == ("failed", "RuntimeError")
    assert failed.error_message == 'step "send" (position 2) failed (one attempt): RuntimeError: mail server down'
    fail["on"] = False
    again = await engine.durable.retry(started.id)
    # Its executor may have claimed it already, even finished it (on a quiet machine, on
    # PostgreSQL, before retry() has read it back).
    assert again.status in ("queued", "running", "succeeded")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output, done.error_tag) == ("succeeded", "sent", None)
    assert CALLS == {"prepare": 1, "send": 2}  # the finished step was not run again
    assert (done.steps or [])[-1].attempt == 1  # fresh attempts
    with pytest.raises(Refused, match="is succeeded; only a failed execution can be retried"):
        await engine.durable.retry(started.id)


async def test_retry_never_runs_a_succeeded_step_again_after_a_nondeterministic_failure(
    engines: Callable[..., Engine],
) -> None:
    """Steps a, b, a: the second "a" fails the execution (a name used twice). Retrying it,
    as often as anyone likes, never runs the first "a" again; once the code is fixed, a
    retry replays a and b from their checkpoints and runs only what is new."""
    fixed = {"on": False}

    async def body(ctx: DurableContext, input: Any) -> Any:
        a = await ctx.step("a", count("a", 1))
        b = await ctx.step("b", count("b", 2))
        c = await ctx.step("c" if fixed["on"] else "a", count("c", 3))
        return [a, b, c]

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    for _ in range(3):
        failed = await engine.durable.get(started.id)
        assert (failed.status, failed.error_tag) == ("failed", "nondeterministic")
        assert [(s.name, s.status) for s in failed.steps or []] == [("a", "succeeded"), ("b", "succeeded")]
        await engine.durable.retry(started.id)
        await engine.quiesce()
    assert CALLS == {"a": 1, "b": 1}
    fixed["on"] = True
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", [1, 2, 3])
    assert CALLS == {"a": 1, "b": 1, "c": 1}


async def test_a_retry_forgets_a_failed_checkpoint_never_a_succeeded_one(engines: Callable[..., Engine], clock: ManualClock) -> None:
    """The store's own rule, whatever step the failure names."""
    engine = engines([])
    await engine.open()
    store = cast(DurableStore, engine.store)
    now = clock.now()
    ids = ["01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "01JD3Z6Q0V9W4C7PAXH3KJ1M2C"]
    for id_ in ids:
        await store.durable_insert(NewExecution(id_, "f", "null", now))
    leases = {c.execution.id: c.execution.lease for c in await store.durable_claim("a", ["f"], now, now + timedelta(seconds=30), 10)}
    ok = StepRecord(1, "a", "step", "succeeded", 1, now, now, output="1")
    bad = StepRecord(2, "b", "step", "failed", 3, now, now, error_tag="ValueError", error_message="no")
    for id_, failed_step in zip(ids, ["a", "b"], strict=False):
        finish = Finish("failed", failed_step, error_tag="x", error_message="x", failed_step=failed_step)
        assert await store.durable_write(Write(id_, leases[id_], now, finish, [ok, bad])) is not None
        assert await store.durable_retry(id_, now, "retried by test") == "failed"

    async def steps_of(id_: str) -> list[tuple[str, str]]:
        execution = await store.durable_get(id_)
        assert execution is not None
        return [(s.name, s.status) for s in execution.steps or []]

    kept = [await steps_of(id_) for id_ in ids]
    assert kept == [[("a", "succeeded"), ("b", "failed")], [("a", "succeeded")]]


async def test_code_that_catches_a_step_failure_goes_on(engines: Callable[..., Engine]) -> None:
    def boom() -> None:
        raise ValueError("no")

    async def body(ctx: DurableContext, input: Any) -> Any:
        try:
            await ctx.step("risky", boom, retry=False)
        except StepFailed as exc:
            return {"handled": exc.step, "tag": exc.error_tag}
        return None

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", {"handled": "risky", "tag": "ValueError"})


async def test_a_step_timeout_is_the_runners_and_a_failed_attempt(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    entered = asyncio.Event()

    async def hangs() -> None:
        CALLS["hang"] += 1
        entered.set()
        await asyncio.Event().wait()

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("hang", hangs, retry=Retry(attempts=2, initial_delay=1))

    engine = engines([define_durable(name="f", handler=body, step_timeout=5)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await entered.wait()
    entered.clear()
    clock.advance(5)
    await engine.quiesce()
    waiting = await engine.durable.get(started.id)
    assert waiting.waiting_for == "retry:hang"
    assert (waiting.steps or [])[0].error_tag == "timeout"
    clock.advance(1)
    await entered.wait()
    clock.advance(5)
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag, CALLS["hang"]) == ("failed", "timeout", 2)


async def test_output_that_is_not_json_fails_the_step(engines: Callable[..., Engine]) -> None:
    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("odd", count("odd", {1, 2}))

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag, CALLS["odd"]) == ("failed", "output_not_json", 1)  # not retried
    assert "is not JSON" in (failed.error_message or "")


async def test_a_sync_step_raising_stop_iteration_fails_the_step_at_once(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """``next()`` on an empty iterator in a plain ``def`` step: a future refuses
    StopIteration, so the step never ended and the execution stayed ``running`` for good."""

    async def code(ctx: DurableContext, input: Any) -> None:
        await ctx.step("first", lambda: next(iter([])), retry=False)

    engine = engines([define_durable(name="d", handler=code)])
    await engine.start()
    started = await engine.durable.start_execution("d")
    await asyncio.wait_for(engine.quiesce(), 10)
    ended = await engine.durable.get(started.id)
    assert (ended.status, ended.error_tag, ended.finished_at) == ("failed", "StopIteration", clock.now())
    assert [(s.name, s.status, s.error_tag) for s in ended.steps or []] == [("first", "failed", "StopIteration")]


@pytest.mark.parametrize("odd", ODD_EXCEPTIONS, ids=tag_of)
async def test_an_exception_that_cannot_be_described_fails_at_once(
    engines: Callable[..., Engine], clock: ManualClock, odd: type[BaseException]
) -> None:
    """Raised by a step or by the code itself: the step, the execution fail as soon as it
    is raised (not at the step's timeout, never left running), tagged with its class."""

    def step() -> None:
        raise odd()

    async def in_a_step(ctx: DurableContext, input: Any) -> None:
        await ctx.step("raises", step, retry=False)

    async def in_the_code(ctx: DurableContext, input: Any) -> None:
        raise odd()

    engine = engines([define_durable(name="step", handler=in_a_step), define_durable(name="code", handler=in_the_code)])
    await engine.start()
    ids = [(await engine.durable.start_execution(name)).id for name in ("step", "code")]
    await asyncio.wait_for(engine.quiesce(), 10)
    by_step, by_code = [await engine.durable.get(id_) for id_ in ids]
    assert (by_step.status, by_step.error_tag, by_step.finished_at) == ("failed", tag_of(odd), clock.now())
    assert [(s.status, s.error_tag) for s in by_step.steps or []] == [("failed", tag_of(odd))]
    assert (by_code.status, by_code.error_tag, by_code.finished_at) == ("failed", tag_of(odd), clock.now())


async def test_a_result_whose_encoding_raises_fails_the_step_as_not_json(engines: Callable[..., Engine]) -> None:
    class Mapping(dict[str, Any]):
        def items(self) -> Any:  # what json reads of a dict subclass
            raise StrRaises()

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("odd", count("odd", Mapping(a=1)))

    async def returns(ctx: DurableContext, input: Any) -> Any:
        return Mapping(a=1)

    engine = engines([define_durable(name="f", handler=body), define_durable(name="g", handler=returns)])
    await engine.start()
    ids = [(await engine.durable.start_execution(name)).id for name in ("f", "g")]
    await asyncio.wait_for(engine.quiesce(), 10)
    for id_ in ids:
        failed = await engine.durable.get(id_)
        assert (failed.status, failed.error_tag) == ("failed", "output_not_json")
        assert "is not JSON (StrRaises() (its str() raised ValueError))" in (failed.error_message or "")
    assert CALLS["odd"] == 1


# ---------------------------------------------------------------------------------------
# names and order
# ---------------------------------------------------------------------------------------
async def test_a_step_name_used_twice_fails_naming_both_positions(engines: Callable[..., Engine]) -> None:
    async def body(ctx: DurableContext, input: Any) -> None:
        await ctx.step("page", count("a"))
        await ctx.step("other", count("b"))
        await ctx.step("page", count("c"))

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag) == ("failed", "nondeterministic")
    assert 'step name "page" is used twice in this execution (positions 1 and 3)' in (failed.error_message or "")
    assert CALLS == {"a": 1, "b": 1}


async def test_code_reaching_recorded_steps_in_another_order_fails_instead_of_replaying_wrong_data(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    async def v1(ctx: DurableContext, input: Any) -> None:
        await ctx.step("fetch", count("fetch", 1))
        await ctx.step("store", count("store", 2))
        await ctx.sleep("nap", 60)

    async def v2(ctx: DurableContext, input: Any) -> None:  # a deploy swapped two steps
        await ctx.step("store", count("store", 2))
        await ctx.step("fetch", count("fetch", 1))
        await ctx.sleep("nap", 60)

    first = engines([define_durable(name="f", handler=v1)])
    await first.start()
    started = await first.durable.start_execution("f")
    await first.quiesce()
    await first.stop()
    second = engines([define_durable(name="f", handler=v2)])
    await second.start()
    clock.advance(60)
    await second.quiesce()
    failed = await second.durable.get(started.id)
    assert (failed.status, failed.error_tag) == ("failed", "nondeterministic")
    assert failed.error_message is not None and failed.error_message.startswith(
        'the code reached step "store" at position 1, but it is recorded at position 2'
    )
    assert CALLS == {"fetch": 1, "store": 1}  # nothing ran again with the wrong data


# ---------------------------------------------------------------------------------------
# sleeps, signal waits, the bound
# ---------------------------------------------------------------------------------------
async def test_a_three_day_wait_for_approval_runs_in_milliseconds(engines: Callable[..., Engine], clock: ManualClock) -> None:
    async def body(ctx: DurableContext, input: Any) -> Any:
        return {"approval": await ctx.wait_for("approval", timeout=timedelta(days=3))}

    engine = engines([define_durable(name="release", handler=body)])
    await engine.start()
    timed_out = await engine.durable.start_execution("release")
    approved = await engine.durable.start_execution("release")
    await engine.quiesce()
    waiting = await engine.durable.get(timed_out.id)
    assert (waiting.waiting_for, waiting.wake_at) == ("signal:approval", clock.now() + timedelta(days=3))
    clock.advance(timedelta(days=1))
    await engine.quiesce()
    early = await engine.durable.signal(timed_out.id, "later", 1)
    again = await engine.durable.signal(timed_out.id, "later", 2)
    assert (early.duplicate, again.duplicate) == (False, True)  # the first payload is kept
    # Both in the audit log, the repeat marked (it answered "done" and went unrecorded).
    signals = [e.detail for e in reversed((await engine.audit.list()).entries) if e.action == "durable.signal"]
    assert signals == [{"name": "later"}, {"name": "later", "duplicate": True}]
    signalled = await engine.durable.signal(approved.id, "approval", {"by": "ops"})
    assert not signalled.duplicate
    await engine.quiesce()
    assert (await engine.durable.get(approved.id)).output == {"approval": {"by": "ops"}}
    assert (await engine.durable.get(timed_out.id)).status == "waiting"
    clock.advance(timedelta(days=2))
    await engine.quiesce()
    done = await engine.durable.get(timed_out.id)
    assert (done.status, done.output) == ("succeeded", {"approval": None})
    with pytest.raises(Refused, match="takes no more signals"):
        await engine.durable.signal(done.id, "approval", True)


async def test_a_signal_sent_before_the_wait_is_taken_when_the_code_gets_there(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.sleep("first", 60)
        return await ctx.wait_for("go")

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    await engine.durable.signal(started.id, "go", [1, 2])
    clock.advance(60)
    await engine.quiesce()
    got = await engine.durable.get(started.id)
    assert got.output == [1, 2], (got.waiting_for, got.wake_at, got.steps, got.logs)


async def test_a_signals_payload_reaches_the_code_as_sent_numbers_and_key_order_included(
    engines: Callable[..., Engine],
) -> None:
    """PostgreSQL kept a signal's payload as ``jsonb``, its value, not its text: 1e16 came
    back an int of 17 digits, the largest float an int of 309, an object's keys sorted."""

    async def body(ctx: DurableContext, input: Any) -> Any:
        got = await ctx.wait_for("go")
        return {"keys": list(got), "types": [type(v).__name__ for v in got.values()], "got": got}

    sent = {"b": 1, "a": 2.0, "big": 1e16, "max": 1.7976931348623157e308, "nested": {"z": 1.5e-7, "y": [1e300]}}
    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    await engine.durable.signal(started.id, "go", sent)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.output == {
        "keys": ["b", "a", "big", "max", "nested"], "types": ["int", "float", "float", "float", "dict"], "got": sent,
    }, done.output  # fmt: skip
    assert json.dumps(done.output["got"]) == json.dumps(sent)  # (the nested order too)
    if isinstance(engine.store, PostgresStore):  # the value too, for the release before (it reads "p")
        row = await engine.store._fetchone("SELECT signals FROM schedtui_durable_executions WHERE id = %s", (started.id,))
        assert row is not None and set(row[0]["go"]) == {"t", "p", "at"} and row[0]["go"]["p"]["b"] == 1


def test_signals_kept_before_as_values_still_read() -> None:
    at = "2026-12-06T10:00:00+00:00"
    kept = signals_from_json({"old": {"p": {"a": [1, 2.5]}, "at": at}, "new": {"t": '{"b":1e16}', "at": at}})
    when = datetime(2026, 12, 6, 10, tzinfo=UTC)
    assert kept == {"old": ('{"a":[1,2.5]}', when), "new": ('{"b":1e16}', when)}


async def test_waits_past_the_366_day_bound_fail_the_execution(engines: Callable[..., Engine], clock: ManualClock) -> None:
    async def too_long(ctx: DurableContext, input: Any) -> None:
        await ctx.sleep("forever", timedelta(days=400))

    async def unbounded(ctx: DurableContext, input: Any) -> Any:
        return await ctx.wait_for("go")

    engine = engines([define_durable(name="long", handler=too_long), define_durable(name="wait", handler=unbounded)])
    await engine.start()
    long = await engine.durable.start_execution("long")
    wait = await engine.durable.start_execution("wait")
    await engine.quiesce()
    failed = await engine.durable.get(long.id)
    assert (failed.status, failed.error_tag) == ("failed", "expired")
    assert "after the execution's 366-day bound" in (failed.error_message or "")
    waiting = await engine.durable.get(wait.id)
    assert waiting.wake_at == waiting.created_at + timedelta(days=366)  # no timeout: until the bound
    clock.advance(timedelta(days=366, seconds=1.5))  # (claimed a moment late, as a live instance would)
    await engine.quiesce()
    # The wait ends with the execution: it cannot outlive its bound (this asserted only
    # "output is None", which an expired execution has too).
    ended = await engine.durable.get(wait.id)
    assert (ended.status, ended.error_tag, ended.output) == ("failed", "expired", None)


@pytest.mark.parametrize("length", [1e13, 1e20, timedelta(days=999_999_999)])
async def test_a_sleep_or_wait_no_date_can_hold_fails_expired_not_overflow(
    engines: Callable[..., Engine], clock: ManualClock, length: Any
) -> None:
    """A length past what a date (or a timedelta) can hold failed the execution with
    OverflowError, "date value out of range"; it is past the bound like any other."""

    async def sleeps(ctx: DurableContext, input: Any) -> None:
        await ctx.sleep("forever", length)

    async def waits(ctx: DurableContext, input: Any) -> None:
        await ctx.wait_for("go", timeout=length)

    engine = engines([define_durable(name="sleeps", handler=sleeps), define_durable(name="waits", handler=waits)])
    await engine.start()
    ids = [(await engine.durable.start_execution(name)).id for name in ("sleeps", "waits")]
    await engine.quiesce()
    for id_, what in zip(ids, ('the sleep "forever"', 'the wait "go"'), strict=True):
        failed = await engine.durable.get(id_)
        assert (failed.status, failed.error_tag) == ("failed", "expired")
        assert (failed.error_message or "").startswith(f"{what} of ") and "366-day bound" in (failed.error_message or "")


async def test_a_step_called_after_the_code_returned_is_not_run(engines: Callable[..., Engine], clock: ManualClock) -> None:
    """A task the code left behind called ctx.step after the execution had succeeded: the
    step's function ran (its work done outside any lease, recorded nowhere), then the
    write failed and the log said the lease was "taken over by another claim"."""
    called: list[str] = []
    left: list[asyncio.Task[Any]] = []
    returned = asyncio.Event()

    async def late(ctx: DurableContext) -> None:
        await returned.wait()
        await ctx.step("late", lambda: called.append("late"))

    async def code(ctx: DurableContext, input: Any) -> str:
        left.append(asyncio.ensure_future(late(ctx)))
        return "done"

    engine = engines([define_durable(name="d", handler=code)])
    await engine.start()
    started = await engine.durable.start_execution("d")
    await engine.quiesce()
    assert (await engine.durable.get(started.id)).status == "succeeded"
    returned.set()
    await asyncio.wait(left)
    assert called == []
    assert type(left[0].exception()).__name__ == "Ended"
    assert [(s.name, s.status) for s in (await engine.durable.get(started.id)).steps or []] == []


@pytest.mark.parametrize("bad", [None, 5, 10**5000], ids=["None", "5", "5001 digits"])
async def test_an_execution_id_that_is_no_text_is_bad_input(engines: Callable[..., Engine], bad: Any) -> None:
    engine = engines([])
    await engine.open()
    for call in (lambda: engine.durable.signal(bad, "go"), lambda: engine.durable.cancel(bad),
                 lambda: engine.durable.get(bad)):  # fmt: skip
        with pytest.raises(BadInput, match=r"^execution id .* is not text$"):
            await call()


# ---------------------------------------------------------------------------------------
# cancel
# ---------------------------------------------------------------------------------------
async def test_cancel_a_waiting_execution_at_once_and_a_running_one_at_its_next_step(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    entered = asyncio.Event()

    async def slow() -> None:
        CALLS["slow"] += 1
        entered.set()
        await asyncio.Event().wait()  # async work in flight: cancelled

    async def sleeper(ctx: DurableContext, input: Any) -> None:
        await ctx.sleep("nap", 3600)

    async def worker(ctx: DurableContext, input: Any) -> None:
        await ctx.step("slow", slow)
        await ctx.step("after", count("after"))

    engine = engines([define_durable(name="sleeper", handler=sleeper), define_durable(name="worker", handler=worker)])
    await engine.start()
    sleeping = await engine.durable.start_execution("sleeper")
    await engine.quiesce()  # its wait is written (runs=False below would not wait for that)
    working = await engine.durable.start_execution("worker")
    await entered.wait()
    await engine.quiesce(runs=False)
    cancelled = await engine.durable.cancel(sleeping.id, by="alice")
    assert (cancelled.status, cancelled.error_tag, cancelled.error_message) == ("cancelled", "cancelled", "cancelled by alice")
    asked = await engine.durable.cancel(working.id, by="alice")
    assert asked.status in ("running", "cancelled")  # the async step in flight is cancelled at once
    await engine.quiesce()
    stopped = await engine.durable.get(working.id)
    assert stopped.status == "cancelled" and CALLS == {"slow": 1}
    with pytest.raises(Refused, match=r"has finished \(cancelled\)"):
        await engine.durable.cancel(working.id)
    with pytest.raises(NotFound):
        await engine.durable.cancel("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")


async def test_cancel_lets_a_step_on_a_thread_finish_and_stops_after_it(engines: Callable[..., Engine]) -> None:
    import threading

    release, entered = threading.Event(), threading.Event()

    def blocking() -> str:
        entered.set()
        release.wait(10)
        CALLS["blocking"] += 1
        return "done"

    async def body(ctx: DurableContext, input: Any) -> None:
        await ctx.step("blocking", blocking)
        await ctx.step("after", count("after"))

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await asyncio.to_thread(entered.wait, 10)
    await engine.durable.cancel(started.id)
    release.set()
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.status == "cancelled"
    assert [(s.name, s.status) for s in done.steps or []] == [("blocking", "succeeded")]  # it ran: checkpointed
    assert CALLS == {"blocking": 1}


# ---------------------------------------------------------------------------------------
# schedules
# ---------------------------------------------------------------------------------------
async def test_a_schedule_starts_one_execution_per_slot_with_an_id_from_the_slot(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    async def body(ctx: DurableContext, input: Any) -> Any:
        return {"input": input, "schedule": ctx.schedule, "slot": ctx.scheduled_at.isoformat() if ctx.scheduled_at else None}

    definitions = [
        define_durable(name="nightly-sync", handler=body),
        define_schedule(name="nightly", cron="0 9 * * *", timezone="UTC", durable="nightly-sync", payload={"full": True}),
    ]
    engine = engines(definitions)
    await engine.start()
    clock.set("2026-03-02T09:00:00Z")
    await engine.quiesce()
    expected = execution_id_for_slot("nightly", clock.now())
    done = await engine.durable.get(expected)
    assert (done.status, done.schedule, done.scheduled_at) == ("succeeded", "nightly", clock.now())
    assert done.output == {"input": {"full": True}, "schedule": "nightly", "slot": "2026-03-02T09:00:00+00:00"}
    # Another instance firing the same slot starts nothing new.
    again = await engine.durable.start_for_slot(
        "nightly-sync", _slot_context("nightly", clock.now())
    )
    assert again.duplicate and again.id == expected
    executions, _ = await engine.durable.list("nightly-sync")
    assert [e.id for e in executions] == [expected]
    [run] = await engine.store.list_runs("nightly", limit=5)
    assert run.status == "succeeded"


def _slot_context(name: str, slot: Any) -> Any:
    from backend.schedules import RunContext

    return RunContext(name=name, run_id="x", scheduled_at=slot, fired_at=slot, trigger="self", payload={"full": True},
                      deadline=slot)  # fmt: skip


# ---------------------------------------------------------------------------------------
# leases, crashes, takeovers
# ---------------------------------------------------------------------------------------
async def test_a_crashed_instances_execution_resumes_elsewhere_without_rerunning_finished_steps(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    entered = asyncio.Event()
    hang = {"on": True}

    async def page(n: int) -> int:
        CALLS[f"page-{n}"] += 1
        if n == 3 and hang["on"]:
            entered.set()
            await asyncio.Event().wait()
        return n

    async def body(ctx: DurableContext, input: Any) -> int:
        total = 0
        for n in range(1, 6):
            total += await ctx.step(f"page-{n}", page, n)
        return total

    function = define_durable(name="sync", handler=body)
    a = engines([function], instance="a")
    await a.start()
    started = await a.durable.start_execution("sync")
    await entered.wait()
    await crash(a)
    hang["on"] = False
    b = engines([function], instance="b")
    await b.start()
    await b.quiesce()
    assert (await b.durable.get(started.id)).status == "running"  # a's lease holds until it expires
    clock.advance(31)
    await b.quiesce()
    done = await b.durable.get(started.id)
    assert (done.status, done.output, done.instance) == ("succeeded", 15, "b")
    assert CALLS == {"page-1": 1, "page-2": 1, "page-3": 2, "page-4": 1, "page-5": 1}
    assert any("taken over by b" in line.message for line in done.logs or [])


async def test_an_execution_claimed_again_under_the_same_name_says_so_not_taken_over_from_itself(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """A process restarted under a fixed ``--instance`` name claims the execution its killed
    predecessor held: its log said "taken over by a ... the lease of a had expired"."""
    entered = asyncio.Event()
    hang = {"on": True}

    async def page(n: int) -> int:
        if n == 2 and hang["on"]:
            entered.set()
            await asyncio.Event().wait()
        return n

    async def body(ctx: DurableContext, input: Any) -> int:
        return sum([await ctx.step(f"page-{n}", page, n) for n in range(1, 4)])

    function = define_durable(name="again", handler=body)
    a = engines([function], instance="a")
    await a.start()
    started = await a.durable.start_execution("again")
    await entered.wait()
    await crash(a)
    hang["on"] = False
    clock.advance(31)
    restarted = engines([function], instance="a")
    await restarted.start()
    await restarted.quiesce()
    done = await restarted.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", 6)
    lines = [line.message for line in done.logs or []]
    assert not any("taken over" in line for line in lines), lines
    assert any(line.startswith("claimed again by a (lease 2): its lease had expired") for line in lines), lines


async def test_an_at_most_once_step_interrupted_by_a_crash_is_not_run_again(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    entered = asyncio.Event()

    async def notify() -> None:
        CALLS["notify"] += 1
        entered.set()
        await asyncio.Event().wait()

    async def body(ctx: DurableContext, input: Any) -> None:
        await ctx.step("notify", notify, at_most_once=True)

    function = define_durable(name="f", handler=body)
    a = engines([function], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await entered.wait()
    marked = await a.durable.get(started.id)
    assert [(s.name, s.status, s.at_most_once) for s in marked.steps or []] == [("notify", "running", True)]
    await crash(a)
    b = engines([function], instance="b")
    await b.start()
    clock.advance(31)
    await b.quiesce()
    failed = await b.durable.get(started.id)
    assert (failed.status, failed.error_tag) == ("failed", "at_most_once_interrupted")
    assert 'at-most-once step "notify" (position 1)' in (failed.error_message or "")
    assert CALLS == {"notify": 1}


async def test_a_displaced_owner_cannot_write(engines: Callable[..., Engine], clock: ManualClock) -> None:
    engine = engines([])
    await engine.open()
    store = cast(DurableStore, engine.store)
    now = clock.now()
    await store.durable_insert(NewExecution("01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "f", "null", now))
    [first] = await store.durable_claim("a", ["f"], now, now + timedelta(seconds=30), 10)
    assert await store.durable_claim("b", ["f"], now, now + timedelta(seconds=30), 10) == []  # held
    later = now + timedelta(seconds=31)
    [second] = await store.durable_claim("b", ["f"], later, later + timedelta(seconds=30), 10)
    assert second.execution.lease == first.execution.lease + 1 and second.execution.was_instance == "a"
    step = StepRecord(1, "one", "step", "succeeded", 1, later, later, output="1")
    stale = Write(first.execution.id, first.execution.lease, later, Progress("one", later + timedelta(seconds=30)), [step])
    assert await store.durable_write(stale) is None
    assert (await engine.durable.get(first.execution.id)).steps == []  # nothing of it landed
    fresh = Write(first.execution.id, second.execution.lease, later, Progress("one", later + timedelta(seconds=30)), [step])
    assert await store.durable_write(fresh) is False
    renewal = await store.durable_renew("a", [(first.execution.id, first.execution.lease)], later)
    assert renewal.lost == {first.execution.id}


async def test_stopping_releases_executions_to_another_instance_at_once(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    entered = asyncio.Event()
    hang = {"on": True}

    async def slow() -> str:
        CALLS["slow"] += 1
        if hang["on"]:
            entered.set()
            await asyncio.Event().wait()
        return "ok"

    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("first", count("first"))
        return await ctx.step("slow", slow)

    function = define_durable(name="f", handler=body)
    a = engines([function], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await entered.wait()
    await a.stop(grace=0)
    hang["on"] = False
    b = engines([function], instance="b")
    await b.open()
    assert (await b.durable.get(started.id)).status == "queued"
    await b.start()
    await b.quiesce()  # no lease to wait for: a let go
    done = await b.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", "ok")
    assert CALLS == {"first": 1, "slow": 2}
    assert any("released: a is stopping" in line.message for line in done.logs or [])


class Blocking:
    """A step on a thread that waits for :attr:`release`, counting its calls (``CALLS``)
    and the most that ran at once."""

    def __init__(self) -> None:
        import threading

        self.release, self.entered, self.returned = threading.Event(), threading.Event(), threading.Event()
        self.now = self.most = 0

    def __call__(self) -> str:
        self.now += 1
        self.most = max(self.most, self.now)
        CALLS["blocking"] += 1
        self.entered.set()
        self.release.wait(10)
        self.now -= 1
        self.returned.set()
        return "done"


async def test_a_stop_leaves_an_execution_whose_step_runs_on_a_thread_to_its_lease_never_beside_it(
    engines: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A thread cannot be stopped. An embedded engine stopped while a step of an execution
    ran on one handed the execution back (queued): another instance claimed it at once and
    ran the step again while the thread, in a process that goes on, still ran it."""
    blocking = Blocking()

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("blocking", blocking)

    function = define_durable(name="f", handler=body)
    a = engines([function], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await asyncio.to_thread(blocking.entered.wait, 10)
    await a.stop(grace=0)
    assert "still runs on its thread as this instance stops" in caplog.text
    b = engines([function], instance="b")
    await b.start()
    await b.quiesce()
    held = await b.durable.get(started.id)
    assert (held.status, held.instance) == ("running", "a")  # not handed back beside its thread
    assert CALLS["blocking"] == 1
    blocking.release.set()
    # The thread returns before a's lease ends (on a busy machine it may not run for a while:
    # a thread still running past the lease is the documented limit, not what this checks).
    assert await asyncio.to_thread(blocking.returned.wait, 10)
    clock.advance(31)  # a's lease (renewed for the stop's grace) has ended: b takes it over
    await b.quiesce()
    done = await b.durable.get(started.id)
    assert (done.status, done.output, done.instance) == ("succeeded", "done", "b")
    assert (CALLS["blocking"], blocking.most) == (2, 1)  # cut short, run again: never two at once


class Held:
    """An async step held until :attr:`release` is set, counting its calls (``CALLS[name]``)."""

    def __init__(self, name: str, value: Any = None) -> None:
        self.name, self.value = name, value
        self.release = asyncio.Event()
        self.called = asyncio.Event()
        """Set once it was first called."""

    async def __call__(self) -> Any:
        CALLS[self.name] += 1
        self.called.set()
        await self.release.wait()
        return self.value


async def until_recorded(engine: Engine, id_: str, *steps: tuple[str, str]) -> None:
    """Wait until the execution's recorded steps are ``steps`` (name, status): a
    ``quiesce(runs=False)`` does not wait for the answer of a checkpoint in flight."""

    async def shown() -> bool:
        execution = await engine.durable.get(id_)
        return {(step.name, step.status) for step in execution.steps or []} == set(steps)

    await until_true(shown, f"the steps recorded to be {sorted(steps)}")


async def taken_over(
    engines: Callable[..., Engine], clock: ManualClock, a: Engine, held: Held, body: Callable[..., Any]
) -> Engine:
    """``a`` dies with ``held`` in flight (never checkpointed), which then returns; ``b``
    takes the execution over once a's lease has ended, and runs it to its end."""
    await crash(a)
    held.release.set()
    b = engines([define_durable(name="f", handler=body)], instance="b")
    await b.start()
    clock.advance(60)
    await b.quiesce()
    return b


@pytest.mark.parametrize("second", ["sleep", "wait"])
async def test_a_sleep_or_a_wait_beside_a_step_in_progress_fails_the_execution_instead_of_leaving_it_running(
    engines: Callable[..., Engine], clock: ManualClock, second: str
) -> None:
    """``asyncio.gather`` of a step and a sleep or a wait: the sleep would let go of the
    execution with the step still running, and the next claim would run that step again
    beside it. Steps may run at once; a sleep or a wait runs alone: it fails the execution."""
    slow = Held("slow", "slow")

    async def body(ctx: DurableContext, input: Any) -> Any:
        others: dict[str, Callable[[], Awaitable[Any]]] = {
            "sleep": lambda: ctx.sleep("nap", 1),
            "wait": lambda: ctx.wait_for("go", timeout=1),
        }
        return await asyncio.gather(ctx.step("slow", slow), others[second]())

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    slow.release.set()
    clock.advance(5)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.error_tag) == ("failed", "concurrent_steps")
    named = {"sleep": 'sleep "nap"', "wait": 'signal "go"'}[second]
    assert done.error_message is not None and done.error_message.startswith(
        f'{named} was reached while step "slow" was still in progress: steps may run at once (asyncio.gather of '
        "steps), but a sleep or a wait runs alone")
    assert CALLS["slow"] == 1


def waiting_branches(gate: asyncio.Event, b_ended: asyncio.Event) -> Callable[..., Any]:
    """Code of two gathered branches whose steps never run at once: ``a`` waits for
    ``gate`` (anything but a step: a message, another task's result) before its one step,
    ``b`` runs two, then sets ``b_ended``; each logs around its steps. Which branch reaches
    its steps first depends on when ``gate`` opens: on a replay, whose recorded steps
    answer at once, it opens sooner."""

    async def body(ctx: DurableContext, input: Any) -> Any:
        async def a() -> Any:
            await gate.wait()
            ctx.log("a before a0")
            value = await ctx.step("a0", count("a0", "a0"))
            ctx.log("a after a0")
            return value

        async def b() -> Any:
            ctx.log("b before b0")
            first = await ctx.step("b0", count("b0", "b0"))
            ctx.log("b before b1")
            second = await ctx.step("b1", count("b1", "b1"))
            ctx.log("b after b1")
            b_ended.set()
            return [first, second]

        values = await asyncio.gather(a(), b())
        ctx.log("gathered")
        await ctx.sleep("nap", 60)
        ctx.log("after the nap")
        return values

    return body


#: In the order written: each line with the checkpoint of the next step its branch reaches
#: (a branch's last lines with the next step any branch reaches after it ended).
WAITING_BRANCH_LINES = ["b before b0", "b before b1", "b after b1", "a before a0", "a after a0", "gathered", "after the nap"]


async def test_branches_whose_steps_never_ran_at_once_replay_in_another_order(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The first time through, ``b`` ran both its steps before ``a`` reached its own; after
    the nap, the replay reaches ``a0`` first. Its steps are found by name: the execution
    ends as the code says (it failed ``nondeterministic``: ``a0`` reached at position 1,
    recorded at 3), no step runs twice, and each line is in the log once."""
    gate, b_ended = asyncio.Event(), asyncio.Event()
    engine = engines([define_durable(name="f", handler=waiting_branches(gate, b_ended))])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await b_ended.wait()  # (quiesce does not wait for a checkpoint's answer in flight)
    gate.set()
    await engine.quiesce()
    clock.advance(61)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.error_message, done.output) == ("succeeded", None, ["a0", ["b0", "b1"]])
    assert [(step.seq, step.name) for step in done.steps or []] == [(1, "b0"), (2, "b1"), (3, "a0"), (4, "nap")]
    assert (CALLS["a0"], CALLS["b0"], CALLS["b1"]) == (1, 1, 1)
    assert [line.message for line in done.logs or [] if line.message in WAITING_BRANCH_LINES] == WAITING_BRANCH_LINES


async def test_a_branchs_line_logged_before_a_crash_is_written_once_whatever_order_the_replay_takes(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """``b``'s steps are recorded; ``a`` waits for its gate, a line of its own logged only
    once the gate opens. The instance dies first; the next claim's replay, its gate open,
    reaches ``a``'s line first, while recorded positions lie ahead: each branch's lines go
    by that branch's next step (``a0``, new: written; ``b0``, recorded: written before), so
    none is lost and none is written twice."""
    gate, b_ended = asyncio.Event(), asyncio.Event()
    first = engines([define_durable(name="f", handler=waiting_branches(gate, b_ended))], instance="first")
    await first.start()
    started = await first.durable.start_execution("f")
    await b_ended.wait()  # (b1's checkpoint answered: quiesce does not wait for it)
    assert (CALLS["b0"], CALLS["b1"], CALLS["a0"]) == (1, 1, 0)
    await crash(first)
    gate.set()
    second = engines([define_durable(name="f", handler=waiting_branches(gate, b_ended))], instance="second")
    await second.start()
    clock.advance(60)  # past the first's lease
    await second.quiesce()
    clock.advance(61)  # past the nap
    await second.quiesce()
    done = await second.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["a0", ["b0", "b1"]])
    assert (CALLS["a0"], CALLS["b0"], CALLS["b1"]) == (1, 1, 1)
    mine = [line.message for line in done.logs or [] if line.message in WAITING_BRANCH_LINES]
    assert sorted(mine) == sorted(WAITING_BRANCH_LINES), mine


async def test_a_line_logged_before_a_step_goes_with_that_steps_checkpoint_not_a_siblings(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two branches gathered, each logging a line before its step. The fast one's checkpoint
    commits while the slow one still runs, and the instance dies: the slow branch's line
    did not go with its sibling's checkpoint (the replay, which runs that step again, logs
    it again), so each line is in the log once."""
    held = Held("held", "held")

    async def body(ctx: DurableContext, input: Any) -> Any:
        async def slow() -> Any:
            ctx.log("before held")
            return await ctx.step("held", held)

        async def fast() -> Any:
            ctx.log("before fast")
            return await ctx.step("fast", count("fast", "fast"))

        return await asyncio.gather(slow(), fast())

    a = engines([define_durable(name="f", handler=body)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await until_recorded(a, started.id, ("fast", "succeeded"))
    b = await taken_over(engines, clock, a, held, body)
    done = await b.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["held", "fast"])
    assert (CALLS["held"], CALLS["fast"]) == (2, 1)
    lines = [line.message for line in done.logs or []]
    assert (lines.count("before held"), lines.count("before fast")) == (1, 1), lines


async def test_a_line_logged_inside_a_gathered_steps_function_goes_with_that_steps_checkpoint_not_a_siblings(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two steps gathered; the slow one's function logs a line, then waits. The fast one's
    checkpoint commits, and the instance dies before the slow one's does: the line did not
    go with its sibling's checkpoint (the replay, which runs that step again, logs it
    again), so it is in the log once."""
    held = Held("held", "held")

    async def body(ctx: DurableContext, input: Any) -> Any:
        async def logs_then_waits() -> Any:
            ctx.log("inside held")
            return await held()

        return await asyncio.gather(ctx.step("held", logs_then_waits), ctx.step("fast", count("fast", "fast")))

    a = engines([define_durable(name="f", handler=body)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await until_recorded(a, started.id, ("fast", "succeeded"))
    b = await taken_over(engines, clock, a, held, body)
    done = await b.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["held", "fast"])
    assert (CALLS["held"], CALLS["fast"]) == (2, 1)
    assert [line.message for line in done.logs or []].count("inside held") == 1, done.logs


async def test_a_line_logged_on_a_sync_steps_thread_or_in_a_task_its_function_started_goes_with_that_step() -> None:
    """Where a step's function logs from (the thread a sync one runs on, a task an async one
    starts), the line goes with that step's record, not with a write of another step's,
    and a line handed over from a thread comes before what the thread returns."""
    lines = ExecutionLines()

    def on_the_thread() -> str:
        lines.hold("on the thread")
        return "returned"

    async def child() -> None:
        lines.hold("in a task it started")

    async def function() -> None:
        await asyncio.create_task(child())

    assert await asyncio.to_thread(lines.on_thread, "sync", on_the_thread, ()) == "returned"
    assert lines.entries == [("sync", "on the thread")]  # (handed over before the thread's return was)
    token = lines.inside("async")
    try:
        await function()
    finally:
        lines.outside(token)
    lines.hold("the code's own")  # (held by its task until it reaches a step)
    at = datetime(2026, 3, 2, tzinfo=UTC)

    def record(name: str) -> StepRecord:
        return StepRecord(1, name, "step", "succeeded", 1, at, at)

    assert lines.take([record("sibling")])[1] == []
    assert lines.take([record("sync"), record("async")])[1] == ["on the thread", "in a task it started"]


async def test_branches_of_steps_gathered_replay_by_name_whatever_order_their_steps_were_reached_in(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two branches of two steps each, gathered: the positions their second steps take
    depend on which first step ended first. A replay reaches them in another order (a
    recorded step returns at once): found by position, store-0 would meet fetch-1's record
    and fail the execution as changed. An execution whose steps ran at once is replayed by
    name (its checkpoints say so), and only what did not finish runs again."""
    held = Held("store-0", "stored 0")

    async def body(ctx: DurableContext, input: Any) -> Any:
        async def branch(i: int) -> Any:
            fetched = await ctx.step(f"fetch-{i}", count(f"fetch-{i}", i))
            return await ctx.step(f"store-{i}", held if i == 0 else count(f"store-{i}", f"stored {fetched}"))

        return await asyncio.gather(branch(0), branch(1))

    a = engines([define_durable(name="f", handler=body)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await until_recorded(a, started.id, ("fetch-0", "succeeded"), ("fetch-1", "succeeded"), ("store-1", "succeeded"))
    # (store-0 in flight)
    b = await taken_over(engines, clock, a, held, body)
    done = await b.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["stored 0", "stored 1"])
    assert (CALLS["fetch-0"], CALLS["fetch-1"], CALLS["store-1"], CALLS["store-0"]) == (1, 1, 1, 2)
    assert len({step.seq for step in done.steps or []}) == 4  # each its own position


@pytest.mark.parametrize("how", ["awaited", "on a task", "on a thread's loop"])
async def test_a_step_reached_inside_another_steps_function_fails_the_execution(
    engines: Callable[..., Engine], clock: ManualClock, how: str
) -> None:
    """A step's function that reaches a step of its own: the outer cannot end before the
    inner, whose retry would wait for the outer to end. Not gathered beside it but inside
    it: it fails the execution, naming both, and neither runs again. Also reached on a task
    the outer's function started (taken for a gathered sibling, it ran, and a retry's wait
    of the inner hung the execution for good, the outer awaiting it) or on an event loop a
    sync outer's thread ran (not seen inside at all: both ran and were recorded)."""

    async def body(ctx: DurableContext, input: Any) -> Any:
        async def outer() -> Any:
            CALLS["outer"] += 1
            if how == "on a task":
                return await asyncio.create_task(ctx.step("inner", count("inner", 1)))
            return await ctx.step("inner", count("inner", 1))

        def sync_outer() -> Any:
            CALLS["outer"] += 1
            return asyncio.run(ctx.step("inner", count("inner", 1)))

        return await ctx.step("outer", sync_outer if how == "on a thread's loop" else outer)

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.error_tag) == ("failed", "concurrent_steps")
    assert done.error_message is not None
    assert done.error_message.startswith('step "inner" was reached inside step "outer"')
    assert "a step's function cannot reach a step, a sleep or a wait of its execution" in done.error_message
    assert (CALLS["outer"], CALLS["inner"]) == (1, 0)
    assert [step.name for step in done.steps or []] == []


async def test_a_step_reached_on_a_threads_own_event_loop_is_refused_with_what_to_do(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The code starts a thread that reaches a step on an event loop of its own
    (``asyncio.run``): the step's bookkeeping and writes belong to the code's loop (on
    SQLite it ran and was recorded from the other thread; on PostgreSQL the execution
    failed "got Future attached to a different loop"). It is refused, saying what to do;
    from that thread through the code's loop, it runs."""
    async def body(ctx: DurableContext, input: Any) -> Any:
        loop = asyncio.get_running_loop()

        def worker(own_loop: bool) -> Any:
            step = ctx.step("own" if own_loop else "handed", count("step", 1))
            return asyncio.run(step) if own_loop else asyncio.run_coroutine_threadsafe(step, loop).result()

        handed = await asyncio.to_thread(worker, False)
        try:
            await asyncio.to_thread(worker, True)
        except RuntimeError as exc:
            return [handed, str(exc)]
        return [handed, "ran"]

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert done.status == "succeeded"
    assert done.output == [1, f'step "own" of execution {started.id} was reached on another event loop than its '
                              "code's: await it from the code (or from a thread with asyncio.run_coroutine_threadsafe"
                              "(..., the code's loop))"]  # fmt: skip
    assert [(step.name, step.status) for step in done.steps or []] == [("handed", "succeeded")]
    assert CALLS["step"] == 1


async def test_gathered_steps_run_at_once_and_a_retrys_wait_waits_for_the_others_to_end(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two steps at once, one of them failing its first attempts: its retry's wait is
    written only once the other has ended and is checkpointed, so the execution never lets
    go of a step still running (the next claim would run it again beside itself)."""
    slow = Held("slow", "slow")

    flaky = fails_first("flaky", 2, "flaky")
    async def body(ctx: DurableContext, input: Any) -> Any:
        return await asyncio.gather(
            ctx.step("slow", slow), ctx.step("flaky", flaky, retry=Retry(attempts=3, initial_delay=1, max_delay=1))
        )

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce(runs=False)
    # flaky's first attempt failed at once; its wait is not written while slow runs.
    running = await engine.durable.get(started.id)
    assert (running.status, CALLS["slow"], CALLS["flaky"]) == ("running", 1, 1)
    slow.release.set()
    await engine.quiesce()
    waiting = await engine.durable.get(started.id)
    assert (waiting.status, waiting.waiting_for) == ("waiting", "retry:flaky")
    assert {(step.name, step.status) for step in waiting.steps or []} == {("slow", "succeeded"), ("flaky", "waiting")}
    for _ in range(2):
        clock.advance(2)
        await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["slow", "flaky"])
    assert (CALLS["slow"], CALLS["flaky"]) == (1, 3)  # the finished step never ran again


async def test_a_step_reached_while_a_retrys_wait_is_written_does_not_start(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two steps at once, the first failing its first attempt at once (an async step): its
    retry's wait is written with no other step in progress. A step reached while that
    write was in flight started all the same: the execution was let go of with it running
    (its outcome recorded nowhere: its failed attempts never counted), and the next claim
    ran it again beside itself. It does not start: it runs after the wait, once."""
    slow = Held("slow", "slow")

    async def flaky() -> str:
        CALLS["flaky"] += 1
        if CALLS["flaky"] == 1:
            raise ConnectionError("reset")
        return "flaky"

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await asyncio.gather(
            ctx.step("flaky", flaky, retry=Retry(attempts=3, initial_delay=1, max_delay=1)), ctx.step("slow", slow)
        )

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    waiting = await engine.durable.get(started.id)
    assert (waiting.status, waiting.waiting_for, CALLS["flaky"], CALLS["slow"]) == ("waiting", "retry:flaky", 1, 0)
    slow.release.set()
    clock.advance(1)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["flaky", "slow"])
    assert (CALLS["flaky"], CALLS["slow"]) == (2, 1)


async def test_a_step_reached_while_another_waits_to_leave_the_code_does_not_start(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """One step failed and waits to leave the code for its retry, a slow one still runs,
    and a third branch reaches a step: it does not start (the execution is about to let
    go); it runs after the wait, on the next claim."""
    slow, go = Held("slow", "slow"), asyncio.Event()

    flaky = fails_first("flaky", 1, "flaky")
    async def body(ctx: DurableContext, input: Any) -> Any:
        async def later() -> Any:
            await go.wait()
            return await ctx.step("late", count("late", "late"))

        return await asyncio.gather(
            ctx.step("slow", slow), ctx.step("flaky", flaky, retry=Retry(attempts=2, initial_delay=1, max_delay=1)), later()
        )

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce(runs=False)
    go.set()  # flaky waits to leave (slow runs): late is reached now
    await engine.quiesce(runs=False)
    assert (CALLS["slow"], CALLS["flaky"], CALLS["late"]) == (1, 1, 0)
    slow.release.set()
    await engine.quiesce()
    waiting = await engine.durable.get(started.id)
    assert (waiting.status, waiting.waiting_for) == ("waiting", "retry:flaky")
    assert {(step.name, step.status) for step in waiting.steps or []} == {("slow", "succeeded"), ("flaky", "waiting")}
    clock.advance(2)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["slow", "flaky", "late"])
    assert (CALLS["slow"], CALLS["flaky"], CALLS["late"]) == (1, 2, 1)


async def test_gathered_steps_that_finished_before_a_crash_are_not_run_again(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Of three steps gathered, two finished (checkpointed) and one was in flight when the
    instance died: the next claim runs that one only, and each takes its own position."""
    held = Held("held", "held")

    async def body(ctx: DurableContext, input: Any) -> Any:
        values = await asyncio.gather(
            ctx.step("one", count("one", 1)), ctx.step("held", held), ctx.step("three", count("three", 3))
        )
        return [*values, await ctx.step("after", count("after", "after"))]

    a = engines([define_durable(name="f", handler=body)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await a.quiesce(runs=False)
    assert (CALLS["one"], CALLS["held"], CALLS["three"]) == (1, 1, 1)
    b = await taken_over(engines, clock, a, held, body)
    done = await b.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", [1, "held", 3, "after"])
    assert (CALLS["one"], CALLS["held"], CALLS["three"], CALLS["after"]) == (1, 2, 1, 1)
    # Each its own position; held, run again after the crash, takes one after those recorded.
    assert [(step.seq, step.name) for step in done.steps or []] == [(1, "one"), (3, "three"), (4, "held"), (5, "after")]


async def test_a_task_group_whose_step_failed_cancels_its_sibling_step_which_a_retry_runs_again(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Steps in an ``asyncio.TaskGroup``: one fails for good, the group cancels the other
    in flight. The cancelled step is not recorded finished (its work did not end), the
    execution fails naming the step's error, and a retry runs both again; a step that had
    finished before is not run again."""
    slow, broken = Held("slow", "slow"), fails_first("broken", 1, "mended")
    async def body(ctx: DurableContext, input: Any) -> Any:
        first = await ctx.step("first", count("first", 1))
        async with asyncio.TaskGroup() as group:
            waited = group.create_task(ctx.step("slow", slow))
            await asyncio.sleep(0)  # (slow starts first)
            failing = group.create_task(ctx.step("broken", broken, retry=False))
        return [first, waited.result(), failing.result()]

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag) == ("failed", "ExceptionGroup")
    assert failed.error_message == (
        'unhandled errors in a TaskGroup (1 sub-exception): StepFailed: step "broken" (position 3) failed (one attempt): '
        "RuntimeError: broken"
    )
    assert {(step.name, step.status) for step in failed.steps or []} == {("first", "succeeded"), ("broken", "failed")}
    slow.release.set()
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", [1, "slow", "mended"])
    assert (CALLS["first"], CALLS["slow"], CALLS["broken"]) == (1, 2, 2)


async def test_a_retry_runs_again_every_step_whose_failure_failed_the_execution(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two gathered steps both fail for good, and the code raises their failure: the
    execution fails. A retry ran only the one whose failure was raised last, and the
    other's failure, replayed from its checkpoint, failed the execution again at once
    without a call (a retry that did nothing anyone asked for: a second one was needed).
    Both run again, each once; the step that had succeeded does not."""
    one, two = fails_first("one", 1, "one mended"), fails_first("two", 1, "two mended")

    async def body(ctx: DurableContext, input: Any) -> Any:
        first = await ctx.step("first", count("first", 1))
        pair = await asyncio.gather(
            ctx.step("one", one, retry=False), ctx.step("two", two, retry=False), return_exceptions=True
        )
        for outcome in pair:
            if isinstance(outcome, StepFailed):
                raise outcome
        return [first, *pair]

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert failed.status == "failed"
    assert {(step.name, step.status) for step in failed.steps or []} == {
        ("first", "succeeded"), ("one", "failed"), ("two", "failed")
    }
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.error_message, done.output) == ("succeeded", None, [1, "one mended", "two mended"])
    assert (CALLS["first"], CALLS["one"], CALLS["two"]) == (1, 2, 2)


async def test_an_end_waits_for_a_siblings_checkpoint_on_its_way(engines: Callable[..., Engine], clock: ManualClock) -> None:
    """Two gathered steps: one fails for good as the other succeeds, whose checkpoint is
    slow to commit (a busy store). The execution's end, written at once, landed first and
    refused that checkpoint: the step that had succeeded ran again on a retry. The end
    waits for the checkpoints on their way; the retry runs the failed step alone."""
    async def flaky() -> str:
        CALLS["flaky"] += 1
        if CALLS["flaky"] == 1:
            raise RuntimeError("flaky failed")
        return "flaky"

    async def succeeds() -> str:  # (async: its checkpoint is sent before flaky starts)
        CALLS["done"] += 1
        return "done"

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await asyncio.gather(ctx.step("done", succeeds, retry=False), ctx.step("flaky", flaky, retry=False))

    engine = engines([define_durable(name="f", handler=body)])
    store: Any = engine.store
    write = store.durable_write
    ended = asyncio.Event()

    async def slow_checkpoint(w: Write) -> Any:
        if isinstance(w.then, Finish):
            try:
                return await write(w)
            finally:
                ended.set()
        if any(record.name == "done" for record in w.steps):
            # Held until the end has landed, or until the end waits for it (as it now does).
            run = engine.durable.executor.running[w.id]
            await until_true(lambda: ended.is_set() or getattr(run, "_answered", None) is not None, "the end, or its wait")
        return await write(w)

    store.durable_write = slow_checkpoint
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert failed.status == "failed"
    assert {(step.name, step.status) for step in failed.steps or []} == {("done", "succeeded"), ("flaky", "failed")}
    store.durable_write = write
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", ["done", "flaky"])
    assert (CALLS["done"], CALLS["flaky"]) == (1, 2)


@pytest.mark.parametrize("failing", ["a step", "the code"])
async def test_an_at_most_once_step_whose_mark_is_answered_after_the_code_failed_is_run_by_a_retry(
    engines: Callable[..., Engine], clock: ManualClock, failing: str
) -> None:
    """Gathered: a step that fails for good, then an at-most-once one whose started mark is
    slow to be answered; the code fails meanwhile, so the at-most-once step is not called.
    Its mark, left started, made a retry fail the execution ``at_most_once_interrupted``,
    asking a person about a call that never happened. The end records it failed, not
    called; a retry calls it, once, and the execution succeeds."""
    broken = fails_first("broken", 1, "mended")

    async def pay() -> str:
        CALLS["pay"] += 1
        return "paid"

    async def code_fails() -> str:  # (the code's own, no step: fails once the mark is sent)
        CALLS["broken"] += 1
        await asyncio.sleep(0)
        if CALLS["broken"] == 1:
            raise ValueError("the code failed")
        return "mended"

    async def body(ctx: DurableContext, input: Any) -> Any:
        first = ctx.step("broken", broken, retry=False) if failing == "a step" else code_fails()
        return await asyncio.gather(first, ctx.step("pay", pay, at_most_once=True))

    engine = engines([define_durable(name="f", handler=body)])
    store: Any = engine.store
    write = store.durable_write

    async def slow_mark(w: Write) -> Any:
        if any(record.name == "pay" and record.status == "running" for record in w.steps):
            # Answered once the code has failed and its end waits for this answer.
            run = engine.durable.executor.running[w.id]
            landed = await write(w)
            await until_true(lambda: getattr(run, "_answered", None) is not None, "the end to wait for the mark")
            return landed
        return await write(w)

    store.durable_write = slow_mark
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, CALLS["pay"]) == ("failed", 0)
    recorded = {("broken", "failed"), ("pay", "failed")} if failing == "a step" else {("pay", "failed")}
    assert {(step.name, step.status) for step in failed.steps or []} == recorded
    store.durable_write = write
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.error_tag, done.output) == ("succeeded", None, ["mended", "paid"])
    assert (CALLS["broken"], CALLS["pay"]) == (2, 1)


async def test_an_at_most_once_step_a_task_group_cancelled_is_left_to_a_person(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """An at-most-once step in flight is cancelled by its ``TaskGroup`` when a sibling
    fails: it may have happened. A retry does not call it again but fails
    ``at_most_once_interrupted`` naming it; a second retry (a person knows it did not
    happen) calls it."""
    charge, broken = Held("charge", "charged"), fails_first("broken", 1, "mended")

    async def body(ctx: DurableContext, input: Any) -> Any:
        async with asyncio.TaskGroup() as group:
            charged = group.create_task(ctx.step("charge", charge, at_most_once=True))
            # (charge called, so in flight as it fails, before broken starts: a sleep(0) let
            # broken fail first on a loaded machine, while charge's mark was being written)
            await charge.called.wait()
            mended = group.create_task(ctx.step("broken", broken, retry=False))
        return [charged.result(), mended.result()]

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag, CALLS["charge"]) == ("failed", "ExceptionGroup", 1)
    charge.release.set()
    await engine.durable.retry(started.id)
    await engine.quiesce()
    interrupted = await engine.durable.get(started.id)
    assert (interrupted.status, interrupted.error_tag, CALLS["charge"]) == ("failed", "at_most_once_interrupted", 1)
    assert 'step "charge"' in (interrupted.error_message or "") and "or the code cancelled it" in (interrupted.error_message or "")
    await engine.durable.retry(started.id)
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output, CALLS["charge"], CALLS["broken"]) == ("succeeded", ["charged", "mended"], 2, 2)


def answer_held_after_commit(engine: Engine, step: str, then: Callable[[], None]) -> None:
    """The write that records ``step`` commits, and its answer is held: ``then`` runs, and
    the write's caller waits until it is cancelled (a commit whose answer is slow to come)."""
    store: Any = engine.store
    write = store.durable_write

    async def held(w: Write) -> Any:
        answer = await write(w)
        if any(record.name == step and record.status == "succeeded" for record in w.steps):
            then()
            await asyncio.Event().wait()
        return answer

    store.durable_write = held


async def test_code_cancelled_while_a_steps_checkpoint_is_in_flight_goes_on_from_what_the_store_holds(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The code bounds a step with a timeout, which fires while the step's checkpoint is in
    flight (its commit waited for the execution's row, its answer was slow). The commit
    landed: the code, told the step timed out, would take its fallback, where every replay
    finds the step recorded and takes the other way. The execution is handed back instead,
    and the next claim goes on from the step's value: the fallback never runs."""
    bounds: list[asyncio.Timeout] = []

    async def body(ctx: DurableContext, input: Any) -> Any:
        try:
            async with asyncio.timeout(None) as bound:
                bounds.append(bound)
                seen = ["value", await ctx.step("a", count("a", "A"))]
        except TimeoutError:
            seen = ["timed out", await ctx.step("fallback", count("fallback", "FB"))]
        return seen

    engine = engines([define_durable(name="f", handler=body)])
    answer_held_after_commit(engine, "a", lambda: bounds[-1].reschedule(asyncio.get_running_loop().time()))
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output, CALLS["a"], CALLS["fallback"]) == ("succeeded", ["value", "A"], 1, 0)
    lines = [line.message for line in done.logs or []]
    assert any(line.startswith('handed back: the code was cancelled while the write of step "a"') for line in lines), lines


async def test_a_task_group_that_cancels_a_step_whose_checkpoint_is_in_flight_hands_the_execution_back(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """A ``TaskGroup``'s other task fails while a step's checkpoint is in flight, and the
    group cancels the step. The code catches the group's failure and undoes what the step
    did if it finished, or records that it did not: the commit landed, so a replay finds
    the step finished. The execution is handed back; the code goes on from the store's
    word: the step finished, it is undone, and "not done" is never recorded."""
    broke = asyncio.Event()

    async def broken() -> None:
        await broke.wait()
        raise RuntimeError("broken")

    async def body(ctx: DurableContext, input: Any) -> Any:
        try:
            async with asyncio.TaskGroup() as group:
                first = group.create_task(ctx.step("a", count("a", "A")))
                group.create_task(ctx.step("broken", broken, retry=False))
        except* StepFailed:
            pass
        else:
            return "whole"
        if first.cancelled():
            return await ctx.step("not done", count("not done", "a never finished"))
        return await ctx.step("undo", count("undo", f"undid {first.result()}"))

    engine = engines([define_durable(name="f", handler=body)])
    answer_held_after_commit(engine, "a", broke.set)
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    done = await engine.durable.get(started.id)
    assert (done.status, done.output) == ("succeeded", "undid A"), done
    assert (CALLS["a"], CALLS["undo"], CALLS["not done"]) == (1, 1, 0)


async def test_an_execution_failed_with_a_step_in_flight_ends_once_that_step_has_returned(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """The other branch of a ``gather`` failed the execution while a step ran on a thread:
    its end was written at once, and a retry ran that step again beside the thread. The
    end waits for the thread (the lease renewed meanwhile)."""
    blocking = Blocking()

    def broken() -> None:
        CALLS["broken"] += 1
        raise RuntimeError("broken")

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await asyncio.gather(ctx.step("blocking", blocking), ctx.step("broken", broken, retry=False))

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await asyncio.to_thread(blocking.entered.wait, 10)
    clock.advance(60)  # past a lease that was not renewed
    await engine.quiesce(runs=False)
    running = await engine.durable.get(started.id)
    assert (running.status, running.error_tag) == ("running", None)  # its step still runs: not ended
    blocking.release.set()
    await engine.quiesce()  # (the thread returns; then the end is written)
    failed = await engine.durable.get(started.id)
    assert (failed.status, failed.error_tag, failed.current_step) == ("failed", "RuntimeError", "broken")
    await engine.durable.retry(started.id)
    await engine.quiesce()
    assert (CALLS["blocking"], CALLS["broken"], blocking.most) == (2, 2, 1)


async def test_stopping_when_the_last_run_ends_during_the_final_renewal(
    engines: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # stop() renews the leases it holds before waiting for the runs; a run that ends during
    # that renewal once left nothing to wait for, asyncio.wait() refused the empty set, and
    # the engine never closed its store (a real serve then hung on exit).
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        entered.set()
        await release.wait()
        return "ok"

    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("slow", slow)
        return await ctx.step("after", count("after"))

    a = engines([define_durable(name="f", handler=body)], instance="a")
    await a.start()
    started = await a.durable.start_execution("f")
    await entered.wait()
    executor = a.durable.executor
    renew = cast(DurableStore, a.store).durable_renew

    async def renew_while_the_run_ends(*args: Any) -> Any:
        renewal = await renew(*args)
        if executor.stopping:
            release.set()
            await asyncio.wait(set(executor._drives))  # the run checkpoints, then lets go
        return renewal

    monkeypatch.setattr(a.store, "durable_renew", renew_while_the_run_ends)
    with caplog.at_level("ERROR"):
        await a.stop(grace=5)
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert release.is_set()
    b = engines([define_durable(name="f", handler=body)], instance="b")
    await b.open()
    released = await b.durable.get(started.id)
    assert released.status == "queued"
    assert [(step.name, step.status) for step in released.steps or []] == [("slow", "succeeded")]
    assert CALLS == {}


async def test_a_part_failing_to_stop_still_closes_the_store(
    engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(ctx: DurableContext, input: Any) -> None:
        return None

    engine = engines([define_durable(name="f", handler=body)], instance="a")
    await engine.start()

    async def broken(grace: float) -> None:
        raise RuntimeError("stop failed (test)")

    monkeypatch.setattr(engine.durable, "stop", broken)
    with caplog.at_level("ERROR"):
        await engine.stop(grace=0)
    assert not engine.life.opened  # the store was closed: nothing is left to outlive the loop
    assert any("stop failed (test)" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")


async def test_two_instances_never_run_one_execution_at_once(engines: Callable[..., Engine], clock: ManualClock) -> None:
    running: set[str] = set()
    overlaps: list[str] = []

    async def step(ctx_id: str) -> None:
        if ctx_id in running:
            overlaps.append(ctx_id)
        running.add(ctx_id)
        await asyncio.sleep(0)
        running.discard(ctx_id)

    async def body(ctx: DurableContext, input: Any) -> None:
        for i in range(5):
            await ctx.step(f"s{i}", step, ctx.id)

    function = define_durable(name="f", handler=body)
    a, b = engines([function], instance="a"), engines([function], instance="b")
    await a.start()
    await b.start()
    ids = [(await a.durable.start_execution("f")).id for _ in range(20)]
    await a.quiesce()
    await b.quiesce()
    statuses = Counter([(await a.durable.get(i)).status for i in ids])
    assert statuses == {"succeeded": 20} and overlaps == []


# ---------------------------------------------------------------------------------------
# operations: bad input and paging
# ---------------------------------------------------------------------------------------
async def test_operations_refuse_bad_input_naming_it(engines: Callable[..., Engine]) -> None:
    async def body(ctx: DurableContext, input: Any) -> None:
        await ctx.sleep("nap", 60)

    engine = engines([define_durable(name="f", handler=body)])
    await engine.open()
    with pytest.raises(NotFound, match='no durable function named "nope" \\(defined here: f\\)'):
        await engine.durable.start_execution("nope")
    with pytest.raises(BadInput, match="input is not JSON"):
        await engine.durable.start_execution("f", {1, 2})
    with pytest.raises(BadInput, match="the limit is 262,144 bytes"):
        await engine.durable.start_execution("f", "x" * 300_000)
    started = await engine.durable.start_execution("f")
    with pytest.raises(BadInput, match="signal name"):
        await engine.durable.signal(started.id, "bad name")
    with pytest.raises(NotFound, match='no execution with id "nope"'):
        await engine.durable.get("nope")
    with pytest.raises(BadInput, match='status "done" is not one of'):
        await engine.durable.list(status="done")
    with pytest.raises(BadInput, match="limit 0 is out of range"):
        await engine.durable.list(limit=0)


async def test_list_pages_newest_first_and_filters(engines: Callable[..., Engine], clock: ManualClock) -> None:
    async def body(ctx: DurableContext, input: Any) -> None:
        pass

    engine = engines([define_durable(name="f", handler=body), define_durable(name="g", handler=body)])
    await engine.open()
    ids = []
    for i in range(5):
        clock.advance(1)
        ids.append((await engine.durable.start_execution("f" if i % 2 == 0 else "g")).id)
    page, more = await engine.durable.list(limit=2)
    assert [e.id for e in page] == ids[:2:-1] and more == ids[3]
    page, more = await engine.durable.list(limit=2, before=more)
    assert [e.id for e in page] == [ids[2], ids[1]]
    only_f, _ = await engine.durable.list("f")
    assert [e.id for e in only_f] == [ids[4], ids[2], ids[0]]
    queued, _ = await engine.durable.list(status="queued", limit=100)
    assert len(queued) == 5


async def test_the_sweep_for_an_earlier_process_of_our_name_spares_a_claim_in_flight(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    # The registry calls our own instance name gone (an earlier process used it): its
    # leases are freed. A claim this process has just made, not yet running here, must
    # keep its lease, or the execution would be claimed (and run) a second time.
    async def body(ctx: DurableContext, input: Any) -> None:
        pass

    function = define_durable(name="f", handler=body)
    before = engines([function], instance="a")  # the earlier process
    await before.open()
    earlier = await before.durable.start_execution("f")
    now = clock.now()
    [old] = await cast(DurableStore, before.store).durable_claim("a", ["f"], now, now + timedelta(seconds=30), 1)
    await crash(before)
    clock.advance(1)
    engine = engines([function], instance="a")  # this process, same name
    await engine.open()
    store = cast(DurableStore, engine.store)
    mine = await engine.durable.start_execution("f")
    now = clock.now()
    [new] = await store.durable_claim("a", ["f"], now, now + timedelta(seconds=30), 1)  # its claim, in flight
    assert (old.execution.id, new.execution.id) == (earlier.id, mine.id)
    await engine.durable.executor.maintain(now)
    assert [c.execution.id for c in await store.durable_claim("b", ["f"], now, now + timedelta(seconds=30), 5)] == [earlier.id]


async def test_a_signal_sent_after_the_deadline_by_a_clock_ahead_does_not_count(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    # A client whose clock runs an hour ahead signals a wait of 10 minutes: by the times
    # recorded, the signal came after the wait's deadline. The wait must neither take it
    # nor be woken for it over and over (the replay would refuse it every time).
    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.sleep("first", 60)
        return await ctx.wait_for("go", timeout=600)

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    store = cast(DurableStore, engine.store)
    await store.durable_signal(started.id, "go", '"late"', clock.now() + timedelta(hours=1))
    clock.advance(60)
    await asyncio.wait_for(engine.quiesce(), 10)
    waiting = await engine.durable.get(started.id)
    assert (waiting.status, waiting.waiting_for, waiting.wake_at) == ("waiting", "signal:go", clock.now() + timedelta(seconds=600))
    clock.advance(600)
    await engine.quiesce()
    assert (await engine.durable.get(started.id)).output is None


async def test_time_that_passes_during_a_claim_is_not_lost(engines: Callable[..., Engine], clock: ManualClock) -> None:
    # The executor looks at the clock, claims, then parks until its next round. If the
    # clock moved while it claimed, a wait that became due meanwhile must be claimed at
    # once, not a poll interval after the new time (on a ManualClock: never).
    async def body(ctx: DurableContext, input: Any) -> str:
        await ctx.sleep("nap", 60)
        return "woke"

    engine = engines([define_durable(name="f", handler=body)])
    await engine.start()
    started = await engine.durable.start_execution("f")
    await engine.quiesce()
    store: Any = engine.store
    claim = store.durable_claim

    async def slow_claim(*args: Any) -> Any:
        result = await claim(*args)
        if clock.now() < started_at + timedelta(seconds=60):
            clock.advance(60)  # the minute passes while this claim is on its way
        return result

    started_at = clock.now()
    store.durable_claim = slow_claim
    engine.durable.executor.poke()
    await engine.quiesce()
    assert (await engine.durable.get(started.id)).output == "woke"


async def test_a_cancel_heard_when_an_at_most_once_step_is_marked_stops_it_before_it_runs(
    engines: Callable[..., Engine],
) -> None:
    """An operator cancels from another process while the code is between two steps, the
    next one at most once (the charge the cancel is meant to prevent). Its owner hears of
    the cancel in the answer to the step's started mark: the step never runs, and the
    execution ends cancelled (the step ran, and the execution succeeded)."""
    between, gate, calls = asyncio.Event(), asyncio.Event(), []

    async def prepare() -> int:
        return 1

    async def charge() -> str:
        calls.append("charge")
        return "charged"

    async def body(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("prepare", prepare)
        between.set()
        await gate.wait()  # (the code between two steps)
        return await ctx.step("charge", charge, at_most_once=True)

    function = define_durable(name="pay", handler=body)
    owner, operator = engines([function], instance="owner"), engines([function], instance="operator")
    await owner.start()
    await operator.open()  # (another process: it tells the owner through the store only)
    started = await owner.durable.start_execution("pay")
    await asyncio.wait_for(between.wait(), 10)
    asked = await operator.durable.cancel(started.id)
    assert asked.status == "running"  # asked to stop at its next step
    gate.set()
    await owner.quiesce()
    done = await owner.durable.get(started.id)
    assert calls == [] and done.status == "cancelled", (calls, done.status)


@pytest.mark.postgres
async def test_a_signal_that_waits_for_its_executions_end_is_refused_not_called_a_duplicate(
    pg_server: Any, tmp_path: Path, clock: ManualClock
) -> None:
    """A signal sent while the owner's end holds the execution's row: once the end commits,
    the signal is not taken (the execution takes no more), and says so. It read the status
    as it was before the end, and answered a duplicate of a signal never kept (audited so)."""
    import psycopg

    async def body(ctx: DurableContext, input: Any) -> Any:
        return await ctx.wait_for("approval")

    url = pg.database_for(tmp_path)
    engine = Engine([define_durable(name="flow", handler=body)], url, clock=clock, instance="i0", shutdown_grace=0)
    await engine.open()  # (no executor: the execution stays queued, its end written below by hand)
    try:
        started = await engine.durable.start_execution("flow")
        async with await psycopg.AsyncConnection.connect(url) as ending:
            await ending.execute("UPDATE schedtui_durable_executions SET status = 'succeeded' WHERE id = %s", (started.id,))
            signal = asyncio.ensure_future(engine.durable.signal(started.id, "approval", {"by": "ops"}))
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
                for _ in range(500):  # until the signal waits for the end's lock on the row
                    row = await (await watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )).fetchone()  # fmt: skip
                    if row is not None and row[0] >= 1:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the signal never waited for the end")
            await ending.commit()
        with pytest.raises(Refused, match="is succeeded; it takes no more signals"):
            await signal
        entries = (await engine.audit.list()).entries
        assert [e.action for e in entries if e.action == "durable.signal"] == []
    finally:
        await engine.stop(grace=0)


async def test_a_renewal_that_lands_late_never_shortens_a_lease(
    engines: Callable[..., Engine], clock: ManualClock, durable_url: str
) -> None:
    """Two renewals of one lease in flight at once (the loop's, held up; a step's, past
    ``held_until``) commit in either order on PostgreSQL's connections: the older one's end,
    landing last, moved the lease's end back, under what its owner counts as held."""
    a, started, gate = await _held_between_steps(engines, "late")
    store: Any = a.store
    [run] = a.durable.executor.running.values()
    later, earlier = clock.now() + timedelta(seconds=60), clock.now() + timedelta(seconds=30)
    for until in (later, earlier):  # the newer renewal commits first, the older one after it
        renewal = await store.durable_renew("a", [(run.id, run.lease)], until)
        assert run.id not in renewal.lost
    if durable_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(durable_url.removeprefix("sqlite:///"))) as conn:
            row = conn.execute("SELECT lease_until FROM durable_executions WHERE id = ?", (started.id,)).fetchone()
        until_now = datetime.fromtimestamp(row[0] / 1e6, UTC)
    else:
        with psycopg.connect(durable_url, autocommit=True) as pg_conn:
            found = pg_conn.execute("SELECT lease_until FROM schedtui_durable_executions WHERE id = %s", (started.id,)).fetchone()
            assert found is not None
            until_now = found[0]
    assert until_now == later
    gate.set()
    await a.quiesce()
