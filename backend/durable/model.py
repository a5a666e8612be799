"""Durable executions as every layer sees them: the API, ``--json``, the console, the client.

An :class:`Execution` is one call of a durable function; its :class:`StepView` list is its
timeline (steps, sleeps and signal waits, in the order the code reached them). Both are
frozen and hold aware UTC datetimes; ``to_json`` gives the objects of the public contract.
The store's own rows (with checkpointed outputs and the lease) are in :mod:`.store`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NotRequired, TypedDict

from backend.errors import describe_exception
from backend.ids import encode_id
from backend.model import Timestamp, iso, parse_iso

__all__ = [
    "EXECUTION_STATUSES",
    "FINISHED",
    "MAX_LIFETIME",
    "STEP_KINDS",
    "SAME_AS_JSON",
    "STEP_STATUSES",
    "TAG_AT_MOST_ONCE_INTERRUPTED",
    "TAG_CANCELLED",
    "TAG_CONCURRENT_STEPS",
    "TAG_EXPIRED",
    "TAG_NONDETERMINISTIC",
    "TAG_NOT_JSON",
    "Execution",
    "ExecutionJson",
    "ExecutionLog",
    "ExecutionLogLineJson",
    "ExecutionStatus",
    "ExecutionsPage",
    "ExecutionsPageJson",
    "Signalled",
    "SignalledJson",
    "Started",
    "StartedJson",
    "StepJson",
    "StepKind",
    "StepStatus",
    "StepViewStatus",
    "StepView",
    "decode",
    "encode",
    "execution_id_for_slot",
]

ExecutionStatus = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
EXECUTION_STATUSES: Final = ("queued", "running", "waiting", "succeeded", "failed", "cancelled")
FINISHED: Final = ("succeeded", "failed", "cancelled")

StepKind = Literal["step", "sleep", "signal"]
STEP_KINDS: Final = ("step", "sleep", "signal")
StepStatus = Literal["running", "waiting", "succeeded", "failed"]
"""``running``: an at-most-once step checkpointed before it ran (never seen finished);
``waiting``: a sleep or signal wait not over yet, or a failed attempt waiting for its retry."""
STEP_STATUSES: Final = ("running", "waiting", "succeeded", "failed")
StepViewStatus = Literal["running", "waiting", "succeeded", "failed", "cancelled"]
"""A step as shown: as stored, or ``cancelled``: it was still waiting or running when its
execution was cancelled, and will never go on (:meth:`Execution.as_ended`)."""

#: How long one execution may last, from its creation: sleeps, waits and retries included.
MAX_LIFETIME: Final = timedelta(days=366)

#: An at-most-once step was found started but not finished: it is not run again.
TAG_AT_MOST_ONCE_INTERRUPTED: Final = "at_most_once_interrupted"
#: The code reached recorded steps in another order, or used a step name twice.
TAG_NONDETERMINISTIC: Final = "nondeterministic"
#: The code reached a step, sleep or wait while another step of it was still in progress
#: (``asyncio.gather`` of steps, a task, a step inside a step): they run one at a time.
TAG_CONCURRENT_STEPS: Final = "concurrent_steps"
#: The execution outlived :data:`MAX_LIFETIME` (or a wait would).
TAG_EXPIRED: Final = "expired"
#: An operator cancelled it.
TAG_CANCELLED: Final = "cancelled"
#: An execution's or a step's output that is not JSON, or too large (see :func:`encode`).
TAG_NOT_JSON: Final = "output_not_json"
#: An execution's output, a step's output, must stay below this (encoded JSON).
MAX_OUTPUT_BYTES: Final = 1024 * 1024


def execution_id_for_slot(schedule: str, scheduled_at: datetime) -> str:
    """The id of the execution a schedule starts for one slot: the same on every instance,
    so the slot starts one execution however many instances try. It has the shape of any
    other id (it sorts by the slot's time)."""
    slot = scheduled_at.astimezone(UTC)
    digest = hashlib.sha256(f"{schedule}@{slot.isoformat()}".encode()).digest()
    ms = int(slot.timestamp() * 1000)
    return encode_id(ms, int.from_bytes(digest[:10], "big"))


def _when(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return parse_iso(value) if value else None


class StepJson(TypedDict):
    """One entry of an execution's timeline: a step, a sleep or a signal wait, in the order
    the code reached it (``seq``, from 1)."""

    seq: int
    name: str
    kind: StepKind
    status: StepViewStatus
    attempt: int
    started_at: Timestamp | None
    finished_at: Timestamp | None
    duration_ms: int | None
    error_tag: str | None
    error_message: str | None
    wake_at: Timestamp | None
    at_most_once: bool


@dataclass(frozen=True, slots=True)
class StepView:
    """One entry of an execution's timeline."""

    seq: int
    """Its position: the order in which the code reached it, from 1."""
    name: str
    kind: StepKind
    status: StepViewStatus
    attempt: int
    """Attempts made (a sleep or a wait has one)."""
    started_at: datetime | None
    """When its latest attempt started (a wait: when it began waiting)."""
    finished_at: datetime | None
    error_tag: str | None = None
    error_message: str | None = None
    wake_at: datetime | None = None
    """A waiting entry: when its sleep ends, its wait times out, or its retry is due."""
    at_most_once: bool = False

    @property
    def duration_ms(self) -> int | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds() * 1000)

    def to_json(self) -> StepJson:
        return {
            "seq": self.seq,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "attempt": self.attempt,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "duration_ms": self.duration_ms,
            "error_tag": self.error_tag,
            "error_message": self.error_message,
            "wake_at": iso(self.wake_at),
            "at_most_once": self.at_most_once,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepView:
        return cls(
            seq=data["seq"],
            name=data["name"],
            kind=data.get("kind", "step"),
            status=data["status"],
            attempt=data.get("attempt", 1),
            started_at=_when(data, "started_at"),
            finished_at=_when(data, "finished_at"),
            error_tag=data.get("error_tag"),
            error_message=data.get("error_message"),
            wake_at=_when(data, "wake_at"),
            at_most_once=bool(data.get("at_most_once", False)),
        )


class ExecutionLogLineJson(TypedDict):
    """One line of an execution's log: what the executor (or the function's code) noted, and when."""

    at: Timestamp
    message: str


@dataclass(frozen=True, slots=True)
class ExecutionLog:
    """One line of an execution's log: what the executor (or the code, ``ctx.log``) noted."""

    at: datetime
    message: str

    def to_json(self) -> ExecutionLogLineJson:
        return {"at": iso(self.at), "message": self.message}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecutionLog:
        return cls(at=parse_iso(data["at"]), message=data["message"])


class ExecutionJson(TypedDict):
    """One execution of a durable function; ``steps`` (its timeline) and ``logs`` only when
    one execution is read, not in lists."""

    id: str
    function: str
    status: ExecutionStatus
    input: Any
    output: Any
    error_tag: str | None
    error_message: str | None
    schedule: str | None
    scheduled_at: Timestamp | None
    created_at: Timestamp
    finished_at: Timestamp | None
    waiting_for: str | None
    wake_at: Timestamp | None
    instance: str | None
    current_step: str | None
    steps: NotRequired[list[StepJson]]
    logs: NotRequired[list[ExecutionLogLineJson]]


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution of a durable function. ``steps`` and ``logs`` are filled in the detail
    (one execution) only, ``None`` in lists."""

    id: str
    function: str
    status: ExecutionStatus
    input: Any
    output: Any
    error_tag: str | None
    error_message: str | None
    schedule: str | None
    scheduled_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    waiting_for: str | None
    """While ``waiting``: ``sleep:NAME``, ``signal:NAME`` or ``retry:STEP``."""
    wake_at: datetime | None
    """While ``waiting``: when the sleep ends, the wait times out, or the retry is due."""
    instance: str | None
    """The instance running it, or the last one that did."""
    current_step: str | None = None
    """The step it is at (running or waiting), or the last one it reached."""
    steps: list[StepView] | None = None
    logs: list[ExecutionLog] | None = None

    @property
    def done(self) -> bool:
        return self.status in FINISHED

    def as_ended(self) -> Execution:
        """The execution with its timeline as it ended: a cancelled execution's steps that
        were still waiting (a sleep, a signal, a retry) or running are ``cancelled`` at the
        cancel, with no wake-up time (the store keeps them as they were)."""
        if self.status != "cancelled" or not self.steps:
            return self
        steps = [
            step if step.status not in ("waiting", "running")
            else replace(step, status="cancelled", wake_at=None, finished_at=step.finished_at or self.finished_at)
            for step in self.steps
        ]  # fmt: skip
        return replace(self, steps=steps)

    def to_json(self) -> ExecutionJson:
        data: ExecutionJson = {
            "id": self.id,
            "function": self.function,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "error_tag": self.error_tag,
            "error_message": self.error_message,
            "schedule": self.schedule,
            "scheduled_at": iso(self.scheduled_at),
            "created_at": iso(self.created_at),
            "finished_at": iso(self.finished_at),
            "waiting_for": self.waiting_for,
            "wake_at": iso(self.wake_at),
            "instance": self.instance,
            "current_step": self.current_step,
        }
        if self.steps is not None:
            data["steps"] = [step.to_json() for step in self.steps]
        if self.logs is not None:
            data["logs"] = [line.to_json() for line in self.logs]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Execution:
        created = _when(data, "created_at")
        assert created is not None
        steps, logs = data.get("steps"), data.get("logs")
        return cls(
            id=data["id"],
            function=data["function"],
            status=data["status"],
            input=data.get("input"),
            output=data.get("output"),
            error_tag=data.get("error_tag"),
            error_message=data.get("error_message"),
            schedule=data.get("schedule"),
            scheduled_at=_when(data, "scheduled_at"),
            created_at=created,
            finished_at=_when(data, "finished_at"),
            waiting_for=data.get("waiting_for"),
            wake_at=_when(data, "wake_at"),
            instance=data.get("instance"),
            current_step=data.get("current_step"),
            steps=None if steps is None else [StepView.from_json(s) for s in steps],
            logs=None if logs is None else [ExecutionLog.from_json(line) for line in logs],
        )


class ExecutionsPageJson(TypedDict):
    """A page of executions, newest first; ``next_before`` pages further back (``null``: the last page)."""

    executions: list[ExecutionJson]
    next_before: str | None


@dataclass(frozen=True, slots=True)
class ExecutionsPage:
    """A page of executions, newest first; ``next_before`` pages further back."""

    executions: list[Execution]
    next_before: str | None = None

    def to_json(self) -> ExecutionsPageJson:
        return {"executions": [e.to_json() for e in self.executions], "next_before": self.next_before}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecutionsPage:
        return cls([Execution.from_json(e) for e in data["executions"]], data.get("next_before"))


class StartedJson(TypedDict):
    """An execution started: its id, and whether it existed already (``duplicate``: an id
    given twice, or a schedule's slot another instance started first)."""

    id: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Started:
    """What ``start`` did: the execution's id, and whether it existed already (an id given
    twice, or a schedule's slot started by another instance first)."""

    id: str
    duplicate: bool = False

    def to_json(self) -> StartedJson:
        return {"id": self.id, "duplicate": self.duplicate}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Started:
        return cls(data["id"], bool(data.get("duplicate", False)))


class SignalledJson(TypedDict):
    """A signal sent to an execution; ``duplicate`` when it had a signal of that name already
    (the first one is kept: signals are idempotent per execution and name)."""

    execution_id: str
    name: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Signalled:
    """What ``signal`` did: ``duplicate`` when that execution had a signal of that name
    already (the first one is kept: signals are idempotent per execution and name)."""

    execution_id: str
    name: str
    duplicate: bool

    def to_json(self) -> SignalledJson:
        return {"execution_id": self.execution_id, "name": self.name, "duplicate": self.duplicate}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Signalled:
        return cls(data["execution_id"], data["name"], bool(data["duplicate"]))


def decode(text: str | None) -> Any:
    """A stored JSON text as a value (``None`` for none)."""
    return None if text is None else json.loads(text)


#: What json.dumps(value, allow_nan=False, separators=(",", ":")) makes, without making an
#: encoder per call. Its text is ASCII (``ensure_ascii``): as many bytes as characters.
_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
#: Values that come back from their JSON text as they went in (a step returns the value a
#: replay will: one of these as it is, anything else decoded from its text).
SAME_AS_JSON: Final = frozenset({str, int, float, bool, type(None)})
_SCALARS: Final = {True: "true", False: "false", None: "null"}
_SCALAR_TYPES: Final = frozenset({bool, type(None)})


def encode(value: Any) -> tuple[str, str | None]:
    """A value as the JSON text it is checkpointed as, or why it cannot be."""
    try:
        # (the encoder makes an encoder object per call for anything but a string: an int,
        # a boolean or None, the commonest results of a step, spelled as it spells them)
        kind = type(value)
        text = int.__repr__(value) if kind is int else _SCALARS[value] if kind in _SCALAR_TYPES else _ENCODE(value)
    except BaseException as exc:  # noqa: BLE001 - the value's own methods run too (a dict subclass's items())
        return "", f"is not JSON ({describe_exception(exc)[1]})"
    if len(text) > MAX_OUTPUT_BYTES:
        return "", f"is larger than {MAX_OUTPUT_BYTES} bytes as JSON"
    return text, None
