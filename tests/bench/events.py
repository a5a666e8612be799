"""Live events benchmark (not a test); prints JSON.

    python -m tests.bench.events [--runs 200] [--gap 0.25] [--idle 150]

**Latency across instances.** Two real ``schedtui serve`` processes, A and B, on one
PostgreSQL database (a throwaway cluster with durable settings, or ``$SCHEDTUI_BENCH_DSN``).
An SSE client reads A's ``/inspect/events``. ``--runs`` times: Run now on B (``POST
/inspect/schedules/bench/fire``), then read A's stream until a ``runs bench`` signal after
which A's ledger shows that run (a signal of an earlier run's end does not count). The
latency is the signal's arrival at the client minus the run's ``fired_at`` (the handler's
start on B; one machine, one clock). Measured twice: with ``--gap`` seconds between one
signal and the next Run now (operators and schedules act now and then), and back to back
(the next Run now as soon as the signal came: every notification then waits out B's
pacing of one NOTIFY per 0.2 s).

**Requests of an idle console.** The console (headless, 120x32) on a RemoteBackend to A,
whose requests are counted at the transport, left alone for ``--idle`` seconds: once
polling (events off, as when the stream is down), once on the event stream (which counts
as one request however long it stays open). Reported per 5 seconds.

Targets: p99 under 300 ms; an idle console under 1 request per 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncGenerator
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ and tests/ importable
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from backend.client.remote import RemoteBackend  # noqa: E402
from tests.bench import stats  # noqa: E402

SCHEDULES = """
    from backend import define_schedule

    async def noop(ctx):
        pass

    bench = define_schedule(name="bench", cron="0 0 1 1 *", timezone="UTC", handler=noop)
    for i in range(30):
        globals()[f"s{i}"] = define_schedule(name=f"quiet-{i:02d}", cron="0 0 1 1 *", timezone="UTC", handler=noop)
"""
TOKEN = "bench=bench-secret"
SECRET = "bench-secret"


def log(message: str) -> None:
    print(f"[events {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_serve(folder: Path, store: str, instance: str) -> tuple[subprocess.Popen[str], str]:
    from tests.pg import die_with_parent

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["SCHEDTUI_TOKEN"] = TOKEN
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "serve", "--schedules", "schedules", "--store", store,
         "--instance", instance, "--port", "0"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=(folder / f"{instance}.log").open("w"), text=True,
        preexec_fn=die_with_parent,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("schedtui: serving "):
            return proc, line.split()[-1].strip()
    raise RuntimeError(f"serve {instance} did not start:\n{(folder / f'{instance}.log').read_text()}")


async def wait_listening(store: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(store, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'schedtui-listen' "
                "AND datname = current_database() AND query ILIKE 'LISTEN%%'"
            )
            row = await cur.fetchone()
            if row and row[0] >= 1:
                return
            await asyncio.sleep(0.05)  # a benchmark's poll of another process
    raise RuntimeError("A never listened")


async def latency(a_url: str, b_url: str, store: str, runs: int, gap: float) -> dict[str, Any]:
    reader = RemoteBackend(a_url, SECRET)
    stream = reader.changes()
    await anext(stream)  # ready: A has subscribed, and will LISTEN
    await wait_listening(store)
    samples: list[float] = []
    stale = 0
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with httpx.AsyncClient(base_url=b_url, headers=headers) as on_b, httpx.AsyncClient(
        base_url=a_url, headers=headers
    ) as on_a:
        for _ in range(runs):
            fired = (await on_b.post("/inspect/schedules/bench/fire")).json()["run"]
            fired_at = datetime.fromisoformat(fired["fired_at"].replace("Z", "+00:00")).timestamp()
            while True:
                batch = await asyncio.wait_for(anext(stream), 30)
                arrived = time.time()
                if ("runs", "bench") not in [(s.topic, s.name) for s in batch]:
                    continue
                page = (await on_a.get("/inspect/schedules/runs", params={"name": "bench", "limit": 1})).json()
                if page["runs"] and page["runs"][0]["id"] == fired["id"]:
                    samples.append(arrived - fired_at)
                    break
                stale += 1  # an earlier run's signal
            if gap:
                await asyncio.sleep(gap)
    assert isinstance(stream, AsyncGenerator)
    await stream.aclose()
    await reader.close()
    return {
        "runs": len(samples),
        "gap_s": gap,
        "latency_ms": stats.summary_ms(samples, ("p50", "p90", "p99", "max"), digits=1),
        "signals_of_earlier_runs": stale,
    }


class CountingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def idle_console(url: str, seconds: float, live: bool) -> dict[str, Any]:
    from console.app import SchedtuiApp

    transport = CountingTransport()
    backend = RemoteBackend(url, SECRET, transport=transport)
    app = SchedtuiApp(backend, refresh_interval=2.0, live_events=live)
    async with app.run_test(size=(120, 32)) as pilot:
        deadline = time.monotonic() + 30
        while not app.views and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.pause(2.0)  # the first screen, and the stream, settle
        before = len(transport.requests)
        await pilot.pause(seconds)
        during = transport.requests[before:]
    await backend.close()
    return {
        "mode": "events" if live else "polling",
        "seconds": seconds,
        "requests": len(during),
        "requests_per_5s": round(len(during) / seconds * 5, 3),
        "by_route": dict(sorted({r: during.count(r) for r in set(during)}.items())),
    }


async def bench(args: argparse.Namespace, folder: Path, store: str) -> dict[str, Any]:
    (folder / "schedules").mkdir()
    (folder / "schedules" / "bench.cron.py").write_text(textwrap.dedent(SCHEDULES))
    a, a_url = start_serve(folder, store, "a")
    b, b_url = start_serve(folder, store, "b")
    result: dict[str, Any] = {}
    try:
        log(f"A {a_url}, B {b_url}: {args.runs} runs with a {args.gap}s gap")
        result["paced"] = await latency(a_url, b_url, store, args.runs, args.gap)
        log(f"paced: {result['paced']['latency_ms']}; now back to back")
        result["back_to_back"] = await latency(a_url, b_url, store, args.runs, 0.0)
        log(f"back to back: {result['back_to_back']['latency_ms']}")
        if args.idle:
            result["idle_console"] = []
            for live in (False, True):
                log(f"idle console, {'events' if live else 'polling'}, {args.idle}s")
                result["idle_console"].append(await idle_console(a_url, args.idle, live))
    finally:
        for proc in (a, b):
            proc.send_signal(signal.SIGINT)
        for proc in (a, b):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between a signal and the next Run now")
    parser.add_argument("--idle", type=float, default=150.0, help="seconds of idle console per mode (0: skip)")
    args = parser.parse_args()

    from tests import pg

    dsn = os.environ.get("SCHEDTUI_BENCH_DSN")
    server = pg.PgServer(dsn=dsn) if dsn else pg.start_cluster(durable=True)
    try:
        store = server.create_database("events")
        with tempfile.TemporaryDirectory(prefix="schedtui-bench-events-") as tmp:
            result = asyncio.run(bench(args, Path(tmp), store))
    finally:
        server.stop()
    result["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    result["targets"] = {"latency_p99_ms": 300, "idle_console_requests_per_5s": 1}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
