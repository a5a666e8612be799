"""The demo keeps the set-up's promise: within a minute it shows every run status and every
coordination outcome a store of one machine can have, a job queue with a dead job, durable
executions (one waiting for an operator's signal) and a held lock, so that no view of the
console opens empty. Driven on the injected clock, as the console drives it (an armed
embedded backend, the platform played by a second instance)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

from backend import Engine
from backend.client.embedded import EmbeddedBackend
from backend.clock import ManualClock
from console.demo import BOUNCING, QUEUE, RELEASE, demo_engine, play_platform, run_now_at_start, seed_demo
from tests.servers import cli_env, until

#: Just past cpu-hog's slot at :45 (it burns two real seconds of CPU; the test turns it off
#: before its next one).
START = "2026-03-02T10:00:46Z"
#: Long enough for the bouncing mail's three attempts (retries after 10 s and 20 s).
SECONDS = 45


async def _advance(engines: list[Engine], clock: ManualClock, seconds: int) -> None:
    """Second by second; after each, the jobs and executions it started have ended (their
    handlers take tens of real milliseconds), the slow schedules' runs go on."""
    def settled() -> bool:
        return all(engine.jobs.idle and engine.durable.idle for engine in engines)

    for _ in range(seconds):
        clock.advance(1)
        for engine in engines:
            await engine.quiesce(runs=False)
        await until(settled, "the jobs and executions to settle")
        for engine in engines:
            await engine.quiesce(runs=False)


async def test_the_demo_shows_every_status_outcome_and_view_within_a_minute(tmp_path: Path) -> None:
    clock = ManualClock(START)
    await seed_demo(tmp_path, clock=clock)
    engine = demo_engine(tmp_path, clock=clock)
    backend = EmbeddedBackend(engine, arm=True)
    platform_engine = demo_engine(tmp_path, clock=clock, instance="demo-2")
    platform: asyncio.Task[None] | None = None
    try:
        await backend.connect()
        await platform_engine.open()
        platform = asyncio.ensure_future(play_platform(platform_engine))
        await run_now_at_start(backend)
        await backend.disable_schedule("cpu-hog", note="the test's real CPU")
        await _advance([engine, platform_engine], clock, SECONDS)

        runs = [run for s in (await backend.list_schedules()).schedules
                for run in (await backend.list_runs(s.name, limit=500)).runs]  # fmt: skip
        assert {run.status for run in runs} >= {"succeeded", "failed", "skipped", "missed", "running"}
        assert {run.coordination_outcome for run in runs} >= {"single", "wonLock", "external", "manual"}
        assert any(run.error_tag == "timeout" for run in runs)  # stuck-import's watchdog

        jobs = (await backend.list_jobs(QUEUE)).jobs
        dead = [job for job in jobs if job.status == "dead"]
        assert [(job.payload["to"], job.attempt) for job in dead] == [(BOUNCING, 3)]
        assert [job.key for job in jobs if job.status == "queued"] == ["newsletter"]  # an hour away
        queue = next(q for q in await backend.list_queues() if q.name == QUEUE)
        assert queue.dead == 1

        executions = {e.input["version"]: e for e in (await backend.list_executions(RELEASE)).executions}
        assert executions["2.3.9"].status == "succeeded"
        assert executions["2.3.9"].output == {"deployed": True, "approved_by": "ops"}
        waiting = executions["2.4.0"]
        assert (waiting.status, waiting.waiting_for) == ("waiting", "signal:approval")

        locks = (await backend.list_locks()).locks
        held = [(lock.name, lock.holder) for lock in locks if lock.holder is not None]
        assert held and held[0][0] == "search-index" and (held[0][1] or "").startswith("demo-1")

        # What the Durable view's `a` sends with its payload left empty: it deploys.
        await backend.signal_execution(waiting.id, "approval")
        await _advance([engine], clock, 1)
        done = await backend.get_execution(waiting.id)
        assert (done.status, done.output) == ("succeeded", {"deployed": True, "approved_by": None})
    finally:
        if platform is not None:
            platform.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await platform
        await platform_engine.stop(grace=0)
        await engine.stop(grace=0)
        await backend.close()


def test_the_headless_demo_says_what_it_runs_prints_firings_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """``schedtui demo --headless``, as the set-up gives it: a real process on the real
    clock, stopped as a user stops it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "demo", "--headless"], cwd=tmp_path, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert re.fullmatch(r"schedtui demo: 9 schedules, 1 job queue\(s\), 1 durable function\(s\), store \S+; "
                            r"Ctrl-C stops\n", first), first  # fmt: skip
        firing = process.stdout.readline()  # (the boot catch-up's or a timer's: every firing is printed)
        assert re.search(r" (✓ succeeded|✗ failed|⊘ missed|↷ skipped) ", firing), firing
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not (tmp_path / ".schedtui").exists(), "the demo's store is a temporary one"
