"""Durable executions in the SQLite store: every SQL statement they need, and nothing else.

A mixin of :class:`~backend.store.sqlite.store.SQLiteStore` (see
:class:`backend.durable.store.DurableStore` for the contract). Each method is one
transaction on the store's one writer thread (reads on its reader), so the runner's
conditional writes need no more than the plain statements below: SQLite runs one writer
at a time.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from backend.durable.model import TAG_CANCELLED, Execution, ExecutionLog, ExecutionStatus
from backend.durable.store import (
    EXECUTION_FIELDS,
    LOG_LINES,
    STEP_FIELDS,
    CancelOutcome,
    Claimed,
    ExecutionRow,
    Finish,
    NewExecution,
    Progress,
    Renewal,
    StepRecord,
    Suspend,
    Write,
    execution_from_row,
    failed_steps,
    signals_from_json,
    step_from_row,
    step_view,
)
from backend.events.audit import AuditEntry
from backend.safetext import store_text
from backend.store.migrations import Component
from backend.store.sqlite.audit import append_audit_in
from backend.store.sqlite.batches import delete_in_batches
from backend.store.sqlite.sql import _dt, _us

T = TypeVar("T")

__all__ = ["SQLiteDurable"]

# ---------------------------------------------------------------------------------------
# SQL
# ---------------------------------------------------------------------------------------
COMPONENT = Component(
    "durable",
    (
        """
        CREATE TABLE durable_executions (
            id               TEXT PRIMARY KEY,
            function         TEXT NOT NULL,
            status           TEXT NOT NULL,
            input            TEXT NOT NULL,
            output           TEXT,
            error_tag        TEXT,
            error_message    TEXT,
            failed_step      TEXT,
            schedule         TEXT,
            scheduled_at     INTEGER,
            created_at       INTEGER NOT NULL,
            updated_at       INTEGER NOT NULL,
            finished_at      INTEGER,
            waiting_for      TEXT,
            wake_at          INTEGER,
            awaits           TEXT,
            signals          TEXT NOT NULL DEFAULT '{}',
            instance         TEXT,
            lease            INTEGER NOT NULL DEFAULT 0,
            lease_until      INTEGER,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            step             TEXT
        ) WITHOUT ROWID;
        CREATE INDEX durable_executions_open ON durable_executions (function, status)
            WHERE status IN ('queued', 'running', 'waiting');
        CREATE INDEX durable_executions_by_function ON durable_executions (function, id);
        CREATE INDEX durable_executions_by_status ON durable_executions (status, id);
        CREATE INDEX durable_executions_finished ON durable_executions (finished_at) WHERE finished_at IS NOT NULL;
        CREATE TABLE durable_steps (
            execution_id  TEXT NOT NULL,
            seq           INTEGER NOT NULL,
            name          TEXT NOT NULL,
            kind          TEXT NOT NULL,
            status        TEXT NOT NULL,
            attempt       INTEGER NOT NULL,
            started_at    INTEGER,
            finished_at   INTEGER,
            wake_at       INTEGER,
            output        TEXT,
            error_tag     TEXT,
            error_message TEXT,
            at_most_once  INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (execution_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE durable_logs (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            execution_id TEXT NOT NULL,
            at           INTEGER NOT NULL,
            message      TEXT NOT NULL
        );
        CREATE INDEX durable_logs_by_execution ON durable_logs (execution_id, id)
        """,
    ),
    # The claim that took a running execution, so that a claim whose answer was lost
    # can give back what it took (durable_give_back).
    additions=(
        "ALTER TABLE durable_executions ADD COLUMN claim TEXT",
        # Steps that ran at once (StepRecord.gathered): older releases do not read it.
        "ALTER TABLE durable_steps ADD COLUMN gathered INTEGER NOT NULL DEFAULT 0",
    ),
)

EXECUTION_COLUMNS = ", ".join(EXECUTION_FIELDS)
STEP_COLUMNS = ", ".join(STEP_FIELDS)
#: A new execution: ``queued``, or claimed by the instance that starts it (``running``,
#: lease 1: what a claim would have made of it).
INSERT = """
    INSERT INTO durable_executions (id, function, status, input, schedule, scheduled_at, created_at, updated_at,
        instance, lease, lease_until, claim)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING
"""
RUNNABLE = """
    SELECT id, status, instance FROM durable_executions
    WHERE function IN (SELECT value FROM json_each(?)) AND status IN ('queued', 'running', 'waiting')
        AND (status = 'queued' OR (status = 'waiting' AND wake_at <= ?) OR (status = 'running' AND lease_until <= ?))
    ORDER BY id LIMIT ?
"""
CLAIM = """
    UPDATE durable_executions SET status = 'running', instance = ?, lease = lease + 1, lease_until = ?,
        waiting_for = NULL, wake_at = NULL, awaits = NULL, updated_at = ?, claim = ?
    WHERE id = ?
    RETURNING id, function, input, created_at, lease, cancel_requested, schedule, scheduled_at, signals
"""
STEPS_OF = f"SELECT {STEP_COLUMNS} FROM durable_steps WHERE execution_id = ? ORDER BY seq"
#: The lease condition every write of the runner carries.
HELD = "id = ? AND lease = ? AND status = 'running'"
# A lease's end never moves back (as on PostgreSQL, where two renewals in flight commit in
# either order; here the writer keeps their order, and this keeps the two stores alike).
PROGRESS = (
    f"UPDATE durable_executions SET lease_until = max(ifnull(lease_until, 0), ?), step = coalesce(?, step) WHERE {HELD} "
    "RETURNING cancel_requested"
)
#: A signal received by the wait's deadline makes the wait due at once (the replay takes
#: such a signal, and only such a one); so does a cancellation asked for meanwhile (the next
#: claim finishes it). Signal times are ISO 8601 in UTC to the microsecond: they compare as text.
SUSPEND = f"""
    UPDATE durable_executions SET status = ?, lease_until = NULL, step = coalesce(?, step), updated_at = ?,
        waiting_for = ?, awaits = ?,
        wake_at = CASE WHEN cancel_requested OR (? IS NOT NULL AND json_extract(signals, '$."' || ? || '".at') <= ?)
                       THEN ? ELSE ? END
    WHERE {HELD} RETURNING cancel_requested
"""
FINISH = f"""
    UPDATE durable_executions SET status = ?, output = ?, error_tag = ?, error_message = ?, failed_step = ?,
        finished_at = ?, updated_at = ?, lease_until = NULL, waiting_for = NULL, wake_at = NULL, awaits = NULL,
        cancel_requested = 0, step = coalesce(?, step)
    WHERE {HELD} RETURNING cancel_requested
"""
UPSERT_STEP = f"""
    INSERT INTO durable_steps (execution_id, {STEP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (execution_id, seq) DO UPDATE SET name = excluded.name, kind = excluded.kind,
        status = excluded.status, attempt = excluded.attempt, started_at = excluded.started_at,
        finished_at = excluded.finished_at, wake_at = excluded.wake_at, output = excluded.output,
        error_tag = excluded.error_tag, error_message = excluded.error_message, at_most_once = excluded.at_most_once,
        gathered = excluded.gathered
"""
INSERT_LOG = "INSERT INTO durable_logs (execution_id, at, message) VALUES (?, ?, ?)"
#: After a checkpoint's lines: the execution's lines but the newest ``?2`` (all a reader gets).
TRIM_LOG = """
    DELETE FROM durable_logs WHERE execution_id = ?1 AND id NOT IN (
        SELECT id FROM durable_logs WHERE execution_id = ?1 ORDER BY id DESC LIMIT ?2)
"""
RENEW = f"""
    UPDATE durable_executions SET lease_until = max(ifnull(lease_until, 0), ?) WHERE {HELD} AND instance = ?
    RETURNING id, cancel_requested
"""
OWNERS = "SELECT DISTINCT instance FROM durable_executions WHERE status = 'running' AND lease_until > ?"
EXPIRE = """
    UPDATE durable_executions SET lease_until = ?
    WHERE status = 'running' AND instance = ? AND lease_until > ? AND (? IS NULL OR updated_at < ?)
"""
#: What a claim took and nobody runs (its answer was lost): its lease ends now. Only while
#: that claim's lease is the execution's (its claim, its lease's end, still running).
GIVE_BACK = """
    UPDATE durable_executions SET lease_until = ?
    WHERE claim = ? AND instance = ? AND status = 'running' AND lease_until = ?
"""
STATE = "SELECT status, awaits, signals, lease_until FROM durable_executions WHERE id = ?"
SIGNAL = """
    UPDATE durable_executions SET signals = json_set(signals, '$."' || ? || '"', json_object('p', json(?), 'at', ?)),
        wake_at = CASE WHEN status = 'waiting' AND awaits = ? THEN ? ELSE wake_at END
    WHERE id = ?
"""
CANCEL_NOW = f"""
    UPDATE durable_executions SET status = 'cancelled', finished_at = ?, updated_at = ?, error_tag = '{TAG_CANCELLED}',
        error_message = ?, cancel_requested = 0, waiting_for = NULL, wake_at = NULL, awaits = NULL, lease_until = NULL
    WHERE id = ?
"""
CANCEL_ASK = "UPDATE durable_executions SET cancel_requested = 1 WHERE id = ?"
FAILED_STEP = "SELECT status, failed_step FROM durable_executions WHERE id = ?"
REQUEUE = """
    UPDATE durable_executions SET status = 'queued', output = NULL, error_tag = NULL, error_message = NULL,
        failed_step = NULL, finished_at = NULL, updated_at = ?, cancel_requested = 0
    WHERE id = ?
"""
# A retry forgets the failed steps' checkpoints so that they run again: never a succeeded one.
FORGET_STEP = "DELETE FROM durable_steps WHERE execution_id = ? AND name = ? AND status <> 'succeeded'"
GET = f"SELECT {EXECUTION_COLUMNS} FROM durable_executions WHERE id = ?"
#: The newest lines of an execution's log, oldest first, with their ids (a reader's place in it).
LOGS_OF = """
    SELECT id, at, message FROM (
        SELECT id, at, message FROM durable_logs WHERE execution_id = ? ORDER BY id DESC LIMIT ?
    ) ORDER BY id
"""
STALE = """
    SELECT function, count(*) FROM durable_executions
    WHERE status IN ('queued', 'running', 'waiting') AND (
        (status = 'queued' AND updated_at < ?) OR (status = 'waiting' AND wake_at < ?)
        OR (status = 'running' AND lease_until < ?))
    GROUP BY function ORDER BY function
"""
#: A batch of the executions the retention removes (see :mod:`.batches`), then each one's rows.
PRUNE_BATCH_OF = "SELECT id FROM durable_executions WHERE finished_at < ? LIMIT ?"
DROP_EXECUTION = [
    "DELETE FROM durable_steps WHERE execution_id = ?",
    "DELETE FROM durable_logs WHERE execution_id = ?",
    "DELETE FROM durable_executions WHERE id = ?",
]

FINISHED_SQL = ("succeeded", "failed", "cancelled")

# ---------------------------------------------------------------------------------------


def _list_sql(function: str | None, status: str | None, before: str | None) -> tuple[str, list[Any]]:
    where, params = [], []
    for column, value in (("function", function), ("status", status)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if before is not None:
        where.append("id < ?")
        params.append(before)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {EXECUTION_COLUMNS} FROM durable_executions {clause} ORDER BY id DESC LIMIT ?", params


class SQLiteDurable:
    """The durable-execution tables and statements of the SQLite store."""

    COMPONENT = COMPONENT

    if TYPE_CHECKING:  # provided by SQLiteStore

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def durable_insert(
        self,
        execution: NewExecution,
        *,
        claim: tuple[str, datetime] | None = None,
        audit: AuditEntry | None = None,
        log: str | None = None,
    ) -> bool:
        instance, until = claim if claim is not None else (None, None)
        params = (
            execution.id,
            execution.function,
            "queued" if claim is None else "running",
            store_text(execution.input),
            execution.schedule,
            _us(execution.scheduled_at),
            _us(execution.created_at),
            _us(execution.created_at),
            instance,
            0 if claim is None else 1,
            _us(until),
            None if claim is None else execution.id,  # (the claim of a start claimed where it is made)
        )

        def insert(c: sqlite3.Connection) -> bool:
            if c.execute(INSERT, params).rowcount != 1:
                return False
            if audit is not None:  # in the same transaction
                append_audit_in(c, audit)
            if log is not None:
                c.execute(INSERT_LOG, (execution.id, _us(execution.created_at), store_text(log)))
            return True

        return await self._write(insert)

    async def durable_claim(
        self, instance: str, functions: Sequence[str], now: datetime, lease_until: datetime, limit: int,
        claim: str | None = None,
    ) -> list[Claimed]:
        names, at, until = json.dumps(list(functions)), _us(now), _us(lease_until)

        def take(c: sqlite3.Connection) -> list[Claimed]:
            claimed = []
            for id_, was, was_instance in c.execute(RUNNABLE, (names, at, at, limit)).fetchall():
                row = c.execute(CLAIM, (instance, until, at, claim, id_)).fetchone()
                signals = signals_from_json(json.loads(row[8]))
                steps = [step_from_row(r, _dt) for r in c.execute(STEPS_OF, (id_,)).fetchall()]
                execution = ExecutionRow(
                    id=row[0],
                    function=row[1],
                    input=row[2],
                    created_at=_dt(row[3]),  # type: ignore[arg-type]
                    lease=int(row[4]),
                    cancel_requested=bool(row[5]),
                    schedule=row[6],
                    scheduled_at=_dt(row[7]),
                    was=was,
                    was_instance=was_instance,
                )
                claimed.append(Claimed(execution, steps, signals))
            return claimed

        return await self._write(take)

    async def durable_give_back(self, instance: str, claim: str, lease_until: datetime, now: datetime) -> int:
        params = (_us(now), claim, instance, _us(lease_until))
        return await self._write(lambda c: int(c.execute(GIVE_BACK, params).rowcount))

    async def durable_write(self, write: Write) -> bool | None:
        # What a handler made (its steps' errors and results, its log lines) is written as
        # the PostgreSQL store writes it: a lone surrogate, which SQLite cannot encode, would
        # fail the execution as a UnicodeEncodeError instead of with its own error. (Step
        # names need nothing: run.py takes printable ones only.)
        now = _us(write.now)
        then = write.then
        held = (write.id, write.lease)
        params: tuple[Any, ...]
        if isinstance(then, Progress):
            sql, params = PROGRESS, (_us(then.lease_until), then.step, *held)
        elif isinstance(then, Suspend):
            wake = _us(then.wake_at)
            deadline = _iso(then.wake_at)
            params = (then.status, then.step, now, then.waiting_for, then.signal, then.signal, then.signal, deadline, now, wake,
                      *held)  # fmt: skip
            sql = SUSPEND
        else:
            assert isinstance(then, Finish)
            sql = FINISH
            params = (
                then.status, store_text(then.output), store_text(then.error_tag), store_text(then.error_message),
                then.failed_step, now, now, then.step, *held,
            )  # fmt: skip
        steps = [(write.id, *_step_params(step)) for step in write.steps]
        logs = [(write.id, now, store_text(message)) for message in write.logs]

        def apply(c: sqlite3.Connection) -> bool | None:
            row = c.execute(sql, params).fetchone()
            if row is None:
                return None
            if steps:
                c.executemany(UPSERT_STEP, steps)
            if logs:
                c.executemany(INSERT_LOG, logs)
                c.execute(TRIM_LOG, (write.id, LOG_LINES))
            return bool(row[0])

        return await self._write(apply)

    async def durable_renew(self, instance: str, leases: Sequence[tuple[str, int]], lease_until: datetime) -> Renewal:
        until = _us(lease_until)

        def renew(c: sqlite3.Connection) -> Renewal:
            result = Renewal()
            for id_, lease in leases:
                row = c.execute(RENEW, (until, id_, lease, instance)).fetchone()
                if row is None:
                    result.lost.add(id_)
                elif row[1]:
                    result.cancel.add(id_)
            return result

        return await self._write(renew)

    async def durable_owners(self, now: datetime) -> set[str]:
        rows = await self._read(lambda c: c.execute(OWNERS, (_us(now),)).fetchall())
        return {row[0] for row in rows}

    async def durable_expire(self, instance: str, now: datetime, claimed_before: datetime | None = None) -> int:
        before = _us(claimed_before)
        params = (_us(now), instance, _us(now), before, before)
        return await self._write(lambda c: int(c.execute(EXPIRE, params).rowcount))

    async def durable_signal(self, id: str, name: str, payload: str, now: datetime) -> tuple[ExecutionStatus, bool] | None:
        at = _us(now)

        def signal(c: sqlite3.Connection) -> tuple[ExecutionStatus, bool] | None:
            row = c.execute(STATE, (id,)).fetchone()
            if row is None:
                return None
            status, _, signals, _ = row
            if status in FINISHED_SQL:
                return status, False
            if name in json.loads(signals):
                return status, True
            c.execute(SIGNAL, (name, store_text(payload), _iso(now), name, at, id))
            c.execute(INSERT_LOG, (id, at, f"signal {name} received"))
            return status, False

        return await self._write(signal)

    async def durable_cancel(self, id: str, now: datetime, note: str) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
        at, note = _us(now), store_text(note)

        def cancel(c: sqlite3.Connection) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
            row = c.execute(STATE, (id,)).fetchone()
            if row is None:
                return None
            status, _, _, lease_until = row
            if status in FINISHED_SQL:
                return status, None
            if status == "running" and lease_until is not None and lease_until > at:
                c.execute(CANCEL_ASK, (id,))
                c.execute(INSERT_LOG, (id, at, f"{note}: asked to stop at its next step"))
                return status, "requested"
            c.execute(CANCEL_NOW, (at, at, note, id))
            c.execute(INSERT_LOG, (id, at, note))
            return status, "cancelled"

        return await self._write(cancel)

    async def durable_retry(self, id: str, now: datetime, note: str) -> ExecutionStatus | None:
        at, note = _us(now), store_text(note)

        def retry(c: sqlite3.Connection) -> ExecutionStatus | None:
            row = c.execute(FAILED_STEP, (id,)).fetchone()
            if row is None:
                return None
            status, failed_step = row
            if status != "failed":
                return status  # type: ignore[no-any-return]
            if failed_step is not None:
                c.executemany(FORGET_STEP, [(id, name) for name in failed_steps(failed_step)])
            c.execute(REQUEUE, (at, id))
            c.execute(INSERT_LOG, (id, at, note))
            return "failed"

        return await self._write(retry)

    async def durable_get(self, id: str) -> Execution | None:
        def get(c: sqlite3.Connection) -> Execution | None:
            row = c.execute(GET, (id,)).fetchone()
            if row is None:
                return None
            steps = [step_view(step_from_row(r, _dt)) for r in c.execute(STEPS_OF, (id,)).fetchall()]
            logs = [ExecutionLog(_dt(at), message) for _, at, message in c.execute(LOGS_OF, (id, LOG_LINES)).fetchall()]  # type: ignore[arg-type]
            execution = execution_from_row(row, _dt)
            return replace(execution, steps=steps, logs=logs)

        return await self._read(get)

    async def durable_log_lines(self, id: str, after: int) -> tuple[list[tuple[int, ExecutionLog]], int | None]:
        """An execution's log as :meth:`durable_get` gives it, each line with its id (ids
        grow with each line written); and how many of its lines with an id above ``after``
        are older than these: 0, or ``None`` when some may have been (the older lines are
        deleted as newer ones come, and their ids are the whole store's)."""
        rows = await self._read(lambda c: c.execute(LOGS_OF, (id, LOG_LINES)).fetchall())
        lines = [(row[0], ExecutionLog(_dt(row[1]), row[2])) for row in rows]  # type: ignore[arg-type]
        # Fewer than a window's worth: none was ever deleted (a checkpoint keeps the newest
        # LOG_LINES). Otherwise none is older than the first kept above ``after`` only when
        # the reader read up to that line's predecessor in the store, or past it.
        if len(lines) < LOG_LINES or after >= lines[0][0] - 1:
            return lines, 0
        return lines, None

    async def durable_list(
        self, *, function: str | None, status: str | None, limit: int, before: str | None
    ) -> list[Execution]:
        sql, params = _list_sql(function, status, before)
        # Parsed on the reading thread: a page of large inputs and outputs would hold the engine's loop.
        found: list[Execution] = await self._read(
            lambda c: [execution_from_row(row, _dt) for row in c.execute(sql, (*params, limit)).fetchall()]
        )
        return found

    async def durable_stale(self, since: datetime, now: datetime) -> dict[str, int]:
        at = _us(since)
        rows = await self._read(lambda c: c.execute(STALE, (at, at, at)).fetchall())
        return {row[0]: int(row[1]) for row in rows}

    async def durable_prune(self, finished_before: datetime) -> int:
        at = _us(finished_before)

        def prune(c: sqlite3.Connection, batch: int) -> int:
            ids = c.execute(PRUNE_BATCH_OF, (at, batch)).fetchall()
            for sql in DROP_EXECUTION:
                c.executemany(sql, ids)
            return len(ids)

        return await delete_in_batches(self._write, prune)


def _step_params(step: StepRecord) -> tuple[Any, ...]:
    return (
        step.seq,
        step.name,
        step.kind,
        step.status,
        step.attempt,
        _us(step.started_at),
        _us(step.finished_at),
        _us(step.wake_at),
        store_text(step.output),
        store_text(step.error_tag),
        store_text(step.error_message),
        int(step.at_most_once),
        int(step.gathered),
    )


def _iso(dt: datetime | None) -> str | None:
    """A signal's time as its JSON keeps it: UTC, to the microsecond (so texts compare as times)."""
    return None if dt is None else dt.astimezone(UTC).isoformat(timespec="microseconds")


