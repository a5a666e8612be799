"""The job queue's tables and SQL on SQLite (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Every write goes through the store's one writer thread, in one ``BEGIN IMMEDIATE``
transaction per call, so writes are serial across every process sharing the file: a claim
sees every seat taken before it, and the count behind the queue limit is exact. The claim
keeps the same seats as on PostgreSQL (a unique index guards them here too). SQLite has no
channel between processes: workers find work sent by other processes by polling.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from backend.errors import NotFound
from backend.jobs.definition import MAX_HELD
from backend.jobs.model import Attempt, Job, JobStatus, NotDead, QueueFull, QueueView, Sent
from backend.jobs.store import Claimed, Cycle, Finish, Handover, NewJob, QueueSpec, RunningJob
from backend.safetext import store_text
from backend.store.job_rows import (
    ATTEMPT_FIELDS,
    JOB_FIELDS,
    RUNNING_FIELDS,
    attempt_from_row,
    job_from_row,
    queue_full_message,
    running_from_row,
)
from backend.store.migrations import Component
from backend.store.sqlite.batches import delete_in_batches
from backend.store.sqlite.logs import PRUNE_JOB_LOGS
from backend.store.sqlite.sql import _dt, _us

__all__ = ["SQLiteJobs"]

T = TypeVar("T")

# ---------------------------------------------------------------------------------------
# SQL: everything the queue says to SQLite is here.
# ---------------------------------------------------------------------------------------
SCHEMA_V1 = """
    CREATE TABLE queues (
        name          TEXT PRIMARY KEY,
        concurrency   INTEGER NOT NULL,
        attempts      INTEGER NOT NULL,
        max_runtime_s REAL NOT NULL,
        paused        INTEGER NOT NULL DEFAULT 0,
        changed_by    TEXT,
        changed_at    INTEGER,
        defined_at    INTEGER NOT NULL
    );
    CREATE TABLE jobs (
        id            TEXT PRIMARY KEY,
        queue         TEXT NOT NULL,
        status        TEXT NOT NULL,
        payload       TEXT NOT NULL,
        key           TEXT,
        cron          TEXT,
        attempt       INTEGER NOT NULL DEFAULT 0,
        max_attempts  INTEGER NOT NULL,
        tries         INTEGER NOT NULL DEFAULT 0,
        run_after     INTEGER NOT NULL,
        created_at    INTEGER NOT NULL,
        started_at    INTEGER,
        instance      TEXT,
        token         TEXT,
        seat          INTEGER,
        deleted       INTEGER NOT NULL DEFAULT 0,
        dead_at       INTEGER,
        error_tag     TEXT,
        error_message TEXT
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX jobs_one_per_key ON jobs (queue, key) WHERE key IS NOT NULL;
    CREATE UNIQUE INDEX jobs_one_per_seat ON jobs (queue, seat) WHERE status = 'running';
    CREATE INDEX jobs_due ON jobs (queue, run_after, id) WHERE status = 'queued';
    CREATE INDEX jobs_dead ON jobs (queue, dead_at) WHERE status = 'dead';
    CREATE TABLE job_attempts (
        job_id        TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        queue         TEXT NOT NULL,
        attempt       INTEGER NOT NULL,
        started_at    INTEGER NOT NULL,
        finished_at   INTEGER NOT NULL,
        status        TEXT NOT NULL,
        error_tag     TEXT,
        error_message TEXT,
        instance      TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX job_attempts_by_age ON job_attempts (finished_at);
"""

JOB_COLUMNS = ", ".join(JOB_FIELDS)
DEFINE_QUEUE = """
    INSERT INTO queues (name, concurrency, attempts, max_runtime_s, defined_at) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, attempts = excluded.attempts,
        max_runtime_s = excluded.max_runtime_s, defined_at = excluded.defined_at
"""
ADD_QUEUE = (
    "INSERT INTO queues (name, concurrency, attempts, max_runtime_s, defined_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (name) DO NOTHING"
)
QUEUE_SETTINGS = "SELECT concurrency, attempts, paused FROM queues WHERE name = ?"
COUNT_HELD = "SELECT count(*) FROM jobs WHERE queue = ? AND status IN ('queued', 'dead') AND deleted = 0"
JOB_EXISTS = "SELECT 1 FROM jobs WHERE id = ?"
KEY_HOLDER = "SELECT id FROM jobs WHERE queue = ? AND key = ?"
INSERT_JOB = """
    INSERT INTO jobs (id, queue, status, payload, key, cron, max_attempts, run_after, created_at)
    VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?)
"""
# -- the worker cycle
FINISH_TARGET = "SELECT deleted FROM jobs WHERE id = ? AND tries = ? AND status = 'running'"
FINISH_DELETE = "DELETE FROM jobs WHERE id = ?"
FINISH_RETRY = """
    UPDATE jobs SET status = 'queued', seat = NULL, token = NULL, run_after = ?, error_tag = ?, error_message = ?
    WHERE id = ?
"""
FINISH_DEAD = """
    UPDATE jobs SET status = 'dead', seat = NULL, token = NULL, dead_at = ?, error_tag = ?, error_message = ?
    WHERE id = ?
"""
#: (A release never started: the job shows its last attempt's start and instance again.)
FINISH_RELEASE = """
    UPDATE jobs SET status = 'queued', seat = NULL, token = NULL, attempt = attempt - 1,
        started_at = (SELECT a.started_at FROM job_attempts a WHERE a.job_id = jobs.id ORDER BY a.seq DESC LIMIT 1),
        instance = (SELECT a.instance FROM job_attempts a WHERE a.job_id = jobs.id ORDER BY a.seq DESC LIMIT 1)
    WHERE id = ?
"""
#: This finish, recorded by a sending of it before (see Finish): the same end, instance and
#: error (the sweep's end of an attempt, `abandoned`, is not the attempt's own).
LANDED = (
    "SELECT 1 FROM job_attempts WHERE job_id = ? AND seq = ? AND finished_at = ? AND instance = ? AND status = ? "
    "AND error_tag IS ? AND error_message IS ?"
)
RECORD_ATTEMPT = """
    INSERT INTO job_attempts (job_id, seq, queue, attempt, started_at, finished_at, status, error_tag, error_message, instance)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING
"""
SEATS_TAKEN = "SELECT seat FROM jobs WHERE queue = ? AND status = 'running'"
DUE = """
    SELECT id, payload, key, cron, attempt, max_attempts, tries, created_at FROM jobs
    WHERE queue = ? AND status = 'queued' AND run_after <= ? ORDER BY run_after, id LIMIT ?
"""
CLAIM = """
    UPDATE jobs SET status = 'running', seat = ?, attempt = attempt + 1, tries = tries + 1,
        started_at = ?, instance = ?, token = ?
    WHERE id = ?
"""
NEXT_DUE = "SELECT min(run_after) FROM jobs WHERE queue = ? AND status = 'queued' AND run_after > ?"
RUNNING = f"SELECT {', '.join(RUNNING_FIELDS)} FROM jobs WHERE status = 'running'"
WAITING = """
    SELECT queue, count(*) FROM jobs WHERE status = 'queued' AND deleted = 0 AND run_after < ?
    GROUP BY queue ORDER BY queue
"""
# -- operator actions
CANCEL_BY_ID = "DELETE FROM jobs WHERE queue = ? AND id = ? AND status = 'queued' AND deleted = 0"
CANCEL_BY_KEY = "DELETE FROM jobs WHERE queue = ? AND key = ? AND status = 'queued' AND deleted = 0"
JOB_STATUS = "SELECT status FROM jobs WHERE queue = ? AND id = ? AND deleted = 0"
#: A running job deleted by an operator keeps its row (and its seat) until its handler
#: ends; it gives its key up at once and no longer shows.
DELETE_RUNNING = "UPDATE jobs SET deleted = 1, key = NULL WHERE id = ?"
RETRY_DEAD = """
    UPDATE jobs SET status = 'queued', attempt = 0, run_after = ?, dead_at = NULL, error_tag = NULL,
        error_message = NULL
    WHERE id = ?
"""
PAUSE = "UPDATE queues SET paused = ?, changed_by = ?, changed_at = ? WHERE name = ?"
QUEUES = "SELECT name, concurrency, paused FROM queues ORDER BY name"
COUNTS = "SELECT queue, status, count(*) FROM jobs WHERE deleted = 0 OR status = 'running' GROUP BY queue, status"
OLDEST_DUE = "SELECT queue, min(run_after) FROM jobs WHERE status = 'queued' AND run_after <= ? GROUP BY queue"
GET_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND deleted = 0"
ATTEMPTS = f"""
    SELECT queue, {", ".join(ATTEMPT_FIELDS)}
    FROM job_attempts WHERE job_id = ? ORDER BY seq
"""
# Each a batch (see :mod:`.batches`): its last parameter is how many rows at most.
PRUNE_DEAD = """
    DELETE FROM jobs WHERE id IN (
        SELECT id FROM jobs WHERE status = 'dead'
            AND ((cron IS NULL AND dead_at < ?) OR (cron IS NOT NULL AND dead_at < ?))
        LIMIT ?)
"""
PRUNE_ATTEMPTS = """
    DELETE FROM job_attempts WHERE (job_id, seq) IN (SELECT job_id, seq FROM job_attempts WHERE finished_at < ? LIMIT ?)
"""

# ---------------------------------------------------------------------------------------


def _apply(c: sqlite3.Connection, f: Finish) -> bool:
    # A handler's error is its own text: written as the PostgreSQL store writes it (a lone
    # surrogate SQLite cannot encode would fail the whole cycle, every queue's, for ever).
    tag, message = store_text(f.error_tag), store_text(f.error_message)
    row = c.execute(FINISH_TARGET, (f.id, f.tries)).fetchone()
    if row is not None:
        if f.kind == "succeeded" or row[0]:
            c.execute(FINISH_DELETE, (f.id,))
        elif f.kind == "retry":
            c.execute(FINISH_RETRY, (_us(f.retry_at), tag, message, f.id))
        elif f.kind == "dead":
            c.execute(FINISH_DEAD, (_us(f.finished_at), tag, message, f.id))
        else:
            c.execute(FINISH_RELEASE, (f.id,))
    elif f.kind != "release" and c.execute(
        LANDED,
        (f.id, f.tries, _us(f.finished_at), f.instance, "succeeded" if f.kind == "succeeded" else "failed", tag, message),
    ).fetchone() is not None:
        return True  # this finish, sent before: applied then (see Finish)
    elif f.swept or c.execute(JOB_EXISTS, (f.id,)).fetchone() is not None:
        # Displaced: the job went on without this attempt; its result is dropped. Or swept
        # from a read the job moved on from: whoever ran it recorded what ran.
        return False
    if f.kind != "release":
        status = "succeeded" if f.kind == "succeeded" else "failed"
        c.execute(
            RECORD_ATTEMPT,
            (f.id, f.tries, f.queue, f.attempt, _us(f.started_at), _us(f.finished_at), status, tag, message,
             f.instance),
        )  # fmt: skip
    return row is not None


class SQLiteJobs:
    """The :class:`~backend.jobs.store.JobStore` of the SQLite store."""

    COMPONENT = Component("jobs", (SCHEMA_V1,))
    job_notifications = False
    job_reservations = False
    job_streams = 1  # one writer thread: a second cycle would wait for the first

    def expect_jobs(self, *, sending: bool = False, cycling: bool = False) -> None:
        pass  # one connection, the writer's, open from the start

    _write: Callable[..., Any]
    _read: Callable[..., Any]

    async def define_queues(self, queues: Sequence[QueueSpec], at: datetime, *, update: bool) -> None:
        rows = [(q.name, q.concurrency, q.attempts, q.max_runtime_s, _us(at)) for q in queues]
        if rows:
            await self._write(lambda c: c.executemany(DEFINE_QUEUE if update else ADD_QUEUE, rows))

    async def send_jobs(
        self, queue: str, jobs: Sequence[NewJob], at: datetime, *, wake_later: Callable[[str], None] | None = None
    ) -> list[Sent]:
        # (No other process to wake: workers here poll the file; see notify_jobs.)
        created = _us(at)

        def send(c: sqlite3.Connection) -> list[Sent]:
            settings = c.execute(QUEUE_SETTINGS, (queue,)).fetchone()
            if settings is None:
                raise NotFound(f'no queue named "{queue}"')
            default = settings[1]
            held = c.execute(COUNT_HELD, (queue,)).fetchone()[0]
            answers: list[Sent] = []
            added = 0
            for job in jobs:
                if c.execute(JOB_EXISTS, (job.id,)).fetchone() is not None:
                    answers.append(Sent(job.id))  # our own earlier attempt
                    continue
                key = store_text(job.key)  # (the same key escapes the same way: duplicates still match)
                if key is not None:
                    holder = c.execute(KEY_HOLDER, (queue, key)).fetchone()
                    if holder is not None:
                        answers.append(Sent(holder[0], duplicate=True))
                        continue
                attempts = job.attempts if job.attempts is not None else default
                c.execute(INSERT_JOB, (job.id, queue, store_text(job.payload), key, job.cron, attempts, _us(job.run_after), created))
                answers.append(Sent(job.id))
                added += 1
            if added and held + added > MAX_HELD:
                # Raised inside the transaction: it rolls back, nothing of the batch stays.
                raise QueueFull(queue_full_message(queue, held, added, MAX_HELD), count=held, reason="queue full")
            return answers

        result: list[Sent] = await self._write(send)
        return result

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
        # Claims nothing ahead (job_reservations is False): the one writer's cycle is cheap.
        assert not handovers, "SQLite takes no handovers"
        at = _us(now)

        def cycle(c: sqlite3.Connection) -> Cycle:
            applied = [_apply(c, f) for f in finishes]
            claimed: list[Claimed] = []
            next_at: dict[str, datetime | None] = {}
            for queue, want in wanted.items():
                settings = c.execute(QUEUE_SETTINGS, (queue,)).fetchone()
                if settings is None or settings[2] or want <= 0:
                    next_at[queue] = None
                    continue
                concurrency = settings[0]
                taken = {row[0] for row in c.execute(SEATS_TAKEN, (queue,))}
                # A seat above the cap is held while a lowered cap drains: claim nothing.
                free = [] if taken and max(taken) > concurrency else [s for s in range(1, concurrency + 1) if s not in taken]
                if free:
                    rows = c.execute(DUE, (queue, at, min(want, len(free)))).fetchall()
                    for row, seat in zip(rows, free, strict=False):
                        c.execute(CLAIM, (seat, at, instance, token, row[0]))
                        created = _dt(row[7])
                        assert created is not None
                        claimed.append(Claimed(row[0], queue, row[1], row[2], row[3], row[4] + 1, row[5], row[6] + 1, created, now, seat))
                next_at[queue] = _dt(c.execute(NEXT_DUE, (queue, at)).fetchone()[0])
            return Cycle(applied, claimed, next_at)

        result: Cycle = await self._write(cycle)
        return result

    async def finish_jobs(self, finishes: Sequence[Finish]) -> list[bool]:
        if not finishes:
            return []
        result: list[bool] = await self._write(lambda c: [_apply(c, f) for f in finishes])
        return result

    async def running_jobs(self) -> list[RunningJob]:
        rows = await self._read(lambda c: c.execute(RUNNING).fetchall())
        return [running_from_row(row, _dt) for row in rows]

    async def waiting_jobs(self, due_before: datetime) -> dict[str, int]:
        rows = await self._read(lambda c: c.execute(WAITING, (_us(due_before),)).fetchall())
        return {queue: int(count) for queue, count in rows}

    async def cancel_job(self, queue: str, *, id: str | None = None, key: str | None = None) -> bool:
        sql, value = (CANCEL_BY_KEY, store_text(key)) if id is None else (CANCEL_BY_ID, id)
        result: bool = await self._write(lambda c: bool(c.execute(sql, (queue, value)).rowcount))
        return result

    async def delete_job(self, queue: str, job_id: str) -> bool:
        def delete(c: sqlite3.Connection) -> bool:
            row = c.execute(JOB_STATUS, (queue, job_id)).fetchone()
            if row is None:
                return False
            c.execute(DELETE_RUNNING if row[0] == "running" else FINISH_DELETE, (job_id,))
            return True

        result: bool = await self._write(delete)
        return result

    async def retry_job(self, queue: str, job_id: str, at: datetime) -> Job | None:
        def retry(c: sqlite3.Connection) -> Job | None:
            row = c.execute(JOB_STATUS, (queue, job_id)).fetchone()
            if row is None:
                return None
            if row[0] != "dead":
                raise NotDead(
                    f'job {job_id} of "{queue}" is {row[0]}, not dead: only a dead job can be retried',
                    reason="not dead",
                )
            c.execute(RETRY_DEAD, (_us(at), job_id))
            found = c.execute(GET_JOB, (job_id,)).fetchone()
            return job_from_row(found, _dt)

        result: Job | None = await self._write(retry)
        return result

    async def pause_queue(self, queue: str, paused: bool, by: str, at: datetime) -> bool:
        params = (int(paused), store_text(by), _us(at), queue)
        result: bool = await self._write(lambda c: c.execute(PAUSE, params).rowcount == 1)
        return result

    async def queue_views(self, now: datetime) -> list[QueueView]:
        def read(c: sqlite3.Connection) -> list[QueueView]:
            counts: dict[tuple[str, str], int] = {(q, s): n for q, s, n in c.execute(COUNTS)}
            oldest = {q: _dt(at) for q, at in c.execute(OLDEST_DUE, (_us(now),))}
            return [
                QueueView(
                    name,
                    concurrency,
                    bool(paused),
                    counts.get((name, "queued"), 0),
                    counts.get((name, "running"), 0),
                    counts.get((name, "dead"), 0),
                    oldest.get(name),
                )
                for name, concurrency, paused in c.execute(QUEUES).fetchall()
            ]

        result: list[QueueView] = await self._read(read)
        return result

    async def list_jobs(
        self, queue: str, *, status: JobStatus | None, limit: int, before: str | None
    ) -> list[Job]:
        sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE queue = ? AND deleted = 0"
        params: list[Any] = [queue]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        if before is not None:
            sql += " AND id < ?"
            params.append(before)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        # Parsed on the reading thread: a page of large payloads would hold the engine's loop.
        jobs: list[Job] = await self._read(lambda c: [job_from_row(row, _dt) for row in c.execute(sql, params).fetchall()])
        return jobs

    async def get_job(self, job_id: str) -> Job | None:
        row = await self._read(lambda c: c.execute(GET_JOB, (job_id,)).fetchone())
        return job_from_row(row, _dt) if row else None

    async def job_attempts(self, job_id: str) -> tuple[str | None, list[Attempt]]:
        rows = await self._read(lambda c: c.execute(ATTEMPTS, (job_id,)).fetchall())
        return (rows[0][0] if rows else None), [attempt_from_row(row[1:], _dt) for row in rows]

    async def prune_jobs(self, dead_before: datetime, cron_dead_before: datetime, attempts_before: datetime) -> int:
        dead, cron_dead, attempts = _us(dead_before), _us(cron_dead_before), _us(attempts_before)
        removed = await delete_in_batches(self._write, lambda c, n: int(c.execute(PRUNE_DEAD, (dead, cron_dead, n)).rowcount))
        # the attempts' logs, with them (not counted: a log is part of its attempt)
        await delete_in_batches(self._write, lambda c, n: int(c.execute(PRUNE_JOB_LOGS, (attempts, n)).rowcount))
        return removed + await delete_in_batches(self._write, lambda c, n: int(c.execute(PRUNE_ATTEMPTS, (attempts, n)).rowcount))

    async def notify_jobs(self, queues: Sequence[str]) -> None:
        """Nothing to tell: SQLite has no channel between processes (workers poll)."""

    async def watch_jobs(self, wake: Callable[[str | None], Any]) -> None:
        """Nothing to watch (see :meth:`notify_jobs`)."""
