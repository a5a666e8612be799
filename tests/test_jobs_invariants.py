"""The job queue's invariants under random sequences (Hypothesis, bounded examples).

Two or three engines share one store on the manual clock. Random steps send jobs (with
and without keys, delays, attempts), let running attempts succeed or fail, move the
clock (retries come due, attempts time out), cancel, delete, retry dead jobs, pause and
resume queues, and kill an instance outright (its handlers stop, nothing it had in hand
is written) to start a fresh one. After every step (and inside every handler call) the
invariants of :mod:`backend.jobs.store` are checked:

* no job is lost: every job sent and not cancelled or deleted is in the store, or has a
  succeeded attempt;
* no attempt of a job runs twice at once, and never more than the queue's concurrency;
* a key is never held by two live jobs;
* attempts never exceed the maximum, and a job is dead only after its last attempt.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from backend import Engine, JobContext, ManualClock, NotFound, define_queue
from backend.ids import IdFactory
from backend.jobs.model import Job, NotDead
from tests import pg

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
CAPS = {"q": 2, "r": 1}
MAX_RUNTIME = 60
ABANDON_AFTER = 30


@dataclass
class Live:
    """An attempt whose handler is running now."""

    job: JobContext
    result: asyncio.Future[bool]
    instance: str


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.mkdtemp(prefix="schedtui-jobs-inv-")
        self.url = self.store_url()
        self.clock = ManualClock(T0)
        self.live: dict[str, Live] = {}
        self.sent: dict[str, tuple[str, str | None]] = {}  # id -> (queue, key)
        self.gone: set[str] = set()  # cancelled or deleted by the test
        self.engines: dict[str, Engine] = {}
        self.serial = 0
        # One id factory for every instance, without randomness: jobs sent at one instant
        # are claimed in one order, so a run of steps replays exactly (random ids from two
        # factories would order them differently each time).
        self.ids = IdFactory(self.clock.now, random_bits=itertools.count().__next__)
        for _ in range(2):
            self.run(self.start_engine())

    # -- plumbing ---------------------------------------------------------------------------
    def store_url(self) -> str:
        return f"sqlite:///{self.folder}/state.db"

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    def handler_for(self, instance: str) -> Any:
        async def handle(job: JobContext) -> None:
            # Checked at the start of every attempt, on every instance.
            assert job.id not in self.live, f"two attempts of job {job.id} at once"
            assert sum(1 for a in self.live.values() if a.job.queue == job.queue) < CAPS[job.queue], "cap exceeded"
            assert 1 <= job.attempt <= job.max_attempts, f"attempt {job.attempt} of {job.max_attempts}"
            live = Live(job, self.loop.create_future(), instance)
            self.live[job.id] = live
            try:
                if not await live.result:
                    raise RuntimeError("failed on purpose")
            finally:
                if self.live.get(job.id) is live:
                    del self.live[job.id]

        return handle

    async def start_engine(self) -> None:
        self.serial += 1
        name = f"i{self.serial}"
        handler = self.handler_for(name)
        queues = [define_queue(name=q, handler=handler, concurrency=c, max_runtime=MAX_RUNTIME) for q, c in CAPS.items()]
        engine = Engine(
            queues, self.url, clock=self.clock, instance=name, coordination="advisoryLock",
            abandon_after=ABANDON_AFTER, shutdown_grace=0, ids=self.ids,
        )  # fmt: skip
        await engine.start()
        self.engines[name] = engine
        await self.settle()

    def busy(self) -> bool:
        """Something the last step set off has not happened yet: a claimed job whose handler
        has not begun, or an attempt told to end that has not ended."""
        for engine in self.engines.values():
            workers = engine.jobs.workers
            assert workers is not None
            if workers.inflight or any(run.context is None and not run.done for run in workers.running.values()):
                return True
        return any(live.result.done() for live in self.live.values())

    async def settle(self) -> None:
        """Wait until every engine has done all the current time calls for (what happens
        next then depends on the steps alone, never on timing)."""
        while True:
            for engine in list(self.engines.values()):
                await engine.quiesce(runs=False)
            if not self.busy():
                await asyncio.sleep(0)
                if not self.busy():
                    return
            await asyncio.sleep(0)

    def any_engine(self, pick: int) -> Engine:
        names = sorted(self.engines)
        return self.engines[names[pick % len(names)]]

    def pick_sent(self, pick: int) -> tuple[str, str, str | None]:
        ids = sorted(self.sent)
        job_id = ids[pick % len(ids)]
        queue, key = self.sent[job_id]
        return job_id, queue, key

    async def store_jobs(self) -> list[Job]:
        engine = self.any_engine(0)
        jobs: list[Job] = []
        for queue in CAPS:
            before = None
            while True:
                page = await engine.jobs.list_jobs(queue, limit=1000, before=before)
                jobs.extend(page.jobs)
                if page.next_before is None:
                    break
                before = page.next_before
        return jobs

    def teardown(self) -> None:
        try:
            for engine in self.engines.values():
                self.loop.run_until_complete(engine.stop(grace=0))
        finally:
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- rules -------------------------------------------------------------------------------
    # No rule has a precondition: which instance claims a job depends on thread timing (the
    # stores' writer threads), so what runs where may differ between two replays of the
    # same steps; the steps themselves, and the invariants they are checked against, do not.
    @rule(
        pick=st.integers(0, 9),
        queue=st.sampled_from(sorted(CAPS)),
        key=st.one_of(st.none(), st.sampled_from(["k1", "k2"])),
        attempts=st.integers(1, 3),
        delay=st.sampled_from([0, 0, 0, 5, 25]),
    )
    def send(self, pick: int, queue: str, key: str | None, attempts: int, delay: int) -> None:
        engine = self.any_engine(pick)
        sent = self.run(engine.jobs.send(queue, {"n": len(self.sent)}, delay=delay, attempts=attempts, key=key))
        if not sent.duplicate:
            assert sent.id not in self.sent
            self.sent[sent.id] = (queue, key)
        else:
            assert key is not None and self.sent[sent.id] == (queue, key), "a duplicate names the job holding the key"
        self.run(self.settle())

    @rule(pick=st.integers(0, 99), ok=st.booleans())
    def finish_an_attempt(self, pick: int, ok: bool) -> None:
        if not self.live:
            return
        live = self.live[sorted(self.live)[pick % len(self.live)]]
        live.result.set_result(ok)
        self.run(self.settle())

    @rule(seconds=st.integers(1, 20))
    def advance(self, seconds: int) -> None:
        # At most 20s a step: a live instance beats every 5s, so it never looks dead (30s).
        self.clock.advance(seconds)
        self.run(self.settle())

    @rule(pick=st.integers(0, 99), by_key=st.booleans())
    def cancel(self, pick: int, by_key: bool) -> None:
        if not self.sent:
            return
        job_id, queue, key = self.pick_sent(pick)
        by_key = by_key and key is not None
        before = self.run(self.store_jobs())
        queued = {j.id for j in before if j.queue == queue and j.status == "queued" and
                  (j.key == key if by_key else j.id == job_id)}  # fmt: skip
        jobs = self.any_engine(pick).jobs
        cancelled = self.run(jobs.cancel(queue, key=key) if by_key else jobs.cancel(queue, job_id))
        assert cancelled == bool(queued), (job_id, key, by_key, queued)
        self.gone |= queued
        self.run(self.settle())

    @rule(pick=st.integers(0, 99))
    def delete(self, pick: int) -> None:
        if not self.sent:
            return
        job_id, queue, _ = self.pick_sent(pick)
        try:
            self.run(self.any_engine(pick).jobs.delete(queue, job_id))
        except NotFound:
            return
        self.gone.add(job_id)
        self.run(self.settle())

    @rule(pick=st.integers(0, 99))
    def retry(self, pick: int) -> None:
        if not self.sent:
            return
        job_id, queue, _ = self.pick_sent(pick)
        try:
            job = self.run(self.any_engine(pick).jobs.retry(queue, job_id))
        except (NotFound, NotDead):
            return
        assert (job.status, job.attempt) == ("queued", 0)
        self.run(self.settle())

    @rule(queue=st.sampled_from(sorted(CAPS)), paused=st.booleans(), pick=st.integers(0, 9))
    def pause_or_resume(self, queue: str, paused: bool, pick: int) -> None:
        view = self.run(self.any_engine(pick).jobs.set_paused(queue, paused))
        assert view.paused == paused
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def kill_an_instance(self, pick: int) -> None:
        """SIGKILL, as far as one process can play it: the instance's loops and handlers
        stop where they are and nothing it holds is written; a fresh instance starts."""
        engine = self.any_engine(pick)

        async def kill() -> None:
            del self.engines[engine.instance]
            workers = engine.jobs.workers
            assert workers is not None
            workers.stopping = True
            await engine.loops.cancel_all()
            tasks = [run.task for run in workers.running.values() if run.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            workers.finishes.clear()  # what it had not written dies with it
            workers.inflight.clear()
            await engine.store.close()
            await self.start_engine()

        self.run(kill())

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def the_store_keeps_every_promise(self) -> None:
        jobs = self.run(self.store_jobs())
        by_id = {j.id: j for j in jobs}
        held: dict[tuple[str, str], str] = {}
        for job in jobs:
            assert job.id in self.sent, f"a job nobody sent: {job.id}"
            assert 0 <= job.attempt <= job.max_attempts, job
            if job.status == "dead":
                assert job.attempt == job.max_attempts, f"dead before its last attempt: {job}"
            if job.key is not None:
                assert (job.queue, job.key) not in held, f"key {job.key} held by {held[(job.queue, job.key)]} and {job.id}"
                held[(job.queue, job.key)] = job.id
        views = {v.name: v for v in self.run(self.any_engine(0).jobs.queue_views())}
        for queue, cap in CAPS.items():
            assert views[queue].running <= cap
        for job_id in self.sent:
            if job_id in by_id or job_id in self.gone:
                continue
            detail = self.run(self.any_engine(0).jobs.get_job(job_id))
            assert any(a.status == "succeeded" for a in detail.attempts), f"job {job_id} is lost: {detail}"
        for job in jobs:
            if job.status != "dead":
                continue
            attempts = self.run(self.any_engine(0).jobs.get_job(job.id)).attempts
            assert attempts and attempts[-1].attempt == job.max_attempts and attempts[-1].status == "failed"


class PostgresQueueMachine(QueueMachine):
    """The same on PostgreSQL: claims of two instances are concurrent transactions there."""

    def store_url(self) -> str:
        assert pg.ACTIVE is not None
        return pg.ACTIVE.create_database("inv")


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )


def test_job_queue_invariants_on_sqlite() -> None:
    run_state_machine_as_test(QueueMachine, settings=bounded(25))


@pytest.mark.postgres
def test_job_queue_invariants_on_postgres(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(PostgresQueueMachine, settings=bounded(8))
