"""``cluster`` coordination on the injected clock: engines in this process sharing one
PostgreSQL database, the lock clock (the database's, in production) shared by all.

Each engine runs on its own view of the clock, which can be *frozen* (its loops stop, its
``now()`` stands still, as a process under SIGSTOP) while the shared clock moves on; thawed,
it sees the jump all at once. A crashed engine just stops, holding its shards until their
leases expire.

The invariants, checked on the ledger after every step of random sequences (Hypothesis):
no slot of a schedule ever has two runs; every run is tagged ``cluster`` (``external`` for
the schedule a platform's calls fire, and each of its slots has the one run its calls
named, whichever members they reached); and once the fleet has settled, no slot between a
schedule's first and last recorded one is a silent hole (each is fired, or recorded
``missed``), and each member holds its even share of the shards (64/N rounded down or up).
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from backend import Engine, ManualClock, Unavailable, define_schedule
from backend.scheduler.coordination.cluster import (
    CLUSTER_PREFIX,
    MEMBER_PREFIX,
    SHARDS,
    Cluster,
    ClusterStore,
    shard_lock,
    shard_of,
    spread,
)
from backend.scheduler.coordination.suspects import MAX_HOLD_LEASES, Suspects
from backend.schedules import Schedule
from backend.store.postgres.cluster import ClusterState
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests.tcp_relay import relay_to, via

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
SHARD_TTL = 3.0
EXTERNAL = "x"  # the HandOver machine's platform-fired schedule


class ViewClock:
    """One engine's view of the shared :class:`ManualClock`, which stops while it is frozen
    (its loops wait for the thaw, then see the jump all at once)."""

    def __init__(self, shared: ManualClock) -> None:
        self.shared = shared
        self.frozen_at: datetime | None = None
        self.thawed = asyncio.Event()
        self.thawed.set()

    def now(self) -> datetime:
        return self.frozen_at if self.frozen_at is not None else self.shared.now()

    async def sleep_until(self, deadline: datetime) -> None:
        while True:
            await self.shared.sleep_until(deadline)
            if self.frozen_at is None:
                return
            await self.thawed.wait()

    def freeze(self) -> None:
        self.frozen_at = self.shared.now()
        self.thawed.clear()

    def thaw(self) -> None:
        self.frozen_at = None
        self.thawed.set()


async def noop(ctx: Any) -> None:
    pass


def every_second(count: int, **kwargs: Any) -> list[Schedule]:
    return [
        define_schedule(name=f"s{i:02d}", cron="* * * * * *", timezone="UTC", handler=noop, **kwargs)
        for i in range(count)
    ]


class Fleet:
    """Engines on one database and one shared clock."""

    def __init__(self, url: str, schedules: list[Schedule], shard_ttl: float = SHARD_TTL) -> None:
        self.url = url
        self.schedules = schedules
        self.shard_ttl = shard_ttl
        self.clock = ManualClock(T0)
        self.engines: dict[str, tuple[Engine, ViewClock]] = {}
        self.crashed: list[Engine] = []

    async def start(self, name: str) -> Engine:
        view = ViewClock(self.clock)
        engine = Engine(
            self.schedules, self.url, clock=view, lock_clock=self.clock, instance=name, coordination="cluster",
            shard_ttl=self.shard_ttl, shutdown_grace=0, abandon_after=3600,
        )  # fmt: skip
        self.engines[name] = (engine, view)
        await engine.start()
        # Its member lock taken before the clock moves: the join runs in the cluster's own
        # task, and one still in flight while the others' first rounds read the members
        # (a loaded machine) made them divide the shards without it, then hand over.
        await engine.quiesce()
        return engine

    async def tick(self, seconds: int = 1) -> None:
        """Move the shared clock a second at a time; every engine that is not frozen does
        what each second calls for."""
        for _ in range(seconds):
            self.clock.advance(1)
            for engine, view in self.engines.values():
                if view.frozen_at is None:
                    await engine.quiesce()

    async def settle(self, limit: int = 60) -> None:
        """Tick until every shard is held by a live engine and nothing is catching up, for a
        whole lease (at most ``limit`` seconds)."""
        steady = 0
        for _ in range(limit):
            await self.tick()
            held = sum(len(cluster_of(engine).held) for engine, _ in self.engines.values())
            busy = any(engine.catch_up.busy for engine, _ in self.engines.values())
            steady = steady + 1 if held == SHARDS and not busy else 0
            if steady > self.shard_ttl:
                return
        raise AssertionError(f"the fleet did not settle within {limit}s")

    async def balance(self, limit: int = 60) -> None:
        """Tick until each engine holds 64/N shards rounded down or up (the crashed ones
        counted out), at most ``limit`` seconds."""
        floor = SHARDS // len(self.engines)
        for _ in range(limit):
            held = {name: len(cluster_of(engine).held) for name, (engine, _) in self.engines.items()}
            if sum(held.values()) == SHARDS and all(floor <= n <= floor + 1 for n in held.values()):
                return
            await self.tick()
        raise AssertionError(f"the shards were not spread evenly within {limit}s: {held}")

    async def crash(self, name: str) -> None:
        """Gone without a word: its loops stop, its shards stay taken until they expire."""
        engine, _ = self.engines.pop(name)
        await engine.loops.cancel_all()
        self.crashed.append(engine)

    async def stop(self) -> None:
        for engine, view in self.engines.values():
            view.thaw()
            await engine.stop(grace=0)
        for engine in self.crashed:
            await engine.store.close()

    async def runs(self) -> list[tuple[str, datetime, str, str, str]]:
        engine = next(iter(self.engines.values()))[0] if self.engines else self.crashed[0]
        await engine.flush()
        assert isinstance(engine.store, PostgresStore)
        rows = await engine.store._fetchall(
            "SELECT name, scheduled_at, status, outcome, instance FROM schedtui_runs WHERE trigger <> 'manual' "
            "ORDER BY name, scheduled_at"
        )
        return [(r[0], r[1].astimezone(UTC), r[2], r[3], r[4]) for r in rows]


def cluster_of(engine: Engine) -> Cluster:
    """The engine's cluster coordination (every engine of a fleet here runs in that mode)."""
    assert engine.cluster is not None
    return engine.cluster


def duplicates(runs: list[tuple[str, datetime, str, str, str]]) -> list[tuple[str, datetime]]:
    counts = Counter((name, slot) for name, slot, *_ in runs)
    return [key for key, n in counts.items() if n > 1]


def holes(runs: list[tuple[str, datetime, str, str, str]], until: datetime) -> list[tuple[str, datetime]]:
    """Slots with no row between a schedule's first recorded slot and ``until``."""
    slots: dict[str, set[datetime]] = {}
    for name, slot, *_ in runs:
        slots.setdefault(name, set()).add(slot)
    missing = []
    for name, seen in slots.items():
        at = min(seen)
        while at <= until:
            if at not in seen:
                missing.append((name, at))
            at += timedelta(seconds=1)
    return missing


@pytest.fixture
async def fleet(pg_url: str) -> AsyncIterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(schedules: list[Schedule], **kwargs: Any) -> Fleet:
        made.append(Fleet(pg_url, schedules, **kwargs))
        return made[-1]

    yield make
    for f in made:
        await f.stop()


# ---------------------------------------------------------------------------------------
# the assignment, without a database
# ---------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.sets(st.text(min_size=1, max_size=12), min_size=1, max_size=70), st.randoms(use_true_random=False))
def test_every_member_owns_its_even_share_whatever_the_members_and_their_order(members: set[str], rnd: Any) -> None:
    owners = spread(members)
    assert set(owners) == set(range(SHARDS)) and set(owners.values()) <= members
    floor, extra = divmod(SHARDS, len(members))
    loads = {member: list(owners.values()).count(member) for member in members}
    assert all(floor <= load <= floor + 1 for load in loads.values()), loads
    assert sum(1 for load in loads.values() if load == floor + 1) == extra
    shuffled = list(members)
    rnd.shuffle(shuffled)
    assert spread(shuffled) == owners  # every member computes the same owners


def test_a_join_or_a_leave_moves_its_share_and_a_few_shards_more() -> None:
    assert spread([]) == {}
    extra_moves = []
    for seed in range(200):
        names = [f"web-{seed}-{i}:{1000 + i}" for i in range(seed % 12 + 3)]
        before = spread(names[:-1])
        after = spread(names)
        moved = [shard for shard in range(SHARDS) if before[shard] != after[shard]]
        joined = [shard for shard in range(SHARDS) if after[shard] == names[-1]]
        assert set(joined) <= set(moved)
        extra_moves.append(len(moved) - len(joined))
        left = spread(names[1:-1])  # the first one leaves
        gone = [shard for shard in range(SHARDS) if before[shard] == names[0]]
        extra_moves.append(sum(1 for shard in range(SHARDS) if before[shard] != left[shard]) - len(gone))
    # Plain rendezvous moves nothing more, but leaves members with 2.5 times their share;
    # the bounded loads cost a few moves (measured: 3.5 of 64 on average, 12 at most).
    assert statistics.mean(extra_moves) <= 5 and max(extra_moves) <= SHARDS // 4, (statistics.mean(extra_moves), max(extra_moves))


def test_a_suspect_is_out_until_it_joins_again_or_for_ever_longer_while_it_renews() -> None:
    lease = timedelta(seconds=10)
    suspects = Suspects(lease)
    suspects.count_out("gone", None, "its lease lapsed", T0)  # its member lock had lapsed too
    suspects.count_out("slow", 7, "it took nothing", T0)  # still renewing token 7
    suspects.review({"slow": 7}, T0 + lease - timedelta(seconds=1))
    assert suspects.names() == {"gone", "slow"}
    suspects.review({"slow": 7}, T0 + lease)
    assert suspects.names() == {"gone"}  # its lease's time out is over
    suspects.review({"gone": 3}, T0 + 100 * lease)
    assert suspects.names() == set()  # it joined again (a new token)
    at = T0 + lease
    for hold in (2, 4, 8, 16, 32, 32):  # out again at once each time: twice as long, at most 32 leases
        suspects.count_out("slow", 7, "it took nothing", at)
        suspects.review({"slow": 7}, at + hold * lease - timedelta(seconds=1))
        assert "slow" in suspects
        at += hold * lease
        suspects.review({"slow": 7}, at)
        assert "slow" not in suspects
    later = at + 2 * MAX_HOLD_LEASES * lease + timedelta(seconds=1)
    suspects.count_out("slow", 7, "it took nothing", later)  # well behaved for long: a lease again
    suspects.review({"slow": 7}, later + lease)
    assert "slow" not in suspects


def test_schedules_hash_onto_every_shard() -> None:
    shards = Counter(shard_of(f"schedule-{i}") for i in range(6400))
    assert set(shards) == set(range(SHARDS)) and statistics.pstdev(shards.values()) < 20


async def test_on_sqlite_cluster_falls_back_to_single_loudly(make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(every_second(1), coordination="cluster")
    assert engine.coordination == "single" and engine.cluster is None
    with caplog.at_level(logging.WARNING, logger="schedtui.engine"):
        await engine.start()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "cluster needs a PostgreSQL store" in warning.getMessage() and "falls back to single" in warning.getMessage()


# ---------------------------------------------------------------------------------------
# engines on PostgreSQL
# ---------------------------------------------------------------------------------------
pg_only = pytest.mark.postgres


@pg_only
async def test_three_instances_divide_the_schedules_and_fire_each_slot_once(fleet: Callable[..., Fleet]) -> None:
    f = fleet(every_second(24))
    for name in ("a", "b", "c"):
        await f.start(name)
    await f.tick(8)
    held = {name: len(cluster_of(engine).held) for name, (engine, _) in f.engines.items()}
    assert sum(held.values()) == SHARDS and min(held.values()) >= 10, held
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now())
    assert {(status, outcome) for _, _, status, outcome, _ in runs} == {("succeeded", "cluster")}
    by_instance = Counter(instance for *_, instance in runs)
    assert set(by_instance) == {"a", "b", "c"}
    # Each schedule has one owner, and only that instance ran it.
    views = await f.engines["a"][0].list_schedules()
    owners = {view.name: view.owner for view in views}
    assert all(view.sharded for view in views) and set(owners.values()) == {"a", "b", "c"}
    assert {(name, instance) for name, _, _, _, instance in runs if (name, instance) != (name, owners[name])} == set()
    # Only the owner arms a schedule: the others do not even wake for it.
    for name, (engine, _) in f.engines.items():
        assert {s for s in engine.schedules if engine.timers.next_slot(s) is not None} == {
            s for s, owner in owners.items() if owner == name
        }


@pg_only
async def test_a_crashed_owners_schedules_are_taken_over_within_a_lease_and_no_slot_is_lost(
    fleet: Callable[..., Fleet],
) -> None:
    f = fleet(every_second(12))
    for name in ("a", "b"):
        await f.start(name)
    await f.tick(4)
    victim_owned = {s for s in f.schedules if cluster_of(f.engines["a"][0]).owns(s.name)}
    assert victim_owned
    await f.crash("a")
    crashed_at = f.clock.now()
    await f.tick(int(SHARD_TTL) + 3)
    survivor = f.engines["b"][0]
    assert all(cluster_of(survivor).owns(s.name) for s in f.schedules)
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now())
    window = [(name, slot, status) for name, slot, status, _, _ in runs if slot > crashed_at and status != "succeeded"]
    # The slots of the hand-over window are recorded missed (backfill="skip"), never dropped.
    assert window and {status for *_, status in window} == {"missed"}
    assert all(slot <= crashed_at + timedelta(seconds=SHARD_TTL + 2) for _, slot, _ in window)


@pg_only
async def test_a_slot_due_while_its_shard_changed_hands_fires_late_under_skip(fleet: Callable[..., Fleet]) -> None:
    """The fleet was behind on a shard whose owner died, not down: the slot that came due
    while nobody held it fires as soon as the shard is taken over (``backfill="skip"``
    records only the older ones missed), its first slot too if it never ran before (that
    slot had no row at all). A daily job is not lost to a member's crash, or to the
    hand-over of a rolling deploy."""
    minutely = [define_schedule(name=f"m{i:02d}", cron="0 * * * * *", timezone="UTC", handler=noop) for i in range(12)]
    f = fleet(minutely)
    for name in ("a", "b"):
        await f.start(name)
    await f.tick(58)
    victim_owned = {s.name for s in minutely if cluster_of(f.engines["a"][0]).owns(s.name)}
    assert victim_owned
    await f.crash("a")  # 2 s before 08:01:00, its shards leased for up to 3 s more
    await f.tick(int(SHARD_TTL) + 3)
    assert all(cluster_of(f.engines["b"][0]).owns(name) for name in victim_owned)
    runs = await f.runs()
    assert not duplicates(runs)
    due = T0 + timedelta(minutes=1)
    assert {(name, status, instance) for name, slot, status, _, instance in runs if slot == due} == {
        (s.name, "succeeded", "b") for s in minutely
    }


@pg_only
async def test_a_frozen_owner_that_wakes_up_is_fenced_and_stands_down(
    fleet: Callable[..., Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    f = fleet(every_second(12, backfill="all"))
    for name in ("a", "b"):
        await f.start(name)
    await f.tick(3)
    frozen, view = f.engines["a"]
    frozen_at = f.clock.now()
    lost = {s.name for s in f.schedules if cluster_of(frozen).owns(s.name)}
    view.freeze()
    await f.tick(int(SHARD_TTL) + 3)  # b takes a's shards over once their leases expire
    assert all(cluster_of(f.engines["b"][0]).owns(name) for name in lost)
    before = await f.runs()
    with caplog.at_level(logging.WARNING, logger="schedtui.cluster"):
        view.thaw()
        await frozen.quiesce()  # it wakes up seconds behind, with every timer due
    runs = await f.runs()
    written = [row for row in runs if row not in before and row[4] == "a"]
    assert written == [], "the woken owner wrote rows for shards it had lost"
    assert any("standing down" in r.getMessage() for r in caplog.records)
    assert not any(cluster_of(frozen).owns(name) for name in lost)
    await f.tick(3)  # it rejoins: shards move back to it, without a duplicate
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now())
    assert any(instance == "a" and slot > f.clock.now() - timedelta(seconds=2) for _, slot, _, _, instance in runs)
    # backfill="all": the hand-over window was fired late by the new owner, not dropped.
    assert {status for _, slot, status, _, _ in runs if slot > frozen_at} == {"succeeded"}


@pg_only
async def test_a_claim_under_a_stale_shard_token_writes_nothing_and_stands_the_owner_down(
    fleet: Callable[..., Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    f = fleet(every_second(4))
    stale = await f.start("a")
    await f.tick(2)
    schedule = f.schedules[0]
    assert stale.cluster is not None and stale.cluster.owns(schedule.name)
    fence = stale.cluster.fence_of(schedule.name)
    assert fence is not None
    lock, token = fence
    # Behind its back, an operator frees the shard and another instance takes it over.
    other = await f.start("b")
    await other.locks.release(lock)
    got = await cast(ClusterStore, other.store).acquire_shards([lock], "b", timedelta(seconds=30), f.clock.now())
    assert got[lock][0] > token
    slot = f.clock.now() + timedelta(seconds=1)
    claim = stale.claims.make_claims([(schedule, slot)], f.clock.now())
    with caplog.at_level(logging.WARNING, logger="schedtui.cluster"):
        result = await stale.coordinator.claim(claim, "a", f.clock.now())
    assert result.won == frozenset()
    assert [r for r in await f.runs() if r[1] == slot] == []
    assert not stale.cluster.owns(schedule.name) and stale.timers.next_slot(schedule.name) is None
    assert any("fenced on 1 shard(s), standing down" in r.getMessage() for r in caplog.records)


@pg_only
async def test_a_slot_that_has_a_run_is_never_claimed_again_even_by_its_current_owner(fleet: Callable[..., Fleet]) -> None:
    f = fleet(every_second(2))
    owner = await f.start("a")
    await f.tick(2)
    schedule, slot = f.schedules[0], f.clock.now() + timedelta(seconds=5)
    first = await owner.coordinator.claim(owner.claims.make_claims([(schedule, slot)], f.clock.now()), "a", f.clock.now())
    again = await owner.coordinator.claim(owner.claims.make_claims([(schedule, slot)], f.clock.now()), "a", f.clock.now())
    assert len(first.won) == 1 and again.won == frozenset()
    assert len([r for r in await f.runs() if r[:2] == (schedule.name, slot)]) == 1


@pg_only
async def test_two_claims_of_one_owner_for_one_slot_at_once_start_one_run(fleet: Callable[..., Fleet]) -> None:
    """Found by the schedule liveness machine: after a stall longer than a shard's lease,
    the timers' catch-up of a schedule and the catch-up of its shard, taken again, claimed
    the same slots at once, and each statement saw no row for them in its snapshot (the
    shard's lock is only shared by a claim): every slot of the stall ran twice. A process's
    claims now go one at a time."""
    f = fleet(every_second(2))
    owner = await f.start("a")
    await f.tick(2)
    schedule, slot = f.schedules[0], f.clock.now() + timedelta(seconds=5)
    store = cast(PostgresStore, owner.store)
    through, at_once, most = store.cluster_claim, [0], [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        at_once[0] += 1
        most[0] = max(most[0], at_once[0])
        try:
            return await through(*args, **kwargs)
        finally:
            at_once[0] -= 1

    store.cluster_claim = counted  # type: ignore[method-assign]
    claims = [owner.claims.make_claims([(schedule, slot)], f.clock.now()) for _ in range(2)]  # two run ids
    results = await asyncio.gather(*(owner.coordinator.claim(c, "a", f.clock.now()) for c in claims))
    assert most[0] == 1
    assert sorted(len(r.won) for r in results) == [0, 1]
    assert len([r for r in await f.runs() if r[:2] == (schedule.name, slot)]) == 1


@pg_only
async def test_a_settled_members_round_is_one_transaction_every_fifth_of_a_lease(fleet: Callable[..., Fleet]) -> None:
    # Renewing the leases and reading the shards and members was two round trips, one of
    # them every second: with a fleet of N, N reads a second before any firing. Now one
    # transaction every fifth of a lease (2 s of the default 10), renewing in every other.
    f = fleet(every_second(20), shard_ttl=10)
    a = await f.start("a")
    await f.start("b")
    await f.settle()
    calls: list[int] = []
    store = cast(ClusterStore, a.store)
    renew_and_read = store.renew_and_read

    async def counting(
        held: dict[str, int], ttl: timedelta, prefix: str, now: datetime | None
    ) -> tuple[dict[str, datetime], ClusterState]:
        calls.append(len(held))
        return await renew_and_read(held, ttl, prefix, now)

    store.renew_and_read = counting  # type: ignore[method-assign]  # counts the rounds
    held_before = dict(cluster_of(a).held)
    await f.tick(40)
    assert 19 <= len(calls) <= 21  # a round every 2 s
    assert 9 <= sum(1 for held in calls if held) <= 11  # the renewals (every 3.3 s) ride every other one
    assert cluster_of(a).held.keys() == held_before.keys()  # renewed throughout


@pg_only
async def test_a_console_or_a_cli_verb_on_the_store_is_never_handed_shards(fleet: Callable[..., Fleet]) -> None:
    # They register a heartbeat as they open. The members used to count every fresh
    # heartbeat as a member: opening the console handed it a share of the shards, which
    # nobody then fired until it was counted out a lease later (and the shards it had
    # been handed, free for that long, got their next owners counted out too).
    f = fleet(every_second(12))
    a = await f.start("a")
    b = await f.start("b")
    await f.settle()
    await f.balance()
    before = {name: set(cluster_of(engine).held) for name, (engine, _) in f.engines.items()}
    await a.store.heartbeat("console-on-a-laptop", "laptop", 4242, f.clock.now())
    for _ in range(int(3 * f.shard_ttl)):
        await f.tick()
        await a.store.heartbeat("console-on-a-laptop", "laptop", 4242, f.clock.now())  # a watcher that stays
        assert {name: set(cluster_of(engine).held) for name, (engine, _) in f.engines.items()} == before
    assert cluster_of(a).members() == cluster_of(b).members() == {"a", "b"}
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now() - timedelta(seconds=2))


async def a_third_that_takes_no_shard(f: Fleet) -> tuple[Engine, asyncio.Event]:
    """Members a and b, settled, then c, which renews its member lock but takes no shard
    while the event returned is set (set at first)."""
    await f.start("a")
    await f.start("b")
    await f.settle()
    c = await f.start("c")
    store = cast(ClusterStore, c.store)
    acquire = store.acquire_shards
    failing = asyncio.Event()
    failing.set()

    async def members_only_while_failing(
        names: Sequence[str], holder: str, ttl: timedelta, now: datetime | None
    ) -> dict[str, tuple[int, datetime]]:
        return await acquire([n for n in names if not failing.is_set() or n.startswith(MEMBER_PREFIX)], holder, ttl, now)

    store.acquire_shards = members_only_while_failing  # type: ignore[method-assign]  # takes no shard while failing
    return c, failing


@pg_only
async def test_a_member_that_never_takes_its_shards_is_counted_out_ever_longer_and_nobody_else(
    fleet: Callable[..., Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    # Its shards, free for a lease by then, go to the others: they must get their own
    # lease to take them, not be counted out at once for the shards' old wait. It still
    # renews its member lock, so it is let back in after a while, and counted out again
    # for twice as long each time: its share waits a lease ever more rarely.
    f = fleet(every_second(12))
    c, _ = await a_third_that_takes_no_shard(f)
    caplog.set_level(logging.WARNING, logger="schedtui.cluster")
    for _ in range(int(14 * f.shard_ttl)):
        await f.tick()
    outs = [r.getMessage() for r in caplog.records if "counting instance" in r.getMessage()]
    assert {m.split()[3] for m in outs} == {"c"}, outs
    holds = {float(m.split()[6].rstrip("s:")) for m in outs}  # "counting instance c out for 3s: ..."
    assert {f.shard_ttl, 2 * f.shard_ttl, 4 * f.shard_ttl} <= holds, outs
    assert len(cluster_of(c).held) == 0
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now() - timedelta(seconds=2))



@pg_only
async def test_a_queued_slot_of_an_owner_waits_for_a_run_now_started_on_another_member(fleet: Callable[..., Fleet]) -> None:
    """The owner of a ``queue`` schedule claims its next slot while its own run is in flight
    (nothing runs elsewhere: it queues behind its own). A Run now through another member
    starts meanwhile. When the owner's run ended, the queued slot started at once, beside
    the Run now: its claim's view was old by then. It now looks again, and waits."""
    holding = False
    gates: dict[str, asyncio.Event] = {}

    async def held(ctx: Any) -> None:
        if holding:
            gates[ctx.run_id] = gate = asyncio.Event()
            await gate.wait()

    f = fleet([define_schedule(name="q", cron="*/10 * * * * *", timezone="UTC", handler=held, on_overlap="queue", max_runtime=3600)])
    for name in ("a", "b"):
        await f.start(name)
    await f.settle()
    owner_name = (await f.engines["a"][0].list_schedules())[0].owner
    assert owner_name is not None
    owner, other = f.engines[owner_name][0], f.engines["b" if owner_name == "a" else "a"][0]
    holding = True

    async def tick(seconds: int) -> None:
        for _ in range(seconds):
            f.clock.advance(1)
            for engine, _ in f.engines.values():
                await engine.quiesce(runs=False)

    await tick(10 - f.clock.now().second % 10)  # the owner's run of this slot starts, and holds
    assert len(gates) == 1, gates
    first = next(iter(gates))
    await tick(10)  # the next slot: claimed, queued behind it
    assert len(gates) == 1 and len(owner.launcher.waiting["q"]) == 1
    manual = await other.run_now("q")
    await other.quiesce(runs=False)
    assert set(gates) == {first, manual.id}
    gates[first].set()
    await tick(3)
    assert set(gates) == {first, manual.id}, "the queued slot started beside the Run now"
    gates[manual.id].set()
    await tick(3)
    assert len(gates) == 3, "the queued slot never started after the Run now ended"
    for gate in gates.values():
        gate.set()
    await tick(1)


@pg_only
async def test_a_member_counted_out_while_alive_is_counted_back_in_once_it_takes_its_shards(
    fleet: Callable[..., Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    # A member that renews its member lock but, for a while, takes no shard (its database
    # calls failing under load, say) is counted out: it keeps its token, so "until it
    # joins again" was for good, and the others never handed it a shard again. Counted
    # out for a while instead, it is let back in and gets its even share.
    f = fleet(every_second(12))
    c, failing = await a_third_that_takes_no_shard(f)
    caplog.set_level(logging.WARNING, logger="schedtui.cluster")
    await f.tick(int(3 * f.shard_ttl))
    assert any("counting instance c out" in r.getMessage() for r in caplog.records)
    assert len(cluster_of(c).held) == 0
    failing.clear()
    await f.balance()  # 21, 21 and 22 shards
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now() - timedelta(seconds=2))


async def test_a_joining_member_takes_its_share_without_a_duplicate(fleet: Callable[..., Fleet]) -> None:
    f = fleet(every_second(16))
    await f.start("a")
    await f.tick(3)
    assert len(cluster_of(f.engines["a"][0]).held) == SHARDS
    await f.start("b")
    await f.tick(4)
    held = {name: len(cluster_of(engine).held) for name, (engine, _) in f.engines.items()}
    assert sum(held.values()) == SHARDS and held["b"] >= 20
    runs = await f.runs()
    assert not duplicates(runs) and not holes(runs, f.clock.now())
    assert {instance for *_, instance in runs if _ } >= {"a", "b"}


# ---------------------------------------------------------------------------------------
# hand-over under random sequences
# ---------------------------------------------------------------------------------------
class HandOver(RuleBasedStateMachine):
    """Members join, crash, freeze and thaw while the clock moves, and a platform calls for
    an external schedule's slot through the live members (retried, or all at once; the
    first call's claim may commit with its answer lost); the
    ledger must never show a slot twice, every call that fired or found a slot names its
    one run, and once settled, never a silent hole, and the shards are spread evenly over
    the members left."""

    def __init__(self) -> None:
        super().__init__()
        assert pg.ACTIVE is not None
        self.loop = asyncio.new_event_loop()
        external = define_schedule(name=EXTERNAL, cron="* * * * *", timezone="UTC", handler=noop, trigger="external")
        self.fleet = Fleet(pg.ACTIVE.create_database("handover", migrated=True), [*every_second(6), external])
        self.names = iter(f"m{i}" for i in range(100))
        self.called: dict[datetime, str] = {}
        """The run the platform's calls named for each slot of the external schedule."""
        self.run(self.fleet.start(next(self.names)))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.settle_and_check()
        finally:
            self.run(self.fleet.stop())
            self.loop.close()

    def live(self) -> list[str]:
        return [name for name, (_, view) in self.fleet.engines.items() if view.frozen_at is None]

    @precondition(lambda self: len(self.fleet.engines) < 3)
    @rule()
    def join(self) -> None:
        self.run(self.fleet.start(next(self.names)))

    @precondition(lambda self: len(self.fleet.engines) > 1)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.run(self.fleet.crash(data.draw(st.sampled_from(sorted(self.fleet.engines)))))

    @precondition(lambda self: len(self.live()) > 1)
    @rule(data=st.data())
    def freeze(self, data: st.DataObject) -> None:
        self.fleet.engines[data.draw(st.sampled_from(self.live()))][1].freeze()

    @rule(data=st.data())
    def thaw(self, data: st.DataObject) -> None:
        frozen = sorted(name for name, (_, view) in self.fleet.engines.items() if view.frozen_at is not None)
        if frozen:
            engine, view = self.fleet.engines[data.draw(st.sampled_from(frozen))]
            view.thaw()
            self.run(engine.quiesce())

    @rule(seconds=st.integers(1, 5))
    def tick(self, seconds: int) -> None:
        self.run(self.fleet.tick(seconds))

    @precondition(lambda self: bool(self.live()))
    @rule(calls=st.lists(st.integers(0, 2), min_size=1, max_size=3), together=st.booleans(), lose_answer=st.booleans())
    def platform_fire(self, calls: list[int], together: bool, lose_answer: bool) -> None:
        """``lose_answer``: the first call's claim commits, and its answer is lost."""
        live = self.live()
        engines = [self.fleet.engines[live[i % len(live)]][0] for i in calls]
        store = cast(PostgresStore, engines[0].store)
        claim = store.claim
        if lose_answer:
            async def answer_lost(*args: Any, **kwargs: Any) -> Any:
                store.claim = claim  # type: ignore[method-assign]  # (once)
                await claim(*args, **kwargs)
                raise Unavailable("the connection broke after the claim committed (test)")

            store.claim = answer_lost  # type: ignore[method-assign]

        async def call(engine: Engine) -> Any:
            try:
                return await engine.fire_external(EXTERNAL)
            except Unavailable as exc:  # nothing fired (a lease that lapsed under the claim): retry
                return exc

        async def go() -> list[Any]:
            if together:
                return list(await asyncio.gather(*(call(engine) for engine in engines)))
            return [await call(engine) for engine in engines]

        slot = self.fleet.clock.now().replace(second=0, microsecond=0)
        try:
            answers = self.run(go())
        finally:
            store.claim = claim  # type: ignore[method-assign]
        # (calls at once answer in any order: the one that created the run first)
        for answer in sorted(answers, key=lambda answer: not getattr(answer, "created", False)):
            if isinstance(answer, Unavailable):
                continue
            known = self.called.get(slot)
            assert answer.run_id == (known or answer.run_id), f"{slot}: calls named {known} and {answer.run_id}"
            assert answer.created == (known is None), f"{slot}: {answer} (the calls so far named {known})"
            self.called[slot] = answer.run_id

    @invariant()
    def no_slot_twice_and_every_run_is_the_clusters(self) -> None:
        runs = self.run(self.fleet.runs())
        assert not duplicates(runs), duplicates(runs)[:5]
        assert {outcome for name, _, _, outcome, _ in runs if name != EXTERNAL} <= {"cluster"}
        assert {outcome for name, _, _, outcome, _ in runs if name == EXTERNAL} <= {"external"}
        engine = next(iter(self.fleet.engines.values()))[0] if self.fleet.engines else self.fleet.crashed[0]
        fired = {run.scheduled_at: run.id for run in self.run(engine.store.list_runs(EXTERNAL, limit=1000))}
        assert fired == self.called, f"the ledger has {fired}, the calls named {self.called}"

    def settle_and_check(self) -> None:
        for engine, view in self.fleet.engines.values():
            if view.frozen_at is not None:
                view.thaw()
                self.run(engine.quiesce())
        self.run(self.fleet.settle())
        runs = self.run(self.fleet.runs())
        assert not duplicates(runs)
        settled = self.fleet.clock.now() - timedelta(seconds=2)
        timed = [run for run in runs if run[0] != EXTERNAL]  # (its slots have runs where a call fired them)
        assert not holes(timed, settled), holes(timed, settled)[:5]
        self.run(self.fleet.balance())  # and each member ends up with its even share


@pg_only
def test_hand_over_never_fires_a_slot_twice_nor_leaves_a_silent_hole(pg_server: pg.PgServer) -> None:
    run_state_machine_as_test(
        HandOver,
        settings=settings(
            max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", "12")), stateful_step_count=12, deadline=None,
            database=None, suppress_health_check=list(HealthCheck),
        ),
    )


# ---------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------
@pg_only
async def test_list_gains_the_owner_of_each_schedule_in_cluster_mode(pg_url: str, tmp_path: Any) -> None:
    import json
    import subprocess
    import sys
    import textwrap

    from tests.servers import REPO, cli_env

    folder = tmp_path / "schedules"
    folder.mkdir()
    (folder / "ticks.cron.py").write_text(textwrap.dedent("""
        from backend import define_schedule

        async def noop(ctx):
            pass

        a = define_schedule(name="alpha", cron="0 * * * *", timezone="UTC", handler=noop)
        b = define_schedule(name="beta", cron="0 * * * *", timezone="UTC", handler=noop)
    """))
    from backend import discover
    from backend.client.embedded import EmbeddedBackend

    engine = Engine(discover(folder), pg_url, instance="owner-1", coordination="cluster", shutdown_grace=0)
    await engine.start()
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while len(cluster_of(engine).held) < SHARDS:
            assert asyncio.get_running_loop().time() < deadline, "the engine did not take the shards"
            await asyncio.sleep(0.1)  # a real clock: the shards are taken on the next poll

        def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "console.cli", *args, "--schedules", str(folder), "--store", pg_url],
                cwd=REPO, env=cli_env(**env), capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        done = await asyncio.to_thread(cli, "list", "--json", SCHEDTUI_COORDINATION="cluster")
        assert done.returncode == 0, done.stderr
        assert {(s["name"], s["owner"]) for s in json.loads(done.stdout)} == {("alpha", "owner-1"), ("beta", "owner-1")}
        table = await asyncio.to_thread(cli, "list", SCHEDTUI_COORDINATION="cluster")
        assert table.stdout.splitlines()[0].split()[-1] == "OWNER" and "owner-1" in table.stdout
        # Left to the store's default, a verb reports the fleet it observes, not advisoryLock.
        plain = await asyncio.to_thread(cli, "list", "--json")
        assert {(s["name"], s["owner"]) for s in json.loads(plain.stdout)} == {("alpha", "owner-1"), ("beta", "owner-1")}
        other = await asyncio.to_thread(cli, "list", "--json", SCHEDTUI_COORDINATION="advisoryLock")
        assert all("owner" not in s for s in json.loads(other.stdout))  # not in the other modes
        observer = EmbeddedBackend(Engine(discover(folder), pg_url, instance="watcher", shutdown_grace=0))
        info = await observer.connect()  # as the console's header reads it
        try:
            assert info.coordination == "cluster"
            assert {(v.name, v.owner) for v in await observer.engine.list_schedules()} == {("alpha", "owner-1"), ("beta", "owner-1")}
        finally:
            await observer.close()
        bad = await asyncio.to_thread(cli, "list", SCHEDTUI_COORDINATION="clustr")
        assert bad.returncode == 2 and bad.stderr == (
            'schedtui: $SCHEDTUI_COORDINATION "clustr" is not one of single, advisoryLock, cluster\n'
        )
    finally:
        await engine.stop(grace=0)


@pg_only
async def test_a_take_of_shards_whose_answer_was_lost_and_that_the_store_sent_again_has_them(pg_url: str) -> None:
    """The take commits and its answer is lost (the connection breaks after the commit); the
    store sends it again on a fresh connection, which finds the shards held. It answers
    them, as taken: a member used to hold them without knowing it, unrenewed and unfired,
    until their lease ran out (its member lock too: out of the fleet for a lease)."""
    names = [shard_lock(7), shard_lock(8), f"{MEMBER_PREFIX}a"]
    with relay_to(pg_url) as relay:
        store = PostgresStore(via(pg_url, relay.port))
        await store.open()
        try:
            relay.lose_reply(shard_lock(8).encode())  # the take's answer names it
            got = await store.acquire_shards(names, "a", timedelta(seconds=30), T0)
            assert relay.lost.is_set()
            state = await store.cluster_state(CLUSTER_PREFIX, T0)
            held = {name: (lock.token, lock.expires_at) for name, lock in state.locks.items() if lock.holder == "a"}
            assert got == held and set(got) == set(names)
            # Another take, even by the same holder, is answered none of them: they are held.
            assert await store.acquire_shards(names, "a", timedelta(seconds=30), T0) == {}
            later = T0 + timedelta(seconds=31)  # expired: taken again, each once, under new tokens
            again = await store.acquire_shards(names, "b", timedelta(seconds=30), later)
            assert set(again) == set(names) and all(again[n][0] > got[n][0] for n in names)
        finally:
            await store.close()
