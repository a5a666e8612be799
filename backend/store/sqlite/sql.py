"""What the embedded store says to SQLite: its schema, every statement, and the
conversions between rows and the model (times are integer microseconds since the epoch)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from backend.model import BackfillProgress, Run
from backend.safetext import store_text
from backend.store.rows import BACKFILL_FIELDS, RUN_FIELDS, RUN_WRITE_FIELDS, backfill_from_row, in_flight_from_row, run_from_row

#: Each entry moves the schema up one version; applied in order inside BEGIN IMMEDIATE.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id            TEXT PRIMARY KEY,
        name          TEXT NOT NULL,
        scheduled_at  INTEGER NOT NULL,
        fired_at      INTEGER,
        finished_at   INTEGER,
        status        TEXT NOT NULL,
        trigger       TEXT NOT NULL,
        outcome       TEXT NOT NULL,
        instance      TEXT NOT NULL,
        error_tag     TEXT,
        error_message TEXT
    ) WITHOUT ROWID;
    CREATE INDEX runs_by_name ON runs (name, id);
    CREATE INDEX runs_by_slot ON runs (name, scheduled_at) WHERE trigger <> 'manual';
    CREATE INDEX runs_running ON runs (status) WHERE status = 'running';
    CREATE TABLE schedule_state (
        name       TEXT PRIMARY KEY,
        enabled    INTEGER NOT NULL,
        changed_by TEXT NOT NULL,
        changed_at INTEGER NOT NULL,
        note       TEXT
    );
    CREATE TABLE instances (
        instance     TEXT PRIMARY KEY,
        host         TEXT NOT NULL,
        pid          INTEGER NOT NULL,
        heartbeat_at INTEGER NOT NULL
    );
    CREATE TABLE backfills (
        id           TEXT PRIMARY KEY,
        name         TEXT NOT NULL,
        range_start  INTEGER NOT NULL,
        range_end    INTEGER NOT NULL,
        total        INTEGER NOT NULL,
        fired        INTEGER NOT NULL,
        failed       INTEGER NOT NULL,
        state        TEXT NOT NULL,
        instance     TEXT NOT NULL,
        started_at   INTEGER NOT NULL,
        finished_at  INTEGER,
        current_slot INTEGER
    );
    CREATE UNIQUE INDEX backfills_one_running ON backfills (name) WHERE state = 'running';
    CREATE TABLE claims (
        key        TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        instance   TEXT NOT NULL,
        claimed_at INTEGER NOT NULL,
        run_id     TEXT NOT NULL
    );
    CREATE INDEX claims_by_name ON claims (name, claimed_at);
    CREATE INDEX claims_by_age ON claims (claimed_at);
    """,
    """
    ALTER TABLE instances ADD COLUMN last_fired_at INTEGER;
    """,
    """
    ALTER TABLE instances ADD COLUMN starting_at INTEGER;
    """,
    # Runs are read in scheduled order (a backfill's old slots land among their peers).
    """
    DROP INDEX runs_by_name;
    CREATE INDEX runs_by_name_slot ON runs (name, scheduled_at, id);
    """,
    """
    ALTER TABLE runs ADD COLUMN traceback TEXT;
    """,
    # What each instance is to the fleet (firing, waiting, observer) and its mode.
    """
    ALTER TABLE instances ADD COLUMN role TEXT;
    ALTER TABLE instances ADD COLUMN coordination TEXT;
    """,
    # Each instance's clock against the server's (never measured on SQLite: one machine's
    # file; the columns keep the two stores' rows alike).
    """
    ALTER TABLE instances ADD COLUMN clock_offset REAL;
    ALTER TABLE instances ADD COLUMN clock_off INTEGER;
    """,
    # Each instance's take-over window (the PostgreSQL store's: the others judge it by it).
    """
    ALTER TABLE instances ADD COLUMN abandon_after REAL;
    """,
    # A closed run whose handler runs on keeps its schedule's overlap place (Run.held).
    """
    ALTER TABLE runs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_held ON runs (held) WHERE held = 1;
    """,
)

RUN_COLUMNS = ", ".join(RUN_FIELDS)
RUN_WRITE_COLUMNS = ", ".join(RUN_WRITE_FIELDS)
_KEEP_CLOSED = ",\n        ".join(
    f"{c} = CASE WHEN runs.status = 'running' THEN excluded.{c} ELSE runs.{c} END"
    for c in RUN_WRITE_FIELDS[1:]
    if c != "error_message"
)
#: What a finished run's row gains when another version of it arrives late (an instance
#: frozen past the abandon window, whose run was closed meanwhile): one sentence appended
#: to its error message. The row itself stays as it was closed.
LATE_NOTE = """
    'late result from instance ' || excluded.instance
    || coalesce(' at ' || strftime('%Y-%m-%dT%H:%M:%SZ', excluded.finished_at / 1000000, 'unixepoch'), '')
    || ': ' || excluded.status
    || coalesce(' [' || excluded.error_tag || ']', '')
    || coalesce(' ' || substr(excluded.error_message, 1, 200), '')
"""
#: The same finished version as the row's (but perhaps for ``held``).
_SAME_CLOSE = """(excluded.status = runs.status AND excluded.error_tag IS runs.error_tag
        AND excluded.finished_at IS runs.finished_at)"""
#: A run's row is replaced while it is ``running``; once closed it stays closed: a later,
#: different outcome only adds LATE_NOTE (once), and a late ``running`` version changes
#: nothing. Writing the same finished version again changes nothing either, but for
#: letting go of the overlap place it held (``held``: see the PostgreSQL store's).
UPSERT_RUN = f"""
    INSERT INTO runs ({RUN_WRITE_COLUMNS}, held) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET
        {_KEEP_CLOSED},
        error_message = CASE WHEN runs.status = 'running' THEN excluded.error_message
            WHEN {_SAME_CLOSE} THEN runs.error_message
            ELSE coalesce(runs.error_message || '; ', '') || {LATE_NOTE} END,
        held = CASE WHEN runs.status = 'running' THEN excluded.held ELSE runs.held AND excluded.held END
    WHERE runs.status = 'running' OR (
        excluded.status <> 'running'
        AND NOT {_SAME_CLOSE}
        AND instr(coalesce(runs.error_message, ''), {LATE_NOTE}) = 0
    ) OR (runs.held = 1 AND excluded.held = 0 AND {_SAME_CLOSE})
"""
#: (A placeholder closed while holding its turn lets go of it.)
CLOSE_RUN = """
    UPDATE runs SET status = ?, finished_at = ?, error_tag = ?, error_message = ?, held = 0
    WHERE id = ? AND status = 'running'
"""
GET_RUN = f"SELECT {RUN_WRITE_COLUMNS} FROM runs WHERE id = ?"
LIST_RUNS = f"SELECT {RUN_COLUMNS} FROM runs WHERE name = ? ORDER BY scheduled_at DESC, id DESC LIMIT ?"
LIST_RUNS_BEFORE = f"""
    SELECT {RUN_COLUMNS} FROM runs
    WHERE name = ?1 AND (scheduled_at, id) < (SELECT scheduled_at, id FROM runs WHERE id = ?2)
    ORDER BY scheduled_at DESC, id DESC LIMIT ?3
"""
#: The newest self/external slot's run per name (the partial index runs_by_slot), or with
#: LATEST_RUNS the newest run of any trigger.
LAST_RUNS = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE id IN (
        SELECT (SELECT id FROM runs WHERE name = n.value AND trigger <> 'manual'
                ORDER BY scheduled_at DESC, id DESC LIMIT 1)
        FROM json_each(?) AS n
    )
"""
LATEST_RUNS = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE id IN (
        SELECT (SELECT id FROM runs WHERE name = n.value ORDER BY scheduled_at DESC, id DESC LIMIT 1)
        FROM json_each(?) AS n
    )
"""
RUNS_BETWEEN = f"""
    SELECT {RUN_COLUMNS} FROM runs WHERE name = ? AND scheduled_at >= ? AND scheduled_at < ?
    ORDER BY scheduled_at DESC, id DESC LIMIT ?
"""
LAST_SLOT = "SELECT max(scheduled_at) FROM runs WHERE name = ? AND trigger <> 'manual' AND scheduled_at <= ?"
#: Runs in flight: ``running``, or closed while their handler runs on (``held``, last).
RUNNING_RUNS = f"SELECT {RUN_COLUMNS}, held FROM runs WHERE status = 'running' OR held = 1"
#: Runs created before the floor, but never one in flight, nor the run of each schedule's
#: newest timed slot (whatever its age): the catch-up counts from that slot (LAST_SLOT), so
#: a schedule rarer than the retention would otherwise forget it ever ran. Only of a
#: schedule that is: stored, defined in some instance's code (the fleet's timings), or
#: named by the sweep (``?``, a JSON list: the sweeper's own); a deleted one's was kept
#: for good, one row per name ever created at run time. The oldest of them, at most ``?``
#: (a sweep is many short transactions: see ``prune_runs``).
PRUNE_RUNS = """
    DELETE FROM runs WHERE id IN (
        SELECT o.id FROM runs o WHERE o.id < ? AND o.status <> 'running' AND o.held = 0
            AND (o.id IS NOT (  -- (null-safe: a schedule with no timed run)
                    SELECT n.id FROM runs n WHERE n.name = o.name AND n.trigger <> 'manual' AND n.scheduled_at IS NOT NULL
                    ORDER BY n.scheduled_at DESC, n.id DESC LIMIT 1)
                OR (o.name NOT IN (SELECT name FROM stored_schedules)
                    AND o.name NOT IN (SELECT name FROM code_schedule_timings)
                    AND o.name NOT IN (SELECT value FROM json_each(?))))
        ORDER BY o.id LIMIT ?)
    RETURNING id
"""
GET_STATES = "SELECT name, enabled, changed_by, changed_at, note FROM schedule_state"
SET_STATE = """
    INSERT INTO schedule_state (name, enabled, changed_by, changed_at, note) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at, note = excluded.note
"""
#: When a name's holder was last heard from, by the store server's clock (the PostgreSQL
#: store's HEARD_AT): its stamp less the offset of its clock it recorded, if any.
HEARD_AT = "(instances.heartbeat_at - CAST(coalesce(instances.clock_offset, 0) * 1000000 AS INTEGER))"
HEARTBEAT = f"""
    INSERT INTO instances (instance, host, pid, heartbeat_at, role, coordination, clock_offset, clock_off, abandon_after)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?10)
    ON CONFLICT (instance) DO UPDATE SET host = excluded.host, pid = excluded.pid,
        heartbeat_at = excluded.heartbeat_at, role = excluded.role, coordination = excluded.coordination,
        clock_offset = excluded.clock_offset, clock_off = excluded.clock_off, abandon_after = excluded.abandon_after
    WHERE (instances.host = excluded.host AND instances.pid = excluded.pid) OR ?9 IS NULL
        OR {HEARD_AT} <= min(?9, ?4 - CAST(coalesce(instances.abandon_after, 0) * 1000000 AS INTEGER))
"""
#: Who holds an instance's name (a heartbeat that did not write: see Membership.taken_before),
#: and when it was last heard from (see HEARD_AT).
NAME_HOLDER = f"SELECT host, pid, {HEARD_AT}, abandon_after FROM instances WHERE instance = ?"
#: A dead process's row, deleted only while it is still that process's.
FORGET_HOLDER = "DELETE FROM instances WHERE instance = ? AND host = ? AND pid = ?"
#: A lost instance's row, forgotten by an operator (see the PostgreSQL store's).
FORGET_LOST = FORGET_HOLDER + " AND heartbeat_at = ? AND starting_at IS NULL"
#: A live firing member of another mode (see the PostgreSQL store's HEARTBEAT).
OTHER_MODE_FIRING = """
    SELECT 1 FROM instances WHERE instance <> ?1 AND role = 'firing' AND coordination <> ?2
        AND heartbeat_at > min(?3, ?4 - CAST(coalesce(abandon_after, 0) * 1000000 AS INTEGER)) LIMIT 1
"""
INSTANCES = "SELECT instance, host, pid, heartbeat_at, abandon_after FROM instances"
INSTANCE_LIST = (
    "SELECT instance, host, pid, heartbeat_at, last_fired_at, role, coordination, clock_offset, clock_off "
    "FROM instances ORDER BY instance"
)
#: Kept by the group commit, in its transaction: when this instance last started a run.
NOTE_LAST_FIRED = "UPDATE instances SET last_fired_at = max(coalesce(last_fired_at, 0), ?) WHERE instance = ?"
FORGET_INSTANCE = "DELETE FROM instances WHERE instance = ?"
MARK_STARTING = "UPDATE instances SET starting_at = ? WHERE instance = ?"
STARTING_MARKS = "SELECT instance, starting_at FROM instances WHERE starting_at IS NOT NULL"
CLEAR_STARTING = "UPDATE instances SET starting_at = NULL WHERE instance = ? AND starting_at = ?"
SLOT_RECORDED = "SELECT 1 FROM runs WHERE name = ? AND scheduled_at = ? AND trigger <> 'manual' LIMIT 1"
BACKFILL_COLUMNS = ", ".join(BACKFILL_FIELDS)
INSERT_BACKFILL = f"INSERT INTO backfills ({BACKFILL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
UPDATE_BACKFILL = """
    UPDATE backfills SET fired = ?, failed = ?, state = ?, finished_at = ?, current_slot = ?
    WHERE id = ?
"""
# Only while it runs: of the instances closing a dead one's backfill, one wins.
END_BACKFILL = UPDATE_BACKFILL.rstrip() + " AND state = 'running'"
GET_BACKFILL = f"SELECT {BACKFILL_COLUMNS} FROM backfills WHERE id = ?"
RUNNING_BACKFILLS = f"SELECT {BACKFILL_COLUMNS} FROM backfills WHERE state = 'running'"
PRUNE_BACKFILLS = "DELETE FROM backfills WHERE state <> 'running' AND started_at < ?"
CLAIM = "INSERT INTO claims (key, name, instance, claimed_at, run_id) VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING"
CLAIMED_RUN = "SELECT run_id FROM claims WHERE key = ?"
RELEASE_PLACEHOLDER = """
    DELETE FROM runs WHERE id = ? AND status = 'running' AND fired_at IS NULL
        AND EXISTS (SELECT 1 FROM claims WHERE key = ? AND run_id = ?)
"""
RELEASE_CLAIM = "DELETE FROM claims WHERE key = ? AND run_id = ?"
#: Whether a slot has run already (its claim pruned since): by a claim; and, for an
#: external fire (``?`` true), by any coordination (a deploy from ``trigger="self"`` to
#: ``external``: the slot the timer fired under ``single`` or ``cluster`` was fired again).
SLOT_TAKEN = """
    SELECT 1 FROM runs WHERE name = ? AND scheduled_at = ? AND trigger <> 'manual'
        AND (outcome IN ('wonLock', 'external') OR ?) LIMIT 1
"""
INSERT_PLACEHOLDER = """
    INSERT INTO runs (id, name, scheduled_at, status, trigger, outcome, instance)
    VALUES (?, ?, ?, 'running', ?, ?, ?) ON CONFLICT (id) DO NOTHING
"""
#: A run of a schedule in flight on another instance: started, holding its turn (held),
#: or claimed for an earlier slot than the one given (queued there, or about to start).
BUSY_ELSEWHERE = """
    SELECT id FROM runs WHERE (status = 'running' OR held = 1) AND name = ? AND instance <> ?
        AND (fired_at IS NOT NULL OR held = 1 OR scheduled_at < ?)
    ORDER BY id LIMIT 1
"""
#: Every run in flight on other instances (see Store.busy_elsewhere): through the indexes
#: of running and of held rows (an OR would walk each schedule's whole ledger).
IN_FLIGHT_ELSEWHERE = """
    SELECT name, id, scheduled_at, fired_at, held FROM runs WHERE status = 'running' AND instance <> ?
    UNION ALL
    SELECT name, id, scheduled_at, fired_at, held FROM runs WHERE held = 1 AND status <> 'running' AND instance <> ?
"""
#: A placeholder takes its schedule's turn (see Store.take_turn).
TAKE_TURN = "UPDATE runs SET held = 1 WHERE id = ? AND status = 'running'"
PRUNE_OWN_CLAIMS = "DELETE FROM claims WHERE name = ? AND claimed_at < ?"
SWEEP_CLAIMS = "DELETE FROM claims WHERE claimed_at < ?"
COUNT_CLAIMS = "SELECT count(*) FROM claims"

# ---------------------------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _us(dt: datetime | None) -> int | None:
    """Microseconds since the epoch, exactly (floats would round)."""
    return None if dt is None else (dt - _EPOCH) // _MICROSECOND


def _dt(us: int | None) -> datetime | None:
    # timedelta * int is exact, and twice as fast as timedelta(microseconds=us).
    return None if us is None else _EPOCH + _MICROSECOND * us


def _run_params(run: Run) -> tuple[Any, ...]:
    """A run's row. Its error and traceback are a handler's text: written as the PostgreSQL
    store writes them (a lone surrogate SQLite cannot encode would lose the run, and it
    would be closed later as abandoned)."""
    return (
        run.id,
        run.name,
        _us(run.scheduled_at),
        _us(run.fired_at),
        _us(run.finished_at),
        run.status,
        run.trigger,
        run.coordination_outcome,
        run.instance,
        store_text(run.error_tag),
        store_text(run.error_message),
        store_text(run.traceback),
        int(run.held),
    )


def _run(row: tuple[Any, ...]) -> Run:
    return run_from_row(row, _dt)


def _in_flight(row: tuple[Any, ...]) -> Run:
    return in_flight_from_row(row, _dt)


def _backfill(row: tuple[Any, ...]) -> BackfillProgress:
    return backfill_from_row(row, _dt)
