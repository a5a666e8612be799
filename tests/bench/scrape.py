"""``GET /metrics`` benchmark: scrapes of a real server over a store of 1,000 schedules and
1,000,000 runs (the README's "Metrics" and "Benchmarks" report its numbers).

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.scrape                      # the full load; JSON on stdout
    python -m tests.bench.scrape --schedules 200 --runs 100000 --scrapes 20

What it does:

1. builds (or reuses, see :mod:`tests.bench.ledger`) the ledger and copies it into a temp
   folder; the engine runs its schedules as ``serve`` does (the ledger is topped up, so
   nothing is caught up), plus ``--queues`` queues holding ``--jobs`` jobs between them
   (queued, due in a day) and a durable function with a few executions, so that every
   family of the fleet has rows to count;
2. serves the API with ``backend.api.server.serve`` in this process (uvicorn on loopback,
   a read token) and scrapes it with one keep-alive client on the same event loop, so a
   scrape's time includes reading and parsing its body;
3. times ``--scrapes`` (50) scrapes in each case, after a warm-up that is not counted (the
   fleet's state is read in the background every 5 s meanwhile, as when serving):

   * ``fresh``: this instance has finished no run yet (as after a restart): the fleet's
     families (three series a schedule) and each schedule's counts at 0 (two more);
   * ``busy``: every schedule has finished runs here (a run count and a duration
     histogram per schedule: about seventeen series a schedule in all);

   each ``cached`` (nothing new since the last scrape) and ``new_snapshot`` (the fleet's
   state read again just before: ``FleetGauges.renew``, not timed, its time is
   ``background_refresh_ms``); ``busy`` also ``changed`` (a run finished since the last
   scrape), ``new_snapshot_changed`` (both) and ``new_snapshot_quarter_changed`` (a new
   snapshot, and a quarter of the schedules finished a run since: 1,000 schedules firing
   every minute, scraped every 15 s), the last both right before the scrape and a second
   or more before it (``…_a_second_ago``: rendered between scrapes by then);
4. the server's side alone: ``--scrapes`` renders of the last case without HTTP, while a
   task measures how late the event loop wakes it (every 10 ms): the lag a scrape and the
   background reads can add to firing, against the same measure while idle.

``--store postgres`` copies the ledger into a throwaway PostgreSQL database (``tests/pg.py``:
``$SCHEDTUI_TEST_DSN``, else a cluster of the machine's binaries) and serves from it.

Latencies are in milliseconds, nearest-rank percentiles. ``targets`` says whether each
case's p99 is under 50 ms (issue 23: "a scrape at 1,000 schedules under 50 ms").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from backend import Engine, define_durable, define_queue, discover_definitions  # noqa: E402
from backend.api.server import serve  # noqa: E402
from backend.client.embedded import EmbeddedBackend  # noqa: E402
from backend.model import Run, RunStatus  # noqa: E402
from backend.observability.fleet import FleetStore  # noqa: E402
from backend.observability.metrics import EngineMetrics  # noqa: E402
from tests.bench import stats  # noqa: E402
from tests.bench.ledger import build_ledger  # noqa: E402

TARGET_P99_MS = 50.0
READ_TOKEN = "bench-read-token"
LAG_EVERY = 0.010


def cpu_probe_ms() -> float:
    """A fixed piece of pure Python (a million additions), timed: how fast this machine runs
    Python now (a shared machine's load changes it several times over), to compare runs by."""
    started = time.perf_counter()
    total = 0
    for n in range(1_000_000):
        total += n
    return round((time.perf_counter() - started) * 1000, 1)


def log(message: str) -> None:
    print(f"[bench-scrape {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def noop_job(job: Any) -> None:
    pass


async def noop_flow(ctx: Any, input: Any) -> Any:
    await ctx.sleep("later", 86400)
    return input


class LagProbe:
    """How late the event loop wakes a task that asks to run every ``LAG_EVERY`` seconds."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_EVERY
            await asyncio.sleep(LAG_EVERY)
            self.lags.append(max(0.0, loop.time() - due))

    def start(self) -> None:
        self.lags = []
        self.task = asyncio.ensure_future(self._tick())

    async def stop(self) -> dict[str, Any]:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return {"n": len(self.lags), **stats.summary_ms(self.lags, ("p50", "p99", "max"))}


async def timed(scrape: Callable[[], Awaitable[httpx.Response]], before: Callable[[], Awaitable[None]], count: int,
                warmup: int) -> dict[str, Any]:  # fmt: skip
    samples: list[float] = []
    size = lines = 0
    for index in range(warmup + count):
        await before()
        started = time.perf_counter()
        response = await scrape()
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"GET /metrics answered {response.status_code}: {response.text[:200]}")
        if index >= warmup:
            samples.append(elapsed)
        size, lines = len(response.content), response.content.count(b"\n")
    return {"n": len(samples), "latency_ms": stats.summary_ms(samples, ("p50", "p90", "p99", "max", "min")),
            "bytes": size, "lines": lines}  # fmt: skip


async def copy_to_postgres(ledger_db: Path) -> tuple[str, Any]:
    """A throwaway PostgreSQL database (tests/pg.py) holding the ledger's runs and schedule
    states, migrated by the store itself; the runs copied with COPY."""
    import psycopg

    from backend import connect
    from tests.pg import provide

    server = provide()
    url = server.create_database(prefix="scrape")
    async with connect(url, create=True):
        pass
    source = sqlite3.connect(ledger_db)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def at(us: int | None) -> datetime | None:
        return None if us is None else epoch + timedelta(microseconds=us)

    columns = "id, name, scheduled_at, fired_at, finished_at, status, trigger, outcome, instance, error_tag, error_message"
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with conn.cursor() as cur, cur.copy(f"COPY schedtui_runs ({columns}) FROM STDIN") as copy:
            for row in source.execute(f"SELECT {columns} FROM runs"):
                await copy.write_row((row[0], row[1], at(row[2]), at(row[3]), at(row[4]), *row[5:]))
        for name, enabled, changed_by, changed_at, note in source.execute(
            "SELECT name, enabled, changed_by, changed_at, note FROM schedule_state"
        ):
            await conn.execute("INSERT INTO schedtui_schedule_state VALUES (%s, %s, %s, %s, %s)",
                               (name, bool(enabled), changed_by, at(changed_at), note))  # fmt: skip
        await conn.execute("ANALYZE")
        await conn.commit()
    source.close()
    return url, server


async def run(args: argparse.Namespace) -> dict[str, Any]:
    probe_before = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="schedtui-bench-scrape-") as tmp:
        log(f"ledger: {args.schedules} schedules, {args.runs} runs")
        ledger = build_ledger(Path(tmp), args.schedules, args.runs, cache=not args.no_cache)
        store_url = ledger.store_url
        if args.store == "postgres":
            log("copying the ledger into PostgreSQL")
            store_url, _ = await copy_to_postgres(ledger.db_path)
        queues = [define_queue(name=f"queue-{n}", handler=noop_job) for n in range(args.queues)]
        definitions = [*discover_definitions(ledger.schedules_dir).items, *queues,
                       define_durable(name="nightly-flow", handler=noop_flow)]  # fmt: skip
        engine = Engine(definitions, store_url, shutdown_grace=0)
        metrics = EngineMetrics(engine)
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        started = time.perf_counter()
        server = asyncio.ensure_future(
            serve(EmbeddedBackend(engine), port=0, read_token=READ_TOKEN, stop=stop, on_ready=ready.set_result, metrics=metrics)
        )
        url = await asyncio.wait_for(ready, 600)
        startup_s = time.perf_counter() - started
        try:
            for n in range(args.queues):
                per_queue = args.jobs // max(1, args.queues)
                for first in range(0, per_queue, 1000):
                    batch = [{"payload": {"n": i}, "delay": 86400} for i in range(first, min(per_queue, first + 1000))]
                    await engine.jobs.send_many(f"queue-{n}", batch)
            for n in range(args.executions):
                await engine.durable.start_execution("nightly-flow", {"n": n})

            snapshot_s = []
            for _ in range(20):
                t = time.perf_counter()
                now = datetime.now(UTC)
                await cast(FleetStore, engine.store).fleet_snapshot(
                    list(engine.schedules), now=now, live_after=now - timedelta(seconds=30), lock_now=None
                )
                snapshot_s.append(time.perf_counter() - t)

            headers = {"Authorization": f"Bearer {READ_TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:

                async def scrape() -> httpx.Response:
                    return await client.get("/metrics")

                refresh_s: list[float] = []

                async def fresh() -> None:
                    t = time.perf_counter()
                    await metrics.fleet.renew()
                    refresh_s.append(time.perf_counter() - t)

                async def cached() -> None:
                    pass

                names = list(engine.schedules)
                finished = [0]

                def finish(count: int) -> None:
                    for _ in range(count):
                        finished[0] += 1
                        now = datetime.now(UTC)
                        name = names[finished[0] % len(names)]
                        metrics.tallies.run_finished(Run(f"bench-{finished[0]}", name, now, "succeeded", "self", "single",
                                                         engine.instance, now - timedelta(seconds=3), now))  # fmt: skip

                async def one_finished() -> None:
                    finish(1)

                async def fresh_one_finished() -> None:
                    await fresh()
                    finish(1)

                async def fresh_many_finished() -> None:
                    await fresh()
                    finish(len(names) // 4)

                async def fresh_many_finished_a_second_ago() -> None:
                    # The same quarter, done a second or more before the scrape: rendered
                    # between scrapes by then, as when a burst of runs ends mid-interval.
                    await fresh()
                    rendered = metrics.next_render()
                    finish(len(names) // 4)
                    await rendered

                probe = LagProbe()
                probe.start()
                await asyncio.sleep(1.0)
                idle_lag = await probe.stop()

                cases: dict[str, Any] = {}
                log(f"fresh: {args.scrapes} scrapes cached, then with a new snapshot")
                await scrape()  # the first: waits for the first snapshot
                cases["fresh"] = {
                    "cached": await timed(scrape, cached, args.scrapes, 3),
                    "new_snapshot": await timed(scrape, fresh, args.scrapes, 3),
                }
                # Every schedule has run here, some more than once, with durations across the buckets.
                now = datetime.now(UTC)
                for index, name in enumerate(names):
                    for repeat in range(1 + index % 3):
                        took = timedelta(seconds=(0.05, 0.7, 3, 40, 200, 1000)[(index + repeat) % 6])
                        status: RunStatus = ("succeeded", "failed")[repeat % 2]
                        run = Run(f"seed-{index}-{repeat}", name, now, status, "self", "single", engine.instance, now - took, now)
                        metrics.tallies.run_finished(run)
                log(f"busy: {args.scrapes} scrapes cached, with a run finished since, with a new snapshot too, "
                    "with a new snapshot and a quarter of the schedules finished a run since")  # fmt: skip
                cases["busy"] = {
                    "cached": await timed(scrape, cached, args.scrapes, 3),
                    "changed": await timed(scrape, one_finished, args.scrapes, 3),
                    "new_snapshot_changed": await timed(scrape, fresh_one_finished, args.scrapes, 3),
                    "new_snapshot_quarter_changed": await timed(scrape, fresh_many_finished, args.scrapes, 3),
                    "new_snapshot_quarter_changed_a_second_ago": await timed(
                        scrape, fresh_many_finished_a_second_ago, args.scrapes, 3
                    ),
                }
            # The server's side alone (no HTTP, no client on the loop): the time a scrape
            # costs the server, and how late the loop wakes a task meanwhile (background
            # reads of the store included).
            log(f"server side: {args.scrapes} renders after a new snapshot and a quarter of the schedules finished a run")
            render_s: list[float] = []
            refresh_s.clear()
            probe.start()
            for _ in range(args.scrapes):
                await fresh_many_finished()
                t = time.perf_counter()
                await metrics.render()
                render_s.append(time.perf_counter() - t)
                await asyncio.sleep(0.05)  # the probe ticks between renders too
            render_lag = await probe.stop()
            quantiles = ("p50", "p99", "max")
            server_side = {"render_new_snapshot_quarter_changed_ms": {"n": len(render_s), **stats.summary_ms(render_s, quantiles)},
                           "background_refresh_ms": {"n": len(refresh_s), **stats.summary_ms(refresh_s, quantiles)},
                           "loop_lag_ms": {"idle": idle_lag, "while_refreshing_and_rendering": render_lag}}  # fmt: skip
            ledger_summary = ledger.summary()
        finally:
            stop.set()
            await server

    targets = {
        f"{case}_{kind}_p99_ms": {
            "target": TARGET_P99_MS,
            "got": result["latency_ms"]["p99"],
            "met": result["latency_ms"]["p99"] <= TARGET_P99_MS,
        }
        for case, kinds in cases.items()
        for kind, result in kinds.items()
    }
    load = os.getloadavg()
    return {
        "benchmark": "scrape",
        "store": args.store,
        "load": {"schedules": args.schedules, "runs": args.runs, "queues": args.queues, "jobs": args.jobs,
                 "executions": args.executions, "scrapes": args.scrapes},  # fmt: skip
        "ledger": ledger_summary,
        "startup_s": round(startup_s, 2),
        "snapshot_read_ms": {"n": len(snapshot_s), **stats.summary_ms(snapshot_s, ("p50", "p99", "max"))},
        "scrapes": cases,
        "server_side": server_side,
        "targets": targets,
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in load],
            "cpu_probe_ms": {"before": probe_before, "after": cpu_probe_ms()},
            "platform": platform.platform(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10_000, help="queued jobs, spread over the queues")
    parser.add_argument("--executions", type=int, default=100, help="durable executions (waiting)")
    parser.add_argument("--scrapes", type=int, default=50, help="timed scrapes per case")
    parser.add_argument("--no-cache", action="store_true", help="build the ledger afresh")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="postgres: the ledger copied into a throwaway PostgreSQL database (tests/pg.py)")  # fmt: skip
    args = parser.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # serve says where it listens: stdout is the JSON's
        result = asyncio.run(run(args))
    print(json.dumps(result, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
