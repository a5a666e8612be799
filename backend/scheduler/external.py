"""External fires: a platform scheduler owns the clock and tells us a slot is due.

The fired slot is the newest cron slot at or before now, if it is at most
``tolerance`` (10 minutes) old; a call up to ``early`` (5 s) before a slot counts for that
slot and waits for it (platform clocks run fast). The slot is claimed in the store whatever
the coordination mode, so a platform that retries the call gets the same run back instead of
a second firing, whichever instance it reaches. A schedule an operator disabled fires
nothing: the call is refused, its state read from the store (a disable made through another
instance a moment ago counts, not only once this one's poll has heard of it).

A claim whose answer was lost (the connection broke after the commit) leaves a placeholder
run that only this instance knows is its own: every other call for the slot, here or on
another instance, finds that run and answers with it. So the claim's run id is kept, and
the run is started as soon as the store shows the claim committed: by the call itself when
it can look, else by the next call here or the next housekeeping round (:meth:`recover`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import datetime, timedelta
from typing import NamedTuple

from backend.clock import Clock
from backend.errors import Refused, Unavailable
from backend.model import ExternalFiring, Run, slot_key
from backend.scheduler.coordination.slots import SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger
from backend.scheduler.states import ScheduleStates
from backend.schedules import Schedule
from backend.store import Store
from backend.timeparse import compact_delta

__all__ = ["ExternalFires", "ExternalFiring"]

#: The smallest step of time: a slot's own instant, as a range ``[slot, slot + _TICK)``.
_TICK = timedelta(microseconds=1)

log = logging.getLogger("schedtui.engine")


class _Started(NamedTuple):
    """What starting the run of an unanswered claim did (see :meth:`ExternalFires._start`)."""

    fired: bool
    skipped: Run | None = None


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
        self.unanswered: dict[str, tuple[Schedule, datetime, str]] = {}
        """Claims whose answer was lost, by key: the schedule, slot and run id proposed (its
        placeholder, if the claim committed, is this instance's to start)."""

    async def fire(self, schedule: Schedule) -> ExternalFiring:
        """Fire the slot that is due now (see the module docstring)."""
        name = schedule.name
        async with self._locks[name]:
            now = self.clock.now()
            upcoming = schedule.cron.next_or_none(now)
            if upcoming is not None and upcoming - now <= self.early:
                # A platform whose clock runs a little fast calls just before the slot:
                # that call is for the coming slot, which still never fires early.
                await self.clock.sleep_until(upcoming)
                now = self.clock.now()
            slot = schedule.cron.latest(now)
            key = slot_key(name, slot)
            existing = await self.store.claimed_run(key)
            if existing is not None:
                if key in self.unanswered:
                    return await self._adopt(key, existing)
                return await self._result(existing, created=False)
            await self.states.refresh()  # (a retry of a slot fired before the disable gets its run, above)
            if not self.states.is_enabled(name):
                state = self.states.get(name)
                why = "" if state is None else f" by {state.changed_by} at {state.changed_at.isoformat(timespec='seconds')}"
                if state is not None and state.note:
                    why += f" ({state.note})"
                raise Refused(
                    f'"{name}" is disabled{why}: this call fired nothing; enable it to let the platform fire it again',
                    reason="disabled",
                )
            late = now - slot
            if late > self.tolerance:
                raise Refused(
                    f'no slot of "{name}" is due: the newest, {slot.isoformat()}, is {compact_delta(late)} old '
                    f"(tolerance {compact_delta(self.tolerance)})",
                    reason="no slot due",
                )
            proposed = self.claims.new_id()
            owned, busy = await self.claims.claim([(schedule, slot)], now, in_store=True, run_ids={(name, slot): proposed})
            if not owned:
                # Lost to another call, or the claim failed: committed or not, its answer lost.
                self.unanswered[key] = (schedule, slot, proposed)
                self.claims.claimed.add(proposed)  # (its placeholder is not a dead instance's to close)
                winner = await self.store.claimed_run(key)
                if winner is None:
                    self._forget(key)
                    ran = await self._slot_run(name, slot)
                    if ran is not None:  # fired without a claim (the timer, before a deploy made it external)
                        return await self._result(ran, created=False)
                    raise Unavailable(f"could not claim slot {key}; try again")
                return await self._adopt(key, winner)
            _, _, run_id = owned[0]
            skipped = self.launcher.fire(schedule, slot, "external", "external", run_id, remote=busy.get(name))
            return await self._fired(run_id, skipped)

    async def _slot_run(self, name: str, slot: datetime) -> str | None:
        """The run the ledger holds for the slot, but a manual one (its claim refused because
        of it: fired by the timer under ``single`` or ``cluster``, which claim no key)."""
        runs = await self.store.runs_between([name], slot, slot + _TICK, limit_per_name=10)
        return next((run.id for run in runs.get(name, []) if run.trigger != "manual"), None)

    async def _adopt(self, key: str, run_id: str) -> ExternalFiring:
        """The slot ``key`` is claimed for ``run_id``: if that is the claim of ours whose
        answer was lost, start its run now (this call made it); otherwise answer with it."""
        proposed = self.unanswered[key][2]
        if run_id != proposed:
            self._forget(key)
            return await self._result(run_id, created=False)
        started = await self._start(key)
        if started is None:
            raise Unavailable(f"slot {key} is claimed, but this instance's lease has lapsed; try again")
        if started.fired:
            return await self._fired(run_id, started.skipped)
        return await self._result(run_id, created=False)

    async def _fired(self, run_id: str, skipped: Run | None = None) -> ExternalFiring:
        """The answer of a call that fired ``run_id`` (``skipped``: its run, recorded skipped
        by the overlap policy). Its row waits in the writer when the store cannot take it
        now (a full disk, an outage since the claim): the call fired all the same, and says
        so (answered 503, the platform would believe nothing ran)."""
        try:
            await self.ledger.flush()
        except Unavailable as exc:
            log.warning("run %s was fired; its row is written once the store takes it (%s)", run_id, exc)
            queued = self.launcher.queued_run(run_id)
            active = self.launcher.active.get(run_id)
            return ExternalFiring(run_id, skipped or (active.run if active is not None else None), True, queued=queued)
        return await self._result(run_id, created=True)

    async def _start(self, key: str) -> _Started | None:
        """Start the run of an unanswered claim that committed (``fired``; ``skipped``: its
        run, recorded skipped by the overlap policy). Not ``fired`` when its placeholder was
        started or closed meanwhile (there is nothing to start); ``None`` while this
        instance's lease has lapsed (others may have judged it dead and closed its runs: it
        is kept for later)."""
        schedule, slot, run_id = self.unanswered[key]
        # One read for the placeholder and for what the claim's answer would have said: a
        # run of the schedule in flight on another instance, for its overlap policy (the
        # rule of the claim's own answer, BUSY_ELSEWHERE in the stores: fired, or a
        # placeholder of an earlier slot; the oldest).
        running = await self.store.running_runs()
        run = next((r for r in running if r.id == run_id), None)
        if run is None or run.fired_at is not None:
            self._forget(key)
            return _Started(False)
        if not self.claims.lease.fresh():
            return None
        remote = next(
            (r.id for r in sorted(running, key=lambda r: r.id) if r.name == schedule.name
             and r.instance != self.claims.instance and (r.fired_at is not None or (r.scheduled_at is not None and r.scheduled_at < slot))),
            None,
        )  # fmt: skip
        # (no await from the read above to here: nobody closes the runs of a live instance)
        self._forget(key)
        self.claims.claimed.add(run_id)
        return _Started(True, self.launcher.fire(schedule, slot, "external", "external", run_id, remote=remote))

    def _forget(self, key: str) -> None:
        entry = self.unanswered.pop(key, None)
        if entry is not None:
            self.claims.claimed.discard(entry[2])

    async def recover(self, *, stopping: bool = False) -> None:
        """Each housekeeping round: start the runs of claims whose answer was lost and that
        committed (a retry that went to another instance got that run back, and nobody
        else starts it), while the slot is within the tolerance; past it, the run is
        recorded ``missed``. When the engine stops, they are given back instead (recorded
        missed if they cannot be). Claims that never committed are forgotten; while the
        store cannot be read, they wait for the next round."""
        try:
            for key in list(self.unanswered):
                await self._recover(key, stopping)
        except Unavailable as exc:
            log.info("claims of external fires whose answer was lost: looked at again next round (%s)", exc)

    async def _recover(self, key: str, stopping: bool) -> None:
        schedule = self.unanswered[key][0]
        async with self._locks[schedule.name]:
            if key not in self.unanswered:
                return  # (a call settled it meanwhile)
            _, slot, proposed = self.unanswered[key]
            if await self.store.claimed_run(key) != proposed:
                self._forget(key)  # it never committed: nothing of ours
            elif stopping:
                # Given back, so that the platform's retry fires it elsewhere (or here, after
                # the restart); recorded missed if it cannot be.
                self._forget(key)
                try:
                    released = await self.store.release_claim(key, proposed)
                except Unavailable:
                    released = False
                if not released:
                    why = "not fired: its claim's answer was lost, and the engine stopped"
                    self.launcher.record_missed(schedule, slot, "external", "external", why, proposed)
            elif self.clock.now() - slot > self.tolerance:
                self._forget(key)
                why = f"not fired: its claim's answer was lost, and no call came back for it within {self.tolerance}"
                self.launcher.record_missed(schedule, slot, "external", "external", why, proposed)
            elif (started := await self._start(key)) is not None and started.fired:
                log.info("started run %s of %s, whose claim's answer had been lost", proposed, schedule.name)

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
