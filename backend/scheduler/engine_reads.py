"""The engine's reads: the fleet's coordination, its schedules and their states, schedule
views, run pages, upcoming slots, the fleet and health (a part of :class:`~backend.scheduler.engine.Engine`).

The views, pages and slots themselves are built by :class:`~backend.scheduler.reads.ScheduleReads`
(the engine's ``reads``), to which most of these delegate; none changes anything but
:meth:`EngineReads.refresh_states`, which re-reads the enabled states from the store and
arms or disarms what changed.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Literal, cast

from backend.clock import Clock
from backend.errors import Unavailable
from backend.locks import Locks
from backend.model import (
    CoordinationMode,
    Health,
    InstanceInfo,
    Run,
    RunsPage,
    SchedulesSnapshot,
    ScheduleView,
)
from backend.scheduler.catalog import Catalog
from backend.scheduler.coordination.cluster import Cluster, ClusterStore, shard_owners
from backend.scheduler.coordination.slots import SlotClaims
from backend.scheduler.lifetime import Lifetime
from backend.scheduler.reads import ScheduleReads, find_schedule, is_schedule_name, no_runs_of
from backend.scheduler.registry import InstanceRegistry
from backend.scheduler.states import ScheduleStates
from backend.scheduler.timings import zone_rules
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["HEALTH_READ_TIMEOUT", "EngineReads"]

#: How long a health check waits for the instances table before answering without it (seconds).
HEALTH_READ_TIMEOUT = 2.0


class EngineReads:
    """What the engine answers about its schedules, runs, fleet and health (see the module
    docstring): a part of the engine, which sets up what is declared here in its ``__init__``."""

    schedules: dict[str, Schedule]
    store: Store
    clock: Clock
    instance: str
    default_trigger: Literal["self", "external"]
    states: ScheduleStates
    catalog: Catalog
    reads: ScheduleReads
    claims: SlotClaims
    registry: InstanceRegistry
    locks: Locks
    cluster: Cluster | None
    coordination_given: bool
    life: Lifetime

    # -- the fleet's coordination, and what this process fires -----------------------------
    def code_timings(self) -> dict[str, tuple[str, str, str]]:
        """The ``(cron, timezone, zone rules)`` of each schedule defined in code (see
        :mod:`backend.scheduler.timings`), as this process fires them."""
        return {
            name: (schedule.cron.expr, schedule.cron.timezone, zone_rules(schedule.cron.timezone))
            for name, schedule in self.schedules.items()
            if not self.catalog.is_stored(name)
        }

    @property
    def coordination(self) -> CoordinationMode:
        return self.claims.coordinator.mode

    async def observed_coordination(self) -> CoordinationMode:
        """The mode the schedules are fired by: this engine's when it was given one or
        fires; for one left to the store's default that does not fire (a CLI verb, a
        ``connect()`` client, a console waiting for another mode's fleet), the mode the live
        firing members record, if any fires."""
        if self.coordination_given or (self.life.started and self.registry.role != "waiting"):
            return self.coordination
        return await self.registry.fleet_mode(self.clock.now()) or self.coordination

    async def _code_owners(self) -> dict[str, str | None]:
        """Each schedule defined in code by some instance: the last instance to start with it."""
        return {name: timing.instance for name, timing in (await self.catalog.store.code_timings()).items()}

    async def _observed_owners(self) -> dict[str, str | None] | None:
        """An observer of a ``cluster`` fleet: who holds each self-triggered schedule's shard."""
        if await self.observed_coordination() != "cluster" or self.cluster is not None:
            return None
        names = [name for name, schedule in self.schedules.items() if self.trigger_of(schedule) == "self"]
        return await shard_owners(cast(ClusterStore, self.store), names, self.locks.lock_now())

    # -- schedules ------------------------------------------------------------------------
    def schedule(self, name: str) -> Schedule:
        """The schedule named ``name``: :class:`NotFound` when none is, and
        :class:`~backend.scheduler.stored.NotValidHere` for a stored one this instance
        cannot run (only an update or a delete acts on it)."""
        if isinstance(name, str):
            self.catalog.check_valid(name)
        return find_schedule(self.schedules, name)

    def trigger_of(self, schedule: Schedule) -> Literal["self", "external"]:
        """How ``schedule`` is fired here: its own trigger, else the engine's default."""
        return schedule.effective_trigger(self.default_trigger)

    def is_enabled(self, name: str) -> bool:
        return self.states.is_enabled(name)

    def next_fire_at(self, name: str) -> datetime | None:
        return self.reads.next_fire(self.schedule(name), self.is_enabled(name))

    def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        """The next ``count`` slots of a schedule, whatever its state (for previews)."""
        return self.reads.upcoming(name, count)

    async def refresh_states(self) -> None:
        """Re-read enabled/disabled from the store and arm or disarm what changed."""
        await self.states.refresh()

    async def list_schedules(self) -> list[ScheduleView]:
        """Every schedule with its state, next slot, newest self/external run and newest
        manual run (when that is its newest run)."""
        return await self.reads.list_schedules()

    async def get_schedule(self, name: str) -> ScheduleView:
        return await self.reads.get_schedule(name)

    async def list_runs(
        self, name: str, *, limit: int = 50, before: str | None = None
    ) -> tuple[list[Run], str | None]:
        """A page of a schedule's runs, newest first, and the ``before`` of the next page
        (``None`` on the last). ``before`` is the last id of the previous page."""
        return await self.reads.list_runs(name, limit=limit, before=before)

    async def get_run(self, run_id: str) -> Run:
        return await self.reads.get_run(run_id)

    async def schedules_snapshot(self) -> SchedulesSnapshot:
        """Every schedule (:meth:`list_schedules`) with the clock's now and who reads them."""
        views = await self.list_schedules()
        return SchedulesSnapshot(self.coordination, self.instance, self.clock.now(), views)

    async def runs_page(self, name: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        """:meth:`list_runs` as a page."""
        runs, next_before = await self.list_runs(name, limit=limit, before=before)
        return RunsPage(runs, next_before)

    async def runs_between(
        self, names: list[str], start: datetime, end: datetime, *, limit_per_name: int = 200
    ) -> dict[str, list[Run]]:
        """Per schedule of ``names``, its runs scheduled in ``[start, end)``, newest first,
        at most ``limit_per_name``; schedules without any left out. A name that is no
        schedule's is read as :meth:`list_runs` reads it: a schedule removed from the code
        (or deleted) keeps its runs until the retention takes them; a name the ledger holds
        no run of at all is :class:`NotFound`."""
        gone = [name for name in names if not is_schedule_name(self.schedules, name) and name not in self.catalog.invalid]
        found = await self.store.runs_between(names, start, end, limit_per_name=limit_per_name)
        for name in gone:
            if name not in found and not await self.store.list_runs(name, limit=1):
                raise no_runs_of(name)
        return found

    async def instances(self) -> list[InstanceInfo]:
        """The engine instances registered in the store, with their heartbeats."""
        return await self.store.fleet()

    async def health(self) -> Health:
        """The store's own account of its writes (no I/O) and the instances table (one
        read, bounded by :data:`HEALTH_READ_TIMEOUT`; ``None`` when it cannot be read)."""
        instances: list[InstanceInfo] | None
        try:
            instances = await asyncio.wait_for(self.store.fleet(), HEALTH_READ_TIMEOUT)
        except (Unavailable, TimeoutError):
            instances = None
        # After the read: it may just have found the store down.
        return Health(self.instance, self.coordination, self.store.kind, self.store.health(), instances, self.clock.now())
