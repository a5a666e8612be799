"""What alerts need from a store, and the rows they exchange with it.

Both stores implement :class:`AlertStore` in a mixin beside each
(:mod:`backend.store.sqlite.alerts`, :mod:`backend.store.postgres.alerts`), over three tables
of the ``alerts`` component: the alerts (one row per condition and subject, its state and
since), the sinks the fleet's instances deliver to (by a hash of the URL: the URL itself,
which often holds a secret, never enters the store), and the outbox (one row per
transition and sink, claimed with a lease by the instance that delivers it).

Every read of facts here is one statement whatever the number of schedules, queues or
executions (a lateral or correlated read per name on an index, or an aggregate), so an
evaluation round costs a fixed number of statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from backend.alerts.model import Alert

__all__ = [
    "AlertStore",
    "DeadJobs",
    "Delivery",
    "SlotRun",
    "StuckCandidate",
    "Success",
    "Transition",
]


@dataclass(frozen=True, slots=True)
class Transition:
    """One alert taking a new state: the row as it is to be, and the notification body
    every sink gets for it (fixed here, so a resend is the same request)."""

    alert: Alert
    payload: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """An outbox row claimed by one instance: one transition to POST to one sink."""

    transition: str
    sink: str
    """The sink's id (a hash of its URL)."""
    alert_key: str
    payload: str
    attempts: int
    """Claims made so far, this one included."""
    token: int
    """The claim's number: only its claimer can record the outcome (a claim taken over
    after its lease ran out has a greater one)."""
    created_at: datetime
    until: datetime
    """When the claim's lease runs out: another instance may take it from then on."""


@dataclass(frozen=True, slots=True)
class SlotRun:
    """One of a schedule's newest finished slot runs (trigger self or external)."""

    status: str
    scheduled_at: datetime
    finished_at: datetime | None
    error_tag: str | None
    error_message: str | None


@dataclass(frozen=True, slots=True)
class Success:
    """A schedule's newest succeeded slot run."""

    scheduled_at: datetime
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class DeadJobs:
    """A queue's dead jobs: how many died since the window's start, how many in all."""

    recent: int
    total: int
    newest: datetime | None


@dataclass(frozen=True, slots=True)
class StuckCandidate:
    """An unfinished durable execution whose reference time (its last progress, or its
    wake time while waiting) is older than the evaluator asked for."""

    id: str
    function: str
    status: str
    reference: datetime


@runtime_checkable
class AlertStore(Protocol):
    """Contract:

    * :meth:`write_transitions` writes each transition only if the stored alert has
      another state and was last changed before this transition's ``updated_at`` (a row
      absent counts as resolved), and in the same transaction adds one outbox row per sink
      seen since ``sinks_after``; it returns the keys it wrote. Of two instances writing
      the same transition at once exactly one wins: the other's condition no longer holds.
    * :meth:`claim_deliveries` takes at most ``limit`` due outbox rows of the given sinks
      whose claim is free or has run out, marks them claimed by ``instance`` until
      ``until`` with a new claim number, and counts the attempt; two claimers never get
      the same row (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: its one writer).
    * :meth:`finish_delivery` records an outcome only under the claim it was given
      (same claim number, not finished): True if recorded.
    * :meth:`give_back_deliveries` frees claimed rows never sent, under the same
      condition, and takes back the attempt their claim counted.
    * Times are aware UTC; connection trouble raises :class:`~backend.errors.Unavailable`.
    """

    async def list_alerts(self, *, resolved_after: datetime | None = None) -> list[Alert]:
        """Every firing alert, and the resolved ones changed after ``resolved_after``
        (``None``: no resolved one)."""

    async def write_transitions(self, transitions: Sequence[Transition], *, sinks_after: datetime) -> list[str]: ...

    async def update_summaries(self, alerts: Sequence[Alert]) -> int:
        """Give firing alerts a new summary (no transition): each only while it is still
        firing under the same transition and was changed before its ``updated_at``."""

    async def register_sinks(self, sinks: Sequence[tuple[str, str]], at: datetime) -> None:
        """Record ``(id, shown)`` sinks as seen at ``at`` (what transitions are sent to)."""

    async def claim_deliveries(
        self, sinks: Sequence[str], instance: str, now: datetime, until: datetime, limit: int
    ) -> list[Delivery]: ...

    async def finish_delivery(
        self, delivery: Delivery, at: datetime, *, retry_at: datetime | None, error: str | None
    ) -> bool:
        """Record a claimed delivery's outcome: delivered (``error`` None), to retry at
        ``retry_at``, or given up (``error`` and no ``retry_at``)."""

    async def give_back_deliveries(self, deliveries: Sequence[Delivery]) -> int:
        """Free claimed deliveries that were never POSTed (a stop cut their claim short):
        due again at once for any instance, their attempt not counted; how many."""

    async def prune_alerts(self, before: datetime) -> int:
        """Delete resolved alerts and finished outbox rows changed before ``before``, and
        give up outbox rows created before it that nobody delivered (a sink no instance
        has any more); returns how many rows went."""

    # -- facts the conditions read (one statement each) --------------------------------------
    async def alert_baselines(self, names: Sequence[str], at: datetime) -> dict[str, datetime]:
        """When each named schedule was first seen by any instance (recorded as ``at`` for
        those first seen now): the fleet's common start of a schedule's lateness."""

    async def slot_runs(self, names: Sequence[str], newest: int) -> dict[str, list[SlotRun]]:
        """Per named schedule, its newest ``newest`` slot runs that succeeded or failed,
        newest first (names without any left out)."""

    async def last_successes(self, names: Sequence[str]) -> dict[str, Success]:
        """Per named schedule, its newest succeeded slot run (names without one left out)."""

    async def last_failures(self, names: Sequence[str]) -> dict[str, tuple[SlotRun, SlotRun]]:
        """Per named schedule, its newest failed slot run and the first slot run that
        succeeded or failed after it (names without both left out): when its runs stopped
        failing, however many have run since."""

    async def dead_jobs(self, since: Mapping[str, datetime], default: datetime) -> dict[str, DeadJobs]:
        """Per queue holding dead jobs, how many died since its window's start (``since``
        by queue, else ``default``) and how many in all."""

    async def stuck_candidates(self, older_than: datetime, limit: int) -> list[StuckCandidate]:
        """Unfinished executions whose reference time is before ``older_than``, oldest
        first, at most ``limit``: queued or running ones by their last progress, waiting
        ones by their wake time (a wait without one is never a candidate)."""
