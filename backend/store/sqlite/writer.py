"""The embedded store's writer: one thread that group-commits the run ledger (whatever
runs were handed in while the previous commit was on disk are upserted in one
transaction), commits the burst mark at once when it can, and keeps the runs it cannot
write, retrying, while the file is full, locked or gone (see :mod:`backend.store.sqlite.store`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import sqlite3
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from backend.errors import Unavailable
from backend.model import Run, StoreHealth
from backend.store import store_unavailable
from backend.store.sqlite.checkpointer import Checkpointer
from backend.store.sqlite.sql import MARK_STARTING, NOTE_LAST_FIRED, UPSERT_RUN, _run_params

log = logging.getLogger("schedtui.store")
T = TypeVar("T")


#: Bytes the write-ahead log is cut back to once checkpointed.
WAL_SIZE_LIMIT = 64 * 1024 * 1024


def _uri(path: str, mode: str) -> str:
    """The URI SQLite opens the file ``path`` by in ``mode`` (``ro``, ``rw``): its bytes
    quoted, so that a name with ``?``, ``#`` or ``%`` (or not UTF-8) is the file's own."""
    return f"file:{urllib.parse.quote(os.fsencode(path))}?mode={mode}"


def _connect_to_look(path: str) -> sqlite3.Connection:
    """A read-only connection to the existing file ``path``. It writes nothing to the file:
    :func:`_connect` switches the file to WAL, in its header, for good, so a file not yet
    known to be a store is looked at by this first."""
    return sqlite3.connect(_uri(path, "ro"), uri=True, timeout=15.0, isolation_level=None, check_same_thread=False)


def _connect(path: str, *, create: bool = True) -> sqlite3.Connection:
    if create:
        conn = sqlite3.connect(path, timeout=15.0, isolation_level=None, check_same_thread=False)
    else:
        # mode=rw opens an existing file and never creates one: a typo must not make a store.
        conn = sqlite3.connect(_uri(path, "rw"), uri=True, timeout=15.0, isolation_level=None, check_same_thread=False)
    for attempt in range(50):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError as exc:
            # Switching a fresh file to WAL while another process does the same can report
            # "database is locked" at once, without waiting on the busy handler. Anything
            # else (a full disk: no room for the shared memory) is said at once: retried,
            # it held a start 25 s in silence.
            if attempt == 49 or not _is_busy(exc):
                conn.close()
                raise
            time.sleep(0.02 * (attempt + 1))
    # NORMAL under WAL survives a process crash; only an OS crash can lose the last commits.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA busy_timeout = 15000")
    # A checkpoint gives the write-ahead log back down to this: a burst of writes (a big
    # retention sweep, a backfill) left it at its high-water mark for the process's life.
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    # No commit checkpoints (three fsyncs inside it): the checkpointer's thread does.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
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
#: What SQLite keeps beside the file in WAL mode, found by name: its log and shared memory.
_SIDECARS = ("-wal", "-shm")


class _Flush:
    """A wait for every run handed in before it to be committed."""

    __slots__ = ("deadline", "future", "target")

    def __init__(self, patience: float) -> None:
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.deadline = time.monotonic() + patience
        self.target = 0


class _Peek:
    """A read on the writer's own connection, outside any transaction (see
    :mod:`backend.store.sqlite.events`), or of the runs it holds (on its thread)."""

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
        self.queued: Counter[str] = Counter()
        """The runs handed in and not yet taken by the writer, by id, each with how many of
        its versions are queued (under :attr:`lock`): a run's start and its end, both handed
        in before the writer took the first, are one run waiting, not two."""
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
        self.told = False
        """The trouble was said with runs waiting (once, then every _WARN_EVERY)."""
        self.identity: tuple[int, int] | None = None
        self.sidecars: dict[str, tuple[int, int]] = {}
        """The identity of each of :data:`_SIDECARS` seen beside the file while it was this
        writer's: removed with it once it is lost (SQLite would replay them into whatever
        file is put at the path next: a restored backup)."""
        self.other_names = False  # said once: the file gained a hard link while open
        self.checked_at = 0.0
        self.page_limit: int | None = None  # the test seam of SQLiteStore.limit_pages
        self.applied_limit: int | None = None
        self.crashed = False
        self.closing = False
        """Told to stop (:meth:`stop`): nothing handed in from then on would be taken."""
        self.marker: sqlite3.Connection | None = None
        """The connection :meth:`mark_now` writes on (from the event loop's thread)."""
        self.marker_lock = threading.Lock()
        self.marks_now = 0
        """Commits made by :meth:`mark_now`."""
        self.keep: Callable[[list[Run]], None] | None = None
        """The firing process's reserve (:meth:`SQLiteStore._keep_now`): given the runs
        waiting each round they changed while the ledger cannot take them, so that a process
        killed meanwhile (SIGKILL, the end of `docker stop`'s grace) loses none of them."""
        self.kept: tuple[int, int] | None = None  # what was given to keep last: (taken, pending)
        self.checkpointer: Checkpointer
        """Copies the log into the file (see :mod:`backend.store.sqlite.checkpointer`)."""

    def run(self) -> None:
        try:
            conn = _connect(self.path, create=self.create)
            st = os.stat(self.path)
            self.identity = (st.st_dev, st.st_ino)
            self._note_sidecars()
            marker = _connect(self.path, create=False)
            marker.execute("PRAGMA busy_timeout = 0")  # never waits for the write lock: the writer does
            self.checkpointer = Checkpointer(lambda: _connect(self.path, create=False), lambda: self.commits + self.marks_now)
            self.checkpointer.start()
            self.marker = marker
            # (an open() cancelled meanwhile cancelled it: it then sends _STOP)
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.ready.set_result(None)
        except Exception as exc:  # surfaced by open()
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.ready.set_exception(exc)
            return
        try:
            self._loop(conn)
        except BaseException as exc:
            self.crashed = True
            log.exception('the ledger writer of "%s" stopped', self.path)
            for flush in self.flushes:
                flush.future.set_exception(store_unavailable(self.path, "the ledger writer of {store} stopped", str(exc)))
            raise
        finally:
            with self.marker_lock:
                self.marker = None
            marker.close()
            self.checkpointer.stop()
            self.checkpointer.join()
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
            self.checkpointer.committed(self.commits + self.marks_now)
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
            self._keep_waiting()
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
            self.queued.subtract(run.id for run in runs)
            for run_id in {run.id for run in runs}:
                if self.queued[run_id] <= 0:
                    del self.queued[run_id]

    def hand_in(self, runs: list[Run]) -> bool:
        """Any thread: queue ``runs`` (new runs or newer versions) for the writer; False
        (nothing queued) once it has been told to stop."""
        with self.lock:  # (the put too: a stop() cannot come between the look and the put)
            if self.closing:
                return False
            self.queued.update(run.id for run in runs)
            self.jobs.put(runs)
        return True

    def stop(self) -> None:
        """End once everything handed in before is done. Nothing is taken from now on: the
        writer would never answer it (a write waited for ever, a run was lost)."""
        with self.lock:
            self.closing = True
            self.jobs.put(_STOP)

    def waiting(self) -> bool:
        """Whether runs were handed in and not committed yet (any thread; a run is queued
        or pending, or both, until it is committed)."""
        with self.lock:
            queued = bool(self.queued)
        return queued or bool(self.pending)

    def newest_waiting(self, names: set[str], until: datetime | None = None) -> dict[str, datetime]:
        """Writer thread only (a :class:`_Peek`): per name, the newest slot (at or before
        ``until``) among the timed runs handed in and not committed yet."""
        newest: dict[str, datetime] = {}
        for run, _ in self.pending.values():
            if run.name not in names or run.trigger == "manual" or (until is not None and run.scheduled_at > until):
                continue
            if run.name not in newest or run.scheduled_at > newest[run.name]:
                newest[run.name] = run.scheduled_at
        return newest

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
                self.checkpointer.committed(self.commits + self.marks_now)
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
            self.since = datetime.now(UTC)
            self.failures = 0
        self.failures += 1
        self.next_try = now + min(_RETRY_MAX, _RETRY_MIN * 2 ** min(self.failures - 1, 8))
        if not self.pending:
            return  # another write failed, and its caller hears of it: no run waits
        if not self.told:
            self.told = True
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

    def _keep_waiting(self) -> None:
        """While the ledger cannot take them, give the runs waiting to :attr:`keep` each
        round they changed (taken from the queue: a run's start, its end)."""
        if self.keep is None or self.error is None or self.lost or not self.pending:
            return
        if self.kept != (self.taken, len(self.pending)):
            self.kept = (self.taken, len(self.pending))
            self.keep([run for run, _ in self.pending.values()])

    def _recovered(self, written: int = 0) -> None:
        if self.error is None or self.lost or self.pending:
            return
        if self.keep is not None and self.kept is not None:
            self.kept = None
            self.keep([])  # all in the ledger now
        log.info('run ledger "%s" writable again; %d run(s) written', self.path, self.written_meanwhile + written)
        self.error = self.since = None
        self.failures = self.written_meanwhile = 0
        self.told = False

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
                if not force or len(self.sidecars) < len(_SIDECARS):
                    self._note_sidecars()
                if st.st_nlink > 1 and not self.other_names:
                    # Opened under one name only (see backend.store.sqlite.file.refuse_other_names): no
                    # schedtui process opens it through the other, but any other tool would.
                    self.other_names = True
                    log.error(
                        'the store file "%s" now has %d names (hard links): a process opening it through another '
                        "name would keep a write-ahead log of its own and corrupt the store; remove the other names",
                        self.path, st.st_nlink,
                    )
                return
        self.lost = True
        self.error = "the store file was deleted or replaced while in use"
        self.since = datetime.now(UTC)
        dropped = self._drop_sidecars()
        log.error(
            'the store file "%s" was deleted or replaced while in use: nothing written from now on would '
            "survive (%d run(s) not written); restore the file, or restart to create a new store%s",
            self.path, len(self.pending),
            f" (its {' and '.join(dropped)} were removed: SQLite would have replayed them into the file put at "
            "that path)" if dropped else "",
        )  # fmt: skip

    def _note_sidecars(self) -> None:
        for suffix in _SIDECARS:
            with contextlib.suppress(OSError):
                st = os.stat(self.path + suffix)
                self.sidecars[suffix] = (st.st_dev, st.st_ino)

    def _drop_sidecars(self) -> list[str]:
        """Remove the lost file's log and shared memory, those seen beside it while it was
        this writer's (a file of those names made since is another's: kept). Its own
        connections keep them open, and SQLite neither checkpoints nor deletes them at
        close, the file having moved: left there, they were replayed into a restored
        backup (a corrupt store, or the lost file's last runs added to it)."""
        dropped = []
        for suffix, identity in self.sidecars.items():
            name = self.path + suffix
            try:
                st = os.stat(name)
                if (st.st_dev, st.st_ino) == identity:
                    os.unlink(name)
                    dropped.append(f'"{name}"')
            except OSError:
                pass  # gone already, or cannot be removed: the README's restore says to
        return dropped

    def unavailable(self) -> Unavailable:
        if self.lost:
            return Unavailable(
                f'the store file "{self.path}" was deleted or replaced while in use; nothing written now would survive',
                public="the store file was deleted or replaced while in use; nothing written now would survive",
            )
        return store_unavailable(
            self.path, "{store} cannot be written",
            f"{self.error} ({len(self.pending)} run(s) waiting; they are kept and retried)",
        )  # fmt: skip

    def health(self) -> StoreHealth:
        with self.lock:
            queued = list(self.queued)
        # (Any thread: a membership test on the writer's dict, which it may be changing.)
        waiting = len(self.pending) + sum(1 for run_id in queued if run_id not in self.pending)
        if self.lost:
            return StoreHealth("lost", self.error, waiting, self.since)
        if self.crashed:
            return StoreHealth("failing", "the ledger writer stopped (see the log)", waiting, self.since)
        if self.error is not None:
            return StoreHealth("failing", self.error, waiting, self.since)
        return StoreHealth("ok", waiting=waiting)
