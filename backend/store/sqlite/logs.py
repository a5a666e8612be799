"""Per-run logs on SQLite (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

A run's log is a row keyed by the run's id, a job attempt's by the job's id and its claim
number. A batch of logs is one transaction of the store's writer. Logs go with what they
belong to: :data:`DROP_RUN_LOG` runs in each of ``prune_runs``' transactions, after the
runs (a run still ``running`` keeps its log), and :data:`PRUNE_JOB_LOGS` in ``prune_jobs``', by
the attempts' cut-off.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from backend.observability.logs import LogTarget, StoredLog
from backend.safetext import store_text
from backend.store.migrations import Component
from backend.store.sqlite.sql import _dt, _us

__all__ = ["DROP_RUN_LOG", "PRUNE_JOB_LOGS", "PRUNE_RUN_LOGS", "SQLiteLogs"]

T = TypeVar("T")

LOGS_V1 = """
    CREATE TABLE run_logs (
        run_id        TEXT PRIMARY KEY,
        head          TEXT NOT NULL,
        tail          TEXT NOT NULL,
        size          INTEGER NOT NULL,
        omitted_bytes INTEGER NOT NULL,
        omitted_lines INTEGER NOT NULL,
        final         INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL
    );
    CREATE TABLE job_logs (
        job_id        TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        attempt       INTEGER NOT NULL,
        head          TEXT NOT NULL,
        tail          TEXT NOT NULL,
        size          INTEGER NOT NULL,
        omitted_bytes INTEGER NOT NULL,
        omitted_lines INTEGER NOT NULL,
        final         INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE INDEX job_logs_by_age ON job_logs (updated_at)
"""
_BODY = "head, tail, size, omitted_bytes, omitted_lines, final, updated_at"
# A final row is never replaced, nor a row by an older version of itself.
_UPDATE = """
    DO UPDATE SET head = excluded.head, tail = excluded.tail, size = excluded.size,
        omitted_bytes = excluded.omitted_bytes, omitted_lines = excluded.omitted_lines, final = excluded.final,
        updated_at = excluded.updated_at
    WHERE NOT {table}.final AND excluded.size >= {table}.size
"""
SAVE_RUN_LOG = f"INSERT INTO run_logs (run_id, {_BODY}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) " + _UPDATE.format(
    table="run_logs"
)
SAVE_JOB_LOG = (
    f"INSERT INTO job_logs (job_id, seq, attempt, {_BODY}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id, seq) " + _UPDATE.format(table="job_logs")
)
GET_RUN_LOG = f"SELECT run_id, 0, 0, {_BODY} FROM run_logs WHERE run_id = ?"
GET_JOB_LOG = f"SELECT job_id, seq, attempt, {_BODY} FROM job_logs WHERE job_id = ? ORDER BY seq DESC LIMIT 1"
GET_JOB_CLAIM_LOG = f"SELECT job_id, seq, attempt, {_BODY} FROM job_logs WHERE job_id = ? AND seq = ?"
#: In ``PRUNE_RUNS``' transaction: the log of each run it deleted.
DROP_RUN_LOG = "DELETE FROM run_logs WHERE run_id = ?"
#: At the end of a sweep (same id floor): any other log whose run is gone.
PRUNE_RUN_LOGS = "DELETE FROM run_logs WHERE run_id < ? AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = run_logs.run_id)"
#: With ``PRUNE_ATTEMPTS`` (same cut-off): job attempts' logs last written before it.
PRUNE_JOB_LOGS = "DELETE FROM job_logs WHERE (job_id, seq) IN (SELECT job_id, seq FROM job_logs WHERE updated_at < ? LIMIT ?)"


def _stored(kind: str, row: Sequence[Any]) -> StoredLog:
    updated = _dt(row[9])
    assert updated is not None
    target = LogTarget("run", row[0]) if kind == "run" else LogTarget("job", row[0], row[1], row[2])
    return StoredLog(target, row[3], row[4], row[5], row[6], row[7], bool(row[8]), updated)


def _body(log: StoredLog) -> tuple[Any, ...]:
    # (The capture writes no NUL and no lone surrogate: escaping here changes nothing, but a
    # log that held one must not fail the batch, every other run's log with it.)
    return (store_text(log.head), store_text(log.tail), log.size, log.omitted_bytes, log.omitted_lines, int(log.final),
            _us(log.updated_at))  # fmt: skip


class SQLiteLogs:
    """The :class:`~backend.observability.logs.LogStore` of the SQLite store."""

    COMPONENT = Component("logs", (LOGS_V1,))

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def save_logs(self, logs: Sequence[StoredLog]) -> None:
        runs = [(log.target.id, *_body(log)) for log in logs if log.target.kind == "run"]
        jobs = [(log.target.id, log.target.seq, log.target.attempt, *_body(log)) for log in logs if log.target.kind == "job"]

        def save(c: sqlite3.Connection) -> None:
            if runs:
                c.executemany(SAVE_RUN_LOG, runs)
            if jobs:
                c.executemany(SAVE_JOB_LOG, jobs)

        if runs or jobs:
            await self._write(save)

    async def get_run_log(self, run_id: str) -> StoredLog | None:
        row = await self._read(lambda c: c.execute(GET_RUN_LOG, (run_id,)).fetchone())
        return _stored("run", row) if row else None

    async def get_job_log(self, job_id: str, seq: int | None = None) -> StoredLog | None:
        if seq is None:
            row = await self._read(lambda c: c.execute(GET_JOB_LOG, (job_id,)).fetchone())
        else:
            row = await self._read(lambda c: c.execute(GET_JOB_CLAIM_LOG, (job_id, seq)).fetchone())
        return _stored("job", row) if row else None
