"""What the engine answers about its schedules and runs, without changing anything.

:class:`ScheduleReads` builds the :class:`~backend.model.ScheduleView` of each schedule
(state, next slot, newest runs, shard owner, source and target), pages a schedule's runs,
finds one run (in flight here, or in the store) and previews upcoming slots. Contract:
every read sees the runs recorded so far (the ledger's pending rows are handed to the
store first) and the schedules created or changed elsewhere up to the last catalog read;
a name nobody knows raises :class:`~backend.errors.NotFound`, a bad page size
:class:`~backend.errors.BadInput`. The engine's methods of the same names delegate here.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from backend.errors import BadInput, NotFound
from backend.model import Run, ScheduleTarget, ScheduleView
from backend.schedules import Schedule

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = ["ScheduleReads", "target_of"]


class ScheduleReads:
    """The engine's read side (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def list_schedules(self) -> list[ScheduleView]:
        engine = self.engine
        engine.ledger.handoff()
        await engine.catalog.refresh()
        await engine.refresh_states()
        return await self._views(list(engine.schedules))

    async def get_schedule(self, name: str) -> ScheduleView:
        engine = self.engine
        if name not in engine.schedules:
            await engine.catalog.refresh()  # created a moment ago by another process?
        engine.schedule(name)
        return (await self._views([name]))[0]

    async def _views(self, names: list[str]) -> list[ScheduleView]:
        engine = self.engine
        last = await engine.store.last_runs(names)
        latest = await engine.store.last_runs(names, manual=True)
        owners = await engine.cluster.owners() if engine.cluster is not None else None
        views = []
        for name in names:
            newest = latest.get(name)
            manual = newest if newest is not None and newest.trigger == "manual" else None
            views.append(self._view(engine.schedules[name], last.get(name), manual, owners))
        return views

    def _view(
        self,
        schedule: Schedule,
        last_run: Run | None,
        latest_manual: Run | None = None,
        owners: dict[str, str | None] | None = None,
    ) -> ScheduleView:
        engine = self.engine
        state = engine.states.get(schedule.name)
        enabled = state.enabled if state is not None else schedule.enabled
        return ScheduleView(
            name=schedule.name,
            cron=schedule.cron.expr,
            timezone=schedule.timezone,
            trigger=schedule.effective_trigger(engine.default_trigger),
            on_overlap=schedule.on_overlap,
            backfill=schedule.backfill,
            max_runtime_s=schedule.max_runtime,
            description=schedule.description,
            payload=schedule.payload,
            enabled=enabled,
            state_note=state.state_note if state is not None else None,
            next_fire_at=self.next_fire(schedule, enabled),
            last_run=last_run,
            latest_manual=latest_manual,
            owner=owners.get(schedule.name) if owners is not None else None,
            sharded=owners is not None,
            source="store" if engine.catalog.is_stored(schedule.name) else "code",
            target=target_of(schedule),
        )

    async def list_runs(
        self, name: str, *, limit: int = 50, before: str | None = None
    ) -> tuple[list[Run], str | None]:
        engine = self.engine
        engine.schedule(name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise BadInput(f"limit {limit!r} is out of range (1-1000)", field="limit")
        engine.ledger.handoff()
        runs = await engine.store.list_runs(name, limit=limit + 1, before=before)
        if len(runs) > limit:  # one more than asked for: there is an older page
            return runs[:limit], runs[limit - 1].id
        return runs, None

    async def get_run(self, run_id: str) -> Run:
        engine = self.engine
        active = engine.launcher.active.get(run_id)
        if active is not None:
            return active.run
        await engine.flush()  # a run that just finished may still be on its way to the store
        run = await engine.store.get_run(run_id)
        if run is None:
            raise NotFound(f'no run with id "{run_id}"')
        return run

    def next_fire(self, schedule: Schedule, enabled: bool) -> datetime | None:
        """The slot a schedule fires next here: the armed one, else the next on its cron;
        none while it is disabled or fired by an external scheduler."""
        engine = self.engine
        if not enabled or schedule.effective_trigger(engine.default_trigger) == "external":
            return None
        armed = engine.timers.next_slot(schedule.name)
        return armed if armed is not None else schedule.cron.next(engine.clock.now())

    def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        engine = self.engine
        schedule = engine.schedule(name)
        slots, at = [], engine.clock.now()
        for _ in range(count):
            at = schedule.cron.next(at)
            slots.append(at)
        return slots


def target_of(schedule: Schedule) -> ScheduleTarget:
    """What a schedule's firing runs: a queue's job, a durable execution, or its handler."""
    if schedule.queue is not None:
        return ScheduleTarget("queue", schedule.queue)
    if schedule.durable is not None:
        return ScheduleTarget("durable", schedule.durable)
    handler = schedule.handler
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    module = getattr(handler, "__module__", None)
    return ScheduleTarget("handler", f"{module}.{name}" if module else name)
