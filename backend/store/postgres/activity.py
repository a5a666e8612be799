"""The activity reads' SQL for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

Each read is one aggregate statement on a pooled connection, whatever the number of
schedules or queues; minutes are counted in SQL (``floor`` of the seconds since the
window's start over 60, so an event at exactly hh:mm:00 falls in minute hh:mm). Its
component adds the two indexes these reads walk: runs by the time they ended, and each
schedule's succeeded runs by slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from backend.activity.store import MinuteCounts, RunMarks
from backend.store.migrations import Component

__all__ = ["PostgresActivity"]

ACTIVITY_V1 = """
    CREATE INDEX schedtui_runs_by_finish ON schedtui_runs (finished_at, name, status);
    CREATE INDEX schedtui_runs_succeeded_by_slot ON schedtui_runs (name, scheduled_at) WHERE status = 'succeeded'
"""
_MINUTE = "floor(extract(epoch FROM {column} - %(start)s) / 60)::int"
RUN_COUNTS = f"""
    SELECT name, {_MINUTE.format(column="finished_at")} AS minute, count(*)::int,
        (count(*) FILTER (WHERE status = 'failed'))::int, 0
    FROM schedtui_runs
    WHERE finished_at >= %(start)s AND finished_at < %(end)s AND status IN ('succeeded', 'failed')
    GROUP BY 1, 2
"""
RUN_MARKS = """
    SELECT n,
        (SELECT scheduled_at FROM schedtui_runs WHERE name = n AND status = 'succeeded'
         ORDER BY scheduled_at DESC LIMIT 1),
        (SELECT scheduled_at FROM schedtui_runs WHERE name = n ORDER BY scheduled_at LIMIT 1)
    FROM unnest(%s::text[]) AS n
"""
QUEUE_COUNTS = f"""
    SELECT queue, {_MINUTE.format(column="finished_at")} AS minute, count(*)::int,
        (count(*) FILTER (WHERE status = 'failed'))::int, 0
    FROM schedtui_job_attempts
    WHERE finished_at >= %(start)s AND finished_at < %(end)s
    GROUP BY 1, 2
    UNION ALL
    SELECT queue, {_MINUTE.format(column="dead_at")} AS minute, 0, 0, count(*)::int
    FROM schedtui_jobs
    WHERE status = 'dead' AND dead_at >= %(start)s AND dead_at < %(end)s
    GROUP BY 1, 2
"""


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


class PostgresActivity:
    """The :class:`~backend.activity.store.ActivityStore` of the PostgreSQL store."""

    COMPONENT = Component("activity", (ACTIVITY_V1,))

    if TYPE_CHECKING:

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

    async def run_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        rows: list[Any] = await self._fetchall(RUN_COUNTS, {"start": start, "end": end})
        return rows

    async def run_marks(self, names: Sequence[str]) -> dict[str, RunMarks]:
        if not names:
            return {}
        rows = await self._fetchall(RUN_MARKS, (list(names),))
        return {name: RunMarks(_utc(success), _utc(first)) for name, success, first in rows if first is not None}

    async def queue_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        rows: list[Any] = await self._fetchall(QUEUE_COUNTS, {"start": start, "end": end})
        return rows
