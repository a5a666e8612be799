"""External fires: a platform scheduler owns the clock and tells us a slot is due.

The fired slot is the newest cron slot at or before now, if it is at most
``tolerance`` (10 minutes) old; a call up to ``early`` (5 s) before a slot counts for that
slot and waits for it (platform clocks run fast). The slot is claimed in the store whatever
the coordination mode, so a platform that retries the call gets the same run back instead of
a second firing, whichever instance it reaches. A schedule an operator disabled fires
nothing: the call is refused, its state read from the store (a disable made through another
instance a moment ago counts, not only once this one's poll has heard of it).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta

from backend.clock import Clock
from backend.errors import Refused, Unavailable
from backend.model import ExternalFiring, slot_key
from backend.scheduler.coordination.slots import SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger
from backend.scheduler.states import ScheduleStates
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["ExternalFires", "ExternalFiring"]


class ExternalFires:
    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        ledger: RunLedger,
        launcher: Launcher,
        claims: SlotClaims,
        states: ScheduleStates,
        tolerance: timedelta,
        early: timedelta,
    ) -> None:
        self.clock = clock
        self.store = store
        self.ledger = ledger
        self.launcher = launcher
        self.claims = claims
        self.states = states
        self.tolerance = tolerance
        self.early = early
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def fire(self, schedule: Schedule) -> ExternalFiring:
        """Fire the slot that is due now (see the module docstring)."""
        name = schedule.name
        async with self._locks[name]:
            now = self.clock.now()
            upcoming = schedule.cron.next(now)
            if upcoming - now <= self.early:
                # A platform whose clock runs a little fast calls just before the slot:
                # that call is for the coming slot, which still never fires early.
                await self.clock.sleep_until(upcoming)
                now = self.clock.now()
            slot = schedule.cron.latest(now)
            key = slot_key(name, slot)
            existing = await self.store.claimed_run(key)
            if existing is not None:
                return await self._result(existing, created=False)
            await self.states.refresh()  # (a retry of a slot fired before the disable gets its run, above)
            if not self.states.is_enabled(name):
                state = self.states.get(name)
                why = "" if state is None else f" by {state.changed_by} at {state.changed_at.isoformat()}"
                if state is not None and state.note:
                    why += f" ({state.note})"
                raise Refused(
                    f'"{name}" is disabled{why}: this call fired nothing; enable it to let the platform fire it again',
                    reason="disabled",
                )
            late = now - slot
            if late > self.tolerance:
                raise Refused(
                    f'no slot of "{name}" is due: the newest, {slot.isoformat()}, is {late} old '
                    f"(tolerance {self.tolerance})",
                    reason="no slot due",
                )
            owned, busy = await self.claims.claim([(schedule, slot)], now, in_store=True)
            if not owned:
                winner = await self.store.claimed_run(key)
                if winner is None:
                    raise Unavailable(f"could not claim slot {key}; try again")
                return await self._result(winner, created=False)
            _, _, run_id = owned[0]
            self.launcher.fire(schedule, slot, "external", "external", run_id, remote=busy.get(name))
            await self.ledger.flush()
            return await self._result(run_id, created=True)

    async def _result(self, run_id: str, *, created: bool) -> ExternalFiring:
        """The run a claim points at; its row may still be on its way from another instance."""
        for _ in range(40):
            if self.launcher.queued_run(run_id):
                return ExternalFiring(run_id, None, created, queued=True)
            active = self.launcher.active.get(run_id)
            if active is None:
                await self.ledger.flush()  # our own latest version first, not the claim's placeholder
            run = active.run if active is not None else await self.store.get_run(run_id)
            if run is not None:
                return ExternalFiring(run_id, run, created)
            await asyncio.sleep(0.05)  # the winner commits its run within one group commit
        raise Unavailable(f"run {run_id} was claimed but is not recorded yet; try again")
