"""What the console concludes from the data: who is firing, which schedules are overdue,
typical durations. Plain functions and small classes, no Textual, tested on their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from backend.client.interface import ConnectionInfo
from backend.cron import Cron, shared_cron
from backend.model import InstanceInfo, Run, ScheduleView

__all__ = [
    "LIVE_WITHIN",
    "OVERDUE_AFTER",
    "CronCache",
    "Durations",
    "Fleet",
    "Overdue",
    "durations",
    "fleet_of",
    "is_gone",
]

LIVE_WITHIN = timedelta(seconds=30)
"""An instance whose last heartbeat is older than this is not firing (the engine's own
abandon window: a firing engine beats every 5 s)."""



def is_gone(instance: InstanceInfo, now: datetime) -> bool:
    """A member (firing or waiting) silent past :data:`LIVE_WITHIN`: killed or crashed (a
    clean stop removes its row; the fleet took its work over). Not an observer (a console,
    a verb): it registers when it opens and never beats, so its silence says nothing."""
    return instance.role != "observer" and now - instance.heard_at > LIVE_WITHIN


OVERDUE_AFTER = timedelta(seconds=30)
"""A slot with no run this long after its time makes its schedule overdue."""


class CronCache:
    """One :class:`Cron` per (expression, zone): building one costs ~70 µs, a thousand
    schedules would pay that on every refresh. Taken from :func:`shared_cron`: on an
    embedded backend the definitions parsed them already."""

    def __init__(self) -> None:
        self._crons: dict[tuple[str, str], Cron | None] = {}

    def get(self, expr: str, zone: str) -> Cron | None:
        key = (expr, zone)
        if key not in self._crons:
            try:
                self._crons[key] = shared_cron(expr, zone)
            except ValueError:  # a server newer than this console; never crash on it
                self._crons[key] = None
        return self._crons[key]

    def next_after(self, view: ScheduleView, now: datetime) -> datetime | None:
        """The schedule's next slot after ``now`` by its cron (when the known one has passed
        and the data is not fresh, e.g. while paused)."""
        cron = self.get(view.cron, view.timezone)
        try:
            return cron.next(now) if cron is not None else None
        except ValueError:
            return None


@dataclass(frozen=True)
class Fleet:
    """The engines that fire, as the heartbeats tell it."""

    firing: tuple[InstanceInfo, ...]
    """Instances that beat within :data:`LIVE_WITHIN` (this console itself only if it fires)."""
    last_beat: InstanceInfo | None
    """The most recent heartbeat of any other instance, live or not (to say since when)."""
    self_triggered: int
    """Enabled schedules that need an engine's timer to fire."""
    owned: dict[str, int] | None = None
    """In ``cluster`` coordination: instance -> how many schedules it owns (``None`` in the
    other modes)."""
    standing_down: tuple[InstanceInfo, ...] = ()
    """Firing members that beat within :data:`LIVE_WITHIN` but take no work: their clock is
    off the database server's (not counted in :attr:`firing`)."""
    last_run: Run | None = None
    """The newest run of any schedule (to say since when, where no heartbeat is left: an
    engine that stopped cleanly takes its instance's row with it)."""

    @property
    def silent(self) -> bool:
        """Nothing fires schedules that need a timer: say so loudly."""
        return self.self_triggered > 0 and not self.firing


def fleet_of(
    instances: Iterable[InstanceInfo], now: datetime, info: ConnectionInfo, views: Iterable[ScheduleView]
) -> Fleet:
    """Which instances fire: the firing members (an engine that arms timers or runs workers,
    not waiting for another coordination mode's fleet, nor standing down because its clock
    is off) whose heartbeat is recent. A console, a CLI verb or a ``connect()`` client is an
    observer and never counts."""
    others = [i for i in instances if info.fires or i.name != info.instance]
    live = sorted((i for i in others if now - i.heard_at <= LIVE_WITHIN), key=lambda i: i.name)
    # A member whose clock is off beats on but fires nothing: it is no engine that fires.
    firing = tuple(i for i in live if i.fires)
    standing_down = tuple(i for i in live if i.stands_down)
    last = max(others, key=lambda i: i.heard_at, default=None)
    views = list(views)
    count = sum(1 for v in views if v.enabled and v.trigger == "self")
    owned: dict[str, int] | None = None
    if any(v.sharded for v in views):
        owned = {}
        for view in views:
            if view.owner is not None:
                owned[view.owner] = owned.get(view.owner, 0) + 1
    fired = [(v.last_run.fired_at, v.last_run) for v in views if v.last_run is not None and v.last_run.fired_at is not None]
    newest = max(fired, key=lambda pair: pair[0], default=None)
    return Fleet(firing, last, count, owned, standing_down, None if newest is None else newest[1])


class Overdue:
    """Which schedules have a past slot without a run: enabled, fired before (a schedule
    that never ran has no baseline), and a slot due :data:`OVERDUE_AFTER` ago or more that
    is newer than the newest self/external run and than the last enable.

    The answer for a schedule only changes when its last run, its state or the next slot's
    deadline changes, so it is kept until then: a refresh of 1,000 schedules costs 1,000
    dictionary lookups, not 1,000 cron walks."""

    def __init__(self, crons: CronCache) -> None:
        self.crons = crons
        self._known: dict[str, tuple[tuple[object, ...], datetime | None, datetime]] = {}

    def since(self, view: ScheduleView, now: datetime) -> datetime | None:
        """The first slot with no run, if ``view`` is overdue at ``now``; else ``None``."""
        last = view.last_run
        if not view.enabled or last is None:
            return None
        key = (view.cron, view.timezone, last.id, last.scheduled_at, view.state_note)
        known = self._known.get(view.name)
        if known is not None and known[0] == key and now < known[2]:
            return known[1]
        cron = self.crons.get(view.cron, view.timezone)
        if cron is None:
            return None
        try:
            due = cron.latest(now - OVERDUE_AFTER)
            recheck = cron.next(due) + OVERDUE_AFTER
        except ValueError:
            return None
        enabled_at = view.state_note.at if view.state_note is not None else None
        since: datetime | None = None
        if due > last.scheduled_at and (enabled_at is None or enabled_at < due):
            # The first slot after the last run, or after re-enabling (slots that passed
            # while disabled are not owed).
            start = max(last.scheduled_at, enabled_at) if enabled_at is not None else last.scheduled_at
            since = cron.next(start)
            recheck = datetime.max.replace(tzinfo=now.tzinfo)  # overdue until a run lands
        self._known[view.name] = (key, since, recheck)
        return since


@dataclass(frozen=True)
class Durations:
    """Typical durations over the runs at hand (finished, executed runs)."""

    p50_ms: int
    p95_ms: int
    count: int


def durations(runs: Sequence[Run]) -> Durations | None:
    """p50 and p95 of the finished, executed runs in ``runs`` (nearest rank), or ``None``
    when there are none. The console passes the page it already has (the newest 50 runs by
    slot), so this costs no query; the detail bar says over how many."""
    values = sorted(r.duration_ms for r in runs if r.duration_ms is not None and r.status in ("succeeded", "failed"))
    if not values:
        return None

    def rank(percent: int) -> int:
        return values[max(0, math.ceil(len(values) * percent / 100) - 1)]

    return Durations(rank(50), rank(95), len(values))
