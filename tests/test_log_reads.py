"""Reading per-run logs: which attempt a job's log is, when a log stops being in flight, and
where a follower of a durable execution's log reads on from (embedded, on both stores).

Handlers here wait on events the test sets: a read happens while a handler is known to be
where the test wants it, never after a sleep."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock, Unavailable, define_durable, define_queue, define_schedule
from backend.durable.store import LOG_LINES


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Overrides conftest's: every engine of a test (a writer, a reader) shares this store."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def numbered(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"  line (\d{4})$", text, re.MULTILINE)]


# ---------------------------------------------------------------------------------------
# a job's newest attempt
# ---------------------------------------------------------------------------------------
async def test_a_jobs_log_is_its_running_attempts_then_its_last_ended_ones_even_silent(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    started, go_on = asyncio.Event(), asyncio.Event()

    async def pay(job: Any) -> None:
        if job.attempt == 1:
            print("<<attempt 1: declined>>")
            raise RuntimeError("declined")
        started.set()
        await go_on.wait()  # attempt 2 says nothing, then succeeds

    engine = make_engine([define_queue(name="pay", handler=pay, attempts=3)])
    await engine.start()
    sent = await engine.jobs.send("pay", None)
    await engine.quiesce()
    clock.advance(11)  # the retry's backoff
    await started.wait()
    await engine.run_logs.flush()  # attempt 1's log is in the store; attempt 2 has none
    log = await engine.run_logs.job_log(sent.id)
    assert (log.attempt, log.status, log.running, log.text, log.size) == (2, "running", True, "", 0)
    first = await engine.run_logs.job_log(sent.id, 1)
    assert first.text.startswith("<<attempt 1: declined>>\n") and first.status == "failed"
    go_on.set()
    await engine.quiesce()
    log = await engine.run_logs.job_log(sent.id)
    assert (log.attempt, log.status, log.running, log.text, log.size) == (2, "succeeded", False, "", 0)


# ---------------------------------------------------------------------------------------
# a run whose process is gone
# ---------------------------------------------------------------------------------------
async def test_a_log_is_not_in_flight_once_the_instance_running_it_is_gone(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    hold = asyncio.Event()

    async def handler(ctx: Any) -> None:
        print("<<before it went quiet>>")
        await hold.wait()

    runner = make_engine([define_schedule(name="long", cron="0 * * * *", timezone="UTC", handler=handler)])
    await runner.open()  # opened, not started (schedtui fire): it beats while its Run now runs
    run = await runner.run_now("long")
    await runner.quiesce(runs=False)

    async def cut_off(now: Any, *, force: bool = False) -> bool:
        raise Unavailable("cut off (test)")

    runner.registry.beat = cut_off  # type: ignore[method-assign]  # from now on, as if frozen, or killed
    await runner.run_logs.flush()
    reader = make_engine([])
    await reader.open()
    log = await reader.run_logs.run_log(run.id)
    assert log.running and log.text == "<<before it went quiet>>\n"
    clock.advance(31)  # past the take-over window (30 s), and past the 5 s a row not final settles
    log = await reader.run_logs.run_log(run.id)
    assert (log.status, log.running, log.text) == ("running", False, "<<before it went quiet>>\n")
    assert (await runner.run_logs.run_log(run.id)).running  # its own process: alive, whatever its heartbeat
    hold.set()


async def test_a_job_attempts_log_is_not_in_flight_once_its_instance_is_gone(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    started, hold = asyncio.Event(), asyncio.Event()

    async def work(job: Any) -> None:
        started.set()
        await hold.wait()

    worker = make_engine([define_queue(name="work", handler=work)])
    await worker.start()
    sent = await worker.jobs.send("work", None)
    await started.wait()
    reader = make_engine([])
    await reader.open()
    assert (await reader.run_logs.job_log(sent.id)).running
    await worker.store.forget_instance(worker.instance)  # as if its row were gone with it
    log = await reader.run_logs.job_log(sent.id)
    assert (log.attempt, log.status, log.running) == (1, "running", False)
    hold.set()


# ---------------------------------------------------------------------------------------
# following a durable execution's log past its window
# ---------------------------------------------------------------------------------------
async def test_following_a_durable_log_reads_on_where_it_stopped_as_its_window_slides(
    make_engine: Callable[..., Engine], store_url: str
) -> None:
    reached = [asyncio.Event() for _ in range(2)]
    go_on = [asyncio.Event() for _ in range(2)]

    async def flow(ctx: Any, input: Any) -> int:
        for n in range(450):
            ctx.log(f"line {n:04d}")
        await ctx.step("a", lambda: 1)
        reached[0].set()
        await go_on[0].wait()
        for n in range(450, 550):  # the window (500 lines) slides past the first lines
            ctx.log(f"line {n:04d}")
        await ctx.step("b", lambda: 2)
        reached[1].set()
        await go_on[1].wait()
        for n in range(550, 1150):  # more than a window: what the reader had not read leaves it
            ctx.log(f"line {n:04d}")
        await ctx.step("c", lambda: 3)
        return 1

    engine = make_engine([define_durable(name="flow", handler=flow)])
    await engine.start()
    started = await engine.durable.start_execution("flow", None)
    await reached[0].wait()
    first = await engine.run_logs.execution_log(started.id)
    assert first.running and numbered(first.text) == list(range(450))
    go_on[0].set()
    await reached[1].wait()
    second = await engine.run_logs.execution_log(started.id, after=first.size)
    assert second.running and second.size > first.size
    assert re.match(r"\d{4}-\d\d-\d\dT", second.text)  # at a line's start, with nothing left out
    assert numbered(first.text + second.text) == list(range(550))  # each line once, in order
    again = await engine.run_logs.execution_log(started.id, after=second.size)
    assert (again.text, again.size) == ("", second.size)
    go_on[1].set()
    await engine.quiesce()
    third = await engine.run_logs.execution_log(started.id, after=second.size)
    assert not third.running
    marker, rest = third.text.split("\n", 1)
    shown = numbered(rest)
    assert shown == list(range(shown[0], 1150)) and len(rest.splitlines()) == LOG_LINES
    if store_url.startswith("sqlite"):  # it deleted them: how many, it cannot tell
        what = "older lines may have been"
    else:  # it keeps them: counted
        what = f"{shown[0] - 550} lines"
    assert marker == f"[… {what} left out: a durable execution's log keeps its newest {LOG_LINES} lines …]"
    whole = await engine.run_logs.execution_log(started.id)
    assert whole.size == third.size and whole.text.endswith(rest)
