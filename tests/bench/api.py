"""HTTP inspect API benchmark: a real ``schedtui serve`` on a ledger of 1,000 schedules and
1,000,000 runs (the README's "Benchmarks" reports its numbers).

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.api                         # the full load; JSON on stdout
    python -m tests.bench.api --schedules 200 --runs 100000 --samples 300 --seconds 3

What it does:

1. builds (or reuses, see :mod:`tests.bench.ledger`) the ledger and copies it into a temp
   folder (the server writes to its store: heartbeats, firings of due schedules);
2. starts ``schedtui serve --host 127.0.0.1 --port 0 --token T`` as a subprocess on it and
   waits for its ``schedtui: serving http://...`` line;
3. latency, one client, sequential, on one keep-alive connection, after a warm-up that is
   not counted: ``GET /healthz`` (the floor: HTTP + client, no work), ``GET
   /inspect/schedules`` (every schedule with ``next_fire_at`` and ``last_run``), the first
   page of runs ``GET /inspect/schedules/runs?name=N&limit=50`` (N rotating over the
   schedules that have a full page), the page ``--deep-page`` (20) of a schedule with about
   1,000 runs, reached by walking ``before`` from the first page, and the very last page
   of the busiest schedule (its cursor read from the database);
4. throughput: ``--clients`` (8) asyncio tasks, each with its own ``httpx.AsyncClient``,
   hammer one endpoint for ``--seconds``; requests per second, latency under load, and the
   server's CPU time per request (psutil), so a client-bound result can be told apart
   from a server-bound one (client and server share this machine's cores).

Latencies are measured in the client, from sending the request to having read the body,
in milliseconds. Percentiles are nearest-rank. ``targets`` says whether each goal of the
issue is met: schedules list p99 <= 50 ms, runs page p99 <= 10 ms, the deep pages no slower
than the first (p50 within 20% or 0.5 ms, whichever is larger).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from tests.bench import stats  # noqa: E402
from tests.bench.ledger import BigLedger, build_ledger  # noqa: E402
from tests.servers import Server, cli_env, start_server  # noqa: E402

TARGET_SCHEDULES_P99_MS = 50.0
TARGET_RUNS_P99_MS = 10.0
PAGE = 50


def log(message: str) -> None:
    print(f"[bench-api {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summary_ms(samples_s: list[float]) -> dict[str, Any]:
    return {"n": len(samples_s), **stats.summary_ms(samples_s, ("p50", "p90", "p99", "max", "min", "mean"))}


class Target:
    """One request to measure: a path with query parameters, and what its body must hold."""

    def __init__(self, label: str, path: str, params: list[dict[str, str]], expect: int | None = None) -> None:
        self.label = label
        self.path = path
        self.params = params  # rotated through, one per request
        self.expect = expect

    def check(self, body: dict[str, Any]) -> None:
        if self.expect is None:
            return
        got = len(body["schedules"] if "schedules" in body else body["runs"])
        if got != self.expect:
            raise AssertionError(f"{self.label}: expected {self.expect} items, got {got}")


# ---------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------
def sequential(client: httpx.Client, target: Target, samples: int, warmup: int) -> dict[str, Any]:
    """Latency of ``samples`` requests one after another (after ``warmup`` uncounted ones)."""
    times: list[float] = []
    size = 0
    for i in range(warmup + samples):
        params = target.params[i % len(target.params)]
        t0 = time.perf_counter()
        response = client.get(target.path, params=params)
        body = response.content
        elapsed = time.perf_counter() - t0
        if response.status_code != 200:
            raise AssertionError(f"{target.label}: {response.status_code} {body[:300]!r}")
        if i == 0:
            target.check(json.loads(body))
            size = len(body)
        if i >= warmup:
            times.append(elapsed)
    return {"latency_ms": summary_ms(times), "response_bytes": size}


async def _hammer(url: str, headers: dict[str, str], target: Target, clients: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    start_measure = time.perf_counter() + warmup_s
    stop = start_measure + seconds
    times: list[float] = []
    errors = total = 0

    async def worker(k: int) -> None:
        nonlocal errors, total
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as client:
            i = k
            while True:
                t0 = time.perf_counter()
                if t0 >= stop:
                    return
                response = await client.get(target.path, params=target.params[i % len(target.params)])
                await response.aread()
                t1 = time.perf_counter()
                i += clients
                total += 1
                if response.status_code != 200:
                    errors += 1
                if t0 >= start_measure:
                    times.append(t1 - t0)

    await asyncio.gather(*(worker(k) for k in range(clients)))
    return {"times": times, "errors": errors, "total": total}


def concurrent(
    url: str, headers: dict[str, str], target: Target, clients: int, seconds: float, warmup_s: float, server_pid: int
) -> dict[str, Any]:
    import psutil  # type: ignore[import-untyped]  # the test extras have psutil but not types-psutil

    server = psutil.Process(server_pid)
    me = psutil.Process()
    # CPU is sampled around the whole run, warm-up included, and divided by every request.
    s0, c0, w0 = server.cpu_times(), me.cpu_times(), time.perf_counter()
    result = asyncio.run(_hammer(url, headers, target, clients, seconds, warmup_s))
    s1, c1, w1 = server.cpu_times(), me.cpu_times(), time.perf_counter()
    wall = w1 - w0
    n = len(result["times"])
    server_cpu = (s1.user + s1.system) - (s0.user + s0.system)
    client_cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": n,
        "errors": result["errors"],
        "rps": round(n / seconds, 1),
        "latency_ms": summary_ms(result["times"]),
        "server_cpu_pct": round(100 * server_cpu / wall, 1),
        "client_cpu_pct": round(100 * client_cpu / wall, 1),
        "server_cpu_ms_per_request": round(1000 * server_cpu / max(1, result["total"]), 3),
    }


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------
def deep_cursor(client: httpx.Client, name: str, page: int) -> tuple[str, int]:
    """Walk ``before`` from the first page to page ``page`` (1-based); returns its cursor and
    how far back it is (the number of newer runs)."""
    before: str | None = None
    for _ in range(page - 1):
        params = {"name": name, "limit": str(PAGE)}
        if before:
            params["before"] = before
        body = client.get("/inspect/schedules/runs", params=params).json()
        before = body["next_before"]
        if before is None:
            raise AssertionError(f"{name} has fewer than {page} pages")
    assert before is not None
    return before, (page - 1) * PAGE


def last_page_cursor(db: Path, name: str) -> tuple[str, int]:
    """The cursor whose page is the oldest full page of ``name`` (read from the database)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        total = conn.execute("SELECT count(*) FROM runs WHERE name = ?", (name,)).fetchone()[0]
        # ``before`` = the id just newer than the oldest PAGE runs.
        row = conn.execute(
            "SELECT id FROM runs WHERE name = ? ORDER BY id ASC LIMIT 1 OFFSET ?", (name, PAGE)
        ).fetchone()
        return row[0], total - PAGE - 1
    finally:
        conn.close()


def wait_settled(client: httpx.Client, server_pid: int, timeout: float = 60.0) -> float:
    """After boot the engine catches up every schedule: wait until the server idles."""
    import psutil

    proc = psutil.Process(server_pid)
    t0 = time.perf_counter()
    proc.cpu_percent(None)
    while time.perf_counter() - t0 < timeout:
        time.sleep(0.5)
        if proc.cpu_percent(None) < 15:
            break
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import psutil

    token = secrets.token_hex(24)  # token_urlsafe may start with "-", which argparse takes for an option
    headers = {"Authorization": f"Bearer {token}"}
    with tempfile.TemporaryDirectory(prefix="schedtui-bench-api-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        ledger: BigLedger = build_ledger(folder, args.schedules, args.runs, cache=not args.no_cache)
        log(f"ledger ready in {time.perf_counter() - t0:.1f}s ({'cached' if ledger.cached else 'built'}): {ledger.db_path}")

        env = cli_env(SCHEDTUI_LOG_LEVEL="WARNING")
        t0 = time.perf_counter()
        server: Server = start_server(
            folder,
            "--schedules", str(ledger.schedules_dir),
            "--store", ledger.store_url,
            "--token", token,
            "--instance", "bench-api",
            "--retention-days", "3650",
            env=env,
            timeout=180,
        )
        startup_s = time.perf_counter() - t0
        pid = server.process.pid
        log(f"server up in {startup_s:.2f}s at {server.url} (pid {pid})")
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                settle_s = wait_settled(client, pid)
                log(f"server settled after {settle_s:.1f}s")

                busy = [n for n, c in ledger.run_counts.items() if c > PAGE]
                deep_name = ledger.schedule_with_runs(args.deep_page * PAGE)
                deep_before, deep_offset = deep_cursor(client, deep_name, args.deep_page)
                busiest = ledger.busiest()
                last_before, last_offset = last_page_cursor(ledger.db_path, busiest)

                def runs_params(name: str, before: str | None = None) -> dict[str, str]:
                    return {"name": name, "limit": str(PAGE), **({"before": before} if before else {})}

                targets = {
                    "healthz": Target("healthz", "/healthz", [{}]),
                    "schedules": Target("schedules", "/inspect/schedules", [{}], expect=len(ledger.specs)),
                    "runs_first_page": Target(
                        "runs_first_page", "/inspect/schedules/runs", [runs_params(n) for n in busy], expect=PAGE
                    ),
                    "runs_deep_page": Target(
                        "runs_deep_page", "/inspect/schedules/runs", [runs_params(deep_name, deep_before)], expect=PAGE
                    ),
                    "runs_last_page_busiest": Target(
                        "runs_last_page_busiest", "/inspect/schedules/runs", [runs_params(busiest, last_before)], expect=PAGE
                    ),
                }
                samples = {
                    "healthz": args.samples,
                    "schedules": max(50, args.samples // 2),
                    "runs_first_page": args.samples,
                    "runs_deep_page": args.samples,
                    "runs_last_page_busiest": args.samples,
                }
                latency: dict[str, Any] = {}
                for key, target in targets.items():
                    log(f"latency: {key} ({samples[key]} requests)")
                    latency[key] = sequential(client, target, samples[key], warmup=max(10, samples[key] // 10))
                latency["runs_deep_page"].update(schedule=deep_name, page=args.deep_page, newer_runs=deep_offset,
                                                 schedule_runs=ledger.run_counts[deep_name])
                latency["runs_last_page_busiest"].update(schedule=busiest, newer_runs=last_offset,
                                                         schedule_runs=ledger.run_counts[busiest])
                latency["runs_first_page"]["schedules_rotated"] = len(busy)

            throughput: dict[str, Any] = {}
            for key in ("schedules", "runs_first_page", "runs_deep_page"):
                log(f"throughput: {key} ({args.clients} clients, {args.seconds}s)")
                throughput[key] = concurrent(
                    server.url, headers, targets[key], args.clients, args.seconds, args.warmup_seconds, pid
                )
            rss_mb = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
            ledger_summary = ledger.summary()
        finally:
            code = server.stop()
            server_log = server.log_text()
        if code != 0:
            log(f"server exited with {code}; its log:\n{server_log[-3000:]}")

    def p99(key: str) -> float:
        return float(latency[key]["latency_ms"]["p99"])

    def p50(key: str) -> float:
        return float(latency[key]["latency_ms"]["p50"])

    def as_fast(key: str) -> bool:
        return p50(key) <= max(p50("runs_first_page") * 1.2, p50("runs_first_page") + 0.5)

    return {
        "benchmark": "api",
        "load": {"schedules": args.schedules, "runs": args.runs, "page": PAGE, "deep_page": args.deep_page},
        "ledger": ledger_summary,
        "server": {
            "startup_s": round(startup_s, 2),
            "settle_s": round(settle_s, 2),
            "rss_mb": rss_mb,
            "exit_code": code,
            "log_warnings": sum(1 for line in server_log.splitlines() if " WARNING " in line or " ERROR " in line),
        },
        "latency": latency,
        "throughput": throughput,
        "targets": {
            "schedules_p99_ms": {"target": TARGET_SCHEDULES_P99_MS, "got": p99("schedules"),
                                 "met": p99("schedules") <= TARGET_SCHEDULES_P99_MS},
            "runs_first_page_p99_ms": {"target": TARGET_RUNS_P99_MS, "got": p99("runs_first_page"),
                                       "met": p99("runs_first_page") <= TARGET_RUNS_P99_MS},
            "runs_deep_page_p99_ms": {"target": TARGET_RUNS_P99_MS, "got": p99("runs_deep_page"),
                                      "met": p99("runs_deep_page") <= TARGET_RUNS_P99_MS},
            "deep_as_fast_as_first": {
                "first_p50": p50("runs_first_page"),
                "deep_p50": p50("runs_deep_page"),
                "last_page_busiest_p50": p50("runs_last_page_busiest"),
                "met": as_fast("runs_deep_page") and as_fast("runs_last_page_busiest"),
            },
        },
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "httpx": httpx.__version__,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=1000, help="sequential requests per runs endpoint (schedules: half as many)")
    parser.add_argument("--deep-page", type=int, default=20, help="which page the deep keyset page is (default 20)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per throughput run")
    parser.add_argument("--warmup-seconds", type=float, default=1.0)
    parser.add_argument("--no-cache", action="store_true", help="build the ledger afresh")
    args = parser.parse_args(argv)
    print(json.dumps(run(args), indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
