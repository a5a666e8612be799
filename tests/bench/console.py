"""Benchmark (not a test) of the console on a big ledger; prints JSON.

    python -m tests.bench.console [--schedules 1000] [--runs 1000000] [--presses 10]

A store with 1,000 schedules and 1,000,000 runs (tests/bench/ledger.py, cached between
runs), opened the way ``schedtui console`` opens it: an embedded backend whose engine runs
armed on a thread of its own. Measured, with the app headless at 100x30:

* ``first_screen_s``: from creating the backend and the app to the first complete screen
  (every schedule in the table, the selected schedule's runs, timeline and next fires);
* ``run_now_to_visible_ms``: from pressing ``r`` to the new run being on screen (median and
  worst of ``--presses``);
* ``keys_after_minute_boundary``: Down pressed every ~150 ms through the 8 s after a real
  minute boundary (when the schedules due at it fire and the table takes their new runs):
  ``key_ms`` from the press to the cursor on the next schedule, ``runs_shown_ms`` to that
  schedule's runs on screen, and ``ui_stall_max_ms``, the longest the UI's event loop was
  kept from running (a probe that sleeps 10 ms and measures how late it wakes);
* ``keys_after_every_schedule_fired``: the same, right after every one of the 1,000
  schedules got a new last run at once (a store written from outside, as at the top of an
  hour, the worst case);
* ``filter_cleared``: ``/`` and one schedule's name, then Escape (every row comes back):
  ``clear_ms`` from Escape to all the rows in the table, and ``ui_stall_max_ms``, which
  includes their first paint;
* ``rss_mb``: the process's resident memory after the first screen and at the end.

Targets: first screen <= 1.5 s, ``r`` to visible <= 300 ms, every key <= 100 ms (key and
runs shown, max), RSS <= 200 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from textual import events
from textual.widgets import Input

from backend import Engine, Run, discover, open_store
from backend.client.embedded import EmbeddedBackend
from console.app import SchedtuiApp
from console.views.schedules import SchedulesView
from console.widgets import RunsTable, SchedulesTable, UpcomingLine
from tests.bench.ledger import build_ledger
from tests.bench.stats import summary_ms


def rss_mb() -> float:
    return round(psutil.Process().memory_info().rss / 2**20, 1)


async def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("the console did not get there in time")
        await asyncio.sleep(0.002)  # a benchmark's poll: measuring, not synchronising


class StallProbe:
    """How late a 10 ms sleep on the UI's loop wakes up: the loop's longest freeze."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - t0 - 0.01)

    def __enter__(self) -> StallProbe:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def press(app: SchedtuiApp, key: str) -> None:
    """A key as the terminal driver hands it in. (Pilot's press also waits for the whole
    process to look idle, which an engine firing on its own thread rarely does: it would
    measure the engine, not the key.)"""
    event = events.Key(key, None)
    event.set_sender(app)
    assert app._driver is not None
    app._driver.send_message(event)


async def keys_through(app: SchedtuiApp, pilot: Any, seconds: float) -> dict[str, Any]:
    """Press Down every ~150 ms for ``seconds``; per press, the time to the cursor on the next
    schedule and to that schedule's runs on screen (wrapping to the top at the end)."""
    table = app.query_one(SchedulesTable)
    view = app.query_one(SchedulesView)
    keys, shown = [], []
    with StallProbe() as probe:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if table.cursor_row >= table.row_count - 1:
                press(app, "home")
                await wait_until(lambda: table.cursor_row == 0)
            target = list(table.views)[table.cursor_row + 1]
            t0 = time.perf_counter()
            press(app, "down")
            await wait_until(lambda: app.selected_name == target)
            keys.append(time.perf_counter() - t0)
            await wait_until(lambda: view._detail is not None and view._detail[0] == target
                             and app.query_one(RunsTable).runs == view._detail[2].runs)
            shown.append(time.perf_counter() - t0)
            await asyncio.sleep(max(0.0, 0.15 - (time.perf_counter() - t0)))  # an operator's pace
    return {"presses": len(keys), "key_ms": summary_ms(keys), "runs_shown_ms": summary_ms(shown),
            "ui_stall_max_ms": round(probe.worst * 1000, 1)}


async def filter_and_clear(app: SchedtuiApp, needle: str, total: int, times: int = 5) -> dict[str, Any]:
    """A schedule's name in the ``/`` filter (one row left), then Escape: from Escape to every row
    back in the table, and the longest the loop was held (the rows' first paint included)."""
    table = app.query_one(SchedulesTable)
    cleared = []
    with StallProbe() as probe:
        for _ in range(times):
            app.action_filter()  # the filter typed in (not measured)
            app.query_one("#filter", Input).value = needle
            await wait_until(lambda: table.row_count < total)
            await asyncio.sleep(0.15)  # an operator's pace
            t0 = time.perf_counter()
            press(app, "escape")
            await wait_until(lambda: table.row_count == total)
            cleared.append(time.perf_counter() - t0)
            await asyncio.sleep(0.3)
    return {"times": times, "clear_ms": summary_ms(cleared), "ui_stall_max_ms": round(probe.worst * 1000, 1)}


async def every_schedule_fires(store_url: str, names: list[str]) -> None:
    """From outside the console, as another instance would: a new run for every schedule."""
    store = open_store(store_url)
    await store.open()
    now = datetime.now(UTC)
    store.save_runs([
        Run(id=f"01ZZBENCH{n:017d}", name=name, scheduled_at=now, status="succeeded", trigger="self",
            coordination_outcome="single", instance="bench-other", fired_at=now, finished_at=now)
        for n, name in enumerate(names)
    ])
    await store.close()


async def bench(folder: Path, schedules: int, runs: int, presses: int) -> dict[str, Any]:
    ledger = build_ledger(folder, schedules, runs)  # already built: only the files are located
    rss_before = rss_mb()

    started = time.perf_counter()
    engine = Engine(discover(ledger.schedules_dir), ledger.store_url, instance="bench-console")
    backend = EmbeddedBackend(engine, arm=True, own_thread=True)
    app = SchedtuiApp(backend, where="state.db", freeze_heap=True)  # as `schedtui console` does
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
            # Just before the next minute boundary, then through it.
            await asyncio.sleep(max(0.0, 60 - time.time() % 60 - 0.5))  # waiting for the clock, not syncing
            result["keys_after_minute_boundary"] = await keys_through(app, pilot, 8.0)
            await every_schedule_fires(ledger.store_url, list(table.views))
            result["keys_after_every_schedule_fired"] = await keys_through(app, pilot, 5.0)
            result["filter_cleared"] = await filter_and_clear(app, list(table.views)[1], schedules)
            result["rss_mb_end"] = rss_mb()
    finally:
        await backend.close()
    keys_ok = all(
        (result.get(case) or {}).get(what, {}).get("max") is not None
        and result[case][what]["max"] <= 100
        for case in ("keys_after_minute_boundary", "keys_after_every_schedule_fired")
        for what in ("key_ms", "runs_shown_ms")
    )
    cleared = result.get("filter_cleared") or {}
    keys_ok = keys_ok and (cleared.get("clear_ms") or {}).get("max", 9999) <= 100 and cleared.get("ui_stall_max_ms", 9999) <= 100
    result["targets_met"] = (
        result.get("first_screen_s", 99) <= 1.5
        and result.get("run_now_to_visible_ms", {}).get("max", 9999) <= 300
        and keys_ok
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
        try:
            build_ledger(folder, args.schedules, args.runs)
            done = subprocess.run(
                [sys.executable, "-m", "tests.bench.console", "--measure", str(folder), "--schedules",
                 str(args.schedules), "--runs", str(args.runs), "--presses", str(args.presses)],
                check=False,
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the ledger's copy: 265 MB at the defaults
        return done.returncode
    print(json.dumps(asyncio.run(bench(Path(args.measure), args.schedules, args.runs, args.presses)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
