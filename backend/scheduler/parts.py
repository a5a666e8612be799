"""Building the engine's schedule parts and handing each what it needs of the others.

:func:`build_schedule_parts` runs once, inside :class:`~backend.scheduler.engine.Engine`'s
constructor, from the engine's :class:`CoreParts` (its clock, store, loops, ledger, runner,
outage log, lease and schedule states, made first). It builds the launcher, the slot claims
(over the given coordinator), the timers, catch-up, backfills and the instance registry,
returns them as :class:`ScheduleParts`, and wires the ledger's finished-run hook and the
registry's two questions: which runs this process is responsible for (never swept as
abandoned), and which self-triggered schedules have a given slot. It does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from backend.clock import Clock
from backend.events.audit import AuditLog
from backend.model import Run
from backend.runtime.liveness import WorkLease
from backend.runtime.loops import Loops
from backend.runtime.outages import OutageLog
from backend.runtime.runner import HandlerRunner
from backend.runtime.subsystems import Subsystem
from backend.scheduler.backfills import Backfills
from backend.scheduler.catchup import CatchUp
from backend.scheduler.coordination.slots import Coordinator, SingleCoordinator, SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger
from backend.scheduler.registry import InstanceRegistry
from backend.scheduler.states import ScheduleStates
from backend.scheduler.timers import Timers
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["CoreParts", "ScheduleParts", "build_schedule_parts"]


@dataclass(frozen=True)
class CoreParts:
    """The engine's parts made before any other, which the schedule parts and the systems
    beside them are built from."""

    clock: Clock
    store: Store
    loops: Loops
    ledger: RunLedger
    runner: HandlerRunner
    outages: OutageLog
    lease: WorkLease
    """This instance's lease on its work (see :mod:`backend.runtime.liveness`)."""
    states: ScheduleStates
    schedules: dict[str, Schedule]
    """The schedules the engine runs, by name: the one dict every part reads (the catalog
    adds and removes schedules in it)."""
    instance: str
    new_id: Callable[[], str]
    default_trigger: Literal["self", "external"]
    """The trigger of a schedule that names none."""
    state_poll_interval: timedelta

    def trigger_of(self, schedule: Schedule) -> Literal["self", "external"]:
        return schedule.effective_trigger(self.default_trigger)


@dataclass(frozen=True)
class ScheduleParts:
    """What fires the schedules and keeps their books (see the module docstring)."""

    launcher: Launcher
    claims: SlotClaims
    timers: Timers
    catch_up: CatchUp
    backfills: Backfills
    registry: InstanceRegistry


def build_schedule_parts(
    core: CoreParts,
    coordinator: Coordinator,
    *,
    subsystems: Sequence[Subsystem],
    audit: AuditLog,
    catch_up_limit: int,
    heartbeat_interval: float,
    abandon_after: float,
    retention: timedelta | None,
    claims_ttl: timedelta | None,
) -> ScheduleParts:
    """Build the schedule parts (see the module docstring). ``subsystems`` is the engine's
    list of systems beside the schedules, read whenever the registry asks whose a run is
    (the systems are added to it once built); the other arguments are the engine's own of
    the same names."""
    launcher = Launcher(
        clock=core.clock,
        store=core.store,
        ledger=core.ledger,
        runner=core.runner,
        schedules=core.schedules,
        instance=core.instance,
        new_id=core.new_id,
        poke=core.loops.poke,
    )
    launcher.takes_turns = coordinator.takes_turns
    launcher.rechecks_waits = coordinator.needs_claims
    if isinstance(coordinator, SingleCoordinator):
        launcher.rechecks_waits = True
        launcher.blocker_elsewhere = coordinator.blocker
    claims = SlotClaims(
        coordinator=coordinator,
        store=core.store,
        clock=core.clock,
        loops=core.loops,
        launcher=launcher,
        outages=core.outages,
        schedules=core.schedules,
        is_enabled=core.states.is_enabled,
        instance=core.instance,
        new_id=core.new_id,
        catch_up_limit=catch_up_limit,
    )

    def finished(run: Run) -> None:
        claims.claimed.discard(run.id)  # claims.finished(), inlined: once per run
        launcher.placement.placed.discard(run.id)
        launcher.turns.discard(run.id)
        launcher.waited.discard(run.id)

    core.ledger.on_finished = finished
    timers = Timers(
        clock=core.clock,
        loops=core.loops,
        ledger=core.ledger,
        launcher=launcher,
        claims=claims,
        schedules=core.schedules,
        is_enabled=core.states.is_enabled,
        catch_up_limit=catch_up_limit,
    )
    catch_up = CatchUp(
        clock=core.clock,
        store=core.store,
        loops=core.loops,
        claims=claims,
        launcher=launcher,
        timers=timers,
        outages=core.outages,
        states=core.states,
        catch_up_limit=catch_up_limit,
        poll_interval=core.state_poll_interval,
    )
    backfills = Backfills(
        clock=core.clock,
        store=core.store,
        loops=core.loops,
        launcher=launcher,
        audit=audit,
        instance=core.instance,
        new_id=core.new_id,
        schedules=core.schedules,
    )

    def is_ours(id_: str) -> bool:
        """A run (or backfill) this process is responsible for: never abandoned by it."""
        return (
            id_ in launcher.active
            or id_ in launcher.placement.placed
            or id_ in claims.claimed
            or id_ in backfills.jobs
            or any(subsystem.is_ours(id_) for subsystem in subsystems)
        )

    def self_due_at(slot: datetime) -> list[str]:
        """The self-triggered schedules with a slot at ``slot``."""
        before = slot - timedelta(microseconds=1)
        return [
            name
            for name, schedule in core.schedules.items()
            if core.trigger_of(schedule) == "self" and schedule.cron.next(before) == slot
        ]

    registry = InstanceRegistry(
        clock=core.clock,
        store=core.store,
        ledger=core.ledger,
        instance=core.instance,
        heartbeat_interval=timedelta(seconds=heartbeat_interval),
        abandon_after=timedelta(seconds=abandon_after),
        retention=retention,
        claims_ttl=claims_ttl,
        is_ours=is_ours,
        due_at=self_due_at,
        new_id=core.new_id,
        lease=core.lease,
        coordination=coordinator.mode,
        defined=core.schedules.keys,
    )
    registry.on_abandoned_backfill = backfills.abandoned
    claims.lease = core.lease
    core.lease.on_lapse.append(launcher.lease_lapsed)
    claims.fires = lambda: registry.fires
    timers.may_arm = lambda name: registry.role != "waiting"  # (cluster: its shards decide)
    return ScheduleParts(launcher, claims, timers, catch_up, backfills, registry)
