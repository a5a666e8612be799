"""The embedded store: stdlib sqlite3 in WAL mode, one file, shared safely by processes.

Writes go through one writer thread that group-commits: whatever runs were handed in
while the previous commit was on disk are upserted in one transaction. So a thousand
schedules firing at the same second cost a handful of commits, not a thousand, and the
event loop never waits on the disk. Reads use their own connection on their own thread;
WAL lets them proceed while the writer commits, and lets the CLI read and act on the same
file while ``schedtui serve`` runs.

The writer thread is :mod:`backend.store.sqlite.writer`; the checks of the file (its one
name, its mount) are :mod:`.file`, its firing lock :mod:`.firing`; every statement of the runs,
states, instances, claims and backfills is in :mod:`backend.store.sqlite.sql` (the calls
that use them in :mod:`.runs` and :mod:`.instances`; the other systems' are in their own
modules: :mod:`.jobs`, :mod:`.durable`, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from backend.errors import BadInput, Unavailable
from backend.model import (
    CoordinationMode,
    Run,
    StoreHealth,
)
from backend.runtime.ownthread import in_own_thread
from backend.safetext import printable
from backend.store import forks, store_unavailable
from backend.store.migrations import CORE, applied, components_of, migrate_sqlite, sqlite_components_current
from backend.store.sqlite import firing
from backend.store.sqlite.activity import SQLiteActivity
from backend.store.sqlite.alerts import SQLiteAlerts
from backend.store.sqlite.audit import SQLiteAudit
from backend.store.sqlite.catalog import SQLiteCatalog
from backend.store.sqlite.durable import SQLiteDurable
from backend.store.sqlite.events import SQLiteEvents
from backend.store.sqlite.file import create_private, explain, make_folder, mode_beside, refuse_other_names, require_file, warn_if_shared
from backend.store.sqlite.instances import SQLiteInstances
from backend.store.sqlite.jobs import SQLiteJobs
from backend.store.sqlite.locks import SQLiteLocks
from backend.store.sqlite.logs import SQLiteLogs
from backend.store.sqlite.metrics import SQLiteMetrics
from backend.store.sqlite.reserve import Kept, Reserve
from backend.store.sqlite.runs import SQLiteRuns
from backend.store.sqlite.sql import (
    CLEAR_STARTING,
    MIGRATIONS,
)
from backend.store.sqlite.writer import (
    _WAKE,
    _connect,
    _connect_to_look,
    _Flush,
    _is_trouble,
    _Peek,
    _Writer,
)

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

class SQLiteStore(
    SQLiteRuns, SQLiteInstances, SQLiteJobs, SQLiteCatalog, SQLiteDurable, SQLiteLocks, SQLiteAudit, SQLiteAlerts, SQLiteEvents,
    SQLiteMetrics, SQLiteActivity, SQLiteLogs,
):
    """The embedded store. ``SQLiteStore(path)``; ``":memory:"`` is not supported (two connections).

    ``create=False`` refuses a file that does not exist (:class:`NotFound`, naming it) instead
    of creating an empty store there: at once, and again in :meth:`open`. It refuses a file
    that is not a schedtui store (:class:`BadInput`) on a read-only look, before anything
    writes to it (see :meth:`_look_first`).
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
        self._single = False
        """This store took the firing lock for an engine of ``single`` coordination."""
        self._firing_lock: tuple[int, ...] | None = None
        self._forked_from: int | None = None
        """The parent's pid, in a child forked while this store was open (see :mod:`..forks`)."""
        """The firing process's locked files: the lock file, and (Linux) the store file."""
        self._firer: str | None = None
        self._reserve: Reserve | None = None
        """The firing process's reserve (see :mod:`backend.store.sqlite.reserve`)."""
        self._kept = Kept([], {})
        """What an earlier process kept in the reserve, until handed to the writer."""
        self._marks: dict[str, int] = {}
        """The burst marks this process committed: instance -> slot (microseconds)."""
        if not create:
            require_file(self.path)

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

    async def open(self) -> None:
        if self.create:
            make_folder(self.path)
        else:
            require_file(self.path)
        refuse_other_names(self.path)
        if self.create:
            create_private(self.path)
        warn_if_shared(self.path)
        if not self.create:
            # A verb's or a console's look is a read: it never changes the schema (under a
            # running serve of an older release), nor makes a store of a stray file. The
            # process that fires the store migrates an older one.
            check = self._require_store if self._firing_lock is not None else self._require_current
            await in_own_thread(self._look_first, check, name="schedtui store look")
        elif self._has_content():
            # Nor does serve or migrate make one of another application's database: its
            # tables would have gone beside that application's.
            await in_own_thread(self._look_first, self._require_store_or_none, name="schedtui store look")
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="schedtui-sqlite-reader")
        writer = _Writer(str(self.path), create=self.create)
        writer.start()
        try:
            try:
                await asyncio.wrap_future(writer.ready)
            except sqlite3.Error as exc:
                if not self.create and not self.path.exists():
                    require_file(self.path)  # deleted in between: say so plainly
                self._refuse_no_database(exc)
                raise Unavailable(f'cannot open the store "{self.path}": {explain(exc, self.path.parent)}') from exc
            self._writer = self._last_writer = writer
            forks.opened(self)
            writer.keep = self._keep_now
            if self.create or self._firing_lock is not None:
                await self._write(self._migrate)
                await self._write_kept()
        except BaseException:
            # Failed or cancelled: no thread of it outlives the open (a writer left waiting
            # would keep the process from exiting).
            writer.stop()
            if self._writer is writer:
                self._writer = None
            if self._reader is not None:
                self._reader.shutdown(wait=False)
                self._reader = None
            raise

    def _look_first(self, check: Callable[[sqlite3.Connection], object]) -> None:
        """Refuse the file unless it is a schedtui store that passes ``check``, found on a
        read-only connection, before anything opens it to write or makes a file beside it
        (blocking: call it on a thread). The writer's open switches the file to WAL, in its
        header, for good: another application's database, named by a mistaken --store,
        kept that change (and a -wal and -shm beside it) though it was refused."""
        refuse_other_names(self.path)
        with contextlib.suppress(OSError):
            if self.path.stat().st_size == 0:
                raise BadInput(
                    f'the file "{self.path}" is empty, not a schedtui store; check --store (only `schedtui serve` '
                    "and `schedtui demo` create a store)",
                    field="store",
                )
        try:
            with contextlib.closing(_connect_to_look(str(self.path))) as conn:
                check(conn)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            require_file(self.path)  # deleted in between: say so plainly
            self._refuse_no_database(exc)
            raise Unavailable(f'cannot open the store "{self.path}": {explain(exc, self.path.parent)}') from exc

    def _refuse_no_database(self, exc: sqlite3.Error) -> None:
        """A file that is no SQLite database at all is bad input, as an empty file or another
        application's database is: not a store out of reach now (exit 1 said "try again")."""
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_NOTADB":
            raise BadInput(
                f'the file "{self.path}" is not a schedtui store, nor any SQLite database (SQLite: {exc}: '
                "a file of another kind, or one damaged or encrypted); check --store",
                field="store",
            ) from exc

    def _require_store(self, conn: sqlite3.Connection) -> int:
        """Refuse a file without schedtui's tables, or of a schema newer than this code's;
        its schema's version."""
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone():
            raise BadInput(
                f'the file "{self.path}" is not a schedtui store (an SQLite file without its tables); check --store',
                field="store",
            )
        return self._core_version(conn, str(self.path))

    def _has_content(self) -> bool:
        """The file is there and not empty (one to look at before a store is made in it)."""
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False

    def _require_store_or_none(self, conn: sqlite3.Connection) -> None:
        """Refuse a file that holds tables but not schedtui's (a store of any version, or a
        database without tables, is one to make or migrate)."""
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name LIMIT 4"
        )]  # fmt: skip
        if tables and not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone():
            shown = ", ".join(printable(name, 40) for name in tables[:3]) + (", …" if len(tables) > 3 else "")
            raise BadInput(
                f'the file "{self.path}" is another application\'s SQLite database (its tables: {shown}), not a '
                "schedtui store: a store is not made in it; check --store",
                field="store",
            )

    def _require_current(self, conn: sqlite3.Connection) -> None:
        """Refuse what :meth:`_require_store` does, and a store whose schema is behind this code's."""
        version = self._require_store(conn)
        if version < len(MIGRATIONS) or not sqlite_components_current(conn, components_of(type(self))):
            raise Unavailable(
                f'the store "{self.path}" was made by an older schedtui (its schema is behind this one\'s): upgrade it '
                "with `schedtui migrate` (or by starting `schedtui serve`) first; a command that reads or acts leaves it as it is"
            )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        self.migrated = self._migrate_core(conn, str(self.path)) + migrate_sqlite(conn, components_of(type(self)))

    @staticmethod
    def _migrate_core(conn: sqlite3.Connection, where: str) -> list[tuple[str, str]]:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        version = SQLiteStore._core_version(conn, where)
        done: list[tuple[str, str]] = []
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            done.append(applied(CORE, f"version {number}"))
        if conn.execute("SELECT 1 FROM schema_version").fetchone() is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS),))
        elif version != len(MIGRATIONS):
            conn.execute("UPDATE schema_version SET version = ?", (len(MIGRATIONS),))
        return done

    @staticmethod
    def _core_version(conn: sqlite3.Connection, where: str) -> int:
        """The run ledger's schema version (0: none yet), refused when it cannot be trusted
        or is newer than this code."""
        rows = conn.execute("SELECT version FROM schema_version").fetchall()
        row = rows[0] if rows else None
        version = row[0] if row else 0
        if len(rows) > 1 or type(version) is not int or version < 0:
            # (edited by hand, or another program's table of that name: nothing to trust)
            shown = ", ".join(repr(r[0]) for r in rows[:3])
            raise Unavailable(
                f'the schema_version table of the store "{where}" holds {shown}, not one version number: '
                "it was edited or is not schedtui's; restore the store from a backup"
            )
        if row is None and conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone():
            raise Unavailable(
                f'the schema_version table of the store "{where}" is empty, yet the store holds schedtui\'s '
                "tables: it was edited; restore the store from a backup"
            )
        if version > len(MIGRATIONS):
            raise Unavailable(
                f"the store's schema is version {version}, newer than this schedtui knows ({len(MIGRATIONS)}); "
                "upgrade schedtui before opening it"
            )
        return version

    async def close(self) -> None:
        if self._writer is not None:
            writer = self._writer
            try:
                await self._flush(self.close_patience)
            except Unavailable as exc:
                log.error("closing the store with run(s) not written: %s", exc)
            # From here on a write, a flush or a run handed in is refused as to a closed
            # store (the writer would never answer it), not queued behind the stop.
            writer.stop()
            await in_own_thread(writer.join, name="schedtui store close")
            self._writer = None
            await in_own_thread(self._keep_unwritten, writer, name="schedtui store close")
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(reader.submit(self._close_reader))
            reader.shutdown(wait=False)
        if self._reserve is not None:
            self._reserve.close()
            self._reserve = None
        if self._firing_lock is not None:
            self._firing_lock = None
            firing.release(self.path, single=self._single)

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

    async def take_firing_lock(self, instance: str, *, claims: bool = False) -> None:
        """Also opens the reserve (the firing process's alone) and, once the store is open,
        writes the runs an earlier process kept there. Engines that claim (``claims``)
        share the lock within this process, and open no reserve (their claims record what
        they fire)."""
        if self._firing_lock is not None:
            return
        # (before the lock file and the reserve are made beside it)
        if not self.create:
            await in_own_thread(self._look_first, self._require_store, name="schedtui store look")
        elif self._has_content():
            await in_own_thread(self._look_first, self._require_store_or_none, name="schedtui store look")
        hold = asyncio.ensure_future(in_own_thread(partial(firing.hold, self.path, instance, single=not claims, create=self.create),
                                                   name="schedtui firing lock"))
        try:
            await asyncio.shield(hold)
        finally:
            # Cancelled meanwhile, the thread takes the lock all the same: held here once it
            # has, so that close() lets go of it (else kept for the process's life).
            while not hold.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(hold)
            if not hold.cancelled() and hold.exception() is None:
                self._firing_lock = hold.result()
                self._firer, self._single = instance, not claims
        if not claims:
            self._reserve = Reserve(self.path.with_name(self.path.name + ".reserve"), mode=mode_beside(self.path))
            self._kept = await in_own_thread(self._reserve.open, name="schedtui reserve")
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

    def _keep_now(self, runs: list[Run]) -> None:
        """On the writer's thread, while the disk refuses ``runs``: keep them in the reserve
        now, not only at the stop, which a SIGKILL may never let come (``[]``: they were
        written since; the reserve is marked empty)."""
        reserve = self._reserve
        if reserve is None:
            return
        if not runs:
            reserve.clear()
        else:
            reserve.keep(runs, dict(self._marks))

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

    @property
    def firing_lock_path(self) -> Path:
        """The file whose lock marks the one process firing this store's schedules."""
        return firing.lock_path(self.path)

    def live_firer(self) -> str | None:
        """The instance that holds this file's firing lock now (its kernel lock proves it
        alive, whatever its heartbeat says), or ``None``."""
        return self._firer if self._firing_lock is not None else firing.holder(self.path)

    # -- plumbing -------------------------------------------------------------------------
    def forget_after_fork(self, parent: int) -> None:
        """(See :mod:`backend.store.forks`; the firing lock's descriptors are closed by
        :mod:`.firing`: the parent holds it alone.)"""
        self._forked_from = parent
        self._writer = self._last_writer = None
        self._reader, self._read_conn = None, None
        self._firing_lock, self._reserve = None, None

    def _not_open(self) -> Unavailable:
        if self._forked_from is not None:
            return store_unavailable(self.where, forks.forked_problem(self._forked_from))
        return store_unavailable(self.where, "{store} is not open")

    def _open_writer(self) -> _Writer:
        writer = self._writer
        if writer is None or writer.closing:
            raise self._not_open()
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
            raise store_unavailable(self.where, "{store} is unavailable", explain(exc, self.path.parent)) from exc

    async def _peek(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the writer's connection, between its transactions (a read only)."""
        peek = _Peek(fn)
        self._open_writer().jobs.put(peek)
        try:
            result: T = await asyncio.wrap_future(peek.future)
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise store_unavailable(self.where, "{store} is unavailable", explain(exc, self.path.parent)) from exc
        return result

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._read_conn is None:
                self._read_conn = _connect(str(self.path), create=False)
            return fn(self._read_conn)

        if self._reader is None:
            raise self._not_open()
        writer = self._writer
        if writer is not None and writer.lost:
            # What the open file still holds is no longer the store at that path (a console
            # showed it, frozen and "live", while a new serve fired into the new file).
            raise Unavailable(
                f'the store file "{self.path}" was deleted or replaced while in use; what this process still reads is '
                "not the file at that path now: restart it to read that one",
                public="the store file was deleted or replaced while in use",
            )
        try:
            return await asyncio.wrap_future(self._reader.submit(job))
        except sqlite3.Error as exc:
            if not _is_trouble(exc):
                raise
            raise store_unavailable(self.where, "{store} is unavailable", explain(exc, self.path.parent)) from exc

    # -- runs -----------------------------------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        if not self._open_writer().hand_in(list(runs)):
            raise self._not_open()

    async def flush(self) -> None:
        """Return once every run handed in before is committed. While they cannot be
        written (a full disk), raise :class:`Unavailable` naming the cause as soon as an
        attempt to write them fails; they stay queued and are retried."""
        await self._flush(0.0)

    async def _flush(self, patience: float) -> None:
        flush = _Flush(patience)
        self._open_writer().jobs.put(flush)
        await asyncio.wrap_future(flush.future)
