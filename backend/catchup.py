"""Catch-up: the slots a schedule missed while no engine ran it, or while it was behind.

At start, the slots between a schedule's newest recorded slot (or its re-enabling, if
later) and now were missed; a running engine that finds a schedule more than one slot
behind has missed the older ones. Either way the schedule's ``backfill`` policy decides:
``skip`` records them ``missed``, ``latest`` fires the newest once, ``all`` fires each in
order. At most ``catch_up_limit`` slots are considered, and a schedule's catch-up finishes
before its timer is armed again. Missed slots are claimed like live ones, so N instances
starting together catch each slot up (or record it) once.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from .clock import Clock
from .coordination import SlotClaims
from .errors import Unavailable
from .launcher import Launcher
from .loops import Loops
from .outages import OutageLog
from .schedules import Schedule
from .states import ScheduleStates
from .store import Store
from .timers import Timers

__all__ = ["CatchUp"]

log = logging.getLogger("schedtui.engine")


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
        timers.on_behind = self.behind

    def at_boot(self, schedule: Schedule, now: datetime, *, reason: str | None = None) -> None:
        """Catch the schedule up from where the ledger left off, then arm it. ``reason``
        says why slots were missed (default: the engine was not running)."""
        self.busy.add(schedule.name)
        self.loops.spawn(self._boot(schedule, now, reason), f"catch-up {schedule.name}")

    def behind(self, schedule: Schedule, slots: list[datetime]) -> None:
        """A running engine found the schedule behind: ``slots`` were due, the last is current."""
        self.busy.add(schedule.name)
        self.loops.spawn(self._catch_up(schedule, slots, live=True), f"catch-up {schedule.name}")

    async def _boot(self, schedule: Schedule, now: datetime, reason: str | None = None) -> None:
        try:
            since = await self._where_it_left_off(schedule)
            state = self.states.get(schedule.name)
            if since is not None and state is not None and state.enabled and state.changed_at > since:
                since = state.changed_at  # slots missed while disabled are not caught up
            missed: list[datetime] = []
            if since is not None:
                for slot in schedule.cron.occurrences_back(now):
                    if slot <= since or len(missed) == self.catch_up_limit:
                        break
                    missed.append(slot)
                missed.reverse()
        except BaseException:
            self.busy.discard(schedule.name)
            raise
        if not missed:
            self.busy.discard(schedule.name)
            self.timers.arm(schedule, now)
            return
        await self._catch_up(schedule, missed, reason=reason)

    async def _where_it_left_off(self, schedule: Schedule) -> datetime | None:
        """The schedule's newest recorded slot; while the store is unreachable, wait for it
        (nothing could be claimed meanwhile anyway), parked so that quiesce() sees it idle."""
        name = schedule.name
        while True:
            try:
                return await self.store.last_slot(name)
            except Unavailable as exc:
                self.outages.trouble("catch-up", f"{name}: catch-up waits for the store", exc)
            loop = f"catch-up {name}"
            self.busy.discard(name)
            try:
                await self.loops.park(loop, self.clock.now() + self.poll_interval)
            finally:
                self.loops.forget(loop)
                self.busy.add(name)

    async def _catch_up(
        self, schedule: Schedule, slots: list[datetime], *, live: bool = False, reason: str | None = None
    ) -> None:
        """Apply the schedule's backfill policy to ``slots`` (ascending, all due), then arm.

        At boot every slot is in the past: ``skip`` records them all ``missed``, ``latest``
        fires the newest, ``all`` fires each in order. When a live engine finds itself
        behind (``live``), the newest slot is simply the current one and always fires; the
        policy decides about the older ones."""
        launcher = self.launcher
        try:
            if len(slots) >= self.catch_up_limit:
                log.warning(
                    "%s missed more slots than the catch-up walk considers; only the newest %d are handled",
                    schedule.name,
                    len(slots),
                )
            outcome = self.claims.coordinator.outcome
            policy = schedule.backfill
            if policy == "all":
                to_fire, to_record = slots, []
            elif policy == "latest" or live:
                to_fire, to_record = slots[-1:], slots[:-1]
            else:
                to_fire, to_record = [], slots
            ids: dict[datetime, str] = {}
            remote: str | None = None
            if self.claims.coordinator.needs_claims:
                owned, busy = await self.claims.claim([(schedule, slot) for slot in slots], self.clock.now())
                ids = {slot: run_id for _, slot, run_id in owned}
                remote = busy.get(schedule.name)
                to_fire = [s for s in to_fire if s in ids]
                to_record = [s for s in to_record if s in ids]
            why = (
                f"missed while the engine was behind (backfill={policy})"
                if live
                else f"missed {reason or 'while the engine was not running'} (backfill={policy})"
            )
            for slot in to_record:
                launcher.record_missed(schedule, slot, "self", outcome, why, ids.get(slot))
            for slot in to_fire:
                if remote is not None:  # in flight on another instance: the overlap policy decides
                    launcher.fire(schedule, slot, "self", outcome, ids[slot], remote=remote)
                    continue
                await launcher.launch(schedule, slot, "self", outcome, ids.get(slot)).finished()
            log.info(
                "%s caught up: %d slot(s) recorded missed, %d fired (backfill=%s)",
                schedule.name,
                len(to_record),
                len(to_fire),
                policy,
            )
        finally:
            self.busy.discard(schedule.name)
            # The definition now (a stored schedule may have been changed or deleted meanwhile).
            current = self.timers.schedules.get(schedule.name)
            if (
                current is not None
                and not launcher.stopping
                and self.states.is_enabled(schedule.name)
                and schedule.name not in self.timers.wheel
            ):
                # From the last slot handled: slots that passed during a long catch-up are
                # then late (one) or behind (several), and handled by the same rules.
                self.timers.arm(current, slots[-1] if slots else self.clock.now())
            self.loops.poke()
