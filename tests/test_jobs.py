"""The job queue in an engine, on the manual clock: handlers, retries with the exact backoff,
dead jobs, timeouts, abandoned attempts, late results, pausing, deleting, schedules that
target a queue, sending from handlers and from ``connect()``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import (
    BadInput,
    DefinitionError,
    Engine,
    JobContext,
    ManualClock,
    NotFound,
    QueueFull,
    RunContext,
    TooLarge,
    Unavailable,
    connect,
    connect_sync,
    define_queue,
    define_schedule,
)
from backend.durable import DurableContext, define_durable
from backend.jobs.definition import backoff, check_send
from backend.jobs.model import NotDead, job_context
from backend.jobs.store import Finish
from tests.conftest import expect
from tests.late_answers import LateAnswer, lapse_and_renew
from tests.odd_exceptions import ODD_EXCEPTIONS, tag_of

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


class Handler:
    """A job handler the test steers: records every call; fails while ``fail`` says so."""

    def __init__(self, fail: Callable[[JobContext], bool] = lambda job: False) -> None:
        self.calls: list[JobContext] = []
        self.fail = fail

    async def __call__(self, job: JobContext) -> None:
        self.calls.append(job)
        if self.fail(job):
            raise RuntimeError(f"attempt {job.attempt} failed")


async def detail(engine: Engine, job_id: str) -> Any:
    return await engine.jobs.get_job(job_id)


# ---------------------------------------------------------------------------------------
# definitions and limits
# ---------------------------------------------------------------------------------------
def test_backoff_doubles_from_ten_seconds_up_to_an_hour() -> None:
    assert [backoff(n) for n in range(1, 12)] == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
    assert [backoff(n, first=1) for n in range(1, 4)] == [1, 2, 4]  # serve's --job-backoff (a test seam)
    assert backoff(200) == 3600


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name"}, "define_queue('bad name'): invalid name"),
        ({"concurrency": 0}, "concurrency 0 is out of range (1-1000)"),
        ({"attempts": 21}, "attempts 21 is out of range (1-20)"),
        ({"attempts": True}, "attempts True is not a whole number (1-20)"),
        ({"max_runtime": 0}, "max_runtime 0 must be a number of seconds or a timedelta, more than 0"),
        ({"handler": 42}, "handler 42 is not callable"),
    ],
)
def test_a_bad_queue_definition_names_the_queue_and_the_value(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "mail", "handler": Handler()}
    fields.update(kwargs)
    with pytest.raises(DefinitionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        define_queue(**fields)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"payload": "x" * (256 * 1024)}, TooLarge, "payload is 262,146 bytes of JSON; the limit is 262,144 bytes (256 KiB)"),
        ({"payload": {1, 2}}, BadInput, "payload is not JSON"),
        ({"payload": float("nan")}, BadInput, "payload is not JSON"),
        ({"payload": {"note": "a\x00"}}, BadInput, "payload holds a NUL character (\\u0000)"),
        ({"payload": ["\ud800"]}, BadInput, "payload holds a lone surrogate (\\ud800)"),
        # json.dumps would write these keys as "7", "true" and "null": the handler would
        # get another value than was sent, and {7: …, "7": …} one key twice.
        ({"payload": {7: "a"}}, BadInput, 'payload has the key 7 (int): JSON object keys are text, so it would arrive as "7"'),
        ({"payload": [{"a": {True: 1}}]}, BadInput, 'payload has the key True (bool): JSON object keys are text, so it would arrive as "true"'),  # noqa: E501
        ({"payload": {"a": ({None: 1},)}}, BadInput, 'payload has the key None (NoneType)'),
        ({"delay": -1}, BadInput, "delay -1s is out of range: 0 to 2,592,000 seconds (30 days)"),
        ({"delay": 30 * 86400 + 1}, BadInput, "delay 2,592,001s is out of range"),
        ({"delay": "soon"}, BadInput, "delay 'soon' is not a number of seconds"),
        ({"attempts": 0}, BadInput, "attempts 0 is out of range (1-20)"),
        ({"attempts": 21}, BadInput, "attempts 21 is out of range (1-20)"),
        # (1.0, True and "3" were told they were out of range, with their value inside it)
        ({"attempts": 1.0}, BadInput, "attempts 1.0 is not a whole number (1-20)"),
        ({"attempts": "3"}, BadInput, "attempts '3' is not a whole number (1-20)"),
        ({"key": "k" * 257}, BadInput, "is 257 bytes; the limit is 256 bytes"),
        ({"key": "é" * 129}, BadInput, "is 258 bytes; the limit is 256 bytes"),
        ({"key": "a\x00b"}, BadInput, "holds \\x00 at position 1, which is not text"),
        ({"key": 7}, BadInput, "key must be a string, not int"),
    ],
)
def test_every_limit_of_a_send_is_named_with_its_value(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        check_send(**kwargs)
    assert type(info.value) is error and message in str(info.value)


def test_the_limits_themselves_are_accepted() -> None:
    send = check_send("x" * (256 * 1024 - 2), 30 * 86400, 20, "k" * 256)
    assert (len(send.payload), send.delay, send.attempts, send.key) == (256 * 1024, 30 * 86400, 20, "k" * 256)
    with pytest.raises(BadInput, match="key is empty"):  # refused, not taken for no key: it would not deduplicate
        check_send(key="")
    # A delay as a timedelta, as a lock's ttl and a max_runtime take one (it was refused).
    assert check_send(delay=timedelta(minutes=5)).delay == 300.0
    with pytest.raises(BadInput, match="delay 2,592,001s is out of range"):
        check_send(delay=timedelta(days=30, seconds=1))


async def test_a_serve_that_defines_no_queue_nor_durable_function_still_prunes_their_rows(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Their retention is store-wide, and ran only in a process that defined a queue (or a
    function): a serve whose definitions had none (moved out of them, or jobs sent from
    elsewhere) kept every dead job, attempt and finished execution for good (an outside
    soak run: 62,743 attempts kept eight days on)."""

    async def fails(ctx: JobContext) -> None:
        raise RuntimeError("no")

    async def body(ctx: DurableContext, input: Any) -> int:
        return 1

    first = make_engine([define_queue(name="mail", handler=fails, attempts=1), define_durable(name="f", handler=body)],
                        retention=timedelta(days=1))  # fmt: skip
    await first.start()
    await first.jobs.send("mail", {"to": "x"})
    started = await first.durable.start_execution("f")
    await first.quiesce()
    assert [j.status for j in (await first.jobs.list_jobs("mail")).jobs] == ["dead"]
    assert (await first.durable.get(started.id)).status == "succeeded"
    await first.stop(grace=0)
    clock.advance(timedelta(days=8))
    bare = make_engine([], retention=timedelta(days=1), instance="bare")
    await bare.open()
    with caplog.at_level(logging.INFO, "schedtui"):
        await bare.maintain()
    said = [r.getMessage() for r in caplog.records]
    assert "job retention: removed 2 dead job(s) and old attempt(s)" in said, said
    assert "retention: removed 1 durable execution(s) finished more than 1 day, 0:00:00 ago" in said, said
    with pytest.raises(NotFound, match="no execution with id"):
        await bare.durable.get(started.id)


async def test_a_refused_send_writes_nothing(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine([define_queue(name="mail", handler=Handler())])
    await engine.open()
    with pytest.raises(TooLarge):
        await engine.jobs.send("mail", "x" * (300 * 1024))
    with pytest.raises(BadInput):
        await engine.jobs.send_many("mail", [{"payload": 1}, {"payload": 2, "attempts": 99}])
    with pytest.raises(NotFound, match='no queue named "ghost"'):
        await engine.jobs.send("ghost", 1)
    assert (await engine.jobs.list_jobs("mail")).jobs == []


# ---------------------------------------------------------------------------------------
# running, retrying, dead
# ---------------------------------------------------------------------------------------
async def test_a_handler_gets_its_job_and_a_success_leaves_only_its_attempt(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler, max_runtime=60)])
    await engine.start()
    sent = await engine.jobs.send("mail", {"order": 42}, key="receipt:42", attempts=5)
    await engine.quiesce()
    (job,) = handler.calls
    assert (job.id, job.queue, job.payload, job.attempt, job.max_attempts, job.key, job.cron) == (
        sent.id, "mail", {"order": 42}, 1, 5, "receipt:42", None
    )
    assert job.deadline == T0 + timedelta(seconds=60) and job.created_at == T0
    found = await detail(engine, sent.id)
    assert found.job is None and [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded")]
    assert found.to_json()["status"] is None and found.to_json()["attempts"][0]["status"] == "succeeded"


def test_the_context_made_on_the_hot_path_is_the_dataclass_itself() -> None:
    values = ("01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "mail", {"to": "a"}, 2, 3, "k", "digest", T0, T0 - timedelta(seconds=5), None, 7)
    made, plain = job_context(*values), JobContext(*values)  # type: ignore[arg-type]  # the fields, in order, as one tuple
    assert made == plain and repr(made) == repr(plain)
    assert [getattr(made, name) for name in JobContext.__slots__] == list(values)
    with pytest.raises(AttributeError):
        made.payload = None  # type: ignore[misc]  # frozen all the same


async def test_a_failing_job_is_retried_on_the_exact_backoff_then_dead(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    handler = Handler(fail=lambda job: True)
    engine = make_engine([define_queue(name="mail", handler=handler, attempts=5)])
    await engine.start()
    sent = await engine.jobs.send("mail", "x")
    await engine.quiesce()
    for attempt in range(1, 5):
        job = (await detail(engine, sent.id)).job
        assert (job.status, job.attempt, job.run_after) == ("queued", attempt, clock.now() + timedelta(seconds=backoff(attempt)))
        assert job.error_message == f"attempt {attempt} failed"
        clock.advance(timedelta(seconds=backoff(attempt)) - timedelta(microseconds=1))
        await engine.quiesce()
        assert len(handler.calls) == attempt  # not a microsecond early
        clock.advance(timedelta(microseconds=1))
        await engine.quiesce()
        assert len(handler.calls) == attempt + 1
    found = await detail(engine, sent.id)
    assert (found.job.status, found.job.attempt, found.job.max_attempts) == ("dead", 5, 5)
    starts = [a.started_at - T0 for a in found.attempts]
    assert starts == [timedelta(seconds=s) for s in (0, 10, 30, 70, 150)]
    assert [(a.status, a.error_tag) for a in found.attempts] == [("failed", "RuntimeError")] * 5
    clock.advance(3600 * 24)
    await engine.quiesce()
    assert len(handler.calls) == 5  # dead: never again, until retried
    retried = await engine.jobs.retry("mail", sent.id)
    assert (retried.status, retried.attempt) == ("queued", 0)
    await engine.quiesce()
    assert [c.attempt for c in handler.calls[5:]] == [1]
    with pytest.raises(NotDead):
        await engine.jobs.retry("mail", sent.id)


async def test_a_sync_handler_raising_stop_iteration_fails_its_attempt_and_frees_its_seat(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """``next()`` on an empty iterator, in a plain ``def`` handler: a future refuses
    StopIteration, so the attempt was never recorded, the job stayed ``running`` and its
    seat (concurrency 1 here) held, every other job of the queue waiting for good."""
    calls: list[Any] = []

    def handler(job: JobContext) -> None:
        calls.append(job.payload)
        if job.payload == "bad":
            next(iter([]))

    engine = make_engine([define_queue(name="q", handler=handler, attempts=1, concurrency=1, max_runtime=600)])
    await engine.start()
    bad, good = await engine.jobs.send("q", "bad"), await engine.jobs.send("q", "good")
    await asyncio.wait_for(engine.quiesce(), 10)
    found = await detail(engine, bad.id)
    assert (found.job.status, found.job.error_tag) == ("dead", "StopIteration")
    assert [(a.status, a.error_tag, a.finished_at) for a in found.attempts] == [("failed", "StopIteration", T0)]
    assert calls == ["bad", "good"]
    assert [a.status for a in (await detail(engine, good.id)).attempts] == ["succeeded"]


@pytest.mark.parametrize("odd", ODD_EXCEPTIONS, ids=tag_of)
async def test_an_exception_that_cannot_be_described_fails_the_attempt_at_once(
    make_engine: Callable[..., Engine], clock: ManualClock, odd: type[BaseException]
) -> None:
    async def raises(job: JobContext) -> None:
        raise odd()

    engine = make_engine([define_queue(name="odd", handler=raises, attempts=1, max_runtime=600)])
    await engine.start()
    sent = await engine.jobs.send("odd")
    await asyncio.wait_for(engine.quiesce(), 10)
    found = await detail(engine, sent.id)
    assert (found.job.status, found.job.error_tag) == ("dead", tag_of(odd))
    assert [(a.status, a.error_tag, a.finished_at) for a in found.attempts] == [("failed", tag_of(odd), T0)]


async def test_an_attempt_past_max_runtime_fails_with_timeout(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    release = asyncio.Event()

    async def hang(job: JobContext) -> None:
        if job.attempt == 1:
            await release.wait()

    engine = make_engine([define_queue(name="slow", handler=hang, max_runtime=30, attempts=2)])
    await engine.start()
    sent = await engine.jobs.send("slow")
    await engine.quiesce(runs=False)
    clock.advance(30)
    await engine.quiesce()
    found = await detail(engine, sent.id)
    assert [(a.attempt, a.error_tag) for a in found.attempts] == [(1, "timeout")]
    assert "exceeded max_runtime of 30s" in (found.attempts[0].error_message or "")
    clock.advance(10)
    await engine.quiesce()
    assert [(a.attempt, a.status) for a in (await detail(engine, sent.id)).attempts] == [(1, "failed"), (2, "succeeded")]


async def test_the_concurrency_cap_holds_and_a_finished_job_makes_room(make_engine: Callable[..., Engine]) -> None:
    gates: dict[int, asyncio.Event] = {}
    running: set[int] = set()
    most = 0

    async def work(job: JobContext) -> None:
        nonlocal most
        running.add(job.payload)
        most = max(most, len(running))
        gates[job.payload] = asyncio.Event()
        await gates[job.payload].wait()
        running.discard(job.payload)

    engine = make_engine([define_queue(name="mail", handler=work, concurrency=2)])
    await engine.start()
    await engine.jobs.send_many("mail", [{"payload": i} for i in range(5)])
    await engine.quiesce(runs=False)
    while len(gates) < 2 or running != set(gates):
        await asyncio.sleep(0)
    assert running == {0, 1}
    for i in range(5):
        await engine.quiesce(runs=False)
        while i not in gates:
            await asyncio.sleep(0)
        gates[i].set()
    await engine.quiesce()
    assert most == 2 and not running


class ShortJobs:
    """A handler that ends within a cycle (worth claiming ahead for), recording the jobs it
    ran and the most that ran at once."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.ran: list[str] = []
        self.most = 0

    async def __call__(self, job: JobContext) -> None:
        self.running.add(job.id)
        self.most = max(self.most, len(self.running))
        self.ran.append(job.id)
        await asyncio.sleep(0)
        self.running.discard(job.id)


async def test_short_jobs_claimed_ahead_keep_the_cap_across_workers_and_run_once(
    pg_url: str, make_engine: Callable[..., Engine]
) -> None:
    work = ShortJobs()
    ran = work.ran
    engines = [make_engine([define_queue(name="mail", handler=work, concurrency=2)], store=pg_url) for _ in range(2)]
    ahead: list[int] = []
    for engine in engines:
        await engine.open()
        inner = engine.jobs.store.cycle_jobs

        async def spy(*args: Any, inner: Any = inner, **kwargs: Any) -> Any:
            cycle = await inner(*args, **kwargs)
            ahead.append(sum(1 for c in cycle.claimed if c.seat is None))
            return cycle

        engine.jobs.store.cycle_jobs = spy  # type: ignore[method-assign]  # counts the jobs claimed ahead
    sent = await engines[0].jobs.send_many("mail", [{"payload": i} for i in range(120)])
    for engine in engines:
        await engine.start()
    while len(ran) < 120:
        for engine in engines:
            await engine.quiesce(runs=False)
        await asyncio.sleep(0)
    for engine in engines:
        await engine.quiesce()
    assert sum(ahead) > 0, "nothing was claimed ahead"
    assert work.most <= 2
    assert sorted(ran) == sorted(s.id for s in sent)  # each once
    views = await engines[0].jobs.queue_views()
    assert (views[0].queued, views[0].running) == (0, 0)
    for s_ in sent[:10]:
        attempts = (await engines[0].jobs.get_job(s_.id)).attempts
        assert [a.status for a in attempts] == ["succeeded"]


JOBS_FOR_A_CHANCE = 400


async def test_jobs_claimed_ahead_that_come_back_after_every_attempt_ended_start_on_the_seats_left(
    pg_url: str, make_engine: Callable[..., Engine]
) -> None:
    """A claim ahead is on its way while every attempt of its queue ends (handlers shorter
    than a cycle): the jobs it brings start on the seats those attempts left, their finishes
    and the handovers in the next cycle, instead of going back (released) to be claimed
    again, a round trip each for nothing. The cap holds and each job runs once."""
    work = ShortJobs()
    ran = work.ran
    engine = make_engine([define_queue(name="mail", handler=work, concurrency=2)], store=pg_url)
    await engine.open()
    workers_store = engine.jobs.store
    inner = workers_store.cycle_jobs
    kinds: list[str] = []
    handed: list[int] = []
    brought: list[int] = []
    hold = asyncio.Event()
    held = asyncio.Event()

    async def spy(finishes: Any, wanted: Any, *args: Any, **kwargs: Any) -> Any:
        kinds.extend(f.kind for f in finishes)
        handed.append(len(kwargs.get("handovers") or ()))
        workers = engine.jobs.workers
        assert workers is not None
        if kwargs.get("ahead") and workers.active["mail"] and not held.is_set():
            held.set()
            await hold.wait()  # every attempt of the queue ends meanwhile
            cycle = await inner(finishes, wanted, *args, **kwargs)
            brought.append(sum(1 for c in cycle.claimed if c.seat is None))
            return cycle
        return await inner(finishes, wanted, *args, **kwargs)

    workers_store.cycle_jobs = spy  # type: ignore[method-assign]  # records the cycles, holds one back
    # Whether a cycle claiming ahead goes out while an attempt still runs is up to timing
    # (handlers this short end while a cycle is in flight, the more so on a busy machine):
    # enough jobs that one does, as it did on a quiet one within 60.
    sent = await engine.jobs.send_many("mail", [{"payload": i} for i in range(JOBS_FOR_A_CHANCE)])
    await engine.start()
    await asyncio.wait_for(held.wait(), 10)  # (the timeouts only bound a broken test)
    workers = engine.jobs.workers
    assert workers is not None

    async def until(done: Callable[[], bool]) -> None:
        while not done():
            await asyncio.sleep(0)

    await asyncio.wait_for(until(lambda: not workers.active["mail"] and bool(workers.finishes)), 10)
    hold.set()
    await asyncio.wait_for(until(lambda: len(ran) == JOBS_FOR_A_CHANCE), 10)
    await engine.quiesce()
    assert brought and brought[0] > 0, "the held claim brought nothing ahead"
    assert "release" not in kinds, "jobs claimed ahead went back to be claimed again"
    assert sum(handed) > 0
    assert work.most <= 2
    assert sorted(ran) == sorted(s.id for s in sent)  # each once
    assert [(v.queued, v.running) for v in await engine.jobs.queue_views()] == [(0, 0)]
    for job in sent[:10]:
        assert [a.status for a in (await engine.jobs.get_job(job.id)).attempts] == ["succeeded"]


async def test_jobs_claimed_under_a_lease_that_lapsed_while_the_answer_was_on_its_way_never_start(
    pg_url: str, make_engine: Callable[..., Engine]
) -> None:
    """A claim commits, then its answer is held up (a partition that heals, a process
    frozen meanwhile) while this instance's lease lapses and is renewed: another instance
    may have taken those jobs over in between, so they must not start here under the new
    epoch. They go back untouched and run once, claimed again."""
    fences: list[tuple[str, int]] = []

    async def work(job: JobContext) -> None:
        fences.append((job.id, job.fence))

    engine = make_engine([define_queue(name="mail", handler=work, concurrency=4)], store=pg_url)
    await engine.open()
    workers_store = engine.jobs.store
    late = LateAnswer(workers_store.cycle_jobs, lambda cycle: bool(cycle.claimed))
    kinds: list[str] = []

    async def spy(finishes: Any, *args: Any, **kwargs: Any) -> Any:
        kinds.extend(f.kind for f in finishes)
        return await late(finishes, *args, **kwargs)

    workers_store.cycle_jobs = spy  # type: ignore[method-assign]  # records the finishes, answers late
    sent = await engine.jobs.send_many("mail", [{"payload": i} for i in range(3)])
    await engine.start()
    await late.committed()
    lapse_and_renew(engine)
    late.let_go()

    async def until_ran() -> None:
        while len(fences) < 3:
            await engine.quiesce(runs=False)
            await asyncio.sleep(0)

    await asyncio.wait_for(until_ran(), 10)
    await engine.quiesce()
    assert sorted(fences) == sorted((s_.id, 2) for s_ in sent), "a job started under the lapsed claim"
    assert kinds.count("release") == 3
    for job in sent:
        attempts = (await engine.jobs.get_job(job.id)).attempts
        assert [(a.attempt, a.status) for a in attempts] == [(1, "succeeded")], attempts
    assert [(v.queued, v.running) for v in await engine.jobs.queue_views()] == [(0, 0)]


class LateRead:
    """Wraps a store's ``running_jobs``: the first read that finds a running job answers
    only once :meth:`answer` is called (a slow read: a busy server, a process paused)."""

    def __init__(self, store: Any) -> None:
        self.real = store.running_jobs
        self.read = asyncio.Event()
        self._answer = asyncio.Event()
        store.running_jobs = self

    async def __call__(self) -> Any:
        running = await self.real()
        if running and not self.read.is_set():
            self.read.set()
            await self._answer.wait()
        return running

    def answer(self) -> None:
        self._answer.set()


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_sweep_whose_read_a_released_jobs_run_overtook_records_no_attempt(
    where: str, request: pytest.FixtureRequest, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The abandoned-work sweep reads a job running here under a claim whose answer is on
    its way; that answer comes under a lapsed epoch, the job goes back untouched, runs
    again and succeeds, all before the sweep's read comes back. The sweep then finds the
    job in no hand here and closes it as abandoned: that close must not apply, nor leave
    a failed attempt in the history of a job whose only attempt succeeded."""
    handler = Handler()
    store = request.getfixturevalue("pg_url" if where == "postgres" else "store_url")
    engine = make_engine([define_queue(name="mail", handler=handler, attempts=1)], abandon_after=30,
                         store=store)  # fmt: skip
    await engine.open()
    workers_store = engine.jobs.store
    late = LateAnswer(workers_store.cycle_jobs, lambda cycle: bool(cycle.claimed))
    workers_store.cycle_jobs = late  # type: ignore[method-assign]  # the claim's answer comes late
    slow = LateRead(workers_store)
    sent = await engine.jobs.send("mail", "x")
    await engine.start()
    await late.committed()
    clock.advance(1)  # the housekeeping's sweep reads the job, running here; its answer waits
    await asyncio.wait_for(slow.read.wait(), 10)  # (the timeouts only bound a broken test)
    lapse_and_renew(engine)
    late.let_go()  # claimed under the lapsed epoch: it goes back, is claimed again, runs

    async def until_gone() -> None:
        while (await detail(engine, sent.id)).job is not None:
            await asyncio.sleep(0)

    await asyncio.wait_for(until_gone(), 10)
    slow.answer()
    await engine.quiesce()
    assert [(c.id, c.attempt) for c in handler.calls] == [(sent.id, 1)]
    found = await detail(engine, sent.id)
    assert [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded")], found.attempts


class LoseClaimAnswers:
    """Wraps a store's ``cycle_jobs``: the first ``count`` cycles that claim a job commit,
    then fail as if the connection broke before their answer came back."""

    def __init__(self, store: Any, count: int = 1, after: int = 0) -> None:
        self.real = store.cycle_jobs
        self.count = count
        self.after = after
        """Claims answered before the first lost one."""
        self.lost: list[str] = []
        self.carried: list[Any] = []
        """The ends of attempts the lost cycles carried."""
        self.done = asyncio.Event()
        store.cycle_jobs = self

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cycle = await self.real(*args, **kwargs)
        if cycle.claimed and self.after:
            self.after -= 1
        elif cycle.claimed and len(self.lost) < self.count:
            self.carried.extend(args[0])
            self.lost.extend(c.id for c in cycle.claimed)
            if len(self.lost) >= self.count:
                self.done.set()
            raise Unavailable("the connection broke after the commit (test)")
        return cycle


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_job_whose_claim_answer_was_lost_runs_once_with_its_attempts_intact(
    where: str, request: pytest.FixtureRequest, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A cycle's claim commits and its answer is lost: the job is `running` here, and this
    process knows it never started it. It goes back untouched at the next sweep and runs
    once, as its first attempt: a job of one attempt is not made dead by a network blip."""
    handler = Handler()
    store = request.getfixturevalue("pg_url" if where == "postgres" else "store_url")
    engine = make_engine([define_queue(name="mail", handler=handler, attempts=1)], abandon_after=30,
                         store=store)  # fmt: skip
    await engine.open()
    lose = LoseClaimAnswers(engine.jobs.store)
    sent = await engine.jobs.send("mail", "x")
    await engine.start()
    await asyncio.wait_for(lose.done.wait(), 10)
    assert lose.lost == [sent.id]
    for _ in range(60):  # a minute: past the take-over window and a sweep's
        clock.advance(1)  # (the sweep runs with the housekeeping, every second)
        await engine.quiesce()
    assert [(c.id, c.attempt) for c in handler.calls] == [(sent.id, 1)]
    found = await detail(engine, sent.id)
    assert found.job is None  # succeeded: gone
    assert [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded")]


async def test_an_end_carried_by_a_cycle_whose_answer_was_lost_is_applied_once_and_said_so(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The lost cycle carried the end of an attempt that had succeeded, and applied it: the
    next cycle carries it again, which does not apply again but is answered as applied (its
    record is there): no late result of a displaced worker (no warning saying so), and the
    attempt counted once."""
    caplog.set_level(logging.INFO, "schedtui.jobs")
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler, concurrency=1, attempts=1)], abandon_after=30)
    await engine.open()
    metered: list[Finish] = []
    engine.jobs.meters.append(metered.append)
    lose = LoseClaimAnswers(engine.jobs.store, after=1)
    first, second = await engine.jobs.send_many("mail", [{"payload": 1}, {"payload": 2}])
    await engine.start()
    await asyncio.wait_for(lose.done.wait(), 10)
    assert lose.lost == [second.id] and [f.id for f in lose.carried] == [first.id]
    for _ in range(5):
        clock.advance(1)
        await engine.quiesce()
    assert [(c.id, c.attempt) for c in handler.calls] == [(first.id, 1), (second.id, 1)]
    for job in (first, second):
        assert [(a.attempt, a.status) for a in (await detail(engine, job.id)).attempts] == [(1, "succeeded")]
    assert not [r for r in caplog.records if "late result" in r.getMessage()]
    assert sorted((f.id, f.kind) for f in metered) == sorted([(first.id, "succeeded"), (second.id, "succeeded")])


async def test_a_handover_applied_by_a_cycle_whose_answer_was_lost_is_not_taken_for_a_lost_seat(
    pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Short jobs: those claimed ahead start on the seats of attempts that just ended, and
    a cycle carries their handovers. That cycle commits and its answer is lost while the
    jobs still run. Sent again, each handover finds its job on that seat already: it is
    this worker's, not a seat taken over. (It answered "not moved", and the worker stopped
    the running jobs as if their seats had been taken: attempts failed, and used, for a
    network blip.)"""
    ran: list[str] = []
    go, lost, resent = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def work(job: JobContext) -> None:
        ran.append(job.id)
        if len(ran) > 20:  # (the first twenty end at once; the others run on until told)
            await go.wait()
        await asyncio.sleep(0)  # (shorter than a cycle, as ShortJobs)

    engine = make_engine([define_queue(name="mail", handler=work, concurrency=2)], store=pg_url)
    await engine.open()
    store = engine.jobs.store
    inner = store.cycle_jobs

    async def cycle_jobs(*args: Any, **kwargs: Any) -> Any:
        handovers = kwargs.get("handovers") or ()
        cycle = await inner(*args, **kwargs)
        if handovers and lost.is_set():
            resent.set()
        workers = engine.jobs.workers
        assert workers is not None
        still = [h for h in handovers if h.id in workers.running and not workers.running[h.id].done]
        if still and any(cycle.handed) and not lost.is_set():
            lost.set()
            raise Unavailable("the connection broke after the commit (test)")
        return cycle

    store.cycle_jobs = cycle_jobs  # type: ignore[method-assign]
    sent = await engine.jobs.send_many("mail", [{"payload": i} for i in range(60)])
    await engine.start()
    await asyncio.wait_for(lost.wait(), 10)  # (the timeout only bounds a broken test)
    for _ in range(5):  # the next cycle, a second later, sends the handovers again
        clock.advance(1)
        await engine.quiesce(runs=False)
        if resent.is_set():
            break
    assert resent.is_set(), "the handovers were not sent again"
    go.set()
    for _ in range(5):  # the sweep puts back what the lost cycle claimed
        clock.advance(1)
        await engine.quiesce()
    assert sorted(ran) == sorted(s.id for s in sent)  # each once
    for job in sent:
        attempts = (await engine.jobs.get_job(job.id)).attempts
        assert [(a.attempt, a.status) for a in attempts] == [(1, "succeeded")], attempts


async def test_the_claims_that_failed_in_a_long_outage_are_remembered_ten_minutes_at_most(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Every cycle of an outage fails (a second apart): their tokens are kept only as long
    as a late commit could land, not for the whole outage."""
    engine = make_engine([define_queue(name="mail", handler=Handler())], abandon_after=30)
    await engine.open()
    await engine.jobs.send("mail", "x")
    store: Any = engine.jobs.store

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("the store is down (test)")

    store.cycle_jobs = down
    await engine.start()
    workers = engine.jobs.workers
    assert workers is not None
    for _ in range(15 * 60):
        clock.advance(1)
        await engine.quiesce()
    assert 500 <= len(workers.unanswered) <= 601
    assert clock.now() - min(workers.unanswered.values()) <= timedelta(minutes=10)


async def test_a_claim_whose_answer_was_lost_just_before_a_stop_goes_back_at_the_stop(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The stop comes before the sweep: it puts the job back itself, untouched, so the next
    instance runs it at once as its first attempt, not after the take-over window as
    an abandoned one."""
    first = Handler()
    engine = make_engine([define_queue(name="mail", handler=first, attempts=1)], abandon_after=30)
    await engine.open()
    lose = LoseClaimAnswers(engine.jobs.store)
    sent = await engine.jobs.send("mail", "x")
    await engine.start()
    await asyncio.wait_for(lose.done.wait(), 10)
    await engine.stop(grace=0)
    second = Handler()
    again = make_engine([define_queue(name="mail", handler=second, attempts=1)], abandon_after=30)
    await again.open()
    job = (await detail(again, sent.id)).job
    assert (job.status, job.attempt) == ("queued", 0)
    await again.start()
    await again.quiesce()
    assert first.calls == [] and [(c.id, c.attempt) for c in second.calls] == [(sent.id, 1)]


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_stop_whose_hand_in_lost_its_answer_still_gives_back_what_a_lost_claim_took(
    where: str, request: pytest.FixtureRequest, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Found by the queue machine: a claim commits and its answer is lost; the stop then
    hands in the attempt it interrupted, and that answer is lost too (the connection broke
    after the commit). The stop went no further, and the claimed job, never started,
    stayed `running` under the stopped instance until the take-over window. It now goes
    back untouched all the same."""
    store = request.getfixturevalue("pg_url" if where == "postgres" else "store_url")
    began = asyncio.Event()

    async def held(job: JobContext) -> None:
        began.set()
        await asyncio.Event().wait()  # until the stop interrupts it

    engine = make_engine([define_queue(name="mail", handler=held, concurrency=2, attempts=3)], store=store)
    await engine.open()
    interrupted = await engine.jobs.send("mail", "held")
    await engine.start()
    await asyncio.wait_for(began.wait(), 10)  # (the timeouts only bound a broken test)
    # No cycle on its way (one writing the start above): one sent before the wrapping below
    # could claim the job sent next on the server, and the wrapping would wait for nothing.
    workers = engine.jobs.workers
    assert workers is not None
    await until(lambda: not (workers.handovers or workers.inflight or workers.inflight_handovers), "the start written")
    lose = LoseClaimAnswers(engine.jobs.store)
    sent = await engine.jobs.send("mail", "x")
    await asyncio.wait_for(lose.done.wait(), 10)
    jobs_store: Any = engine.jobs.store
    finish, handed_in = jobs_store.finish_jobs, []

    async def answer_lost(*args: Any, **kwargs: Any) -> Any:
        handed_in.append(await finish(*args, **kwargs))
        jobs_store.finish_jobs = finish
        raise Unavailable("the connection broke after the commit (test)")

    jobs_store.finish_jobs = answer_lost
    await engine.stop(grace=0)
    assert handed_in == [[True]]  # (the interrupted attempt's end, committed)
    again = make_engine([define_queue(name="mail", handler=Handler())], abandon_after=30, store=store)
    await again.open()
    job = (await detail(again, sent.id)).job
    assert (job.status, job.attempt) == ("queued", 0), job
    job = (await detail(again, interrupted.id)).job
    assert (job.status, job.attempt, job.error_tag) == ("queued", 1, "interrupted"), job


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_claim_the_server_commits_after_the_stop_began_goes_back_at_the_stop(
    where: str, request: pytest.FixtureRequest, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A stop cancels the workers' cycle while its claim is on its way, and the server
    commits that claim only once the stop has begun (it runs on whatever the client does).
    The stop looked for what cut-short cycles claimed at once, and could read before that
    commit: the job stayed `running` under the stopped instance until the take-over window
    ran out. It now waits for the cycle's answer first, and puts the job back untouched."""
    store = request.getfixturevalue("pg_url" if where == "postgres" else "store_url")
    first = Handler()
    engine = make_engine([define_queue(name="mail", handler=first, attempts=1)], abandon_after=30, store=store)
    await engine.open()
    jobs_store: Any = engine.jobs.store
    cycle, sent_cycle, commit = jobs_store.cycle_jobs, asyncio.Event(), asyncio.Event()
    on_the_server: list[asyncio.Future[Any]] = []

    async def on_the_wire(*args: Any, **kwargs: Any) -> Any:
        if not args[1] or on_the_server:  # (only the first cycle that claims)
            return await cycle(*args, **kwargs)

        async def server() -> Any:
            await commit.wait()
            return await cycle(*args, **kwargs)

        on_the_server.append(asyncio.ensure_future(server()))  # (a cancelled client does not stop it)
        sent_cycle.set()
        return await asyncio.shield(on_the_server[-1])

    jobs_store.cycle_jobs = on_the_wire
    sent = await engine.jobs.send("mail", "x")
    stop_jobs = engine.jobs.stop

    async def commit_once_stopping(grace: float) -> None:
        commit.set()
        await stop_jobs(grace)

    engine.jobs.stop = commit_once_stopping  # type: ignore[method-assign]
    await engine.start()
    await asyncio.wait_for(sent_cycle.wait(), 10)  # (the timeouts only bound a broken test)
    await asyncio.wait_for(engine.stop(grace=0), 10)
    assert [c.id for c in on_the_server[0].result().claimed] == [sent.id]
    second = Handler()
    again = make_engine([define_queue(name="mail", handler=second, attempts=1)], abandon_after=30, store=store)
    await again.open()
    job = (await detail(again, sent.id)).job
    assert (job.status, job.attempt) == ("queued", 0)
    await again.start()
    await again.quiesce()  # the same instant: not after the take-over window
    assert first.calls == [] and [(c.id, c.attempt) for c in second.calls] == [(sent.id, 1)]


async def test_queues_on_two_streams_are_claimed_side_by_side(pg_url: str, make_engine: Callable[..., Engine]) -> None:
    """A stream's cycle on its way holds back neither the other stream's claims nor the
    jobs they bring; each queue keeps its cap, and every job runs once."""
    running: dict[str, set[str]] = {"a": set(), "b": set()}
    ran: list[str] = []
    most = 0

    async def work(job: JobContext) -> None:
        nonlocal most
        running[job.queue].add(job.id)
        most = max(most, *map(len, running.values()))
        ran.append(job.id)
        await asyncio.sleep(0)
        running[job.queue].discard(job.id)

    engine = make_engine([define_queue(name=q, handler=work, concurrency=2) for q in ("a", "b")], store=pg_url)
    await engine.open()
    workers_store = engine.jobs.store
    inner = workers_store.cycle_jobs
    held = asyncio.Event()
    stuck = asyncio.Event()
    on_their_way = most_at_once = 0

    async def spy(finishes: Any, wanted: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal on_their_way, most_at_once
        on_their_way += 1
        most_at_once = max(most_at_once, on_their_way)
        try:
            if "a" in wanted and not held.is_set():
                stuck.set()
                await held.wait()  # queue a's first claim is slow to come back
            return await inner(finishes, wanted, *args, **kwargs)
        finally:
            on_their_way -= 1

    workers_store.cycle_jobs = spy  # type: ignore[method-assign]  # holds queue a's first claim back
    sent = await engine.jobs.send_many("a", [{"payload": i} for i in range(20)])
    sent += await engine.jobs.send_many("b", [{"payload": i} for i in range(20)])
    await engine.start()
    await asyncio.wait_for(stuck.wait(), 10)
    b_ids = {s.id for s in sent[20:]}

    async def until(done: Callable[[], bool]) -> None:
        while not done():
            await engine.quiesce(runs=False)
            await asyncio.sleep(0)

    # b's jobs run while a's claim is on its way (the timeout only bounds a broken test)
    await asyncio.wait_for(until(lambda: b_ids <= set(ran)), 10)
    assert not set(ran) - b_ids and most_at_once >= 2
    held.set()
    await asyncio.wait_for(until(lambda: len(ran) == 40), 10)
    await engine.quiesce()
    assert sorted(ran) == sorted(s.id for s in sent) and most <= 2
    assert [(v.queued, v.running) for v in await engine.jobs.queue_views()] == [(0, 0), (0, 0)]


async def test_an_attempt_that_ends_while_a_claim_is_on_its_way_is_handed_in_with_the_next_cycle(
    make_engine: Callable[..., Engine],
) -> None:
    """Not in a cycle of its own beside the claim: one transaction for both, not two."""
    release = asyncio.Event()
    ran: list[str] = []
    returned: list[str] = []

    async def work(job: JobContext) -> None:
        ran.append(job.id)
        if len(ran) == 1:
            await release.wait()
        returned.append(job.id)

    engine = make_engine([define_queue(name="mail", handler=work, concurrency=2)])
    await engine.open()
    workers_store = engine.jobs.store
    inner = workers_store.cycle_jobs
    cycles: list[tuple[list[str], bool]] = []
    hold = asyncio.Event()
    held = asyncio.Event()

    async def spy(finishes: Any, wanted: Any, *args: Any, **kwargs: Any) -> Any:
        cycles.append(([f.id for f in finishes], bool(wanted)))
        if wanted and len(ran) == 1 and not held.is_set():
            held.set()
            await hold.wait()  # the claim after the first job started is slow to come back
        return await inner(finishes, wanted, *args, **kwargs)

    workers_store.cycle_jobs = spy  # type: ignore[method-assign]  # records the cycles, holds one back
    [first] = await engine.jobs.send_many("mail", [{"payload": 1}])
    await engine.start()
    await engine.quiesce(runs=False)  # the first job runs (and waits)
    await engine.jobs.send_many("mail", [{"payload": 2}])
    await asyncio.wait_for(held.wait(), 10)
    workers = engine.jobs.workers
    assert workers is not None
    release.set()

    def first_ended_and_dispatcher_parked() -> bool:
        parked = engine.loops._parking.get("jobs")
        return bool(returned) and parked is not None and parked.parked and not workers.wake.is_set()

    async def until_parked() -> None:
        while not first_ended_and_dispatcher_parked():
            await asyncio.sleep(0)

    await asyncio.wait_for(until_parked(), 10)  # (the timeout only bounds a broken test)
    before = len(cycles)
    assert not any(ids == [first.id] for ids, _ in cycles), "the ended attempt went in a cycle of its own"
    hold.set()
    await engine.quiesce()
    assert len(ran) == 2 and first.id in cycles[before][0]  # with the next cycle after the claim came back
    assert [(v.queued, v.running) for v in await engine.jobs.queue_views()] == [(0, 0)]


async def test_a_sync_handler_runs_on_a_thread_and_sends_with_the_blocking_twin(make_engine: Callable[..., Engine]) -> None:
    threads: list[str] = []

    def fan_out(job: JobContext) -> None:
        threads.append(threading.current_thread().name)
        if job.payload == "parent":
            job.jobs.sync.send("mail", "child", key="only-child")

    engine = make_engine([define_queue(name="mail", handler=fan_out)])
    await engine.start()
    await engine.jobs.send("mail", "parent")
    await engine.quiesce()
    assert threads == ["schedtui-job-mail", "schedtui-job-mail"]


async def test_an_async_handler_sends_from_its_context(make_engine: Callable[..., Engine]) -> None:
    handler = Handler()

    async def chain(job: JobContext) -> None:
        if job.payload < 3:
            await job.jobs.send("mail", job.payload + 1)
        await handler(job)

    engine = make_engine([define_queue(name="mail", handler=chain)])
    await engine.start()
    await engine.jobs.send("mail", 0)
    await engine.quiesce()
    assert [c.payload for c in handler.calls] == [0, 1, 2, 3]


async def test_a_paused_queue_keeps_its_jobs_until_resumed(make_engine: Callable[..., Engine]) -> None:
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler)])
    await engine.start()
    view = await engine.jobs.set_paused("mail", True, by="alice")
    assert view.paused
    await engine.jobs.send("mail", 1)
    await engine.quiesce()
    assert handler.calls == [] and (await engine.jobs.queue_view("mail")).queued == 1
    await engine.jobs.set_paused("mail", False)
    await engine.quiesce()
    assert [c.payload for c in handler.calls] == [1]


async def test_cancel_delete_and_their_refusals(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler)])
    await engine.start()
    later = await engine.jobs.send("mail", "later", delay=3600, key="k")
    assert await engine.jobs.cancel("mail", key="k")
    assert not await engine.jobs.cancel("mail", key="k")
    other = await engine.jobs.send("mail", "other", delay=3600)
    await engine.jobs.delete("mail", other.id)
    with pytest.raises(NotFound):
        await engine.jobs.delete("mail", other.id)
    with pytest.raises(NotFound):
        await engine.jobs.get_job(later.id)
    with pytest.raises(NotFound, match="no queue named"):
        await engine.jobs.cancel("ghost", key="k")
    with pytest.raises(NotFound, match='no job with id "nope"'):
        await engine.jobs.get_job("nope")
    clock.advance(3600)
    await engine.quiesce()
    assert handler.calls == []


async def test_a_job_deleted_while_it_runs_finishes_and_holds_its_seat_not_its_key(make_engine: Callable[..., Engine]) -> None:
    gate = asyncio.Event()
    seen: list[str] = []

    async def work(job: JobContext) -> None:
        seen.append(job.payload)
        if job.payload == "first":
            await gate.wait()

    engine = make_engine([define_queue(name="mail", handler=work, concurrency=1)])
    await engine.start()
    first = await engine.jobs.send("mail", "first", key="k")
    await engine.quiesce(runs=False)
    while seen != ["first"]:
        await asyncio.sleep(0)
    await engine.jobs.delete("mail", first.id)
    await engine.jobs.send("mail", "second", key="k")  # the key is free at once
    await engine.quiesce(runs=False)
    assert seen == ["first"]  # ... but the seat is not
    gate.set()
    await engine.quiesce()
    assert seen == ["first", "second"]
    gone = await engine.jobs.get_job(first.id)
    assert gone.job is None and [a.status for a in gone.attempts] == ["succeeded"]  # its attempt stays readable
    assert (await engine.jobs.queue_view("mail")).queued == 0


# ---------------------------------------------------------------------------------------
# jobs claimed ahead (PostgreSQL): as queued jobs to every action, started oldest first
# ---------------------------------------------------------------------------------------
async def until(done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait (on the loop) until ``done()``; the timeout only bounds a broken test."""

    async def poll() -> None:
        while not done():
            await asyncio.sleep(0)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"never: {what}")


class Held:
    """Handlers that end at once (``quick``), or when the test lets them (``hold``): they
    make a queue's handlers shorter than a cycle, then keep its seats busy."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.running: dict[str, str] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.cap = 0
        self.over: list[str] = []

    async def __call__(self, job: JobContext) -> None:
        name = job.payload["name"]
        if self.cap and len(self.running) >= self.cap:
            self.over.append(f"{name} started beside {sorted(self.running.values())}, cap {self.cap}")
        self.ran.append(name)
        self.running[job.id] = name
        try:
            if job.payload.get("hold"):
                await self.gates.setdefault(name, asyncio.Event()).wait()
        finally:
            del self.running[job.id]

    def end(self, *names: str) -> None:
        for name in names:
            self.gates.setdefault(name, asyncio.Event()).set()

    @staticmethod
    def batch(quick: int, held: str) -> list[dict[str, Any]]:
        return [{"payload": {"name": f"quick{i}"}} for i in range(quick)] + [
            {"payload": {"name": n, "hold": True}, "key": f"key-{n}"} for n in held
        ]


async def test_jobs_waiting_behind_a_busy_seat_are_cancelled_deleted_and_paused_as_queued_ones(
    pg_url: str, make_engine: Callable[..., Engine]
) -> None:
    work = Held()
    engine = make_engine([define_queue(name="q", handler=work, concurrency=1)], store=pg_url)
    await engine.start()
    sent = await engine.jobs.send_many("q", Held.batch(4, "ABCDEF"))
    ids = {s_.id: n for s_, n in zip(sent, [*(f"quick{i}" for i in range(4)), *"ABCDEF"], strict=True)}
    by_name = {n: i for i, n in ids.items()}
    workers = engine.jobs.workers
    assert workers is not None
    await until(lambda: len(work.ran) == 5, "A started")
    await engine.quiesce(runs=False)
    assert work.ran == ["quick0", "quick1", "quick2", "quick3", "A"]  # oldest due first
    assert len(workers.waiting["q"]) == 5, "nothing waits behind the busy seat (claimed ahead)"
    # A's start and the quick jobs' ends reach the store in the worker's next cycle; the
    # listing below reads the store.
    await until(lambda: not (workers.finishes or workers.handovers or workers.inflight), "every start and end written")
    listed = {ids[j.id]: (j.status, j.attempt, j.started_at is None) for j in (await engine.jobs.list_jobs("q")).jobs}
    assert listed == {"A": ("running", 1, False), **{n: ("queued", 0, True) for n in "BCDEF"}}
    view = await engine.jobs.queue_view("q")
    assert (view.queued, view.running) == (5, 1) and view.oldest_queued_at is not None
    assert await engine.jobs.cancel("q", by_name["F"])
    assert await engine.jobs.cancel("q", key="key-E")
    await engine.jobs.delete("q", by_name["D"])
    assert not (await engine.jobs.send("q", {"name": "D2"}, key="key-D")).duplicate  # its key free at once
    await engine.jobs.pause("q")
    work.end("A", "B", "C")
    await engine.quiesce()
    assert work.ran[4:] == ["A"], "a job started in a paused queue"
    await engine.jobs.resume("q")
    await engine.quiesce()
    assert work.ran[4:] == ["A", "B", "C", "D2"]  # the cancelled and the deleted never ran


async def test_a_cancel_and_a_pause_from_another_process_reach_the_jobs_claimed_ahead(
    pg_url: str, make_engine: Callable[..., Engine]
) -> None:
    """Sent from a client of the store (no workers of its own), the actions reach the worker
    holding the jobs by a notification after their commit: it gives them back, and none of
    them starts."""
    work = Held()
    engine = make_engine([define_queue(name="q", handler=work, concurrency=1)], store=pg_url)
    await engine.start()
    sent = await engine.jobs.send_many("q", Held.batch(4, "ABCD"))
    workers = engine.jobs.workers
    assert workers is not None
    await until(lambda: bool(work.running) and len(workers.waiting["q"]) == 3, "A running, B, C and D waiting")
    async with connect(pg_url) as client:
        heard = workers.revokes
        assert await client.jobs.cancel("q", sent[-1].id)  # D
        await until(lambda: workers.revokes > heard, "the worker heard of the cancel")
        assert not workers.waiting["q"]
        heard = workers.revokes
        await client.jobs.pause("q")
        await until(lambda: workers.revokes > heard, "the worker heard of the pause")
    work.end("A", "B", "C")
    await engine.quiesce()
    assert work.ran[4:] == ["A"], "a job started in a paused queue"
    await engine.jobs.resume("q")
    await engine.quiesce()
    assert work.ran[4:] == ["A", "B", "C"]


async def test_due_jobs_start_oldest_first_when_claimed_ahead(pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    work = Held()
    engine = make_engine([define_queue(name="q", handler=work, concurrency=1)], store=pg_url)
    await engine.open()
    for i in range(40):
        await engine.jobs.send("q", {"name": str(i)})
        clock.advance(0.001)
    await engine.start()
    await until(lambda: len(work.ran) == 40, "every job ran")
    await engine.quiesce()
    assert work.ran == [str(i) for i in range(40)]


async def _claiming_ahead(make_engine: Callable[..., Engine], pg_url: str, work: Held, held: str) -> tuple[Engine, Any]:
    """Instance a, running queue ``q`` at concurrency 2: two of ``held``'s jobs running (held),
    more claimed ahead behind them, and its listening connection up; a and its workers."""
    a = make_engine([define_queue(name="q", handler=work, concurrency=2)], store=pg_url, instance="a")
    await a.start()
    await a.jobs.send_many("q", Held.batch(8, held))
    workers = a.jobs.workers
    assert workers is not None
    await until(lambda: len(work.running) == 2 and bool(workers.waiting["q"]), "two held jobs running, more waiting")
    # It hears of changes on its listening connection: one that comes up after a change was
    # said (a loaded machine) never hears it.
    store: Any = a.store
    await until(lambda: store._listener is not None and store._listener.up, "the first instance listening")
    return a, workers


async def _one_at_a_time_to_the_end(work: Held, held: str, clock: ManualClock, *engines: Engine) -> None:
    """End the held jobs as they run until all of ``held`` ran: each once, none beside another."""
    while len([n for n in work.ran if n in held]) < len(held) or work.running:
        work.end(*work.running.values())
        clock.advance(1)  # (a seat above the cap freed: the claims resume at the next poll)
        for engine in engines:
            await engine.quiesce(runs=False)
    assert work.over == []
    assert sorted(n for n in work.ran if n in held) == sorted(held)  # each once


async def test_a_concurrency_lowered_by_another_instance_holds_for_the_jobs_claimed_ahead(
    pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """An instance runs a queue at concurrency 2 with jobs claimed ahead behind its busy
    seats; another starts with the queue defined at 1 (a rolling deploy). The first hears
    of it and gives those jobs back: no job starts beside another from then on."""
    work, held = Held(), "ABCDEFGHIJ"
    a, workers = await _claiming_ahead(make_engine, pg_url, work, held)
    b = make_engine([define_queue(name="q", handler=work, concurrency=1)], store=pg_url, instance="b")
    await b.start()
    while (await a.jobs.queue_view("q")).concurrency != 1:
        await b.quiesce(runs=False)
    work.cap = 1
    await until(lambda: not workers.waiting["q"], "the first instance gave back what it claimed ahead")
    await _one_at_a_time_to_the_end(work, held, clock, a, b)


async def test_a_change_said_while_the_listener_was_down_is_made_up_for_when_it_comes_back(
    pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """As above, but the first instance's listening connection is down while the second
    one's start says the lower concurrency (the notification reaches nobody there). When
    the connection comes back, the jobs claimed ahead go back all the same, for every
    queue: no job starts beside another (they stayed claimed ahead, and started two at a
    time, until a claim happened to look at the queue again)."""
    work, held = Held(), "ABCDEFGHIJ"
    a, workers = await _claiming_ahead(make_engine, pg_url, work, held)
    store: Any = a.store
    listener = store._listener
    listener._state(False)  # the connection is lost: what is said meanwhile, nobody here hears
    dispatch, listener._dispatch = listener._dispatch, lambda channel, payload: None
    b = make_engine([define_queue(name="q", handler=work, concurrency=1)], store=pg_url, instance="b")
    await b.start()
    while (await a.jobs.queue_view("q")).concurrency != 1:
        await b.quiesce(runs=False)
    await a.quiesce(runs=False)
    assert workers.waiting["q"]  # not heard: still claimed ahead
    listener._dispatch = dispatch
    listener._state(True)  # back
    work.cap = 1
    await until(lambda: not workers.waiting["q"], "the first instance gave back what it claimed ahead")
    await _one_at_a_time_to_the_end(work, held, clock, a, b)


# ---------------------------------------------------------------------------------------
# workers that die, or come back late
# ---------------------------------------------------------------------------------------
async def test_a_job_whose_instance_died_is_retried_within_the_abandon_window(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler, attempts=3)], abandon_after=30)
    await engine.open()
    sent = await engine.jobs.send("mail", "x")
    store: Any = engine.store
    await store.heartbeat("ghost", "another-host", 1, clock.now())
    claimed = (await store.cycle_jobs([], {"mail": 1}, "ghost", "tok", clock.now())).claimed
    assert [c.id for c in claimed] == [sent.id]
    await engine.start()
    clock.advance(30)
    await engine.quiesce()
    assert handler.calls == []  # its heartbeat is 30s old: not gone yet
    clock.advance(1)
    await engine.quiesce()
    assert [(c.id, c.attempt) for c in handler.calls] == [(sent.id, 2)]
    attempts = (await detail(engine, sent.id)).attempts
    assert [(a.attempt, a.status, a.error_tag, a.instance) for a in attempts] == [
        (1, "failed", "abandoned", "ghost"), (2, "succeeded", None, engine.instance)
    ]
    assert "has not sent a heartbeat since" in (attempts[0].error_message or "")


async def test_an_instance_without_queues_closes_a_dead_instances_running_jobs(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A deploy that moved every queue out of a serve's definitions, after a crash: the dead
    instance's job stayed running on a gone instance for good, its seat taken, because only
    an instance with workers looked (outside attack: the code changes between deploys)."""
    sender = make_engine([define_queue(name="mail", handler=Handler(), attempts=3)], instance="old")
    await sender.open()
    sent = await sender.jobs.send("mail", "x")
    store: Any = sender.store
    await store.heartbeat("ghost", "another-host", 1, clock.now())
    await store.cycle_jobs([], {"mail": 1}, "ghost", "tok", clock.now())
    engine = make_engine([], abandon_after=30)  # the new release: no queue at all
    await engine.start()
    clock.advance(31)
    await engine.quiesce()
    job = (await detail(engine, sent.id)).job
    assert (job.status, job.attempt) == ("queued", 1)  # retried: due again for an instance with the queue
    attempts = (await detail(engine, sent.id)).attempts
    assert [(a.attempt, a.status, a.error_tag, a.instance) for a in attempts] == [(1, "failed", "abandoned", "ghost")]


async def test_jobs_of_a_queue_no_instance_runs_are_said_in_the_log(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A deploy that renamed a queue: sends to the old name are still accepted (it is
    recorded), and its jobs waited in silence, nothing in any log nor alert (outside attack:
    code changes between deploys). As for a durable function nobody defines, an instance
    that does not run the queue says so, at most every 5 minutes."""
    old = make_engine([define_queue(name="mailer", handler=Handler())], instance="old")
    await old.open()
    for n in range(3):
        await old.jobs.send("mailer", n)
    new = make_engine([define_queue(name="mailer-v2", handler=Handler())], instance="new")
    await new.start()
    with caplog.at_level(logging.WARNING, "schedtui.jobs"):
        await new.quiesce()
        assert not [r for r in caplog.records if "no instance has claimed them" in r.getMessage()]  # due just now
        clock.advance(61)
        await new.maintain()
        clock.advance(60)
        await new.maintain()  # (said again in 5 minutes, not at every round)
    said = [r.getMessage() for r in caplog.records if "no instance has claimed them" in r.getMessage()]
    assert said == [
        '3 job(s) of queue "mailer" have been due for over 60s and no instance has claimed them; this instance '
        "does not run that queue (it runs: mailer-v2)"
    ]


async def test_an_abandoned_last_attempt_makes_the_job_dead(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([define_queue(name="mail", handler=Handler(), attempts=1)], abandon_after=30)
    await engine.open()
    sent = await engine.jobs.send("mail", "x")
    store: Any = engine.store
    await store.heartbeat("ghost", "another-host", 1, clock.now())
    await store.cycle_jobs([], {"mail": 1}, "ghost", "tok", clock.now())
    await engine.start()
    clock.advance(31)
    await engine.quiesce()
    job = (await detail(engine, sent.id)).job
    assert (job.status, job.error_tag) == ("dead", "abandoned")


async def test_a_late_result_from_a_displaced_worker_is_discarded(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    calls: list[int] = []

    async def work(job: JobContext) -> None:
        calls.append(job.attempt)
        if job.attempt == 1:
            await gate.wait()
            raise RuntimeError("late and wrong")

    engine = make_engine([define_queue(name="mail", handler=work, attempts=3)])
    await engine.start()
    sent = await engine.jobs.send("mail", "x")
    await engine.quiesce(runs=False)
    while calls != [1]:
        await asyncio.sleep(0)
    # Another instance judged this one gone and closed the attempt (as its sweep would).
    store: Any = engine.store
    (running,) = await store.running_jobs()

    abandoned = Finish(sent.id, "mail", running.tries, "dead", 1, running.started_at, clock.now(), engine.instance, "abandoned", "gone")
    await store.finish_jobs([abandoned])
    with caplog.at_level(logging.WARNING, "schedtui.jobs"):
        gate.set()
        await engine.quiesce()
    job = (await detail(engine, sent.id)).job
    assert (job.status, job.error_tag) == ("dead", "abandoned")  # unchanged by the late failure
    assert [(a.attempt, a.error_tag) for a in (await detail(engine, sent.id)).attempts] == [(1, "abandoned")]
    assert "late result of job" in caplog.text


async def test_stopping_interrupts_a_job_and_it_is_retried_at_once(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str
) -> None:
    started = asyncio.Event()

    async def forever(job: JobContext) -> None:
        started.set()
        await asyncio.Event().wait()

    engine = make_engine([define_queue(name="mail", handler=forever, attempts=3)])
    await engine.start()
    sent = await engine.jobs.send("mail", "x")
    await started.wait()
    await engine.stop(grace=0)
    again = make_engine([define_queue(name="mail", handler=Handler(), attempts=3)])
    await again.open()
    job = (await detail(again, sent.id)).job
    assert (job.status, job.attempt, job.run_after, job.error_tag) == ("queued", 1, clock.now(), "interrupted")


# ---------------------------------------------------------------------------------------
# schedules that target a queue
# ---------------------------------------------------------------------------------------
def test_a_schedule_takes_a_handler_or_a_queue() -> None:
    with pytest.raises(DefinitionError, match="give a handler or a queue, not both"):
        define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=Handler(), queue="mail")  # type: ignore[arg-type]  # refused: both
    with pytest.raises(DefinitionError, match="queue 'bad name' is not a queue name"):
        define_schedule(name="s", cron="* * * * *", timezone="UTC", queue="bad name")


async def test_each_slot_enqueues_one_job_and_run_now_one_more(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    handler = Handler(fail=lambda job: True)
    queue = define_queue(name="mail", handler=handler, attempts=5)
    digest = define_schedule(name="digest", cron="*/5 * * * *", timezone="UTC", queue="mail", payload={"list": "all"})
    engine = make_engine([queue, digest])
    await engine.start()
    fired = expect(engine, lambda run: run.status == "succeeded")
    clock.advance(300)
    await engine.quiesce()
    run = await fired
    (job,) = handler.calls
    assert (job.id, job.payload, job.cron, job.max_attempts) == (run.id, {"list": "all"}, "digest", 1)
    dead = (await detail(engine, run.id)).job
    assert dead.status == "dead"  # one attempt: its next slot is its retry
    manual = await engine.run_now("digest", wait=True)
    await engine.quiesce()
    assert manual.status == "succeeded" and [c.id for c in handler.calls] == [run.id, manual.id]


async def test_a_slot_is_enqueued_once_across_instances(pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    digest = define_schedule(name="digest", cron="*/5 * * * *", timezone="UTC", queue="mail")
    engines = [make_engine([define_queue(name="mail", handler=Handler()), digest], store=pg_url) for _ in range(3)]
    for engine in engines:
        await engine.open()
    await engines[0].jobs.set_paused("mail", True)  # keep the jobs to count them
    for engine in engines:
        await engine.start()
    clock.advance(300)
    for engine in engines:
        await engine.quiesce()
    page = await engines[0].jobs.list_jobs("mail")
    assert [(j.cron, j.status) for j in page.jobs] == [("digest", "queued")]


# ---------------------------------------------------------------------------------------
# connect(), the sync twin, and a full queue
# ---------------------------------------------------------------------------------------
async def test_connect_sends_without_running_anything(tmp_path: Path, make_engine: Callable[..., Engine], store_url: str) -> None:
    handler = Handler()
    serving = make_engine([define_queue(name="mail", handler=handler)])
    await serving.open()  # records the queue
    async with connect(store_url) as st:
        sent = await st.jobs.send("mail", {"order": 42}, key="receipt:42")
        again = await st.jobs.send("mail", {"order": 42}, key="receipt:42")
        assert (again.id, again.duplicate) == (sent.id, True)
        many = await st.jobs.send_many("mail", [{"payload": 1, "delay": 60}, {"payload": 2, "key": "receipt:42"}])
        assert [s.duplicate for s in many] == [False, True]
        assert [q.queued for q in await st.jobs.queues()] == [2]
        assert await st.jobs.cancel("mail", key="receipt:42")
        assert (await st.jobs.pause("mail")).paused
        assert not (await st.jobs.resume("mail")).paused
        page = await st.jobs.list(many[0].id and "mail", status="queued")
        assert [j.id for j in page.jobs] == [many[0].id]
    assert handler.calls == []


def test_connect_sync_mirrors_the_job_actions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = define_queue(name="mail", handler=Handler())
    with connect_sync(url, definitions=[queue], create=True) as st:
        sent = st.jobs.send("mail", "hello", delay=10)
        assert st.jobs.get(sent.id).job.payload == "hello"
        assert st.jobs.cancel("mail", sent.id) is True


async def test_a_full_queue_refuses_until_jobs_run(make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.store.sqlite import jobs as sqlite_jobs

    monkeypatch.setattr(sqlite_jobs, "MAX_HELD", 3)
    handler = Handler()
    engine = make_engine([define_queue(name="mail", handler=handler)])
    await engine.open()
    await engine.jobs.send_many("mail", [{"payload": i} for i in range(3)])
    with pytest.raises(QueueFull, match='queue "mail" is full'):
        await engine.jobs.send("mail", 3)
    await engine.start()
    await engine.quiesce()
    await engine.jobs.send("mail", 3)
    await engine.quiesce()
    assert sorted(c.payload for c in handler.calls) == [0, 1, 2, 3]


async def test_a_schedule_handler_sends_through_its_context(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    handler = Handler()

    async def nightly(ctx: RunContext) -> None:
        await ctx.jobs.send("mail", {"slot": ctx.scheduled_at.isoformat()})

    engine = make_engine(
        [define_queue(name="mail", handler=handler), define_schedule(name="n", cron="0 * * * *", timezone="UTC", handler=nightly)]
    )
    await engine.start()
    clock.advance(3600)
    await engine.quiesce()
    assert [c.payload for c in handler.calls] == [{"slot": "2026-03-02T09:00:00+00:00"}]


async def test_dead_jobs_and_old_attempts_are_swept(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([define_queue(name="mail", handler=Handler(fail=lambda job: True), attempts=1)])
    await engine.start()
    sent = await engine.jobs.send("mail", "x")
    await engine.quiesce()
    assert (await detail(engine, sent.id)).job.status == "dead"
    clock.advance(timedelta(days=7, hours=1))  # the sweep runs hourly
    await engine.quiesce()
    with pytest.raises(NotFound):
        await engine.jobs.get_job(sent.id)


async def test_a_schedule_targeting_an_unknown_queue_fails_its_runs_saying_so(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "schedtui.engine"):
        engine = make_engine([define_schedule(name="orphan", cron="* * * * *", timezone="UTC", queue="nowhere")])
    assert 'sends its jobs to queue "nowhere", which these definitions do not define' in caplog.text
    await engine.start()
    run = await engine.run_now("orphan", wait=True)
    assert (run.status, run.error_tag, run.error_message) == ("failed", "NotFound", 'no queue named "nowhere"')
