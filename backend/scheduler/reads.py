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

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Literal

from backend.alerts.policy import schedule_alerting
from backend.clock import Clock
from backend.errors import BadInput, NotFound
from backend.inputs import check_before, check_count, shown_number
from backend.model import Run, ScheduleTarget, ScheduleView
from backend.scheduler.catalog import Catalog
from backend.scheduler.coordination.cluster import Cluster
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger
from backend.scheduler.states import ScheduleStates
from backend.scheduler.stored import StoredSchedule
from backend.scheduler.timers import Timers
from backend.schedules import NAME_PATTERN, Schedule
from backend.store import Store

__all__ = ["ScheduleReads", "find_schedule", "target_of"]


def find_schedule(schedules: Mapping[str, Schedule], name: str) -> Schedule:
    """The schedule named ``name``; :class:`~backend.errors.NotFound` when none is
    (:class:`~backend.errors.BadInput` for a name that is no text: a list, None)."""
    _check_is_text(name)
    try:
        return schedules[name]
    except KeyError:
        raise NotFound(f'no schedule named "{name}"') from None


def is_schedule_name(schedules: Mapping[str, Schedule], name: str) -> bool:
    """Whether ``name`` is one of ``schedules``: ``False`` for a name a schedule may have had
    (one removed from the code, or deleted, keeps its runs until the retention takes
    them); :class:`~backend.errors.NotFound` for a name no schedule could ever have had,
    which is never looked up in the ledger."""
    _check_is_text(name)
    if name in schedules:
        return True
    if not (isinstance(name, str) and NAME_PATTERN.fullmatch(name)):
        find_schedule(schedules, name)
    return False


def _check_is_text(name: object) -> None:
    if not isinstance(name, str):
        raise BadInput(f"schedule name {shown_number(name, 60)} is not text", field="name")


def no_runs_of(name: str) -> NotFound:
    """A name that is no schedule's and that the ledger holds no run of."""
    return NotFound(f'no schedule named "{name}", and the ledger holds no runs of one')


async def _no_owners() -> dict[str, str | None] | None:
    return None


class ScheduleReads:
    """The engine's read side (see the module docstring): ``schedules`` is the engine's,
    ``catalog`` is re-read for names created elsewhere, ``ledger`` hands its pending rows
    to ``store`` before a read, ``launcher`` knows the runs in flight and ``timers`` the
    armed slots."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        ledger: RunLedger,
        schedules: dict[str, Schedule],
        states: ScheduleStates,
        catalog: Catalog,
        launcher: Launcher,
        timers: Timers,
        cluster: Cluster | None,
        default_trigger: Literal["self", "external"],
    ) -> None:
        self.clock = clock
        self.store = store
        self.ledger = ledger
        self.schedules = schedules
        self.states = states
        self.catalog = catalog
        self.launcher = launcher
        self.timers = timers
        self.cluster = cluster
        self.default_trigger: Literal["self", "external"] = default_trigger
        self.observed_owners: Callable[[], Awaitable[dict[str, str | None] | None]] = _no_owners
        """Without shards of its own: who holds each schedule's shard, when the fleet this
        engine observes runs ``cluster`` (``None`` otherwise)."""

    async def list_schedules(self) -> list[ScheduleView]:
        self.ledger.handoff()
        await self.catalog.refresh()
        await self.states.refresh()
        return await self._views([*self.schedules, *self.catalog.invalid])

    async def get_schedule(self, name: str) -> ScheduleView:
        if name not in self.schedules:
            await self.catalog.refresh()  # created a moment ago by another process?
        if name not in self.catalog.invalid:
            find_schedule(self.schedules, name)
        views = await self._views([name])
        if not views:
            raise NotFound(f'no schedule named "{name}" (deleted a moment ago)')
        return views[0]

    async def written_view(self, name: str, row: StoredSchedule) -> ScheduleView:
        """The view of the stored schedule ``row`` a create or an update of this instance
        just wrote: read as :meth:`get_schedule` reads it, or, deleted by a concurrent request
        in between, as written (no next fire: it is gone). The answer to the call is what
        the call did; a 404 would tell its caller (who may send it again) it did nothing."""
        try:
            return await self.get_schedule(name)
        except NotFound:
            written = self._view(row.to_schedule(), None)
            return dataclasses.replace(written, next_fire_at=None, source="store")

    async def _views(self, names: list[str]) -> list[ScheduleView]:
        """The views of those of ``names`` still defined once their runs are read: a
        schedule deleted meanwhile (by a concurrent request) is left out."""
        last = await self.store.last_runs(names)
        latest = await self.store.last_runs(names, manual=True)
        owners = await self.cluster.owners() if self.cluster is not None else await self.observed_owners()
        views = []
        for name in names:
            newest = latest.get(name)
            manual = newest if newest is not None and newest.trigger == "manual" else None
            if name in self.schedules:
                views.append(self._view(self.schedules[name], last.get(name), manual, owners))
            elif name in self.catalog.invalid:
                views.append(
                    self._invalid_view(self.catalog.rows[name], self.catalog.invalid[name], last.get(name), manual, owners)
                )
        return views

    def _invalid_view(
        self,
        row: StoredSchedule,
        why: str,
        last_run: Run | None,
        latest_manual: Run | None,
        owners: dict[str, str | None] | None,
    ) -> ScheduleView:
        """A stored schedule this instance cannot run, as its row says (no next slot: it
        does not fire here), with why in ``problem``."""
        state = self.states.get(row.name)
        return ScheduleView(
            name=row.name,
            cron=row.cron,
            timezone=row.timezone,
            trigger="self",
            on_overlap=row.on_overlap,
            backfill=row.backfill,
            max_runtime_s=row.max_runtime,
            description=row.description,
            payload=row.payload,
            enabled=state.enabled if state is not None else row.enabled,
            state_note=state.state_note if state is not None else None,
            next_fire_at=None,
            last_run=last_run,
            latest_manual=latest_manual,
            owner=owners.get(row.name) if owners is not None else None,
            sharded=owners is not None,
            source="store",
            target=row.target,
            problem=why,
            alert=_alerting_of(row.alert),
        )

    def _view(
        self,
        schedule: Schedule,
        last_run: Run | None,
        latest_manual: Run | None = None,
        owners: dict[str, str | None] | None = None,
    ) -> ScheduleView:
        state = self.states.get(schedule.name)
        enabled = state.enabled if state is not None else schedule.enabled
        return ScheduleView(
            name=schedule.name,
            cron=schedule.cron.expr,
            timezone=schedule.timezone,
            trigger=schedule.effective_trigger(self.default_trigger),
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
            source="store" if self.catalog.is_stored(schedule.name) else "code",
            target=target_of(schedule),
            alert=schedule.alert.to_json(),
        )

    async def list_runs(
        self, name: str, *, limit: int = 50, before: str | None = None
    ) -> tuple[list[Run], str | None]:
        known = is_schedule_name(self.schedules, name) or name in self.catalog.invalid
        check_count(limit, "limit", 1, 1000)
        check_before(before)  # (what a page of the API or the CLI refuses, refused here too)
        self.ledger.handoff()
        runs = await self.store.list_runs(name, limit=limit + 1, before=before)
        # A schedule removed from the code (or deleted) keeps its runs until the retention
        # takes them: its history stays readable by its name.
        if not known and not runs and before is None:
            raise no_runs_of(name)
        if len(runs) > limit:  # one more than asked for: there is an older page
            return runs[:limit], runs[limit - 1].id
        return runs, None

    async def get_run(self, run_id: str) -> Run:
        active = self.launcher.active.get(run_id)
        if active is not None:
            return active.run
        await self.ledger.flush()  # a run that just finished may still be on its way to the store
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound(f'no run with id "{run_id}"')
        return run

    def next_fire(self, schedule: Schedule, enabled: bool) -> datetime | None:
        """The slot a schedule fires next here: the armed one, else the next on its cron;
        none while it is disabled or fired by an external scheduler."""
        if not enabled or schedule.effective_trigger(self.default_trigger) == "external":
            return None
        armed = self.timers.next_slot(schedule.name)
        return armed if armed is not None else schedule.cron.next_or_none(self.clock.now())

    def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        if isinstance(name, str) and name in self.catalog.invalid:
            return []  # (not run here: nothing is upcoming)
        schedule = find_schedule(self.schedules, name)
        slots: list[datetime] = []
        at = self.clock.now()
        for _ in range(count):
            nxt = schedule.cron.next_or_none(at)
            if nxt is None:  # the end of the calendar
                break
            slots.append(nxt)
            at = nxt
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


def _alerting_of(option: Any) -> Any:
    """A stored row's ``alert`` option as it would apply (``None``: not one it takes)."""
    try:
        return schedule_alerting(option).to_json()
    except BadInput:
        return None
