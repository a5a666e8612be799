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
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..errors import Refused, Unavailable
from ..ids import id_floor
from ..model import (
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    Run,
    ScheduleState,
)
from .rows import BACKFILL_FIELDS, RUN_FIELDS, backfill_from_row, run_from_row

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
    # Runs are read in scheduled order (a backfill's old slots land among their peers).
    """
    DROP INDEX runs_by_name;
    CREATE INDEX runs_by_name_slot ON runs (name, scheduled_at, id);
    """,
)

RUN_COLUMNS = ", ".join(RUN_FIELDS)
UPSERT_RUN = f"""
    INSERT INTO runs ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET
        name = excluded.name, scheduled_at = excluded.scheduled_at,
        fired_at = excluded.fired_at, finished_at = excluded.finished_at,
        status = excluded.status, trigger = excluded.trigger, outcome = excluded.outcome,
        instance = excluded.instance, error_tag = excluded.error_tag,
        error_message = excluded.error_message
"""
CLOSE_RUN = """
    UPDATE runs SET status = ?, finished_at = ?, error_tag = ?, error_message = ?
    WHERE id = ? AND status = 'running'
"""
GET_RUN = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"
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
FORGET_INSTANCE = "DELETE FROM instances WHERE instance = ?"
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
    )


def _run(row: tuple[Any, ...]) -> Run:
    return run_from_row(row, _dt)


def _backfill(row: tuple[Any, ...]) -> BackfillProgress:
    return backfill_from_row(row, _dt)


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=15.0, isolation_level=None, check_same_thread=False)
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


_STOP = object()


class _Writer(threading.Thread):
    """Owns the write connection; group-commits run upserts; runs other writes in order."""

    def __init__(self, path: str) -> None:
        super().__init__(name="schedtui-sqlite-writer", daemon=True)
        self.path = path
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.commits = 0
        self.rows_written = 0
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run(self) -> None:
        try:
            conn = _connect(self.path)
            self.ready.set_result(None)
        except Exception as exc:  # surfaced by open()
            self.ready.set_exception(exc)
            return
        try:
            self._loop(conn)
        finally:
            conn.close()

    def _loop(self, conn: sqlite3.Connection) -> None:
        stop = False
        while not stop:
            items = [self.jobs.get()]
            try:
                while len(items) < 50_000:
                    items.append(self.jobs.get_nowait())
            except queue.Empty:
                pass
            pending: dict[str, Run] = {}
            for item in items:
                if item is _STOP:
                    stop = True
                elif isinstance(item, list):
                    for run in item:
                        pending.pop(run.id, None)  # keep hand-in order: latest version last
                        pending[run.id] = run
                else:
                    fn, fut = item
                    self._commit_runs(conn, pending)
                    pending = {}
                    if fut.set_running_or_notify_cancel():
                        try:
                            fut.set_result(self._transaction(conn, fn))
                        except BaseException as exc:
                            fut.set_exception(exc)
            self._commit_runs(conn, pending)

    def _transaction(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        for attempt in range(20):
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                if attempt == 19:
                    raise
                time.sleep(0.05 * (attempt + 1))  # another process holds the write lock
                continue
            try:
                result = fn(conn)
                conn.execute("COMMIT")
                self.commits += 1
                return result
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        raise AssertionError("unreachable")

    def _commit_runs(self, conn: sqlite3.Connection, pending: dict[str, Run]) -> None:
        if not pending:
            return
        params = [_run_params(run) for run in pending.values()]
        try:
            self._transaction(conn, lambda c: c.executemany(UPSERT_RUN, params))
            self.rows_written += len(params)
        except Exception:
            log.exception("could not write %d run(s) to the ledger", len(params))


class SQLiteStore:
    """The embedded store. ``SQLiteStore(path)``; ``":memory:"`` is not supported (two connections)."""

    kind = "sqlite"
    default_coordination: CoordinationMode = "single"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._writer: _Writer | None = None
        self._last_writer: _Writer | None = None  # its counters outlive close()
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._read_conn: sqlite3.Connection | None = None

    @property
    def commits(self) -> int:
        """Transactions committed by this store's writer (also after close)."""
        return self._last_writer.commits if self._last_writer else 0

    @property
    def rows_written(self) -> int:
        """Run rows upserted by this store's writer (also after close)."""
        return self._last_writer.rows_written if self._last_writer else 0

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f'cannot create the folder for the store "{self.path}": {exc}') from exc
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="schedtui-sqlite-reader")
        writer = _Writer(str(self.path))
        writer.start()
        try:
            await asyncio.wrap_future(writer.ready)
        except sqlite3.Error as exc:
            raise Unavailable(f'cannot open the store "{self.path}": {exc}') from exc
        self._writer = self._last_writer = writer
        await self._write(self._migrate)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
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
            await self.flush()
            self._writer.jobs.put(_STOP)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(reader.submit(self._close_reader))
            reader.shutdown(wait=False)

    def _close_reader(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    # -- plumbing -------------------------------------------------------------------------
    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._writer is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._writer.jobs.put((fn, fut))
        try:
            return await asyncio.wrap_future(fut)
        except sqlite3.OperationalError as exc:
            raise Unavailable(f'the store "{self.path}" is unavailable: {exc}') from exc

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._read_conn is None:
                self._read_conn = _connect(str(self.path))
            return fn(self._read_conn)

        if self._reader is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        try:
            return await asyncio.wrap_future(self._reader.submit(job))
        except sqlite3.OperationalError as exc:
            raise Unavailable(f'the store "{self.path}" is unavailable: {exc}') from exc

    # -- runs -----------------------------------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        if self._writer is None:
            raise Unavailable(f'the store "{self.path}" is not open')
        self._writer.jobs.put(list(runs))

    async def flush(self) -> None:
        await self._write(lambda conn: None)

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

    async def last_slot(self, name: str) -> datetime | None:
        row = await self._read(lambda c: c.execute(LAST_SLOT, (name,)).fetchone())
        return _dt(row[0]) if row else None

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

    async def forget_instance(self, instance: str) -> None:
        await self._write(lambda c: c.execute(FORGET_INSTANCE, (instance,)))

    # -- claims ---------------------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        us = _us(at)

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
