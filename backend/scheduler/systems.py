"""Building the systems beside the schedules and attaching them to an engine.

:func:`attach_systems` runs once, inside :class:`~backend.scheduler.engine.Engine`'s constructor,
after the schedule parts (launcher, claims, timers, catch-up, registry) exist. It builds
the :class:`~backend.runtime.subsystems.Shared` parts, then durable executions, the job queue,
locks and, in ``cluster`` coordination, this instance's shards; sets them on the engine
(``shared``, ``durable``, ``jobs``, ``locks``, ``cluster``), appends them to
``engine.subsystems`` in start order, and hands the launcher and the timers what they need
of them. It warns of a schedule sending to a queue these definitions do not define. It
does no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from backend.clock import Clock, ManualClock
from backend.durable import Durable, DurableFunction
from backend.jobs.definition import Queue
from backend.jobs.system import Jobs
from backend.locks import Locks
from backend.runtime.subsystems import Shared
from backend.scheduler.coordination.cluster import Cluster, ClusterCoordinator, ClusterStore

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = ["attach_systems"]

log = logging.getLogger("schedtui.engine")


def attach_systems(
    engine: Engine,
    functions: Sequence[DurableFunction],
    queues: Sequence[Queue],
    *,
    abandon_after: float,
    state_poll_interval: float,
    heartbeat_interval: float,
    retention: timedelta | None,
    lock_clock: Clock | None,
    shard_ttl: float,
) -> None:
    """Build the durable executions, job queue, locks and shards of ``engine`` (see the
    module docstring); the arguments are the engine's own of the same names."""
    engine.shared = Shared(
        clock=engine.clock,
        store=engine.store,
        loops=engine.loops,
        runner=engine.runner,
        registry=engine.registry,
        outages=engine.outages,
        instance=engine.instance,
        new_id=engine.new_id,
        audit=engine.audit,
        events=engine.events,
    )
    engine.durable = Durable(
        engine.shared,
        functions,
        lease_ttl=timedelta(seconds=abandon_after),
        poll_interval=timedelta(seconds=state_poll_interval),
        check_owners_every=timedelta(seconds=heartbeat_interval),
        retention=retention,
    )
    engine.subsystems.append(engine.durable)
    engine.jobs = Jobs(engine.shared, queues)
    engine.subsystems.append(engine.jobs)
    engine.launcher.jobs = engine.jobs.actions
    for schedule in engine.schedules.values():
        if schedule.queue is not None and schedule.queue not in engine.jobs.queues:
            log.warning(
                'schedule "%s" sends its jobs to queue "%s", which these definitions do not define: '
                "its firings fail unless a process that defines it has recorded it in the store",
                schedule.name,
                schedule.queue,
            )
    # Leases expire on the database's clock, unless a test injected a clock to move by hand.
    if lock_clock is None and isinstance(engine.clock, ManualClock):
        lock_clock = engine.clock
    engine.locks = Locks(engine.shared, lock_clock=lock_clock)
    engine.launcher.locks = engine.locks
    engine.subsystems.append(engine.locks)
    coordinator = engine.coordinator
    if isinstance(coordinator, ClusterCoordinator):
        engine.cluster = Cluster(
            store=cast(ClusterStore, engine.store),
            clock=engine.clock,
            loops=engine.loops,
            registry=engine.registry,
            outages=engine.outages,
            instance=engine.instance,
            schedules=[s for s in engine.schedules.values() if s.effective_trigger(engine.default_trigger) == "self"],
            catch_up=engine.catch_up,
            timers=engine.timers,
            is_enabled=engine.is_enabled,
            lock_now=engine.locks.lock_now,
            ttl=timedelta(seconds=shard_ttl),
            # A round (renewal and read, one transaction) every fifth of a lease: a dead
            # owner's shards move within a lease and that; a member costs 0.5 commits/s.
            poll=max(engine.state_poll_interval, timedelta(seconds=shard_ttl) / 5),
        )
        coordinator.cluster = engine.cluster
        cluster = engine.cluster
        engine.launcher.shard_fence = lambda name: fence[1] if (fence := cluster.fence_of(name)) is not None else None
        engine.timers.may_arm = engine.cluster.owns  # only what this instance's shards hold
        engine.subsystems.append(engine.cluster)
