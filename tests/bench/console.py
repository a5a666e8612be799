"""Benchmark (not a test) of the console on a big ledger; prints JSON.

    python -m tests.bench.console [--schedules 1000] [--runs 1000000] [--presses 10]

A store with 1,000 schedules and 1,000,000 runs (tests/bench/ledger.py, cached between
runs), opened the way ``schedtui console`` opens it: an embedded backend whose engine runs
armed on a thread of its own. Measured, with the app headless at 100x30:

* ``first_screen_s``: from creating the backend and the app to the first complete screen
  (every schedule in the table, the selected schedule's runs, timeline and next fires);
* ``run_now_to_visible_ms``: from pressing ``r`` to the new run being on screen (median and
  worst of ``--presses``);
* ``rss_mb``: the process's resident memory after the first screen and at the end.

Targets: first screen <= 1.5 s, ``r`` to visible <= 300 ms, RSS <= 200 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from backend import Engine, discover
from backend.interface import EmbeddedBackend
from console.app import SchedtuiApp
from console.widgets import RunsTable, SchedulesTable, UpcomingLine
from tests.bench.ledger import build_ledger


def rss_mb() -> float:
    return round(psutil.Process().memory_info().rss / 2**20, 1)


async def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("the console did not get there in time")
        await asyncio.sleep(0.002)  # a benchmark's poll: measuring, not synchronising


async def bench(folder: Path, schedules: int, runs: int, presses: int) -> dict[str, Any]:
    ledger = build_ledger(folder, schedules, runs)  # already built: only the files are located
    rss_before = rss_mb()

    started = time.perf_counter()
    engine = Engine(discover(ledger.schedules_dir), ledger.store_url, instance="bench-console")
    backend = EmbeddedBackend(engine, arm=True, own_thread=True)
    app = SchedtuiApp(backend, where="state.db")
    result: dict[str, Any] = {"schedules": schedules, "runs": runs, "rss_mb_before_app": rss_before}
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one(SchedulesTable)
            runs_table = app.query_one(RunsTable)
            await wait_until(
                lambda: table.row_count == schedules
                and app.selected_name is not None
                and runs_table.runs
                and runs_table.runs[0].name == app.selected_name
                and app.query_one(UpcomingLine).slots
            )
            result["first_screen_s"] = round(time.perf_counter() - started, 3)
            result["rss_mb_first_screen"] = rss_mb()
            result["selected"] = app.selected_name
            result["selected_runs_shown"] = len(runs_table.runs)
            latencies = []
            for _ in range(presses):
                known = {r.id for r in runs_table.runs}
                t0 = time.perf_counter()
                await pilot.press("r")
                await wait_until(lambda: bool(runs_table.runs) and runs_table.runs[0].id not in known
                                 and runs_table.runs[0].trigger == "manual")
                latencies.append((time.perf_counter() - t0) * 1000)
                await app.workers.wait_for_complete()
            result["run_now_to_visible_ms"] = {
                "median": round(statistics.median(latencies), 1),
                "max": round(max(latencies), 1),
                "presses": presses,
            }
            result["rss_mb_end"] = rss_mb()
    finally:
        await backend.close()
    result["targets_met"] = (
        result.get("first_screen_s", 99) <= 1.5
        and result.get("run_now_to_visible_ms", {}).get("max", 9999) <= 300
        and result.get("rss_mb_end", 9999) <= 200
    )
    result["ledger_cached"] = ledger.cached
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.console", description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--presses", type=int, default=10)
    parser.add_argument("--measure", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is None:
        # Build (or reuse) the ledger here, then measure in a fresh process, so that the
        # builder's memory is not counted as the console's.
        folder = Path(tempfile.mkdtemp(prefix="schedtui-bench-console-"))
        build_ledger(folder, args.schedules, args.runs)
        done = subprocess.run(
            [sys.executable, "-m", "tests.bench.console", "--measure", str(folder), "--schedules", str(args.schedules),
             "--runs", str(args.runs), "--presses", str(args.presses)],
            check=False,
        )
        return done.returncode
    print(json.dumps(asyncio.run(bench(Path(args.measure), args.schedules, args.runs, args.presses)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
