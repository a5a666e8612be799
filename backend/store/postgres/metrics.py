"""The metrics' reads for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

:meth:`PostgresMetrics.fleet_snapshot` is five statements on one pooled connection, whatever
the number of schedules: each schedule's last success is one probe of the partial index
``schedtui_runs_succeeded`` inside one statement over every name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from backend.observability.fleet import FleetSnapshot, ScheduleFacts, job_counts, member_counts
from backend.store.migrations import Component

__all__ = ["PostgresMetrics"]

T = TypeVar("T")

METRICS_V1 = """
    CREATE INDEX schedtui_runs_succeeded ON schedtui_runs (name, finished_at) WHERE status = 'succeeded'
"""
#: Per name: its stored state (NULL: never changed) and its newest success.
SCHEDULE_FACTS = """
    SELECT n.name, s.enabled,
        (SELECT max(r.finished_at) FROM schedtui_runs r WHERE r.name = n.name AND r.status = 'succeeded')
    FROM unnest(%(names)s::text[]) WITH ORDINALITY AS n(name, position)
    LEFT JOIN schedtui_schedule_state s ON s.name = n.name
    ORDER BY n.position
"""
#: As the queue views count (a deleted job still running counts as running), and every
#: recorded queue once more with no state, so that its zeros are reported.
JOB_COUNTS = """
    SELECT queue, status, count(*) FROM schedtui_jobs WHERE NOT deleted OR status = 'running' GROUP BY queue, status
    UNION ALL SELECT name, NULL, 0 FROM schedtui_queues
"""
DURABLE_COUNTS = "SELECT function, status, count(*) FROM schedtui_durable_executions GROUP BY function, status"
LOCKS_HELD = """
    SELECT count(*) FROM schedtui_locks
    WHERE holder IS NOT NULL AND expires_at > coalesce(%(now)s::timestamptz, statement_timestamp())
"""
#: (A member standing down because its clock is off takes no work: not counted as firing.)
MEMBERS = """
    SELECT CASE WHEN clock_off THEN 'standing_down' ELSE role END, count(*) FROM schedtui_instances
    WHERE heartbeat_at > least(%(live_after)s::timestamptz,
            %(now)s::timestamptz - make_interval(secs => coalesce(abandon_after, 0)))
        AND (role IS NULL OR role <> 'observer') GROUP BY 1
"""


class PostgresMetrics:
    COMPONENT = Component("metrics", (METRICS_V1,))

    if TYPE_CHECKING:

        async def _with_conn(self, fn: Callable[[Any], Awaitable[T]], *, wait: float = ...) -> T: ...

    async def fleet_snapshot(
        self, names: Sequence[str], *, now: datetime, live_after: datetime, lock_now: datetime | None
    ) -> FleetSnapshot:
        unique = list(dict.fromkeys(names))

        async def read(conn: Any) -> FleetSnapshot:
            async def rows(sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
                return list(await (await conn.execute(sql, params or {})).fetchall())

            schedules = tuple(
                ScheduleFacts(name, enabled, last.astimezone(UTC) if last is not None else None)
                for name, enabled, last in await rows(SCHEDULE_FACTS, {"names": unique})
            )
            jobs = job_counts(await rows(JOB_COUNTS))
            durable = {(function, status): int(n) for function, status, n in await rows(DURABLE_COUNTS)}
            locks = int((await rows(LOCKS_HELD, {"now": lock_now}))[0][0])
            members = member_counts(await rows(MEMBERS, {"live_after": live_after, "now": now}))
            return FleetSnapshot(schedules, jobs, durable, locks, members)

        return await self._with_conn(read)
