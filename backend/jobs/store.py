"""What the job queue needs from a store: :class:`JobStore`, and the records it takes.

Both stores implement it, each in a mixin beside it that holds all of its SQL
(:mod:`backend.store.sqlite.jobs`, :mod:`backend.store.postgres.jobs`).

The invariants the queue keeps, and where each is kept:

* **No job is lost.** A job is a row from its send until it succeeds or is deleted. Every
  change of a row is one transaction; a claimed job whose worker dies stays ``running``
  until a live instance closes its attempt as ``abandoned`` (:meth:`JobStore.finish_jobs`).
* **No attempt of a job runs twice at once.** A claim turns ``queued`` into ``running``
  and increments ``tries`` under a row lock (PostgreSQL: ``FOR UPDATE SKIP LOCKED``;
  SQLite: the one writer). Every finish names the ``tries`` it was claimed with and applies
  only while the row is still ``running`` with that value: a displaced worker's late
  result changes nothing.
* **The concurrency cap holds fleet-wide.** A running job holds a *seat* ``1..concurrency``
  and a unique index on (queue, seat) over running jobs makes two claims of one seat
  impossible, whatever the snapshots (the loser's statement fails and is retried). While a
  seat above the concurrency is held (the cap was lowered) nothing is claimed. A job
  deleted while it runs keeps its seat until its handler ends.
* **A key is held by one live job at most**: a unique index on (queue, key). A job
  deleted while it runs gives its key up at once.
* **Attempts never exceed the maximum, and a job is dead only after its last attempt**:
  the worker decides (``retry`` while ``attempt < max_attempts``, else ``dead``) from the
  claimed row's own counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from backend.jobs.model import Attempt, Job, JobStatus, QueueView, Sent

__all__ = [
    "Claimed",
    "Cycle",
    "Finish",
    "FinishKind",
    "Handover",
    "JobStore",
    "NewJob",
    "QueueSpec",
    "REVOKE",
    "RunningJob",
]

#: The mark of a notification (:meth:`JobStore.notify_jobs`) that a queue changed under the
#: jobs claimed ahead of it (a cancel, a delete, a pause, a lower concurrency): ``REVOKE +
#: name`` (no queue name holds it). Its workers give those jobs back.
REVOKE = "!"

FinishKind = Literal["succeeded", "retry", "dead", "release"]

# Claimed, Handover and Finish are made once per job on the worker's hot path: not frozen
# (a frozen dataclass costs three times as much to construct); nothing changes one once made.


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue's settings as the store keeps them (from its definition)."""

    name: str
    concurrency: int
    attempts: int
    max_runtime_s: float


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert: checked, with its id and times decided."""

    id: str
    payload: str
    """JSON text."""
    run_after: datetime
    attempts: int | None
    """``None``: the queue's default."""
    key: str | None = None
    cron: str | None = None


@dataclass(slots=True)
class Claimed:
    """A job this instance just claimed: it is ``running`` under ``tries``."""

    id: str
    queue: str
    payload: str
    key: str | None
    cron: str | None
    attempt: int
    """This attempt's number (attempts made, this one included)."""
    max_attempts: int
    tries: int
    """Claims of this job ever: the fencing token of this attempt."""
    created_at: datetime
    started_at: datetime
    seat: int | None = None
    """The seat it holds; ``None``: claimed ahead, it waits for a seat this worker holds
    (see :class:`Handover`)."""


@dataclass(slots=True)
class Handover:
    """A job claimed ahead (no seat) that started on a seat its worker holds: the seat of
    an attempt that just ended, whose finish goes first in the same cycle. Applied only while
    the job is running under ``tries`` without a seat, and the seat is free once that
    finish applied; one found on that seat under ``tries`` already counts as moved (sent
    again after a cycle whose answer was lost)."""

    id: str
    tries: int
    seat: int


@dataclass(slots=True)
class Finish:
    """The end of one attempt, applied only if the job is still ``running`` under ``tries``.

    ``succeeded`` deletes the job; ``retry`` queues it again at ``retry_at``; ``dead``
    keeps it dead; ``release`` puts it back untouched (it never started: no attempt is
    used or recorded). Every kind but ``release`` records the attempt: where it applies,
    and where the job is gone, unless ``swept``. A job deleted while it ran is deleted
    whatever the kind.

    Sent again, the same finish is answered as the first sending was where that one
    applied: its attempt's record (the same tries, end to the microsecond, instance and
    error) is found, and it counts as applied, changing nothing. A store that sends a statement
    again after a lost answer (PostgreSQL) so tells the worker what really ended."""

    id: str
    queue: str
    tries: int
    kind: FinishKind
    attempt: int
    started_at: datetime
    finished_at: datetime
    instance: str
    error_tag: str | None = None
    error_message: str | None = None
    retry_at: datetime | None = None
    swept: bool = False
    """Made by the abandoned-work sweep from a read of the job, not by the worker that ran
    the attempt: a job gone by the time it arrives moved on after that read (its attempt
    ended, or its claim went back untouched and it ran again), and whoever ran it recorded
    what ran, so it records nothing. (A worker's own finish sent again after a lost answer
    finds the job gone because the first one applied: it records the attempt.)"""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A ``running`` row, as the abandoned-work sweep sees it."""

    id: str
    queue: str
    instance: str
    token: str
    tries: int
    attempt: int
    max_attempts: int
    started_at: datetime
    seat: int | None
    """``None``: claimed ahead, not started (or started and not handed its seat yet)."""


@dataclass(frozen=True, slots=True)
class Cycle:
    """What one worker cycle did: which finishes applied (by index), the jobs claimed, and
    per queue asked for, its next due time among jobs not yet due (``None``: none)."""

    applied: list[bool]
    claimed: list[Claimed]
    next_at: dict[str, datetime | None] = field(default_factory=dict)
    handed: list[bool] = field(default_factory=list)
    """Per handover (by index), whether it applied."""
    in_doubt: bool = False
    """A first sending of this cycle failed after it may have applied (its answer lost),
    and the store ran it again: these answers are the second sending's. A finish not
    applied may have been applied by the first, and jobs the first claimed under the
    cycle's token may be ``running`` under this instance unknown to the worker (it gives
    them back untouched: see :meth:`JobStore.cycle_jobs`). Never set where the store does
    not run a cycle again by itself (SQLite)."""


class JobStore(Protocol):
    """The queue's storage. Times are aware UTC datetimes; a connection problem raises
    :class:`~backend.errors.Unavailable`. See the module for the invariants."""

    job_notifications: bool
    """Whether :meth:`notify_jobs` reaches other processes (else workers only poll)."""
    job_reservations: bool
    """Whether :meth:`cycle_jobs` claims ahead (``ahead``) and takes handovers."""
    job_streams: int
    """How many cycles of disjoint queues a worker may have on their way at once to good
    effect (each on a connection of its own; one where writes are serial anyway)."""

    def expect_jobs(self, *, sending: bool = False, cycling: bool = False) -> None:
        """A hint: this process is about to send jobs (``sending``) or run workers
        (``cycling``). Connections the store keeps for that may start opening now, in the
        background, so that the first sends and claims do not pay for them. Nothing waits
        for it, and a store that keeps none ignores it; without it they open as first needed."""

    async def define_queues(self, queues: Sequence[QueueSpec], at: datetime, *, update: bool) -> None:
        """Record the queues (``update``: overwrite their settings; else only add missing
        ones). Never touches ``paused``."""

    async def send_jobs(
        self, queue: str, jobs: Sequence[NewJob], at: datetime, *, wake_later: Callable[[str], None] | None = None
    ) -> list[Sent]:
        """Insert the jobs in one transaction, answering one :class:`Sent` per job, in
        order. A job whose key another job of the queue holds (also one earlier in the
        same batch) is not inserted: its answer is that job's id, ``duplicate``. A job
        whose id exists already (a send retried after a lost answer) answers that id, not
        duplicate. A store that sends again by itself after a lost answer (PostgreSQL)
        finds a job by its id in the queue or, once it ran and is gone, by its recorded
        attempts: it is queued once; only a job cancelled or deleted while still queued,
        between the lost answer and the repeat, is queued again.
        :class:`~backend.errors.NotFound` for an unknown queue;
        :class:`~backend.jobs.model.QueueFull` (nothing inserted) when the queue's queued +
        dead jobs would exceed :data:`~backend.jobs.definition.MAX_HELD`.

        ``wake_later`` (stores with :attr:`job_notifications`): wake the workers of other
        processes after the commit, in the send's own round trip when the store can, else
        by calling ``wake_later(queue)`` once it committed (the caller's coalesced
        :meth:`notify_jobs`). Without it, waking them is the caller's."""

    async def cycle_jobs(
        self,
        finishes: Sequence[Finish],
        wanted: Mapping[str, int],
        instance: str,
        token: str,
        now: datetime,
        *,
        ahead: Mapping[str, int] | None = None,
        handovers: Sequence[Handover] = (),
    ) -> Cycle:
        """One worker cycle, one transaction: apply ``finishes`` (conditionally, see
        :class:`Finish`), then ``handovers`` (see :class:`Handover`), then claim up to
        ``wanted[q]`` due jobs of each queue ``q`` that is not paused, oldest due first,
        each with a free seat, and up to ``ahead[q]`` more without a seat (where
        :attr:`job_reservations`), as ``instance`` under ``token``. PostgreSQL: one claim
        statement with ``FOR UPDATE SKIP LOCKED``.

        A store that runs the cycle again by itself after a first sending whose answer was
        lost (PostgreSQL, on another connection) says so (:attr:`Cycle.in_doubt`): every
        statement of a cycle is safe to run again, but only the worker knows which
        ``running`` jobs under ``token`` it holds."""

    async def finish_jobs(self, finishes: Sequence[Finish]) -> list[bool]:
        """Apply finishes alone (the abandoned sweep, shutdown); which applied."""

    async def running_jobs(self) -> list[RunningJob]:
        """Every ``running`` job, from any instance."""

    async def waiting_jobs(self, due_before: datetime) -> dict[str, int]:
        """Per queue, how many queued jobs were due before ``due_before`` and are still
        queued (nobody has claimed them since)."""

    async def cancel_job(self, queue: str, *, id: str | None = None, key: str | None = None) -> bool:
        """Delete the queued job with this id, or this key (one of them is given); True if
        there was one."""

    async def delete_job(self, queue: str, job_id: str) -> bool:
        """Delete a job in any state (a running one keeps its seat, not its key, until its
        handler ends); False if there is none."""

    async def retry_job(self, queue: str, job_id: str, at: datetime) -> Job | None:
        """A dead job back to ``queued`` now, with fresh attempts; ``None`` if there is no
        such job; :class:`~backend.jobs.model.NotDead` if it is not dead."""

    async def pause_queue(self, queue: str, paused: bool, by: str, at: datetime) -> bool:
        """Pause or resume; False for an unknown queue."""

    async def queue_views(self, now: datetime) -> list[QueueView]:
        """Every recorded queue with its counts, by name."""

    async def list_jobs(
        self, queue: str, *, status: JobStatus | None, limit: int, before: str | None
    ) -> list[Job]:
        """At most ``limit`` jobs of the queue with ``id < before``, newest first."""

    async def get_job(self, job_id: str) -> Job | None: ...

    async def job_attempts(self, job_id: str) -> tuple[str | None, list[Attempt]]:
        """The job's queue (from its attempts) and its recorded attempts, oldest first."""

    async def prune_jobs(self, dead_before: datetime, cron_dead_before: datetime, attempts_before: datetime) -> int:
        """Delete dead jobs that died before the cutoffs (a schedule's, and the others), and
        attempts that ended before ``attempts_before``; how many rows went."""

    async def notify_jobs(self, queues: Sequence[str]) -> None:
        """Tell other processes that these queues have new work (a no-op where the store
        has no such channel)."""

    async def watch_jobs(self, wake: Callable[[str | None], Any]) -> None:
        """Until cancelled: call ``wake(queue)`` when another process tells of new work or
        of a change (``REVOKE + queue``), and ``wake(None)`` whenever the channel comes up
        (what was told while it was down was not heard: any queue may have new work or a
        change). Returns at once where the store has no such channel; workers then rely on
        polling."""
