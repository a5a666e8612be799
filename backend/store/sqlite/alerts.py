"""Alerts' SQL for the SQLite store (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Writes go through the store's one writer thread, each call in one transaction (so a
transition and its outbox rows commit together, and two claims never interleave); reads
of facts are one statement each, on the indexes the ledger, the queue and durable
executions already have. Times are integer microseconds since the epoch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from backend.alerts.model import Alert
from backend.alerts.store import DeadJobs, Delivery, SlotRun, StuckCandidate, Success, Transition
from backend.safetext import store_text
from backend.store.migrations import Component

__all__ = ["SQLiteAlerts"]

T = TypeVar("T")

ALERTS_V1 = """
    CREATE TABLE alerts (
        key          TEXT PRIMARY KEY,
        condition    TEXT NOT NULL,
        subject_kind TEXT NOT NULL,
        subject      TEXT NOT NULL,
        state        TEXT NOT NULL,
        since        INTEGER NOT NULL,
        summary      TEXT NOT NULL,
        updated_at   INTEGER NOT NULL,
        transition   TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX alerts_by_state ON alerts (state, updated_at);
    CREATE TABLE alert_sinks (
        id      TEXT PRIMARY KEY,
        shown   TEXT NOT NULL,
        seen_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE alert_outbox (
        transition  TEXT NOT NULL,
        sink        TEXT NOT NULL,
        alert_key   TEXT NOT NULL,
        payload     TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        due_at      INTEGER NOT NULL,
        attempts    INTEGER NOT NULL DEFAULT 0,
        claimed_by  TEXT,
        claim       INTEGER NOT NULL DEFAULT 0,
        claim_until INTEGER,
        done_at     INTEGER,
        outcome     TEXT,
        last_error  TEXT,
        PRIMARY KEY (transition, sink)
    ) WITHOUT ROWID;
    CREATE INDEX alert_outbox_due ON alert_outbox (due_at) WHERE done_at IS NULL;
    CREATE TABLE alert_baselines (
        name       TEXT PRIMARY KEY,
        first_seen INTEGER NOT NULL
    ) WITHOUT ROWID
"""
ALERT_COLUMNS = "key, condition, subject_kind, subject, state, since, summary, updated_at, transition"
LIST_FIRING = f"SELECT {ALERT_COLUMNS} FROM alerts WHERE state = 'firing'"
LIST_WITH_RESOLVED = f"SELECT {ALERT_COLUMNS} FROM alerts WHERE state = 'firing' OR updated_at > ?"
#: A transition: written only over another state that was changed before it (an instance
#: that read older facts does not undo a newer transition).
TRANSITION = f"""
    INSERT INTO alerts ({ALERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (key) DO UPDATE SET state = excluded.state, since = excluded.since, summary = excluded.summary,
        updated_at = excluded.updated_at, transition = excluded.transition
    WHERE alerts.state <> excluded.state AND alerts.updated_at < excluded.updated_at
"""
QUEUE_OUTBOX = """
    INSERT INTO alert_outbox (transition, sink, alert_key, payload, created_at, due_at)
    SELECT ?, id, ?, ?, ?, ? FROM alert_sinks WHERE seen_at >= ?
    ON CONFLICT (transition, sink) DO NOTHING
"""
UPDATE_SUMMARY = """
    UPDATE alerts SET summary = ?, updated_at = ?
    WHERE key = ? AND state = 'firing' AND transition = ? AND updated_at < ? AND summary <> ?
"""
REGISTER_SINK = """
    INSERT INTO alert_sinks (id, shown, seen_at) VALUES (?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET shown = excluded.shown, seen_at = max(alert_sinks.seen_at, excluded.seen_at)
"""
CLAIM = """
    UPDATE alert_outbox SET claimed_by = ?, claim = claim + 1, claim_until = ?, attempts = attempts + 1
    WHERE (transition, sink) IN (
        SELECT transition, sink FROM alert_outbox
        WHERE done_at IS NULL AND due_at <= ? AND (claim_until IS NULL OR claim_until <= ?)
            AND sink IN (SELECT value FROM json_each(?))
        ORDER BY due_at, transition LIMIT ?
    )
    RETURNING transition, sink, alert_key, payload, attempts, claim, created_at
"""
DELIVERED = """
    UPDATE alert_outbox SET done_at = ?, outcome = 'delivered', claimed_by = NULL, claim_until = NULL, last_error = NULL
    WHERE transition = ? AND sink = ? AND claim = ? AND done_at IS NULL
"""
RETRY = """
    UPDATE alert_outbox SET due_at = ?, last_error = ?, claimed_by = NULL, claim_until = NULL
    WHERE transition = ? AND sink = ? AND claim = ? AND done_at IS NULL
"""
GIVE_BACK = """
    UPDATE alert_outbox SET claimed_by = NULL, claim_until = NULL, attempts = attempts - 1
    WHERE transition = ? AND sink = ? AND claim = ? AND done_at IS NULL AND claim_until IS NOT NULL
"""
GAVE_UP = """
    UPDATE alert_outbox SET done_at = ?, outcome = 'gave_up', last_error = ?, claimed_by = NULL, claim_until = NULL
    WHERE transition = ? AND sink = ? AND claim = ? AND done_at IS NULL
"""
PRUNE_RESOLVED = "DELETE FROM alerts WHERE state = 'resolved' AND updated_at < ?"
PRUNE_OUTBOX = "DELETE FROM alert_outbox WHERE done_at IS NOT NULL AND done_at < ?"
ABANDON_OUTBOX = """
    UPDATE alert_outbox SET done_at = ?, outcome = 'gave_up', last_error = 'no instance delivers to this sink'
    WHERE done_at IS NULL AND created_at < ? AND (claim_until IS NULL OR claim_until <= ?)
"""
PRUNE_SINKS = "DELETE FROM alert_sinks WHERE seen_at < ?"
ADD_BASELINES = """
    INSERT INTO alert_baselines (name, first_seen) SELECT value, ? FROM json_each(?) WHERE true
    ON CONFLICT (name) DO NOTHING
"""
BASELINES = "SELECT name, first_seen FROM alert_baselines WHERE name IN (SELECT value FROM json_each(?))"
#: Per name, its newest N slot runs that ran to an end (the slot index, walked back).
SLOT_RUNS = """
    SELECT r.name, r.status, r.scheduled_at, r.finished_at, r.error_tag, r.error_message
    FROM json_each(?) AS n JOIN runs AS r ON r.id IN (
        SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual' AND status IN ('succeeded', 'failed')
        ORDER BY scheduled_at DESC, id DESC LIMIT ?
    )
    ORDER BY r.name, r.scheduled_at DESC, r.id DESC
"""
LAST_SUCCESSES = """
    SELECT n.value, r.scheduled_at, r.finished_at FROM json_each(?) AS n JOIN runs AS r ON r.id = (
        SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual' AND status = 'succeeded'
        ORDER BY scheduled_at DESC, id DESC LIMIT 1
    )
"""
LAST_FAILURES = """
    SELECT n.value, f.status, f.scheduled_at, f.finished_at, f.error_tag, f.error_message,
        o.status, o.scheduled_at, o.finished_at, o.error_tag, o.error_message
    FROM json_each(?) AS n
    JOIN runs AS f ON f.id = (
        SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual' AND status = 'failed'
        ORDER BY scheduled_at DESC, id DESC LIMIT 1
    )
    JOIN runs AS o ON o.id = (
        SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual' AND status IN ('succeeded', 'failed')
            AND (scheduled_at, id) > (f.scheduled_at, f.id)
        ORDER BY scheduled_at, id LIMIT 1
    )
"""
DEAD_JOBS = """
    SELECT queue, sum(dead_at >= coalesce((SELECT value FROM json_each(?) WHERE key = queue), ?)), count(*), max(dead_at)
    FROM jobs
    WHERE status = 'dead' AND deleted = 0 GROUP BY queue
"""
STUCK = """
    SELECT id, function, status, CASE status WHEN 'waiting' THEN wake_at ELSE updated_at END AS reference
    FROM durable_executions
    WHERE status IN ('queued', 'running', 'waiting')
        AND CASE status WHEN 'waiting' THEN wake_at ELSE updated_at END < ?
    ORDER BY reference, id LIMIT ?
"""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _us(dt: datetime) -> int:
    return (dt - _EPOCH) // _MICROSECOND


def _dt(us: int) -> datetime:
    return _EPOCH + _MICROSECOND * us


def _alert(row: Sequence[Any]) -> Alert:
    return Alert(
        key=row[0],
        condition=row[1],
        subject_kind=row[2],
        subject=row[3],
        state=row[4],
        since=_dt(row[5]),
        summary=row[6],
        updated_at=_dt(row[7]),
        transition=row[8],
    )


class SQLiteAlerts:
    COMPONENT = Component("alerts", (ALERTS_V1,))

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def list_alerts(self, *, resolved_after: datetime | None = None) -> list[Alert]:
        if resolved_after is None:
            rows = await self._read(lambda c: c.execute(LIST_FIRING).fetchall())
        else:
            after = _us(resolved_after)
            rows = await self._read(lambda c: c.execute(LIST_WITH_RESOLVED, (after,)).fetchall())
        return [_alert(row) for row in rows]

    async def write_transitions(self, transitions: Sequence[Transition], *, sinks_after: datetime) -> list[str]:
        seen = _us(sinks_after)

        def write(conn: sqlite3.Connection) -> list[str]:
            won = []
            for t in transitions:
                a = t.alert
                at = _us(a.updated_at)
                # (A summary quotes what failed, a handler's error among it: escaped as it is
                # on PostgreSQL.)
                row = (a.key, a.condition, a.subject_kind, a.subject, a.state, _us(a.since), store_text(a.summary), at,
                       a.transition)  # fmt: skip
                if conn.execute(TRANSITION, row).rowcount:
                    conn.execute(QUEUE_OUTBOX, (a.transition, a.key, store_text(t.payload), at, at, seen))
                    won.append(a.key)
            return won

        return await self._write(write)

    async def update_summaries(self, alerts: Sequence[Alert]) -> int:
        rows = []
        for a in alerts:
            summary = store_text(a.summary)
            rows.append((summary, _us(a.updated_at), a.key, a.transition, _us(a.updated_at), summary))
        if not rows:
            return 0
        return await self._write(lambda c: int(c.executemany(UPDATE_SUMMARY, rows).rowcount))

    async def register_sinks(self, sinks: Sequence[tuple[str, str]], at: datetime) -> None:
        rows = [(sink, shown, _us(at)) for sink, shown in sinks]
        if rows:
            await self._write(lambda c: c.executemany(REGISTER_SINK, rows))

    async def claim_deliveries(
        self, sinks: Sequence[str], instance: str, now: datetime, until: datetime, limit: int
    ) -> list[Delivery]:
        if not sinks:
            return []
        params = (instance, _us(until), _us(now), _us(now), json.dumps(list(sinks)), limit)
        rows = await self._write(lambda c: c.execute(CLAIM, params).fetchall())
        return [Delivery(r[0], r[1], r[2], r[3], int(r[4]), int(r[5]), _dt(r[6]), until) for r in rows]

    async def finish_delivery(
        self, delivery: Delivery, at: datetime, *, retry_at: datetime | None, error: str | None
    ) -> bool:
        key = (delivery.transition, delivery.sink, delivery.token)
        params: tuple[Any, ...]
        if error is None:
            sql, params = DELIVERED, (_us(at), *key)
        elif retry_at is not None:
            sql, params = RETRY, (_us(retry_at), store_text(error), *key)
        else:
            sql, params = GAVE_UP, (_us(at), store_text(error), *key)
        return bool(await self._write(lambda c: c.execute(sql, params).rowcount))

    async def give_back_deliveries(self, deliveries: Sequence[Delivery]) -> int:
        keys = [(d.transition, d.sink, d.token) for d in deliveries]
        return int(await self._write(lambda c: sum(c.execute(GIVE_BACK, key).rowcount for key in keys)))

    async def prune_alerts(self, before: datetime) -> int:
        cutoff = _us(before)

        def prune(conn: sqlite3.Connection) -> int:
            removed = conn.execute(PRUNE_RESOLVED, (cutoff,)).rowcount
            removed += conn.execute(ABANDON_OUTBOX, (cutoff, cutoff, cutoff)).rowcount
            removed += conn.execute(PRUNE_OUTBOX, (cutoff,)).rowcount
            return int(removed + conn.execute(PRUNE_SINKS, (cutoff,)).rowcount)

        return await self._write(prune)

    async def alert_baselines(self, names: Sequence[str], at: datetime) -> dict[str, datetime]:
        if not names:
            return {}
        listed = json.dumps(list(names))
        await self._write(lambda c: c.execute(ADD_BASELINES, (_us(at), listed)))
        rows = await self._read(lambda c: c.execute(BASELINES, (listed,)).fetchall())
        return {row[0]: _dt(row[1]) for row in rows}

    async def slot_runs(self, names: Sequence[str], newest: int) -> dict[str, list[SlotRun]]:
        if not names:
            return {}
        params = (json.dumps(list(names)), newest)
        rows = await self._read(lambda c: c.execute(SLOT_RUNS, params).fetchall())
        found: dict[str, list[SlotRun]] = {}
        for r in rows:
            found.setdefault(r[0], []).append(SlotRun(r[1], _dt(r[2]), _dt(r[3]) if r[3] is not None else None, r[4], r[5]))
        return found

    async def last_successes(self, names: Sequence[str]) -> dict[str, Success]:
        if not names:
            return {}
        listed = json.dumps(list(names))
        rows = await self._read(lambda c: c.execute(LAST_SUCCESSES, (listed,)).fetchall())
        return {r[0]: Success(_dt(r[1]), _dt(r[2] if r[2] is not None else r[1])) for r in rows}

    async def last_failures(self, names: Sequence[str]) -> dict[str, tuple[SlotRun, SlotRun]]:
        if not names:
            return {}
        listed = json.dumps(list(names))
        rows = await self._read(lambda c: c.execute(LAST_FAILURES, (listed,)).fetchall())
        return {
            r[0]: (SlotRun(r[1], _dt(r[2]), _dt(r[3]) if r[3] is not None else None, r[4], r[5]),
                   SlotRun(r[6], _dt(r[7]), _dt(r[8]) if r[8] is not None else None, r[9], r[10]))
            for r in rows
        }  # fmt: skip

    async def dead_jobs(self, since: Mapping[str, datetime], default: datetime) -> dict[str, DeadJobs]:
        params = (json.dumps({queue: _us(at) for queue, at in since.items()}), _us(default))
        rows = await self._read(lambda c: c.execute(DEAD_JOBS, params).fetchall())
        return {r[0]: DeadJobs(int(r[1] or 0), int(r[2]), _dt(r[3]) if r[3] is not None else None) for r in rows}

    async def stuck_candidates(self, older_than: datetime, limit: int) -> list[StuckCandidate]:
        params = (_us(older_than), limit)
        rows = await self._read(lambda c: c.execute(STUCK, params).fetchall())
        return [StuckCandidate(r[0], r[1], r[2], _dt(r[3])) for r in rows]
