"""Catch-up: the slots a schedule missed while no engine ran it, or while it was behind.

At start, the slots between a schedule's newest recorded slot (or its re-enabling, if
later) and now were missed; a running engine that finds a schedule more than one slot
behind has missed the older ones. Either way the schedule's ``backfill`` policy decides:
``skip`` records them ``missed``, ``latest`` fires the newest once, ``all`` fires each in
order. At most ``catch_up_limit`` slots are considered, and a schedule's catch-up finishes
before its timer is armed again. Missed slots are claimed like live ones, so N instances
starting together catch each slot up (or record it) once.

The slots it fires keep the overlap policy: under ``skip`` a slot meets a run in flight
(here or elsewhere) as a timer slot would; ``queue`` slots join the queue in slot order;
otherwise each runs once the one before it has ended. Contract: every slot a catch-up
holds gets a row, including those due while it held the timer if the schedule is disabled
before it ends (recorded ``missed``), and a stop records the ones not started yet; only a
catch-up never disabled meanwhile re-arms the timer, so none fires a slot twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice

from backend.clock import Clock
from backend.errors import Unavailable
from backend.model import Trigger
from backend.runtime.loops import Loops
from backend.runtime.outages import OutageLog
from backend.scheduler.coordination.slots import SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.states import ScheduleStates
from backend.scheduler.timers import Behind, Timers
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["CatchUp"]

log = logging.getLogger("schedtui.engine")

#: At most this many slots recorded ahead of a stepped-back clock are read, per schedule.
_AHEAD_LIMIT = 100_000

#: Slots claimed in one go when a batch of schedules catches up at start or take-over.
_CLAIM_CHUNK = 5_000
#: At a start, the slots due at most this long ago are current ones, not missed: each fires
#: whatever the backfill policy. Another live instance may be about to fire them (its
#: clock a little behind this one's, its loop busy) and the claim decides which one runs
#: each; recorded ``missed`` here, a restart of one instance took them from the fleet (a
#: start two seconds ahead took the one before the newest of an every-second schedule).
BOOT_GRACE = timedelta(seconds=2)


@dataclass(eq=False)
class _Hold:
    """A catch-up keeping its schedule unarmed until it ends."""

    disabled_at: datetime | None = None
    """When the schedule was first disabled meanwhile: the catch-up holds the slots due
    until then (a re-enable arms the timer, which handles the later ones)."""


class CatchUp:
    """Runs catch-ups, one task per schedule; ``busy`` names the schedules catching up."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        loops: Loops,
        claims: SlotClaims,
        launcher: Launcher,
        timers: Timers,
        outages: OutageLog,
        states: ScheduleStates,
        catch_up_limit: int,
        poll_interval: timedelta,
    ) -> None:
        self.clock = clock
        self.store = store
        self.loops = loops
        self.claims = claims
        self.launcher = launcher
        self.timers = timers
        self.outages = outages
        self.states = states
        self.catch_up_limit = catch_up_limit
        self.poll_interval = poll_interval
        self.busy: set[str] = set()
        self.holds: dict[str, list[_Hold]] = defaultdict(list)
        """The catch-ups in progress that fire slots, per schedule."""
        self._booting: list[tuple[Schedule, datetime, str | None, timedelta]] = []
        """Schedules waiting for the next read of where they left off (see :meth:`at_boot`)."""
        self._resting: list[tuple[Schedule, datetime]] = []
        """Disabled schedules waiting for the same read (see :meth:`resting_at_boot`)."""
        self._boot_batches = 0
        self.code_timing_changed: dict[str, datetime] = {}
        """When the cron or zone of schedules defined in code changed, as the store recorded
        it at start (a deploy that changed them; see :func:`lifecycle.record_code_timings`)."""
        self.unhanded = 0
        """Catch-ups spawned that have not yet launched their first run or recorded their
        slots: ``quiesce(runs=False)`` waits for them."""
        timers.on_behind = self.behind
        timers.on_disabled = self.disabled

    def at_boot(
        self, schedule: Schedule, now: datetime, *, reason: str | None = None, late_by: timedelta = timedelta(0)
    ) -> None:
        """Catch the schedule up from where the ledger left off, then arm it. ``reason``
        says why slots were missed (default: the engine was not running). The newest slot
        fires whatever the policy if it was due ``late_by`` before ``now`` at most (at
        least :data:`BOOT_GRACE`: the current slot, which is not late). The schedules
        asked for together (an engine starting, a shard taken over) share one read of
        where they left off: one query for a thousand schedules, not a thousand."""
        self.busy.add(schedule.name)
        self._booting.append((schedule, now, reason, late_by))
        self._boot_soon()

    def resting_at_boot(self, schedule: Schedule, now: datetime) -> None:
        """A self-triggered schedule disabled as the engine starts: nothing to catch up, but
        the slots it has recorded ahead of the clock (stepped back since) are passed over
        once it is enabled again, as an enabled one's are."""
        self._resting.append((schedule, now))
        self._boot_soon()

    def _boot_soon(self) -> None:
        """Read where the schedules asked for left off, in one batch, once the caller's
        loop lets the task run (every schedule asked for until then joins it)."""
        if len(self._booting) + len(self._resting) == 1:
            self._boot_batches += 1
            loop = f"catch-up boot {self._boot_batches}"
            self.loops.expect(loop)  # quiesce() waits for it to hand its schedules on
            self.loops.spawn(self._boot(loop), "catch-up boot")

    async def behind(self, catching: list[Behind]) -> None:
        """A running engine found these schedules behind, each with the slots that were
        due (the last is current, unless it ran already). Their slots are claimed together,
        here in the timers' pass, before each schedule's catch-up starts: a stalled process
        that finds its whole burst behind pays a few transactions, not one per schedule (on
        PostgreSQL, when it can least afford them). A schedule whose current slot ran
        already (by a clock since stepped back) has only past slots left: its policy decides
        about each, as at a start; none fires as the current one."""
        names = [b.schedule.name for b in catching]
        self.busy.update(names)
        try:
            claimed = await self._claim_together(
                [(b.schedule, b.slots) for b in catching],
                current={(b.schedule.name, b.slots[-1]) for b in catching if b.current},
            )
        except Exception:  # a bug: it must not stop the timers; each catch-up claims its own
            log.exception("could not claim the slots of %d schedule(s) found behind together", len(catching))
            self.busy.update(names)
            claimed = None
        for schedule, slots, current in catching:
            claim = claimed.get(schedule.name, ({}, None)) if claimed is not None else None
            self._spawn(schedule, slots, live=current, claimed=claim, reason=None if current else "while the engine was behind")

    async def _boot(self, loop: str) -> None:
        try:
            await self._boot_batch(loop)
        finally:
            self.loops.forget(loop)
            self.loops.poke()

    async def _boot_batch(self, loop: str) -> None:
        batch, self._booting = self._booting, []
        resting, self._resting = self._resting, []
        names = [schedule.name for schedule, *_ in batch]
        try:
            left_off = await self._where_they_left_off([*names, *(schedule.name for schedule, _ in resting)], loop)
        except BaseException:
            self.busy.difference_update(names)
            raise
        # A newest recorded slot ahead of the clock: it was stepped back since. The slots
        # recorded ahead are passed over as they come due; the catch-up starts where the
        # schedule left off before them (the slots of a downtime since are due all the same).
        stepped = [schedule.name for schedule, now, *_ in batch if schedule.name in left_off and left_off[schedule.name] > now]
        left_off_before: dict[str, datetime] = {}
        if stepped:
            try:
                left_off_before = await self._where_they_left_off(stepped, loop, until=max(now for _, now, *_ in batch))
            except BaseException:
                self.busy.difference_update(names)
                raise
        catching: list[tuple[Schedule, list[datetime], str | None, int]] = []
        ahead = [(schedule, now, left_off[schedule.name]) for schedule, now in resting if left_off.get(schedule.name, now) > now]
        for schedule, now, reason, late_by in batch:
            recorded = left_off.get(schedule.name)
            if recorded is not None and recorded > now:
                ahead.append((schedule, now, recorded))
            since = left_off_before.get(schedule.name) if schedule.name in stepped else recorded
            never_ran = recorded is None
            changed = schedule.timing_changed_at or self.code_timing_changed.get(schedule.name)
            state = self.states.get(schedule.name)
            if since is None and schedule.name in stepped:
                # It ran only at slots ahead of the clock: its catch-up starts where what it
                # is now began here (created, re-enabled, its timing changed), if that did.
                enabled_at = state.changed_at if state is not None and state.enabled else None
                since = max((t for t in (schedule.created_at, changed, enabled_at) if t is not None and t <= now), default=None)
            if never_ran and late_by:
                # Never run, and taken over: the hand-over window's newest slot is due all the
                # same (the owner before would have fired it), not only those after now.
                since = now - late_by
            if since is not None and schedule.created_at is not None and schedule.created_at > since:
                since = schedule.created_at  # where a deleted namesake left off: not this one's slots
            if since is not None and changed is not None and changed > since:
                since = changed  # slots before its cron or zone changed were another timing's
            if since is not None and state is not None and state.enabled and state.changed_at > since:
                since = state.changed_at  # slots missed while disabled are not caught up
            missed: list[datetime] = []
            if since is not None:
                for slot in schedule.cron.occurrences_back(now):
                    if slot <= since or len(missed) == self.catch_up_limit:
                        break
                    missed.append(slot)
                missed.reverse()
                if never_ran:
                    missed = missed[-1:]  # (nothing before it was ever due to it here)
            if missed:
                # At a start, a slot due within BOOT_GRACE is not late (the timer, armed after
                # now, would not fire it, and another instance may be about to): each fires
                # whatever the policy, as a live catch-up's newest does. At a cluster
                # hand-over (late_by), nobody else fires the window's slots: its newest fires
                # if it was held up by less than late_by, the older ones were missed.
                if late_by:
                    on_time = int(missed[-1] >= now - max(late_by, BOOT_GRACE))
                else:
                    on_time = sum(1 for slot in missed if slot >= now - BOOT_GRACE)
                catching.append((schedule, missed, reason, on_time))
            else:
                self.busy.discard(schedule.name)
                self.timers.arm(schedule, now)
        if ahead:
            await self._pass_over_recorded(ahead)
        newest = {(schedule.name, slot) for schedule, missed, _, on_time in catching for slot in _current(schedule, missed, on_time)}
        claimed = await self._claim_together([(schedule, missed) for schedule, missed, *_ in catching], current=newest)
        for schedule, missed, reason, on_time in catching:
            claim = claimed.get(schedule.name, ({}, None)) if claimed is not None else None
            self._spawn(schedule, missed, reason=reason, claimed=claim, on_time=on_time)
        self.loops.poke()

    async def _pass_over_recorded(self, ahead: list[tuple[Schedule, datetime, datetime]]) -> None:
        """Schedules whose newest recorded slot is ahead of the clock: it was stepped back
        since (NTP correcting a fast one; a host whose clock kept local time). The slots the
        ledger holds between now and then ran already: the timers pass over each when it
        comes due; the others (never fired) fire as usual."""
        start = min(now for _, now, _ in ahead)
        end = max(since for *_, since in ahead) + timedelta(seconds=1)  # (runs_between's end is open)
        try:
            found = await self.store.runs_between(
                [schedule.name for schedule, *_ in ahead], start, end, limit_per_name=_AHEAD_LIMIT
            )
        except Unavailable as exc:  # (a store down now was up a moment ago: the slots fire again)
            log.error("cannot read the slots recorded ahead of the clock: %s; they may fire again", exc)
            return
        # Two clocks of a fleet may differ by twice the limit each is held to: a slot another
        # instance fired that little ahead of this clock is no sign of a clock stepped back.
        tolerance = timedelta(seconds=2 * self.claims.lease.jump_limit)
        for schedule, now, since in ahead:
            slots = {r.scheduled_at for r in found.get(schedule.name, []) if r.trigger != "manual" and r.scheduled_at > now}
            self.timers.pass_over(schedule.name, slots)
            if since - now <= tolerance:
                log.info(
                    "%s: its newest recorded slot (%s) is %.3fs ahead of this clock, within what two clocks of the "
                    "fleet may differ by; %d recorded slot(s) until then ran already and do not fire again",
                    schedule.name, since.isoformat(), (since - now).total_seconds(), len(slots),
                )  # fmt: skip
                continue
            log.warning(
                "%s: its newest recorded slot (%s) is ahead of this clock (%s): was the clock stepped back? "
                "%d recorded slot(s) until then ran already and do not fire again",
                schedule.name, since.isoformat(), now.isoformat(), len(slots),
            )  # fmt: skip

    async def _claim_together(
        self, catching: list[tuple[Schedule, list[datetime]]], *, current: Collection[tuple[str, datetime]] = ()
    ) -> dict[str, tuple[dict[datetime, str], str | None]] | None:
        """Claim the slots of several schedules' catch-ups together, a chunk at a time: a
        start, a shard taken over or a burst found behind costs a few transactions, not one
        per schedule. Per schedule: the slots won (with their run ids) and the instance running
        it elsewhere, if any; ``None`` when the coordination claims nothing."""
        if not catching or not self.claims.coordinator.needs_claims:
            return None
        claimed: dict[str, tuple[dict[datetime, str], str | None]] = {}
        try:
            pairs = [(schedule, slot) for schedule, slots in catching for slot in slots]
            for start in range(0, len(pairs), _CLAIM_CHUNK):
                owned, busy = await self.claims.claim(pairs[start : start + _CLAIM_CHUNK], self.clock.now(), current=current)
                for schedule, slot, run_id in owned:
                    claimed.setdefault(schedule.name, ({}, None))[0][slot] = run_id
                for name, instance in busy.items():
                    claimed[name] = (claimed.get(name, ({}, None))[0], instance)
        except BaseException:
            self.busy.difference_update(schedule.name for schedule, _ in catching)
            raise
        return claimed

    async def _where_they_left_off(self, names: list[str], loop: str, *, until: datetime | None = None) -> dict[str, datetime]:
        """The schedules' newest recorded slots (at or before ``until``); while the store is
        unreachable, wait for it (nothing could be claimed meanwhile anyway), parked so that
        quiesce() sees it idle."""
        while True:
            try:
                last = await self.store.last_slots(names, until=until)
            except Unavailable as exc:
                self.outages.trouble("catch-up", f"catch-up of {len(names)} schedule(s) waits for the store", exc)
            else:
                self.outages.back("catch-up")
                return last
            self.busy.difference_update(names)
            try:
                await self.loops.park(loop, self.clock.now() + self.poll_interval)
            finally:
                self.loops.forget(loop)
                self.busy.update(names)

    def disabled(self, name: str) -> None:
        """The schedule was disabled: every catch-up holding it answers for the slots due
        until then only (a re-enable arms its timer, which handles the later ones)."""
        state = self.states.get(name)
        at = state.changed_at if state is not None and not state.enabled else self.clock.now()
        for hold in self.holds.get(name, ()):
            if hold.disabled_at is None:
                hold.disabled_at = at

    def _spawn(
        self,
        schedule: Schedule,
        slots: list[datetime],
        *,
        live: bool = False,
        fire: bool = True,
        reason: str | None = None,
        claimed: tuple[dict[datetime, str], str | None] | None = None,
        on_time: int = 0,
    ) -> None:
        """Start a catch-up as a task of its own, counted in :attr:`unhanded` until it
        hands its slots on."""
        self.unhanded += 1
        catch_up = self._catch_up(
            schedule, slots, live=live, fire=fire, reason=reason, claimed=claimed, counted=True, on_time=on_time
        )
        self.loops.spawn(catch_up, f"catch-up {schedule.name}")

    def _handed(self) -> None:
        self.unhanded -= 1
        self.loops.poke()

    async def _catch_up(
        self,
        schedule: Schedule,
        slots: list[datetime],
        *,
        live: bool = False,
        fire: bool = True,
        reason: str | None = None,
        claimed: tuple[dict[datetime, str], str | None] | None = None,
        counted: bool = False,
        on_time: int = 0,
    ) -> None:
        """Apply the schedule's backfill policy to ``slots`` (ascending, all due), then arm.

        At boot every slot is in the past: ``skip`` records them all ``missed``, ``latest``
        fires the newest, ``all`` fires each in order. When a live engine finds itself
        behind (``live``), the newest slot is simply the current one and always fires; the
        policy decides about the older ones; so it is at boot when the newest is not late,
        or late by a cluster hand-over only: the newest ``on_time`` slots are current, each
        fires. Without ``fire``, all are recorded ``missed``.
        A slot fired while a run of the schedule is in flight (here or elsewhere) goes
        through the overlap policy, as any timer firing."""
        launcher = self.launcher
        name = schedule.name
        # While it runs the schedule is not armed. A disable ends that (a re-enable arms
        # the timer, which may even start another catch-up meanwhile): this one then only
        # answers for the slots due until the disable.
        hold = _Hold() if fire else None
        if hold is not None:
            self.holds[name].append(hold)
        try:
            if len(slots) >= self.catch_up_limit:
                log.warning(
                    "%s missed more slots than the catch-up walk considers; only the newest %d are handled",
                    name,
                    len(slots),
                )
            outcome = self.claims.coordinator.outcome
            policy = schedule.backfill if fire else "skip"
            if policy == "all":
                to_fire, to_record = slots, []
            elif on_time and fire:
                to_fire, to_record = slots[-on_time:], slots[:-on_time]
            elif policy == "latest" or (live and fire):
                to_fire, to_record = slots[-1:], slots[:-1]
            else:
                to_fire, to_record = [], slots
            ids: dict[datetime, str] = {}
            remote: str | None = None
            if claimed is not None:  # claimed with the other schedules of its batch
                ids, remote = claimed
                to_fire = [s for s in to_fire if s in ids]
                to_record = [s for s in to_record if s in ids]
            elif self.claims.coordinator.needs_claims:
                newest = {(name, slot) for slot in (slots[-1:] if live else _current(schedule, slots, on_time))} if fire else set()
                owned, busy = await self.claims.claim([(schedule, slot) for slot in slots], self.clock.now(), current=newest)
                ids = {slot: run_id for _, slot, run_id in owned}
                remote = busy.get(name)
                to_fire = [s for s in to_fire if s in ids]
                to_record = [s for s in to_record if s in ids]
            elif not self.claims.fires():
                to_fire, to_record = [], []  # waiting for another mode's fleet, which fires them
            elif to_fire:  # single: no claim, but a Run now of a process that fires nothing counts
                remote = (await self.claims.busy_elsewhere([(schedule, to_fire[0])])).get(name)
            if not fire:
                why = "due while a catch-up held the schedule's timer, and disabled before it ended"
            elif live:
                why = f"missed while the engine was behind (backfill={policy})"
            else:
                why = f"missed {reason or 'while the engine was not running'} (backfill={policy})"
            for slot in to_record:
                launcher.record_missed(schedule, slot, "self", outcome, why, ids.get(slot))
            if schedule.on_overlap == "queue":
                # Into the queue, in slot order among the slots waiting there (the timer's
                # may join while these run); it runs them one at a time.
                trigger: Trigger = "self"
                entries = [(slot, trigger, outcome, ids.get(slot)) for slot in to_fire]
                launcher.enqueue(schedule, entries, remote)
            for index, slot in enumerate(to_fire if schedule.on_overlap != "queue" else []):
                current = self.timers.schedules.get(name)
                if current is not None and current.created_at != schedule.created_at:
                    current = None  # (another schedule of its name)
                if current is None or not self.states.is_enabled(name):
                    # Deleted meanwhile (maybe created again under its name: another
                    # schedule, whose slots these are not), or disabled now (it fires
                    # nothing; paused and enabled again, it goes on): the slots not started
                    # yet are recorded missed, as a deleted schedule's queued firings are.
                    why_not = f"the schedule was {'disabled' if current else 'deleted'} before this caught-up firing started"
                    for left in to_fire[index:]:
                        launcher.record_missed(schedule, left, "self", outcome, why_not, ids.get(left))
                    break
                schedule = current  # (changed meanwhile: its definition now)
                # A run in flight here or on another instance (an engine behind usually has
                # one): the overlap policy decides, as for any timer firing. Otherwise each
                # slot runs once the one before it has ended.
                if (remote is not None or launcher.inflight[name]) and schedule.on_overlap == "skip":
                    launcher.fire(schedule, slot, "self", outcome, ids.get(slot) or launcher.new_id(), remote=remote)
                    continue
                if index:
                    launcher.waits(ids.get(slot))  # (it waited for the one before it)
                run = launcher.launch(schedule, slot, "self", outcome, ids.get(slot))
                if counted:
                    counted = False
                    self._handed()  # its run is the runner's now (see Runner.unbegun)
                if index == len(to_fire) - 1:
                    # The last one need not end first: the timer's slots then meet it as the
                    # overlap policy says (skipped while it runs, or run beside it). Waited
                    # for, they came due behind the catch-up and were caught up in turn,
                    # after each run: a schedule whose runs outlast its interval never came
                    # back to its timer. (``queue`` slots are queued above, not fired here.)
                    # Started first, so that a ``parallel`` slot due meanwhile starts after it.
                    await asyncio.shield(run.started())
                    break
                with launcher.missed_on_stop(schedule, [(s, ids.get(s)) for s in to_fire[index + 1 :]], outcome):
                    await asyncio.shield(run.finished())
            if to_record or to_fire:
                # (Nothing won, as while the store is down: a line per schedule per round
                # would say nothing happened, every 2 s.)
                log.info(
                    "%s caught up: %d slot(s) recorded missed, %d fired (backfill=%s)",
                    name,
                    len(to_record),
                    len(to_fire),
                    policy,
                )
        finally:
            if counted:
                self._handed()
            self.busy.discard(name)
            if hold is not None:
                self.holds[name].remove(hold)
                await self._after(schedule, slots, hold)
            self.loops.poke()

    async def _after(self, schedule: Schedule, slots: list[datetime], hold: _Hold) -> None:
        """A firing catch-up ended (or was cancelled by a stop)."""
        name = schedule.name
        if hold.disabled_at is not None and slots:
            # Disabled meanwhile: the slots that came due before that, while this catch-up
            # held the timer, still get their (missed) rows, claimed as usual; when
            # stopping, now (a next start would not look for them).
            until = min(hold.disabled_at, self.clock.now())
            held = list(islice(schedule.cron.occurrences(slots[-1], until), self.catch_up_limit))
            ran = self.timers.taken.get(name, ())  # (by a clock since stepped back: not again)
            held = await self._unrecorded(name, [slot for slot in held if slot not in ran])
            if held and self.launcher.stopping:
                with contextlib.suppress(Unavailable):
                    await self._catch_up(schedule, held, live=True, fire=False)
            elif held:
                self.busy.add(name)
                self._spawn(schedule, held, live=True, fire=False)
        elif name not in self.timers.wheel and self.states.is_enabled(name) and not self.launcher.stopping:
            # Never disabled meanwhile, so the only catch-up holding the schedule: re-arm it
            # from the last slot handled. Slots that passed during a long catch-up are then
            # late (one) or behind (several), and handled by the same rules (after a stop,
            # by the next start's catch-up). The definition now: a stored schedule may have
            # been changed or deleted meanwhile.
            current = self.timers.schedules.get(name)
            if current is not None:
                now = self.clock.now()
                after = slots[-1] if slots else now
                changed = current.timing_changed_at
                if changed is not None and changed > after:
                    # Its cron or zone changed meanwhile: the new timing's slots from before
                    # the change were never its own (as when an armed schedule is changed).
                    after = min(changed, now)
                self.timers.arm(current, after)

    async def _unrecorded(self, name: str, slots: list[datetime]) -> list[datetime]:
        """``slots`` without those the ledger already holds a timed run of. Slots recorded
        before the clock was stepped back come due again; the timer passes over those the
        engine was told of at its start (:attr:`Timers.taken`), but a catch-up disabled
        meanwhile recorded one ``missed`` beside its run all the same (the stateful test
        found it). In a fleet a claim would refuse it; under ``single`` nothing else does."""
        if not slots:
            return slots
        try:
            found = await self.store.runs_between([name], slots[0], slots[-1] + timedelta(seconds=1), limit_per_name=_AHEAD_LIMIT)
        except Unavailable:
            return slots  # (as before the read: in a fleet the claims still refuse them)
        recorded = {r.scheduled_at for r in found.get(name, []) if r.trigger != "manual"}
        return [slot for slot in slots if slot not in recorded]


def _current(schedule: Schedule, slots: list[datetime], on_time: int) -> list[datetime]:
    """The slots a catch-up at a start fires as current ones (a stop that cuts its claim
    short starts those within its grace: see ``SlotClaims.claim``): the newest ``on_time``,
    due within the grace; if none is, the newest where the policy fires it."""
    if on_time:
        return slots[-on_time:]
    return slots[-1:] if schedule.backfill in ("latest", "all") else []
