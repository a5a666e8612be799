"""The metrics' reads for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

:meth:`SQLiteMetrics.fleet_snapshot` is five statements on the reader's connection, whatever
the number of schedules: each schedule's last success is one index probe (the partial index
``runs_succeeded``) inside one statement over every name.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from backend.observability.fleet import FleetSnapshot, ScheduleFacts, job_counts, member_counts
from backend.store.migrations import Component
from backend.store.sqlite.sql import _dt, _us

__all__ = ["SQLiteMetrics"]

T = TypeVar("T")

METRICS_V1 = """
    CREATE INDEX runs_succeeded ON runs (name, finished_at) WHERE status = 'succeeded'
"""
#: Per name: its stored state (NULL: never changed) and its newest success.
SCHEDULE_FACTS = """
    SELECT n.value, s.enabled,
        (SELECT max(r.finished_at) FROM runs r WHERE r.name = n.value AND r.status = 'succeeded')
    FROM json_each(?) AS n LEFT JOIN schedule_state s ON s.name = n.value
    ORDER BY n.key
"""
#: As the queue views count (a deleted job still running counts as running), and every
#: recorded queue once more with no state, so that its zeros are reported.
JOB_COUNTS = """
    SELECT queue, status, count(*) FROM jobs WHERE deleted = 0 OR status = 'running' GROUP BY queue, status
    UNION ALL SELECT name, NULL, 0 FROM queues
"""
DURABLE_COUNTS = "SELECT function, status, count(*) FROM durable_executions GROUP BY function, status"
LOCKS_HELD = "SELECT count(*) FROM locks WHERE holder IS NOT NULL AND expires_at > ?"
#: (A member standing down because its clock is off takes no work: not counted as firing.)
MEMBERS = """
    SELECT CASE WHEN clock_off THEN 'standing_down' ELSE role END, count(*) FROM instances
    WHERE heartbeat_at > min(?1, ?2 - CAST(coalesce(abandon_after, 0) * 1000000 AS INTEGER))
        AND (role IS NULL OR role <> 'observer') GROUP BY 1
"""


class SQLiteMetrics:
    COMPONENT = Component("metrics", (METRICS_V1,))

    if TYPE_CHECKING:

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def fleet_snapshot(
        self, names: Sequence[str], *, now: datetime, live_after: datetime, lock_now: datetime | None
    ) -> FleetSnapshot:
        names_json = json.dumps(list(dict.fromkeys(names)))
        locks_at = _us(lock_now if lock_now is not None else datetime.now(UTC))

        def read(c: sqlite3.Connection) -> FleetSnapshot:
            schedules = tuple(
                ScheduleFacts(name, None if enabled is None else bool(enabled), _dt(last))
                for name, enabled, last in c.execute(SCHEDULE_FACTS, (names_json,))
            )
            jobs = job_counts(c.execute(JOB_COUNTS))
            durable = {(function, status): int(n) for function, status, n in c.execute(DURABLE_COUNTS)}
            locks = int(c.execute(LOCKS_HELD, (locks_at,)).fetchone()[0])
            members = member_counts(c.execute(MEMBERS, (_us(live_after), _us(now))))
            return FleetSnapshot(schedules, jobs, durable, locks, members)

        return await self._read(read)
