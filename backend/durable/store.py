"""What durable executions need from a store: the :class:`DurableStore` protocol and its rows.

Both stores implement it in a mixin of their own (``backend/store/sqlite_durable.py``,
``backend/store/postgres_durable.py``) with their own tables (component ``durable``).

The lease: an execution being run belongs to one instance (``instance``) under a fencing
number (``lease``) until ``lease_until``. Claiming an execution increments ``lease``; every
write of the runner carries the number it claimed with and is applied only while the
stored one is still that number and the execution still ``running``. An instance that was
displaced (frozen, cut off, presumed dead) therefore cannot write anything, whatever its
clock says. Times are the engine's clock: a skewed clock can only take an execution over
early, never let two owners write.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from backend.durable.model import Execution, ExecutionStatus, StepKind, StepStatus, StepView
from backend.events.audit import AuditEntry
from backend.safetext import load_json

__all__ = [
    "EXECUTION_FIELDS",
    "STEP_FIELDS",
    "CancelOutcome",
    "Claimed",
    "DurableStore",
    "ExecutionRow",
    "Finish",
    "NewExecution",
    "Progress",
    "Renewal",
    "StepRecord",
    "Suspend",
    "Write",
    "execution_from_row",
    "failed_steps",
    "join_failed_steps",
    "signals_from_json",
    "step_from_row",
    "step_view",
]


# The three classes a step's checkpoint makes (a record, its progress, the write) are not
# frozen: one of each is made per step, a frozen dataclass costs several times as much to
# construct, and nothing changes one once made.
@dataclass(slots=True)
class StepRecord:
    """A step's checkpoint: its outcome (``output`` as JSON text) or its error."""

    seq: int
    name: str
    kind: StepKind
    status: StepStatus
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None = None
    wake_at: datetime | None = None
    output: str | None = None
    error_tag: str | None = None
    error_message: str | None = None
    at_most_once: bool = False
    gathered: bool = False
    """Reached after its execution's code had steps in progress at once: the positions of
    such an execution's steps depend on timing, so its replays find them by name."""


@dataclass(frozen=True, slots=True)
class NewExecution:
    id: str
    function: str
    input: str
    """JSON text."""
    created_at: datetime
    schedule: str | None = None
    scheduled_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ExecutionRow:
    """An execution as the runner claimed it."""

    id: str
    function: str
    input: str
    created_at: datetime
    lease: int
    cancel_requested: bool
    schedule: str | None
    scheduled_at: datetime | None
    was: ExecutionStatus
    """Its status before this claim (``running``: its owner's lease had expired)."""
    was_instance: str | None
    """Who ran it before (``None`` for a new one)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claimed execution with everything its replay needs, read in the claim."""

    execution: ExecutionRow
    steps: list[StepRecord]
    signals: dict[str, tuple[str, datetime]]
    """Signals received so far: name -> (payload as JSON text, when it was sent)."""


@dataclass(slots=True)
class Progress:
    """The execution goes on: renew its lease, note the step it is at. (A store may leave
    both to the executor's renewals and to the checkpoints when the write is one finished
    step and nothing else: PostgreSQL's lean checkpoint does.)"""

    step: str | None
    lease_until: datetime


@dataclass(frozen=True, slots=True)
class Suspend:
    """The execution stops running here and releases its lease: ``waiting`` until
    ``wake_at`` (a sleep, a signal wait, a retry's backoff), or ``queued`` to be claimed
    again at once (this instance is stopping). A wait for ``signal`` that has arrived
    meanwhile is due at once (``wake_at`` becomes now): a signal is never missed."""

    status: Literal["waiting", "queued"]
    step: str | None
    waiting_for: str | None = None
    wake_at: datetime | None = None
    signal: str | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    status: Literal["succeeded", "failed", "cancelled"]
    step: str | None
    output: str | None = None
    error_tag: str | None = None
    error_message: str | None = None
    failed_step: str | None = None
    """The steps whose failure failed the execution (``retry`` runs them again), one a line:
    see :func:`join_failed_steps`."""


def join_failed_steps(names: Sequence[str]) -> str:
    """The steps a retry runs again, as :attr:`Finish.failed_step` keeps them: one a line (a
    step name is printable: it holds no line break). A release before this one kept one
    name; its retry of an execution failed with several runs none again (it fails again at
    once, and a retry by this release runs them)."""
    return "\n".join(names)


def failed_steps(kept: str) -> list[str]:
    """The step names :func:`join_failed_steps` joined."""
    return kept.split("\n")


#: An execution's log is its newest this many lines: all a reader is given, and all a store
#: keeps (older lines are dropped as newer ones are written).
LOG_LINES = 500


@dataclass(slots=True)
class Write:
    """One transaction of the runner: step checkpoints, log lines and what becomes of the
    execution, applied only under the lease it was claimed with."""

    id: str
    lease: int
    now: datetime
    then: Progress | Suspend | Finish
    steps: Sequence[StepRecord] = ()
    logs: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Renewal:
    lost: set[str] = field(default_factory=set)
    """Executions whose lease this instance no longer holds."""
    cancel: set[str] = field(default_factory=set)
    """Executions an operator asked to cancel."""


CancelOutcome = Literal["cancelled", "requested"]


class DurableStore(Protocol):
    """Contract (both stores):

    * :meth:`durable_write` is ONE transaction (and on a server one round trip): it
      applies every part of the write, or, when the lease is not held any more (another
      claim since, or the execution is not ``running``), none, and says so with ``None``.
      Step checkpoints are upserts by ``(execution, seq)``.
    * :meth:`durable_claim` takes runnable executions of the given functions, each for one
      claimer only (``SKIP LOCKED`` on PostgreSQL): ``queued`` ones, ``waiting`` ones whose
      ``wake_at`` has come, and ``running`` ones whose lease has expired. Each claim
      increments the lease number and records ``claim`` on each (or nothing). It returns
      each with its steps and signals.
    * A signal is kept once per execution and name (the first payload wins), with the time
      it was sent; it makes a wait for it due at once.
    * Times go in and come out aware UTC.
    """

    async def durable_insert(
        self,
        execution: NewExecution,
        *,
        claim: tuple[str, datetime] | None = None,
        audit: AuditEntry | None = None,
        log: str | None = None,
    ) -> bool:
        """Insert a ``queued`` execution unless its id exists; True if inserted. With
        ``claim`` (an instance, a lease end) it is inserted claimed, as a claim would leave
        it: ``running`` on that instance under lease 1 until then, its claim id its own id
        (what :meth:`durable_give_back` takes if the answer is lost). ``audit``: the entry
        that records the start, and ``log``: a first line of its log, each written in the
        same transaction if the execution is."""

    async def durable_claim(
        self, instance: str, functions: Sequence[str], now: datetime, lease_until: datetime, limit: int,
        claim: str | None = None,
    ) -> list[Claimed]: ...

    async def durable_give_back(self, instance: str, claim: str, lease_until: datetime, now: datetime) -> int:
        """End now the leases that the claim ``claim`` took (until ``lease_until``) and still
        holds, for a claim whose answer was lost or whose executions are not run here: they
        are claimable at once. Only while that claim's lease is the execution's own (no
        other claim since, still ``running``, its lease's end unchanged); how many."""

    async def durable_write(self, write: Write) -> bool | None:
        """Apply the write under its lease. ``None``: the lease is lost, nothing written;
        otherwise whether an operator asked to cancel the execution."""

    async def durable_renew(self, instance: str, leases: Sequence[tuple[str, int]], lease_until: datetime) -> Renewal:
        """Extend the leases still held; say which are lost and which are to be cancelled."""

    async def durable_owners(self, now: datetime) -> set[str]:
        """The instances holding unexpired leases."""

    async def durable_expire(self, instance: str, now: datetime, claimed_before: datetime | None = None) -> int:
        """End the leases an instance holds (it is gone): all of them, or those it claimed
        before ``claimed_before`` (an earlier process of this instance's own name); how many."""

    async def durable_signal(self, id: str, name: str, payload: str, now: datetime) -> tuple[ExecutionStatus, bool] | None:
        """Record a signal unless the execution has one of that name, and make a wait for it
        due. Returns the execution's status and whether the signal was a duplicate, or
        ``None`` for an unknown execution. Finished executions take no signal (nothing is
        written; the caller refuses)."""

    async def durable_cancel(self, id: str, now: datetime, note: str) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
        """Cancel a ``queued``/``waiting`` execution (and one whose owner's lease expired)
        at once; ask the owner of a ``running`` one to stop at its next step boundary.
        Returns the status found and what was done (``None``: finished, nothing done), or
        ``None`` for an unknown execution."""

    async def durable_retry(self, id: str, now: datetime, note: str) -> ExecutionStatus | None:
        """Queue a ``failed`` execution again: its failed step's checkpoint is removed, so
        that step runs again with fresh attempts, unless it succeeded (a succeeded step never
        runs again). Returns the status found (only ``failed`` is retried), or ``None`` for
        an unknown execution."""

    async def durable_get(self, id: str) -> Execution | None:
        """The execution with its steps and logs."""

    async def durable_list(
        self, *, function: str | None, status: str | None, limit: int, before: str | None
    ) -> list[Execution]:
        """At most ``limit`` executions with ``id < before``, newest first."""

    async def durable_stale(self, since: datetime, now: datetime) -> dict[str, int]:
        """Per function, runnable executions nobody claimed since ``since``."""

    async def durable_prune(self, finished_before: datetime) -> int:
        """Delete executions finished before the given time, with their steps, signals and
        logs; returns how many."""



# ---------------------------------------------------------------------------------------
# Rows: one column order for both stores, each passing its own "stored time -> datetime".
# ---------------------------------------------------------------------------------------
#: The columns of an execution, in the order both stores select them.
EXECUTION_FIELDS = (
    "id", "function", "status", "input", "output", "error_tag", "error_message", "schedule",
    "scheduled_at", "created_at", "finished_at", "waiting_for", "wake_at", "instance", "step",
)  # fmt: skip
#: The columns of a step checkpoint (after its execution's id).
STEP_FIELDS = (
    "seq", "name", "kind", "status", "attempt", "started_at", "finished_at", "wake_at", "output",
    "error_tag", "error_message", "at_most_once", "gathered",
)  # fmt: skip

ToTime = Callable[[Any], "datetime | None"]


def execution_from_row(row: Sequence[Any], when: ToTime) -> Execution:
    created = when(row[9])
    assert created is not None
    return Execution(
        id=row[0],
        function=row[1],
        status=row[2],
        # A view (replays decode the checkpoints as stored): escaped where a handler, or an
        # older version, stored what is not text.
        input=None if row[3] is None else load_json(row[3]),
        output=None if row[4] is None else load_json(row[4]),
        error_tag=row[5],
        error_message=row[6],
        schedule=row[7],
        scheduled_at=when(row[8]),
        created_at=created,
        finished_at=when(row[10]),
        waiting_for=row[11],
        wake_at=when(row[12]),
        instance=row[13],
        current_step=row[14],
    )


def step_from_row(row: Sequence[Any], when: ToTime) -> StepRecord:
    return StepRecord(
        seq=int(row[0]),
        name=row[1],
        kind=row[2],
        status=row[3],
        attempt=int(row[4]),
        started_at=when(row[5]),
        finished_at=when(row[6]),
        wake_at=when(row[7]),
        output=row[8],
        error_tag=row[9],
        error_message=row[10],
        at_most_once=bool(row[11]),
        gathered=bool(row[12]),
    )


def signals_from_json(stored: dict[str, Any]) -> dict[str, tuple[str, datetime]]:
    """The signals an execution's row keeps: ``{name: {"p": payload, "at": iso}}``, and on
    PostgreSQL ``"t"``, the payload's JSON text, beside ``p``: its ``jsonb`` keeps a
    payload's value, not its text (``1e16`` came back as ``10000000000000000``, an
    object's keys reordered), so the text is read where it is there (``p`` stays for the
    release before, which reads it: a fleet is upgraded one instance at a time)."""
    signals = {}
    for name, entry in stored.items():
        at = datetime.fromisoformat(entry["at"]).astimezone(UTC)
        text = entry["t"] if "t" in entry else json.dumps(entry["p"], separators=(",", ":"))
        signals[name] = (text, at)
    return signals


def step_view(record: StepRecord) -> StepView:
    return StepView(
        seq=record.seq,
        name=record.name,
        kind=record.kind,
        status=record.status,
        attempt=record.attempt,
        started_at=record.started_at,
        finished_at=record.finished_at,
        error_tag=record.error_tag,
        error_message=record.error_message,
        wake_at=record.wake_at,
        at_most_once=record.at_most_once,
    )
