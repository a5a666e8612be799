"""Fleet benchmark: N ``schedtui serve`` processes on one PostgreSQL, ``advisoryLock`` against
``cluster`` coordination, and N uncoordinated APScheduler 3 processes.

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.fleet          # advisoryLock and cluster; N = 1, 2, 4, 8; 1,000 schedules; 30 s
    python -m tests.bench.fleet --coordination advisoryLock --instances 4 --seconds 10 --schedules 200
    python -m tests.bench.fleet --idle --seconds 60 --apscheduler 0   # what an idle member costs

The load: S schedules with the cron ``* * * * * *`` (every second) in UTC, each with an
async handler that does nothing. For each mode and each N, a fresh database, N real
``schedtui serve --coordination MODE`` processes started at once, and a measured window
of D whole seconds that opens two seconds after the last of them is up (in ``cluster``
mode: after the members hold every shard, spread over all N, and the spread has held
for two seconds).

Everything is read back from the database once the fleet has stopped:

* ``firings``: runs of the window's slots whose handler started; ``duplicates``: runs
  beyond the first of one (schedule, slot); ``missing``: window slots without a firing;
  ``recorded_missed``: those of them recorded ``missed``; ``silent_holes``: those without
  any row at all, once the fleet has had up to a minute after the window to record every
  slot (a fleet running late catches up before it is stopped).
* ``lag_ms``: ``fired_at - scheduled_at`` from the run ledger. The engine reads
  ``fired_at`` just before it calls the handler, so this is the handler's start, minus
  the slot, on the winning instance's clock (all instances run on this machine's clock).
* ``commits_per_firing``: ``xact_commit`` of the fleet's database in
  ``pg_stat_database`` from before the fleet started to after it stopped (every
  transaction, reads included, less the benchmark's own reads while it waits for the
  fleet: ``harness_commits``), divided by every firing in the ledger. Backends flush
  these counters when they exit, so the delta is exact. ``write_transactions_per_firing``
  counts only the transactions that wrote (transaction ids assigned, from
  ``txid_current_snapshot()`` before and after; the server runs nothing else).
  ``commits_per_instance_second``: the same commits over N times ``ran_s``, the seconds
  from the first instance's start to the last one's exit (start-up and stop included):
  what one member costs the database, whatever the number of firings.
* ``database_work_per_firing``: what the database did for the fleet, per firing:
  ``rows_written`` (inserted, updated, deleted) and ``rows_read`` (returned and fetched)
  in the fleet's database, ``wal_bytes`` of the server, and, on the throwaway server
  (which loads ``pg_stat_statements``), the ``statements`` the fleet ran there and their
  ``statement_ms`` of execution time (BEGIN and COMMIT not counted). A commit is a
  member's cost; these are a firing's.
* ``busiest_instance_share``: the share of the window's firings run by the instance that
  ran the most (``firings_by_instance``): 1/N is an even spread.
* ``claims_rows_at_end``: rows in the claims table after the run (each winner prunes its
  schedule's claims older than a minute for sub-minute crons).

``--jobs R``: each instance also runs a queue (concurrency 8, a no-op handler), and a
client of the store sends it R jobs a second during the window (``jobs_sent``,
``jobs_done``): the fleet's cost with a busy queue.

``--idle``: the same schedules on a yearly cron (:data:`IDLE_CRON`), so nothing is due: the
thousands-of-hourly-schedules fleet between its firings. Only the cost of being a member
is measured (``commits_per_instance_second``, start-up and stop included).

Then the same S jobs on N uncoordinated APScheduler 3 processes (AsyncIOScheduler, memory
job store): each process fires every slot, so each slot runs N times: the contrast.

The server is ``$SCHEDTUI_BENCH_DSN`` when set, otherwise a throwaway cluster from the
machine's binaries (see tests/pg.py) with durable settings (fsync on). JSON on stdout,
progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ and tests/ importable
    sys.path.insert(0, str(REPO_ROOT))

from tests.bench import stats  # noqa: E402

CRON = "* * * * * *"
IDLE_CRON = "0 0 1 1 *"  # midnight on 1 January: never due while the benchmark runs
LEAD_S = 2.0  # the window opens this long after the last instance is up
SETTLE_S = 1.5  # and the fleet stops this long after it closes,
DRAIN_S = 60.0  # or once every slot of the window has a row (a fleet running late), at most this later

SCHEDULES = """
    from backend import define_schedule

    async def noop(ctx):
        pass

    for i in range({n}):
        globals()[f"s{{i}}"] = define_schedule(
            name=f"bench-{{i:04d}}", cron="{cron}", timezone="UTC", handler=noop, max_runtime=60,
        )
"""
QUEUE = """
    from backend import define_queue

    async def noop_job(job):
        pass

    queue = define_queue(name="bench-q", handler=noop_job, concurrency=8)
"""


def send_jobs(url: str, rate: int, until: float, sent: list[int]) -> None:
    """Send ``rate`` jobs a second to ``bench-q`` until ``until`` (epoch), one at a time on
    a schedule of their own, from a client of the store (what an application does)."""
    from backend import connect, define_queue

    async def noop_job(job: Any) -> None:
        pass

    async def go() -> None:
        async with connect(url, definitions=[define_queue(name="bench-q", handler=noop_job, concurrency=8)]) as client:
            i = 0
            start = time.time()
            while (now := time.time()) < until:
                due = start + i / rate
                if due > now:
                    await asyncio.sleep(due - now)
                await client.jobs.send("bench-q", {"i": i})
                i += 1
            sent.append(i)

    asyncio.run(go())


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summary_ms(lags_s: list[float]) -> dict[str, float | None]:
    return stats.summary_ms(lags_s, ("p50", "p99", "max"), digits=2)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def sleep_until(epoch: float) -> None:
    while (remaining := epoch - time.time()) > 0:
        time.sleep(min(remaining, 0.5))


# ---------------------------------------------------------------------------------------
# schedtui: N serve processes
# ---------------------------------------------------------------------------------------
def run_fleet(
    server: Any,
    instances: int,
    schedules: int,
    seconds: int,
    work: Path,
    mode: str = "advisoryLock",
    *,
    idle: bool = False,
    jobs: int = 0,
) -> dict[str, Any]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from tests.pg import die_with_parent

    url = server.create_database(prefix=f"bench{mode[:2]}{instances}")
    dbname = str(conninfo_to_dict(url)["dbname"])
    folder = work / f"{mode}-n{instances}"
    (folder / "schedules").mkdir(parents=True)
    (folder / "schedules" / "bench.cron.py").write_text(textwrap.dedent(SCHEDULES.format(n=schedules, cron=IDLE_CRON if idle else CRON))
        + (textwrap.dedent(QUEUE) if jobs else ""))

    def stat(query: str) -> Any:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute(query, (dbname,)).fetchone()
            return row[0] if row else None

    commits_query = "SELECT xact_commit FROM pg_stat_database WHERE datname = %s"
    commits_before = stat(commits_query) or 0
    work_before = database_work(server, dbname)
    xids_before = next_xid(server)

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["SCHEDTUI_LOG_LEVEL"] = "INFO"
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    t0 = time.time()
    for i in range(instances):
        log_path = folder / f"serve-{i}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "serve", "--schedules", "schedules", "--store", url, "--instance", f"bench-{i}",
             "--coordination", mode],
            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("w"),
            preexec_fn=die_with_parent,
        )  # fmt: skip
        procs.append((proc, log_path))
    try:
        for proc, log_path in procs:
            wait_for(lambda proc=proc, log_path=log_path: "claims retention" in log_path.read_text() or proc.poll() is not None,
                     60, "an instance to start")
            if proc.poll() is not None:
                raise RuntimeError(f"an instance exited:\n{log_path.read_text()}")
        harness = 0  # the benchmark's own transactions on the fleet's database, left out
        if mode == "cluster":
            harness += wait_for_spread(url, instances, 120)
        ready = time.time()
        start = math.floor(ready + LEAD_S) + 1
        end = start + seconds
        log(f"{mode} N={instances}: {instances} instance(s) up in {ready - t0:.2f}s; window {start}..{end} ({seconds}s)")
        sent: list[int] = []
        if jobs:
            sleep_until(start)
            sender = threading.Thread(target=send_jobs, args=(url, jobs, end, sent))
            sender.start()
        sleep_until(end + SETTLE_S)
        if jobs:
            sender.join()
        if not idle:
            harness += drain(url, start, end, schedules * seconds, DRAIN_S)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _ in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    exits = [proc.returncode for proc, _ in procs]
    ran_s = time.time() - t0  # from the first start to the last exit
    # Backends flush their statistics as they exit: read them once all have gone.
    wait_for(lambda: stat("SELECT count(*) FROM pg_stat_activity WHERE datname = %s") == 0, 30, "the fleet's connections to close")
    commits_after = (stat(commits_query) or 0) - harness
    xids_after = next_xid(server)
    work_after = database_work(server, dbname)

    with psycopg.connect(url) as conn:
        window = conn.execute(
            """
            SELECT name, scheduled_at, status, extract(epoch FROM fired_at - scheduled_at), instance
            FROM schedtui_runs WHERE scheduled_at >= to_timestamp(%s) AND scheduled_at < to_timestamp(%s)
            """,
            (start, end),
        ).fetchall()
        all_firings = conn.execute("SELECT count(*) FROM schedtui_runs WHERE fired_at IS NOT NULL").fetchone()
        claims = conn.execute("SELECT count(*) FROM schedtui_claims").fetchone()
        done = (
            conn.execute("SELECT count(DISTINCT job_id) FROM schedtui_job_attempts WHERE status = 'succeeded'").fetchone() if jobs else None
        )
        statuses: dict[str, int] = dict(conn.execute("SELECT status, count(*) FROM schedtui_runs GROUP BY status").fetchall())
    fired = [row for row in window if row[3] is not None]
    per_slot = Counter((row[0], row[1]) for row in fired)
    rows_per_slot = Counter((row[0], row[1]) for row in window)
    recorded_missed = sum(1 for row in window if row[2] == "missed")
    expected = 0 if idle else schedules * seconds
    lags = [float(row[3]) for row in fired]
    by_instance = Counter(row[4] for row in fired)
    firings_total = int(all_firings[0]) if all_firings else 0
    return {
        "coordination": mode,
        "instances": instances,
        "expected": expected,
        "firings": len(fired),
        "duplicates": sum(count - 1 for count in per_slot.values()),
        "missing": expected - len(per_slot),
        "recorded_missed": recorded_missed,
        "silent_holes": expected - len(rows_per_slot),
        "lag_ms": summary_ms(lags),
        "commits": commits_after - commits_before,
        "harness_commits": harness,
        "jobs_sent": sum(sent),
        "jobs_done": int(done[0]) if done else 0,
        "firings_total": firings_total,
        "commits_per_firing": round((commits_after - commits_before) / max(1, firings_total), 4),
        "commits_per_instance_second": round((commits_after - commits_before) / (instances * ran_s), 2),
        "ran_s": round(ran_s, 1),
        "write_transactions": xids_after - xids_before,
        "write_transactions_per_firing": round((xids_after - xids_before) / max(1, firings_total), 4),
        "database_work_per_firing": per_firing(work_before, work_after, harness, firings_total),
        "claims_rows_at_end": int(claims[0]) if claims else None,
        "window_statuses": dict(Counter(row[2] for row in window)),
        "ledger_statuses": statuses,
        "firings_by_instance": dict(sorted(by_instance.items())),
        "busiest_instance_share": round(max(by_instance.values(), default=0) / max(1, len(fired)), 3),
        "exit_codes": exits,
    }


def database_work(server: Any, dbname: str) -> dict[str, float]:
    """Counters of what the database did: rows written to the fleet's database
    (``pg_stat_database``), WAL bytes of the server (``pg_stat_wal``: the server runs
    nothing else), and, when ``pg_stat_statements`` is loaded, the statements run in the
    fleet's database and their execution time."""
    import psycopg

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tup_inserted + tup_updated + tup_deleted, tup_returned + tup_fetched FROM pg_stat_database WHERE datname = %s",
            (dbname,),
        ).fetchone()
        wal = conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()
        work = {"rows_written": float(row[0]) if row else 0.0, "rows_read": float(row[1]) if row else 0.0,
                "wal_bytes": float(wal[0]) if wal else 0.0}  # fmt: skip
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
            calls = conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
                (dbname,),
            ).fetchone()
            assert calls is not None
            work["statements"], work["statement_ms"] = float(calls[0]), float(calls[1])
    return work


def per_firing(before: dict[str, float], after: dict[str, float], harness: int, firings: int) -> dict[str, float]:
    """The growth of each counter of :func:`database_work`, per firing (the benchmark's own
    waiting reads, one statement each, left out of ``statements``)."""
    out = {}
    for key, value in after.items():
        grown = value - before.get(key, 0.0) - (harness if key == "statements" else 0)
        out[key] = round(grown / max(1, firings), 4 if key != "wal_bytes" else 1)
    return out


def drain(url: str, start: int, end: int, expected: int, timeout: float) -> int:
    """Wait until every slot of the window has a row (fired or recorded), at most ``timeout``:
    a fleet running seconds late still records what it owes before it is stopped, so a slot
    without any row is a real silent hole, not an artefact of stopping it. Returns the
    transactions it took."""
    import psycopg

    looks = 0

    def recorded() -> int:
        nonlocal looks
        looks += 1
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM (SELECT DISTINCT name, scheduled_at FROM schedtui_runs "
                "WHERE scheduled_at >= to_timestamp(%s) AND scheduled_at < to_timestamp(%s)) s",
                (start, end),
            ).fetchone()
        return int(row[0]) if row else 0

    deadline = time.monotonic() + timeout
    while recorded() < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return looks


def next_xid(server: Any) -> int:
    """The next transaction id the server will assign (reading it assigns none)."""
    import psycopg

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())").fetchone()
    return int(row[0]) if row else 0


def wait_for_spread(url: str, instances: int, timeout: float) -> int:
    """Until the members hold every shard between them, all N of them, unchanged for 2 s.
    Returns the transactions it took."""
    import psycopg

    from backend.scheduler.coordination.cluster import SHARDS

    looks = 0

    def holders() -> dict[str, str]:
        nonlocal looks
        looks += 1
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, holder FROM schedtui_locks WHERE name LIKE 'cluster:shard:%' AND holder IS NOT NULL "
                "AND expires_at > statement_timestamp()"
            ).fetchall()
        return dict(rows)

    deadline = time.monotonic() + timeout
    last: dict[str, str] = {}
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = holders()
        if now != last:
            last, since = now, time.monotonic()
        elif len(now) == SHARDS and len(set(now.values())) == instances and time.monotonic() - since >= 2:
            return looks
        time.sleep(0.2)
    raise RuntimeError(f"the shards did not settle over {instances} members within {timeout}s: {Counter(last.values())}")


# ---------------------------------------------------------------------------------------
# APScheduler 3: N uncoordinated processes
# ---------------------------------------------------------------------------------------
async def aps_child(schedules: int, start: int, end: int) -> dict[str, Any]:
    from apscheduler.events import EVENT_JOB_EXECUTED
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.cron import CronTrigger

    counts: Counter[str] = Counter()
    lags: list[float] = []

    async def job() -> None:
        pass

    def listener(event: Any) -> None:
        slot = event.scheduled_run_time.timestamp()
        if start <= slot < end:
            counts[f"{event.job_id}@{int(slot)}"] += 1
            lags.append(time.time() - slot)  # after the no-op job ended: its start, within a hair

    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.add_listener(listener, EVENT_JOB_EXECUTED)
    for i in range(schedules):
        scheduler.add_job(
            job, CronTrigger(second="*", timezone="UTC"), id=str(i),
            misfire_grace_time=None, coalesce=False, max_instances=1000,
        )  # fmt: skip
    scheduler.start()
    while time.time() < end + SETTLE_S:
        await asyncio.sleep(0.2)
    scheduler.shutdown(wait=False)
    return {"counts": counts, "lags": lags}


def run_apscheduler(processes: int, schedules: int, seconds: int) -> dict[str, Any]:
    from tests.bench.peers import ensure

    ensure("apscheduler>=3.10,<4", "apscheduler")  # installed by the benchmark (its children inherit PYTHONPATH)
    import apscheduler

    from tests.pg import die_with_parent

    start = math.floor(time.time() + 3) + 1  # time for the interpreters to start
    end = start + seconds
    log(f"APScheduler 3: {processes} uncoordinated process(es); window {start}..{end} ({seconds}s)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.bench.fleet", "--aps-child", str(schedules), str(start), str(end)],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        for _ in range(processes)
    ]
    total: Counter[str] = Counter()
    lags: list[float] = []
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        doc = json.loads(out.strip().splitlines()[-1])
        total.update(doc["counts"])
        lags += doc["lags"]
    expected = schedules * seconds
    return {
        "processes": processes,
        "expected": expected,
        "firings": sum(total.values()),
        "duplicates": sum(count - 1 for count in total.values()),
        "missing": expected - len(total),
        "lag_ms": summary_ms(lags),
        "settings": "AsyncIOScheduler, memory job store, CronTrigger(second='*'), coalesce=False, misfire_grace_time=None",
        "version": apscheduler.__version__,
    }


# ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000, help="schedules (default 1000)")
    parser.add_argument("--seconds", type=int, default=30, help="measured whole seconds (default 30)")
    parser.add_argument("--instances", default="1,2,4,8", help="fleet sizes, comma-separated (default 1,2,4,8)")
    parser.add_argument(
        "--coordination", default="advisoryLock,cluster", help="modes, comma-separated (default advisoryLock,cluster)"
    )
    parser.add_argument("--jobs", type=int, default=0, help="jobs a second sent to a queue the instances run (default 0)")
    parser.add_argument("--idle", action="store_true", help="nothing due: what a member costs between firings")
    parser.add_argument("--apscheduler", type=int, default=4, help="uncoordinated APScheduler processes (0: skip)")
    parser.add_argument("--aps-child", nargs=3, type=int, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.aps_child:
        n, start, end = args.aps_child
        print(json.dumps(asyncio.run(aps_child(n, start, end))), flush=True)
        return 0

    from tests import pg

    sizes = [int(x) for x in args.instances.split(",") if x.strip()]
    dsn = os.environ.get("SCHEDTUI_BENCH_DSN")
    # pg_stat_statements counts the statements and their time (without BEGIN/COMMIT).
    statements = ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_utility=off"]
    server = pg.PgServer(dsn=dsn) if dsn else pg.start_cluster(durable=True, settings=statements)
    try:
        import psycopg

        if server.owned:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

        with psycopg.connect(server.dsn) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')"
            ).fetchone()
        assert row is not None
        doc: dict[str, Any] = {
            "load": {
                "schedules": args.schedules, "seconds": args.seconds, "cron": IDLE_CRON if args.idle else CRON, "jobs_per_s": args.jobs
            },
            "server": {"version": row[0], "fsync": row[1], "synchronous_commit": row[2], "throwaway": server.owned},
            "lag_source": "fired_at - scheduled_at from the run ledger (fired_at is read just before the handler is called)",
            "schedtui": {},
        }
        modes = [m for m in args.coordination.split(",") if m.strip()]
        with tempfile.TemporaryDirectory(prefix="schedtui-fleet-") as work:
            for mode in modes:
                doc["schedtui"][mode] = {}
                for n in sizes:
                    result = doc["schedtui"][mode][str(n)] = run_fleet(
                        server, n, args.schedules, args.seconds, Path(work), mode, idle=args.idle, jobs=args.jobs
                    )
                    keys = ("firings", "duplicates", "silent_holes", "lag_ms", "commits_per_firing", "commits_per_instance_second",
                            "write_transactions_per_firing", "database_work_per_firing", "busiest_instance_share")
                    log(f"{mode} N={n}: {json.dumps({k: result[k] for k in keys})}")
        if args.apscheduler:
            doc["apscheduler3_uncoordinated"] = run_apscheduler(args.apscheduler, args.schedules, args.seconds)
        doc["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    finally:
        server.stop()
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
