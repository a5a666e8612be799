"""The job queue's objects, as the API, the CLI's ``--json`` and the backend interface share
them: a job, its attempts, a queue, a send's answer, a page of jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

from backend.errors import Refused
from backend.model import Timestamp, iso, parse_iso

if TYPE_CHECKING:
    from backend.jobs.actions import JobActions

__all__ = [
    "ATTEMPT_STATUSES",
    "JOB_STATUSES",
    "Attempt",
    "Job",
    "JobContext",
    "JobDetail",
    "JobStatus",
    "JobsPage",
    "NotDead",
    "QueueFull",
    "QueueView",
    "Sent",
    "numbered",
]

JobStatus = Literal["queued", "running", "dead"]
JOB_STATUSES: Final = ("queued", "running", "dead")
AttemptStatus = Literal["succeeded", "failed"]
ATTEMPT_STATUSES: Final = ("succeeded", "failed")


class QueueFull(Refused):
    """The queue holds its maximum of queued + dead jobs: nothing was sent."""

    title = "Queue full"
    code = "queue_full"


class NotDead(Refused):
    """Only a dead job can be retried."""

    title = "Not dead"
    code = "not_dead"


def _when(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return parse_iso(value) if value else None


class JobJson(TypedDict):
    """A job while it exists: ``queued`` (also delayed, or waiting for a retry), ``running``
    or ``dead``; ``attempt`` counts the attempts made since it was sent or retried from dead."""

    id: str
    queue: str
    status: JobStatus
    payload: Any
    key: str | None
    cron: str | None
    attempt: int
    max_attempts: int
    run_after: Timestamp
    created_at: Timestamp
    started_at: Timestamp | None
    instance: str | None
    error_tag: str | None
    error_message: str | None


@dataclass(frozen=True, slots=True)
class Job:
    """A job while it exists: ``queued`` (also delayed, or waiting for a retry), ``running``
    or ``dead``. One that succeeds, or is deleted, is gone; its attempts stay readable."""

    id: str
    queue: str
    status: JobStatus
    payload: Any
    key: str | None
    cron: str | None
    """The schedule that enqueued it, if one did."""
    attempt: int
    """Attempts made (since it was sent, or retried from dead)."""
    max_attempts: int
    run_after: datetime
    """When it may run (next): its send plus delay, or its retry time."""
    created_at: datetime
    started_at: datetime | None = None
    """When its latest attempt started."""
    instance: str | None = None
    """Who runs it, or ran its latest attempt."""
    error_tag: str | None = None
    error_message: str | None = None
    """Why its latest attempt failed."""

    def to_json(self) -> JobJson:
        return {
            "id": self.id,
            "queue": self.queue,
            "status": self.status,
            "payload": self.payload,
            "key": self.key,
            "cron": self.cron,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "run_after": iso(self.run_after),
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "instance": self.instance,
            "error_tag": self.error_tag,
            "error_message": self.error_message,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        run_after, created_at = _when(data, "run_after"), _when(data, "created_at")
        assert run_after is not None and created_at is not None
        return cls(
            id=data["id"],
            queue=data["queue"],
            status=data["status"],
            payload=data.get("payload"),
            key=data.get("key"),
            cron=data.get("cron"),
            attempt=int(data["attempt"]),
            max_attempts=int(data["max_attempts"]),
            run_after=run_after,
            created_at=created_at,
            started_at=_when(data, "started_at"),
            instance=data.get("instance"),
            error_tag=data.get("error_tag"),
            error_message=data.get("error_message"),
        )


class AttemptJson(TypedDict):
    """One finished attempt of a job: ``number`` is its place among the job's attempts kept
    (oldest first), ``attempt`` its number within its ``round`` (a round per retry from dead)."""

    number: int
    round: int
    attempt: int
    started_at: Timestamp
    finished_at: Timestamp
    status: AttemptStatus
    error_tag: str | None
    error_message: str | None
    instance: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One finished attempt of a job (kept 7 days)."""

    attempt: int
    """Its number within its round (against ``max_attempts``): from 1 again after a retry from dead."""
    started_at: datetime
    finished_at: datetime
    status: AttemptStatus
    error_tag: str | None
    error_message: str | None
    instance: str
    seq: int = 0
    """The claim it ran under (its job's count of claims then): what its log is kept by.
    Not in its JSON."""
    number: int = 0
    """Its place among the job's attempts kept, oldest first (see :func:`numbered`): how
    ``jobs show`` lists it and ``job_log`` addresses it."""
    round: int = 1
    """1, and one more with each retry from dead (see :func:`numbered`)."""

    def to_json(self) -> AttemptJson:
        return {
            "number": self.number,
            "round": self.round,
            "attempt": self.attempt,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "status": self.status,
            "error_tag": self.error_tag,
            "error_message": self.error_message,
            "instance": self.instance,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        started, finished = _when(data, "started_at"), _when(data, "finished_at")
        assert started is not None and finished is not None
        return cls(
            attempt=int(data["attempt"]),
            started_at=started,
            finished_at=finished,
            status=data["status"],
            error_tag=data.get("error_tag"),
            error_message=data.get("error_message"),
            instance=data["instance"],
        )


def numbered(attempts: list[Attempt]) -> list[Attempt]:
    """A job's attempts (oldest first) with their :attr:`~Attempt.number` (1, 2, … on
    across retries from dead, so that each attempt's log has an address of its own: a
    retried job's attempts were 1, 2, 1, 2) and :attr:`~Attempt.round` (an attempt whose
    number within its round is not past the one before began a round: a retry from dead)."""
    out: list[Attempt] = []
    round_, before = 1, 0
    for number, attempt in enumerate(attempts, 1):
        if attempt.attempt <= before:
            round_ += 1
        before = attempt.attempt
        out.append(replace(attempt, number=number, round=round_))
    return out


class JobDetailJson(TypedDict):
    """A job and its attempts, oldest first. Once the job is gone (it succeeded, or was
    deleted) only its attempts remain: every field but ``id``, ``queue`` and ``attempts`` is null."""

    id: str
    queue: str
    status: JobStatus | None
    payload: Any
    key: str | None
    cron: str | None
    attempt: int | None
    max_attempts: int | None
    run_after: Timestamp | None
    created_at: Timestamp | None
    started_at: Timestamp | None
    instance: str | None
    error_tag: str | None
    error_message: str | None
    attempts: list[AttemptJson]


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job and its attempts, oldest first. Once the job is gone (it succeeded, or was
    deleted) only its attempts remain: ``job`` is ``None`` and the JSON's job fields are
    ``null``."""

    id: str
    queue: str
    job: Job | None
    attempts: list[Attempt] = field(default_factory=list)

    def to_json(self) -> JobDetailJson:
        attempts = [a.to_json() for a in self.attempts]
        if self.job is not None:
            return {**self.job.to_json(), "attempts": attempts}
        return {
            "id": self.id,
            "queue": self.queue,
            "status": None,
            "payload": None,
            "key": None,
            "cron": None,
            "attempt": None,
            "max_attempts": None,
            "run_after": None,
            "created_at": None,
            "started_at": None,
            "instance": None,
            "error_tag": None,
            "error_message": None,
            "attempts": attempts,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobDetail:
        job = Job.from_json(data) if data.get("status") is not None else None
        # (numbered here, as the server numbers them: an older server's answer has no numbers)
        return cls(data["id"], data["queue"], job, numbered([Attempt.from_json(a) for a in data.get("attempts", [])]))


class QueueJson(TypedDict):
    """A job queue as operators see it: its settings, and how many of its jobs are in each state."""

    name: str
    concurrency: int
    paused: bool
    queued: int
    running: int
    dead: int
    oldest_queued_at: Timestamp | None


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue as operators see it."""

    name: str
    concurrency: int
    paused: bool
    queued: int
    running: int
    dead: int
    oldest_queued_at: datetime | None
    """When the job that has waited longest became due (``None`` when none is due)."""

    def to_json(self) -> QueueJson:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "paused": self.paused,
            "queued": self.queued,
            "running": self.running,
            "dead": self.dead,
            "oldest_queued_at": iso(self.oldest_queued_at),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueView:
        return cls(
            name=data["name"],
            concurrency=int(data["concurrency"]),
            paused=bool(data["paused"]),
            queued=int(data["queued"]),
            running=int(data["running"]),
            dead=int(data["dead"]),
            oldest_queued_at=_when(data, "oldest_queued_at"),
        )


class SentJson(TypedDict):
    """What a send did: the job's id, and whether a job with the same key was there already
    (then nothing was queued and ``id`` is that job's)."""

    id: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Sent:
    """What a send did: the job's id, and whether a job with the same key was there already
    (then nothing was queued and ``id`` is that job's)."""

    id: str
    duplicate: bool = False

    def to_json(self) -> SentJson:
        return {"id": self.id, "duplicate": self.duplicate}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sent:
        return cls(id=data["id"], duplicate=bool(data["duplicate"]))


class JobsPageJson(TypedDict):
    """A page of a queue's jobs, newest first; ``next_before`` (a job id) asks for the page after it."""

    jobs: list[JobJson]
    next_before: str | None


@dataclass(frozen=True, slots=True)
class JobsPage:
    """One page of a queue's jobs, newest first; ``next_before`` pages further back."""

    jobs: list[Job]
    next_before: str | None = None

    def to_json(self) -> JobsPageJson:
        return {"jobs": [j.to_json() for j in self.jobs], "next_before": self.next_before}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobsPage:
        return cls(jobs=[Job.from_json(j) for j in data["jobs"]], next_before=data.get("next_before"))


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a job's handler receives."""

    id: str
    queue: str
    payload: Any
    attempt: int
    """This attempt's number, from 1."""
    max_attempts: int
    key: str | None
    cron: str | None
    """The schedule that enqueued it, if one did."""
    deadline: datetime
    """When the watchdog gives up on this attempt (its start + the queue's ``max_runtime``)."""
    created_at: datetime
    jobs: JobActions = field(repr=False)
    """Send (and act on) jobs from the handler: ``await job.jobs.send(...)``; from a sync
    handler, ``job.jobs.sync.send(...)``."""
    fence: int = 0
    """This attempt's fencing token: greater than that of every earlier claim of this job,
    on any instance. The store refuses the attempt's end once the job was claimed again;
    give it to your own writes (``WHERE fence < %s``) to refuse a stale attempt's too."""


# A handler's context is made once per attempt, on the worker's hot path: made by
# job_context, which sets its slots directly (its frozen __init__ costs twice as much).
_ID, _QUEUE, _PAYLOAD, _ATTEMPT, _MAX, _KEY, _CRON, _DEADLINE, _CREATED, _JOBS, _FENCE = (
    getattr(JobContext, f).__set__ for f in JobContext.__slots__
)
_new = object.__new__


def job_context(
    id: str, queue: str, payload: Any, attempt: int, max_attempts: int, key: str | None, cron: str | None,
    deadline: datetime, created_at: datetime, jobs: JobActions, fence: int,
) -> JobContext:  # fmt: skip
    """``JobContext(...)``, the same object, made faster."""
    context: JobContext = _new(JobContext)
    _ID(context, id)
    _QUEUE(context, queue)
    _PAYLOAD(context, payload)
    _ATTEMPT(context, attempt)
    _MAX(context, max_attempts)
    _KEY(context, key)
    _CRON(context, cron)
    _DEADLINE(context, deadline)
    _CREATED(context, created_at)
    _JOBS(context, jobs)
    _FENCE(context, fence)
    return context
