"""The fleet store's run ledger writer (a mixin of
:class:`~backend.store.postgres.store.PostgresStore`): :meth:`save_runs` only hands runs to a
writer task, which upserts whatever has gathered since its last commit in one statement
and one transaction, with the notification that announces them; rows the server refuses
are found one by one, and rows it cannot reach wait, retried, until it is back (at once
when any other statement of this process goes through: the retry backoff must not keep
finished runs looking in flight to the other instances' claims)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from backend.errors import Unavailable
from backend.model import Run
from backend.runtime.loops import stop_if_cancelled
from backend.store import store_unavailable
from backend.store.postgres.events import NOTIFY_CHOSEN, _one_line
from backend.store.postgres.sql import NOTE_LAST_FIRED, UPSERT_RUNS, WRITTEN_TURN_LOCKS, _runs_json

log = logging.getLogger("schedtui.store")
T = TypeVar("T")


#: Writer: most rows per statement, and the pause between failed attempts (grows to the max).
_WRITE_CHUNK = 5_000
_RETRY_MIN, _RETRY_MAX = 0.25, 2.0


class PostgresLedgerWriter:
    """The group-commit writer of the run ledger (its state is set up by the store)."""

    if TYPE_CHECKING:
        where: str
        commits: int
        rows_written: int
        announce_runs: Callable[[Sequence[Run]], str | None] | None
        _loop: asyncio.AbstractEventLoop | None
        _loop_thread: int
        _lock: threading.Lock
        _incoming: list[Run]
        _handed: int
        _committed: int
        _waiters: list[tuple[int, asyncio.Future[None]]]
        _wake: asyncio.Event | None
        _writer: asyncio.Task[None] | None
        _write_failures: int
        _pending: dict[str, Run]
        _write_trouble: tuple[str, datetime] | None
        _conn_trouble: tuple[str, datetime] | None

        async def _with_conn(self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], *, wait: float = ...) -> T: ...

    def save_runs(self, runs: Sequence[Run]) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or self._writer is None:
            raise store_unavailable(self.where, "{store} is not open")
        with self._lock:
            self._incoming.extend(runs)
            self._handed += 1
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    def _store_answered(self) -> None:
        """A statement of this process just went through. A writer waiting out its retry
        backoff with rows it could not write retries now: until it does, the other
        instances read this instance's finished runs as still in flight."""
        if self._write_failures and self._wake is not None:
            self._wake.set()

    async def flush(self) -> None:
        if self._writer is None or self._wake is None or self._loop is None:
            raise store_unavailable(self.where, "{store} is not open")
        with self._lock:
            target = self._handed
        if self._committed >= target:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((target, fut))
        self._wake.set()
        await fut

    def _settle(self, upto: int, error: Exception | None = None) -> None:
        """Wake the flushes waiting for hand-ins up to ``upto``: done, or failed with ``error``."""
        if error is None:
            self._committed = max(self._committed, upto)
        keep = []
        for target, fut in self._waiters:
            if fut.done():
                continue
            if target <= upto:
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
            else:
                keep.append((target, fut))
        self._waiters = keep

    async def _write_loop(self) -> None:
        assert self._wake is not None
        pending = self._pending
        while True:
            # The backoff's wait_for below (and psycopg's pool) can drop a cancellation
            # (Python 3.11): the close that sent it would then wait for this loop for ever.
            stop_if_cancelled()
            if not pending:
                await self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch, self._incoming = self._incoming, []
                upto = self._handed
            for run in batch:
                pending.pop(run.id, None)  # keep hand-in order: the latest version last
                pending[run.id] = run
            if not pending:
                self._settle(upto)
                continue
            try:
                try:
                    await self._with_conn(lambda conn: self._upsert(conn, list(pending.values())))
                except psycopg.Error as exc:
                    # Refused by the server, not lost on the way: find the culprit row by
                    # row rather than drop the whole batch.
                    log.warning(
                        "the ledger refused a batch of %d run(s) (%s); writing them one by one", len(pending), _one_line(exc)
                    )
                    await self._upsert_each(pending)
            except Exception as exc:
                if not isinstance(exc, Unavailable):  # a bug: keep the rows, say it loudly
                    log.exception("could not write %d run(s) to the ledger", len(pending))
                    exc = store_unavailable(self.where, "{store} could not write runs", _one_line(exc), "see the log")
                self._write_failures += 1
                since = self._write_trouble[1] if self._write_trouble else datetime.now(UTC)
                # What /healthz shows: the words fit for anyone (no host, user or database).
                self._write_trouble = (self._conn_trouble[0] if self._conn_trouble else exc.public, since)
                self._settle(upto, exc)
                if self._write_failures == 1 or self._write_failures % 20 == 0:
                    log.warning("cannot write %d run(s) to the ledger yet, will retry: %s", len(pending), exc)
                delay = min(_RETRY_MAX, _RETRY_MIN * 2 ** min(self._write_failures - 1, 8))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            if self._write_failures:
                log.info("run ledger writable again; %d run(s) written", len(pending))
                self._write_failures = 0
                self._write_trouble = None
            pending.clear()
            self._settle(upto)

    async def _upsert(self, conn: AsyncConnection[Any], runs: list[Run]) -> None:
        started: dict[str, datetime] = {}  # instance -> the latest fired_at among its runs here
        for run in runs:
            fired = run.fired_at
            if fired is not None and run.status not in ("skipped", "missed"):
                latest = started.get(run.instance)
                if latest is None or fired > latest:
                    started[run.instance] = fired
        # Rows taking their schedules' turns as they are written (a Run now's, placed):
        # committed under those schedules' turn locks (see WRITTEN_TURN_LOCKS).
        turns = sorted({run.name for run in runs if run.held and run.status == "running" and run.fired_at is None})
        async with conn.transaction():
            if turns:
                await conn.execute(WRITTEN_TURN_LOCKS, (turns,))
            for start in range(0, len(runs), _WRITE_CHUNK):
                await conn.execute(UPSERT_RUNS, (_runs_json(runs[start : start + _WRITE_CHUNK]),))
            for instance, fired in started.items():
                await conn.execute(NOTE_LAST_FIRED, (fired, instance))
            announce = self.announce_runs
            payload = announce(runs) if announce is not None else None
            if payload is not None:
                # Rides this commit: one transaction per batch, not two, and the other
                # instances hear of the rows exactly when they become readable; and only
                # while some process has readers (see NOTIFY_CHOSEN).
                await conn.execute(NOTIFY_CHOSEN, (payload, None))
        self.commits += 1
        self.rows_written += len(runs)

    async def _upsert_each(self, pending: dict[str, Run]) -> None:
        """Write ``pending`` row by row, dropping only the rows the server refuses (they could
        never be written). Connection trouble stops it with :class:`Unavailable`, the rows
        not yet written still in ``pending``."""
        for run in list(pending.values()):
            try:
                await self._with_conn(functools.partial(self._upsert, runs=[run]))
            except psycopg.Error as exc:
                log.error("run %s of %s cannot be written to the ledger: %s", run.id, run.name, _one_line(exc))
            del pending[run.id]
