"""A connection of its own for the statements of a hot path (a durable step's checkpoint, a
job's send, a worker's cycle).

A statement run through the pool pays for a checkout and a return, a cursor, psycopg's
adaptation of every parameter and its wait on the socket (a reader added and removed, a
future and a timer per wait): about as much CPU again as the commit's own round trip on
the client. A :class:`Lane` keeps one connection with its statements prepared on it (at
the protocol level), its socket watched by one reader for as long as it is open, and
sends each call's parameters as it is given them, already encoded (text, or the server's
binary form where the caller says so): what is left per call is libpq's send, one wake-up
and the reply, which the caller awaits as the reply's future itself. Several statements go as one transaction in one
round trip (pipeline mode, :meth:`Lane.call_many`), and one more after its commit if asked.

It carries one call at a time and is only ever a shortcut: whoever uses it falls back to
the pool when it is busy, not connected yet, or fails (:class:`LaneFailed`), so a
statement must be safe to run again after a failure (a checkpoint is an upsert fenced by
the lease; a start run again finds its own row). It never retries by itself. A call cancelled in flight leaves the lane busy
until the reply has been read and dropped; a connection that breaks is closed, and the
lane connects again in the background, at most every :data:`RECONNECT_EVERY` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, pq

__all__ = ["RECONNECT_EVERY", "Lane", "LaneFailed", "numbered"]

log = logging.getLogger("schedtui.store")

#: Seconds between two attempts to connect the lane (the pool serves meanwhile).
RECONNECT_EVERY = 5.0


class LaneFailed(Exception):
    """The call did not go through the lane (an error, a broken connection): run it on the
    pool. Whether the statement took effect is unknown."""


def numbered(sql: str) -> str:
    """psycopg's positional ``%s`` placeholders as the server's ``$1``, ``$2``, …"""
    count = iter(range(1, sql.count("%s") + 1))
    return re.sub("%s", lambda _: f"${next(count)}", sql)


#: The statuses of a clean result.
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
#: The statements that frame a call's first transaction when one follows it (every lane's).
_BEGIN, _COMMIT = b"schedtui_lane_begin", b"schedtui_lane_commit"


def _unframed(results: list[pq.abc.PGresult]) -> list[pq.abc.PGresult]:
    """A framed call's results without its BEGIN's and its COMMIT's (the first, and the
    last but one); a call that failed keeps them all (its first error is what it says)."""
    if len(results) < 3 or any(r.status not in _OK for r in results):
        return results
    return results[1:-2] + results[-1:]


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Lane:
    """One connection for a few prepared statements (see the module docstring), each named
    ``{name}_{key}`` on the server."""

    def __init__(
        self,
        conninfo: str,
        name: str,
        statements: Mapping[str, str],
        configure: Callable[[AsyncConnection[Any]], Awaitable[None]],
    ) -> None:
        self.conninfo = conninfo
        self.name = name
        self.statements = {key: (f"{name}_{key}".encode(), numbered(sql).encode()) for key, sql in statements.items()}
        self.configure = configure
        self._conn: AsyncConnection[Any] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        """The socket the reader watches (libpq may close it before the lane lets go)."""
        self._connecting: asyncio.Task[None] | None = None
        self._tried_at = -RECONNECT_EVERY
        self._waiter: asyncio.Future[list[pq.abc.PGresult]] | None = None
        self._single: asyncio.Future[pq.abc.PGresult] | None = None
        """The reply of a :meth:`call` sent whole: its one result, checked here."""
        self._results: list[pq.abc.PGresult] = []
        self._busy = False
        self._syncs = 0
        """The Syncs of the call in flight whose results have not been read (pipeline mode,
        see :meth:`call_many`; 0: not in pipeline mode)."""
        self._framed = False
        """The call in flight opened its first transaction with BEGIN (see :meth:`call_many`)."""
        self._rolling_back = False
        """That transaction failed, and its ROLLBACK is in flight."""
        self._prepared = False
        """Connected, and its statements prepared: calls may go through it."""
        self.closed = False
        self.calls = 0
        """Calls that went through the lane (failed ones included)."""

    @property
    def connected(self) -> bool:
        return self._prepared

    @property
    def opening(self) -> bool:
        """Connected, or connecting now."""
        return self._prepared or self._connecting is not None

    @property
    def pid(self) -> int | None:
        """The server process of its connection (``None``: not connected)."""
        return None if self._pgconn is None else self._pgconn.backend_pid

    def available(self, connect: bool = True) -> bool:
        """Whether a call may go through the lane now (connected, and free). A lane not
        connected starts connecting in the background (at most every
        :data:`RECONNECT_EVERY` seconds; unless ``connect`` is false) and says no meanwhile."""
        if self._prepared:
            return not self._busy
        if (
            connect
            and self._pgconn is None
            and self._connecting is None
            and not self.closed
            and time.monotonic() - self._tried_at >= RECONNECT_EVERY
        ):
            self._tried_at = time.monotonic()
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.set_name("schedtui lane")
        return False

    async def open(self) -> bool:
        """Connect now unless connected (or connecting: then wait for it); whether it is."""
        if self._pgconn is None and self._connecting is None and not self.closed:
            self._tried_at = time.monotonic()
            self._connecting = asyncio.ensure_future(self._connect())
        if self._connecting is not None:
            await asyncio.shield(self._connecting)
        return self._prepared

    async def _connect(self) -> None:
        try:
            conn = await AsyncConnection.connect(self.conninfo, autocommit=True)
        except psycopg.Error as exc:
            log.info("the %s connection could not be opened (%s); the pool serves meanwhile", self.name, exc)
            self._connecting = None
            return
        self._conn, self._pgconn = conn, conn.pgconn
        try:
            await self.configure(conn)
            await conn.execute("SET client_encoding TO 'UTF8'")  # parameters are sent as UTF-8
            self._loop = asyncio.get_running_loop()
            self._fd = conn.pgconn.socket
            self._loop.add_reader(self._fd, self._readable)
            for name, sql in (*self.statements.values(), (_BEGIN, b"BEGIN"), (_COMMIT, b"COMMIT")):
                self._busy = True
                conn.pgconn.send_prepare(name, sql)
                self._check(await self._reply())
            self._prepared = True
        except (psycopg.Error, LaneFailed) as exc:
            log.info("the %s connection could not be opened (%s); the pool serves meanwhile", self.name, exc)
            self._release()
        except BaseException:
            self._release()
            raise
        finally:
            self._connecting = None
            if self.closed:
                self._release()

    def call(
        self, key: str, params: Sequence[bytes | None], formats: Sequence[int] | None = None
    ) -> Awaitable[pq.abc.PGresult]:
        """Run the statement ``key`` with these parameters (text, encoded; or, where
        ``formats`` has a 1, in the server's binary form of their type); its one result, to
        await. Only when :meth:`available`. It fails with :class:`LaneFailed` for anything
        but a clean result. Sent now; what it returns is the reply's future itself (a
        checkpoint's await goes to it without one more coroutine, there and back)."""
        pgconn = self._pgconn
        assert pgconn is not None and not self._busy
        self._busy = True
        self.calls += 1
        try:
            pgconn.send_query_prepared(self.statements[key][0], params, formats)
            unsent = pgconn.flush()
        except psycopg.Error as exc:
            self._broken(exc)
            raise LaneFailed(str(exc)) from None
        if unsent:  # the socket's buffer is full: wait until it takes the rest
            return self._one(self._reply())
        # (nearly always: a short message leaves at once)
        assert self._loop is not None
        waiter: asyncio.Future[pq.abc.PGresult] = self._loop.create_future()
        self._single = waiter
        return waiter

    async def _one(self, reply: Awaitable[list[pq.abc.PGresult]]) -> pq.abc.PGresult:
        results = await reply
        failure = self._failure(results)
        if failure is not None:
            raise failure
        return results[0]

    async def call_many(
        self, calls: Sequence[tuple[str, Sequence[bytes | None]]], then: tuple[str, Sequence[bytes | None]] | None = None
    ) -> list[pq.abc.PGresult]:
        """Run several statements of the lane, in order, as one transaction in one round
        trip (pipeline mode, one Sync after the last: an error rolls back every one); their
        results, one each. ``then``: one more statement, in a transaction of its own after
        that one's commit, in the same round trip and the same write (the first transaction
        is then opened and committed by statements of its own; its result last; it does not
        run when the first one failed). As :meth:`call` otherwise."""
        return await self.start_many(calls, then)

    def start_many(
        self, calls: Sequence[tuple[str, Sequence[bytes | None]]], then: tuple[str, Sequence[bytes | None]] | None = None
    ) -> Awaitable[list[pq.abc.PGresult]]:
        """:meth:`call_many`, sent now (the lane is busy from here): its reply to await."""
        pgconn = self._pgconn
        assert pgconn is not None and not self._busy and calls
        self._busy = True
        self.calls += 1
        try:
            pgconn.enter_pipeline_mode()
            self._syncs = 1
            if then is None:
                for key, params in calls:
                    pgconn.send_query_prepared(self.statements[key][0], params)
            else:
                # One Sync, so one write: libpq's Sync flushes at once, and a second one (the
                # form before) cost the sender a write and the server a wake-up per call.
                # The first transaction is explicit, so that its COMMIT, not a Sync, ends it.
                pgconn.send_query_prepared(_BEGIN, [])
                for key, params in calls:
                    pgconn.send_query_prepared(self.statements[key][0], params)
                pgconn.send_query_prepared(_COMMIT, [])
                pgconn.send_query_prepared(self.statements[then[0]][0], then[1])
                self._framed = True
            pgconn.pipeline_sync()
        except psycopg.Error as exc:
            self._broken(exc)
            raise LaneFailed(str(exc)) from None
        return self._many(len(calls) + (then is not None))

    async def _many(self, expected: int) -> list[pq.abc.PGresult]:
        results = await self._reply()
        ok = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
        if len(results) == expected and all(r.status in ok for r in results):
            return results
        self._check(results)  # raises LaneFailed with the first error
        raise LaneFailed("an unexpected reply")

    async def _reply(self) -> list[pq.abc.PGresult]:
        """Flush what was sent, then wait for every result of it. Cancelled while waiting
        for the reply, the lane stays busy until the reader has read it to the end."""
        pgconn, loop, fd = self._pgconn, self._loop, self._fd
        if pgconn is None or loop is None:
            # Let go of since it was sent (the reader found it broken): what was sent may
            # have committed. An assertion here was taken for "not sent", and a send was
            # sent again: its jobs inserted twice.
            raise LaneFailed("the connection was lost before its reply was read")
        try:
            while pgconn.flush():  # a short message leaves at once; a full socket buffer waits
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(fd, _settle, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(fd)
        except psycopg.Error as exc:
            self._broken(exc)
            raise LaneFailed(str(exc)) from None
        except asyncio.CancelledError:
            self._broken(LaneFailed("cancelled while sending"))  # half a message: nothing to read
            raise
        waiter: asyncio.Future[list[pq.abc.PGresult]] = loop.create_future()
        self._waiter = waiter
        return await waiter

    def _readable(self) -> None:
        pgconn = self._pgconn
        if pgconn is None:
            return
        try:
            pgconn.consume_input()
            if pgconn.status != pq.ConnStatus.OK:
                raise LaneFailed("the connection is closed")
            ended = False
            while self._busy and not pgconn.is_busy():
                result = pgconn.get_result()
                if self._syncs:
                    # Each statement's results end with a None; the last Sync's own result
                    # ends the call (every result read: leaving pipeline mode is immediate).
                    if result is None:
                        if ended:
                            break  # (two in a row: nothing more has arrived yet)
                        ended = True
                        continue
                    ended = False
                    if result.status != pq.ExecStatus.PIPELINE_SYNC:
                        self._results.append(result)
                        continue
                    self._syncs -= 1
                    if self._syncs:
                        continue
                    pgconn.exit_pipeline_mode()
                    if self._framed:
                        self._framed = False
                        self._results = _unframed(self._results)
                        if pgconn.transaction_status == pq.TransactionStatus.INERROR:
                            # A statement failed inside BEGIN: the Sync left the transaction
                            # open and aborted. Rolled back before the lane is free again.
                            pgconn.send_query(b"ROLLBACK")
                            if pgconn.flush():
                                raise LaneFailed("the rollback could not be sent")
                            self._rolling_back = True
                            continue
                elif self._rolling_back:
                    if result is not None:
                        continue  # (the ROLLBACK's own result)
                    self._rolling_back = False
                elif result is not None:
                    self._results.append(result)
                    continue
                results, self._results = self._results, []
                waiter, self._waiter = self._waiter, None
                single, self._single = self._single, None
                self._busy = False
                if single is not None:
                    failure = self._failure(results)
                    if single.done():  # (cancelled: the reply is dropped)
                        pass
                    elif failure is None:
                        single.set_result(results[0])
                    else:
                        single.set_exception(failure)
                elif waiter is not None and not waiter.done():
                    waiter.set_result(results)
        except (psycopg.Error, LaneFailed) as exc:
            self._broken(exc)

    def _check(self, results: list[pq.abc.PGresult]) -> pq.abc.PGresult:
        failure = self._failure(results)
        if failure is not None:
            raise failure
        return results[0]

    def _failure(self, results: list[pq.abc.PGresult]) -> LaneFailed | None:
        """``None`` for one clean result; otherwise the failure to raise (the connection let
        go of first if the failure left it in a transaction)."""
        if len(results) == 1 and results[0].status in _OK:
            return None
        errors = [r.get_error_message() for r in results if r.status not in _OK]
        why = (errors[0] if errors else "an unexpected reply").strip()
        pgconn = self._pgconn
        if pgconn is None or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            self._broken(LaneFailed(why))
        return LaneFailed(why)

    def _broken(self, exc: BaseException) -> None:
        """The connection cannot be trusted any more: let go of it now (a waiting call
        fails; the lane connects again when asked, later)."""
        for pending in (self._waiter, self._single):
            if pending is not None and not pending.done():
                pending.set_exception(LaneFailed(str(exc)))
        self._waiter = self._single = None
        if not self.closed:
            log.info("the %s connection failed (%s); the pool serves until it is back", self.name, exc)
        self._release()

    def _release(self) -> None:
        pgconn, self._pgconn, self._conn = self._pgconn, None, None
        self._prepared = False
        self._syncs = 0
        self._framed = self._rolling_back = False
        self._results = []
        self._busy = False
        if pgconn is None:
            return
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
        self._fd = -1
        pgconn.finish()  # what the connection's close() does: no reply awaited

    async def close(self) -> None:
        self.closed = True
        if self._connecting is not None:
            task, self._connecting = self._connecting, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for pending in (self._waiter, self._single):
            if pending is not None and not pending.done():
                pending.set_exception(LaneFailed("the store was closed"))
        self._waiter = self._single = None
        self._release()
