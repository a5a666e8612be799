"""The locks' invariants under random sequences of operations (Hypothesis, stateful), on
the injected clock:

* one holder at a time: a lock is taken only when no current lease holds it;
* tokens strictly increasing per name, across take-overs, releases and forced releases;
* a stale token (taken over, released, expired) never renews, releases or fences, and a
  resource never accepts a token older than one it has seen;
* a give-back (for an acquire whose answer was lost) frees only the lease taken with its
  claim, and a lock taken by such an acquire is free again within a housekeeping round.

The first machine drives the store directly (both stores) against a model of what each
answer must be; the second drives leases of two engines on one SQLite store, with
background renewals, frozen holders, forced releases and ``with_lock`` calls whose work
ends (and, some, fences a write) when the machine says, and restarts of either engine
(with work holding locks and an acquire on its way), and checks after every step that
at most one lease per name believes itself held, that a ``with_lock`` whose lease was
released by force while it held it never reports success (nor is a run of a schedule
locked on ``a`` recorded ``succeeded``), that a fenced write is
never accepted from a lease released by force nor after a newer token's, and that a lock
taken by an acquire whose answer was lost is given back by the next housekeeping round;
and after a restart, that the stopped engine holds no lock in the store and no lease of it
believes itself held (what it held is lost: never a success, never a fenced write).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sqlite3
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule, run_state_machine_as_test

from backend import Engine, LeaseLost, ManualClock, RunContext, StaleLease, Unavailable, define_schedule
from backend.locks import Lease, LockResult, LockStore
from backend.model import Run
from backend.runtime.leaseclock import LeaseClock
from backend.store import open_store
from tests import pg

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
NAMES = ["a", "b"]
RESOURCES = ["r1", "r2"]
SETTINGS = settings(
    max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", "25")),
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Issued:
    name: str
    token: int


@dataclass
class Current:
    token: int
    expires_at: datetime
    released: bool = False
    claim: str | None = None


_examples = itertools.count()


class StoreMachine(RuleBasedStateMachine):
    """The lock table against a model. ``KIND`` picks the store (set by the test)."""

    KIND = "sqlite"
    issued = Bundle("issued")
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="locks-props-")
        self.prefix = f"x{next(_examples)}-"  # the PostgreSQL database is shared by every example
        if self.KIND == "sqlite":
            path = Path(self.tmp.name) / "state.db"
            self.store: Any = open_store(f"sqlite:///{path}")
            self.run(self.store.open())
            self.conn: Any = sqlite3.connect(str(path), isolation_level=None)
        else:
            assert pg.ACTIVE is not None
            self.store = open_store(_pg_url())
            self.run(self.store.open())
            import psycopg

            self.conn = psycopg.connect(self.store.url)
        self.now = T0
        self.current: dict[str, Current] = {}
        self.highest: dict[str, int] = {}
        self.seen: dict[str, int] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.conn.close()
        self.run(self.store.close())
        self.loop.close()
        self.tmp.cleanup()

    def lock(self, name: str) -> str:
        return self.prefix + name

    def is_current(self, lease: Issued) -> bool:
        cur = self.current.get(lease.name)
        return cur is not None and cur.token == lease.token and not cur.released and cur.expires_at > self.now

    # -- rules ---------------------------------------------------------------------------
    @rule(seconds=st.sampled_from([0, 0.5, 1, 3, 7]))
    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(target=issued, name=st.sampled_from(NAMES), ttl=st.sampled_from([1, 5, 10]), claimed=st.booleans())
    def acquire(self, name: str, ttl: int, claimed: bool) -> Any:
        cur = self.current.get(name)
        free = cur is None or cur.released or cur.expires_at <= self.now
        claim = f"{self.prefix}c{next(_examples)}" if claimed else None
        lock = self.run(self.store.acquire_lock(self.lock(name), f"h{ttl}", timedelta(seconds=ttl), self.now, claim))
        assert (lock is not None) == free, (name, cur, self.now)
        if lock is None:
            return multiple()  # nothing issued
        assert lock.token > self.highest.get(name, 0), "tokens must strictly increase per name"
        self.highest[name] = lock.token
        self.current[name] = Current(lock.token, self.now + timedelta(seconds=ttl), claim=claim)
        return Issued(name, lock.token)

    @rule(target=claims, name=st.sampled_from(NAMES), ttl=st.sampled_from([1, 5, 10]))
    def acquire_unanswered(self, name: str, ttl: int) -> Any:
        """An acquire whose answer is lost: only its claim is known."""
        claim = f"{self.prefix}c{next(_examples)}"
        before = self.current.get(name)
        free = before is None or before.released or before.expires_at <= self.now
        lock = self.run(self.store.acquire_lock(self.lock(name), "lost", timedelta(seconds=ttl), self.now, claim))
        assert (lock is not None) == free
        if lock is not None:
            assert lock.token > self.highest.get(name, 0)
            self.highest[name] = lock.token
            self.current[name] = Current(lock.token, self.now + timedelta(seconds=ttl), claim=claim)
        return (name, claim)

    @rule(lost=claims)
    def give_back(self, lost: tuple[str, str]) -> None:
        name, claim = lost
        cur = self.current.get(name)
        expected = cur is not None and cur.claim == claim and not cur.released
        given_back = self.run(self.store.give_back_lock(self.lock(name), claim, self.now))
        assert given_back == expected, "only the lease taken with the claim is given back"
        if given_back:
            assert cur is not None
            cur.released = True
            cur.expires_at = min(cur.expires_at, self.now)

    @rule(lease=issued, ttl=st.sampled_from([1, 5, 10]))
    def renew(self, lease: Issued, ttl: int) -> None:
        expected = self.is_current(lease)
        expires = self.run(self.store.renew_lock(self.lock(lease.name), lease.token, timedelta(seconds=ttl), self.now))
        assert (expires is not None) == expected, "only the current, unexpired lease renews"
        if expires is not None:
            assert expires == self.now + timedelta(seconds=ttl)
            self.current[lease.name].expires_at = expires

    @rule(lease=issued)
    def release(self, lease: Issued) -> None:
        cur = self.current.get(lease.name)
        expected = cur is not None and cur.token == lease.token and not cur.released
        released = self.run(self.store.release_lock(self.lock(lease.name), lease.token, self.now))
        assert released == expected, "only the current lease releases"
        if released:
            assert cur is not None
            cur.released = True
            cur.expires_at = min(cur.expires_at, self.now)

    @rule(name=st.sampled_from(NAMES))
    def force_release(self, name: str) -> None:
        done = self.run(self.store.force_release_lock(self.lock(name), self.now))
        cur = self.current.get(name)
        assert (done is None) == (cur is None)
        if cur is not None:
            assert done.released == (not cur.released)
            cur.released = True
            cur.expires_at = min(cur.expires_at, self.now)

    @rule(lease=issued, resource=st.sampled_from(RESOURCES))
    def fence(self, lease: Issued, resource: str) -> None:
        expected = self.is_current(lease) and self.seen.get(resource, 0) <= lease.token
        resource = self.lock(resource)
        if isinstance(self.conn, sqlite3.Connection):
            self.conn.execute("BEGIN")
            why = self.store.fence_on_sync(self.conn, resource, self.lock(lease.name), lease.token, self.now)
            self.conn.execute("COMMIT")
        else:
            with self.conn.transaction():
                why = self.store.fence_on_sync(self.conn, resource, self.lock(lease.name), lease.token, self.now)
        assert (why is None) == expected, (why, lease, self.current, self.seen)
        if why is None:
            self.seen[resource[len(self.prefix) :]] = lease.token

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def the_table_matches_the_model(self) -> None:
        snapshot = self.run(self.store.list_locks(self.now))
        rows = {lock.name[len(self.prefix) :]: lock for lock in snapshot.locks if lock.name.startswith(self.prefix)}
        assert set(rows) == set(self.current)
        for name, lock in rows.items():
            cur = self.current[name]
            assert lock.token == cur.token
            held = lock.state(self.now) == "held"
            assert held == (not cur.released and cur.expires_at > self.now), "one holder at a time"


def _pg_url() -> str:
    global _PG_URL
    if _PG_URL is None:
        assert pg.ACTIVE is not None
        _PG_URL = pg.ACTIVE.create_database("props")
    return _PG_URL


_PG_URL: str | None = None


def test_the_lock_table_keeps_its_invariants_on_sqlite() -> None:
    run_state_machine_as_test(StoreMachine, settings=SETTINGS)


@pytest.mark.postgres
def test_the_lock_table_keeps_its_invariants_on_postgres(pg_server: pg.PgServer) -> None:
    class OnPostgres(StoreMachine):
        KIND = "postgres"

    run_state_machine_as_test(OnPostgres, settings=settings(SETTINGS, max_examples=10))


@dataclass
class WorkInFlight:
    """A ``with_lock`` call whose work waits for :attr:`finish` (then, if it ``fences``,
    writes through ``lease.fence`` before it returns)."""

    task: asyncio.Task[LockResult]
    finish: asyncio.Event
    fences: bool
    lease: Lease | None = None


@dataclass
class LockedRun:
    """A run of the locked schedule ``guarded`` whose handler holds the lock and waits for
    :attr:`finish`; :attr:`ended` is its run as recorded."""

    id: str
    lease: Lease
    finish: asyncio.Event
    ended: asyncio.Task[Run]


class LeaseMachine(RuleBasedStateMachine):
    """Leases of two engines sharing a store and a clock: renewals run by themselves; a
    frozen holder's renewals fail; an operator releases by force; ``with_lock`` work and
    runs of a schedule locked on ``a`` start and end at any point in between."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="lease-props-")
        self.clock = ManualClock(T0)
        self.url = f"sqlite:///{Path(self.tmp.name) / 'state.db'}"
        self.entered: dict[str, Lease] = {}
        """The leases the locked schedule's handlers hold, by run id."""
        self.entries: dict[str, asyncio.Event] = {}
        self.finishes: dict[str, asyncio.Event] = {}
        self.engines = [self._engine(f"e{i}") for i in range(2)]
        self.stopped: set[int] = set()
        """Tokens of leases their engine's stop released: lost, never a success."""
        for engine in self.engines:
            self.run(engine.open())
        self.leases: list[Lease] = []
        self.frozen: set[int] = set()
        """The ``id()`` of the lock services whose renewals fail (a restart makes a new one)."""
        self.evicted: set[int] = set()
        """Tokens of leases released by force while held: they learn it at their next renewal."""
        self.highest: dict[str, int] = {}
        self.path = Path(self.tmp.name) / "state.db"
        self.works: list[WorkInFlight] = []
        self.writes: list[tuple[int, bool]] = []
        """Fenced writes the store accepted: (token, whether it had been released by force)."""
        self.unanswered: list[tuple[str, int, datetime]] = []
        """Locks taken by acquires whose answer was lost: (name, token, when)."""
        self.locked_runs: list[LockedRun] = []

    def _engine(self, instance: str) -> Engine:
        """An engine of the store with the schedule ``guarded``, locked on ``a`` (its timer
        never fires here: its runs are fired by hand)."""

        async def guarded(ctx: RunContext) -> None:
            assert ctx.lease is not None
            self.entered[ctx.run_id] = ctx.lease
            self._event(self.entries, ctx.run_id).set()
            await self._event(self.finishes, ctx.run_id).wait()

        schedule = define_schedule(name="guarded", cron="0 0 1 1 *", timezone="UTC", handler=guarded, lock="a", lock_ttl=9)
        return Engine([schedule], self.url, clock=self.clock, instance=instance, shutdown_grace=0)

    @staticmethod
    def _event(events: dict[str, asyncio.Event], run_id: str) -> asyncio.Event:
        return events.setdefault(run_id, asyncio.Event())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            for work in self.works:  # the work still in flight ends now, at this very time
                work.finish.set()
            if self.works:
                self.run(asyncio.wait([work.task for work in self.works]))
            for run in self.locked_runs:
                run.finish.set()
            if self.locked_runs:
                self.run(asyncio.wait([run.ended for run in self.locked_runs]))
            self.a_holder_whose_lease_was_released_never_reports_success()
            self.a_locked_run_whose_lease_was_released_never_succeeds()
            self.a_stale_lease_never_writes()
        finally:
            for engine in self.engines:
                self.run(engine.stop(grace=0))
            self.loop.close()
            self.tmp.cleanup()

    @rule(engine=st.integers(0, 1), name=st.sampled_from(NAMES), ttl=st.sampled_from([3, 9]))
    def acquire(self, engine: int, name: str, ttl: int) -> None:
        lease = self.run(self.engines[engine].locks.acquire(name, ttl=ttl))
        if lease is not None:
            assert lease.token > self.highest.get(name, 0)
            self.highest[name] = lease.token
            self.leases.append(lease)

    @rule(seconds=st.sampled_from([1, 2, 3, 5]))
    def advance(self, seconds: int) -> None:
        # A second at a time: time flows for live holders (a jump past a whole ttl would be
        # a freeze of everyone, which the freeze rule models for one holder).
        for _ in range(seconds):
            self.clock.advance(1)
            for engine in self.engines:
                self.run(engine.quiesce(runs=False))  # (locked runs end when the machine says)
                # The locks' part of the housekeeping round a started engine runs every
                # second (these engines are only opened: no timers to start).
                self.run(engine.locks.maintain(self.clock.now()))

    @rule(engine=st.integers(0, 1), name=st.sampled_from(NAMES), ttl=st.sampled_from([3, 9]))
    def lose_acquire_answer(self, engine: int, name: str, ttl: int) -> None:
        """An acquire commits and its answer is lost: the caller sees Unavailable."""
        store = cast(LockStore, self.engines[engine].store)
        acquire = store.acquire_lock
        taken: list[Any] = []

        async def lost(*args: Any) -> Any:
            taken.append(await acquire(*args))
            raise Unavailable("the answer was lost (test)")

        store.acquire_lock = lost  # type: ignore[method-assign,assignment]
        try:
            with contextlib.suppress(Unavailable):
                self.run(self.engines[engine].locks.acquire(name, ttl=ttl))
                raise AssertionError("an acquire whose answer was lost returned")
        finally:
            del store.acquire_lock  # the class's method again
        if taken and taken[0] is not None:
            assert taken[0].token > self.highest.get(name, 0)
            self.highest[name] = taken[0].token
            self.unanswered.append((name, taken[0].token, self.clock.now()))

    @rule(engine=st.integers(0, 1))
    def freeze(self, engine: int) -> None:
        """From now on this engine's renewals fail, as if it could not reach the store."""

        async def unreachable(name: str, token: int, ttl: timedelta, now: datetime | None) -> datetime | None:
            raise Unavailable("frozen")

        self.frozen.add(id(self.engines[engine].locks))
        store = cast(LockStore, self.engines[engine].store)
        store.renew_lock = unreachable  # type: ignore[method-assign]  # the store out of reach

    @rule(name=st.sampled_from(NAMES))
    def force_release(self, name: str) -> None:
        try:
            done = self.run(self.engines[0].locks.release(name))
        except LookupError:
            return
        if done.released:
            self.evicted.add(done.lock.token)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        working = {id(work.lease) for work in self.works}  # with_lock releases its own
        working.update(id(run.lease) for run in self.locked_runs)  # so does a locked run
        live = [lease for lease in self.leases if not lease.released and id(lease) not in working]
        if live:
            self.run(data.draw(st.sampled_from(live)).release())

    @rule(engine=st.integers(0, 1), name=st.sampled_from(NAMES), ttl=st.sampled_from([3, 9]), fences=st.booleans())
    def start_with_lock(self, engine: int, name: str, ttl: int, fences: bool) -> None:
        entered, finish = asyncio.Event(), asyncio.Event()

        async def work(lease: Lease) -> str:
            started.lease = lease
            self.leases.append(lease)
            entered.set()
            await finish.wait()
            if fences:
                self._fenced_write(lease)
            return "done"

        task = self.loop.create_task(self.engines[engine].locks.with_lock(name, work, ttl=ttl))
        started = WorkInFlight(task, finish, fences)
        waiting = self.loop.create_task(entered.wait())
        self.run(asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED))  # holding it, or refused
        waiting.cancel()
        if started.lease is not None:
            assert started.lease.token > self.highest.get(name, 0)
            self.highest[name] = started.lease.token
            self.works.append(started)

    @rule(data=st.data())
    def finish_with_lock(self, data: st.DataObject) -> None:
        working = [work for work in self.works if not work.finish.is_set()]
        if working:
            work = data.draw(st.sampled_from(working))
            work.finish.set()
            self.run(asyncio.wait({work.task}))

    def _fenced_write(self, lease: Lease) -> None:
        conn = sqlite3.connect(str(self.path), isolation_level=None)
        try:
            conn.execute("BEGIN")
            try:
                lease.fence_sync(conn, "report")
            except StaleLease:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()
        self.writes.append((lease.token, lease.token in self.evicted | self.stopped))

    @rule(engine=st.integers(0, 1))
    def start_locked_run(self, engine: int) -> None:
        """Run now the schedule locked on ``a``: its handler holds the lock until the
        machine finishes it, or the run is skipped as ``locked`` (another holder has it)."""
        fired: Run = self.run(self.engines[engine].run_now("guarded"))
        ended = self.loop.create_task(self.engines[engine].wait_run(fired.id))
        entry = self.loop.create_task(self._event(self.entries, fired.id).wait())
        self.run(asyncio.wait({ended, entry}, return_when=asyncio.FIRST_COMPLETED))  # holding the lock, or skipped
        entry.cancel()
        lease = self.entered.get(fired.id)
        if lease is None:
            run = ended.result()
            assert (run.status, run.error_tag) == ("skipped", "locked"), f"a locked run that never held its lock: {run}"
            return
        assert lease.token > self.highest.get("a", 0)
        self.highest["a"] = lease.token
        self.leases.append(lease)
        self.locked_runs.append(LockedRun(fired.id, lease, self._event(self.finishes, fired.id), ended))

    @rule(data=st.data())
    def finish_locked_run(self, data: st.DataObject) -> None:
        running = [run for run in self.locked_runs if not run.finish.is_set()]
        if running:
            run = data.draw(st.sampled_from(running))
            run.finish.set()
            self.run(asyncio.wait({run.ended}))

    @rule(engine=st.integers(0, 1), name=st.sampled_from(NAMES), mid_acquire=st.booleans())
    def restart(self, engine: int, name: str, mid_acquire: bool) -> None:
        """The engine stops (a SIGTERM; grace 0) and a new one opens in its place. Its
        ``with_lock`` work is told (cancelled: never a success), its leases are released,
        and, with ``mid_acquire``, an acquire of ``name`` whose statement committed gets its
        answer once the stop has begun. After it, the stopped engine holds no lock."""
        old = self.engines[engine]
        store = cast(LockStore, old.store)
        acquire = store.acquire_lock
        committed, answer = asyncio.Event(), asyncio.Event()
        taken: list[Any] = []

        async def answers_late(*args: Any) -> Any:
            lock = await acquire(*args)
            taken.append(lock)
            committed.set()
            await answer.wait()
            return lock

        acquiring = None
        if mid_acquire:
            store.acquire_lock = answers_late  # type: ignore[method-assign,assignment]
            acquiring = self.loop.create_task(old.locks.acquire(name, ttl=9))
            self.run(asyncio.wait({acquiring, self.loop.create_task(committed.wait())}, return_when=asyncio.FIRST_COMPLETED))
        stop_locks = old.locks.stop

        async def answer_once_stopping(grace: float) -> None:
            answer.set()
            await stop_locks(grace)

        old.locks.stop = answer_once_stopping  # type: ignore[method-assign]
        held = [lease for lease in self.leases if lease._locks is old.locks and lease.held]
        self.run(old.stop(grace=0))
        self.stopped.update(lease.token for lease in held)
        for lease in self.leases:
            if lease._locks is old.locks:
                assert not lease.held, f"lease {lease.name}#{lease.token} believes itself held after its engine stopped"
        if acquiring is not None:
            self.run(asyncio.wait({acquiring}))
            got = None if acquiring.cancelled() or acquiring.exception() else acquiring.result()
            assert got is None or not got.held, f"an acquire answered after its engine stopped holds {got}"
            if got is not None:
                self.leases.append(got)
            if taken and taken[0] is not None:
                self.highest[name] = max(self.highest.get(name, 0), taken[0].token)
                self.stopped.add(taken[0].token)
        instance = old.instance
        for lock in self.run(cast(LockStore, self.engines[1 - engine].store).list_locks(self.clock.now())).locks:
            assert not (lock.holder == instance and lock.state(self.clock.now()) == "held"), (
                f"lock {lock.name!r} (token {lock.token}) is held by {instance} after it stopped"
            )
        self.engines[engine] = again = self._engine(instance)
        self.run(again.open())

    @invariant()
    def at_most_one_lease_per_name_believes_itself_held(self) -> None:
        now = self.clock.now()
        for name in NAMES:
            believers = [lease for lease in self.leases if lease.name == name and lease.held]
            held = [lease for lease in believers if lease.token not in self.evicted]
            assert len(held) <= 1, held
            for lease in believers:
                # (the lease clock of an engine on an injected clock: its time, in nanoseconds)
                lease_now = (now - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000
                assert lease_now < lease.deadline, "a lease is lost by its deadline at the latest"
                if lease.token in self.evicted and id(lease._locks) not in self.frozen:
                    assert lease_now < lease.renewed_at + LeaseClock.span(lease.ttl) // 3, (
                        "an evicted holder learns it at its next renewal"
                    )
            for lease in self.leases:
                if lease.name != name or not lease.lost.is_set() or lease.token in self.evicted | self.stopped:
                    continue
                assert id(lease._locks) in self.frozen, "lost without a cause"
            if held:
                lock = self.run(cast(LockStore, self.engines[0].store).get_lock(name))
                assert lock is not None and lock.token == held[0].token and lock.state(self.clock.now()) == "held"

    @invariant()
    def a_holder_whose_lease_was_released_never_reports_success(self) -> None:
        for work in self.works:
            if work.task.done() and work.lease is not None and work.lease.token in self.evicted | self.stopped:
                result = work.task.result()
                assert isinstance(result.error, (LeaseLost, StaleLease)), (
                    f"with_lock reported {result} after its lease (token {work.lease.token}) was released by force "
                    "or by its engine's stop"
                )

    @invariant()
    def a_locked_run_whose_lease_was_released_never_succeeds(self) -> None:
        for run in self.locked_runs:
            if run.ended.done() and run.lease.token in self.evicted | self.stopped:
                ended = run.ended.result()
                assert ended.status == "failed" and ended.error_tag in ("lease_lost", "interrupted"), (
                    f"locked run {run.id} was recorded {ended.status} ({ended.error_tag}) after its lease "
                    f"(token {run.lease.token}) was released by force or by its engine's stop"
                )

    @invariant()
    def a_lock_nobody_knows_it_holds_is_given_back_within_a_round(self) -> None:
        now = self.clock.now()
        for name, token, when in self.unanswered:
            if now >= when + timedelta(seconds=1):
                lock = self.run(cast(LockStore, self.engines[0].store).get_lock(name))
                assert lock is not None
                assert lock.token != token or lock.holder is None, (
                    f"lock {name!r} (token {token}) taken by an acquire whose answer was lost is still held at {now}"
                )

    @invariant()
    def a_stale_lease_never_writes(self) -> None:
        assert not [token for token, evicted in self.writes if evicted], "a lease released by force (or a stop) wrote"
        tokens = [token for token, _ in self.writes]
        assert tokens == sorted(tokens), "a fenced write was accepted after a newer token's"


def test_leases_keep_their_invariants_with_renewals_freezes_and_forced_releases() -> None:
    run_state_machine_as_test(LeaseMachine, settings=SETTINGS)
