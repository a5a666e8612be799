"""Turning a store's rows into model objects, and a backfill's progress into the parameters
of its update: one column order for every store.

Each store selects runs and backfills in the column order below and passes its own
function for turning a stored time into an aware UTC datetime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from backend.model import BackfillProgress, Run

#: The columns of a run, in the order every store selects them.
RUN_FIELDS = (
    "id", "name", "scheduled_at", "fired_at", "finished_at", "status", "trigger", "outcome",
    "instance", "error_tag", "error_message",
)
#: The columns a run is written with: RUN_FIELDS and its traceback, which is read only
#: with one run (lists of runs leave it out: it can be 8 KB).
RUN_WRITE_FIELDS = (*RUN_FIELDS, "traceback")
#: The columns of a backfill, likewise.
BACKFILL_FIELDS = (
    "id", "name", "range_start", "range_end", "total", "fired", "failed", "state", "instance",
    "started_at", "finished_at", "current_slot",
)

ToTime = Callable[[Any], "datetime | None"]


def run_from_row(row: Sequence[Any], when: ToTime) -> Run:
    scheduled_at = when(row[2])
    assert scheduled_at is not None
    return Run(
        id=row[0],
        name=row[1],
        scheduled_at=scheduled_at,
        fired_at=when(row[3]),
        finished_at=when(row[4]),
        status=row[5],
        trigger=row[6],
        coordination_outcome=row[7],
        instance=row[8],
        error_tag=row[9],
        error_message=row[10],
        traceback=row[11] if len(row) > 11 else None,
    )


def in_flight_from_row(row: Sequence[Any], when: ToTime) -> Run:
    """A row of a store's runs in flight: a run's columns (RUN_FIELDS), then whether it is
    :attr:`~backend.model.Run.held`."""
    run = run_from_row(row[:-1], when)
    return dataclasses.replace(run, held=True) if row[-1] else run


def backfill_from_row(row: Sequence[Any], when: ToTime) -> BackfillProgress:
    start, end, started_at = when(row[2]), when(row[3]), when(row[9])
    assert start is not None and end is not None and started_at is not None
    return BackfillProgress(
        id=row[0],
        name=row[1],
        start=start,
        end=end,
        total=row[4],
        fired=row[5],
        failed=row[6],
        state=row[7],
        instance=row[8],
        started_at=started_at,
        finished_at=when(row[10]),
        current=when(row[11]),
    )


def _as_it_is(at: datetime | None) -> datetime | None:
    return at


def backfill_progress_params(
    progress: BackfillProgress, stored: Callable[[datetime | None], Any] = _as_it_is
) -> tuple[Any, ...]:
    """A backfill's progress as UPDATE_BACKFILL and END_BACKFILL take it (every store's):
    fired, failed, state, finished_at, current slot, id; ``stored`` turns a time into the
    store's form (by default, as it is)."""
    return (
        progress.fired,
        progress.failed,
        progress.state,
        stored(progress.finished_at),
        stored(progress.current),
        progress.id,
    )
