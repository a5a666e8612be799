"""The fleet store: PostgreSQL through psycopg 3 and a psycopg_pool connection pool.

Several ``schedtui serve`` processes on several machines share one database. The claims
table is what makes each slot fire once: a winner inserts the slot's key; the primary key
turns every other insert of it away.

Runs are written like in the SQLite store, by group commit: :meth:`save_runs` only hands
runs to a writer task, which upserts whatever has gathered since its last commit in one
statement and one transaction. So a thousand schedules due in the same second cost a few
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
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import BadInput, Refused, Unavailable
from ..ids import id_floor
from ..model import (
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    InstanceInfo,
    Run,
    ScheduleState,
    StoreHealth,
    unique_claims,
)
from . import Unfinished, redact_url
from .migrations import components_of, migrate_postgres
from .postgres_audit import PostgresAudit
from .postgres_durable import PostgresDurable
from .postgres_events import NOTIFY_CHOSEN
from .postgres_events import PostgresEvents
from .postgres_catalog import PostgresCatalog
from .postgres_jobs import PostgresJobs
from .postgres_cluster import PostgresCluster
from .postgres_locks import PostgresLocks
from .rows import BACKFILL_FIELDS, RUN_FIELDS, RUN_WRITE_FIELDS, backfill_from_row, run_from_row

log = logging.getLogger("schedtui.store")
T = TypeVar("T")

# During an outage the pool logs every failed reconnection attempt as a warning; this store
# reports the outage itself (once, then sparingly), so keep the pool to its errors unless
# the application configured that logger.
_pool_log = logging.getLogger("psycopg.pool")
if _pool_log.level == logging.NOTSET:
    _pool_log.setLevel(logging.ERROR)

# ---------------------------------------------------------------------------------------
# SQL: everything this store says to PostgreSQL is here.
# ---------------------------------------------------------------------------------------

#: Advisory lock taken (transaction-scoped) around schema creation and migration, so N
#: instances starting at once migrate one after the other. Two-key form: (class, object).
LOCK_CLASS = 0x5C4ED  # "schedtui"
LOCK_MIGRATE = 1

MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(%s, %s)"
CREATE_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schedtui_schema_version (version integer NOT NULL)"
GET_VERSION = "SELECT version FROM schedtui_schema_version"
INSERT_VERSION = "INSERT INTO schedtui_schema_version (version) VALUES (%s)"
UPDATE_VERSION = "UPDATE schedtui_schema_version SET version = %s"

#: Each entry moves the schema up one version; applied in order under MIGRATE_LOCK.
#: Run ids sort by creation time as bytes, hence COLLATE "C" (whatever the database's locale).
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE schedtui_runs (
        id            text COLLATE "C" PRIMARY KEY,
        name          text NOT NULL,
        scheduled_at  timestamptz NOT NULL,
        fired_at      timestamptz,
        finished_at   timestamptz,
        status        text NOT NULL,
        trigger       text NOT NULL,
        outcome       text NOT NULL,
        instance      text NOT NULL,
        error_tag     text,
        error_message text
    );
    CREATE INDEX schedtui_runs_by_name ON schedtui_runs (name, id);
    CREATE INDEX schedtui_runs_by_slot ON schedtui_runs (name, scheduled_at) WHERE trigger <> 'manual';
    CREATE INDEX schedtui_runs_running ON schedtui_runs (name) WHERE status = 'running';
    CREATE TABLE schedtui_schedule_state (
        name       text PRIMARY KEY,
        enabled    boolean NOT NULL,
        changed_by text NOT NULL,
        changed_at timestamptz NOT NULL,
        note       text
    );
    CREATE TABLE schedtui_instances (
        instance     text PRIMARY KEY,
        host         text NOT NULL,
        pid          integer NOT NULL,
        heartbeat_at timestamptz NOT NULL
    );
    CREATE TABLE schedtui_backfills (
        id           text COLLATE "C" PRIMARY KEY,
        name         text NOT NULL,
        range_start  timestamptz NOT NULL,
        range_end    timestamptz NOT NULL,
        total        integer NOT NULL,
        fired        integer NOT NULL,
        failed       integer NOT NULL,
        state        text NOT NULL,
        instance     text NOT NULL,
        started_at   timestamptz NOT NULL,
        finished_at  timestamptz,
        current_slot timestamptz
    );
    CREATE UNIQUE INDEX schedtui_backfills_one_running ON schedtui_backfills (name) WHERE state = 'running';
    CREATE TABLE schedtui_claims (
        key        text COLLATE "C" PRIMARY KEY,
        name       text NOT NULL,
        instance   text NOT NULL,
        claimed_at timestamptz NOT NULL,
        run_id     text NOT NULL
    );
    CREATE INDEX schedtui_claims_by_name ON schedtui_claims (name, claimed_at);
    """,
    """
    ALTER TABLE schedtui_instances ADD COLUMN last_fired_at timestamptz;
    """,
    """
    ALTER TABLE schedtui_instances ADD COLUMN starting_at timestamptz;
    """,
    # Runs are read in scheduled order (a backfill's old slots land among their peers).
    """
    DROP INDEX schedtui_runs_by_name;
    CREATE INDEX schedtui_runs_by_name_slot ON schedtui_runs (name, scheduled_at, id);
    """,
    """
    ALTER TABLE schedtui_runs ADD COLUMN traceback text;
    """,
)

RUN_COLUMNS = ", ".join(RUN_FIELDS)
RUN_WRITE_COLUMNS = ", ".join(RUN_WRITE_FIELDS)
_KEEP_CLOSED = ",\n        ".join(
    f"{c} = CASE WHEN schedtui_runs.status = 'running' THEN excluded.{c} ELSE schedtui_runs.{c} END"
    for c in RUN_WRITE_FIELDS[1:]
    if c != "error_message"
)
#: What a finished run's row gains when another version of it arrives late (an instance
#: frozen past the abandon window, whose run was closed meanwhile): one sentence appended
#: to its error message. The row itself stays as it was closed.
LATE_NOTE = """
    'late result from instance ' || excluded.instance
    || coalesce(' at ' || to_char(excluded.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), '')
    || ': ' || excluded.status
    || coalesce(' [' || excluded.error_tag || ']', '')
    || coalesce(' ' || left(excluded.error_message, 200), '')
"""
#: One statement for a whole group commit. The batch travels as one JSON document (one
#: parameter: cheap to build in Python, where a parameter per column would be adapted
#: element by element on the event loop). A row is replaced while it is ``running``; once
#: closed it stays closed: a later, different outcome only adds LATE_NOTE (once), and a
#: late ``running`` version or the same finished version again changes nothing.
UPSERT_RUNS = f"""
    INSERT INTO schedtui_runs ({RUN_WRITE_COLUMNS})
    SELECT {RUN_WRITE_COLUMNS} FROM json_to_recordset(%s::json) AS r(
        id text, name text, scheduled_at timestamptz, fired_at timestamptz, finished_at timestamptz,
        status text, trigger text, outcome text, instance text, error_tag text, error_message text,
        traceback text)
    ON CONFLICT (id) DO UPDATE SET
        {_KEEP_CLOSED},
        error_message = CASE WHEN schedtui_runs.status = 'running' THEN excluded.error_message
            ELSE coalesce(schedtui_runs.error_message || '; ', '') || {LATE_NOTE} END
    WHERE schedtui_runs.status = 'running' OR (
        excluded.status <> 'running'
        AND NOT (excluded.status = schedtui_runs.status
                 AND excluded.error_tag IS NOT DISTINCT FROM schedtui_runs.error_tag
                 AND excluded.finished_at IS NOT DISTINCT FROM schedtui_runs.finished_at)
        AND strpos(coalesce(schedtui_runs.error_message, ''), {LATE_NOTE}) = 0
    )
"""
CLOSE_RUN = """
    UPDATE schedtui_runs SET status = %s, finished_at = %s, error_tag = %s, error_message = %s
    WHERE id = %s AND status = 'running'
"""
GET_RUN = f"SELECT {RUN_WRITE_COLUMNS} FROM schedtui_runs WHERE id = %s"
LIST_RUNS = (
    f"SELECT {RUN_COLUMNS} FROM schedtui_runs WHERE name = %s ORDER BY scheduled_at DESC, id DESC LIMIT %s"
)
#: Keyset on (scheduled_at, id) from the cursor run's pair; LATERAL, so that the row
#: comparison is an index condition of the inner scan.
LIST_RUNS_BEFORE = f"""
    SELECT r.* FROM (SELECT scheduled_at, id FROM schedtui_runs WHERE id = %(before)s) AS c
    CROSS JOIN LATERAL (
        SELECT {RUN_COLUMNS} FROM schedtui_runs
        WHERE name = %(name)s AND (scheduled_at, id) < (c.scheduled_at, c.id)
        ORDER BY scheduled_at DESC, id DESC LIMIT %(limit)s
    ) AS r
"""
#: The newest self/external slot's run per name, or with LATEST_RUNS the newest of any trigger.
LAST_RUNS = f"""
    SELECT r.* FROM unnest(%s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT {RUN_COLUMNS} FROM schedtui_runs WHERE name = n.name AND trigger <> 'manual'
        ORDER BY scheduled_at DESC, id DESC LIMIT 1
    ) AS r
"""
LATEST_RUNS = f"""
    SELECT r.* FROM unnest(%s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT {RUN_COLUMNS} FROM schedtui_runs WHERE name = n.name ORDER BY scheduled_at DESC, id DESC LIMIT 1
    ) AS r
"""
RUNS_BETWEEN = f"""
    SELECT r.* FROM unnest(%(names)s::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT {RUN_COLUMNS} FROM schedtui_runs
        WHERE name = n.name AND scheduled_at >= %(start)s AND scheduled_at < %(end)s
        ORDER BY scheduled_at DESC, id DESC LIMIT %(limit)s
    ) AS r
"""
# A correlated max() per name: one backward index probe each (schedtui_runs_by_name_slot).
LAST_SLOTS = """
    SELECT n.name, (SELECT max(r.scheduled_at) FROM schedtui_runs r WHERE r.name = n.name AND r.trigger <> 'manual')
    FROM unnest(%s::text[]) AS n(name)
"""
RUNNING_RUNS = f"SELECT {RUN_COLUMNS} FROM schedtui_runs WHERE status = 'running'"
PRUNE_RUNS = "DELETE FROM schedtui_runs WHERE id < %s AND status <> 'running'"
GET_STATES = "SELECT name, enabled, changed_by, changed_at, note FROM schedtui_schedule_state"
SET_STATE = """
    INSERT INTO schedtui_schedule_state (name, enabled, changed_by, changed_at, note)
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at, note = excluded.note
"""
HEARTBEAT = """
    INSERT INTO schedtui_instances (instance, host, pid, heartbeat_at) VALUES (%s, %s, %s, %s)
    ON CONFLICT (instance) DO UPDATE SET host = excluded.host, pid = excluded.pid,
        heartbeat_at = excluded.heartbeat_at
"""
INSTANCES = "SELECT instance, host, pid, heartbeat_at FROM schedtui_instances"
INSTANCE_LIST = (
    "SELECT instance, host, pid, heartbeat_at, last_fired_at FROM schedtui_instances ORDER BY instance COLLATE \"C\""
)
#: Kept by the group commit, in its transaction: when this instance last started a run.
NOTE_LAST_FIRED = """
    UPDATE schedtui_instances SET last_fired_at = greatest(last_fired_at, %s) WHERE instance = %s
"""
FORGET_INSTANCE = "DELETE FROM schedtui_instances WHERE instance = %s"
MARK_STARTING = "UPDATE schedtui_instances SET starting_at = %s WHERE instance = %s"
STARTING_MARKS = "SELECT instance, starting_at FROM schedtui_instances WHERE starting_at IS NOT NULL"
CLEAR_STARTING = "UPDATE schedtui_instances SET starting_at = NULL WHERE instance = %s AND starting_at = %s"
SLOT_RECORDED = (
    "SELECT 1 FROM schedtui_runs WHERE name = %s AND scheduled_at = %s AND trigger <> 'manual' LIMIT 1"
)
BACKFILL_COLUMNS = ", ".join(BACKFILL_FIELDS)
INSERT_BACKFILL = (
    f"INSERT INTO schedtui_backfills ({BACKFILL_COLUMNS}) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
UPDATE_BACKFILL = """
    UPDATE schedtui_backfills SET fired = %s, failed = %s, state = %s, finished_at = %s, current_slot = %s
    WHERE id = %s
"""
GET_BACKFILL = f"SELECT {BACKFILL_COLUMNS} FROM schedtui_backfills WHERE id = %s"
RUNNING_BACKFILLS = f"SELECT {BACKFILL_COLUMNS} FROM schedtui_backfills WHERE state = 'running'"
PRUNE_BACKFILLS = "DELETE FROM schedtui_backfills WHERE state <> 'running' AND started_at < %s"
BACKFILL_PKEY = "schedtui_backfills_pkey"

#: The whole claim of a batch, in one statement (one round trip, one transaction):
#:
#: * ``inserted``: the claims, in key order (so concurrent claimers wait on each other's
#:   keys in one global order and cannot deadlock), skipping slots the ledger already holds
#:   a claimed run of (its claim may be pruned by now), and keys someone else holds (the
#:   primary key decides).
#: * ``mine``: keys not inserted but claimed with the run id we propose, i.e. our own
#:   earlier attempt whose reply was lost; they count as won.
#: * ``placeholders``: each winner's run row, ``running`` without ``fired_at``, committed
#:   with its claim, so the slot is visibly in flight before its handler starts.
#: * ``doomed``/``pruned``: the winners' schedules' claims older than ``prune_before``. Rows
#:   another claimer is deleting right now are skipped, never waited for.
#:
#: Lookups are written as correlated subqueries and LATERAL joins so that each is an
#: index probe whatever the planner thinks of the tables' sizes: the cost of a claim grows
#: with the batch, never with the ledger or the claims table.
#: * the final SELECT: the keys won, and per schedule of the slots won one run in flight
#:   on another instance (started, or placed for an earlier slot than ours), if any.
CLAIM = """
    WITH wanted AS (
        SELECT * FROM json_to_recordset(%(claims)s::json) AS w(
            key text, name text, run_id text, slot timestamptz, trigger text, outcome text,
            prune_before timestamptz)
    ),
    inserted AS (
        INSERT INTO schedtui_claims (key, name, instance, claimed_at, run_id)
        SELECT w.key, w.name, %(instance)s, %(at)s, w.run_id FROM wanted w
        WHERE (
            SELECT 1 FROM schedtui_runs r
            WHERE r.name = w.name AND r.scheduled_at = w.slot AND r.trigger <> 'manual'
                AND r.outcome IN ('wonLock', 'external')
            LIMIT 1
        ) IS NULL
        ORDER BY w.key
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    ),
    mine AS (
        SELECT w.key FROM wanted w
        WHERE NOT EXISTS (SELECT 1 FROM inserted i WHERE i.key = w.key)
            AND w.run_id = (SELECT c.run_id FROM schedtui_claims c WHERE c.key = w.key)
    ),
    placeholders AS (
        INSERT INTO schedtui_runs (id, name, scheduled_at, status, trigger, outcome, instance)
        SELECT w.run_id, w.name, w.slot, 'running', w.trigger, w.outcome, %(instance)s
        FROM wanted w JOIN inserted i ON i.key = w.key
        WHERE w.slot IS NOT NULL
        ON CONFLICT (id) DO NOTHING
    ),
    doomed AS (
        SELECT d.ctid FROM (
            SELECT w.name, max(w.prune_before) AS before
            FROM wanted w JOIN inserted i ON i.key = w.key
            WHERE w.prune_before IS NOT NULL
            GROUP BY w.name
        ) h
        CROSS JOIN LATERAL (
            SELECT c.ctid FROM schedtui_claims c
            WHERE c.name = h.name AND c.claimed_at < h.before
            FOR UPDATE SKIP LOCKED
        ) d
    ),
    pruned AS (
        DELETE FROM schedtui_claims WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
    )
    SELECT 'won', key FROM inserted
    UNION ALL
    SELECT 'won', key FROM mine
    UNION ALL
    SELECT 'busy:' || f.name, b.id
    FROM (
        SELECT w.name, min(w.slot) AS first FROM wanted w
        WHERE w.key IN (SELECT key FROM inserted UNION ALL SELECT key FROM mine)
        GROUP BY w.name
    ) f
    CROSS JOIN LATERAL (
        SELECT r.id FROM schedtui_runs r
        WHERE r.name = f.name AND r.status = 'running' AND r.instance <> %(instance)s
            AND (r.fired_at IS NOT NULL OR r.scheduled_at < f.first)
        ORDER BY r.id LIMIT 1
    ) b
"""
CLAIMED_RUN = "SELECT run_id FROM schedtui_claims WHERE key = %s"
PRUNE_OWN_CLAIMS = "DELETE FROM schedtui_claims WHERE name = %s AND claimed_at < %s"
#: Hourly, over a table the winners keep small: no index on claimed_at to maintain on
#: every claim for it.
SWEEP_CLAIMS = "DELETE FROM schedtui_claims WHERE claimed_at < %s"
COUNT_CLAIMS = "SELECT count(*) FROM schedtui_claims"

#: Per-connection settings: a statement that runs away (a lock never released, a server
#: stuck) is stopped rather than left to hold a pool connection forever.
CONFIGURE = "SET statement_timeout = '30s'; SET idle_in_transaction_session_timeout = '60s'"

# ---------------------------------------------------------------------------------------

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
#: Writer: most rows per statement, and the pause between failed attempts (grows to the max).
_WRITE_CHUNK = 5_000
_RETRY_MIN, _RETRY_MAX = 0.25, 2.0


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


def _run(row: Sequence[Any]) -> Run:
    return run_from_row(row, _utc)


def _backfill(row: Sequence[Any]) -> BackfillProgress:
    return backfill_from_row(row, _utc)


class _Iso:
    """ISO 8601 text of datetimes for JSON payloads, memoised: a batch repeats a few slots."""

    def __init__(self) -> None:
        self.seen: dict[datetime, str] = {}

    def __call__(self, dt: datetime | None) -> str | None:
        if dt is None:
            return None
        text = self.seen.get(dt)
        if text is None:
            text = self.seen[dt] = dt.isoformat()
        return text


def _text(value: str | None) -> str | None:
    """Text PostgreSQL accepts: no NUL character, no lone surrogate (a handler's message may
    carry either)."""
    if value is None or value.isascii() and "\x00" not in value:
        return value
    return value.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def _runs_json(runs: Sequence[Run]) -> str:
    """The batch as the JSON document UPSERT_RUNS reads."""
    iso = _Iso()
    return json.dumps(
        [
            {
                "id": r.id,
                "name": r.name,
                "scheduled_at": iso(r.scheduled_at),
                "fired_at": iso(r.fired_at),
                "finished_at": iso(r.finished_at),
                "status": r.status,
                "trigger": r.trigger,
                "outcome": r.coordination_outcome,
                "instance": r.instance,
                "traceback": _text(r.traceback),
                "error_tag": _text(r.error_tag),
                "error_message": _text(r.error_message),
            }
            for r in runs
        ],
        separators=(",", ":"),
    )


def _claims_json(claims: Sequence[Claim]) -> str:
    iso = _Iso()
    return json.dumps(
        [
            {
                "key": c.key,
                "name": c.name,
                "run_id": c.run_id,
                "slot": iso(c.scheduled_at),
                "trigger": c.trigger,
                "outcome": c.outcome,
                "prune_before": iso(c.prune_before),
            }
            for c in claims
        ],
        separators=(",", ":"),
    )


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _connection_lost(exc: psycopg.Error) -> bool:
    """True when the error says the connection (not the statement) failed: worth one retry."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class PostgresStore(PostgresJobs, PostgresCatalog, PostgresDurable, PostgresLocks, PostgresCluster, PostgresAudit, PostgresEvents):
    """The fleet store. ``PostgresStore("postgresql://user:pass@host:5432/db")``.

    Tables are created in the first schema of the connection's ``search_path`` (add
    ``?options=-csearch_path%3Dsomewhere`` to the URL to choose another); the user needs
    the right to create tables there at the first start.
    """

    kind = "postgresql"
    default_coordination: CoordinationMode = "advisoryLock"

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact_url(url)
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise BadInput(f'bad store URL "{self.where}": {_one_line(exc)}') from None
        for key, value in _CONNINFO_DEFAULTS.items():
            params.setdefault(key, value)
        self._conninfo = make_conninfo("", **params)
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

    # -- opening and closing ---------------------------------------------------------------
    async def open(self) -> None:
        if self._pool is not None:
            return
        # One plain connection first: its error says exactly what is wrong (refused, unknown
        # host, bad password), and it creates or migrates the schema.
        try:
            conn = await AsyncConnection.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise Unavailable(f'cannot reach the store "{self.where}": {_one_line(exc)}') from None
        try:
            await self._migrate(conn)
        except psycopg.Error as exc:
            raise Unavailable(f'cannot set up the store "{self.where}": {_one_line(exc)}') from None
        finally:
            await conn.close()
        pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
            self._conninfo,
            kwargs={"autocommit": True},
            min_size=2,
            max_size=8,
            open=False,
            name="schedtui",
            timeout=_POOL_WAIT,
            # Give up on a reconnection attempt quickly: the next request that finds the
            # pool short starts a new one at once, instead of after a growing backoff.
            reconnect_timeout=2.0,
            reconnect_failed=lambda pool: None,
            configure=self._configure,
        )
        try:
            await pool.open(wait=True, timeout=float(_CONNINFO_DEFAULTS["connect_timeout"]) + 2)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close(timeout=1)
            raise Unavailable(f'cannot reach the store "{self.where}": {self._why(exc)}') from None
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._writer = asyncio.ensure_future(self._write_loop())
        self._writer.set_name("schedtui postgres writer")

    @staticmethod
    async def _configure(conn: AsyncConnection[Any]) -> None:
        for statement in CONFIGURE.split(";"):
            await conn.execute(statement)

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await conn.execute(MIGRATE_LOCK, (LOCK_CLASS, LOCK_MIGRATE))
            await conn.execute(CREATE_VERSION_TABLE)
            row = await (await conn.execute(GET_VERSION)).fetchone()
            version = int(row[0]) if row else 0
            if version > len(MIGRATIONS):
                raise Unavailable(
                    f"the store's schema is version {version}, newer than this schedtui knows "
                    f"({len(MIGRATIONS)}); upgrade schedtui before opening it"
                )
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        await conn.execute(statement)
                log.info("store schema migrated to version %d", number)
            if row is None:
                await conn.execute(INSERT_VERSION, (len(MIGRATIONS),))
            elif version != len(MIGRATIONS):
                await conn.execute(UPDATE_VERSION, (len(MIGRATIONS),))
            await migrate_postgres(conn, components_of(type(self)))
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
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close(timeout=5)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(Unavailable(f'the store "{self.where}" was closed'))
        self._waiters = []

    # -- plumbing -------------------------------------------------------------------------
    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, PoolTimeout):
            return "no connection to the server (it is down or unreachable)"
        return _one_line(exc)

    def _unavailable(self, exc: BaseException) -> Unavailable:
        return Unavailable(f'the store "{self.where}" is unavailable: {self._why(exc)}')

    def _trouble(self, exc: BaseException) -> Unavailable:
        """Remember connection trouble for :meth:`health`; the error to raise."""
        since = self._conn_trouble[1] if self._conn_trouble else datetime.now(timezone.utc)
        self._conn_trouble = (self._why(exc), since)
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
            raise Unavailable(f'the store "{self.where}" is not open')
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
                return result
            except PoolTimeout as exc:
                raise self._trouble(exc) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if attempt == 2 or not _connection_lost(exc):
                    raise self._trouble(exc) from None
                log.info("store connection lost (%s); retrying on a fresh one", _one_line(exc))
                try:
                    await pool.check()  # drop every idle connection that died with it
                except Exception:  # the check itself failing is the next attempt's problem
                    pass
        raise AssertionError("unreachable")

    async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(sql, params)).fetchall()

        return await self._with_conn(go)

    async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        async def go(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(sql, params)).fetchone()

        return await self._with_conn(go)

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One write statement (its own transaction); returns the affected row count."""

        async def go(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(sql, params)).rowcount

        count = await self._with_conn(go)
        self.commits += 1
        return count

    # -- runs: the group-commit writer -----------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or self._writer is None:
            raise Unavailable(f'the store "{self.where}" is not open')
        with self._lock:
            self._incoming.extend(runs)
            self._handed += 1
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    async def flush(self) -> None:
        if self._writer is None or self._wake is None or self._loop is None:
            raise Unavailable(f'the store "{self.where}" is not open')
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
                    exc = Unavailable(f'the store "{self.where}" could not write runs: {_one_line(exc)}')
                self._write_failures += 1
                since = self._write_trouble[1] if self._write_trouble else datetime.now(timezone.utc)
                self._write_trouble = (str(self._conn_trouble[0] if self._conn_trouble else exc), since)
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
        async with conn.transaction():
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
                await self._with_conn(lambda conn: self._upsert(conn, [run]))
            except psycopg.Error as exc:
                log.error("run %s of %s cannot be written to the ledger: %s", run.id, run.name, _one_line(exc))
            del pending[run.id]

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
        return {name: slot.astimezone(timezone.utc) for name, slot in rows if slot is not None}

    async def running_runs(self) -> list[Run]:
        return [_run(row) for row in await self._fetchall(RUNNING_RUNS)]

    async def close_run(self, run: Run) -> bool:
        await self.flush()  # the order of hand-in: a version handed in earlier lands first
        params = (run.status, run.finished_at, run.error_tag, run.error_message, run.id)
        return await self._execute(CLOSE_RUN, params) == 1

    async def prune_runs(self, created_before: datetime) -> int:
        await self.flush()
        floor = id_floor(created_before)

        async def prune(conn: AsyncConnection[Any]) -> int:
            async with conn.transaction():
                await conn.execute(PRUNE_BACKFILLS, (created_before,))
                return (await conn.execute(PRUNE_RUNS, (floor,))).rowcount

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
        await self._execute(SET_STATE, (state.name, state.enabled, state.changed_by, state.changed_at, state.note))

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(self, instance: str, host: str, pid: int, at: datetime) -> None:
        await self._execute(HEARTBEAT, (instance, host, pid, at))

    async def instances(self) -> dict[str, tuple[str, int, datetime]]:
        rows = await self._fetchall(INSTANCES)
        return {row[0]: (row[1], row[2], _utc(row[3])) for row in rows}  # type: ignore[misc]

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._fetchall(INSTANCE_LIST)
        return [InstanceInfo(row[0], row[1], row[2], _utc(row[3]), _utc(row[4])) for row in rows]  # type: ignore[arg-type]

    async def forget_instance(self, instance: str) -> None:
        await self._execute(FORGET_INSTANCE, (instance,))

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        await self._execute(MARK_STARTING, (slot, instance))

    async def starting_marks(self) -> dict[str, datetime]:
        return {row[0]: _utc(row[1]) for row in await self._fetchall(STARTING_MARKS)}  # type: ignore[misc]

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        async def read(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
            async with conn.transaction():  # one commit for the three, not three
                return await self._read_unfinished(conn)

        return await self._with_conn(read)

    async def heartbeat_and_unfinished(self, instance: str, host: str, pid: int, at: datetime) -> Unfinished:
        async def beat(conn: AsyncConnection[Any]) -> Unfinished:
            async with conn.transaction():  # a member's round: one commit, not two
                await conn.execute(HEARTBEAT, (instance, host, pid, at))
                runs, backfills, marks = await self._read_unfinished(conn)
                beats = await (await conn.execute(INSTANCES)).fetchall()
            return Unfinished(runs, backfills, marks, {r[0]: (r[1], r[2], _utc(r[3])) for r in beats})  # type: ignore[misc]

        return await self._with_conn(beat)

    @staticmethod
    async def _read_unfinished(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        runs = await (await conn.execute(RUNNING_RUNS)).fetchall()
        backfills = await (await conn.execute(RUNNING_BACKFILLS)).fetchall()
        marks = await (await conn.execute(STARTING_MARKS)).fetchall()
        return [_run(r) for r in runs], [_backfill(r) for r in backfills], {r[0]: r[1].astimezone(timezone.utc) for r in marks}

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

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._fetchone(GET_BACKFILL, (backfill_id,))
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        return [_backfill(row) for row in await self._fetchall(RUNNING_BACKFILLS)]

