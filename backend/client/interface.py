"""The shared backend interface: all the console and the CLI know about an engine.

:class:`Backend` is implemented twice: :class:`EmbeddedBackend` drives an
:class:`~backend.scheduler.engine.Engine` in this process, and :class:`backend.client.remote.RemoteBackend`
drives a remote engine through its HTTP inspect API. The same contract tests run against
both. Nothing here imports Textual; the caller owns concurrency (the console calls these
methods from its workers).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from backend.durable.model import Execution, ExecutionsPage, Signalled, Started
from backend.errors import BadInput, Forbidden, Unavailable
from backend.events.audit import AuditPage
from backend.events.bus import READY, STREAM, Signal
from backend.inputs import check_before, check_id, check_instant
from backend.jobs.model import Job, JobDetail, JobsPage, QueueView, Sent
from backend.locks import LockRelease, LocksSnapshot
from backend.model import (
    BackfillPlan,
    BackfillProgress,
    CoordinationMode,
    ExternalFiring,
    Health,
    InstanceInfo,
    Run,
    ScheduleView,
    iso,
    parse_iso,
)
from backend.scheduler.engine import Engine

__all__ = [
    "SYSTEMS",
    "Backend",
    "ConnectionInfo",
    "EmbeddedBackend",
    "RunsPage",
    "SchedulesSnapshot",
]

T = TypeVar("T")

#: How long a health check waits for the instances table before answering without it (seconds).
HEALTH_READ_TIMEOUT = 2.0

SYSTEMS = ("schedules", "jobs", "durable", "locks", "audit")
"""The systems an engine of this version offers (part 2 adds ``jobs``, ``durable``,
``locks``, ``audit``); a console shows a view only for a system its backend offers."""


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What a backend is connected to, for the console's header."""

    kind: Literal["embedded", "remote"]
    where: str
    """The store's path or redacted URL (embedded), or the server's URL (remote)."""
    coordination: CoordinationMode
    instance: str
    read_only: bool
    store_kind: str = ""
    fires: bool = True
    """Whether this engine fires schedules on its timers (a remote ``serve`` does; an
    embedded console only when asked to, otherwise it observes and acts)."""
    systems: tuple[str, ...] = SYSTEMS
    """What the backend offers (``schedules``; later ``jobs``, ``durable``, ``locks``, ``audit``)."""
    actor: str = ""
    """Who the actions are recorded as: the OS user or ``--as`` (embedded), the token's
    name (remote)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "where": self.where,
            "coordination": self.coordination,
            "instance": self.instance,
            "read_only": self.read_only,
            "store_kind": self.store_kind,
            "fires": self.fires,
            "systems": list(self.systems),
            "actor": self.actor,
        }


@dataclass(frozen=True, slots=True)
class SchedulesSnapshot:
    """Every schedule at one instant (``now`` is the engine's clock at that instant)."""

    coordination: CoordinationMode
    instance: str
    now: datetime
    schedules: list[ScheduleView]

    def to_json(self) -> dict[str, Any]:
        return {
            "coordination": self.coordination,
            "instance": self.instance,
            "now": iso(self.now),
            "schedules": [s.to_json() for s in self.schedules],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SchedulesSnapshot:
        return cls(
            coordination=data["coordination"],
            instance=data["instance"],
            now=parse_iso(data["now"]),
            schedules=[ScheduleView.from_json(s) for s in data["schedules"]],
        )


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of a schedule's runs, newest first; ``next_before`` pages further back."""

    runs: list[Run]
    next_before: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs], "next_before": self.next_before}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunsPage:
        return cls(runs=[Run.from_json(r) for r in data["runs"]], next_before=data.get("next_before"))


class Backend(Protocol):
    """One engine, local or remote, as the console and the CLI see it.

    Contract:

    * Every method may raise a :class:`backend.errors.SchedtuiError` subclass and nothing
      else on purpose: ``NotFound`` (unknown schedule/run/backfill), ``Refused`` (with
      ``count`` and ``reason``), ``BadInput``, ``Unauthorized``, ``Forbidden`` (a
      read-only backend asked to act), ``Unavailable`` (store or server unreachable).
    * Reads have no side effects. ``plan_backfill`` in particular fires nothing.
    * ``run_now`` always starts exactly one run (trigger and outcome ``manual``) and
      returns it once it is recorded; it is not retried on a connection error.
    * Datetimes are aware UTC.
    """

    read_only: bool
    """True when the actions below raise ``Forbidden``."""

    async def connect(self) -> ConnectionInfo:
        """Open the store or reach the server; returns what it is connected to."""

    async def close(self) -> None: ...

    def info(self) -> ConnectionInfo:
        """What :meth:`connect` found (call it after connecting)."""

    async def health(self) -> Health:
        """Whether the engine is serving; needs no token."""

    async def now(self) -> datetime:
        """The engine's clock: what relative times such as ``-2d`` are read against."""

    async def schedule_zone(self, name: str) -> str:
        """The IANA zone of schedule ``name``, in which operator-typed times without an
        offset are read; ``NotFound`` for an unknown name (a cheap existence check)."""

    async def list_schedules(self) -> SchedulesSnapshot: ...

    async def list_runs(self, name: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        """A page of runs of ``name``, newest first by scheduled time (then id), by keyset
        (``before`` a run id)."""

    async def runs_between(
        self, names: list[str], start: datetime, end: datetime, *, limit_per_name: int = 200
    ) -> dict[str, list[Run]]:
        """Per schedule of ``names``, its runs scheduled in ``[start, end)``, newest first,
        at most ``limit_per_name`` (a schedule with exactly that many may have more);
        schedules without runs there are left out. ``NotFound`` for an unknown name."""

    async def instances(self) -> list[InstanceInfo]:
        """The engine instances registered in the store, by name, with their heartbeats."""

    async def get_run(self, run_id: str) -> Run: ...

    async def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        """The next ``count`` slots of ``name`` by its cron (whether or not it is enabled)."""

    async def run_now(self, name: str) -> Run: ...

    async def fire_external(self, name: str) -> ExternalFiring:
        """Fire the slot of ``name`` that is due now, as a platform scheduler asks: at most
        once per slot across the fleet (a repeated call returns the first firing with
        ``created`` False). ``Refused`` for a schedule on its own timer (unless the serving
        engine allows it) or when no slot is due."""

    async def wait_run(self, run_id: str) -> Run:
        """Return the run once it is no longer ``running``."""

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView: ...

    async def create_schedule(self, spec: Mapping[str, Any]) -> ScheduleView:
        """Store a new schedule (keys: ``name``, ``cron``, ``timezone``, exactly one of
        ``queue``/``durable``, and optionally ``payload``, ``description``, ``enabled``,
        ``on_overlap``, ``backfill``, ``max_runtime``); every instance arms it within 2 s.
        ``BadInput`` (its ``field`` the key) for a bad value or an unknown target,
        ``NameTaken`` (409 ``name_taken``) for a name in use."""

    async def update_schedule(self, name: str, changes: Mapping[str, Any]) -> ScheduleView:
        """Change a stored schedule (the same keys but ``name``); ``DefinedInCode`` (409
        ``defined_in_code``) for a schedule defined in code, ``NotFound`` for an unknown one."""

    async def delete_schedule(self, name: str) -> None:
        """Delete a stored schedule; ``DefinedInCode`` (409), ``NotFound`` as for update."""

    async def plan_backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan: ...

    async def start_backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress: ...

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress: ...

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        """Stop a running backfill before its next slot; its progress, ``cancelled`` (or
        as it ended, if it had). ``Refused`` when another instance runs it."""

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        """Return the backfill's progress once it is no longer ``running``."""

    # -- locks ------------------------------------------------------------------------
    async def list_locks(self) -> LocksSnapshot:
        """Every lock (held, expired or free) with the lock clock's ``now``."""

    async def release_lock(self, name: str) -> LockRelease:
        """Release a lock by force (an operator's action; the next holder gets a greater
        token); ``NotFound`` for a name no lock ever had. Never retried blindly: a second
        release would free the next holder's lock."""
    # -- durable executions (``NotFound`` for an unknown execution or function; ``Refused``
    # for a signal or cancel of a finished execution, a retry of one that has not failed)
    async def list_executions(
        self, function: str | None = None, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> ExecutionsPage:
        """A page of executions, newest first, by keyset (``before`` an execution id)."""

    async def get_execution(self, execution_id: str) -> Execution:
        """One execution with its steps (the timeline) and its log."""

    async def start_execution(self, function: str, input: Any = None) -> Started: ...

    async def signal_execution(self, execution_id: str, name: str, payload: Any = None) -> Signalled: ...

    async def cancel_execution(self, execution_id: str) -> Execution:
        """Cancel: a queued or waiting execution at once, a running one at its next step."""

    async def retry_execution(self, execution_id: str) -> Execution:
        """Run a failed execution again from its failed step, with fresh attempts."""

    async def audit(self, *, limit: int = 50, before: str | None = None) -> AuditPage:
        """A page of the audit log, newest first, by keyset (``before`` an entry id)."""

    def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        """Change signals as they happen (see :mod:`backend.events.bus`): first a batch holding
        a ``ready`` signal (its name says how other instances' changes arrive: ``notify``,
        ``file`` or ``none``; a ``stream down`` beside it says they do not, for now), then
        each batch as it comes, and ``[]`` when the stream has been quiet for a while
        (``idle`` seconds embedded; at the server's ping remotely). ``since`` resumes after
        the last id seen: what was missed comes first, or a ``resync``. Raises
        ``Unavailable`` when the stream cannot be had or breaks."""
    # -- the job queue (DESIGN.md part 2) -------------------------------------------------
    async def list_queues(self) -> list[QueueView]:
        """Every queue recorded in the store, by name, with its counts."""

    async def set_queue_paused(self, queue: str, paused: bool) -> QueueView:
        """Pause a queue (its jobs wait; running ones finish) or resume it."""

    async def list_jobs(
        self, queue: str, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> JobsPage:
        """A page of a queue's jobs, newest first, by keyset (``before`` a job id)."""

    async def send_job(
        self, queue: str, payload: Any = None, *, delay: float = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        """Queue one job; every limit is checked before anything is written (``BadInput``,
        ``TooLarge``; ``QueueFull`` is a ``Refused``). Never retried on a connection error."""

    async def get_job(self, job_id: str) -> JobDetail:
        """A job (while it exists) and its attempts; ``NotFound`` once both are gone."""

    async def cancel_job(self, queue: str, id: str | None = None, *, key: str | None = None) -> bool:
        """Delete a queued job by its id, or by its key (exactly one; each means what it
        says); True if it was queued and is gone."""

    async def retry_job(self, queue: str, job_id: str) -> Job:
        """A dead job back to the queue with fresh attempts (``Refused`` if it is not dead)."""

    async def delete_job(self, queue: str, job_id: str) -> None:
        """Delete a job in any state (``NotFound`` if there is none)."""


@dataclass
class _EngineThread:
    """An event loop on its own thread, so handlers never share the caller's loop."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, name="schedtui-engine", daemon=True)
        self.thread.start()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.loop.close()


class EmbeddedBackend:
    """The interface over an engine in this process.

    ``arm=True`` starts the engine's timers (the console and ``serve``); otherwise the
    engine is only opened, to read and act (the one-shot CLI verbs). ``own_thread=True``
    runs the engine on a loop of its own thread, so that neither handlers nor the ledger
    ever hold up the caller's loop (the console's UI).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        read_only: bool = False,
        arm: bool = False,
        own_thread: bool = False,
        allow_external_self: bool = False,
    ) -> None:
        self.engine = engine
        self.read_only = read_only
        self.arm = arm
        self.allow_external_self = allow_external_self
        """Let :meth:`fire_external` fire schedules that have their own timer too."""
        self._thread = _EngineThread() if own_thread else None

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._thread is None:
            return await coro
        return await self._thread.call(coro)

    def _check_can_act(self, action: str) -> None:
        if self.read_only:
            raise Forbidden(f"read-only: {action} is not allowed")

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            kind="embedded",
            where=self.engine.store.where,
            coordination=self.engine.coordination,
            instance=self.engine.instance,
            read_only=self.read_only,
            store_kind=self.engine.store.kind,
            fires=self.arm,
            actor=self.engine.audit.default_actor,
        )

    async def connect(self) -> ConnectionInfo:
        if self._thread is not None and self._thread.thread is None:
            self._thread.start()
        await self._call(self.engine.start() if self.arm else self.engine.open())
        return self.info()

    async def close(self, grace: float | None = None) -> None:
        """Stop the engine: runs in flight may finish for ``grace`` seconds (its default)."""
        await self._call(self.engine.stop(grace))
        if self._thread is not None:
            self._thread.stop()

    def interrupt(self) -> None:
        """Stop waiting for runs in flight during :meth:`close` (a second Ctrl-C)."""
        if self._thread is None:
            self.engine.interrupt()
        else:
            self._thread.loop.call_soon_threadsafe(self.engine.interrupt)

    async def health(self) -> Health:
        """The store's own account of its writes (no I/O) and the instances table (one
        read, bounded by :data:`HEALTH_READ_TIMEOUT`; ``None`` when it cannot be read)."""

        async def health() -> Health:
            engine = self.engine
            instances: list[InstanceInfo] | None
            try:
                instances = await asyncio.wait_for(engine.store.fleet(), HEALTH_READ_TIMEOUT)
            except (Unavailable, TimeoutError):
                instances = None
            # After the read: it may just have found the store down.
            return Health(
                engine.instance, engine.coordination, engine.store.kind, engine.store.health(), instances, engine.clock.now()
            )

        return await self._call(health())

    async def now(self) -> datetime:
        return self.engine.clock.now()

    async def schedule_zone(self, name: str) -> str:
        return self.engine.schedule(name).timezone

    async def list_schedules(self) -> SchedulesSnapshot:
        async def snapshot() -> SchedulesSnapshot:
            views = await self.engine.list_schedules()
            return SchedulesSnapshot(self.engine.coordination, self.engine.instance, self.engine.clock.now(), views)

        return await self._call(snapshot())

    async def list_runs(self, name: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        before = check_before(before)
        runs, next_before = await self._call(self.engine.list_runs(name, limit=limit, before=before))
        return RunsPage(runs, next_before)

    async def get_run(self, run_id: str) -> Run:
        return await self._call(self.engine.get_run(check_id(run_id, "run")))

    async def runs_between(
        self, names: list[str], start: datetime, end: datetime, *, limit_per_name: int = 200
    ) -> dict[str, list[Run]]:
        for name in names:
            self.engine.schedule(name)
        check_runs_between(names, start, end, limit_per_name)
        store = self.engine.store
        return await self._call(store.runs_between(names, start, end, limit_per_name=limit_per_name))

    async def instances(self) -> list[InstanceInfo]:
        return await self._call(self.engine.store.fleet())

    async def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        return self.engine.upcoming(name, count)

    async def run_now(self, name: str) -> Run:
        self._check_can_act("Run now")
        return await self._call(self.engine.run_now(name))

    async def fire_external(self, name: str) -> ExternalFiring:
        self._check_can_act("an external fire")
        return await self._call(self.engine.fire_external(name, allow_self=self.allow_external_self))

    async def wait_run(self, run_id: str) -> Run:
        return await self._call(self.engine.wait_run(check_id(run_id, "run")))

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView:
        self._check_can_act("enable" if enabled else "disable")
        return await self._call(self.engine.set_enabled(name, enabled, note=note))

    async def create_schedule(self, spec: Mapping[str, Any]) -> ScheduleView:
        self._check_can_act("creating a schedule")
        return await self._call(self.engine.create_schedule(spec))

    async def update_schedule(self, name: str, changes: Mapping[str, Any]) -> ScheduleView:
        self._check_can_act("editing a schedule")
        return await self._call(self.engine.update_schedule(name, changes))

    async def delete_schedule(self, name: str) -> None:
        self._check_can_act("deleting a schedule")
        await self._call(self.engine.delete_schedule(name))

    async def plan_backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan:
        start, end = check_instant(start, "from"), check_instant(end, "to")
        plan = self.engine.plan_backfill(name, start, end, confirm=confirm, limit=limit)
        if plan.count == 0 or plan.reason not in (None, "needs confirmation"):
            return plan
        slots = list(self.engine.schedule(name).cron.occurrences(plan.start, plan.end))
        done = await self._call(self.engine.succeeded_slots(name, slots))
        return replace(plan, already_succeeded=len(done))

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
        self._check_can_act("backfill")
        start, end = check_instant(start, "from"), check_instant(end, "to")
        return await self._call(
            self.engine.start_backfill(name, start, end, confirm=confirm, limit=limit, skip_succeeded=skip_succeeded)
        )

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        return await self._call(self.engine.backfill_progress(check_id(backfill_id, "backfill")))

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        self._check_can_act("cancelling a backfill")
        return await self._call(self.engine.cancel_backfill(check_id(backfill_id, "backfill")))

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        return await self._call(self.engine.wait_backfill(check_id(backfill_id, "backfill")))

    async def list_locks(self) -> LocksSnapshot:
        return await self._call(self.engine.locks.list())

    async def release_lock(self, name: str) -> LockRelease:
        self._check_can_act("a lock release")
        return await self._call(self.engine.locks.release(name))
    # -- durable executions ----------------------------------------------------------------
    async def list_executions(
        self, function: str | None = None, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> ExecutionsPage:
        rows, next_before = await self._call(self.engine.durable.list(function, status=status, limit=limit, before=before))
        return ExecutionsPage(rows, next_before)

    async def get_execution(self, execution_id: str) -> Execution:
        return await self._call(self.engine.durable.get(execution_id))

    async def start_execution(self, function: str, input: Any = None) -> Started:
        self._check_can_act("durable start")
        return await self._call(self.engine.durable.start_execution(function, input))

    async def signal_execution(self, execution_id: str, name: str, payload: Any = None) -> Signalled:
        self._check_can_act("durable signal")
        return await self._call(self.engine.durable.signal(execution_id, name, payload))

    async def cancel_execution(self, execution_id: str) -> Execution:
        self._check_can_act("durable cancel")
        return await self._call(self.engine.durable.cancel(execution_id))

    async def retry_execution(self, execution_id: str) -> Execution:
        self._check_can_act("durable retry")
        return await self._call(self.engine.durable.retry(execution_id))

    async def audit(self, *, limit: int = 50, before: str | None = None) -> AuditPage:
        return await self._call(self.engine.audit.list(limit=limit, before=before))

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        bus = self.engine.events
        subscription = bus.subscribe(since=since)  # read on the caller's loop, whatever the engine's
        try:
            ready = [Signal(since or subscription.start_id, READY, self.engine.relay.stream_kind)]
            if not bus.live:
                ready.append(Signal(subscription.start_id, STREAM, "down"))
            yield ready
            while not subscription.closed:
                yield await subscription.get(idle)
        finally:
            subscription.close()
    # -- the job queue --------------------------------------------------------------------
    async def list_queues(self) -> list[QueueView]:
        return await self._call(self.engine.jobs.queue_views())

    async def set_queue_paused(self, queue: str, paused: bool) -> QueueView:
        self._check_can_act("pause" if paused else "resume")
        return await self._call(self.engine.jobs.set_paused(queue, paused))

    async def list_jobs(
        self, queue: str, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> JobsPage:
        return await self._call(self.engine.jobs.list_jobs(queue, status=status, limit=limit, before=before))

    async def send_job(
        self, queue: str, payload: Any = None, *, delay: float = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        self._check_can_act("sending a job")
        sent = await self._call(self.engine.jobs.send(queue, payload, delay=delay, attempts=attempts, key=key))
        # An operator's send (console, CLI, API) is audited; the application's are not.
        await self._call(self.engine.audit.record("job.send", sent.id, {"queue": queue, "key": key, "duplicate": sent.duplicate}))
        return sent

    async def get_job(self, job_id: str) -> JobDetail:
        return await self._call(self.engine.jobs.get_job(job_id))

    async def cancel_job(self, queue: str, id: str | None = None, *, key: str | None = None) -> bool:
        self._check_can_act("cancel")
        return await self._call(self.engine.jobs.cancel(queue, id, key=key))

    async def retry_job(self, queue: str, job_id: str) -> Job:
        self._check_can_act("retry")
        return await self._call(self.engine.jobs.retry(queue, job_id))

    async def delete_job(self, queue: str, job_id: str) -> None:
        self._check_can_act("delete")
        await self._call(self.engine.jobs.delete(queue, job_id))

#: Bounds of :meth:`Backend.runs_between` (the console asks for what is on screen).
RUNS_BETWEEN_MAX_NAMES = 500
RUNS_BETWEEN_MAX_PER_NAME = 1000


def check_runs_between(names: list[str], start: datetime, end: datetime, limit_per_name: int) -> None:
    """Refuse a :meth:`Backend.runs_between` call out of bounds, naming the bad value."""
    if not names:
        raise BadInput("name: give at least one schedule name", field="name")
    if len(names) > RUNS_BETWEEN_MAX_NAMES:
        raise BadInput(f"{len(names)} names are more than {RUNS_BETWEEN_MAX_NAMES} at once", field="name")
    if isinstance(limit_per_name, bool) or not 1 <= limit_per_name <= RUNS_BETWEEN_MAX_PER_NAME:
        raise BadInput(f"limit_per_name {limit_per_name!r} is out of range (1-{RUNS_BETWEEN_MAX_PER_NAME})",
                       field="limit_per_name")
    if start.tzinfo is None or end.tzinfo is None:
        raise BadInput("from and to must carry a time zone offset", field="from")
    if start >= end:
        raise BadInput(f"from ({iso(start)}) must be before to ({iso(end)})", field="from")
