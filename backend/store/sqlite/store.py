"""The embedded store: stdlib sqlite3 in WAL mode, one file, shared safely by processes.

Writes go through one writer thread that group-commits: whatever runs were handed in
while the previous commit was on disk are upserted in one transaction. So a thousand
schedules firing at the same second cost a handful of commits, not a thousand, and the
event loop never waits on the disk. Reads use their own connection on their own thread;
WAL lets them proceed while the writer commits, and lets the CLI read and act on the same
file while ``schedtui serve`` runs.

The writer thread is :mod:`backend.store.sqlite.writer`; every statement of the runs,
states, instances, claims and backfills is in :mod:`backend.store.sqlite.sql` (the other
systems' are in their own modules: ``sqlite_jobs``, ``sqlite_durable``, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import json
import logging
import math
import os
import socket
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from backend.errors import BadInput, InUse, NameTaken, NotFound, Refused, Unavailable
from backend.ids import id_floor
from backend.model import (
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    InstanceInfo,
    Role,
    Run,
    ScheduleState,
    StoreHealth,
    unique_claims,
)
from backend.safetext import store_text
from backend.store import FIRING, Membership, Unfinished, store_unavailable
from backend.store.migrations import CORE, applied, components_of, migrate_sqlite
from backend.store.sqlite.activity import SQLiteActivity
from backend.store.sqlite.alerts import SQLiteAlerts
from backend.store.sqlite.audit import SQLiteAudit
from backend.store.sqlite.catalog import SQLiteCatalog
from backend.store.sqlite.durable import SQLiteDurable
from backend.store.sqlite.events import SQLiteEvents
from backend.store.sqlite.jobs import SQLiteJobs
from backend.store.sqlite.locks import SQLiteLocks
from backend.store.sqlite.logs import PRUNE_RUN_LOGS, SQLiteLogs
from backend.store.sqlite.metrics import SQLiteMetrics
from backend.store.sqlite.reserve import Kept, Reserve
from backend.store.sqlite.sql import (
    _EPOCH,
    _MICROSECOND,
    BUSY_ELSEWHERE,
    CLAIM,
    CLAIMED_RUN,
    CLEAR_STARTING,
    CLOSE_RUN,
    COUNT_CLAIMS,
    END_BACKFILL,
    FORGET_HOLDER,
    FORGET_INSTANCE,
    GET_BACKFILL,
    GET_RUN,
    GET_STATES,
    HEARTBEAT,
    INSERT_BACKFILL,
    INSERT_PLACEHOLDER,
    INSTANCE_LIST,
    INSTANCES,
    LAST_RUNS,
    LAST_SLOT,
    LATEST_RUNS,
    LIST_RUNS,
    LIST_RUNS_BEFORE,
    MARK_STARTING,
    MIGRATIONS,
    NAME_HOLDER,
    OTHER_MODE_FIRING,
    PRUNE_BACKFILLS,
    PRUNE_OWN_CLAIMS,
    PRUNE_RUNS,
    RELEASE_CLAIM,
    RELEASE_PLACEHOLDER,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    RUNS_BETWEEN,
    SET_STATE,
    SLOT_RECORDED,
    SLOT_TAKEN,
    STARTING_MARKS,
    SWEEP_CLAIMS,
    UPDATE_BACKFILL,
    UPSERT_RUN,
    _backfill,
    _dt,
    _run,
    _run_params,
    _us,
)
from backend.store.sqlite.writer import (
    _STOP,
    _WAKE,
    _connect,
    _Flush,
    _is_trouble,
    _Peek,
    _Writer,
)

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

class SQLiteStore(
    SQLiteJobs, SQLiteCatalog, SQLiteDurable, SQLiteLocks, SQLiteAudit, SQLiteAlerts, SQLiteEvents, SQLiteMetrics, SQLiteActivity,
    SQLiteLogs,
):
    """The embedded store. ``SQLiteStore(path)``; ``":memory:"`` is not supported (two connections).

    ``create=False`` refuses a file that does not exist (:class:`NotFound`, naming it) instead
    of creating an empty store there: at once, and again in :meth:`open`.
    """

    kind = "sqlite"
    default_coordination: CoordinationMode = "single"

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        # The file itself, whatever name it was given by: every symlink to it (or to a
        # folder above it) leads to the same firing lock and the same write-ahead log.
        self.path = Path(os.path.realpath(path))
        self.where = str(self.path)
        self.migrated: list[tuple[str, str]] = []
        self.create = create
        self.close_patience = 10.0
        """Seconds :meth:`close` keeps retrying runs that cannot be written before it gives up
        on them (and logs each one, so that none is lost without a trace)."""
        self._writer: _Writer | None = None
        self._last_writer: _Writer | None = None  # its counters outlive close()
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._firing_lock: int | None = None
        self._firer: str | None = None
        self._reserve: Reserve | None = None
        """The firing process's reserve (see :mod:`backend.store.sqlite.reserve`)."""
        self._kept = Kept([], {})
        """What an earlier process kept in the reserve, until handed to the writer."""
        self._marks: dict[str, int] = {}
        """The burst marks this process committed: instance -> slot (microseconds)."""
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
                f'no store at "{self.path}" (no such file); check --store and the working '
                "directory (only `schedtui serve` and `schedtui demo` create a store)"
            )

    def _refuse_other_names(self) -> None:
        """Refuse a store file that has more than one name (hard links). SQLite keeps its
        write-ahead log and shared memory beside the name a file is opened by: a second
        name gets a log of its own, each process sees only its own name's recent writes,
        a firing lock beside each name lets a firer in through each, and a checkpoint
        through one name overwrites what the other's log holds (a corrupt store)."""
        try:
            names = os.stat(self.path).st_nlink
        except FileNotFoundError:
            return  # created by the writer (one name)
        except OSError as exc:
            raise Unavailable(f'cannot look at the store file "{self.path}": {exc.strerror or exc}') from None
        if names > 1:
            raise BadInput(
                f'the store file "{self.path}" has {names} names (hard links); SQLite would keep a write-ahead log '
                "beside each name and the store would be corrupted: remove the other names (find them with "
                f"`find / -xdev -samefile {self.path}`) and use one, or a symlink",
                field="store",
            )

    async def open(self) -> None:
        if self.create:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise Unavailable(f'cannot create the folder for the store "{self.path}": {exc}') from exc
        else:
            self._require_file()
        self._refuse_other_names()
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
        await self._write_kept()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        self.migrated = self._migrate_core(conn) + migrate_sqlite(conn, components_of(type(self)))

    @staticmethod
    def _migrate_core(conn: sqlite3.Connection) -> list[tuple[str, str]]:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = row[0] if row else 0
        if version > len(MIGRATIONS):
            raise Unavailable(
                f"the store's schema is version {version}, newer than this schedtui knows ({len(MIGRATIONS)}); "
                "upgrade schedtui before opening it"
            )
        done: list[tuple[str, str]] = []
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            done.append(applied(CORE, f"version {number}"))
        if row is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS),))
        elif version != len(MIGRATIONS):
            conn.execute("UPDATE schema_version SET version = ?", (len(MIGRATIONS),))
        return done

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
            await asyncio.to_thread(self._keep_unwritten, writer)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(reader.submit(self._close_reader))
            reader.shutdown(wait=False)
        if self._reserve is not None:
            self._reserve.close()
            self._reserve = None
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
            raise store_unavailable(self.where, "{store} is not open")
        self._writer.page_limit = extra
        self._writer.jobs.put(_WAKE)

    async def take_firing_lock(self, instance: str) -> None:
        """Also opens the reserve (the firing process's alone) and, once the store is open,
        writes the runs an earlier process kept there."""
        if self._firing_lock is None:
            self._firing_lock = await asyncio.to_thread(self._lock_firing, instance)
            self._firer = instance
            self._reserve = Reserve(self.path.with_name(self.path.name + ".reserve"))
            self._kept = await asyncio.to_thread(self._reserve.open)
            if self._writer is not None:
                await self._write_kept()

    async def _write_kept(self) -> None:
        """Hand the runs kept in the reserve to the writer, ahead of anything this process
        writes; the reserve is marked empty once they are committed. Meanwhile
        :meth:`last_slots` counts them, so the catch-up starts after their slots. Then
        clear the stopped process's burst marks they account for (after them: a write
        never overtakes runs handed in before it; on a disk still full, this raises)."""
        (kept, marks), self._kept = self._kept, Kept([], {})
        reserve = self._reserve
        if not kept or reserve is None:
            return
        log.warning(
            '%d run(s) kept by an earlier process in the reserve "%s" (it could not write them to the ledger); '
            "writing them now", len(kept), reserve.path,
        )  # fmt: skip
        self.save_runs(kept)
        written = _Flush(math.inf)  # waits through a full disk, as the runs do

        def done(future: concurrent.futures.Future[None]) -> None:
            if future.exception() is None:  # on the writer's thread, before it takes anything else
                reserve.clear()
                log.info('the %d run(s) kept in the reserve "%s" are in the ledger', len(kept), reserve.path)

        written.future.add_done_callback(done)
        self._open_writer().jobs.put(written)
        if marks:
            try:
                await self._write(lambda c: c.executemany(CLEAR_STARTING, list(marks.items())))
            except Unavailable:
                for instance, slot in marks.items():  # still to clear: kept again if this one stops first
                    self._marks.setdefault(instance, slot)
                raise

    def _keep_unwritten(self, writer: _Writer) -> None:
        """After the writer has stopped: keep the runs it could not write in the reserve,
        as many as fit, and log the others, one JSON line each (the last resort)."""
        left = [run for run, _ in writer.pending.values()]
        if not left:
            return
        unkept = left
        if self._reserve is not None and not writer.lost:
            unkept = self._reserve.keep(left, self._marks)
            kept = len(left) - len(unkept)
            if kept:
                log.error(
                    'cannot write %d run(s) to the ledger "%s" (%s): kept %d run(s) in its reserve "%s"; the next process '
                    "to fire this store writes them to the ledger first%s",
                    len(left), self.path, writer.error, kept, self._reserve.path,
                    f" ({len(unkept)} more did not fit: they follow, one a line)" if unkept else "",
                )  # fmt: skip
                writer.error = f"{writer.error}; {kept} of them kept in the reserve for the next start"
        for run in unkept:
            # The last resort: the log is the only place left that can keep it.
            log.error("run not written to the ledger: %s", json.dumps(run.to_json(), ensure_ascii=False))

    def _lock_firing(self, instance: str) -> int:
        self._refuse_other_names()
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
            "since": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return fd

    def live_firer(self) -> str | None:
        """The instance that holds this file's firing lock now (its kernel lock proves it
        alive, whatever its heartbeat says), or ``None``."""
        if self._firing_lock is not None:
            return self._firer
        path = self.firing_lock_path
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                return holder.get("instance") if isinstance(holder, dict) else None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except ValueError:
            return None
        finally:
            os.close(fd)

    def _in_use_message(self, path: Path) -> str:
        try:
            holder = json.loads(path.read_text() or "{}")
            who = f'instance "{holder["instance"]}" (pid {holder["pid"]} on {holder["host"]}, since {holder["since"]})'
        except (OSError, ValueError, KeyError, TypeError):
            who = "another process"
        return (
            f'refusing to fire: {who} already fires the schedules of the store "{self.path}"; '
            "two firing processes on one SQLite file would run every slot twice. Stop that one first "
            "(the other verbs, and a console without --fire, work beside it; several firing instances need PostgreSQL)"
        )

    # -- plumbing -------------------------------------------------------------------------
    def _open_writer(self) -> _Writer:
        writer = self._writer
        if writer is None:
            raise store_unavailable(self.where, "{store} is not open")
        if writer.crashed:
            raise store_unavailable(self.where, "the ledger writer of {store} stopped (see the log)")
        return writer

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._open_writer().jobs.put((fn, fut))
        try:
            return await asyncio.wrap_future(fut)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise store_unavailable(self.where, "{store} is unavailable", str(exc)) from exc

    async def _peek(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the writer's connection, between its transactions (a read only)."""
        peek = _Peek(fn)
        self._open_writer().jobs.put(peek)
        try:
            result: T = await asyncio.wrap_future(peek.future)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise store_unavailable(self.where, "{store} is unavailable", str(exc)) from exc
        return result

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._read_conn is None:
                self._read_conn = _connect(str(self.path), create=False)
            return fn(self._read_conn)

        if self._reader is None:
            raise store_unavailable(self.where, "{store} is not open")
        try:
            return await asyncio.wrap_future(self._reader.submit(job))
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise store_unavailable(self.where, "{store} is unavailable", str(exc)) from exc

    # -- runs -----------------------------------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        self._open_writer().hand_in(list(runs))

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
        """Counting the runs that wait in the writer (a full disk), and those kept in the
        reserve by an earlier process: their slots ran."""
        wanted = sorted(set(names))
        waiting = await self._newest_waiting(wanted) if wanted else {}

        def read(c: sqlite3.Connection) -> dict[str, datetime]:
            found: dict[str, datetime] = {}
            for name in wanted:  # one index probe per name, on the reader's thread
                row = c.execute(LAST_SLOT, (name,)).fetchone()
                if row and row[0] is not None:
                    found[name] = _EPOCH + _MICROSECOND * row[0]
            return found

        found = await self._read(read) if wanted else {}
        for name, slot in waiting.items():
            if name not in found or slot > found[name]:
                found[name] = slot
        return found

    async def _newest_waiting(self, names: list[str]) -> dict[str, datetime]:
        """Per name, the newest slot of its timed runs handed in and not committed yet.
        Looked at before the ledger is read: a run committed in between is then in one or
        the other."""
        writer = self._writer
        if writer is None or writer.crashed or not writer.waiting():
            return {}
        wanted = set(names)
        peek = _Peek(lambda _: writer.newest_waiting(wanted))  # on the writer's thread: it owns them
        writer.jobs.put(peek)
        newest: dict[str, datetime] = await asyncio.wrap_future(peek.future)
        return newest

    async def running_runs(self) -> list[Run]:
        rows = await self._read(lambda c: c.execute(RUNNING_RUNS).fetchall())
        return [_run(row) for row in rows]

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        if not runs:
            return set()

        rows = [(r.status, _us(r.finished_at), store_text(r.error_tag), store_text(r.error_message), r.id) for r in runs]

        def close(c: sqlite3.Connection) -> set[str]:
            return {row[-1] for row in rows if c.execute(CLOSE_RUN, row).rowcount == 1}

        return await self._write(close)

    async def prune_runs(self, created_before: datetime) -> int:
        floor, us = id_floor(created_before), _us(created_before)

        def prune(c: sqlite3.Connection) -> int:
            c.execute(PRUNE_BACKFILLS, (us,))
            removed = int(c.execute(PRUNE_RUNS, (floor,)).rowcount)
            c.execute(PRUNE_RUN_LOGS, (floor,))  # their logs
            return removed

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
        params = (state.name, int(state.enabled), store_text(state.changed_by), _us(state.changed_at), store_text(state.note))
        await self._write(lambda c: c.execute(SET_STATE, params))

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
    ) -> Role:
        role, coordination, live_after, clock_offset, clock_off, taken_before = membership
        since = _us(live_after if live_after is not None else at)
        taken = None if taken_before is None else _us(taken_before)

        def beat(c: sqlite3.Connection) -> Role:
            recorded = role
            if role == "firing" and coordination is not None:
                # The writer's transaction is the only one: the check and the write are atomic.
                if c.execute(OTHER_MODE_FIRING, (instance, coordination, since)).fetchone() is not None:
                    recorded = "waiting"
            params = (instance, host, pid, _us(at), recorded, coordination, clock_offset, int(clock_off), taken)
            if c.execute(HEARTBEAT, params).rowcount == 0:
                holder = c.execute(NAME_HOLDER, (instance,)).fetchone()
                raise NameTaken(instance, holder[0], holder[1], _dt(holder[2]))  # type: ignore[arg-type]
            return recorded

        return await self._write(beat)

    async def instances(self) -> dict[str, tuple[str, int, datetime]]:
        rows = await self._read(lambda c: c.execute(INSTANCES).fetchall())
        return {row[0]: (row[1], row[2], _dt(row[3])) for row in rows}  # type: ignore[misc]

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._read(lambda c: c.execute(INSTANCE_LIST).fetchall())
        return [
            InstanceInfo(row[0], row[1], row[2], _dt(row[3]), _dt(row[4]), row[5], row[6], row[7], bool(row[8]))  # type: ignore[arg-type]
            for row in rows
        ]  # (an older version's row: no clock, NULL)

    async def forget_instance(self, instance: str, host: str | None = None, pid: int | None = None) -> None:
        if host is None or pid is None:
            await self._write(lambda c: c.execute(FORGET_INSTANCE, (instance,)))
        else:
            await self._write(lambda c: c.execute(FORGET_HOLDER, (instance, host, pid)))

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        us = (slot - _EPOCH) // _MICROSECOND
        await self._write(lambda c: c.execute(MARK_STARTING, (us, instance)))
        self._marks[instance] = us

    def mark_starting_now(self, instance: str, slot: datetime) -> bool:
        writer, us = self._writer, (slot - _EPOCH) // _MICROSECOND
        if writer is None or not writer.mark_now((us, instance)):
            return False
        self._marks[instance] = us
        return True

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

    async def heartbeat_and_unfinished(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
        *,
        stuck_after: timedelta | None = None,
    ) -> Unfinished:
        # One process's file: no commit to save by folding the reads into the write.
        recorded = await self.heartbeat(instance, host, pid, at, membership)
        runs, backfills, marks = await self.unfinished_work()
        return Unfinished(runs, backfills, marks, await self.instances(), recorded)

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

    async def release_claim(self, key: str, run_id: str) -> bool:
        def release(c: sqlite3.Connection) -> bool:
            if c.execute(RELEASE_PLACEHOLDER, (run_id, key, run_id)).rowcount != 1:
                return False
            c.execute(RELEASE_CLAIM, (key, run_id))
            return True

        return await self._write(release)

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

    async def end_backfill(self, progress: BackfillProgress) -> bool:
        params = (
            progress.fired,
            progress.failed,
            progress.state,
            _us(progress.finished_at),
            _us(progress.current),
            progress.id,
        )
        return bool(await self._write(lambda c: c.execute(END_BACKFILL, params).rowcount))

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._read(lambda c: c.execute(GET_BACKFILL, (backfill_id,)).fetchone())
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        rows = await self._read(lambda c: c.execute(RUNNING_BACKFILLS).fetchall())
        return [_backfill(row) for row in rows]
