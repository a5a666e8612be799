"""Locks: the lock table on both stores, leases on the injected clock, locked schedules,
the synchronous twin, and the invariants under random sequences (Hypothesis).

The lock clock is the injected one here (an engine on a ManualClock hands the store its
time), so expiry is exact and nothing waits for real time."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from backend import (
    BadInput,
    DefinitionError,
    Engine,
    LeaseLost,
    LockNotAcquired,
    ManualClock,
    NotFound,
    StaleLease,
    Unavailable,
    connect,
    connect_sync,
    define_schedule,
)
from backend.clock import OffsetClock
from backend.locks import Lease, Lock, LockStore
from backend.scheduler import lifecycle
from backend.schedules import RunContext
from backend.store import Store, open_store
from tests import pg
from tests.conftest import all_runs
from tests.odd_exceptions import StrAndReprRaise, Unreadable

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
TTL = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def lock_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An open store of either kind (the lock methods are what these tests use)."""
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        store: Store = open_store(pg.database_for(tmp_path))
    else:
        store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    yield store
    await store.close()


async def stored_lock(store: Store | LockStore, name: str) -> Lock:
    """The lock table's row of ``name`` (there is one: the lock was taken)."""
    lock = await cast(LockStore, store).get_lock(name)
    assert lock is not None
    return lock


def fence_conn(store: Any, tmp_path: Path) -> Any:
    """A connection of the caller's own to the store's database, in autocommit-free mode."""
    if store.kind == "sqlite":
        return sqlite3.connect(str(tmp_path / "state.db"), isolation_level=None)
    return psycopg.connect(store.url)


def fence(store: Any, conn: Any, resource: str, name: str, token: int, now: datetime) -> str | None:
    """One fenced write in its own transaction: the fence, then commit (roll back if refused)."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
        why: str | None = store.fence_on_sync(conn, resource, name, token, now)
        conn.execute("ROLLBACK" if why else "COMMIT")
        return why
    with conn.transaction():
        why = store.fence_on_sync(conn, resource, name, token, now)
    return why


# ---------------------------------------------------------------------------------------
# the lock table, on both stores
# ---------------------------------------------------------------------------------------
async def test_one_holder_until_expiry_then_a_greater_token(lock_store: LockStore) -> None:
    first = await lock_store.acquire_lock("rollup", "a", TTL, at(0))
    assert first is not None and first.token >= 1 and first.holder == "a"
    assert first.expires_at == at(30)
    assert await lock_store.acquire_lock("rollup", "b", TTL, at(29.999)) is None  # held: refused at once
    other = await lock_store.acquire_lock("other", "b", TTL, at(1))  # another name is another lock
    assert other is not None
    second = await lock_store.acquire_lock("rollup", "b", TTL, at(30))  # expired: taken over
    assert second is not None and second.token > first.token and second.holder == "b"
    # The old holder can neither renew nor release what is no longer its lease.
    assert await lock_store.renew_lock("rollup", first.token, TTL, at(31)) is None
    assert not await lock_store.release_lock("rollup", first.token, at(31))
    taken = await lock_store.get_lock("rollup")
    assert taken is not None and taken.holder == "b"


async def test_renewal_only_for_the_current_token_before_expiry(lock_store: LockStore) -> None:
    lease = await lock_store.acquire_lock("sync", "a", TTL, at(0))
    assert lease is not None
    assert await lock_store.renew_lock("sync", lease.token, TTL, at(10)) == at(40)
    assert await lock_store.renew_lock("sync", lease.token + 1, TTL, at(11)) is None
    assert await lock_store.renew_lock("sync", lease.token, TTL, at(40)) is None  # expired at 40: too late
    snapshot = await lock_store.list_locks(at(41))
    assert snapshot.now == at(41)
    [lock] = snapshot.locks
    assert (lock.renewed_at, lock.expires_at, lock.state(snapshot.now)) == (at(10), at(40), "expired")


async def test_release_keeps_the_row_and_the_next_token_is_greater(lock_store: LockStore) -> None:
    first = await lock_store.acquire_lock("x", "a", TTL, at(0))
    assert first is not None
    assert await lock_store.release_lock("x", first.token, at(5))
    assert not await lock_store.release_lock("x", first.token, at(5))  # once
    [lock] = (await lock_store.list_locks(at(5))).locks
    assert (lock.holder, lock.token, lock.state(at(5))) == (None, first.token, "free")
    assert await lock_store.renew_lock("x", first.token, TTL, at(6)) is None  # released: no renewal
    second = await lock_store.acquire_lock("x", "b", TTL, at(6))
    assert second is not None and second.token > first.token


async def test_a_released_lock_is_free_to_a_clock_that_stepped_back(lock_store: LockStore) -> None:
    """The release sets the expiry to its own time; the acquire looked only at the expiry,
    so a clock stepped back (NTP, a VM restored) found a lock listed as free taken."""
    first = await lock_store.acquire_lock("x", "a", TTL, at(0))
    assert first is not None and await lock_store.release_lock("x", first.token, at(20))
    second = await lock_store.acquire_lock("x", "b", TTL, at(10))  # 10 s before the release
    assert second is not None and second.token > first.token and second.expires_at == at(40)
    assert await lock_store.acquire_lock("x", "c", TTL, at(5)) is None  # and held again: refused


async def test_a_forced_release_frees_the_lock_and_stales_its_holder(lock_store: LockStore, tmp_path: Path) -> None:
    held = await lock_store.acquire_lock("x", "a", TTL, at(0))
    assert held is not None
    done = await lock_store.force_release_lock("x", at(1))
    assert done is not None and done.released and done.lock.holder == "a" and done.lock.token == held.token
    assert await lock_store.renew_lock("x", held.token, TTL, at(2)) is None
    conn = fence_conn(lock_store, tmp_path)
    try:
        assert fence(lock_store, conn, "table:t", "x", held.token, at(2)) == "the lease expired or was released"
    finally:
        conn.close()
    again = await lock_store.force_release_lock("x", at(2))
    assert again is not None and not again.released
    assert await lock_store.force_release_lock("never", at(2)) is None
    nxt = await lock_store.acquire_lock("x", "b", TTL, at(2))
    assert nxt is not None and nxt.token > held.token


async def test_a_fence_refuses_a_token_older_than_one_seen_and_a_lease_no_longer_current(
    lock_store: LockStore, tmp_path: Path
) -> None:
    conn = fence_conn(lock_store, tmp_path)
    try:
        old = await lock_store.acquire_lock("acct", "a", TTL, at(0))
        assert old is not None
        assert fence(lock_store, conn, "acct:42", "acct", old.token, at(1)) is None
        assert fence(lock_store, conn, "acct:42", "acct", old.token, at(2)) is None  # the same holder again
        # Expired, nobody took it yet: the lease is not current any more.
        assert fence(lock_store, conn, "acct:42", "acct", old.token, at(30)) == "the lease expired or was released"
        new = await lock_store.acquire_lock("acct", "b", TTL, at(31))
        assert new is not None
        assert fence(lock_store, conn, "acct:42", "acct", old.token, at(32)) == (
            f"the lock was taken over since (token {new.token})"
        )
        assert fence(lock_store, conn, "acct:42", "acct", new.token, at(33)) is None
        # Even a lease that is current again under a later lock cannot go below what the
        # resource has seen (another lock's holder wrote there with a greater token).
        assert fence(lock_store, conn, "acct:43", "acct", new.token, at(33)) is None
        third = await lock_store.acquire_lock("other", "c", TTL, at(34))
        assert third is not None and third.token > new.token
        assert fence(lock_store, conn, "acct:43", "other", third.token, at(34)) is None
        assert fence(lock_store, conn, "acct:43", "acct", new.token, at(35)) == (
            f"token {third.token} has already written to it"
        )
    finally:
        conn.close()


async def test_a_give_back_frees_only_the_lease_taken_with_its_claim(lock_store: LockStore) -> None:
    """For an acquire whose answer was lost: what it took, and nothing else, is freed."""
    first = await lock_store.acquire_lock("x", "a", TTL, at(0), "claim-1")
    assert first is not None
    assert not await lock_store.give_back_lock("x", "claim-2", at(1))  # another claim: not this lease
    assert (await stored_lock(lock_store, "x")).holder == "a"
    assert await lock_store.give_back_lock("x", "claim-1", at(1))
    assert not await lock_store.give_back_lock("x", "claim-1", at(1))  # once
    [lock] = (await lock_store.list_locks(at(1))).locks
    assert (lock.holder, lock.token, lock.state(at(1))) == (None, first.token, "free")
    # The next holder's lease is never given back under an older claim, nor one taken
    # without a claim (its acquire clears the claim it finds on the row).
    second = await lock_store.acquire_lock("x", "b", TTL, at(2), "claim-3")
    assert second is not None and second.token > first.token
    assert not await lock_store.give_back_lock("x", "claim-1", at(3))
    assert await lock_store.release_lock("x", second.token, at(4))
    third = await lock_store.acquire_lock("x", "c", TTL, at(5))
    assert third is not None
    assert not await lock_store.give_back_lock("x", "claim-3", at(6))
    assert (await stored_lock(lock_store, "x")).holder == "c"
    # A lease given back is a stale one: it neither renews nor fences.
    fourth = await lock_store.acquire_lock("y", "d", TTL, at(7), "claim-4")
    assert fourth is not None and await lock_store.give_back_lock("y", "claim-4", at(8))
    assert await lock_store.renew_lock("y", fourth.token, TTL, at(9)) is None


# ---------------------------------------------------------------------------------------
# leases on an engine's injected clock
# ---------------------------------------------------------------------------------------
async def engines_on(clock: ManualClock, url: str) -> AsyncIterator[Callable[..., Engine]]:
    """Build engines (i0, i1, …) on the test clock sharing the store at ``url``; every one
    is stopped at the end."""
    made: list[Engine] = []

    def make(schedules: list[Any] | None = None, **kwargs: Any) -> Engine:
        kwargs.setdefault("instance", f"i{len(made)}")
        engine = Engine(schedules or [], url, clock=clock, shutdown_grace=0, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.stop(grace=0)


@pytest.fixture
async def engines(clock: ManualClock, store_url: str) -> AsyncIterator[Callable[..., Engine]]:
    async for make in engines_on(clock, store_url):
        yield make


async def test_a_lease_renews_every_third_of_its_ttl_and_is_released(clock: ManualClock, engines: Callable[..., Engine]) -> None:
    engine = engines()
    await engine.open()
    lease = await engine.locks.acquire("nightly", ttl=30)
    assert lease is not None and lease.held and lease.expires_at == clock.now() + TTL
    for step in range(1, 7):  # a minute: six renewals, each 10 s after the previous
        clock.advance(10)
        await engine.quiesce()
        assert lease.expires_at == clock.now() + TTL, step
    lock = await stored_lock(engine.store, "nightly")
    assert lock.renewed_at == clock.now() and lock.holder == engine.instance
    await lease.release()
    assert not lease.held
    assert (await stored_lock(engine.store, "nightly")).holder is None


async def test_a_renewal_due_between_two_microseconds_waits_for_the_clock_and_never_spins(
    clock: ManualClock, engines: Callable[..., Engine]
) -> None:
    """A third of a 7 s ttl is no whole number of microseconds. Measured in float seconds,
    the clock moved by that third (rounded to the microsecond) read a few hundred
    nanoseconds short of the renewal; the loop parked for what was left, which a timedelta
    rounds to nothing, woke at once and looked again, for ever: the engine never settled."""
    engine = engines()
    await engine.open()
    lease = await engine.locks.acquire("nightly", ttl=7)
    assert lease is not None
    clock.advance(timedelta(seconds=7 / 3))  # (2.333333 s)
    await asyncio.wait_for(engine.quiesce(), 10)
    clock.advance(timedelta(microseconds=1))
    await asyncio.wait_for(engine.quiesce(), 10)
    assert lease.held and lease.expires_at == clock.now() + timedelta(seconds=7)  # renewed


async def test_a_lease_that_cannot_be_renewed_is_lost_at_its_deadline_and_async_work_is_cancelled(
    clock: ManualClock, engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engines()
    await engine.open()
    started = asyncio.Event()
    finished: list[str] = []

    async def work(lease: Lease) -> str:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        finished.append("never")
        return "done"

    async def unreachable(*args: Any) -> None:
        raise Unavailable("the store is down")

    task = asyncio.ensure_future(engine.locks.with_lock("rollup", work, ttl=30))
    await started.wait()
    monkeypatch.setattr(engine.store, "renew_lock", unreachable)
    clock.advance(29)  # renewals fail, and are retried, until the deadline
    await engine.quiesce()
    assert not task.done()
    clock.advance(1)
    result = await task
    assert result.acquired and result.value is None and finished == []
    assert isinstance(result.error, LeaseLost) and "not renewed before it expired" in str(result.error)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_step_back_of_the_holders_wall_clock_holds_no_renewal_back(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """NTP steps the holder's clock back a minute (a real clock: the step is the fault). Its
    renewals go on every third of the ttl, measured on a clock that never jumps: nobody
    else takes the lock, and the work under it ends held. (Measured on the wall clock, the
    next renewal waited a minute, the lease expired in the store after its ttl, another
    process took the lock with the next token, and the first still believed it held.)"""
    if kind == "postgres":
        request.getfixturevalue("pg_server")
    url = pg.database_for(tmp_path) if kind == "postgres" else f"sqlite:///{tmp_path / 'state.db'}"
    stepped = OffsetClock(0)
    holder = Engine([], url, instance="holder", clock=stepped, shutdown_grace=0)
    other = Engine([], url, instance="other", shutdown_grace=0)
    await holder.open()
    await other.open()
    try:
        ttl = 1.5
        lease = await holder.locks.acquire("nightly", ttl=ttl)
        assert lease is not None
        stepped.offset = timedelta(seconds=-60)
        end = time.monotonic() + 3 * ttl  # past the ttl three times over: renewals had to go on
        while time.monotonic() < end:
            assert await other.locks.acquire("nightly", ttl=ttl) is None, "another process took a held lock"
            assert lease.held, lease.lost_reason
            await asyncio.sleep(ttl / 6)
        await lease.release()
        assert not lease.lost.is_set(), lease.lost_reason
    finally:
        await holder.stop(grace=0)
        await other.stop(grace=0)


async def test_a_lock_whose_answer_comes_after_its_ttl_ran_out_is_not_taken_and_no_work_runs(
    clock: ManualClock, engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store took the lock, but its answer came back after the ttl (a partition that
    healed, a process frozen meanwhile): another holder may have it by now."""
    engine, other = engines(), engines()
    await engine.open()
    await other.open()
    acquire = cast(LockStore, engine.store).acquire_lock

    async def late_answer(*args: Any) -> Any:
        lock = await acquire(*args)
        clock.advance(31)  # the answer, on its way past the ttl
        return lock

    monkeypatch.setattr(engine.store, "acquire_lock", late_answer)
    ran: list[str] = []
    result = await engine.locks.with_lock("rollup", lambda lease: ran.append("ran"), ttl=30)
    assert not result.acquired and ran == []
    assert (await stored_lock(engine.store, "rollup")).holder is None
    monkeypatch.undo()
    taken = await other.locks.acquire("rollup", ttl=30)
    assert taken is not None and taken.held


class LoseAcquireAnswers:
    """The store's acquire commits, then its answer is lost (the connection breaks on the
    way back): ``calls`` times, then every acquire answers again."""

    def __init__(self, store: Any, calls: int = 1) -> None:
        self.acquire = store.acquire_lock
        self.left = calls
        self.taken: list[Lock | None] = []

    async def __call__(self, *args: Any) -> Lock | None:
        lock: Lock | None = await self.acquire(*args)
        if self.left <= 0:
            return lock
        self.left -= 1
        self.taken.append(lock)
        raise Unavailable("the connection broke before the answer came back (test)")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def fleet(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Callable[..., Engine]]:
    """Engines on the test clock sharing one store of either kind."""
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        url = pg.database_for(tmp_path)
    else:
        url = f"sqlite:///{tmp_path / 'state.db'}"
    async for make in engines_on(clock, url):
        yield make


async def test_a_lock_taken_by_an_acquire_whose_answer_was_lost_is_given_back_at_the_next_round(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acquire raises Unavailable, as the caller cannot know better; the lock it took
    all the same is free again a housekeeping round later, not at the end of its ttl."""
    engine, other = fleet(), fleet()
    await engine.start()
    await other.open()
    lost = LoseAcquireAnswers(engine.store)
    monkeypatch.setattr(engine.store, "acquire_lock", lost)
    ran: list[str] = []
    with pytest.raises(Unavailable, match="before the answer came back"):
        await engine.locks.with_lock("rollup", lambda lease: ran.append("ran"), ttl=300)
    [taken] = lost.taken
    assert taken is not None and ran == []
    assert await other.locks.acquire("rollup") is None  # held, by nobody who knows it
    clock.advance(1)  # one housekeeping round
    await engine.quiesce()
    assert (await stored_lock(engine.store, "rollup")).holder is None
    lease = await other.locks.acquire("rollup")
    assert lease is not None and lease.token > taken.token
    clock.advance(1)  # the claim was forgotten once answered: the new holder keeps its lease
    await engine.quiesce()
    await other.quiesce()
    assert lease.held and (await stored_lock(engine.store, "rollup")).holder == "i1"


async def test_the_next_acquire_of_the_name_gives_back_what_an_unanswered_one_took_first(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No housekeeping round between them (the engine is only opened): the retry itself
    frees what the lost acquire took, and takes the lock."""
    engine = fleet()
    await engine.open()
    lost = LoseAcquireAnswers(engine.store)
    monkeypatch.setattr(engine.store, "acquire_lock", lost)
    with pytest.raises(Unavailable):
        await engine.locks.acquire("rollup")
    lease = await engine.locks.acquire("rollup")
    [taken] = lost.taken
    assert lease is not None and taken is not None and lease.token > taken.token


async def test_a_give_back_that_fails_is_tried_again_until_the_ttl_and_at_the_stop(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, other = fleet(), fleet()
    await engine.start()
    await other.open()
    monkeypatch.setattr(engine.store, "acquire_lock", LoseAcquireAnswers(engine.store, calls=2))
    give_back = cast(LockStore, engine.store).give_back_lock
    down = True

    async def maybe_down(*args: Any) -> bool:
        if down:
            raise Unavailable("still down (test)")
        result: bool = await give_back(*args)
        return result

    monkeypatch.setattr(engine.store, "give_back_lock", maybe_down)
    for name in ("short", "long"):
        with pytest.raises(Unavailable):
            await engine.locks.acquire(name, ttl=5 if name == "short" else 300)
    clock.advance(5)  # five rounds fail; the short lease has run out by itself meanwhile
    await engine.quiesce()
    assert (await stored_lock(engine.store, "long")).holder == "i0"
    assert await other.locks.acquire("short") is not None
    down = False
    await engine.stop(grace=0)  # the stop gives back what is left
    assert (await stored_lock(other.store, "long")).holder is None
    assert (await stored_lock(other.store, "short")).holder == "i1"  # the short one's claim was forgotten


async def test_a_locked_schedule_whose_lock_answer_was_lost_runs_at_its_next_slot(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the lock stayed held for its ttl by nobody, and the schedule skipped its own
    next slots as "locked"."""
    ran: list[datetime] = []
    schedule = define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=lambda ctx: ran.append(ctx.scheduled_at),
                               lock="nightly-rollup", lock_ttl=600)  # fmt: skip
    engine = fleet([schedule])
    await engine.start()
    monkeypatch.setattr(engine.store, "acquire_lock", LoseAcquireAnswers(engine.store))
    for _ in range(3):
        clock.advance(60)
        await engine.quiesce()
    runs = await all_runs(engine, "rollup")
    assert [(r.status, r.error_tag) for r in runs] == [("failed", "unavailable"), ("succeeded", None), ("succeeded", None)]
    assert ran == [at(120), at(180)]
    assert (await stored_lock(engine.store, "nightly-rollup")).holder is None


async def test_quiesce_returns_once_a_locked_runs_lock_is_released(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A locked run's lock is released in the background once the run has ended. The
    engine is not settled while that release is on its way, so a read of the lock after
    ``quiesce`` finds it free (it found it held now and then, on a busy machine)."""
    schedule = define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=lambda ctx: None,
                               lock="nightly-rollup", lock_ttl=600)  # fmt: skip
    engine = fleet([schedule])
    await engine.start()
    release = cast(LockStore, engine.store).release_lock
    asked, go = asyncio.Event(), asyncio.Event()

    async def held_up(*args: Any) -> bool:
        asked.set()
        await go.wait()
        done: bool = await release(*args)
        return done

    monkeypatch.setattr(engine.store, "release_lock", held_up)
    clock.advance(60)
    settled = asyncio.ensure_future(engine.quiesce())
    await asyncio.wait_for(asked.wait(), 10)  # (the timeouts only bound a broken test)
    assert not lifecycle.is_settled(engine), "settled with the run's lock still held"
    go.set()
    await asyncio.wait_for(settled, 10)
    assert [r.status for r in await all_runs(engine, "rollup")] == ["succeeded"]
    assert (await stored_lock(engine.store, "nightly-rollup")).holder is None


@pytest.mark.parametrize("grace", [5, 0])
async def test_a_stop_while_a_locked_runs_lock_is_being_taken_leaves_the_lock_free(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, grace: float
) -> None:
    """A slot fires just before SIGTERM: its run is still taking its lock when the stop
    begins, and the acquire commits. With a grace the run starts and ends within it; without
    one, the acquire is cut short and the run recorded interrupted. Either way the lock is
    free after the stop: before, the acquire was cut short after the stop had given back
    what unanswered acquires took, and the lock stayed held (by nobody who knew it) for its
    whole ttl, every instance's run of the schedule skipped as "locked" meanwhile."""
    ran: list[datetime] = []
    schedule = define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=lambda ctx: ran.append(ctx.scheduled_at),
                               lock="nightly-rollup", lock_ttl=600)  # fmt: skip
    engine = fleet([schedule])
    await engine.start()
    acquire = cast(LockStore, engine.store).acquire_lock
    committed, answer, stopping_locks = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def answers_late(*args: Any) -> Lock | None:
        lock: Lock | None = await acquire(*args)
        committed.set()
        await answer.wait()
        return lock

    stop_locks = engine.locks.stop

    async def stop_locks_seen(grace: float) -> None:
        stopping_locks.set()
        await stop_locks(grace)

    monkeypatch.setattr(engine.store, "acquire_lock", answers_late)
    monkeypatch.setattr(engine.locks, "stop", stop_locks_seen)
    clock.advance(60)
    await asyncio.wait_for(committed.wait(), 10)  # (the timeouts only bound a broken test)
    stopping = asyncio.ensure_future(engine.stop(grace=grace))
    await asyncio.wait_for(stopping_locks.wait(), 10)  # the lock service has begun to stop
    answer.set()
    await asyncio.wait_for(stopping, 10)
    other = fleet()
    await other.open()
    assert (await stored_lock(other.store, "nightly-rollup")).holder is None
    runs = [(r.status, r.error_tag) for r in await all_runs(other, "rollup")]
    if grace:
        assert runs == [("succeeded", None)] and ran == [at(60)]
    else:
        assert runs == [("failed", "interrupted")] and ran == []


async def test_a_stop_that_cuts_short_a_guard_releasing_its_lock_leaves_the_lock_free(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop with no grace interrupts a locked run still taking its lock; the acquire's
    answer comes next, so the guard gives the lock back, and the stop cancels the guard
    while that release is on its way. The release used to be cancelled with it: the lock
    stayed held, by nobody, for its ttl (600 s), every run of the schedule skipped."""
    schedule = define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=lambda ctx: None,
                               lock="nightly-rollup", lock_ttl=600)  # fmt: skip
    engine = fleet([schedule])
    await engine.start()
    store = cast(LockStore, engine.store)
    acquire, release = store.acquire_lock, store.release_lock
    committed, answer, releasing, guard_done = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def answers_late(*args: Any) -> Lock | None:
        lock: Lock | None = await acquire(*args)
        committed.set()
        await answer.wait()
        return lock

    async def releases_once_the_guard_is_gone(*args: Any) -> bool:
        releasing.set()
        await guard_done.wait()
        done: bool = await release(*args)
        return done

    stop_locks = engine.locks.stop

    async def stop_locks_once_releasing(grace: float) -> None:
        for guard in engine.locks._guarding:
            guard.add_done_callback(lambda _: guard_done.set())
        answer.set()  # the acquire's answer arrives as the stop begins: the run is stopped already
        await asyncio.wait_for(releasing.wait(), 10)  # (the timeouts only bound a broken test)
        await stop_locks(grace)

    monkeypatch.setattr(engine.store, "acquire_lock", answers_late)
    monkeypatch.setattr(engine.store, "release_lock", releases_once_the_guard_is_gone)
    monkeypatch.setattr(engine.locks, "stop", stop_locks_once_releasing)
    clock.advance(60)
    await asyncio.wait_for(committed.wait(), 10)
    await asyncio.wait_for(engine.stop(grace=0), 10)
    assert guard_done.is_set()
    other = fleet()
    await other.open()
    assert (await stored_lock(other.store, "nightly-rollup")).holder is None
    assert [(r.status, r.error_tag) for r in await all_runs(other, "rollup")] == [("failed", "interrupted")]


async def test_a_stop_tells_the_work_holding_a_lock_and_takes_no_lock_after_it(
    clock: ManualClock, fleet: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the lease machine. An engine stops while code of the process holds a lock
    (``with_lock``) and while an acquire of another is on its way (committed, its answer
    late). The work ran on unprotected once its renewals stopped, and ``with_lock``
    reported success; the acquire answered after the stop with a lease believed held,
    its lock held by nobody until its ttl. Now the work is cancelled (``LeaseLost``), the
    acquire raises, and both locks are free."""
    engine = fleet()
    await engine.open()
    entered, forever = asyncio.Event(), asyncio.Event()

    async def work(lease: Lease) -> str:
        entered.set()
        await forever.wait()
        return "done"

    holding = asyncio.ensure_future(engine.locks.with_lock("report", work, ttl=60))
    await asyncio.wait_for(entered.wait(), 10)  # (the timeouts only bound a broken test)
    acquire = cast(LockStore, engine.store).acquire_lock
    committed, answer = asyncio.Event(), asyncio.Event()

    async def answers_late(*args: Any) -> Lock | None:
        lock: Lock | None = await acquire(*args)
        committed.set()
        await answer.wait()
        return lock

    monkeypatch.setattr(engine.store, "acquire_lock", answers_late)
    acquiring = asyncio.ensure_future(engine.locks.acquire("export", ttl=60))
    await asyncio.wait_for(committed.wait(), 10)
    stop_locks = engine.locks.stop

    async def answer_once_stopping(grace: float) -> None:
        answer.set()
        await stop_locks(grace)

    monkeypatch.setattr(engine.locks, "stop", answer_once_stopping)
    await asyncio.wait_for(engine.stop(grace=0), 10)
    result = await asyncio.wait_for(holding, 10)
    assert result.acquired and isinstance(result.error, LeaseLost) and "the engine stopped" in str(result.error)
    with pytest.raises(Unavailable, match='lock "export" not taken: the engine stopped while it was being taken'):
        await acquiring
    with pytest.raises(Unavailable, match='lock "export" not taken: the engine has stopped'):
        await engine.locks.acquire("export")
    other = fleet()
    await other.open()
    for name in ("report", "export"):
        assert (await stored_lock(other.store, name)).holder is None, name


async def test_a_lease_taken_from_its_holder_is_lost_at_the_next_renewal(clock: ManualClock, engines: Callable[..., Engine]) -> None:
    holder, operator = engines(), engines()
    await holder.open()
    await operator.open()
    lease = await holder.locks.acquire("rollup", ttl=30)
    assert lease is not None
    done = await operator.locks.release("rollup")
    assert done.released and done.lock.token == lease.token
    with pytest.raises(StaleLease, match="expired or was released"):
        conn = sqlite3.connect(str(holder.store.where), isolation_level=None)
        try:
            await lease.fence(conn, "rollup-table")
        finally:
            conn.close()
    clock.advance(10)
    await holder.quiesce()
    assert lease.lost.is_set() and "no longer current" in (lease.lost_reason or "")
    taker = await operator.locks.acquire("rollup", ttl=30)
    assert taker is not None and taker.token > lease.token


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_with_lock_whose_lock_was_released_by_force_never_reports_success(
    engines: Callable[..., Engine], kind: str
) -> None:
    """Released by force while the work runs, and the work ends before the next renewal
    could notice: the release on exit finds the token no longer current."""
    holder, operator = engines(), engines()
    await holder.open()
    await operator.open()

    async def async_work(lease: Lease) -> str:
        await operator.locks.release("rollup")
        return "done"

    def sync_work(lease: Lease) -> str:
        asyncio.run_coroutine_threadsafe(operator.locks.release("rollup"), loop).result(10)
        return "done"

    loop = asyncio.get_running_loop()
    result = await holder.locks.with_lock("rollup", async_work if kind == "async" else sync_work, ttl=30)
    assert result.acquired and result.value == "done"
    assert isinstance(result.error, LeaseLost) and "released by force" in str(result.error)
    taker = await operator.locks.acquire("rollup", ttl=30)
    assert taker is not None and result.token is not None and taker.token > result.token


async def test_hold_refuses_naming_the_holder_and_cancels_its_block_when_the_lease_is_lost(
    clock: ManualClock, engines: Callable[..., Engine]
) -> None:
    a, b = engines(), engines()
    await a.open()
    await b.open()
    entered = asyncio.Event()

    async def block() -> None:
        async with a.locks.hold("rollup", ttl=30) as lease:
            assert lease.held
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(block())
    await entered.wait()
    with pytest.raises(LockNotAcquired, match=r'lock "rollup" is held by i0 \(token 1\) until 2026-03-02T08:00:30Z'):
        async with b.locks.hold("rollup", ttl=30):
            pass
    await b.locks.release("rollup")
    clock.advance(10)
    with pytest.raises(LeaseLost, match="the block was cancelled"):
        await task
    # The holder's task was not left cancelled: it goes on (here: it ended with LeaseLost).
    assert not task.cancelled()


async def test_hold_whose_lease_is_lost_after_the_last_await_raises_at_the_end(
    clock: ManualClock, engines: Callable[..., Engine]
) -> None:
    a = engines()
    await a.open()
    with pytest.raises(LeaseLost, match="while the block ran"):
        async with a.locks.hold("x", ttl=30) as lease:
            a.locks._lose(lease, "simulated")  # lost with no await left in the block
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending on this task


async def test_an_outside_cancellation_of_a_holder_is_not_taken_for_a_lost_lease(engines: Callable[..., Engine]) -> None:
    a = engines()
    await a.open()
    entered = asyncio.Event()

    async def block() -> None:
        async with a.locks.hold("x", ttl=30):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(block())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await stored_lock(a.store, "x")).holder is None


async def test_with_lock_returns_value_or_error_and_never_overlaps(engines: Callable[..., Engine]) -> None:
    a = engines()
    await a.open()
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def slow(lease: Lease) -> int:
        inside.set()
        await leave.wait()
        return lease.token

    first = asyncio.ensure_future(a.locks.with_lock("rollup", slow, ttl=30))
    await inside.wait()
    second = await a.locks.with_lock("rollup", slow, ttl=30)
    assert (second.acquired, second.value, second.error) == (False, None, None)
    leave.set()
    result = await first
    assert (result.acquired, result.value, result.error) == (True, result.token, None)

    def boom(lease: Lease) -> None:
        raise RuntimeError("partner API down")

    failed = await a.locks.with_lock("rollup", boom, ttl=30)
    assert failed.acquired and isinstance(failed.error, RuntimeError)
    assert failed.token is not None and result.token is not None and failed.token > result.token
    threaded = await a.locks.with_lock("rollup", lambda lease: lease.token, ttl=30)
    assert threaded.value == threaded.token

    def odd(lease: Lease) -> None:  # what it raises is handed back, never described (str() raises)
        raise StrAndReprRaise()

    async def odd_async(lease: Lease) -> None:
        raise Unreadable()

    for work, raised in ((odd, StrAndReprRaise), (odd_async, Unreadable)):
        result = await a.locks.with_lock("rollup", work, ttl=30)
        assert result.acquired and type(result.error) is raised
        assert (await stored_lock(a.store, "rollup")).holder is None


RAISED_BY_WORK = [SystemExit(7), KeyboardInterrupt(), GeneratorExit()]


@pytest.mark.parametrize(
    ("sync", "exc"),
    [(False, exc) for exc in RAISED_BY_WORK] + [(True, exc) for exc in [*RAISED_BY_WORK, StopIteration()]],
    ids=lambda v: repr(v),
)  # (a coroutine cannot raise StopIteration: PEP 479 makes it a RuntimeError)
async def test_whatever_with_lock_work_raises_is_returned_never_raised_and_the_lock_is_free(
    engines: Callable[..., Engine], sync: bool, exc: BaseException
) -> None:
    """Async work raising SystemExit or KeyboardInterrupt ran in a task of its own: asyncio
    raised it out of the event loop, and the process ended. Sync work raising StopIteration
    (``next()`` on an empty iterator) never returned: a future refuses it, so the lock stayed
    held and renewed for as long as the process lived. Both are the work's error now."""
    a = engines()
    await a.open()

    def work(lease: Lease) -> None:
        raise exc

    async def work_async(lease: Lease) -> None:
        raise exc

    result = await asyncio.wait_for(a.locks.with_lock("rollup", work if sync else work_async, ttl=30), 10)
    assert result.acquired and result.error is exc and result.value is None
    assert (await stored_lock(a.store, "rollup")).holder is None
    again = await a.locks.with_lock("rollup", lambda lease: "next", ttl=30)
    assert (again.acquired, again.value, again.error) == (True, "next", None)


async def test_a_forced_release_is_audited_and_every_change_is_signalled(engines: Callable[..., Engine]) -> None:
    holder, operator = engines(), engines(actor="alice")
    await holder.open()
    await operator.open()
    inbox = holder.events.subscribe()
    lease = await holder.locks.acquire("rollup", ttl=30)
    assert lease is not None
    assert ("locks", "rollup") in [(s.topic, s.name) for s in await inbox.get(1)]
    await operator.locks.release("rollup")
    [entry] = (await operator.audit.list()).entries
    assert (entry.actor, entry.action, entry.target) == ("alice", "lock.release", "rollup")
    assert entry.detail == {"released": True, "holder": holder.instance, "token": lease.token}
    await lease.release()
    assert ("locks", "rollup") in [(s.topic, s.name) for s in await inbox.get(1)]


@pytest.mark.parametrize("ttl", [0, -1, 1e-7, 0.05, timedelta(microseconds=1), 86_401, "60", True, float("nan")])
async def test_bad_ttls_and_names_are_refused_naming_the_value(engines: Callable[..., Engine], ttl: Any) -> None:
    a = engines()
    await a.open()
    with pytest.raises(BadInput, match=re.escape(f"lock ttl {ttl!r}")):
        await a.locks.acquire("x", ttl=ttl)
    with pytest.raises(BadInput, match="invalid lock name 'a b'"):
        await a.locks.acquire("a b")
    with pytest.raises(NotFound, match='no lock named "never"'):
        await a.locks.release("never")


@pytest.mark.parametrize(
    ("name", "shown"),
    [("a" * 10_000, "'" + "a" * 79 + "… (10000 characters)"), ("\u00e9", "'\\xe9'"), ("e\u0301", "'e\\u0301'"),
     ("\ud800", "'\\ud800'"), ("a\x00b", "'a\\x00b'"), ("a\x1b[2Jb", "'a\\x1b[2Jb'")],
    ids=["long", "e-acute", "e-combining", "surrogate", "nul", "escape"],
)  # fmt: skip
async def test_a_bad_lock_name_is_quoted_on_one_short_line_each_character_told_apart(
    engines: Callable[..., Engine], name: str, shown: str
) -> None:
    """A name of 10,000 characters was echoed whole (the API's 422, the command line's one
    line of 10,000 characters); "é" was said to be no letter, and written as an e and a
    combining accent it looked the same as that, and as the letter typed."""
    a = engines()
    await a.open()
    for refuse in (a.locks.acquire, a.locks.release):
        with pytest.raises(BadInput) as refused:
            await refuse(name)
        message = refused.value.message
        assert message == f"invalid lock name {shown} (1-200 characters of ASCII letters, digits and _ . : / @ -)"
        assert message.replace("…", "").isascii() and message.isprintable() and len(message) < 200


async def test_the_cluster_coordinations_lock_names_are_refused_to_applications(engines: Callable[..., Engine]) -> None:
    """``cluster:shard:NN`` held by an application stopped every schedule of that shard from
    firing (the member took it for another's), and the coordinator gave back a
    ``cluster:…`` lock of the application held under its instance's name. Taking one is
    refused; such a lock is still read and released like any other."""
    a = engines()
    await a.open()
    for name in ("cluster:shard:13", "cluster:member:a", "cluster:mine"):
        with pytest.raises(BadInput, match=f'lock name "{name}" is reserved: names beginning "cluster:"'):
            await a.locks.acquire(name)
        with pytest.raises(DefinitionError, match=f'lock name "{name}" is reserved'):
            define_schedule(name="x", cron="* * * * *", timezone="UTC", handler=lambda ctx: None, lock=name)
    assert await a.locks.acquire("clusters:x") is not None  # (only the prefix itself)
    for nobody in ("", "   "):  # (a lock held by a holder no one can name)
        with pytest.raises(BadInput, match=f"holder {nobody!r} is empty"):
            await a.locks.acquire("y", holder=nobody)
    with pytest.raises(NotFound, match='no lock named "cluster:shard:13"'):  # released like any other
        await a.locks.release("cluster:shard:13")


# ---------------------------------------------------------------------------------------
# schedules defined with lock=
# ---------------------------------------------------------------------------------------
async def test_a_plain_def_handler_takes_locks_through_ctx_locks_sync_on_its_thread(
    clock: ManualClock, engines: Callable[..., Engine]
) -> None:
    """On a handler's thread the lock is taken, held (renewed on the engine's loop) and
    released by blocking calls; on the loop itself the blocking form is refused, naming
    the awaitable one (it would wait on the loop that must do the work)."""
    seen: list[Any] = []

    def rollup(ctx: RunContext) -> None:
        assert ctx.locks is not None
        locks = ctx.locks.sync
        seen.append(threading.current_thread() is not threading.main_thread())
        result = locks.with_lock("rollup", lambda lease: (lease.token, lease.held))
        seen.append((result.acquired, result.value))
        lease = locks.acquire("rollup", ttl=30)
        assert lease is not None
        seen.append(([lock.holder for lock in locks.list().locks], lease.token))
        lease.release()
        seen.append(lease.held)

    engine = engines([define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=rollup)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    assert [(r.status, r.error_message) for r in await all_runs(engine, "rollup")] == [("succeeded", None)]
    assert seen == [True, (True, (1, True)), (["i0"], 2), False]
    assert (await stored_lock(engine.store, "rollup")).holder is None
    with pytest.raises(RuntimeError, match="await ctx.locks"):
        engine.locks.sync.acquire("rollup")


async def test_a_locked_schedule_runs_holding_its_lock_and_skips_a_slot_when_it_is_held(
    clock: ManualClock, engines: Callable[..., Engine]
) -> None:
    seen: list[tuple[int, str | None]] = []

    async def rollup(ctx: RunContext) -> None:
        assert ctx.lease is not None and ctx.locks is not None
        seen.append((ctx.lease.token, (await ctx.locks.list()).locks[0].holder))

    schedule = define_schedule(name="rollup", cron="* * * * *", timezone="UTC", handler=rollup, lock="nightly-rollup")
    engine = engines([schedule])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    assert seen == [(1, "i0 (rollup)")]
    assert (await stored_lock(engine.store, "nightly-rollup")).holder is None

    other = engines()
    await other.open()
    held = await other.locks.acquire("nightly-rollup", ttl=300)
    assert held is not None
    clock.advance(60)
    await engine.quiesce()
    runs = await all_runs(engine, "rollup")
    assert [(r.status, r.error_tag) for r in runs] == [("succeeded", None), ("skipped", "locked")]
    assert runs[1].error_message == (
        f'not started: lock "nightly-rollup" is held by i1 (token {held.token}) until 2026-03-02T08:06:00Z'
    )
    await held.release()
    clock.advance(60)
    await engine.quiesce()
    assert len(seen) == 2 and seen[1][0] > held.token


async def test_a_locked_run_whose_lease_is_lost_is_recorded_and_cancelled(clock: ManualClock, engines: Callable[..., Engine]) -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def long(ctx: RunContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    schedule = define_schedule(name="long", cron="0 * * * *", timezone="UTC", handler=long, lock="l", lock_ttl=30)
    engine, operator = engines([schedule]), engines()
    await engine.open()
    await operator.open()
    run = await engine.run_now("long")
    await started.wait()
    await operator.locks.release("l")
    clock.advance(10)
    await engine.quiesce()
    [closed] = await all_runs(engine, "long")
    assert closed.id == run.id and (closed.status, closed.error_tag) == ("failed", "lease_lost")
    assert "no longer current" in (closed.error_message or "") and cancelled == [True]


@pytest.mark.parametrize("sync", [False, True])
async def test_a_locked_run_that_ends_after_its_lock_was_released_by_force_is_never_a_success(
    clock: ManualClock, engines: Callable[..., Engine], sync: bool
) -> None:
    """The handler returns after an operator released its lock, before a renewal could
    notice: the release at the end is the last check, as ``with_lock``'s. Before, the run
    was recorded ``succeeded``, its work done under a lock another holder could have had."""
    entered, finish, finish_async = threading.Event(), threading.Event(), asyncio.Event()

    def work(ctx: RunContext) -> None:
        entered.set()
        assert finish.wait(10)  # (the timeout only bounds a broken test)

    async def work_async(ctx: RunContext) -> None:
        entered.set()
        await finish_async.wait()

    schedule = define_schedule(name="long", cron="0 * * * *", timezone="UTC", handler=work if sync else work_async,
                               lock="l", lock_ttl=30)  # fmt: skip
    engine, operator = engines([schedule]), engines()
    await engine.open()
    await operator.open()
    run = await engine.run_now("long")
    await asyncio.to_thread(entered.wait, 10)
    released = await operator.locks.release("l")
    assert released.released
    taken = await operator.locks.acquire("l", ttl=30)  # the next holder, meanwhile
    assert taken is not None
    finish.set()
    finish_async.set()
    closed = await engine.wait_run(run.id)
    assert (closed.status, closed.error_tag) == ("failed", "lease_lost")
    assert closed.error_message == (
        f'the lease of lock "l" (token {released.lock.token}) was lost: token {released.lock.token} was no longer '
        "current when it was released (released by force, or taken over)"
    )
    assert [r.status for r in await all_runs(engine, "long")] == ["failed"]
    await engine.quiesce()
    assert (await stored_lock(engine.store, "l")).token == taken.token  # the new holder's, untouched


def test_define_schedule_checks_its_lock() -> None:
    with pytest.raises(DefinitionError, match=r"define_schedule\('x'\): invalid lock name 'a b'"):
        define_schedule(name="x", cron="* * * * *", timezone="UTC", handler=lambda ctx: None, lock="a b")
    with pytest.raises(DefinitionError, match="lock ttl 0"):
        define_schedule(name="x", cron="* * * * *", timezone="UTC", handler=lambda ctx: None, lock="ok", lock_ttl=0)


# ---------------------------------------------------------------------------------------
# connect() and its synchronous twin
# ---------------------------------------------------------------------------------------
async def test_connect_exposes_the_locks_and_releases_what_is_held_on_exit(store_url: str) -> None:
    async with connect(store_url, create=True) as st:
        lease = await st.locks.acquire("x", ttl=60)
        assert lease is not None
        async with connect(store_url) as other:
            assert (await other.locks.with_lock("x", lambda lease: 1)).acquired is False
    async with connect(store_url) as st:
        [lock] = (await st.locks.list()).locks
        assert lock.holder is None and lock.token == lease.token


def test_the_synchronous_twin_holds_fences_and_reports(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with connect_sync(url, create=True) as st:
        result = st.locks.with_lock("x", lambda lease: lease.token * 2, ttl=60)
        assert result.acquired and result.token is not None and result.value == 2 * result.token
        # Released by force inside the block: its end says so (LeaseLost), before any renewal.
        with pytest.raises(LeaseLost, match="was lost while the block ran: .*released by force"):
            with st.locks.hold("x", ttl=60) as lease:
                assert lease.held and not lease.lost.is_set()
                assert st.locks.with_lock("x", lambda lease: None).acquired is False
                with pytest.raises(LockNotAcquired, match='lock "x" is held by'):
                    with st.locks.hold("x"):
                        pass
                conn = sqlite3.connect(str(tmp_path / "state.db"), isolation_level=None)
                conn.execute("BEGIN")
                lease.fence(conn, "report")
                conn.execute("COMMIT")
                st.locks.release("x")  # an operator, by force
                conn.execute("BEGIN")
                with pytest.raises(StaleLease, match="expired or was released"):
                    lease.fence(conn, "report")
                conn.execute("ROLLBACK")
                conn.close()
        assert lease.lost.is_set()
        snapshot = st.locks.list()
        assert [lock.state(snapshot.now) for lock in snapshot.locks] == ["free"]
