"""A second Ctrl-C (``Engine.interrupt``) during a stop with a grace: the stop waits no
longer for anything in flight, in every part of the engine, not only the schedules' runs.

Before, it cut the runs short and nothing else: a stop with a job, a durable step, a
locked run still taking its lock or an alert POST in flight waited out its whole grace
(31.5 s of a 30 s grace in an outside test of ``serve``), though the log said "signal
again to stop waiting"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from backend import Engine, ManualClock, RunContext, define_durable, define_queue, define_schedule
from backend.alerts.notifier import AlertSettings
from backend.durable import DurableContext
from backend.jobs import JobContext
from backend.model import Run

GRACE = 3600.0  # a stop that waited it out would fail the test's own time limit


async def forever() -> None:
    await asyncio.Event().wait()


async def stop_then_interrupt(engine: Engine) -> None:
    """``stop(GRACE)``, then the second Ctrl-C once a part of the stop waits for what it
    has in flight; the stop must end."""
    within_grace = engine.loops.within_grace
    waiting = asyncio.Event()

    async def seen(aws: Any, grace: float) -> None:
        if aws:
            waiting.set()
        await within_grace(aws, grace)

    engine.loops.within_grace = seen  # type: ignore[method-assign]
    stopping = asyncio.ensure_future(engine.stop(GRACE))
    await asyncio.wait([stopping, asyncio.ensure_future(waiting.wait())], return_when=asyncio.FIRST_COMPLETED)
    assert not stopping.done(), "the stop did not wait for what was in flight"
    engine.interrupt()
    await asyncio.wait_for(stopping, 10)  # (the timeout only bounds a broken test)


async def test_a_job_in_flight(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    started = asyncio.Event()

    async def slow(job: JobContext) -> None:
        started.set()
        await forever()

    engine = make_engine([define_queue(name="q", handler=slow, attempts=3)])
    await engine.start()
    sent = await engine.jobs.send("q")
    await asyncio.wait_for(started.wait(), 10)
    await stop_then_interrupt(engine)
    again = make_engine([define_queue(name="q", handler=slow, attempts=3)])
    await again.open()
    found = await again.jobs.get_job(sent.id)
    assert [(a.status, a.error_tag) for a in found.attempts] == [("failed", "interrupted")]


async def test_a_durable_step_in_flight(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    started = asyncio.Event()

    async def step() -> None:
        started.set()
        await forever()

    async def code(ctx: DurableContext, input: Any) -> None:
        await ctx.step("slow", step)

    engine = make_engine([define_durable(name="d", handler=code)])
    await engine.start()
    execution = await engine.durable.start_execution("d")
    await asyncio.wait_for(started.wait(), 10)
    await stop_then_interrupt(engine)
    again = make_engine([define_durable(name="d", handler=code)])
    await again.open()
    assert (await again.durable.get(execution.id)).status == "queued"  # let go of, to run again


async def test_a_locked_run_taking_its_lock(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    asked = asyncio.Event()

    async def tick(ctx: RunContext) -> None:
        pass

    engine = make_engine([define_schedule(name="tick", cron="0 * * * *", timezone="UTC", handler=tick, lock="l")])
    await engine.start()
    acquire = engine.store.acquire_lock  # type: ignore[attr-defined]

    async def never_answers(*args: Any) -> Any:
        asked.set()
        await forever()
        return await acquire(*args)

    engine.store.acquire_lock = never_answers  # type: ignore[attr-defined]
    fired = asyncio.ensure_future(engine.run_now("tick"))
    await asyncio.wait_for(asked.wait(), 10)
    await stop_then_interrupt(engine)
    run: Run = await asyncio.wait_for(fired, 10)
    assert run.name == "tick"


async def test_an_alert_post_in_flight(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    posted = asyncio.Event()

    async def hangs(request: httpx.Request) -> httpx.Response:
        posted.set()
        await forever()
        return httpx.Response(200)

    async def fails(ctx: RunContext) -> None:
        raise RuntimeError("no")

    engine = make_engine(
        [define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)],
        alerting=AlertSettings(sinks=("https://hooks.example.test/x",), poll=1.0, timeout=GRACE / 2, lease=GRACE),
        alert_transport=httpx.MockTransport(hangs),
    )
    await engine.start()
    clock.set("2026-03-02T08:59:50Z")
    await engine.quiesce()
    clock.set("2026-03-02T09:00:00Z")
    await engine.quiesce()
    clock.advance(5)  # the round that sees the failure: its POST hangs
    waiting = asyncio.ensure_future(posted.wait())
    await asyncio.wait([waiting, asyncio.ensure_future(engine.quiesce())], return_when=asyncio.FIRST_COMPLETED)
    assert posted.is_set()
    await stop_then_interrupt(engine)
