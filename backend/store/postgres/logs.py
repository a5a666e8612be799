"""Per-run logs on PostgreSQL (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

The same rows as on SQLite (see :mod:`backend.store.sqlite.logs`): a batch of logs is one
transaction on a pooled connection (one statement per kind, the rows as a JSON array), off
the ledger's writer; the logs are pruned in ``prune_runs``' transaction and with
``prune_jobs``' statement.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any

from backend.observability.logs import LogTarget, StoredLog
from backend.store.migrations import Component

__all__ = ["PRUNE_JOB_LOGS_CTE", "PRUNE_RUN_LOGS", "PostgresLogs"]

LOGS_V1 = """
    CREATE TABLE schedtui_run_logs (
        run_id        text COLLATE "C" PRIMARY KEY,
        head          text NOT NULL,
        tail          text NOT NULL,
        size          bigint NOT NULL,
        omitted_bytes bigint NOT NULL,
        omitted_lines bigint NOT NULL,
        final         boolean NOT NULL,
        updated_at    timestamptz NOT NULL
    );
    CREATE TABLE schedtui_job_logs (
        job_id        text COLLATE "C" NOT NULL,
        seq           integer NOT NULL,
        attempt       integer NOT NULL,
        head          text NOT NULL,
        tail          text NOT NULL,
        size          bigint NOT NULL,
        omitted_bytes bigint NOT NULL,
        omitted_lines bigint NOT NULL,
        final         boolean NOT NULL,
        updated_at    timestamptz NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE INDEX schedtui_job_logs_by_age ON schedtui_job_logs (updated_at)
"""
_BODY = "head, tail, size, omitted_bytes, omitted_lines, final, updated_at"
_RECORD = "head text, tail text, size bigint, omitted_bytes bigint, omitted_lines bigint, final boolean, updated_at timestamptz"
# A final row is never replaced, nor a row by an older version of itself.
_UPDATE = """
    DO UPDATE SET head = excluded.head, tail = excluded.tail, size = excluded.size,
        omitted_bytes = excluded.omitted_bytes, omitted_lines = excluded.omitted_lines, final = excluded.final,
        updated_at = excluded.updated_at
    WHERE NOT {table}.final AND excluded.size >= {table}.size
"""
SAVE_RUN_LOGS = (
    f"INSERT INTO schedtui_run_logs (run_id, {_BODY}) SELECT run_id, {_BODY} "
    f"FROM json_to_recordset(%s::json) AS r(run_id text, {_RECORD}) ON CONFLICT (run_id) "
    + _UPDATE.format(table="schedtui_run_logs")
)
SAVE_JOB_LOGS = (
    f"INSERT INTO schedtui_job_logs (job_id, seq, attempt, {_BODY}) SELECT job_id, seq, attempt, {_BODY} "
    f"FROM json_to_recordset(%s::json) AS r(job_id text, seq integer, attempt integer, {_RECORD}) "
    "ON CONFLICT (job_id, seq) " + _UPDATE.format(table="schedtui_job_logs")
)
GET_RUN_LOG = f"SELECT run_id, 0, 0, {_BODY} FROM schedtui_run_logs WHERE run_id = %s"
GET_JOB_LOG = f"SELECT job_id, seq, attempt, {_BODY} FROM schedtui_job_logs WHERE job_id = %s ORDER BY seq DESC LIMIT 1"
GET_JOB_CLAIM_LOG = f"SELECT job_id, seq, attempt, {_BODY} FROM schedtui_job_logs WHERE job_id = %s AND seq = %s"
#: After ``PRUNE_RUNS`` (same id floor, same transaction): the logs of the runs it deleted.
PRUNE_RUN_LOGS = """
    DELETE FROM schedtui_run_logs l WHERE l.run_id < %s
        AND NOT EXISTS (SELECT 1 FROM schedtui_runs r WHERE r.id = l.run_id)
"""
#: A CTE of ``prune_jobs``' statement: job attempts' logs last written before the attempts' cut-off.
PRUNE_JOB_LOGS_CTE = "logs AS (DELETE FROM schedtui_job_logs WHERE updated_at < %(attempts)s RETURNING 1)"


def _stored(kind: str, row: Sequence[Any]) -> StoredLog:
    target = LogTarget("run", row[0]) if kind == "run" else LogTarget("job", row[0], row[1], row[2])
    return StoredLog(target, row[3], row[4], int(row[5]), int(row[6]), int(row[7]), bool(row[8]), row[9].astimezone(UTC))


def _body(log: StoredLog) -> dict[str, Any]:
    return {
        "head": log.head, "tail": log.tail, "size": log.size, "omitted_bytes": log.omitted_bytes,
        "omitted_lines": log.omitted_lines, "final": log.final, "updated_at": log.updated_at.isoformat(),
    }  # fmt: skip


class PostgresLogs:
    """The :class:`~backend.observability.logs.LogStore` of the PostgreSQL store."""

    COMPONENT = Component("logs", (LOGS_V1,))

    if TYPE_CHECKING:
        commits: int
        _with_conn: Callable[..., Awaitable[Any]]

        async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

    async def save_logs(self, logs: Sequence[StoredLog]) -> None:
        runs = [{"run_id": log.target.id, **_body(log)} for log in logs if log.target.kind == "run"]
        jobs = [
            {"job_id": log.target.id, "seq": log.target.seq, "attempt": log.target.attempt, **_body(log)}
            for log in logs
            if log.target.kind == "job"
        ]
        if not runs and not jobs:
            return

        async def save(conn: Any) -> None:
            async with conn.transaction():
                if runs:
                    await conn.execute(SAVE_RUN_LOGS, (json.dumps(runs),))
                if jobs:
                    await conn.execute(SAVE_JOB_LOGS, (json.dumps(jobs),))

        await self._with_conn(save)
        self.commits += 1

    async def get_run_log(self, run_id: str) -> StoredLog | None:
        row = await self._fetchone(GET_RUN_LOG, (run_id,))
        return _stored("run", row) if row else None

    async def get_job_log(self, job_id: str, seq: int | None = None) -> StoredLog | None:
        if seq is None:
            row = await self._fetchone(GET_JOB_LOG, (job_id,))
        else:
            row = await self._fetchone(GET_JOB_CLAIM_LOG, (job_id, seq))
        return _stored("job", row) if row else None
