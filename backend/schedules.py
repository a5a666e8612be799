"""Defining schedules (discovering them in files is :mod:`backend.definitions`'s job), and the
:class:`RunContext` their handlers receive.

A schedule is validated completely when it is defined, so a typo fails at import time
with a message naming the schedule, the expression and the zone, rather than as a timer
that silently never fires.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from backend.alerts.policy import ScheduleAlerting, schedule_alerting
from backend.cron import Cron, shared_cron
from backend.defined import caller_location, made
from backend.errors import BadInput, CronError, DefinitionError
from backend.inputs import MAX_SENT_JSON_BYTES, check_json, check_seconds, check_text, is_async_callable
from backend.locks.model import check_lock_to_take, check_ttl
from backend.model import (
    BACKFILL_POLICIES,
    OVERLAP_POLICIES,
    BackfillPolicy,
    OverlapPolicy,
    Trigger,
    quick_init,
)
from backend.safetext import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from backend.locks import Lease, Locks

__all__ = [
    "DEFAULT_MAX_RUNTIME",
    "MAX_NAME_CHARS",
    "MAX_RUNTIME_LIMIT",
    "Handler",
    "QueueTarget",
    "RunContext",
    "Schedule",
    "define_schedule",
]

Handler = Callable[["RunContext"], Awaitable[Any] | Any]

#: The longest name of a schedule, queue or durable function.
MAX_NAME_CHARS = 128
NAME_PATTERN = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAME_CHARS}}}")
#: The watchdog's default bound on one run, in seconds (30 minutes).
DEFAULT_MAX_RUNTIME = 1800.0
#: The longest ``max_runtime`` may be, in seconds (7 days): a run's deadline is its start
#: plus it, and a bound of years (or of more seconds than a timedelta holds) would break
#: every run of the schedule, or the engine that loads it.
MAX_RUNTIME_LIMIT = 7 * 86_400


@quick_init
@dataclass(frozen=True, slots=True)
class RunContext:
    """What a handler receives about the firing it is running for."""

    name: str
    run_id: str
    scheduled_at: datetime
    """The cron-derived slot this run is for (the same on every instance)."""
    fired_at: datetime
    """When the handler actually started; later than ``scheduled_at`` by the firing lag."""
    trigger: Trigger
    payload: Any
    deadline: datetime
    """When the watchdog gives up on this run (``fired_at`` + ``max_runtime``)."""
    jobs: Any = field(default=None, repr=False, compare=False)
    """The job queue's actions (``backend.jobs.actions.JobActions``): send jobs from the
    handler with ``await ctx.jobs.send(...)`` (a sync handler: ``ctx.jobs.sync.send(...)``)."""
    lease: Lease | None = None
    """The lease of the schedule's ``lock``, for its fencing token (``None`` without one)."""
    locks: Locks | None = None
    """The engine's locks, for handlers that take locks of their own."""
    fence: int | None = None
    """A fencing token for this run's own writes, strictly greater than every earlier
    one of the same lease: the schedule's ``lock`` token, or in ``cluster`` coordination
    its shard's (``None`` otherwise: give the schedule a ``lock`` to fence its writes)."""


@dataclass(frozen=True, eq=False)
class Schedule:
    """A validated schedule definition. Build it with :func:`define_schedule`."""

    name: str
    cron: Cron
    handler: Handler
    on_overlap: OverlapPolicy = "skip"
    backfill: BackfillPolicy = "skip"
    max_runtime: float = DEFAULT_MAX_RUNTIME
    description: str | None = None
    payload: Any = None
    enabled: bool = True
    trigger: Literal["self", "external"] | None = None
    queue: str | None = None
    """The queue each firing sends a job to, when the schedule targets one (its handler is
    then a :class:`QueueTarget`)."""
    lock: str | None = None
    """A lock every run must hold (see :mod:`backend.locks`); a slot that cannot get it is
    recorded ``skipped`` with error tag ``locked``."""
    lock_ttl: float = 60.0
    durable: str | None = None
    """The durable function each slot starts an execution of (instead of a handler)."""
    source: str | None = field(default=None, compare=False)
    """Where it was defined, as ``path:line``."""
    isolation: Literal["process"] | None = None
    """``"process"``: each run in a child process of its own, which the watchdog can kill."""
    alert: ScheduleAlerting = field(default_factory=ScheduleAlerting, compare=False)
    """Its alerts (``failing``, ``late``): see :mod:`backend.alerts.policy`."""
    created_at: datetime | None = field(default=None, compare=False)
    """A stored schedule's creation (``None`` for one in code): no slot before it is its
    own, though runs of a namesake deleted before may be recorded under its name."""
    timing_changed_at: datetime | None = field(default=None, compare=False)
    """When its cron or zone last changed (``None``: never, or not known): the catch-up at
    start fires no slot up to it, which the timing of then did not have."""

    @property
    def source_file(self) -> str | None:
        return self.source.rsplit(":", 1)[0] if self.source else None

    @property
    def timezone(self) -> str:
        return self.cron.timezone

    @property
    def is_async(self) -> bool:
        return is_async_callable(self.handler)

    def effective_trigger(self, default: Literal["self", "external"] = "self") -> Literal["self", "external"]:
        return self.trigger or default

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, {self.cron.expr!r}, tz={self.timezone!r})"


class QueueTarget:
    """The handler of a schedule that targets a queue: each firing sends one job there, with
    the schedule's payload, ``cron`` set to the schedule's name and one attempt."""

    def __init__(self, queue: str) -> None:
        self.queue = queue

    async def __call__(self, ctx: RunContext) -> str:
        if ctx.jobs is None:
            raise RuntimeError(f'no job queue to send to "{self.queue}"')
        sent = await ctx.jobs.from_schedule(self.queue, ctx.name, ctx.run_id, ctx.payload)
        return str(sent.id)

    def __repr__(self) -> str:
        return f"QueueTarget({self.queue!r})"


def handler_problem(handler: Any) -> str | None:
    """Why ``handler`` cannot be a handler (it would not run when called), or ``None``.

    A handler is a function, a coroutine function, or an object whose ``__call__`` is one
    (partials included). A generator function, sync or async, only builds a generator when
    called and never runs its body; a class builds an instance."""
    if not callable(handler):
        return f"handler {handler!r} is not callable"
    if inspect.isclass(handler):
        return f"handler {handler.__name__} is a class; pass a function (or an instance with __call__)"
    for candidate in (handler, handler.__call__):
        if inspect.isasyncgenfunction(candidate) or inspect.isgeneratorfunction(candidate):
            name = getattr(handler, "__name__", repr(handler))
            return f"handler {name} is a generator function: calling it would not run it; use def or async def without yield"
    return None


def define_schedule(
    *,
    name: str,
    cron: str,
    timezone: str,
    handler: Handler | None = None,
    on_overlap: OverlapPolicy = "skip",
    backfill: BackfillPolicy = "skip",
    max_runtime: float | timedelta = DEFAULT_MAX_RUNTIME,
    description: str | None = None,
    payload: Any = None,
    enabled: bool = True,
    trigger: Trigger | None = None,
    lock: str | None = None,
    lock_ttl: float | timedelta = 60.0,
    isolation: Literal["process"] | None = None,
    queue: str | None = None,
    durable: str | None = None,
    alert: Any = None,
) -> Schedule:
    """Define a named cron schedule; raises :class:`DefinitionError` on anything invalid.

    A schedule runs ``handler``, or (``queue=``) sends one job to that queue per firing.
    ``isolation="process"`` runs each run of it in a child process (see
    :mod:`backend.runtime.isolated`): for handlers that may hang, burn CPU or block the event loop,
    which the watchdog can then really stop. With ``durable="F"`` instead of a handler, each
    slot starts one execution of the durable function F (its ``payload`` is the input).
    ``alert`` overrides its alerts' defaults, or (``False``) turns them off: see
    :mod:`backend.alerts.policy`."""
    label = f"define_schedule({name!r})" if isinstance(name, str) else "define_schedule()"

    def bad(problem: str) -> DefinitionError:
        return DefinitionError(f"{label}: {problem}")

    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise DefinitionError(
            f"{label}: invalid name {name!r} (1-128 characters of letters, digits, '_', '.', '-')"
        )
    for what, text in (("cron", cron), ("timezone", timezone)):
        if isinstance(text, str):  # checked before it is parsed, so no message quotes it raw
            try:
                check_text(text, what, one_line=True)
            except BadInput as exc:
                raise bad(exc.message) from None
    try:
        parsed = shared_cron(cron, timezone)
    except CronError as exc:
        raise CronError(f"{label}: {exc.message}") from None
    if queue is not None and durable is not None:
        raise bad(f"give a queue or durable=, not both (queue={queue!r}, durable={durable!r})")
    if queue is not None:
        if handler is not None:
            raise bad(f"give a handler or a queue, not both (queue={queue!r})")
        if not isinstance(queue, str) or not NAME_PATTERN.fullmatch(queue):
            raise bad(f"queue {queue!r} is not a queue name (1-128 letters, digits, '_', '.', '-')")
        handler = QueueTarget(queue)
    if durable is not None:
        if handler is not None:
            raise bad("give a handler or durable=, not both")
        if not isinstance(durable, str) or not NAME_PATTERN.fullmatch(durable):
            raise bad(f"durable {durable!r} is not a durable function name")
        handler = _unbound_target
    problem = handler_problem(handler)
    if problem is not None or handler is None:
        raise bad(problem or "no handler")
    if on_overlap not in OVERLAP_POLICIES:
        raise bad(f"on_overlap {on_overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}")
    if backfill not in BACKFILL_POLICIES:
        raise bad(f"backfill {backfill!r} is not one of {', '.join(BACKFILL_POLICIES)}")
    if trigger not in (None, "self", "external"):
        raise bad(f"trigger {trigger!r} is not one of self, external (or None for the app default)")
    try:
        if lock is not None:
            lock = check_lock_to_take(lock)
        # Checked with or without a lock: a value kept is a value that must work.
        lock_ttl = check_ttl(lock_ttl).total_seconds()
    except BadInput as exc:
        raise bad(exc.message) from None
    try:
        max_runtime = check_seconds(max_runtime, "max_runtime", high=MAX_RUNTIME_LIMIT, span="7 days")
    except BadInput as exc:
        raise bad(exc.message) from None
    if not isinstance(enabled, bool):
        raise bad(f"enabled {enabled!r} is not a bool")
    try:
        if description is not None:
            check_text(description, "description")
        # A payload sent to a queue or as a durable input is held here to the bounds a send
        # or a start has (else each slot failed on it, the file imported fine); a handler's
        # stays in this process. (A stored schedule's is checked where it comes in, and one an
        # earlier release took deeper runs as it did: :mod:`backend.scheduler.stored`.)
        sent = queue is not None or durable is not None
        check_json(payload, "payload", MAX_SENT_JSON_BYTES if sent else None, max_depth=MAX_JSON_DEPTH if sent else None)
    except BadInput as exc:
        raise bad(exc.message) from None
    try:
        alerting = schedule_alerting(alert)
    except BadInput as exc:
        raise bad(exc.message) from None
    if isolation not in (None, "process"):
        raise bad(f"isolation {isolation!r} is not one of process (or None: in this process)")
    if isolation is not None and durable is not None:
        raise bad("isolation applies to a handler; a schedule with durable= starts an execution")
    source = caller_location()
    if isolation == "process" and (source is None or not source.rsplit(":", 1)[0].endswith(".py")):
        raise bad("isolation='process' needs the schedule defined in a definitions file (its child imports it again)")
    if trigger == "external" and parsed.has_seconds:
        raise bad(
            f'cron "{parsed.expr}" has a seconds field; external schedulers fire at most once a '
            "minute, so a six-field schedule must use the self trigger"
        )
    return made(Schedule(
        name=name,
        cron=parsed,
        handler=handler,
        on_overlap=on_overlap,
        backfill=backfill,
        max_runtime=float(max_runtime),
        description=description,
        payload=payload,
        enabled=enabled,
        trigger=trigger,  # "manual" was rejected above
        lock=lock,
        lock_ttl=float(lock_ttl),
        source=source,
        isolation=isolation,
        queue=queue,
        durable=durable,
        alert=alerting,
    ))


async def _unbound_target(ctx: RunContext) -> None:
    """The handler of a schedule with a target, until an engine binds it (it always does)."""
    raise RuntimeError(f"schedule {ctx.name} has a target but no engine bound it")
