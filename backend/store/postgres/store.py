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
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from backend.errors import BadInput, NameTaken, Refused, Unavailable
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
from backend.store import FIRING, Membership, Unfinished, redact_url, store_unavailable
from backend.store.migrations import CORE, applied, components_of, migrate_postgres, postgres_components_current
from backend.store.postgres.activity import PostgresActivity
from backend.store.postgres.alerts import PostgresAlerts
from backend.store.postgres.audit import PostgresAudit
from backend.store.postgres.catalog import PostgresCatalog
from backend.store.postgres.cluster import PostgresCluster
from backend.store.postgres.durable import PostgresDurable
from backend.store.postgres.events import PostgresEvents, _Listener
from backend.store.postgres.jobs import PostgresJobs, _Rider
from backend.store.postgres.lane import Lane
from backend.store.postgres.ledger import (
    PostgresLedgerWriter,
)
from backend.store.postgres.locks import PostgresLocks
from backend.store.postgres.logs import PRUNE_RUN_LOGS, PostgresLogs
from backend.store.postgres.metrics import PostgresMetrics
from backend.store.postgres.pooler import SEE, detect_sharing, split_url
from backend.store.postgres.sql import (
    BACKFILL_PKEY,
    CLAIM,
    CLAIMED_RUN,
    CLEAR_STARTING,
    CLOSE_RUNS,
    CONFIGURE,
    CONFIGURE_POOLED,
    COUNT_CLAIMS,
    CREATE_VERSION_TABLE,
    END_BACKFILL,
    END_STUCK_SESSIONS,
    FLEET_LOCK,
    FORGET_HOLDER,
    FORGET_INSTANCE,
    GET_BACKFILL,
    GET_RUN,
    GET_STATES,
    GET_VERSION,
    HAS_VERSION_TABLE,
    HEARTBEAT,
    INSERT_BACKFILL,
    INSERT_VERSION,
    INSTANCE_LIST,
    INSTANCES,
    ISOLATION,
    LAST_RUNS,
    LAST_SLOTS,
    LATEST_RUNS,
    LIST_RUNS,
    LIST_RUNS_BEFORE,
    LOCK_CLASS,
    LOCK_MIGRATE,
    MARK_STARTING,
    MIGRATE_LOCK,
    MIGRATIONS,
    NAME_HOLDER,
    POOLED_TIMEOUTS,
    PRUNE_BACKFILLS,
    PRUNE_OWN_CLAIMS,
    PRUNE_RUNS,
    RELEASE_CLAIM,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    RUNS_BETWEEN,
    SERVER_CLOCK,
    SERVER_ENCODING,
    SET_STATE,
    SLOT_RECORDED,
    STARTING_MARKS,
    SWEEP_CLAIMS,
    SYNCHRONOUS_COMMIT,
    UPDATE_BACKFILL,
    UPDATE_VERSION,
    UPSERT_RUNS,
    WHO_MIGRATES,
    _backfill,
    _claims_json,
    _run,
    _runs_json,
    _utc,
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

#: How long a call waits for a pooled connection before giving up (seconds). Claims get
#: a shorter wait: a slot that cannot be claimed promptly is not fired (fail closed).
_POOL_WAIT = 3.0
_CLAIM_WAIT = 2.0
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

#: Statement errors that say the server cannot do its part now, whatever the statement:
#: told as an outage (:class:`Unavailable`), as a connection's failure is. A failover
#: leaves the old primary answering as a read-only standby (or a pooler still sends there
#: for a while): every write then fails with 25006, which is no bug of the statement's.
#: A privilege the role lacks (42501: a table created by an upgrade its grants do not
#: cover yet) is the deployment's to fix, and the work resumes once it is granted.
_SERVER_CANNOT = ("25006", "42501")


def _public_reason(exc: BaseException) -> str:
    """Why a call failed, in words that name no host, port, user or database: what
    ``/healthz`` and the HTTP API's 503 bodies say (the log and the command line get the
    driver's own line, passwords redacted)."""
    if isinstance(exc, PoolTimeout):
        return "no connection to the server (it is down or unreachable)"
    state = getattr(exc, "sqlstate", None) or ""
    for prefix, reason in _PUBLIC_REASONS:
        if state.startswith(prefix):
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


def _connection_lost(exc: psycopg.Error) -> bool:
    """True when the error says the connection (not the statement) failed: worth one retry."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_ENDED


class PostgresStore(
    PostgresLedgerWriter, PostgresJobs, PostgresCatalog, PostgresDurable, PostgresLocks, PostgresCluster, PostgresAudit,
    PostgresAlerts, PostgresEvents, PostgresMetrics, PostgresActivity, PostgresLogs,
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
        self._conninfo = make_conninfo("", **params)
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
            await self._check_encoding(conn)
            await self._check_synchronous_commit(conn)  # (what the session got, before CONFIGURE)
            if self.pooler.transaction:
                await self._check_pooled_isolation(conn)
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
        try:
            await pool.open(wait=True, timeout=float(_CONNINFO_DEFAULTS["connect_timeout"]) + 2)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close(timeout=1)
            raise store_unavailable(self.where, "cannot reach {store}", self._why(exc), _public_reason(exc)) from None
        try:
            if self.pooler.transaction:
                await self._check_pooled_timeouts(first)
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

    async def _check_pooled_timeouts(self, conn: AsyncConnection[Any]) -> None:
        """Behind a transaction pooler the store sets no timeout of its own (a ``SET``
        would stay on the server connection for the pooler's next client): say so when the
        server's, for this role and database, are none."""
        row = await (await conn.execute(POOLED_TIMEOUTS)).fetchone()
        names = ("statement_timeout", "idle_in_transaction_session_timeout")
        unset = [name for name, value in zip(names, row or (), strict=False) if value == "0"]
        if unset:
            log.warning(
                'the store "%s" is behind a transaction pooler, where schedtui sets no timeout per connection, '
                "and the server's %s unlimited: a statement or transaction left hanging holds its locks; set them "
                "for schedtui's role, e.g. ALTER ROLE … SET statement_timeout = '30s'; ALTER ROLE … SET "
                "idle_in_transaction_session_timeout = '60s' (%s)",
                self.where, " and ".join(unset) + (" are" if len(unset) > 1 else " is"), SEE,
            )  # fmt: skip

    async def _check_encoding(self, conn: AsyncConnection[Any]) -> None:
        """Refuse a database that is not UTF8: a LATIN1 one fails every write of a character
        it has no byte for (a handler's error, a payload, a note), and a SQL_ASCII one every
        statement with text, each as a driver error in the middle of the work; better once,
        at start, saying what to do."""
        row = await (await conn.execute(SERVER_ENCODING)).fetchone()
        encoding = row[0] if row else "UTF8"
        if isinstance(encoding, bytes):  # (a SQL_ASCII database's text comes back undecoded)
            encoding = encoding.decode("ascii", "replace")
        if encoding != "UTF8":
            raise store_unavailable(
                self.where,
                "cannot use {store} as given",
                f"its database's encoding is {encoding}, and schedtui's text (names, payloads, a handler's errors "
                "and logs) is Unicode: create the database with ENCODING 'UTF8' (CREATE DATABASE … TEMPLATE "
                "template0 ENCODING 'UTF8')",
                f"the database's encoding is {encoding} (UTF8 is needed)",
            )

    async def _check_pooled_isolation(self, conn: AsyncConnection[Any]) -> None:
        """Behind a transaction pooler the store cannot make its sessions ``read committed``
        (see CONFIGURE): refuse a server whose sessions default to anything else, rather
        than fire, claim and fence under a snapshot that misses the commits they wait for."""
        row = await (await conn.execute(ISOLATION)).fetchone()
        level = row[0] if row else "read committed"
        if level != "read committed":
            raise store_unavailable(
                self.where,
                "cannot use {store} as given",
                f"its sessions default to {level} isolation (default_transaction_isolation), and behind a "
                "transaction pooler schedtui cannot set read committed for its own: its claims, fences and locks "
                "need it; set it for schedtui's role: ALTER ROLE … SET default_transaction_isolation = "
                f"'read committed' ({SEE})",
                f"the server's sessions default to {level} isolation (read committed is needed)",
            )

    @staticmethod
    async def _configure(conn: AsyncConnection[Any]) -> None:
        await conn.execute(CONFIGURE)

    async def _check_synchronous_commit(self, conn: AsyncConnection[Any]) -> None:
        """Warn when the server's sessions of this role and database do not make a commit
        durable before answering it (see CONFIGURE): the store turns it back on for its
        own connections, but not behind a transaction pooler, where it cannot."""
        row = await (await conn.execute(SYNCHRONOUS_COMMIT)).fetchone()
        if not row or row[0] != "off":
            return
        if self.pooler.transaction:
            log.warning(
                'the store "%s" has synchronous_commit = off for this role or database, and behind a transaction '
                "pooler schedtui cannot turn it on for its own sessions: a server crash can lose commits it already "
                "acknowledged, and with them the claims, checkpoints and lock tokens that keep work from running "
                "twice; set it for schedtui's role: ALTER ROLE … SET synchronous_commit = on (%s)",
                self.where, SEE,
            )  # fmt: skip
        else:
            log.warning(
                'the store "%s" has synchronous_commit = off for this role or database: schedtui turns it on for '
                "its own connections (a commit lost in a server crash after it was acknowledged could run work "
                "twice); other clients of the database keep it off",
                self.where,
            )

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
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
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
        if isinstance(exc, PoolTimeout):
            return "no connection to the server (it is down or unreachable)"
        return _one_line(exc)

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

    async def take_firing_lock(self, instance: str) -> None:
        """Nothing to take: instances sharing PostgreSQL coordinate through its claims."""

    def _require_pool(self) -> AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]:
        if self._pool is None:
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
                raise self._trouble(exc) from None
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
                raise
        raise AssertionError("unreachable")

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

    # -- runs: reads and the rest -----------------------------------------------------------
    async def get_run(self, run_id: str) -> Run | None:
        row = await self._fetchone(GET_RUN, (run_id,))
        return _run(row) if row else None

    async def list_runs(self, name: str, *, limit: int, before: str | None = None) -> list[Run]:
        if before:
            rows = await self._fetchall(LIST_RUNS_BEFORE, {"name": name, "before": before, "limit": limit})
        else:
            rows = await self._fetchall(LIST_RUNS, (name, limit))
        return [_run(row) for row in rows]

    async def last_runs(self, names: Iterable[str], *, manual: bool = False) -> dict[str, Run]:
        wanted = list(names)
        if not wanted:
            return {}
        rows = await self._fetchall(LATEST_RUNS if manual else LAST_RUNS, (wanted,))
        return {row[1]: _run(row) for row in rows}

    async def runs_between(
        self, names: Iterable[str], start: datetime, end: datetime, *, limit_per_name: int
    ) -> dict[str, list[Run]]:
        wanted = list(names)
        if not wanted:
            return {}
        params = {"names": wanted, "start": start, "end": end, "limit": limit_per_name}
        found: dict[str, list[Run]] = {}
        for row in await self._fetchall(RUNS_BETWEEN, params):
            found.setdefault(row[1], []).append(_run(row))
        return found

    async def last_slots(self, names: Iterable[str]) -> dict[str, datetime]:
        wanted = sorted(set(names))
        if not wanted:
            return {}
        rows = await self._fetchall(LAST_SLOTS, (wanted,))
        return {name: slot.astimezone(UTC) for name, slot in rows if slot is not None}

    async def running_runs(self) -> list[Run]:
        return [_run(row) for row in await self._fetchall(RUNNING_RUNS)]

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        if not runs:
            return set()
        await self.flush()  # the order of hand-in: a version handed in earlier lands first
        rows = await self._fetchall(CLOSE_RUNS, (_runs_json(runs),))
        self.commits += 1
        return {str(row[0]) for row in rows}

    async def prune_runs(self, created_before: datetime) -> int:
        await self.flush()
        floor = id_floor(created_before)

        async def prune(conn: AsyncConnection[Any]) -> int:
            async with conn.transaction():
                await conn.execute(PRUNE_BACKFILLS, (created_before,))
                removed = (await conn.execute(PRUNE_RUNS, (floor,))).rowcount
                await conn.execute(PRUNE_RUN_LOGS, (floor,))  # their logs
                return removed

        removed = await self._with_conn(prune)
        self.commits += 1
        return removed

    # -- schedule state -------------------------------------------------------------------
    async def get_states(self) -> dict[str, ScheduleState]:
        rows = await self._fetchall(GET_STATES)
        return {
            row[0]: ScheduleState(
                name=row[0], enabled=bool(row[1]), changed_by=row[2], changed_at=_utc(row[3]), note=row[4]  # type: ignore[arg-type]
            )
            for row in rows
        }

    async def set_state(self, state: ScheduleState) -> None:
        params = (state.name, state.enabled, store_text(state.changed_by), state.changed_at, store_text(state.note))
        await self._execute(SET_STATE, params)

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
    ) -> Role:
        async def beat(conn: AsyncConnection[Any]) -> Role:
            async with conn.transaction():
                return await _beat(conn, instance, host, pid, at, membership)

        role = await self._with_conn(beat)
        self.commits += 1
        return role

    async def server_clock(self) -> datetime:
        row = await self._fetchone(SERVER_CLOCK)
        assert row is not None
        return _utc(row[0])  # type: ignore[return-value]

    async def instances(self) -> dict[str, tuple[str, int, datetime]]:
        rows = await self._fetchall(INSTANCES)
        return {row[0]: (row[1], row[2], _utc(row[3])) for row in rows}  # type: ignore[misc]

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._fetchall(INSTANCE_LIST)
        return [
            InstanceInfo(row[0], row[1], row[2], _utc(row[3]), _utc(row[4]), row[5], row[6], row[7], bool(row[8]))  # type: ignore[arg-type]
            for row in rows
        ]  # (an older version's row: no clock, NULL)

    async def forget_instance(self, instance: str, host: str | None = None, pid: int | None = None) -> None:
        if host is None or pid is None:
            await self._execute(FORGET_INSTANCE, (instance,))
        else:
            await self._execute(FORGET_HOLDER, (instance, host, pid))

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        await self._execute(MARK_STARTING, (slot, instance))

    async def starting_marks(self) -> dict[str, datetime]:
        return {row[0]: _utc(row[1]) for row in await self._fetchall(STARTING_MARKS)}  # type: ignore[misc]

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        async def read(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
            async with conn.transaction():  # one commit for the three, not three
                return await self._read_unfinished(conn)

        return await self._with_conn(read)

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
        async def beat(conn: AsyncConnection[Any]) -> Unfinished:
            ended = 0
            if stuck_after is not None:
                ended = await self._end_stuck_sessions(conn, stuck_after)
            async with conn.transaction():  # a member's round: one commit, not two
                recorded = await _beat(conn, instance, host, pid, at, membership)
                # The runs before the instances: a run committed after its instance renewed
                # is then never read beside that instance's older heartbeat.
                runs, backfills, marks = await self._read_unfinished(conn)
                beats = await (await conn.execute(INSTANCES)).fetchall()
            instances = {r[0]: (r[1], r[2], _utc(r[3])) for r in beats}
            return Unfinished(runs, backfills, marks, instances, recorded, ended)  # type: ignore[arg-type]

        return await self._with_conn(beat)

    @staticmethod
    async def _end_stuck_sessions(conn: AsyncConnection[Any], after: timedelta) -> int:
        row = await (await conn.execute(END_STUCK_SESSIONS, (after.total_seconds(),))).fetchone()
        return int(row[0]) if row is not None else 0

    @staticmethod
    async def _read_unfinished(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        runs = await (await conn.execute(RUNNING_RUNS)).fetchall()
        backfills = await (await conn.execute(RUNNING_BACKFILLS)).fetchall()
        marks = await (await conn.execute(STARTING_MARKS)).fetchall()
        return [_run(r) for r in runs], [_backfill(r) for r in backfills], {r[0]: r[1].astimezone(UTC) for r in marks}

    async def close_unrecorded(self, instance: str, slot: datetime, runs: Sequence[Run]) -> list[Run]:
        async def close(conn: AsyncConnection[Any]) -> list[Run]:
            async with conn.transaction():
                if (await conn.execute(CLEAR_STARTING, (instance, slot))).rowcount != 1:
                    return []  # cleared by someone else meanwhile
                missing = [
                    run for run in runs if await (await conn.execute(SLOT_RECORDED, (run.name, slot))).fetchone() is None
                ]
                if missing:
                    await conn.execute(UPSERT_RUNS, (_runs_json(missing),))
            self.commits += 1
            return missing

        return await self._with_conn(close)

    # -- claims ---------------------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        if not claims:
            return ClaimResult(frozenset())
        # A key twice in the batch would get one claim row but two placeholder runs.
        params = {"claims": _claims_json(unique_claims(claims)), "instance": instance, "at": at}

        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(CLAIM, params)).fetchall()

        rows = await self._with_conn(go, wait=_CLAIM_WAIT)
        self.commits += 1
        won = frozenset(value for kind, value in rows if kind == "won")
        busy = {kind[len("busy:") :]: value for kind, value in rows if kind.startswith("busy:")}
        return ClaimResult(won, busy)

    async def claimed_run(self, key: str) -> str | None:
        row = await self._fetchone(CLAIMED_RUN, (key,))
        return row[0] if row else None

    async def release_claim(self, key: str, run_id: str) -> bool:
        return await self._execute(RELEASE_CLAIM, {"key": key, "run_id": run_id}) == 1

    async def prune_claims(self, name: str | None, before: datetime) -> int:
        if name is None:
            return await self._execute(SWEEP_CLAIMS, (before,))
        return await self._execute(PRUNE_OWN_CLAIMS, (name, before))

    async def count_claims(self) -> int:
        row = await self._fetchone(COUNT_CLAIMS)
        return int(row[0]) if row else 0

    # -- backfills ------------------------------------------------------------------------
    async def start_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.id,
            progress.name,
            progress.start,
            progress.end,
            progress.total,
            progress.fired,
            progress.failed,
            progress.state,
            progress.instance,
            progress.started_at,
            progress.finished_at,
            progress.current,
        )
        try:
            await self._execute(INSERT_BACKFILL, params)
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == BACKFILL_PKEY:
                return  # a retry of our own insert whose reply was lost
            raise Refused(
                f'a backfill of "{progress.name}" is already running; wait for it to finish',
                count=progress.total,
                reason="a backfill is already running",
            ) from None

    async def update_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.fired,
            progress.failed,
            progress.state,
            progress.finished_at,
            progress.current,
            progress.id,
        )
        await self._execute(UPDATE_BACKFILL, params)

    async def end_backfill(self, progress: BackfillProgress) -> bool:
        params = (
            progress.fired,
            progress.failed,
            progress.state,
            progress.finished_at,
            progress.current,
            progress.id,
        )
        return bool(await self._execute(END_BACKFILL, params))

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._fetchone(GET_BACKFILL, (backfill_id,))
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        return [_backfill(row) for row in await self._fetchall(RUNNING_BACKFILLS)]


async def _beat(
    conn: AsyncConnection[Any],
    instance: str,
    host: str,
    pid: int,
    at: datetime,
    membership: Membership,
) -> Role:
    """The heartbeat, inside the caller's transaction (see :meth:`PostgresStore.heartbeat`)."""
    role, coordination, live_after, clock_offset, clock_off, taken_before = membership
    gated = role == "firing" and coordination is not None
    if gated:
        await conn.execute(FLEET_LOCK)
    row = await (
        await conn.execute(
            HEARTBEAT,
            {
                "instance": instance, "host": host, "pid": pid, "at": at, "role": role,
                "mode": coordination, "live_after": live_after if live_after is not None else at,
                "clock_offset": clock_offset, "clock_off": clock_off, "taken_before": taken_before,
            },
        )
    ).fetchone()  # fmt: skip
    if row is None:  # another process holds the name (see Membership.taken_before)
        holder = await (await conn.execute(NAME_HOLDER, (instance,))).fetchone()
        assert holder is not None
        raise NameTaken(instance, holder[0], holder[1], _utc(holder[2]))  # type: ignore[arg-type]
    return row[0]  # type: ignore[no-any-return]
