"""Who gets to fire a slot when several instances share a store, and what happens to the
slots nobody could claim.

:class:`Coordinator` is the gate between "a timer says slot X of schedule S is due" and
"this instance runs the handler". ``single`` lets every firing through (one instance
only: two ``single`` instances fire everything twice); ``advisoryLock`` lets exactly one
instance win each slot through a claims table in PostgreSQL.

:class:`SlotClaims` is the engine's side of it: it claims batches of due slots, fails
closed when the store cannot be written (nothing fires), remembers the slots it could not
claim, and claims and records them once the store is back (:meth:`SlotClaims.recover_lost`)
or, at the latest, when the engine stops. Lost slots that the backfill policy fires run
oldest first, one at a time, each once no run of the schedule is in flight anywhere
(``skip`` does not skip them behind the live timer's run); ``queue`` takes them in slot
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol, cast

from backend.clock import Clock
from backend.errors import BadInput, Unavailable
from backend.model import Claim, ClaimResult, CoordinationMode, Outcome, Run, Trigger, slot_key
from backend.runtime.liveness import WorkLease
from backend.runtime.loops import Loops
from backend.runtime.outages import OutageLog
from backend.scheduler.coordination.cluster import ClusterCoordinator, ClusterStore
from backend.scheduler.launcher import Launcher
from backend.scheduler.placement import PLACE_WAIT_S
from backend.schedules import Schedule

if TYPE_CHECKING:
    from backend.store import Store

__all__ = ["ClaimCoordinator", "Coordinator", "SingleCoordinator", "SlotClaims", "make_coordinator", "warn_cluster_fallback"]

log = logging.getLogger("schedtui.engine")


class Coordinator(Protocol):
    """Decides which due slots this instance fires.

    Contract: ``claim`` takes claims whose keys are ``name@YYYY-MM-DDTHH:MM:SS`` (see
    :func:`backend.model.slot_key`) and returns the keys this instance won. For a given
    key, across every instance sharing the store, at most one call ever returns it (for as
    long as the claim is retained, and, for claims carrying their slot, for as long as the
    slot's run is in the ledger). The result also names the schedules of the batch that
    another instance has a run of in flight, so overlap policies hold across instances.
    When the claim cannot be written the coordinator raises
    :class:`backend.errors.Unavailable` and the caller must not fire: fail closed.
    """

    mode: CoordinationMode
    outcome: Outcome
    """The coordination outcome recorded on runs this coordinator let through."""
    needs_claims: bool
    """False when every slot is won without asking anyone (``single``)."""
    takes_turns: bool
    """Whether runs of ``skip`` and ``queue`` schedules take their turn in the store before
    they start (``advisoryLock``: every instance may fire any slot, so two may start runs
    of one schedule's different slots; ``cluster`` has one owner per schedule)."""

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult: ...


class SingleCoordinator:
    """No gate: this instance assumes it is the only one that fires. Processes that fire
    nothing may still run a schedule's handler (a Run now from ``schedtui fire`` in
    another shell, or a console without ``--fire``): a timed run of a ``skip`` or ``queue``
    schedule meets theirs as it meets one on another instance (:attr:`ClaimResult.busy`),
    read from the store before it starts."""

    mode: CoordinationMode = "single"
    outcome: Outcome = "single"
    needs_claims = False
    takes_turns = False

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        slots = [(claim.name, claim.scheduled_at) for claim in claims if claim.scheduled_at is not None]
        return ClaimResult(frozenset(claim.key for claim in claims), await self.busy(slots, instance))

    async def blocker(self, name: str, slot: datetime, instance: str) -> str | None:
        """The run in flight in another process that ``name``'s run of ``slot`` must not
        start beside (a slot that waited, queued or behind a catch-up's earlier one)."""
        return (await self.busy([(name, slot)], instance)).get(name)

    async def busy(self, slots: Iterable[tuple[str, datetime]], instance: str) -> dict[str, str]:
        """Of the schedules of ``slots`` (each with a slot about to start), those with a run
        in flight in another process (see :meth:`Store.busy_elsewhere`). Fails open: this
        mode fires whatever the store's state, and a store that cannot answer has no Run
        now of another process's starting either."""
        firsts: dict[str, datetime] = {}
        for name, slot in slots:
            first = firsts.get(name)
            if first is None or slot < first:
                firsts[name] = slot
        if not firsts:
            return {}
        try:
            # Asked even while the store fails its writes (a full disk still answers reads),
            # and waited for at most as long as a run waits for its row: a server that
            # stopped answering holds a burst back that long, not a pool's whole timeout.
            return await asyncio.wait_for(self.store.busy_elsewhere(firsts, instance), PLACE_WAIT_S)
        except (Unavailable, TimeoutError) as exc:
            log.debug("runs of other processes not read (%s): the due runs start", exc or "no answer")
            return {}


class ClaimCoordinator:
    """``advisoryLock``: one row per slot in the store's claims table; the insert that
    creates the row wins. Nothing but the store is needed, and a crashed winner blocks
    nothing, because the next slot is a new key."""

    mode: CoordinationMode = "advisoryLock"
    outcome: Outcome = "wonLock"
    needs_claims = True
    takes_turns = True

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        return await self.store.claim(claims, instance, now)


def make_coordinator(coordination: CoordinationMode | Coordinator | None, store: Store) -> tuple[Coordinator, bool]:
    """The coordinator for ``coordination`` (a mode, a coordinator given as is, or ``None``
    for the store's default), and whether ``cluster`` fell back to ``single``."""
    if coordination is not None and not isinstance(coordination, str):
        return coordination, False
    mode = coordination or store.default_coordination
    if mode == "single":
        return SingleCoordinator(store), False
    if mode == "advisoryLock":
        return ClaimCoordinator(store), False
    if mode == "cluster":
        if store.kind != "postgresql":
            return SingleCoordinator(store), True
        return ClusterCoordinator(cast(ClusterStore, store)), False
    raise BadInput(f'coordination "{mode}" is not one of single, advisoryLock, cluster')


def warn_cluster_fallback(store: Store) -> None:
    log.warning(
        "COORDINATION: cluster needs a PostgreSQL store; the store %s is %s, so this instance falls "
        "back to single: it fires every schedule itself, and a second instance would fire them all again",
        store.where,
        store.kind,
    )


class SlotClaims:
    """Claims due slots for this instance and accounts for the ones it could not claim.

    Contract: :meth:`claim` returns only slots this instance won (each with the run id
    its claim recorded); when the store cannot be written it returns nothing (fail closed)
    and remembers the slots, at most ``catch_up_limit`` per schedule. :meth:`recover_lost`
    claims them again once the store answers; the winner of each records it ``missed`` or
    fires it per the schedule's backfill policy, so an outage leaves visible rows and never
    a double firing.
    """

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        store: Store,
        clock: Clock,
        loops: Loops,
        launcher: Launcher,
        outages: OutageLog,
        schedules: dict[str, Schedule],
        is_enabled: Callable[[str], bool],
        instance: str,
        new_id: Callable[[], str],
        catch_up_limit: int,
    ) -> None:
        self.coordinator = coordinator
        self.store = store
        self.clock = clock
        self.loops = loops
        self.launcher = launcher
        self.outages = outages
        self.schedules = schedules
        self.is_enabled = is_enabled
        self.instance = instance
        self.new_id = new_id
        self.catch_up_limit = catch_up_limit
        self._recheck = asyncio.Event()
        """Set by each housekeeping round: lost slots waiting for a run on another instance
        look at the ledger again."""
        self.claimed: set[str] = set()
        """Run ids this instance won a claim for whose run is not recorded finished yet."""
        self.lost: dict[str, dict[datetime, str]] = defaultdict(dict)
        """Slots that could not be claimed (store unreachable), with the run id proposed."""
        self.lost_on_their_way = 0
        """Lost slots taken out of :attr:`lost` by a claim of them not answered yet."""
        self.recovering: set[str] = set()
        """Schedules whose recovered slots are being fired."""
        self.lease: WorkLease = WorkLease(timedelta(seconds=30), None)
        """This instance's lease on its work: nothing is claimed while it has lapsed."""
        self.fires: Callable[[], bool] = lambda: True
        """Whether this instance fires now (not while it waits for another mode's fleet)."""
        self.leaves: Callable[[str], bool] = lambda name: False
        """Whether this instance leaves a schedule's slots to the instances that run another
        timing of it (a deploy under way: see :mod:`backend.scheduler.timings`)."""

    @property
    def lost_count(self) -> int:
        return sum(len(entries) for entries in self.lost.values())

    def finished(self, run_id: str) -> None:
        self.claimed.discard(run_id)

    async def busy_elsewhere(self, slots: Sequence[tuple[Schedule, datetime]]) -> dict[str, str]:
        """Under ``single``, which claims nothing: the schedules of ``slots`` (slots about to
        start, ``skip`` and ``queue``) with a run in flight in another process, a Run now of
        one that fires nothing (see :class:`SingleCoordinator`). Empty in the other modes,
        whose claims answer it."""
        coordinator = self.coordinator
        if not isinstance(coordinator, SingleCoordinator):
            return {}
        return await coordinator.busy(((s.name, slot) for s, slot in slots if s.on_overlap != "parallel"), self.instance)

    def horizon(self, schedule: Schedule, now: datetime) -> datetime:
        """How far back a winner keeps its schedule's claims: long enough that a replica
        running late still finds its slot taken (an hour; a minute for sub-minute crons)."""
        return now - (timedelta(minutes=1) if schedule.cron.has_seconds else timedelta(hours=1))

    async def claim(
        self,
        slots: list[tuple[Schedule, datetime]],
        now: datetime,
        *,
        in_store: bool = False,
        run_ids: dict[tuple[str, datetime], str] | None = None,
        due_now: bool = False,
        current: Collection[tuple[str, datetime]] = (),
    ) -> tuple[list[tuple[Schedule, datetime, str]], dict[str, str]]:
        """The slots this instance wins, each with the run id its claim recorded, and the
        schedules of the batch with a run in flight on another instance (name -> run id).

        Fails closed: if the claims cannot be written, nothing is won, and the slots are
        remembered as lost; external fires are not remembered, their caller gets the
        error and looks at what the claim left (``run_ids``: the ids to propose, which it
        knows so). ``in_store`` claims in the store whatever the coordination mode
        (external fires dedupe retries so). ``due_now``: the timer's due slots, which a
        graceful stop finding this claim on its way starts (see :meth:`_stopped_with`);
        of a catch-up's, only ``current`` (``(name, slot)``: the newest slot each schedule's
        catch-up fires, as the timer would) starts then, the others are recorded
        ``missed``, as those it had not started yet."""
        if not in_store and not self.fires():
            return [], {}  # the fleet's own mode fires them (external fires dedupe in the store whatever the mode)
        if not in_store:
            slots = [(schedule, slot) for schedule, slot in slots if not self.leaves(schedule.name)]
            if not slots:
                return [], {}  # left to the instances of the fleet's timing of each
        # The slots due now (the timer's, an external call's, a catch-up's current ones) take
        # their turn with the claim; a catch-up's older slots take it when they start.
        starting = True if due_now or in_store else set(current)
        claims = self.make_claims(slots, now, in_store=in_store, run_ids=run_ids, starting=starting)
        epoch = self.lease.epoch
        try:
            self._check_lease()
            result = await self._send(
                claims, now, in_store=in_store, epoch=None if in_store else epoch, starts=None if due_now else set(current)
            )
        except Unavailable as exc:
            self.outages.trouble("claim", f"not firing {len(slots)} slot(s): cannot claim them", exc)
            if not in_store:
                for (schedule, slot), claim in zip(slots, claims, strict=False):
                    self._remember_lost(schedule, slot, claim.run_id)
            return [], {}
        self.outages.back("claim", self.lost_count + self.lost_on_their_way)
        won = result.won
        if won and not self.lease.holds(epoch):
            # Its answer came back after the lease lapsed (a partition that healed, a process
            # frozen meanwhile): another instance may have taken these runs over since.
            self.claimed.difference_update(claim.run_id for claim in claims)
            if in_store:
                # An external fire: its caller finds its own claim there and starts the run
                # once this instance's lease holds again and nobody closed the run meanwhile
                # (another call may have answered with that run already: giving the claim
                # back would leave that answer naming a run that never runs).
                return [], result.busy
            self._record_missed(claims, result, "this instance's lease lapsed while this slot was being claimed")
            return [], result.busy
        owned = [(schedule, slot, claim.run_id) for (schedule, slot), claim in zip(slots, claims, strict=False) if claim.key in won]
        return owned, result.busy

    def make_claims(
        self,
        slots: list[tuple[Schedule, datetime]],
        now: datetime,
        *,
        in_store: bool = False,
        run_ids: dict[tuple[str, datetime], str] | None = None,
        starting: Collection[tuple[str, datetime]] | bool = False,
    ) -> list[Claim]:
        """One claim per slot; ``run_ids`` reuses the ids of an earlier attempt, whose
        reply may have been lost after it committed. ``starting``: the slots (``True``:
        all) whose runs start once won, which take their schedule's turn with the claim
        (:attr:`Claim.turn`, under ``skip`` and ``queue`` where the coordinator takes turns):
        slots due now. The others (lost slots, a catch-up's older ones) take it as they start
        (see :meth:`Launcher.needs_turn`), as do the runs whose turn their claim left
        undecided (:attr:`ClaimResult.untried`)."""
        trigger: Trigger = "external" if in_store else "self"
        outcome: Outcome = "external" if in_store else self.coordinator.outcome
        turns = self.coordinator.takes_turns

        def turn(schedule: Schedule, slot: datetime) -> bool:
            if not turns or schedule.on_overlap == "parallel":
                return False
            return starting if isinstance(starting, bool) else (schedule.name, slot) in starting
        stamps: dict[datetime, str] = {}  # a batch shares a few slots: format each once

        def key(name: str, slot: datetime) -> str:
            stamp = stamps.get(slot)
            if stamp is None:
                stamp = stamps[slot] = slot_key("", slot)[1:]
            return f"{name}@{stamp}"

        return [
            Claim(
                key(schedule.name, slot),
                schedule.name,
                (run_ids or {}).get((schedule.name, slot)) or self.new_id(),
                self.horizon(schedule, now),
                scheduled_at=slot,
                trigger=trigger,
                outcome=outcome,
                turn=turn(schedule, slot),
            )
            for schedule, slot in slots
        ]

    def _check_lease(self) -> None:
        """Fail closed while this instance's lease has lapsed: what it claimed now, another
        instance may take over before it could start it."""
        if not self.lease.fresh():
            raise Unavailable("this instance's lease on its work has lapsed (it could not renew its heartbeat in time)")

    async def _send(
        self,
        claims: list[Claim],
        now: datetime,
        *,
        in_store: bool = False,
        epoch: int | None = None,
        starts: Collection[tuple[str, datetime]] | None = None,
    ) -> ClaimResult:
        """Claim (raising :class:`Unavailable`); remember the run ids won as pending.
        ``epoch``: the lease's epoch when the timer's due slots, or a catch-up's, were
        claimed; ``starts``: of a catch-up's, the slots a stop starts (``None``: all, the
        timer's; see :meth:`_stopped_with`)."""
        # Pending from before the claim is sent: a placeholder committed while its reply is
        # still on the way is ours, not a dead instance's run for close_abandoned to close.
        proposed = [claim.run_id for claim in claims]
        self.claimed.update(proposed)
        sending = asyncio.ensure_future(
            self.store.claim(claims, self.instance, now) if in_store else self.coordinator.claim(claims, self.instance, now)
        )
        try:
            result = await asyncio.shield(sending)
        except asyncio.CancelledError:
            # Stopping with the claim on its way: it may commit all the same, and its rows
            # would then stay "running" for good. Wait for its answer and settle what it won.
            self.claimed.difference_update(proposed)
            with contextlib.suppress(Exception):
                self._stopped_with(claims, await sending, epoch, starts)
            raise
        except BaseException:
            self.claimed.difference_update(proposed)  # the callers remember what may be ours
            raise
        self.claimed.difference_update(claim.run_id for claim in claims if claim.key not in result.won)
        self.launcher.turns.update(result.turns(claims))
        return result

    def _stopped_with(
        self, claims: Sequence[Claim], result: ClaimResult, epoch: int | None, starts: Collection[tuple[str, datetime]] | None
    ) -> None:
        """The answer of a claim a stop found on its way. What the timer's claim won starts
        when the stop has a grace and the lease held throughout: the other instances lost
        these slots to this one, so recorded ``missed`` they would run nowhere (a rolling
        restart's SIGTERM landing mid-claim), and the grace covers them as it covers the
        runs in flight. So does the newest slot a catch-up's claim was to fire (``starts``:
        a start's on time, or by its policy; one found behind: a restart stopped again
        during its catch-up recorded the current slot missed, and the fleet had lost it).
        Otherwise (no grace, a catch-up's other slots, recovered slots, external fires) it
        is recorded ``missed``."""
        launcher = self.launcher
        if epoch is None or launcher.stop_grace <= 0:
            self._record_missed(claims, result, "the engine stopped while this slot was being claimed")
            return
        if not self.lease.holds(epoch):
            self._record_missed(claims, result, "this instance's lease lapsed while this slot was being claimed")
            return
        older: list[Claim] = []
        for claim in claims:
            schedule = self.schedules.get(claim.name)
            if claim.key in result.won and schedule is not None and claim.scheduled_at is not None:
                if starts is not None and (claim.name, claim.scheduled_at) not in starts:
                    older.append(claim)
                    continue
                self.claimed.add(claim.run_id)
                remote = result.busy.get(claim.name)
                launcher.fire(schedule, claim.scheduled_at, claim.trigger, claim.outcome, claim.run_id, remote=remote)
        if older:
            self._record_missed(older, result, "the engine stopped while this slot was being claimed")

    def _record_missed(self, claims: Sequence[Claim], result: ClaimResult, why: str) -> None:
        """The slots a claim won that are not fired after all: recorded ``missed``."""
        for claim in claims:
            schedule = self.schedules.get(claim.name)
            if claim.key in result.won and schedule is not None and claim.scheduled_at is not None:
                self.launcher.record_missed(
                    schedule, claim.scheduled_at, claim.trigger, claim.outcome, f"not fired: {why}", claim.run_id
                )

    def _remember_lost(self, schedule: Schedule, slot: datetime, run_id: str) -> None:
        lost = self.lost[schedule.name]
        run_id = lost.setdefault(slot, run_id)
        # The claim may have committed with its reply lost: then its placeholder row is ours.
        self.claimed.add(run_id)
        if len(lost) > self.catch_up_limit:  # slots come in order: the first is the oldest
            self.claimed.discard(lost.pop(next(iter(lost))))

    async def recover_lost(self, *, fire_current: bool = False) -> None:
        """Claim and record the slots that could not be claimed while the store was down.

        Every instance that lost a slot tries to claim it now; one wins it (or nobody, if
        another instance fired it in time), and the winner applies the schedule's backfill
        policy to the lost slots it won: ``skip`` records them ``missed``, ``latest`` fires
        the newest lost slot and records the others, ``all`` fires them in order (see
        :meth:`_fire_in_order`); under ``skip`` too, a lost slot that is still the current
        one when it is won fires, late. Called by every housekeeping round.

        A stop records them all ``missed``, but for the current ones when it has a grace
        (``fire_current``, called before the runs in flight are waited for): those start at
        once, as a due slot won by a claim the stop cut short does, if the lease held
        throughout the claim. A lost answer is the others' loss too: they do not claim the
        slot again, so recorded ``missed`` it would run nowhere."""
        self._recheck.set()
        if not self.lost:
            return
        if not self.fires():
            # Waiting for another mode's fleet, which fires these slots (or records them).
            for entries in self.lost.values():
                self.claimed.difference_update(entries.values())
            self.lost.clear()
            return
        if not self.lease.fresh():
            return  # claimed once the lease is renewed
        lost, self.lost = self.lost, defaultdict(dict)
        wanted: list[tuple[Schedule, datetime]] = []
        ids: dict[tuple[str, datetime], str] = {}
        now = self.clock.now()
        for name, entries in lost.items():
            schedule = self.schedules.get(name)
            if schedule is None or self.leaves(name):
                self.claimed.difference_update(entries.values())
                continue
            for slot, run_id in sorted(entries.items()):
                if slot > now:
                    # Due only by a clock that was ahead (its lease lapsed, so its claims
                    # failed), corrected since: not lost, still to come. Claimed and
                    # recorded missed, it was the fleet's loss: no instance ran it.
                    lost[name].pop(slot)
                    self.claimed.discard(run_id)
                    continue
                wanted.append((schedule, slot))
                ids[(name, slot)] = run_id
        if not wanted:
            return
        epoch = self.lease.epoch
        claims = self.make_claims(wanted, now, run_ids=ids)
        # A stop has no next round: a claim whose answer was lost is sent once more (the same
        # run ids: what committed is won again), or its placeholders would stay running.
        self.lost_on_their_way += len(wanted)  # (a timer's claim answered meanwhile counts them)
        try:
            for attempts_left in reversed(range(2 if self.launcher.stopping else 1)):
                try:
                    result = await self._send(claims, now)
                    break
                except Unavailable as exc:
                    if attempts_left:
                        continue
                    for schedule, slot in wanted:
                        self._remember_lost(schedule, slot, ids[(schedule.name, slot)])
                    self.outages.trouble("claim", f"not firing {len(wanted)} slot(s): cannot claim them", exc)
                    return
            self.outages.back("claim", self.lost_count + self.lost_on_their_way)
        finally:
            self.lost_on_their_way -= len(wanted)
        won: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
        for (schedule, slot), claim in zip(wanted, claims, strict=False):
            if claim.key in result.won:
                won[schedule.name].append((slot, claim.run_id))
            else:
                self.claimed.discard(claim.run_id)
        outcome = self.coordinator.outcome
        stopping = self.launcher.stopping  # a stop records them, but for the current ones with a grace
        held = self.lease.holds(epoch)
        for name, mine in won.items():
            schedule = self.schedules[name]
            policy = schedule.backfill if self.is_enabled(name) and not stopping else "skip"
            newest = max(lost[name])
            # The newest lost slot that is still the schedule's current one (its next slot
            # not due yet) is late, not missed: it fires whatever the policy, as the current
            # slot of an engine found behind does. A blip of the store at 09:00 (or one lost
            # answer) delays the 09:00 run; it does not drop it.
            current = (
                policy == "skip"
                and self.is_enabled(name)
                and (not stopping or (fire_current and held))
                and schedule.cron.latest(now) == newest
            )
            if policy == "all":
                to_fire = mine
            elif policy == "latest" or current:
                to_fire = [(slot, run_id) for slot, run_id in mine if slot == newest]
            else:
                to_fire = []
            firing = {slot for slot, _ in to_fire}
            why = "not fired: the store was unreachable when it was due " + (
                "(the engine stopped before it could fire it)" if stopping else f"(backfill={policy})"
            )
            for slot, run_id in mine:
                if slot not in firing:
                    self.launcher.record_missed(schedule, slot, "self", outcome, why, run_id)
            if to_fire and stopping:  # (at once: the stop waits for the runs it finds in flight)
                self.launcher.fire(schedule, newest, "self", outcome, to_fire[0][1], remote=result.busy.get(name))
            elif to_fire:
                self.recovering.add(name)
                self.loops.spawn(self._fire_in_order(schedule, to_fire, result.busy.get(name), epoch), f"recover {name}")
            log.info(
                "%s: %d slot(s) lost while the store was unreachable: %d recorded missed, %d fired (backfill=%s%s)",
                name,
                len(mine),
                len(mine) - len(to_fire),
                len(to_fire),
                policy,
                "; the current slot fires late" if current and to_fire else "",
            )

    async def _fire_in_order(
        self, schedule: Schedule, slots: list[tuple[datetime, str]], remote: str | None, epoch: int
    ) -> None:
        """Fire owned lost slots oldest first, one at a time. They were due when the store
        was down, so a run in flight (the live timer's, here or on another instance) does
        not make ``skip`` skip them: they wait for it. ``queue`` puts them in its queue, in
        slot order, so ahead of the newer slots waiting there (``remote``: a run in flight
        elsewhere, from the claim, holds the queue); ``parallel`` does not wait.

        They were claimed under the lease's ``epoch``: one whose wait outlasts a lapse of it
        is recorded ``missed`` instead, with those after it, whatever renewed the lease
        since (another member may own the schedule by then: under ``cluster`` it took the
        shard and fired the current slot, and the recovered one started beside it)."""
        name = schedule.name
        launcher = self.launcher
        outcome = self.coordinator.outcome
        try:
            if schedule.on_overlap == "queue":
                launcher.enqueue(schedule, [(slot, "self", outcome, run_id) for slot, run_id in slots], remote)
                return
            for index, (slot, run_id) in enumerate(slots):
                with launcher.missed_on_stop(schedule, slots[index:], outcome):
                    if schedule.on_overlap == "skip" and not await self._until_idle(schedule, slot, run_id):
                        continue
                if not self.lease.holds(epoch):
                    why = "not fired: this instance's lease lapsed while this lost slot waited to start"
                    for late, late_id in slots[index:]:
                        launcher.record_missed(schedule, late, "self", outcome, why, late_id)
                    return
                current = self.schedules.get(name)
                if current is not None and current.created_at != schedule.created_at:
                    current = None  # (another schedule of its name)
                if current is None or not self.is_enabled(name):
                    # Deleted or disabled while its slots waited: a deleted schedule's queued
                    # firings are recorded missed, and a disabled one fires nothing.
                    why = f"not fired: the schedule was {'disabled' if current else 'deleted'} before this lost slot started"
                    for late, late_id in slots[index:]:
                        launcher.record_missed(schedule, late, "self", outcome, why, late_id)
                    return
                schedule = current  # (changed meanwhile: its definition now)
                run = launcher.launch(schedule, slot, "self", outcome, run_id)
                with launcher.missed_on_stop(schedule, slots[index + 1 :], outcome):
                    await asyncio.shield(run.finished())
        finally:
            self.recovering.discard(name)
            self.loops.poke()

    async def _until_idle(self, schedule: Schedule, slot: datetime, run_id: str) -> bool:
        """Return once no run of the schedule is in flight here, nor on another instance,
        and this run may start. With turns (``advisoryLock``, see
        :meth:`Launcher.needs_turn`): a run that took its turn with its claim waits only
        for the runs in flight here; any other waits until none there has started, holds
        its turn or is claimed for an older slot, then takes its turn. Without: until none
        there has started, or is claimed for a slot newer than ``slot`` (about to start; an
        older one waits for ours in turn, so two instances never wait for each other). The
        ledger is looked at once, then at each housekeeping round while something is in
        flight. False: the run's row was closed by another instance meanwhile (it must not
        start)."""
        name = schedule.name
        launcher = self.launcher
        turns = launcher.takes_turns

        def busy(r: Run) -> bool:
            if r.name != name or r.instance == self.instance:
                return False
            return r.fired_at is not None or r.held or (r.scheduled_at < slot if turns else r.scheduled_at > slot)

        while True:
            while launcher.inflight[name]:
                # (gone, not finished: a run recorded timeout whose handler runs on keeps its
                # place, and waiting for its finish spun the loop until the handler returned)
                mine = [r.gone() for r in launcher.active.values() if r.schedule.name == name]  # (any definition of it)
                await (asyncio.wait(mine) if mine else asyncio.sleep(0))  # sleep(0): not started yet
                launcher.waits(run_id)
            if run_id in launcher.turns:
                return True  # it holds the turn (its claim's, or taken below): nothing elsewhere starts
            try:
                running = await self.store.running_runs()
                self.outages.back("recover")
            except Unavailable as exc:
                self.outages.trouble("recover", f"{name}: lost slots wait for the store", exc)
                running = None
            if launcher.inflight[name]:
                continue  # started here meanwhile
            if running is not None and not any(busy(r) for r in running):
                if not launcher.needs_turn(schedule, "self", run_id):
                    return True
                try:
                    turn = await self.store.take_turn(run_id, name, slot, self.instance)
                except Unavailable as exc:
                    # (A kind of its own: the read above goes through on a full disk, this
                    # write does not.)
                    self.outages.trouble("recover turn", f"{name}: lost slots wait for the store", exc)
                else:
                    self.outages.back("recover turn")
                    if turn.taken:
                        # (Its own timer may have started a run of the schedule while the
                        # turn was taken: the loop waits for that one first.)
                        launcher.turns.add(run_id)
                        continue
                    if turn.blocker is None:
                        log.warning("%s: lost slot %s not fired: its row was closed by another instance meanwhile", name, slot)
                        return False
            loop = f"recover {name}"
            self.recovering.discard(name)  # parked on the clock: idle for quiesce()
            try:
                await self.loops.park(loop, None, self._recheck)
            finally:
                self.loops.forget(loop)
                self.recovering.add(name)
                self.loops.poke()  # woken (not idle) to wait for a run: idle again for quiesce()
