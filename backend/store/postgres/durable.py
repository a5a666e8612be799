"""Durable executions in the PostgreSQL store: every SQL statement they need, and nothing else.

A mixin of :class:`~backend.store.postgres.store.PostgresStore` (see
:class:`backend.durable.store.DurableStore` for the contract). What the runner does on its
hot path is one statement each, so one round trip and one commit:

* a claim takes runnable executions with ``FOR UPDATE SKIP LOCKED`` (concurrent claimers
  skip each other's rows instead of waiting), bumps each one's lease number, and returns
  each with its step checkpoints and signals: the replay reads nothing else;
* a write updates the execution under its lease and upserts the step rows and log lines
  in data-modifying CTEs that only act if that update matched; the update returns whether
  a cancellation was asked for, so no extra read is needed. A finished step with nothing
  else to write (nearly every one) takes the lean form, on a connection of its own when
  that is free (:mod:`.lane`): the step row inserted from the execution's row read and
  locked under its lease (not updated: no new version of the row per step), positional
  parameters, no JSON.

Signals live in the execution's row (a JSON object), so a signal and a runner suspending
to wait for it update the same row: PostgreSQL orders the two, and whichever comes second
sees the first (a wait is never left waiting for a signal that has arrived).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
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
from backend.safetext import store_text as _text
from backend.store import store_unavailable
from backend.store.migrations import Component
from backend.store.postgres.audit import APPEND_AUDIT_FROM, audit_params
from backend.store.postgres.lane import Lane, LaneFailed

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.pq.abc import PGresult

    from backend.events.audit import AuditEntry

T = TypeVar("T")

__all__ = ["PostgresDurable"]

# ---------------------------------------------------------------------------------------
# SQL
# ---------------------------------------------------------------------------------------
COMPONENT = Component(
    "durable",
    (
        """
        CREATE TABLE schedtui_durable_executions (
            id               text COLLATE "C" PRIMARY KEY,
            function         text NOT NULL,
            status           text NOT NULL,
            input            text NOT NULL,
            output           text,
            error_tag        text,
            error_message    text,
            failed_step      text,
            schedule         text,
            scheduled_at     timestamptz,
            created_at       timestamptz NOT NULL,
            updated_at       timestamptz NOT NULL,
            finished_at      timestamptz,
            waiting_for      text,
            wake_at          timestamptz,
            awaits           text,
            signals          jsonb NOT NULL DEFAULT '{}',
            instance         text,
            lease            bigint NOT NULL DEFAULT 0,
            lease_until      timestamptz,
            cancel_requested boolean NOT NULL DEFAULT false,
            step             text
        );
        CREATE INDEX schedtui_durable_open ON schedtui_durable_executions (function, status)
            WHERE status IN ('queued', 'running', 'waiting');
        CREATE INDEX schedtui_durable_by_function ON schedtui_durable_executions (function, id);
        CREATE INDEX schedtui_durable_by_status ON schedtui_durable_executions (status, id);
        CREATE INDEX schedtui_durable_finished ON schedtui_durable_executions (finished_at)
            WHERE finished_at IS NOT NULL;
        CREATE TABLE schedtui_durable_steps (
            execution_id  text COLLATE "C" NOT NULL,
            seq           integer NOT NULL,
            name          text NOT NULL,
            kind          text NOT NULL,
            status        text NOT NULL,
            attempt       integer NOT NULL,
            started_at    timestamptz,
            finished_at   timestamptz,
            wake_at       timestamptz,
            output        text,
            error_tag     text,
            error_message text,
            at_most_once  boolean NOT NULL DEFAULT false,
            PRIMARY KEY (execution_id, seq)
        );
        CREATE TABLE schedtui_durable_logs (
            id           bigserial PRIMARY KEY,
            execution_id text COLLATE "C" NOT NULL,
            at           timestamptz NOT NULL,
            message      text NOT NULL
        );
        CREATE INDEX schedtui_durable_logs_by_execution ON schedtui_durable_logs (execution_id, id)
        """,
    ),
    # The claim that took a running execution, so that a claim whose answer was lost
    # can give back what it took (durable_give_back).
    additions=(
        "ALTER TABLE schedtui_durable_executions ADD COLUMN claim text",
        # Steps that ran at once (StepRecord.gathered): older releases do not read it.
        "ALTER TABLE schedtui_durable_steps ADD COLUMN gathered boolean NOT NULL DEFAULT false",
    ),
)

EXECUTIONS = "schedtui_durable_executions"
#: A step's checkpoint leaves the execution's row as it is (see CHECKPOINT): the step a
#: running execution is at is its newest checkpoint's (the one a write set otherwise).
CURRENT_STEP = """CASE WHEN x.status = 'running' THEN coalesce((
    SELECT s.name FROM schedtui_durable_steps s WHERE s.execution_id = x.id ORDER BY s.seq DESC LIMIT 1), x.step)
    ELSE x.step END"""
EXECUTION_COLUMNS = ", ".join(CURRENT_STEP if f == "step" else f"x.{f}" for f in EXECUTION_FIELDS)
STEP_COLUMNS = ", ".join(STEP_FIELDS)

#: A new execution: ``queued``, or claimed by the instance that starts it (``running``,
#: lease 1: what a claim would have made of it); with the audit entry of the start and a
#: line of its log, each if there is one, only if the execution was inserted. Positional
#: parameters: it also goes through the checkpoints' connection (:mod:`.lane`).
INSERT = f"""
    WITH x AS (
        INSERT INTO {EXECUTIONS} (id, function, status, input, schedule, scheduled_at, created_at, updated_at,
            instance, lease, lease_until, claim)
        SELECT v.id, v.function, v.status, v.input, v.schedule, v.scheduled_at, v.created, v.created, v.instance,
            v.lease, v.until, CASE WHEN v.lease = 1 THEN v.id END
        FROM (VALUES (%s::text, %s::text, %s::text, %s::text, %s::text, %s::timestamptz, %s::timestamptz, %s::text,
            %s::bigint, %s::timestamptz)) AS v(id, function, status, input, schedule, scheduled_at, created, instance,
            lease, until)
        ON CONFLICT (id) DO NOTHING RETURNING id, created_at
    ),
    a AS ({APPEND_AUDIT_FROM.format(source="x")}),
    l AS (
        INSERT INTO schedtui_durable_logs (execution_id, at, message)
        SELECT x.id, x.created_at, m.message FROM x, (VALUES (%s::text)) AS m(message) WHERE m.message IS NOT NULL
    )
    SELECT count(*) FROM x
"""
#: Whether an execution is the one a start made at its creation (it may have run since).
MADE = f"SELECT 1 FROM {EXECUTIONS} WHERE id = %s AND created_at = %s"
#: Whether an execution is the one a start claimed for ``instance`` at its creation.
MINE = f"""
    SELECT 1 FROM {EXECUTIONS} WHERE id = %s AND instance = %s AND lease = 1 AND status = 'running' AND created_at = %s
"""
CLAIM = f"""
    WITH picked AS (
        SELECT id, status AS was, instance AS was_instance FROM {EXECUTIONS}
        WHERE function = ANY (%(functions)s) AND status IN ('queued', 'running', 'waiting')
            AND (status = 'queued' OR (status = 'waiting' AND wake_at <= %(now)s)
                 OR (status = 'running' AND lease_until <= %(now)s))
        ORDER BY id LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE {EXECUTIONS} e SET status = 'running', instance = %(instance)s, lease = e.lease + 1,
            lease_until = %(until)s, waiting_for = NULL, wake_at = NULL, awaits = NULL, updated_at = %(now)s,
            claim = %(claim)s
        FROM picked p WHERE e.id = p.id
        RETURNING e.id, e.function, e.input, e.created_at, e.lease, e.cancel_requested, e.schedule,
            e.scheduled_at, e.signals, p.was, p.was_instance
    )
    SELECT c.* FROM claimed c ORDER BY c.id
"""
#: The steps of the executions a claim took, read by a statement of its own once the claim
#: has committed. Read in the claim statement's snapshot, they missed a checkpoint under
#: the displaced lease that committed after that snapshot was taken and before the claim
#: locked the row (a checkpoint locks the row FOR SHARE, it does not update it, so nothing
#: made the claim look again), and the finished step could run again. A checkpoint under
#: that lease either committed before the claim's lock (this read sees it) or is fenced
#: out. If this read fails, the claim raises: what it took waits out its lease, as after a
#: claim whose answer was lost.
CLAIMED_STEPS = f"""
    SELECT s.execution_id, json_agg(json_build_array({", ".join(f"s.{f}" for f in STEP_FIELDS)}) ORDER BY s.seq)
    FROM schedtui_durable_steps s WHERE s.execution_id = ANY (%s) GROUP BY s.execution_id
"""
#: The lease condition every write of the runner carries.
HELD = "id = %(id)s AND lease = %(lease)s AND status = 'running'"
#: A step's row written again (a retry, an at-most-once step's end).
_STEP_UPDATE = """name = excluded.name, kind = excluded.kind,
        status = excluded.status, attempt = excluded.attempt, started_at = excluded.started_at,
        finished_at = excluded.finished_at, wake_at = excluded.wake_at, output = excluded.output,
        error_tag = excluded.error_tag, error_message = excluded.error_message,
        at_most_once = excluded.at_most_once, gathered = excluded.gathered"""
#: What a write does besides updating the execution ("e"), only if that update matched.
_AND_STEPS_AND_LOGS = f""",
    s AS (
        INSERT INTO schedtui_durable_steps (execution_id, {STEP_COLUMNS})
        SELECT %(id)s, r.* FROM json_to_recordset(%(steps)s::json) AS r(
            seq integer, name text, kind text, status text, attempt integer, started_at timestamptz,
            finished_at timestamptz, wake_at timestamptz, output text, error_tag text, error_message text,
            at_most_once boolean, gathered boolean)
        WHERE EXISTS (SELECT 1 FROM e)
        ON CONFLICT (execution_id, seq) DO UPDATE SET {_STEP_UPDATE}
    ),
    l AS (
        INSERT INTO schedtui_durable_logs (execution_id, at, message)
        SELECT %(id)s, %(now)s, m FROM json_array_elements_text(%(logs)s::json) AS m
        WHERE EXISTS (SELECT 1 FROM e)
    )
    SELECT cancel_requested FROM e
"""
PROGRESS = f"""
    WITH e AS (
        UPDATE {EXECUTIONS} SET lease_until = greatest(lease_until, %(until)s), step = coalesce(%(step)s, step)
        WHERE {HELD} RETURNING cancel_requested
    )""" + _AND_STEPS_AND_LOGS
#: A finished step and nothing else, the general form (and every checkpoint's fallback):
#: the step's upsert, inserted from the execution's row read under its lease (so nothing
#: when the lease is not held). The row is locked (FOR SHARE: every other write of it
#: waits, a claim skips it), not updated: no new version of it per step. Its lease is
#: renewed by the executor's own renewals, and the step it is at is read from its newest
#: checkpoint (CURRENT_STEP). It returns whether a cancellation was asked for.
CHECKPOINT = f"""
    WITH e AS (
        SELECT id, cancel_requested FROM {EXECUTIONS} WHERE id = %s AND lease = %s AND status = 'running' FOR SHARE
    )
    INSERT INTO schedtui_durable_steps (execution_id, {STEP_COLUMNS})
    SELECT e.id, %s::integer, %s::text, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz,
        %s::timestamptz, %s::text, %s::text, %s::text, %s::boolean, %s::boolean FROM e
    ON CONFLICT (execution_id, seq) DO UPDATE SET {_STEP_UPDATE}
    RETURNING (SELECT cancel_requested FROM e)
"""
#: The hot path, the same fence without the CTE or its RETURNING (about 10 µs less of a
#: round trip that is otherwise one commit): the step's columns first, then the execution's
#: id and lease. It inserts nothing, besides under a lost lease, when a cancellation was
#: asked for: the caller then runs CHECKPOINT, which writes the step and says so.
#: ``CHECKPOINT_FIRST`` is a step's first attempt, which has no row yet: a plain insert (a
#: row there after all fails it, and CHECKPOINT runs on the pool instead).
_CHECKPOINT_LEAN = f"""
    INSERT INTO schedtui_durable_steps (execution_id, {STEP_COLUMNS})
    SELECT e.id, %s::integer, %s::text, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz,
        %s::timestamptz, %s::text, %s::text, %s::text, %s::boolean, %s::boolean
    FROM {EXECUTIONS} e WHERE e.id = %s AND e.lease = %s AND e.status = 'running' AND NOT e.cancel_requested
    FOR SHARE OF e
"""
CHECKPOINT_FIRST = _CHECKPOINT_LEAN
CHECKPOINT_AGAIN = _CHECKPOINT_LEAN + f"ON CONFLICT (execution_id, seq) DO UPDATE SET {_STEP_UPDATE}\n"
#: Progress without steps or logs: only the update.
PROGRESS_ONLY = f"""
    UPDATE {EXECUTIONS} SET lease_until = greatest(lease_until, %(until)s), step = coalesce(%(step)s, step)
    WHERE {HELD} RETURNING cancel_requested
"""
#: A signal received by the wait's deadline makes the wait due at once (the replay takes
#: such a signal, and only such a one); so does a cancellation asked for meanwhile (the next
#: claim finishes it).
SUSPEND = f"""
    WITH e AS (
        UPDATE {EXECUTIONS} SET status = %(status)s, lease_until = NULL, step = coalesce(%(step)s, step),
            updated_at = %(now)s, waiting_for = %(waiting_for)s, awaits = %(signal)s,
            wake_at = CASE WHEN cancel_requested OR (
                    %(signal)s::text IS NOT NULL
                    AND (signals -> %(signal)s::text ->> 'at')::timestamptz <= %(wake)s::timestamptz)
                THEN %(now)s ELSE %(wake)s END
        WHERE {HELD} RETURNING cancel_requested
    )""" + _AND_STEPS_AND_LOGS
#: An execution's end with nothing to write but one line of its log (nearly every end):
#: positional parameters, no JSON; it also goes through the checkpoints' connection.
FINISH_LEAN = f"""
    WITH e AS (
        UPDATE {EXECUTIONS} x SET status = %s, output = %s, error_tag = %s, error_message = %s, failed_step = %s,
            step = coalesce(%s, x.step), finished_at = t.now, updated_at = t.now, lease_until = NULL,
            waiting_for = NULL, wake_at = NULL, awaits = NULL, cancel_requested = false
        FROM (VALUES (%s::timestamptz)) AS t(now)
        WHERE x.id = %s AND x.lease = %s AND x.status = 'running' RETURNING x.id, x.cancel_requested, t.now
    ),
    l AS (
        INSERT INTO schedtui_durable_logs (execution_id, at, message)
        SELECT e.id, e.now, m.message FROM e, (VALUES (%s::text)) AS m(message)
    )
    SELECT cancel_requested FROM e
"""
FINISH = f"""
    WITH e AS (
        UPDATE {EXECUTIONS} SET status = %(status)s, output = %(output)s, error_tag = %(error_tag)s,
            error_message = %(error_message)s, failed_step = %(failed_step)s, finished_at = %(now)s,
            updated_at = %(now)s, lease_until = NULL, waiting_for = NULL, wake_at = NULL, awaits = NULL,
            cancel_requested = false, step = coalesce(%(step)s, step)
        WHERE {HELD} RETURNING cancel_requested
    )""" + _AND_STEPS_AND_LOGS
#: Whether a write whose answer was lost landed (see PostgresDurable._landed): the execution
#: under the write's lease, its status and last change, and whether a log line carries the
#: write's instant (a progress writes its lines at it, and changes nothing else it can show).
LANDED = f"""
    SELECT e.status, e.updated_at, e.cancel_requested,
        EXISTS (SELECT 1 FROM schedtui_durable_logs l WHERE l.execution_id = e.id AND l.at = %(now)s)
    FROM {EXECUTIONS} e WHERE e.id = %(id)s AND e.lease = %(lease)s
"""
#: A lease's end never moves back (here, in PROGRESS and PROGRESS_ONLY): two renewals in
#: flight on two connections commit in either order, and the older one's end, landing
#: last, cut short a lease its owner counts as held to the newer one's (its held_until
#: only grows).
RENEW = f"""
    UPDATE {EXECUTIONS} e SET lease_until = greatest(e.lease_until, %(until)s)
    FROM json_to_recordset(%(leases)s::json) AS l(id text, lease bigint)
    WHERE e.id = l.id AND e.lease = l.lease AND e.status = 'running' AND e.instance = %(instance)s
    RETURNING e.id, e.cancel_requested
"""
#: What a claim took and nobody runs (its answer was lost): its lease ends now. Only while
#: that claim's lease is the execution's (its claim, its lease's end, still running).
GIVE_BACK = f"""
    UPDATE {EXECUTIONS} SET lease_until = %s
    WHERE claim = %s AND instance = %s AND status = 'running' AND lease_until = %s
"""
OWNERS = f"SELECT DISTINCT instance FROM {EXECUTIONS} WHERE status = 'running' AND lease_until > %s"
EXPIRE = f"""
    UPDATE {EXECUTIONS} SET lease_until = %s
    WHERE status = 'running' AND instance = %s AND lease_until > %s
        AND (%s::timestamptz IS NULL OR updated_at < %s::timestamptz)
"""
#: The status is read from the row locked (FOR UPDATE re-reads it once another write of it,
#: an end on its way, has committed): read in the statement's snapshot, a signal that waited
#: for the end was not taken, and was answered a duplicate of a signal never kept.
#: A signal's payload kept as its text ("t": jsonb keeps a value, not its text) and as a
#: value ("p": what the release before reads). Cast to text first: the one parameter is
#: typed by its first cast, and a jsonb parameter cast to text is jsonb's text again.
SIGNAL = f"""
    WITH found AS (SELECT status FROM {EXECUTIONS} WHERE id = %(id)s FOR UPDATE),
    taken AS (
        UPDATE {EXECUTIONS}
        SET signals = signals || jsonb_build_object(
                %(name)s::text, jsonb_build_object('t', %(payload)s::text, 'p', %(payload)s::text::jsonb, 'at', %(sent)s::text)),
            wake_at = CASE WHEN status = 'waiting' AND awaits = %(name)s THEN %(now)s ELSE wake_at END
        WHERE id = %(id)s AND status NOT IN ('succeeded', 'failed', 'cancelled') AND NOT signals ? %(name)s::text
        RETURNING id
    ),
    logged AS (
        INSERT INTO schedtui_durable_logs (execution_id, at, message)
        SELECT id, %(now)s, 'signal ' || %(name)s || ' received' FROM taken
    )
    SELECT (SELECT status FROM found), EXISTS (SELECT 1 FROM taken)
"""
#: Whether a signal whose answer was lost was kept: the execution's status, and whether the
#: signal of that name is this one (sent at that instant, with that payload).
SIGNAL_LANDED = f"""
    SELECT status, coalesce(signals -> %(name)s::text ->> 'at' = %(sent)s
        AND signals -> %(name)s::text ->> 't' = %(payload)s::text, false)
    FROM {EXECUTIONS} WHERE id = %(id)s
"""
LOCK_STATE = f"SELECT status, lease_until, failed_step FROM {EXECUTIONS} WHERE id = %s FOR UPDATE"
CANCEL_NOW = f"""
    UPDATE {EXECUTIONS} SET status = 'cancelled', finished_at = %s, updated_at = %s, error_tag = '{TAG_CANCELLED}',
        error_message = %s, cancel_requested = false, waiting_for = NULL, wake_at = NULL, awaits = NULL,
        lease_until = NULL
    WHERE id = %s
"""
CANCEL_ASK = f"UPDATE {EXECUTIONS} SET cancel_requested = true WHERE id = %s"
REQUEUE = f"""
    UPDATE {EXECUTIONS} SET status = 'queued', output = NULL, error_tag = NULL, error_message = NULL,
        failed_step = NULL, finished_at = NULL, updated_at = %s, cancel_requested = false
    WHERE id = %s
"""
# A retry forgets the failed steps' checkpoints so that they run again: never a succeeded one.
FORGET_STEPS = "DELETE FROM schedtui_durable_steps WHERE execution_id = %s AND name = ANY (%s) AND status <> 'succeeded'"
INSERT_LOG = "INSERT INTO schedtui_durable_logs (execution_id, at, message) VALUES (%s, %s, %s)"
#: Which of an operator's log lines (one of ``messages`` at its instant) an execution holds:
#: a cancel's or a retry's own doing, whose answer was lost (see ``PostgresDurable._done``).
LOGGED = "SELECT message FROM schedtui_durable_logs WHERE execution_id = %s AND at = %s AND message = ANY (%s::text[])"
#: What an execution a cancel ended at once was, as near as its row tells (the cancel
#: cleared its wait and its lease): waiting if a step of it still waits, queued if no
#: instance ever took it, running (its lease run out) otherwise.
CANCELLED_WAS = f"""
    SELECT CASE WHEN EXISTS (SELECT 1 FROM schedtui_durable_steps s WHERE s.execution_id = x.id AND s.status = 'waiting')
        THEN 'waiting' WHEN x.instance IS NULL THEN 'queued' ELSE 'running' END
    FROM {EXECUTIONS} x WHERE x.id = %s
"""
GET = f"SELECT {EXECUTION_COLUMNS} FROM {EXECUTIONS} x WHERE id = %s"
STEPS_OF = f"SELECT {STEP_COLUMNS} FROM schedtui_durable_steps WHERE execution_id = %s ORDER BY seq"
#: The newest lines of an execution's log, oldest first, with their ids (a reader's place in it).
LOGS_OF = """
    SELECT id, at, message FROM (
        SELECT id, at, message FROM schedtui_durable_logs WHERE execution_id = %s ORDER BY id DESC LIMIT %s
    ) l ORDER BY id
"""
#: How many lines of an execution's log lie between two ids (the older lines are kept).
LOG_BETWEEN = "SELECT count(*) FROM schedtui_durable_logs WHERE execution_id = %s AND id > %s AND id < %s"
STALE = f"""
    SELECT function, count(*) FROM {EXECUTIONS}
    WHERE status IN ('queued', 'running', 'waiting') AND (
        (status = 'queued' AND updated_at < %(since)s) OR (status = 'waiting' AND wake_at < %(since)s)
        OR (status = 'running' AND lease_until < %(since)s))
    GROUP BY function ORDER BY function
"""
PRUNE = f"""
    WITH gone AS (DELETE FROM {EXECUTIONS} WHERE finished_at < %(before)s RETURNING id),
    steps AS (DELETE FROM schedtui_durable_steps WHERE execution_id IN (SELECT id FROM gone)),
    logs AS (DELETE FROM schedtui_durable_logs WHERE execution_id IN (SELECT id FROM gone))
    SELECT count(*) FROM gone
"""


# ---------------------------------------------------------------------------------------


def _list_sql(function: str | None, status: str | None, before: str | None) -> tuple[str, list[Any]]:
    where, params = [], []
    for column, value in (("function", function), ("status", status)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    if before is not None:
        where.append("id < %s")
        params.append(before)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {EXECUTION_COLUMNS} FROM {EXECUTIONS} x {clause} ORDER BY id DESC LIMIT %s", params


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # a time inside a JSON document
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()




def _utf8(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


#: A ``timestamptz`` in the server's binary form: microseconds since 2000-01-01 UTC, a
#: big-endian int64 (a quarter of ``isoformat()``'s cost here, and no parsing there).
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_int64 = struct.Struct("!q").pack


def _when(value: datetime | None) -> bytes | None:
    return None if value is None else _int64((value - _PG_EPOCH) // _MICROSECOND)


#: The hot checkpoint's parameter formats: its three timestamps binary (see _when).
_CHECKPOINT_FORMATS = (0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)


def _lane_text(value: Any) -> bytes | None:
    """A parameter as the lane sends it: PostgreSQL's text for it."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return b"%d" % value
    assert isinstance(value, datetime), value
    return value.isoformat().encode()


def _steps_json(steps: Sequence[StepRecord]) -> str:
    return json.dumps(
        [
            {
                "seq": s.seq,
                "name": s.name,
                "kind": s.kind,
                "status": s.status,
                "attempt": s.attempt,
                "started_at": _iso(s.started_at),
                "finished_at": _iso(s.finished_at),
                "wake_at": _iso(s.wake_at),
                "output": s.output,
                "error_tag": _text(s.error_tag),
                "error_message": _text(s.error_message),
                "at_most_once": s.at_most_once,
                "gathered": s.gathered,
            }
            for s in steps
        ],
        separators=(",", ":"),
    )


class PostgresDurable:
    """The durable-execution tables and statements of the PostgreSQL store."""

    COMPONENT = COMPONENT
    _lane_key: tuple[str, int, bytes, bytes] = ("", -1, b"", b"")
    """The execution and lease of the last checkpoint on the lane, and their text."""

    if TYPE_CHECKING:  # provided by PostgresStore
        commits: int
        where: str
        _conninfo: str
        _checkpoints: Lane | None
        _conn_trouble: tuple[str, datetime] | None

        @staticmethod
        async def _configure(conn: AsyncConnection[Any]) -> None: ...

        def _store_answered(self) -> None: ...

        async def _with_conn(self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], *, wait: float = ...) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

        async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

        async def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int: ...

        async def _again(
            self, first: Callable[[AsyncConnection[Any]], Awaitable[T]], again: Callable[[AsyncConnection[Any]], Awaitable[T]]
        ) -> T: ...

    def _checkpoint_lane(self) -> Lane:
        """The connection kept for checkpoints (made when the store opens, connected when
        first used)."""
        statements = {"again": CHECKPOINT_AGAIN, "first": CHECKPOINT_FIRST, "start": INSERT, "finish": FINISH_LEAN}
        return Lane(self._conninfo, "schedtui_durable", statements, self._configure)

    async def _on_lane(self, key: str, params: Sequence[Any], *, connect: bool = True) -> PGresult | None:
        """Run a statement of the lane on it when it is free (``None`` otherwise, or when it
        failed: the caller runs the same statement on the pool). ``connect``: connect the
        lane (in the background) if it is not."""
        lane = self._checkpoints
        if lane is None or not lane.available(connect):
            return None
        try:
            result = await lane.call(key, [_lane_text(value) for value in params])
        except LaneFailed:
            return None  # unknown whether it took effect: every lane statement may run again
        self._lane_answered()
        return result

    def _lane_answered(self) -> None:
        self.commits += 1
        self._conn_trouble = None
        self._store_answered()

    async def _fetch_write(
        self,
        sql: str,
        params: Sequence[Any] | dict[str, Any],
        *,
        again: Callable[[AsyncConnection[Any]], Awaitable[list[tuple[Any, ...]]]] | None = None,
        sent: bool = False,
    ) -> list[tuple[Any, ...]]:
        """One statement that writes (its own transaction, one commit); its rows. ``again``
        runs instead when it is sent a second time after a connection lost with it in flight
        (see :meth:`_landed`); ``sent``: it was sent once already (on the lane)."""
        runs = 1 if sent else 0

        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            nonlocal runs
            runs += 1
            if runs > 1 and again is not None:
                return await again(conn)
            return await (await conn.execute(sql, params)).fetchall()

        rows = await self._with_conn(go)
        self.commits += 1
        return rows

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
            execution.id, execution.function, "queued" if claim is None else "running", _text(execution.input),
            execution.schedule, execution.scheduled_at, execution.created_at, instance, 0 if claim is None else 1, until,
            *audit_params(audit), _text(log),
        )  # fmt: skip
        # (only once this process's executor has connected the lane: a process that only
        # starts executions, a command line's, has no use for a connection of its own)
        lane = self._checkpoints
        tried = lane is not None and lane.available(connect=False)
        if tried:
            result = await self._on_lane("start", params)
            if result is not None:
                return result.get_value(0, 0) == b"1"

        async def again(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            # A sending before this one (the lane's, or the pool's on a connection that broke)
            # may have committed, its answer lost: the row found is then this very start's,
            # which was answered a duplicate (not launched, nobody woken: a claimed one waited
            # out its lease). Its own is the one made at its creation (and claimed for this
            # instance, when it claims).
            rows: list[tuple[Any, ...]] = await (await conn.execute(INSERT, params)).fetchall()
            if rows[0][0]:
                return rows
            own = (MINE, (execution.id, instance, execution.created_at)) if claim else (MADE, (execution.id, execution.created_at))
            return [(1,)] if await (await conn.execute(*own)).fetchone() is not None else rows

        rows = await self._fetch_write(INSERT, params, again=again, sent=tried)
        return bool(rows[0][0])

    async def durable_claim(
        self, instance: str, functions: Sequence[str], now: datetime, lease_until: datetime, limit: int,
        claim: str | None = None,
    ) -> list[Claimed]:
        params = {"functions": list(functions), "now": now, "until": lease_until, "limit": limit, "instance": instance,
                  "claim": claim}  # fmt: skip
        claimed = []

        async def lost(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            # Sent again, it would take more, and leave what the first took (if it committed)
            # running under this instance, run by nobody, until its lease ran out: failed, it
            # is given back by its claim id at the executor's next round.
            raise store_unavailable(self.where, "{store} lost the answer of a claim, which may have committed")

        rows = await self._fetch_write(CLAIM, params, again=lost if claim is not None else None)
        steps_of = dict(await self._fetchall(CLAIMED_STEPS, ([row[0] for row in rows],))) if rows else {}
        for row in rows:
            execution = ExecutionRow(
                id=row[0],
                function=row[1],
                input=row[2],
                created_at=_utc(row[3]),  # type: ignore[arg-type]
                lease=int(row[4]),
                cancel_requested=bool(row[5]),
                schedule=row[6],
                scheduled_at=_utc(row[7]),
                was=row[9],
                was_instance=row[10],
            )
            signals = signals_from_json(row[8] or {})
            steps = [step_from_row(step, _utc) for step in steps_of.get(row[0]) or ()]
            claimed.append(Claimed(execution, steps, signals))
        return claimed

    def durable_write(self, write: Write) -> Coroutine[Any, Any, bool | None]:
        then = write.then
        if type(then) is Progress and len(write.steps) == 1 and not write.logs and then.step is not None:
            return self._checkpoint(write, write.steps[0])  # (its coroutine: awaited without one more)
        return self._write(write)

    async def _write(self, write: Write) -> bool | None:
        then = write.then
        params: dict[str, Any] = {"id": write.id, "lease": write.lease, "now": write.now, "step": then.step}
        if isinstance(then, Progress):
            params["until"] = then.lease_until
            sql = PROGRESS if write.steps or write.logs else PROGRESS_ONLY
        elif isinstance(then, Suspend):
            params.update(status=then.status, waiting_for=then.waiting_for, signal=then.signal, wake=then.wake_at)
            sql = SUSPEND
        else:
            assert isinstance(then, Finish)
            if not write.steps and len(write.logs) == 1:
                return await self._finish(write, then)
            params.update(
                status=then.status,
                output=_text(then.output),
                error_tag=_text(then.error_tag),
                error_message=_text(then.error_message),
                failed_step=then.failed_step,
            )
            sql = FINISH
        if sql is not PROGRESS_ONLY:
            params["steps"] = _steps_json(write.steps)
            params["logs"] = json.dumps([_text(line) for line in write.logs])
        rows = await self._fetch_write(sql, params, again=None if sql is PROGRESS_ONLY else self._landed(write, sql, params))
        return bool(rows[0][0]) if rows else None

    def _landed(
        self, write: Write, sql: str, params: Sequence[Any] | dict[str, Any]
    ) -> Callable[[AsyncConnection[Any]], Awaitable[list[tuple[Any, ...]]]]:
        """What runs in place of a write sent again after its answer was lost (the connection
        broke with it in flight: it may have committed). Run again as it is, a progress would
        write its log lines twice, and a wait or an end that landed would find the execution
        no longer running and answer that its lease was lost. It looks first: landed, it
        answers as the write did; if not, the write runs."""
        status = None if isinstance(write.then, Progress) else write.then.status

        async def again(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            row = await (await conn.execute(LANDED, {"id": write.id, "lease": write.lease, "now": write.now})).fetchone()
            if row is not None:
                current, changed, cancel, logged = row
                if status is not None and current == status and changed == write.now:
                    return [(cancel,)]
                if status is None and current == "running" and logged and write.logs:
                    return [(cancel,)]
            return await (await conn.execute(sql, params)).fetchall()

        return again

    async def _checkpoint(self, write: Write, s: StepRecord) -> bool | None:
        lane = self._checkpoints
        if lane is not None and lane.available():
            # Its own connection, the statement prepared on it, the parameters as text:
            # about half the client's CPU of the same statement through the pool. A first
            # attempt has no row yet: a plain insert.
            key = self._lane_key
            if key[0] != write.id or key[1] != write.lease:  # (the same execution step after step)
                key = self._lane_key = (write.id, write.lease, write.id.encode(), b"%d" % write.lease)
            wake, tag, message = s.wake_at, s.error_tag, s.error_message
            try:
                result = await lane.call("first" if s.attempt == 1 and not s.at_most_once else "again", (
                    b"%d" % s.seq, s.name.encode(), s.kind.encode(), s.status.encode(),
                    b"%d" % s.attempt, _when(s.started_at), _when(s.finished_at), _when(wake),
                    _utf8(_text(s.output)), None if tag is None else _utf8(_text(tag)),
                    None if message is None else _utf8(_text(message)), b"t" if s.at_most_once else b"f",
                    b"t" if s.gathered else b"f", key[2], key[3],
                ), _CHECKPOINT_FORMATS)  # fmt: skip
            except LaneFailed:
                pass  # unknown whether it took effect (or a row was there): the upsert, on the pool
            else:
                self._lane_answered()
                if result.command_tuples:
                    return False
                # Nothing written: the lease is lost, or a cancellation was asked for (the
                # step is written all the same, and the code stops at its next boundary).
        params = (
            write.id, write.lease, s.seq, s.name, s.kind, s.status, s.attempt, s.started_at, s.finished_at, s.wake_at,
            _text(s.output), _text(s.error_tag), _text(s.error_message), s.at_most_once, s.gathered,
        )  # fmt: skip
        rows = await self._fetch_write(CHECKPOINT, params)
        return bool(rows[0][0]) if rows else None

    async def _finish(self, write: Write, then: Finish) -> bool | None:
        params = (
            then.status, _text(then.output), _text(then.error_tag), _text(then.error_message), then.failed_step,
            then.step, write.now, write.id, write.lease, _text(write.logs[0]),
        )  # fmt: skip
        lane = self._checkpoints
        sent = lane is not None and lane.available()
        result = await self._on_lane("finish", params)
        if result is not None:
            return None if result.ntuples == 0 else result.get_value(0, 0) == b"t"
        rows = await self._fetch_write(FINISH_LEAN, params, again=self._landed(write, FINISH_LEAN, params), sent=sent)
        return bool(rows[0][0]) if rows else None

    async def durable_renew(self, instance: str, leases: Sequence[tuple[str, int]], lease_until: datetime) -> Renewal:
        if not leases:
            return Renewal()
        payload = json.dumps([{"id": id_, "lease": lease} for id_, lease in leases])
        rows = await self._fetch_write(RENEW, {"until": lease_until, "leases": payload, "instance": instance})
        kept = {row[0] for row in rows}
        return Renewal(lost={id_ for id_, _ in leases} - kept, cancel={row[0] for row in rows if row[1]})

    async def durable_owners(self, now: datetime) -> set[str]:
        return {row[0] for row in await self._fetchall(OWNERS, (now,))}

    async def durable_expire(self, instance: str, now: datetime, claimed_before: datetime | None = None) -> int:
        return await self._execute(EXPIRE, (now, instance, now, claimed_before, claimed_before))

    async def durable_give_back(self, instance: str, claim: str, lease_until: datetime, now: datetime) -> int:
        return await self._execute(GIVE_BACK, (now, claim, instance, lease_until))

    async def durable_signal(self, id: str, name: str, payload: str, now: datetime) -> tuple[ExecutionStatus, bool] | None:
        sent = now.astimezone(UTC).isoformat(timespec="microseconds")
        params = {"id": id, "name": name, "payload": _text(payload), "now": now, "sent": sent}

        async def again(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            # Sent again after its answer was lost, a signal that was kept finds itself, and
            # was answered a duplicate (or refused, its execution woken by it and ended since).
            row = await (await conn.execute(SIGNAL_LANDED, params)).fetchone()
            if row is not None and row[1]:
                return [("running" if row[0] in ("succeeded", "failed", "cancelled") else row[0], True)]
            return await (await conn.execute(SIGNAL, params)).fetchall()

        rows = await self._fetch_write(SIGNAL, params, again=again)
        status, taken = rows[0]
        if status is None:
            return None
        return status, not taken and status not in ("succeeded", "failed", "cancelled")

    # An operator's cancel or retry whose answer was lost (the connection broke with it in
    # flight, after its commit) is sent again by the store (see ``_again``): sent as it was,
    # a cancel found the execution ended by itself and answered "nothing to cancel" (a
    # requested one, still running, wrote its line again), and a retry found it queued and
    # answered "only a failed execution can be retried". Sent again, each looks first for
    # its own log line (the execution, its instant, its note): found, it answers as it did.
    async def durable_cancel(self, id: str, now: datetime, note: str) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
        note = _text(note)
        asked = f"{note}: asked to stop at its next step"

        async def cancel(conn: AsyncConnection[Any], *, look: bool = False) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
            async with conn.transaction():
                row = await (await conn.execute(LOCK_STATE, (id,))).fetchone()
                if row is None:
                    return None
                status, lease_until, _ = row
                if look and (done := await self._done(conn, id, now, note, asked)) is not None:
                    if done == asked:
                        return "running", "requested"
                    return await self._cancelled_was(conn, id), "cancelled"
                if status in ("succeeded", "failed", "cancelled"):
                    return status, None
                if status == "running" and lease_until is not None and lease_until > now:
                    await conn.execute(CANCEL_ASK, (id,))
                    await conn.execute(INSERT_LOG, (id, now, asked))
                    return status, "requested"
                await conn.execute(CANCEL_NOW, (now, now, note, id))
                await conn.execute(INSERT_LOG, (id, now, note))
                return status, "cancelled"

        async def again(conn: AsyncConnection[Any]) -> tuple[ExecutionStatus, CancelOutcome | None] | None:
            return await cancel(conn, look=True)

        return await self._again(cancel, again)

    async def durable_retry(self, id: str, now: datetime, note: str) -> ExecutionStatus | None:
        note = _text(note)

        async def retry(conn: AsyncConnection[Any], *, look: bool = False) -> ExecutionStatus | None:
            async with conn.transaction():
                row = await (await conn.execute(LOCK_STATE, (id,))).fetchone()
                if row is None:
                    return None
                status, _, failed_step = row
                if look and await self._done(conn, id, now, note) is not None:
                    return "failed"
                if status != "failed":
                    return status  # type: ignore[no-any-return]
                if failed_step is not None:
                    await conn.execute(FORGET_STEPS, (id, failed_steps(failed_step)))
                await conn.execute(REQUEUE, (now, id))
                await conn.execute(INSERT_LOG, (id, now, note))
                return "failed"

        async def again(conn: AsyncConnection[Any]) -> ExecutionStatus | None:
            return await retry(conn, look=True)

        return await self._again(retry, again)

    @staticmethod
    async def _done(conn: AsyncConnection[Any], id: str, now: datetime, *lines: str) -> str | None:
        """Which of an operator's ``lines`` at ``now`` the execution's log holds: its own
        doing, by a sending before whose answer was lost (only it writes that line at that
        instant, to the microsecond)."""
        row = await (await conn.execute(LOGGED, (id, now, list(lines)))).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    async def _cancelled_was(conn: AsyncConnection[Any], id: str) -> ExecutionStatus:
        """What an execution that a lost cancel ended at once was (see CANCELLED_WAS): the
        audit entry's ``was``, which the row no longer holds."""
        row = await (await conn.execute(CANCELLED_WAS, (id,))).fetchone()
        return "queued" if row is None else row[0]

    async def durable_get(self, id: str) -> Execution | None:
        async def get(conn: AsyncConnection[Any]) -> Execution | None:
            row = await (await conn.execute(GET, (id,))).fetchone()
            if row is None:
                return None
            steps = await (await conn.execute(STEPS_OF, (id,))).fetchall()
            logs = await (await conn.execute(LOGS_OF, (id, LOG_LINES))).fetchall()
            return replace(
                execution_from_row(row, _utc),
                steps=[step_view(step_from_row(s, _utc)) for s in steps],
                logs=[ExecutionLog(_utc(at), message) for _, at, message in logs],  # type: ignore[arg-type]
            )

        return await self._with_conn(get)

    async def durable_log_lines(self, id: str, after: int) -> tuple[list[tuple[int, ExecutionLog]], int | None]:
        """An execution's log as :meth:`durable_get` gives it, each line with its id (ids
        grow with each line written); and how many of its lines with an id above ``after``
        are older than these (they are kept: counted)."""

        async def read(conn: AsyncConnection[Any]) -> tuple[list[tuple[int, ExecutionLog]], int | None]:
            rows = await (await conn.execute(LOGS_OF, (id, LOG_LINES))).fetchall()
            lines = [(int(row[0]), ExecutionLog(_utc(row[1]), row[2])) for row in rows]  # type: ignore[arg-type]
            if len(lines) < LOG_LINES or after >= lines[0][0] - 1:
                return lines, 0
            row = await (await conn.execute(LOG_BETWEEN, (id, after, lines[0][0]))).fetchone()
            return lines, int(row[0]) if row else 0

        return await self._with_conn(read)

    async def durable_list(
        self, *, function: str | None, status: str | None, limit: int, before: str | None
    ) -> list[Execution]:
        sql, params = _list_sql(function, status, before)
        return [execution_from_row(row, _utc) for row in await self._fetchall(sql, (*params, limit))]

    async def durable_stale(self, since: datetime, now: datetime) -> dict[str, int]:
        return {row[0]: int(row[1]) for row in await self._fetchall(STALE, {"since": since})}

    async def durable_prune(self, finished_before: datetime) -> int:
        rows = await self._fetch_write(PRUNE, {"before": finished_before})
        return int(rows[0][0]) if rows else 0
