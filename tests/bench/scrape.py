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
3. times ``--scrapes`` (50) scrapes in each case, after a warm-up that is not counted:

   * ``fresh``: this instance has finished no run yet (the counts are empty, as after a
     restart): the families are the fleet's (three series a schedule);
   * ``busy``: every schedule has finished runs here (a run count and a duration
     histogram per schedule: about seventeen series a schedule in all);

   each ``cold`` (the fleet's snapshot read again: the store's five statements, then the
   fleet's families rendered: what every scrape of a Prometheus scraping less often than
   the 5 s window gets) and ``warm`` (within the window); ``busy`` also ``changed`` (a
   run finished since the last scrape, so this instance's counts are rendered again: what
   a busy instance's scrapes get) and ``cold_changed`` (both);
4. the server's side alone: ``--scrapes`` renders of the ``busy`` ``cold_changed`` case
   without HTTP, while a task measures how late the event loop wakes it (every 10 ms):
   the lag a scrape can add to firing, against the same measure while idle.

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
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from backend import Engine, define_durable, define_queue, discover_definitions  # noqa: E402
from backend.api.server import serve  # noqa: E402
from backend.client.embedded import EmbeddedBackend  # noqa: E402
from backend.model import Run  # noqa: E402
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


async def timed(scrape: Callable[[], Awaitable[httpx.Response]], before: Callable[[], None], count: int, warmup: int) -> dict[str, Any]:
    samples: list[float] = []
    size = lines = 0
    for index in range(warmup + count):
        before()
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


async def run(args: argparse.Namespace) -> dict[str, Any]:
    probe_before = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="schedtui-bench-scrape-") as tmp:
        log(f"ledger: {args.schedules} schedules, {args.runs} runs")
        ledger = build_ledger(Path(tmp), args.schedules, args.runs, cache=not args.no_cache)
        queues = [define_queue(name=f"queue-{n}", handler=noop_job) for n in range(args.queues)]
        definitions = [*discover_definitions(ledger.schedules_dir).items, *queues,
                       define_durable(name="nightly-flow", handler=noop_flow)]  # fmt: skip
        engine = Engine(definitions, ledger.store_url, shutdown_grace=0)
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
                await engine.store.fleet_snapshot(  # type: ignore[attr-defined]
                    list(engine.schedules), live_after=datetime.now(UTC) - timedelta(seconds=30), lock_now=None
                )
                snapshot_s.append(time.perf_counter() - t)

            headers = {"Authorization": f"Bearer {READ_TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:

                async def scrape() -> httpx.Response:
                    return await client.get("/metrics")

                def cold() -> None:
                    metrics.fleet.read_at = None

                def warm() -> None:
                    pass

                names = list(engine.schedules)
                finished = [0]

                def one_finished() -> None:
                    finished[0] += 1
                    now = datetime.now(UTC)
                    name = names[finished[0] % len(names)]
                    metrics.tallies.run_finished(Run(f"bench-{finished[0]}", name, now, "succeeded", "self", "single",
                                                     engine.instance, now - timedelta(seconds=3), now))  # fmt: skip

                def cold_changed() -> None:
                    cold()
                    one_finished()

                probe = LagProbe()
                probe.start()
                await asyncio.sleep(1.0)
                idle_lag = await probe.stop()

                cases: dict[str, Any] = {}
                log(f"fresh: {args.scrapes} scrapes cold, then warm")
                cases["fresh"] = {
                    "cold": await timed(scrape, cold, args.scrapes, 3),
                    "warm": await timed(scrape, warm, args.scrapes, 3),
                }
                # Every schedule has run here, some more than once, with durations across the buckets.
                now = datetime.now(UTC)
                for index, name in enumerate(names):
                    for repeat in range(1 + index % 3):
                        took = timedelta(seconds=(0.05, 0.7, 3, 40, 200, 1000)[(index + repeat) % 6])
                        status = ("succeeded", "failed")[repeat % 2]
                        run = Run(f"seed-{index}-{repeat}", name, now, status, "self", "single", engine.instance, now - took, now)
                        metrics.tallies.run_finished(run)
                log(f"busy: {args.scrapes} scrapes cold, warm, changed, cold and changed")
                cases["busy"] = {
                    "cold": await timed(scrape, cold, args.scrapes, 3),
                    "warm": await timed(scrape, warm, args.scrapes, 3),
                    "changed": await timed(scrape, one_finished, args.scrapes, 3),
                    "cold_changed": await timed(scrape, cold_changed, args.scrapes, 3),
                }
            # The server's side alone (no HTTP, no client on the loop): the time a scrape
            # costs the server, and how late the loop wakes a task meanwhile.
            log(f"server side: {args.scrapes} renders, busy, cold and changed")
            render_s: list[float] = []
            probe.start()
            for _ in range(args.scrapes):
                cold_changed()
                t = time.perf_counter()
                await metrics.render()
                render_s.append(time.perf_counter() - t)
                await asyncio.sleep(0.05)  # the probe ticks between renders too
            render_lag = await probe.stop()
            server_side = {"render_busy_cold_changed_ms": {"n": len(render_s), **stats.summary_ms(render_s, ("p50", "p99", "max"))},
                           "loop_lag_ms": {"idle": idle_lag, "while_rendering": render_lag}}  # fmt: skip
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
    args = parser.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # serve says where it listens: stdout is the JSON's
        result = asyncio.run(run(args))
    print(json.dumps(result, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
