"""Change signals between the instances sharing a PostgreSQL store: NOTIFY and LISTEN (a
mixin of :class:`~backend.store.postgres.store.PostgresStore`; see :mod:`backend.events.relay`).

A notification is sent by a statement of its own on a pooled connection (autocommit),
except the one that announces a batch of run rows: it rides the batch's own transaction
(see ``PostgresStore.announce_runs``). Listening needs a connection of its own, outside the
pool, held open for as long as someone wants to hear; it is checked every
:data:`LISTEN_CHECK` seconds and opened again, with backoff, when it is lost.

A process listens on **one** connection, whatever it listens for (the other instances'
signals, and the job queue's wake-ups when it runs queues): PostgreSQL wakes every
listening connection of the database for every NOTIFY, whatever its channel, and each
wake-up is a transaction, so a second listening connection per process would double what
every notification of the fleet costs.

Behind a transaction pooler (``pooler=transaction``, see :mod:`.pooler`) a held connection
holds no session: both go to the server past it when the URL names it (``listen_host``,
``listen_port``), and otherwise nothing listens (each loop's poll does the work; said once
in the log) and no readers mark is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection, pq

from backend.runtime.loops import stop_if_cancelled

__all__ = ["PostgresEvents"]

log = logging.getLogger("schedtui.events")

CHANNEL = "schedtui_events"
#: The job queue's wake-ups (sent by :mod:`backend.store.postgres.jobs`).
JOBS_CHANNEL = "schedtui_jobs"
NOTIFY = f"SELECT pg_notify('{CHANNEL}', %s)"
#: The application name of the connection a process holds open while it has readers.
READERS_APP = "schedtui-readers"
_SOMEONE_READS = (
    f"EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND application_name = '{READERS_APP}')"
)
#: A notification whose payload the server picks: the whole one while some process of the
#: database has readers, otherwise the part the other engines act on (``NULL``: nothing is
#: sent). Every listening connection of the database is woken by every NOTIFY (one
#: transaction each), so a fleet nobody watches must not be told of every burst of runs,
#: job or lock change, only of what changes what it runs.
NOTIFY_CHOSEN = (
    f"SELECT pg_notify('{CHANNEL}', c.payload) FROM (SELECT CASE WHEN {_SOMEONE_READS} "
    "THEN %s::text ELSE %s::text END AS payload) AS c WHERE c.payload IS NOT NULL"
)
LISTEN = f"LISTEN {CHANNEL}"
LISTEN_JOBS = f"LISTEN {JOBS_CHANNEL}"
#: The check of a quiet listening connection: listening again is a no-op that needs the server.
PING = LISTEN
#: Seconds without a notification after which the listening connection is checked.
LISTEN_CHECK = 15.0
#: Pauses between attempts to listen again (seconds); the last repeats.
LISTEN_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class PostgresEvents:
    if TYPE_CHECKING:
        where: str
        _listen_conninfo: str | None
        _listener: _Listener | None
        _deaf_told: bool

        async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    async def notify_events(self, payload: str, unread: str | None = None) -> None:
        """Send ``payload`` while some process has readers; otherwise ``unread`` (the part
        the other engines need), or nothing when it is ``None``. One statement of its own."""
        if unread == payload:
            await self._execute(NOTIFY, (payload,))
        else:
            await self._execute(NOTIFY_CHOSEN, (payload, unread))

    async def hold_readers_mark(self, has_readers: Callable[[], bool], changed: asyncio.Event) -> None:
        """Until cancelled: while ``has_readers()``, hold a connection named
        :data:`READERS_APP` open (the other instances then announce their runs); ``changed``
        is set when the answer may have changed. Checked every :data:`LISTEN_CHECK` s."""
        conninfo = self._listen_conninfo
        if conninfo is None:  # behind a transaction pooler: a connection held there is no session
            await asyncio.Future()  # (until cancelled)
            return
        conn: AsyncConnection[Any] | None = None
        try:
            while True:
                try:
                    if has_readers() and conn is None:
                        conn = await AsyncConnection.connect(conninfo, autocommit=True, application_name=READERS_APP)
                    elif not has_readers() and conn is not None:
                        await conn.close()
                        conn = None
                    elif conn is not None:
                        await conn.execute("SELECT 1")  # still there?
                except (psycopg.Error, OSError) as exc:
                    log.debug("cannot hold the readers mark (%s); retrying", _one_line(exc))
                    if conn is not None:
                        await conn.close()
                    conn = None
                stop_if_cancelled()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), LISTEN_CHECK)
                changed.clear()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def listen_events(self, on_payload: Callable[[str], None], on_state: Callable[[bool], None]) -> None:
        """Until cancelled: the other instances' signals to ``on_payload``; ``on_state(up)``
        when the listening connection comes up (what is sent from then on is heard) or is lost."""
        await self._listen(CHANNEL, on_payload, on_state)

    async def watch_jobs(self, wake: Callable[[str | None], Any]) -> None:
        """Until cancelled: each queue named by a job wake-up to ``wake``; ``wake(None)``
        whenever the listening connection comes up (what was sent meanwhile was not heard)."""
        await self._listen(JOBS_CHANNEL, lambda payload: wake(payload or None), lambda up: wake(None) if up else None)

    async def _listen(self, channel: str, on_payload: Callable[[str], None], on_state: Callable[[bool], None]) -> None:
        """Subscribe to ``channel`` on this store's one listening connection until cancelled
        (the connection is held while anyone subscribes)."""
        if self._listen_conninfo is None:
            if not self._deaf_told:
                self._deaf_told = True
                log.info(
                    'the store "%s" is behind a transaction pooler (pooler=transaction), where LISTEN hears nothing: '
                    "the other instances' changes are polled instead; add listen_host=/listen_port= to the store URL "
                    '(the server past the pooler) to hear them at once (see "Behind PgBouncer" in the README)',
                    self.where,
                )  # fmt: skip
            await asyncio.Future()  # (until cancelled)
            return
        if self._listener is None:
            self._listener = _Listener(self._listen_conninfo, self.where)
        await self._listener.subscribe(channel, on_payload, on_state)


class _Listener:
    """One listening connection for every subscriber of a store (see the module)."""

    def __init__(self, conninfo: str, where: str) -> None:
        self.conninfo = conninfo
        self.where = where
        self.subscribers: dict[object, tuple[str, Callable[[str], None], Callable[[bool], None]]] = {}
        self.task: asyncio.Task[None] | None = None
        self.up: bool | None = None
        """Whether the connection is up, as last told to the subscribers (``None``: not known yet)."""
        self.fd: int | None = None
        """The socket the reader watches, while it does."""

    async def subscribe(self, channel: str, on_payload: Callable[[str], None], on_state: Callable[[bool], None]) -> None:
        key = object()
        self.subscribers[key] = (channel, on_payload, on_state)
        if self.up is not None:
            on_state(self.up)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="schedtui listener")
        try:
            await asyncio.Future()  # until cancelled
        finally:
            del self.subscribers[key]
            if not self.subscribers and self.task is not None:
                task, self.task, self.up = self.task, None, None
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        """Stop listening, whoever subscribes (the store is closing)."""
        if self.task is not None:
            task, self.task = self.task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._state(False)

    def _state(self, up: bool) -> None:
        if up != self.up:
            self.up = up
            for _, _, on_state in list(self.subscribers.values()):
                on_state(up)

    def _dispatch(self, channel: str, payload: str) -> None:
        for wanted, on_payload, _ in list(self.subscribers.values()):
            if wanted == channel:
                on_payload(payload)

    async def _hear(self, conn: AsyncConnection[Any]) -> None:
        """Until the connection fails (raised) or the task is cancelled: each notification
        to its subscribers, from the socket's reader, as it arrives.

        The reader stays on the socket for as long as the connection listens, and reads
        libpq's notifications itself: one callback per arrival, where psycopg's
        ``notifies()`` would add and remove a reader, and make a future and a timer, for
        every one (CPU on the path from a send to its job's start). Every
        :data:`LISTEN_CHECK` seconds without a notification the connection is asked
        something (:data:`PING`); one that has not answered by the next check is taken for
        lost (a half-open TCP connection never says so)."""
        pgconn = conn.pgconn
        encoding = conn.info.encoding  # (the database's, as psycopg would decode them)
        loop = asyncio.get_running_loop()
        fd = pgconn.socket
        lost: asyncio.Future[BaseException] = loop.create_future()
        heard = 0  # arrivals (notifications or answers) since the last check
        asked = False  # a PING not answered yet
        watching = True

        def unwatch() -> None:
            nonlocal watching
            if watching:
                watching = False
                self.fd = None
                loop.remove_reader(fd)
                loop.remove_writer(fd)

        def fail(exc: BaseException) -> None:
            # Let go of the socket now, in the callback that saw it fail: libpq may have
            # closed it already, and its number, once reused by a socket of someone else's,
            # must not be unwatched later in their place.
            unwatch()
            if not lost.done():
                lost.set_result(exc)

        def readable() -> None:
            nonlocal heard, asked
            try:
                pgconn.consume_input()
                if pgconn.status != pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the connection is closed")
                while not pgconn.is_busy():
                    result = pgconn.get_result()
                    if result is None:
                        break
                    if result.status == pq.ExecStatus.FATAL_ERROR:
                        raise psycopg.OperationalError(result.get_error_message())
                    asked = False
                while (notify := pgconn.notifies()) is not None:
                    heard += 1
                    self._dispatch(notify.relname.decode(encoding, "replace"), notify.extra.decode(encoding, "replace"))
            except (psycopg.Error, OSError) as exc:
                fail(exc)

        def writable() -> None:
            try:
                if not pgconn.flush():
                    loop.remove_writer(fd)
            except psycopg.Error as exc:
                fail(exc)

        loop.add_reader(fd, readable)
        self.fd = fd
        try:
            readable()  # (what arrived with the LISTEN's answer)
            while True:
                stop_if_cancelled()
                with contextlib.suppress(TimeoutError):
                    raise await asyncio.wait_for(asyncio.shield(lost), LISTEN_CHECK)
                if heard:
                    heard = 0
                    continue
                if asked:
                    raise psycopg.OperationalError(f"no answer in {LISTEN_CHECK:.0f}s")
                asked = True
                try:
                    pgconn.send_query(PING.encode())
                    unsent = pgconn.flush()
                except psycopg.Error as exc:
                    fail(exc)
                    raise
                if unsent:
                    loop.add_writer(fd, writable)
        finally:
            unwatch()

    async def _run(self) -> None:
        failures = 0
        while True:
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(self.conninfo, autocommit=True, application_name="schedtui-listen")
                # Both channels, whoever subscribes: a listening connection is woken by
                # every notification of the database anyway.
                await conn.execute(LISTEN)
                await conn.execute(LISTEN_JOBS)
                if failures:
                    log.info("listening to the other instances again")
                failures = 0
                self._state(True)
                await self._hear(conn)
            except (psycopg.Error, OSError) as exc:
                self._state(False)
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning('cannot listen to the other instances on "%s" (%s); retrying', self.where, _one_line(exc))
            finally:
                if conn is not None:
                    try:
                        await conn.close()
                    except Exception:  # closing a broken connection: nothing left to do
                        pass
            await asyncio.sleep(LISTEN_BACKOFF[min(failures, len(LISTEN_BACKOFF)) - 1])
