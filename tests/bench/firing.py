"""Firing benchmark: N every-second schedules, schedtui against APScheduler 3.

A benchmark, not a test (pytest does not collect it). Run it from the repository root::

    python -m tests.bench.firing                       # 1,000 schedules, 30 s, both contenders
    python -m tests.bench.firing --schedules 300 --seconds 20
    python -m tests.bench.firing --contender schedtui  # one contender only
    python -m tests.bench.firing --sweep               # N = 100, 300, 1000 (10 s each)
    python -m tests.bench.firing --contender schedtui --capture off     # per-run logs off (on by default)
    python -m tests.bench.firing --contender schedtui --handler-lines 2 # each handler logs 2 lines
    python tests/bench/firing.py ...                   # works too

The load: N schedules with the cron ``* * * * * *`` (six fields, leading seconds: every
second) in UTC, each with an async handler that does nothing but note ``time.time()`` at its
start. The lag of a firing is that start minus the slot it fired for (``ctx.scheduled_at``
for schedtui; for APScheduler the ``scheduled_run_time`` of the job's EXECUTED event).

Each contender runs in its own fresh child process (``--child``), so that its peak RSS is
its own and neither warms the other's imports or allocator; the parent collects each
child's JSON and prints one JSON document on stdout. Progress goes to stderr.

The measured window is whole seconds: a contender is started, and once every schedule is
armed (plus half a second, see MID_S), the window opens at the next whole second S and
covers the slots S, S+1, ..., S+D-1. ``expected`` is N x D; ``missed`` is every (schedule, slot) of the window that no
handler saw. schedtui runs on the real :class:`~backend.clock.SystemClock` against a fresh
SQLite store in a temporary folder, and its ledger is read back after a clean stop.

Per-run logs (the capture of what handlers log and print) are on, as in ``serve``;
``--capture off`` measures the engine without them. ``--handler-lines N`` makes each
handler log N INFO lines (after noting its start) to a logger no handler prints: with the
capture on they go to the run's log, so its writes are measured too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ importable
    sys.path.insert(0, str(REPO_ROOT))

from tests.bench import stats  # noqa: E402

CRON = "* * * * * *"
CONTENDERS = ("schedtui", "apscheduler3")
APSCHEDULER = "apscheduler>=3.10,<4"
SWEEP = (100, 300, 1000)
# After the window closes, wait this long before stopping, so the window's last slot has
# certainly been handled (and a contender that is late is not cut off mid-second).
SETTLE_S = 0.5
# The benchmark's own work (CPU sampling) happens this long before a whole second, away
# from the bursts it measures.
MID_S = 0.5


def log(message: str) -> None:
    print(f"[firing {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------
def summary_ms(lags_s: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/p99.9/max/min/mean of lags given in seconds, in milliseconds."""
    return stats.summary_ms(lags_s, ("p50", "p90", "p99", "p999", "max", "min", "mean"))


def analyse(
    observations: list[tuple[int, int, float]], names: int, start: int, seconds: int
) -> dict[str, Any]:
    """Firings, missed slots, duplicates and lags from (schedule index, slot, start time).

    ``slot`` is the whole-second epoch of the slot the firing was for; only slots in
    ``[start, start + seconds)`` count."""
    end = start + seconds
    seen: Counter[tuple[int, int]] = Counter()
    lags: list[float] = []
    per_slot: dict[int, list[float]] = defaultdict(list)
    for index, slot, began in observations:
        if start <= slot < end:
            seen[(index, slot)] += 1
            lag = began - slot
            lags.append(lag)
            per_slot[slot].append(lag)
    expected = names * seconds
    hit = sum(1 for index in range(names) for slot in range(start, end) if (index, slot) in seen)
    # Per second: the first handler's lag shows how late the scheduler woke up, the last
    # one's how long it took to start all N after waking.
    firsts = [min(v) for v in per_slot.values()]
    lasts = [max(v) for v in per_slot.values()]
    return {
        "firings": len(lags),
        "expected": expected,
        "missed": expected - hit,
        "duplicates": sum(c - 1 for c in seen.values() if c > 1),
        "lag_ms": summary_ms(lags),
        "first_of_second_lag_ms": summary_ms(firsts),
        "last_of_second_lag_ms": summary_ms(lasts),
        # Second by second (window order): the p99 of N x D firings is often set by a few
        # bad seconds, and these show which (e.g. every 5th: heartbeats).
        "per_second_p50_ms": [
            round(stats.percentile(sorted(per_slot[s]), 50) * 1000, 1) if per_slot[s] else None for s in range(start, end)
        ],
        "per_second_max_ms": [round(max(per_slot[s]) * 1000, 1) if per_slot[s] else None for s in range(start, end)],
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kib / 1024 if sys.platform != "darwin" else kib / 2**20, 1)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by each live thread of this process, by thread name."""
    try:
        import psutil  # type: ignore[import-untyped]  # the test extras have psutil but not types-psutil
    except ImportError:  # pragma: no cover - psutil is a test dependency
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, f"tid-{t.id}")
        out[name] = round(out.get(name, 0.0) + t.user_time + t.system_time, 3)
    return out


async def sleep_until(epoch: float) -> None:
    while (remaining := epoch - time.time()) > 0:
        await asyncio.sleep(remaining)


# ---------------------------------------------------------------------------------------
# schedtui
# ---------------------------------------------------------------------------------------
async def run_schedtui(n: int, seconds: int, *, capture: bool = True, lines: int = 0) -> dict[str, Any]:
    import logging
    import sqlite3

    import backend
    from backend import Engine, define_schedule
    from backend.api.server import freeze_startup_heap
    from backend.clock import SystemClock

    observations: list[tuple[int, int, float]] = []
    note = observations.append
    now = time.time
    index_of: dict[str, int] = {}

    said = logging.getLogger("bench.handler")
    said.setLevel(logging.INFO)  # reaches the root's handlers; the capture's takes it, the others drop it

    async def handler(ctx: Any) -> None:
        began = now()
        note((index_of[ctx.name], int(ctx.scheduled_at.timestamp()), began))
        for line in range(lines):
            said.info("%s: line %d of slot %s", ctx.name, line, ctx.scheduled_at)

    schedules = []
    for i in range(n):
        name = f"bench-{i:05d}"
        index_of[name] = i
        schedules.append(define_schedule(name=name, cron=CRON, timezone="UTC", handler=handler))

    options: dict[str, Any] = {} if capture else {"capture_logs": False}  # (older engines have no such option)
    with tempfile.TemporaryDirectory(prefix="schedtui-bench-") as folder:
        db = Path(folder) / "state.db"
        engine = Engine(
            schedules,
            f"sqlite:///{db}",  # an absolute path: sqlite:////tmp/.../state.db
            clock=SystemClock(),
            instance="bench",
            shutdown_grace=5,
            **options,
        )
        t0 = time.time()
        await engine.start()
        freeze_startup_heap()  # as `schedtui serve` does once its engine has started
        store = engine.store
        # Armed = every schedule has its slot in the timer heap and no catch-up is running.
        while not engine.armed:
            if time.time() - t0 > 120:
                raise RuntimeError("schedules not armed after 120 s")
            await asyncio.sleep(0.005)
        ready = time.time()
        start = math.floor(ready + MID_S) + 1
        end = start + seconds
        log(f"schedtui: {n} schedules armed in {ready - t0:.3f}s; window {start}..{end} ({seconds}s)")
        # CPU is sampled half-way between slots: reading it (psutil reads /proc) must not
        # delay a burst. [start - 0.5, end - 0.5) still holds D bursts.
        thread_cpu()  # warm up (imports psutil)
        await sleep_until(start - MID_S)
        cpu_before, threads_before = cpu_seconds(), thread_cpu()
        await sleep_until(end - MID_S)
        cpu_window = cpu_seconds() - cpu_before
        threads_after = thread_cpu()
        await sleep_until(end + SETTLE_S)
        stats_before_stop = dict(engine.stats)
        counts_before_stop = (getattr(engine.store, "rows_written", None), getattr(engine.store, "commits", None))
        t_stop = time.time()
        await engine.stop()
        stop_s = time.time() - t_stop
        rss = peak_rss_mb()

        conn = sqlite3.connect(db)
        try:
            lo, hi = start * 1_000_000, end * 1_000_000
            ledger_rows = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
            statuses = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
            window_statuses = dict(
                conn.execute(
                    "SELECT status, count(*) FROM runs WHERE scheduled_at >= ? AND scheduled_at < ? GROUP BY status",
                    (lo, hi),
                ).fetchall()
            )
        finally:
            conn.close()

    result = analyse(observations, n, start, seconds)
    result.update(
        {
            "ledger_missed_rows": statuses.get("missed", 0),
            "ledger_skipped_rows": statuses.get("skipped", 0),
            # After stop (includes the final flush); else as read just before stop.
            "ledger_rows_written": getattr(store, "rows_written", counts_before_stop[0]),
            "ledger_commits": getattr(store, "commits", counts_before_stop[1]),
            "ledger_rows": ledger_rows,
            "ledger_statuses": statuses,
            "ledger_window_statuses": window_statuses,
            "rss_mb": rss,
            "arm_s": round(ready - t0, 3),
            "stop_s": round(stop_s, 3),
            "cpu_s_window": round(cpu_window, 3),
            "cpu_us_per_firing": round(cpu_window * 1e6 / max(1, n * seconds), 1),
            "thread_cpu_s_window": {
                name: round(spent - threads_before.get(name, 0.0), 3) for name, spent in threads_after.items()
            },
            "engine_stats": stats_before_stop,
            "capture": capture,
            "handler_lines": lines,
            "run_log_writes": getattr(getattr(engine, "run_logs", None), "writes", None),
            "code": str(Path(backend.__file__).resolve().parent),
        }
    )
    return result


# ---------------------------------------------------------------------------------------
# APScheduler 3
# ---------------------------------------------------------------------------------------
async def run_apscheduler3(n: int, seconds: int) -> dict[str, Any]:
    from tests.bench.peers import ensure

    ensure(APSCHEDULER, "apscheduler")  # installed by the benchmark, never by the tests
    import apscheduler
    from apscheduler.events import (
        EVENT_JOB_ERROR,
        EVENT_JOB_EXECUTED,
        EVENT_JOB_MAX_INSTANCES,
        EVENT_JOB_MISSED,
    )
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.cron import CronTrigger

    # APScheduler passes the job no slot. The job notes its start; the executor then sends
    # one EXECUTED event per run, carrying the run's scheduled_run_time, in the order the
    # runs of that job started (an async job with no await finishes before the next run
    # of it starts). The k-th start of a job is paired with its k-th EXECUTED slot.
    starts: list[list[float]] = [[] for _ in range(n)]
    slots: list[list[float]] = [[] for _ in range(n)]
    events: Counter[str] = Counter()
    now = time.time

    async def job(i: int) -> None:
        starts[i].append(now())

    def listener(event: Any) -> None:
        if event.code == EVENT_JOB_EXECUTED:
            slots[int(event.job_id)].append(event.scheduled_run_time.timestamp())
        elif event.code == EVENT_JOB_MISSED:
            events["missed"] += 1
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            events["max_instances"] += 1
        elif event.code == EVENT_JOB_ERROR:
            events["error"] += 1

    scheduler = AsyncIOScheduler(timezone=UTC)
    scheduler.add_listener(
        listener, EVENT_JOB_EXECUTED | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR
    )
    for i in range(n):
        scheduler.add_job(
            job,
            CronTrigger(second="*", timezone=UTC),
            args=(i,),
            id=str(i),
            # None = no grace limit: a run is executed however late it is (3.11 accepts
            # None or a positive int; the default, 1 s, would drop runs later than that).
            misfire_grace_time=None,
            # coalesce=False: when several slots of a job are due at once, run every one of
            # them instead of only the newest (which would hide missed slots).
            coalesce=False,
            # The default of 1 skips a slot while the previous run is still going.
            max_instances=1000,
        )
    t0 = time.time()
    scheduler.start()
    ready = time.time()
    start = math.floor(ready + MID_S) + 1
    end = start + seconds
    log(f"apscheduler3: {n} jobs started in {ready - t0:.3f}s; window {start}..{end} ({seconds}s)")
    await sleep_until(start - MID_S)
    cpu_before = cpu_seconds()
    await sleep_until(end - MID_S)
    cpu_window = cpu_seconds() - cpu_before
    await sleep_until(end + SETTLE_S)
    scheduler.shutdown(wait=False)
    await asyncio.sleep(0.1)  # shutdown() is carried out on the loop
    rss = peak_rss_mb()

    observations: list[tuple[int, int, float]] = []
    unpaired = floor_disagrees = 0
    for i in range(n):
        unpaired += abs(len(starts[i]) - len(slots[i]))
        for began, slot in zip(starts[i], slots[i], strict=False):
            whole = round(slot)
            if math.floor(began) != whole:
                floor_disagrees += 1  # floor(start) would have been the wrong slot
            observations.append((i, whole, began))

    result = analyse(observations, n, start, seconds)
    result.update(
        {
            "missed_events": events["missed"],
            "max_instances_events": events["max_instances"],
            "error_events": events["error"],
            "unpaired_starts": unpaired,
            "floor_slot_disagreements": floor_disagrees,
            "rss_mb": rss,
            "arm_s": round(ready - t0, 3),
            "cpu_s_window": round(cpu_window, 3),
            "cpu_us_per_firing": round(cpu_window * 1e6 / max(1, n * seconds), 1),
            "settings": {
                "trigger": 'CronTrigger(second="*", timezone=UTC)',
                "misfire_grace_time": None,
                "coalesce": False,
                "max_instances": 1000,
                "jobstore": "memory",
                "executor": "AsyncIOExecutor",
            },
            "version": apscheduler.__version__,
        }
    )
    return result


# ---------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------
def child(contender: str, n: int, seconds: int, *, capture: bool = True, lines: int = 0) -> dict[str, Any]:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger().handlers[0].setLevel(logging.WARNING)  # the handlers' INFO lines are not printed
    if contender == "schedtui":
        result = asyncio.run(run_schedtui(n, seconds, capture=capture, lines=lines))
    else:
        result = asyncio.run(run_apscheduler3(n, seconds))
    return {"contender": contender, "pid": os.getpid(), **result}


def spawn(contender: str, n: int, seconds: int, *, capture: bool = True, lines: int = 0) -> dict[str, Any]:
    """Run one contender in a fresh interpreter and return its JSON."""
    try:
        import psutil

        psutil.cpu_percent(None)  # start a system-wide CPU measurement
    except ImportError:  # pragma: no cover
        psutil = None
    load_before = os.getloadavg()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "tests.bench.firing", "--child", contender]
    command += ["--schedules", str(n), "--seconds", str(seconds)]
    if contender == "schedtui" and (not capture or lines):
        command += ["--capture", "on" if capture else "off", "--handler-lines", str(lines)]
    log(f"running {contender}: {n} schedules for {seconds}s")
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True, timeout=seconds + 300
    )
    if done.returncode != 0:
        return {"contender": contender, "error": f"child exited with {done.returncode}"}
    printed = [line for line in done.stdout.splitlines() if line.strip()]
    result: dict[str, Any] = json.loads(printed[-1])
    result["host"] = {
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        # Whole machine, all cores, over the child's life: 100 = every core busy.
        "system_cpu_pct": psutil.cpu_percent(None) if psutil is not None else None,
    }
    return result


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if a is None or b is None:
        return None
    try:
        ratio: float = a["lag_ms"]["p99"] / b["lag_ms"]["p99"]
        return round(ratio, 3)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def compare(contenders: list[str], n: int, seconds: int, *, capture: bool = True, lines: int = 0) -> dict[str, Any]:
    results = {name: spawn(name, n, seconds, capture=capture, lines=lines) for name in contenders}
    doc: dict[str, Any] = {"load": {"schedules": n, "seconds": seconds, "cron": CRON}, **results}
    doc["ratio_p99"] = _ratio(results.get("schedtui"), results.get("apscheduler3"))
    doc["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000, help="how many schedules (default 1000)")
    parser.add_argument("--seconds", type=int, default=None, help="measured whole seconds (default 30; 10 with --sweep)")
    parser.add_argument("--contender", choices=(*CONTENDERS, "both"), default="both")
    parser.add_argument("--sweep", action="store_true", help=f"N = {', '.join(map(str, SWEEP))}; prints a list")
    parser.add_argument("--capture", choices=("on", "off"), default="on", help="schedtui's per-run logs (default on)")
    parser.add_argument("--handler-lines", type=int, default=0, metavar="N", help="INFO lines each handler logs (default 0)")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.schedules < 1 or (args.seconds is not None and args.seconds < 1):
        parser.error("--schedules and --seconds must be positive")

    if args.child:
        result = child(args.child, args.schedules, args.seconds or 30, capture=args.capture == "on", lines=args.handler_lines)
        print(json.dumps(result), flush=True)
        return 0
    contenders = list(CONTENDERS) if args.contender == "both" else [args.contender]
    if args.sweep:
        seconds = args.seconds or 10
        out: Any = [compare(contenders, n, seconds, capture=args.capture == "on", lines=args.handler_lines) for n in SWEEP]
    else:
        out = compare(contenders, args.schedules, args.seconds or 30, capture=args.capture == "on", lines=args.handler_lines)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
