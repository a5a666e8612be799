"""The timers: each self-triggered schedule's next slot, and the loop that fires them.

:class:`TimerWheel` holds the armed slots: **one entry per schedule, by construction**
(arming a schedule that is armed already moves its entry), all in one heap keyed by slot,
so a thousand schedules due at the same second cost one heap operation. :class:`Timers`
is the loop over it: when slots come due it claims them (one round trip for the whole
burst when the coordination mode needs claims), starts their handlers back to back, and
only then spends time computing each schedule's next slot, once per distinct expression.
A schedule found more than one slot behind (a suspended VM, a blocked loop) is handed to
catch-up instead.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice, takewhile
from typing import Any, Final, NamedTuple

from backend.clock import Clock
from backend.model import Outcome
from backend.runtime.loops import Loops
from backend.scheduler.coordination.slots import SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger
from backend.schedules import Schedule

__all__ = ["NO_SLOT", "Behind", "TimerWheel", "Timers", "slot_after"]

# Handlers due at one instant are started in slices of this size, yielding to the loop in
# between, so the first ones start before the last ones are even created.
START_SLICE: Final = 32


#: The slot after a schedule's last one (the end of the calendar, year 9999): it never
#: comes due, and the timer loop disarms a schedule whose next slot it is.
NO_SLOT: Final = datetime.max.replace(tzinfo=UTC)


def slot_after(schedule: Schedule, slot: datetime) -> datetime:
    """The schedule's slot after ``slot``, :data:`NO_SLOT` when it has none."""
    nxt = schedule.cron.next_or_none(slot)
    return NO_SLOT if nxt is None else nxt


class Behind(NamedTuple):
    """A schedule found behind: the slots that were due (ascending) and whether the last of
    them is its current slot. It is not when the current one ran already, by a clock that
    was ahead (see :meth:`Timers.pass_over`): then every slot left is a past one."""

    schedule: Schedule
    slots: list[datetime]
    current: bool


async def _nothing_behind(catching: list[Behind]) -> None:
    pass


class TimerWheel:
    """Armed slots: ``name -> (slot, the slot after)``, and a heap of distinct slots.

    Contract: a schedule has at most one armed slot, and :meth:`pop_due` returns each
    armed schedule at most once per slot, however often it was armed, disarmed and armed
    again. A popped schedule stays *armed at the popped slot* (no heap entry) until it is
    armed anew or disarmed: that is how the firing loop knows it was not disabled meanwhile.
    """

    def __init__(self) -> None:
        self._heap: list[datetime] = []
        self._due_at: dict[datetime, dict[str, None]] = {}  # slot -> names (an ordered set)
        self._armed: dict[str, tuple[datetime, datetime]] = {}

    def __len__(self) -> int:
        return len(self._armed)

    def __contains__(self, name: object) -> bool:
        return name in self._armed

    def armed(self, name: str) -> tuple[datetime, datetime] | None:
        return self._armed.get(name)

    def arm(self, name: str, slot: datetime, following: datetime) -> None:
        old = self._armed.get(name)
        if old is not None:
            names = self._due_at.get(old[0])
            if names is not None:
                names.pop(name, None)
        self._armed[name] = (slot, following)
        names = self._due_at.get(slot)
        if names is None:
            self._due_at[slot] = {name: None}
            heapq.heappush(self._heap, slot)
        else:
            names[name] = None

    def disarm(self, name: str) -> None:
        old = self._armed.pop(name, None)
        if old is not None:
            names = self._due_at.get(old[0])
            if names is not None:
                names.pop(name, None)

    def pending(self, name: str) -> bool:
        """Whether the schedule is armed and its slot not yet popped (firing)."""
        armed = self._armed.get(name)
        return armed is not None and name in self._due_at.get(armed[0], ())

    def next_at(self) -> datetime | None:
        return self._heap[0] if self._heap else None

    def pop_due(self, now: datetime) -> list[tuple[str, datetime, datetime]]:
        """Every armed ``(name, slot, following)`` whose slot is at or before ``now``, in
        slot order."""
        due: list[tuple[str, datetime, datetime]] = []
        while self._heap and self._heap[0] <= now:
            slot = heapq.heappop(self._heap)
            for name in self._due_at.pop(slot, ()):
                armed = self._armed[name]
                due.append((name, slot, armed[1]))
        return due


class Timers:
    """Fires armed slots when they come due. See the module docstring."""

    def __init__(
        self,
        *,
        clock: Clock,
        loops: Loops,
        ledger: RunLedger,
        launcher: Launcher,
        claims: SlotClaims,
        schedules: dict[str, Schedule],
        is_enabled: Callable[[str], bool],
        catch_up_limit: int,
    ) -> None:
        self.clock = clock
        self.loops = loops
        self.ledger = ledger
        self.launcher = launcher
        self.claims = claims
        self.schedules = schedules
        self.is_enabled = is_enabled
        self.catch_up_limit = catch_up_limit
        self.wheel = TimerWheel()
        self._wake = asyncio.Event()
        self.may_arm: Callable[[str], bool] = lambda name: True
        """Whether this instance fires the schedule (``cluster``: its shard is held here)."""
        self.on_behind: Callable[[list[Behind]], Awaitable[None]] = _nothing_behind
        """Told, once per pass, of every schedule found behind with its due slots (ascending,
        the current one last, unless it ran already); it takes over re-arming them, from
        the last slot it handled. Awaited, so that the pass has handled them before the loop
        parks."""
        self.on_disabled: Callable[[str], None] = lambda name: None
        """Called with a schedule just disabled (see :meth:`disabled`)."""
        self.taken: dict[str, set[datetime]] = {}
        """Per schedule, slots the ledger holds ahead of the clock (it was stepped back, and
        the engine started again): each is passed over when it comes due, not fired again
        (see :meth:`pass_over`)."""

    def pass_over(self, name: str, slots: set[datetime]) -> None:
        """Never fire these slots of ``name``: they ran already (by a clock that was ahead)."""
        if slots:
            self.taken.setdefault(name, set()).update(slots)

    def _taken(self, name: str, slot: datetime) -> bool:
        slots = self.taken.get(name)
        if slots is None or slot not in slots:
            return False
        slots.discard(slot)
        if not slots:
            del self.taken[name]
        return True

    def _untaken(self, name: str, due: list[datetime], now: datetime) -> list[datetime]:
        """``due`` (a schedule found behind) without the slots that ran already. Those are
        forgotten only up to where the schedule is armed again from: the last slot left (its
        catch-up re-arms from there), or now when none is left. The ones after it come due
        again, and must still be passed over."""
        taken = self.taken.get(name, set())
        left = [s for s in due if s not in taken]
        through = left[-1] if left else now
        taken.difference_update([s for s in taken if s <= through])
        if not taken:
            self.taken.pop(name, None)
        return left

    def start(self) -> None:
        self._wake = asyncio.Event()
        self.loops.expect("timers")
        self.loops.keep(self._loop, "timers")

    def arm(self, schedule: Schedule, after: datetime) -> None:
        """Arm the schedule's first slot after ``after`` (none left: disarm it)."""
        slot = schedule.cron.next_or_none(after)
        if slot is None:
            self.wheel.disarm(schedule.name)
            return
        self.arm_at(schedule, slot, slot_after(schedule, slot))

    def arm_at(self, schedule: Schedule, slot: datetime, following: datetime) -> None:
        if not self.may_arm(schedule.name):
            return
        self.wheel.arm(schedule.name, slot, following)
        if self.loops.needs_wake("timers", slot):
            self._wake.set()

    def disarm(self, name: str) -> None:
        self.wheel.disarm(name)

    def disabled(self, name: str) -> None:
        """The schedule was disabled: disarm it, and tell ``on_disabled``."""
        self.wheel.disarm(name)
        self.on_disabled(name)

    def next_slot(self, name: str) -> datetime | None:
        armed = self.wheel.armed(name)
        return armed[0] if armed is not None else None

    async def _loop(self) -> None:
        while True:
            now = self.clock.now()
            nxt = self.wheel.next_at()
            if nxt is None or nxt > now:
                await self.loops.park("timers", nxt, self._wake)
                continue
            due: list[tuple[Schedule, datetime, datetime]] = []
            behind: list[tuple[Schedule, datetime]] = []
            passed: list[tuple[Schedule, datetime, datetime]] = []
            for name, slot, following in self.wheel.pop_due(now):
                schedule = self.schedules[name]
                if self.taken and self._taken(name, slot):
                    passed.append((schedule, slot, following))
                elif following <= now:
                    behind.append((schedule, slot))
                else:
                    due.append((schedule, slot, following))
            if passed:
                self._rearm(passed)
            if due:
                await self._fire_due(due, now)
            catching: list[Behind] = []
            for schedule, slot in behind:
                armed = self.wheel.armed(schedule.name)
                if armed is None or armed[0] != slot:
                    continue  # disabled (or re-armed) while the due slots above were claimed
                self.wheel.disarm(schedule.name)
                # Walked back from now, as a start's catch-up does: more than the limit
                # behind (a VM resumed after a night, a clock stepped a day ahead), the
                # newest are the ones to handle. Walked forward from the armed slot, the
                # oldest were: a run fired for a slot hours old, and the current slots were
                # skipped beside it.
                due_slots = list(islice(takewhile(slot.__le__, schedule.cron.occurrences_back(now)), self.catch_up_limit + 1))
                due_slots.reverse()
                missed = self._untaken(schedule.name, due_slots, now) if self.taken else due_slots
                if not missed:
                    self.arm(schedule, now)
                    continue
                catching.append(Behind(schedule, missed[-self.catch_up_limit :], missed[-1] == due_slots[-1]))
            if catching:
                await self.on_behind(catching)

    async def _fire_due(self, due: list[tuple[Schedule, datetime, datetime]], now: datetime) -> None:
        """Claim (or mark), start and re-arm ``due``, in slot order (as :meth:`TimerWheel.pop_due`)."""
        claims = self.claims
        outcome = claims.coordinator.outcome
        # The runs started here reach the writer thread only once the whole burst has started.
        try:
            with self.ledger.hold():
                if claims.coordinator.needs_claims:
                    # One claim for the whole batch: one round trip, one transaction, which
                    # also writes the winners' rows.
                    owned, busy = await claims.claim([(schedule, slot) for schedule, slot, _ in due], now, due_now=True)
                    await self._fire_owned(owned, outcome, busy)
                else:
                    # The burst's rows follow in the group commit; until they land, a
                    # committed mark lets a survivor record them if this process dies (a
                    # handler calling os._exit). One small write, not a thousand rows
                    # before the first start.
                    await self.launcher.placement.mark_starting(due[-1][1])  # the latest slot: due is in slot order
                    busy = await claims.busy_elsewhere([(schedule, slot) for schedule, slot, _ in due])
                    await self._fire_owned(self._with_ids(due), outcome, busy)
        finally:
            # Even when the round raised what it does not handle (the loop starts again):
            # a popped schedule stays armed at its popped slot, with no timer, until re-armed.
            self._rearm(due)

    def _rearm(self, fired: list[tuple[Schedule, datetime, datetime]]) -> None:
        """Arm each fired schedule for its following slot: :meth:`arm_at` for the burst,
        with one wake check for all."""
        # Schedules that share an expression share their next slot: compute it once.
        after: dict[tuple[Any, datetime], datetime] = {}
        armed, arm, schedules = self.wheel.armed, self.wheel.arm, self.schedules
        is_enabled, may_arm = self.is_enabled, self.may_arm
        earliest: datetime | None = None
        for schedule, slot, following in fired:
            name = schedule.name
            current = armed(name)
            # Still armed at the slot just fired: not disabled (or re-armed) meanwhile.
            if current is None or current[0] != slot or not is_enabled(name):
                continue
            if schedules.get(name, schedule) is not schedule:  # redefined while firing (a stored schedule)
                self.arm(schedules[name], slot)
                continue
            if not may_arm(name):
                continue
            if following == NO_SLOT:  # its last slot before the end of the calendar
                self.wheel.disarm(name)
                continue
            key = (schedule.cron, following)
            nxt = after.get(key)
            if nxt is None:
                nxt = after[key] = slot_after(schedule, following)
            arm(name, following, nxt)
            if earliest is None or following < earliest:
                earliest = following
        if earliest is not None and self.loops.needs_wake("timers", earliest):
            self._wake.set()

    def _with_ids(self, due: list[tuple[Schedule, datetime, datetime]]) -> Iterator[tuple[Schedule, datetime, str]]:
        """``due`` with a new run id each, made a slice at a time as :meth:`_fire_owned`
        starts them: lazily, since making every id before the first start delays the whole
        burst, but one clock read per slice, not per id."""
        new_ids = self.launcher.new_ids
        for start in range(0, len(due), START_SLICE):
            chunk = due[start : start + START_SLICE]
            for (schedule, slot, _), run_id in zip(chunk, new_ids(len(chunk)), strict=True):
                yield schedule, slot, run_id

    async def _fire_owned(
        self, owned: Iterable[tuple[Schedule, datetime, str]], outcome: Outcome, busy: dict[str, str]
    ) -> None:
        fire = self.launcher.fire
        index = -1
        for index, (schedule, slot, run_id) in enumerate(owned):
            fire(schedule, slot, "self", outcome, run_id, remote=busy.get(schedule.name))
            if index % START_SLICE == START_SLICE - 1:
                await asyncio.sleep(0)  # let the handlers created so far start
        if index >= 0:
            await asyncio.sleep(0)  # the last slice too, before the re-arming that follows
