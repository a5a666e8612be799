"""Plain data shared by every layer: runs, schedule views, backfill plans and progress.

Everything here is a frozen dataclass holding timezone-aware UTC datetimes. ``to_json``
turns each into the JSON object of the public contract (the HTTP API, ``--json`` output
of the CLI and the shared backend interface all use the same shapes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal, NotRequired, TypedDict, TypeVar, overload

RunStatus = Literal["succeeded", "failed", "skipped", "missed", "running"]
Trigger = Literal["self", "external", "manual"]
CoordinationMode = Literal["single", "advisoryLock", "cluster"]
Role = Literal["firing", "waiting", "observer"]
"""What an instance is to its fleet: a ``firing`` member arms timers or runs workers; a
``waiting`` member would, but its coordination mode differs from the fleet's, so it fires
nothing until the other mode's members are gone; an ``observer`` (a console, a CLI verb,
``connect()``) acts for an operator and fires nothing on its own."""
Outcome = Literal["single", "wonLock", "cluster", "external", "manual"]
OverlapPolicy = Literal["skip", "queue", "parallel"]
BackfillPolicy = Literal["skip", "latest", "all"]

COORDINATION_MODES: Final = ("single", "advisoryLock", "cluster")
OVERLAP_POLICIES: Final = ("skip", "queue", "parallel")
BACKFILL_POLICIES: Final = ("skip", "latest", "all")

#: Where the embedded store lives unless told otherwise (``--store``, ``$SCHEDTUI_STORE``).
DEFAULT_STORE_URL: Final = "sqlite:///.schedtui/state.db"
#: The definitions folder unless told otherwise (``--schedules``, ``$SCHEDTUI_SCHEDULES``).
DEFAULT_DEFINITIONS_FOLDER: Final = "schedules"

_T = TypeVar("_T")


def quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that stores each field straight
    through its slot, instead of the generated one's ``object.__setattr__`` per field,
    which looks the name up again each time. Same signature and defaults, as frozen once
    made, at about half the cost: for the few classes made on the firing path (a run's
    rows and its context, three per run)."""
    params_of = getattr(cls, "__dataclass_params__", None)
    if params_of is None or not params_of.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen, slotted dataclass")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    params, body, names = [], [], {}
    for f in fields:
        if f.default_factory is not dataclasses.MISSING or not f.init or f.kw_only:
            raise TypeError(f"quick_init: {cls.__name__}.{f.name} needs the generated __init__")
        params.append(f.name if f.default is dataclasses.MISSING else f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        names[f"_default_{f.name}"] = f.default
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init: {cls.__name__} has a __post_init__")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), names)  # noqa: S102 - as dataclasses does
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__, init.__annotations__ = cls.__init__.__doc__, cls.__init__.__annotations__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls


#: Error tags the engine itself writes; a failing handler's tag is its exception's class name.
TAG_TIMEOUT: Final = "timeout"
TAG_ABANDONED: Final = "abandoned"
TAG_INTERRUPTED: Final = "interrupted"
TAG_UNAVAILABLE: Final = "unavailable"
#: A run, attempt or step stopped (or never started) because this instance's lease on its
#: work lapsed: it could not renew it in time, so another instance may take the work over.
TAG_LEASE_LOST: Final = "lease_lost"


def utc(dt: datetime) -> datetime:
    """Return ``dt`` as an aware UTC datetime; naive input is a programming error."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"naive datetime {dt.isoformat()} (schedtui needs timezone-aware datetimes)")
    return dt.astimezone(UTC)


@dataclass(frozen=True)
class JsonFormat:
    """The ``format`` of a JSON string field, as the OpenAPI document states it."""

    name: str


Timestamp = Annotated[str, JsonFormat("date-time")]
"""A moment in a model's JSON: ISO 8601 in UTC with a ``Z`` (:func:`iso`).

Each model's ``to_json`` returns a ``TypedDict`` that states its JSON's shape: mypy holds
the code to it, and the OpenAPI document's answers are derived from it
(:mod:`backend.api.schemas`)."""


@overload
def iso(dt: datetime) -> str: ...
@overload
def iso(dt: None) -> None: ...
@overload
def iso(dt: datetime | None) -> str | None: ...
def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z``; seconds precision unless there are fractions."""
    if dt is None:
        return None
    dt = dt.astimezone(UTC)
    text = dt.isoformat(timespec="milliseconds" if dt.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 instant written by :func:`iso` (or any aware ISO string)."""
    return utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def slot_key(name: str, scheduled_at: datetime) -> str:
    """The claim key of one slot: ``name@YYYY-MM-DDTHH:MM:SS`` in UTC."""
    return f"{name}@{scheduled_at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S')}"


@dataclass(frozen=True, slots=True)
class Claim:
    """A slot an instance wants to own: the key, its schedule, the run id it would record."""

    key: str
    name: str
    run_id: str
    prune_before: datetime | None = None
    """If this claim is won, the schedule's claims older than this can go."""
    scheduled_at: datetime | None = None
    """The slot itself. When given, the store also refuses the claim if the ledger already
    holds a run of that slot that was claimed (outcome ``wonLock`` or ``external``; for an
    external fire, any run of the slot but a manual one: one the timer fired under
    ``single`` or ``cluster`` before a deploy made the schedule external), so a slot stays
    taken after its claim is pruned;
    and writes the winner's run row as a ``running`` placeholder (no ``fired_at`` yet) in
    the same transaction as the claim: from the moment a slot is won, every instance can
    see it in flight, and a winner that dies before starting leaves a row to close."""
    trigger: Trigger = "self"
    """Trigger of the placeholder run."""
    outcome: Outcome = "wonLock"
    """Coordination outcome of the placeholder run."""
    turn: bool = False
    """The claimer means to start this slot's run without waiting for another instance
    (a ``skip`` or ``queue`` schedule in ``advisoryLock`` coordination): when it is won and
    no run of its schedule is busy elsewhere (:attr:`ClaimResult.busy`), the store marks
    the placeholder :attr:`Run.held` in the same transaction, so the schedule's overlap
    place is taken from that moment, not from when the handler begins (unless another
    instance was deciding one of the schedule's turns then: :attr:`ClaimResult.untried`).
    A run won so holds its turn: it starts without :meth:`~backend.store.Store.take_turn`."""


def unique_claims(claims: Sequence[Claim]) -> Sequence[Claim]:
    """The batch with each key once, by its first claim: a key given twice in one batch is
    claimed once, under one run id (a caller that counted both as won would fire twice)."""
    unique: dict[str, Claim] = {}
    for claim in claims:
        unique.setdefault(claim.key, claim)
    return claims if len(unique) == len(claims) else list(unique.values())


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What a claim call decided: the keys this caller won, and which schedules of the
    batch another instance has a run of in flight."""

    won: frozenset[str]
    busy: dict[str, str] = field(default_factory=dict)
    """``{schedule name: id of a run in flight elsewhere}``, for the schedules this call won
    a slot of: a run of that schedule that is ``running`` on another instance and has
    started or holds its turn (:attr:`Run.held`), or is claimed for an earlier slot than
    the earliest one won here (a run about to start, or queued)."""
    untried: frozenset[str] = frozenset()
    """Schedules whose turn the claim left undecided, though asked to take it: another
    instance was deciding one at that moment (PostgreSQL). Their runs take it as they start."""

    def turns(self, claims: Sequence[Claim]) -> list[str]:
        """The run ids of ``claims`` that won their turn with their slot (see :attr:`Claim.turn`)."""
        busy, won, untried = self.busy, self.won, self.untried
        return [c.run_id for c in claims if c.turn and c.key in won and c.name not in busy and c.name not in untried]


@dataclass(frozen=True, slots=True)
class Turn:
    """What :meth:`~backend.store.Store.take_turn` decided: ``taken`` (the run holds its
    schedule's overlap place now: start it); else ``blocker``, the run in flight on another
    instance it must wait for, or ``None`` when its own row is no longer ``running``
    (closed by another instance meanwhile: it must not start)."""

    taken: bool
    blocker: str | None = None


class RunJson(TypedDict):
    """A run of the ledger: a firing, or a slot that did not fire and why."""

    id: str
    name: str
    scheduled_at: Timestamp
    fired_at: Timestamp | None
    finished_at: Timestamp | None
    status: RunStatus
    trigger: Trigger
    coordination_outcome: Outcome
    instance: str
    error_tag: str | None
    error_message: str | None
    duration_ms: int | None
    traceback: str | None


@quick_init
@dataclass(frozen=True, slots=True)
class Run:
    """One row of the run ledger: a firing, or a slot that did not fire and why."""

    id: str
    name: str
    scheduled_at: datetime
    status: RunStatus
    trigger: Trigger
    coordination_outcome: Outcome
    instance: str
    fired_at: datetime | None = None
    finished_at: datetime | None = None
    error_tag: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    """The failing handler's traceback (its last 8 KB); read with one run (the API's run
    detail, the console's details), not with lists of runs."""
    held: bool = False
    """Holds its schedule's overlap place though its row does not show a handler running:
    closed while its handler runs on (a sync handler past ``max_runtime``, or one that
    ignores its cancellation), until the handler returns; or, still ``running`` with no
    ``fired_at``, its turn taken by the claim that won it or by
    :meth:`~backend.store.Store.take_turn` (the handler starts next). The fleet's overlap
    checks count it in flight."""

    @property
    def duration_ms(self) -> int | None:
        if self.fired_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.fired_at).total_seconds() * 1000)

    @property
    def done(self) -> bool:
        return self.status != "running"

    def finish(
        self,
        status: RunStatus,
        at: datetime,
        *,
        error_tag: str | None = None,
        error_message: str | None = None,
        traceback: str | None = None,
    ) -> Run:
        # Positional construction: dataclasses.replace costs twice as much, once per run.
        return Run(
            self.id, self.name, self.scheduled_at, status, self.trigger, self.coordination_outcome,
            self.instance, self.fired_at, at, error_tag, error_message, traceback,
        )

    def to_json(self) -> RunJson:
        return {
            "id": self.id,
            "name": self.name,
            "scheduled_at": iso(self.scheduled_at),
            "fired_at": iso(self.fired_at),
            "finished_at": iso(self.finished_at),
            "status": self.status,
            "trigger": self.trigger,
            "coordination_outcome": self.coordination_outcome,
            "instance": self.instance,
            "error_tag": self.error_tag,
            "error_message": self.error_message,
            "duration_ms": self.duration_ms,
            "traceback": self.traceback,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        def when(key: str) -> datetime | None:
            value = data.get(key)
            return parse_iso(value) if value else None

        scheduled_at = when("scheduled_at")
        assert scheduled_at is not None
        return cls(
            id=data["id"],
            name=data["name"],
            scheduled_at=scheduled_at,
            fired_at=when("fired_at"),
            finished_at=when("finished_at"),
            status=data["status"],
            trigger=data["trigger"],
            coordination_outcome=data["coordination_outcome"],
            instance=data["instance"],
            error_tag=data.get("error_tag"),
            error_message=data.get("error_message"),
            traceback=data.get("traceback"),
        )


StoreState = Literal["ok", "failing", "lost"]


class StoreHealthJson(TypedDict):
    """Whether the store can write: ``ok``, ``failing`` (rows wait in memory) or ``lost``."""

    state: StoreState
    error: str | None
    waiting: int
    since: Timestamp | None


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What a store knows about its own writes, without asking the database.

    ``failing``: it cannot write right now (a full disk, a database that is down); the rows
    handed in wait in memory and are retried. ``lost``: what it writes can no longer
    survive (the SQLite file was deleted or replaced while in use)."""

    state: StoreState
    error: str | None = None
    """Why it cannot write, in a few words (no URL, no password); ``None`` when ``ok``."""
    waiting: int = 0
    """Run rows handed in and not committed yet."""
    since: datetime | None = None
    """When the trouble began; ``None`` when ``ok``."""

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> StoreHealthJson:
        return {"state": self.state, "error": self.error, "waiting": self.waiting, "since": iso(self.since)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoreHealth:
        return cls(
            state=data["state"],
            error=data.get("error"),
            waiting=data.get("waiting", 0),
            since=parse_iso(data["since"]) if data.get("since") else None,
        )


class InstanceJson(TypedDict):
    """A registered instance, as its heartbeat row says; ``stands_down`` says why it fires
    nothing when its clock is off the database server's."""

    name: str
    host: str
    pid: int
    heartbeat_at: Timestamp
    heartbeat_age_s: float
    last_fired_at: Timestamp | None
    role: Role | None
    coordination: CoordinationMode | None
    clock_offset_s: float | None
    clock_off: bool
    stands_down: str | None


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One registered instance, as its heartbeat row says."""

    name: str
    host: str
    pid: int
    heartbeat_at: datetime
    last_fired_at: datetime | None = None
    """When a run of this instance last started (as far as its ledger rows tell)."""
    role: Role | None = None
    """``firing``, ``waiting`` or ``observer`` (``None``: a heartbeat that does not say,
    from an older version)."""
    coordination: CoordinationMode | None = None
    """The coordination mode a member runs (``None`` for observers and older versions)."""
    clock_offset_s: float | None = None
    """Its clock minus the database server's, in seconds (positive: ahead), as its newest
    reading before this heartbeat measured it (``None``: not measured: SQLite, an injected
    clock, the first heartbeat, an older version)."""
    clock_off: bool = False
    """Whether its own verdict was that its clock is off (see :mod:`backend.runtime.skew`):
    a member then stands down, firing nothing and taking no work, until the clocks agree.
    Stored rather than derived from the offset: the limit is the instance's (a twelfth of its
    take-over window) and a reading too slow to tell keeps the previous verdict."""

    @property
    def hostname(self) -> str:
        """The host's name alone, as an operator knows it (``host`` also carries hashes of
        its boot and PID namespace, which tell processes apart)."""
        return self.host.split("#")[0]

    @property
    def heard_at(self) -> datetime:
        """When it beat last, by the database server's clock: its heartbeat's stamp less its
        recorded offset (a process a minute behind looked gone to every other while it beat;
        one five minutes ahead that crashed looked alive five minutes more)."""
        if self.clock_offset_s is None:
            return self.heartbeat_at
        return self.heartbeat_at - timedelta(seconds=self.clock_offset_s)

    @property
    def fires(self) -> bool:
        """Whether this instance is a firing member (an older version's row counts as one),
        not standing down because its clock is off."""
        return self.role in (None, "firing") and not self.clock_off

    @property
    def stands_down(self) -> bool:
        """A member (not an observer) that takes no work because its clock is off."""
        return self.clock_off and self.role != "observer"

    def clock_text(self) -> str | None:
        """Why it stands down, in words (``None`` when it does not)."""
        if not self.stands_down:
            return None
        offset = self.clock_offset_s or 0.0
        where = "ahead of" if offset > 0 else "behind"
        return (
            f"its clock is {abs(offset):.1f}s {where} the database server's: it fires nothing and takes "
            "no work until they agree (fix its time sync)"
        )

    def to_json(self, now: datetime) -> InstanceJson:
        return {
            "name": self.name,
            "host": self.host,
            "pid": self.pid,
            "heartbeat_at": iso(self.heartbeat_at),
            "heartbeat_age_s": round((now - self.heartbeat_at).total_seconds(), 1),
            "last_fired_at": iso(self.last_fired_at),
            "role": self.role,
            "coordination": self.coordination,
            "clock_offset_s": None if self.clock_offset_s is None else round(self.clock_offset_s, 3),
            "clock_off": self.clock_off,
            "stands_down": self.clock_text(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InstanceInfo:
        return cls(
            name=data["name"],
            host=data["host"],
            pid=data["pid"],
            heartbeat_at=parse_iso(data["heartbeat_at"]),
            last_fired_at=parse_iso(data["last_fired_at"]) if data.get("last_fired_at") else None,
            role=data.get("role"),
            coordination=data.get("coordination"),
            clock_offset_s=data.get("clock_offset_s"),  # (absent from an older server's)
            clock_off=bool(data.get("clock_off")),
        )


class StoreStatusJson(StoreHealthJson):
    """The store's kind (``sqlite``, ``postgresql``) and whether it can write."""

    kind: str


class HealthJson(TypedDict):
    """``/healthz``: whether the store can record runs, and every instance's signs of life."""

    status: StoreState
    instance: str
    coordination: CoordinationMode
    store: StoreStatusJson
    instances: list[InstanceJson] | None
    now: Timestamp


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/healthz`` says: whether the store can record runs, and every instance's
    last signs of life. ``ok`` decides the HTTP status (200, else 503)."""

    instance: str
    coordination: CoordinationMode
    store_kind: str
    store: StoreHealth
    instances: list[InstanceInfo] | None
    """Every registered instance; ``None`` when the store could not be read."""
    now: datetime

    @property
    def ok(self) -> bool:
        return self.store.ok

    @property
    def status(self) -> StoreState:
        return self.store.state

    def to_json(self) -> HealthJson:
        return {
            "status": self.status,
            "instance": self.instance,
            "coordination": self.coordination,
            "store": {"kind": self.store_kind, **self.store.to_json()},
            "instances": None if self.instances is None else [i.to_json(self.now) for i in self.instances],
            "now": iso(self.now),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        store = dict(data["store"])
        kind = store.pop("kind")
        instances = data.get("instances")
        return cls(
            instance=data["instance"],
            coordination=data["coordination"],
            store_kind=kind,
            store=StoreHealth.from_json(store),
            instances=None if instances is None else [InstanceInfo.from_json(i) for i in instances],
            now=parse_iso(data["now"]),
        )


class StateNoteJson(TypedDict):
    """Who last enabled or disabled a schedule, when, and why."""

    by: str
    at: Timestamp
    note: str | None


@dataclass(frozen=True, slots=True)
class StateNote:
    """Who last enabled or disabled a schedule, when, and why."""

    by: str
    at: datetime
    note: str | None = None

    def to_json(self) -> StateNoteJson:
        return {"by": self.by, "at": iso(self.at), "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateNote:
        return cls(by=data["by"], at=parse_iso(data["at"]), note=data.get("note"))


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """The persisted, operator-controlled part of a schedule (survives restarts)."""

    name: str
    enabled: bool
    changed_by: str
    changed_at: datetime
    note: str | None = None

    @property
    def state_note(self) -> StateNote:
        return StateNote(by=self.changed_by, at=self.changed_at, note=self.note)


class ScheduleTargetJson(TypedDict):
    """What a schedule's slots do: call a handler, send a job to a queue, start a durable function."""

    kind: Literal["handler", "queue", "durable"]
    name: str


@dataclass(frozen=True, slots=True)
class ScheduleTarget:
    """What a schedule's slots do: call a ``handler`` (its qualified name), send a job to a
    ``queue``, or start an execution of a ``durable`` function."""

    kind: Literal["handler", "queue", "durable"]
    name: str

    def to_json(self) -> ScheduleTargetJson:
        return {"kind": self.kind, "name": self.name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleTarget:
        return cls(kind=data["kind"], name=data["name"])


class ScheduleAlertingJson(TypedDict):
    """A schedule's alerts as they apply (``false``: that condition is off): ``failing`` runs in
    a row; ``late`` ``true`` (the default grace) or a grace in seconds; ``disabled`` seconds a
    run-time disable counts after; ``resolve_after`` seconds without a failure to resolve."""

    failing: int | Literal[False]
    late: float | bool
    disabled: float | Literal[False]
    resolve_after: float


class ScheduleJson(TypedDict):
    """A schedule as an operator sees it; ``owner`` (the instance holding its shard) only
    under ``cluster`` coordination; ``alert`` its alerts as they apply (``false``: off)."""

    name: str
    cron: str
    timezone: str
    trigger: Literal["self", "external"]
    on_overlap: OverlapPolicy
    backfill: BackfillPolicy
    max_runtime_s: float
    description: str | None
    payload: Any
    enabled: bool
    state_note: StateNoteJson | None
    next_fire_at: Timestamp | None
    last_run: RunJson | None
    latest_manual: RunJson | None
    source: Literal["code", "store"]
    target: ScheduleTargetJson | None
    problem: str | None
    alert: ScheduleAlertingJson | Literal[False] | None
    owner: NotRequired[str | None]


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as an operator sees it: its definition, its state, what is next, what was last."""

    name: str
    cron: str
    timezone: str
    trigger: Literal["self", "external"]
    on_overlap: OverlapPolicy
    backfill: BackfillPolicy
    max_runtime_s: float
    description: str | None
    payload: Any
    enabled: bool
    state_note: StateNote | None
    next_fire_at: datetime | None
    last_run: Run | None
    """The run of the newest self/external slot (by scheduled time), or ``None``."""
    latest_manual: Run | None = None
    """The schedule's newest run by scheduled time when that run is manual (a Run now, or a
    backfill reaching past ``last_run``); ``None`` otherwise."""
    owner: str | None = None
    """In ``cluster`` coordination: the instance holding the schedule's shard (``None``
    while nobody holds it); see :attr:`sharded`."""
    sharded: bool = False
    """Whether the engine coordinates in ``cluster`` mode (then the JSON carries ``owner``)."""
    source: Literal["code", "store"] = "code"
    """``code``: defined in a definitions file; ``store``: created at run time."""
    target: ScheduleTarget | None = None
    problem: str | None = None
    """Why the instance that answered does not run it (``None``: it does): a stored
    schedule whose row is not valid there (a zone its time zone database lacks, a value
    past a bound of its release). Such a schedule has no next slot there; it may be updated
    or deleted, nothing else (409 ``not_valid_here``)."""
    alert: Any = None
    """Its alerts as they apply (see :mod:`backend.alerts.policy`): ``{"failing": runs in a
    row or false, "late": true, false or seconds of grace, "disabled": seconds or false,
    "resolve_after": seconds}``, or ``false`` (off); ``None`` where not known (an older
    server, a stored row not valid here whose option is not either)."""

    def to_json(self) -> ScheduleJson:
        json: ScheduleJson = {
            "name": self.name,
            "cron": self.cron,
            "timezone": self.timezone,
            "trigger": self.trigger,
            "on_overlap": self.on_overlap,
            "backfill": self.backfill,
            "max_runtime_s": self.max_runtime_s,
            "description": self.description,
            "payload": self.payload,
            "enabled": self.enabled,
            "state_note": self.state_note.to_json() if self.state_note else None,
            "next_fire_at": iso(self.next_fire_at),
            "last_run": self.last_run.to_json() if self.last_run else None,
            "latest_manual": self.latest_manual.to_json() if self.latest_manual else None,
            "source": self.source,
            "target": self.target.to_json() if self.target else None,
            "problem": self.problem,
            "alert": self.alert,
        }
        if self.sharded:
            json["owner"] = self.owner
        return json

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleView:
        return cls(
            name=data["name"],
            cron=data["cron"],
            timezone=data["timezone"],
            trigger=data["trigger"],
            on_overlap=data["on_overlap"],
            backfill=data["backfill"],
            max_runtime_s=data["max_runtime_s"],
            description=data.get("description"),
            payload=data.get("payload"),
            enabled=data["enabled"],
            state_note=StateNote.from_json(data["state_note"]) if data.get("state_note") else None,
            next_fire_at=parse_iso(data["next_fire_at"]) if data.get("next_fire_at") else None,
            last_run=Run.from_json(data["last_run"]) if data.get("last_run") else None,
            latest_manual=Run.from_json(data["latest_manual"]) if data.get("latest_manual") else None,
            owner=data.get("owner"),
            sharded="owner" in data,
            source="store" if data.get("source") == "store" else "code",  # older servers: all code
            target=ScheduleTarget.from_json(data["target"]) if data.get("target") else None,
            problem=data.get("problem"),
            alert=data.get("alert"),
        )


#: Above this many slots a range backfill needs an explicit confirmation.
BACKFILL_CONFIRM_ABOVE: Final = 25
#: Default most slots one backfill may fire.
BACKFILL_DEFAULT_LIMIT: Final = 1_000
#: The limit can be raised up to here and no further.
BACKFILL_MAX_LIMIT: Final = 10_000
#: How many of a schedule's newest runs a backfill plan times one run by (their median).
BACKFILL_ESTIMATE_RUNS: Final = 20


class SchedulesJson(TypedDict):
    """Every schedule at one instant of the engine's clock (``now``)."""

    coordination: CoordinationMode
    instance: str
    now: Timestamp
    schedules: list[ScheduleJson]


@dataclass(frozen=True, slots=True)
class SchedulesSnapshot:
    """Every schedule at one instant (``now`` is the engine's clock at that instant)."""

    coordination: CoordinationMode
    instance: str
    now: datetime
    schedules: list[ScheduleView]

    def to_json(self) -> SchedulesJson:
        return {
            "coordination": self.coordination,
            "instance": self.instance,
            "now": iso(self.now),
            "schedules": [s.to_json() for s in self.schedules],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SchedulesSnapshot:
        return cls(
            coordination=data["coordination"],
            instance=data["instance"],
            now=parse_iso(data["now"]),
            schedules=[ScheduleView.from_json(s) for s in data["schedules"]],
        )


class RunsPageJson(TypedDict):
    """A page of runs, newest first; ``next_before`` (a run id) asks for the page after it."""

    runs: list[RunJson]
    next_before: str | None


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of a schedule's runs, newest first; ``next_before`` pages further back."""

    runs: list[Run]
    next_before: str | None = None

    def to_json(self) -> RunsPageJson:
        return {"runs": [r.to_json() for r in self.runs], "next_before": self.next_before}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunsPage:
        return cls(runs=[Run.from_json(r) for r in data["runs"]], next_before=data.get("next_before"))


BackfillPlanJson = TypedDict(
    "BackfillPlanJson",
    {
        "name": str,
        "from": Timestamp,
        "to": Timestamp,
        "count": int,
        "count_exceeds": bool,
        "first": Timestamp | None,
        "last": Timestamp | None,
        "limit": int,
        "confirm": bool,
        "needs_confirmation": bool,
        "ok": bool,
        "refusal": str | None,
        "reason": str | None,
        "already_succeeded": int,
        "on_overlap": OverlapPolicy | None,
        "run_seconds": float | None,
        "duration_seconds": float | None,
        "live_slots": int | None,
    },
)
# (``from`` and ``to`` are keywords in Python: the functional form, its docstring assigned)
BackfillPlanJson.__doc__ = """What a range backfill would do, computed without side effects: ``ok`` or the
``refusal`` (and its ``reason``), the slots it would fire, and what it would do to the live ones."""


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """What a range backfill would do, computed without side effects.

    ``count`` is exact up to :data:`BACKFILL_MAX_LIMIT`; beyond it the plan stops counting
    and sets ``count_exceeds`` (the refusal then says "more than 10,000").
    """

    name: str
    start: datetime
    end: datetime
    count: int
    first: datetime | None
    last: datetime | None
    limit: int
    confirm: bool
    refusal: str | None
    """Why it would be refused, as a sentence; ``None`` when it may start."""
    count_exceeds: bool = False
    reason: str | None = None
    """The refusal's kind in a few words: ``reversed range``, ``empty range``, ``reaches into
    the future``, ``no slots in range``, ``over the limit`` or ``needs confirmation``."""
    already_succeeded: int = 0
    """How many of the slots already have a succeeded run (any trigger): they would run
    again, unless the backfill is started with ``skip_succeeded``."""
    on_overlap: OverlapPolicy | None = None
    """The schedule's overlap policy: what its live slots due while a backfill run is in
    flight get (``skip``: recorded skipped; ``queue``: fired late; ``parallel``: fired
    beside it). ``None`` on a plan that may not start (and from older servers)."""
    run_seconds: float | None = None
    """How long one run takes, estimated: the median duration of the schedule's newest
    runs that ran (up to :data:`BACKFILL_ESTIMATE_RUNS`); ``None`` when none has."""
    duration_seconds: float | None = None
    """How long the backfill runs, estimated: ``count`` runs one after the other, each
    ``run_seconds`` long (so at most this long when slots that succeeded are skipped)."""
    live_slots: int | None = None
    """The schedule's live slots due while it runs, estimated: its cron's slots in the
    ``duration_seconds`` from now, counted up to :data:`BACKFILL_MAX_LIMIT` (none while it
    is disabled). ``None`` when the duration is unknown."""

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def live_effect(self) -> str | None:
        """What the backfill may do to the schedule's live slots, in a sentence; ``None``
        for a plan that may not start."""
        policy, n = self.on_overlap, self.live_slots
        if policy is None:
            return None
        if n is None or self.duration_seconds is None:
            consequence = {"skip": "skipped", "queue": "fired late", "parallel": "fired beside it"}[policy]
            return (f"how long it runs is unknown (no recent run of it to time): each live slot due "
                    f"while it runs is {consequence} (on_overlap {policy})")  # fmt: skip
        about = "under 1s" if self.duration_seconds < 1 else f"about {_span(self.duration_seconds)}"
        took = f"{about}, {_span(self.run_seconds or 0)} a run"
        slots = f"{n:,} live slot{'s' if n != 1 else ''}"
        if n == 0:
            return f"no live slot is due while it runs ({took})"
        if policy == "skip":
            return f"may skip up to {slots} (on_overlap skip): due while it runs ({took})"
        if policy == "queue":
            return f"may delay up to {slots} (on_overlap queue: fired late, not skipped): due while it runs ({took})"
        return f"{slots} due while it runs fire beside it (on_overlap parallel; {took})"

    @property
    def needs_confirmation(self) -> bool:
        return self.count > BACKFILL_CONFIRM_ABOVE

    def count_text(self) -> str:
        return f"more than {self.count - 1:,}" if self.count_exceeds else f"{self.count:,}"

    def to_json(self) -> BackfillPlanJson:
        return {
            "name": self.name,
            "from": iso(self.start),
            "to": iso(self.end),
            "count": self.count,
            "count_exceeds": self.count_exceeds,
            "first": iso(self.first),
            "last": iso(self.last),
            "limit": self.limit,
            "confirm": self.confirm,
            "needs_confirmation": self.needs_confirmation,
            "ok": self.ok,
            "refusal": self.refusal,
            "reason": self.reason,
            "already_succeeded": self.already_succeeded,
            "on_overlap": self.on_overlap,
            "run_seconds": self.run_seconds,
            "duration_seconds": self.duration_seconds,
            "live_slots": self.live_slots,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackfillPlan:
        return cls(
            name=data["name"],
            start=parse_iso(data["from"]),
            end=parse_iso(data["to"]),
            count=data["count"],
            count_exceeds=data.get("count_exceeds", False),
            first=parse_iso(data["first"]) if data.get("first") else None,
            last=parse_iso(data["last"]) if data.get("last") else None,
            limit=data["limit"],
            confirm=data["confirm"],
            refusal=data.get("refusal"),
            reason=data.get("reason"),
            already_succeeded=data.get("already_succeeded", 0),
            on_overlap=data.get("on_overlap"),
            run_seconds=data.get("run_seconds"),
            duration_seconds=data.get("duration_seconds"),
            live_slots=data.get("live_slots"),
        )


def _span(seconds: float) -> str:
    """``45s``, ``12m``, ``3h 5m``, ``2d 4h``: an estimate, to the unit below its largest."""
    s = round(seconds)
    if seconds < 1:
        return "under 1s"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f" {s % 60}s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600}h" + (f" {s % 3600 // 60}m" if s % 3600 >= 60 else "")
    return f"{s // 86400}d" + (f" {s % 86400 // 3600}h" if s % 86400 >= 3600 else "")


BackfillState = Literal["running", "done", "cancelled", "abandoned"]
"""``cancelled``: an operator stopped it (the run in flight then finishes on its own);
``abandoned``: the process running it stopped."""


BackfillProgressJson = TypedDict(
    "BackfillProgressJson",
    {
        "id": str,
        "name": str,
        "from": Timestamp,
        "to": Timestamp,
        "total": int,
        "fired": int,
        "failed": int,
        "remaining": int,
        "state": BackfillState,
        "instance": str,
        "started_at": Timestamp,
        "finished_at": Timestamp | None,
        "current": Timestamp | None,
    },
)
BackfillProgressJson.__doc__ = """How far a range backfill has got (``state``: running, done, cancelled or abandoned)."""


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """How far a range backfill has got; readable by any process while it runs."""

    id: str
    name: str
    start: datetime
    end: datetime
    total: int
    fired: int
    failed: int
    state: BackfillState
    instance: str
    started_at: datetime
    finished_at: datetime | None = None
    current: datetime | None = field(default=None)

    @property
    def remaining(self) -> int:
        return self.total - self.fired

    @property
    def succeeded(self) -> int:
        return self.fired - self.failed

    def to_json(self) -> BackfillProgressJson:
        return {
            "id": self.id,
            "name": self.name,
            "from": iso(self.start),
            "to": iso(self.end),
            "total": self.total,
            "fired": self.fired,
            "failed": self.failed,
            "remaining": self.remaining,
            "state": self.state,
            "instance": self.instance,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "current": iso(self.current),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackfillProgress:
        return cls(
            id=data["id"],
            name=data["name"],
            start=parse_iso(data["from"]),
            end=parse_iso(data["to"]),
            total=data["total"],
            fired=data["fired"],
            failed=data["failed"],
            state=data["state"],
            instance=data["instance"],
            started_at=parse_iso(data["started_at"]),
            finished_at=parse_iso(data["finished_at"]) if data.get("finished_at") else None,
            current=parse_iso(data["current"]) if data.get("current") else None,
        )


class ExternalFiringJson(TypedDict):
    """What an external fire did: the due slot's run, and whether this call made it."""

    run_id: str
    created: bool
    queued: bool
    run: RunJson | None


@dataclass(frozen=True, slots=True)
class ExternalFiring:
    """What an external fire did: the run of the due slot, and whether this call made it."""

    run_id: str
    run: Run | None
    """``None`` only while the firing waits behind a run in flight (``on_overlap="queue"``),
    or when it ran already and its row waits to be written (the store could not take it)."""
    created: bool
    """False when the slot had already been fired (a retry): ``run`` is that firing."""
    queued: bool = False

    def to_json(self) -> ExternalFiringJson:
        return {
            "run_id": self.run_id,
            "created": self.created,
            "queued": self.queued,
            "run": self.run.to_json() if self.run is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExternalFiring:
        run = data.get("run")
        return cls(
            run_id=data["run_id"],
            run=Run.from_json(run) if run is not None else None,
            created=bool(data["created"]),
            queued=bool(data.get("queued", False)),
        )
