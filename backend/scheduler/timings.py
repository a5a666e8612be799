"""One timing per schedule across a fleet.

A schedule defined in code fires by the cron and zone of the code each instance runs.
During a rolling deploy that changes them, or beside a canary, the instances of the two
versions each claimed their own slots under ``advisoryLock``: claims are per slot, and the
two timings' slots differ, so a daily job moved from 02:00 to 03:00 ran at both, every day,
for as long as both versions ran.

The store records one timing per schedule: the one the last instance to start with
another timing runs, and the last instance to start with it
(:meth:`~backend.scheduler.catalog.CatalogStore.record_code_timings`, at each start). An
instance whose own timing differs leaves the schedule to the instances that run the
recorded one, claiming none of its slots, while that instance is alive; once it is gone
(judged as the fleet judges an instance dead), it records its own timing and fires by it,
and the others leave the schedule to it in turn. So one timing fires at a time. A change
of timing fires both timings' slots of the day it lands on, as it would on one instance.

A start that changes a recorded timing signals the others (``schedules``, PostgreSQL's
NOTIFY), which look again at once (:meth:`FleetTimings.heard`); otherwise an instance
looks every :data:`BACKSTOP` seconds, and every heartbeat interval while it leaves a
schedule to another instance, whose life it then watches.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from zoneinfo import ZoneInfo

from backend.cron import Cron
from backend.errors import CronError
from backend.events.bus import RESYNC
from backend.model import InstanceInfo
from backend.scheduler.stored import CodeTiming
from backend.store import Beat

if TYPE_CHECKING:
    from backend.scheduler.catalog import CatalogStore

__all__ = ["FleetTimings", "same_timing", "zone_rules"]

log = logging.getLogger("schedtui.engine")

#: The span :func:`zone_rules` samples, twice a day (about 25 ms a zone, once a process).
_RULES_FROM, _RULES_DAYS = datetime(2020, 1, 1, tzinfo=UTC), 20 * 366


@functools.cache
def zone_rules(zone: str) -> str:
    """A digest of ``zone``'s offsets from UTC at midnight and noon UTC of every day from
    2020 to 2040, as this machine's time zone database has them: two machines whose
    databases differ on the zone (a rolling OS upgrade across a change of its rules, as
    Mexico's end of daylight saving time in 2022) give two digests, and fire one local time
    at two instants. The span is fixed, so machines that agree agree whatever their clock."""
    tz = ZoneInfo(zone)
    start = int(_RULES_FROM.timestamp())
    offsets = bytearray()
    for half_day in range(_RULES_DAYS * 2):
        offset = datetime.fromtimestamp(start + half_day * 43_200, tz).utcoffset()
        offsets += int(offset.total_seconds() if offset is not None else 0).to_bytes(4, "big", signed=True)
    return hashlib.sha256(offsets).hexdigest()[:16]

#: Seconds between two looks at the fleet's timings when no signal asks for one (a lost
#: NOTIFY, a store that cannot signal): each look is a read of the store.
BACKSTOP = 60.0


class _Judge(Protocol):
    def gone(self, beats: dict[str, Beat], instance: str, now: datetime) -> str | None: ...


class FleetTimings:
    """Which of this instance's schedules it leaves to another timing's instances (see the
    module docstring). ``own``: the ``(cron, timezone)`` of each self-triggered schedule
    defined in code, by name; ``beats`` and ``fleet``: the fleet's heartbeats and rows, read
    when a recorder's life is in question; ``judge``: the registry, which says whether an
    instance is gone (one alive that fires nothing counts as gone here);
    ``claims``: whether this engine's coordination claims slots (it decides only then);
    ``signal``: tells the other instances that a timing changed."""

    def __init__(
        self,
        *,
        store: CatalogStore,
        instance: str,
        own: Callable[[], Mapping[str, tuple[str, str, str]]],
        beats: Callable[[], Awaitable[dict[str, Beat]]],
        fleet: Callable[[], Awaitable[list[InstanceInfo]]],
        judge: _Judge,
        claims: Callable[[], bool],
        signal: Callable[[], None],
        every: timedelta,
    ) -> None:
        self.store = store
        self.instance = instance
        self.own = own
        self.beats = beats
        self.fleet = fleet
        self.judge = judge
        self.claims = claims
        self.signal = signal
        self.every = every
        self.left: dict[str, CodeTiming] = {}
        """The schedules this instance fires none of, with the fleet's timing of each."""
        self._next_at: datetime | None = None
        self._stale = True

    def heard(self, topic: str, name: str | None) -> None:
        """A signal from another instance: a start that changed a timing signals
        ``schedules`` (so does a change of the stored ones); look again at the next round."""
        if topic in ("schedules", RESYNC):
            self._stale = True

    @property
    def stale(self) -> bool:
        """Whether the next round looks at the fleet's timings whatever the time (a signal
        came, or nothing was looked at yet)."""
        return self._stale

    def leaves(self, name: str) -> bool:
        """Whether this instance leaves ``name``'s slots to the instances of another timing."""
        return name in self.left

    async def review(self, now: datetime, *, force: bool = False) -> None:
        """Compare this instance's timings with the fleet's, when it is time to (see the
        module docstring): leave a schedule to its recorder while that lives and fires, take
        it over once it does not."""
        if not force and not self._stale and self._next_at is not None and now < self._next_at:
            return
        self._stale = False
        try:
            await self._review(now)
        except BaseException:
            self._stale = True  # (the store did not answer: look again next round)
            raise
        finally:
            # While a schedule is left to another instance, watch that instance's life.
            self._next_at = now + (self.every if self.left else timedelta(seconds=BACKSTOP))

    async def _review(self, now: datetime) -> None:
        own = self.own() if self.claims() else {}
        if not own:
            self._settle({})
            return
        recorded = await self.store.code_timings()
        differing = {
            name: fleet
            for name, mine in own.items()
            if (fleet := recorded.get(name)) is not None
            and _differ(fleet, mine)
            and fleet.instance is not None  # (recorded by a release that named no instance: as before)
            and fleet.instance != self.instance
        }
        if not differing:
            self._settle({})
            return
        # Read now: a recorder that has just started is in them.
        beats, members = await self.beats(), {i.name: i for i in await self.fleet()}
        left: dict[str, CodeTiming] = {}
        taking: list[tuple[str, str, str]] = []
        for name, fleet in differing.items():
            assert fleet.instance is not None
            why = self.judge.gone(beats, fleet.instance, now)
            gone = None if why is None else f"is gone ({why})"
            member = members.get(fleet.instance)
            if gone is None and member is not None and not member.fires:
                # Alive, but firing nothing: waiting for another coordination mode's fleet,
                # or standing down on a clock that is off. Left to it, nobody would fire.
                gone = f"fires nothing ({member.clock_text() or f'its role is {member.role}'})"
            if gone is None:
                left[name] = fleet
                continue
            cron, zone, _ = own[name]
            taking.append((name, cron, zone))
            log.warning(
                'schedule "%s": %s, the last instance to start with its timing "%s" (%s), %s; this instance '
                'fires it by its own, "%s" (%s)',
                name, fleet.instance, fleet.cron, fleet.timezone, gone, cron, zone,
            )  # fmt: skip
        if taking:
            rules = {name: own[name][2] for name, _, _ in taking}
            await self.store.record_code_timings(taking, now, instance=self.instance, rules=rules)
            self.signal()  # its peers, which ran the other timing, leave it to this instance now
        self._settle(left)

    def _settle(self, left: dict[str, CodeTiming]) -> None:
        own = self.own()
        for name, fleet in left.items():
            if self.left.get(name) != fleet:
                cron, zone, _ = own[name]
                rules = " (the same expression, by another time zone database's rules)" if (cron, zone) == fleet[:2] else ""
                log.warning(
                    'schedule "%s" runs by "%s" (%s) here, and by "%s" (%s)%s on %s, the last instance to start with '
                    "that timing: this instance fires none of its slots while %s runs (one timing a schedule across "
                    "the fleet: a deploy under way, or a canary)",
                    name, cron, zone, fleet.cron, fleet.timezone, rules, fleet.instance, fleet.instance,
                )  # fmt: skip
        for name in self.left.keys() - left.keys():
            if name in own:
                log.info('schedule "%s" fires by this instance\'s timing again', name)
        self.left = left


def _differ(fleet: CodeTiming, mine: tuple[str, str, str]) -> bool:
    """Whether the fleet's timing of a schedule is another than this instance's (see
    :func:`same_timing`)."""
    return not same_timing(fleet, mine)


def same_timing(fleet: CodeTiming, mine: tuple[str, str, str]) -> bool:
    """Whether the fleet's recorded timing of a schedule fires what this instance's
    ``(cron, zone, zone rules)`` does: the same instants by the same rules of the zone
    (where both said), however either is written. A rewrite of the expression
    (``*/4`` as ``0-59/4``) or of the zone's name (``UTC`` as ``Etc/UTC``) is no change
    of timing: taken for one, it restarted the catch-up from the deploy, and the slots
    missed while none ran were never caught up."""
    cron, zone, rules = mine
    if fleet.rules is not None and fleet.rules != rules:
        return False
    if (fleet.cron, fleet.timezone) == (cron, zone):
        return True
    try:
        theirs, ours = Cron(fleet.cron, fleet.timezone), Cron(cron, zone)
    except CronError:
        return False  # (a zone or expression this machine cannot read: not known to be the same)
    return theirs.timing == ours.timing and zone_rules(fleet.timezone) == zone_rules(zone)
