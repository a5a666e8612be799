"""The engine's operator actions: on schedules (run now, enable and disable, create, update
and delete, fire for an external scheduler, add and remove, bind to a durable function),
on backfills (plan, start, cancel, follow) and on the fleet (forget a lost instance): a part
of :class:`~backend.scheduler.engine.Engine`.

Each checks what it is asked and hands the work to the part that does it (the launcher,
the states, the catalog, the external fires, the backfills); those an operator takes are
recorded in the audit log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from backend.alerts.system import Alerts
from backend.clock import Clock
from backend.durable import Durable
from backend.errors import EngineStopped, NotFound, Refused, Unavailable
from backend.events.audit import AuditLog
from backend.inputs import check_instance
from backend.model import BackfillPlan, BackfillProgress, ExternalFiring, InstanceInfo, Run, ScheduleView, iso
from backend.safetext import in_line
from backend.scheduler.backfills import Backfills, live_estimate
from backend.scheduler.catalog import Catalog, bind_target
from backend.scheduler.coordination.slots import Coordinator
from backend.scheduler.external import ExternalFires
from backend.scheduler.launcher import Launcher
from backend.scheduler.reads import ScheduleReads
from backend.scheduler.registry import InstanceRegistry
from backend.scheduler.states import ScheduleStates
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["EngineActions"]

log = logging.getLogger("schedtui.engine")


class EngineActions:
    """The operator actions on schedules, backfills and the fleet (see the module docstring): a part of
    the engine, which sets up what is declared here in its ``__init__``."""

    schedules: dict[str, Schedule]
    store: Store
    clock: Clock
    allow_external_self: bool
    states: ScheduleStates
    audit: AuditLog
    catalog: Catalog
    launcher: Launcher
    external: ExternalFires
    backfills: Backfills
    durable: Durable
    reads: ScheduleReads
    registry: InstanceRegistry
    alerts: Alerts

    if TYPE_CHECKING:  # the engine's (its reads: :class:`~backend.scheduler.engine_reads.EngineReads`)

        def schedule(self, name: str) -> Schedule: ...

        def trigger_of(self, schedule: Schedule) -> Literal["self", "external"]: ...

        def is_enabled(self, name: str) -> bool: ...

        def check_open(self, action: str) -> None: ...

        @property
        def coordinator(self) -> Coordinator: ...

        async def get_schedule(self, name: str) -> ScheduleView: ...

        async def get_run(self, run_id: str) -> Run: ...

        async def flush(self) -> None: ...

        async def hold_lease_here(self, action: str) -> None: ...

    async def prepare_runs_here(self, action: str) -> None:
        """A Run now or a backfill is about to start its runs on this instance. One that
        fires nothing while instances of another coordination mode fire (a rolling change
        of ``--coordination``) refuses it: those instances are where it belongs (the
        stateful test found a ``single`` firer, which then looked at no other process's
        runs, starting its next slot beside such a Run now). Otherwise this instance holds
        a lease from now on, if it only opened (see :meth:`Engine.hold_lease_here`).

        Taking that lease waits for the store: a stop that began meanwhile refuses the
        action (:class:`EngineStopped`), nothing started. It used to start all the same,
        on a launcher already stopped: its handler ran after the stop had closed the
        store, its run's end and its audit entry were never written."""
        if self.registry.role == "waiting":
            raise Refused(
                f"cannot {action} here: this instance fires nothing while instances of another coordination "
                "mode fire (a rolling change of --coordination); do it through one of those",
                reason="this instance fires nothing",
            )
        await self.hold_lease_here(action)
        self.check_open(action)

    def bind_target(self, schedule: Schedule) -> Schedule:
        """A schedule defined with ``durable=F`` starts an execution of F per slot."""
        # Looked up at each slot: the code schedules are bound before ``durable`` is built.
        return bind_target(schedule, lambda function, ctx: self.durable.start_for_slot(function, ctx))

    def add_schedule(self, schedule: Schedule) -> None:
        """Run ``schedule`` (new, or replacing its namesake's definition); arming is the caller's."""
        self.catalog.add_schedule(schedule)

    def remove_schedule(self, name: str) -> None:
        """Stop running a schedule: disarmed, its queued firings recorded missed, forgotten
        (a run in flight finishes and is recorded)."""
        self.catalog.remove_schedule(name)

    async def run_now(self, name: str, *, wait: bool = False) -> Run:
        """Fire a schedule at once (trigger and outcome ``manual``), whatever its overlap
        policy and enabled state. Returns the run once its row is committed, or, with
        ``wait``, once it has finished."""
        schedule = self.schedule(name)
        self.check_open(f'fire "{name}"')
        health = self.store.health()
        if not health.ok:
            # Refused before firing: its answer could only be a 503 after the fact.
            raise Unavailable(f'"{name}" not fired: the store cannot record runs now ({health.error})')
        await self.prepare_runs_here(f'fire "{name}"')
        scheduled = self.launcher.launch(schedule, self.clock.now(), "manual", "manual")
        await scheduled.started()
        await self.audit.record("schedule.fire", name, {"run_id": scheduled.run.id})
        run = await scheduled.finished() if wait else scheduled.run
        try:
            await self.flush()
        except Unavailable:
            try:
                self.check_open("flush")
            except EngineStopped:
                return run  # stopped while it ran: the stop wrote its row, and closed the store
            raise
        return run

    async def wait_run(self, run_id: str) -> Run:
        """Wait for a run this engine started to finish."""
        active = self.launcher.active.get(run_id)
        if active is None:
            return await self.get_run(run_id)
        return await asyncio.shield(active.finished())

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None, by: str | None = None) -> ScheduleView:
        """Enable or disable a schedule, persistently. A disabled schedule keeps its
        definition, has no next slot and does not fire; enabling it arms its next future slot
        (slots that passed while it was disabled are not caught up)."""
        await self.known_schedule(name)
        actor = by or self.audit.actor()
        was = self.is_enabled(name)
        await self.states.set(name, enabled, at=self.clock.now(), by=actor, note=note)
        state = self.states.get(name)
        await self.audit.record(
            "schedule.enable" if enabled else "schedule.disable",
            name,
            {"note": state.note if state is not None else None, "was_enabled": was},
            actor=actor,
        )
        return await self.get_schedule(name)

    async def known_schedule(self, name: str) -> Schedule:
        """The schedule named ``name``; one not known here is looked for in the store's
        catalog first (created a moment ago by another process?), then NotFound."""
        if isinstance(name, str) and name not in self.schedules:
            await self.catalog.refresh()
        return self.schedule(name)

    async def schedule_zone(self, name: str) -> str:
        """The zone of the schedule named ``name`` (:meth:`known_schedule`), a stored one
        not valid here included: it is there, to be read, corrected or deleted."""
        if isinstance(name, str) and name not in self.schedules:
            await self.catalog.refresh()
            row = self.catalog.rows.get(name)
            if row is not None and name in self.catalog.invalid:
                return row.timezone
        return self.schedule(name).timezone

    async def enable(self, name: str, *, note: str | None = None) -> ScheduleView:
        """:meth:`set_enabled` to enabled (an operator's action)."""
        return await self.set_enabled(name, True, note=note)

    async def disable(self, name: str, *, note: str | None = None) -> ScheduleView:
        """:meth:`set_enabled` to disabled (an operator's action)."""
        return await self.set_enabled(name, False, note=note)

    async def create_schedule(self, spec: Mapping[str, Any]) -> ScheduleView:
        """Store a new schedule (see :meth:`backend.client.interface.Backend.create_schedule`);
        armed here at once, on every instance sharing the store within 2 s."""
        actor = self.audit.actor()
        row, made = await self.catalog.create(spec, actor)
        # A repeat (a retry whose first answer was lost) is recorded too, marked: the first
        # call's own entry may be what was lost.
        details = {"spec": row.spec()} if made else {"spec": row.spec(), "again": True}
        await self.audit.record("schedule.create", row.name, details, actor=actor)
        return await self.reads.written_view(row.name, row)

    async def update_schedule(self, name: str, changes: Mapping[str, Any]) -> ScheduleView:
        """Change a stored schedule; a code schedule is refused (``defined_in_code``)."""
        self.catalog.check_stored(name)
        actor = self.audit.actor()
        try:  # (before: with no state yet, it is the row's, which the update changes)
            was_enabled: bool | None = self.is_enabled(name)
        except NotFound:  # created a moment ago by another process: the update reads it
            was_enabled = None
        before, after = await self.catalog.update(name, changes, actor)
        if "enabled" in changes and after.enabled != (before.enabled if was_enabled is None else was_enabled):
            # Who and when, as a disable records them: "disabled too long" counts from it.
            await self.states.set(name, after.enabled, at=self.clock.now(), by=actor)
        await self.audit.record("schedule.update", name, {"before": before.spec(), "after": after.spec()}, actor=actor)
        return await self.reads.written_view(name, after)

    async def delete_schedule(self, name: str) -> None:
        """Delete a stored schedule: it stops firing here at once, everywhere within 2 s."""
        self.catalog.check_stored(name, deleting=True)
        actor = self.audit.actor()
        row = await self.catalog.delete(name)
        await self.audit.record("schedule.delete", name, {"spec": row.spec()}, actor=actor)

    async def fire_external(self, name: str, *, allow_self: bool | None = None) -> ExternalFiring:
        """Fire the slot that is due now because an external scheduler says so (see
        :mod:`backend.scheduler.external`). Schedules not marked ``trigger="external"`` are refused
        unless ``allow_self`` (by default :attr:`allow_external_self`). The overlap policy
        applies as for timer firings."""
        schedule = self.schedule(name)
        self.check_open(f'fire "{name}"')
        if allow_self is None:
            allow_self = self.allow_external_self
        if self.trigger_of(schedule) != "external" and not allow_self:
            raise Refused(
                f'"{name}" is fired by its own timer (trigger=self); an external fire would run it twice. '
                "Mark it trigger=\"external\", or allow it explicitly.",
                reason="not an external schedule",
            )
        mode = self.coordinator.mode
        if self.trigger_of(schedule) != "external" and mode != "advisoryLock":
            # Only there does the timer claim each slot in the store, as the call does: under
            # single and cluster the call and the timer both ran the slot, in either order.
            raise Refused(
                f'"{name}" is fired by its own timer, which under coordination {mode} claims no slot in the store: '
                "an external fire would run the slot it fires twice. Allowed under coordination advisoryLock, "
                'where each slot is claimed once in the store; or mark it trigger="external".',
                reason="would run twice",
            )
        return await self.external.fire(schedule)

    async def start_backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress:
        """Start firing the slots in ``(start, end]`` in order, in the background (with
        ``skip_succeeded``, only those without a succeeded run); raises :class:`Refused`
        when the plan is refused or one runs for this schedule anywhere."""
        schedule = self.schedule(name)
        self.check_open(f'backfill "{name}"')
        await self.prepare_runs_here(f'backfill "{name}"')
        return await self.backfills.start(
            schedule, start, end, confirm=confirm, limit=limit, skip_succeeded=skip_succeeded
        )

    async def plan_backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan:
        """What a backfill of the slots in ``(start, end]`` would do; fires nothing. When
        it may start or needs confirmation, also how many of its slots already have a
        succeeded run (``already_succeeded``) and what it may do to the schedule's live
        slots (see :func:`~backend.scheduler.backfills.live_estimate`). The one plan every
        surface shows (the API, the CLI, the console, ``connect()``)."""
        schedule = self.schedule(name)
        plan, slots = await self.backfills.plan(schedule, start, end, confirm=confirm, limit=limit)
        if plan.count == 0 or plan.reason not in (None, "needs confirmation"):
            return plan
        done = await self.succeeded_slots(name, slots)
        live = await live_estimate(
            self.store, schedule, plan.count, self.clock.now(), enabled=self.is_enabled(name), walk=self.backfills.walk
        )
        return dataclasses.replace(plan, already_succeeded=len(done), **live)

    async def succeeded_slots(self, name: str, slots: list[datetime]) -> set[datetime]:
        """Which of ``slots`` (ascending) already have a succeeded run, of any trigger."""
        return await self.backfills.succeeded_slots(self.schedule(name), slots)

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        """Stop a running backfill of this engine before its next slot (the run in flight
        finishes on its own); recorded ``cancelled``, and its end once that run has ended."""
        return await self.backfills.cancel(backfill_id)

    async def running_backfills(self, name: str | None = None) -> list[BackfillProgress]:
        """The backfills running now on any instance (of schedule ``name``), oldest first."""
        if name is not None:
            self.schedule(name)  # NotFound for an unknown one
        return self.backfills.running(name, await self.store.running_backfills())

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        return await self.backfills.progress(backfill_id)

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        return await self.backfills.wait(backfill_id)

    # -- the fleet --------------------------------------------------------------------------
    async def forget_instance(self, name: str) -> InstanceInfo:
        """Forget a lost instance (an operator's action): delete the row of an instance the
        fleet judges gone, as every member's sweep judges it before taking its work over
        (silent past its take-over window, or its pid dead on this host), so that its
        ``instance_lost`` alert resolves and it leaves the instance lists now rather than a
        day later. Its work is taken over as it would be anyway (a row gone is an instance
        gone). Returns the instance as it was registered.

        :class:`NotFound` for a name not registered; :class:`Refused` for this very
        instance, one that is alive by its heartbeat (or while this instance cannot judge:
        its clock off, its lease lapsed), one whose last burst a sweep has yet to record,
        and one that beat between the look and the delete (nothing is deleted)."""
        check_instance(name, "name")
        registry = self.registry
        if name == registry.instance:
            raise Refused(f'instance "{name}" is the one answering: it is alive (stop it instead)', reason="alive")
        beats = await self.store.instances()
        beat = beats.get(name)
        info = next((i for i in await self.store.fleet() if i.name == name), None)
        if beat is None or info is None:
            raise NotFound(f'no instance named "{name}" is registered (gone already, or never was)')
        now = self.clock.now()
        why = registry.gone(beats, name, now)
        if why is None and not registry.holds_name():
            raise Refused(
                f'instance "{name}" cannot be judged gone by this instance now: its own clock is off the '
                "database's, or its own lease lapsed; try again through another instance, or once this one's holds",
                reason="cannot judge",
            )
        if why is None:
            age = max(0.0, (now - beat.at).total_seconds())
            raise Refused(
                f'instance "{name}" is alive as far as the fleet can tell: its last heartbeat was {age:.0f}s ago, '
                "within its take-over window; stop it instead, or wait until it is judged gone",
                reason="alive",
            )
        if name in await self.store.starting_marks():
            raise Refused(
                f'instance "{name}" died while starting a burst of runs that a member has yet to record; '
                "try again in a few seconds",
                reason="burst not recorded",
            )
        if not await self.store.forget_lost_instance(name, beat.host, beat.pid, beat.at):
            raise Refused(f'instance "{name}" beat again just now, or its row changed: nothing forgotten; look again',
                          reason="changed")  # fmt: skip
        log.warning("instance %s forgotten by an operator: %s", in_line(name), why)
        await self.audit.record(
            "instance.forget", name, {"host": beat.host, "pid": beat.pid, "heartbeat_at": iso(beat.at), "why": why}
        )
        self.alerts.evaluate_soon()  # (its instance_lost resolves now)
        return info
