"""Lock benchmark: acquire + release latency on PostgreSQL with 8 contenders.

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.locks                      # 8 contenders, 20 s per scenario
    python -m tests.bench.locks --contenders 4 --seconds 5

Each contender is its own process with its own ``connect()`` (a real client: its own
connection pool, its own event loop), or (``--as tasks``) a task of one process, the eight
sharing one client as the requests of one web application would; each loops for the
measured window: take the lock
(``Locks.acquire``: one statement), and when it got it, release it at once (one
statement); then wait ``--think-ms`` (20 ms) before the next attempt: eight contenders that
never pause would measure how eight interpreters share the CPU. Two scenarios:

* ``one_lock``: every contender wants the same lock. Most attempts lose (the lock is
  held by someone else): a lost attempt is one read-only statement.
* ``own_locks``: each contender has a lock of its own: no row contention, every attempt
  wins; what the database costs per acquire + release when nobody waits.

Reported, in milliseconds, as ``p50``/``p99``/``max``: ``acquire_release`` (a won
acquire plus its release, back to back: the target is p99 under 5 ms), ``acquire_won``,
``acquire_lost``, ``release``; and per scenario the attempts, wins, and the database's
transactions (``xact_commit`` of ``pg_stat_database``, reads included) per won
acquire + release; and ``commit_floor_ms``, one durable single-row ``UPDATE`` from one idle
client in the same run (the disk's share of an acquire). The server is ``$SCHEDTUI_BENCH_DSN`` when set, otherwise a throwaway
cluster from the machine's binaries with durable settings (fsync on). JSON on stdout,
progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ and tests/ importable
    sys.path.insert(0, str(REPO_ROOT))

from tests.bench import stats  # noqa: E402

KEYS = ("p50", "p99", "max")


def log(message: str) -> None:
    print(f"[locks {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def contender(url: str, name: str, start: float, end: float, think: float) -> dict[str, Any]:
    from backend import connect

    async with connect(url, instance=f"bench-{os.getpid()}") as st:
        await st.locks.list()  # warm the pool before the window opens
        return await attempts(st.locks, name, start, end, think)


async def tasks_contenders(url: str, names: list[str], start: float, end: float, think: float) -> dict[str, Any]:
    """Every contender a task of one process, sharing its client (one pool of 8 connections)."""
    from backend import connect

    async with connect(url, instance=f"bench-{os.getpid()}") as st:
        await asyncio.gather(*(st.locks.list() for _ in names))  # open the pool's connections
        docs = await asyncio.gather(*(attempts(st.locks, name, start, end, think) for name in names))
    return {key: [value for doc in docs for value in doc[key]] for key in docs[0]} | {
        "per_contender": [len(doc["won"]) for doc in docs]
    }


async def attempts(locks: Any, name: str, start: float, end: float, think: float) -> dict[str, Any]:
    won: list[float] = []
    lost: list[float] = []
    released: list[float] = []
    pairs: list[float] = []
    while time.time() < start:
        await asyncio.sleep(0.01)
    while time.time() < end:
        t0 = time.perf_counter()
        lease = await locks.acquire(name, ttl=30)
        t1 = time.perf_counter()
        if lease is None:
            lost.append(t1 - t0)
        else:
            await lease.release()
            t2 = time.perf_counter()
            won.append(t1 - t0)
            released.append(t2 - t1)
            pairs.append(t2 - t0)
        if think:
            await asyncio.sleep(think)
    return {"won": won, "lost": lost, "released": released, "pairs": pairs}


def run_scenario(
    server: Any, scenario: str, contenders: int, seconds: int, think_ms: float, mode: str = "processes"
) -> dict[str, Any]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from tests.pg import die_with_parent

    url = server.create_database(prefix=f"locks{scenario.replace('_', '')}")
    dbname = conninfo_to_dict(url)["dbname"]

    async def migrate() -> None:
        from backend import connect

        async with connect(url, create=True):
            pass

    asyncio.run(migrate())

    def commits() -> int:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)).fetchone()
            return int(row[0]) if row else 0

    start = time.time() + 4  # time for the interpreters to start and connect
    end = start + seconds
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    names = ["bench" if scenario == "one_lock" else f"bench-{i}" for i in range(contenders)]
    groups = [[name] for name in names] if mode == "processes" else [names]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.bench.locks", "--child", url, ",".join(group), str(start), str(end), str(think_ms)],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        for group in groups
    ]
    log(f"{scenario}: {contenders} contender(s) as {mode}, {seconds}s window, think {think_ms} ms")
    while time.time() < start:
        time.sleep(0.05)
    before = commits()
    samples: dict[str, list[float]] = {"won": [], "lost": [], "released": [], "pairs": []}
    per_contender = []
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        doc = json.loads(out.strip().splitlines()[-1])
        for key in samples:
            samples[key] += doc[key]
        per_contender += doc.get("per_contender", [len(doc["won"])])
    # Backends flush their statistics when they exit: wait for the contenders' to go.
    deadline = time.time() + 30
    while time.time() < deadline:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)).fetchone()
        if row is not None and row[0] == 0:
            break
        time.sleep(0.1)
    after = commits()
    wins = len(samples["won"])
    return {
        "contenders": contenders,
        "as": mode,
        "attempts": wins + len(samples["lost"]),
        "wins": wins,
        "wins_per_contender": per_contender,
        "acquire_release_ms": stats.summary_ms(samples["pairs"], KEYS),
        "acquire_won_ms": stats.summary_ms(samples["won"], KEYS),
        "acquire_lost_ms": stats.summary_ms(samples["lost"], KEYS),
        "release_ms": stats.summary_ms(samples["released"], KEYS),
        "transactions_per_win": round((after - before) / max(1, wins), 2),
        "note": "transactions include every attempt (lost ones are read-only) and the clients' start and stop",
    }


def commit_floor(server: Any, samples: int = 500) -> dict[str, float | None]:
    """What one durable single-row UPDATE costs this server from one idle client, measured
    in the same run: the floor under an acquire (a release does not wait for the disk)."""
    import psycopg

    url = server.create_database(prefix="floor")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO floor VALUES (1, 0)")
        took = []
        for _ in range(samples):
            t0 = time.perf_counter()
            conn.execute("UPDATE floor SET n = n + 1 WHERE id = 1")
            took.append(time.perf_counter() - t0)
    return stats.summary_ms(took, KEYS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", type=int, default=8, help="processes (default 8)")
    parser.add_argument("--seconds", type=int, default=20, help="measured seconds per scenario (default 20)")
    parser.add_argument("--think-ms", type=float, default=20.0, help="pause between a contender's attempts (default 20)")
    parser.add_argument(
        "--as", dest="mode", default="processes,tasks",
        help="contenders as processes (a client each) and/or as tasks of one process sharing a client (default both)",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.child:
        url, names, start, end, think = args.child
        group = names.split(",")
        doc: dict[str, Any]
        if len(group) == 1:
            doc = asyncio.run(contender(url, group[0], float(start), float(end), float(think) / 1000))
        else:
            doc = asyncio.run(tasks_contenders(url, group, float(start), float(end), float(think) / 1000))
        print(json.dumps(doc), flush=True)
        return 0

    from tests import pg

    dsn = os.environ.get("SCHEDTUI_BENCH_DSN")
    server = pg.PgServer(dsn=dsn) if dsn else pg.start_cluster(durable=True)
    try:
        import psycopg

        with psycopg.connect(server.dsn) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')"
            ).fetchone()
        assert row is not None
        doc = {
            "server": {"version": row[0], "fsync": row[1], "synchronous_commit": row[2], "throwaway": server.owned},
            "load": {"contenders": args.contenders, "seconds": args.seconds, "think_ms": args.think_ms, "ttl_s": 30},
        }
        doc["commit_floor_ms"] = commit_floor(server)
        for mode in [m for m in args.mode.split(",") if m]:
            for scenario in ("one_lock", "own_locks"):
                key = f"{scenario}_{mode}"
                doc[key] = run_scenario(server, scenario, args.contenders, args.seconds, args.think_ms, mode)
                log(f"{key}: acquire+release {doc[key]['acquire_release_ms']}")
        doc["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    finally:
        server.stop()
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
