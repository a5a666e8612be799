"""Alerts' SQL for the PostgreSQL store (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

* **Transitions**: one statement for a round's transitions. A data-modifying CTE upserts
  each alert only over another state changed before it (``ON CONFLICT … DO UPDATE …
  WHERE``), and inserts the outbox rows of exactly the rows it changed: instances writing
  the same transition at once serialise on the alert's row, and the second finds the
  condition false, so one transition makes one set of outbox rows.
* **Claims**: due outbox rows are taken ``FOR UPDATE SKIP LOCKED`` and marked with the
  claimer, a lease and a new claim number, in one statement: concurrent claimers skip each
  other's rows, and a row whose lease ran out (its claimer died) is due again.
* **Facts**: one statement each, per name a lateral read on the ledger's slot index.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from backend.alerts.model import Alert
from backend.alerts.store import DeadJobs, Delivery, SlotRun, StuckCandidate, Success, Transition
from backend.store.migrations import Component

__all__ = ["PostgresAlerts"]

T = TypeVar("T")

ALERTS_V1 = """
    CREATE TABLE schedtui_alerts (
        key          text PRIMARY KEY,
        condition    text NOT NULL,
        subject_kind text NOT NULL,
        subject      text NOT NULL,
        state        text NOT NULL,
        since        timestamptz NOT NULL,
        summary      text NOT NULL,
        updated_at   timestamptz NOT NULL,
        transition   text COLLATE "C" NOT NULL
    );
    CREATE INDEX schedtui_alerts_by_state ON schedtui_alerts (state, updated_at);
    CREATE TABLE schedtui_alert_sinks (
        id      text PRIMARY KEY,
        shown   text NOT NULL,
        seen_at timestamptz NOT NULL
    );
    CREATE TABLE schedtui_alert_outbox (
        transition  text COLLATE "C" NOT NULL,
        sink        text NOT NULL,
        alert_key   text NOT NULL,
        payload     text NOT NULL,
        created_at  timestamptz NOT NULL,
        due_at      timestamptz NOT NULL,
        attempts    integer NOT NULL DEFAULT 0,
        claimed_by  text,
        claim       bigint NOT NULL DEFAULT 0,
        claim_until timestamptz,
        done_at     timestamptz,
        outcome     text,
        last_error  text,
        PRIMARY KEY (transition, sink)
    );
    CREATE INDEX schedtui_alert_outbox_due ON schedtui_alert_outbox (due_at) WHERE done_at IS NULL;
    CREATE TABLE schedtui_alert_baselines (
        name       text PRIMARY KEY,
        first_seen timestamptz NOT NULL
    )
"""
ALERT_COLUMNS = "key, condition, subject_kind, subject, state, since, summary, updated_at, transition"
LIST_FIRING = f"SELECT {ALERT_COLUMNS} FROM schedtui_alerts WHERE state = 'firing'"
LIST_WITH_RESOLVED = f"SELECT {ALERT_COLUMNS} FROM schedtui_alerts WHERE state = 'firing' OR updated_at > %s"
TRANSITIONS = f"""
    WITH t AS (
        SELECT * FROM json_to_recordset(%(rows)s::json) AS t(
            key text, condition text, subject_kind text, subject text, state text, since timestamptz,
            summary text, updated_at timestamptz, transition text, payload text)
    ),
    changed AS (
        INSERT INTO schedtui_alerts ({ALERT_COLUMNS})
        SELECT {ALERT_COLUMNS} FROM t ORDER BY key
        ON CONFLICT (key) DO UPDATE SET state = excluded.state, since = excluded.since, summary = excluded.summary,
            updated_at = excluded.updated_at, transition = excluded.transition
        WHERE schedtui_alerts.state <> excluded.state AND schedtui_alerts.updated_at < excluded.updated_at
        RETURNING key, transition
    ),
    queued AS (
        INSERT INTO schedtui_alert_outbox (transition, sink, alert_key, payload, created_at, due_at)
        SELECT c.transition, s.id, c.key, t.payload, t.updated_at, t.updated_at
        FROM changed c JOIN t ON t.key = c.key CROSS JOIN schedtui_alert_sinks s
        WHERE s.seen_at >= %(sinks_after)s
        ON CONFLICT (transition, sink) DO NOTHING
    )
    SELECT key FROM changed
    UNION ALL  -- written by a sending of this very statement before (its answer lost): won too
    SELECT a.key FROM schedtui_alerts a JOIN t ON a.key = t.key AND a.transition = t.transition
"""
UPDATE_SUMMARIES = """
    UPDATE schedtui_alerts a SET summary = u.summary, updated_at = u.updated_at
    FROM json_to_recordset(%s::json) AS u(key text, summary text, updated_at timestamptz, transition text)
    WHERE a.key = u.key AND a.state = 'firing' AND a.transition = u.transition AND a.updated_at < u.updated_at
        AND a.summary <> u.summary
"""
REGISTER_SINKS = """
    INSERT INTO schedtui_alert_sinks (id, shown, seen_at)
    SELECT id, shown, %(at)s FROM json_to_recordset(%(sinks)s::json) AS s(id text, shown text) ORDER BY id
    ON CONFLICT (id) DO UPDATE SET shown = excluded.shown,
        seen_at = greatest(schedtui_alert_sinks.seen_at, excluded.seen_at)
    RETURNING id
"""
CLAIM = """
    WITH picked AS (
        SELECT transition, sink FROM schedtui_alert_outbox
        WHERE done_at IS NULL AND due_at <= %(now)s AND (claim_until IS NULL OR claim_until <= %(now)s)
            AND sink = ANY (%(sinks)s)
        ORDER BY due_at, transition LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE schedtui_alert_outbox o SET claimed_by = %(instance)s, claim = o.claim + 1, claim_until = %(until)s,
        attempts = o.attempts + 1
    FROM picked p WHERE o.transition = p.transition AND o.sink = p.sink
    RETURNING o.transition, o.sink, o.alert_key, o.payload, o.attempts, o.claim, o.created_at
"""
#: What a claim took, found by its lease's end and claimer (the same call's): the store sends
#: the claim again on a fresh connection when its connection broke with it in flight, and
#: the first sending may have committed, its answer lost. Sent again as it was, it found
#: those rows leased and took others or none: they waited out the lease, their pages a
#: lease late, an attempt spent for nothing.
CLAIMED_BEFORE = """
    SELECT transition, sink, alert_key, payload, attempts, claim, created_at FROM schedtui_alert_outbox
    WHERE claimed_by = %(instance)s AND claim_until = %(until)s AND done_at IS NULL AND sink = ANY (%(sinks)s)
    ORDER BY due_at, transition
"""
_HELD = "transition = %s AND sink = %s AND claim = %s AND done_at IS NULL"
#: An outcome recorded under the claim, or recorded so by a sending of the same statement
#: before (its answer lost: sent again, it found its row done and answered "not recorded",
#: so the delivery was logged as perhaps sent again by another instance, and neither its
#: ``alert.notified`` nor its ``alert.notify_failed`` entry was written). Only the claim's
#: holder records under it, once.
_HELD_OR_DONE = (
    "transition = %s AND sink = %s AND claim = %s AND (done_at IS NULL OR (done_at = %s AND outcome = {outcome}))"
)
DELIVERED = f"""
    UPDATE schedtui_alert_outbox SET done_at = %s, outcome = 'delivered', claimed_by = NULL, claim_until = NULL,
        last_error = NULL
    WHERE {_HELD_OR_DONE.format(outcome="'delivered'")}
"""
RETRY = f"UPDATE schedtui_alert_outbox SET due_at = %s, last_error = %s, claimed_by = NULL, claim_until = NULL WHERE {_HELD}"
GAVE_UP = f"""
    UPDATE schedtui_alert_outbox SET done_at = %s, outcome = 'gave_up', last_error = %s, claimed_by = NULL,
        claim_until = NULL
    WHERE {_HELD_OR_DONE.format(outcome="'gave_up'")}
"""
GIVE_BACK = f"""
    UPDATE schedtui_alert_outbox SET claimed_by = NULL, claim_until = NULL, attempts = attempts - 1
    WHERE {_HELD} AND claim_until IS NOT NULL
"""
PRUNE = """
    WITH resolved AS (DELETE FROM schedtui_alerts WHERE state = 'resolved' AND updated_at < %(before)s RETURNING 1),
    abandoned AS (
        UPDATE schedtui_alert_outbox SET done_at = %(before)s, outcome = 'gave_up',
            last_error = 'no instance delivers to this sink'
        WHERE done_at IS NULL AND created_at < %(before)s AND (claim_until IS NULL OR claim_until <= %(before)s)
        RETURNING 1
    ),
    finished AS (DELETE FROM schedtui_alert_outbox WHERE done_at IS NOT NULL AND done_at < %(before)s RETURNING 1),
    sinks AS (DELETE FROM schedtui_alert_sinks WHERE seen_at < %(before)s RETURNING 1)
    SELECT (SELECT count(*) FROM resolved) + (SELECT count(*) FROM abandoned) + (SELECT count(*) FROM finished)
        + (SELECT count(*) FROM sinks)
"""
#: Adds the names not seen before and reads every one's first sighting, in one statement
#: (a row inserted here is not visible to the same statement's read: it is answered as ``at``).
BASELINES = """
    WITH added AS (
        INSERT INTO schedtui_alert_baselines (name, first_seen)
        SELECT n, %(at)s FROM unnest(%(names)s::text[]) AS n ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name, first_seen
    )
    SELECT name, first_seen FROM added
    UNION ALL
    SELECT name, first_seen FROM schedtui_alert_baselines WHERE name = ANY (%(names)s::text[])
"""
SLOT_RUNS = """
    SELECT n.name, r.status, r.scheduled_at, r.finished_at, r.error_tag, r.error_message
    FROM unnest(%s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT status, scheduled_at, finished_at, error_tag, error_message FROM schedtui_runs
        WHERE name = n.name AND trigger <> 'manual' AND status IN ('succeeded', 'failed')
        ORDER BY scheduled_at DESC, id DESC LIMIT %s
    ) AS r
"""
LAST_SUCCESSES = """
    SELECT n.name, r.scheduled_at, r.finished_at FROM unnest(%s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT scheduled_at, finished_at FROM schedtui_runs
        WHERE name = n.name AND trigger <> 'manual' AND status = 'succeeded'
        ORDER BY scheduled_at DESC, id DESC LIMIT 1
    ) AS r
"""
LAST_FAILURES = """
    SELECT n.name, f.status, f.scheduled_at, f.finished_at, f.error_tag, f.error_message,
        o.status, o.scheduled_at, o.finished_at, o.error_tag, o.error_message
    FROM unnest(%s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT id, status, scheduled_at, finished_at, error_tag, error_message FROM schedtui_runs
        WHERE name = n.name AND trigger <> 'manual' AND status = 'failed'
        ORDER BY scheduled_at DESC, id DESC LIMIT 1
    ) AS f
    CROSS JOIN LATERAL (
        SELECT status, scheduled_at, finished_at, error_tag, error_message FROM schedtui_runs
        WHERE name = n.name AND trigger <> 'manual' AND status IN ('succeeded', 'failed')
            AND (scheduled_at, id) > (f.scheduled_at, f.id)
        ORDER BY scheduled_at, id LIMIT 1
    ) AS o
"""
DEAD_JOBS = """
    SELECT queue, count(*) FILTER (WHERE dead_at >= coalesce((%(since)s::jsonb ->> queue)::timestamptz, %(default)s)),
        count(*), max(dead_at)
    FROM schedtui_jobs
    WHERE status = 'dead' AND NOT deleted GROUP BY queue
"""
STUCK = """
    SELECT id, function, status, reference FROM (
        SELECT id, function, status, CASE status WHEN 'waiting' THEN wake_at ELSE updated_at END AS reference
        FROM schedtui_durable_executions WHERE status IN ('queued', 'running', 'waiting')
    ) e
    WHERE reference < %s ORDER BY reference, id LIMIT %s
"""


def _alert(row: Sequence[Any]) -> Alert:
    return Alert(
        key=row[0],
        condition=row[1],
        subject_kind=row[2],
        subject=row[3],
        state=row[4],
        since=row[5].astimezone(UTC),
        summary=row[6],
        updated_at=row[7].astimezone(UTC),
        transition=row[8],
    )


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


class PostgresAlerts:
    COMPONENT = Component("alerts", (ALERTS_V1,))

    if TYPE_CHECKING:

        async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

        async def _again(self, first: Callable[[Any], Awaitable[T]], again: Callable[[Any], Awaitable[T]]) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

    async def list_alerts(self, *, resolved_after: datetime | None = None) -> list[Alert]:
        if resolved_after is None:
            rows = await self._fetchall(LIST_FIRING)
        else:
            rows = await self._fetchall(LIST_WITH_RESOLVED, (resolved_after,))
        return [_alert(row) for row in rows]

    async def write_transitions(self, transitions: Sequence[Transition], *, sinks_after: datetime) -> list[str]:
        if not transitions:
            return []
        # Full microseconds (not iso()'s milliseconds): the "changed before" test compares them.
        rows = [
            {**t.alert.to_json(), "payload": t.payload, "since": t.alert.since.isoformat(),
             "updated_at": t.alert.updated_at.isoformat()}
            for t in transitions
        ]  # fmt: skip
        found = await self._fetchall(TRANSITIONS, {"rows": json.dumps(rows), "sinks_after": sinks_after})
        return [row[0] for row in found]

    async def update_summaries(self, alerts: Sequence[Alert]) -> int:
        if not alerts:
            return 0
        rows = [
            {"key": a.key, "summary": a.summary, "updated_at": a.updated_at.isoformat(), "transition": a.transition}
            for a in alerts
        ]
        return await self._execute(UPDATE_SUMMARIES, (json.dumps(rows),))

    async def register_sinks(self, sinks: Sequence[tuple[str, str]], at: datetime) -> None:
        if sinks:
            listed = json.dumps([{"id": sink, "shown": shown} for sink, shown in sinks])
            await self._fetchall(REGISTER_SINKS, {"sinks": listed, "at": at})

    async def claim_deliveries(
        self, sinks: Sequence[str], instance: str, now: datetime, until: datetime, limit: int
    ) -> list[Delivery]:
        if not sinks:
            return []
        params = {"now": now, "sinks": list(sinks), "limit": limit, "instance": instance, "until": until}

        async def first(conn: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = await (await conn.execute(CLAIM, params)).fetchall()
            return rows

        async def again(conn: Any) -> list[tuple[Any, ...]]:
            return await (await conn.execute(CLAIMED_BEFORE, params)).fetchall() or await first(conn)

        rows = await self._again(first, again)
        return [Delivery(r[0], r[1], r[2], r[3], int(r[4]), int(r[5]), r[6].astimezone(UTC), until) for r in rows]

    async def finish_delivery(
        self, delivery: Delivery, at: datetime, *, retry_at: datetime | None, error: str | None
    ) -> bool:
        key = (delivery.transition, delivery.sink, delivery.token)
        if error is None:
            return bool(await self._execute(DELIVERED, (at, *key, at)))
        if retry_at is not None:  # (sent again, the same row: it still matches)
            return bool(await self._execute(RETRY, (retry_at, error, *key)))
        return bool(await self._execute(GAVE_UP, (at, error, *key, at)))

    async def give_back_deliveries(self, deliveries: Sequence[Delivery]) -> int:
        given = 0
        for d in deliveries:  # (a handful, once per stop)
            given += await self._execute(GIVE_BACK, (d.transition, d.sink, d.token))
        return given

    async def prune_alerts(self, before: datetime) -> int:
        rows = await self._fetchall(PRUNE, {"before": before})
        return int(rows[0][0]) if rows else 0

    async def alert_baselines(self, names: Sequence[str], at: datetime) -> dict[str, datetime]:
        if not names:
            return {}
        rows = await self._fetchall(BASELINES, {"names": list(names), "at": at})
        return {row[0]: row[1].astimezone(UTC) for row in rows}

    async def slot_runs(self, names: Sequence[str], newest: int) -> dict[str, list[SlotRun]]:
        if not names:
            return {}
        found: dict[str, list[SlotRun]] = {}
        for r in await self._fetchall(SLOT_RUNS, (list(names), newest)):
            found.setdefault(r[0], []).append(SlotRun(r[1], r[2].astimezone(UTC), _utc(r[3]), r[4], r[5]))
        return found

    async def last_successes(self, names: Sequence[str]) -> dict[str, Success]:
        if not names:
            return {}
        rows = await self._fetchall(LAST_SUCCESSES, (list(names),))
        return {r[0]: Success(r[1].astimezone(UTC), (r[2] or r[1]).astimezone(UTC)) for r in rows}

    async def last_failures(self, names: Sequence[str]) -> dict[str, tuple[SlotRun, SlotRun]]:
        if not names:
            return {}
        return {
            r[0]: (SlotRun(r[1], r[2].astimezone(UTC), _utc(r[3]), r[4], r[5]),
                   SlotRun(r[6], r[7].astimezone(UTC), _utc(r[8]), r[9], r[10]))
            for r in await self._fetchall(LAST_FAILURES, (list(names),))
        }  # fmt: skip

    async def dead_jobs(self, since: Mapping[str, datetime], default: datetime) -> dict[str, DeadJobs]:
        windows = json.dumps({queue: at.isoformat() for queue, at in since.items()})
        rows = await self._fetchall(DEAD_JOBS, {"since": windows, "default": default})
        return {r[0]: DeadJobs(int(r[1]), int(r[2]), _utc(r[3])) for r in rows}

    async def stuck_candidates(self, older_than: datetime, limit: int) -> list[StuckCandidate]:
        rows = await self._fetchall(STUCK, (older_than, limit))
        return [StuckCandidate(r[0], r[1], r[2], r[3].astimezone(UTC)) for r in rows]
