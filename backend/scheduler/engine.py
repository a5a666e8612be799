"""The scheduler engine: the facade that wires its parts and carries the operator actions.

One :class:`Engine` drives a set of schedules against one store. Its parts, each a module
with one job:

* :mod:`~backend.scheduler.timers`: each self-triggered schedule's one armed slot, and the loop
  that fires due slots in bursts;
* :mod:`~backend.scheduler.launcher`: the overlap policy, runs in flight, and their ledger rows;
* :mod:`~backend.scheduler.placement`: a run's row committed before its handler starts;
* :mod:`~backend.runtime.runner`: calls handlers (async as tasks, sync on a bounded thread pool)
  under a deadline, and decides how each call ended;
* :mod:`~backend.scheduler.coordination.slots`: claims across instances and the slots lost to an outage;
* :mod:`~backend.scheduler.catchup`: slots missed while no engine ran, or while it was behind;
* :mod:`~backend.scheduler.backfills`: operator-requested range backfills;
* :mod:`~backend.scheduler.registry`: heartbeats, the abandoned-work sweep and retention;
* :mod:`~backend.runtime.liveness`: this instance's lease on its work, and what a lapse stops;
* :mod:`~backend.scheduler.external`: fires requested by a platform scheduler;
* :mod:`~backend.scheduler.parts`: builds the parts above and hands each what it needs of the others;
* :mod:`~backend.scheduler.systems`: builds the job queue, durable executions, locks and shards
  beside the schedules (each a :class:`~backend.runtime.subsystems.Subsystem`);
* :mod:`~backend.scheduler.catalog`: the schedules created at run time, kept in the store;
* :mod:`~backend.scheduler.reads`: the schedule views, run pages and upcoming slots it answers with;
* :mod:`~backend.activity`: the recent activity per schedule and queue, and each schedule's lateness;
* :mod:`~backend.scheduler.lifecycle`: the order in which the parts open, start, keep house and stop;
* :mod:`~backend.scheduler.lifetime`: where the engine is in its one life, on which loop, in which process;
* :mod:`~backend.scheduler.ledger` and :mod:`~backend.runtime.loops`: recording runs, and the background
  tasks with the bookkeeping that lets :meth:`Engine.quiesce` say "nothing left to do".

The class is written in three modules: this one (wiring the parts, the lifecycle, listeners
and quiescence), and two it inherits from, :mod:`~backend.scheduler.engine_reads` (:class:`~backend.scheduler.engine_reads.EngineReads`:
the schedules, their states and views, run pages, the fleet and health) and
:mod:`~backend.scheduler.engine_actions` (:class:`~backend.scheduler.engine_actions.EngineActions`:
the operator actions on schedules and backfills).

Each part is handed what it uses (constructor arguments, or the :class:`~backend.scheduler.parts.CoreParts`
bundle the builders start from), never the engine; only :mod:`~backend.scheduler.lifecycle`
takes the engine, whose order of events it is, through its public surface.

Time comes only from the injected :class:`~backend.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, Literal, cast

import httpx

from backend.activity import ActivityReads, ActivityStore
from backend.alerts.system import Alerts, AlertSettings
from backend.clock import Clock, SystemClock, follows_real_time
from backend.definitions import Definitions
from backend.durable import Durable, DurableFunction
from backend.errors import BadInput, Unavailable
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.events.relay import Relay
from backend.ids import IdFactory
from backend.inputs import check_instance, check_seconds, shown_number
from backend.jobs.definition import BACKOFF_FIRST_S, Queue
from backend.jobs.system import Jobs
from backend.locks import Locks
from backend.model import CoordinationMode, ExternalFiring, Run
from backend.observability.logs import LogStore
from backend.observability.runlogs import RunLogs
from backend.runtime.liveness import WorkLease, boot_clock
from backend.runtime.loops import Loops
from backend.runtime.loopwatch import LoopWatch
from backend.runtime.outages import OutageLog
from backend.runtime.runner import DEFAULT_MAX_THREADS, HandlerRunner
from backend.runtime.subsystems import Shared, Subsystem
from backend.safetext import printable
from backend.scheduler import lifecycle, names
from backend.scheduler.backfills import Backfills
from backend.scheduler.catalog import Catalog, CatalogStore
from backend.scheduler.catchup import CatchUp
from backend.scheduler.coordination.cluster import Cluster
from backend.scheduler.coordination.slots import Coordinator, SlotClaims, make_coordinator
from backend.scheduler.engine_actions import EngineActions
from backend.scheduler.engine_reads import EngineReads
from backend.scheduler.external import ExternalFires
from backend.scheduler.launcher import Launcher
from backend.scheduler.ledger import RunLedger, RunListener
from backend.scheduler.lifetime import Lifetime
from backend.scheduler.parts import CoreParts, build_schedule_parts
from backend.scheduler.reads import ScheduleReads
from backend.scheduler.registry import InstanceRegistry
from backend.scheduler.states import ScheduleStates
from backend.scheduler.systems import build_systems
from backend.scheduler.timers import Timers
from backend.scheduler.timings import FleetTimings
from backend.schedules import Schedule
from backend.store import Store, open_store

__all__ = ["Engine", "ExternalFiring", "RunListener"]

log = logging.getLogger("schedtui.engine")

#: The longest of the engine's lengths of time, in seconds: a day for its own rhythms (its
#: polls, heartbeats, take-over window, grace, shard leases), a year for an external call's
#: tolerance, a century for what it keeps (runs, claims).
_DAY, _YEAR, _CENTURY = 86_400.0, 366 * 86_400.0, 36_500 * 86_400.0


def _whole_option(value: object, option: str, low: int, high: int) -> int:
    """An engine option's whole number, refused as every option is (``… must be …``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadInput(f"{option} {shown_number(value)} must be a whole number from {low:,} to {high:,}", field=option)
    return value


def _span(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _definitions(definitions: object) -> list[Any]:
    """What an engine is given to run, as a list; :class:`BadInput` for anything else (a
    folder's name given for what it defines: its characters were taken one by one)."""
    if isinstance(definitions, Definitions):
        return list(definitions.items)
    if isinstance(definitions, (str, bytes, os.PathLike)):
        raise BadInput(
            f"definitions {printable(str(definitions), 80)!r} is not a list of definitions: for the files of a folder, "
            "give discover_definitions(folder)",
            field="definitions",
        )
    try:
        items: list[Any] = list(cast(Iterable[Any], definitions))
    except TypeError:
        raise BadInput(
            f"definitions {printable(repr(definitions), 80)} is not a list of definitions "
            "(define_schedule, define_queue, define_durable) nor discover_definitions(folder)",
            field="definitions",
        ) from None
    for index, item in enumerate(items):
        if not isinstance(item, _DEFINITION_TYPES):
            raise BadInput(f"definitions item {index}, {printable(repr(item), 80)}, is not a definition this engine runs "
                           "(define_schedule, define_queue, define_durable)", field="definitions")  # fmt: skip
    return items

#: What the engine runs: schedules, and each subsystem's definitions.
_DEFINITION_TYPES: tuple[type, ...] = (Schedule, Queue, DurableFunction)


class Engine(EngineReads, EngineActions):
    """Fires schedules, records every run, and carries out operator actions.

    Use ``await engine.start()`` to arm timers (what ``schedtui serve`` does), or only
    ``await engine.open()`` to act on the store without firing anything on the clock (what
    the other CLI verbs do). ``await engine.stop()`` shuts down cleanly.

    ``instance`` names this process on every run it records (default ``hostname:pid``);
    one that is not 1-255 printable characters is :class:`~backend.errors.BadInput`.
    """

    # Built by :func:`backend.scheduler.parts.build_schedule_parts`.
    launcher: Launcher
    claims: SlotClaims
    timers: Timers
    catch_up: CatchUp
    backfills: Backfills
    registry: InstanceRegistry
    # Built by :func:`backend.scheduler.systems.build_systems`.
    shared: Shared
    """The engine's parts the systems beside the schedules use."""
    durable: Durable
    """Durable executions: starting them and operator actions; the executor once started."""
    jobs: Jobs
    """The job queue: sending and operator actions; workers once started."""
    locks: Locks
    """Leases on named locks, and locked schedule runs."""
    cluster: Cluster | None
    """This instance's shards, in ``cluster`` coordination."""

    def __init__(
        self,
        definitions: Iterable[Any] | Definitions,
        store: Store | str | None = None,
        *,
        clock: Clock | None = None,
        instance: str | None = None,
        coordination: CoordinationMode | Coordinator | None = None,
        default_trigger: Literal["self", "external"] = "self",
        retention: float | timedelta | None = timedelta(days=30),
        claims_ttl: float | timedelta | None = timedelta(hours=24),
        catch_up_limit: int = 1000,
        state_poll_interval: float | timedelta = 1.0,
        heartbeat_interval: float | timedelta = 5.0,
        abandon_after: float | timedelta = 30.0,
        shutdown_grace: float | timedelta = 30.0,
        external_tolerance: float | timedelta = timedelta(minutes=10),
        external_early: float | timedelta = timedelta(seconds=5),
        max_threads: int = DEFAULT_MAX_THREADS,
        ids: Callable[[], str] | None = None,
        lock_clock: Clock | None = None,
        shard_ttl: float | timedelta = 10.0,
        job_backoff: int = BACKOFF_FIRST_S,
        actor: str | None = None,
        lease_clock: Callable[[], float] | None | Literal["auto"] = "auto",
        exit_when_lease_lapses: bool = True,
        alerting: AlertSettings | None = None,
        alert_transport: httpx.AsyncBaseTransport | None = None,
        capture_logs: bool = True,
    ) -> None:
        """Lengths of time are seconds or timedeltas. Each option is checked before anything
        opens: a refusal (:class:`BadInput`) names it and its value."""
        if instance is not None:  # before anything opens: it goes on every run, shown in tables
            check_instance(instance)
        retention = None if retention is None else _span(check_seconds(retention, "retention", high=_CENTURY))
        claims_ttl = None if claims_ttl is None else _span(check_seconds(claims_ttl, "claims_ttl", high=_CENTURY))
        catch_up_limit = _whole_option(catch_up_limit, "catch_up_limit", 1, 1_000_000)
        state_poll_interval = check_seconds(state_poll_interval, "state_poll_interval", high=_DAY)
        heartbeat_interval = check_seconds(heartbeat_interval, "heartbeat_interval", high=_DAY)
        abandon_after = check_seconds(abandon_after, "abandon_after", high=_DAY)
        shutdown_grace = check_seconds(shutdown_grace, "shutdown_grace", high=_DAY, zero=True)
        external_tolerance = _span(check_seconds(external_tolerance, "external_tolerance", high=_YEAR, zero=True))
        external_early = _span(check_seconds(external_early, "external_early", high=_DAY, zero=True))
        max_threads = _whole_option(max_threads, "max_threads", 1, 10_000)
        shard_ttl = check_seconds(shard_ttl, "shard_ttl", high=_DAY)
        job_backoff = _whole_option(job_backoff, "job_backoff", 1, int(_DAY))
        if default_trigger not in ("self", "external"):
            raise BadInput(f"default_trigger {default_trigger!r} must be \"self\" or \"external\"", field="default_trigger")
        items = _definitions(definitions)
        self.schedules: dict[str, Schedule] = {}
        for schedule in (item for item in items if isinstance(item, Schedule)):
            if schedule.name in self.schedules:
                raise BadInput(f'schedule name "{schedule.name}" is given twice')
            self.schedules[schedule.name] = schedule
        functions = [item for item in items if isinstance(item, DurableFunction)]
        for name, schedule in list(self.schedules.items()):
            if schedule.durable is not None and schedule.durable not in {f.name for f in functions}:
                raise BadInput(f'schedule "{name}" targets durable function "{schedule.durable}", which is not defined')
            self.schedules[name] = self.bind_target(schedule)
        self.store: Store = store if store is not None and not isinstance(store, str) else open_store(store)
        self.clock: Clock = clock or SystemClock()
        self.instance = names.take_default_name(self) if instance is None else instance
        self.life = Lifetime(named_in=os.getpid() if instance is None else None)
        """Where this engine is in its one life (opened, started, stopped), and on which loop."""
        self.default_trigger = default_trigger
        self.allow_external_self = False
        """Whether :meth:`fire_external` fires schedules on their own timer too (``serve
        --allow-external-self``)."""
        self.catch_up_limit = catch_up_limit
        self.state_poll_interval = timedelta(seconds=state_poll_interval)
        self.shutdown_grace = shutdown_grace
        self.new_id = ids or IdFactory(self.clock.now)
        self.states = ScheduleStates(self.store, self.schedules)
        self._beating = False
        """Whether this engine, opened but not started, keeps its heartbeat (see :meth:`hold_lease_here`)."""
        self._holding = asyncio.Lock()
        """Held while :meth:`hold_lease_here` writes the heartbeat (two Run nows at once wait for one)."""

        self.loops = Loops(self.clock)
        self.ledger = RunLedger(self.store)
        self.events = EventBus()
        """Change signals (runs, schedules, …) for the event stream and the console."""
        self.audit = AuditLog(store=self.store, clock=self.clock, new_id=self.new_id, events=self.events, actor=actor)
        """The audit log of operator actions; ``actor`` names who acts when no token does."""
        self.alerts = Alerts(
            store=self.store, clock=self.clock, loops=self.loops, events=self.events, audit=self.audit,
            instance=self.instance, new_id=self.new_id, settings=alerting, transport=alert_transport,
        )  # fmt: skip
        """The alerts kept in the store: read by every engine; evaluated and delivered by one
        given ``alerting`` settings (``serve``; see :mod:`backend.alerts`)."""
        self.relay = Relay(store=self.store, ledger=self.ledger, events=self.events, loops=self.loops)
        self.states.publish = lambda name: self.events.publish("schedules", name)
        self.outages = OutageLog(self.clock)
        if lease_clock == "auto":
            # The lease runs on real time: on an injected clock (tests) it is not enforced
            # unless the test injects a lease clock of its own. Nor on SQLite: its one firer
            # holds the file's lock, which the others ask rather than its heartbeat's age
            # (a full disk silences the heartbeat, and the work goes on).
            shared = self.store.kind == "postgresql"
            lease_clock = boot_clock if follows_real_time(self.clock) and shared else None
        wall = self.clock if lease_clock is not None and follows_real_time(self.clock) else None
        self.lease = WorkLease(
            timedelta(seconds=abandon_after), lease_clock, None if wall is None else lambda: wall.now().timestamp()
        )
        """This instance's lease on its work (see :mod:`backend.runtime.liveness`)."""
        self.exit_when_lease_lapses = exit_when_lease_lapses
        """End the process when the lease lapses while sync handlers still run (a thread
        cannot be stopped; the process ending stops it)."""
        self.end_process: Callable[[int], None] = os._exit
        """How the process ends itself then (a test replaces it)."""
        self.after_stop: threading.Thread | None = None
        """The thread that ends the process if sync handlers left running by :meth:`stop`
        outlive the lease (see :mod:`backend.scheduler.lifecycle`)."""
        self.loop_watch: LoopWatch | None = None
        """The thread that ends the process if the lease lapses while a handler blocks the
        event loop (see :mod:`backend.runtime.loopwatch`); started with the lease, on real time."""
        self.runner = HandlerRunner(self.clock, self.loops, max_threads=max_threads, lease=self.lease)
        coordinator, cluster_fallback = make_coordinator(coordination, self.store)
        self.coordination_given = coordination is not None
        """Whether the mode was given (else the store's default: an observer reports the fleet's)."""
        self.cluster_fallback = cluster_fallback
        """True when ``cluster`` was asked for on a store that cannot shard (SQLite): the
        engine runs ``single``, and says so loudly at start."""
        self.subsystems: list[Subsystem] = [self.relay, self.audit]
        """The systems beside the schedules (queue, durable, locks), in start order."""
        core = CoreParts(
            clock=self.clock,
            store=self.store,
            loops=self.loops,
            ledger=self.ledger,
            runner=self.runner,
            outages=self.outages,
            lease=self.lease,
            states=self.states,
            schedules=self.schedules,
            instance=self.instance,
            new_id=self.new_id,
            default_trigger=default_trigger,
            state_poll_interval=self.state_poll_interval,
        )
        parts = build_schedule_parts(
            core,
            coordinator,
            subsystems=self.subsystems,
            audit=self.audit,
            catch_up_limit=catch_up_limit,
            heartbeat_interval=heartbeat_interval,
            abandon_after=abandon_after,
            retention=retention,
            claims_ttl=claims_ttl,
        )
        self.launcher, self.claims, self.timers = parts.launcher, parts.claims, parts.timers
        self.catch_up, self.backfills, self.registry = parts.catch_up, parts.backfills, parts.registry
        self.registry.on_role = lambda was, now: lifecycle.role_changed(self, was, now)
        systems = build_systems(
            core,
            parts,
            coordinator,
            audit=self.audit,
            events=self.events,
            functions=functions,
            queues=[item for item in items if isinstance(item, Queue)],
            abandon_after=abandon_after,
            state_poll_interval=state_poll_interval,
            heartbeat_interval=heartbeat_interval,
            retention=retention,
            lock_clock=lock_clock,
            shard_ttl=shard_ttl,
            job_backoff=job_backoff,
        )
        self.shared, self.durable, self.jobs, self.locks = systems.shared, systems.durable, systems.jobs, systems.locks
        self.cluster = systems.cluster
        self.subsystems.extend(systems.in_start_order)
        # A folder's definitions are all there are: a start of any other function is refused.
        self.durable.complete = isinstance(definitions, Definitions)
        self.catalog = Catalog(
            store=cast(CatalogStore, self.store),
            clock=self.clock,
            schedules=self.schedules,
            states=self.states,
            launcher=self.launcher,
            timers=self.timers,
            catch_up=self.catch_up,
            cluster=self.cluster,
            durable=self.durable,
            jobs=self.jobs,
            events=self.events,
            outages=self.outages,
            started=lambda: self.started,
        )
        """The schedules created at run time (kept in the store)."""
        self.backfills.refresh_catalog = self.catalog.refresh
        self.alerts.watch(
            schedules=self.schedules, queues=self.jobs.queues, functions=self.durable.functions,
            state_of=self.states.get, is_enabled=self.states.is_enabled, fleet=self.store.fleet,
            fresh=timedelta(seconds=abandon_after), beat=self.registry.beat_when_due, unrunnable=self.catalog.invalid,
            code_owners=self._code_owners, store_time=self.registry.store_time,
        )  # fmt: skip
        self.subsystems.append(self.alerts)
        self.fleet_timings = FleetTimings(
            store=cast(CatalogStore, self.store),
            instance=self.instance,
            own=lambda: {
                name: timing
                for name, timing in self.code_timings().items()
                if self.trigger_of(self.schedules[name]) == "self"
            },
            beats=self.store.instances,
            fleet=self.store.fleet,
            judge=self.registry,
            # (not under cluster: a shard's owner fires alone, by its timing; nobody else may)
            claims=lambda: self.claims.coordinator.mode == "advisoryLock" and self.registry.member,
            signal=lambda: self.events.publish("schedules"),
            every=self.registry.heartbeat_interval,
        )
        """Which schedules this instance leaves to the instances of another timing (a deploy)."""
        self.claims.leaves = self.fleet_timings.leaves
        self.reads = ScheduleReads(
            clock=self.clock,
            store=self.store,
            ledger=self.ledger,
            schedules=self.schedules,
            states=self.states,
            catalog=self.catalog,
            launcher=self.launcher,
            timers=self.timers,
            cluster=self.cluster,
            default_trigger=default_trigger,
        )
        """Schedule views, run pages, upcoming slots: what the read methods delegate to."""
        if coordination is None and self.store.kind == "postgresql":
            self.reads.observed_owners = self._observed_owners
        self.activity = ActivityReads(
            clock=self.clock,
            store=cast(ActivityStore, self.store),
            schedules=self.schedules,
            is_enabled=self.is_enabled,
            queues=self.jobs.queue_views,
            handoff=self.ledger.handoff,
        )
        """Recent runs, failures and lateness per schedule, and jobs per queue, by the minute."""
        self.run_logs = RunLogs(
            store=cast(LogStore, self.store),
            clock=self.clock,
            loops=self.loops,
            get_run=self.get_run,
            get_job=self.jobs.get_job,
            get_execution=self.durable.get,
            judge=self.registry,
            enabled=capture_logs,
        )
        """Per-run logs: what handlers log and print, kept per run and job attempt, and read."""
        if capture_logs:
            self.runner.logs = self.run_logs
            self.run_logs.busy = lambda: self.ledger.holding
            self.ledger.on_handoff.append(self.run_logs.quiet_again)
        self.external = ExternalFires(
            clock=self.clock,
            store=self.store,
            ledger=self.ledger,
            launcher=self.launcher,
            claims=self.claims,
            states=self.states,
            tolerance=external_tolerance,
            early=external_early,
        )

    @property
    def started(self) -> bool:
        return self.life.running

    @property
    def coordinator(self) -> Coordinator:
        return self.claims.coordinator

    @coordinator.setter
    def coordinator(self, coordinator: Coordinator) -> None:
        self.claims.coordinator = coordinator

    @property
    def stats(self) -> dict[str, int]:
        return self.ledger.stats

    @property
    def host(self) -> str:
        return self.registry.host

    # ------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the store, register this instance, close what dead processes left running."""
        if self.life.opened:
            return
        self.check_running("open")
        self.life.check_not_forked(self.instance)
        names.hold(self.store.where, self.instance, self)  # (InUse: another engine here has it)
        self.loops.reset()
        try:
            await self.store.open()
        except BaseException:
            names.let_go(self.store.where, self.instance, self)
            raise
        self.life.opened = True  # from here on, stop() closes the store
        self.run_logs.open()
        await lifecycle.open_engine(self)

    async def start(self) -> None:
        """Open, catch up on missed slots, arm every enabled self-triggered schedule.

        An engine starts once: started again after :meth:`stop` (or on another event loop)
        it raises :class:`~backend.errors.EngineStopped`. A start that fails or is cancelled
        halfway undoes what it did (the store's firing lock, its registration), and may be
        tried again; a :meth:`stop` while it runs waits for it, then stops."""
        self.check_running("start")
        life = self.life
        if life.starting is not None:  # (started from two tasks at once: one start)
            await asyncio.shield(life.starting)
            return
        if life.started:
            return
        starting = life.starting = asyncio.get_running_loop().create_future()
        try:
            # One firing process per embedded store, whatever the coordination (claims
            # coordinate the engines of one process: no lease fences another process):
            # refused (InUse) before anything is registered or fired, when another
            # process already fires it.
            await self.store.take_firing_lock(self.instance, claims=self.claims.coordinator.needs_claims)
            await self.open()
            life.began()
            await lifecycle.join_fleet(self)
            await lifecycle.record_code_timings(self)
            lifecycle.start_engine(self)
        except BaseException:
            life.starting = None  # (its stop must not wait for this start)
            await asyncio.shield(self._undo_start())
            raise
        finally:
            life.starting = None
            starting.set_result(None)

    async def _undo_start(self) -> None:
        """A start failed or was cancelled: let go of what it took. The engine is then as
        if never started: it may start again (the console retries a store not up yet)."""
        try:
            if self.life.opened:
                await self.stop(grace=0)
            else:  # (the firing lock, taken before the store opened)
                await self.store.close()
        except Exception as exc:  # (the start's own error is the one to raise)
            log.error("undoing a failed start: %s", exc, exc_info=exc)
        self.life.started = self.life.stopped = self.life.stopping = False

    def check_running(self, action: str) -> None:
        """Refuse ``action`` on an engine that has stopped (or is stopping, or was started
        on an event loop that has ended, or in a process forked since): see :class:`Lifetime`."""
        self.life.check_running(action)

    def check_open(self, action: str) -> None:
        """:meth:`check_running`, and refuse ``action`` on an engine not opened yet."""
        self.life.check_open(action)

    async def stop(self, grace: float | timedelta | None = None) -> None:
        """Stop firing, let runs in flight finish (up to ``grace`` seconds), record the rest."""
        grace = self.shutdown_grace if grace is None else check_seconds(grace, "grace", high=_DAY, zero=True)
        life = self.life
        if life.starting is not None:  # a start in flight: stop what it starts, once it has
            with contextlib.suppress(Exception):
                await asyncio.shield(life.starting)
        if not life.opened or life.stopping:
            return
        life.stopping = True
        self.launcher.stopping, self.launcher.stop_grace = True, grace
        await lifecycle.stop_engine(self, grace)
        life.opened = self._beating = False
        if not life.started:
            self.lease.enforced = False  # (an observer opened again holds none until it runs a handler)
        life.stopped = life.started  # (one only opened, a client, may open again)
        life.stopping = life.stopped
        if not self.runner.lingering:  # (else its row stays, and so does its name: see stop_engine)
            names.let_go(self.store.where, self.instance, self)

    def interrupt(self) -> None:
        """Stop waiting for what is in flight (a second Ctrl-C): the runs are recorded
        ``failed``/``interrupted`` and cancelled (a sync handler's thread cannot be cancelled
        and is abandoned), and every other part's grace ends now (jobs, durable steps,
        locked runs, alert POSTs), each ending what it waited for as a stop with no grace."""
        self.loops.hurry()
        self.launcher.interrupt("interrupted while the engine was stopping")

    async def hold_lease_here(self, action: str) -> None:
        """About to run a handler here (a Run now, a backfill): an engine opened but not
        started holds a lease from now on, as a member does (see
        :func:`lifecycle.hold_observer_lease`); one that holds it already renews it first
        if it lapsed (cut off from the store since its last Run now)."""
        if self.life.started:
            return
        async with self._holding:
            if self._beating and self.lease.fresh():
                return
            await lifecycle.hold_observer_lease(self, action, first=not self._beating)
            self._beating = True

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def armed(self) -> bool:
        """True once every enabled self-triggered schedule is armed and none is catching up."""
        return lifecycle.is_armed(self)

    # ------------------------------------------------------------------------------------
    # listeners, the ledger, quiescence
    # ------------------------------------------------------------------------------------
    def add_listener(self, listener: RunListener) -> None:
        self.ledger.listeners.append(listener)

    def remove_listener(self, listener: RunListener) -> None:
        if listener in self.ledger.listeners:
            self.ledger.listeners.remove(listener)

    async def flush(self) -> None:
        """Return once every run recorded so far is committed to the store."""
        await self.ledger.flush()

    async def quiesce(self, *, runs: bool = True) -> None:
        """Wait until every due slot has fired and every run in flight has finished and is
        committed. Meant for a :class:`~backend.clock.ManualClock`: after moving it, this
        returns once the engine has done everything the new time calls for. With
        ``runs=False`` it waits only for the engine's own loops (timers, watchdog,
        housekeeping, catch-ups) to have handled the new time and the handlers they started
        to have begun, not for handlers to finish."""
        assert self.life.opened, "open() the engine first"

        async def flush() -> None:
            await self.flush()
            try:
                await self.run_logs.flush()
            except Unavailable:
                pass  # the logs are kept and written by their own loop once the store answers

        await self.loops.quiesce(lambda: lifecycle.is_settled(self) if runs else lifecycle.has_started(self), flush)

    def unsettled(self) -> list[str]:
        """What a :meth:`quiesce` still waits for now: the loops not idle and the parts not
        settled, each named (empty: nothing). For a test whose quiesce does not end."""
        return self.loops.busy() + lifecycle.unsettled(self)

    # ------------------------------------------------------------------------------------
    # housekeeping: state changes from other processes, heartbeats, abandoned runs, retention
    # ------------------------------------------------------------------------------------
    async def maintain(self) -> None:
        """One round of housekeeping (normally every ``state_poll_interval``)."""
        await lifecycle.maintain(self)

    async def close_abandoned(self) -> list[Run]:
        """Close runs (and backfills) left ``running`` by instances that are gone."""
        return await self.registry.close_abandoned()

