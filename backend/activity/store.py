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


MinuteCounts = tuple[str, int, int, int, int]
"""What happened to one subject (a schedule, a queue) in one minute of a window:
``(subject, minute, total, failed, dead)``. ``minute`` counts whole minutes since the
window's start (0: its first minute); ``total`` the runs that ended (succeeded or failed),
for a queue the attempts that ended; ``failed`` those that failed; ``dead`` a queue's jobs
that died in that minute and are dead still (0 for a schedule). Plain tuples, as the
database hands them over: a window of 1,000 busy schedules is 60,000 of them."""


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
