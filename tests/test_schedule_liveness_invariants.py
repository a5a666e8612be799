"""Never twice at once, for schedule runs, under random sequences (Hypothesis, bounded).

The README's *Never twice at once* promises that a process cut off from the database, or
frozen (SIGSTOP, a suspended VM), stops its schedule's handlers itself (async ones
cancelled, or the process ends itself when a sync handler still runs on its thread)
before another instance takes its run for abandoned and starts the next slot, and that a
process that fires nothing but runs a Run now holds a lease as a member does. The
scheduler's own machines do not cover it: ``tests/test_invariants.py`` runs on SQLite,
where the lease is not enforced, and ``tests/test_cluster.py``'s hand-over runs no-op
handlers with no lapse. This machine does, on PostgreSQL, on the manual clock:

* two or three firing members (``advisoryLock``; ``cluster`` in a second machine), and at
  most one observer: a process opened, not started, that runs Run nows (``schedtui fire``,
  a console without ``--fire``), all with their lease on the manual clock;
* two ``skip`` schedules every ten seconds whose handlers run until the test lets them
  end: ``a`` async, ``b`` sync on a thread with a short ``max_runtime`` (past it, the run
  is recorded ``timeout`` and its handler runs on, holding the schedule's place across
  the fleet);
* random steps: the clock moves (a few seconds, or a minute in steps of ten; or the whole
  host is suspended, every process at once), a handler ends, a Run now through a member
  or the observer, a partition of one process (every statement of its store fails; what
  it hands its ledger waits, as on a real network), a freeze (its clock stops, its store
  calls wait, and so do the answers of those on their way, its handlers take no step,
  nobody looks at its lease) and a thaw (its lease watch looks first, as the real one,
  overdue, does the moment it runs again), each also for a while in one step; a claim
  that commits just before its member is cut off or frozen, its answer arriving after
  the heal or thaw, before or after a heartbeat renewed the lease; a Run now whose row
  commits just before its process freezes, its handler not begun; a crash (its loops and
  handlers end where they are, nothing it had in hand is written); a fresh member or
  observer.

Each process is in a PID namespace of its own (simulated: a host of its own and a pid dead
here), so only its lease decides when it is gone; ``end_process`` is recorded, and the
process is then crashed as its exit would end it. Checked at the start of every handler
and after every step:

1. a timed run of a schedule never starts while another handler of it executes in a
   process that is not frozen, has not ended itself and whose lease has not lapsed (a
   Run now starts whatever runs, and counts as running); after a thaw too;
2. a process whose lease has lapsed (or that is frozen, or gone) starts no handler, and
   no slot's handler starts twice;
3. the ledger never has two timed runs (trigger ``self``) of one slot;
4. once every fault heals and every handler has ended, nothing is left ``running`` (nor
   holding its place) in the ledger that no handler executes, and every lease holds again.

What the README leaves out is not asserted: a frozen process's handler may be left
running by the others' take-over while it is frozen (it takes no step then), and a
thawed process stops it at its lease watch's first look (a real one may run a few loop
iterations first). A handler that ignores its cancellation, clocks that step or are off
the database's, and ``queue``/``parallel`` schedules are other machines' (or not
modelled here).

About 1 s an example on two cores (16 + 8 by default, ``SCHEDTUI_HYPOTHESIS_EXAMPLES``
and ``SCHEDTUI_HYPOTHESIS_STEPS`` override both), e.g.::

    SCHEDTUI_REQUIRE_POSTGRES=1 SCHEDTUI_HYPOTHESIS_EXAMPLES=200 python -m pytest -n 0 \
        tests/test_schedule_liveness_invariants.py -q -p no:cacheprovider
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from backend import Engine, ManualClock, RunContext, Unavailable, define_schedule, open_store
from backend.errors import Refused
from backend.ids import IdFactory
from backend.model import CoordinationMode
from backend.scheduler import lifecycle
from backend.scheduler.registry import host_identity
from backend.store import store_unavailable
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests.bounded import awaiting, run_within
from tests.servers import dead_pid
from tests.test_cluster import ViewClock

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
ABANDON_AFTER = 30
#: ``a`` async, ``b`` sync (on a thread, past its deadline soon: it then runs on, held).
CRONS = {"a": "*/10 * * * * *", "b": "5-55/10 * * * * *"}
MAX_RUNTIME = {"a": 600, "b": 45}
SYNC = {"b"}
MAX_MEMBERS = 3

DEAD_PID = dead_pid()


@dataclass(eq=False)
class Process:
    """One process: a firing member, or the observer (opened, not started)."""

    name: str
    member: bool
    view: ViewClock
    store: PostgresStore
    engine: Engine = field(init=False)
    cut: bool = False
    """Partitioned: every statement of its store fails (its ledger's writes wait)."""
    dead: bool = False
    after_claim: str | None = None
    """``cut`` or ``freeze``: its next claim commits, then that fault begins, and the claim's
    answer is held (on its way) until :attr:`answer` is set."""
    answer: asyncio.Event | None = None
    freeze_after_flush: bool = False
    """Its next flush of the ledger (a Run now's row, placed before its handler starts)
    commits, then it freezes."""
    faulted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while a claim's answer is held: a wait for the process to be idle ends (its
    loop waiting for the answer is not idle)."""

    @property
    def frozen(self) -> bool:
        return self.view.frozen_at is not None


def gate_store(process: Process) -> None:
    """Every statement of the process's store goes through here: it waits while the
    process is frozen (a stopped process sends nothing, nor reads an answer that arrives
    meanwhile), and fails while it is cut off."""
    store = process.store
    through = store._with_conn

    async def with_conn(fn: Callable[[Any], Awaitable[Any]], **kwargs: Any) -> Any:
        while process.frozen:
            await process.view.thawed.wait()
        if process.cut:
            raise store_unavailable(store.where, "{store} is unreachable", "cut off (test)")
        try:
            return await through(fn, **kwargs)
        finally:
            while process.frozen:  # (frozen while the statement was on its way)
                await process.view.thawed.wait()

    store._with_conn = with_conn  # type: ignore[method-assign]


def hook_claims(process: Process) -> None:
    """A claim of the process (a slot's, ``advisoryLock``; a shard owner's, ``cluster``)
    that commits just before the fault :attr:`Process.after_claim` names begins: its answer
    arrives once the test lets it (after the partition healed or the thaw, before or after
    a heartbeat renewed the lease that lapsed meanwhile)."""
    store = process.store

    def hooked(inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def claim(*args: Any, **kwargs: Any) -> Any:
            result = await inner(*args, **kwargs)
            how, process.after_claim = process.after_claim, None
            if how is not None and not process.dead:
                answer = process.answer = asyncio.Event()
                if how == "cut":
                    process.cut = True
                else:
                    process.view.freeze()
                process.faulted.set()
                try:
                    await answer.wait()
                finally:
                    process.answer = None
                    process.faulted.clear()
            return result

        return claim

    flush = store.flush

    async def flushed() -> None:
        await flush()
        if process.freeze_after_flush and not process.dead:
            process.freeze_after_flush = False
            process.view.freeze()
            process.faulted.set()
            try:
                while process.frozen:
                    await process.view.thawed.wait()
            finally:
                process.faulted.clear()

    store.flush = flushed  # type: ignore[method-assign]
    store.claim = hooked(store.claim)  # type: ignore[method-assign,assignment]
    store.cluster_claim = hooked(store.cluster_claim)  # type: ignore[method-assign,assignment]


@dataclass(eq=False)
class Live:
    """A handler executing now."""

    schedule: str
    run_id: str
    trigger: str
    slot: datetime
    process: Process
    seq: int
    sync: bool
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the test lets an async handler end."""
    told: threading.Event = field(default_factory=threading.Event)
    """Set when the test lets a sync handler end (or its process is gone)."""

    def __str__(self) -> str:
        return f"{self.schedule}/{self.trigger} run {self.run_id[-6:]} slot {self.slot:%H:%M:%S} in {self.process.name}"


class ScheduleLivenessMachine(RuleBasedStateMachine):
    coordination: CoordinationMode = "advisoryLock"
    shard_ttl = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        assert pg.ACTIVE is not None
        self.url = pg.ACTIVE.create_database("liveinv", migrated=True)
        self.db = psycopg.connect(self.url, autocommit=True)
        self.clock = ManualClock(T0)
        # One id factory for every process, without randomness (a replay claims alike).
        self.ids = IdFactory(self.clock.now, random_bits=itertools.count().__next__)
        self.processes: list[Process] = []
        self.live: dict[str, Live] = {}
        self.violations: list[str] = []
        self.ended: set[Process] = set()
        """Processes that ended themselves (their lease lapsed with a sync handler running)."""
        self.closing = False
        """Tearing down: every engine is stopped, and faults are off."""
        self.started: set[tuple[str, datetime]] = set()
        self.seq = 0
        self.serial = 0
        self.log: list[str] = []
        for _ in range(2):
            self.run(self.start_process(member=True))

    # -- plumbing ---------------------------------------------------------------------------
    def run(self, coro: Any) -> Any:
        return run_within(self.loop, coro, 60)

    def note(self, what: str) -> None:
        self.log.append(f"{self.clock.now():%H:%M:%S} {what}")

    @staticmethod
    def saw(what: str) -> None:
        """What an example went through (``--hypothesis-show-statistics``)."""
        if currently_in_test_context():
            event(what)

    def running(self) -> list[Process]:
        """The processes that take steps: alive and not frozen."""
        return [p for p in self.processes if not p.dead and not p.frozen]

    def members(self) -> list[Process]:
        return [p for p in self.processes if p.member and not p.dead]

    def observer(self) -> Process | None:
        return next((p for p in self.processes if not p.member and not p.dead), None)

    def counts(self, live: Live) -> bool:
        """Whether a handler counts as executing for the promise: its process takes steps,
        has not ended itself, and its lease has not lapsed (a lapsed lease cancelled it)."""
        p = live.process
        return not p.dead and not p.frozen and p not in self.ended and not p.engine.lease.lapsed

    async def start_process(self, *, member: bool) -> None:
        self.serial += 1
        name = f"{'m' if member else 'o'}{self.serial}"
        store = open_store(self.url)
        assert isinstance(store, PostgresStore)
        process = Process(name, member, ViewClock(self.clock), store)
        gate_store(process)
        hook_claims(process)
        schedules = [
            define_schedule(
                name=s, cron=CRONS[s], timezone="UTC", on_overlap="skip", max_runtime=MAX_RUNTIME[s],
                handler=self.sync_handler(process) if s in SYNC else self.async_handler(process),
            )
            for s in sorted(CRONS)
        ]  # fmt: skip
        engine = Engine(
            schedules, store, clock=process.view, lock_clock=self.clock, instance=name, coordination=self.coordination,
            abandon_after=ABANDON_AFTER, shutdown_grace=0, ids=self.ids, capture_logs=False, shard_ttl=self.shard_ttl,
            lease_clock=lambda: self.clock.now().timestamp(),  # like CLOCK_BOOTTIME: it runs on while frozen
        )  # fmt: skip
        # Each process in a PID namespace of its own: only its lease says when it is gone.
        engine.registry.host = f"{host_identity()}#sim{self.serial}"
        engine.registry.pid = DEAD_PID
        engine.end_process = lambda code: self.exit(process)
        process.engine = engine
        self.processes.append(process)
        self.note(f"start {name}")
        if member:
            await engine.start()
        else:
            await engine.open()
        await self.settle()

    def exit(self, process: Process) -> None:
        """The process ends itself (``os._exit``, at once): from here it takes no step (its
        clock stops, its statements wait), until the next settle stops it for good. Before,
        it went on until then: its heartbeat renewed its lease and its timer started a slot,
        which the real process, gone, never did."""
        self.ended.add(process)
        if not self.closing:
            process.view.freeze()

    # -- the handlers ---------------------------------------------------------------------
    def began(self, ctx: RunContext, process: Process, sync: bool) -> Live:
        """At the start of every handler (on the loop's thread)."""
        self.seq += 1
        live = Live(ctx.name, ctx.run_id, ctx.trigger, ctx.scheduled_at, process, self.seq, sync)
        self.note(f"begin {live}")
        if process.dead:
            # (a sync handler's thread reaches its first line after its process was crashed)
            live.told.set()
            live.release.set()
            return live
        if process.frozen:
            self.violations.append(f"{live}: started in a frozen process")
        if process in self.ended:
            self.violations.append(f"{live}: started in a process that ended itself")
        if process.engine.lease.lapsed:
            self.violations.append(f"{live}: started with its process's lease lapsed")
        if ctx.trigger != "manual":
            if (ctx.name, ctx.scheduled_at) in self.started:
                self.violations.append(f"{live}: this slot's handler started before")
            self.started.add((ctx.name, ctx.scheduled_at))
            beside = [str(other) for other in self.live.values() if other.schedule == ctx.name and self.counts(other)]
            if beside:
                self.violations.append(f"{live}: started beside {beside}")
            if any(other.schedule == ctx.name and other.process.frozen for other in self.live.values()):
                self.saw("a timed run started beside a frozen process's handler (its run taken over)")
        if not process.member:
            self.saw("a Run now began in the observer")
        self.live[ctx.run_id] = live
        return live

    def finished(self, live: Live) -> None:
        if self.live.get(live.run_id) is live:
            del self.live[live.run_id]
            self.note(f"end {live}")

    def async_handler(self, process: Process) -> Callable[[RunContext], Awaitable[None]]:
        async def handle(ctx: RunContext) -> None:
            live = self.began(ctx, process, False)
            try:
                await live.release.wait()
            except asyncio.CancelledError:
                self.note(f"cancelled {live}")
                if process.engine.lease.lapsed:
                    self.saw(f"an async handler cancelled at a lapse ({'member' if process.member else 'observer'})")
                raise
            finally:
                self.finished(live)

        return handle

    def sync_handler(self, process: Process) -> Callable[[RunContext], None]:
        def handle(ctx: RunContext) -> None:
            async def begin() -> Live:
                return self.began(ctx, process, True)

            live = asyncio.run_coroutine_threadsafe(begin(), self.loop).result(60)
            try:
                live.told.wait(120)
            finally:
                # A plain callback (before the runner's own, which this thread sends next).
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                    self.loop.call_soon_threadsafe(self.finished, live)

        return handle

    def release(self, live: Live) -> None:
        live.release.set()
        live.told.set()

    # -- settling ---------------------------------------------------------------------------
    def busy(self) -> bool:
        """Something the last step set off has not happened yet: a process that ended
        itself still runs, a handler told to end has not, a thread that began has not
        said so yet."""
        if self.ended:
            return True
        for live in self.live.values():
            if (live.release.is_set() or live.told.is_set()) and not live.process.frozen:
                return True
        for p in self.running():
            threads = sum(1 for live in self.live.values() if live.process is p and live.sync)
            if p.engine.runner.threads_running != threads:
                return True
            runner = p.engine.runner
            for call in [*runner.in_flight.values(), *runner.lingering]:
                # Begun, and its handler has ended here: the runner has not recorded it yet.
                if call.deadline is not None and getattr(call, "run_id", None) not in self.live:
                    return True
        return False

    async def calm(self, process: Process) -> None:
        """Until the process has done what the time calls for and its handlers have begun
        (``quiesce(runs=False)``, its flush failing while it is cut off)."""
        engine = process.engine

        async def flush() -> None:
            with contextlib.suppress(Unavailable):
                await engine.flush()

        if process.answer is not None or process.frozen:
            return

        def started() -> bool:
            if not lifecycle.has_started(engine):
                return False
            # Lost slots being fired (after a lapse): each has begun its run, or parked.
            launcher = engine.launcher
            return all(
                any(r.schedule.name == name and (r.run.fired_at is not None or r.done) for r in launcher.active.values())
                for name in engine.claims.recovering
            )

        quiet = asyncio.ensure_future(engine.loops.quiesce(started, flush))
        fault = asyncio.ensure_future(process.faulted.wait())
        try:
            await asyncio.wait({quiet, fault}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (quiet, fault):
                waiting.cancel()
            await asyncio.gather(quiet, fault, return_exceptions=True)

    async def settle(self) -> None:
        """Until every process that takes steps has done all the current time calls for."""
        while True:
            for p in self.running():
                # The lease's watch looks on real time, which the manual clock does not
                # move: it looks here, as it would have by now.
                p.engine.lease.check()
            while self.ended:
                await self.die(min(self.ended, key=lambda p: p.name))
            for p in self.running():
                await self.calm(p)
            if not self.busy():
                await asyncio.sleep(0)
                if not self.busy():
                    for p in self.running():
                        await self.calm(p)  # (what the last handlers to end recorded, written)
                    if not self.busy():
                        return
            await asyncio.sleep(0)

    async def tick(self, seconds: float) -> None:
        """Move the clock; each lease's watch looks before anything else runs (it would
        have looked as its bound passed, long before another's take-over window did)."""
        self.clock.advance(seconds)
        for p in self.running():
            p.engine.lease.check()
        await self.settle()

    async def die(self, process: Process) -> None:
        """The process ends (crashed, or it ended itself): its loops and handlers stop
        where they are, nothing it had in hand is written."""
        if process.dead:
            self.ended.discard(process)
            return
        self.note(f"die {process.name}")
        if process in self.ended:
            self.saw(f"a{' member' if process.member else 'n observer'} ended itself (a sync handler ran at its lapse)")
            self.ended.discard(process)
        process.dead = process.cut = True  # (what it hands its ledger from now on is lost)
        process.view.thaw()
        if process.answer is not None:
            process.answer.set()  # (its claim's task ends with it)
        for live in [live for live in self.live.values() if live.process is process]:
            self.finished(live)  # its process is gone, and the handler with it
            self.release(live)
        engine = process.engine
        await engine.loops.cancel_all()
        tasks = [i.task for i in engine.runner.in_flight.values() if i.task is not None and not i.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        engine.ledger.handoff()  # (to a store that cannot write it)
        await process.store.close()
        # Its threads' last words (a handler told to return) go nowhere.
        process.store.save_runs = lambda runs: None  # type: ignore[method-assign]

    def teardown(self) -> None:
        try:
            # Every fault off for good, the armed ones too: an engine's stop claims its lost
            # slots and flushes its ledger, and a process that ends itself as the others stop
            # (its lease lapsed with a sync handler not returned yet) must still stop.
            self.closing = True
            for process in self.processes:
                process.cut = False
                process.after_claim = None
                process.freeze_after_flush = False
                process.view.thaw()
                if process.answer is not None:
                    process.answer.set()
            for live in list(self.live.values()):
                self.release(live)
            for process in self.processes:
                if not process.dead:
                    self.run(process.engine.stop(grace=0))
            for live in list(self.live.values()):
                self.release(live)
            pending = asyncio.all_tasks(self.loop)
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending, timeout=30))
        finally:
            self.loop.close()
            self.db.close()

    def where_left(self, run_id: str, instance: str) -> str:
        """What the process a run left ``running`` belongs to knows of it (its row, and
        where in the engine it is: claimed, active, lost, its schedule recovering)."""
        row = self.db.execute(
            "SELECT name, scheduled_at, fired_at, finished_at, trigger, outcome, error_tag FROM schedtui_runs WHERE id = %s",
            (run_id,),
        ).fetchone()
        owner = next((p for p in self.processes if p.name == instance), None)
        if owner is None:
            return f"{run_id}: {row}; no process named {instance}"
        engine = owner.engine
        claims = engine.claims
        lost = {name: sorted(slot.isoformat() for slot in entries) for name, entries in claims.lost.items() if entries}
        tasks = sorted(t.get_name() for t in engine.loops.tasks if not t.done())
        recovering = "".join(
            f"\n  {t.get_name()} waits at:\n{awaiting(t)}" for t in engine.loops.tasks if "recover" in t.get_name() and not t.done()
        )
        return (
            f"{run_id}: {row}; {instance} dead={owner.dead} frozen={owner.frozen} ended={owner in self.ended} "
            f"lapsed={engine.lease.lapsed}; claimed={run_id in claims.claimed} active={run_id in engine.launcher.active} "
            f"turn={run_id in engine.launcher.turns} recovering={sorted(claims.recovering)} lost={lost} "
            f"inflight={dict(engine.launcher.inflight)} tasks={tasks}{recovering}"
        )

    # -- picking ----------------------------------------------------------------------------
    @staticmethod
    def pick_of(candidates: list[Process], pick: int) -> Process | None:
        return candidates[pick % len(candidates)] if candidates else None

    def healthy_members(self) -> list[Process]:
        return [p for p in self.members() if not p.cut and not p.frozen]

    # -- rules ------------------------------------------------------------------------------
    # No rule has a precondition: which member wins a slot, and so where a handler runs
    # (and whose lapse ends its process), depends on timing; the steps do not.
    @rule(seconds=st.integers(1, 14))
    def advance(self, seconds: int) -> None:
        """A live member beats every 5 s: at most 14 s, no healthy lease lapses."""
        self.note(f"advance {seconds}")
        self.run(self.tick(seconds))

    @rule(seconds=st.sampled_from([30, 65]))
    def time_passes(self, seconds: int) -> None:
        """In steps of ten seconds: past a cut-off lease's bound (20 s), the take-over window
        (30 s) and a sync handler's deadline (45 s)."""
        self.note(f"time passes {seconds}")
        self.time_goes_by(seconds)

    @rule(seconds=st.sampled_from([25, 45]))
    def host_suspended(self, seconds: int) -> None:
        """The whole host is suspended (every process at once, as a VM's): every lease
        that runs lapses, looked at first as the host wakes."""
        self.note(f"host suspended {seconds}")
        self.run(self.tick(seconds))

    @rule(pick=st.integers(0, 99))
    def a_handler_ends(self, pick: int) -> None:
        candidates = [live for live in sorted(self.live.values(), key=lambda live: live.seq) if not live.process.frozen]
        if not candidates:
            return
        live = candidates[pick % len(candidates)]
        self.note(f"let end {live}")
        self.release(live)
        self.run(self.settle())

    @rule(pick=st.integers(0, 9), name=st.sampled_from(sorted(CRONS)), observer=st.booleans())
    def run_now(self, pick: int, name: str, observer: bool) -> None:
        """A Run now through a member, or through the observer (opened first if none)."""
        if observer and self.observer() is None:
            self.run(self.start_process(member=False))
        candidates = [self.observer()] if observer else self.members()
        process = self.pick_of([p for p in candidates if p is not None and not p.frozen], pick)
        if process is None:
            return
        self.note(f"run now {name} through {process.name}")

        async def fire() -> None:
            with contextlib.suppress(Unavailable, Refused):
                await process.engine.run_now(name)
            await self.settle()

        self.run(fire())

    @rule(pick=st.integers(0, 9))
    def cut_off(self, pick: int) -> None:
        """A partition of one process (a member, while another is healthy; or the observer)."""
        process = self.faulty(pick)
        if process is None:
            return
        self.note(f"cut off {process.name}")
        process.cut = True
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def heal(self, pick: int) -> None:
        process = self.pick_of([p for p in self.processes if not p.dead and p.cut and p.answer is None], pick)
        if process is None:
            return
        self.note(f"heal {process.name}")
        process.cut = False
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def freeze(self, pick: int) -> None:
        """SIGSTOP: its clock stops, its statements wait, its handlers take no step, and
        nobody looks at its lease (whose clock, CLOCK_BOOTTIME, runs on)."""
        process = self.faulty(pick)
        if process is None:
            return
        self.note(f"freeze {process.name}")
        process.view.freeze()
        self.run(self.settle())

    @rule(pick=st.integers(0, 9))
    def thaw(self, pick: int) -> None:
        process = self.pick_of([p for p in self.processes if not p.dead and p.frozen and p.answer is None], pick)
        if process is None:
            return
        self.note(f"thaw {process.name}")
        self.run(self.thawed(process))

    def end_fault(self, process: Process, how: str) -> None:
        """The partition heals (``cut``), or the process is thawed (``freeze``)."""
        self.note(f"{'heal' if how == 'cut' else 'thaw'} {process.name}")
        if how == "cut":
            process.cut = False
            self.run(self.settle())
        else:
            self.run(self.thawed(process))

    async def thawed(self, process: Process) -> None:
        process.view.thaw()
        # Its lease's watch, overdue, is the first thing to run (a heartbeat needs a round
        # trip to the database before it could renew anything).
        process.engine.lease.check()
        await self.settle()

    def faulty(self, pick: int) -> Process | None:
        """A process to cut off or freeze: a member while another stays healthy, or the observer."""
        healthy = self.healthy_members()
        candidates = [p for p in self.processes if not p.dead and not p.cut and not p.frozen and p.answer is None]
        return self.pick_of([p for p in candidates if not p.member or len(healthy) > 1], pick)

    def time_goes_by(self, seconds: int) -> None:
        for _ in range(seconds // 10):
            self.run(self.tick(10))
        self.run(self.tick(seconds % 10 or 1))

    @rule(pick=st.integers(0, 9), how=st.sampled_from(["cut", "freeze"]), seconds=st.sampled_from([15, 25, 40, 70]))
    def a_fault_for_a_while(self, pick: int, how: str, seconds: int) -> None:
        """A partition or a freeze, time passing in steps of ten seconds, then it ends: its
        lease lapses (20 s) and the others take its runs over (30 s), or not yet."""
        process = self.faulty(pick)
        if process is None:
            return
        self.note(f"{how} {process.name} for {seconds}")
        if how == "cut":
            process.cut = True
        else:
            process.view.freeze()
        self.run(self.settle())
        self.time_goes_by(seconds)
        if not process.dead:
            self.end_fault(process, how)

    @rule(
        pick=st.integers(0, 9), how=st.sampled_from(["cut", "freeze"]), seconds=st.sampled_from([15, 25, 40]),
        renewed=st.booleans(),
    )  # fmt: skip
    def a_claim_answered_late(self, pick: int, how: str, seconds: int, renewed: bool) -> None:
        """A member's claim commits, then it is cut off or frozen with the answer on its
        way, which arrives after the partition healed or the thaw (``renewed``: after a
        heartbeat renewed the lease that lapsed meanwhile). Another member may have taken
        the slot's run over in between: what the claim won must not start."""
        process = self.faulty(pick)
        if process is None or not process.member:
            return
        process.after_claim = how
        for _ in range(2):  # to its next slot (one every five seconds)
            self.run(self.tick(5))
            if process.answer is not None or process.dead:
                break
        answer = process.answer
        if answer is None:
            process.after_claim = None  # (it claimed nothing: its lease had lapsed, or it died)
            return
        self.note(f"{process.name}'s claim committed, its answer held; {how} for {seconds}")
        self.time_goes_by(seconds)
        if process.dead:
            return
        self.end_fault(process, how)
        if renewed and not process.dead:
            self.run(self.tick(6))  # a heartbeat (every 5 s) renews its lease
        self.note(f"{process.name}'s claim answered")
        answer.set()
        self.run(self.settle())
        self.saw(f"a claim answered late ({how}{', renewed' if renewed else ''})")

    @rule(pick=st.integers(0, 9), name=st.sampled_from(sorted(CRONS)), seconds=st.sampled_from([15, 25, 40]))
    def a_run_now_frozen_before_it_starts(self, pick: int, name: str, seconds: int) -> None:
        """A Run now's row commits (it holds the schedule's place), then its process (the
        observer, or a member) freezes before the handler starts; thawed, the handler must
        not start if its lease lapsed meanwhile (another may have started the next slot)."""
        if self.observer() is None:
            self.run(self.start_process(member=False))
        process = self.faulty(pick)
        if process is None:
            return
        self.note(f"run now {name} through {process.name}, frozen once its row commits, for {seconds}")

        async def fire() -> None:
            with contextlib.suppress(Unavailable, Refused):
                await process.engine.run_now(name)

        async def until_frozen() -> asyncio.Task[None]:
            process.freeze_after_flush = True
            task = asyncio.ensure_future(fire())
            frozen = asyncio.ensure_future(process.faulted.wait())
            await asyncio.wait({task, frozen}, return_when=asyncio.FIRST_COMPLETED)
            frozen.cancel()
            process.freeze_after_flush = False
            await self.settle()
            return task

        task = self.run(until_frozen())
        self.time_goes_by(seconds)
        if process.frozen and not process.dead:
            self.note(f"thaw {process.name}")
            self.run(self.thawed(process))
        self.run(asyncio.wait({task}))
        self.run(self.settle())
        self.saw("a Run now frozen before it started")

    @rule(pick=st.integers(0, 9))
    def crash(self, pick: int) -> None:
        """SIGKILL: a member (while another is alive) or the observer."""
        members = self.members()
        candidates = [p for p in self.processes if not p.dead and (not p.member or len(members) > 1)]
        process = self.pick_of(candidates, pick)
        if process is None:
            return
        self.note(f"crash {process.name}")

        async def crashed() -> None:
            await self.die(process)
            await self.settle()

        self.run(crashed())

    @rule()
    def a_fresh_member(self) -> None:
        if len(self.members()) < MAX_MEMBERS:
            self.run(self.start_process(member=True))

    @rule()
    def everything_ends(self) -> None:
        """Every fault heals, every handler is let end as soon as it starts, for long enough
        (past a lapse, the take-over window and a deadline): then nothing is left running
        in the ledger, and every lease holds."""
        self.note("everything ends")

        async def heal_all() -> None:
            for process in self.processes:
                process.cut = False
                process.after_claim = None
                if process.frozen:
                    await self.thawed(process)
                if process.answer is not None:
                    process.answer.set()
            if not self.members():
                await self.start_process(member=True)
            await self.settle()

        self.run(heal_all())
        # 90 s without a member ending itself (its lease lapsed under a sync handler): what it
        # left running is closed by another (one started if it was the last) past the window.
        quiet, members = 0, self.members()
        for _ in range(40):
            if quiet >= 9:
                break
            for live in list(self.live.values()):
                self.release(live)
            if not self.members():
                self.run(self.start_process(member=True))
            quiet = quiet + 1 if self.members() == members else 0
            members = self.members()
            self.run(self.tick(10))
        for _ in range(3):  # (a settle may start a late slot: a shard taken over catches up)
            for live in list(self.live.values()):
                self.release(live)
            self.run(self.settle())
        assert not self.live, [str(live) for live in self.live.values()]
        left = self.db.execute(
            "SELECT id, name, status, held, instance FROM schedtui_runs WHERE status = 'running' OR held ORDER BY id"
        ).fetchall()
        assert not left, (
            f"left running (or holding its place) with no handler executing: {left}\n"
            + "\n".join(self.where_left(str(row[0]), str(row[4])) for row in left) + "\n" + "\n".join(self.log)
        )
        tags = self.db.execute("SELECT DISTINCT trigger, status, error_tag FROM schedtui_runs").fetchall()
        for tag in tags:
            self.saw(f"ledger: {' '.join(str(part) for part in tag)}")
        for process in self.processes:
            if not process.dead and process.engine.lease.enforced:
                assert not process.engine.lease.lapsed, f"{process.name}'s lease never held again"

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def never_twice_at_once(self) -> None:
        for live in self.live.values():
            p = live.process
            if not p.dead and not p.frozen and p.engine.lease.lapsed:
                # (each step waits until what it set off has happened: a cancellation too)
                self.violations.append(f"{live} still runs, its process's lease lapsed (cancelled at the lapse?)")
        for name in CRONS:
            counted = sorted((live for live in self.live.values() if live.schedule == name and self.counts(live)),
                             key=lambda live: live.seq)  # fmt: skip
            for later in counted[1:]:
                if later.trigger != "manual":
                    self.violations.append(f"{later} runs beside {[str(live) for live in counted if live is not later]}")
        assert not self.violations, "\n".join(self.violations) + "\n" + "\n".join(self.log)

    @invariant()
    def no_slot_twice_in_the_ledger(self) -> None:
        twice = self.db.execute(
            "SELECT name, scheduled_at, count(*) FROM schedtui_runs WHERE trigger = 'self' GROUP BY name, scheduled_at HAVING count(*) > 1"
        ).fetchall()
        if twice:
            rows = self.db.execute(
                "SELECT r.name, r.scheduled_at, r.id, r.status, r.instance, r.fired_at, r.coordination_outcome, "
                "r.error_tag FROM schedtui_runs r JOIN (SELECT name, scheduled_at FROM schedtui_runs WHERE trigger = 'self' "
                "GROUP BY name, scheduled_at HAVING count(*) > 1) t USING (name, scheduled_at) "
                "WHERE r.trigger = 'self' ORDER BY 1, 2, 3"
            ).fetchall()
            assert not twice, "slots with two timed runs:\n" + "\n".join(map(str, rows)) + "\n" + "\n".join(self.log)


class ClusterScheduleLivenessMachine(ScheduleLivenessMachine):
    """The same in ``cluster`` coordination: one owner per schedule at a time, its shard
    taken over by another member once its lease expires (a frozen or cut-off owner)."""

    coordination: CoordinationMode = "cluster"
    shard_ttl = 25.0
    """Renewed every fifth of it: a step of ten seconds leaves a live owner its shards (with
    the default 10 s, every such step would expire them all, as a freeze of the fleet)."""


def bounded(examples: int) -> settings:
    return settings(
        max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", examples)),
        stateful_step_count=int(os.environ.get("SCHEDTUI_HYPOTHESIS_STEPS", 25)),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@pytest.mark.postgres
def test_schedule_runs_never_twice_at_once_on_postgres(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(ScheduleLivenessMachine, settings=bounded(16))


@pytest.mark.postgres
def test_schedule_runs_never_twice_at_once_in_cluster_coordination(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(ClusterScheduleLivenessMachine, settings=bounded(8))
