"""The job queue's invariants under random sequences (Hypothesis, bounded examples).

Two or three engines share one store on the manual clock. Random steps send jobs (with
and without keys, delays, attempts), let running attempts succeed or fail, move the
clock (retries come due, attempts time out), cancel, delete, retry dead jobs, pause and
resume queues, kill an instance outright (its handlers stop, nothing it had in hand
is written) to start a fresh one, and stop one cleanly while its claim is on its way to a
server that commits it only once the stop has begun. The faults of the liveness model too: handlers that
outlive their deadline (a sync one on its thread, an async one that ignores its
cancellation), a partition of one worker (its store calls fail: its lease lapses and it
stops its work, or ends its process when it cannot; the others take its jobs over after
the window; it may come back), a partition that begins just after a worker's claim
committed, its answer arriving after the partition healed (before or after a heartbeat
renewed the lease), cycles that commit and lose their answer while the worker goes on
(what they claimed never started: it must go back untouched), a sweep for abandoned work
whose read of the running jobs answers rounds later (as such a partition heals, or at
any step), an outage of the store
longer than the window for every
worker at once, instances in different PID namespaces of one host
(simulated: each records a namespace of its own and a pid that is dead here), a worker
replaced under its own name while cut off (it runs on once the partition heals, its
heartbeats refused), and wall
clocks that step (NTP, a VM restored) while the lease clock does not, against a database
clock that is the manual clock (the lease lapses until a heartbeat finds them agreeing
again; time sync puts one right later). After
every step (and at the start of every handler call) the invariants of
:mod:`backend.jobs.store` are checked:

* no job is lost: every job sent and not cancelled or deleted is in the store, or has a
  succeeded attempt;
* no attempt of a job runs twice at once, and never more than the queue's concurrency;
* a worker whose lease has lapsed starts no handler;
* a key is never held by two live jobs;
* attempts never exceed the maximum, and a job is dead only after its last attempt;
* each attempt is recorded once (numbered anew after an operator's retry of a dead job);
* an attempt is used only by a handler that began, or by a claim of an instance that
  died or was taken over (nobody can know whether it began);
* once every fault heals and every handler succeeds (a rule), nothing is left running
  and nothing due waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from backend import Engine, JobContext, ManualClock, NotFound, Unavailable, define_queue, open_store
from backend.clock import OffsetClock
from backend.ids import IdFactory
from backend.jobs.model import Job, NotDead, QueueFull
from backend.jobs.store import REVOKE, QueueSpec
from backend.jobs.system import OWN_CLAIM_CLOSED
from backend.runtime.skew import ClockCheck
from backend.scheduler import names
from backend.scheduler.registry import host_identity
from backend.store.postgres import jobs as postgres_jobs
from backend.store.sqlite import jobs as sqlite_jobs
from tests import pg
from tests.bounded import run_within
from tests.servers import dead_pid

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
CAPS = {"q": 2, "r": 1, "s": 1}
SYNC = {"s"}  # its handler runs on a thread
MAX_RUNTIME = 60
ABANDON_AFTER = 30


DEAD_PID = dead_pid()


@dataclass
class Live:
    """An attempt whose handler is running now."""

    job: JobContext
    result: asyncio.Future[bool]
    instance: str
    engine: Engine
    """The process it runs in (two may go by one name: see ``replaced_under_its_name``)."""
    told: threading.Event = field(default_factory=threading.Event)
    """Set (with ``ok``) when the test lets the handler end (one on a thread waits for it)."""
    ok: list[bool] = field(default_factory=list)


#: The store's writes that :attr:`CutStore.sent_twice` sends twice (those on its pool: the
#: cycles and sends go on connections of their own while one is free).
SENT_TWICE = frozenset({"cancel_job", "delete_job", "retry_job", "finish_jobs", "cycle_jobs", "send_jobs", "pause_queue"})
_SENDING_TWICE: contextvars.ContextVar[bool] = contextvars.ContextVar("sending_twice", default=False)


class CutStore:
    """An engine's store whose calls all fail while its engine is cut off (a partition of
    that one worker); handing runs in and flushing still work, as with the real stores.
    Its server's clock is the machine's manual clock (every instance compares its own,
    which may have stepped, with it)."""

    PASSING = {"open", "close", "flush", "save_runs", "health"}

    def __init__(self, inner: Any, server: ManualClock) -> None:
        self.inner = inner
        self.server = server
        self.cut = False
        self.cut_after_claim = False
        """The next claim commits, then the partition begins: its answer is on its way
        until :meth:`answers_arrive` (after the partition healed, or not)."""
        self.late: dict[str, asyncio.Event] = {}
        """The cycles (by token) whose answers are on their way."""
        self.lose_answers = 0
        """The next so many cycles (or sweeps' finishes) commit, then their answer is lost:
        the call fails as if the connection broke after the commit; the worker goes on."""
        self.old_read: Any = None
        """The running jobs, read for a sweep for abandoned work whose answer comes late."""
        self.read_in = 0
        """The sweeps' rounds until that answer comes: those before it wait for it (they
        see nothing running), and that one decides on it."""
        self.hold_claims: asyncio.Event | None = None
        """While set up: a cycle that claims reaches the server, which commits it only once
        this is set, whatever the client does meanwhile (its answer is then on its way)."""
        self.held_claimed: list[Any] = []
        """What those claims took."""
        self.sent_twice = 0
        """The next so many writes of :data:`SENT_TWICE` (PostgreSQL) send each of their
        statements on the pool twice: the first commits and its answer is lost, and the store
        sends it again on a fresh connection, as it does after a connection broken in flight
        (``_with_conn``). The first sending runs to its end here, where a broken connection
        cuts it short after its commit: a send's second sending is SEND, not SEND_AGAIN (they
        differ only for a job that ran and is gone in between, which no step here does)."""
        sending = getattr(inner, "_with_conn", None)
        if sending is not None:

            async def with_conn(fn: Any, **kwargs: Any) -> Any:
                if _SENDING_TWICE.get():
                    await sending(fn, **kwargs)  # (committed, its answer lost)
                return await sending(fn, **kwargs)

            inner._with_conn = with_conn

    async def read_late(self, rounds: int) -> None:
        """The sweep reads the running jobs now; the answer comes ``rounds`` rounds later."""
        self.old_read = await self.inner.running_jobs()
        self.read_in = rounds

    def answers_arrive(self) -> None:
        for arrived in self.late.values():
            arrived.set()

    async def server_clock(self) -> datetime:
        if self.cut:
            raise Unavailable("cut off from the store (test)")
        return self.server.now()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in self.PASSING or not asyncio.iscoroutinefunction(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise Unavailable("cut off from the store (test)")
            if name == "cycle_jobs" and self.hold_claims is not None and args[1]:
                commit, token = self.hold_claims, args[3]
                self.late[token] = commit  # (on its way: settling does not wait for it)

                async def server() -> Any:
                    await commit.wait()
                    self.late.pop(token, None)
                    cycle = await value(*args, **kwargs)
                    self.held_claimed.extend(cycle.claimed)
                    return cycle

                return await asyncio.shield(asyncio.ensure_future(server()))
            if name == "running_jobs" and self.old_read is not None:
                self.read_in -= 1
                if self.read_in > 0:
                    return []
                old, self.old_read = self.old_read, None
                return old
            if name in SENT_TWICE and self.sent_twice > 0:
                self.sent_twice -= 1
                twice = _SENDING_TWICE.set(True)
                try:
                    result = await value(*args, **kwargs)
                finally:
                    _SENDING_TWICE.reset(twice)
            else:
                result = await value(*args, **kwargs)
            if name in ("cycle_jobs", "finish_jobs") and self.lose_answers:
                self.lose_answers -= 1
                raise Unavailable("the connection broke after the commit (test)")
            if name == "cycle_jobs" and self.cut_after_claim and getattr(result, "claimed", None):
                self.cut_after_claim = False
                self.cut = True
                token = args[3]
                arrived = self.late[token] = asyncio.Event()
                try:
                    await arrived.wait()
                finally:
                    self.late.pop(token, None)
            return result

        return call


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.mkdtemp(prefix="schedtui-jobs-inv-")
        self.url = self.store_url()
        self.clock = ManualClock(T0)
        self.live: dict[str, Live] = {}
        self.violations: list[str] = []
        self.stores: dict[str, CutStore] = {}
        self.every_store: list[CutStore] = []
        """Every instance's store, those of instances gone since included (a killed one may
        have left a call waiting for an answer the test holds)."""
        self.ended: set[Engine] = set()
        """Processes that ended themselves (their lease lapsed with handlers running)."""
        self.renamed: set[str] = set()
        """Names a second process has taken (see ``replaced_under_its_name``)."""
        self.zombies: dict[Engine, CutStore] = {}
        """Processes whose name another process took while they were cut off: they run on,
        their partition healed, and must start and write nothing more."""
        self.sent: dict[str, tuple[str, str | None]] = {}  # id -> (queue, key)
        self.gone: set[str] = set()  # cancelled or deleted by the test
        self.started: set[tuple[str, int]] = set()
        """Every attempt whose handler began (job id, attempt)."""
        self.retried: Counter[str] = Counter()
        """Per job, how many times an operator retried it dead (its attempts count anew)."""
        self.died: set[str] = set()
        """Instances whose process ended (killed, or ended itself)."""
        self.engines: dict[str, Engine] = {}
        self.walls: dict[str, OffsetClock] = {}
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
        return run_within(self.loop, coro, 30)

    def check_start(self, job: JobContext, instance: str, engine: Engine) -> Live:
        """At the start of every attempt, on every instance (a violation is noted, not
        raised: the handler would only fail its attempt)."""
        if job.id in self.live:
            self.violations.append(f"two attempts of job {job.id} at once")
        if sum(1 for a in self.live.values() if a.job.queue == job.queue) >= CAPS[job.queue]:
            self.violations.append(f"the cap of {job.queue} exceeded by {job.id}")
        if not 1 <= job.attempt <= job.max_attempts:
            self.violations.append(f"attempt {job.attempt} of {job.max_attempts}")
        if engine.lease.lapsed:
            self.violations.append(f"{instance} started job {job.id} with its lease lapsed")
        live = Live(job, self.loop.create_future(), instance, engine)
        self.live[job.id] = live
        self.started.add((job.id, job.attempt))
        return live

    def handler_for(self, instance: str, process: list[Engine]) -> Any:
        async def handle(job: JobContext) -> Any:
            if job.payload.get("lazy"):
                return work(job)  # its await left out (see send_one_whose_handler_returns_its_work)
            return await work(job)

        async def work(job: JobContext) -> None:
            live = self.check_start(job, instance, process[0])
            try:
                while True:
                    try:
                        ok = await asyncio.shield(live.result)
                        break
                    except asyncio.CancelledError:
                        if not job.payload.get("stubborn"):
                            raise
                        # it ignores its deadline (and its lease's lapse) until told to end
                if not ok:
                    raise RuntimeError("failed on purpose")
            finally:
                if self.live.get(job.id) is live:
                    del self.live[job.id]

        return handle

    def sync_handler_for(self, instance: str, process: list[Engine]) -> Any:
        def handle(job: JobContext) -> None:
            # The checks run on the loop's thread, where the rest of the machine runs.
            began = asyncio.run_coroutine_threadsafe(self._begin(job, instance, process[0]), self.loop)
            live = began.result(30)
            try:
                live.told.wait(60)
                if not (live.ok and live.ok[0]):
                    raise RuntimeError("failed on purpose")
            finally:
                ended = threading.Event()

                def end() -> None:
                    if self.live.get(job.id) is live:
                        del self.live[job.id]
                    ended.set()

                # A plain callback, not a coroutine: one never awaited (its loop closed at the
                # machine's teardown) is finalized by whatever runs the garbage collector.
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
                    self.loop.call_soon_threadsafe(end)
                    ended.wait(30)

        return handle

    async def begins(self, job: Job) -> bool:
        """Whether the attempt a ``running`` row shows began. A sync handler begins on a
        thread, which may reach its first line (and ask this loop to note it) only after
        the stop that left it running: its note is waited for, a bounded while."""
        attempt = (job.id, job.attempt)
        if job.queue in SYNC:
            deadline = self.loop.time() + 10
            while attempt not in self.started and self.loop.time() < deadline:
                await asyncio.sleep(0.01)
        return attempt in self.started

    async def _begin(self, job: JobContext, instance: str, engine: Engine) -> Live:
        return self.check_start(job, instance, engine)

    async def start_engine(self, name: str | None = None) -> None:
        """A new process: under a name of its own, or under ``name`` (a replacement: see
        ``replaced_under_its_name``, which starts it once the name's last holder has been
        silent for the window, so it takes the name at once)."""
        self.serial += 1
        name = name or f"i{self.serial}"
        process: list[Engine] = []
        handlers = {q: self.sync_handler_for(name, process) if q in SYNC else self.handler_for(name, process) for q in CAPS}
        queues = [define_queue(name=q, handler=handlers[q], concurrency=c, max_runtime=MAX_RUNTIME) for q, c in CAPS.items()]
        store = CutStore(open_store(self.url), self.clock)
        self.every_store.append(store)
        wall = self.walls[name] = OffsetClock(timedelta(0), self.clock)  # its wall clock, which may step
        engine = Engine(
            queues, store, clock=wall, instance=name, coordination="advisoryLock",
            abandon_after=ABANDON_AFTER, shutdown_grace=0, ids=self.ids,
            lease_clock=lambda: self.clock.now().timestamp(),  # the lease on the manual clock, which never steps
        )  # fmt: skip
        # Compared as on a real clock: the wall clock with the lease clock, and with the store's.
        engine.lease.wall = lambda: wall.now().timestamp()
        engine.registry.clock_check = ClockCheck(timedelta(seconds=ABANDON_AFTER))
        # Each instance in a PID namespace of its own on one host: its pid means nothing to
        # the others (and is dead here), so only its lease may say it is gone.
        engine.registry.host = f"{host_identity()}#sim{self.serial}"
        engine.registry.pid = DEAD_PID
        engine.end_process = lambda code: self.ended.add(engine)
        process.append(engine)
        await engine.start()
        self.engines[name] = engine
        self.stores[name] = store
        await self.settle()

    def busy(self) -> bool:
        """Something the last step set off has not happened yet: a claimed job whose handler
        has not begun, an attempt told to end that has not ended, an instance that ended
        itself and is not replaced yet."""
        if self.ended:
            return True
        for engine, store in self.processes():
            workers = engine.jobs.workers
            assert workers is not None
            late = store.late  # (answers on their way until a step lets them arrive)
            if any(token not in late for token in workers.inflight) or any(
                run.context is None and not run.done for run in workers.running.values()
            ):
                return True
        return any(live.result.done() or live.told.is_set() for live in self.live.values())

    async def settle(self) -> None:
        """Wait until every engine has done all the current time calls for (what happens
        next then depends on the steps alone, never on timing)."""
        while True:
            for engine, _ in self.processes():
                # Each lease's watcher looks on real time (every 0.5 s), which the manual
                # clock does not move: it looks here, at every step, as it would have by then.
                engine.lease.check()
                engine.lease.check_jump()
            while self.ended:
                # its lease lapsed with handlers running: it ended itself
                await self.die(min(self.ended, key=lambda e: e.instance))
            for engine, _ in self.processes():
                await engine.quiesce(runs=False)
            if not self.busy():
                await asyncio.sleep(0)
                if not self.busy():
                    return
            await asyncio.sleep(0)

    def processes(self) -> list[tuple[Engine, CutStore]]:
        """Every process that runs, with its store: the names' holders, then the zombies."""
        return [(self.engines[name], self.stores[name]) for name in sorted(self.engines)] + list(self.zombies.items())

    def any_engine(self, pick: int) -> Engine:
        """An engine that can reach the store (the operators' and the senders' side)."""
        names = sorted(name for name in self.engines if not self.stores[name].cut)
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

    def end_every_handler(self) -> None:
        for live in self.live.values():
            live.told.set()  # every handler returns (on a thread, or ignoring cancellation)
            if not live.result.done():
                live.result.set_result(True)

    def every_answer_arrives(self) -> None:
        for store in self.every_store:
            store.cut_after_claim = False
            store.answers_arrive()

    def teardown(self) -> None:
        self.end_every_handler()
        self.every_answer_arrives()  # (a stop waits a moment for the claims it cut short)
        try:
            for engine, _ in self.processes():
                self.loop.run_until_complete(engine.stop(grace=0))
            # A job claimed before the stop may have begun during it (one that ignores its
            # cancellation would hold the wait below to its 30 s): tell those too. And a
            # killed instance's call may still wait for an answer the test holds (it held
            # the wait below to its 30 s: 273 s for one run of the test).
            self.end_every_handler()
            self.every_answer_arrives()
            # The calls that wait for their threads to return (a thread cannot be stopped):
            # they end now that every handler was told to, and none is left pending.
            pending = asyncio.all_tasks(self.loop)
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending, timeout=30))
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
        stubborn=st.booleans(),
    )
    def send(self, pick: int, queue: str, key: str | None, attempts: int, delay: int, stubborn: bool) -> None:
        engine = self.any_engine(pick)
        payload = {"n": len(self.sent), "stubborn": stubborn}
        sent = self.run(engine.jobs.send(queue, payload, delay=delay, attempts=attempts, key=key))
        if not sent.duplicate:
            assert sent.id not in self.sent
            self.sent[sent.id] = (queue, key)
        else:
            assert key is not None and self.sent[sent.id] == (queue, key), "a duplicate names the job holding the key"
        self.run(self.settle())

    @rule(pick=st.integers(0, 9), queue=st.sampled_from(sorted(set(CAPS) - SYNC)), attempts=st.integers(1, 3))
    def send_one_whose_handler_returns_its_work(self, pick: int, queue: str, attempts: int) -> None:
        """A job whose async handler returns its work un-awaited (``return work(job)``): its
        attempt was recorded ``succeeded`` with the work never begun (and the job deleted
        as done). The runner awaits it: it begins, and ends as the test tells it."""
        engine = self.any_engine(pick)
        payload = {"n": len(self.sent), "stubborn": False, "lazy": True}
        sent = self.run(engine.jobs.send(queue, payload, attempts=attempts))
        assert not sent.duplicate and sent.id not in self.sent
        self.sent[sent.id] = (queue, None)
        self.run(self.settle())

    @rule(pick=st.integers(0, 99), ok=st.booleans())
    def finish_an_attempt(self, pick: int, ok: bool) -> None:
        if not self.live:
            return
        live = self.live[sorted(self.live)[pick % len(self.live)]]
        if not live.result.done():
            live.result.set_result(ok)
        live.ok.append(ok)
        live.told.set()
        self.run(self.settle())

    @rule(seconds=st.integers(1, 14))
    def advance(self, seconds: int) -> None:
        # At most 14s a step: a live instance beats every 5s, so its lease never lapses (20s)
        # and it never looks dead (30s), unless it is cut off.
        self.clock.advance(seconds)
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def cut_off(self, pick: int) -> None:
        """A partition of one worker: every call of its store fails (the others' do not)."""
        engine = self.any_engine(pick)
        if sum(1 for store in self.stores.values() if not store.cut) > 1:
            self.stores[engine.instance].cut = True
        self.run(self.settle())

    @rule(pick=st.integers(0, 9), seconds=st.sampled_from([25, 40, 70]))
    def partition_for_a_while(self, pick: int, seconds: int) -> None:
        """Cut one worker off and let time pass in steps of 10 s: its lease lapses (20 s),
        the others take its jobs over (30 s), its running attempts time out (60 s)."""
        self.cut_off(pick)
        for _ in range(seconds // 10):
            self.advance(10)
        self.advance(seconds % 10 or 1)

    @rule(
        pick=st.integers(0, 9), seconds=st.sampled_from([25, 40, 70]), renewed=st.booleans(),
        read_late=st.sampled_from([0, 0, 2, 4]),
    )  # fmt: skip
    def partition_with_a_claim_on_its_way(self, pick: int, seconds: int, renewed: bool, read_late: int) -> None:
        """A partition begins just after one worker's claim committed (if it claims: a job
        is sent for it), and its answer is still on its way when the partition heals: it
        arrives before or after a heartbeat renewed the lease that lapsed meanwhile. What it
        claimed, the others may have taken over since: it must start none of it. With
        ``read_late``, that worker's sweep reads the running jobs as the partition heals,
        and the answer comes that many rounds later (see ``a_sweep_reads_late``)."""
        engine = self.any_engine(pick)
        if sum(1 for store in self.stores.values() if not store.cut) > 1:
            self.stores[engine.instance].cut_after_claim = True
        self.send(pick, "q", None, 2, 0, False)
        for _ in range(seconds // 10):
            self.advance(10)
        self.advance(seconds % 10 or 1)
        store = self.stores.get(engine.instance)
        if store is not None:
            store.cut = store.cut_after_claim = False
            if read_late:
                self.run(store.read_late(read_late))
            if renewed:
                self.advance(6)  # a heartbeat (every 5 s) renews the lease
            store.answers_arrive()
        self.run(self.settle())

    @rule(pick=st.integers(0, 9), calls=st.integers(1, 2))
    def lose_answers(self, pick: int, calls: int) -> None:
        """The next one or two cycles of one worker commit and their answers are lost (a job
        is sent for it to claim): what they claimed and finished is in the store, and the
        worker does not know it. It must neither lose those jobs nor leave them running."""
        engine = self.any_engine(pick)
        self.stores[engine.instance].lose_answers = calls
        self.send(pick, "q", None, 2, 0, False)

    @rule(pick=st.integers(0, 9), rounds=st.sampled_from([1, 2, 4]))
    def a_sweep_reads_late(self, pick: int, rounds: int) -> None:
        """One worker's sweep for abandoned work reads the running jobs now, and the answer
        comes back ``rounds`` rounds (seconds) later (the process froze just after the
        read, the server was slow); the rounds between wait for it. Every job in it may have
        moved on by then: finished, retried, gone back untouched and run again, taken over.
        Closing any of those as abandoned must not apply, nor leave an attempt in a job's
        history."""
        store = self.stores[self.any_engine(pick).instance]
        if not store.cut and store.old_read is None:
            self.run(store.read_late(rounds))
        self.run(self.settle())

    @rule()
    def everything_ends(self) -> None:
        """Every partition heals, every answer arrives, every queue runs and every handler
        succeeds as soon as it starts, for long enough: then nothing is left running, and
        nothing due waits (no job stuck, whatever the faults before)."""
        for store in self.stores.values():
            store.cut = store.cut_after_claim = False
            store.lose_answers = store.sent_twice = 0
            store.answers_arrive()
        for wall in self.walls.values():
            wall.offset = timedelta(0)
        for queue in CAPS:
            self.run(self.any_engine(0).jobs.set_paused(queue, False))
        for _ in range(24):  # 240 s: past a lapse, the take-over window and a timed-out attempt
            self.end_every_handler()
            self.advance(10)
            if not self.live and all(job.status == "dead" for job in self.run(self.store_jobs())):
                break  # nothing left that time could move (a finished job is deleted)
        self.end_every_handler()
        self.run(self.settle())
        now = self.clock.now()
        for job in self.run(self.store_jobs()):
            assert job.status != "running" or job.id in self.live, f"left running with nothing running it: {job}"
            if job.status == "queued":
                # (a retry's backoff may lie ahead; a due job waits at most a poll)
                assert job.run_after > now - timedelta(seconds=20), f"due since {job.run_after}, never started: {job}"

    @rule()
    def late_answers_arrive(self) -> None:
        for store in self.stores.values():
            store.answers_arrive()
        self.run(self.settle())

    @rule(seconds=st.sampled_from([25, 45]))
    def store_outage(self, seconds: int) -> None:
        """The store is out of reach of every worker for longer than the lease's bound, or
        than the take-over window, then back: an outage's silence is nobody's death."""
        for store in self.stores.values():
            store.cut = True
        for _ in range(seconds // 10):
            self.advance(10)
        self.advance(seconds % 10 or 1)
        for store in self.stores.values():
            store.cut = False
        self.run(self.settle())

    @rule(seconds=st.sampled_from([30, 65]))
    def time_passes(self, seconds: int) -> None:
        """Time passes in steps of 10 s, every instance beating: attempts time out (60 s)."""
        for _ in range(seconds // 10):
            self.advance(10)
        self.advance(seconds % 10 or 1)

    @rule(pick=st.integers(0, 9))
    def heal(self, pick: int) -> None:
        names = sorted(self.engines)
        self.stores[names[pick % len(names)]].cut = False
        self.run(self.settle())

    @rule(pick=st.integers(0, 9), seconds=st.sampled_from([-70, -35, -8, 8, 35, 70]))
    def step_a_clock(self, pick: int, seconds: int) -> None:
        """One instance's wall clock steps: back, it would stamp heartbeats the others take
        for a dead instance's; ahead, it would take the others for dead. Its lease's checks
        find the jump before either, and its heartbeats find it off the store's clock."""
        engine = self.any_engine(pick)
        self.walls[engine.instance].offset += timedelta(seconds=seconds)
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def sync_a_clock(self, pick: int) -> None:
        """Time sync puts an instance's wall clock right again: its next heartbeat renews."""
        names = sorted(self.engines)
        self.walls[names[pick % len(names)]].offset = timedelta(0)
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
        try:
            cancelled = self.run(jobs.cancel(queue, key=key) if by_key else jobs.cancel(queue, job_id))
        except Unavailable:  # its answer lost, sent again, it found the job gone: maybe its doing
            left = {j.id for j in self.run(self.store_jobs())}
            self.gone |= queued - left
            self.run(self.settle())
            return
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
        except Unavailable:  # its answer lost, sent again, it found the job gone: maybe its doing
            if job_id not in {j.id for j in self.run(self.store_jobs())}:
                self.gone.add(job_id)
            self.run(self.settle())
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
        except Unavailable:  # its answer lost, sent again, it found the job back: maybe its doing
            if job_id in {j.id for j in self.run(self.store_jobs()) if j.status != "dead"}:
                self.retried[job_id] += 1
            self.run(self.settle())
            return
        assert (job.status, job.attempt) == ("queued", 0)
        self.retried[job_id] += 1
        self.run(self.settle())

    @rule(queue=st.sampled_from(sorted(CAPS)), paused=st.booleans(), pick=st.integers(0, 9))
    def pause_or_resume(self, queue: str, paused: bool, pick: int) -> None:
        view = self.run(self.any_engine(pick).jobs.set_paused(queue, paused))
        assert view.paused == paused
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def replaced_under_its_name(self, pick: int) -> None:
        """A worker is cut off past the take-over window, and a process under its name starts
        elsewhere in its place (an orchestrator replacing a pod of a node it lost: a stable
        name, a new host). The new one takes the name, and with it what the old one left
        running; then the partition heals. The old one runs on under a name it no longer
        holds: its heartbeats are refused, so its lease stays lapsed, and it must start no
        attempt and finish none that another has taken over since."""
        engine = self.any_engine(pick)
        if sum(1 for store in self.stores.values() if not store.cut) < 2:
            return
        name, store = engine.instance, self.stores[engine.instance]
        store.cut = True
        for _ in range(4):  # 40 s: past its lease (20 s) and the window (30 s)
            self.advance(10)
        for _ in range(12):  # a clock stepped ahead stamped its last beat later: silent by the store's time
            if self.engines.get(name) is not engine or self.silent_for_the_window(name):
                break
            self.advance(10)
        if self.engines.get(name) is not engine:
            return  # it ended itself meanwhile (handlers it could not stop), and was replaced
        if not self.silent_for_the_window(name):
            # Another process beats under the name: one this rule made a zombie before, which
            # took its name back once its replacement fell silent (as it should). A new one
            # would wait for it, and be refused: the cut-off one only heals.
            store.cut = False
            self.run(self.settle())
            return
        del self.engines[name], self.stores[name]
        self.zombies[engine] = store
        self.renamed.add(name)
        # The replacement plays another process: the guard against two engines of one
        # process under one name is not the one tested here, the store's is.
        names.let_go(engine.store.where, name, engine)
        self.run(self.start_engine(name))
        store.cut = False  # the partition heals
        self.run(self.settle())

    def silent_for_the_window(self, name: str) -> bool:
        beats = {i.name: i.heard_at for i in self.run(self.any_engine(0).store.fleet())}
        last = beats.get(name)
        return last is None or last < self.clock.now() - timedelta(seconds=ABANDON_AFTER + 1)

    @rule(pick=st.integers(0, 9))
    def stop_with_a_claim_on_its_way(self, pick: int) -> None:
        """A clean stop (a rolling restart's SIGTERM, no grace) lands while the worker's
        cycle that claims is on its way (a job is sent for it: another may claim it first),
        and the server commits that claim only once the stop has begun. What it claimed
        never began: after the stop it is back in its queue untouched, not left running
        under the stopped instance until the take-over window. A fresh instance starts."""
        engine = self.any_engine(pick)
        name, store = engine.instance, self.stores[engine.instance]
        if any(live.engine is engine for live in self.live.values()) or store.late:
            return  # (its handlers in flight, or answers held by the test, would hold its stop)
        commit = store.hold_claims = asyncio.Event()
        try:
            self.send(pick, "q", None, 2, 0, False)
        finally:
            store.hold_claims = None
        if self.engines.get(name) is not engine:  # it ended itself meanwhile, and was replaced
            commit.set()
            self.run(self.settle())
            return
        stop_jobs = engine.jobs.stop

        async def commit_once_stopping(grace: float) -> None:
            commit.set()
            await stop_jobs(grace)

        engine.jobs.stop = commit_once_stopping  # type: ignore[method-assign]
        # A sweep's read whose answer is late goes to that sweep, which the stop cancels:
        # the stop's own read is answered now.
        store.old_read, store.read_in = None, 0
        self.run(engine.stop(grace=0))
        if currently_in_test_context():
            event("a stop with a claim on its way that took a job" if store.held_claimed else "a stop, nothing claimed")
        del self.engines[name], self.stores[name]
        replaced = not any(not other.cut for other in self.stores.values())
        if replaced:
            self.run(self.start_engine())  # (someone to read the store through)
        # Read before any sweep could close what it left (as abandoned: it is gone).
        for job in self.run(self.store_jobs()):
            if job.status == "running" and job.instance == name and not self.run(self.begins(job)):
                self.violations.append(f"claimed by a cycle its stop cut short, never begun, left running: {job}")
        if not replaced:
            self.run(self.start_engine())

    @rule(pick=st.integers(0, 9))
    def kill_an_instance(self, pick: int) -> None:
        """SIGKILL, as far as one process can play it: the instance's loops and handlers
        stop where they are and nothing it holds is written; a fresh instance starts."""
        names = sorted(self.engines)
        self.run(self.die(self.engines[names[pick % len(names)]]))

    async def die(self, engine: Engine) -> None:
        """The instance's process ends: its handlers (threads too) end with it, nothing it
        had in hand is written; a fresh instance starts in its place (none for a zombie:
        its name's holder has taken its place already)."""
        zombie = self.zombies.pop(engine, None) is not None
        if not zombie:
            del self.engines[engine.instance]
            self.stores.pop(engine.instance, None)
            self.died.add(engine.instance)
        self.ended.discard(engine)
        for job_id, live in list(self.live.items()):
            if live.engine is engine:
                del self.live[job_id]  # its process is gone, and the handler with it
                live.told.set()
                if not live.result.done():
                    live.result.set_result(False)  # (one that ignores cancellation ends too)
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
        workers.running.clear()
        await engine.store.close()
        if not zombie:
            await self.start_engine()

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def never_twice_at_once(self) -> None:
        assert not self.violations, self.violations

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
        # An attempt is used only by a handler that began, or by a claim whose instance died
        # or was taken over (cut off for the window): the others cannot know whether it
        # began. Never by an instance that lives and knows it did not (a lost answer).
        for job_id in self.sent:
            attempts = self.run(self.any_engine(0).jobs.get_job(job_id)).attempts if job_id not in self.gone else []
            # Each attempt is recorded once (its number counts anew after an operator's retry).
            numbers = Counter(attempt.attempt for attempt in attempts)
            assert all(n <= 1 + self.retried[job_id] for n in numbers.values()), (
                f"an attempt of {job_id} recorded twice: {attempts}"
            )
            for attempt in attempts:
                # A success is a handler's that began and returned (not one that handed back
                # its work un-awaited: see send_one_whose_handler_returns_its_work).
                assert attempt.status != "succeeded" or (job_id, attempt.attempt) in self.started, (
                    f"attempt {attempt.attempt} of {job_id} succeeded, though no handler began it: {attempt}"
                )
                # (Under a name two processes have gone by, one's sweep takes the other's work
                # over, and says so as for an earlier process of that name.)
                taken_over = attempt.error_message != f"abandoned: {OWN_CLAIM_CLOSED}" or attempt.instance in self.renamed
                assert (job_id, attempt.attempt) in self.started or attempt.instance in self.died or taken_over, (
                    f"attempt {attempt.attempt} of {job_id} recorded, though no handler began it and "
                    f"{attempt.instance} is alive: {attempt}"
                )


class PostgresQueueMachine(QueueMachine):
    """The same on PostgreSQL: claims of two instances are concurrent transactions there,
    and the store sends a statement again after a connection broke with it in flight."""

    def store_url(self) -> str:
        assert pg.ACTIVE is not None
        return pg.ACTIVE.create_database("inv", migrated=True)

    @rule(pick=st.integers(0, 9), writes=st.integers(1, 4))
    def the_store_sends_its_writes_again(self, pick: int, writes: int) -> None:
        """The next writes of one worker's store (an operator's action through it, its
        sweep's ends, a cycle or a send on the pool) commit and lose their answers, and the
        store sends each again: none may lose a job, run one twice at once or record an
        attempt twice, nor tell the operator something false."""
        self.stores[self.any_engine(pick).instance].sent_twice = writes


def bounded(examples: int) -> settings:
    return settings(
        max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", examples)),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def test_job_queue_invariants_on_sqlite() -> None:
    run_state_machine_as_test(QueueMachine, settings=bounded(25))


@pytest.mark.postgres
def test_job_queue_invariants_on_postgres(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(PostgresQueueMachine, settings=bounded(8))


def test_a_process_whose_clock_is_off_takes_no_name_back() -> None:
    """Found by running the machine longer than CI does (shrunk by hand): a worker whose
    clock stepped 8 s ahead is replaced under its name; its replacement, cut off, is silent
    22 s by the store's time and 30 s by the old one's clock, which took the name back. Its
    clock off, it closed nothing since: the replacement's job stayed running for ever.
    A clock that is off (or jumped, unconfirmed) takes no name, whatever silence it reads."""
    machine = QueueMachine()
    try:
        machine.step_a_clock(pick=0, seconds=8)
        machine.replaced_under_its_name(pick=6)
        machine.lose_answers(pick=8, calls=2)
        machine.partition_for_a_while(pick=2, seconds=25)
        machine.everything_ends()
        machine.never_twice_at_once()
        machine.the_store_keeps_every_promise()
    finally:
        machine.teardown()


# ---------------------------------------------------------------------------------------
# jobs waiting behind busy seats (claimed ahead on PostgreSQL)
# ---------------------------------------------------------------------------------------
#: A queue's limit in :class:`AheadMachine` (10,000 in production): small enough to reach.
AHEAD_LIMIT = 8


class AheadMachine(RuleBasedStateMachine):
    """One worker runs queue ``q`` (async handlers, concurrency 2): batches of quick jobs
    (they end at once: its handlers look shorter than a cycle, so on PostgreSQL it claims
    ahead) and held ones (they keep the seats busy until a step ends them), so that jobs
    wait behind busy seats. Random steps cancel them (by id, by key), delete them, pause
    and resume the queue, lower its concurrency as another instance's start does (the
    worker hears of it) and raise it back, and fill the queue to its limit. Checked at
    every handler's start: no job cancelled or deleted starts, nothing starts in a paused
    queue, no job starts beside as many as the queue's concurrency; after every step: the
    view, the list and the limit count the same queued jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(T0)
        self.patch = pytest.MonkeyPatch()
        self.folder = tempfile.mkdtemp(prefix="schedtui-jobs-ahead-")
        self.url = self.store_url()
        self.loop = asyncio.new_event_loop()
        for module in (sqlite_jobs, postgres_jobs):
            self.patch.setattr(module, "MAX_HELD", AHEAD_LIMIT)
        self.violations: list[str] = []
        self.running: dict[str, asyncio.Event] = {}
        self.sent: dict[str, str | None] = {}  # id -> key
        self.gone: set[str] = set()  # cancelled or deleted (the action said so)
        self.paused = False
        self.cap = 2
        self.serial = 0
        queue = define_queue(name="q", handler=self.handle, concurrency=2, max_runtime=MAX_RUNTIME)
        store = open_store(self.url)
        # Only the steps move the worker: no notification of its own sends (or actions)
        # arriving at a moment of the network's choosing (``define_elsewhere`` delivers one).
        store.job_notifications = False  # type: ignore[attr-defined]
        self.engine = Engine([queue], store, clock=self.clock, instance="w1", shutdown_grace=0)
        self.run(self.engine.start())
        self.run(self.settle())

    def store_url(self) -> str:
        return f"sqlite:///{self.folder}/state.db"

    def run(self, coro: Any) -> Any:
        return run_within(self.loop, coro, 30)

    async def handle(self, job: JobContext) -> None:
        if job.id in self.gone:
            self.violations.append(f"job {job.id}, cancelled or deleted, started")
        if self.paused:
            self.violations.append(f"job {job.id} started in a paused queue")
        if len(self.running) >= self.cap:
            self.violations.append(f"job {job.id} started beside {len(self.running)}, concurrency {self.cap}")
        gate = self.running[job.id] = asyncio.Event()
        try:
            if job.payload.get("hold"):
                await gate.wait()
        finally:
            del self.running[job.id]

    async def settle(self) -> None:
        """Until the worker has done what the step calls for: no cycle on its way, nothing
        to hand in, every job it took begun."""
        workers = self.engine.jobs.workers
        assert workers is not None
        calm = 0
        while calm < 2:
            await self.engine.quiesce(runs=False)
            await asyncio.sleep(0)
            busy = workers.inflight or workers.finishes or workers.handovers or any(
                run.context is None and not run.done for run in workers.running.values()
            )
            calm = 0 if busy else calm + 1

    def teardown(self) -> None:
        for gate in self.running.values():
            gate.set()
        try:
            self.loop.run_until_complete(self.engine.stop(grace=0))
        finally:
            self.patch.undo()
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def pick(self, pick: int) -> tuple[str, str | None] | None:
        if not self.sent:
            return None
        job_id = sorted(self.sent)[pick % len(self.sent)]
        return job_id, self.sent[job_id]

    async def counts(self) -> tuple[int, int]:
        """Queued and dead, by the view."""
        view = await self.engine.jobs.queue_view("q")
        return view.queued, view.dead

    @rule(quick=st.integers(0, 4), held=st.integers(1, 3), keyed=st.booleans())
    def send_a_batch(self, quick: int, held: int, keyed: bool) -> None:
        batch: list[dict[str, Any]] = [{"payload": {"hold": False}} for _ in range(quick)]
        for _ in range(held):
            self.serial += 1
            batch.append({"payload": {"hold": True}, **({"key": f"k{self.serial}"} if keyed else {})})
        queued, dead = self.run(self.counts())  # (nothing moves the worker between the two)
        try:
            sent = self.run(self.engine.jobs.send_many("q", batch))
        except QueueFull as exc:
            # The limit counts what the view counts (nothing runs between the two here).
            assert queued + dead + len(batch) > AHEAD_LIMIT, f"refused with {queued} queued, {dead} dead: {exc}"
            assert exc.count == queued + dead, f"the limit counted {exc.count}, the view {queued} + {dead}"
        else:
            assert queued + dead + len(batch) <= AHEAD_LIMIT, f"{len(batch)} taken with {queued} queued, {dead} dead"
            for item, s in zip(batch, sent, strict=True):
                if item["payload"]["hold"]:
                    self.sent[s.id] = item.get("key")
        self.run(self.settle())

    @rule(pick=st.integers(0, 99))
    def end_one(self, pick: int) -> None:
        if self.running:
            self.running[sorted(self.running)[pick % len(self.running)]].set()
        self.run(self.settle())

    @rule()
    def a_poll(self) -> None:
        self.clock.advance(1)
        self.run(self.settle())

    @rule(pick=st.integers(0, 99), by_key=st.booleans())
    def cancel(self, pick: int, by_key: bool) -> None:
        picked = self.pick(pick)
        if picked is None:
            return
        job_id, key = picked
        if by_key and key is not None:
            cancelled = self.run(self.engine.jobs.cancel("q", key=key))
        else:
            cancelled = self.run(self.engine.jobs.cancel("q", job_id))
        if cancelled:
            self.gone.add(job_id)
        self.run(self.settle())

    @rule(pick=st.integers(0, 99))
    def delete(self, pick: int) -> None:
        picked = self.pick(pick)
        if picked is None:
            return
        job_id, _ = picked
        started = job_id in self.running
        with contextlib.suppress(NotFound):
            self.run(self.engine.jobs.delete("q", job_id))
            if not started and job_id not in self.running:
                self.gone.add(job_id)  # (a running one finishes)
        self.run(self.settle())

    @rule(paused=st.booleans())
    def pause_or_resume(self, paused: bool) -> None:
        if not paused:
            self.paused = False  # (jobs may start once the resume is on its way)
        self.run(self.engine.jobs.set_paused("q", paused))
        self.run(self.settle())  # (a job whose claim came before the pause may begin meanwhile)
        self.paused = paused

    @rule(concurrency=st.sampled_from([1, 2]))
    def define_elsewhere(self, concurrency: int) -> None:
        """Another instance starts with the queue at this concurrency (a rolling deploy); the
        worker hears of it (PostgreSQL: a notification; its delivery is its own test)."""
        if concurrency > self.cap:
            self.cap = concurrency  # (more may start once the change is on its way)
        spec = QueueSpec("q", concurrency, 3, float(MAX_RUNTIME))
        self.run(self.engine.jobs.store.define_queues([spec], self.clock.now(), update=True))
        workers = self.engine.jobs.workers
        assert workers is not None
        workers.heard(REVOKE + "q")
        self.run(self.settle())  # (as for a pause)
        self.cap = concurrency

    @invariant()
    def every_promise_kept(self) -> None:
        assert not self.violations, self.violations
        view = self.run(self.engine.jobs.queue_view("q"))
        listed = self.run(self.engine.jobs.list_jobs("q", limit=1000)).jobs
        shown = [(j.id[-4:], j.status, j.attempt, j.run_after) for j in listed]
        assert view.queued == sum(1 for j in listed if j.status == "queued"), (view, shown, self.clock.now())
        # (a job deleted while it runs no longer shows, and holds its seat until it ends)
        assert view.running >= sum(1 for j in listed if j.status == "running"), (view, shown)
        for job in listed:
            assert job.id not in self.gone, f"a cancelled or deleted job is listed: {job}"
            if job.status == "queued":
                assert job.attempt < job.max_attempts and (job.attempt > 0 or job.started_at is None), job


class PostgresAheadMachine(AheadMachine):
    def store_url(self) -> str:
        assert pg.ACTIVE is not None
        return pg.ACTIVE.create_database("ahead", migrated=True)


def test_jobs_waiting_behind_busy_seats_keep_every_promise_on_sqlite() -> None:
    run_state_machine_as_test(AheadMachine, settings=bounded(15))


@pytest.mark.postgres
def test_jobs_waiting_behind_busy_seats_keep_every_promise_on_postgres(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(PostgresAheadMachine, settings=bounded(15))
