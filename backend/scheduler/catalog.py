"""The catalog: schedules created at run time, kept in the store, run beside the code ones.

Every change to the stored rows bumps a counter in the same transaction. An engine reads
the counter on its state poll (and at once when a ``schedules`` change signal arrives from
another instance over PostgreSQL's NOTIFY), and on a new value re-reads the rows and applies
the difference to its ``schedules``: a created schedule is armed, a changed one re-armed, a
deleted one disarmed and forgotten. The process that makes a change applies it at once.

Re-arming loses no due slot and fires none twice. A schedule is armed again from the later
of the old definition's last slot before the one that was armed (handled already), and the
earlier of the change's time and the armed slot: the new definition's slots that came due
since the change, before this instance heard of it, still fire (claims keep them once
across instances); a slot due while the change was applied fires once.

The catalog also changes the set of schedules the engine runs
(:meth:`Catalog.add_schedule`, :meth:`Catalog.remove_schedule`: arming is the caller's),
refuses edits of schedules defined in code (:meth:`Catalog.check_stored`), and binds a
``durable=F`` schedule to its function (:func:`bind_target`, for code schedules too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from backend.clock import Clock
from backend.durable import Durable
from backend.errors import BadInput, NotFound, Unavailable
from backend.events.bus import RESYNC, EventBus
from backend.jobs.system import Jobs
from backend.runtime.loops import stop_if_cancelled
from backend.runtime.outages import OutageLog
from backend.scheduler.catchup import CatchUp
from backend.scheduler.coordination.cluster import Cluster
from backend.scheduler.launcher import Launcher
from backend.scheduler.states import ScheduleStates
from backend.scheduler.stored import (
    CodeTiming,
    DefinedInCode,
    NameTaken,
    NotValidHere,
    StoredSchedule,
    check_changes,
    check_spec,
)
from backend.scheduler.timers import Timers, slot_after
from backend.schedules import RunContext, Schedule

__all__ = ["Catalog", "CatalogStore", "bind_target"]

log = logging.getLogger("schedtui.engine")

_TICK = timedelta(microseconds=1)


class CatalogStore(Protocol):
    """The stored schedules in a store. Every change bumps :meth:`catalog_version` in its
    own transaction; deleting a schedule also deletes its enabled/disabled state."""

    async def catalog_version(self) -> int: ...

    async def stored_schedules(self) -> tuple[int, list[StoredSchedule]]:
        """The version and every row, read at one instant."""

    async def create_stored_schedule(self, schedule: StoredSchedule) -> bool:
        """Insert the row; False when the name is taken."""

    async def update_stored_schedule(self, schedule: StoredSchedule, version: int) -> StoredSchedule | None:
        """Replace the definition of the row if its version is still ``version``; the row
        as stored (version + 1), or None when it is gone or changed meanwhile."""

    async def delete_stored_schedule(self, name: str) -> bool: ...

    async def record_code_timings(
        self,
        timings: list[tuple[str, str, str]],
        now: datetime,
        *,
        instance: str | None = None,
        rules: Mapping[str, str] | None = None,
    ) -> dict[str, datetime]:
        """Record the ``(name, cron, timezone)`` of schedules defined in code, each as
        ``instance``'s (the last to start with it), with the digest of its zone's rules
        (``rules``, by name: see :attr:`CodeTiming.rules`); answer, per name, when its
        timing last changed: ``now`` for a name recorded with another timing (or other
        rules, where both were said), what was recorded for one recorded with this timing
        (absent: never changed since first recorded)."""

    async def code_timings(self) -> dict[str, CodeTiming]:
        """Every recorded timing of a schedule defined in code, by name."""


#: How many times an update is applied to a row another writer changed meanwhile.
UPDATE_TRIES = 3


class Catalog:
    """This engine's copy of the stored schedules (see the module docstring).

    It changes ``schedules`` (the engine's, shared by every part), arms and disarms through
    ``timers``, tells ``launcher`` and ``cluster`` of each schedule it adds or removes, and
    checks a change's target against ``durable`` and ``jobs``; ``started`` says whether the
    engine fires (only then does it arm)."""

    def __init__(
        self,
        *,
        store: CatalogStore,
        clock: Clock,
        schedules: dict[str, Schedule],
        states: ScheduleStates,
        launcher: Launcher,
        timers: Timers,
        catch_up: CatchUp,
        cluster: Cluster | None,
        durable: Durable,
        jobs: Jobs,
        events: EventBus,
        outages: OutageLog,
        started: Callable[[], bool],
    ) -> None:
        self.store = store
        self.clock = clock
        self.schedules = schedules
        self.states = states
        self.launcher = launcher
        self.timers = timers
        self.catch_up = catch_up
        self.cluster = cluster
        self.durable = durable
        self.jobs = jobs
        self.events = events
        self.outages = outages
        self.started = started
        self.rows: dict[str, StoredSchedule] = {}
        self.version: int | None = None
        self.polled_at: datetime | None = None
        """When the housekeeping round last read the catalog and the states."""
        self.shadowed: dict[str, StoredSchedule] = {}
        """Stored names that a code schedule also defines (the code one runs)."""
        self.known_queues: set[str] = set()
        """Queues recorded in the store by any process (read before a change is checked)."""
        self.invalid: dict[str, str] = {}
        """Stored rows this instance cannot run, each with why (a zone its time zone database
        lacks, a value past a bound of this release): listed, never run, and refused to act
        on until an update corrects them or a delete removes them."""
        self._changed = asyncio.Event()

    def is_stored(self, name: str) -> bool:
        return name in self.rows

    def check_stored(self, name: str, *, deleting: bool = False) -> None:
        """Refuse a schedule defined in code (stored ones, and unknown names, pass; and, to
        be deleted, a stored row a code schedule of its name shadows)."""
        if deleting and name in self.shadowed:
            return
        if name in self.schedules and not self.is_stored(name):
            raise DefinedInCode(
                f'"{name}" is defined in code; it can be enabled or disabled, not edited or deleted here',
                reason="defined in code",
            )

    # -- the engine's running set --------------------------------------------------------------
    def add_schedule(self, schedule: Schedule) -> None:
        """Run ``schedule`` (new, or replacing its namesake's definition); arming is the caller's."""
        name = schedule.name
        self.schedules[name] = schedule
        self.launcher.defined(schedule)
        if self.cluster is not None:
            self.cluster.put(schedule)

    def remove_schedule(self, name: str) -> None:
        """Stop running a schedule: disarmed, its queued firings recorded missed, forgotten
        (a run in flight finishes and is recorded)."""
        schedule = self.schedules.get(name)
        if schedule is None:
            return
        self.timers.disarm(name)
        launcher = self.launcher
        waiting = launcher.waiting.pop(name, None)
        while waiting:
            slot, trigger, fired_as, run_id = waiting.popleft()
            launcher.record_missed(
                schedule, slot, trigger, fired_as, "the schedule was deleted before this queued firing started", run_id
            )
        launcher.remote.pop(name, None)
        del self.schedules[name]
        self.states.forget(name)
        if self.cluster is not None:
            self.cluster.drop(name)

    # -- following the store -----------------------------------------------------------------
    async def load(self) -> None:
        version, rows = await self.store.stored_schedules()
        self._apply(version, rows)

    async def refresh(self) -> None:
        """Re-read the rows if the catalog changed since the last read."""
        if self.version is not None and await self.store.catalog_version() == self.version:
            return
        await self.load()

    def heard(self, topic: str, name: str | None) -> None:
        """A signal relayed from another instance (PostgreSQL): a schedules change, or a
        resync, means the catalog may have changed."""
        if topic in ("schedules", RESYNC):
            self._changed.set()

    async def follow_signals(self) -> None:
        """PostgreSQL: re-read the catalog and the enabled states as soon as another
        instance signals a change to them (or that signals were lost). While signals
        arrive, the state poll is only a backstop (see :func:`backend.scheduler.lifecycle.maintain`)."""
        while True:
            stop_if_cancelled()
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.refresh()
                await self.states.refresh()
            except Unavailable as exc:
                self.outages.trouble("maintain", "store unavailable for the catalog", exc)

    def _apply(self, version: int, rows: list[StoredSchedule]) -> None:
        if self.version is not None and version < self.version:
            return  # an older read than one applied already
        fresh = {row.name: row for row in rows}
        for name in [n for n in self.rows if n not in fresh]:
            self._remove(name)
        for name in [n for n in self.shadowed if n not in fresh]:
            del self.shadowed[name]
        for row in rows:
            # The whole row, not its version: a schedule deleted and created again between
            # two reads here starts again at version 1 (with another definition, maybe).
            if self.rows.get(row.name) != row:
                self._put(row)
        # Only once every row is applied: a row that could not be (the machine short of
        # descriptors to read its zone: Unavailable) is read and applied again next round.
        self.version = version

    def _put(self, row: StoredSchedule) -> None:
        code = self.schedules.get(row.name)
        if code is not None and row.name not in self.rows:
            if row.name not in self.shadowed:
                log.warning(
                    'stored schedule "%s" is ignored: a schedule defined in code has that name (delete the stored one: '
                    "schedtui schedules delete %s)", row.name, row.name,
                )  # fmt: skip
            self.shadowed[row.name] = row
            return
        try:
            schedule = bind_target(row.to_schedule(), self.durable.start_for_slot)
        except BadInput as exc:
            self._put_invalid(row, exc.message)
            return
        self.invalid.pop(row.name, None)
        old_row = self.rows.get(row.name)
        # (another schedule of that name, created since the one read before: armed as new)
        old = self.schedules.get(row.name) if old_row is not None and old_row.created_at == row.created_at else None
        self.rows[row.name] = row
        self.add_schedule(schedule)
        self.events.publish("schedules", row.name)
        if not self.started() or not self.states.is_enabled(row.name) or self.catch_up.busy & {row.name}:
            return
        timers = self.timers
        armed = timers.wheel.armed(row.name)
        now = self.clock.now()
        if old is None or armed is None:
            timers.arm(schedule, min(row.updated_at, now))
            return
        slot = armed[0]
        if slot <= now:
            # Due before the change took effect here: it fires once, as it was armed (the
            # timer loop re-arms a slot being fired from the new definition).
            if timers.wheel.pending(row.name):
                timers.arm_at(schedule, slot, slot_after(schedule, slot))
            return
        # The old definition handled its slots up to the one before the armed one.
        handled = next(iter(old.cron.occurrences_back(slot - _TICK)), None)
        after = min(row.updated_at, slot - _TICK)
        if handled is not None and handled > after:
            after = handled
        timers.arm(schedule, after)

    def _put_invalid(self, row: StoredSchedule, why: str) -> None:
        """Keep a row this instance cannot run: listed with why, so an operator sees it and
        can correct or delete it; an earlier definition of it stops running here (what the
        fleet stored is no longer it). Logged once per change of the row."""
        if self.started():  # (an engine that does not fire, a CLI verb's, says nothing; a start says it)
            self._say_invalid(row.name, why)
        self.rows[row.name] = row
        self.invalid[row.name] = why
        self.remove_schedule(row.name)
        self.events.publish("schedules", row.name)

    def say_invalid(self) -> None:
        """Log, at ERROR, each stored schedule this instance cannot run (at its start)."""
        for name, why in self.invalid.items():
            self._say_invalid(name, why)

    @staticmethod
    def _say_invalid(name: str, why: str) -> None:
        log.error('stored schedule "%s" is not valid here and does not run on this instance: %s', name, why)

    def check_valid(self, name: str) -> None:
        """Refuse to act on a stored schedule this instance cannot run (see :attr:`invalid`)."""
        why = self.invalid.get(name)
        if why is not None:
            raise NotValidHere(
                f'stored schedule "{name}" is not valid here ({why}): correct it with an update, or delete it',
                reason=why,
            )

    def _remove(self, name: str) -> None:
        del self.rows[name]
        self.invalid.pop(name, None)
        self.remove_schedule(name)
        self.events.publish("schedules", name)

    # -- the operator's changes ---------------------------------------------------------------
    async def create(self, spec: Any, actor: str) -> tuple[StoredSchedule, bool]:
        """Store a new schedule; the row, and whether this call made it. The same create
        again by its author, the schedule unchanged since (nor enabled or disabled),
        answers with that row rather than ``NameTaken``: it is most likely a retry after
        the first answer was lost."""
        full = check_spec(spec)
        name = full["name"]
        if name in self.schedules and name not in self.rows:
            raise NameTaken(f'a schedule named "{name}" is defined in code', reason="name taken")
        await self._read_known_queues()
        self._check_target(full)
        now = self.clock.now()
        row = StoredSchedule(
            **full, created_at=now, created_by=actor, updated_at=now, updated_by=actor, version=1
        )
        if not await self.store.create_stored_schedule(row):
            await self.refresh()
            there = self.rows.get(name)
            if there is not None and there.version == 1 and there.created_by == actor and there.spec() == full:
                await self.states.refresh()  # (nor enabled or disabled since)
                if self.states.is_enabled(name) == there.enabled:
                    return there, False
            raise NameTaken(f'a schedule named "{name}" exists already', reason="name taken")
        await self._after_change(functools.partial(self._put, row))
        return row, True

    async def update(self, name: str, changes: Any, actor: str) -> tuple[StoredSchedule, StoredSchedule]:
        """Apply ``changes``; returns the row before and after. A row changed by another
        writer between the read and the write (its version moved on) is read again and the
        changes applied to it, as a PATCH means: a few times, then ``Unavailable``."""
        for _ in range(UPDATE_TRIES):
            await self.refresh()
            before = self._row(name)  # NotFound when it was deleted meanwhile
            full = check_changes(before.spec(), changes)
            await self._read_known_queues()
            self._check_target(full)
            now = self.clock.now()
            wanted = replace(before, **{k: v for k, v in full.items() if k != "name"}, updated_at=now, updated_by=actor)
            if (wanted.cron, wanted.timezone) != (before.cron, before.timezone):
                wanted = replace(wanted, timing_changed_at=now)  # the catch-up at start begins there
            after = await self.store.update_stored_schedule(wanted, before.version)
            if after is not None:
                await self._after_change(functools.partial(self._put, after))
                return before, after
        await self.refresh()
        self._row(name)
        raise Unavailable(f'"{name}" was changed by someone else at the same moment, {UPDATE_TRIES} times; try again')

    async def delete(self, name: str) -> StoredSchedule:
        """Delete the stored schedule ``name``, also one a schedule in code shadows (the code's
        runs on; the stored row came back with every rollback of that code)."""
        await self.refresh()
        row = self.shadowed.get(name) or self._row(name)
        if not await self.store.delete_stored_schedule(name):
            raise NotFound(f'no schedule named "{name}"')
        await self._after_change(functools.partial(self._forget, name))
        return row

    def _row(self, name: str) -> StoredSchedule:
        row = self.rows.get(name)
        if row is None:
            raise NotFound(f'no schedule named "{name}"')
        return row

    async def _after_change(self, apply: Callable[[], None]) -> None:
        """Apply this instance's change here at once (the others hear of it by the signal
        the engine publishes): by itself when it is the only change since the catalog read
        here (its version moved by one), else by reading every row again. Each change read
        them all: a thousand schedules created one after another cost a million rows read."""
        known = self.version
        version = await self.store.catalog_version()
        if known is not None and version == known + 1:
            apply()
            self.version = version
        else:
            await self.load()

    def _forget(self, name: str) -> None:
        """A stored row deleted here."""
        if name in self.rows:
            self._remove(name)
        self.shadowed.pop(name, None)

    def _check_target(self, spec: dict[str, Any]) -> None:
        queue, durable = spec.get("queue"), spec.get("durable")
        if durable is not None and durable not in self.durable.functions:
            raise BadInput(f'durable function "{durable}" is not defined here', field="durable")
        if queue is not None and queue not in self.jobs.queues and queue not in self.known_queues:
            raise BadInput(f'queue "{queue}" is not defined here nor recorded in the store', field="queue")

    async def _read_known_queues(self) -> None:
        views = await self.jobs.queue_views()
        self.known_queues = {view.name for view in views}


def bind_target(schedule: Schedule, start_for_slot: Callable[[str, RunContext], Awaitable[object]]) -> Schedule:
    """A schedule defined with ``durable=F`` starts an execution of F per slot (by
    ``start_for_slot(F, ctx)``); any other schedule is returned as it is."""
    target = schedule.durable
    if target is None:
        return schedule

    async def start(ctx: RunContext, target: str = target) -> None:
        await start_for_slot(target, ctx)

    return replace(schedule, handler=start)
