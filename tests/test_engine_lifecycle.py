"""An Engine's one life, as applications embed it: started once, on one loop, in one
process; an action after its stop, a stop during its start, a start cancelled halfway or a
fork after it neither runs unrecorded work nor leaves a lock behind. (Found by an outside
attack, each 3 of 3: a handler run after the stop, its caller told it failed; a stop that
returned while the start went on firing; a firing lock kept for the process's life.)"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backend import (
    Engine,
    EngineStopped,
    InUse,
    JobContext,
    RunContext,
    Unavailable,
    connect,
    define_queue,
    define_schedule,
)
from backend.clock import ManualClock
from backend.store.sqlite.store import SQLiteStore
from tests.servers import in_a_forked_child

MakeEngine = Callable[..., Engine]


def counting() -> tuple[list[Any], Any]:
    calls: list[Any] = []

    async def handler(ctx: RunContext) -> None:
        calls.append(ctx.scheduled_at)

    return calls, handler


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, store_url: str) -> str:
    return store_url if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


async def test_an_action_after_the_stop_runs_nothing_and_says_the_engine_stopped(any_store: str, clock: ManualClock) -> None:
    calls, handler = counting()
    engine = Engine([define_schedule(name="tick", cron="0 0 1 1 *", timezone="UTC", handler=handler)], any_store,
                    clock=clock, instance="one", shutdown_grace=0)  # fmt: skip
    await engine.start()
    await engine.stop()
    for act in (lambda: engine.run_now("tick"), lambda: engine.start_backfill("tick", clock.now(), clock.now()),
                lambda: engine.fire_external("tick", allow_self=True), engine.start):  # fmt: skip
        with pytest.raises(EngineStopped, match=r"this engine has stopped \(an Engine runs once; make a new one"):
            await act()
    assert calls == []
    async with connect(any_store, definitions=[define_schedule(name="tick", cron="0 0 1 1 *", timezone="UTC",
                                                               handler=handler)]) as client:  # fmt: skip
        gone = client
    with pytest.raises(Unavailable):
        await gone.engine.run_now("tick")
    assert calls == []
    fresh = Engine([define_schedule(name="tick", cron="0 0 1 1 *", timezone="UTC", handler=handler)], any_store,
                   clock=clock, instance="two", shutdown_grace=0)  # fmt: skip
    await fresh.start()  # a new engine runs (the old one let go of everything)
    try:
        run = await fresh.run_now("tick", wait=True)
        assert run.status == "succeeded" and len(calls) == 1
    finally:
        await fresh.stop()


async def test_a_stop_during_the_start_waits_for_it_then_stops(any_store: str, clock: ManualClock) -> None:
    calls, handler = counting()
    for turns in (1, 2, 4, 7, 11):  # the stop lands at several points of the start (begun)
        engine = Engine([define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=handler)], any_store,
                        clock=clock, instance=f"e{turns}", shutdown_grace=0)  # fmt: skip
        starting = asyncio.create_task(engine.start())
        for _ in range(turns):
            await asyncio.sleep(0)
        await engine.stop()
        assert starting.done() and not engine.started, turns
        await starting
        before = len(calls)
        clock.advance(120)  # two slots: the stopped engine fires neither
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(calls) == before, turns


async def test_a_start_cancelled_halfway_lets_go_of_the_stores_firing_lock(store_url: str, clock: ManualClock) -> None:
    schedules = [define_schedule(name="tick", cron="* * * * *", timezone="UTC", handler=counting()[1])]
    for turns in range(0, 40, 2):
        engine = Engine(schedules, store_url, clock=clock, instance=f"cut{turns}", shutdown_grace=0)
        starting = asyncio.create_task(engine.start())
        for _ in range(turns):
            await asyncio.sleep(0)
        starting.cancel()
        try:
            await starting
        except asyncio.CancelledError:
            pass
        else:  # (started before the cancel landed)
            await engine.stop()
        await engine.stop()
        successor = Engine(schedules, store_url, clock=clock, instance=f"next{turns}", shutdown_grace=0)
        await successor.start()  # InUse before: the cancelled start's lock was kept for good
        await successor.stop()


def test_an_engine_started_on_a_loop_that_ended_is_refused_on_the_next(store_url: str) -> None:
    engine = Engine([define_queue(name="q", handler=lambda job: None)], store_url, instance="loops", shutdown_grace=0)
    asyncio.run(engine.start())  # (no stop: the loop ends under it)

    async def again() -> None:
        with pytest.raises(EngineStopped, match="this engine was started on another event loop \\(it has ended\\)"):
            await engine.start()
        with pytest.raises(EngineStopped, match="cannot send a job: this engine was started on another event loop"):
            engine.check_open("send a job")

    asyncio.run(again())


@pytest.mark.parametrize("handler_kind", ["def", "async def"])
@pytest.mark.parametrize("kind", ["generator", "async generator"])
async def test_a_handler_that_returns_a_generator_fails_its_run_and_its_job(
    make_engine: MakeEngine, clock: ManualClock, kind: str, handler_kind: str
) -> None:
    """An async job handler (run on a lane) that returned one was recorded ``succeeded``
    and its job deleted as done: the check was made on a call's own task only."""
    ran: list[str] = []

    def body() -> Any:
        if kind == "generator":
            def rows() -> Any:
                ran.append("body")
                yield 1
            return rows()

        async def rows_async() -> Any:
            ran.append("body")
            yield 1
        return rows_async()

    async def async_handler(ctx: Any) -> Any:
        return body()

    handler = async_handler if handler_kind == "async def" else (lambda ctx: body())
    engine = make_engine([define_schedule(name="export", cron="0 0 1 1 *", timezone="UTC", handler=handler),
                          define_queue(name="q", handler=handler, attempts=1)])  # fmt: skip
    await engine.start()
    run = await engine.run_now("export", wait=True)
    assert (run.status, run.error_tag) == ("failed", "TypeError")
    assert run.error_message is not None and run.error_message.startswith(
        f"the handler returned a{'n async' if kind != 'generator' else ''} generator, so its body never ran")
    sent = await engine.jobs.send("q", 1)
    await engine.quiesce()
    detail = await engine.jobs.get_job(sent.id)
    assert detail.job is not None and detail.job.status == "dead"  # not deleted as done
    assert [a.error_tag for a in detail.attempts] == ["TypeError"]
    assert ran == []


@pytest.mark.parametrize("handler_kind", ["def", "async def"])
async def test_a_handler_that_returns_a_coroutine_it_did_not_await_has_it_awaited(
    make_engine: MakeEngine, clock: ManualClock, handler_kind: str
) -> None:
    """``return send_mail(job)`` with its ``await`` left out: an async handler's run, and
    its job (on a lane), were recorded ``succeeded`` and the job deleted as done, with the
    work never done (a RuntimeWarning at most). The work is the awaitable, as it was for a
    plain def already: it is awaited, in the call's own context, under its deadline, and
    what it raises fails the call."""
    ran: list[tuple[str, Any]] = []

    async def work(what: str, payload: Any) -> str:
        await asyncio.sleep(0)  # (it waits once: a lane carries it on)
        ran.append((what, payload))
        if payload == "bad":
            raise ValueError("the work failed")
        return "done"

    def handler_for(what: str) -> Any:
        if handler_kind == "def":
            return lambda ctx: work(what, ctx.payload)

        async def handler(ctx: Any) -> Any:
            return work(what, ctx.payload)

        return handler

    engine = make_engine([
        define_schedule(name="mail", cron="0 0 1 1 *", timezone="UTC", handler=handler_for("run"), payload="p"),
        define_queue(name="q", handler=handler_for("job"), attempts=1),
    ])  # fmt: skip
    await engine.start()
    run = await engine.run_now("mail", wait=True)
    assert (run.status, run.error_tag) == ("succeeded", None), run
    good, bad = await engine.jobs.send("q", "good"), await engine.jobs.send("q", "bad")
    await engine.quiesce()
    assert sorted(ran) == [("job", "bad"), ("job", "good"), ("run", "p")]
    assert [a.status for a in (await engine.jobs.get_job(good.id)).attempts] == ["succeeded"]
    failed = await engine.jobs.get_job(bad.id)
    assert failed.job is not None and (failed.job.status, failed.job.error_tag, failed.job.error_message) == (
        "dead", "ValueError", "the work failed"
    )


def test_a_second_engine_of_one_process_on_one_sqlite_file_is_told_to_share_its_slots(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"

    async def main() -> None:
        first = Engine([], url, instance="first", shutdown_grace=0)
        await first.start()
        try:
            second = Engine([], url, instance="second", shutdown_grace=0)
            with pytest.raises(InUse) as refused:
                await second.start()
            assert str(refused.value).startswith(
                'refusing to fire: instance "first" of this same process already fires the schedules of the store')
            assert 'coordination="advisoryLock"' in str(refused.value)
        finally:
            await first.stop()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_engine_started_before_a_fork_refuses_the_child_and_keeps_serving_the_parent(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """gunicorn --preload with the engine started in the master: the child used the parent's
    connections (PostgreSQL: one session, two writers) and threads (SQLite: a writer that
    is not there: it hung), and ran the handler of a Run now no one recorded."""
    url = f"sqlite:///{tmp_path / 'state.db'}" if kind == "sqlite" else str(request.getfixturevalue("pg_url"))
    ran: list[int] = []

    async def tick(ctx: RunContext) -> None:
        ran.append(os.getpid())

    async def job(ctx: JobContext) -> None:
        pass

    loop = asyncio.new_event_loop()
    engine = Engine([define_schedule(name="tick", cron="0 0 1 1 *", timezone="UTC", handler=tick),
                     define_queue(name="q", handler=job)], url, instance="master", shutdown_grace=0)  # fmt: skip
    try:
        loop.run_until_complete(engine.start())
        sent = in_a_forked_child(lambda: engine.jobs.send("q", 1))
        assert sent.startswith("Unavailable: the store") and "before this process (" in sent, sent
        assert "open the engine (or connect()) after the fork" in sent
        fired = in_a_forked_child(lambda: engine.run_now("tick"))
        assert fired.startswith("BadInput: cannot fire \"tick\": this engine was started in process"), fired
        assert ran == []
        # The parent's sessions and threads are its own still.
        run = loop.run_until_complete(engine.run_now("tick", wait=True))
        assert run.status == "succeeded" and ran == [os.getpid()]
        assert loop.run_until_complete(engine.jobs.send("q", 2)).id
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()


def test_a_sqlite_store_whose_open_is_cancelled_leaves_no_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its writer thread was left running, or died of the cancelled answer it was to give
    (``InvalidStateError``)."""
    import threading

    url = tmp_path / "state.db"
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))

    async def main() -> None:
        SQLiteStore(url, create=True)  # (made by serve)
        made = SQLiteStore(url, create=True)
        await made.open()
        await made.close()
        before = {t.ident for t in threading.enumerate()}
        for turns in range(12):
            store = SQLiteStore(url)
            opening = asyncio.create_task(store.open())
            for _ in range(turns):
                await asyncio.sleep(0)
            opening.cancel()
            try:
                await opening
            except asyncio.CancelledError:
                pass
            else:
                await store.close()
        for _ in range(200):  # (a writer told to stop ends on its own thread)
            left = [t for t in threading.enumerate() if t.ident not in before and "sqlite" in t.name.lower()]
            if not left:
                break
            await asyncio.sleep(0.01)
        assert not left, left

    asyncio.run(main())
    assert died == []



async def test_a_start_refused_may_be_tried_again(store_url: str, clock: ManualClock) -> None:
    """The console (``--fire``) retries its start until the store lets it: a failed start
    leaves the engine as if never started."""
    first = Engine([], store_url, clock=clock, instance="first", shutdown_grace=0)
    second = Engine([], store_url, clock=clock, instance="second", shutdown_grace=0)
    await first.start()
    with pytest.raises(InUse):
        await second.start()
    await first.stop()
    await second.start()
    assert second.started
    await second.stop()


async def test_a_handler_that_fills_the_default_executor_does_not_hold_the_stop(store_url: str, clock: ManualClock) -> None:
    """A handler whose ``asyncio.to_thread`` calls never return filled the loop's default
    executor (five or six threads on a small machine), and the store's close, queued behind
    them there, never ran: the stop, and ``serve``, never ended. The engine's own blocking
    calls run on threads of their own."""
    import threading

    never = threading.Event()  # (set at the end: the threads it holds then return)
    began = asyncio.Event()

    async def hog(ctx: RunContext) -> None:
        calls = [asyncio.to_thread(never.wait) for _ in range(64)]
        began.set()
        await asyncio.gather(*calls)

    schedule = define_schedule(name="hog", cron="0 0 1 1 *", timezone="UTC", handler=hog)
    engine = Engine([schedule], store_url, clock=clock, instance="hog", shutdown_grace=0)
    await engine.start()
    try:
        await engine.run_now("hog", wait=False)
        await began.wait()
        await asyncio.sleep(0)  # (its calls are handed to the executor)
        await asyncio.wait_for(engine.stop(), 30)  # (without its own threads: for ever)
    finally:
        never.set()
