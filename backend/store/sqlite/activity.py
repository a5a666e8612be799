"""The activity reads' SQL for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Each read is one aggregate statement on the reader connection, whatever the number of
schedules or queues; minutes are counted in SQL from integer microseconds (a minute is
60,000,000 of them, so an event at exactly hh:mm:00 falls in minute hh:mm). Its component
adds the two indexes these reads walk: runs by the time they ended, and each schedule's
succeeded runs by slot.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from backend.activity.store import MinuteCounts, RunMarks
from backend.store.migrations import Component
from backend.store.sqlite.sql import _dt, _us

__all__ = ["SQLiteActivity"]

T = TypeVar("T")

ACTIVITY_V1 = """
    CREATE INDEX runs_by_finish ON runs (finished_at, name, status);
    CREATE INDEX runs_succeeded_by_slot ON runs (name, scheduled_at) WHERE status = 'succeeded'
"""
RUN_COUNTS = """
    SELECT name, (finished_at - ?1) / 60000000 AS minute, count(*), sum(status = 'failed'), 0
    FROM runs
    WHERE finished_at >= ?1 AND finished_at < ?2 AND status IN ('succeeded', 'failed')
    GROUP BY name, minute
"""
RUN_MARKS = """
    SELECT n.value,
        (SELECT scheduled_at FROM runs WHERE name = n.value AND status = 'succeeded'
         ORDER BY scheduled_at DESC LIMIT 1),
        (SELECT scheduled_at FROM runs WHERE name = n.value ORDER BY scheduled_at LIMIT 1)
    FROM json_each(?) AS n
"""
QUEUE_COUNTS = """
    SELECT queue, (finished_at - ?1) / 60000000 AS minute, count(*), sum(status = 'failed'), 0
    FROM job_attempts
    WHERE finished_at >= ?1 AND finished_at < ?2
    GROUP BY queue, minute
    UNION ALL
    SELECT queue, (dead_at - ?1) / 60000000 AS minute, 0, 0, count(*)
    FROM jobs
    WHERE status = 'dead' AND dead_at >= ?1 AND dead_at < ?2
    GROUP BY queue, minute
"""


class SQLiteActivity:
    """The :class:`~backend.activity.store.ActivityStore` of the SQLite store."""

    COMPONENT = Component("activity", (ACTIVITY_V1,))

    if TYPE_CHECKING:

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def run_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        params = (_us(start), _us(end))
        rows: list[MinuteCounts] = await self._read(lambda c: c.execute(RUN_COUNTS, params).fetchall())
        return rows

    async def run_marks(self, names: Sequence[str]) -> dict[str, RunMarks]:
        if not names:
            return {}
        param = json.dumps(list(names))
        rows = await self._read(lambda c: c.execute(RUN_MARKS, (param,)).fetchall())
        return {name: RunMarks(_dt(success), _dt(first)) for name, success, first in rows if first is not None}

    async def queue_counts(self, start: datetime, end: datetime) -> list[MinuteCounts]:
        params = (_us(start), _us(end))
        rows: list[MinuteCounts] = await self._read(lambda c: c.execute(QUEUE_COUNTS, params).fetchall())
        return rows
