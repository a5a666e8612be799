"""The engine's invariants under random sequences of operations (Hypothesis, stateful).

A :class:`~hypothesis.stateful.RuleBasedStateMachine` drives real engines on a
:class:`~backend.clock.ManualClock` over a real SQLite store in a temporary folder: enable,
disable (with or without a note), Run now, range backfills of a past range, clock advances
from a fraction of a second to several minutes, store outages (a wrapper whose calls raise
:class:`~backend.errors.Unavailable` while the store is down), claims whose answer is lost
after they committed, a full disk (SQLite refuses
to grow the file; ``single`` only: the one firer keeps what it cannot write in the store's
reserve) that a restart may find, and clean restarts after some downtime (some whose stop
lands while the instance's claim of the next slot has committed and its answer is held,
with or without a grace) or after the clock was stepped back (NTP correcting a clock that
ran fast: the engine meets slots it has recorded again; one engine only). One configuration runs one engine (``single`` or ``advisoryLock``
coordination), the other a fleet of two engines sharing the store, ``advisoryLock`` at
first; a restart there may come back in the other mode (``single``), as a rolling change
of ``--coordination`` does: an instance whose mode differs from the firing one's waits,
and fires (catching up) once no instance of the other mode is left. In a fleet the two
instances' claims and heartbeats sent at the same instant reach the store in either order,
and the second may run with a shorter take-over window (a rolling change of
``--abandon-after``). A handler may overrun its ``max_runtime``, ignoring the watchdog's
cancellation (until its engine stops). After every step the ledger is checked:

(a) at most one ``self`` run per (schedule, slot), across every engine;
(b) every slot of a self-triggered schedule that came due while it was enabled (after the
    first start, or after it was re-enabled: slots passed while disabled are not replayed)
    has a row: a run, or a ``skipped`` or ``missed`` one;
(c) after a clean stop (a restart, and the end of each example), the stopped engine has
    left nothing ``running``;
(d) no two non-manual runs of a ``skip`` or ``queue`` schedule were in flight at once, by
    the ledger or by when their handlers really ran (a timed-out one keeps its place); nor
    did one start while a Run now of the schedule ran (d');
(e) no slot's handler started twice (self-triggered or external), and none whose handler
    started is recorded ``missed`` or ``skipped``;
(f) a fourth schedule is fired by a platform (``trigger="external"``, every 15 minutes):
    calls reach one instance or another, one after another or at once (a platform's retry
    while its first call hangs), on time, a few seconds early (the call waits for its slot),
    or later than the tolerance. Every call that fired or found a slot's run names the same
    run, which the ledger has, for that slot; at most one call created it; a call answered
    503 fired nothing; a call is refused as disabled exactly when an operator disabled the
    schedule (through any instance) and the slot had not been fired before, and as too late
    exactly when the slot is older than the tolerance and was never fired;
(g) what the timer's claim of due slots won, cut short by a stop, is closed by the stop:
    started within the grace (or recorded as its overlap policy says), and recorded
    ``missed`` only by a stop with no grace (a rolling restart's SIGTERM must not leave a
    slot the fleet lost to this instance run nowhere);
(h) a stop with a grace records no slot that is still its schedule's current one ``missed``
    for want of a claim (a claim whose answer was lost, an outage just before the stop):
    it starts it, if its lease held (the fleet lost that slot to it as well);
(i) a restart of one engine may come back deployed with another cron for a schedule: no
    timed run is of a slot that is not one of the cron of its time (none before the
    change fires after it; the catch-up starts from the change).
(j) no run is closed ``abandoned`` while its handler still runs (no instance here dies).

Only the engine's public API is used (``Engine(...)``, ``start``, ``stop``, ``quiesce``,
``run_now``, ``set_enabled``, ``start_backfill``, ``flush``, ``store``, ``stats``).

The number of examples is bounded for CI by the Hypothesis profile ``invariants`` (100
examples of 30 steps, about 30 s on two cores). The profile ``invariants-deep`` (2,000
examples) shakes out rarer sequences locally; ``SCHEDTUI_HYPOTHESIS_EXAMPLES`` and
``SCHEDTUI_HYPOTHESIS_STEPS`` override either, e.g.::

    SCHEDTUI_HYPOTHESIS_PROFILE=invariants-deep python -m pytest tests/test_invariants.py -q -p no:cacheprovider
    SCHEDTUI_HYPOTHESIS_EXAMPLES=5000 SCHEDTUI_HYPOTHESIS_STEPS=50 python -m pytest tests/test_invariants.py -q
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import os
import random
import shutil
import tempfile
import types
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backend import Engine, ManualClock, Refused, Run, RunContext, Schedule, Unavailable, define_schedule
from backend.cron import Cron
from backend.ids import IdFactory
from backend.model import BackfillPolicy, Claim, ClaimResult, CoordinationMode, OverlapPolicy
from backend.store import Store, open_store
from backend.store.sqlite.store import SQLiteStore

START = "2026-03-02T08:00:00Z"
STEP_TIMEOUT = 30.0  # real seconds; a step takes milliseconds
POLL = 1.0  # the engines' state_poll_interval: how soon housekeeping notices things

# Schedules, one of each kind of cadence: a six-field every-20-seconds one, a minute one,
# and an every-two-minutes one. Their policies and handlers are drawn per example.
CRONS = {"sec": "*/20 * * * * *", "min": "* * * * *", "two": "*/2 * * * *"}
# What a deploy may change two of them to (and back): slots the first never has.
RETIMED = {"min": "30 * * * * *", "two": "1-59/2 * * * *"}
# The platform-fired schedule: slots far enough apart that a call may come past the tolerance.
EXTERNAL, EXTERNAL_CRON = "ext", "*/15 * * * *"
TOLERANCE = timedelta(minutes=10)  # the engine's default external_tolerance
EARLY = timedelta(seconds=5)  # and external_early


# ---------------------------------------------------------------------------------------
# test infrastructure: a store that can go down, handlers that can be slow or fail
# ---------------------------------------------------------------------------------------
class World:
    """What the engines of one example share: the outage switch, and the stores behind
    their :class:`FlakyStore` wrappers."""

    def __init__(self) -> None:
        self.down = False
        self.full = False  # the disk: SQLite cannot grow the file
        self.lose_answers = 0  # the next claims whose answer is lost after they committed
        self.unanswered: set[str] = set()
        """The run ids of the claims whose answer was lost."""
        self.pending = 0  # store calls on their way
        self.stores: list[Store] = []
        self._lock: asyncio.Lock | None = None
        self.hold_claim: tuple[str, datetime] | None = None
        """The instance whose timer's next claim of the slots due at an instant commits and
        then holds its answer (a stop lands meanwhile)."""
        self.claim_held: asyncio.Event | None = None
        self.let_go: asyncio.Event | None = None
        self.held: tuple[Sequence[Claim], ClaimResult] | None = None
        """The held claim and its answer."""
        self.order: random.Random | None = None
        """In a fleet: whose claim or heartbeat reaches the database first when two are sent
        at the same instant (clocks a little apart, one network slower), drawn per call."""

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


class FlakyStore:
    """A store whose calls raise :class:`Unavailable` while the world's store is down.

    Handing runs to the writer and flushing it still work (the real stores keep what they
    cannot write and write it once back). For repeatable examples, calls go one at a time
    (in the order the engines make them), and each first flushes every engine's writer:
    what an engine handed in before is visible to the next call, whichever engine makes
    it (the group commit takes milliseconds; the clock here only moves between steps). It
    also counts the calls on their way, so the machine knows when nothing waits for the
    database any more. In a fleet, whose racing call goes first is drawn, and a claim's
    turns are sometimes left undecided, as PostgreSQL leaves them when another instance
    decides one of the schedule's at that moment (:attr:`ClaimResult.untried`)."""

    FAILING = {
        "claim", "claimed_run", "get_states", "set_state", "heartbeat", "heartbeat_and_unfinished", "instances", "forget_instance",
        "running_runs", "unfinished_work", "running_backfills", "last_slots", "last_runs", "list_runs", "get_run", "close_runs",
        "prune_runs", "prune_claims", "count_claims", "start_backfill", "update_backfill", "get_backfill", "take_turn",
    }  # fmt: skip
    PASSING = {"open", "close", "flush"}
    RACING = {"claim", "heartbeat_and_unfinished", "take_turn"}

    def __init__(self, inner: Store, world: World, instance: str) -> None:
        self.inner = inner
        self.world = world
        self.instance = instance

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name not in self.FAILING and name not in self.PASSING:
            return value
        world = self.world

        async def call(*args: Any, **kwargs: Any) -> Any:
            world.pending += 1
            untried: frozenset[str] = frozenset()
            try:
                if name in self.RACING and world.order is not None and world.order.random() < 0.5:
                    for _ in range(3):
                        await asyncio.sleep(0)  # the other instance's call, sent as well, goes first
                if name == "claim" and world.order is not None and any(c.turn for c in args[0]):
                    if world.order.random() < 0.25:  # another instance decides a turn meanwhile (PostgreSQL)
                        untried = frozenset(c.name for c in args[0] if c.turn)
                        args = ([dataclasses.replace(c, turn=False) for c in args[0]], *args[1:])
                async with world.lock:
                    if name in self.FAILING and world.down:
                        raise Unavailable("the store is down (test)")
                    for store in world.stores:
                        try:
                            await store.flush()
                        except Unavailable:
                            if not world.full:  # a full disk: the rows wait in the writer
                                raise
                    if name == "close":
                        world.stores.remove(self.inner)
                    result = await value(*args, **kwargs)
                    if untried:
                        result = dataclasses.replace(result, untried=untried)
                    if name == "open":
                        world.stores.append(self.inner)
                    if name == "claim" and world.lose_answers:
                        world.lose_answers -= 1
                        world.unanswered.update(claim.run_id for claim in args[0])
                        raise Unavailable("the connection broke after the claim committed (test)")
                if name == "claim" and world.hold_claim is not None and self.holds(world.hold_claim, args[0]):
                    assert world.claim_held is not None and world.let_go is not None
                    world.hold_claim, world.held = None, (args[0], result)
                    world.claim_held.set()
                    await world.let_go.wait()  # (the other engines' calls go on meanwhile)
                return result
            finally:
                world.pending -= 1

        return call

    def holds(self, hold: tuple[str, datetime], claims: Sequence[Claim]) -> bool:
        """Whether ``claims`` is the claim to hold: this instance's claiming only slots due
        at the instant: its timer's, or a catch-up's of current slots only (a start that
        waited for another mode's fleet), whose won slots a graceful stop starts alike. Not
        a catch-up's of older slots too, a platform's call (``external``), nor lost slots
        claimed again (their run ids were proposed before)."""
        return hold[0] == self.instance and all(
            claim.scheduled_at == hold[1] and claim.trigger == "self" and claim.run_id not in self.world.unanswered
            for claim in claims
        )


@dataclass
class Behaviour:
    kind: str  # "noop" | "fail" | "sleep" | "overrun" (a sleep that ignores its cancellation)
    seconds: float = 0.0


class Handlers:
    """One handler per schedule, shared by the engines; counts what they do."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.events = 0  # changes whenever a handler starts or ends
        self.started: dict[tuple[str, datetime], int] = defaultdict(int)
        """Handler starts per timed slot (``(name, scheduled_at)``; Run now and backfills are
        manual and not counted)."""
        self.stopping = False
        """Set while an engine stops: an ``overrun`` handler ends with its process then."""
        self.epoch = 0
        """How many times the clock was stepped back: times compare only within one epoch."""
        self.spans: dict[tuple[str, int], list[list[datetime | None]]] = defaultdict(list)
        """When each timed run's handler really ran, per schedule and epoch: ``[start, end]``
        (``None``: running); a run recorded ``timeout`` or ``abandoned`` may run on past its
        row's end."""
        self.ran: dict[str, list[datetime | None]] = {}
        """The same spans by run id, Run now and backfills included."""

    def make(self, behaviour: Behaviour) -> Callable[[RunContext], Any]:
        async def handler(ctx: RunContext) -> None:
            self.events += 1
            span: list[datetime | None] = [self.clock.now(), None]
            self.ran[ctx.run_id] = span
            if ctx.trigger != "manual":
                self.started[(ctx.name, ctx.scheduled_at)] += 1
                self.spans[(ctx.name, self.epoch)].append(span)
            try:
                if behaviour.kind == "fail":
                    raise RuntimeError("failed on purpose")
                if behaviour.kind in ("sleep", "overrun"):
                    until = ctx.fired_at + timedelta(seconds=behaviour.seconds)
                    while True:
                        try:
                            await self.clock.sleep_until(until)
                            break
                        except asyncio.CancelledError:  # past max_runtime: the watchdog's
                            if behaviour.kind == "sleep" or self.stopping or self.clock.now() >= until:
                                raise
            finally:
                span[1] = self.clock.now()
                self.events += 1

        return handler


# ---------------------------------------------------------------------------------------
# the model: what the ledger must show
# ---------------------------------------------------------------------------------------
@dataclass
class ScheduleModel:
    name: str
    schedule: Schedule
    enabled_since: list[datetime] = field(default_factory=list)
    """Starts of the enabled intervals; ``enabled_until`` holds their ends."""
    enabled_until: list[datetime | None] = field(default_factory=list)
    excused: list[tuple[datetime, datetime]] = field(default_factory=list)
    """Intervals ``(start, end]`` whose slots may lack a row (documented behaviour)."""
    external: bool = False
    """Fired by the platform's calls only: its slots have rows where a call fired them."""
    crons: list[tuple[datetime | None, Cron]] = field(default_factory=list)
    """Its crons, oldest first, each with the instant after which its slots are the
    schedule's (``None``: from the start); empty: ``schedule.cron`` throughout."""

    @property
    def enabled(self) -> bool:
        return bool(self.enabled_until) and self.enabled_until[-1] is None

    def enable(self, at: datetime) -> None:
        if not self.enabled:
            self.enabled_since.append(at)
            self.enabled_until.append(None)

    def disable(self, at: datetime) -> None:
        if self.enabled:
            self.enabled_until[-1] = at

    def timings(self, now: datetime) -> list[tuple[datetime | None, datetime, Cron]]:
        """``(start, end, cron)``: the cron whose slots in ``(start, end]`` are the schedule's."""
        crons = self.crons or [(None, self.schedule.cron)]
        ends = [start for start, _ in crons[1:] if start is not None] + [now]
        return [(start, end, cron) for (start, cron), end in zip(crons, ends, strict=True)]

    def retime(self, at: datetime, schedule: Schedule) -> None:
        """A deploy changed its cron at ``at`` (when an engine first ran the new one)."""
        if not self.crons:
            self.crons.append((None, self.schedule.cron))
        self.crons.append((at, schedule.cron))
        self.schedule = schedule

    def cron_at(self, slot: datetime) -> Cron:
        """The cron of the time of ``slot``: a timed run's slot must be one of its."""
        return next(cron for start, end, cron in self.timings(slot) if (start is None or start < slot) and slot <= end)

    def due_slots(self, now: datetime) -> list[datetime]:
        """Slots that came due while enabled, up to now, each of the cron of its time."""
        slots: list[datetime] = []
        for since, until in zip(self.enabled_since, self.enabled_until, strict=False):
            for start, end, cron in self.timings(now):
                low, high = max(since, start or since), min(until or now, end)
                if low < high:
                    slots.extend(cron.occurrences(low, high))
        return [s for s in slots if not any(a < s <= b for a, b in self.excused)]


#: The instance name of the process that fires nothing (see EngineMachine.run_now_elsewhere).
OBSERVER = "cli"


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        # Tasks counted as they are made and as they end: settle() compares the counts, where
        # asyncio.all_tasks() walked every ended task not yet collected (8% of the machine).
        self.tasks_made = self.tasks_ended = 0
        self.runner.get_loop().set_task_factory(self.counted_task)
        self.folder = Path(tempfile.mkdtemp(prefix="schedtui-invariants-"))
        self.url = f"sqlite:///{self.folder / 'state.db'}"
        self.clock = ManualClock(START)
        self.instants: list[datetime] = [self.clock.now()]
        """Every time the clock was set to, in order, since it was last stepped back: the
        engines see a slot only at the first of them at or after it (a jump over several
        slots shows them all at once)."""
        self.run_epochs: dict[str, int] = {}
        """The epoch (see :class:`Handlers`) of each run recorded before the clock was last
        stepped back; every run not here is of the current one."""
        self.handlers = Handlers(self.clock)
        self.world = World()
        self.generation = 0  # engines made so far: seeds their ids
        self.engines: dict[str, Engine] = {}
        self.observer: Engine | None = None
        self.room_at: datetime | None = None
        """When the disk last got room again."""
        """A process that fires nothing, opened to do a Run now (``schedtui fire`` in another
        shell): it lives on while its runs do, until a restart of the clock's epoch or the end."""
        self.mode = "single"
        self.modes: dict[str, CoordinationMode] = {}
        self.windows: dict[str, float] = {}
        """In a fleet: an instance's take-over window, if not the default 3600 s."""
        """In a fleet: each instance's coordination mode (``advisoryLock`` unless a restart changed it)."""
        self.models: dict[str, ScheduleModel] = {}
        self.definitions: list[Schedule] = []
        self.checker: Store | None = None
        self.unrecovered_since: datetime | None = None
        """When the current (or last, not yet recovered) outage began."""
        self.recovered_after: datetime | None = None
        self.log: list[str] = []
        self.external_runs: dict[datetime, str] = {}
        """The run each external slot's calls named (a call that fired it, or found it)."""
        self.external_created: set[datetime] = set()

    # -- plumbing -------------------------------------------------------------------------
    def run(self, coro: Any) -> Any:
        """Run one step on the machine's event loop. The timeout only bounds a hung engine
        (then the stacks of its tasks and the steps so far are the failure message)."""

        async def bounded() -> Any:
            step = asyncio.ensure_future(coro)
            done, _ = await asyncio.wait({step}, timeout=STEP_TIMEOUT)
            if step in done:
                return step.result()
            stacks = []
            for task in asyncio.all_tasks():
                where: list[str] = []
                awaiting: object = task.get_coro()
                while isinstance(awaiting, types.CoroutineType):  # down the await chain
                    if awaiting.cr_frame is not None:
                        where.append(f"{awaiting.cr_code.co_name}:{awaiting.cr_frame.f_lineno}")
                    awaiting = awaiting.cr_await
                stacks.append(f"{task.get_name()}: {' -> '.join(where)}")
            step.cancel()
            raise AssertionError(f"a step hung ({STEP_TIMEOUT}s); tasks:\n  " + "\n  ".join(stacks) + self.steps())

        return self.runner.run(bounded())

    def new_engine(self, instance: str) -> Engine:
        inner = open_store(self.url)
        assert isinstance(inner, SQLiteStore)
        inner.close_patience = 0  # real seconds: a stop on a full disk keeps its runs at once
        store = FlakyStore(inner, self.world, instance)
        self.generation += 1
        bits = random.Random(f"{instance}-{self.generation}").getrandbits
        return Engine(
            self.definitions,
            store,
            clock=self.clock,
            instance=instance,
            coordination=self.modes.get(instance, "single" if self.mode == "single" else "advisoryLock"),
            shutdown_grace=0,
            state_poll_interval=POLL,
            # The clock jumps minutes at once; no instance here dies (one of 300 s judges
            # the others by their own window, 3600 s, where that is the longer).
            abandon_after=self.windows.get(instance, 3600),
            retention=None,
            ids=IdFactory(self.clock.now, functools.partial(bits, 80)),  # repeatable
        )

    def counted_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks_made += 1
        task.add_done_callback(self.task_ended)
        return task

    def task_ended(self, _: asyncio.Task[Any]) -> None:
        self.tasks_ended += 1

    def signature(self) -> tuple[Any, ...]:
        return (
            self.world.pending,
            self.handlers.events,
            self.clock.sleepers,
            self.tasks_made,
            self.tasks_ended,
            tuple(sum(e.stats.values()) for e in self.every_engine()),
        )

    def every_engine(self) -> list[Engine]:
        """The firing instances and the observer, if open."""
        return [*self.engines.values(), *([self.observer] if self.observer is not None else [])]

    async def settle(self) -> None:
        """Wait until the engines have done everything the current time calls for, short
        of runs still in flight: their loops are parked (``quiesce(runs=False)``), no store
        call is on its way, and nothing changes over a few more rounds of the event loop.
        (``quiesce()`` itself waits for every run to finish, which a handler sleeping on
        the manual clock never does until the clock moves.)"""
        last, stable = None, 0
        for _ in range(2000):
            for engine in self.every_engine():
                try:
                    await engine.quiesce(runs=False)
                except Unavailable:
                    if not self.world.full:  # a full disk: quiesce's last flush cannot write
                        raise
            for _ in range(3):
                await asyncio.sleep(0)
            now = self.signature()
            stable = stable + 1 if now == last and self.world.pending == 0 else 0
            if stable >= 3:
                return
            last = now
        raise AssertionError(f"the engines did not settle{self.steps()}")

    async def ledger(self) -> dict[str, list[Run]]:
        for engine in self.every_engine():
            try:
                await engine.flush()
            except Unavailable:
                if not self.world.full:
                    raise
        assert self.checker is not None
        return {name: await self.checker.list_runs(name, limit=1_000_000) for name in self.models}

    # -- set-up -----------------------------------------------------------------------------
    @initialize(
        mode=st.sampled_from(["single", "advisoryLock", "fleet"]),
        policies=st.lists(
            st.tuples(
                st.sampled_from(["skip", "queue", "parallel"]),
                st.sampled_from(["skip", "latest", "all"]),
                st.one_of(
                    st.just(Behaviour("noop")),
                    st.just(Behaviour("fail")),
                    st.builds(Behaviour, st.just("sleep"), st.sampled_from([5.0, 25.0, 45.0, 90.0, 200.0])),
                    # past a max_runtime of 30 s, ignoring the watchdog's cancellation
                    st.builds(Behaviour, st.just("overrun"), st.sampled_from([45.0, 200.0])),
                ),
                st.sampled_from([30.0, 600.0]),
            ),
            min_size=len(CRONS),
            max_size=len(CRONS),
        ),
        external=st.tuples(
            st.sampled_from(["skip", "queue", "parallel"]),
            st.sampled_from([Behaviour("noop"), Behaviour("fail"), Behaviour("sleep", 20.0), Behaviour("sleep", 1000.0)]),
        ),
        window=st.sampled_from([3600.0, 300.0]),
        order=st.integers(0, 2**16),
    )
    def set_up(
        self,
        mode: str,
        policies: list[tuple[OverlapPolicy, BackfillPolicy, Behaviour, float]],
        external: tuple[OverlapPolicy, Behaviour] = ("skip", Behaviour("noop")),
        window: float = 3600.0,
        order: int = 0,
    ) -> None:
        self.mode = mode
        if mode == "fleet":  # b's --abandon-after: a rolling change of it runs both (a: 3600 s)
            self.windows["b"] = window
            self.world.order = random.Random(order)
            self.log.append(f"b: abandon_after={window:g}; who goes first: {order}")
        overlap, behaviour = external
        schedule = define_schedule(
            name=EXTERNAL,
            cron=EXTERNAL_CRON,
            timezone="UTC",
            handler=self.handlers.make(behaviour),
            trigger="external",
            on_overlap=overlap,
            max_runtime=3600,
        )
        self.definitions.append(schedule)
        self.models[EXTERNAL] = ScheduleModel(EXTERNAL, schedule, external=True)
        self.log.append(f"{EXTERNAL}: {EXTERNAL_CRON} external on_overlap={overlap} {behaviour}")
        for (name, cron), (overlap, backfill, behaviour, max_runtime) in zip(CRONS.items(), policies, strict=False):
            if behaviour.kind == "overrun":
                max_runtime = 30.0  # (what it runs past)
            schedule = define_schedule(
                name=name,
                cron=cron,
                timezone="UTC",
                handler=self.handlers.make(behaviour),
                on_overlap=overlap,
                backfill=backfill,
                max_runtime=max_runtime,
            )
            self.definitions.append(schedule)
            self.models[name] = ScheduleModel(name, schedule)
            self.log.append(f"{name}: {cron} on_overlap={overlap} backfill={backfill} {behaviour} max_runtime={max_runtime}")

        async def go() -> None:
            self.checker = open_store(self.url)
            await self.checker.open()
            for instance in ["a", "b"] if mode == "fleet" else ["a"]:
                self.engines[instance] = engine = self.new_engine(instance)
                await engine.start()
            await self.settle()

        self.run(go())
        for model in self.models.values():
            model.enable(self.clock.now())

    def teardown(self) -> None:
        async def go() -> None:
            self.handlers.stopping = True
            for engine in self.every_engine():
                await engine.stop(grace=0)
            if self.world.full:
                # Stopped on a full disk: the rows it could not write are in the reserve,
                # until the next firer of the store (with room) writes them.
                after = SQLiteStore(self.folder / "state.db")
                await after.take_firing_lock("after")
                await after.open()
                await after.flush()
                await after.close()
            if self.checker is not None:
                left = await self.checker.running_runs()
                # The unstarted runs of claims whose answer was lost (the stop's own claim's
                # too, or the store down at the stop) wait for the instance's next start, or
                # another's sweep, to be closed (the restart rule checks that it does).
                left = [r for r in left if not (r.fired_at is None and r.id in self.world.unanswered)]
                await self.checker.close()
                # (c) once more, for every engine, after the last step
                assert not left, f"(c) a clean stop left runs running: {self.show({r.scheduled_at: [r] for r in left})}"

        try:
            self.run(go())
        finally:
            self.runner.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- rules ------------------------------------------------------------------------------
    instances = st.sampled_from(["a", "b"])
    names = st.sampled_from(sorted([*CRONS, EXTERNAL]))
    # Every other rule also lets some time pass after it (Hypothesis turns whole rules off
    # in some examples, the advance rules too): none, a fraction of a second, a slot of
    # the six-field schedule, a minute and a bit, a few minutes.
    then = st.sampled_from([0.0, 0.5, 20.0, 61.0, 150.0])

    def engine(self, instance: str) -> Engine:
        return self.engines.get(instance) or self.engines["a"]

    # Time moves in three kinds of steps (three rules, so that it moves in most steps):
    # within a second, across a few of the six-field schedule's slots, across minutes.
    @rule(seconds=st.floats(0.1, 1.0))
    def advance_a_little(self, seconds: float) -> None:
        self.advance(seconds)

    @rule(seconds=st.integers(1, 30))
    def advance_seconds(self, seconds: int) -> None:
        self.advance(seconds)

    @rule(seconds=st.integers(30, 400))
    def advance_minutes(self, seconds: int) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if not seconds:
            return
        self.clock.advance(seconds)
        self.instants.append(self.clock.now())
        self.log.append(f"advance {seconds}s -> {self.clock.now():%H:%M:%S.%f}")
        self.run(self.settle())

    notes = st.one_of(st.none(), st.just("maintenance"))

    @rule(instance=instances, name=names, enabled=st.booleans(), note=notes, then=then)
    def set_enabled(self, instance: str, name: str, enabled: bool, note: str | None, then: float) -> None:
        self.switch(instance, name, enabled, note)
        self.advance(then)

    @rule(instance=instances, name=names, note=notes, then=then)
    def pause(self, instance: str, name: str, note: str | None, then: float) -> None:
        """Disable, then enable at once: an operator's brief pause (it once added a timer
        entry per pause, so later slots fired more than once)."""
        self.switch(instance, name, False, note)
        self.switch(instance, name, True, None)
        self.advance(then)

    def switch(self, instance: str, name: str, enabled: bool, note: str | None) -> None:
        engine = self.engine(instance)
        self.log.append(f"{engine.instance}: set_enabled({name}, {enabled}, note={note!r})")

        async def go() -> bool:
            try:
                await engine.set_enabled(name, enabled, note=note)
            except Unavailable:
                return False
            await self.settle()
            return True

        if self.run(go()):
            model = self.models[name]
            if not engine.registry.fires:
                # Done through an instance that fires nothing (it waits for the other mode's
                # instances to leave): the firing ones hear of it at their next state poll, so
                # a slot due meanwhile may go either way.
                before = self.clock.now()
                self.advance(POLL)
                model.excused.append((before - timedelta(seconds=POLL), self.clock.now()))
            model.enable(self.clock.now()) if enabled else model.disable(self.clock.now())

    @rule(instance=instances, name=names, then=then)
    def run_now(self, instance: str, name: str, then: float) -> None:
        engine = self.engine(instance)
        self.log.append(f"{engine.instance}: run_now({name})")

        async def go() -> None:
            waiting = engine.registry.role == "waiting"
            try:
                run = await engine.run_now(name)
            except Unavailable:
                assert self.world.full, "Run now refused with room on the disk"
                return  # refused: the store cannot record it
            except Refused:
                assert waiting, "Run now refused by an instance that fires"
                return  # it fires nothing while the other mode's instances fire
            assert not waiting, "Run now started by an instance that fires nothing"
            assert (run.trigger, run.coordination_outcome) == ("manual", "manual")
            await self.settle()

        self.run(go())
        self.advance(then)

    @rule(name=names, then=then)
    def run_now_elsewhere(self, name: str, then: float) -> None:
        """A Run now through a process that fires nothing (``schedtui fire`` in another shell,
        a console without ``--fire``), opened for it, beside the firing instances: under
        ``single`` the firing one once looked at no other process's runs, and started its
        next slot beside this one."""
        self.log.append(f"{OBSERVER}: run_now({name})")

        async def go() -> None:
            if self.observer is None:
                observer = self.new_engine(OBSERVER)
                try:
                    await observer.open()
                except Unavailable:
                    await observer.stop(grace=0)
                    return  # the store is down: the verb fails
                self.observer = observer
            try:
                run = await self.observer.run_now(name)
            except Unavailable:
                return  # refused: the store cannot record it
            assert (run.trigger, run.coordination_outcome) == ("manual", "manual")
            await self.settle()

        self.run(go())
        self.advance(then)

    async def close_observer(self) -> None:
        """The process that fires nothing exits (its runs are interrupted)."""
        if self.observer is not None:
            observer, self.observer = self.observer, None
            stopping, self.handlers.stopping = self.handlers.stopping, True  # (its handlers end with it)
            try:
                await observer.stop(grace=0)
            finally:
                self.handlers.stopping = stopping

    @rule(instance=instances, name=names, back=st.integers(1, 6), count=st.integers(1, 4), then=then)
    def backfill(self, instance: str, name: str, back: int, count: int, then: float) -> None:
        engine = self.engine(instance)
        step = timedelta(seconds={"sec": 20, "min": 60, "two": 120}.get(name, 900))
        end = self.clock.now() - back * step
        start = end - count * step
        self.log.append(f"{engine.instance}: backfill({name}, {start:%H:%M:%S}, {end:%H:%M:%S})")

        async def go() -> None:
            waiting = engine.registry.role == "waiting"
            try:
                await engine.start_backfill(name, start, end, confirm=True)
            except (Refused, Unavailable):
                pass  # one at a time, a range before the first slot, the store is down, or it fires nothing
            else:
                assert not waiting, "a backfill started by an instance that fires nothing"
            await self.settle()

        self.run(go())
        self.advance(then)

    @rule(
        calls=st.lists(instances, min_size=1, max_size=3),
        together=st.booleans(),
        early=st.sampled_from([False, False, False, True]),
        disabled_by=st.sampled_from([None, None, None, "a", "b"]),
        then=then,
    )
    def platform_fire(self, calls: list[str], together: bool, early: bool, disabled_by: str | None, then: float) -> None:
        """The platform calls for the external schedule's due slot: once, or again (a
        retry), through one instance or another, one call after another or all at once;
        ``early``: two seconds before the next slot (its clock runs fast), when that slot is
        a few minutes off at most; ``disabled_by``: an operator disabled the schedule
        through that instance just before (an incident), and it stays so until enabled."""
        model = self.models[EXTERNAL]
        if disabled_by is not None:
            self.switch(disabled_by, EXTERNAL, False, "incident")
        cron = model.schedule.cron
        upcoming = cron.next(self.clock.now())
        gap = (upcoming - self.clock.now()).total_seconds()
        early = early and gap <= 400
        if early and gap > 2:
            self.advance(gap - 2)
        # A call up to 5 s before a slot is for that slot: it waits for it (drawn or not).
        early = upcoming - self.clock.now() <= EARLY
        engines = [self.engine(instance) for instance in calls]
        self.log.append(f"platform: fire {EXTERNAL} via {[e.instance for e in engines]}"
                        f"{' at once' if together else ''}{' early' if early else ''}")  # fmt: skip

        async def call(engine: Engine) -> tuple[datetime, Any]:
            try:
                answer: Any = await engine.fire_external(EXTERNAL)
            except (Refused, Unavailable) as exc:
                answer = exc
            return self.clock.now(), answer

        async def go() -> list[tuple[datetime, Any]]:
            if together:
                pending = asyncio.gather(*(call(engine) for engine in engines))
            else:
                async def one_by_one() -> list[tuple[datetime, Any]]:
                    return [await call(engine) for engine in engines]

                pending = asyncio.ensure_future(one_by_one())
            await self.settle()
            if early:  # the calls wait for the slot
                self.clock.set(upcoming)
                self.instants.append(upcoming)
                await self.settle()
            answers = await pending
            await self.settle()
            return answers

        # (calls at once answer in any order: the one that created the run first)
        for at, answer in sorted(self.run(go()), key=lambda pair: (pair[0], not getattr(pair[1], "created", False))):
            self.check_answer(model, at, answer)
        self.advance(then)

    def check_answer(self, model: ScheduleModel, at: datetime, answer: Any) -> None:
        """(f), for one call answered at ``at``."""
        slot = model.schedule.cron.latest(at)
        self.log.append(f"  -> {slot:%H:%M:%S}: {answer!r:.160}")
        known = self.external_runs.get(slot)
        if currently_in_test_context():
            kind = getattr(answer, "reason", None) or type(answer).__name__
            event(f"{self.mode}: external call {kind}{' created' if getattr(answer, 'created', False) else ''}")
        if isinstance(answer, Unavailable):
            assert self.world.down or self.world.full, f"(f) answered 503 with the store up: {answer}{self.steps()}"
            return
        if isinstance(answer, Refused):
            assert known is None, f"(f) refused ({answer}), but slot {slot:%H:%M:%S} was fired: {known}{self.steps()}"
            if answer.reason == "disabled":
                assert not model.enabled, f"(f) refused as disabled while enabled: {answer}{self.steps()}"
            else:
                assert answer.reason == "no slot due", f"(f) refused: {answer}{self.steps()}"
                assert at - slot > TOLERANCE, f"(f) refused as too late {at - slot} after the slot{self.steps()}"
            return
        assert known in (None, answer.run_id), f"(f) slot {slot:%H:%M:%S}: calls named {known} and {answer.run_id}{self.steps()}"
        if known is None:
            assert answer.created, f"(f) the first call of {slot:%H:%M:%S} found a run it had not fired{self.steps()}"
            assert model.enabled, f"(f) a disabled schedule's slot {slot:%H:%M:%S} was fired{self.steps()}"
            assert at - slot <= TOLERANCE, f"(f) fired {at - slot} after the slot{self.steps()}"
        else:
            assert not answer.created, f"(f) slot {slot:%H:%M:%S} was created twice{self.steps()}"
        self.external_runs[slot] = answer.run_id
        if answer.run is not None:
            assert (answer.run.scheduled_at, answer.run.trigger) == (slot, "external"), f"(f) {answer.run}{self.steps()}"

    @rule(then=then)
    def outage(self, then: float = 0.0) -> None:
        """The store goes down, or comes back."""
        self.toggle_store()
        self.advance(then)

    def toggle_store(self) -> None:
        if not self.world.down:
            self.log.append("store down")
            self.world.down = True
            if self.unrecovered_since is None:
                self.unrecovered_since = self.clock.now()
            self.recovered_after = None
            return
        self.log.append("store up")
        self.world.down = False
        # The lost slots are claimed and recorded at the next housekeeping round.
        self.recovered_after = self.clock.now() + timedelta(seconds=POLL)
        self.run(self.settle())

    @rule(count=st.integers(1, 2), then=then)
    def lose_claim_answers(self, count: int, then: float) -> None:
        """The next claims commit, and their answers are lost (the connection broke after the
        commit): the claimer does not know it owns them."""
        self.world.lose_answers = count
        self.log.append(f"the next {count} claim answer(s) lost")
        self.advance(then)

    @rule(then=then)
    def disk(self, then: float) -> None:
        """The disk fills up, or has room again (``single``: the one firer, whose stop keeps
        what it cannot write in the reserve; the other modes have no reserve)."""
        if self.mode == "single":
            if not self.world.full and self.observer is not None:
                # A process that fires nothing has no reserve: the ends of its runs that
                # a full disk refused stay running until the firer judges its pid gone,
                # which no process here does (one pid for all). It exits first.
                self.log.append("cli exits")
                self.run(self.close_observer())
            self.world.full = not self.world.full
            self.log.append("disk full" if self.world.full else "disk has room")
            if not self.world.full:
                self.room_at = self.clock.now()
            for store in self.world.stores:
                assert isinstance(store, SQLiteStore)
                store.limit_pages(0 if self.world.full else None)
            self.run(self.settle())
        self.advance(then)

    @rule(
        instance=instances,
        down_for=st.sampled_from([0.0, 0.5, 30.0, 150.0, 400.0]),
        other_mode=st.booleans(),
        mid_claim=st.sampled_from([None, None, 0.0, 0.01]),
        graceful=st.booleans(),
        retime=st.sampled_from([None, None, *RETIMED]),
    )
    def restart(
        self, instance: str, down_for: float, other_mode: bool, mid_claim: float | None = None, graceful: bool = False,
        retime: str | None = None, back: float | None = None, grace: float = 0.01,
    ) -> None:
        """A clean stop and a start after ``down_for`` seconds. With ``mid_claim`` (the stop's
        grace, in real seconds), the stop lands while the instance's claim of the slots due
        next has committed and its answer is on its way (a rolling restart's SIGTERM):
        with a grace, what it won starts within it; with none, it is recorded missed.
        Otherwise the stop has a grace of ``grace`` real seconds when ``graceful`` (10 ms: the
        handlers wait on the manual clock, so a longer one would only wait longer; a sequence
        whose claims must finish within it takes more), then (h) is checked. With
        ``retime`` (one engine only: a fleet would run both crons during the deploy), it
        starts again with that schedule's other cron (a deploy that changes it), and (i)
        is checked. With ``back`` (see :meth:`restart_stepped_back`), the clock is stepped
        back that many seconds while it is down, instead of moving on ``down_for``."""
        if self.world.down:  # an engine refuses to start without its store: it comes back first
            self.toggle_store()
        engine = self.engine(instance)
        name = engine.instance
        full = self.world.full
        if self.mode == "fleet" and other_mode:
            # A rolling change of mode: back in the other one. (Never two `single` instances:
            # that mode does not coordinate; two of them fire everything twice, by design.)
            mode: CoordinationMode = "single" if self.modes.get(name, "advisoryLock") == "advisoryLock" else "advisoryLock"
            if mode == "advisoryLock" or all(m != "single" for n, m in self.modes.items() if n != name):
                self.modes[name] = mode
        change = f" as {self.modes[name]}" if name in self.modes else ""
        disk = " (the disk full as it stops, room when it starts)" if full else ""
        how = f" (stopped mid-claim, grace {mid_claim}s)" if mid_claim is not None else f" (grace {grace}s)" if graceful else ""
        grace = grace if graceful else 0.0
        retimed: Schedule | None = None
        # (Nor after the clock was stepped back: the model dates a cron by the clock, and
        # slots recorded ahead of it were of the cron of their own time.)
        if retime is not None and self.mode != "fleet" and self.handlers.epoch == 0:
            old = self.models[retime].schedule
            cron = RETIMED[retime] if old.cron.expr == CRONS[retime] else CRONS[retime]
            retimed = dataclasses.replace(old, cron=Cron(cron, "UTC"))
            self.definitions = [retimed if s.name == retime else s for s in self.definitions]
            how += f" (deployed with {retime} at {cron!r})"
        if back is not None:
            how += f" (the clock stepped back {back}s)"
        self.log.append(f"{name}: restart after {down_for if back is None else 0}s{change}{disk}{how}")

        async def go() -> None:
            self.handlers.stopping = True
            try:
                if back is not None:
                    await self.close_observer()  # (its runs would run into the next epoch)
                if mid_claim is None or not await self.stop_mid_claim(engine, mid_claim):
                    await self.stop_checking_current_slots(engine, grace)
            finally:
                self.handlers.stopping = False
            del self.engines[name]
            if self.world.full:
                self.world.full = False  # its rows not written are in the reserve; the next store has room
                self.room_at = self.clock.now()
            await self.settle()
            assert self.checker is not None
            left = [r for r in await self.checker.running_runs() if r.instance == name]
            # (after a full disk: their last versions are in the reserve; unstarted runs of
            # claims whose answer was lost, at the stop's claim too: nothing told the stop
            # they were its own. The start below must close them all.)
            unexplained = [] if full else [r for r in left if not (r.fired_at is None and r.id in self.world.unanswered)]
            assert not unexplained, f"(c) a clean stop of {name} left runs running: {self.show({r.scheduled_at: [r] for r in unexplained})}"
            stopped_at = self.clock.now()
            # A schedule that has never run has nothing to catch up: its slots while this
            # engine was down may stay empty, unless another instance fired them.
            ledger = await self.ledger()
            never_ran = {n for n, runs in ledger.items() if not any(r.trigger != "manual" for r in runs)}
            # (Nor does an instance that waited for the other mode's instances to leave, when
            # it starts firing: as at boot, it catches up from the last recorded slot.)
            nobody_fired = not any(e.registry.fires for e in self.engines.values())
            if back is None:
                self.clock.advance(down_for)
                self.instants.append(self.clock.now())
            else:
                # Every run so far belongs to the epoch that ends here: (c) holds, so none runs.
                for runs in ledger.values():
                    for r in runs:
                        self.run_epochs.setdefault(r.id, self.handlers.epoch)
                self.handlers.epoch += 1
                self.clock.step_back(back)
                self.instants = [self.clock.now()]
            await self.settle()
            if nobody_fired and back is None:
                for n in never_ran:
                    self.models[n].excused.append((stopped_at, self.clock.now()))
            if back is None and self.handlers.epoch:
                # The start catches up from the newest slot recorded before now, by whichever
                # clock: one recorded before the clock stepped back, inside this downtime,
                # hides the slots of the downtime before it (the ledger cannot tell where
                # this clock's runs left off; see the README). Nor those before the stop whose
                # rows the full disk lost with it: the downtime begins, for the ledger, where
                # this clock's rows end.
                for n, runs in ledger.items():
                    ours = [r.scheduled_at for r in runs if self.epoch_of(r) == self.handlers.epoch
                            and r.trigger != "manual" and r.scheduled_at <= stopped_at]  # fmt: skip
                    since = min(stopped_at, max(ours, default=stopped_at))
                    earlier = [r.scheduled_at for r in runs if self.epoch_of(r) < self.handlers.epoch
                               and r.trigger != "manual" and since < r.scheduled_at <= self.clock.now()]  # fmt: skip
                    if earlier:
                        self.models[n].excused.append((since, max(earlier)))
            if retimed is not None:
                # The catch-up starts from the deploy: the slots the old cron still owed at
                # the stop (a catch-up held them) and either cron's while none ran are not
                # caught up.
                model = self.models[retimed.name]
                model.retime(self.clock.now(), retimed)
                last = max((r.scheduled_at for r in ledger[retimed.name] if r.trigger != "manual"), default=stopped_at)
                model.excused.append((min(last, stopped_at), self.clock.now()))
            self.engines[name] = again = self.new_engine(name)
            await again.start()
            await self.settle()
            await again.flush()
            still = {r.id for r in await self.checker.running_runs()} & {r.id for r in left}
            assert not still, f"(c) runs left running by {name}'s stop, not closed by its start: {sorted(still)}{self.steps()}"

        self.run(go())

    @precondition(lambda self: self.mode != "fleet" and not self.world.full and not any(m.crons for m in self.models.values()))
    @rule(back=st.sampled_from([0.5, 20.0, 150.0, 900.0, 3600.0]), graceful=st.booleans())
    def restart_stepped_back(self, back: float, graceful: bool) -> None:
        """A clean stop, and a start after the clock was stepped back ``back`` seconds (NTP
        correcting a clock that ran fast, a VM restored from a snapshot): the engine meets
        slots it recorded again. One engine only (a fleet's other instance would see its
        clock step back as it runs), never on a full disk (rows the reserve writes later
        carry the old epoch's times) nor after a deploy changed a cron (the model dates it
        on the clock). Times compare only within an epoch (see :class:`Handlers`)."""
        self.restart("a", 0.0, other_mode=False, graceful=graceful, back=back)

    async def stop_checking_current_slots(self, engine: Engine, grace: float) -> None:
        """Stop ``engine`` with ``grace``; with one, check (h)."""
        if grace <= 0 or self.world.full:
            await engine.stop(grace=0)
            return
        before = {r.id for runs in (await self.ledger()).values() for r in runs}
        enabled = {name for name in CRONS if engine.is_enabled(name)}
        held = engine.claims.lease.fresh()
        at = self.clock.now()
        await engine.stop(grace=grace)
        if not held:
            return
        assert self.checker is not None
        for name in enabled:  # (what it recorded, it flushed as it stopped)
            runs = await self.checker.list_runs(name, limit=1_000_000)
            current = self.models[name].schedule.cron.latest(at)
            for run in runs:
                if run.id in before or run.instance != engine.instance or run.scheduled_at != current:
                    continue
                dropped = run.status == "missed" and "stopped before it could fire it" in (run.error_message or "")
                assert not dropped, f"(h) a stop with a grace recorded {name}'s current slot missed: {run}{self.steps()}"

    async def stop_mid_claim(self, engine: Engine, grace: float) -> bool:
        """Move the clock to the next slot of the six-field schedule, hold the answer of
        ``engine``'s timer's claim of the slots due there, and stop it meanwhile; then check
        (g). False (and nothing stopped) when it made no such claim (``single``, waiting for
        the other mode's fleet, the store down, its schedules disabled, found behind)."""
        world = self.world
        world.claim_held, world.let_go, world.held = asyncio.Event(), asyncio.Event(), None
        self.clock.set(Cron(CRONS["sec"], "UTC").next(self.clock.now()))
        self.instants.append(self.clock.now())
        world.hold_claim = (engine.instance, self.clock.now())
        settling = asyncio.ensure_future(self.settle())
        held = asyncio.ensure_future(world.claim_held.wait())
        await asyncio.wait({settling, held}, return_when=asyncio.FIRST_COMPLETED)
        world.hold_claim = None
        if not held.done():
            held.cancel()
            await settling
            self.log.append(f"  ({engine.instance} claimed nothing at {self.clock.now():%H:%M:%S})")
            if currently_in_test_context():
                event("a stop mid-claim that found no claim")
            return False
        settling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await settling
        stopping = asyncio.ensure_future(engine.stop(grace=grace))
        while not stopping.done() and not any(task.cancelling() for task in engine.loops.tasks):
            await asyncio.sleep(0)  # until the stop has asked its loops to stop
        world.let_go.set()
        await stopping
        assert world.held is not None
        claims, result = world.held
        won = [claim for claim in claims if claim.key in result.won]
        self.log.append(f"  ({engine.instance}'s claim won {len(won)} of {len(claims)} slot(s))")
        if currently_in_test_context():
            event(f"a stop mid-claim (grace {grace}s) that won {'some' if won else 'nothing'}")
        assert self.checker is not None
        for claim in won:
            run = await self.checker.get_run(claim.run_id)
            # (g) what a claim cut short by a graceful stop won starts (or its overlap policy
            # records it); with no grace it is recorded missed
            cut = run is not None and run.status == "missed" and "stopped while this slot was being claimed" in (run.error_message or "")
            assert run is not None and run.status != "running", f"(g) {claim.key}: {run}{self.steps()}"
            assert cut == (grace == 0), f"(g) {claim.key} after a stop with grace {grace}: {run}{self.steps()}"
        return True

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def ledger_holds(self) -> None:
        if not self.engines:  # before set-up
            return
        if self.unrecovered_since is not None and not self.world.down and self.recovered_after is not None:
            if self.clock.now() >= self.recovered_after:
                self.unrecovered_since = None
        ledger = self.run(self.ledger())
        now = self.clock.now()
        for name, runs in ledger.items():
            model = self.models[name]
            timed = [r for r in runs if r.trigger != "manual"]
            if currently_in_test_context():
                for what in {f"{self.mode}: {r.status}/{r.trigger} {r.error_tag or ''}" for r in runs}:
                    event(what)  # what the examples reached (--hypothesis-show-statistics)
            # (a) at most one self/external run per slot
            per_slot: dict[datetime, list[Run]] = defaultdict(list)
            for r in timed:
                per_slot[r.scheduled_at].append(r)
            twice = {slot: rs for slot, rs in per_slot.items() if len(rs) > 1}
            assert not twice, f"(a) {name}: slots recorded more than once: {self.show(twice)}"
            if model.external:
                # (f) the runs the platform's calls named are the ledger's, one per slot, and
                # no slot no call fired has one
                named = {r.scheduled_at: r.id for r in timed}
                calls = self.external_runs
                if self.world.full:  # (rows not written yet wait in the writer)
                    calls = {slot: run for slot, run in calls.items() if slot in named}
                assert named == calls, f"(f) {name}: the ledger has {named}, the calls named {calls}{self.steps()}"
            # (i) every timed slot is one of the cron of its time: none of a cron from before
            # it took effect (a deploy's catch-up judging earlier slots by it)
            foreign = [r for r in timed if model.cron_at(r.scheduled_at).latest(r.scheduled_at) != r.scheduled_at]
            assert not foreign, f"(i) {name}: slots of another cron than their time's: {self.show({r.scheduled_at: [r] for r in foreign})}"
            # (b) no slot of an enabled (self-triggered) schedule left without a row
            expected = [] if model.external else model.due_slots(now)
            held = self.held(runs, now)
            expected = [s for s in expected if not held(s)]
            if self.world.full:
                expected = []  # their rows wait in the writer
            if self.unrecovered_since is not None:
                # While the store is down, and until the housekeeping round after it is back,
                # slots may wait unclaimed in memory: also slots due before the outage that a
                # catch-up reached only during it.
                if self.world.down or self.recovered_after is None or now < self.recovered_after:
                    expected = []
            missing = [s for s in expected if s not in per_slot]
            assert not missing, f"(b) {name}: due slots with no row: {[f'{s:%H:%M:%S}' for s in missing]}{self.steps()}"
            # (d) skip and queue never run two of a schedule at once: the runs' [fired_at,
            # finished_at) intervals do not intersect (one still running: up to now).
            # Within each epoch (runs of an earlier one all ended before the clock stepped back).
            if model.schedule.on_overlap in ("skip", "queue"):
                for epoch in range(self.handlers.epoch + 1):
                    spans = sorted(
                        ((r.fired_at, r.finished_at or datetime.max.replace(tzinfo=now.tzinfo), r) for r in timed
                         if r.fired_at is not None and r.status in ("succeeded", "failed", "running")
                         and self.epoch_of(r) == epoch),
                        key=lambda span: (span[0], span[1], span[2].id),
                    )  # fmt: skip
                    latest: tuple[datetime, Run] | None = None  # the span that ends last so far
                    for start, end, r in spans:
                        if start == end:
                            continue  # zero length: nothing can run beside it
                        if latest is not None:
                            assert start >= latest[0], f"(d) {name}: ran at once: {self.show({r.scheduled_at: [latest[1], r]})}"
                        if latest is None or end > latest[0]:
                            latest = (end, r)
                    # (d') nor did one start while a Run now of it ran: a Run now starts whatever
                    # is in flight, but counts in flight for what comes after it, on every
                    # instance (at the same instant either may go first).
                    manual = [(r.fired_at, r.finished_at or datetime.max.replace(tzinfo=now.tzinfo), r) for r in runs
                              if r.trigger == "manual" and r.fired_at is not None and self.epoch_of(r) == epoch]  # fmt: skip
                    beside = [(m, r) for start, _, r in spans for m_start, m_end, m in manual if m_start < start < m_end]
                    assert not beside, f"(d') {name}: started while a Run now ran: {self.show({r.scheduled_at: [m, r] for m, r in beside})}"
                    # ... nor did their handlers really run at once (a run recorded timeout or
                    # abandoned, whose handler ran on, keeps its place until it has returned)
                    ran = sorted((start, end or now) for start, end in self.handlers.spans[(name, epoch)] if start is not None)
                    for (_, end), (start, _) in zip(ran, ran[1:], strict=False):
                        assert end <= start, f"(d) {name}: two handlers ran at once, from {start:%H:%M:%S}{self.steps()}"

        # (e) a timed slot's handler starts once, and a slot whose handler started is not
        # recorded as one that did not run
        started_twice = [key for key, count in self.handlers.started.items() if count > 1]
        assert not started_twice, f"(e) handlers started twice for {[f'{n} {s:%H:%M:%S}' for n, s in started_twice]}{self.steps()}"
        for name, runs in ledger.items():
            false = [r for r in runs if r.status in ("missed", "skipped") and r.trigger != "manual"
                     and self.handlers.started.get((name, r.scheduled_at))]  # fmt: skip
            assert not false, f"(e) {name}: recorded as not run, but its handler started: {self.show({r.scheduled_at: [r] for r in false})}"
            # (j) a run is closed abandoned only once its handler has stopped: no instance here
            # dies, so none takes a live one's runs (one of a shorter window did)
            alive = [r for r in runs if r.error_tag == "abandoned" and r.id in self.handlers.ran
                     and (self.handlers.ran[r.id][1] or now) > (r.finished_at or now)]  # fmt: skip
            assert not alive, f"(j) {name}: closed abandoned while its handler ran: {self.show({r.scheduled_at: [r] for r in alive})}"

    def epoch_of(self, run: Run) -> int:
        return self.run_epochs.get(run.id, self.handlers.epoch)

    def held(self, runs: list[Run], now: datetime) -> Callable[[datetime], bool]:
        """Which slots of a schedule may wait in memory, rowless, because runs of it are in
        flight: the slots after the oldest slot still running (a catch-up firing in order),
        and those the engines first saw since the stretch of runs back to back, any trigger,
        that is still going on began (queued behind them).

        A slot is seen when the clock first reaches it, not at its cron time: a jump over
        two slots shows both at the instant the first one's run starts the stretch, and the
        second is queued behind it; once that run ends, a Run now started meanwhile keeps
        the stretch going, and the second slot still waits (a slot that is due while any run
        of the schedule is in flight waits under ``queue``). A run recorded ``timeout`` whose
        handler runs on is in flight until it returns. Only the current epoch's runs count:
        the earlier ones' had all ended when the clock stepped back."""
        never, ran = now.max.replace(tzinfo=now.tzinfo), self.handlers.ran
        runs = [r for r in runs if self.epoch_of(r) == self.handlers.epoch]

        def ended(r: Run) -> datetime:
            span = ran.get(r.id)
            end = max(r.finished_at or never, span[1] or never) if span is not None else r.finished_at or never
            if r.instance == OBSERVER and end != never:
                # Another process's run: the firing instance reads it ended at its next
                # housekeeping round, which a full disk put off until it had room again.
                end = max(end, self.room_at or end) + timedelta(seconds=POLL)
            return end

        running = [
            r.scheduled_at for r in runs
            if r.status == "running" or (r.id in ran and ran[r.id][1] is None) or (r.instance == OBSERVER and ended(r) > now)
        ]  # fmt: skip
        if not running:
            return lambda slot: False
        oldest = min(running)
        spans = sorted((r.fired_at, ended(r)) for r in runs if r.fired_at)
        since, until = None, None
        for start, end in spans:
            if until is None or start > until:
                since, until = start, end  # a new stretch
            else:
                until = max(until, end)
        if since is None or until is None or until <= now:
            return lambda slot: slot > oldest or slot >= now
        ongoing = since
        return lambda slot: slot > oldest or self.seen(slot) >= ongoing

    def seen(self, slot: datetime) -> datetime:
        """When the engines first saw ``slot`` due: the first time the clock was set to at
        or after it."""
        index = bisect.bisect_left(self.instants, slot)
        return self.instants[index] if index < len(self.instants) else self.clock.now()

    def steps(self) -> str:
        return "\n steps:\n   " + "\n   ".join(self.log)

    def show(self, runs: Mapping[datetime, Sequence[Run]]) -> str:
        return "; ".join(
            f"{slot:%H:%M:%S}: "
            + ", ".join(
                f"[{r.scheduled_at:%H:%M:%S} {r.status}/{r.trigger}/{r.instance} fired {r.fired_at and f'{r.fired_at:%H:%M:%S}'} "
                f"finished {r.finished_at and f'{r.finished_at:%H:%M:%S}'} {r.error_tag or ''} {r.error_message or ''}]"
                for r in rs
            )
            for slot, rs in runs.items()
        ) + self.steps()


def test_a_slot_seen_late_and_queued_behind_a_run_now_is_held_not_missing() -> None:
    """A sequence the machine once failed on: the clock jumps from 08:00 to 08:02:30, so the
    ``queue`` schedule's 08:01 fires late and 08:02, seen at the same instant, is queued
    behind it; a Run now at 08:03:30 is in flight when 08:01's run ends (08:05:50), so 08:02
    waits for it too. The model dated 08:02 by its cron time, before the stretch of runs that
    began at 08:02:30, and called it a slot without a row."""
    machine = EngineMachine()
    try:
        quick = ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="single", policies=[quick, ("queue", "all", Behaviour("sleep", 200.0), 600.0), quick])
        machine.ledger_holds()
        machine.advance(150)
        machine.ledger_holds()
        machine.advance(60)
        machine.ledger_holds()
        machine.run_now("a", "min", then=150.0)
        machine.ledger_holds()
        slots = {r.scheduled_at.strftime("%H:%M:%S") for r in machine.run(machine.ledger())["min"]}
        assert slots == {"08:01:00", "08:03:30"}  # 08:02 waits behind the Run now (the case above)
        machine.advance(60)
        machine.ledger_holds()
        slots = {r.scheduled_at.strftime("%H:%M:%S") for r in machine.run(machine.ledger())["min"]}
        assert slots == {"08:01:00", "08:02:00", "08:03:30"}
    finally:
        machine.teardown()


def test_a_stop_whose_claim_of_lost_slots_lost_its_answer_sends_it_again() -> None:
    """A sequence the machine failed on: a slot is lost in an outage; the store is back, and
    the engine stops before its next round, so the stop claims the lost slot, and that
    claim commits with its answer lost. The stop left its placeholder ``running``; it now
    sends the claim once more (the same run id: won again) and records the slot missed."""
    machine = EngineMachine()
    try:
        quick = ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="advisoryLock", policies=[quick, quick, quick])
        machine.outage(then=30.0)  # 08:00:20 of "sec" is lost
        machine.lose_claim_answers(1, then=0.0)
        machine.outage(then=0.0)  # back
        machine.restart("a", 0.0, False)  # (c): nothing left running by the stop
        runs = machine.run(machine.ledger())["sec"]
        assert [(r.scheduled_at.strftime("%H:%M:%S"), r.status) for r in runs if r.trigger != "manual"][-1:] == [
            ("08:00:20", "missed")
        ]
        machine.ledger_holds()
    finally:
        machine.teardown()


def test_a_graceful_stop_after_an_outage_and_lost_answers_starts_the_current_slots() -> None:
    """A sequence the machine failed on, checking (h): the store is down a minute (its slots
    lost), comes back, and the engine stops with a grace before its next round. The stop
    recorded every lost slot missed, the current ones too; then, once it claimed them again
    first, the two claim answers lost left them lost, so it recorded them missed all the
    same. It now starts the current ones within the grace (a second round, if need be)."""
    machine = EngineMachine()
    try:
        quick = ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="advisoryLock", policies=[quick, quick, quick])
        machine.lose_claim_answers(2, then=3.0)
        machine.outage(then=61.0)  # 08:00:03-08:01:04: 08:00:20, 08:00:40 and 08:01:00 lost
        machine.outage(then=0.0)  # back
        # (A grace of real seconds: the claims must answer within it, and on a loaded machine
        # two rounds of them took longer than the machine's 10 ms. The runs end at once.)
        machine.restart("a", 0.0, False, graceful=True, grace=30.0)  # (h)
        ledger = machine.run(machine.ledger())
        assert {name: sorted((r.scheduled_at.strftime("%H:%M:%S"), r.status) for r in ledger[name]) for name in CRONS} == {
            "sec": [("08:00:20", "missed"), ("08:00:40", "missed"), ("08:01:00", "succeeded")],
            "min": [("08:01:00", "succeeded")],
            "two": [],
        }
        machine.ledger_holds()
    finally:
        machine.teardown()


def _stepped_back() -> EngineMachine:
    """One engine of three quick schedules, run to 08:02:30 (sec's slots recorded to 08:02:20,
    all but the newest missed), then restarted with its clock 900 s back: 07:47:30."""
    machine = EngineMachine()
    quick = ("skip", "skip", Behaviour("noop"), 30.0)
    machine.set_up(mode="single", policies=[quick, quick, quick])
    machine.advance(150)
    machine.restart_stepped_back(back=900.0, graceful=True)
    return machine


def test_a_jump_over_slots_recorded_before_the_clock_stepped_back_records_none_again() -> None:
    """(a) on a sequence the machine found once it stepped the clock back: slots 08:00:20 to
    08:02:20 are recorded (missed, and the newest run); the engine restarts with the clock
    900 s back, and later jumps over them again (a stalled process). The timers passed over
    the recorded ones, but forgot them as they did: the catch-up re-armed from the last slot
    left, found them behind again, and recorded them missed a second time (and ran 08:01:20,
    recorded missed before). It also fired 08:00:00 as if current, 90 s late, though the
    current slot had run already; with backfill=skip it is now recorded missed."""
    machine = _stepped_back()
    try:
        for seconds in (370, 150, 320):  # 08:01:30
            machine.advance(seconds)
            machine.ledger_holds()
        first = machine.models["sec"].enabled_since[0]
        runs = [r for r in machine.run(machine.ledger())["sec"] if r.scheduled_at >= first]
        missed = [f"08:0{m}:{s:02}" for m, s in ((2, 0), (1, 40), (1, 20), (1, 0), (0, 40), (0, 20), (0, 0))]
        assert [(r.scheduled_at.strftime("%H:%M:%S"), r.status) for r in runs] == [
            ("08:02:20", "succeeded"), *((slot, "missed") for slot in missed)
        ]  # fmt: skip
    finally:
        machine.teardown()


def test_slots_recorded_ahead_of_a_schedule_disabled_at_the_start_are_passed_over_once_enabled() -> None:
    """(a) on a sequence the machine found: slots to 08:02:20 recorded, the clock stepped
    back 900 s, the schedule disabled, the engine restarted. Only the schedules enabled at
    the start had their slots recorded ahead passed over: once enabled again, this one's
    catch-up recorded 08:01 to 08:02:20 missed a second time."""
    machine = _stepped_back()
    try:
        machine.switch("a", "sec", False, None)
        machine.restart("a", 400.0, False)  # 07:54:10, sec disabled at the start
        machine.advance(400)  # 08:00:50
        machine.switch("a", "sec", True, None)
        machine.advance(150)  # 08:03:20: 08:01:00 to 08:03:20 found behind
        machine.ledger_holds()
    finally:
        machine.teardown()


def test_a_deploy_that_changes_a_cron_catches_up_none_of_its_slots_from_before() -> None:
    """(i) on a sequence: "min" fires 08:01; the engine stops and comes back at 08:03:31
    deployed with "min" at second 30 of every minute. Its 08:01:30, 08:02:30 and 08:03:30
    lay before that cron ran anywhere: the catch-up (backfill="all") fired them all."""
    machine = EngineMachine()
    try:
        quick = ("skip", "all", Behaviour("noop"), 30.0)
        machine.set_up(mode="single", policies=[quick, quick, quick])
        machine.advance(61)
        machine.restart("a", 150.0, False, retime="min")
        machine.ledger_holds()
        machine.advance(60)
        machine.ledger_holds()
        runs = machine.run(machine.ledger())["min"]
        assert sorted(r.scheduled_at.strftime("%H:%M:%S") for r in runs) == ["08:01:00", "08:04:30"]
    finally:
        machine.teardown()


def test_a_handler_past_its_max_runtime_keeps_its_place_on_the_other_instance() -> None:
    """A sequence the machine fails on without the fix, checking (d): in a fleet, a's run of
    ``sec`` times out at 30 s but its handler ignores the cancellation and runs on for 200 s;
    b claims the next slots first. b started them beside it: the row said ``timeout``."""
    machine = EngineMachine()
    try:
        overrun, quick = ("skip", "skip", Behaviour("overrun", 200.0), 30.0), ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="fleet", policies=[overrun, quick, quick], order=1)
        for _ in range(12):
            machine.advance_seconds(20)
            machine.ledger_holds()
        runs = machine.run(machine.ledger())["sec"]
        assert {(r.instance, r.status) for r in runs if r.error_message and "(on another instance)" in r.error_message} == {
            ("b", "skipped")
        }
    finally:
        machine.teardown()


def test_an_instance_of_a_shorter_window_takes_no_run_of_a_live_one() -> None:
    """A sequence the machine fails on without the fix, checking (j): b runs with a take-over
    window of 300 s, a with 3600 s; the clock jumps 350 s and b's sweep comes first. b judged
    a by its own 300 s and closed a's run abandoned while its handler ran."""
    machine = EngineMachine()
    try:
        long, quick = ("skip", "skip", Behaviour("overrun", 200.0), 30.0), ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="fleet", policies=[long, quick, quick], window=300.0, order=1)
        for _ in range(6):
            machine.advance_minutes(350)
            machine.ledger_holds()
        runs = [r for runs in machine.run(machine.ledger()).values() for r in runs]
        assert not [r for r in runs if r.error_tag == "abandoned"]
    finally:
        machine.teardown()


def test_a_lost_slot_that_takes_its_turn_waits_for_the_run_its_own_timer_started_meanwhile() -> None:
    """(d) on a sequence the machine found once lost slots took their turn as they start
    (in a fleet; here one instance claiming, so that it wins them): 08:02 and 08:03 of
    ``min`` are lost in an outage while 08:01's handler runs past its deadline; the engine
    wins them back and waits for that handler, which returns at 08:04:21, when its timer
    fires 08:04. The lost 08:03 (fired late, as the current slot was) took its turn
    meanwhile, then started without looking again: 08:03 and 08:04 ran at once. Now 08:03
    waits for 08:04."""
    machine = EngineMachine()
    try:
        quick, overrun = ("skip", "skip", Behaviour("noop"), 30.0), ("skip", "skip", Behaviour("overrun", 200.0), 30.0)
        machine.set_up(mode="advisoryLock", policies=[quick, overrun, quick])
        machine.set_enabled("a", "sec", False, None, then=61.0)
        machine.outage(then=150.0)  # 08:01:01 to 08:03:31
        machine.outage(then=20.0)
        machine.advance_seconds(30)  # 08:04:21
        machine.ledger_holds()
        runs = {r.scheduled_at.strftime("%H:%M"): r for r in machine.run(machine.ledger())["min"]}
        assert (runs["08:04"].status, runs["08:04"].fired_at is not None) == ("running", True)
        assert (runs["08:03"].status, runs["08:03"].fired_at) == ("running", None)  # waiting for it
    finally:
        machine.teardown()


def test_a_catch_ups_later_slot_takes_its_turn_again_after_a_run_now_started_elsewhere() -> None:
    """A sequence the machine fails on without the fix, checking (d'): the clock jumps 61 s
    and b catches up ``sec``'s three slots (``backfill="all"``, 90 s runs) one after
    another (or a does); its claim took the newest's turn. 30 s later the other's Run now
    starts (beside it, as a Run now does). When the first catch-up run ended, the newest started on the
    turn its claim had taken a minute and a half before: beside the Run now."""
    machine = EngineMachine()
    try:
        long, quick = ("skip", "all", Behaviour("sleep", 90.0), 600.0), ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="fleet", policies=[long, quick, quick])
        machine.advance(61)
        machine.ledger_holds()
        catching = {r.instance for r in machine.run(machine.ledger())["sec"]}
        assert len(catching) == 1, catching
        machine.advance(30)
        machine.run_now("b" if catching == {"a"} else "a", "sec", 0.0)
        machine.ledger_holds()
        machine.advance(62)
        machine.ledger_holds()
        runs = {r.scheduled_at.strftime("%H:%M:%S"): r for r in machine.run(machine.ledger())["sec"]}
        assert (runs["08:01:00"].status, runs["08:01:00"].fired_at) == ("skipped", None)
    finally:
        machine.teardown()


def test_a_queued_slot_takes_its_turn_again_after_a_run_now_started_elsewhere() -> None:
    """The same on a ``queue`` schedule: a fires ``sec`` at 08:00:20 (30 s runs) and claims
    08:00:40, taking its turn, which waits in its queue. At 08:00:45 b's Run now starts.
    When a's run ended at 08:00:50, the queued slot started on its claim's turn, beside it;
    it now waits for the Run now."""
    machine = EngineMachine()
    try:
        queued, quick = ("queue", "skip", Behaviour("sleep", 30.0), 600.0), ("skip", "skip", Behaviour("noop"), 30.0)
        machine.set_up(mode="fleet", policies=[queued, quick, quick], order=1)
        machine.advance(20)
        machine.advance(20)
        assert {r.instance for r in machine.run(machine.ledger())["sec"]} == {"a"}
        machine.advance(5)
        machine.run_now("b", "sec", 0.0)
        for _ in range(4):
            machine.advance(5)
            machine.ledger_holds()
        runs = {r.scheduled_at.strftime("%H:%M:%S"): r for r in machine.run(machine.ledger())["sec"]}
        assert (runs["08:00:40"].status, runs["08:00:40"].fired_at) == ("running", None)  # waiting for it
        machine.advance(15)
        machine.ledger_holds()
        runs = {r.scheduled_at.strftime("%H:%M:%S"): r for r in machine.run(machine.ledger())["sec"]}
        assert runs["08:00:40"].fired_at == runs["08:00:45"].finished_at
    finally:
        machine.teardown()


def test_a_slot_run_before_the_clock_stepped_back_is_not_recorded_missed_by_a_catch_up_disabled_meanwhile() -> None:
    """A sequence the machine fails on without the fix, checking (a): ``min`` (backfill
    "all", overrunning handlers) ran 08:01; the clock steps back 15 minutes, the engine
    restarts and later again; a backfill and handlers that block the loop put it behind,
    and ``min`` is paused and resumed while its catch-up holds the timer. The catch-up's
    end recorded the slots due meanwhile ``missed``, 08:01 among them, beside its run."""
    machine = EngineMachine()
    try:
        overrun = Behaviour("overrun", 45.0)
        machine.set_up(
            mode="single",
            policies=[("skip", "skip", overrun, 30.0), ("parallel", "all", overrun, 30.0), ("skip", "skip", Behaviour("noop"), 30.0)],
            order=17205,
        )
        steps: list[Callable[[], None]] = [
            lambda: machine.lose_claim_answers(count=2, then=61.0),
            lambda: machine.advance(30),
            lambda: machine.restart_stepped_back(back=900.0, graceful=False),
            lambda: machine.pause(instance="a", name="min", note=None, then=61.0),
            lambda: machine.advance(30),
            lambda: machine.run_now(instance="a", name="ext", then=150.0),
            lambda: machine.advance(235),
            lambda: machine.advance(233),
            lambda: machine.restart(down_for=0.0, graceful=False, instance="a", mid_claim=0.0, other_mode=False, retime=None),
            lambda: machine.backfill(back=6, count=2, instance="a", name="min", then=150.0),
            lambda: machine.pause(instance="a", name="min", note=None, then=0.5),
            lambda: machine.lose_claim_answers(count=1, then=150.0),
            lambda: machine.restart(down_for=0.5, graceful=True, instance="a", mid_claim=0.0, other_mode=True, retime="min"),
        ]
        for step in steps:
            step()
            machine.ledger_holds()
    finally:
        machine.teardown()


def test_a_run_now_through_an_instance_that_waits_for_the_other_mode_is_refused() -> None:
    """A sequence the machine fails on without the fix, checking (d'): a is restarted as
    ``single`` during a rolling change of mode and fires; b (``advisoryLock``) waits. b's
    Run now of ``min`` (200 s runs) ran on b, and a's next slot started beside it: under
    ``single`` nothing looks at another instance's runs. b now refuses it."""
    machine = EngineMachine()
    try:
        short, long = ("skip", "skip", Behaviour("sleep", 5.0), 30.0), ("skip", "latest", Behaviour("sleep", 200.0), 600.0)
        machine.set_up(mode="fleet", policies=[short, long, short], order=7211)
        steps: list[Callable[[], None]] = [
            lambda: machine.outage(then=0.0),
            lambda: machine.restart(down_for=0.0, graceful=True, instance="a", other_mode=True),
            *[lambda: machine.advance(30)] * 6,
            lambda: machine.restart(down_for=150.0, graceful=True, instance="b", other_mode=False),
            lambda: machine.platform_fire(calls=["a"], disabled_by=None, early=False, then=150.0, together=False),
            lambda: machine.run_now(instance="a", name="ext", then=0.0),
            lambda: machine.advance(30),
        ]
        for step in steps:
            step()
            machine.ledger_holds()
        assert (machine.engines["a"].registry.role, machine.engines["b"].registry.role) == ("firing", "waiting")
        with pytest.raises(Refused, match="fires nothing"):
            machine.run(machine.engines["b"].run_now("min"))
        machine.run_now(instance="b", name="min", then=0.0)
        machine.advance(30)
        machine.ledger_holds()
    finally:
        machine.teardown()


settings.register_profile(
    "invariants",
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("invariants-deep", settings.get_profile("invariants"), max_examples=2000)


def _profile() -> settings:
    chosen = settings.get_profile(os.environ.get("SCHEDTUI_HYPOTHESIS_PROFILE", "invariants"))
    overrides: dict[str, Any] = {}
    if "SCHEDTUI_HYPOTHESIS_EXAMPLES" in os.environ:
        overrides["max_examples"] = int(os.environ["SCHEDTUI_HYPOTHESIS_EXAMPLES"])
    if "SCHEDTUI_HYPOTHESIS_STEPS" in os.environ:
        overrides["stateful_step_count"] = int(os.environ["SCHEDTUI_HYPOTHESIS_STEPS"])
    return settings(chosen, **overrides)


EngineMachine.TestCase.settings = _profile()
TestEngineInvariants = EngineMachine.TestCase
