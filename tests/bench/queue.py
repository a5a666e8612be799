"""Job queue benchmark: schedtui against pgqueuer 1.6.0 (asyncpg) and procrastinate 3.10.0,
on the same PostgreSQL, in the same run.

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.queue                      # everything (installs the peers first)
    python -m tests.bench.queue --no-peers           # schedtui only
    python -m tests.bench.queue --jobs 5000 --seconds 5
    python -m tests.bench.queue --no-peers --parts drain --statements   # statements per job

The measures, each system in its own database of one server, each worker in a process
of its own (a no-op async handler):

* ``drain``: N jobs (20,000) are queued first, then one worker process with a
  concurrency of 16 runs them all. ``jobs_per_s`` is N over the time from the first
  handler's start to the last one's, read in the handlers. A schedtui queue holds at
  most 10,000 queued jobs, so schedtui's N are spread over two queues of concurrency 8
  (16 at once, as for the others, which use one entrypoint or task of concurrency 16).
  The ``ceiling``, measured just before and just after schedtui's drain (their mean): the
  database's own limit for a queue, a bare table of N rows drained by 16 async claimers
  (psycopg, as schedtui) in batches of 16, each claiming with ``UPDATE … RETURNING`` over
  ``FOR UPDATE SKIP LOCKED`` and finishing with one ``DELETE``, no bookkeeping at all.
  ``ratio_to_ceiling`` (schedtui's drain over the ceiling) is the figure to quote: the
  machine may be shared, and both move with its load. With ``--statements`` (the server
  loads ``pg_stat_statements``), the drain's statements, rows and execution time per job.
* ``fairness`` (schedtui only): one worker drains 100 queues of 100 jobs each (every queue
  of concurrency 16), and one queue of 10,000; ``many_vs_one`` is the ratio of their rates,
  and per queue of the hundred, when its first job started (``latest_first_start_s``: the
  longest any queue waited for its first job) and when its last one ended (fastest and
  slowest queue), in seconds after the drain's first start.
* ``latency``: a separate sender process queues R jobs a second (1,000) for one second and
  then S seconds (20), each on its own schedule (an open loop: a slow send does not slow
  the next), stamping the time just before it calls the send; the worker (concurrency 16,
  started and idle before the first send; its startup heap frozen, as ``serve`` does)
  reads the time at the handler's start. ``p50_ms``/``p99_ms`` of the difference over the
  S seconds: enqueue-to-start, as an application sees it once its sender and worker have
  warmed up (the bare queue opens its connections before its first send); the first
  second's jobs apart, in ``first_second`` (a process's first statements plan, and the
  connections it keeps for sends and cycles beyond the first open as they are needed).
  Sends that fail (say, no pooled connection within 3 s: the sender fell behind) are
  counted in ``failed_sends``.
  ``cpu_us_per_job``: the CPU of the sender and of the worker (each process, over its
  sends or its jobs) and of the server's processes (over the sends), per job. Just before
  and just after schedtui's run, the same load on a bare queue (``ceiling``: a send is one
  insert and its NOTIFY in one transaction; one claimer woken by LISTEN deletes the batch
  it ran and claims the next in one statement; both over the connections schedtui's sends
  use, statements prepared), the floor of a notified queue on this machine:
  ``latency_p99_to_ceiling`` is schedtui's p99 over that floor's.
* ``sigkill`` (schedtui only): 4,000 jobs of 2 ms each on two worker processes; the one
  running them is SIGKILLed a quarter of the way through. ``lost``: jobs with no succeeded
  attempt in the store at the end; ``run_twice``: jobs two of whose attempts ran at the
  same time (the killed worker's until the kill), or with more than one succeeded attempt;
  ``rerun_after_kill``: jobs the killed worker had in hand, run again elsewhere after it
  died (their result died with it: at-least-once delivery).

The peers are installed by this script into a temporary folder (``pip install --target``)
and run from there: they are never a dependency of schedtui. The server is
``$SCHEDTUI_BENCH_DSN`` when set, otherwise a throwaway cluster from the machine's
binaries with durable settings (fsync on; see tests/pg.py). JSON on stdout, progress on
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ and tests/ importable
    sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402

from tests import pg  # noqa: E402
from tests.bench import stats  # noqa: E402

PEERS = ["pgqueuer==1.6.0", "asyncpg", "procrastinate==3.10.0"]


def log(message: str) -> None:
    print(f"[queue {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# The worker and sender programs, one per system. Each runs in a process of its own:
# ``python -c PROGRAM MODE URL ARGS...``, and prints one JSON line last.
# ---------------------------------------------------------------------------------------
COMMON = """
import asyncio, json, os, sys, time
mode, url = sys.argv[1], sys.argv[2]
args = [int(a) for a in sys.argv[3:]]

def report(**fields):
    print(json.dumps(fields), flush=True)

def server_cpu():
    # CPU seconds of the server's processes (its postmaster's children), when it runs here.
    parent = os.environ.get("BENCH_SERVER_PID")
    if not parent:
        return None
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if entry == parent or fields[1] == parent:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")

class Tally:
    def __init__(self, expected):
        self.expected, self.count, self.first, self.last = expected, 0, None, None
        self.cpu = None  # the process's CPU seconds from the first start to the last end
        self.delays = []
        self.sent = []  # each delay's send stamp, in the same order
        self.queues = {}
        self.done = asyncio.Event()

    def start(self, sent_at=None):
        now = time.time()
        if self.first is None:
            self.first = now
            self.cpu = -time.process_time()
        if sent_at is not None:
            self.delays.append(now - sent_at)
            self.sent.append(sent_at)

    def end(self):
        self.count += 1
        if self.count == self.expected:
            self.last = time.time()
            self.cpu += time.process_time()
            self.done.set()

async def until_done_or_told():
    # Every job ran, or the sender is done (some of its sends failed) and nothing started for 2 s.
    stop, seen, quiet = os.environ.get("BENCH_STOP_FILE"), -1, 0.0
    while not tally.done.is_set():
        await asyncio.sleep(0.2)
        quiet = quiet + 0.2 if tally.count == seen else 0.0
        seen = tally.count
        if stop and os.path.exists(stop) and quiet >= 2:
            break

async def paced(total, rate, send):
    # An open loop: each send at its own time, whatever the previous one costs. Returns
    # the CPU seconds of this process and of the server over the sends.
    start = time.time() + 0.5
    tasks = []
    cpu, server = time.process_time(), server_cpu()
    for i in range(total):
        delay = start + i / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(send(i)))
    await asyncio.gather(*tasks)
    after = server_cpu()
    return {"cpu_s": time.process_time() - cpu, "server_cpu_s": None if server is None else after - server}
"""

SCHEDTUI = COMMON + """
sys.path.insert(0, os.environ["SCHEDTUI_REPO"])
from backend import Engine, connect, define_queue
from backend.api.server import freeze_startup_heap

async def main():
    if mode == "enqueue":  # N jobs over two queues (a queue holds at most 10,000)
        n, = args
        async with connect(url, definitions=QUEUES) as st:
            for q in range(2):
                for at in range(0, n // 2, 1000):
                    await st.jobs.send_many(f"drain{q}", [{"payload": {}}] * min(1000, n // 2 - at))
        report(enqueued=n)
    elif mode == "drain":
        n, conc = args
        tally.expected = n
        engine = Engine(QUEUES, url, instance="bench-drain")
        await engine.start()
        await tally.done.wait()
        await engine.stop(grace=5)
        report(count=tally.count, first=tally.first, last=tally.last)
    elif mode == "latency-worker":
        n, conc = args
        tally.expected = n
        engine = Engine(QUEUES, url, instance="bench-latency")
        await engine.start()
        freeze_startup_heap()  # as `schedtui serve` does once its engine has started
        report(ready=True)
        await until_done_or_told()
        await engine.stop(grace=5)
        report(count=tally.count, delays=tally.delays, sent=tally.sent, cpu_s=tally.cpu)
    elif mode == "latency-sender":
        n, rate = args
        failed = 0

        async def send(i):
            nonlocal failed
            try:
                await st.jobs.send("latency", {"t": time.time()})
            except Exception as exc:  # a send that could not get through: counted, not fatal
                failed += 1
                if failed == 1:
                    print(f"a send failed: {exc}", file=sys.stderr)

        async with connect(url, definitions=QUEUES) as st:
            cpu = await paced(n, rate, send)
        report(sent=n - failed, failed=failed, **cpu)
    elif mode == "kill-enqueue":
        n, = args
        async with connect(url, definitions=QUEUES) as st:
            ids = []
            for at in range(0, n, 1000):
                ids += [s.id for s in await st.jobs.send_many("kill", [{"payload": {}}] * min(1000, n - at))]
        report(ids=ids)
    elif mode == "fair-enqueue":  # per queue of FAIR_QUEUES, n jobs
        n, = args
        async with connect(url, definitions=QUEUES) as st:
            for q in FAIR:
                for at in range(0, n, 1000):
                    await st.jobs.send_many(q.name, [{"payload": {}}] * min(1000, n - at))
        report(enqueued=n * len(FAIR))
    elif mode == "fair-drain":
        n, = args
        tally.expected = n
        engine = Engine(QUEUES, url, instance="bench-fair")
        await engine.start()
        await tally.done.wait()
        await engine.stop(grace=5)
        report(count=tally.count, first=tally.first, last=tally.last, queues=tally.queues)
    elif mode == "kill-worker":
        engine = Engine(QUEUES, url, instance=f"bench-kill-{os.getpid()}")
        await engine.start()
        report(ready=True)
        await asyncio.Event().wait()

tally = Tally(0)

async def noop(job):
    tally.start(job.payload.get("t") if isinstance(job.payload, dict) else None)
    tally.end()

async def fair(job):
    # Per queue: its first handler's start and its last one's end.
    now = time.time()
    seen = tally.queues.setdefault(job.queue, [now, now, 0])
    seen[1], seen[2] = now, seen[2] + 1
    tally.start()
    tally.end()

DONE = open(os.environ["BENCH_DONE_FILE"], "a", buffering=1) if os.environ.get("BENCH_DONE_FILE") else None

async def work_2ms(job):
    DONE.write(f"s {job.id} {os.getpid()} {time.time():.6f}\\n")
    await asyncio.sleep(0.002)
    DONE.write(f"e {job.id} {os.getpid()} {time.time():.6f}\\n")

conc = int(os.environ.get("BENCH_CONCURRENCY", "16"))
QUEUES = [
    define_queue(name="drain0", handler=noop, concurrency=conc // 2),
    define_queue(name="drain1", handler=noop, concurrency=conc // 2),
    define_queue(name="latency", handler=noop, concurrency=conc),
    define_queue(name="kill", handler=work_2ms, concurrency=conc),
]
FAIR = [define_queue(name=f"fair{i:03d}", handler=fair, concurrency=conc) for i in range(int(os.environ.get("BENCH_FAIR_QUEUES", "0")))]
QUEUES += FAIR
asyncio.run(main())
"""

PGQUEUER = COMMON + """
import asyncpg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer import types

async def main():
    conn = await asyncpg.connect(url)
    driver = AsyncpgDriver(conn)
    if mode == "enqueue":
        n, = args
        queries = Queries(driver)
        await queries.install()
        for at in range(0, n, 1000):
            size = min(1000, n - at)
            await queries.enqueue(["noop"] * size, [b"{}"] * size, [0] * size)
        report(enqueued=n)
        return
    n, conc = args
    tally.expected = n
    qm = QueueManager(Queries(driver))

    @qm.entrypoint("noop", concurrency_limit=conc)
    async def noop(job):
        payload = json.loads(job.payload) if job.payload else {}
        tally.start(payload.get("t"))
        tally.end()
        if tally.count >= n:
            qm.shutdown.set()

    if mode == "drain":
        await qm.run(batch_size=conc, mode=types.QueueExecutionMode.drain)
        report(count=tally.count, first=tally.first, last=tally.last)
    elif mode == "latency-worker":
        runner = asyncio.ensure_future(qm.run(batch_size=conc))
        report(ready=True)
        await tally.done.wait()
        await runner
        report(count=tally.count, delays=tally.delays, sent=tally.sent, cpu_s=tally.cpu)

async def send_main():
    n, rate = args
    pool = await asyncpg.create_pool(url, min_size=4, max_size=16)
    from pgqueuer.db import AsyncpgPoolDriver
    queries = Queries(AsyncpgPoolDriver(pool))
    cpu = await paced(n, rate, lambda i: queries.enqueue("noop", json.dumps({"t": time.time()}).encode()))
    report(sent=n, **cpu)

tally = Tally(0)
asyncio.run(send_main() if mode == "latency-sender" else main())
"""

PROCRASTINATE = COMMON + """
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, min_size=4, max_size=20))

@app.task(name="noop", queue="bench")
async def noop(t=None):
    tally.start(t)
    tally.end()

async def main():
    async with app.open_async():
        if mode == "enqueue":
            n, = args
            await app.schema_manager.apply_schema_async()
            for at in range(0, n, 1000):
                await noop.batch_defer_async(*[{}] * min(1000, n - at))
            report(enqueued=n)
        elif mode == "drain":
            n, conc = args
            tally.expected = n
            await app.run_worker_async(queues=["bench"], concurrency=conc, wait=False)
            report(count=tally.count, first=tally.first, last=tally.last)
        elif mode == "latency-worker":
            n, conc = args
            tally.expected = n
            worker = asyncio.ensure_future(app.run_worker_async(queues=["bench"], concurrency=conc, wait=True))
            report(ready=True)
            await tally.done.wait()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            report(count=tally.count, delays=tally.delays, sent=tally.sent, cpu_s=tally.cpu)
        elif mode == "latency-sender":
            n, rate = args
            cpu = await paced(n, rate, lambda i: noop.defer_async(t=time.time()))
            report(sent=n, **cpu)

tally = Tally(0)
asyncio.run(main())
"""

CEILING = COMMON + """
# The database's ceilings for a queue, with the same driver as schedtui (psycopg, async):
# * drain: a bare table drained by claimers that each claim a batch (UPDATE ... RETURNING
#   over FOR UPDATE SKIP LOCKED) and delete it: no seats, no history, no handler, no
#   bookkeeping;
# * latency: the least a queue woken by notifications can do: a send is one insert and
#   its NOTIFY in one transaction (on a free one of 8 connections); one claimer, woken by
#   LISTEN, deletes the batch it ran and claims the next in one statement, in a loop
#   while there is work.
import psycopg

SEND = ("WITH i AS (INSERT INTO bare_jobs (status, payload) VALUES ('queued', %s::text))"
        " SELECT pg_notify('bare_jobs', '')")
CYCLE = ("WITH d AS (DELETE FROM bare_jobs WHERE id = ANY(%s::bigint[]))"
         " UPDATE bare_jobs SET status = 'running' WHERE id IN ("
         " SELECT id FROM bare_jobs WHERE status = 'queued' ORDER BY id LIMIT %s::integer FOR UPDATE SKIP LOCKED)"
         " RETURNING id, payload")

async def create(n):
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS bare_jobs")
        await conn.execute(
            "CREATE TABLE bare_jobs (id bigserial PRIMARY KEY, status text NOT NULL, payload text NOT NULL)")
        await conn.execute("CREATE INDEX bare_jobs_queued ON bare_jobs (id) WHERE status = 'queued'")
        await conn.execute("INSERT INTO bare_jobs (status, payload) SELECT 'queued', '{}' FROM generate_series(1, %s)", (n,))
        await conn.execute("VACUUM ANALYZE bare_jobs")

async def drain(n, conc):
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(conc)]
    done = 0
    first = last = None

    async def claimer(conn):
        nonlocal done, first, last
        while True:
            cur = await conn.execute(
                "UPDATE bare_jobs SET status = 'running' WHERE id IN ("
                " SELECT id FROM bare_jobs WHERE status = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                " RETURNING id", (conc,))
            ids = [row[0] for row in await cur.fetchall()]
            if not ids:
                return
            if first is None:
                first = time.time()
            await conn.execute("DELETE FROM bare_jobs WHERE id = ANY(%s)", (ids,))
            done += len(ids)
            last = time.time()

    await asyncio.gather(*(claimer(c) for c in conns))
    for c in conns:
        await c.close()
    report(count=done, first=first, last=last)

async def lane(name):
    # The transport schedtui's sends and durable steps use (a connection with its
    # statements prepared, parameters sent as text): the floor compares SQL, not drivers.
    sys.path.insert(0, os.environ["SCHEDTUI_REPO"])
    from backend.store.postgres.lane import Lane

    async def configure(conn):
        pass

    one = Lane(url, name, {"send": SEND, "cycle": CYCLE}, configure)
    assert await one.open()
    return one

async def latency_worker(n, conc):
    tally.expected = n
    listen = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listen.execute("LISTEN bare_jobs")
    conn = await lane("bare_claim")
    woken = asyncio.Event()

    async def hear():
        async for _ in listen.notifies():
            woken.set()

    async def claim():
        ran = b"{}"
        while True:
            woken.clear()
            result = await conn.call("cycle", (ran, b"%d" % conc))
            rows = [(result.get_value(i, 0), result.get_value(i, 1)) for i in range(result.ntuples)]
            for _, payload in rows:
                tally.start(json.loads(payload)["t"])
                tally.end()
            ran = b"{" + b",".join(row[0] for row in rows) + b"}"
            if len(rows) < conc and not woken.is_set():
                try:
                    await asyncio.wait_for(woken.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass

    tasks = [asyncio.ensure_future(hear()), asyncio.ensure_future(claim())]
    report(ready=True)
    await until_done_or_told()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    report(count=tally.count, delays=tally.delays, sent=tally.sent, cpu_s=tally.cpu)

async def latency_sender(n, rate):
    free = asyncio.Queue()
    for _ in range(8):
        free.put_nowait(await lane("bare_send"))

    async def send(i):
        t = time.time()
        conn = await free.get()
        try:
            await conn.call("send", (json.dumps({"t": t}).encode(),))
        finally:
            free.put_nowait(conn)

    cpu = await paced(n, rate, send)
    report(sent=n, **cpu)

async def main():
    if mode == "drain":
        n, conc = args
        await create(n)
        await drain(n, conc)
    elif mode == "enqueue":
        await create(args[0])
        report(enqueued=args[0])
    elif mode == "latency-worker":
        await latency_worker(*args)
    elif mode == "latency-sender":
        await latency_sender(*args)

tally = Tally(0)
asyncio.run(main())
"""

PROGRAMS = {"ceiling": CEILING, "schedtui": SCHEDTUI, "pgqueuer": PGQUEUER, "procrastinate": PROCRASTINATE}


class ChildEnv(TypedDict, total=False):
    """Settings handed to a program in its environment, shared by several of its runs."""

    BENCH_CONCURRENCY: str
    BENCH_FAIR_QUEUES: str
    BENCH_STOP_FILE: str
    BENCH_SERVER_PID: str


class Runner:
    """Starts the programs with the right paths and reads their JSON."""

    def __init__(self, peers: Path | None, workdir: Path) -> None:
        self.peers = peers
        self.workdir = workdir

    def env(self, system: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
        env["SCHEDTUI_REPO"] = str(REPO_ROOT)
        env["SCHEDTUI_LOG_LEVEL"] = "WARNING"
        env["PYTHONUNBUFFERED"] = "1"
        if system not in ("schedtui", "ceiling"):
            assert self.peers is not None
            env["PYTHONPATH"] = str(self.peers)
        env.update(extra)
        return env

    def popen(self, system: str, mode: str, url: str, *args: int, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PROGRAMS[system]), mode, url, *map(str, args)],
            cwd=self.workdir, env=self.env(system, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, system: str, mode: str, url: str, *args: int, timeout: float = 900, **extra: str) -> dict[str, Any]:
        proc = self.popen(system, mode, url, *args, **extra)
        out, err = proc.communicate(timeout=timeout)
        return last_json(out, err, f"{system} {mode}", proc.returncode)

    @staticmethod
    def ready(proc: subprocess.Popen[str], what: str, timeout: float = 60) -> None:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if '"ready"' in line:
                return
        proc.kill()
        raise RuntimeError(f"{what} did not start:\n{proc.stderr.read() if proc.stderr else ''}")


def last_json(out: str, err: str, what: str, code: int | None) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise RuntimeError(f"{what} failed (exit {code}):\n{err[-3000:]}")


def server_pid(server: pg.PgServer) -> str:
    """The server's postmaster, when it runs on this machine ("": it does not, or is not ours
    to read): the latency run counts the CPU of its processes."""
    if not server.owned:
        return ""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    try:
        return (Path(row[0]) / "postmaster.pid").read_text().split()[0] if row else ""
    except OSError:
        return ""


def database(server: pg.PgServer, name: str) -> str:
    return server.create_database(name)


def drain(runner: Runner, server: pg.PgServer, system: str, jobs: int, concurrency: int) -> dict[str, Any]:
    url = database(server, f"drain_{system}")
    log(f"{system}: queueing {jobs:,} jobs")
    runner.run(system, "enqueue", url, jobs, BENCH_CONCURRENCY=str(concurrency))
    reset_statements(server)
    log(f"{system}: draining them with one worker, concurrency {concurrency}")
    result = runner.run(system, "drain", url, jobs, concurrency, BENCH_CONCURRENCY=str(concurrency))
    seconds = result["last"] - result["first"]
    out = {"jobs": result["count"], "seconds": round(seconds, 3), "jobs_per_s": round(result["count"] / seconds)}
    said = statements(server, url, jobs)
    return out if said is None else out | {"statements": said}


def ceiling(runner: Runner, server: pg.PgServer, jobs: int, concurrency: int) -> dict[str, Any]:
    url = database(server, "ceiling")
    log(f"ceiling: a bare table of {jobs:,} jobs, {concurrency} claimers in batches of {concurrency}")
    result = runner.run("ceiling", "drain", url, jobs, concurrency)
    seconds = result["last"] - result["first"]
    return {"jobs": result["count"], "seconds": round(seconds, 3), "jobs_per_s": round(result["count"] / seconds)}


def fairness(runner: Runner, server: pg.PgServer, queues: int, per_queue: int, concurrency: int) -> dict[str, Any]:
    """One worker drains ``queues`` queues of ``per_queue`` jobs each (every queue of the
    same concurrency), and then one queue of all those jobs; per queue, when its first job
    started and its last one ended (seconds after the drain's first start)."""
    out: dict[str, Any] = {}
    for name, count, each in (("one_queue", 1, queues * per_queue), ("many_queues", queues, per_queue)):
        url = database(server, f"fair_{count}")
        env: ChildEnv = {"BENCH_CONCURRENCY": str(concurrency), "BENCH_FAIR_QUEUES": str(count)}
        log(f"fairness: {count} queue(s) of {each:,} jobs")
        runner.run("schedtui", "fair-enqueue", url, each, **env)
        result = runner.run("schedtui", "fair-drain", url, count * each, **env)
        seconds = result["last"] - result["first"]
        out[name] = {"queues": count, "jobs": result["count"], "seconds": round(seconds, 3),
                     "jobs_per_s": round(result["count"] / seconds)}  # fmt: skip
        if count > 1:
            spans = [(first - result["first"], last - result["first"]) for first, last, _ in result["queues"].values()]
            out[name] |= {
                "latest_first_start_s": round(max(s for s, _ in spans), 3),
                "fastest_queue_done_s": round(min(e for _, e in spans), 3),
                "slowest_queue_done_s": round(max(e for _, e in spans), 3),
            }
    out["many_vs_one"] = round(out["many_queues"]["jobs_per_s"] / out["one_queue"]["jobs_per_s"], 2)
    return out


def reset_statements(server: pg.PgServer) -> None:
    """Forget what was said and committed so far (when ``pg_stat_statements`` is loaded)."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_reset_shared('wal')")
            for (name,) in conn.execute("SELECT datname FROM pg_database WHERE NOT datistemplate").fetchall():
                with psycopg.connect(server.dsn, dbname=name, autocommit=True) as other:
                    other.execute("SELECT pg_stat_reset()")


def statements(server: pg.PgServer, url: str, jobs: int) -> dict[str, Any] | None:
    """What the drain's database said, per job (when ``pg_stat_statements`` is loaded)."""
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server.dsn) as conn:
        if not conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
            return None
        rows = conn.execute(
            "SELECT s.calls, s.rows, s.total_exec_time, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 60), "
            "s.plans, s.total_plan_time "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "ORDER BY s.total_exec_time DESC",
            (dbname,),
        ).fetchall()
        conn.execute("SELECT pg_stat_force_next_flush()")
        commits = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)).fetchone()
        wal = conn.execute("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal").fetchone()
    return {
        "commits_per_job": round(commits[0] / jobs, 3) if commits else None,
        "wal_records_per_job": round(wal[0] / jobs, 2) if wal else None,
        "wal_bytes_per_job": round(float(wal[1]) / jobs) if wal else None,
        "wal_syncs_per_job": round(wal[2] / jobs, 3) if wal else None,
        "statements_per_job": round(sum(r[0] for r in rows) / jobs, 3),
        "rows_per_job": round(sum(r[1] for r in rows) / jobs, 3),
        "exec_ms_per_job": round(sum(r[2] for r in rows) / jobs, 4),
        "plan_ms_per_job": round(sum(r[5] for r in rows) / jobs, 4),
        "top": [
            {"calls": r[0], "rows": r[1], "ms": round(r[2], 1), "plans": r[4], "plan_ms": round(r[5], 1), "sql": r[3]}
            for r in rows[:8]
        ],
    }


#: Seconds of sending at the latency's rate before the jobs it measures: each system's
#: sender and worker warm up (connections, prepared statements, plans) as the bare queue's,
#: which opens its connections before it sends, already has. Reported apart (``first_second``).
WARM_UP_S = 1


def latency(runner: Runner, server: pg.PgServer, system: str, rate: int, seconds: int, concurrency: int) -> dict[str, Any]:
    url = database(server, f"latency_{system}")
    total = rate * (WARM_UP_S + seconds)
    if system != "schedtui":
        runner.run(system, "enqueue", url, 0)  # installs the schema
    else:
        runner.run(system, "enqueue", url, 0, BENCH_CONCURRENCY=str(concurrency))
    stop = runner.workdir / f"latency-{system}.sent"
    env: ChildEnv = {"BENCH_CONCURRENCY": str(concurrency), "BENCH_STOP_FILE": str(stop), "BENCH_SERVER_PID": server_pid(server)}
    worker = runner.popen(system, "latency-worker", url, total, concurrency, **env)
    runner.ready(worker, f"{system}'s worker")
    reset_statements(server)
    log(f"{system}: {rate} jobs/s for {seconds}s, enqueue to start")
    sent = runner.run(system, "latency-sender", url, total, rate, **env)
    stop.touch()
    out, err = worker.communicate(timeout=120)
    result = last_json(out, err, f"{system} latency worker", worker.returncode)
    delays, sent_at = result["delays"], result["sent"]
    measured_from = min(sent_at, default=0.0) + WARM_UP_S
    measured = [delay for delay, at in zip(delays, sent_at, strict=True) if at >= measured_from]
    warming = [delay for delay, at in zip(delays, sent_at, strict=True) if at < measured_from]
    summary = stats.summary_ms(measured, keys=("p50", "p99", "max"), digits=1)
    out_: dict[str, Any] = {"jobs": len(measured), "rate_per_s": rate,
                            "p50_ms": summary["p50"], "p99_ms": summary["p99"], "max_ms": summary["max"]}  # fmt: skip
    if warming:
        out_["first_second"] = {"jobs": len(warming)} | {
            f"{key}_ms": value for key, value in stats.summary_ms(warming, keys=("p50", "p99", "max"), digits=1).items()
        }
    cpu = {"sender": sent.get("cpu_s"), "worker": result.get("cpu_s"), "server": sent.get("server_cpu_s")}
    out_["cpu_us_per_job"] = {who: round(s / len(delays) * 1e6) for who, s in cpu.items() if s is not None and delays}
    said = statements(server, url, len(delays) or 1)
    out_ |= {"statements": said} if said is not None else {}
    return out_ | ({"failed_sends": sent["failed"]} if sent.get("failed") else {})


def sigkill(runner: Runner, server: pg.PgServer, jobs: int, concurrency: int) -> dict[str, Any]:
    url = database(server, "sigkill")
    done_files = [runner.workdir / f"done-{i}.txt" for i in range(2)]
    sent = runner.run("schedtui", "kill-enqueue", url, jobs, BENCH_CONCURRENCY=str(concurrency))["ids"]
    workers = [
        runner.popen("schedtui", "kill-worker", url, BENCH_CONCURRENCY=str(concurrency), BENCH_DONE_FILE=str(path))
        for path in done_files
    ]
    for worker in workers:
        runner.ready(worker, "a kill worker")

    def events() -> list[tuple[str, str, int, float]]:
        lines = []
        for path in done_files:
            if path.exists():
                for line in path.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 4:
                        lines.append((parts[0], parts[1], int(parts[2]), float(parts[3])))
        return lines

    deadline = time.monotonic() + 120
    while sum(1 for e in events() if e[0] == "e") < jobs // 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # watching a real process's progress
    # The worker with jobs in hand: the one that started a job last (one worker may take a
    # backlog alone while the other waits for its next poll: it claims ahead).
    latest = max((e for e in events() if e[0] == "s"), key=lambda e: e[3], default=None)
    victim = next((w for w in workers if latest and w.pid == latest[2]), workers[0])
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.time()
    log(f"sigkill: killed worker {victim.pid} after {sum(1 for e in events() if e[0] == 'e'):,} of {jobs:,} jobs")
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM schedtui_jobs").fetchone()
        if left is not None and left[0] == 0:
            break
        time.sleep(0.1)
    (survivor,) = [w for w in workers if w is not victim]
    survivor.send_signal(signal.SIGINT)
    survivor.communicate(timeout=60)
    with psycopg.connect(url) as conn:
        succeeded = Counter(
            row[0] for row in conn.execute("SELECT job_id FROM schedtui_job_attempts WHERE status = 'succeeded'")
        )
        abandoned = conn.execute("SELECT count(*) FROM schedtui_job_attempts WHERE error_tag = 'abandoned'").fetchone()
    # Each attempt as a span of time: from its start to its end, or to the kill for one the
    # killed worker never ended. Two spans of one job that overlap ran twice at once.
    spans: dict[str, list[tuple[float, float, int]]] = {}
    opened: dict[tuple[str, int], float] = {}
    for kind, job_id, pid, at in sorted(events(), key=lambda e: e[3]):
        if kind == "s":
            opened[(job_id, pid)] = at
        elif (job_id, pid) in opened:
            spans.setdefault(job_id, []).append((opened.pop((job_id, pid)), at, pid))
    for (job_id, pid), at in opened.items():
        spans.setdefault(job_id, []).append((at, killed_at if pid == victim.pid else time.time(), pid))
    at_once = {
        job_id for job_id, s in spans.items()
        if any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(s) for b in s[i + 1:])
    }
    ended = {job_id: [pid for _, _, pid in s] for job_id, s in spans.items()}
    rerun = [j for j, pids in ended.items() if victim.pid in pids and len(pids) > 1 and j not in at_once]
    return {
        "jobs": jobs,
        "killed_after": sum(1 for kind, _, pid, _ in events() if kind == "e" and pid == victim.pid),
        "lost": len(set(sent) - set(succeeded)),
        "run_twice": len(at_once | {j for j, n in succeeded.items() if n > 1}),
        "rerun_after_kill": len(rerun),
        "abandoned_attempts": int(abandoned[0]) if abandoned else 0,
    }


def install_peers(target: Path) -> None:
    log(f"installing {', '.join(PEERS)} into {target}")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(target), *PEERS],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"could not install the peers:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained (20,000)")
    parser.add_argument("--concurrency", type=int, default=16, help="worker concurrency (16)")
    parser.add_argument("--rate", type=int, default=1000, help="jobs sent per second for the latency (1,000)")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of sending for the latency (20)")
    parser.add_argument("--kill-jobs", type=int, default=4_000, help="jobs of the SIGKILL run (4,000)")
    parser.add_argument("--fair-queues", type=int, default=100, help="queues of the fairness run (100)")
    parser.add_argument("--fair-jobs", type=int, default=100, help="jobs per queue of the fairness run (100)")
    parser.add_argument("--statements", action="store_true", help="load pg_stat_statements: statements per job")
    parser.add_argument("--no-peers", action="store_true", help="schedtui only")
    parser.add_argument(
        "--parts", default="drain,fairness,latency,sigkill", help="which measures (drain,fairness,latency,sigkill)"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="schedtui-bench-queue-"))
    dsn = os.environ.get("SCHEDTUI_BENCH_DSN")
    settings = [
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track_utility=off",
        "pg_stat_statements.track_planning=on",
    ]
    server = pg.PgServer(dsn=dsn) if dsn else pg.start_cluster(durable=True, settings=settings if args.statements else ())
    systems = ["schedtui"] if args.no_peers else ["schedtui", "pgqueuer", "procrastinate"]
    try:
        peers = None
        if not args.no_peers:
            peers = workdir / "peers"
            install_peers(peers)
        runner = Runner(peers, workdir)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
            if args.statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        results: dict[str, Any] = {
            "benchmark": "queue",
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
            "postgres": {"version": version[0] if version else None, "fsync": fsync[0] if fsync else None},
            "drain": {},
            "latency": {},
        }
        parts = set(args.parts.split(","))
        if "drain" in parts:
            # The ceiling just before and just after schedtui's drain: the machine is shared.
            before = ceiling(runner, server, args.jobs, args.concurrency)
            for system in systems:
                results["drain"][system] = drain(runner, server, system, args.jobs, args.concurrency)
                log(f"{system}: drain {results['drain'][system]}")
                if system == "schedtui":
                    after = ceiling(runner, server, args.jobs, args.concurrency)
                    rates = [before["jobs_per_s"], after["jobs_per_s"]]
                    results["drain"]["ceiling"] = {"jobs": args.jobs, "jobs_per_s": round(sum(rates) / 2), "runs": rates}
                    log(f"ceiling: {results['drain']['ceiling']}")
            results["ratio_to_ceiling"] = round(
                results["drain"]["schedtui"]["jobs_per_s"] / results["drain"]["ceiling"]["jobs_per_s"], 3
            )
        if "fairness" in parts:
            results["fairness"] = fairness(runner, server, args.fair_queues, args.fair_jobs, args.concurrency)
            log(f"fairness: {results['fairness']}")
        if "latency" in parts:
            # The bare queue's latency just before and just after schedtui's: the machine is shared.
            bare = [latency(runner, server, "ceiling", args.rate, args.seconds, args.concurrency)]
            for system in systems:
                results["latency"][system] = latency(runner, server, system, args.rate, args.seconds, args.concurrency)
                log(f"{system}: latency {results['latency'][system]}")
                if system == "schedtui":
                    bare.append(latency(runner, server, "ceiling", args.rate, args.seconds, args.concurrency))
            # (a run with no job measured, on a machine too busy to send on time, has None)
            results["latency"]["ceiling"] = {
                key: round(sum(values) / len(values), 1) if (values := [b[key] for b in bare if b[key] is not None]) else None
                for key in ("p50_ms", "p99_ms", "max_ms")
            } | {"runs": bare}
            log(f"ceiling: latency {results['latency']['ceiling']}")
            ours, bare_p99 = results["latency"]["schedtui"]["p99_ms"], results["latency"]["ceiling"]["p99_ms"]
            results["latency_p99_to_ceiling"] = round(ours / bare_p99, 2) if ours is not None and bare_p99 else None
        if "sigkill" in parts:
            results["sigkill"] = sigkill(runner, server, args.kill_jobs, args.concurrency)
            log(f"sigkill: {results['sigkill']}")
        if "pgqueuer" in results["drain"] and "schedtui" in results["drain"]:
            results["drain_vs_pgqueuer"] = round(
                results["drain"]["schedtui"]["jobs_per_s"] / results["drain"]["pgqueuer"]["jobs_per_s"], 2
            )
        results["machine"]["load_1m_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(results, indent=2))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
