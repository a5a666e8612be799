"""What the activity reads need from a store: :class:`ActivityStore`, implemented by both
stores (:mod:`backend.store.sqlite.activity`, :mod:`backend.store.postgres.activity`).

Each method is one statement, whatever the number of schedules or queues: the counts are
aggregated by the database, per subject and minute, from the run ledger and the job tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple, Protocol

__all__ = ["ActivityStore", "MinuteCounts", "RunMarks"]


class MinuteCounts(NamedTuple):
    """What happened to one subject (a schedule, a queue) in one minute of a window."""

    subject: str
    minute: int
    """Whole minutes since the window's start (0: its first minute)."""
    total: int
    """Runs that ended (succeeded or failed); for a queue, attempts that ended."""
    failed: int
    dead: int = 0
    """A queue's jobs that died in that minute and are dead still."""


class RunMarks(NamedTuple):
    """Where one schedule's lateness is counted from."""

    last_success: datetime | None
    """The ``scheduled_at`` of its newest succeeded run."""
    first_run: datetime | None
    """The ``scheduled_at`` of its oldest recorded run."""


class ActivityStore(Protocol):
    """Per-minute counts over ``[start, end)`` (``start`` a whole minute) and where each
    schedule's lateness starts. Times are aware UTC; connection trouble raises
    :class:`~backend.errors.Unavailable`."""

    async def run_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        """Per schedule and minute with any, the runs that ended in it (``finished_at``),
        succeeded or failed, and how many of them failed."""

    async def run_marks(self, names: Sequence[str]) -> dict[str, RunMarks]:
        """Per named schedule that has runs, its :class:`RunMarks`."""

    async def queue_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        """Per queue and minute with any, the attempts that ended in it, the failed ones,
        and the jobs that died in it (``dead_at``) and are dead still."""
