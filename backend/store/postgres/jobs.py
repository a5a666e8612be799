"""The job queue's tables and SQL on PostgreSQL (a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

* **Claims**: one statement per worker cycle takes, for every queue asked for, the oldest
  due jobs ``FOR UPDATE SKIP LOCKED`` (two workers never wait on each other's rows), as
  many as there are free seats and the worker has room for. The cycle's finishes go first,
  in the same transaction (pipelined: one round trip), so the seats they free are
  claimable at once.
* **Finishes**: the attempts that succeeded (most of them) in one ``DELETE`` of their rows,
  still running under their tries, from binary arrays, recording their attempts in the
  same statement; the others (retry, dead, release) lock their rows in id order, then
  change them. A worker's finish of a job whose run ended before its handover was written
  needs no handover (see :mod:`backend.jobs.workers`).
* **Claims ahead and handovers**: a cycle may also claim jobs without a seat (``running``,
  ``seat`` NULL: queued to the view, the list, the limit, cancel and delete, see QUEUED)
  for a worker to start on the seat of an attempt of its own that ends; the
  next cycle writes the handover (HANDOVER) after that attempt's finish, in the same
  transaction, so the seat is never free in between (see :mod:`backend.jobs.workers`).
* **The fleet-wide cap**: a running job holds a seat ``1..concurrency``; a unique index on
  (queue, seat) over running jobs makes a second holder of a seat impossible whatever two
  snapshots say (a COUNT in the claim would race). A claim skips seats another claim is
  taking right now (``pg_try_advisory_xact_lock`` per seat), so claims never wait on each
  other; one that loses a seat to a claim committed after its snapshot fails on the index
  and is retried.
* **Cycles** go on a connection kept for them when one is free (:mod:`.lane`: the
  statements prepared on generic plans, answers read from text, no pool checkout; up to
  :data:`CYCLE_LANES`), else on the pool. One run again on the pool after its connection
  broke on its way (it may have committed, its answer lost) says so
  (:attr:`~backend.jobs.store.Cycle.in_doubt`): what its first sending claimed, only the
  worker can tell from what it holds.
* **Sends** are one pipelined round trip each, on a connection kept for sends when one is
  free (:mod:`.lane`: the statements prepared, no pool checkout; up to
  :data:`SEND_LANES`, opened one by one as sends overlap), else on the pool. Far from the 10,000-job limit they share
  a per-queue advisory lock and run side by side (their commits group); one that finds
  the queue within 2,000 of the limit, or sends more than 100 jobs, takes the lock alone,
  so near the limit the count is exact. Concurrent sends of one key meet on the unique
  index: the loser sends again and finds the winner's job (a duplicate). A send that may
  have committed without its answer (a connection broken on its way) is sent again by
  SEND_AGAIN, which finds a job that ran and is gone meanwhile by its attempts.
* **Wake-ups**: after a send commits (never inside its transaction: a NOTIFY serialises
  commits), the sender tells workers with ``pg_notify``: on a sender's connection in a
  transaction of its own sent in the send's round trip, else (the pool's sends, other
  wake-ups) coalesced per queue by the caller's notifier; a wake-up's commit does not
  wait for the disk. Workers listen on the process's one listening connection
  (:mod:`backend.store.postgres.events`) and poll as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.pq.abc import PGresult

from backend.errors import NotFound, Unavailable
from backend.jobs.definition import MAX_HELD
from backend.jobs.model import Attempt, Job, JobStatus, NotDead, QueueFull, QueueView, Sent
from backend.jobs.store import REVOKE, Claimed, Cycle, Finish, Handover, NewJob, QueueSpec, RunningJob
from backend.safetext import store_text as _text
from backend.store import store_unavailable
from backend.store.job_rows import (
    ATTEMPT_FIELDS,
    CLAIMED_FIELDS,
    JOB_FIELDS,
    RUNNING_FIELDS,
    attempt_from_row,
    claimed_from_row,
    job_from_row,
    queue_full_message,
    running_from_row,
)
from backend.store.migrations import Component
from backend.store.postgres.events import JOBS_CHANNEL
from backend.store.postgres.lane import Lane, LaneFailed
from backend.store.postgres.logs import PRUNE_JOB_LOGS_CTE
from backend.store.postgres.pooler import PoolerSettings

__all__ = ["PostgresJobs"]

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

# ---------------------------------------------------------------------------------------
# SQL: everything the queue says to PostgreSQL is here.
# ---------------------------------------------------------------------------------------
SCHEMA_V1 = """
    CREATE TABLE schedtui_queues (
        name          text PRIMARY KEY,
        concurrency   integer NOT NULL,
        attempts      integer NOT NULL,
        max_runtime_s double precision NOT NULL,
        paused        boolean NOT NULL DEFAULT false,
        changed_by    text,
        changed_at    timestamptz,
        defined_at    timestamptz NOT NULL
    );
    CREATE TABLE schedtui_jobs (
        id            text COLLATE "C" PRIMARY KEY,
        queue         text NOT NULL,
        status        text NOT NULL,
        payload       text NOT NULL,
        key           text,
        cron          text,
        attempt       integer NOT NULL DEFAULT 0,
        max_attempts  integer NOT NULL,
        tries         integer NOT NULL DEFAULT 0,
        run_after     timestamptz NOT NULL,
        created_at    timestamptz NOT NULL,
        started_at    timestamptz,
        instance      text,
        token         text,
        seat          integer,
        deleted       boolean NOT NULL DEFAULT false,
        dead_at       timestamptz,
        error_tag     text,
        error_message text
    );
    CREATE UNIQUE INDEX schedtui_jobs_one_per_key ON schedtui_jobs (queue, key) WHERE key IS NOT NULL;
    CREATE UNIQUE INDEX schedtui_jobs_one_per_seat ON schedtui_jobs (queue, seat) WHERE status = 'running';
    CREATE INDEX schedtui_jobs_due ON schedtui_jobs (queue, run_after, id) WHERE status = 'queued';
    CREATE INDEX schedtui_jobs_dead ON schedtui_jobs (queue, dead_at) WHERE status = 'dead';
    CREATE TABLE schedtui_job_attempts (
        job_id        text COLLATE "C" NOT NULL,
        seq           integer NOT NULL,
        queue         text NOT NULL,
        attempt       integer NOT NULL,
        started_at    timestamptz NOT NULL,
        finished_at   timestamptz NOT NULL,
        status        text NOT NULL,
        error_tag     text,
        error_message text,
        instance      text NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE INDEX schedtui_job_attempts_by_age ON schedtui_job_attempts (finished_at);
"""

#: The channel workers listen on; the payload is the queue's name.
CHANNEL = JOBS_CHANNEL
#: Advisory lock classes (two-key form: class, object), kept apart from the store's own.
SEND_LOCK_CLASS = "hashtext('schedtui.jobs.send')"

JOB_COLUMNS = ", ".join(JOB_FIELDS)
#: Which jobs are queued, as the view, the list, the limit and a cancel see them: those
#: claimed ahead too (``running`` without a seat), which have not started (an action of
#: this process first has its workers hand them back or write their start; another
#: instance's give theirs back when they hear of it: see :mod:`backend.jobs.workers`).
QUEUED = "(status = 'queued' OR status = 'running' AND seat IS NULL)"
#: A queue's concurrency lowered: the workers holding jobs claimed ahead of it hear of it
#: (REVOKE), and give them back (a seat above the new cap is handed to none).
DEFINE_QUEUES = f"""
    WITH d AS (
        SELECT * FROM json_to_recordset(%(queues)s::json) AS q(name text, concurrency int, attempts int, max_runtime_s float8)
    ),
    before AS (SELECT q.name, q.concurrency FROM schedtui_queues q JOIN d ON d.name = q.name),
    defined AS (
        INSERT INTO schedtui_queues (name, concurrency, attempts, max_runtime_s, defined_at)
        SELECT d.name, d.concurrency, d.attempts, d.max_runtime_s, %(at)s FROM d
        ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, attempts = excluded.attempts,
            max_runtime_s = excluded.max_runtime_s, defined_at = excluded.defined_at
    )
    SELECT pg_notify('{CHANNEL}', '{REVOKE}' || d.name) FROM d JOIN before b ON b.name = d.name
    WHERE d.concurrency < b.concurrency
"""
ADD_QUEUES = """
    INSERT INTO schedtui_queues (name, concurrency, attempts, max_runtime_s, defined_at)
    SELECT q.name, q.concurrency, q.attempts, q.max_runtime_s, %(at)s
    FROM json_to_recordset(%(queues)s::json) AS q(name text, concurrency int, attempts int, max_runtime_s float8)
    ON CONFLICT (name) DO NOTHING
"""
#: The first statement of a send. Far from the limit, sends share the queue's lock and go
#: side by side; near it a send takes the lock alone (it waits for those sharing it to
#: commit, and they for it), so the count behind the limit is exact where it matters.
SEND_LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({SEND_LOCK_CLASS}, hashtext(%s))"
SEND_LOCK_ALONE = f"SELECT pg_advisory_xact_lock({SEND_LOCK_CLASS}, hashtext(%s))"
#: The second (its snapshot sees every send committed before the lock): which jobs are
#: new (not an id that exists, not a key held, not a key an earlier job of the batch
#: takes); whether they fit under the limit; if they do, insert them. Answers per job, in
#: order: its id (or the holder's), whether it is a duplicate; and with every row whether
#: the queue exists, whether the batch fit, and the counts of the limit. One round trip
#: with the lock, pipelined; nothing for the client to decide in between. Every lookup is
#: a join (hashed, or by index), none a subquery per job: a batch of 10,000 takes time in
#: proportion to it (per-job subqueries over the batch took 30 s and more).
SEND = f"""
    WITH q AS (SELECT attempts FROM schedtui_queues WHERE name = %(queue)s),
    w AS (
        SELECT * FROM json_to_recordset(%(jobs)s::json) AS w(
            n int, id text, payload text, key text, cron text, attempts int, run_after timestamptz)
    ),
    held AS (  -- (queued as the view counts: jobs claimed ahead too)
        SELECT count(*) AS n FROM schedtui_jobs
        WHERE queue = %(queue)s AND (status = 'dead' OR {QUEUED}) AND NOT deleted
    ),
    known AS (SELECT w.n, e.id FROM w JOIN schedtui_jobs e ON e.id = w.id),
    holders AS (
        SELECT h.key, h.id FROM schedtui_jobs h
        WHERE h.queue = %(queue)s AND h.key IN (SELECT w.key FROM w WHERE w.key IS NOT NULL)
    ),
    firsts AS (SELECT min(w.n) AS n FROM w WHERE w.key IS NOT NULL GROUP BY w.key),
    fresh AS (
        SELECT w.* FROM w
        WHERE w.n NOT IN (SELECT n FROM known)
            AND (w.key IS NULL OR (w.key NOT IN (SELECT key FROM holders) AND w.n IN (SELECT n FROM firsts)))
    ),
    fits AS (  -- (a send that adds nothing fits: a repeated keyed send answers its job, however full)
        SELECT EXISTS (SELECT 1 FROM q)
            AND (NOT EXISTS (SELECT 1 FROM fresh) OR (SELECT n FROM held) + (SELECT count(*) FROM fresh) <= %(limit)s) AS ok
    ),
    ins AS (
        INSERT INTO schedtui_jobs (id, queue, status, payload, key, cron, max_attempts, run_after, created_at)
        SELECT f.id, %(queue)s, 'queued', f.payload, f.key, f.cron, coalesce(f.attempts, (SELECT attempts FROM q)),
            f.run_after, %(at)s
        FROM fresh f WHERE (SELECT ok FROM fits)
        ORDER BY f.n
        ON CONFLICT DO NOTHING
        RETURNING id
    )
    SELECT
        coalesce(k.id, own.id, taker.id, holder.id),
        w.key IS NOT NULL AND k.id IS NULL AND own.id IS NULL,
        EXISTS (SELECT 1 FROM q), (SELECT ok FROM fits), (SELECT n FROM held), (SELECT count(*) FROM fresh),
        (SELECT count(*) FROM ins)
    FROM w
    LEFT JOIN known k ON k.n = w.n
    LEFT JOIN fresh own ON own.n = w.n
    LEFT JOIN fresh taker ON taker.key = w.key
    LEFT JOIN holders holder ON holder.key = w.key
    ORDER BY w.n
"""
_KNOWN = "known AS (SELECT w.n, e.id FROM w JOIN schedtui_jobs e ON e.id = w.id),"
#: SEND for jobs a sending before this one may have inserted with its answer lost (sent
#: again after a connection broke): an id is known also by its recorded attempts, so a job
#: that was claimed, run and deleted (success, or a delete while it ran) between the two is
#: found, answered as its id (not a duplicate) and not queued again. Only for such sends:
#: the join with the attempts is a cost no first send pays. What it cannot find: a job
#: cancelled or deleted while still queued in that instant (no attempt names it): that one
#: is queued again.
SEND_AGAIN = SEND.replace(_KNOWN, """known AS (
        SELECT w.n, w.id FROM w JOIN schedtui_jobs e ON e.id = w.id
        UNION  -- (a job that ran and is gone: its attempts name it)
        SELECT w.n, w.id FROM w JOIN schedtui_job_attempts a ON a.job_id = w.id
    ),""")
#: A finish that a sending of it before this one recorded (committed, its answer lost, and
#: sent again): its attempt's row, to the microsecond of its end and by its instance (and
#: with its error: see FINISH), is there already. Only the statement's snapshot is read:
#: its own record is not in it. (Only the worker holding an attempt ends it succeeded.)
_LANDED = """
        SELECT 1 FROM schedtui_job_attempts a
        WHERE a.job_id = f.id AND a.seq = f.tries AND a.finished_at = f.finished_at AND a.instance = f.instance"""
#: A cycle's finishes, each applied only while its job is still running under its tries;
#: answers the ids that applied, and those a sending of it before this one applied (see
#: _LANDED: a finish sent again after a lost answer is answered as the first sending was).
#: The attempt is recorded when it applied, or when the job is gone and the finish was not
#: swept (a finish retried after a lost answer finds its own record: nothing changes; a
#: sweep's, made from a read the job moved on from, records nothing).
FINISH = f"""
    WITH f AS (
        SELECT * FROM json_to_recordset(%(finishes)s::json) AS f(
            id text, queue text, tries int, kind text, attempt int, started_at timestamptz,
            finished_at timestamptz, instance text, error_tag text, error_message text, retry_at timestamptz,
            swept boolean)
    ),
    target AS (
        SELECT j.id, j.deleted FROM schedtui_jobs j JOIN f ON f.id = j.id
        WHERE j.tries = f.tries AND j.status = 'running'
        ORDER BY j.id
        FOR UPDATE OF j
    ),
    removed AS (
        DELETE FROM schedtui_jobs j USING target t, f
        WHERE j.id = t.id AND f.id = t.id AND (f.kind = 'succeeded' OR t.deleted)
    ),
    changed AS (
        UPDATE schedtui_jobs j SET
            status = CASE WHEN f.kind = 'dead' THEN 'dead' ELSE 'queued' END,
            seat = NULL,
            token = NULL,
            run_after = CASE WHEN f.kind = 'retry' THEN f.retry_at ELSE j.run_after END,
            dead_at = CASE WHEN f.kind = 'dead' THEN f.finished_at END,
            attempt = CASE WHEN f.kind = 'release' THEN j.attempt - 1 ELSE j.attempt END,
            -- (a release never started: the job shows its last attempt's start and instance again)
            started_at = CASE WHEN f.kind = 'release' THEN (
                SELECT a.started_at FROM schedtui_job_attempts a WHERE a.job_id = j.id ORDER BY a.seq DESC LIMIT 1
            ) ELSE j.started_at END,
            instance = CASE WHEN f.kind = 'release' THEN (
                SELECT a.instance FROM schedtui_job_attempts a WHERE a.job_id = j.id ORDER BY a.seq DESC LIMIT 1
            ) ELSE j.instance END,
            error_tag = CASE WHEN f.kind = 'release' THEN j.error_tag ELSE f.error_tag END,
            error_message = CASE WHEN f.kind = 'release' THEN j.error_message ELSE f.error_message END
        FROM target t, f
        WHERE j.id = t.id AND f.id = t.id AND NOT (f.kind = 'succeeded' OR t.deleted)
    ),
    recorded AS (
        INSERT INTO schedtui_job_attempts
            (job_id, seq, queue, attempt, started_at, finished_at, status, error_tag, error_message, instance)
        SELECT f.id, f.tries, f.queue, f.attempt, f.started_at, f.finished_at,
            CASE WHEN f.kind = 'succeeded' THEN 'succeeded' ELSE 'failed' END, f.error_tag, f.error_message, f.instance
        FROM f
        WHERE f.kind <> 'release'
            AND (f.id IN (SELECT id FROM target)
                OR (NOT f.swept AND NOT EXISTS (SELECT 1 FROM schedtui_jobs j WHERE j.id = f.id)))
        ON CONFLICT DO NOTHING
    )
    SELECT id FROM target
    UNION ALL
    SELECT f.id FROM f
    WHERE f.kind <> 'release' AND f.id NOT IN (SELECT id FROM target) AND EXISTS ({_LANDED}
            AND a.status = CASE WHEN f.kind = 'succeeded' THEN 'succeeded' ELSE 'failed' END
            -- (and its error: the sweep's end of an attempt, `abandoned`, is not the attempt's own)
            AND a.error_tag IS NOT DISTINCT FROM f.error_tag AND a.error_message IS NOT DISTINCT FROM f.error_message)
"""
#: The common finish, attempts that succeeded (binary arrays, one element per finish): the
#: job is deleted while it is still running under its tries (whether or not it was deleted
#: while it ran); answers the ids that applied. No row lock is taken before the DELETE (it
#: takes its own; a concurrent change of the row is seen by its recheck). The attempt is
#: recorded as in FINISH.
FINISH_SUCCEEDED = f"""
    WITH f AS (
        SELECT * FROM unnest(
            %b::text[], %b::int[], %b::text[], %b::int[], %b::timestamptz[], %b::timestamptz[], %b::text[]
        ) AS f(id, tries, queue, attempt, started_at, finished_at, instance)
    ),
    removed AS (
        DELETE FROM schedtui_jobs j USING f
        WHERE j.id = f.id AND j.tries = f.tries AND j.status = 'running'
        RETURNING j.id
    ),
    recorded AS (
        INSERT INTO schedtui_job_attempts (job_id, seq, queue, attempt, started_at, finished_at, status, instance)
        SELECT f.id, f.tries, f.queue, f.attempt, f.started_at, f.finished_at, 'succeeded', f.instance
        FROM f
        WHERE f.id IN (SELECT id FROM removed) OR NOT EXISTS (SELECT 1 FROM schedtui_jobs j WHERE j.id = f.id)
        ON CONFLICT DO NOTHING
    )
    SELECT id FROM removed
    UNION ALL
    SELECT f.id FROM f WHERE f.id NOT IN (SELECT id FROM removed) AND EXISTS ({_LANDED} AND a.status = 'succeeded')
"""
#: The claim, for every queue asked for at once:
#:
#: * ``open``: the queues asked for that are not paused and hold no seat above their cap
#:   (a lowered cap drains first);
#: * ``seats``: per queue, up to ``n`` free seats, and no more than it has jobs due, each
#:   one no other claim is taking now (a transaction-scoped advisory try-lock per seat). A
#:   seat is looked at only until enough are found, in a per-instance rotation of the seat
#:   numbers so that concurrent claimers start apart: a claim for one job of a queue of 16
#:   probes and locks one seat, not 16 (the CASE keeps the lock behind the probe);
#: * ``picked``: per queue, the oldest due jobs, as many as it got seats and ``r`` more (claimed
#:   ahead), ``FOR UPDATE SKIP LOCKED``;
#: * ``claimed``: each picked job running on its seat (one claimed ahead: with none yet, see
#:   HANDOVER), its attempt and tries counted;
#: * per queue asked for, the next due time among jobs not due yet (``next`` rows);
#:   the jobs come first, oldest due first: the order they start in.
CLAIM = f"""
    WITH wanted AS (
        SELECT w.queue, w.n, coalesce(w.r, 0) AS r FROM json_to_recordset(%(wanted)s::json) AS w(queue text, n int, r int)
    ),
    open AS (
        SELECT w.queue, w.n, w.r, q.concurrency FROM wanted w JOIN schedtui_queues q ON q.name = w.queue
        WHERE NOT q.paused AND (w.n > 0 OR w.r > 0) AND NOT EXISTS (
            SELECT 1 FROM schedtui_jobs r
            WHERE r.queue = w.queue AND r.status = 'running' AND r.seat > q.concurrency)
    ),
    seats AS MATERIALIZED (
        SELECT o.queue, s.seat, row_number() OVER (PARTITION BY o.queue ORDER BY s.ord) AS k
        FROM open o CROSS JOIN LATERAL (
            SELECT c.seat, c.ord FROM (
                SELECT g.seat, mod(g.seat + %(spin)s, o.concurrency) AS ord
                FROM generate_series(1, o.concurrency) AS g(seat)
                ORDER BY 2 OFFSET 0
            ) c
            WHERE CASE WHEN NOT EXISTS (
                    SELECT 1 FROM schedtui_jobs r
                    WHERE r.queue = o.queue AND r.status = 'running' AND r.seat = c.seat)
                THEN pg_try_advisory_xact_lock(hashtext('schedtui.jobs.seat:' || o.queue), c.seat) END
            LIMIT least(o.n, (
                SELECT count(*) FROM (
                    SELECT FROM schedtui_jobs d
                    WHERE d.queue = o.queue AND d.status = 'queued' AND d.run_after <= %(now)s
                    LIMIT o.n
                ) due))
        ) s
    ),
    picked AS (
        SELECT p.id, p.queue, row_number() OVER (PARTITION BY p.queue ORDER BY p.run_after, p.id) AS k
        FROM open o CROSS JOIN LATERAL (
            SELECT j.id, j.queue, j.run_after FROM schedtui_jobs j
            WHERE j.queue = o.queue AND j.status = 'queued' AND j.run_after <= %(now)s
            ORDER BY j.run_after, j.id
            LIMIT (SELECT count(*) FROM seats s WHERE s.queue = o.queue) + o.r
            FOR UPDATE OF j SKIP LOCKED
        ) p
    ),
    assigned AS MATERIALIZED (
        SELECT p.id, s.seat FROM picked p LEFT JOIN seats s ON s.queue = p.queue AND s.k = p.k
    ),
    claimed AS (
        -- By primary key (the picked rows are locked, and queued): a plain join here is planned
        -- as a scan of every queued job, the planner not knowing how few were picked.
        UPDATE schedtui_jobs j SET status = 'running', seat = a.seat, attempt = j.attempt + 1, tries = j.tries + 1,
            started_at = %(now)s, instance = %(instance)s, token = %(token)s
        FROM assigned a
        WHERE j.id = a.id AND j.id = ANY(ARRAY(SELECT a.id FROM assigned a))
        RETURNING {", ".join(f"j.{c}" for c in CLAIMED_FIELDS)}, j.seat, j.run_after
    )
    SELECT 'job', {", ".join(f"c.{c}" for c in CLAIMED_FIELDS)}, c.seat, c.run_after FROM claimed c
    UNION ALL
    SELECT 'next', NULL, o.queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, (
        SELECT min(j.run_after) FROM schedtui_jobs j
        WHERE j.queue = o.queue AND j.status = 'queued' AND j.run_after > %(now)s), NULL, NULL
    FROM open o
    ORDER BY 1, 13, 2  -- the jobs oldest due first, as they are to start (RETURNING has no order)
"""
#: Jobs claimed ahead that started on a seat their worker holds: the seat of an attempt
#: that ended, whose finish (the cycle's FINISH, just before) freed it in this transaction,
#: so no other claim can have seen it free. Applied only while the job is still running
#: under its tries without a seat and nothing else holds the seat (the ended attempt's finish
#: applied); answers the ids that applied, and those already on that seat under those tries
#: (a handover sent again after a cycle whose answer was lost: it is that worker's).
HANDOVER = """
    UPDATE schedtui_jobs j SET seat = h.seat
    FROM unnest(%b::text[], %b::int[], %b::int[]) AS h(id, tries, seat)
    WHERE j.id = h.id AND j.tries = h.tries AND j.status = 'running' AND (j.seat IS NULL OR j.seat = h.seat)
        AND NOT EXISTS (
            SELECT 1 FROM schedtui_jobs r
            WHERE r.queue = j.queue AND r.status = 'running' AND r.seat = h.seat AND r.id <> j.id)
    RETURNING j.id
"""
RUNNING = f"SELECT {', '.join(RUNNING_FIELDS)} FROM schedtui_jobs WHERE status = 'running'"
WAITING = """
    SELECT queue, count(*) FROM schedtui_jobs WHERE status = 'queued' AND NOT deleted AND run_after < %s
    GROUP BY queue ORDER BY queue
"""
#: A job claimed ahead (not on a seat yet) as the list shows it: queued, with its last
#: attempt's number, start and instance (what it showed before the claim).
SHOWN_FIELDS = {
    "status": f"CASE WHEN {QUEUED} THEN 'queued' ELSE status END",
    "attempt": "CASE WHEN status = 'running' AND seat IS NULL THEN attempt - 1 ELSE attempt END",
    "started_at": (
        "CASE WHEN status = 'running' AND seat IS NULL THEN (SELECT a.started_at FROM schedtui_job_attempts a "
        "WHERE a.job_id = j.id ORDER BY a.seq DESC LIMIT 1) ELSE started_at END"
    ),
    "instance": (
        "CASE WHEN status = 'running' AND seat IS NULL THEN (SELECT a.instance FROM schedtui_job_attempts a "
        "WHERE a.job_id = j.id ORDER BY a.seq DESC LIMIT 1) ELSE instance END"
    ),
}
SHOWN_COLUMNS = ", ".join(SHOWN_FIELDS.get(c, c) for c in JOB_FIELDS)
#: Which jobs a status filter of the list takes (by what the list shows).
STATUS_FILTERS = {"queued": QUEUED, "running": "status = 'running' AND seat IS NOT NULL", "dead": "status = 'dead'"}
#: Cancel a queued job: deleted. One claimed ahead is hidden as a running one is (its key
#: free): should its worker have started it before it heard, it finishes and its result is
#: not kept; one that had not goes back and its row goes (see FINISH).
_CANCEL = f"""
    WITH target AS (
        SELECT id, status FROM schedtui_jobs WHERE queue = %s AND {{by}} = %s AND {QUEUED} AND NOT deleted FOR UPDATE
    ),
    gone AS (DELETE FROM schedtui_jobs j USING target t WHERE j.id = t.id AND t.status = 'queued'),
    hidden AS (
        UPDATE schedtui_jobs j SET deleted = true, key = NULL FROM target t WHERE j.id = t.id AND t.status = 'running'
    )
    SELECT count(*) FROM target
"""
CANCEL_BY_ID = _CANCEL.replace("{by}", "id")
CANCEL_BY_KEY = _CANCEL.replace("{by}", "key")
#: Delete in any state; a running job (or one claimed ahead: see _CANCEL) keeps its row
#: (and seat) until its handler ends, but gives its key up and no longer shows. Answers
#: whether there was one.
DELETE_JOB = """
    WITH target AS (
        SELECT id, status FROM schedtui_jobs WHERE queue = %(queue)s AND id = %(id)s AND NOT deleted FOR UPDATE
    ),
    gone AS (DELETE FROM schedtui_jobs j USING target t WHERE j.id = t.id AND t.status <> 'running'),
    hidden AS (
        UPDATE schedtui_jobs j SET deleted = true, key = NULL FROM target t WHERE j.id = t.id AND t.status = 'running'
    )
    SELECT status FROM target
"""
RETRY_DEAD = f"""
    WITH target AS (
        SELECT id, status FROM schedtui_jobs WHERE queue = %(queue)s AND id = %(id)s AND NOT deleted FOR UPDATE
    ),
    retried AS (
        UPDATE schedtui_jobs j SET status = 'queued', attempt = 0, run_after = %(at)s, dead_at = NULL,
            error_tag = NULL, error_message = NULL, token = %(mark)s
        FROM target t WHERE j.id = t.id AND t.status = 'dead'
        RETURNING {", ".join(f"j.{c}" for c in JOB_FIELDS)}
    )
    SELECT t.status, r.* FROM target t LEFT JOIN retried r ON true
"""
#: A dead job's retry that a sending of it before applied (see ``PostgresJobs.retry_job``):
#: whether it is the retry's own doing (its mark, the token of a queued job, which a claim
#: replaces), and the job: alive again from the retry's instant, its last recorded attempt
#: still the one it died of (only a retry brings a dead job back). The instant alone is no
#: proof: a job sent with no delay is queued from its send's instant (a job never dead was
#: answered retried, running even), and another retry may come in the same instant.
RETRIED = f"""
    SELECT coalesce(token = %(mark)s, false), {", ".join(JOB_FIELDS)} FROM schedtui_jobs j
    WHERE queue = %(queue)s AND id = %(id)s AND NOT deleted AND dead_at IS NULL AND run_after = %(at)s
        AND (token = %(mark)s OR (
            SELECT a.status = 'failed' AND a.attempt = j.max_attempts FROM schedtui_job_attempts a
            WHERE a.job_id = j.id ORDER BY a.seq DESC LIMIT 1))
"""
PAUSE = "UPDATE schedtui_queues SET paused = %s, changed_by = %s, changed_at = %s WHERE name = %s"
QUEUE_VIEWS = f"""
    SELECT q.name, q.concurrency, q.paused,
        coalesce(c.queued, 0), coalesce(c.running, 0), coalesce(c.dead, 0),
        least(
            (SELECT min(j.run_after) FROM schedtui_jobs j
             WHERE j.queue = q.name AND j.status = 'queued' AND j.run_after <= %(now)s),
            (SELECT min(j.run_after) FROM schedtui_jobs j  -- (claimed ahead)
             WHERE j.queue = q.name AND j.status = 'running' AND j.seat IS NULL AND NOT j.deleted
                AND j.run_after <= %(now)s))
    FROM schedtui_queues q
    LEFT JOIN (
        SELECT queue,
            count(*) FILTER (WHERE {QUEUED} AND NOT deleted) AS queued,
            count(*) FILTER (WHERE status = 'running' AND seat IS NOT NULL) AS running,
            count(*) FILTER (WHERE status = 'dead' AND NOT deleted) AS dead
        FROM schedtui_jobs GROUP BY queue
    ) c ON c.queue = q.name
    ORDER BY q.name COLLATE "C"
"""
GET_JOB = f"SELECT {SHOWN_COLUMNS} FROM schedtui_jobs j WHERE id = %s AND NOT deleted"
ATTEMPTS = f"""
    SELECT queue, {", ".join(ATTEMPT_FIELDS)}
    FROM schedtui_job_attempts WHERE job_id = %s ORDER BY seq
"""
PRUNE = f"""
    WITH dead AS (
        DELETE FROM schedtui_jobs WHERE status = 'dead'
            AND ((cron IS NULL AND dead_at < %(dead)s) OR (cron IS NOT NULL AND dead_at < %(cron_dead)s))
        RETURNING 1
    ),
    attempts AS (DELETE FROM schedtui_job_attempts WHERE finished_at < %(attempts)s RETURNING 1),
    {PRUNE_JOB_LOGS_CTE}
    SELECT (SELECT count(*) FROM dead) + (SELECT count(*) FROM attempts)
"""
#: A wake-up is a hint (workers poll as well): its transaction commits without waiting for
#: its WAL to reach the disk. Every notifying commit takes one lock for the whole server
#: until it is done, so one that waited for the disk would hold every other one up.
NOTIFY = f"""
    WITH quick AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
    SELECT pg_notify('{CHANNEL}', q) FROM quick, unnest(%s::text[]) AS q
"""
#: SEND with positional, typed parameters (queue, jobs, at, limit): as the senders'
#: connections prepare it (:mod:`.lane`).
SEND_ON_LANE = (
    SEND.replace("%(queue)s", "$1::text").replace("%(jobs)s", "$2").replace("%(at)s", "$3::timestamptz")
    .replace("%(limit)s", "$4::bigint")
)  # fmt: skip
#: SEND for the most common send, one job without a key, on the senders' connections: the
#: same answer (one row, the same columns) from scalar parameters (queue, id, payload,
#: cron, attempts, run_after, at, limit), without the batch's record set and the key's
#: checks: in tests/bench/queue.py's latency run, 87 µs a send on the server against SEND's 138.
SEND_ONE = f"""
    WITH q AS (SELECT attempts FROM schedtui_queues WHERE name = $1::text),
    held AS (
        SELECT count(*) AS n FROM schedtui_jobs
        WHERE queue = $1::text AND (status = 'dead' OR {QUEUED}) AND NOT deleted
    ),
    known AS (SELECT EXISTS (SELECT 1 FROM schedtui_jobs e WHERE e.id = $2::text) AS e),
    fits AS (
        SELECT EXISTS (SELECT 1 FROM q) AND ((SELECT e FROM known) OR (SELECT n FROM held) + 1 <= $8::bigint) AS ok
    ),
    ins AS (
        INSERT INTO schedtui_jobs (id, queue, status, payload, key, cron, max_attempts, run_after, created_at)
        SELECT $2::text, $1::text, 'queued', $3::text, NULL, $4::text, coalesce($5::int, q.attempts),
            $6::timestamptz, $7::timestamptz
        FROM q WHERE (SELECT ok FROM fits) AND NOT (SELECT e FROM known)
        ON CONFLICT DO NOTHING
        RETURNING id
    )
    SELECT $2::text, false, EXISTS (SELECT 1 FROM q), (SELECT ok FROM fits), (SELECT n FROM held),
        CASE WHEN (SELECT e FROM known) THEN 0 ELSE 1 END, (SELECT count(*) FROM ins)
"""
#: The statements of the senders' connections (their lock and SEND, pipelined; NOTIFY).
SEND_LANE_STATEMENTS = {"lock": SEND_LOCK_SHARED, "send": SEND_ON_LANE, "send_one": SEND_ONE, "notify": NOTIFY}
#: Connections kept for sends at most, per process (opened one by one as sends overlap).
SEND_LANES = 8
#: The statements of the workers' cycle connections (:mod:`.lane`): a cycle's finishes,
#: handovers and claim, pipelined as one transaction. Its parameters are typed here: a
#: lane prepares the statement before it has any.
CYCLE_LANE_STATEMENTS = {
    "finish": FINISH.replace("%(finishes)s", "$1"),
    "succeeded": FINISH_SUCCEEDED.replace("%b", "%s"),
    "handover": HANDOVER.replace("%b", "%s"),
    "claim": (
        CLAIM.replace("%(wanted)s", "$1").replace("%(now)s", "$2::timestamptz").replace("%(instance)s", "$3::text")
        .replace("%(token)s", "$4::text").replace("%(spin)s", "$5::int")
    ),
}  # fmt: skip
#: Connections kept for cycles at most, per process: one per stream claiming, one more
#: while a stream's cycle that only hands in overlaps it (see :mod:`backend.jobs.workers`).
CYCLE_LANES = 3
#: What a cycle connection sets beyond the pool's: its statements' generic plans. With
#: custom plans FINISH_SUCCEEDED was planned again at every call (its estimate for an
#: array parameter of unknown length costs the generic plan above the custom ones): that
#: planning took more of the server's time than the statement itself. CLAIM runs on its
#: generic plan either way. The times it answers are read as ISO text.
CYCLE_CONFIGURE = "SET plan_cache_mode = force_generic_plan; SET DateStyle = 'ISO'"

# ---------------------------------------------------------------------------------------

#: How often a cycle is retried at once when it lost a seat to a concurrent claim.
_SEAT_RETRIES = 5
#: Sends of at most this many jobs share the queue's lock while the queue has this much
#: room to spare; larger ones, and any near the limit, take it alone (see SEND_LOCK_SHARED).
_SHARED_BATCH = 100
_SHARED_ROOM = 2_000
#: A send that met a concurrent send of one of its keys is made again, at most this often.
_SEND_TRIES = 5


def _utc(dt: datetime | None) -> datetime | None:
    # (The pool's sessions are in UTC: their times come back in it, as they are wanted.)
    return dt if dt is None or dt.tzinfo is UTC else dt.astimezone(UTC)


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat()




def _finishes_json(finishes: Sequence[Finish]) -> str:
    return json.dumps(
        [
            {
                "id": f.id,
                "queue": f.queue,
                "tries": f.tries,
                "kind": f.kind,
                "attempt": f.attempt,
                "started_at": _iso(f.started_at),
                "finished_at": _iso(f.finished_at),
                "instance": f.instance,
                "error_tag": _text(f.error_tag),
                "error_message": _text(f.error_message),
                "retry_at": _iso(f.retry_at),
                "swept": f.swept,
            }
            for f in sorted(finishes, key=lambda f: f.id)  # one lock order for every writer
        ],
        separators=(",", ":"),
    )


def _finish_statements(finishes: Sequence[Finish]) -> list[tuple[str, Any]]:
    """The statements that apply ``finishes``: the attempts that succeeded (most of them) in
    FINISH_SUCCEEDED, the others in FINISH."""
    succeeded = [f for f in finishes if f.kind == "succeeded"]
    others = [f for f in finishes if f.kind != "succeeded"] if len(succeeded) < len(finishes) else []
    statements: list[tuple[str, Any]] = []
    if succeeded:
        succeeded.sort(key=_by_id)  # one lock order for every writer
        columns = (
            [f.id for f in succeeded], [f.tries for f in succeeded], [f.queue for f in succeeded],
            [f.attempt for f in succeeded], [f.started_at for f in succeeded], [f.finished_at for f in succeeded],
            [f.instance for f in succeeded],
        )  # fmt: skip
        statements.append((FINISH_SUCCEEDED, columns))
    if others:
        statements.append((FINISH, {"finishes": _finishes_json(others)}))
    return statements


def _array(values: Sequence[str]) -> bytes:
    """A text array as PostgreSQL reads it."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return ("{" + ",".join(quoted) + "}").encode()


def _send_call(
    queue: str, jobs: Sequence[NewJob], batch: Callable[[], str], at: datetime
) -> tuple[str, list[bytes | None]]:
    """A shared send on a sender's connection: SEND_ONE for one job without a key, SEND
    (``batch()``, the jobs' record set) otherwise, or where its text cannot go as it is (the
    record set's JSON escapes it; the server then refuses it with the pool's message)."""
    limit = b"%d" % (MAX_HELD - _SHARED_ROOM)
    if len(jobs) == 1 and jobs[0].key is None:
        job = jobs[0]
        try:
            return "send_one", [
                queue.encode(), job.id.encode(), job.payload.encode(), None if job.cron is None else job.cron.encode(),
                None if job.attempts is None else b"%d" % job.attempts, job.run_after.isoformat().encode(),
                at.isoformat().encode(), limit,
            ]  # fmt: skip
        except UnicodeEncodeError:
            pass
    return "send", [queue.encode(), batch().encode(), at.isoformat().encode(), limit]


def _send_rows(result: PGresult) -> list[tuple[Any, ...]]:
    """SEND's rows, from the text a sender's connection got back."""
    rows = []
    for i in range(result.ntuples):
        job_id, duplicate, exists, fits, held, adding, inserted = (result.get_value(i, j) for j in range(7))
        rows.append((
            None if job_id is None else job_id.decode(), duplicate == b"t", exists == b"t", fits == b"t",
            int(held or 0), int(adding or 0), int(inserted or 0),
        ))  # fmt: skip
    return rows


def _lane_finish_calls(finishing: list[tuple[str, Any]]) -> list[tuple[str, list[bytes | None]]]:
    """:func:`_finish_statements`' statements as a cycle connection's calls (text parameters)."""
    calls: list[tuple[str, list[bytes | None]]] = []
    for sql, params in finishing:
        if sql is FINISH:
            calls.append(("finish", [params["finishes"].encode()]))
            continue
        ids, tries, queues, attempts, started, finished, instances = params
        calls.append(("succeeded", [
            _array(ids), _numbers(tries), _array(queues), _numbers(attempts),
            _array([t.isoformat() for t in started]), _array([t.isoformat() for t in finished]), _array(instances),
        ]))  # fmt: skip
    return calls


def _numbers(values: Sequence[int]) -> bytes:
    return ("{" + ",".join(str(int(v)) for v in values) + "}").encode()


def _text_time(value: bytes | None) -> datetime | None:
    """A ``timestamptz`` a cycle connection answered (ISO, in UTC: see CYCLE_CONFIGURE)."""
    return None if value is None else _utc(datetime.fromisoformat(value.decode()))


def _decoded(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _ids(result: PGresult) -> set[str]:
    return {result.get_value(i, 0).decode() for i in range(result.ntuples)}  # type: ignore[union-attr]


def _claim_rows(result: PGresult) -> tuple[list[Claimed], dict[str, datetime | None]]:
    """CLAIM's answer, from the text a cycle connection got back: the jobs claimed and, per
    queue asked for, its next due time."""
    claimed: list[Claimed] = []
    next_at: dict[str, datetime | None] = {}
    value = result.get_value
    for i in range(result.ntuples):
        if value(i, 0) == b"job":
            created_at, started_at = _text_time(value(i, 9)), _text_time(value(i, 10))
            assert created_at is not None and started_at is not None
            seat = value(i, 11)
            claimed.append(Claimed(
                value(i, 1).decode(), value(i, 2).decode(), value(i, 3).decode(),  # type: ignore[union-attr]
                _decoded(value(i, 4)), _decoded(value(i, 5)), int(value(i, 6)), int(value(i, 7)),  # type: ignore[arg-type]
                int(value(i, 8)), created_at, started_at, None if seat is None else int(seat),  # type: ignore[arg-type]
            ))  # fmt: skip
        else:
            next_at[value(i, 2).decode()] = _text_time(value(i, 10))  # type: ignore[union-attr]
    return claimed, next_at


def _free_lane(lanes: Sequence[Lane]) -> Lane | None:
    """A connected one of ``lanes`` that is free now, if any; when every connected one is
    busy, the next one starts connecting (in the background: the pool serves meanwhile)."""
    for lane in lanes:
        if lane.connected:
            if lane.available():
                return lane
        else:
            lane.available()
            return None
    return None


def _by_id(f: Finish) -> str:
    return f.id


def _retryable(exc: psycopg.Error) -> bool:
    """A claim that lost a seat to a claim committed after its snapshot, or (never expected)
    a deadlock: the cycle is retried whole."""
    return isinstance(exc, (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected))


class _Rider:
    """A send waiting for a sender's connection, to go with others (see PostgresJobs._ride)."""

    __slots__ = ("at", "future", "in_doubt", "items", "wake_later")

    def __init__(
        self,
        items: list[dict[str, Any]],
        at: datetime,
        wake_later: Callable[[str], None] | None,
        future: asyncio.Future[list[Sent] | None],
    ) -> None:
        self.items = items
        self.at = at
        self.wake_later = wake_later
        self.future = future
        self.in_doubt = False
        """Its shared send failed after it may have inserted its jobs (its answer lost), or
        inserted some of them before it gave up: sent alone, it is sent again (SEND_AGAIN)."""


class PostgresJobs:
    """The :class:`~backend.jobs.store.JobStore` of the PostgreSQL store."""

    COMPONENT = Component("jobs", (SCHEMA_V1,))
    job_notifications = True
    job_reservations = True
    #: Two: the worker's Python and the server each have a core's work while the other waits.
    job_streams = 2

    _conninfo: str
    _senders: list[Lane]
    _cyclers: list[Lane]
    _riders: dict[str, list[_Rider]]
    _carrying: set[asyncio.Future[None]]
    _conn_trouble: tuple[str, datetime] | None
    _configure: Callable[[AsyncConnection[Any]], Awaitable[None]]
    _store_answered: Callable[[], None]
    _with_conn: Callable[..., Awaitable[Any]]
    _fetchall: Callable[..., Awaitable[list[tuple[Any, ...]]]]
    _fetchone: Callable[..., Awaitable[tuple[Any, ...] | None]]
    _execute: Callable[..., Awaitable[int]]
    _again: Callable[..., Awaitable[Any]]
    where: str
    commits: int
    pooler: PoolerSettings

    #: This process's rotation of seat numbers (see CLAIM).
    _spin = random.randrange(1 << 16)

    def _one_transaction(self, conn: AsyncConnection[Any]) -> contextlib.AbstractAsyncContextManager[Any]:
        """The statements of the block as one transaction: pipelined on a direct connection
        (one round trip: they are one implicit transaction, committed at the pipeline's one
        Sync, rolled back whole on an error); behind a transaction pooler an explicit one.
        There psycopg's Flush after a pipeline's Sync can reach PgBouncer after the server
        answered and was let go, and PgBouncer gives that lone Flush a server connection of
        its own: the server never answers it, and that connection stays tied to an idle
        client (no statement or transaction timeout ends it) until the pool is exhausted and
        every other client waits out ``query_wait_timeout`` (120 s)."""
        return conn.transaction() if self.pooler.transaction else conn.pipeline()

    def _send_lanes(self) -> list[Lane]:
        """The connections kept for sends (made when the store opens, each connected when
        the sends first need it: one while sends come one at a time)."""
        return [Lane(self._conninfo, "schedtui_send", SEND_LANE_STATEMENTS, self._configure) for _ in range(SEND_LANES)]

    def _cycle_lanes(self) -> list[Lane]:
        """The connections kept for the workers' cycles (made when the store opens, each
        connected when cycles first need it; never in a process that runs no queue)."""
        return [
            Lane(self._conninfo, "schedtui_cycle", CYCLE_LANE_STATEMENTS, self._configure_cycle)
            for _ in range(CYCLE_LANES)
        ]

    def expect_jobs(self, *, sending: bool = False, cycling: bool = False) -> None:
        """The first sender's connection (``sending``) and one cycle connection for each
        stream a worker may run (``cycling``: :attr:`job_streams`) start connecting now. Opened as first needed instead, the first
        sends and claims went on the pool while those connections opened beside them: at
        1,000 sends a second from a fresh client to fresh workers, the first second's jobs
        waited 32–80 ms to start at p99, and 11 ms in most runs with them opened early
        (tests/bench/RESULTS.md). The others still open as sends and cycles overlap."""
        lanes = (self._senders[:1] if sending else []) + (self._cyclers[: self.job_streams] if cycling else [])
        for lane in lanes:
            lane.available()  # starts connecting in the background; nothing if connected or connecting

    async def _configure_cycle(self, conn: AsyncConnection[Any]) -> None:
        await self._configure(conn)
        for statement in CYCLE_CONFIGURE.split(";"):
            await conn.execute(statement)

    def _free_sender(self) -> Lane | None:
        return _free_lane(self._senders)

    async def _on_sender(
        self, calls: Sequence[tuple[str, Sequence[bytes | None]]], then: tuple[str, Sequence[bytes | None]] | None = None
    ) -> list[PGresult] | None:
        """Run statements of the senders' connections on a free one, in one transaction
        (and ``then`` in one of its own after it: :meth:`Lane.call_many`); ``None``: none
        was free: the caller runs them on the pool. :class:`LaneFailed`: the call failed,
        after it may have applied (see :meth:`_on_lanes`)."""
        lane = self._free_sender()
        if lane is None:
            return None
        try:
            return await self._on_lanes([lane], calls, then)
        finally:
            if self._riders:
                self._board()

    async def _on_lanes(
        self,
        lanes: Sequence[Lane],
        calls: Sequence[tuple[str, Sequence[bytes | None]]],
        then: tuple[str, Sequence[bytes | None]] | None = None,
    ) -> list[PGresult] | None:
        """Run statements on a free one of ``lanes`` (see :meth:`_on_sender`); ``None``:
        none was free. :class:`LaneFailed`: the call failed, and whether it took effect is
        unknown (its answer may have been lost after the commit): the caller runs the
        statements again on the pool, knowing they may have applied once already."""
        lane = _free_lane(lanes)
        if lane is None:
            return None
        results = await lane.call_many(calls, then)
        self._conn_trouble = None
        self._store_answered()
        return results

    def _senders_all_busy(self) -> bool:
        """Some connection kept for sends is connected, and every connected one is busy (the
        next one starts connecting: see :meth:`_free_sender`)."""
        if self._free_sender() is not None:
            return False
        return any(lane.connected for lane in self._senders)

    async def _ride(
        self, queue: str, items: list[dict[str, Any]], at: datetime, wake_later: Callable[[str], None] | None
    ) -> tuple[list[Sent] | None, bool]:
        """Every sender's connection is busy: wait for the next one free and go with the
        other sends to ``queue`` that wait for it, in one transaction (a backlog of single
        sends costs a commit per batch, not per send). Its answers, or ``None``: send alone
        after all (the batch failed, did not fit, or met a concurrent send of one of its
        keys); and whether the jobs may have been inserted already (see :attr:`_Rider.in_doubt`)."""
        rider = _Rider(items, at, wake_later, asyncio.get_running_loop().create_future())
        self._riders.setdefault(queue, []).append(rider)
        return await rider.future, rider.in_doubt

    def _board(self) -> None:
        """A sender's connection is free: the sends waiting for one go, the longest-waiting
        queue's first (as many as fit in a shared send), on that connection."""
        while self._riders:
            queue = next(iter(self._riders))
            riders = [r for r in self._riders.pop(queue) if not r.future.done()]
            if not riders:
                continue
            lane = self._free_sender()
            if lane is None:
                if any(sender.connected and not sender.available() for sender in self._senders):
                    self._riders[queue] = riders  # the next free one takes them
                else:
                    for rider in riders:  # none connected: each sends on its own (the pool)
                        rider.future.set_result(None)
                return
            going: list[_Rider] = []
            count = 0
            while riders and (not going or count + len(riders[0].items) <= _SHARED_BATCH):
                going.append(riders.pop(0))
                count += len(going[-1].items)
            if riders:
                self._riders[queue] = riders
            batch = [item | {"n": n} for n, item in enumerate(i for r in going for i in r.items)]
            at = min(r.at for r in going)
            wake = any(r.wake_later is not None for r in going)
            try:
                # Sent now, on the connection just found free (no other send can take it first).
                reply = lane.start_many((
                    ("lock", [queue.encode()]),
                    ("send", [queue.encode(), json.dumps(batch, separators=(",", ":")).encode(), at.isoformat().encode(),
                              b"%d" % (MAX_HELD - _SHARED_ROOM)]),
                ), then=("notify", [_array([queue])]) if wake else None)  # fmt: skip
            except LaneFailed:
                for rider in going:  # (a part of it may have reached the server)
                    rider.in_doubt = True
                    rider.future.set_result(None)
                continue
            task = asyncio.ensure_future(self._carry(reply, going))
            self._carrying.add(task)
            task.add_done_callback(self._carrying.discard)
            return

    async def _carry(self, reply: Awaitable[list[PGresult]], riders: list[_Rider]) -> None:
        """The answers of a shared send, to each of its sends (``None`` to each: send alone;
        in doubt where the shared send may have inserted some of their jobs)."""
        answers: list[list[Sent] | None] = [None] * len(riders)
        try:
            try:
                results = await reply
            except LaneFailed:
                for rider in riders:  # it may have committed, its answer lost
                    rider.in_doubt = True
                return
            self.commits += 1
            self._conn_trouble = None
            self._store_answered()
            rows = _send_rows(results[1])
            if not rows or not rows[0][2] or not rows[0][3] or rows[0][6] != rows[0][5]:
                if rows and rows[0][6]:  # (a key taken beside it: the others' jobs went in)
                    for rider in riders:
                        rider.in_doubt = True
                return  # no such queue, no room, or a key taken beside it: each on its own
            at_row = 0
            for index, rider in enumerate(riders):
                mine = rows[at_row:at_row + len(rider.items)]
                at_row += len(rider.items)
                answers[index] = [Sent(job_id, duplicate=bool(duplicate)) for job_id, duplicate, *_ in mine]
        finally:
            for rider, answer in zip(riders, answers, strict=True):
                if not rider.future.done():
                    rider.future.set_result(answer)
            self._board()

    async def define_queues(self, queues: Sequence[QueueSpec], at: datetime, *, update: bool) -> None:
        if not queues:
            return
        rows = json.dumps([
            {"name": q.name, "concurrency": q.concurrency, "attempts": q.attempts, "max_runtime_s": q.max_runtime_s}
            for q in queues
        ])  # fmt: skip
        await self._execute(DEFINE_QUEUES if update else ADD_QUEUES, {"queues": rows, "at": at})

    async def send_jobs(
        self, queue: str, jobs: Sequence[NewJob], at: datetime, *, wake_later: Callable[[str], None] | None = None
    ) -> list[Sent]:
        items = [
            {"n": n, "id": j.id, "payload": j.payload, "key": j.key, "cron": j.cron, "attempts": j.attempts,
             "run_after": j.run_after.isoformat()}
            for n, j in enumerate(jobs)
        ]  # fmt: skip
        alone = len(jobs) > _SHARED_BATCH
        # Whether a sending of these jobs may have inserted them already (its answer lost,
        # or some inserted before it met a key taken beside it): then every sending after
        # it is SEND_AGAIN, on the pool, which finds a job that ran and is gone meanwhile.
        in_doubt = False
        if not alone and self._senders_all_busy():
            carried, in_doubt = await self._ride(queue, items, at, wake_later)
            if carried is not None:
                return carried
        encoded: list[str] = []

        def batch() -> str:
            """The jobs' record set as SEND reads it (made once, when a send needs it)."""
            if not encoded:
                encoded.append(json.dumps(items, separators=(",", ":")))
            return encoded[0]

        unanswered = False  # a sending below is on its way, or lost its answer

        async def send(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            nonlocal in_doubt, unanswered
            # Run again by _with_conn after the connection was lost: the first may have committed.
            in_doubt = in_doubt or unanswered
            unanswered = True
            # While sharing the lock, leave room for the others that share it now.
            params = {"jobs": batch(), "queue": queue, "at": at, "limit": MAX_HELD if alone else MAX_HELD - _SHARED_ROOM}
            # One round trip: the lock and the send are one implicit transaction (see cycle_jobs).
            async with self._one_transaction(conn):
                await conn.execute(SEND_LOCK_ALONE if alone else SEND_LOCK_SHARED, (queue,))
                cursor = await conn.execute(SEND_AGAIN if in_doubt else SEND, params)
            rows = await cursor.fetchall()
            unanswered = False
            return rows

        for _ in range(_SEND_TRIES):
            # On a connection kept for sends when one is free (prepared statements, no pool
            # checkout: a fraction of the CPU). Sent again after a failure there, on the
            # pool, a job finds its own row by its id, or its attempts once it ran: sent
            # once, not a duplicate. The wake-up goes in the same round trip and write, in
            # a transaction of its own after it.
            done = None
            if not alone and not in_doubt:
                try:
                    done = await self._on_sender((
                        ("lock", [queue.encode()]),
                        _send_call(queue, jobs, batch, at),
                    ), then=("notify", [_array([queue])]) if wake_later is not None else None)  # fmt: skip
                except LaneFailed:
                    in_doubt = True  # it may have committed, its answer lost
            if done is not None:
                rows = _send_rows(done[1])
            else:
                rows = await self._with_conn(send)
                if wake_later is not None:
                    wake_later(queue)
            self.commits += 1
            if not rows or not rows[0][2]:
                raise NotFound(f'no queue named "{queue}"')
            _, _, _, fits, held, adding, inserted = rows[0]
            if not fits:
                if not alone:
                    alone = True  # near the limit: count again, alone
                    continue
                raise QueueFull(queue_full_message(queue, held, adding, MAX_HELD), count=held, reason="queue full")
            if inserted == adding:
                return [Sent(job_id, duplicate=bool(duplicate)) for job_id, duplicate, *_ in rows]
            # A send beside this one took one of its keys first (or its ids: our own earlier
            # attempt). Again: that job is visible now, and what was inserted is ours (and
            # may run before the next sending: found by its attempts).
            in_doubt = in_doubt or inserted > 0
        raise Unavailable(f'the send to "{queue}" kept meeting concurrent sends of its keys; send it again')

    async def cycle_jobs(
        self,
        finishes: Sequence[Finish],
        wanted: Mapping[str, int],
        instance: str,
        token: str,
        now: datetime,
        *,
        ahead: Mapping[str, int] | None = None,
        handovers: Sequence[Handover] = (),
    ) -> Cycle:
        finishing = _finish_statements(finishes)
        hand_params = (
            ([h.id for h in handovers], [h.tries for h in handovers], [h.seat for h in handovers]) if handovers else None
        )
        ahead = ahead or {}
        asked = [{"queue": q, "n": wanted.get(q, 0), "r": ahead.get(q, 0)} for q in {**wanted, **ahead}]
        claim_params = (
            {"wanted": json.dumps(asked), "now": now, "instance": instance, "token": token, "spin": self._spin}
            if asked
            else None
        )

        sendings = 0  # of the closure below, in one call of _with_conn

        async def cycle(conn: AsyncConnection[Any]) -> tuple[set[str], set[str], list[tuple[Any, ...]]]:
            nonlocal sendings
            sendings += 1
            # Pipelined, one round trip: the statements before the pipeline's one Sync are
            # one (implicit) transaction, committed at the Sync or rolled back whole on an
            # error. (A `transaction()` block here would cost a Sync of its own first; it is
            # one behind a transaction pooler: see _one_transaction.)
            async with self._one_transaction(conn):
                done = [await conn.execute(sql, params) for sql, params in finishing]
                handed = await conn.execute(HANDOVER, hand_params) if hand_params else None
                taken = await conn.execute(CLAIM, claim_params) if claim_params else None
            applied = {row[0] for cursor in done for row in await cursor.fetchall()}
            moved = {row[0] for row in await handed.fetchall()} if handed else set()
            rows = await taken.fetchall() if taken else []
            return applied, moved, rows

        # Whether a sending of the cycle failed after it may have committed (its answer
        # lost) and it was run again: the worker must hear of it (see Cycle.in_doubt).
        in_doubt = False
        try:
            on_lane = await self._cycle_on_lane(finishing, hand_params, claim_params)
        except LaneFailed:
            on_lane, in_doubt = None, True
        if on_lane is not None:
            applied, moved, claimed, next_at = on_lane
        else:
            for attempt in range(_SEAT_RETRIES + 1):
                sendings = 0
                try:
                    applied, moved, rows = await self._with_conn(cycle)
                    break
                except psycopg.Error as exc:
                    if attempt == _SEAT_RETRIES or not _retryable(exc):
                        raise
                finally:
                    # _with_conn ran it again after a connection lost (not this loop after
                    # a seat lost, whose statements were rolled back)
                    in_doubt = in_doubt or sendings > 1
            claimed = []
            next_at = {}
            for row in rows:
                if row[0] == "job":
                    claimed.append(claimed_from_row(row[1:11], _utc, row[11]))
                else:
                    next_at[row[2]] = _utc(row[10])
        self.commits += 1
        return Cycle(
            [f.id in applied for f in finishes], claimed, next_at, [h.id in moved for h in handovers], in_doubt=in_doubt
        )

    async def _cycle_on_lane(
        self,
        finishing: list[tuple[str, Any]],
        hand_params: tuple[list[str], list[int], list[int]] | None,
        claim_params: dict[str, Any] | None,
    ) -> tuple[set[str], set[str], list[Claimed], dict[str, datetime | None]] | None:
        """A cycle on a connection kept for cycles: its finishes, handovers and claim in one
        round trip (their answers: finishes applied, handovers moved, jobs claimed, next due
        times); ``None``: none was free, or its text could not be sent as it is: the pool
        runs it. :class:`LaneFailed`: it failed there (a seat lost to a concurrent claim
        among the reasons, or its answer lost after the commit): the pool runs it again,
        and tries again where it must (every statement of a cycle may run again), and the
        cycle is in doubt (see :attr:`Cycle.in_doubt`)."""
        if not self._cyclers or _free_lane(self._cyclers) is None:
            return None
        try:
            calls = _lane_finish_calls(finishing)
            if hand_params is not None:
                ids, tries, seats = hand_params
                calls.append(("handover", [_array(ids), _numbers(tries), _numbers(seats)]))
            if claim_params is not None:
                calls.append(("claim", [
                    claim_params["wanted"].encode(), claim_params["now"].isoformat().encode(),
                    claim_params["instance"].encode(), claim_params["token"].encode(), b"%d" % claim_params["spin"],
                ]))  # fmt: skip
        except UnicodeEncodeError:
            return None  # (text PostgreSQL would refuse: the pool's path says so)
        results = await self._on_lanes(self._cyclers, calls) if calls else None
        if results is None:
            return None
        applied: set[str] = set()
        at = 0
        for _ in range(len(calls) - (hand_params is not None) - (claim_params is not None)):
            applied |= _ids(results[at])
            at += 1
        moved: set[str] = set()
        if hand_params is not None:
            moved = _ids(results[at])
            at += 1
        claimed, next_at = _claim_rows(results[at]) if claim_params is not None else ([], {})
        return applied, moved, claimed, next_at

    async def finish_jobs(self, finishes: Sequence[Finish]) -> list[bool]:
        if not finishes:
            return []
        finishing = _finish_statements(finishes)

        async def finish(conn: AsyncConnection[Any]) -> set[str]:
            async with self._one_transaction(conn):  # one round trip, one implicit transaction (see cycle_jobs)
                done = [await conn.execute(sql, params) for sql, params in finishing]
            return {row[0] for cursor in done for row in await cursor.fetchall()}

        for attempt in range(_SEAT_RETRIES + 1):
            try:
                applied = await self._with_conn(finish)
                break
            except psycopg.errors.DeadlockDetected:
                # Its two statements lock apart (those that succeeded, then the others):
                # against a cycle of this instance closing some of the same jobs, one of the
                # two may be chosen to fail. Nothing was written: again.
                if attempt == _SEAT_RETRIES:
                    raise
        self.commits += 1
        return [f.id in applied for f in finishes]

    async def running_jobs(self) -> list[RunningJob]:
        return [running_from_row(row, _utc) for row in await self._fetchall(RUNNING)]

    async def waiting_jobs(self, due_before: datetime) -> dict[str, int]:
        return {queue: int(count) for queue, count in await self._fetchall(WAITING, (due_before,))}

    # An operator's cancel, delete or retry whose answer was lost (the connection broke with
    # it in flight, after its commit) is sent again by the store (see ``_again``): sent as
    # it was, it found its own doing and told the operator "no such job" or "not dead".
    # Sent again, one that finds its job still to act on acts; a cancel or a delete that
    # finds none may have done it (its row is gone) and says so rather than "not found";
    # a retry finds the job it brought back from the dead by its mark (RETRIED), and says
    # so where the job came back and the mark is gone (claimed since, or another's retry).
    async def cancel_job(self, queue: str, *, id: str | None = None, key: str | None = None) -> bool:
        sql, value = (CANCEL_BY_KEY, key) if id is None else (CANCEL_BY_ID, id)

        async def first(conn: AsyncConnection[Any]) -> bool:
            row = await (await conn.execute(sql, (queue, value))).fetchone()
            return bool(row and row[0])

        async def again(conn: AsyncConnection[Any]) -> bool:
            if await first(conn):
                return True
            raise self._in_doubt("cancel", "cancelling")

        return bool(await self._again(first, again))

    async def delete_job(self, queue: str, job_id: str) -> bool:
        params = {"queue": queue, "id": job_id}

        async def first(conn: AsyncConnection[Any]) -> bool:
            return bool(await (await conn.execute(DELETE_JOB, params)).fetchall())

        async def again(conn: AsyncConnection[Any]) -> bool:
            if await first(conn):
                return True
            raise self._in_doubt("delete", "deleting")

        return bool(await self._again(first, again))

    def _in_doubt(self, action: str, doing: str, found: str = "the job is gone") -> Unavailable:
        return store_unavailable(
            self.where, f"{{store}} lost the answer of a job's {action}, which may have been done all the same "
            f"({found}): look before {doing} it again"
        )  # fmt: skip

    async def retry_job(self, queue: str, job_id: str, at: datetime) -> Job | None:
        # (The mark: no claim's token has a space.)
        params = {"queue": queue, "id": job_id, "at": at, "mark": f"retry {secrets.token_hex(8)}"}

        async def first(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = await (await conn.execute(RETRY_DEAD, params)).fetchall()
            return rows

        async def again(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            row = await (await conn.execute(RETRIED, params)).fetchone()
            if row is None:
                return await first(conn)
            if not row[0]:  # claimed since, or another retry's doing
                raise self._in_doubt("retry", "retrying", "the job is back in its queue")
            return [("dead", *row[1:])]

        rows = await self._again(first, again)
        if not rows:
            return None
        status, *job = rows[0]
        if status != "dead":
            raise NotDead(
                f'job {job_id} of "{queue}" is {status}, not dead: only a dead job can be retried', reason="not dead"
            )
        return job_from_row(job, _utc)

    async def pause_queue(self, queue: str, paused: bool, by: str, at: datetime) -> bool:
        return await self._execute(PAUSE, (paused, _text(by), at, queue)) == 1

    async def queue_views(self, now: datetime) -> list[QueueView]:
        rows = await self._fetchall(QUEUE_VIEWS, {"now": now})
        return [QueueView(r[0], r[1], bool(r[2]), r[3], r[4], r[5], _utc(r[6])) for r in rows]

    async def list_jobs(
        self, queue: str, *, status: JobStatus | None, limit: int, before: str | None
    ) -> list[Job]:
        sql = f"SELECT {SHOWN_COLUMNS} FROM schedtui_jobs j WHERE queue = %s AND NOT deleted"
        params: list[Any] = [queue]
        if status is not None:
            sql += f" AND {STATUS_FILTERS[status]}"
        if before is not None:
            sql += " AND id < %s"
            params.append(before)
        sql += " ORDER BY id DESC LIMIT %s"
        params.append(limit)
        return [job_from_row(row, _utc) for row in await self._fetchall(sql, params)]

    async def get_job(self, job_id: str) -> Job | None:
        row = await self._fetchone(GET_JOB, (job_id,))
        return job_from_row(row, _utc) if row else None

    async def job_attempts(self, job_id: str) -> tuple[str | None, list[Attempt]]:
        rows = await self._fetchall(ATTEMPTS, (job_id,))
        return (rows[0][0] if rows else None), [attempt_from_row(row[1:], _utc) for row in rows]

    async def prune_jobs(self, dead_before: datetime, cron_dead_before: datetime, attempts_before: datetime) -> int:
        row = await self._fetchone(PRUNE, {"dead": dead_before, "cron_dead": cron_dead_before, "attempts": attempts_before})
        self.commits += 1
        return int(row[0]) if row else 0

    async def notify_jobs(self, queues: Sequence[str]) -> None:
        if not queues:
            return
        with contextlib.suppress(LaneFailed):  # (a wake-up told twice wakes twice: no harm)
            if await self._on_sender((("notify", [_array(queues)]),)) is not None:
                return
        await self._fetchall(NOTIFY, (list(queues),))
