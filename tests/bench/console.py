"""Benchmark (not a test) of the console on a big ledger; prints JSON.

    python -m tests.bench.console [--schedules 1000] [--runs 1000000] [--presses 10] [--rounds 3]
                                  [--part all|ledger|boundary]

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
* ``rss_mb``: the process's resident memory after the first screen and at the end;
* ``keys_at_boundary``: another console, over a fleet of 1,000 schedules of which 700 fire
  every minute (:func:`boundary_fleet`), on an injected clock that the benchmark moves
  across minute boundaries at will (no minute of waiting each). At a boundary, the runs of
  every schedule due at it are written from outside (another instance firing them; ~8%
  fail, ~3% stay running, 15 schedules are left overdue); once the console has taken them
  (its refresh drawn: 700 rows changed), a key is pressed. In quiet time the clock moves
  to the middle of a minute instead, and the schedules table has caught its rows up (if
  shown: hidden, it waits to be shown again). Keys: the view switches ``2``..``7``, ``1``; the
  status filters ``/``, a word typed (``failed``, ``overdue``, ``disabled``, ``running``),
  enter, and esc clearing it. Per kind and case (``quiet``, ``boundary``), p50/p99/max of
  ``key_to_frame_ms``: from the key handed in to the first frame (the screen's update,
  rendered to terminal output as a terminal would get it) that shows what it does.

Targets: first screen <= 1.5 s, ``r`` to visible <= 300 ms, every key <= 100 ms (key and
runs shown, max; every kind at a boundary and in quiet time, max), RSS <= 200 MB. The
figures measured last, and those of the version before: README, Benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # the test extras have psutil but not types-psutil
from textual import events, on
from textual._compositor import CompositorUpdate
from textual.widgets import Input

from backend import Engine, Run, discover, open_store
from backend.client.embedded import EmbeddedBackend
from backend.clock import OffsetClock
from backend.cron import Cron
from backend.model import RunStatus, ScheduleView
from console.app import SchedtuiApp
from console.views.schedules import SchedulesView
from console.widgets import RunsTable, SchedulesTable, UpcomingLine
from tests.bench.ledger import build_ledger
from tests.bench.stats import summary_ms


def rss_mb() -> float:
    rss: int = psutil.Process().memory_info().rss
    return round(rss / 2**20, 1)


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


def press(app: SchedtuiApp, key: str, character: str | None = None) -> None:
    """A key as the terminal driver hands it in. (Pilot's press also waits for the whole
    process to look idle, which an engine firing on its own thread rarely does: it would
    measure the engine, not the key.)"""
    event = events.Key(key, character)
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
            await wait_until(lambda target=target: app.selected_name == target)
            keys.append(time.perf_counter() - t0)
            await wait_until(lambda target=target: view._detail is not None and view._detail[0] == target
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


# -- keys at a minute boundary ---------------------------------------------------------------

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Asia/Kolkata")
TEAMS = ("billing", "search", "mail", "reports", "etl", "ledger", "cache", "ads")
WORDS = ("failed", "overdue", "disabled", "running")
VIEW_KEYS = (("2", "timeline"), ("3", "jobs"), ("4", "durable"), ("5", "locks"), ("6", "audit"), ("7", "health"),
             ("1", "schedules"))  # fmt: skip


class FleetSpec:
    """One schedule of :func:`boundary_fleet` and what the other instance makes of it."""

    def __init__(self, i: int) -> None:
        kind = i % 10
        self.name = f"{TEAMS[i % len(TEAMS)]}-{('sync', 'export', 'digest', 'check')[i % 4]}-{i:04d}"
        self.zone = ZONES[i % len(ZONES)]
        self.every_minute = kind < 7
        self.cron = ("* * * * *" if self.every_minute else f"{i % 5}-59/5 * * * *" if kind == 7
                     else f"{i % 60} * * * *" if kind == 8 else f"{i % 60} {i % 24} * * *")  # fmt: skip
        self.enabled = i % 25 != 3
        self.neglected = self.every_minute and i % 50 == 10
        """No run since ten minutes before the start: overdue throughout."""
        self.status: RunStatus = "running" if self.every_minute and i % 37 == 5 else (
            "failed" if self.every_minute and i % 13 == 0 else "succeeded")
        self.parsed = Cron(self.cron, self.zone)


def boundary_fleet(folder: Path, count: int = 1000) -> list[FleetSpec]:
    """``count`` schedules in ``folder/schedules``: 70% every minute, the others every five
    minutes, hourly or daily, in five zones; one in 25 disabled in its definition."""
    specs = [FleetSpec(i) for i in range(count)]
    lines = ['"""Generated by tests/bench/console.py."""', "", "from backend import define_schedule", "", "",
             "async def noop(ctx):", "    pass", "", ""]  # fmt: skip
    for n, spec in enumerate(specs):
        lines.append(f"s{n:04d} = define_schedule(name={spec.name!r}, cron={spec.cron!r}, timezone={spec.zone!r}, "
                     f"handler=noop, enabled={spec.enabled!r})")  # fmt: skip
    (folder / "schedules").mkdir(parents=True, exist_ok=True)
    (folder / "schedules" / "fleet.cron.py").write_text("\n".join(lines) + "\n")
    return specs


class OtherInstance:
    """Fires the fleet from outside the console's process, as another instance would: a run
    at each due slot, written in one transaction."""

    def __init__(self, url: str, specs: list[FleetSpec]) -> None:
        self.url = url
        self.specs = specs
        self.store: Any = None
        self._ids = 0

    async def open(self) -> None:
        self.store = open_store(self.url)
        await self.store.open()

    async def close(self) -> None:
        await self.store.close()

    def _run(self, spec: FleetSpec, slot: datetime, status: RunStatus) -> Run:
        self._ids += 1
        done = status != "running"
        return Run(id=f"01ZZBOUNDARY{self._ids:014d}", name=spec.name, scheduled_at=slot, status=status,
                   trigger="self", coordination_outcome="single", instance="bench-other", fired_at=slot,
                   finished_at=slot + timedelta(milliseconds=120) if done else None,
                   error_tag="RuntimeError" if status == "failed" else None,
                   error_message="upstream said no" if status == "failed" else None)  # fmt: skip

    async def beat(self, at: datetime) -> None:
        """Its heartbeat (it fires: the console's engine leaves its running runs alone)."""
        await self.store.heartbeat("bench-other", socket.gethostname(), os.getpid(), at)

    async def fire(self, since: datetime, until: datetime) -> int:
        """A run for each schedule with a slot in (``since``, ``until``]; how many."""
        await self.beat(until)
        runs = []
        for spec in self.specs:
            if not spec.enabled or spec.neglected:
                continue
            slot = spec.parsed.latest(until)
            if slot > since:
                runs.append(self._run(spec, slot, spec.status))
        self.store.save_runs(runs)
        return len(runs)

    async def start(self, now: datetime) -> None:
        """Every schedule's newest slot before ``now`` fired (the neglected ones' ten minutes
        earlier: overdue from the start)."""
        runs = [self._run(spec, spec.parsed.latest(now - timedelta(minutes=10 if spec.neglected else 0)), spec.status)
                for spec in self.specs if spec.enabled]  # fmt: skip
        self.store.save_runs(runs)
        await self.beat(now)


class BoundaryApp(SchedtuiApp):
    """The console, saying which data its last drawn refresh had."""

    CSS_PATH = str(Path(sys.modules[SchedtuiApp.__module__].__file__ or "").with_name("console.tcss"))
    drawn: list[ScheduleView] = []

    @on(SchedtuiApp.Refreshed)
    def _drawn(self) -> None:
        self.drawn = self.views


class Frames:
    """The first frame, after a key, that shows what the key does: every screen update the
    app sends out is rendered to terminal output (headless, the app skips that part) and
    then the pending condition is checked."""

    def __init__(self, app: SchedtuiApp) -> None:
        self.pending: Any = None
        self.at: float | None = None
        original = app._display

        def display(screen: Any, renderable: Any) -> None:
            original(screen, renderable)
            if renderable is None or app._batch_count:
                return
            if isinstance(renderable, CompositorUpdate):
                renderable.render_segments(app.console)
            if self.pending is not None and self.pending():
                self.at, self.pending = time.perf_counter(), None

        app._display = display  # type: ignore[method-assign]  # notes each frame as it goes out

    async def key(self, app: SchedtuiApp, key: str, character: str | None, done: Any) -> float:
        """Press ``key``; seconds to the first frame drawn once ``done()`` holds."""
        self.at, self.pending = None, done
        t0 = time.perf_counter()
        press(app, key, character)
        await wait_until(lambda: self.at is not None, timeout=10)
        assert self.at is not None
        return self.at - t0


async def keys_at_boundary(folder: Path, count: int, rounds: int) -> dict[str, Any]:
    """See the module docstring (``keys_at_boundary``)."""
    specs = boundary_fleet(folder, count)
    url = f"sqlite:///{folder / 'fleet.db'}"
    clock = OffsetClock(0.0)
    # The console's own engine only reads (it is the other instance that fires): what is
    # measured is the console's work, on the clock both share.
    engine = Engine(discover(folder / "schedules"), url, instance="bench-console", clock=clock)
    backend = EmbeddedBackend(engine, arm=False, own_thread=True)
    other = OtherInstance(url, specs)
    await other.open()
    await other.start(clock.now())
    app = BoundaryApp(backend, clock, where="fleet.db", freeze_heap=True)
    app_frames = Frames(app)
    samples: dict[str, dict[str, list[float]]] = {"quiet": {}, "boundary": {}}
    changed: list[int] = []
    probe = next(spec for spec in specs if spec.every_minute and spec.enabled and not spec.neglected)

    def jump(to_boundary: bool) -> datetime:
        """The clock to 50 ms after the next minute boundary, or to the middle of a minute."""
        now = clock.now()
        start = now.replace(second=0, microsecond=0)
        target = start + timedelta(minutes=1, milliseconds=50) if to_boundary else start + timedelta(seconds=30)
        if target <= now:
            target += timedelta(minutes=1)
        clock.offset += target - now
        return now

    async def boundary() -> None:
        """Across a boundary; the other instance fires what is due; until the console has
        drawn the refresh that took the new runs."""
        before = jump(True)
        changed.append(await other.fire(before, clock.now()))
        slot = probe.parsed.latest(clock.now())

        def taken() -> bool:
            view = next((v for v in app.drawn if v.name == probe.name), None)
            return view is not None and view.last_run is not None and view.last_run.scheduled_at >= slot

        await wait_until(taken)

    async def quiet() -> None:
        jump(False)
        table = app.query_one(SchedulesTable)
        await wait_until(lambda: not table._stale or not table.shown)  # (hidden: it waits to be shown)
        await asyncio.sleep(0.3)  # an operator's pace; the boundary's work long done

    async def moment(case: str) -> None:
        await (boundary() if case == "boundary" else quiet())

    def note(case: str, kind: str, seconds: float) -> None:
        samples[case].setdefault(kind, []).append(seconds)

    try:
        async with app.run_test(size=(100, 30)):
            table = app.query_one(SchedulesTable)
            field = app.query_one("#filter", Input)
            await wait_until(lambda: table.row_count == count and app.drawn)
            for _ in range(rounds):
                for case in ("quiet", "boundary"):
                    for key, view_id in VIEW_KEYS:
                        await moment(case)
                        note(case, "switch", await app_frames.key(
                            app, key, key, lambda view_id=view_id: app.active_view_id == view_id))
                    for word in WORDS:
                        await moment("quiet")
                        note("quiet", "filter_open", await app_frames.key(
                            app, "slash", "/", lambda: field.display and field.has_focus))
                        await moment(case)
                        for n, letter in enumerate(word, 1):
                            note(case, "filter_type", await app_frames.key(
                                app, letter, letter, lambda typed=word[:n]: app.filter_text == typed))
                            await asyncio.sleep(0.08)  # typing
                        note(case, "filter_enter", await app_frames.key(
                            app, "enter", "\r", lambda: app.focused is table))
                        await moment(case)
                        note(case, "filter_clear", await app_frames.key(
                            app, "escape", "\x1b", lambda: app.filter_text == "" and table.row_count == count))
    finally:
        await other.close()
        await backend.close()
    return {
        "schedules": count,
        "every_minute": sum(1 for spec in specs if spec.every_minute),
        "rows_changed_per_boundary": round(statistics.median(changed)) if changed else None,
        "rounds": rounds,
        **{case: {kind: {"presses": len(values), **summary_ms(values, ("p50", "p99", "max"), 1)}
                  for kind, values in kinds.items()} for case, kinds in samples.items()},
    }  # fmt: skip


async def bench(folder: Path, schedules: int, runs: int, presses: int, part: str = "all", rounds: int = 3) -> dict[str, Any]:
    result: dict[str, Any] = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
    if part in ("all", "ledger"):
        result.update(await bench_ledger(folder, schedules, runs, presses))
    if part in ("all", "boundary"):
        result["keys_at_boundary"] = await keys_at_boundary(folder / "boundary", schedules, rounds)
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    at_boundary = result.get("keys_at_boundary")
    worst = [stats["max"] for case in ("quiet", "boundary") for stats in (at_boundary or {}).get(case, {}).values()]
    boundary_ok = at_boundary is None or (bool(worst) and max(worst) <= 100)
    result["targets_met"] = result.get("targets_met", True) and boundary_ok
    return result


async def bench_ledger(folder: Path, schedules: int, runs: int, presses: int) -> dict[str, Any]:
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
                await wait_until(lambda known=known: bool(runs_table.runs) and runs_table.runs[0].id not in known
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
    parser.add_argument("--rounds", type=int, default=3, help="rounds of keys at a minute boundary (and in quiet time)")
    parser.add_argument("--part", choices=("all", "ledger", "boundary"), default="all",
                        help="the big ledger's measures, the keys at a minute boundary, or both")
    parser.add_argument("--measure", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is None:
        # Build (or reuse) the ledger here, then measure in a fresh process, so that the
        # builder's memory is not counted as the console's.
        folder = Path(tempfile.mkdtemp(prefix="schedtui-bench-console-"))
        try:
            if args.part != "boundary":
                build_ledger(folder, args.schedules, args.runs)
            done = subprocess.run(
                [sys.executable, "-m", "tests.bench.console", "--measure", str(folder), "--schedules",
                 str(args.schedules), "--runs", str(args.runs), "--presses", str(args.presses),
                 "--rounds", str(args.rounds), "--part", args.part],
                check=False,
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the ledger's copy: 265 MB at the defaults
        return done.returncode
    print(json.dumps(asyncio.run(bench(Path(args.measure), args.schedules, args.runs, args.presses, args.part, args.rounds)),
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
