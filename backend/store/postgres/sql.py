"""What the fleet store says to PostgreSQL about runs, states, instances, claims and
backfills: its schema, every statement, and the conversions between rows and the model
(the other systems' statements are in their own modules: ``postgres_jobs``, ...)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from backend.model import BackfillProgress, Claim, Run
from backend.safetext import store_text as _text
from backend.store.rows import BACKFILL_FIELDS, RUN_FIELDS, RUN_WRITE_FIELDS, backfill_from_row, in_flight_from_row, run_from_row

#: Advisory lock taken (transaction-scoped) around schema creation and migration, so N
#: instances starting at once migrate one after the other. Two-key form: (class, object).
LOCK_CLASS = 0x5C4ED  # "schedtui"
LOCK_MIGRATE = 1
#: Taken around a member's heartbeat: two members of different coordination modes that
#: beat at once see each other, and the second waits (see HEARTBEAT).
LOCK_FLEET = 2

MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(%s, %s)"
CREATE_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schedtui_schema_version (version integer NOT NULL)"
GET_VERSION = "SELECT version FROM schedtui_schema_version"
INSERT_VERSION = "INSERT INTO schedtui_schema_version (version) VALUES (%s)"
UPDATE_VERSION = "UPDATE schedtui_schema_version SET version = %s"
#: Whether the version table is there (along the search_path, where the statements look).
HAS_VERSION_TABLE = "SELECT to_regclass('schedtui_schema_version') IS NOT NULL"
#: Who failed to migrate, and where: the role, and the schema tables would be created in.
WHO_MIGRATES = "SELECT current_user, current_schema()"

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
    # What each instance is to the fleet (firing, waiting, observer) and its mode.
    """
    ALTER TABLE schedtui_instances ADD COLUMN role text;
    ALTER TABLE schedtui_instances ADD COLUMN coordination text;
    """,
    # Each instance's clock against the server's, and whether it stands down for it.
    """
    ALTER TABLE schedtui_instances ADD COLUMN clock_offset double precision;
    ALTER TABLE schedtui_instances ADD COLUMN clock_off boolean;
    """,
    # Each instance's take-over window: the others judge its silence by it.
    """
    ALTER TABLE schedtui_instances ADD COLUMN abandon_after double precision;
    """,
    # A closed run whose handler runs on keeps its schedule's overlap place (Run.held): the
    # fleet's overlap checks count it in flight, as a running one.
    """
    ALTER TABLE schedtui_runs ADD COLUMN held boolean NOT NULL DEFAULT false;
    DROP INDEX schedtui_runs_running;
    CREATE INDEX schedtui_runs_in_flight ON schedtui_runs (name) WHERE status = 'running' OR held;
    """,
    # The in-flight check walks its schedule's entries in id order and stops at the first
    # (see BUSY_ELSEWHERE): a plain index scan, which marks the entries of closed runs dead
    # as it passes them, where a bitmap scan fetched each of them from the table again at
    # every claim until a vacuum came (a claim's check grew with the ledger).
    """
    DROP INDEX schedtui_runs_in_flight;
    CREATE INDEX schedtui_runs_in_flight ON schedtui_runs (name, id) WHERE status = 'running' OR held;
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
#: The same finished version as the row's (but perhaps for ``held``).
_SAME_CLOSE = """(excluded.status = schedtui_runs.status
        AND excluded.error_tag IS NOT DISTINCT FROM schedtui_runs.error_tag
        AND excluded.finished_at IS NOT DISTINCT FROM schedtui_runs.finished_at)"""
#: One statement for a whole group commit. The batch travels as one JSON document (one
#: parameter: cheap to build in Python, where a parameter per column would be adapted
#: element by element on the event loop). A row is replaced while it is ``running``; once
#: closed it stays closed: a later, different outcome only adds LATE_NOTE (once), and a
#: late ``running`` version or the same finished version again changes nothing, but for
#: letting go of the overlap place it held (``held``, never taken again once let go).
UPSERT_RUNS = f"""
    INSERT INTO schedtui_runs ({RUN_WRITE_COLUMNS}, held)
    SELECT {RUN_WRITE_COLUMNS}, held FROM json_to_recordset(%s::json) AS r(
        id text, name text, scheduled_at timestamptz, fired_at timestamptz, finished_at timestamptz,
        status text, trigger text, outcome text, instance text, error_tag text, error_message text,
        traceback text, held boolean)
    ON CONFLICT (id) DO UPDATE SET
        {_KEEP_CLOSED},
        error_message = CASE WHEN schedtui_runs.status = 'running' THEN excluded.error_message
            WHEN {_SAME_CLOSE} THEN schedtui_runs.error_message
            ELSE coalesce(schedtui_runs.error_message || '; ', '') || {LATE_NOTE} END,
        held = CASE WHEN schedtui_runs.status = 'running' THEN excluded.held
            ELSE schedtui_runs.held AND excluded.held END
    WHERE schedtui_runs.status = 'running' OR (
        excluded.status <> 'running'
        AND NOT {_SAME_CLOSE}
        AND strpos(coalesce(schedtui_runs.error_message, ''), {LATE_NOTE}) = 0
    ) OR (schedtui_runs.held AND NOT excluded.held AND {_SAME_CLOSE})
"""
CLOSE_RUNS = """
    UPDATE schedtui_runs r
    SET status = c.status, finished_at = c.finished_at, error_tag = c.error_tag, error_message = c.error_message,
        held = false  -- (a placeholder closed while holding its turn lets go of it)
    FROM json_to_recordset(%s::json) AS c(id text, status text, finished_at timestamptz, error_tag text, error_message text)
    WHERE r.id = c.id AND r.status = 'running'
    RETURNING r.id
"""
#: The runs of a CLOSE_RUNS batch closed as the batch closes them (to the microsecond and
#: the word): what a sending of it before did, whose answer was lost (see
#: ``PostgresRuns.close_runs``).
CLOSED_AS = """
    SELECT r.id FROM schedtui_runs r
    JOIN json_to_recordset(%s::json) AS c(id text, status text, finished_at timestamptz, error_tag text, error_message text)
        ON r.id = c.id
    WHERE r.status = c.status AND r.finished_at = c.finished_at AND r.error_tag IS NOT DISTINCT FROM c.error_tag
        AND r.error_message IS NOT DISTINCT FROM c.error_message
"""
#: Which of these run ids the ledger holds.
RECORDED_IDS = "SELECT id FROM schedtui_runs WHERE id = ANY (%s::text[])"
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
    SELECT n.name, (SELECT max(r.scheduled_at) FROM schedtui_runs r WHERE r.name = n.name AND r.trigger <> 'manual'
                    AND r.scheduled_at <= %s)
    FROM unnest(%s::text[]) AS n(name)
"""
#: Runs in flight: ``running``, or closed while their handler runs on (``held``, last).
RUNNING_RUNS = f"SELECT {RUN_COLUMNS}, held FROM schedtui_runs WHERE status = 'running' OR held"
#: Runs created before the floor, but never one in flight, nor the run of each schedule's
#: newest timed slot (whatever its age): the catch-up counts from that slot (LAST_SLOT), so
#: a schedule rarer than the retention would otherwise forget it ever ran. Only of a
#: schedule that is: stored, defined in some instance's code (the fleet's timings), or
#: named by the sweep (``%s``: the sweeper's own); a deleted one's was kept for good,
#: one row per name ever created at run time. The oldest of them, at most ``%s`` (a sweep is many short transactions: see ``prune_runs``).
PRUNE_RUNS = """
    DELETE FROM schedtui_runs WHERE id IN (
        SELECT o.id FROM schedtui_runs o WHERE o.id < %s AND o.status <> 'running' AND NOT o.held
            AND (o.id IS DISTINCT FROM (
                    SELECT n.id FROM schedtui_runs n WHERE n.name = o.name AND n.trigger <> 'manual'
                        AND n.scheduled_at IS NOT NULL
                    ORDER BY n.scheduled_at DESC, n.id DESC LIMIT 1)
                OR (o.name NOT IN (SELECT name FROM schedtui_stored_schedules)
                    AND o.name NOT IN (SELECT name FROM schedtui_code_schedule_timings)
                    AND o.name <> ALL(%s::text[])))
        ORDER BY o.id LIMIT %s)
"""
GET_STATES = "SELECT name, enabled, changed_by, changed_at, note FROM schedtui_schedule_state"
SET_STATE = """
    INSERT INTO schedtui_schedule_state (name, enabled, changed_by, changed_at, note)
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at, note = excluded.note
"""
#: When a name's holder was last heard from, by the server's clock: its heartbeat's stamp,
#: less the offset of its clock it recorded (a process five minutes ahead that crashed kept
#: its name from the replacement started on a host with a right clock for five minutes
#: more than the window; one behind looked silent while it beat).
HEARD_AT = "(schedtui_instances.heartbeat_at - make_interval(secs => coalesce(schedtui_instances.clock_offset, 0)))"
#: Register or refresh an instance, deciding its role in the same statement: a member that
#: asks to fire waits instead while a live firing member of another mode beats (one fleet,
#: one coordination; live by the caller's window, or by its own if longer, as a name's
#: holder is). Members take FLEET_LOCK first, so two of different modes starting
#: at once see each other. A NULL mode (an older version, a bare heartbeat) is not gated
#: and does not gate.
HEARTBEAT = f"""
    INSERT INTO schedtui_instances (
        instance, host, pid, heartbeat_at, role, coordination, clock_offset, clock_off, abandon_after)
    VALUES (%(instance)s, %(host)s, %(pid)s, %(at)s,
        CASE WHEN %(role)s::text = 'firing' AND EXISTS (
            SELECT 1 FROM schedtui_instances o
            WHERE o.instance <> %(instance)s AND o.role = 'firing'
              AND o.coordination <> %(mode)s::text AND o.heartbeat_at > least(%(live_after)s::timestamptz,
                  %(at)s::timestamptz - make_interval(secs => coalesce(o.abandon_after, 0))))
        THEN 'waiting' ELSE %(role)s::text END,
        %(mode)s::text, %(clock_offset)s::double precision, %(clock_off)s::boolean, %(window)s::double precision)
    ON CONFLICT (instance) DO UPDATE SET host = excluded.host, pid = excluded.pid,
        heartbeat_at = excluded.heartbeat_at, role = excluded.role, coordination = excluded.coordination,
        clock_offset = excluded.clock_offset, clock_off = excluded.clock_off, abandon_after = excluded.abandon_after
    WHERE (schedtui_instances.host = excluded.host AND schedtui_instances.pid = excluded.pid)
        OR %(taken_before)s::timestamptz IS NULL OR {HEARD_AT} <= least(%(taken_before)s::timestamptz,
            %(at)s::timestamptz - make_interval(secs => coalesce(schedtui_instances.abandon_after, 0)))
    RETURNING role
"""
#: Who holds an instance's name (a heartbeat that did not write: see Membership.taken_before),
#: and when it was last heard from (see HEARD_AT).
NAME_HOLDER = f"SELECT host, pid, {HEARD_AT}, abandon_after FROM schedtui_instances WHERE instance = %s"
#: A dead process's row, deleted only while it is still that process's.
FORGET_HOLDER = "DELETE FROM schedtui_instances WHERE instance = %s AND host = %s AND pid = %s"
#: A lost instance's row, forgotten by an operator: only while it is the row they judged (the
#: same process, not beaten since) and no burst of it is left to record (its mark is on it).
FORGET_LOST = FORGET_HOLDER + " AND heartbeat_at = %s AND starting_at IS NULL"
FLEET_LOCK = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, {LOCK_FLEET})"
#: The server's clock at this moment (not the transaction's start): what every instance's
#: clock is compared with.
SERVER_CLOCK = "SELECT clock_timestamp()"
INSTANCES = "SELECT instance, host, pid, heartbeat_at, abandon_after FROM schedtui_instances"
INSTANCE_LIST = (
    "SELECT instance, host, pid, heartbeat_at, last_fired_at, role, coordination, clock_offset, clock_off "
    "FROM schedtui_instances "
    'ORDER BY instance COLLATE "C"'
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
# Only while it runs: of the instances closing a dead one's backfill, one wins.
END_BACKFILL = UPDATE_BACKFILL.rstrip() + " AND state = 'running'"
#: Whether a backfill is at what an END_BACKFILL set (every column it sets, the end's instant
#: to the microsecond): that end's own doing, when its answer was lost (see
#: ``PostgresRuns.end_backfill``). The parameters are END_BACKFILL's.
ENDED_AS = """
    SELECT 1 FROM schedtui_backfills WHERE fired = %s AND failed = %s AND state = %s
        AND finished_at IS NOT DISTINCT FROM %s AND current_slot IS NOT DISTINCT FROM %s AND id = %s
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
#: * ``doomed``/``pruned``: the winners' schedules' claims older than ``prune_before``, the
#:   oldest 100 of each (the rest go with the next claims). Rows another claimer is
#:   deleting right now are skipped, never waited for.
#:
#: Lookups are written as correlated subqueries and LATERAL joins so that each is an
#: index probe whatever the planner thinks of the tables' sizes: the cost of a claim grows
#: with the batch, never with the ledger or the claims table.
#: * the final SELECT: the keys won, and per schedule of the slots won one run in flight
#:   on another instance (started, or placed for an earlier slot than ours), if any.
#: Per schedule ``f.name`` won by a claim from its earliest slot ``f.first`` on, a run of
#: it in flight on another instance: started, holding its turn, or claimed for an earlier
#: slot (queued there, or about to start).
#: It walks the schedule's entries of the in-flight index, (name, id), in that order and
#: stops at the first that counts: a plain index scan, which marks the entries of closed
#: runs dead as it passes them (a bitmap scan of the index on name alone read each from
#: the table again at every claim until a vacuum came: 0.1 s more a burst of 1,000
#: schedules after four minutes), and no reason left to walk the primary key in id order
#: instead (which it did with that index, filtering every run of the ledger once per
#: schedule: 6.7 s for such a burst).
BUSY_ELSEWHERE = """
    SELECT r.id FROM schedtui_runs r
    WHERE r.name = f.name AND (r.status = 'running' OR r.held) AND r.instance <> %(instance)s
        AND (r.fired_at IS NOT NULL OR r.held OR r.scheduled_at < f.first)
    ORDER BY r.name, r.id LIMIT 1
"""
#: Of each schedule in ``names``, a run in flight on another instance that a run of its
#: slot in ``firsts`` must not start beside (see Store.busy_elsewhere).
BUSY_OF = f"""
    SELECT f.name, b.id FROM unnest(%(names)s::text[], %(firsts)s::text[]::timestamptz[]) AS f(name, first)
    CROSS JOIN LATERAL ({BUSY_ELSEWHERE}) b
"""
CLAIM = f"""
    WITH wanted AS (
        SELECT * FROM json_to_recordset(%(claims)s::json) AS w(
            key text, name text, run_id text, slot timestamptz, trigger text, outcome text,
            prune_before timestamptz, turn boolean)
    ),
    inserted AS (
        INSERT INTO schedtui_claims (key, name, instance, claimed_at, run_id)
        SELECT w.key, w.name, %(instance)s, %(at)s, w.run_id FROM wanted w
        WHERE (
            SELECT 1 FROM schedtui_runs r
            WHERE r.name = w.name AND r.scheduled_at = w.slot AND r.trigger <> 'manual'
                -- an external fire: a run by any coordination (a deploy from trigger self to
                -- external: the slot the timer fired under cluster or single fired again)
                AND (r.outcome IN ('wonLock', 'external') OR w.trigger = 'external')
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
    busy AS (  -- per schedule won here, a run of it in flight on another instance
        SELECT f.name, b.id
        FROM (
            SELECT w.name, min(w.slot) AS first FROM wanted w
            WHERE w.key IN (SELECT key FROM inserted UNION ALL SELECT key FROM mine)
            GROUP BY w.name
        ) f
        CROSS JOIN LATERAL ({BUSY_ELSEWHERE}) b
    ),
    placeholders AS (  -- (held: the turn taken with the slot, see Claim.turn)
        INSERT INTO schedtui_runs (id, name, scheduled_at, status, trigger, outcome, instance, held)
        SELECT w.run_id, w.name, w.slot, 'running', w.trigger, w.outcome, %(instance)s, w.turn AND b.id IS NULL
        FROM wanted w JOIN inserted i ON i.key = w.key LEFT JOIN busy b ON b.name = w.name  -- (one row a name at most)
        WHERE w.slot IS NOT NULL
        ON CONFLICT (id) DO NOTHING
    ),
    turned AS (  -- a claim won again (its answer was lost): its turn too
        UPDATE schedtui_runs r SET held = true
        FROM wanted w JOIN mine m ON m.key = w.key
        WHERE r.id = w.run_id AND r.status = 'running' AND w.turn
            AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.name = w.name)
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
            ORDER BY c.claimed_at LIMIT 100  -- (an index scan, see BUSY_ELSEWHERE; the rest next time)
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
    SELECT 'busy:' || name, id FROM busy
"""
CLAIMED_RUN = "SELECT run_id FROM schedtui_claims WHERE key = %s"
#: Turns are serialized by advisory locks, one per bucket of schedule names (64: a burst's
#: claim of thousands of schedules takes at most 64). Store.take_turn takes its
#: schedule's, then decides. A claim decides its turns without them (its losers must not
#: wait for anyone), then, if it took any, takes the free ones of their schedules' locks,
#: never waiting (TRY_TURN_LOCKS: it holds its keys, and a claim of the version before,
#: which held these locks shared while it waited for keys, would close a cycle). Under
#: the locks it got it checks again and gives back a turn another instance holds by now
#: (KEEP_TURNS): two claims of *different* slots (instances whose clocks are a cron
#: interval apart each claim their own "now"), or a claim and a turn, each deciding from a
#: snapshot without the other, are decided again one after the other. A turn whose lock
#: another holds it gives back undecided (ClaimResult.untried): its run takes it as it
#: starts. A statement's snapshot is taken at its start, so the locks come in a statement
#: of their own, before the check.
_TURN_CLASS = "hashtext('schedtui.turn')"


def _turn_bucket(name: str) -> str:
    """The bucket of a schedule name (SQL of ``name``, an expression): 64 of them."""
    return f"hashtext({name}) & 63"


TURN_LOCK = f"SELECT pg_advisory_xact_lock({_TURN_CLASS}, {_turn_bucket('%(name)s')})"
TRY_TURN_LOCKS = f"""
    WITH b AS MATERIALIZED (
        SELECT b.bucket, pg_try_advisory_xact_lock({_TURN_CLASS}, b.bucket) AS got
        FROM (SELECT DISTINCT {_turn_bucket('n')} AS bucket FROM unnest(%(names)s::text[]) AS n) b
    )
    SELECT n FROM unnest(%(names)s::text[]) AS n JOIN b ON b.bucket = {_turn_bucket('n')} WHERE NOT b.got
"""
#: The ledger's writer, committing a batch with rows that take their schedules' turn as
#: they are first written (a Run now's, placed before its handler starts: ``running``, no
#: ``fired_at``, ``held``; see Launcher.place), takes those schedules' locks first, waiting,
#: in bucket order, before any row: a turn or a claim's check that decides meanwhile from
#: a snapshot without the row decides again once it is committed (TAKE_TURN, KEEP_TURNS),
#: or leaves the turn to its run (TRY_TURN_LOCKS). Whoever holds such a lock waits for
#: nothing more but its commit, so the writer waits a moment at most.
WRITTEN_TURN_LOCKS = f"""
    SELECT count(pg_advisory_xact_lock({_TURN_CLASS}, b.bucket))
    FROM (SELECT DISTINCT {_turn_bucket('n')} AS bucket FROM unnest(%s::text[]) AS n ORDER BY 1) b
"""
KEEP_TURNS = f"""
    WITH f AS (
        SELECT * FROM unnest(%(names)s::text[], %(firsts)s::text[]::timestamptz[], %(run_ids)s::text[]) AS t(name, first, run_id)
    ),
    blocked AS (SELECT f.name, f.run_id, b.id FROM f CROSS JOIN LATERAL ({BUSY_ELSEWHERE}) b),
    given_back AS (
        UPDATE schedtui_runs r SET held = false
        WHERE r.held AND (r.id IN (SELECT run_id FROM blocked) OR r.id = ANY (%(undecided)s::text[]))
    )
    SELECT 'busy:' || name, id FROM blocked
"""
TAKE_TURN = f"""
    WITH f AS (SELECT %(name)s::text AS name, %(slot)s::timestamptz AS first),
    blocker AS (SELECT b.id FROM f CROSS JOIN LATERAL ({BUSY_ELSEWHERE}) b),
    taken AS (
        UPDATE schedtui_runs SET held = true
        WHERE id = %(run_id)s AND status = 'running' AND NOT EXISTS (SELECT 1 FROM blocker)
        RETURNING id
    )
    SELECT (SELECT id FROM blocker), EXISTS (SELECT 1 FROM taken)
"""
RELEASE_CLAIM = """
    WITH run AS (
        DELETE FROM schedtui_runs WHERE id = %(run_id)s AND status = 'running' AND fired_at IS NULL
            AND EXISTS (SELECT 1 FROM schedtui_claims WHERE key = %(key)s AND run_id = %(run_id)s)
        RETURNING id
    )
    DELETE FROM schedtui_claims WHERE key = %(key)s AND run_id = %(run_id)s AND EXISTS (SELECT 1 FROM run)
"""
#: Whether a claim naming this run, or the run, is still there: both gone, a RELEASE_CLAIM
#: whose answer was lost released them (see ``PostgresRuns.release_claim``).
CLAIM_OR_RUN_LEFT = """
    SELECT EXISTS (SELECT 1 FROM schedtui_claims WHERE key = %(key)s AND run_id = %(run_id)s)
        OR EXISTS (SELECT 1 FROM schedtui_runs WHERE id = %(run_id)s)
"""
PRUNE_OWN_CLAIMS = "DELETE FROM schedtui_claims WHERE name = %s AND claimed_at < %s"
#: Hourly, over a table the winners keep small: no index on claimed_at to maintain on
#: every claim for it.
SWEEP_CLAIMS = "DELETE FROM schedtui_claims WHERE claimed_at < %s"
COUNT_CLAIMS = "SELECT count(*) FROM schedtui_claims"

#: Per-connection settings: a statement that runs away (a lock never released, a server
#: stuck) is stopped rather than left to hold a pool connection forever; times come back
#: in UTC (as the store hands them out: nothing to convert).
#: Every connection of the store's own (its pool's, its lanes'), in one round trip. A commit
#: the server acknowledged must survive its crash: a claim, a checkpoint, a lock's token or
#: a fence lost after its answer would fire a slot twice, run a finished step again or
#: hand a lock to two holders. So ``synchronous_commit = off`` (a role's or a database's
#: setting for speed) is turned back ``on`` for these sessions; any other value is kept
#: (``local``, ``remote_write`` and ``remote_apply`` all flush the commit locally first).
#: Transactions are ``read committed`` whatever the role's or the database's default: a
#: transaction that reads after taking a lock (a migration, a heartbeat's mode check, a
#: cluster round) must see what the lock's previous holder committed, and a fenced write
#: must re-check a row updated under it (a repeatable-read snapshot would miss the one and
#: fail the other with a serialization error). Dates come back as ISO text whatever the
#: role's ``DateStyle`` (psycopg reads no other: ``SQL, DMY``, a European DBA's choice,
#: failed the store's first read of a timestamp). A lock is waited for as long as the
#: statement may run, whatever the role's ``lock_timeout`` (a DBA's guard for migrations):
#: the store's waits are for its own locks, held for a transaction each (another
#: instance's migration, a schedule's turn, a send near a full queue), and under a
#: ``lock_timeout`` of 10 ms an instance that started while another migrated failed to open.
CONFIGURE = """
    SELECT set_config('statement_timeout', '30s', false), set_config('idle_in_transaction_session_timeout', '60s', false),
        set_config('lock_timeout', '0', false),
        set_config('TimeZone', 'UTC', false), set_config('default_transaction_isolation', 'read committed', false),
        set_config('DateStyle', 'ISO', false),
        CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'on', false) END
"""
#: The database's encoding: its text columns hold UTF-8 only in a UTF8 database (read at open).
SERVER_ENCODING = "SELECT current_setting('server_encoding')"
#: The isolation a new session of this role and database gets (read at open behind a
#: transaction pooler, where the store cannot set its own).
ISOLATION = "SELECT current_setting('default_transaction_isolation')"
#: What the server gives a new session of this role and database (read at open, to warn).
SYNCHRONOUS_COMMIT = "SELECT current_setting('synchronous_commit')"
#: Behind a transaction pooler (see :mod:`.pooler`): the time zone and the date style only,
#: which PgBouncer keeps per client (it sets them again on whichever server connection
#: serves the client).
#: The timeouts and ``synchronous_commit`` would stay on the server connection for the
#: pooler's next client: the role's or the database's own settings apply there (checked at
#: open with POOLED_TIMEOUTS and SYNCHRONOUS_COMMIT).
CONFIGURE_POOLED = "SELECT set_config('TimeZone', 'UTC', false), set_config('DateStyle', 'ISO', false)"
POOLED_TIMEOUTS = (
    "SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout'), "
    "current_setting('lock_timeout')"
)

#: The fleet's sessions stuck on a silent client inside a transaction for longer than the
#: take-over window: a statement whose client went quiet before its last message (a
#: partition, a frozen process) is ``active`` and waits for it with no timeout at all, its
#: row locks held until TCP gives up (hours), and the rest of the fleet waits behind them.
#: Each member's heartbeat ends such sessions: their transactions roll back, their clients
#: reconnect. (``idle in transaction`` is also ended by its 60 s timeout above.) Only this
#: role's sessions: a role may always end its own.
END_STUCK_SESSIONS = """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE datname = current_database() AND usename = current_user AND pid <> pg_backend_pid()
      AND application_name LIKE 'schedtui%%' AND xact_start IS NOT NULL
      AND ((state = 'active' AND wait_event = 'ClientRead') OR state LIKE 'idle in transaction%%')
      AND state_change < now() - make_interval(secs => %s)
"""

# ---------------------------------------------------------------------------------------

def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(UTC)


def _run(row: Sequence[Any]) -> Run:
    return run_from_row(row, _utc)


def _in_flight(row: Sequence[Any]) -> Run:
    return in_flight_from_row(row, _utc)


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
                "held": r.held,
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
                "turn": c.turn,
            }
            for c in claims
        ],
        separators=(",", ":"),
    )
