"""A process that runs for weeks keeps no more objects than one that ran for minutes: what
each run, job, execution and lock leaves in memory is let go of once it is done.

On either store, an engine runs schedules every second (some failing, one locked), a queue that each of
their runs sends to (some attempts failing, retried), and a durable function started every
second, on the injected clock. After a warm-up, the objects Python holds are counted by
type; then twice over the same stretch of time again. A type whose count grows in both
stretches grows with the work done: a leak, which weeks would turn into an outage."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from collections import Counter
from typing import Any

import pytest

from backend import Engine, ManualClock, define_schedule
from backend.durable import DurableContext, define_durable
from backend.jobs import JobContext, define_queue

#: Seconds of the clock per stretch: 5 runs, a locked run, 5 jobs (some retried) and an
#: execution of three steps every second.
STRETCH = 120


async def _tick(ctx: Any) -> None:
    await ctx.jobs.send("mail", {"slot": ctx.scheduled_at.second})
    if ctx.scheduled_at.second % 5 == 0:
        raise RuntimeError("every fifth slot fails")


async def _locked(ctx: Any) -> None:
    pass


async def _deliver(job: JobContext) -> None:
    if job.attempt == 1 and job.payload["slot"] % 3 == 0:
        raise ConnectionError("the first attempt of every third fails")


async def _step(i: int) -> int:
    return i


async def _flow(ctx: DurableContext, input: Any) -> int:
    for i in range(3):
        await ctx.step(f"s{i}", _step, i)
    return 3


def _objects() -> Counter[str]:
    """The objects Python holds, by type; but for two kinds whose numbers follow real time,
    not the work done: weak references whose object is gone (the collector and their
    holders' callbacks clear them when they get to it) and cancelled timers (the event
    loop keeps each until its time comes or until enough pile up to purge them). On a
    loaded machine both rose over two stretches, with nothing leaking. A cancelled timer's
    context goes with it (each timer keeps a copy of its caller's: 26–30 more over a
    stretch in one CI run, the timers' own numbers excluded)."""
    gc.collect()
    objects = gc.get_objects()
    cancelled = [o for o in objects if type(o) is asyncio.TimerHandle and o.cancelled()]
    theirs = {id(getattr(timer, "_context", None)) for timer in cancelled}
    return Counter(
        type(o).__qualname__
        for o in objects
        if not (type(o) is weakref.ReferenceType and o() is None)
        and not (type(o) is asyncio.TimerHandle and o.cancelled())
        and not (type(o) is contextvars.Context and id(o) in theirs)
    )


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
async def test_what_runs_jobs_executions_and_locks_leave_in_memory_does_not_grow(
    request: pytest.FixtureRequest, where: str
) -> None:
    clock = ManualClock("2026-03-02T08:00:00Z")
    definitions = [
        *(define_schedule(name=f"tick{i}", cron="* * * * * *", timezone="UTC", handler=_tick) for i in range(5)),
        define_schedule(name="locked", cron="* * * * * *", timezone="UTC", handler=_locked, lock="nightly", lock_ttl=30),
        define_queue(name="mail", handler=_deliver, concurrency=4, attempts=2),
        define_durable(name="flow", handler=_flow),
    ]
    # Runs older than an hour are deleted: what the store keeps is bounded too.
    store = request.getfixturevalue("pg_url" if where == "postgres" else "store_url")
    engine = Engine(definitions, store, clock=clock, instance="long", retention=3600)
    await engine.start()

    async def run_for(seconds: int) -> None:
        for _ in range(seconds):
            clock.advance(1)
            await engine.durable.start_execution("flow")
            await engine.quiesce()

    try:
        await run_for(STRETCH)  # warm-up: caches, pools, first-time imports
        counts = [_objects()]
        for _ in range(2):
            await run_for(STRETCH)
            counts.append(_objects())
        done, _ = await engine.list_runs("tick0", limit=10)
        assert done and all(run.status != "running" for run in done[1:]), "the engine did its work"
    finally:
        await engine.stop(grace=0)
    first, second, third = counts
    growing = {
        kind: (first[kind], second[kind], third[kind])
        for kind in third
        if second[kind] - first[kind] > max(20, first[kind] // 20) and third[kind] - second[kind] > max(20, second[kind] // 20)
    }
    assert not growing, f"objects that grow with the work done (type: counts after each stretch): {growing}"
