"""The invariants of durable executions under random sequences (Hypothesis, stateful).

Up to three instances share one store (SQLite, and PostgreSQL) on one manual clock. Hypothesis starts executions
of random plans (steps that fail a few times or until their attempts run out, at-most-once
steps, steps that take 3 to 40 s of the clock, sleeps, signal waits, a step name used a
second time, steps at once (a slow one beside one whose retries wait, beside an
at-most-once one; two branches of two steps each), code that takes a while between two steps), sends signals, cancels,
retries failed executions, moves the clock (so leases expire), crashes instances just before
or just after one of their writes commits, loses the answer of a claim or a write that
committed while the instance goes on, freezes an instance (its store calls hang, as
a SIGSTOPped process's would; or only the answers of its claims, which commit: runs it
claimed come back after their lease may have run out) and thaws it later, holds up only the
answers of an instance's claims while the clock moves past the leases they took and another
instance claims and runs those executions (a slow store: its other calls go through), and
restarts crashed ones, replaces a frozen instance under its own name by a process on
another host (the old one thaws later, its heartbeats refused), and steps an instance's wall
clock back or ahead (NTP, a VM restored from a snapshot) and puts it right again: each
instance compares its clock with its lease's, which never steps, and with the store's,
which is the manual clock. After every rule:

* a finished step never runs again: no step starts after its success was committed;
* an at-most-once step runs at most once;
* a stale lease never writes: every write the store accepts carries the newest lease;
* nor runs: no step starts under a lease older than one claimed since (its owner was
  displaced, and must have stopped first), nor while a step of its execution runs under
  another lease (unless that one's owner was frozen meanwhile, as a SIGSTOPped process
  resumes where it was, or every process stood still longer than a renewal's period: then
  the owner's lapse and the take-over race, and fencing refuses the stale writes);
* a cancel heard stops the code at its next step: no step starts under a lease whose
  owner was answered (by a write or a renewal) that an operator asked to cancel (an
  at-most-once step did, when the answer was its own started mark's);
* step outputs replay identically: at each position, every run of an execution's code
  saw the same value;
* (at the end) the line the code logs before a step is in the log exactly once when that
  step is recorded; so is the line a slow step's function logs inside it, once an attempt
  (steps at once: a sibling's checkpoint never carries it);
* every execution ends, or waits with a reason (what for, until when).

At the end every execution must have finished, once the instances are thawed and the
clock has moved on far enough; then every failed one is retried and must end again, with
the same invariants.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from backend import Engine, ManualClock, Refused, Unavailable
from backend.clock import OffsetClock
from backend.durable import DurableContext, Retry, define_durable
from backend.durable.model import TAG_AT_MOST_ONCE_INTERRUPTED, Execution
from backend.durable.store import Claimed, NewExecution, Write
from backend.ids import IdFactory
from backend.runtime.skew import ClockCheck
from backend.scheduler import names
from backend.scheduler.registry import host_identity
from backend.store import open_store
from tests import pg
from tests.bounded import run_within
from tests.durable_helpers import crash
from tests.servers import dead_pid

T = TypeVar("T")
NAMES = ("a", "b", "c")
DEAD_PID = dead_pid()
EXAMPLES = int(os.environ.get("SCHEDTUI_DURABLE_EXAMPLES", "30"))

Plan = list[tuple[str, int]]
PLANS = st.lists(
    st.one_of(
        # Fails this many times first: from 4 on, its 4 attempts run out and the execution
        # fails (a retry gives it 4 more).
        st.tuples(st.just("step"), st.integers(0, 5)),
        st.tuples(st.just("again"), st.integers(0, 5)),  # an earlier step's name: nondeterministic
        st.tuples(st.just("amo"), st.just(0)),
        st.tuples(st.just("sleep"), st.integers(0, 20)),
        st.tuples(st.just("wait"), st.integers(1, 40)),  # timeout
        st.tuples(st.just("slow"), st.sampled_from([3, 12, 40])),  # a step that takes this long
        # A slow step and another at once (asyncio.gather).
        st.tuples(st.just("gather"), st.sampled_from([3, 40])),
        # Three at once: a slow step, one that fails this many times first (its retry's wait
        # waits for the others to end) and an at-most-once one.
        st.tuples(st.just("fan"), st.integers(0, 5)),
        # Two branches of two steps, gathered (the second of one fails this many times
        # first): the positions the second steps take depend on which first step ended
        # first, so replays find them by name.
        st.tuples(st.just("branches"), st.integers(0, 5)),
        # A step that fails this many times first and a slow one, gathered in that order:
        # the first fails at once, and its retry's wait is written as the second is reached.
        st.tuples(st.just("lead"), st.integers(0, 5)),
        # Code between two steps that takes this long (no step: nothing is checkpointed):
        # an operator's cancel meanwhile is heard at the next write, perhaps an at-most-once
        # step's started mark.
        st.tuples(st.just("pause"), st.sampled_from([3, 12])),
    ),
    min_size=1,
    max_size=6,
)


class World:
    """What happened, in one order: step starts, committed checkpoints, the leases claimed."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.started: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.committed: dict[tuple[str, str], int] = {}
        self.amo: set[tuple[str, str]] = set()
        self.slow: set[tuple[str, str]] = set()
        """(execution, step) whose function is :func:`slow`, which logs a line inside it."""
        self.lease: dict[str, int] = {}
        self.committed_lease: dict[str, int] = {}
        """The newest lease of each execution whose claim the store has answered (as soon as
        it has: before an answer the machine holds up reaches its instance)."""
        self.violations: list[str] = []
        self.seen: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.clock: ManualClock | None = None
        """The machine's clock, which slow steps sleep on."""
        self.owner: dict[tuple[str, int], Proxy] = {}
        """Whose claim each lease of each execution was (its instance's store)."""
        self.running: dict[str, dict[int, tuple[int, int, int]]] = defaultdict(dict)
        """Per execution, its steps in flight: (lease, its owner's freezes then, stalls then)."""
        self.stalls = 0
        """Clock moves longer than a renewal's period, at once: every process stood still
        that long (a host suspended), and a step in flight races its owner's lapse."""
        self.token = itertools.count()
        self.pausing: set[tuple[str, int]] = set()
        """(execution, lease) whose code is between two steps, waiting on the clock."""
        self.heard_cancel: set[tuple[str, int]] = set()
        """(execution, lease) whose owner was answered that an operator asked to cancel (a
        write's answer, a renewal's): no step starts under that lease after it."""
        self.trace: deque[str] = deque(maxlen=120)
        """The last rules, claims, step starts and ends and the engines' warnings: a
        violation shows them (a race seen once may not replay)."""


def note(text: str) -> None:
    at = "" if WORLD.clock is None else WORLD.clock.now().strftime("%H:%M:%S")
    WORLD.trace.append(f"{at} {text}")


def violation(text: str) -> None:
    if not WORLD.violations:  # the first one tells what led to it
        text += "\nwhat led to it:\n  " + "\n  ".join(WORLD.trace)
    WORLD.violations.append(text)


class Traced(logging.Handler):
    """The engines' warnings, into the trace."""

    def emit(self, record: logging.LogRecord) -> None:
        note(f"[{record.name}] {record.getMessage()}")


F = TypeVar("F", bound=Callable[..., None])


def traced(rule_: F) -> F:
    @functools.wraps(rule_)
    def call(self: Any, **kwargs: Any) -> None:
        note(f"rule {rule_.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        rule_(self, **kwargs)

    return call  # type: ignore[return-value]


WORLD = World()


def begin(execution: str, step: str, lease: int) -> int:
    """A step starts under ``lease``: checked against the leases claimed since, and against
    the steps of the execution in flight under another lease."""
    newest = WORLD.lease.get(execution, 0)
    if lease < newest:  # its owner was displaced: it must have stopped before this
        violation(f"step {step} of {execution} started under lease {lease}; lease {newest} was claimed")
    for other, freezes, stalls in WORLD.running[execution].values():
        owner = WORLD.owner.get((execution, other))
        # Excused: an owner frozen meanwhile (a SIGSTOPped process resumes its step where
        # it was: fencing refuses what it writes after), or a stall of every process.
        excused = owner is None or owner.freezes > freezes or owner.frozen is not None or WORLD.stalls > stalls
        if other != lease and not excused:
            violation(f"step {step} of {execution} started under lease {lease} while one ran under lease {other}")
    if (execution, lease) in WORLD.heard_cancel:
        violation(f"step {step} of {execution} started under lease {lease} after its owner heard of a cancel")
    token = next(WORLD.token)
    mine = WORLD.owner.get((execution, lease))
    note(f"{'?' if mine is None else mine.name} starts {step} of {execution} under lease {lease} (#{token})")
    WORLD.running[execution][token] = (lease, mine.freezes if mine is not None else 0, WORLD.stalls)
    WORLD.started[(execution, step)].append(next(WORLD.seq))
    return token


async def page(execution: str, step: str, fails: int, lease: int) -> str:
    key = (execution, step)
    del WORLD.running[execution][begin(execution, step, lease)]  # (done at once)
    if len(WORLD.started[key]) <= fails:
        raise ConnectionError(f"failure {len(WORLD.started[key])} of {fails}")
    return f"{step}#{next(WORLD.seq)}"  # a new value on every call: a re-run would show


async def slow(execution: str, step: str, seconds: int, lease: int, log: Callable[[str], None]) -> str:
    """A step that takes ``seconds`` of the clock: its owner holds the execution meanwhile.
    It logs ``inside STEP`` as it starts (see lines_inside_recorded_steps_are_written_once)."""
    token = begin(execution, step, lease)
    log(f"inside {step}")
    try:
        assert WORLD.clock is not None
        await WORLD.clock.sleep_until(WORLD.clock.now() + timedelta(seconds=seconds))
    finally:
        del WORLD.running[execution][token]
        note(f"{step} of {execution} under lease {lease} returns (#{token})")
    return f"{step}#{next(WORLD.seq)}"


async def plan_body(ctx: DurableContext, plan: Plan) -> list[Any]:
    seen = []
    steps: list[str] = []  # the names of the steps so far
    for position, (kind, arg) in enumerate(plan):
        name = f"p{position}"
        value: Any = None
        ctx.log(f"before {name}")  # (see lines_before_recorded_steps_are_written_once)
        if kind in ("step", "amo"):
            steps.append(name)
        if kind == "step":
            value = await ctx.step(name, page, ctx.id, name, arg, ctx.fence, retry=Retry(attempts=4, initial_delay=5, max_delay=5))
        elif kind == "again":  # steps a, b, a: the second "a" fails the execution
            name = steps[arg % len(steps)] if steps else name
            value = await ctx.step(name, page, ctx.id, name, 0, ctx.fence)
        elif kind == "amo":
            WORLD.amo.add((ctx.id, name))
            value = await ctx.step(name, page, ctx.id, name, 0, ctx.fence, at_most_once=True)
        elif kind == "slow":
            steps.append(name)
            WORLD.slow.add((ctx.id, name))
            value = await ctx.step(name, slow, ctx.id, name, arg, ctx.fence, ctx.log)
        elif kind == "gather":
            steps.extend([f"{name}s", f"{name}t"])
            WORLD.slow.add((ctx.id, f"{name}s"))
            value = await asyncio.gather(
                ctx.step(f"{name}s", slow, ctx.id, f"{name}s", arg, ctx.fence, ctx.log),
                ctx.step(f"{name}t", page, ctx.id, f"{name}t", 0, ctx.fence),
            )
        elif kind == "fan":
            steps.extend([f"{name}s", f"{name}f", f"{name}m"])
            WORLD.amo.add((ctx.id, f"{name}m"))
            WORLD.slow.add((ctx.id, f"{name}s"))
            value = await asyncio.gather(
                ctx.step(f"{name}s", slow, ctx.id, f"{name}s", 12, ctx.fence, ctx.log),
                ctx.step(f"{name}f", page, ctx.id, f"{name}f", arg, ctx.fence, retry=Retry(attempts=4, initial_delay=5, max_delay=5)),
                ctx.step(f"{name}m", page, ctx.id, f"{name}m", 0, ctx.fence, at_most_once=True),
            )
        elif kind == "branches":
            steps.extend([f"{name}a0", f"{name}a1", f"{name}b0", f"{name}b1"])

            async def branch(i: int, name: str = name, fails: int = arg) -> list[Any]:
                ctx.log(f"before {name}a{i}")
                if i == 0:
                    WORLD.slow.add((ctx.id, f"{name}a0"))
                    first = await ctx.step(f"{name}a0", slow, ctx.id, f"{name}a0", 3, ctx.fence, ctx.log)
                else:
                    first = await ctx.step(f"{name}a1", page, ctx.id, f"{name}a1", 0, ctx.fence)
                ctx.log(f"before {name}b{i}")
                second = await ctx.step(f"{name}b{i}", page, ctx.id, f"{name}b{i}", fails if i == 1 else 0, ctx.fence,
                                        retry=Retry(attempts=4, initial_delay=5, max_delay=5))  # fmt: skip
                return [first, second]

            value = await asyncio.gather(branch(0), branch(1))
        elif kind == "lead":
            steps.extend([f"{name}f", f"{name}s"])
            WORLD.slow.add((ctx.id, f"{name}s"))
            value = await asyncio.gather(
                ctx.step(f"{name}f", page, ctx.id, f"{name}f", arg, ctx.fence, retry=Retry(attempts=4, initial_delay=5, max_delay=5)),
                ctx.step(f"{name}s", slow, ctx.id, f"{name}s", 12, ctx.fence, ctx.log),
            )
        elif kind == "pause":
            assert WORLD.clock is not None
            WORLD.pausing.add((ctx.id, ctx.fence))
            try:
                await WORLD.clock.sleep_until(WORLD.clock.now() + timedelta(seconds=arg))
            finally:
                WORLD.pausing.discard((ctx.id, ctx.fence))
        elif kind == "sleep":
            await ctx.sleep(name, arg)
        else:
            value = await ctx.wait_for(name, timeout=arg)
        WORLD.seen[(ctx.id, position)].add(json.dumps(value))
        seen.append(value)
    return seen


FUNCTION = define_durable(name="plan", handler=plan_body)


class Proxy:
    """A store as one instance sees it: it can hang (frozen), or die just before or just
    after one of its writes commits; it checks every write the store accepts."""

    def __init__(self, store: Any, server: ManualClock, name: str) -> None:
        self._store = store
        self.name = name
        self.server = server
        """The store server's clock: the machine's (every instance compares its own with it)."""
        self.frozen: asyncio.Event | None = None
        self.freezes = 0
        """How often it was frozen (a step it runs across a freeze was paused with it)."""
        self.claims_go_through = False
        """While frozen, its claims still commit (sent just before the freeze): only their
        answers wait for the thaw."""
        self.late_answers: asyncio.Event | None = None
        """Set: its claims commit, but their answers wait until it is set (a slow store, a
        connection whose reply is held up), while its other calls go through."""
        self.crash_next: str | None = None  # "before" or "after"
        self.crashed = False
        self.lose_next: str | None = None
        """"claim" or "write": the next such call commits, then its answer is lost (the
        connection broke); the instance goes on."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def server_clock(self) -> datetime:
        await self._beat_gate()
        return self.server.now()

    async def _gate(self) -> None:
        if self.crashed:
            raise Unavailable("crashed (test)")
        if self.frozen is not None:
            await self.frozen.wait()

    async def durable_insert(self, execution: NewExecution, **kwargs: Any) -> bool:
        inserted: bool = await self._store.durable_insert(execution, **kwargs)
        if inserted and kwargs.get("claim") is not None:  # started and claimed at once: lease 1
            WORLD.lease[execution.id] = max(WORLD.lease.get(execution.id, 0), 1)
            WORLD.owner[(execution.id, 1)] = self
            note(f"{self.name} started {execution.id} claimed (lease 1)")
        return inserted

    async def durable_claim(self, *args: Any) -> list[Claimed]:
        frozen = self.frozen if self.claims_go_through else self.late_answers
        if frozen is None:
            await self._gate()
        claimed: list[Claimed] = await self._store.durable_claim(*args)
        for one in claimed:
            key = one.execution.id
            WORLD.committed_lease[key] = max(WORLD.committed_lease.get(key, 0), one.execution.lease)
        if frozen is not None:
            await frozen.wait()  # committed; the answer comes after the thaw
        for one in claimed:
            # The newest lease is the highest issued: two claims in flight can come back in
            # either order (their commits are ordered, their replies are not).
            WORLD.lease[one.execution.id] = max(WORLD.lease.get(one.execution.id, 0), one.execution.lease)
            WORLD.owner[(one.execution.id, one.execution.lease)] = self
            note(f"{self.name} claimed {one.execution.id} under lease {one.execution.lease}")
        if claimed and self.lose_next == "claim":
            self.lose_next = None
            raise Unavailable("the connection broke after the claim committed (test)")
        return claimed

    async def durable_renew(self, instance: str, leases: Any, *args: Any) -> Any:
        await self._gate()
        renewal = await self._store.durable_renew(instance, leases, *args)
        WORLD.heard_cancel.update((id_, lease) for id_, lease in leases if id_ in renewal.cancel)
        return renewal

    # A frozen process beats no more: its name falls silent, as its leases lapse.
    async def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        await self._beat_gate()
        return await self._store.heartbeat(*args, **kwargs)

    async def heartbeat_and_unfinished(self, *args: Any, **kwargs: Any) -> Any:
        await self._beat_gate()
        return await self._store.heartbeat_and_unfinished(*args, **kwargs)

    async def _beat_gate(self) -> None:
        if self.frozen is not None and not self.claims_go_through:
            await self.frozen.wait()

    async def durable_write(self, write: Write) -> bool | None:
        await self._gate()
        when, self.crash_next = self.crash_next, None
        if when == "before":
            self.crashed = True
            raise Unavailable("crashed before the write (test)")
        # A newer claim the store had answered before this write was sent committed first:
        # the write must be refused. One answered while the write was in flight may have
        # committed after it (the two answers come back in either order): no evidence.
        newer = WORLD.committed_lease.get(write.id, 0)
        result: bool | None = await self._store.durable_write(write)
        if result is not None:
            if newer > write.lease:
                violation(f"a write under lease {write.lease} landed; lease {newer} was claimed before it was sent")
            for record in write.steps:
                if record.kind == "step" and record.status == "succeeded":
                    WORLD.committed.setdefault((write.id, record.name), next(WORLD.seq))
        if when == "after":
            self.crashed = True
            raise Unavailable("crashed after the write (test)")
        if self.lose_next == "write":
            self.lose_next = None
            raise Unavailable("the connection broke after the write committed (test)")
        if result:  # (its owner is answered: an operator asked to cancel)
            WORLD.heard_cancel.add((write.id, write.lease))
        return result


class DurableFleet(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        global WORLD
        WORLD = World()
        self.loop = asyncio.new_event_loop()
        self.folder = Path(tempfile.mkdtemp(prefix="schedtui-durable-"))
        self.url = self.store_url()
        self.clock = WORLD.clock = ManualClock("2026-03-02T08:00:00Z")
        self.ids_made = IdFactory(self.clock.now, itertools.count().__next__)  # the same ids on a replay
        self.live: dict[str, tuple[Engine, Proxy]] = {}
        self.walls: dict[str, OffsetClock] = {}
        """Each live instance's wall clock, which may step (the lease's never does)."""
        self.zombies: list[tuple[Engine, Proxy]] = []
        """Instances whose name another process took while they were frozen: they run on
        once thawed (their heartbeats refused) and must write nothing."""
        self.ids: list[str] = []
        self.elsewhere = itertools.count(1)
        self.traced = Traced(logging.WARNING)
        logging.getLogger("schedtui").addHandler(self.traced)
        self.run(self._boot("a"))

    def store_url(self) -> str:
        return f"sqlite:///{self.folder / 'state.db'}"

    def _advance(self, seconds: float) -> None:
        """Move the clock. Longer than a renewal's period at once, every process stood
        still that long: a step in flight then races its owner's lapse (see ``begin``)."""
        if seconds > 5:
            WORLD.stalls += 1
        self.clock.advance(seconds)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_within(self.loop, coro, 30)

    async def _boot(self, name: str, elsewhere: bool = False) -> None:
        """An instance ``name`` in this process, or (``elsewhere``) in a process of another
        host or container, as far as the store can tell."""
        proxy = Proxy(open_store(self.url), self.clock, name + ("'" * elsewhere))
        wall = self.walls[name] = OffsetClock(timedelta(0), self.clock)
        # The lease on the manual clock too: a frozen instance's lease lapses as the others'
        # clocks move past it (on real time it never would here, and a claim whose answer
        # came back after the others had taken its work over would still look held).
        engine = Engine([FUNCTION], proxy, clock=wall, instance=name, coordination="advisoryLock",
                        shutdown_grace=0, retention=None, ids=self.ids_made,
                        lease_clock=lambda: self.clock.now().timestamp())  # fmt: skip
        # Compared as on a real clock: the wall clock with the lease's, and with the store's.
        engine.lease.wall = lambda: wall.now().timestamp()
        engine.registry.clock_check = ClockCheck(engine.registry.abandon_after)
        if elsewhere:
            engine.registry.host = f"{host_identity()}#sim{next(self.elsewhere)}"
            engine.registry.pid = DEAD_PID
        await engine.start()
        self.live[name] = (engine, proxy)

    async def _settle(self) -> None:
        for engine, proxy in [*self.live.values(), *self.zombies]:
            if proxy.frozen is None and not proxy.crashed:
                # Each lease's watcher looks on real time (every 0.5 s), which the manual
                # clock does not move: it looks here, as it would have by then. (A frozen
                # process's does not: it looks when it thaws, as a SIGSTOPped one would.)
                engine.lease.check()
                engine.lease.check_jump()
        for engine, proxy in [*self.live.values(), *self.zombies]:
            if proxy.frozen is None and proxy.late_answers is None and not proxy.crashed:
                await self._quiet(engine)
        for name, (engine, proxy) in list(self.live.items()):
            if proxy.crashed:
                del self.live[name]
                await crash(engine)
        for zombie in [entry for entry in self.zombies if entry[1].crashed]:
            # (a crash due when its name was taken, which came once it thawed: its process is
            # gone too. Left beating, it held the name against its live replacement for ever.)
            self.zombies.remove(zombie)
            await crash(zombie[0])

    def settle(self) -> None:
        self.run(self._settle())

    async def _quiet(self, engine: Engine) -> None:
        """Wait until the engine has done what the current time calls for: its loops
        parked, and each execution it runs ended, waiting in the store, or in a slow step
        or a pause between steps (which only the clock ends)."""
        executor = engine.durable.executor
        settled = 0
        # Bounded by real time, not by rounds: a run between two slow steps commits each
        # step it passes, and on a loaded machine (the other test worker beside it) that
        # outlasted 5,000 rounds of a loop with nothing else to do.
        deadline = asyncio.get_running_loop().time() + 20
        for round_ in itertools.count():
            if asyncio.get_running_loop().time() > deadline:
                break
            await engine.quiesce(runs=False)
            await asyncio.sleep(0 if round_ < 200 else 0.001)  # (then no busy loop beside the server)
            asleep = all(
                any(lease == run.lease for lease, _, _ in WORLD.running[run.id].values())
                or (run.id, run.lease) in WORLD.pausing
                for run in executor.running.values()
            )
            settled = settled + 1 if asleep else 0
            if settled >= 3:
                return
        raise AssertionError(f"{engine.instance} did not settle: {sorted(executor.running)}")

    @property
    def acting(self) -> Engine | None:
        for engine, proxy in self.live.values():
            if proxy.frozen is None and proxy.late_answers is None and not proxy.crashed:
                return engine
        return None

    # -- rules -------------------------------------------------------------------------
    # Which instance writes next, and so which one crashes, is a race: the rules draw from
    # fixed choices and do nothing when theirs does not apply (a precondition or a draw
    # that depended on it would make Hypothesis's generation differ between replays).
    @rule(plan=PLANS)
    @traced
    def start(self, plan: Plan) -> None:
        engine = self.acting
        if engine is not None:
            self.ids.append(self.run(engine.durable.start_execution("plan", plan)).id)
        self.settle()

    @rule(seconds=st.sampled_from([1, 5, 10, 31]))
    @traced
    def advance(self, seconds: int) -> None:
        self._advance(seconds)
        self.settle()

    @rule(which=st.integers(0, 15), position=st.integers(0, 5), payload=st.integers(0, 100))
    @traced
    def signal(self, which: int, position: int, payload: int) -> None:
        engine = self.acting
        if engine is not None and self.ids:
            try:
                self.run(engine.durable.signal(self.ids[which % len(self.ids)], f"p{position}", payload))
            except Refused:
                pass  # finished already
        self.settle()

    @rule(which=st.integers(0, 15), by=st.integers(0, 2))
    @traced
    def cancel(self, which: int, by: int) -> None:
        """An operator cancels through one of the instances: the owner hears of it at once,
        another one only at its next write or renewal."""
        able = [engine for engine, proxy in self.live.values()
                if proxy.frozen is None and proxy.late_answers is None and not proxy.crashed]  # fmt: skip
        engine = able[by % len(able)] if able else None
        if engine is not None and self.ids:
            try:
                self.run(engine.durable.cancel(self.ids[which % len(self.ids)]))
            except Refused:
                pass
        self.settle()

    @rule()
    @traced
    def retry(self) -> None:
        """An operator retries every failed execution: after a nondeterministic failure or
        a failed step (not after an interrupted at-most-once step: that retry does run it
        again, as documented)."""
        engine = self.acting
        if engine is not None and self.ids:
            executions, _ = self.run(engine.durable.list(status="failed", limit=1000))
            for execution in executions:
                if execution.error_tag != TAG_AT_MOST_ONCE_INTERRUPTED:
                    self.run(engine.durable.retry(execution.id))
        self.settle()

    @rule(name=st.sampled_from(NAMES), when=st.sampled_from(["before", "after"]))
    @traced
    def crash_at_next_write(self, name: str, when: str) -> None:
        entry = self.live.get(name)
        if entry is not None and not entry[1].crashed and entry[1].crash_next is None:
            entry[1].crash_next = when
        self.settle()

    @rule(name=st.sampled_from(NAMES), which=st.sampled_from(["claim", "write"]), plan=PLANS, rounds=st.integers(0, 2))
    @traced
    def lose_an_answer(self, name: str, which: str, plan: Plan, rounds: int) -> None:
        """Its next claim (of at least one execution) or write commits, and the answer is
        lost; the instance goes on (its other calls go through). Something is set off for
        it to do: an execution started through it (its first write), or time moved on to
        what is due (a claim, by it or another). Then ``rounds`` seconds pass, a claim
        round each: the next gives back what a lost claim took, while its lease holds."""
        entry = self.live.get(name)
        if entry is None or entry[1].crashed:
            self.settle()
            return
        engine, proxy = entry
        proxy.lose_next = which
        if which == "write" and proxy.frozen is None and proxy.late_answers is None:
            self.ids.append(self.run(engine.durable.start_execution("plan", plan)).id)
        else:
            self._advance(31)
        self.settle()
        for _ in range(rounds):
            self._advance(1)
            self.settle()

    @rule(name=st.sampled_from(NAMES), claims_go_through=st.booleans())
    @traced
    def freeze(self, name: str, claims_go_through: bool) -> None:
        """Its store calls hang (a SIGSTOPped process); or its claims commit and only their
        answers hang (frozen just after sending them): runs it claims then come back late."""
        entry = self.live.get(name)
        if entry is not None and entry[1].frozen is None and not entry[1].crashed:
            entry[1].frozen = asyncio.Event()
            entry[1].freezes += 1
            entry[1].claims_go_through = claims_go_through
        self.settle()

    @rule(name=st.sampled_from(NAMES), first=st.sampled_from([5, 31]))
    @traced
    def claim_answers_come_late(self, name: str, first: int) -> None:
        """Its claims' answers are held up while the clock moves past the leases they took
        (and its other calls go through): the runs it claimed meanwhile, another instance
        may claim and run before the answer comes (one is started if none is live).
        ``first``: a lease or a wait that comes due, or not yet, before it claims."""
        entry = self.live.get(name)
        if entry is None or entry[1].frozen is not None or entry[1].crashed or entry[1].late_answers is not None:
            self.settle()
            return
        others = [other for other in self.live if other != name]
        if all(self.live[other][1].frozen is not None or self.live[other][1].crashed for other in others):
            # One to take the runs over: a new instance, or (every name in use) one thawed.
            free = [n for n in NAMES if n not in self.live and self._bootable(n)]
            frozen = [other for other in others if self.live[other][1].frozen is not None]
            if free:
                self.run(self._boot(free[0]))
            elif frozen:
                self._thaw(frozen[0])
            else:
                self.settle()
                return
        held = entry[1].late_answers = asyncio.Event()
        self._advance(first)
        self.settle()  # it claims what is due; the others claim and run the rest
        self._advance(31)  # past the leases of what it claimed
        self.settle()  # the others claim those and run them
        entry[1].late_answers = None
        held.set()
        self.settle()

    @rule(name=st.sampled_from(NAMES))
    @traced
    def thaw(self, name: str) -> None:
        if name in self.live:
            self._thaw(name)
        self.settle()

    def _thaw(self, name: str) -> None:
        proxy = self.live[name][1]
        frozen, proxy.frozen = proxy.frozen, None
        proxy.claims_go_through = False
        if frozen is not None:
            frozen.set()

    @rule(name=st.sampled_from(NAMES))
    @traced
    def replaced_under_its_name(self, name: str) -> None:
        """An instance is frozen past the take-over window, and a process under its name
        starts on another host in its place (an orchestrator replacing what it lost: a
        stable name, a new host). The new one takes the name; then the old one thaws and
        runs on under a name it no longer holds: its heartbeats are refused, and it must
        write nothing under the leases the others have taken since."""
        entry = self.live.get(name)
        if entry is None or entry[1].crashed or entry[1].late_answers is not None:
            self.settle()
            return
        engine, proxy = entry
        if proxy.frozen is None:
            proxy.frozen = asyncio.Event()
            proxy.freezes += 1
        proxy.claims_go_through = False  # the whole process: its heartbeats too
        self._advance(31)  # past the window: its last heartbeat is older than 30 s
        self.settle()
        acting = self.acting
        # (when each beat by the store server's clock: a clock stepped back stamps them old)
        beats = {} if acting is None else {i.name: i.heard_at for i in self.run(acting.store.fleet())}
        if beats.get(name, self.clock.now()) >= self.clock.now() - timedelta(seconds=30):
            # Another process beats under the name: one this rule left running before, which
            # took its name back once its replacement fell silent (as it should). A new one
            # would wait for it and be refused: the frozen one only thaws.
            self._thaw(name)
            self.settle()
            return
        del self.live[name]
        self.zombies.append(entry)
        # The new one plays another process: the guard against two engines of one process
        # under one name is not the one tested here, the store's is.
        names.let_go(engine.store.where, name, engine)
        self.run(self._boot(name, elsewhere=True))
        frozen, proxy.frozen = proxy.frozen, None
        proxy.claims_go_through = False
        frozen.set()  # it thaws
        self.settle()

    @rule(name=st.sampled_from(NAMES), seconds=st.sampled_from([-70, -35, -8, 8, 35, 70]))
    @traced
    def step_a_clock(self, name: str, seconds: int) -> None:
        """An instance's wall clock steps: back, the leases it stamps would look expired to
        the others while it runs their executions; ahead, it would take the others' leases
        for expired. Its lease's checks find the jump first, and its heartbeats find its
        clock off the store's: it stops its work and claims nothing until they agree."""
        if name in self.live:
            self.walls[name].offset += timedelta(seconds=seconds)
        self.settle()

    @rule(name=st.sampled_from(NAMES))
    @traced
    def sync_a_clock(self, name: str) -> None:
        """Time sync puts its wall clock right again: its next heartbeat renews its lease."""
        if name in self.live:
            self.walls[name].offset = timedelta(0)
        self.settle()

    @rule(name=st.sampled_from(NAMES))
    @traced
    def restart(self, name: str) -> None:
        if name not in self.live and self._bootable(name):
            self.run(self._boot(name))
        self.settle()

    def _bootable(self, name: str) -> bool:
        """Whether a process started here under ``name`` takes it at once: nobody beats
        under it, or this process did (started again), or its holder has been silent for
        the window. Else (a replacement on another host that crashed, a zombie that took
        the name back) it would wait for that holder on a clock that only the rules move."""

        async def holder() -> tuple[str, int, Any] | None:
            store = open_store(self.url)
            await store.open()
            try:
                row = next((i for i in await store.fleet() if i.name == name), None)
            finally:
                await store.close()
            return None if row is None else (row.host, row.pid, row.heard_at)

        if any(engine.instance == name and not proxy.crashed for engine, proxy in self.zombies):
            # A zombie of this process runs on under the name, and takes it back once its
            # replacement falls silent: a start here would share its host and pid, and be
            # taken for this process started again (and end the zombie's leases under it,
            # its step still running). A real process is another pid: refused as in use.
            return False
        found = self.run(holder())
        if found is None:
            return True
        host, pid, at = found
        here = host == host_identity() and pid == os.getpid()
        return here or at < self.clock.now() - timedelta(seconds=30)

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def a_finished_step_never_runs_again(self) -> None:
        for key, committed in WORLD.committed.items():
            late = [seq for seq in WORLD.started[key] if seq > committed]
            assert not late, f"step {key} started again after its success was committed"

    @invariant()
    def an_at_most_once_step_runs_at_most_once(self) -> None:
        for key in WORLD.amo:
            assert len(WORLD.started.get(key, [])) <= 1, f"at-most-once step {key} ran {len(WORLD.started[key])} times"

    @invariant()
    def a_stale_lease_never_writes_nor_runs(self) -> None:
        assert not WORLD.violations, "\n".join(WORLD.violations)  # (whole: the trace of what led there)

    @invariant()
    def step_outputs_replay_identically(self) -> None:
        for key, values in WORLD.seen.items():
            assert len(values) == 1, f"position {key} saw {sorted(values)}"

    def _logs(self) -> list[tuple[str, Execution, list[str], list[list[str]]]]:
        """Each execution, its log's lines, and those lines cut at each retry ("retried by")."""
        engine = self.acting
        assert engine is not None
        logs = []
        for id_ in self.ids:
            execution = self.run(engine.durable.get(id_))
            lines = [line.message for line in execution.logs or []]
            stretches: list[list[str]] = [[]]
            for line in lines:
                if line.startswith("retried by "):
                    stretches.append([])
                stretches[-1].append(line)
            logs.append((id_, execution, lines, stretches))
        return logs

    def lines_before_recorded_steps_are_written_once(self) -> None:
        """Each step the code reached (but those of a gather or a fan, logged before it as
        one) has a line logged just before it, ``before NAME``: of a step that is recorded,
        that line is in the log, and at most once between two retries of the execution
        (a retry runs its failed step again, from the line before it), whatever crashes,
        lost answers and take-overs came between, and in whatever order replays reached
        the branches."""
        for id_, execution, lines, stretches in self._logs():
            for step in execution.steps or []:
                if step.kind == "step" and not step.name.endswith(("s", "t", "f", "m")):  # (gathered: one line)
                    line = f"before {step.name}"
                    counts = [stretch.count(line) for stretch in stretches]
                    assert sum(counts) >= 1 and max(counts) == 1, (
                        f"{id_}: the line before {step.name} ({step.status}) is in its log {counts} times "
                        f"(between retries): {lines}"
                    )

    def lines_inside_recorded_steps_are_written_once(self) -> None:
        """A slow step's function logs ``inside NAME`` as it starts: of such a step that
        succeeded, that line is in the log, and between two retries of the execution at
        most once an attempt, though its first attempts may have been cut short by a crash,
        a take-over or a lost answer, and a sibling's checkpoint committed meanwhile."""
        for id_, execution, lines, stretches in self._logs():
            for step in execution.steps or []:
                if (id_, step.name) in WORLD.slow and step.status == "succeeded":
                    counts = [stretch.count(f"inside {step.name}") for stretch in stretches]
                    assert sum(counts) >= 1 and max(counts) <= step.attempt, (
                        f"{id_}: the line inside {step.name} (attempt {step.attempt}) is in its log {counts} times "
                        f"(between retries): {lines}"
                    )

    @invariant()
    def every_execution_ends_or_waits_with_a_reason(self) -> None:
        engine = self.acting
        if engine is None or not self.ids:
            return
        executions, _ = self.run(engine.durable.list(limit=1000))
        for execution in executions:
            if execution.status == "waiting":
                assert execution.waiting_for and execution.wake_at, execution
            if execution.status in ("succeeded", "failed", "cancelled"):
                assert execution.finished_at is not None, execution

    def teardown(self) -> None:
        try:
            for name, (_, proxy) in list(self.live.items()):
                self.walls[name].offset = timedelta(0)  # time sync, everywhere
                proxy.crash_next = proxy.lose_next = None
                if proxy.late_answers is not None:
                    proxy.late_answers.set()
                    proxy.late_answers = None
                self._thaw(name)
            for _, proxy in self.zombies:
                if proxy.frozen is not None:
                    proxy.frozen.set()
                    proxy.frozen = None
            self.settle()
            for _ in range(20):  # one to run the rest: a name that can be taken (or, once silent long enough)
                if self.acting is not None:
                    break
                free = [n for n in NAMES if n not in self.live and self._bootable(n)]
                if free:
                    self.run(self._boot(free[0]))
                else:
                    self._advance(5)
                    self.settle()
            self._run_to_the_end()
            # Every failed execution retried once more (a retry goes wherever its failure
            # left the execution), and run to its end again.
            self.retry()
            self._run_to_the_end()
        finally:
            for engine, _ in [*self.live.values(), *self.zombies]:
                self.run(engine.stop(grace=0))
            self.loop.close()
            logging.getLogger("schedtui").removeHandler(self.traced)
            shutil.rmtree(self.folder, ignore_errors=True)  # (each example's SQLite file was left behind)

    def _run_to_the_end(self) -> None:
        executions: list[Execution] = []
        for _ in range(250):  # 5 s at a time (a longer jump at once would lapse every lease)
            engine = self.acting
            assert engine is not None
            executions, _ = self.run(engine.durable.list(limit=1000))
            if all(e.done for e in executions):
                break
            self._advance(5)
            self.settle()
        open_ = [(e.id, e.status, e.waiting_for) for e in executions if not e.done]
        assert not open_, f"executions that never ended: {open_}"
        self.a_finished_step_never_runs_again()
        self.an_at_most_once_step_runs_at_most_once()
        self.a_stale_lease_never_writes_nor_runs()
        self.step_outputs_replay_identically()
        self.lines_before_recorded_steps_are_written_once()
        self.lines_inside_recorded_steps_are_written_once()


class DurableFleetOnPostgres(DurableFleet):
    """The same on PostgreSQL, where the instances' starts, checkpoints and ends go through a
    connection of their own (backend/store/postgres/lane.py) and a checkpoint locks the
    execution's row under its lease instead of updating it."""

    def store_url(self) -> str:
        assert pg.ACTIVE is not None, "the pg_server fixture was not requested"
        return pg.ACTIVE.create_database(migrated=True)


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
DurableFleet.TestCase.settings = SETTINGS
test_durable_invariants = DurableFleet.TestCase
DurableFleetOnPostgres.TestCase.settings = SETTINGS
test_durable_invariants_on_postgres = pytest.mark.postgres(
    pytest.mark.usefixtures("pg_server")(DurableFleetOnPostgres.TestCase)
)


def test_the_machine_never_starts_a_second_engine_under_a_name_its_zombie_holds() -> None:
    """The rules in the order that once reported two steps at once: "a" is replaced under
    its name (a zombie of this process runs on), its replacement on another host crashes
    and falls silent, the zombie takes the name back and runs a slow step; then ``restart``
    booted a second engine "a" in this process (same host and pid: taken for this process
    started again), whose first round ended the zombie's leases under its running step. A
    real second process is another pid, refused as in use: the machine must not do it."""
    machine = DurableFleet()
    try:
        machine.restart(name="b")
        machine.replaced_under_its_name(name="a")
        zombie = machine.zombies[0][0]
        replacement = machine.live["a"][0]
        machine.crash_at_next_write(name="a", when="after")
        machine.ids.append(machine.run(replacement.durable.start_execution("plan", [("step", 0)])).id)
        machine.settle()
        assert "a" not in machine.live  # the replacement crashed at its first write
        for _ in range(8):  # 5 s at a time (no stall): it falls silent, the zombie takes the name back
            machine.advance(seconds=5)
        machine.ids.append(machine.run(zombie.durable.start_execution("plan", [("step", 0), ("slow", 40)])).id)
        machine.settle()
        machine.advance(seconds=5)
        assert any(WORLD.running.values())  # the zombie's slow step runs
        assert not machine._bootable("a")
        machine.restart(name="a")
        machine.a_stale_lease_never_writes_nor_runs()
    finally:
        machine.teardown()
