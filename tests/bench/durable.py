"""Durable-function benchmark: schedtui against DBOS Transact 3.4.0 on the same PostgreSQL.

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.durable                  # 20 workflows of 100 no-op steps each
    python -m tests.bench.durable --workflows 5 --skip-resume
    python -m tests.bench.durable --skip-dbos --skip-resume --statements   # statements per step
    python -m tests.bench.durable --fence          # the checkpoint statement alone vs the INSERT

The workload: a workflow of ``--steps`` no-op steps (each returns its index), run
``--workflows`` times one after the other, after one warm-up run. Each system runs in a
process of its own against a fresh database of one PostgreSQL cluster (fsync on), one at
a time. Measured:

* ``steps_per_s``: steps of the measured workflows over their wall time, each from its
  start to its end (each system's own process clock). The systems run ``--rounds``
  times, alternating, each round on a fresh database; each system's median round is
  shown (with every round's figure): the machine may be busy with other work;
* ``checkpoint_ms``: the time of one step's checkpoint, the write that makes its outcome
  durable (schedtui: its one statement; DBOS: ``record_operation_result``), p50/p99/max.
  For DBOS ``step_db_ms`` adds the read it does first (``check_operation_execution``):
  what a step costs it in the database in all;
* ``commits_per_step``: ``xact_commit`` of the system's database in ``pg_stat_database``
  (every transaction, read-only ones included) over the measured workflows, less a run
  of the same process with no workflow (start-up, schema, background work), divided by
  the steps (the warm-up's included). Counters are read after each process has exited
  (backends flush them then);
* ``ceiling``: the sequential commit rate of the same server at the same moments: one
  connection (psycopg, autocommit) committing a one-row ``INSERT`` after another, into a
  database of its own, as many commits as a workflow has steps before each measured
  workflow, in the system's own process (between workflows, never during one). A
  checkpointed step cannot cost less than one such commit, so ``ceiling_ratio``, the
  system's steps/s over those commits/s, is the figure to quote: how close a system
  comes to that floor. It holds on a machine whose disk and CPUs other work shares, where
  the absolute rates swing several-fold within a minute. Each system's median ratio over
  the rounds is shown, with every round's;
* ``async_floor``: the same commits sent from schedtui's event loop over the connection a
  checkpoint uses (statement prepared, parameter as text), with no engine work, measured
  beside the ceiling: ``async_floor_to_ceiling`` is what asyncio and that transport leave
  of the ceiling, and ``async_floor_ratio`` the system's steps/s over that floor's
  commits/s (schedtui only): what the engine's own work (the step's bookkeeping, its
  fenced checkpoint statement) costs on top;
* ``cpu_us_per_step``: the worker process's CPU (every thread) during the measured
  workflows, per step; beside it ``ceiling_cpu_us_per_commit``, the same process's CPU
  per commit of the ceiling: what a step costs the client besides its commit;
* ``--breakdown`` stamps each step's parts on the checkpoints' connection (see
  :class:`Breakdown`): ``step_breakdown``, the median and mean microseconds of its send,
  its reply in flight, the reply's read, the wake-up of the code awaiting it, and the
  engine's Python to the next send;
* ``--fence`` measures only the checkpoint statement, without the engine (see
  :func:`fence_costs`): what the fence and the step's row cost beside the ceiling's
  ``INSERT``;
* with ``--statements`` (the throwaway cluster loads ``pg_stat_statements``): each
  system's statements (so round trips, but for pipelined ones), rows and server time per
  step, over the whole process (its start-up included, which ``commits_per_step``
  subtracts), with the statements that took the most calls.

DBOS is installed by this script with pip into a temporary virtual environment it
creates and removes (never into the project's environment). ``resume`` measures, on real
``schedtui serve`` processes, how long after a SIGKILL of the instance running an
execution another live instance runs its next step (the registry sees the dead pid on
this machine), and after a SIGSTOP (the frozen owner's lease must expire: 30 s).

The server is ``$SCHEDTUI_BENCH_DSN`` when set, otherwise a throwaway cluster from the
machine's binaries (see tests/pg.py). JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import inspect
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
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ and tests/ importable
    sys.path.insert(0, str(REPO_ROOT))

from tests.bench import stats  # noqa: E402

DBOS_VERSION = "3.4.0"


def log(message: str) -> None:
    print(f"[durable {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# the ceiling: sequential commits on one connection (DBOS's worker gets this class's source)
# ---------------------------------------------------------------------------------------
class Ceiling:
    """One connection committing a one-row INSERT after another, timed in batches."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling (n bigint PRIMARY KEY, at timestamptz NOT NULL)")
        self.conn.execute("TRUNCATE bench_ceiling")
        self.n = self.commits = 0
        self.seconds = self.cpu = 0.0
        self.batch(20)  # warm-up: psycopg prepares the statement after a few executions
        self.commits = 0
        self.seconds = self.cpu = 0.0

    def batch(self, count: int) -> None:
        began, began_cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            self.n += 1
            self.conn.execute("INSERT INTO bench_ceiling (n, at) VALUES (%s, now())", (self.n,))
        self.seconds += time.perf_counter() - began
        self.cpu += time.process_time() - began_cpu
        self.commits += count

    def close(self) -> dict[str, float]:
        self.conn.close()
        return {"ceiling_commits": self.commits, "ceiling_s": self.seconds, "ceiling_cpu_s": self.cpu}


# ---------------------------------------------------------------------------------------
# the schedtui worker (run in a process of its own)
# ---------------------------------------------------------------------------------------
class Breakdown:
    """Where a step's time goes, stamped on the checkpoints' connection (``--breakdown``):
    the send (libpq's send and flush: the write may hand the CPU to the server at once),
    the reply in flight (the server's work and its commit, the wake-ups on both sides), the
    reader reading it, the wake-up of the code awaiting it, and the engine's Python from
    there to the next step's send (its bookkeeping, the no-op step, the next checkpoint's
    parameters). Each stamp costs about a microsecond: the steps/s of such a run are not
    the ones to quote."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, int]] = []
        self.on = False

    def install(self) -> None:
        from backend.store.postgres import durable, lane

        stamp = self.stamp
        call, readable, checkpoint = lane.Lane.call, lane.Lane._readable, durable.PostgresDurable._checkpoint

        def timed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.name != "schedtui_durable" or args[0] not in ("first", "again"):  # (a start's, a finish's)
                return call(self, *args, **kwargs)
            stamp("send")
            try:
                return call(self, *args, **kwargs)
            finally:
                stamp("sent")

        def timed_readable(self: Any) -> None:
            if self.name == "schedtui_durable":
                stamp("read")
            readable(self)
            if self.name == "schedtui_durable":
                stamp("read_done")

        async def timed_checkpoint(self: Any, write: Any, step: Any) -> Any:
            result = await checkpoint(self, write, step)
            stamp("resumed")
            return result

        lane.Lane.call = timed_call  # type: ignore[method-assign]
        lane.Lane._readable = timed_readable  # type: ignore[method-assign]
        durable.PostgresDurable._checkpoint = timed_checkpoint  # type: ignore[method-assign,assignment]

    def stamp(self, what: str) -> None:
        if self.on:
            self.stamps.append((what, time.perf_counter_ns()))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per part, its median and mean in microseconds over the steps measured."""
        import statistics

        parts: dict[str, list[float]] = {"send": [], "in_flight": [], "reply_read": [], "wake_up": [], "engine": []}
        stamps, resumed, checkpoint = self.stamps, None, False
        for (before, at), (what, then) in zip(stamps, stamps[1:], strict=False):
            gap = (then - at) / 1000
            if what == "end":
                resumed = None  # (the next send is the next workflow's first)
            elif what == "send" and resumed is not None:
                parts["engine"].append((then - resumed) / 1000)
                resumed = None
            elif (before, what) == ("send", "sent"):
                parts["send"].append(gap)
            elif (before, what) == ("sent", "read"):
                parts["in_flight"].append(gap)
                checkpoint = True  # (the reply a checkpoint's; not a start's or a finish's)
            elif (before, what) == ("read", "read_done") and checkpoint:
                parts["reply_read"].append(gap)
                checkpoint = False
            elif (before, what) == ("read_done", "resumed"):
                parts["wake_up"].append(gap)
                resumed = then
        return {
            name: {"p50_us": round(statistics.median(v), 1), "mean_us": round(statistics.mean(v), 1), "n": len(v)}
            for name, v in parts.items()
            if v
        }


def schedtui_worker(url: str, steps: int, workflows: int, ceiling_url: str, breakdown: bool = False) -> dict[str, Any]:
    import asyncio

    from backend import Engine
    from backend.durable import DurableContext, define_durable
    from backend.durable.store import Finish, Progress, Write

    async def noop(i: int) -> int:
        return i

    async def body(ctx: DurableContext, input: Any) -> int:
        for i in range(steps):
            await ctx.step(f"s{i}", noop, i)
        return steps

    async def run() -> dict[str, Any]:
        engine = Engine([define_durable(name="bench", handler=body)], url, instance="bench", shutdown_grace=5)
        await engine.start()
        store: Any = engine.store
        write = store.durable_write
        checkpoints: list[float] = []
        finished: dict[str, asyncio.Future[None]] = {}

        async def timed(w: Write) -> Any:
            began = time.perf_counter()
            result = await write(w)
            if isinstance(w.then, Progress) and w.steps:
                checkpoints.append(time.perf_counter() - began)
            if isinstance(w.then, Finish) and w.id in finished:
                finished[w.id].set_result(None)
            return result

        store.durable_write = timed
        parts = Breakdown()
        if breakdown:
            parts.install()

        cpu: list[float] = []

        async def one() -> float:
            began, began_cpu = time.perf_counter(), time.process_time()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            started = await engine.durable.start_execution("bench")
            finished[started.id] = done
            await done
            cpu.append(time.process_time() - began_cpu)
            return time.perf_counter() - began

        # The same commits sent from the event loop, over the connection a checkpoint uses
        # (its statement prepared, its parameter as text), with nothing else to do: what
        # asyncio and that transport leave of the ceiling, before any engine work.
        from backend.store.postgres.lane import Lane

        async def nothing(conn: Any) -> None:
            pass

        floor = Lane(ceiling_url, "bench_floor", {"insert": "INSERT INTO bench_floor (n, at) VALUES (%s::bigint, now())"}, nothing)
        floor_n, floor_commits, floor_s = 0, 0, 0.0

        async def floor_batch(count: int) -> None:
            nonlocal floor_n, floor_commits, floor_s
            began = time.perf_counter()
            for _ in range(count):
                floor_n += 1
                await floor.call("insert", (b"%d" % floor_n,))
            floor_s += time.perf_counter() - began
            floor_commits += count

        if workflows:
            await one()  # warm-up
        checkpoints.clear()
        cpu.clear()
        ceiling = Ceiling(ceiling_url)
        ceiling.conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (n bigint PRIMARY KEY, at timestamptz NOT NULL)")
        assert await floor.open()
        await floor_batch(20)  # warm-up
        floor_commits, floor_s = 0, 0.0
        durations = []
        for _ in range(workflows):
            ceiling.batch(steps)  # blocks the loop: nothing of the engine's runs meanwhile
            await floor_batch(steps)
            parts.on = True
            durations.append(await one())
            parts.stamp("end")  # (not a step: the next workflow's first send is not this one's)
            parts.on = False
        await engine.stop()
        await floor.close()
        extra = {"breakdown": parts.summary()} if breakdown else {}
        return {"elapsed_s": sum(durations), "workflow_s": durations, "checkpoint_s": checkpoints, "cpu_s": sum(cpu),
                "floor_commits": floor_commits, "floor_s": floor_s, **ceiling.close(), **extra}  # fmt: skip

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------
# the DBOS worker (run with the temporary venv's Python; this file is read as a script)
# ---------------------------------------------------------------------------------------
DBOS_WORKER = """
from __future__ import annotations
import json, sys, time
from dbos import DBOS, DBOSConfig
from dbos._sys_db import SystemDatabase

url, steps, workflows, ceiling_url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

# CEILING

timings = {"record": [], "check": []}

def timed(name, key):
    original = getattr(SystemDatabase, name)
    def wrapper(self, *args, **kwargs):
        began = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            timings[key].append(time.perf_counter() - began)
    setattr(SystemDatabase, name, wrapper)

timed("record_operation_result", "record")
timed("check_operation_execution", "check")
config: DBOSConfig = {"name": "bench", "system_database_url": url, "run_admin_server": False}
DBOS(config=config)

@DBOS.step()
def noop(i):
    return i

@DBOS.workflow()
def bench():
    for i in range(steps):
        noop(i)
    return steps

DBOS.launch()
if workflows:
    bench()  # warm-up
for values in timings.values():
    values.clear()
ceiling = Ceiling(ceiling_url)
durations = []
for _ in range(workflows):
    ceiling.batch(steps)
    t = time.perf_counter()
    bench()
    durations.append(time.perf_counter() - t)
DBOS.destroy()
print(json.dumps({"elapsed_s": sum(durations), "workflow_s": durations, "checkpoint_s": timings["record"],
                  "check_s": timings["check"], **ceiling.close()}))
"""


def install_dbos(folder: Path) -> Path:
    """A virtual environment with dbos==3.4.0; returns its Python."""
    venv = folder / "dbos-venv"
    log(f"installing dbos=={DBOS_VERSION} into a temporary venv ({venv})")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"dbos=={DBOS_VERSION}"], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return python


# ---------------------------------------------------------------------------------------
# the parent: databases, commit counts, figures
# ---------------------------------------------------------------------------------------
def xact_commit(dsn: str, database: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)).fetchone()
        return int(row[0]) if row else 0


def run_worker(command: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["SCHEDTUI_LOG_LEVEL"] = "WARNING"
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def baseline(server: Any, name: str, command: list[str], steps: int) -> int:
    """Commits of the worker's process with no workflow: start-up, schema, background work."""
    return run_counted(server, name, command, steps, 0)[1]


def run_counted(server: Any, name: str, command: list[str], steps: int, workflows: int) -> tuple[dict[str, Any], int]:
    url = server.create_database(f"bench_{name}")
    database = url.rsplit("/", 1)[1].split("?")[0]
    before = xact_commit(server.dsn, database)
    ceiling_url = server.create_database("bench_ceiling")  # its commits are not the system's
    results = run_worker([*command, url, str(steps), str(workflows), ceiling_url])
    time.sleep(1.0)  # the stats collector: backends report their counters as they exit
    said = statements(server.dsn, database)
    if said is not None:
        results["statements"] = said
    return results, xact_commit(server.dsn, database) - before


def statements(dsn: str, database: str) -> list[tuple[int, int, float, str]] | None:
    """Every statement the database ran (calls, rows, ms, its text) when the server loads
    ``pg_stat_statements``; ``None`` otherwise."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
            return None
        rows = conn.execute(
            "SELECT s.calls, s.rows, s.total_exec_time, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 90) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "ORDER BY s.calls DESC",
            (database,),
        ).fetchall()
    return [(int(r[0]), int(r[1]), float(r[2]), str(r[3])) for r in rows]


def figures(results: dict[str, Any], commits: int, base: int, steps: int, workflows: int) -> dict[str, Any]:
    total_steps = steps * workflows
    ceiling = results["ceiling_commits"] / results["ceiling_s"] if results.get("ceiling_s") else None
    out: dict[str, Any] = {
        "steps_per_s": round(total_steps / results["elapsed_s"]),
        "ceiling_commits_per_s": round(ceiling) if ceiling else None,
        "ceiling_ratio": round(total_steps / results["elapsed_s"] / ceiling, 3) if ceiling else None,
        "workflow_ms": stats.summary_ms(results["workflow_s"], ("p50", "p99", "max")),
        "checkpoint_ms": stats.summary_ms(results["checkpoint_s"], ("p50", "p99", "max")),
        "checkpoints": len(results["checkpoint_s"]),
        # the warm-up workflow's commits are in the count: its steps are too
        "commits_per_step": round((commits - base) / (total_steps + steps), 3),
    }
    if results.get("floor_s") and ceiling:
        floor = results["floor_commits"] / results["floor_s"]
        out["async_floor_commits_per_s"] = round(floor)
        out["async_floor_to_ceiling"] = round(floor / ceiling, 3)
        out["async_floor_ratio"] = round(total_steps / results["elapsed_s"] / floor, 3)
    if "cpu_s" in results:  # the process's CPU (every thread) during the measured workflows
        out["cpu_us_per_step"] = round(results["cpu_s"] / total_steps * 1e6)
    if results.get("ceiling_cpu_s"):
        out["ceiling_cpu_us_per_commit"] = round(results["ceiling_cpu_s"] / results["ceiling_commits"] * 1e6)
    if "statements" in results:
        said, per = results["statements"], total_steps + steps
        out["statements_per_step"] = round(sum(r[0] for r in said) / per, 3)
        out["rows_per_step"] = round(sum(r[1] for r in said) / per, 3)
        out["exec_ms_per_step"] = round(sum(r[2] for r in said) / per, 4)
        out["statements"] = [{"calls": r[0], "rows": r[1], "ms": round(r[2], 1), "sql": r[3]} for r in said[:8]]
    if "breakdown" in results:
        out["step_breakdown"] = results["breakdown"]
    if "check_s" in results:
        steps_db = [a + b for a, b in zip(results["check_s"], results["checkpoint_s"], strict=False)]
        out["step_db_ms"] = stats.summary_ms(steps_db, ("p50", "p99", "max"))
    return out


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median steps/s, with every round's steps/s beside it; first, the
    median ratio to the ceiling over the rounds (whichever round it came from)."""
    ordered = sorted(rounds, key=lambda r: r["steps_per_s"])
    ratios = [r["ceiling_ratio"] for r in rounds]
    median = ordered[len(ordered) // 2]
    chosen = {"ceiling_ratio": sorted(ratios)[len(ratios) // 2]}
    chosen.update((key, value) for key, value in median.items() if key != "ceiling_ratio")
    chosen["rounds_ceiling_ratio"] = ratios
    chosen["rounds_steps_per_s"] = [r["steps_per_s"] for r in rounds]
    chosen["rounds_ceiling_commits_per_s"] = [r["ceiling_commits_per_s"] for r in rounds]
    if all("async_floor_to_ceiling" in r for r in rounds):
        chosen["rounds_async_floor_to_ceiling"] = [r["async_floor_to_ceiling"] for r in rounds]
        chosen["rounds_async_floor_ratio"] = [r["async_floor_ratio"] for r in rounds]
    return chosen


# ---------------------------------------------------------------------------------------
# the checkpoint statement alone, against the ceiling's INSERT (--fence)
# ---------------------------------------------------------------------------------------
def fence_costs(server: Any, rounds: int = 40, per_round: int = 100) -> dict[str, Any]:
    """What a step's checkpoint statement costs the server's round trip, apart from the
    engine: each variant sent ``per_round`` times in a row over a connection of its own like
    the checkpoint's (statement prepared, parameters as text) from one event loop, the
    variants interleaved round after round; per variant, its median commits/s and the
    median over the rounds of its rate over the one-row ``INSERT``'s of the same round.

    The variants: the ceiling's one-row ``INSERT``; the step's row alone (no fence); the
    checkpoint as schedtui sends it (``CHECKPOINT_FIRST``: the row inserted from the
    execution's row read ``FOR SHARE`` under its lease; its timestamps binary); the same
    with its timestamps as text (as it was sent before); the same read without the lock
    (*unsafe*: a take-over committing between its read and its commit would not stop it;
    shown for what the lock costs); and the general form (``CHECKPOINT``: a CTE, an upsert,
    the cancellation returned)."""
    import asyncio
    import statistics
    from datetime import UTC, datetime

    import psycopg

    from backend.store.postgres import durable as sql
    from backend.store.postgres.lane import Lane

    url = server.create_database("bench_fence", migrated=True)
    execution = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_floor (n bigint PRIMARY KEY, at timestamptz NOT NULL)")
        conn.execute(
            f"INSERT INTO {sql.EXECUTIONS} (id, function, status, input, created_at, updated_at, instance, lease) "
            "VALUES (%s, 'bench', 'running', 'null', now(), now(), 'bench', 7)",
            (execution,),
        )
    columns = sql.STEP_COLUMNS
    values = "%s::integer, %s::text, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, " \
        "%s::timestamptz, %s::text, %s::text, %s::text, %s::boolean"  # fmt: skip
    variants = {
        "insert": "INSERT INTO bench_floor (n, at) VALUES (%s::bigint, now())",
        "step_row": f"INSERT INTO schedtui_durable_steps (execution_id, {columns}) VALUES (%s, {values})",
        "checkpoint": sql.CHECKPOINT_FIRST,
        "checkpoint_text_times": sql.CHECKPOINT_FIRST,
        "checkpoint_unlocked": sql.CHECKPOINT_FIRST.replace("FOR SHARE OF e", ""),
        "checkpoint_general": sql.CHECKPOINT,
    }
    assert variants["checkpoint_unlocked"] != variants["checkpoint"]
    now = datetime.now(UTC).isoformat().encode()
    binary_now = sql._when(datetime.now(UTC))
    key = (execution.encode(), b"7")
    seq = 0

    def params(name: str) -> list[bytes | None]:
        nonlocal seq
        seq += 1
        if name == "insert":
            return [b"%d" % seq]
        row: list[bytes | None] = [b"%d" % seq, b"s%d" % seq, b"step", b"succeeded", b"1", now, now, None, b"1",
                                   None, None, b"f"]  # fmt: skip
        if name == "step_row":
            return [key[0], *row]
        if name == "checkpoint_general":
            return [*key, *row]
        if name == "checkpoint":  # its timestamps as it sends them: binary
            row[5] = row[6] = binary_now
        return [*row, *key]

    def formats(name: str) -> tuple[int, ...] | None:
        return sql._CHECKPOINT_FORMATS if name == "checkpoint" else None

    async def nothing(conn: Any) -> None:
        pass

    async def measure() -> dict[str, list[float]]:
        lanes = {name: Lane(url, f"bench_{name}", {"s": text}, nothing) for name, text in variants.items()}
        rates: dict[str, list[float]] = {name: [] for name in variants}
        try:
            for lane in lanes.values():
                assert await lane.open()
            for number in range(rounds + 1):  # the first round warms up (plans, caches)
                for name, lane in lanes.items():
                    began = time.perf_counter()
                    for _ in range(per_round):
                        result = await lane.call("s", params(name), formats(name))
                        assert name == "insert" or result.command_tuples == 1, name  # the fence let it through
                    if number:
                        rates[name].append(per_round / (time.perf_counter() - began))
        finally:
            for lane in lanes.values():
                await lane.close()
        return rates

    rates = asyncio.run(measure())
    out: dict[str, Any] = {"rounds": rounds, "per_round": per_round}
    for name, rate in rates.items():
        ratios = [a / b for a, b in zip(rate, rates["insert"], strict=True)]
        out[name] = {"commits_per_s": round(statistics.median(rate)), "of_insert": round(statistics.median(ratios), 3)}
    return out


# ---------------------------------------------------------------------------------------
# resume after SIGKILL / SIGSTOP, on real serve processes
# ---------------------------------------------------------------------------------------
RESUME_DEFINITIONS = """
    import asyncio, os
    from pathlib import Path
    from backend.durable import define_durable

    CALLS = Path({calls!r})

    async def step(n):
        with open(CALLS, "a") as f:
            f.write(f"{{n}} {{os.getpid()}} {{__import__('time').time()}}\\n")
        if n == 2 and os.environ.get("RESUME_HOLD"):
            await asyncio.sleep(3600)  # the first owner is stopped here
        return n

    async def work(ctx, input):
        for n in range(1, 5):
            await ctx.step(f"s{{n}}", step, n)

    resume = define_durable(name="resume", handler=work)
"""


def resume_after(server: Any, how: str, folder: Path) -> float:
    """Seconds from the owner's SIGKILL/SIGSTOP until another live instance runs the step."""
    import asyncio

    from backend import connect

    root = folder / f"resume-{how}"
    (root / "defs").mkdir(parents=True)
    calls = root / "calls.log"
    (root / "defs" / "resume.durable.py").write_text(textwrap.dedent(RESUME_DEFINITIONS.format(calls=str(calls))))
    url = server.create_database(f"resume_{how}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))

    def serve(name: str) -> subprocess.Popen[bytes]:
        hold = {"RESUME_HOLD": "1"} if name == "first" else {}
        return subprocess.Popen(
            [sys.executable, "-m", "console.cli", "serve", "--schedules", "defs", "--store", url, "--instance", name],
            cwd=root, env={**env, **hold}, stdout=subprocess.DEVNULL, stderr=(root / f"{name}.log").open("w"),
        )  # fmt: skip

    def lines() -> list[list[str]]:
        return [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []

    def wait(condition: Any, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.005)

    first = serve("first")
    try:
        wait(lambda: (root / "first.log").exists() and "starting 0 schedule" in (root / "first.log").read_text(), "first")

        async def start() -> None:
            async with connect(url) as st:
                await st.durable.start("resume")

        asyncio.run(start())
        wait(lambda: any(n == "2" for n, *_ in lines()), "the first owner to reach step 2")
        second = serve("second")
        try:
            wait(lambda: "starting 0 schedule" in (root / "second.log").read_text(), "second")
            time.sleep(1.0)  # the second instance is up and idle
            stopped_at = time.time()
            first.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGSTOP)
            if how == "sigkill":
                first.wait()  # reaped, as a supervisor would (a zombie's pid still looks alive)
            wait(lambda: sum(1 for n, *_ in lines() if n == "2") == 2, "the second instance to resume")
            resumed_at = float(next(t for n, pid, t in lines()[::-1] if n == "2"))
            return resumed_at - stopped_at
        finally:
            second.send_signal(signal.SIGINT)
            second.wait(30)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
        first.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--workflows", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per system; the median is shown")
    parser.add_argument("--skip-dbos", action="store_true")
    parser.add_argument("--skip-resume", action="store_true")
    parser.add_argument("--statements", action="store_true", help="load pg_stat_statements: statements per step")
    parser.add_argument("--fence", action="store_true", help="only the checkpoint statement alone against the INSERT")
    parser.add_argument("--breakdown", action="store_true", help="stamp where a step's time goes (its rates not to quote)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.worker == "schedtui":
        url, steps, workflows, ceiling_url = rest
        print(json.dumps(schedtui_worker(url, int(steps), int(workflows), ceiling_url, args.breakdown)))
        return 0

    from tests import pg

    dsn = os.environ.get("SCHEDTUI_BENCH_DSN")
    settings = ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_utility=off"]
    server = pg.PgServer(dsn=dsn) if dsn else pg.start_cluster(durable=True, settings=settings if args.statements else ())
    folder = Path(tempfile.mkdtemp(prefix="schedtui-bench-durable-"))
    try:
        with __import__("psycopg").connect(server.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            if args.statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        result: dict[str, Any] = {
            "benchmark": "durable",
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "postgresql": version},
            "workload": {"steps_per_workflow": args.steps, "workflows": args.workflows, "step": "no-op, returns its index"},
        }
        if args.fence:
            log("the checkpoint statement alone, interleaved with the ceiling's INSERT")
            result["fence"] = fence_costs(server)
            print(json.dumps(result, indent=2))
            return 0
        systems = {"schedtui": [sys.executable, "-m", "tests.bench.durable", "--worker", "schedtui",
                                *(["--breakdown"] if args.breakdown else [])]}  # fmt: skip
        if not args.skip_dbos:
            python = install_dbos(folder)
            script = folder / "dbos_worker.py"
            script.write_text(DBOS_WORKER.replace("# CEILING\n", inspect.getsource(Ceiling)))
            systems["dbos"] = [str(python), str(script)]
        bases = {name: baseline(server, name, command, args.steps) for name, command in systems.items()}
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for number in range(1, args.rounds + 1):  # alternating: load on a shared machine hits both alike
            for name, command in systems.items():
                log(f"round {number}/{args.rounds}: {name}, {args.workflows} workflows of {args.steps} steps")
                results, commits = run_counted(server, name, command, args.steps, args.workflows)
                rounds[name].append(figures(results, commits, bases[name], args.steps, args.workflows))
                figure = rounds[name][-1]
                log(f"  {figure['steps_per_s']} steps/s; ceiling {figure['ceiling_commits_per_s']} commits/s; "
                    f"ratio {figure['ceiling_ratio']}; async floor {figure.get('async_floor_to_ceiling')} of the ceiling, "
                    f"steps {figure.get('async_floor_ratio')} of it")  # fmt: skip
        result["schedtui"] = median_round(rounds["schedtui"])
        if "dbos" in rounds:
            result["dbos"] = {"version": DBOS_VERSION, **median_round(rounds["dbos"])}
            result["steps_per_s_ratio"] = round(result["schedtui"]["steps_per_s"] / result["dbos"]["steps_per_s"], 2)
        if not args.skip_resume:
            log("resume after SIGKILL (a live instance takes over)")
            killed = resume_after(server, "sigkill", folder)
            log("resume after SIGSTOP (the frozen owner's lease expires)")
            frozen = resume_after(server, "sigstop", folder)
            result["resume_s"] = {"after_sigkill": round(killed, 2), "after_sigstop_lease_expiry": round(frozen, 2)}
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
