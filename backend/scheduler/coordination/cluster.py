"""``cluster`` coordination: the schedules are divided among the live instances.

Every schedule belongs to one of :data:`SHARDS` shards (a hash of its name). Each shard is
a lock of the lock table (``cluster:shard:NN``) held under a lease with a fencing token;
only the instance holding a shard arms its schedules' timers and fires them, so nobody
else even wakes for them, and no per-slot claim is written.

* **Who should own what.** Rendezvous hashing with bounded loads over the live members
  (:func:`spread`): every member scores every shard, the highest scores are served first,
  and nobody takes more than its even share, so each member holds 64/N shards rounded
  down or up, and a member joining or leaving moves its own share and a few more.
* **Who is a member.** An instance that runs ``cluster`` holds a member lock
  (``cluster:member:<instance>``) under the same lease as its shards, renewed with them:
  the members are the holders of live member locks that
  :meth:`~backend.scheduler.registry.InstanceRegistry.gone` does not rule out, less the *suspects*:
  an instance holding a shard whose lease expired (it stopped renewing), or one that has
  not picked up a shard it should own for a whole lease (counted out until it joins
  again, or for a while when it still renews its member lock: see
  :mod:`~backend.scheduler.coordination.suspects`). Any other process of the store
  (a console, a CLI verb, an instance in another mode) registers a heartbeat but is no
  member: it is never handed shards. A dead member's shards move within a lease (plus a
  poll) of its death.
* **Hand-over.** An owner gives a shard back (disarming its schedules first) when it
  should no longer own it; the new owner takes it only once it is released or expired
  (the lock's rule), then catches its schedules up from their last recorded slot, bounded
  like the boot catch-up: the slots of the hand-over window are fired late or recorded
  ``missed`` per each schedule's backfill policy.
* **Fencing.** Every run row an owner creates for a slot is inserted by one statement
  that checks its shard token is still current and that the slot has no run yet, holding
  the shard's lock row until it commits (see :mod:`backend.store.postgres.cluster`). A
  frozen owner that wakes up finds its token stale: it fires nothing, writes nothing, and
  stands down (disarms the shard). Runs it started while it owned the shard go on being
  recorded.

PostgreSQL only; the engine falls back to ``single`` on SQLite, loudly.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from backend.errors import Unavailable
from backend.locks.model import CLUSTER_LOCKS
from backend.model import Claim, ClaimResult, CoordinationMode, Outcome
from backend.runtime.leaseclock import LeaseClock
from backend.scheduler.coordination.suspects import Suspects

if TYPE_CHECKING:
    from backend.clock import Clock
    from backend.locks.model import Lock
    from backend.runtime.loops import Loops
    from backend.runtime.outages import OutageLog
    from backend.scheduler.registry import InstanceRegistry
    from backend.schedules import Schedule
    from backend.store.postgres.cluster import ClusterState

__all__ = [
    "MEMBER_PREFIX",
    "SHARDS",
    "SHARD_PREFIX",
    "CatchesUp",
    "Cluster",
    "ClusterCoordinator",
    "ClusterStore",
    "ShardTimers",
    "shard_of",
    "spread",
]

log = logging.getLogger("schedtui.cluster")

#: Shards the schedules are hashed onto: fixed, so every instance agrees on them.
SHARDS = 64
#: The lock names of ``cluster``: its shards, and one member lock per instance in it.
CLUSTER_PREFIX = CLUSTER_LOCKS
SHARD_PREFIX = f"{CLUSTER_LOCKS}shard:"
MEMBER_PREFIX = f"{CLUSTER_LOCKS}member:"


def shard_of(name: str) -> int:
    """The shard of a schedule: a stable hash of its name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % SHARDS


def shard_lock(shard: int) -> str:
    return f"{SHARD_PREFIX}{shard:02d}"


async def shard_owners(store: ClusterStore, names: Iterable[str], now: datetime | None) -> dict[str, str | None]:
    """Schedule name -> the instance holding its shard now (``None``: nobody); ``now`` is
    the locks' time (``None``: the database's). A member's, or an observer's of a fleet."""
    state = await store.cluster_state(CLUSTER_PREFIX, now)
    holders = {lock.name: lock.holder for lock in state.locks.values() if lock.state(state.now) == "held"}
    return {name: holders.get(shard_lock(shard_of(name))) for name in names}


@functools.lru_cache(maxsize=1024)
def _scores(member: str) -> tuple[int, ...]:
    """``member``'s score for each shard (a member keeps its scores while it lives)."""
    return tuple(
        int.from_bytes(hashlib.blake2b(f"{member}\x00{shard}".encode(), digest_size=8).digest(), "big")
        for shard in range(SHARDS)
    )


def spread(members: Iterable[str]) -> dict[int, str]:
    """Shard -> the member that should own it: rendezvous hashing with bounded loads.

    Every (member, shard) pair has a score; pairs are served from the highest down, a
    shard going to the first member that still has room. Room is the even share: 64/N
    rounded down, and rounded up for the first 64 mod N members to reach it. So:

    * every shard has an owner (``{}`` without members), and each member owns 64/N
      rounded down or up: the busiest member carries its fair share, not a hash's luck
      (plain rendezvous gave 4 to 14 shards over 8 members);
    * every member computes the same answer from the same members, in any order;
    * a shard moves only when its owner leaves, a joiner outscores it, or the shares
      change: a join or a leave moves the joiner's or leaver's share and a few shards
      more (about 4 of 64 at 8 members, measured over random names).
    """
    names = sorted(set(members))
    if not names:
        return {}
    floor, extra = divmod(SHARDS, len(names))
    pairs = sorted(
        ((score, member, shard) for member in names for shard, score in enumerate(_scores(member))), reverse=True
    )
    owner: dict[int, str] = {}
    load = dict.fromkeys(names, 0)
    rounded_up = 0  # members holding floor + 1: at most `extra` of them
    for _, member, shard in pairs:
        if shard in owner:
            continue
        held = load[member]
        if held >= floor + 1 or (held == floor and rounded_up >= extra):
            continue
        owner[shard] = member
        load[member] = held + 1
        if held == floor:
            rounded_up += 1
        if len(owner) == SHARDS:
            break
    return owner


class ClusterStore(Protocol):
    """What ``cluster`` needs from a store (PostgreSQL's :class:`~backend.store.postgres.cluster.PostgresCluster`)."""

    async def acquire_shards(
        self, names: Sequence[str], holder: str, ttl: timedelta, now: datetime | None
    ) -> dict[str, tuple[int, datetime]]: ...

    async def release_shards(self, held: dict[str, int], now: datetime | None) -> None: ...

    async def release_leftover_shards(self, prefix: str, holder: str, keep: Sequence[int], now: datetime | None) -> None: ...

    async def cluster_state(self, prefix: str, now: datetime | None) -> ClusterState: ...

    async def renew_and_read(
        self, held: dict[str, int], ttl: timedelta, prefix: str, now: datetime | None
    ) -> tuple[dict[str, datetime], ClusterState]: ...

    async def cluster_claim(
        self, claims: Sequence[Claim], fences: dict[str, tuple[str, int]], instance: str, now: datetime | None
    ) -> tuple[ClaimResult, set[str]]: ...


@dataclass
class _Held:
    token: int
    renewed_at: int
    """When this process asked for the lease or its last renewal, on its lease clock
    (:class:`~backend.runtime.leaseclock.LeaseClock`: a step of the wall clock neither holds
    a renewal back nor keeps a shard believed held past its ttl)."""
    deadline: int
    """Until when the lease is surely ours: ``renewed_at`` + the ttl (lease clock, nanoseconds)."""


class ShardTimers(Protocol):
    """What the shards need of the timers (:class:`~backend.scheduler.timers.Timers`; the timers
    and catch-up import the slot claims, which import this module: protocols keep the
    imports one way)."""

    @property
    def wheel(self) -> Container[str]:
        """The names of the schedules armed."""

    def disarm(self, name: str) -> None: ...


class CatchesUp(Protocol):
    """What the shards need of catch-up (:class:`~backend.scheduler.catchup.CatchUp`)."""

    def at_boot(
        self, schedule: Schedule, now: datetime, *, reason: str | None = None, late_by: timedelta = timedelta(0)
    ) -> None: ...


class ClusterCoordinator:
    """The :class:`~backend.scheduler.coordination.slots.Coordinator` of ``cluster``: a slot is won when its
    schedule's shard is held here and the store confirms the token (see the module)."""

    mode: CoordinationMode = "cluster"
    outcome: Outcome = "cluster"
    needs_claims = True
    takes_turns = False  # (a schedule has one owner at a time)

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.cluster: Cluster | None = None
        """Set by the engine once the cluster exists."""
        self._claiming = asyncio.Lock()
        """One claim of this process at a time. A claim inserts a slot's row where its
        statement's snapshot shows none, holding the shard's lock only shared: two claims of
        one owner for one slot at once (after a stall, the timers' catch-up of a schedule and
        the catch-up of its shard taken again) each saw no row, and the slot ran twice."""

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        cluster = self.cluster
        assert cluster is not None, "the engine wires the cluster in"
        async with self._claiming:
            fences = {name: fence for name in {c.name for c in claims} if (fence := cluster.fence_of(name)) is not None}
            mine = [claim for claim in claims if claim.name in fences]
            if not mine:
                return ClaimResult(frozenset())
            result, stale = await self.store.cluster_claim(mine, fences, instance, cluster.lock_now())
        if stale:
            cluster.stand_down(stale, "its token is no longer current (the shard was taken over or its lease expired)")
        return result


class Cluster:
    """This instance's shards: taking, renewing and giving them back, and arming what they
    hold. The engine runs it as a subsystem (its own loop, every ``poll``)."""

    def __init__(
        self,
        *,
        store: ClusterStore,
        clock: Clock,
        loops: Loops,
        registry: InstanceRegistry,
        outages: OutageLog,
        instance: str,
        schedules: Iterable[Schedule],
        catch_up: CatchesUp,
        timers: ShardTimers,
        is_enabled: Callable[[str], bool],
        lock_now: Callable[[], datetime | None],
        ttl: timedelta = timedelta(seconds=10),
        poll: timedelta = timedelta(seconds=1),
    ) -> None:
        self.store = store
        self.clock = clock
        self.loops = loops
        self.registry = registry
        self.outages = outages
        self.instance = instance
        self.catch_up = catch_up
        self.timers = timers
        self.is_enabled = is_enabled
        self.lock_now = lock_now
        self.ttl = ttl
        self.poll = poll
        self.lease_clock = LeaseClock(clock, loops)
        self.grace = ttl
        """How long a shard may stay free before its would-be owner counts as gone."""
        self.hand_over = ttl + 2 * poll
        """The longest a shard goes unfired when it changes hands in a running fleet (a
        dead owner's lease, then a round to see it and one to take it): a slot due that
        recently before a take-over fires late, whatever its backfill policy; the fleet
        was behind on it, not down."""
        self.by_shard: dict[int, list[Schedule]] = {}
        for schedule in schedules:
            self.by_shard.setdefault(shard_of(schedule.name), []).append(schedule)
        self.held: dict[int, _Held] = {}
        self.member_lock = f"{MEMBER_PREFIX}{instance}"
        self.member: _Held | None = None
        """This instance's member lock, while it holds it (see the module)."""
        self._waiting: dict[int, tuple[str, datetime]] = {}
        """Free shards -> the member that should take them, and since when it should."""
        self._suspects = Suspects(ttl)
        """Instances found dead-like or slow (see :meth:`assignment`), counted out until
        they join again or for a while (see :mod:`~backend.scheduler.coordination.suspects`)."""
        self._first_round = True
        self.last_state: ClusterState | None = None
        """The last read of the shards and instances (for the views)."""

    def put(self, schedule: Schedule) -> None:
        """Hold ``schedule`` in its shard (a stored one created or changed at run time)."""
        self.drop(schedule.name)
        self.by_shard.setdefault(shard_of(schedule.name), []).append(schedule)

    def drop(self, name: str) -> None:
        members = self.by_shard.get(shard_of(name), [])
        members[:] = [s for s in members if s.name != name]

    # -- what the engine asks ------------------------------------------------------------
    def owns(self, name: str) -> bool:
        return shard_of(name) in self.held

    def fence_of(self, name: str) -> tuple[str, int] | None:
        held = self.held.get(shard_of(name))
        return (shard_lock(shard_of(name)), held.token) if held is not None else None

    async def owners(self) -> dict[str, str | None]:
        """Schedule name -> the instance holding its shard now (``None``: nobody)."""
        names = [schedule.name for schedules in self.by_shard.values() for schedule in schedules]
        return await shard_owners(self.store, names, self.lock_now())

    # -- the subsystem's hooks -------------------------------------------------------------
    async def open(self) -> None:
        """Nothing: the shards are the lock table's rows."""

    def start(self) -> None:
        self.loops.expect("cluster")
        self.loops.keep(self._loop, "cluster")

    async def maintain(self, now: datetime) -> None:
        """Nothing here: the cluster keeps its own loop (a slow housekeeping round must not
        delay renewals)."""

    async def stop(self, grace: float) -> None:
        """Give every shard back at once (its timers stopped already), and the member lock,
        so that the others take over without waiting for the leases to run out."""
        held = {shard_lock(shard): h.token for shard, h in self.held.items()}
        if self.member is not None:
            held[self.member_lock] = self.member.token
        self.held.clear()
        self.member = None
        if held:
            try:
                await self.store.release_shards(held, self.lock_now())
                log.info("cluster: gave back %d shard(s)", len(held))
            except Unavailable as exc:
                log.warning("cluster: could not give the shards back (%s); they expire within %s", exc, self.ttl)

    @property
    def idle(self) -> bool:
        return True

    def is_ours(self, id_: str) -> bool:
        return False

    # -- the loop ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        # Join, then one poll before the first take: instances starting together see each
        # other first, instead of one taking every shard and handing most of them over a
        # second later.
        try:
            await self._join()
            self.outages.back("cluster")
        except Unavailable as exc:
            self.outages.trouble("cluster", "cluster: cannot join the members", exc)
        poll = LeaseClock.span(self.poll)
        await self.lease_clock.park("cluster", self.lease_clock.now() + poll)
        while True:
            try:
                await self.round()
                self.outages.back("cluster")
            except Unavailable as exc:
                self.outages.trouble("cluster", "cluster: cannot renew or balance the shards", exc)
                self._expire()
            await self.lease_clock.park("cluster", self.lease_clock.now() + poll)

    async def round(self) -> None:
        """Renew what is due, read the shards and the members, give back and take."""
        now = self.clock.now()
        if not self.registry.fires or self.registry.clock_off:
            # Waiting while another coordination mode fires (or an observer), or a clock off
            # the store's (its lease lapsed: it fires nothing): hold nothing.
            if self.held or self.member is not None:
                why = "its clock is off the store's" if self.registry.clock_off else self.registry.role
                log.warning("cluster: giving every shard back: this instance does not fire (%s)", why)
                await self.stop(0)
            return
        self._expire()
        state = await self._renew_and_read()
        self.last_state = state
        if self._first_round:
            # A previous process of this instance name died holding shards: free them now
            # rather than wait for their leases (nobody else would take them sooner).
            self._first_round = False
            keep = [h.token for h in self.held.values()] + ([self.member.token] if self.member is not None else [])
            mine = [lock for lock in state.locks.values() if lock.holder == self.instance]
            if any(lock.token not in keep for lock in mine):
                await self.store.release_leftover_shards(CLUSTER_PREFIX, self.instance, keep, self.lock_now())
                state = await self.store.cluster_state(CLUSTER_PREFIX, self.lock_now())
        if self.member is None:
            await self._join()  # its member lock was lost (a long pause): a member again
        desired = self.assignment(state, now)
        give = [shard for shard in self.held if desired.get(shard) != self.instance]
        if give:
            handed = {shard_lock(shard): self.held[shard].token for shard in give}
            self._drop(give, "rebalanced to another member")  # its timers stop before it is handed over
            await self.store.release_shards(handed, self.lock_now())
        take = [
            shard
            for shard, owner in desired.items()
            if owner == self.instance and shard not in self.held and _free(state, shard)
        ]
        if take:
            asked_at = self.lease_clock.now()
            got = await self.store.acquire_shards([shard_lock(s) for s in take], self.instance, self.ttl, self.lock_now())
            for name, (token, _) in sorted(got.items()):
                shard = int(name[len(SHARD_PREFIX) :])
                self._took(shard, token, asked_at, handed_over=self._held_lately(state, shard))

    def assignment(self, state: ClusterState, now: datetime) -> dict[int, str]:
        """Shard -> the member that should own it (see the module docstring)."""
        beats = state.instances
        tokens = members_of(state)
        live = {self.instance} | {name for name in tokens if self.registry.gone(beats, name, now) is None}
        self._suspects.review(tokens, now)
        for lock in shard_locks(state).values():
            holder = lock.holder
            if holder is not None and holder != self.instance and lock.state(state.now) == "expired":
                self._suspects.count_out(holder, tokens.get(holder), "it stopped renewing its shards", now)
        members = live - self._suspects.names()
        while True:
            desired = spread(members)  # this instance is always a member: every shard has an owner
            # Slow: a member that should have taken a free shard for a whole lease and has
            # not (counted from when it became that shard's owner-to-be, not from when the
            # shard became free: counting a member out hands its shards to others, who
            # must have their own lease to take them).
            slow = {
                owner
                for shard, (owner, since) in self._waiting.items()
                if desired.get(shard) == owner and owner != self.instance and now - since > self.grace
            }
            if not slow:
                break
            for owner in slow:
                why = f"it did not take a free shard within {self.grace}"
                self._suspects.count_out(owner, tokens.get(owner), why, now)
            members -= slow
        for shard in range(SHARDS):
            to = desired.get(shard)
            if to is None or not _free(state, shard):
                self._waiting.pop(shard, None)
            elif shard not in self._waiting or self._waiting[shard][0] != to:
                self._waiting[shard] = (to, now)
        return desired

    # -- holding and letting go ----------------------------------------------------------------
    def _held_lately(self, state: ClusterState, shard: int) -> bool:
        """Whether the shard was held until a hand-over ago at most (its lease ended or it was
        given back then): a hand-over in a running fleet, not a fleet starting cold."""
        lock = state.locks.get(shard_lock(shard))
        return lock is not None and state.now - lock.expires_at <= self.hand_over

    def _took(self, shard: int, token: int, asked_at: int, *, handed_over: bool = False) -> None:
        self.held[shard] = _Held(token, asked_at, asked_at + LeaseClock.span(self.ttl))
        schedules = self.by_shard.get(shard, [])
        log.info("cluster: took shard %02d (token %d, %d schedule(s))", shard, token, len(schedules))
        now = self.clock.now()
        for schedule in schedules:
            if self.is_enabled(schedule.name) and schedule.name not in self.timers.wheel:
                # From its last recorded slot, as at boot; after a hand-over, the newest slot
                # of its window fires late (due within self.hand_over), the others per the
                # schedule's backfill policy.
                late_by = self.hand_over if handed_over else timedelta(0)
                self.catch_up.at_boot(schedule, now, reason=f"while its shard {shard:02d} changed hands", late_by=late_by)

    def _drop(self, shards: Iterable[int], why: str) -> None:
        for shard in list(shards):
            if self.held.pop(shard, None) is None:
                continue
            for schedule in self.by_shard.get(shard, []):
                self.timers.disarm(schedule.name)
            log.info("cluster: let go of shard %02d: %s", shard, why)

    def stand_down(self, locks: Iterable[str], why: str) -> None:
        """The store refused this instance's token for these shard locks: stop firing them."""
        shards = [int(name[len(SHARD_PREFIX) :]) for name in locks if name.startswith(SHARD_PREFIX)]
        held = [shard for shard in shards if shard in self.held]
        if held:
            log.warning("cluster: fenced on %d shard(s), standing down: %s", len(held), why)
            self._drop(held, why)

    def _expire(self) -> None:
        now = self.lease_clock.now()
        late = [shard for shard, held in self.held.items() if held.deadline <= now]
        if late:
            log.warning("cluster: %d shard lease(s) not renewed in time; standing down on them", len(late))
            self._drop(late, "its lease could not be renewed in time")
        if self.member is not None and self.member.deadline <= now:
            self.member = None  # the others count it out: it joins again next round

    async def _join(self) -> None:
        """Take this instance's member lock: from now on the others hand it shards."""
        asked_at = self.lease_clock.now()
        got = await self.store.acquire_shards([self.member_lock], self.instance, self.ttl, self.lock_now())
        if self.member_lock in got:
            token, _ = got[self.member_lock]
            self.member = _Held(token, asked_at, asked_at + LeaseClock.span(self.ttl))

    async def _renew_and_read(self) -> ClusterState:
        """Renew the leases (the shards' and the member lock) if a third of their ttl has
        passed, and read the shards, the members and the instances: one transaction."""
        now = self.lease_clock.now()
        leases = list(self.held.values()) + ([self.member] if self.member is not None else [])
        due = bool(leases) and min(h.renewed_at for h in leases) + LeaseClock.span(self.ttl) // 3 <= now
        held: dict[str, int] = {}
        if due:
            held = {shard_lock(shard): h.token for shard, h in self.held.items()}
            if self.member is not None:
                held[self.member_lock] = self.member.token
        renewed, state = await self.store.renew_and_read(held, self.ttl, CLUSTER_PREFIX, self.lock_now())
        if held:
            self._renewed(now, held, renewed)
        return state

    def _renewed(self, asked_at: int, held: dict[str, int], renewed: dict[str, datetime]) -> None:
        ttl = LeaseClock.span(self.ttl)
        if self.member is not None and self.member_lock in held:
            if self.member_lock in renewed:
                self.member.renewed_at, self.member.deadline = asked_at, asked_at + ttl
            else:
                self.member = None  # taken over by a newer process of this name, or expired
        lost = [name for name in held if name.startswith(SHARD_PREFIX) and name not in renewed]
        if lost:
            self.stand_down(lost, "its token is no longer current")
        for name in renewed:
            if not name.startswith(SHARD_PREFIX):
                continue
            current = self.held.get(int(name[len(SHARD_PREFIX) :]))
            if current is not None:
                current.renewed_at, current.deadline = asked_at, asked_at + ttl

    def members(self) -> set[str]:
        """From the last read: the instances holding a live member lock."""
        return set(members_of(self.last_state)) if self.last_state is not None else set()



def _free(state: ClusterState, shard: int) -> bool:
    lock = state.locks.get(shard_lock(shard))
    return lock is None or lock.state(state.now) != "held"


def shard_locks(state: ClusterState) -> dict[str, Lock]:
    """The shards' lock rows of a read of the cluster."""
    return {name: lock for name, lock in state.locks.items() if name.startswith(SHARD_PREFIX)}


def members_of(state: ClusterState) -> dict[str, int]:
    """The instances holding a live member lock in a read of the cluster, with its token."""
    return {
        name[len(MEMBER_PREFIX) :]: lock.token
        for name, lock in state.locks.items()
        if name.startswith(MEMBER_PREFIX) and lock.holder == name[len(MEMBER_PREFIX) :] and lock.state(state.now) == "held"
    }
