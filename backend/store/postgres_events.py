"""Change signals between the instances sharing a PostgreSQL store: NOTIFY and LISTEN (a
mixin of :class:`~backend.store.postgres.PostgresStore`; see :mod:`backend.relay`).

A notification is sent by a statement of its own on a pooled connection (autocommit),
except the one that announces a batch of run rows: it rides the batch's own transaction
(see ``PostgresStore.announce_runs``). Listening needs a connection of its own, outside the
pool, held open for as long as someone wants to hear; it is checked every
:data:`LISTEN_CHECK` seconds and opened again, with backoff, when it is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection

from ..loops import stop_if_cancelled

__all__ = ["PostgresEvents"]

log = logging.getLogger("schedtui.events")

CHANNEL = "schedtui_events"
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
        _conninfo: str

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
        conn: AsyncConnection[Any] | None = None
        try:
            while True:
                try:
                    if has_readers() and conn is None:
                        conn = await AsyncConnection.connect(self._conninfo, autocommit=True, application_name=READERS_APP)
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
        failures = 0
        listening: bool | None = None  # as last told to on_state
        while True:
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(
                    self._conninfo, autocommit=True, application_name="schedtui-listen"
                )
                await conn.execute(LISTEN)
                if failures:
                    log.info("listening to the other instances again")
                failures = 0
                if listening is not True:
                    listening = True
                    on_state(True)
                while True:
                    stop_if_cancelled()
                    async for notify in conn.notifies(timeout=LISTEN_CHECK):
                        on_payload(notify.payload)
                    await conn.execute(PING)  # quiet for a while: is the connection still there?
            except (psycopg.Error, OSError) as exc:
                if listening is not False:
                    listening = False
                    on_state(False)
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
