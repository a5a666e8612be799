"""Building the systems beside the schedules.

:func:`build_systems` runs once, inside :class:`~backend.scheduler.engine.Engine`'s
constructor, after the schedule parts (launcher, claims, timers, catch-up, registry) exist.
It builds the :class:`~backend.runtime.subsystems.Shared` parts, then durable executions,
the job queue, locks and, in ``cluster`` coordination, this instance's shards, returns them
as :class:`Systems`, and hands the launcher and the timers what they need of them. It warns
of a schedule sending to a queue these definitions do not define. It does no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

from backend.clock import Clock, ManualClock
from backend.durable import Durable, DurableFunction
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.jobs.definition import Queue
from backend.jobs.system import Jobs
from backend.locks import Locks
from backend.runtime.subsystems import Shared, Subsystem
from backend.scheduler.coordination.cluster import Cluster, ClusterCoordinator, ClusterStore
from backend.scheduler.coordination.slots import Coordinator
from backend.scheduler.parts import CoreParts, ScheduleParts

__all__ = ["Systems", "build_systems"]

log = logging.getLogger("schedtui.engine")


@dataclass(frozen=True)
class Systems:
    """The systems beside the schedules (see the module docstring)."""

    shared: Shared
    """The engine's parts the systems use."""
    durable: Durable
    jobs: Jobs
    locks: Locks
    cluster: Cluster | None
    """This instance's shards, in ``cluster`` coordination."""

    @property
    def in_start_order(self) -> list[Subsystem]:
        """Each system, in the order the engine opens and starts them."""
        systems: list[Subsystem] = [self.durable, self.jobs, self.locks]
        if self.cluster is not None:
            systems.append(self.cluster)
        return systems


def build_systems(
    core: CoreParts,
    parts: ScheduleParts,
    coordinator: Coordinator,
    *,
    audit: AuditLog,
    events: EventBus,
    functions: Sequence[DurableFunction],
    queues: Sequence[Queue],
    abandon_after: float,
    state_poll_interval: float,
    heartbeat_interval: float,
    retention: timedelta | None,
    lock_clock: Clock | None,
    shard_ttl: float,
    job_backoff: int,
) -> Systems:
    """Build the durable executions, job queue, locks and shards (see the module
    docstring); the arguments are the engine's own of the same names."""
    shared = Shared(
        clock=core.clock,
        store=core.store,
        loops=core.loops,
        runner=core.runner,
        registry=parts.registry,
        outages=core.outages,
        instance=core.instance,
        new_id=core.new_id,
        audit=audit,
        events=events,
    )
    durable = Durable(
        shared,
        functions,
        lease_ttl=timedelta(seconds=abandon_after),
        poll_interval=timedelta(seconds=state_poll_interval),
        check_owners_every=timedelta(seconds=heartbeat_interval),
        retention=retention,
    )
    jobs = Jobs(shared, queues, first_backoff=job_backoff)
    parts.launcher.jobs = jobs.actions
    for schedule in core.schedules.values():
        if schedule.queue is not None and schedule.queue not in jobs.queues:
            log.warning(
                'schedule "%s" sends its jobs to queue "%s", which these definitions do not define: '
                "its firings fail unless a process that defines it has recorded it in the store",
                schedule.name,
                schedule.queue,
            )
    # Leases expire on the database's clock, unless a test injected a clock to move by hand.
    if lock_clock is None and isinstance(core.clock, ManualClock):
        lock_clock = core.clock
    locks = Locks(shared, lock_clock=lock_clock)
    parts.launcher.locks = locks
    shards: Cluster | None = None
    if isinstance(coordinator, ClusterCoordinator):
        cluster = Cluster(
            store=cast(ClusterStore, core.store),
            clock=core.clock,
            loops=core.loops,
            registry=parts.registry,
            outages=core.outages,
            instance=core.instance,
            schedules=[s for s in core.schedules.values() if core.trigger_of(s) == "self"],
            catch_up=parts.catch_up,
            timers=parts.timers,
            is_enabled=core.states.is_enabled,
            lock_now=locks.lock_now,
            ttl=timedelta(seconds=shard_ttl),
            # A round (renewal and read, one transaction) every fifth of a lease: a dead
            # owner's shards move within a lease and that; a member costs 0.5 commits/s.
            poll=max(core.state_poll_interval, timedelta(seconds=shard_ttl) / 5),
        )
        coordinator.cluster = cluster
        parts.launcher.shard_fence = lambda name: fence[1] if (fence := cluster.fence_of(name)) is not None else None
        parts.timers.may_arm = cluster.owns  # only what this instance's shards hold
        shards = cluster
    return Systems(shared, durable, jobs, locks, shards)
