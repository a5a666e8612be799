"""Building the engine's schedule parts and handing each what it needs of the others.

:func:`attach_schedule_parts` runs once, inside :class:`~backend.scheduler.engine.Engine`'s
constructor, after the engine's clock, store, loops, ledger, runner and outage log exist.
It builds the launcher, the slot claims (over the given coordinator), the timers,
catch-up, backfills and the instance registry, sets them on the engine (``launcher``,
``claims``, ``timers``, ``catch_up``, ``backfills``, ``registry``), and wires the ledger's
finished-run hook and the registry's two questions: which runs this process is
responsible for (never swept as abandoned), and which self-triggered schedules have a
given slot. It does no I/O.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from backend.model import Run
from backend.scheduler.backfills import Backfills
from backend.scheduler.catchup import CatchUp
from backend.scheduler.coordination.slots import Coordinator, SlotClaims
from backend.scheduler.launcher import Launcher
from backend.scheduler.lifecycle import role_changed
from backend.scheduler.registry import InstanceRegistry
from backend.scheduler.timers import Timers

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = ["attach_schedule_parts"]


def attach_schedule_parts(
    engine: Engine,
    coordinator: Coordinator,
    *,
    catch_up_limit: int,
    heartbeat_interval: float,
    abandon_after: float,
    retention: timedelta | None,
    claims_ttl: timedelta | None,
) -> None:
    """Build the schedule parts of ``engine`` (see the module docstring); the arguments
    are the engine's own of the same names."""
    engine.launcher = launcher = Launcher(
        clock=engine.clock,
        store=engine.store,
        ledger=engine.ledger,
        runner=engine.runner,
        schedules=engine.schedules,
        instance=engine.instance,
        new_id=engine.new_id,
        poke=engine.loops.poke,
    )
    engine.claims = claims = SlotClaims(
        coordinator=coordinator,
        store=engine.store,
        clock=engine.clock,
        loops=engine.loops,
        launcher=launcher,
        outages=engine.outages,
        schedules=engine.schedules,
        is_enabled=engine.is_enabled,
        instance=engine.instance,
        new_id=engine.new_id,
        catch_up_limit=catch_up_limit,
    )

    def finished(run: Run) -> None:
        claims.claimed.discard(run.id)  # claims.finished(), inlined: once per run
        launcher.placed.discard(run.id)

    engine.ledger.on_finished = finished
    engine.timers = Timers(
        clock=engine.clock,
        loops=engine.loops,
        ledger=engine.ledger,
        launcher=launcher,
        claims=claims,
        schedules=engine.schedules,
        is_enabled=engine.states.is_enabled,
        catch_up_limit=catch_up_limit,
    )
    engine.catch_up = CatchUp(
        clock=engine.clock,
        store=engine.store,
        loops=engine.loops,
        claims=claims,
        launcher=launcher,
        timers=engine.timers,
        outages=engine.outages,
        states=engine.states,
        catch_up_limit=catch_up_limit,
        poll_interval=engine.state_poll_interval,
    )
    engine.backfills = Backfills(
        clock=engine.clock,
        store=engine.store,
        loops=engine.loops,
        launcher=launcher,
        instance=engine.instance,
        new_id=engine.new_id,
    )

    def is_ours(id_: str) -> bool:
        """A run (or backfill) this process is responsible for: never abandoned by it."""
        return (
            id_ in launcher.active
            or id_ in launcher.placed
            or id_ in claims.claimed
            or id_ in engine.backfills.jobs
            or any(subsystem.is_ours(id_) for subsystem in engine.subsystems)
        )

    def self_due_at(slot: datetime) -> list[str]:
        """The self-triggered schedules with a slot at ``slot``."""
        before = slot - timedelta(microseconds=1)
        return [
            name
            for name, schedule in engine.schedules.items()
            if schedule.effective_trigger(engine.default_trigger) == "self" and schedule.cron.next(before) == slot
        ]

    engine.registry = InstanceRegistry(
        clock=engine.clock,
        store=engine.store,
        ledger=engine.ledger,
        instance=engine.instance,
        heartbeat_interval=timedelta(seconds=heartbeat_interval),
        abandon_after=timedelta(seconds=abandon_after),
        retention=retention,
        claims_ttl=claims_ttl,
        is_ours=is_ours,
        due_at=self_due_at,
        new_id=engine.new_id,
        lease=engine.lease,
        coordination=coordinator.mode,
    )
    claims.lease = engine.lease
    engine.lease.on_lapse.append(launcher.lease_lapsed)
    registry = engine.registry
    claims.fires = lambda: registry.fires
    engine.timers.may_arm = lambda name: registry.role != "waiting"  # (cluster: its shards decide)
    registry.on_role = lambda was, now: role_changed(engine, was, now)
