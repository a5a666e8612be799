"""The embedded store: stdlib sqlite3 in WAL mode, one file, shared safely by processes.

Writes go through one writer thread that group-commits: whatever runs were handed in
while the previous commit was on disk are upserted in one transaction. So a thousand
schedules firing at the same second cost a handful of commits, not a thousand, and the
event loop never waits on the disk. Reads use their own connection on their own thread;
WAL lets them proceed while the writer commits, and lets the CLI read and act on the same
file while ``schedtui serve`` runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import queue
import socket
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InUse, NotFound, Refused, Unavailable
from ..ids import id_floor
from ..model import (
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    InstanceInfo,
    Run,
    ScheduleState,
    StoreHealth,
    unique_claims,
)
from . import Unfinished
from .migrations import components_of, migrate_sqlite
from .rows import BACKFILL_FIELDS, RUN_FIELDS, RUN_WRITE_FIELDS, backfill_from_row, run_from_row
from .sqlite_audit import SQLiteAudit
from .sqlite_events import SQLiteEvents
from .sqlite_catalog import SQLiteCatalog
from .sqlite_jobs import SQLiteJobs
from .sqlite_locks import SQLiteLocks
from .sqlite_durable import SQLiteDurable

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

# ---------------------------------------------------------------------------------------
# SQL: everything this store says to SQLite is here.
# ---------------------------------------------------------------------------------------

#: Each entry moves the schema up one version; applied in order inside BEGIN IMMEDIATE.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id            TEXT PRIMARY KEY,
        name          TEXT NOT NULL,
        scheduled_at  INTEGER NOT NULL,
        fired_at      INTEGER,
        finished_at   INTEGER,
        status        TEXT NOT NULL,
        trigger       TEXT NOT NULL,
        outcome       TEXT NOT NULL,
        instance      TEXT NOT NULL,
        error_tag     TEXT,
        error_message TEXT
    ) WITHOUT ROWID;
    CREATE INDEX runs_by_name ON runs (name, id);
    CREATE INDEX runs_by_slot ON runs (name, scheduled_at) WHERE trigger <> 'manual';
    CREATE INDEX runs_running ON runs (status) WHERE status = 'running';
    CREATE TABLE schedule_state (
        name       TEXT PRIMARY KEY,
        enabled    INTEGER NOT NULL,
        changed_by TEXT NOT NULL,
        changed_at INTEGER NOT NULL,
        note       TEXT
    );
    CREATE TABLE instances (
        instance     TEXT PRIMARY KEY,
        host         TEXT NOT NULL,
        pid          INTEGER NOT NULL,
        heartbeat_at INTEGER NOT NULL
    );
    CREATE TABLE backfills (
        id           TEXT PRIMARY KEY,
        name         TEXT NOT NULL,
        range_start  INTEGER NOT NULL,
        range_end    INTEGER NOT NULL,
        total        INTEGER NOT NULL,
        fired        INTEGER NOT NULL,
        failed       INTEGER NOT NULL,
        state        TEXT NOT NULL,
        instance     TEXT NOT NULL,
        started_at   INTEGER NOT NULL,
        finished_at  INTEGER,
        current_slot INTEGER
    );
    CREATE UNIQUE INDEX backfills_one_running ON backfills (name) WHERE state = 'running';
    CREATE TABLE claims (
        key        TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        instance   TEXT NOT NULL,
        claimed_at INTEGER NOT NULL,
        run_id     TEXT NOT NULL
    );
    CREATE INDEX claims_by_name ON claims (name, claimed_at);
    CREATE INDEX claims_by_age ON claims (claimed_at);
    """,
    """
    ALTER TABLE instances ADD COLUMN last_fired_at INTEGER;
    """,
    """
    ALTER TABLE instances ADD COLUMN starting_at INTEGER;
    """,
    # Runs are read in scheduled order (a backfill's old slots land among their peers).
    """
    DROP INDEX runs_by_name;
    CREATE INDEX runs_by_name_slot ON runs (name, scheduled_at, id);
    """,
    """
    ALTER TABLE runs ADD COLUMN traceback TEXT;
    """,
)

RUN_COLUMNS = ", ".join(RUN_FIELDS)
RUN_WRITE_COLUMNS = ", ".join(RUN_WRITE_FIELDS)
_KEEP_CLOSED = ",\n        ".join(
    f"{c} = CASE WHEN runs.status = 'running' THEN excluded.{c} ELSE runs.{c} END"
    for c in RUN_WRITE_FIELDS[1:]
    if c != "error_message"
)
#: What a finished run's row gains when another version of it arrives late (an instance
#: frozen past the abandon window, whose run was closed meanwhile): one sentence appended
#: to its error message. The row itself stays as it was closed.
LATE_NOTE = """
    'late result from instance ' || excluded.instance
    || coalesce(' at ' || strftime('%Y-%m-%dT%H:%M:%SZ', excluded.finished_at / 1000000, 'unixepoch'), '')
    || ': ' || excluded.status
    || coalesce(' [' || excluded.error_tag || ']', '')
    || coalesce(' ' || substr(excluded.error_message, 1, 200), '')
"""
#: A run's row is replaced while it is ``running``; once closed it stays closed: a later,
#: different outcome only adds LATE_NOTE (once), and a late ``running`` version changes
#: nothing. Writing the same finished version again changes nothing either.
UPSERT_RUN = f"""
    INSERT INTO runs ({RUN_WRITE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET
        {_KEEP_CLOSED},
        error_message = CASE WHEN runs.status = 'running' THEN excluded.error_message
            ELSE coalesce(runs.error_message || '; ', '') || {LATE_NOTE} END
    WHERE runs.status = 'running' OR (
        excluded.status <> 'running'
        AND NOT (excluded.status = runs.status AND excluded.error_tag IS runs.error_tag
                 AND excluded.finished_at IS runs.finished_at)
        AND instr(coalesce(runs.error_message, ''), {LATE_NOTE}) = 0
    )
"""
CLOSE_RUN = """
    UPDATE runs SET status = ?, finished_at = ?, error_tag = ?, error_message = ?
    WHERE id = ? AND status = 'running'
"""
GET_RUN = f"SELECT {RUN_WRITE_COLUMNS} FROM runs WHERE id = ?"
LIST_RUNS = f"SELECT {RUN_COLUMNS} FROM runs WHERE name = ? ORDER BY scheduled_at DESC, id DESC LIMIT ?"
LIST_RUNS_BEFORE = f"""
    SELECT {RUN_COLUMNS} FROM runs
    WHERE name = ?1 AND (scheduled_at, id) < (SELECT scheduled_at, id FROM runs WHERE id = ?2)
    ORDER BY scheduled_at DESC, id DESC LIMIT ?3
"""
#: The newest self/external slot's run per name (the partial index runs_by_slot), or with
#: LATEST_RUNS the newest run of any trigger.
LAST_RUNS = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE id IN (
        SELECT (SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual'
                ORDER BY scheduled_at DESC, id DESC LIMIT 1)
        FROM json_each(?) AS n
    )
"""
LATEST_RUNS = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE id IN (
        SELECT (SELECT id FROM runs WHERE name = n.value ORDER BY scheduled_at DESC, id DESC LIMIT 1)
        FROM json_each(?) AS n
    )
"""
RUNS_BETWEEN = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE name = ? AND scheduled_at >= ? AND scheduled_at < ?
    ORDER BY scheduled_at DESC, id DESC LIMIT ?
"""
LAST_SLOT = "SELECT max(scheduled_at) FROM runs WHERE name = ? AND trigger <> 'manual'"
RUNNING_RUNS = f"SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running'"
PRUNE_RUNS = "DELETE FROM runs WHERE id < ? AND status <> 'running'"
GET_STATES = "SELECT name, enabled, changed_by, changed_at, note FROM schedule_state"
SET_STATE = """
    INSERT INTO schedule_state (name, enabled, changed_by, changed_at, note) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at, note = excluded.note
"""
HEARTBEAT = """
    INSERT INTO instances (instance, host, pid, heartbeat_at) VALUES (?, ?, ?, ?)
    ON CONFLICT (instance) DO UPDATE SET host = excluded.host, pid = excluded.pid,
        heartbeat_at = excluded.heartbeat_at
"""
INSTANCES = "SELECT instance, host, pid, heartbeat_at FROM instances"
INSTANCE_LIST = "SELECT instance, host, pid, heartbeat_at, last_fired_at FROM instances ORDER BY instance"
#: Kept by the group commit, in its transaction: when this instance last started a run.
NOTE_LAST_FIRED = "UPDATE instances SET last_fired_at = max(coalesce(last_fired_at, 0), ?) WHERE instance = ?"
FORGET_INSTANCE = "DELETE FROM instances WHERE instance = ?"
MARK_STARTING = "UPDATE instances SET starting_at = ? WHERE instance = ?"
STARTING_MARKS = "SELECT instance, starting_at FROM instances WHERE starting_at IS NOT NULL"
CLEAR_STARTING = "UPDATE instances SET starting_at = NULL WHERE instance = ? AND starting_at = ?"
SLOT_RECORDED = "SELECT 1 FROM runs WHERE name = ? AND scheduled_at = ? AND trigger <> 'manual' LIMIT 1"
BACKFILL_COLUMNS = ", ".join(BACKFILL_FIELDS)
INSERT_BACKFILL = f"INSERT INTO backfills ({BACKFILL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
UPDATE_BACKFILL = """
    UPDATE backfills SET fired = ?, failed = ?, state = ?, finished_at = ?, current_slot = ?
    WHERE id = ?
"""
GET_BACKFILL = f"SELECT {BACKFILL_COLUMNS} FROM backfills WHERE id = ?"
RUNNING_BACKFILLS = f"SELECT {BACKFILL_COLUMNS} FROM backfills WHERE state = 'running'"
PRUNE_BACKFILLS = "DELETE FROM backfills WHERE state <> 'running' AND started_at < ?"
CLAIM = "INSERT INTO claims (key, name, instance, claimed_at, run_id) VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING"
CLAIMED_RUN = "SELECT run_id FROM claims WHERE key = ?"
SLOT_TAKEN = """
    SELECT 1 FROM runs WHERE name = ? AND scheduled_at = ? AND trigger <> 'manual'
        AND outcome IN ('wonLock', 'external') LIMIT 1
"""
INSERT_PLACEHOLDER = """
    INSERT INTO runs (id, name, scheduled_at, status, trigger, outcome, instance)
    VALUES (?, ?, ?, 'running', ?, ?, ?) ON CONFLICT (id) DO NOTHING
"""
BUSY_ELSEWHERE = """
    SELECT id FROM runs WHERE status = 'running' AND name = ? AND instance <> ?
        AND (fired_at IS NOT NULL OR scheduled_at < ?)
    ORDER BY id LIMIT 1
"""
PRUNE_OWN_CLAIMS = "DELETE FROM claims WHERE name = ? AND claimed_at < ?"
SWEEP_CLAIMS = "DELETE FROM claims WHERE claimed_at < ?"
COUNT_CLAIMS = "SELECT count(*) FROM claims"

# ---------------------------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _us(dt: datetime | None) -> int | None:
    """Microseconds since the epoch, exactly (floats would round)."""
    return None if dt is None else (dt - _EPOCH) // _MICROSECOND


def _dt(us: int | None) -> datetime | None:
    # timedelta * int is exact, and twice as fast as timedelta(microseconds=us).
    return None if us is None else _EPOCH + _MICROSECOND * us


def _run_params(run: Run) -> tuple[Any, ...]:
    return (
        run.id,
        run.name,
        _us(run.scheduled_at),
        _us(run.fired_at),
        _us(run.finished_at),
        run.status,
        run.trigger,
        run.coordination_outcome,
        run.instance,
        run.error_tag,
        run.error_message,
        run.traceback,
    )


def _run(row: tuple[Any, ...]) -> Run:
    return run_from_row(row, _dt)


def _backfill(row: tuple[Any, ...]) -> BackfillProgress:
    return backfill_from_row(row, _dt)


def _connect(path: str, *, create: bool = True) -> sqlite3.Connection:
    if create:
        conn = sqlite3.connect(path, timeout=15.0, isolation_level=None, check_same_thread=False)
    else:
        # mode=rw opens an existing file and never creates one: a typo must not make a store.
        uri = f"file:{urllib.parse.quote(path)}?mode=rw"
        conn = sqlite3.connect(uri, uri=True, timeout=15.0, isolation_level=None, check_same_thread=False)
    for attempt in range(50):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError:
            # Switching a fresh file to WAL while another process does the same can report
            # "database is locked" at once, without waiting on the busy handler.
            if attempt == 49:
                conn.close()
                raise
            time.sleep(0.02 * (attempt + 1))
    # NORMAL under WAL survives a process crash; only an OS crash can lose the last commits.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA busy_timeout = 15000")
    return conn


def _is_trouble(exc: BaseException) -> bool:
    """True for a problem of the database file itself (full, locked, unreadable, read-only,
    corrupt): the same write may succeed later. A problem of one statement's data
    (a constraint, a value SQLite cannot bind) is not: retrying it changes nothing."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


def _is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the write lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (5, 6)


_STOP = object()
_WAKE = object()

#: Most run rows per write transaction: a burst is still one commit, and a disk with
#: little room left takes a backlog a part at a time.
_WRITE_CHUNK = 5_000
#: The pause between attempts while the ledger cannot be written (seconds; grows to the max).
_RETRY_MIN, _RETRY_MAX = 0.25, 2.0
#: How often the writer checks that its path still names the file it has open (seconds).
_FILE_CHECK = 1.0
#: After the first warning about failing writes, another at most this often (seconds).
_WARN_EVERY = 60.0
#: SQLite's own ceiling for max_page_count (what lifts a test's limit).
_MAX_PAGES = 4_294_967_294


class _Flush:
    """A wait for every run handed in before it to be committed."""

    __slots__ = ("deadline", "future", "target")

    def __init__(self, patience: float) -> None:
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.deadline = time.monotonic() + patience
        self.target = 0


class _Peek:
    """A read on the writer's own connection, outside any transaction (see
    :mod:`backend.store.sqlite_events`)."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


class _Writer(threading.Thread):
    """Owns the write connection; group-commits run upserts; runs other writes in order.

    Runs that cannot be written (a full disk, a file locked or unreadable) are never
    dropped: they stay in :attr:`pending`, the latest version of each in hand-in order,
    and are retried with backoff until they are written. A write handed in after them
    does not overtake them: while they cannot be written it fails at once, naming the
    cause (:class:`Unavailable`).
    """

    def __init__(self, path: str, *, create: bool) -> None:
        super().__init__(name="schedtui-sqlite-writer", daemon=True)
        self.path = path
        self.create = create
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.commits = 0
        self.rows_written = 0
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.lock = threading.Lock()
        self.queued = 0
        """Rows handed in and not yet taken by the writer (under :attr:`lock`)."""
        self.pending: dict[str, tuple[Run, int]] = {}
        """Writer thread only: run id -> (its latest version, the hand-in it came with).
        Re-inserted on every new version, so the first entry is the oldest hand-in."""
        self.taken = 0  # hand-ins taken from the queue so far
        self.flushes: list[_Flush] = []
        # trouble: set while the ledger cannot be written, cleared when it can again
        self.error: str | None = None
        self.since: datetime | None = None
        self.lost = False
        self.failures = 0
        self.written_meanwhile = 0
        self.next_try = 0.0
        self.warned_at = 0.0
        self.identity: tuple[int, int] | None = None
        self.checked_at = 0.0
        self.page_limit: int | None = None  # the test seam of SQLiteStore.limit_pages
        self.applied_limit: int | None = None
        self.crashed = False
        self.marker: sqlite3.Connection | None = None
        """The connection :meth:`mark_now` writes on (from the event loop's thread)."""
        self.marker_lock = threading.Lock()
        self.marks_now = 0
        """Commits made by :meth:`mark_now`."""

    def run(self) -> None:
        try:
            conn = _connect(self.path, create=self.create)
            st = os.stat(self.path)
            self.identity = (st.st_dev, st.st_ino)
            marker = _connect(self.path, create=False)
            marker.execute("PRAGMA busy_timeout = 0")  # never waits for the write lock: the writer does
            marker.execute("PRAGMA wal_autocheckpoint = 0")  # never checkpoints: the writer does
            self.marker = marker
            self.ready.set_result(None)
        except Exception as exc:  # surfaced by open()
            self.ready.set_exception(exc)
            return
        try:
            self._loop(conn)
        except BaseException as exc:
            self.crashed = True
            log.exception('the ledger writer of "%s" stopped', self.path)
            for flush in self.flushes:
                flush.future.set_exception(Unavailable(f'the ledger writer of "{self.path}" stopped: {exc}'))
            raise
        finally:
            with self.marker_lock:
                self.marker = None
            marker.close()
            conn.close()

    def mark_now(self, params: tuple[int | None, str]) -> bool:
        """Commit the burst mark (:data:`MARK_STARTING`) on the caller's thread, if that can
        be done at once; False (nothing written) otherwise.

        A burst's handlers wait for its mark: written here it takes one small autocommit
        (no fsync under WAL and synchronous=NORMAL) instead of two thread hand-offs, each a
        wake-up that costs a few hundred microseconds on a busy machine. Only while the
        writer has nothing in hand (no rows queued or being written, no other write queued,
        no trouble), so nothing handed in before is overtaken; and never waiting for a lock
        (another write in progress: False). The file's identity is not checked here (a
        stat is a syscall on the burst's path): the writer checks it before every write,
        the burst's rows included, and a store whose file was replaced keeps nothing anyway."""
        if self.crashed or self.lost or self.error is not None or not self.marker_lock.acquire(blocking=False):
            return False
        try:
            with self.lock:
                if self.queued or self.pending or not self.jobs.empty():
                    return False
            marker = self.marker
            if marker is None:
                return False
            try:
                marker.execute(MARK_STARTING, params)
            except sqlite3.Error:
                return False  # a write in progress (busy), or trouble the writer will name
            self.marks_now += 1
            return True
        finally:
            self.marker_lock.release()

    # -- the loop ----------------------------------------------------------------------
    def _loop(self, conn: sqlite3.Connection) -> None:
        while True:
            timeout = _FILE_CHECK
            if self.pending and not self.lost:
                timeout = max(0.0, min(timeout, self.next_try - time.monotonic()))
            try:
                items = [self.jobs.get(timeout=timeout)]
            except queue.Empty:
                items = []
            with contextlib.suppress(queue.Empty):
                while len(items) < 50_000:
                    items.append(self.jobs.get_nowait())
            stop = tried = False  # while failing, one attempt per round is enough
            for item in items:
                if item is _STOP:
                    stop = True
                elif item is _WAKE:
                    pass
                elif isinstance(item, list):
                    self._take(item)
                elif isinstance(item, _Peek):
                    if item.future.set_running_or_notify_cancel():
                        try:
                            item.future.set_result(item.fn(conn))
                        except BaseException as exc:
                            item.future.set_exception(exc)
                elif isinstance(item, _Flush):
                    if item.future.set_running_or_notify_cancel():
                        item.target = self.taken
                        self.flushes.append(item)
                else:
                    fn, fut = item
                    if not fut.set_running_or_notify_cancel():
                        continue
                    self._check_file(force=True)
                    if self.lost or not self._write_pending(conn, now=not tried):
                        tried = True
                        fut.set_exception(self.unavailable())
                        continue
                    try:
                        fut.set_result(self._transaction(conn, fn))
                    except BaseException as exc:
                        if _is_trouble(exc):
                            self._failed(exc)
                        fut.set_exception(exc)
                    else:
                        self._recovered()
            if not tried and (self.flushes or self.error is None or time.monotonic() >= self.next_try):
                self._write_pending(conn, now=True)
            self._settle_flushes()
            self._check_file()
            if stop:
                return

    def _take(self, runs: list[Run]) -> None:
        self.taken += 1
        for run in runs:
            self.pending.pop(run.id, None)  # keep hand-in order: the latest version last
            self.pending[run.id] = (run, self.taken)
        # Only now: mark_now must never see them neither queued nor pending.
        with self.lock:
            self.queued -= len(runs)

    def _committed_upto(self) -> int:
        """Every hand-in up to this one is committed."""
        for _, taken in self.pending.values():
            return taken - 1
        return self.taken

    def _settle_flushes(self) -> None:
        if not self.flushes:
            return
        upto, now, keep = self._committed_upto(), time.monotonic(), []
        for flush in self.flushes:
            if upto >= flush.target:
                flush.future.set_result(None)
            elif self.error is not None and (self.lost or now >= flush.deadline):
                flush.future.set_exception(self.unavailable())
            else:
                keep.append(flush)
        self.flushes = keep

    # -- writing -----------------------------------------------------------------------
    def _write_pending(self, conn: sqlite3.Connection, *, now: bool) -> bool:
        """Commit the pending runs, oldest hand-in first; True once none is left. While
        failing, only tries when ``now`` or when the backoff has passed."""
        if not self.pending:
            return True
        if self.lost or (self.error is not None and not now and time.monotonic() < self.next_try):
            return False
        self._check_file(force=True)
        if self.lost:
            return False
        written = 0
        try:
            while self.pending:
                chunk = [run for run, _ in itertools.islice(self.pending.values(), _WRITE_CHUNK)]
                try:
                    self._upsert(conn, chunk)
                except Exception as exc:
                    if _is_trouble(exc):
                        raise
                    self._upsert_each(conn, chunk, exc)
                for run in chunk:
                    del self.pending[run.id]
                written += len(chunk)
        except Exception as exc:
            self._failed(exc, written)
            return False
        self._recovered(written)
        return True

    def _upsert(self, conn: sqlite3.Connection, runs: list[Run]) -> None:
        params = [_run_params(run) for run in runs]
        started: dict[str, int] = {}  # instance -> the latest fired_at among its runs here
        for row in params:
            fired, status, instance = row[3], row[5], row[8]
            if fired is not None and status not in ("skipped", "missed") and fired > started.get(instance, -1):
                started[instance] = fired

        def write(c: sqlite3.Connection) -> None:
            c.executemany(UPSERT_RUN, params)
            c.executemany(NOTE_LAST_FIRED, [(fired, instance) for instance, fired in started.items()])

        self._transaction(conn, write)
        self.rows_written += len(params)

    def _upsert_each(self, conn: sqlite3.Connection, runs: list[Run], why: Exception) -> None:
        """A batch the database refused for its data, not for its state: write it row by
        row, so one bad row costs only itself (it could never be written)."""
        log.warning("the ledger refused a batch of %d run(s) (%s); writing them one by one", len(runs), why)
        for run in runs:
            try:
                self._upsert(conn, [run])
            except Exception as exc:
                if _is_trouble(exc):
                    raise
                log.error("run %s of %s cannot be written to the ledger: %s", run.id, run.name, exc)

    def _transaction(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self.page_limit != self.applied_limit:
            if self.page_limit is None:
                conn.execute(f"PRAGMA max_page_count = {_MAX_PAGES}")
            else:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count = {pages + self.page_limit}")
            self.applied_limit = self.page_limit
        for attempt in range(20):
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if attempt == 19 or not _is_busy(exc):
                    raise
                time.sleep(0.05 * (attempt + 1))  # another process holds the write lock
                continue
            try:
                result = fn(conn)
                conn.execute("COMMIT")
                self.commits += 1
                return result
            except BaseException:
                # SQLite rolls back by itself on some errors (SQLITE_FULL among them); a
                # ROLLBACK then fails with "no transaction is active" and would hide why.
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        raise AssertionError("unreachable")

    # -- trouble -----------------------------------------------------------------------
    def _failed(self, exc: BaseException, written: int = 0) -> None:
        now = time.monotonic()
        first = self.error is None
        self.error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self.written_meanwhile += written
        if first:
            self.since = datetime.now(timezone.utc)
            self.failures = 0
        self.failures += 1
        self.next_try = now + min(_RETRY_MAX, _RETRY_MIN * 2 ** min(self.failures - 1, 8))
        if first:
            self.warned_at = now
            log.warning(
                'cannot write %d run(s) to the ledger "%s": %s; they are kept and retried',
                len(self.pending), self.path, self.error,
            )
        elif now - self.warned_at >= _WARN_EVERY:
            self.warned_at = now
            log.warning(
                'still cannot write %d run(s) to the ledger "%s" (since %s): %s',
                len(self.pending), self.path, self.since.isoformat(timespec="seconds") if self.since else "?", self.error,
            )

    def _recovered(self, written: int = 0) -> None:
        if self.error is None or self.lost or self.pending:
            return
        log.info('run ledger "%s" writable again; %d run(s) written', self.path, self.written_meanwhile + written)
        self.error = self.since = None
        self.failures = self.written_meanwhile = 0

    def _check_file(self, *, force: bool = False) -> None:
        """Notice when the path no longer names the file this writer has open (deleted, or
        replaced): what it writes from then on would vanish with the process."""
        if self.lost or self.identity is None:
            return
        now = time.monotonic()
        if not force and now - self.checked_at < _FILE_CHECK:
            return
        self.checked_at = now
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            return  # cannot look (permissions, a stale mount): no verdict
        else:
            if (st.st_dev, st.st_ino) == self.identity:
                return
        self.lost = True
        self.error = "the store file was deleted or replaced while in use"
        self.since = datetime.now(timezone.utc)
        log.error(
            'the store file "%s" was deleted or replaced while in use: nothing written from now on would '
            "survive (%d run(s) not written); restore the file, or restart to create a new store",
            self.path, len(self.pending),
        )

    def unavailable(self) -> Unavailable:
        if self.lost:
            return Unavailable(
                f'the store file "{self.path}" was deleted or replaced while in use; nothing written now would survive'
            )
        return Unavailable(
            f'the store "{self.path}" cannot be written: {self.error} '
            f"({len(self.pending)} run(s) waiting; they are kept and retried)"
        )

    def health(self) -> StoreHealth:
        waiting = self.queued + len(self.pending)
        if self.lost:
            return StoreHealth("lost", self.error, waiting, self.since)
        if self.crashed:
            return StoreHealth("failing", "the ledger writer stopped (see the log)", waiting, self.since)
        if self.error is not None:
            return StoreHealth("failing", self.error, waiting, self.since)
        return StoreHealth("ok", waiting=waiting)


class SQLiteStore(SQLiteJobs, SQLiteCatalog, SQLiteDurable, SQLiteLocks, SQLiteAudit, SQLiteEvents):
    """The embedded store. ``SQLiteStore(path)``; ``":memory:"`` is not supported (two connections).

    ``create=False`` refuses a file that does not exist (:class:`NotFound`, naming it) instead
    of creating an empty store there: at once, and again in :meth:`open`.
    """

    kind = "sqlite"
    default_coordination: CoordinationMode = "single"

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.create = create
        self.close_patience = 10.0
        """Seconds :meth:`close` keeps retrying runs that cannot be written before it gives up
        on them (and logs each one, so that none is lost without a trace)."""
        self._writer: _Writer | None = None
        self._last_writer: _Writer | None = None  # its counters outlive close()
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._firing_lock: int | None = None
        if not create:
            self._require_file()

    @property
    def commits(self) -> int:
        """Transactions committed by this store's writer, and by :meth:`mark_starting_now`
        (also after close)."""
        writer = self._last_writer
        return writer.commits + writer.marks_now if writer else 0

    @property
    def rows_written(self) -> int:
        """Run rows upserted by this store's writer (also after close)."""
        return self._last_writer.rows_written if self._last_writer else 0

    @property
    def firing_lock_path(self) -> Path:
        """The file whose lock marks the one process firing this store's schedules."""
        return self.path.with_name(self.path.name + ".firing-lock")

    def _require_file(self) -> None:
        if not self.path.is_file():
            raise NotFound(
                f'no store at "{os.path.abspath(self.path)}" (no such file); check --store and the working '
                "directory (only `schedtui serve` and `schedtui demo` create a store)"
            )

    async def open(self) -> None:
        if self.create:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise Unavailable(f'cannot create the folder for the store "{self.path}": {exc}') from exc
        else:
            self._require_file()
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="schedtui-sqlite-reader")
        writer = _Writer(str(self.path), create=self.create)
        writer.start()
        try:
            await asyncio.wrap_future(writer.ready)
        except sqlite3.Error as exc:
            if not self.create and not self.path.exists():
                self._require_file()  # deleted in between: say so plainly
            raise Unavailable(f'cannot open the store "{self.path}": {exc}') from exc
        self._writer = self._last_writer = writer
        await self._write(self._migrate)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        self._migrate_core(conn)
        migrate_sqlite(conn, components_of(type(self)))

    @staticmethod
    def _migrate_core(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = row[0] if row else 0
        if version > len(MIGRATIONS):
            raise Unavailable(
                f"the store's schema is version {version}, newer than this schedtui knows ({len(MIGRATIONS)}); "
                "upgrade schedtui before opening it"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            log.info("store schema migrated to version %d", number)
        if row is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS),))
        elif version != len(MIGRATIONS):
            conn.execute("UPDATE schema_version SET version = ?", (len(MIGRATIONS),))

    async def close(self) -> None:
        if self._writer is not None:
            writer = self._writer
            try:
                await self._flush(self.close_patience)
            except Unavailable as exc:
                log.error("closing the store with run(s) not written: %s", exc)
            writer.jobs.put(_STOP)
            await asyncio.to_thread(writer.join)
            self._writer = None
            for run, _ in writer.pending.values():
                # The last resort: the log is the only place left that can keep it.
                log.error("run not written to the ledger: %s", json.dumps(run.to_json(), ensure_ascii=False))
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(reader.submit(self._close_reader))
            reader.shutdown(wait=False)
        if self._firing_lock is not None:
            fd, self._firing_lock = self._firing_lock, None
            os.close(fd)  # releases the lock

    def _close_reader(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    # -- health and the one firer ---------------------------------------------------------
    def health(self) -> StoreHealth:
        writer = self._writer or self._last_writer
        return writer.health() if writer is not None else StoreHealth("ok")

    def limit_pages(self, extra: int | None) -> None:
        """Test seam: let the file grow by at most ``extra`` more pages (``None`` lifts the
        limit). Past it SQLite fails writes with SQLITE_FULL, exactly as on a full disk."""
        if self._writer is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        self._writer.page_limit = extra
        self._writer.jobs.put(_WAKE)

    async def take_firing_lock(self, instance: str) -> None:
        if self._firing_lock is None:
            self._firing_lock = await asyncio.to_thread(self._lock_firing, instance)

    def _lock_firing(self, instance: str) -> int:
        path = self.firing_lock_path
        if self.create:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise Unavailable(f'cannot create the firing lock "{path}": {exc}') from exc
        try:
            # flock: held by this open file, released by the kernel when the process ends,
            # however it ends (SIGKILL too); not inherited across exec.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise Unavailable(f'cannot lock "{path}": {exc}') from exc
            raise InUse(self._in_use_message(path)) from None
        holder = {
            "instance": instance,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return fd

    def _in_use_message(self, path: Path) -> str:
        try:
            holder = json.loads(path.read_text() or "{}")
            who = f'instance "{holder["instance"]}" (pid {holder["pid"]} on {holder["host"]}, since {holder["since"]})'
        except (OSError, ValueError, KeyError, TypeError):
            who = "another process"
        return (
            f'refusing to fire: {who} already fires the schedules of the store "{os.path.abspath(self.path)}"; '
            "two firing processes on one SQLite file would run every slot twice. Stop that one first "
            "(the other verbs, and a console without --fire, work beside it; several firing instances need PostgreSQL)"
        )

    # -- plumbing -------------------------------------------------------------------------
    def _open_writer(self) -> _Writer:
        writer = self._writer
        if writer is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        if writer.crashed:
            raise Unavailable(f'the ledger writer of "{self.path}" stopped (see the log)')
        return writer

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._open_writer().jobs.put((fn, fut))
        try:
            return await asyncio.wrap_future(fut)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise Unavailable(f'the store "{self.path}" is unavailable: {exc}') from exc

    async def _peek(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the writer's connection, between its transactions (a read only)."""
        peek = _Peek(fn)
        self._open_writer().jobs.put(peek)
        try:
            result: T = await asyncio.wrap_future(peek.future)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise Unavailable(f'the store "{self.path}" is unavailable: {exc}') from exc
        return result

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._read_conn is None:
                self._read_conn = _connect(str(self.path), create=False)
            return fn(self._read_conn)

        if self._reader is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        try:
            return await asyncio.wrap_future(self._reader.submit(job))
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise Unavailable(f'the store "{self.path}" is unavailable: {exc}') from exc

    # -- runs -----------------------------------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        writer = self._open_writer()
        batch = list(runs)
        with writer.lock:
            writer.queued += len(batch)
        writer.jobs.put(batch)

    async def flush(self) -> None:
        """Return once every run handed in before is committed. While they cannot be
        written (a full disk), raise :class:`Unavailable` naming the cause as soon as an
        attempt to write them fails; they stay queued and are retried."""
        await self._flush(0.0)

    async def _flush(self, patience: float) -> None:
        flush = _Flush(patience)
        self._open_writer().jobs.put(flush)
        await asyncio.wrap_future(flush.future)

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._read(lambda c: c.execute(GET_RUN, (run_id,)).fetchone())
        return _run(row) if row else None

    async def list_runs(self, name: str, *, limit: int, before: str | None = None) -> list[Run]:
        if before:
            rows = await self._read(lambda c: c.execute(LIST_RUNS_BEFORE, (name, before, limit)).fetchall())
        else:
            rows = await self._read(lambda c: c.execute(LIST_RUNS, (name, limit)).fetchall())
        return [_run(row) for row in rows]

    async def last_runs(self, names: Iterable[str], *, manual: bool = False) -> dict[str, Run]:
        payload, sql = json.dumps(list(names)), LATEST_RUNS if manual else LAST_RUNS
        rows = await self._read(lambda c: c.execute(sql, (payload,)).fetchall())
        return {row[1]: _run(row) for row in rows}

    async def runs_between(
        self, names: Iterable[str], start: datetime, end: datetime, *, limit_per_name: int
    ) -> dict[str, list[Run]]:
        wanted, low, high = list(names), _us(start), _us(end)

        def read(c: sqlite3.Connection) -> dict[str, list[Run]]:
            found = {}
            for name in wanted:  # one index range per name, on the reader's thread
                rows = c.execute(RUNS_BETWEEN, (name, low, high, limit_per_name)).fetchall()
                if rows:
                    found[name] = [_run(row) for row in rows]
            return found

        return await self._read(read)

    async def last_slots(self, names: Iterable[str]) -> dict[str, datetime]:
        wanted = sorted(set(names))

        def read(c: sqlite3.Connection) -> dict[str, datetime]:
            found: dict[str, datetime] = {}
            for name in wanted:  # one index probe per name, on the reader's thread
                row = c.execute(LAST_SLOT, (name,)).fetchone()
                if row and row[0] is not None:
                    found[name] = _EPOCH + _MICROSECOND * row[0]
            return found

        return await self._read(read) if wanted else {}

    async def running_runs(self) -> list[Run]:
        rows = await self._read(lambda c: c.execute(RUNNING_RUNS).fetchall())
        return [_run(row) for row in rows]

    async def close_run(self, run: Run) -> bool:
        params = (run.status, _us(run.finished_at), run.error_tag, run.error_message, run.id)
        return await self._write(lambda c: c.execute(CLOSE_RUN, params).rowcount == 1)

    async def prune_runs(self, created_before: datetime) -> int:
        floor, us = id_floor(created_before), _us(created_before)

        def prune(c: sqlite3.Connection) -> int:
            c.execute(PRUNE_BACKFILLS, (us,))
            return int(c.execute(PRUNE_RUNS, (floor,)).rowcount)

        return await self._write(prune)

    # -- schedule state -------------------------------------------------------------------
    async def get_states(self) -> dict[str, ScheduleState]:
        rows = await self._read(lambda c: c.execute(GET_STATES).fetchall())
        return {
            row[0]: ScheduleState(
                name=row[0], enabled=bool(row[1]), changed_by=row[2], changed_at=_dt(row[3]), note=row[4]  # type: ignore[arg-type]
            )
            for row in rows
        }

    async def set_state(self, state: ScheduleState) -> None:
        params = (state.name, int(state.enabled), state.changed_by, _us(state.changed_at), state.note)
        await self._write(lambda c: c.execute(SET_STATE, params))

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(self, instance: str, host: str, pid: int, at: datetime) -> None:
        params = (instance, host, pid, _us(at))
        await self._write(lambda c: c.execute(HEARTBEAT, params))

    async def instances(self) -> dict[str, tuple[str, int, datetime]]:
        rows = await self._read(lambda c: c.execute(INSTANCES).fetchall())
        return {row[0]: (row[1], row[2], _dt(row[3])) for row in rows}  # type: ignore[misc]

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._read(lambda c: c.execute(INSTANCE_LIST).fetchall())
        return [InstanceInfo(row[0], row[1], row[2], _dt(row[3]), _dt(row[4])) for row in rows]  # type: ignore[arg-type]

    async def forget_instance(self, instance: str) -> None:
        await self._write(lambda c: c.execute(FORGET_INSTANCE, (instance,)))

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        params = (_us(slot), instance)
        await self._write(lambda c: c.execute(MARK_STARTING, params))

    def mark_starting_now(self, instance: str, slot: datetime) -> bool:
        writer = self._writer
        return writer is not None and writer.mark_now((_us(slot), instance))

    async def starting_marks(self) -> dict[str, datetime]:
        rows = await self._read(lambda c: c.execute(STARTING_MARKS).fetchall())
        return {row[0]: _dt(row[1]) for row in rows}  # type: ignore[misc]

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        def read(c: sqlite3.Connection) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
            runs = [_run(row) for row in c.execute(RUNNING_RUNS).fetchall()]
            backfills = [_backfill(row) for row in c.execute(RUNNING_BACKFILLS).fetchall()]
            marks = {row[0]: _EPOCH + _MICROSECOND * row[1] for row in c.execute(STARTING_MARKS).fetchall()}
            return runs, backfills, marks

        return await self._read(read)

    async def heartbeat_and_unfinished(self, instance: str, host: str, pid: int, at: datetime) -> Unfinished:
        # One process's file: no commit to save by folding the reads into the write.
        await self.heartbeat(instance, host, pid, at)
        runs, backfills, marks = await self.unfinished_work()
        return Unfinished(runs, backfills, marks, await self.instances())

    async def close_unrecorded(self, instance: str, slot: datetime, runs: Sequence[Run]) -> list[Run]:
        us = _us(slot)

        def close(c: sqlite3.Connection) -> list[Run]:
            if c.execute(CLEAR_STARTING, (instance, us)).rowcount != 1:
                return []  # cleared by someone else meanwhile
            missing = [run for run in runs if not c.execute(SLOT_RECORDED, (run.name, us)).fetchone()]
            c.executemany(UPSERT_RUN, [_run_params(run) for run in missing])
            return missing

        return await self._write(close)

    # -- claims ---------------------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        us = _us(at)
        claims = unique_claims(claims)

        def insert(c: sqlite3.Connection) -> ClaimResult:
            won = set()
            first: dict[str, int | None] = {}
            for claim in sorted(claims, key=lambda cl: cl.key):
                slot = _us(claim.scheduled_at)
                owner = c.execute(CLAIMED_RUN, (claim.key,)).fetchone()
                if owner is not None:
                    if owner[0] != claim.run_id:
                        continue
                    won.add(claim.key)  # our own earlier attempt: its reply was lost
                elif slot is not None and c.execute(SLOT_TAKEN, (claim.name, slot)).fetchone():
                    continue  # fired already; its claim has been pruned since
                else:
                    c.execute(CLAIM, (claim.key, claim.name, instance, us, claim.run_id))
                    won.add(claim.key)
                    if slot is not None:
                        c.execute(INSERT_PLACEHOLDER, (claim.run_id, claim.name, slot, claim.trigger, claim.outcome, instance))
                    if claim.prune_before is not None:
                        c.execute(PRUNE_OWN_CLAIMS, (claim.name, _us(claim.prune_before)))
                earliest = first.get(claim.name)
                first[claim.name] = slot if earliest is None or (slot is not None and slot < earliest) else earliest
            busy = {}
            for name, slot in first.items():
                row = c.execute(BUSY_ELSEWHERE, (name, instance, slot)).fetchone()
                if row is not None:
                    busy[name] = row[0]
            return ClaimResult(frozenset(won), busy)

        return await self._write(insert)

    async def claimed_run(self, key: str) -> str | None:
        row = await self._read(lambda c: c.execute(CLAIMED_RUN, (key,)).fetchone())
        return row[0] if row else None

    async def prune_claims(self, name: str | None, before: datetime) -> int:
        us = _us(before)
        if name is None:
            return await self._write(lambda c: int(c.execute(SWEEP_CLAIMS, (us,)).rowcount))
        return await self._write(lambda c: int(c.execute(PRUNE_OWN_CLAIMS, (name, us)).rowcount))

    async def count_claims(self) -> int:
        row = await self._read(lambda c: c.execute(COUNT_CLAIMS).fetchone())
        return int(row[0])

    # -- backfills ------------------------------------------------------------------------
    async def start_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.id,
            progress.name,
            _us(progress.start),
            _us(progress.end),
            progress.total,
            progress.fired,
            progress.failed,
            progress.state,
            progress.instance,
            _us(progress.started_at),
            _us(progress.finished_at),
            _us(progress.current),
        )

        def insert(c: sqlite3.Connection) -> None:
            try:
                c.execute(INSERT_BACKFILL, params)
            except sqlite3.IntegrityError:
                raise Refused(
                    f'a backfill of "{progress.name}" is already running; wait for it to finish',
                    count=progress.total,
                    reason="a backfill is already running",
                ) from None

        await self._write(insert)

    async def update_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.fired,
            progress.failed,
            progress.state,
            _us(progress.finished_at),
            _us(progress.current),
            progress.id,
        )
        await self._write(lambda c: c.execute(UPDATE_BACKFILL, params))

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._read(lambda c: c.execute(GET_BACKFILL, (backfill_id,)).fetchone())
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        rows = await self._read(lambda c: c.execute(RUNNING_BACKFILLS).fetchall())
        return [_backfill(row) for row in rows]
