"""The fleet store: PostgreSQL through psycopg 3 and a psycopg_pool connection pool.

Several ``schedtui serve`` processes on several machines share one database. The claims
table is what makes each slot fire once: a winner inserts the slot's key; the primary key
turns every other insert of it away.

Runs are written like in the SQLite store, by group commit: :meth:`save_runs` only hands
runs to a writer task (:mod:`backend.store.postgres.ledger`), which upserts whatever has
gathered since its last commit in one statement and one transaction. So a thousand schedules due in the same second cost a few
commits, not a thousand. Everything else is one statement per call on a pooled
connection in autocommit mode.

Connections die (a server restart, a failover, a network cut). Every call that finds its
connection broken checks the pool's idle connections and retries once on a fresh one; if
the server is really gone the call raises :class:`~backend.errors.Unavailable` with a
one-line message, and the pool keeps reconnecting by itself in the background. Runs handed
in meanwhile stay with the writer, which retries until the server is back.

What an open asks of the server (a UTF8 database, durable commits, and behind a
transaction pooler read committed sessions and timeouts) is :mod:`.server_checks`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from backend.errors import BadInput, Unavailable
from backend.model import (
    CoordinationMode,
    Run,
    StoreHealth,
)
from backend.store import forks, redact_url, store_unavailable
from backend.store.migrations import CORE, applied, components_of, migrate_postgres, postgres_components_current
from backend.store.postgres.activity import PostgresActivity
from backend.store.postgres.alerts import PostgresAlerts
from backend.store.postgres.audit import PostgresAudit
from backend.store.postgres.catalog import PostgresCatalog
from backend.store.postgres.cluster import PostgresCluster
from backend.store.postgres.durable import PostgresDurable
from backend.store.postgres.events import PostgresEvents, _Listener
from backend.store.postgres.instances import PostgresInstances
from backend.store.postgres.jobs import PostgresJobs, _Rider
from backend.store.postgres.lane import Lane
from backend.store.postgres.ledger import (
    PostgresLedgerWriter,
)
from backend.store.postgres.locks import PostgresLocks
from backend.store.postgres.logs import PostgresLogs
from backend.store.postgres.metrics import PostgresMetrics
from backend.store.postgres.pooler import SEE, detect_sharing, split_url
from backend.store.postgres.runs import PostgresRuns
from backend.store.postgres.server_checks import (
    check_encoding,
    check_pooled_isolation,
    check_pooled_timeouts,
    check_synchronous_commit,
)
from backend.store.postgres.sql import (
    CONFIGURE,
    CONFIGURE_POOLED,
    CREATE_VERSION_TABLE,
    GET_VERSION,
    HAS_VERSION_TABLE,
    INSERT_VERSION,
    LOCK_CLASS,
    LOCK_MIGRATE,
    MIGRATE_LOCK,
    MIGRATIONS,
    UPDATE_VERSION,
    WHO_MIGRATES,
)

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

# During an outage the pool logs every failed reconnection attempt as a warning; this store
# reports the outage itself (once, then sparingly), so keep the pool to its errors unless
# the application configured that logger.
_pool_log = logging.getLogger("psycopg.pool")
if _pool_log.level == logging.NOTSET:
    _pool_log.setLevel(logging.ERROR)

#: libpq parameters set unless the URL says otherwise: fail fast on an unreachable server,
#: notice a dead peer within seconds, and name ourselves in pg_stat_activity.
_CONNINFO_DEFAULTS = {
    "connect_timeout": "5",
    "application_name": "schedtui",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}


def _application_name(given: str) -> str:
    """The name the store's sessions go by: ``schedtui``, followed by the URL's own name
    where it gives one (``?application_name=billing``: ``schedtui billing``). Each member's
    heartbeat ends the fleet's sessions stuck mid-statement by that prefix (see
    END_STUCK_SESSIONS): named ``billing`` alone, they held their locks for hours."""
    name = given.strip()
    return name if name.startswith("schedtui") else f"schedtui {name}".rstrip()


#: How long a call waits for a pooled connection before giving up (seconds). Claims get
#: a shorter wait (:data:`~backend.store.postgres.runs._CLAIM_WAIT`).
_POOL_WAIT = 3.0
def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


#: What a connection's failure is told as to clients (by SQLSTATE prefix): libpq's own text
#: names the host, the port, the user and the database.
_PUBLIC_REASONS = (
    ("28", "the server refused the credentials"),
    ("3D000", "the database does not exist"),
    ("53300", "the server has no connection slot left"),
    ("57P", "the server is shutting down or starting up"),
    ("08", "the connection to the server failed"),
    ("25006", "the server takes no writes (a read-only standby, or a failover under way)"),
)

#: The server's refusals at connection time, by their words (the server's English; see
#: :func:`_public_reason`), first match wins.
_CONNECT_REFUSALS = (
    ("password authentication failed", "the server refused the credentials"),
    ("is not permitted to log in", "the server refused the credentials"),
    ("no pg_hba.conf entry", "the server refused the credentials"),
    ('role "', "the server refused the credentials"),  # (role "x" does not exist)
    ("too many clients already", "the server has no connection slot left"),
    ("connection slots are reserved", "the server has no connection slot left"),
    ("does not exist", "the database does not exist"),
)

#: Statement errors that say the server cannot do its part now, whatever the statement:
#: told as an outage (:class:`Unavailable`), as a connection's failure is. A failover
#: leaves the old primary answering as a read-only standby (or a pooler still sends there
#: for a while): every write then fails with 25006, which is no bug of the statement's.
#: A privilege the role lacks (42501: a table created by an upgrade its grants do not
#: cover yet) is the deployment's to fix, and the work resumes once it is granted.
_SERVER_CANNOT = ("25006", "42501")


class _PoolBusy(PoolTimeout):
    """No connection in time because every one of the pool's is checked out: the server
    answers, but slowly, or more work came at once than the pool takes (not "down")."""


class _NotServed(PoolTimeout):
    """No connection in time from a server that does answer: it took a connection and then
    served no statement on it (a pooler with every server connection held: in session mode
    each client connection holds one for its life), or it took the first connection and
    the pool's next ones got nowhere. Not "down": told so, and what to look at."""


#: What :class:`_NotServed` says (the pooler's section of the README has the sizes).
NOT_SERVED = (
    "the server accepts connections but served none of the pool's within {waited:g} s: a pooler "
    "in front of it with no server connection free (in session mode each client connection holds "
    "one for its life: see the README's Behind PgBouncer), or the server stuck"
)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _answers(conn: AsyncConnection[Any], within: float) -> bool:
    """Whether the server says anything to a statement within ``within`` seconds. Sent
    below psycopg: its own wait, cancelled, asks the server to cancel the statement and
    waits up to 5 s more for that (through a pooler with no server connection, all of it)."""
    pgconn, loop = conn.pgconn, asyncio.get_running_loop()
    said: asyncio.Future[None] = loop.create_future()
    try:
        pgconn.send_query(b"SELECT 1")
        pgconn.flush()  # (a few bytes leave at once; if not, the server is not reading: silence)
    except psycopg.Error:
        return True  # (it broke: not a silence; the pool's own failure says the rest)
    loop.add_reader(pgconn.socket, _settle, said)
    try:
        await asyncio.wait_for(said, within)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pgconn.socket)
    return True


def _pool_busy(pool: AsyncConnectionPool[Any], waited: float) -> _PoolBusy | None:
    """The pool's timeout as every connection busy (``None``: it had room, and could not
    connect)."""
    stats = pool.get_stats()
    if stats.get("pool_size", 0) >= pool.max_size and not stats.get("pool_available", 0):
        return _PoolBusy(
            f"every one of the pool's {pool.max_size} connections to the server was in use for "
            f"{waited:g} s (statements running long, or more work at once than it takes)"
        )
    return None


#: At most one connection made to learn why the pool could not connect, this often (s).
PROBE_EVERY = 5.0
#: How long that connection may take (s): a server that does not answer is "unreachable".
PROBE_WAIT = 2.0


def _public_reason(exc: BaseException) -> str:
    """Why a call failed, in words that name no host, port, user or database: what
    ``/healthz`` and the HTTP API's 503 bodies say (the log and the command line get the
    driver's own line, passwords redacted)."""
    if isinstance(exc, (_PoolBusy, _NotServed)):
        return str(exc)
    if isinstance(exc, PoolTimeout):
        return "no connection to the server (it is down or unreachable)"
    state = getattr(exc, "sqlstate", None) or ""
    for prefix, reason in _PUBLIC_REASONS:
        if state.startswith(prefix):
            return reason
    if not state and isinstance(exc, psycopg.OperationalError):
        # A refusal at connection time comes without its SQLSTATE (libpq keeps the text only).
        said = str(exc)
        for words, reason in _CONNECT_REFUSALS:
            if words in said:
                return reason
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and state[:2] not in ("40", "55", "57"):
        return "the connection to the server failed" + (f" ({state})" if state else "")
    return _one_line(exc)  # a statement's own error (a serialization failure, a lock timeout)


#: The server ended the session before the statement ran: an administrator, a shutdown, or
#: the database's own idle timeouts (``idle_session_timeout``, which a pooled connection
#: left idle meets; ``idle_in_transaction_session_timeout``). Worth one retry on a fresh one.
_SESSION_ENDED = ("57P01", "57P02", "57P03", "57P05", "25P03")


#: The README section the migration's refusal points to.
SEE_ROLES = 'see "A role of its own for the instances" in the README'


def _check_version(version: int) -> None:
    if version > len(MIGRATIONS):
        raise Unavailable(
            f"the store's schema is version {version}, newer than this schedtui knows "
            f"({len(MIGRATIONS)}); upgrade schedtui before opening it"
        )


def _out_of_step(exc: psycopg.Error) -> bool:
    """A protocol error of the client's, no SQLSTATE: the connection's answers no longer
    match its commands (a server connection that died behind a pooler)."""
    return isinstance(exc, psycopg.InternalError) and exc.sqlstate is None


def _connection_lost(exc: psycopg.Error) -> bool:
    """True when the error says the connection (not the statement) failed: worth one retry."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_ENDED


class PostgresStore(
    PostgresRuns, PostgresInstances, PostgresLedgerWriter, PostgresJobs, PostgresCatalog, PostgresDurable, PostgresLocks,
    PostgresCluster, PostgresAudit, PostgresAlerts, PostgresEvents, PostgresMetrics, PostgresActivity, PostgresLogs,
):
    """The fleet store. ``PostgresStore("postgresql://user:pass@host:5432/db")``.

    Tables are created in the first schema of the connection's ``search_path`` (add
    ``?options=-csearch_path%3Dsomewhere`` to the URL to choose another); the user needs
    the right to create tables there at the first start.

    Behind a pooler in transaction mode, add ``pooler=transaction`` (and optionally
    ``listen_host``/``listen_port``): see :mod:`backend.store.postgres.pooler`.
    """

    kind = "postgresql"
    default_coordination: CoordinationMode = "advisoryLock"

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact_url(url)
        self.migrated: list[tuple[str, str]] = []
        libpq_url, self.pooler = split_url(url, self.where)
        try:
            params = conninfo_to_dict(libpq_url)
        except psycopg.Error as exc:
            raise BadInput(f'bad store URL "{self.where}": {_one_line(exc)}') from None
        for key, value in _CONNINFO_DEFAULTS.items():
            params.setdefault(key, value)
        params["application_name"] = _application_name(str(params["application_name"] or ""))
        self._conninfo = make_conninfo("", **params)
        self._probed: tuple[float, BaseException | None] | None = None
        """When the pool last could not connect and a connection of its own was tried, and
        what the server said (``None``: nothing, or no answer in time)."""
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        if self.pooler.transaction:
            # A statement prepared on one server connection is missing on the next, or is
            # another client's of the same name there: every statement goes unnamed.
            self._connect_kwargs["prepare_threshold"] = None
        self._listen_conninfo: str | None = self._conninfo
        """Where the listening connection (and the readers mark) goes: ``None`` behind a
        transaction pooler unless the URL names the server past it."""
        if self.pooler.listens_directly:
            direct = {k: v for k, v in params.items() if k != "hostaddr" or self.pooler.listen_host is None}
            if self.pooler.listen_host is not None:
                direct["host"] = self.pooler.listen_host
            if self.pooler.listen_port is not None:
                direct["port"] = str(self.pooler.listen_port)
            self._listen_conninfo = make_conninfo("", **direct)
        elif self.pooler.transaction:
            self._listen_conninfo = None
        self._pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] | None = None
        self._forked_from: int | None = None
        """The parent's pid, in a child forked while this store was open (see :mod:`..forks`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        # writer (group commit)
        self._lock = threading.Lock()
        self._incoming: list[Run] = []
        self._handed = 0  # save_runs calls so far (under _lock)
        self._committed = 0  # of those, how many are committed (writer task only)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._write_failures = 0
        self._pending: dict[str, Run] = {}  # the writer's runs, not yet committed
        self._write_trouble: tuple[str, datetime] | None = None  # why the writer cannot write, since
        self._conn_trouble: tuple[str, datetime] | None = None  # the last call's connection trouble
        self.commits = 0
        """Write transactions committed (group commits, claims, other writes)."""
        self.rows_written = 0
        """Run rows upserted by the group commit."""
        self.announce_runs: Callable[[Sequence[Run]], str | None] | None = None
        """Set by the relay: the notification that tells the other instances of a batch
        of run rows, sent inside the batch's own transaction."""
        self._listener: _Listener | None = None  # the one listening connection, while subscribed
        self._deaf_told = False  # (behind a transaction pooler: that nothing listens, logged once)
        self._pooler_hinted = False
        self._checkpoints: Lane | None = None
        """The connection kept for durable steps' checkpoints (see :mod:`.lane`), while open."""
        self._senders: list[Lane] = []
        """The connections kept for sends (see :mod:`.jobs`), while open."""
        self._cyclers: list[Lane] = []
        """The connections kept for the workers' cycles (see :mod:`.jobs`), while open."""
        self._riders: dict[str, list[_Rider]] = {}
        """Per queue, sends waiting for one of them to go together (see :mod:`.jobs`)."""
        self._carrying: set[asyncio.Future[None]] = set()

    # -- opening and closing ---------------------------------------------------------------
    async def open(self) -> None:
        if self._pool is not None:
            return
        # One plain connection first: its error says exactly what is wrong (refused, unknown
        # host, bad password), and it creates or migrates the schema.
        try:
            conn = await AsyncConnection.connect(self._conninfo, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise store_unavailable(self.where, "cannot reach {store}", _one_line(exc), _public_reason(exc)) from None
        try:
            await check_encoding(conn, self.where)
            await check_synchronous_commit(conn, self.where, pooled=self.pooler.transaction)  # (what the session got, before CONFIGURE)
            if self.pooler.transaction:
                await check_pooled_isolation(conn, self.where)
                await self._configure_pooled(conn)
            else:
                await self._configure(conn)  # (read committed, for the migration's lock-then-read)
            await self._migrate(conn)
            pool = await self._open_pool(conn)
        except psycopg.Error as exc:
            raise store_unavailable(self.where, "cannot set up {store}", _one_line(exc), _public_reason(exc)) from None
        finally:
            await conn.close()
        self._pool = pool
        if self.pooler.transaction:
            # Behind a transaction pooler the connections kept for hot paths would keep
            # statements prepared on a server connection they do not keep: the pool serves.
            self._checkpoints, self._senders, self._cyclers = None, [], []
        else:
            self._checkpoints = self._checkpoint_lane()
            self._senders = self._send_lanes()
            self._cyclers = self._cycle_lanes()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._writer = asyncio.ensure_future(self._write_loop())
        self._writer.set_name("schedtui postgres writer")
        forks.opened(self)

    def forget_after_fork(self, parent: int) -> None:
        """(See :mod:`backend.store.forks`.) The parent's sessions, unclosed: every call of
        the child's goes to the pool, which is gone, and says why."""
        self._forked_from = parent
        self._pool, self._writer, self._listener = None, None, None
        self._checkpoints, self._senders, self._cyclers = None, [], []

    async def _open_pool(self, first: AsyncConnection[Any]) -> AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]:
        """The pool, open; ``first`` (the connection that migrated) is still open, to tell a
        transaction pooler in front of the server that the URL did not mention."""
        pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
            self._conninfo,
            kwargs=self._connect_kwargs,
            min_size=2,
            max_size=8,
            open=False,
            name="schedtui",
            timeout=_POOL_WAIT,
            # Give up on a reconnection attempt quickly: the next request that finds the
            # pool short starts a new one at once, instead of after a growing backoff.
            reconnect_timeout=2.0,
            reconnect_failed=lambda pool: None,
            configure=self._configure_pooled if self.pooler.transaction else self._configure,
        )
        waited = float(_CONNINFO_DEFAULTS["connect_timeout"]) + 2
        try:
            await pool.open(wait=True, timeout=waited)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close(timeout=1)
            if isinstance(exc, PoolTimeout):  # (``first`` got through: the server answers)
                exc = _NotServed(NOT_SERVED.format(waited=waited))
            raise store_unavailable(self.where, "cannot reach {store}", self._why(exc), _public_reason(exc)) from None
        try:
            if self.pooler.transaction:
                await check_pooled_timeouts(first, self.where)
            else:
                async with pool.connection() as second:
                    shared = await detect_sharing(first, second)
                if shared is not None:
                    raise store_unavailable(
                        self.where,
                        "cannot use {store} as given",
                        f"two of its connections were served by one server session (pid {shared}): a connection "
                        "pooler in transaction mode is in front of the server; add pooler=transaction to the "
                        f"store URL ({SEE})",
                        "a connection pooler in transaction mode is in front of the server; add pooler=transaction "
                        "to the store URL",
                    )
        except BaseException:
            await pool.close(timeout=1)
            raise
        return pool

    @staticmethod
    async def _configure(conn: AsyncConnection[Any]) -> None:
        await conn.execute(CONFIGURE)

    @staticmethod
    async def _configure_pooled(conn: AsyncConnection[Any]) -> None:
        """Behind a transaction pooler: only what the pooler keeps per client."""
        await conn.execute(CONFIGURE_POOLED)

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        """Bring the tables to this release, unless reading says they are (then no DDL is
        sent at all: a role without the right to change the schema opens a current store).
        A role that may not migrate what needs it is told what to do."""
        migrating = False
        try:
            if await self._schema_current(conn):
                return
            migrating = True
            await self._migrate_locked(conn)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidSchemaName) as exc:
            row = await (await conn.execute(WHO_MIGRATES)).fetchone()
            user, schema = row if row else ("?", None)
            if migrating:
                where = f'schema "{schema}"' if schema else "any schema (its search_path names none that exists)"
                reason = (
                    f"its tables need creating or migrating to this release of schedtui, and the role \"{user}\" may "
                    f"not create tables in {where}: run `schedtui migrate` once with a role that may (the schema's "
                    "owner), or GRANT CREATE ON SCHEMA … TO that role"
                )
                public = "its tables need creating or migrating to this release, and its role may not"
            else:
                reason = (
                    f'the role "{user}" may not use schedtui\'s tables: GRANT SELECT, INSERT, UPDATE, DELETE ON '
                    "ALL TABLES IN SCHEMA … and USAGE ON ALL SEQUENCES IN SCHEMA … TO it"
                )
                public = "its role may not use schedtui's tables"
            raise store_unavailable(
                self.where, "cannot set up {store}", f"{_one_line(exc)}: {reason} ({SEE_ROLES})", public
            ) from None

    async def _schema_current(self, conn: AsyncConnection[Any]) -> bool:
        """Whether every table is at this release's version, found by reading alone (no
        lock: versions only go up, and one newer than this code is refused here too)."""
        present = await (await conn.execute(HAS_VERSION_TABLE)).fetchone()
        row = await (await conn.execute(GET_VERSION)).fetchone() if present and present[0] else None
        if row is None:
            return False
        _check_version(int(row[0]))
        return int(row[0]) == len(MIGRATIONS) and await postgres_components_current(conn, components_of(type(self)))

    async def _migrate_locked(self, conn: AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await conn.execute(MIGRATE_LOCK, (LOCK_CLASS, LOCK_MIGRATE))
            await conn.execute(CREATE_VERSION_TABLE)
            row = await (await conn.execute(GET_VERSION)).fetchone()
            version = int(row[0]) if row else 0
            _check_version(version)
            done: list[tuple[str, str]] = []
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        await conn.execute(statement)
                done.append(applied(CORE, f"version {number}"))
            if row is None:
                await conn.execute(INSERT_VERSION, (len(MIGRATIONS),))
            elif version != len(MIGRATIONS):
                await conn.execute(UPDATE_VERSION, (len(MIGRATIONS),))
            done += await migrate_postgres(conn, components_of(type(self)))
        self.migrated = done
        self.commits += 1

    async def close(self) -> None:
        if self._writer is not None:
            try:
                await asyncio.wait_for(self.flush(), timeout=10)
            except (Unavailable, TimeoutError) as exc:
                log.error("closing the store with run(s) not written: %s", exc or "no answer within 10s")
            writer, self._writer = self._writer, None
            writer.cancel()
            # Bounded: a writer that never ends (a statement that never answers) must not
            # hang the process's stop; what it held is logged below as not written.
            done, _ = await asyncio.wait({writer}, timeout=10)
            if not done:
                log.error("the ledger's writer did not stop within 10s of its cancellation; closing without it")
            elif not writer.cancelled() and writer.exception() is not None:  # (retrieved: a bug, said)
                log.error("the ledger's writer failed: %s", writer.exception())
            with self._lock:
                left, self._incoming = [*self._pending.values(), *self._incoming], []
            self._pending.clear()
            for run in left:
                # The last resort: the log is the only place left that can keep it.
                log.error("run not written to the ledger: %s", json.dumps(run.to_json(), ensure_ascii=False))
        if self._listener is not None:
            await self._listener.close()
        if self._checkpoints is not None:
            lane, self._checkpoints = self._checkpoints, None
            await lane.close()
        lanes, self._senders, self._cyclers = self._senders + self._cyclers, [], []
        for lane in lanes:
            await lane.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close(timeout=5)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(store_unavailable(self.where, "{store} was closed"))
        self._waiters = []

    # -- plumbing -------------------------------------------------------------------------
    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, (_PoolBusy, _NotServed)):
            return str(exc)
        if isinstance(exc, PoolTimeout):
            return "no connection to the server (it is down or unreachable)"
        return _one_line(exc)

    async def _no_connection(self, pool: AsyncConnectionPool[Any], exc: PoolTimeout, waited: float) -> BaseException:
        """Why the pool gave no connection in time, as it was: every connection busy, or
        the server's own refusal (a changed password, no connection slot left, a database
        dropped), learned by connecting once (at most every :data:`PROBE_EVERY` seconds);
        the pool's timeout itself when the server does not answer."""
        busy = _pool_busy(pool, waited)
        if busy is not None:
            return busy
        now = asyncio.get_running_loop().time()
        if self._probed is None or now - self._probed[0] >= PROBE_EVERY:
            self._probed = (now, self._probed[1] if self._probed else None)  # (one probe at a time)
            failure: BaseException | None = None
            try:
                conn = await asyncio.wait_for(AsyncConnection.connect(self._conninfo, **self._connect_kwargs), PROBE_WAIT)
            except psycopg.Error as refused:
                failure = refused
            except TimeoutError:
                pass
            else:
                try:  # (a pooler lets a client in without a server connection for it)
                    if not await _answers(conn, PROBE_WAIT):
                        failure = _NotServed(NOT_SERVED.format(waited=waited))
                finally:
                    await conn.close()
            self._probed = (now, failure)
        return self._probed[1] or exc

    def _unavailable(self, exc: BaseException) -> Unavailable:
        return store_unavailable(self.where, "{store} is unavailable", self._why(exc), _public_reason(exc))

    def _trouble(self, exc: BaseException) -> Unavailable:
        """Remember connection trouble for :meth:`health` (in the words ``/healthz`` may
        show); the error to raise."""
        since = self._conn_trouble[1] if self._conn_trouble else datetime.now(UTC)
        self._conn_trouble = (_public_reason(exc), since)
        return self._unavailable(exc)

    def health(self) -> StoreHealth:
        with self._lock:
            waiting = len(self._incoming) + len(self._pending)
        trouble = self._write_trouble or self._conn_trouble
        if self._writer is not None and self._writer.done():
            return StoreHealth("failing", "the ledger writer stopped (see the log)", waiting)
        if trouble is not None:
            return StoreHealth("failing", trouble[0], waiting, trouble[1])
        return StoreHealth("ok", waiting=waiting)

    async def take_firing_lock(self, instance: str, *, claims: bool = False) -> None:
        """Nothing to take: instances sharing PostgreSQL coordinate through its claims."""

    def _require_pool(self) -> AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]:
        if self._pool is None:
            if self._forked_from is not None:
                raise store_unavailable(self.where, forks.forked_problem(self._forked_from))
            raise store_unavailable(self.where, "{store} is not open")
        return self._pool

    async def _with_conn(
        self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], *, wait: float = _POOL_WAIT
    ) -> T:
        """Run ``fn`` on a pooled connection; retry once on a fresh one if the connection
        turns out to be dead (a restarted server). Connection trouble -> Unavailable."""
        pool = self._require_pool()
        for attempt in (1, 2):
            try:
                async with pool.connection(timeout=wait) as conn:
                    result = await fn(conn)
                self._conn_trouble = None
                self._store_answered()
                return result
            except PoolTimeout as exc:
                raise self._trouble(await self._no_connection(pool, exc, wait)) from None
            except (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.IdleInTransactionSessionTimeout) as exc:
                self._hint_pooler(exc)
                if attempt == 2 or not _connection_lost(exc):
                    raise self._trouble(exc) from None
                log.info("store connection lost (%s); retrying on a fresh one", _one_line(exc))
                try:
                    await pool.check()  # drop every idle connection that died with it
                except Exception:  # the check itself failing is the next attempt's problem
                    pass
            except psycopg.Error as exc:
                self._hint_pooler(exc)
                if exc.sqlstate in _SERVER_CANNOT:
                    raise self._trouble(exc) from None
                if not _out_of_step(exc):
                    raise
                # A server connection that died behind a pooler answers the next command
                # with the server's error and the pooler's ("received 2 results from command
                # 'BEGIN'"): the connection is lost, as a restart's is. Taken for a refusal,
                # a slot was lost without a missed row and a run that succeeded was closed
                # abandoned.
                if attempt == 2:
                    raise self._trouble(exc) from None
                log.info("store connection out of step (%s); retrying on a fresh one", _one_line(exc))
                try:
                    await pool.check()  # (drop the idle connections that died with it)
                except Exception:  # the check itself failing is the next attempt's problem
                    pass
        raise AssertionError("unreachable")

    async def _again(
        self, first: Callable[[AsyncConnection[Any]], Awaitable[T]], again: Callable[[AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        """A write: ``first(conn)`` on a pooled connection, and ``again(conn)`` in its place
        when :meth:`_with_conn` sends it a second time (its connection broke with it in
        flight: the first sending may have committed, its answer lost). ``again`` looks for
        the first sending's doing before it answers: sent again as it was, a write found its
        own effect and answered as if someone else had done it."""
        runs = 0

        async def go(conn: AsyncConnection[Any]) -> T:
            nonlocal runs
            runs += 1
            return await (first if runs == 1 else again)(conn)

        result = await self._with_conn(go)
        self.commits += 1
        return result

    def _hint_pooler(self, exc: psycopg.Error) -> None:
        """A prepared statement missing, already there or not the one expected is what a
        transaction pooler the store was not told of does to psycopg's statements (when
        the check at open did not catch it): say what to do, once."""
        if self._pooler_hinted or self.pooler.transaction or "prepared statement" not in str(exc):
            return
        self._pooler_hinted = True
        log.error(
            'the store "%s" lost track of a prepared statement (%s): is a connection pooler in transaction mode in '
            "front of the server? Then add pooler=transaction to the store URL (%s)", self.where, _one_line(exc), SEE,
        )  # fmt: skip

    async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(sql, params)).fetchall()

        return await self._with_conn(go)

    async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        async def go(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(sql, params)).fetchone()

        return await self._with_conn(go)

    async def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """One write statement (its own transaction); returns the affected row count."""

        async def go(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(sql, params)).rowcount

        count = await self._with_conn(go)
        self.commits += 1
        return count
