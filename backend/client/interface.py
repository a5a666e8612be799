# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
# ruff: noqa: B027
"""The shared backend interface: all the console and the CLI know about an engine.

:class:`Backend` is implemented twice: :class:`EmbeddedBackend` drives an
:class:`~backend.scheduler.engine.Engine` in this process, and :class:`backend.client.remote.RemoteBackend`
drives a remote engine through its HTTP inspect API. The same contract tests run against
both. Nothing here imports Textual; the caller owns concurrency (the console calls these
methods from its workers).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, TypedDict

from backend.activity import Activity
from backend.alerts.model import AlertsPage
from backend.client.actions import (
    ACTIONS,
    Action,
    Check,
    Cursor,
    Danger,
    Help,
    Http,
    Id,
    Json,
    Known,
    Range,
    Schema,
    When,
    action,
    action_of,
)
from backend.durable.model import EXECUTION_STATUSES, Execution, ExecutionsPage, Signalled, Started
from backend.durable.service import MAX_INPUT_BYTES, MAX_SIGNAL_BYTES
from backend.errors import BadInput
from backend.events.audit import AuditPage
from backend.events.bus import Signal
from backend.inputs import INSTANCE_MAX_CHARS, NOTE_MAX_CHARS, check_count, check_instance, check_note
from backend.jobs.definition import MAX_PAYLOAD_BYTES, check_cancel, check_queue_name, check_send
from backend.jobs.model import Job, JobDetail, JobsPage, QueueView, Sent
from backend.locks import LockRelease, LocksSnapshot
from backend.locks.model import check_lock_name
from backend.model import (
    BACKFILL_MAX_LIMIT,
    BackfillPlan,
    BackfillPlanJson,
    BackfillProgress,
    CoordinationMode,
    ExternalFiring,
    Health,
    InstanceInfo,
    Run,
    RunsPage,
    SchedulesSnapshot,
    ScheduleView,
    Timestamp,
    iso,
)
from backend.observability.logs import RunLog
from backend.schedules import MAX_RUNTIME_LIMIT

__all__ = [
    "ACTIONS",
    "SYSTEMS",
    "Action",
    "Backend",
    "ConnectionInfo",
    "ConnectionInfoJson",
    "RunsPage",
    "SchedulesSnapshot",
    "action_of",
]

SYSTEMS = ("schedules", "jobs", "durable", "locks", "audit", "alerts", "health")
"""The systems an engine of this version offers (an older server offers only
``schedules``; ``alerts`` and ``health``, the activity read, came after ``audit``); a
console shows a view only for a system its backend offers."""


class ConnectionInfoJson(TypedDict):
    """What a console or CLI is connected to: an engine in this process (``embedded``) or a
    server (``remote``), the systems it offers, and who its actions are recorded as."""

    kind: Literal["embedded", "remote"]
    where: str
    coordination: CoordinationMode
    instance: str
    read_only: bool
    store_kind: str
    fires: bool
    systems: list[str]
    actor: str


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
    """What the backend offers (``schedules``; later ``jobs``, ``durable``, ``locks``, ``audit``,
    ``health``)."""
    actor: str = ""
    """Who the actions are recorded as: the OS user or ``--as`` (embedded), the token's
    name (remote)."""

    def to_json(self) -> ConnectionInfoJson:
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


#: Bounds of :meth:`Backend.runs_between` (the console asks for what is on screen).
RUNS_BETWEEN_MAX_NAMES = 500
RUNS_BETWEEN_MAX_PER_NAME = 1000


def check_runs_between(names: list[str], start: datetime, end: datetime, limit_per_name: int) -> None:
    """Refuse a :meth:`Backend.runs_between` call out of bounds, naming the bad value."""
    if not names:
        raise BadInput("name: give at least one schedule name", field="name")
    if len(names) > RUNS_BETWEEN_MAX_NAMES:
        raise BadInput(f"{len(names)} names are more than {RUNS_BETWEEN_MAX_NAMES} at once", field="name")
    check_count(limit_per_name, "limit_per_name", 1, RUNS_BETWEEN_MAX_PER_NAME)
    if start.tzinfo is None or end.tzinfo is None:
        raise BadInput("from and to must carry a time zone offset", field="from")
    if start >= end:
        raise BadInput(f"from ({iso(start)}) must be before to ({iso(end)})", field="from")


_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"}
#: A stored schedule's keys as the OpenAPI document states them (the engine checks them).
SCHEDULE_CHANGES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cron": {"type": "string"},
        "timezone": {"type": "string"},
        "queue": {"type": "string", "nullable": True},
        "durable": {"type": "string", "nullable": True},
        "payload": {"description": "any JSON, up to 64 KiB encoded"},
        "description": {"type": "string", "nullable": True, "maxLength": 1000},
        "enabled": {"type": "boolean"},
        "on_overlap": {"type": "string", "enum": ["skip", "queue", "parallel"]},
        "backfill": {"type": "string", "enum": ["skip", "latest", "all"]},
        "max_runtime": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_RUNTIME_LIMIT},
        "alert": {"description": "false (no alerts), or {failing: N, late: SECONDS, disabled: SECONDS, "
                  "resolve_after: SECONDS}, each false to turn it off, seconds at most a year (see the README's Alerts)",
                  "nullable": True},
    },
}
SCHEDULE_SPEC: dict[str, Any] = {
    **SCHEDULE_CHANGES,
    "required": ["name", "cron", "timezone"],
    "properties": {"name": _NAME, **SCHEDULE_CHANGES["properties"]},
}

ScheduleName = Annotated[str, Known("schedule"), Help("the schedule's name")]
QueueName = Annotated[
    str, Check(check_queue_name, {"pattern": "^[A-Za-z0-9_.-]{1,128}$"}), Help("the queue's name")
]
LockName = Annotated[
    str, Check(check_lock_name, {"pattern": "^[A-Za-z0-9_.:/@-]{1,200}$"}), Help('the lock\'s name (it may hold "/")')
]
PageSize = Annotated[int, Range(1, 1000), Help("how many, at most")]
InstanceName = Annotated[
    str, Check(lambda name: check_instance(name, "name"), {"minLength": 1, "maxLength": INSTANCE_MAX_CHARS}),
    Help("the instance's name (as schedtui instances lists it)"),
]


def _check_offset(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise BadInput(f"after {value} is no byte offset (0 or more: the size of an earlier answer)", field="after")
    return value


LogOffset = Annotated[
    int, Check(_check_offset, {"minimum": 0}),
    Help("where an earlier answer ended (its size: bytes of a run's or a job's log, the newest line's number of a "
         "durable execution's): only what came since"),
]
#: What a log action answers (the OpenAPI response's description).
LOG_ANSWER = "{kind, id, name, attempt, status, running, text, size, omitted_bytes, omitted_lines}"


# -- the fields some answers add beside the result (their types are the OpenAPI document's)


class Deleted(TypedDict):
    deleted: Literal[True]


def _deleted(result: None, arguments: Mapping[str, Any]) -> Deleted:
    return {"deleted": True}


Window = TypedDict("Window", {"from": Timestamp, "to": Timestamp})


def _window(runs: Any, arguments: Mapping[str, Any]) -> Window:
    return {"from": iso(arguments["start"]), "to": iso(arguments["end"])}


class Fired(TypedDict):
    run_id: str


def _fired(run: Run, arguments: Mapping[str, Any]) -> Fired:
    return {"run_id": run.id}


class BackfillId(TypedDict):
    id: str


def _backfill_id(progress: BackfillProgress, arguments: Mapping[str, Any]) -> BackfillId:
    return {"id": progress.id}


class PlanBeside(TypedDict):
    plan: BackfillPlanJson


async def _backfill_plan(backend: Backend, arguments: Mapping[str, Any]) -> PlanBeside:
    """The plan beside a started backfill's progress (asked before it starts)."""
    plan = await backend.plan_backfill(
        arguments["name"], arguments["start"], arguments["end"], confirm=arguments["confirm"], limit=arguments["limit"]
    )
    return {"plan": plan.to_json()}


def _check_send(queue: str, payload: Any = None, delay: float = 0, attempts: int | None = None, key: str | None = None) -> None:
    check_send(payload, delay, attempts, key)


def _check_cancel(queue: str, id: str | None = None, key: str | None = None) -> None:
    check_cancel(id, key)


def _check_window(names: list[str], start: datetime, end: datetime, limit_per_name: int) -> None:
    check_runs_between(names, start, end, limit_per_name)


class Backend(abc.ABC):
    """One engine, local or remote, as the console and the CLI see it.

    Its operator actions are the methods marked :func:`~backend.client.actions.action`:
    each one's signature and docstring are its declaration (see
    :mod:`backend.client.actions`), and every call of one goes to :meth:`_act`, which
    each implementation defines once. The other members are plain abstract methods.

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
    """True when the ``operate`` actions raise ``Forbidden``."""

    @abc.abstractmethod
    async def _act(self, action: Action, arguments: dict[str, Any]) -> Any:
        """Carry out ``action`` with ``arguments`` (by name, defaults applied)."""

    @abc.abstractmethod
    async def connect(self) -> ConnectionInfo:
        """Open the store or reach the server; returns what it is connected to."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def info(self) -> ConnectionInfo:
        """What :meth:`connect` found (call it after connecting)."""

    @abc.abstractmethod
    async def health(self) -> Health:
        """Whether the engine is serving; needs no token."""

    @abc.abstractmethod
    async def now(self) -> datetime:
        """The engine's clock: what relative times such as ``-2d`` are read against."""

    @abc.abstractmethod
    async def schedule_zone(self, name: str) -> str:
        """The IANA zone of schedule ``name``, in which operator-typed times without an
        offset are read; ``NotFound`` for an unknown name (a cheap existence check)."""

    @abc.abstractmethod
    async def wait_run(self, run_id: str) -> Run:
        """Return the run once it is no longer ``running``."""

    @abc.abstractmethod
    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        """Return the backfill's progress once it is no longer ``running``."""

    @abc.abstractmethod
    def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        """Change signals as they happen (see :mod:`backend.events.bus`): first a batch holding
        a ``ready`` signal (its name says how other instances' changes arrive: ``notify``,
        ``file`` or ``none``; a ``stream down`` beside it says they do not, for now), then
        each batch as it comes, and ``[]`` when the stream has been quiet for a while
        (``idle`` seconds embedded; at the server's ping remotely). ``since`` resumes after
        the last id seen: what was missed comes first, or a ``resync``. Raises
        ``Unavailable`` when the stream cannot be had or breaks."""

    # -- conveniences over two actions -------------------------------------------------
    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView:
        """:meth:`enable_schedule` or :meth:`disable_schedule`."""
        if enabled:
            return await self.enable_schedule(name, note=note)
        return await self.disable_schedule(name, note=note)

    async def set_queue_paused(self, queue: str, paused: bool) -> QueueView:
        """:meth:`pause_queue` or :meth:`resume_queue`."""
        return await (self.pause_queue(queue) if paused else self.resume_queue(queue))

    # -- schedules and runs --------------------------------------------------------------
    @action(system="schedules", permission="read", impl="schedules_snapshot",
            http=Http("GET", "/inspect/schedules", ok="{coordination, instance, now, schedules: [schedule]}"))
    async def list_schedules(self) -> SchedulesSnapshot:
        """Every schedule with its state, next slot and last run."""

    @action(system="schedules", permission="read", impl="runs_page",
            http=Http("GET", "/inspect/schedules/runs", ok="{runs: [run], next_before}",
                      errors={404: "a schedule neither defined nor in the ledger"}))
    async def list_runs(
        self, name: ScheduleName, *, limit: PageSize = 50, before: Annotated[str | None, Cursor("run")] = None
    ) -> RunsPage:
        """A page of a schedule's runs, newest first (keyset paging).

        Newest first by scheduled time (then id); ``before`` is the id of the last run of
        the previous page. A schedule no longer defined (removed from the code, deleted)
        keeps its runs until the retention takes them: they are listed by its name."""

    @action(system="schedules", permission="read", check=_check_window,
            http=Http("GET", "/inspect/runs", envelope="runs", wire={"names": "name", "start": "from", "end": "to"},
                      extra=_window,
                      ok="{from, to, runs: {name: [run]}}", errors={404: "a schedule neither defined nor in the ledger"}))
    async def runs_between(
        self,
        names: Annotated[list[str], Help("repeat for several schedules (up to 500)")],
        start: datetime,
        end: datetime,
        *,
        limit_per_name: Annotated[int, Range(1, RUNS_BETWEEN_MAX_PER_NAME)] = 200,
    ) -> dict[str, list[Run]]:
        """Runs of several schedules scheduled in a window, newest first per schedule.

        For timelines: per schedule, its runs with from <= scheduled_at < to, at most
        limit_per_name of them (the newest; a schedule with exactly that many may have
        more). Schedules without runs in the window are left out. A schedule no longer
        defined is read as the runs' page reads it (its runs stay until the retention
        takes them); a name neither defined nor in the ledger is ``NotFound``."""

    @action(system="fleet", permission="read",
            http=Http("GET", "/inspect/instances", envelope="instances", clock=True,
                      ok="{now, instances: [{name, host, pid, heartbeat_at, heartbeat_age_s, last_fired_at, role, coordination, "
                         "clock_offset_s, clock_off, stands_down}]}"))
    async def instances(self) -> list[InstanceInfo]:
        """The engine instances registered in the store, with their last heartbeat.

        An engine that fires beats every few seconds; one that only opened the store (a
        CLI verb, a watching console) beat once, when it opened it. On PostgreSQL each
        heartbeat carries the instance's clock offset from the database server's, and
        whether the instance stands down for it (``stands_down`` says why)."""

    @action(system="fleet", permission="operate", label="forgetting an instance", audit="instance.forget",
            impl="forget_instance",
            danger=Danger('Forget instance "{name}"?',
                          "Only one the fleet judges gone (silent past its take-over window, or its pid dead): its "
                          "instance_lost alert resolves and the others take its work over now."),
            http=Http("DELETE", "/inspect/instances/{name:path}", clock=True, ok="the instance as it was registered",
                      errors={404: "no instance with that name is registered",
                              409: "alive by its heartbeat, beat again just now, or its last burst is not recorded yet: "
                                   "nothing forgotten"}))
    async def forget_instance(self, name: InstanceName) -> InstanceInfo:
        """Forget a lost instance: delete its row, so that its instance_lost alert resolves
        and it leaves the instance lists now, not a day later.

        Only an instance the fleet judges gone, as a member does before taking its work
        over: silent past its take-over window, or its pid dead on the judging host; a
        killed or crashed process that a replacement under another name (the default,
        hostname:pid) will never bring back. An instance that is alive, or beats between
        the look and the delete, is refused (409) and nothing is forgotten; so is this
        very instance. Its work is taken over as it would be anyway."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/runs/{run_id}", ok="the run", errors={404: "unknown run"}))
    async def get_run(self, run_id: Annotated[str, Id("run")]) -> Run:
        """One run."""

    @action(system="schedules", permission="read", impl="run_logs.run_log",
            http=Http("GET", "/inspect/runs/{run_id}/log", ok=LOG_ANSWER, errors={404: "unknown run"}))
    async def run_log(self, run_id: Annotated[str, Id("run")], *, after: LogOffset = 0) -> RunLog:
        """What a run's handler logged and printed (its first and last 32 KiB).

        text is the log past its first ``after`` bytes (all of it by default), with one line
        saying how much was left out between the head and the tail; size is the ``after`` of
        the next read; running is true while more may come (a follower reads again until it
        is false)."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/schedules/{name}/upcoming", envelope="slots", ok="{slots: [iso8601]}",
                      errors={404: "unknown schedule"}))
    async def upcoming(self, name: ScheduleName, count: Annotated[int, Range(1, 100)] = 5) -> list[datetime]:
        """The next slots of a schedule by its cron (whether or not it is enabled)."""

    @action(system="schedules", permission="operate", label="Run now", audit="schedule.fire",
            http=Http("POST", "/inspect/schedules/{name}/fire", status=202, envelope="run",
                      extra=_fired, ok="{run_id, run}", errors={404: "unknown schedule"}))
    async def run_now(self, name: ScheduleName) -> Run:
        """Run now (trigger and outcome manual), whatever the overlap policy.

        Starts exactly one run and returns it once it is recorded."""

    @action(system="schedules", permission="operate", label="an external fire",
            http=Http("POST", "/schedule/{name}/fire", status=202, again=200, repeated=lambda firing: not firing.created,
                      fixed={"trigger": "external"}, ok="{run_id, created, queued, run}",
                      errors={404: "unknown schedule", 409: "not an external schedule, disabled, or no slot due"}))
    async def fire_external(self, name: ScheduleName) -> ExternalFiring:
        """Fire the slot that is due now (called by a platform scheduler).

        The slot is the newest cron slot at or before now, at most 10 minutes old, fired at
        most once across the fleet: a retry for the same slot returns the first firing
        (200, created false) instead of firing again (202). Refused for a schedule on its
        own timer (unless the serving engine allows it) or when no slot is due."""

    @action(system="schedules", permission="operate", label="enable", audit="schedule.enable", impl="enable",
            http=Http("POST", "/inspect/schedules/{name}/enable", ok="the schedule",
                      errors={404: "unknown schedule"}))
    async def enable_schedule(
        self, name: ScheduleName, *, note: Annotated[str | None, Check(check_note, {"maxLength": NOTE_MAX_CHARS})] = None
    ) -> ScheduleView:
        """Enable a schedule (it arms its next future slot).

        Slots that passed while it was disabled are not caught up."""

    @action(system="schedules", permission="operate", label="disable", audit="schedule.disable", impl="disable",
            http=Http("POST", "/inspect/schedules/{name}/disable", ok="the schedule",
                      errors={404: "unknown schedule"}))
    async def disable_schedule(
        self, name: ScheduleName, *, note: Annotated[str | None, Check(check_note, {"maxLength": NOTE_MAX_CHARS})] = None
    ) -> ScheduleView:
        """Disable a schedule, with an optional note.

        It keeps its definition, has no next slot and does not fire until enabled."""

    @action(system="schedules", permission="operate", label="creating a schedule", audit="schedule.create",
            http=Http("POST", "/inspect/schedules", status=201, body="spec", ok="the schedule created",
                      errors={409: "name_taken: a schedule (in code or stored) has that name"}))
    async def create_schedule(self, spec: Annotated[Mapping[str, Any], Schema(SCHEDULE_SPEC)]) -> ScheduleView:
        """Create a schedule, kept in the store, that every instance arms within 2 s.

        Keys: name, cron, timezone, exactly one of queue (a queue's name) or durable (a
        durable function's name), and optionally payload, description, enabled,
        on_overlap, backfill, max_runtime. Validated as a schedule defined in code: a bad
        value or an unknown target is ``BadInput`` naming it (422, error.field); a name in
        use is ``NameTaken`` (409 name_taken), but for the same create again by its author
        with the schedule unchanged since (a retry whose first answer was lost), which
        answers as the first did. The answer is the schedule, with source "store"."""

    @action(system="schedules", permission="operate", label="editing a schedule", audit="schedule.update",
            http=Http("PATCH", "/inspect/schedules/{name}", body="changes", ok="the schedule as changed",
                      errors={409: "defined_in_code: schedules defined in code are only enabled or disabled"}))
    async def update_schedule(self, name: str, changes: Annotated[Mapping[str, Any], Schema(SCHEDULE_CHANGES)]) -> ScheduleView:
        """Change a stored schedule; every instance re-arms it within 2 s.

        The changes have any of the create keys but name. Giving queue replaces a durable
        target and the other way round. A due slot is neither fired twice nor lost.
        ``DefinedInCode`` (409 defined_in_code) for a schedule defined in code,
        ``NotFound`` for an unknown one."""

    @action(system="schedules", permission="operate", label="deleting a schedule", audit="schedule.delete",
            danger=Danger('Delete schedule "{name}"?',
                          "It stops firing on every instance within 2 seconds and cannot be undone; its runs stay in the ledger."),
            http=Http("DELETE", "/inspect/schedules/{name}", extra=_deleted, ok="{deleted: true}",
                      errors={409: "defined_in_code: schedules defined in code cannot be deleted"}))
    async def delete_schedule(self, name: str) -> None:
        """Delete a stored schedule; it stops firing everywhere within 2 s.

        Its runs stay in the ledger; a run in flight finishes. ``DefinedInCode`` (409),
        ``NotFound`` as for update."""

    # -- backfills --------------------------------------------------------------------------
    @action(system="schedules", permission="read",
            http=Http("POST", "/inspect/schedules/{name}/backfill/plan", wire={"start": "from", "end": "to"}, retry=True,
                      ok="the plan", errors={404: "unknown schedule"}))
    async def plan_backfill(
        self,
        name: ScheduleName,
        start: Annotated[datetime, When(lower=True)],
        end: Annotated[datetime, When()],
        *,
        confirm: bool = False,
        limit: Annotated[int | None, Schema({"minimum": 1, "maximum": BACKFILL_MAX_LIMIT})] = None,
    ) -> BackfillPlan:
        """What a backfill would do (count, first, last, refusal); fires nothing.

        The slots in (from, to]; already_succeeded counts those that have a succeeded run."""

    @action(system="schedules", permission="operate", label="backfill", audit="schedule.backfill",
            danger=Danger('Backfill "{name}"?',
                          "Every slot of the range fires now, one after another, as if it had been due; "
                          "their handlers run with those slots' times."),
            http=Http("POST", "/inspect/schedules/{name}/backfill", status=202, envelope="progress",
                      wire={"start": "from", "end": "to"}, prelude=_backfill_plan, extra=_backfill_id,
                      ok="{id, plan, progress}", errors={404: "unknown schedule", 409: "refused: {count, reason}"}))
    async def start_backfill(
        self,
        name: ScheduleName,
        start: Annotated[datetime, When(lower=True)],
        end: Annotated[datetime, When()],
        *,
        confirm: Annotated[bool, Help("needed above 25 slots")] = False,
        limit: Annotated[int | None, Schema({"minimum": 1, "maximum": BACKFILL_MAX_LIMIT, "default": 1000})] = None,
        skip_succeeded: Annotated[bool, Help("fire only the slots without a succeeded run")] = False,
    ) -> BackfillProgress:
        """Start a range backfill in the background.

        It fires the slots in (from, to] in order; ``Refused`` when the plan is refused or
        a backfill of this schedule runs anywhere."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/backfills/{backfill_id}", ok="backfill progress", errors={404: "unknown backfill"}))
    async def backfill_progress(self, backfill_id: Annotated[str, Id("backfill")]) -> BackfillProgress:
        """Progress of a backfill (fired, failed, remaining, state)."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/backfills", envelope="backfills", ok="{backfills: [backfill progress]}",
                      errors={404: "unknown schedule"}))
    async def running_backfills(
        self, name: Annotated[str | None, Help("only this schedule's (at most one runs per schedule)")] = None
    ) -> list[BackfillProgress]:
        """The backfills running now, on any instance, oldest first.

        With name, the one of that schedule (an empty list when none runs); ``NotFound``
        for an unknown schedule. What a console reopens, and stops, after its dialog was
        closed."""

    @action(system="schedules", permission="operate", label="cancelling a backfill", audit="schedule.backfill_cancel",
            danger=Danger("Stop backfill {backfill_id}?",
                          "No further slot of it fires; the run in flight finishes on its own. "
                          "The slots not fired stay unfired (backfill them again to fire them)."),
            http=Http("POST", "/inspect/backfills/{backfill_id}/cancel", retry=True,
                      ok="the backfill's progress, state cancelled (or as it had ended)",
                      errors={404: "unknown backfill", 409: "it runs on another instance"}))
    async def cancel_backfill(self, backfill_id: Annotated[str, Id("backfill")]) -> BackfillProgress:
        """Stop a running backfill before its next slot (the run in flight finishes).

        Its progress, cancelled (or as it ended, if it had); ``Refused`` when another
        instance runs it. Its end is recorded in the audit log once the run in flight has
        ended too."""

    # -- locks ------------------------------------------------------------------------------
    @action(system="locks", permission="read", impl="locks.list", http=Http("GET", "/inspect/locks", ok="{now, locks: [lock]}"))
    async def list_locks(self) -> LocksSnapshot:
        """Every lock - held, expired or free - with its holder, token and times.

        locks is [{name, holder, token, acquired_at, expires_at, renewed_at, state}]; state
        is held, expired (its holder stopped renewing it) or free (released; holder null).
        now is the lock clock (the database's), to count expiries down against."""

    @action(system="locks", permission="operate", label="a lock release", audit="lock.release", impl="locks.release",
            danger=Danger('Release lock "{name}" by force?',
                          "The next holder gets it at once while the current one may still be working; "
                          "its renewals and fenced writes are refused from then on."),
            http=Http("POST", "/inspect/locks/{name:path}/release", ok="{released, lock, now}",
                      errors={404: "no lock with that name", 409: "token given, and no longer the lock's: nothing released"}))
    async def release_lock(
        self,
        name: LockName,
        *,
        if_token: Annotated[int | None, Range(1, 2**53), Help("only while this is its token (the lease you saw)")] = None,
    ) -> LockRelease:
        """Release a lock by force, whoever holds it (with if_token: only while that is still
        its token, else 409 and nothing released: a lease taken since the operator looked
        is never cut by mistake).

        Its holder's renewals and fenced writes are refused from now on, and the next
        holder gets a greater token. released is false when nobody held it; lock is the
        lock as it was just before. ``NotFound`` for a name no lock ever had. Never
        retried blindly: a second release would free the next holder's lock."""

    # -- durable executions (``NotFound`` for an unknown execution or function; ``Refused``
    # for a signal or cancel of a finished execution, a retry of one that has not failed)
    @action(system="durable", permission="read", impl="durable.page",
            http=Http("GET", "/inspect/durable/executions", ok="{executions: [execution], next_before}"))
    async def list_executions(
        self,
        function: Annotated[str | None, Schema({"pattern": "^[A-Za-z0-9_.-]{1,128}$"})] = None,
        *,
        status: Annotated[str | None, Schema({"enum": list(EXECUTION_STATUSES)})] = None,
        limit: PageSize = 50,
        before: Annotated[str | None, Cursor("execution")] = None,
    ) -> ExecutionsPage:
        """A page of durable executions, newest first (keyset paging)."""

    @action(system="durable", permission="read", impl="durable.get",
            http=Http("GET", "/inspect/durable/executions/{execution_id}",
                      ok="execution, with steps [{seq, name, kind, status, attempt, started_at, finished_at, error_message, …}] and logs",
                      errors={404: "unknown execution"}))
    async def get_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """One durable execution with its steps (the timeline) and its log."""

    @action(system="durable", permission="read", impl="run_logs.execution_log",
            http=Http("GET", "/inspect/durable/executions/{execution_id}/log", ok=LOG_ANSWER,
                      errors={404: "unknown execution"}))
    async def execution_log(self, execution_id: Annotated[str, Id("execution")], *, after: LogOffset = 0) -> RunLog:
        """A durable execution's log: what its steps and its code noted (the newest 500 lines).

        The same answer as a run's log; running is true until the execution has finished."""

    @action(system="durable", permission="operate", label="durable start", audit="durable.start", impl="durable.start_execution",
            definitions=True,  # a folder read names every function there is: a typo is refused
            http=Http("POST", "/inspect/durable/{function}/start", status=201, max_body=6 * MAX_INPUT_BYTES + 64 * 1024,
                      ok="{id, duplicate}", errors={404: "unknown durable function", 413: "input over 256 KiB as JSON"}))
    async def start_execution(self, function: str, input: Annotated[Any, Json(MAX_INPUT_BYTES)] = None) -> Started:
        """Start an execution of a durable function."""

    @action(system="durable", permission="operate", label="durable signal", audit="durable.signal", impl="durable.signal",
            http=Http("POST", "/inspect/durable/executions/{execution_id}/signal/{name}", retry=True,
                      max_body=6 * MAX_SIGNAL_BYTES + 64 * 1024, ok="{execution_id, name, duplicate}",
                      errors={404: "unknown execution", 409: "the execution has finished", 413: "payload over 64 KiB as JSON"}))
    async def signal_execution(
        self, execution_id: Annotated[str, Id("execution")], name: str, payload: Annotated[Any, Json(MAX_SIGNAL_BYTES)] = None
    ) -> Signalled:
        """Send a signal (an approval, say) to an execution; the first of a name is kept.

        A signal is kept once per execution and name, so a repeat changes nothing."""

    @action(system="durable", permission="operate", label="durable cancel", audit="durable.cancel", impl="durable.cancel",
            danger=Danger("Cancel execution {execution_id}?",
                          "A queued or waiting execution is cancelled at once, a running one at its next step boundary; "
                          "it cannot be resumed."),
            http=Http("POST", "/inspect/durable/executions/{execution_id}/cancel", ok="the execution",
                      errors={404: "unknown execution", 409: "the execution has finished"}))
    async def cancel_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """Cancel an execution (a running one stops at its next step boundary).

        A queued or waiting execution is cancelled at once."""

    @action(system="durable", permission="operate", label="durable retry", audit="durable.retry", impl="durable.retry",
            http=Http("POST", "/inspect/durable/executions/{execution_id}/retry", ok="the execution",
                      errors={404: "unknown execution", 409: "the execution has not failed"}))
    async def retry_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """Run a failed execution again from its failed step, with fresh attempts."""

    # -- the audit log -----------------------------------------------------------------------
    @action(system="audit", permission="read", impl="audit.list",
            http=Http("GET", "/inspect/audit", ok="{entries: [entry], next_before}"))
    async def audit(self, *, limit: PageSize = 50, before: Annotated[str | None, Cursor("entry")] = None) -> AuditPage:
        """The audit log, newest first (keyset paging).

        Every operator action (Run now, enable, disable, backfills, and the actions of the
        queue, durable executions, locks and stored schedules): {id, at, actor, action,
        target, detail}. actor is the name of the token the action came with, or the OS
        user (or --as) of a CLI or console acting on the store directly. Kept 90 days."""

    # -- alerts ------------------------------------------------------------------------------
    @action(system="alerts", permission="read", impl="alerts.page",
            http=Http("GET", "/inspect/alerts", ok="{alerts: [alert], firing}"))
    async def alerts(self, *, resolved: Annotated[bool, Help("also the alerts resolved in the last 24 hours")] = False) -> AlertsPage:
        """What is alerting now: firing alerts first, newest first.

        alerts is [{key, condition, subject_kind, subject, state, since, summary, updated_at,
        transition}]: condition is failing, late, not_firing, instance_lost, dead_jobs or stuck;
        subject the schedule, queue, execution id, fleet or instance name; since when it took its
        state; firing counts the firing ones. With resolved, the alerts resolved in the last 24
        hours follow."""

    # -- health ----------------------------------------------------------------------------
    @action(system="health", permission="read", impl="activity.read",
            http=Http("GET", "/inspect/activity",
                      ok="{now, from, minutes, schedules: [{name, enabled, runs, failures, last_success_at, late_since, "
                         "late_s}], queues: [{name, finished, failed, dead, dead_now}]}"))
    async def activity(
        self, *, minutes: Annotated[int, Range(5, 180), Help("the window: this many whole minutes, up to now")] = 60
    ) -> Activity:
        """Runs and failures per schedule and jobs per queue, by the minute; lateness now.

        The window is whole minutes of UTC, the last one the current minute; every series
        holds a count per minute, oldest first. runs: runs that ended then (succeeded or
        failed), failures: those that failed. late_since: the first slot after the
        schedule's newest succeeded run, once it has come (null: on time, or no run yet);
        late_s: how long ago. finished and failed: job attempts that ended; dead: jobs that
        died then and are dead still; dead_now: the queue's dead jobs now."""

    # -- the job queue ---------------------------------------------------------------------
    @action(system="jobs", permission="read", impl="jobs.queue_views",
            http=Http("GET", "/inspect/queues", envelope="queues", clock=True,
                      ok="{now, queues: [{name, concurrency, paused, queued, running, dead, oldest_queued_at}]}"))
    async def list_queues(self) -> list[QueueView]:
        """Every queue with its counts (queued, running, dead) and whether it is paused."""

    @action(system="jobs", permission="operate", label="pause", audit="queue.pause", impl="jobs.pause",
            http=Http("POST", "/inspect/queues/{queue}/pause", ok="the queue", errors={404: "unknown queue"}))
    async def pause_queue(self, queue: QueueName) -> QueueView:
        """Pause a queue - its jobs wait (sends are still taken); running ones finish."""

    @action(system="jobs", permission="operate", label="resume", audit="queue.resume", impl="jobs.resume",
            http=Http("POST", "/inspect/queues/{queue}/resume", ok="the queue", errors={404: "unknown queue"}))
    async def resume_queue(self, queue: QueueName) -> QueueView:
        """Resume a paused queue."""

    @action(system="jobs", permission="read", impl="jobs.list_jobs",
            http=Http("GET", "/inspect/queues/{queue}/jobs", ok="{jobs: [job], next_before}", errors={404: "unknown queue"}))
    async def list_jobs(
        self,
        queue: QueueName,
        *,
        status: Annotated[str | None, Schema({"enum": ["queued", "running", "dead"]})] = None,
        limit: PageSize = 50,
        before: Annotated[str | None, Cursor("job")] = None,
    ) -> JobsPage:
        """A page of a queue's jobs, newest first (keyset paging)."""

    @action(system="jobs", permission="operate", label="sending a job", audit="job.send", impl="jobs.send_by_operator", check=_check_send,
            http=Http("POST", "/inspect/queues/{queue}/jobs", status=201, again=200, repeated=lambda sent: sent.duplicate,
                      max_body=6 * MAX_PAYLOAD_BYTES + 64 * 1024,
                      ok="queued: {id, duplicate: false}; a job with this key exists: {id, duplicate: true}, nothing queued",
                      errors={404: "unknown queue", 409: "queue_full: it holds 10,000 queued and dead jobs",
                              413: "the payload is over 256 KiB"}))
    async def send_job(
        self,
        queue: QueueName,
        payload: Annotated[Any, Schema({"description": "any JSON, up to 256 KiB encoded"})] = None,
        *,
        delay: Annotated[float, Schema({"minimum": 0, "maximum": 2592000, "description": "seconds (30 days at most)"})] = 0,
        attempts: Annotated[int | None, Schema({"minimum": 1, "maximum": 20})] = None,
        key: Annotated[str | None, Schema({"maxLength": 256, "description": "up to 256 bytes of UTF-8"})] = None,
    ) -> Sent:
        """Send a job (a key held by another job queues nothing and answers its id).

        Every limit is checked before anything is written (``BadInput``, ``TooLarge``;
        ``QueueFull`` is a ``Refused``). Sent again after a connection error only with a
        ``key`` (the repeat queues nothing and answers the job's id, ``duplicate`` true)."""

    @action(system="jobs", permission="read", impl="jobs.get_job",
            http=Http("GET", "/inspect/jobs/{job_id}", errors={404: "unknown job"},
                      ok="the job with attempts: [{number, round, attempt, started_at, finished_at, status, error_tag, error_message, "
                         "instance}]"))
    async def get_job(self, job_id: Annotated[str, Id("job")]) -> JobDetail:
        """A job (while it exists) and its attempts; once gone, its attempts (job fields null)."""

    @action(system="jobs", permission="read", impl="run_logs.job_log",
            http=Http("GET", "/inspect/jobs/{job_id}/log", ok=LOG_ANSWER, errors={404: "unknown job, or no such attempt"}))
    async def job_log(
        self,
        job_id: Annotated[str, Id("job")],
        *,
        attempt: Annotated[int | None, Range(1, 1000),
                           Help("the attempt's number, as jobs show lists it (on across retries; default: the newest)")] = None,
        after: LogOffset = 0,
    ) -> RunLog:
        """What a job attempt's handler logged and printed (its first and last 32 KiB).

        The newest attempt's, or that of the attempt numbered ``attempt`` (its ``number``
        in the job's ``attempts``: 1, 2, … on across retries from dead, where ``attempt``
        starts again from 1); the same answer as a run's log, ``attempt`` its number."""

    @action(system="jobs", permission="operate", label="cancel", audit="job.cancel", impl="jobs.cancel", check=_check_cancel,
            http=Http("POST", "/inspect/queues/{queue}/cancel", envelope="cancelled",
                      ok="{cancelled}: true if it was queued and is gone", errors={404: "unknown queue"}))
    async def cancel_job(
        self,
        queue: QueueName,
        id: Annotated[str | None, Schema({"pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"})] = None,
        *,
        key: Annotated[str | None, Schema({"minLength": 1, "maxLength": 256})] = None,
    ) -> bool:
        """Delete a queued job by its id or by its key (a running one finishes).

        Exactly one of id and key. Each means what it says: a key that happens to look
        like an id (even another job's) cancels the job with that key. True if it was
        queued and is gone."""

    @action(system="jobs", permission="operate", label="retry", audit="job.retry", impl="jobs.retry",
            http=Http("POST", "/inspect/queues/{queue}/jobs/{job_id}/retry", ok="the job",
                      errors={404: "unknown queue or job", 409: "the job is not dead"}))
    async def retry_job(self, queue: QueueName, job_id: Annotated[str, Id("job")]) -> Job:
        """Put a dead job back in its queue, with fresh attempts (``Refused`` if it is not dead)."""

    @action(system="jobs", permission="operate", label="delete", audit="job.delete", impl="jobs.delete",
            danger=Danger("Delete job {job_id} of {queue}?",
                          "It is gone from the queue whatever its state; a running one finishes, and its result is not kept."),
            http=Http("DELETE", "/inspect/queues/{queue}/jobs/{job_id}", extra=_deleted, ok="{deleted: true}",
                      errors={404: "unknown queue or job"}))
    async def delete_job(self, queue: QueueName, job_id: Annotated[str, Id("job")]) -> None:
        """Delete a job in any state (a running one finishes; its result is not kept)."""
