"""The handler runner and the timer wheel, alone and through the engine.

How a handler call ends is decided in one place (backend/runner.py): whatever a handler
raises fails its run and never the process; a deadline cancels async work and abandons a
stuck thread; threads are bounded; a handler that blocks the loop past its deadline is a
timeout; and every run's row is committed before its handler starts.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import DefinitionError, Engine, ManualClock, RunContext, Schedule, define_schedule, open_store
from backend.errors import describe_exception
from backend.runtime.loops import Loops
from backend.runtime.runner import COMPACT_AT, HandlerRunner, Invocation, Outcome
from backend.scheduler.timers import TimerWheel
from tests.conftest import all_runs
from tests.odd_exceptions import ODD_EXCEPTIONS, tag_of
from tests.servers import REPO, cli_env

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def schedule(handler: Any, name: str = "job", cron: str = "* * * * *", **kwargs: Any) -> Schedule:
    return define_schedule(name=name, cron=cron, timezone="UTC", handler=handler, **kwargs)


# ---------------------------------------------------------------------------------------
# the timer wheel: one armed entry per schedule, by construction
# ---------------------------------------------------------------------------------------
def test_arming_twice_for_one_slot_pops_the_schedule_once() -> None:
    wheel = TimerWheel()
    wheel.arm("a", at(1), at(2))
    wheel.arm("a", at(1), at(2))
    wheel.disarm("a")
    wheel.arm("a", at(1), at(2))  # disable + enable within the interval
    assert wheel.pop_due(at(1)) == [("a", at(1), at(2))]
    assert wheel.pop_due(at(5)) == []


def test_due_slots_pop_in_slot_order_whatever_the_arming_order() -> None:
    wheel = TimerWheel()
    for name, minute in (("late", 3), ("early", 1), ("middle", 2), ("early-too", 1)):
        wheel.arm(name, at(minute), at(minute + 10))
    assert [(name, slot) for name, slot, _ in wheel.pop_due(at(5))] == [
        ("early", at(1)), ("early-too", at(1)), ("middle", at(2)), ("late", at(3))
    ]


async def test_a_burst_of_several_slots_marks_its_latest(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    """The burst's starting mark covers every run it starts: its slot is the latest one."""
    engine = make_engine([schedule(nothing_with_ctx, name=f"at-{second}", cron=f"{second} * * * * *") for second in (2, 1, 3)])
    await engine.start()
    clock.advance(4)  # one wake: the three slots are due together, none is behind
    await engine.quiesce()
    assert [r.scheduled_at for r in await all_runs(engine, "at-1")] == [T0 + timedelta(seconds=1)]
    assert await engine.store.starting_marks() == {engine.instance: T0 + timedelta(seconds=3)}


def test_rearming_moves_the_entry() -> None:
    wheel = TimerWheel()
    wheel.arm("a", at(1), at(2))
    wheel.arm("b", at(1), at(2))
    wheel.arm("a", at(3), at(4))
    assert wheel.pop_due(at(2)) == [("b", at(1), at(2))]
    assert wheel.armed("a") == (at(3), at(4)) and len(wheel) == 2
    assert wheel.pop_due(at(3)) == [("a", at(3), at(4))]
    # Popped schedules stay armed at the slot they fired for, until re-armed or disarmed.
    assert wheel.armed("a") == (at(3), at(4)) and wheel.next_at() is None


# ---------------------------------------------------------------------------------------
# the runner alone
# ---------------------------------------------------------------------------------------
async def nothing() -> None:
    pass


async def nothing_with_ctx(ctx: RunContext) -> None:
    pass


class Call(Invocation):
    def __init__(self, max_runtime: float = 60, is_async: bool = True) -> None:
        super().__init__("call", timedelta(seconds=max_runtime), is_async)
        self.outcomes: list[Outcome] = []

    def begin(self, now: datetime) -> Any:
        super().begin(now)
        return "arg"

    def settled(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


async def test_a_call_is_settled_once_even_when_it_returns_after_its_timeout() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    release = threading.Event()

    def slow(arg: str) -> str:
        release.wait(10)
        return arg

    call = Call(max_runtime=5, is_async=False)
    runner.start(call, slow)
    await loops.quiesce(lambda: call.deadline is not None, nothing)  # begun, watchdog parked
    clock.advance(5)
    await loops.quiesce(lambda: call.done, nothing)
    assert runner.abandoned == 1
    release.set()
    assert call.task is not None
    await call.task
    assert [(o.status, o.error_tag) for o in call.outcomes] == [("failed", "timeout")]
    await loops.cancel_all()


async def test_a_succeeding_call_hands_back_its_value() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()

    async def echo(arg: str) -> str:
        return arg * 2

    call = Call()
    runner.start(call, echo)
    assert call.task is not None
    await call.task
    assert [(o.status, o.value) for o in call.outcomes] == [("succeeded", "argarg")]
    await loops.cancel_all()


async def test_a_call_run_here_ends_alone_when_it_is_cancelled_and_lets_its_callers_cancellation_through() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    entered = asyncio.Event()

    async def forever(arg: str) -> None:
        entered.set()
        await asyncio.Event().wait()

    async def caller(call: Call) -> str:
        await runner.run_here(call, forever)
        return "went on"

    aimed = Call()  # cancelled through the call (an operator's cancel, the watchdog): the caller goes on
    task = asyncio.ensure_future(caller(aimed))
    await entered.wait()
    aimed.cancel()
    assert await asyncio.wait_for(task, 5) == "went on"
    assert [(o.status, o.error_tag) for o in aimed.outcomes] == [("failed", "interrupted")] and aimed.has_ended

    entered.clear()
    outer = Call()  # the caller itself cancelled: the call is settled, and the caller stops too
    task = asyncio.ensure_future(caller(outer))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert [(o.status, o.error_tag) for o in outer.outcomes] == [("failed", "interrupted")] and outer.has_ended

    entered.clear()
    timed = Call(max_runtime=5)  # past its deadline: the watchdog ends the call, the caller goes on
    task = asyncio.ensure_future(caller(timed))
    await entered.wait()
    clock.advance(5)
    assert await asyncio.wait_for(task, 5) == "went on"
    assert [(o.status, o.error_tag) for o in timed.outcomes] == [("failed", "timeout")]
    assert not runner.in_flight
    await loops.cancel_all()


class Lane:
    """A lane's calls, handed on one after another; what the runner told it."""

    def __init__(self, runner: HandlerRunner, calls: list[Call], fn: Any) -> None:
        self.calls = list(calls)
        self.asked: list[Call] = []
        self.lost: list[Invocation] = []
        runner.start_lane(self.calls.pop(0), fn, self.successor, self.lost.append)

    def successor(self, ended: Invocation) -> Invocation | None:
        assert isinstance(ended, Call) and ended.has_ended and ended.done
        self.asked.append(ended)
        return self.calls.pop(0) if self.calls else None


async def test_a_lane_runs_its_calls_one_after_another_on_one_task_each_in_its_own_context() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    seen = contextvars.ContextVar("seen", default="nothing")
    tasks: list[asyncio.Task[Any] | None] = []
    values: list[str] = []

    async def handler(arg: str) -> str:
        values.append(seen.get())  # never what an earlier call of the lane set
        seen.set(f"call {len(values)}")
        tasks.append(asyncio.current_task())
        if len(values) % 2:
            await asyncio.sleep(0)  # one that waits, one that does not
        return seen.get()

    calls = [Call() for _ in range(5)]
    lane = Lane(runner, calls, handler)
    await asyncio.wait_for(loops.quiesce(lambda: all(c.has_ended for c in calls), nothing), 5)
    assert values == ["nothing"] * 5 and len(set(map(id, tasks))) == 1
    assert [[(o.status, o.value) for o in c.outcomes] for c in calls] == [[("succeeded", f"call {n}")] for n in range(1, 6)]
    assert lane.asked == calls and lane.lost == [] and seen.get() == "nothing"
    assert not runner.in_flight
    await loops.cancel_all()


async def test_calls_that_ended_in_time_are_not_kept_watched() -> None:
    """A long run of short calls (a queue's backlog) keeps the watched deadlines, and the
    calls they hold, to about those in flight: not every call until the first deadline."""
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()

    async def short(arg: str) -> None:
        pass

    calls = [Call(max_runtime=900) for _ in range(3000)]
    Lane(runner, calls, short)
    await asyncio.wait_for(loops.quiesce(lambda: calls[-1].has_ended, nothing), 5)
    assert all(c.outcomes[0].status == "succeeded" for c in calls)
    assert len(runner._deadlines) <= 2 * COMPACT_AT + 1
    await loops.cancel_all()


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_a_lane_call_cancelled_or_timed_out_ends_alone_and_the_lane_goes_on(how: str) -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    entered, waiting, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(arg: str) -> str:
        if not entered.is_set():
            entered.set()
            await asyncio.Event().wait()
        waiting.set()
        await release.wait()
        return "next"

    stuck, after = Call(max_runtime=5), Call(max_runtime=60)
    lane = Lane(runner, [stuck, after], handler)
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(loops.quiesce(lambda: stuck.deadline is not None, nothing), 5)
    if how == "cancelled":
        runner.stop_call(stuck, Outcome("failed", clock.now(), "interrupted", "stopped"))
    else:
        clock.advance(5)
    await asyncio.wait_for(waiting.wait(), 5)
    tag = "interrupted" if how == "cancelled" else "timeout"
    assert [(o.status, o.error_tag) for o in stuck.outcomes] == [("failed", tag)] and stuck.has_ended
    runner.stop_call(stuck, Outcome("failed", clock.now(), "interrupted", "again"))  # ended: reaches nothing now
    release.set()
    await asyncio.wait_for(loops.quiesce(lambda: after.has_ended, nothing), 5)
    assert [(o.status, o.value) for o in after.outcomes] == [("succeeded", "next")]
    assert lane.asked == [stuck, after] and lane.lost == []
    await loops.cancel_all()


# (A CancelledError the handler raises itself, nobody having cancelled it, is its own error:
# it was recorded `interrupted`, "the run was cancelled".)
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), ValueError("boom"), asyncio.CancelledError()])
@pytest.mark.parametrize("wait", [False, True])
async def test_whatever_a_lane_call_raises_fails_that_call_only(exc: BaseException, wait: bool) -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    ran = 0

    async def handler(arg: str) -> str:
        nonlocal ran
        ran += 1
        if wait:
            await asyncio.sleep(0)
        if ran == 1:
            raise exc
        return "fine"

    first, second = Call(), Call()
    Lane(runner, [first, second], handler)
    await asyncio.wait_for(loops.quiesce(lambda: second.has_ended, nothing), 5)
    assert [(o.status, o.error_tag) for o in first.outcomes] == [("failed", type(exc).__name__)]
    assert [(o.status, o.value) for o in second.outcomes] == [("succeeded", "fine")]
    await loops.cancel_all()


@pytest.mark.parametrize("when", ["in a call", "before it began"])
async def test_a_lane_cancelled_from_elsewhere_ends_its_call_and_says_so(when: str) -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()
    entered = asyncio.Event()

    async def forever(arg: str) -> None:
        entered.set()
        await asyncio.Event().wait()

    held, never = Call(), Call()
    lane = Lane(runner, [held, never], forever)
    task = held.task
    assert task is not None
    if when == "in a call":
        await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [(o.status, o.error_tag) for o in held.outcomes] == [("failed", "interrupted")] and held.has_ended
    assert lane.lost == [held] and lane.asked == [] and never.outcomes == []
    assert entered.is_set() == (when == "in a call") and not runner.in_flight
    await loops.cancel_all()


async def test_a_deadline_earlier_than_those_watched_wakes_the_watchdog_and_a_later_one_waits() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()

    async def forever(arg: str) -> None:
        await asyncio.Event().wait()

    calls = {seconds: Call(max_runtime=seconds) for seconds in (60, 5, 30)}
    for call in calls.values():  # each begins (and is watched) while the watchdog is parked
        runner.start(call, forever)

        def watched(call: Call = call) -> bool:
            return call.deadline is not None

        await asyncio.wait_for(loops.quiesce(watched, nothing), 5)
    for seconds in (5, 30, 60):
        clock.set(T0 + timedelta(seconds=seconds))

        def finished(seconds: int = seconds) -> bool:
            return calls[seconds].done

        await asyncio.wait_for(loops.quiesce(finished, nothing), 5)
        assert [s for s, call in calls.items() if call.done] == [s for s in calls if s <= seconds]
        assert calls[seconds].outcomes[0].error_tag == "timeout"
    await loops.cancel_all()


async def test_calls_one_after_another_do_not_pile_up_in_the_watchdogs_heap() -> None:
    clock = ManualClock(T0)
    loops = Loops(clock)
    runner = HandlerRunner(clock, loops)
    runner.open()

    async def quick(arg: str) -> str:
        return arg

    entered = asyncio.Event()

    async def waits(arg: str) -> None:
        entered.set()
        await asyncio.Event().wait()

    watched = Call(max_runtime=30)  # one call in flight all along: it must stay watched
    task = asyncio.ensure_future(runner.run_here(watched, waits))
    await entered.wait()
    for _ in range(1000):  # steps of a durable function: each awaited at once, none wakes the watchdog
        await runner.run_here(Call(), quick)
    assert len(runner._deadlines) <= 2 * COMPACT_AT
    assert watched in [entry[2] for entry in runner._deadlines]
    clock.advance(30)
    await asyncio.wait_for(task, 5)
    assert [(o.status, o.error_tag) for o in watched.outcomes] == [("failed", "timeout")]
    await loops.cancel_all()


# ---------------------------------------------------------------------------------------
# whatever a handler raises fails its run, never the process
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize(
    "exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), ValueError("boom"), StopIteration(), asyncio.CancelledError()]
)
async def test_any_exception_fails_the_run_and_the_next_slot_still_fires(
    make_engine: Callable[..., Engine], clock: ManualClock, kind: str, exc: BaseException
) -> None:
    # A sync handler's StopIteration (next() on an empty iterator) never reached the loop (a
    # future refuses it): its run stayed "running", its place held, for good. A coroutine's
    # is a RuntimeError (PEP 479).
    tag = "RuntimeError" if kind == "async" and isinstance(exc, StopIteration) else type(exc).__name__
    calls: list[datetime] = []

    async def async_handler(ctx: RunContext) -> None:
        calls.append(ctx.scheduled_at)
        if len(calls) == 1:
            raise exc

    def sync_handler(ctx: RunContext) -> None:
        calls.append(ctx.scheduled_at)
        if len(calls) == 1:
            raise exc

    engine = make_engine([schedule(async_handler if kind == "async" else sync_handler)])
    await engine.start()
    for _ in range(2):
        clock.advance(60)
        await engine.quiesce()
    runs = await all_runs(engine, "job")
    assert [(r.status, r.error_tag) for r in runs] == [("failed", tag), ("succeeded", None)]
    assert await engine.store.running_runs() == []


@pytest.mark.parametrize("odd", ODD_EXCEPTIONS, ids=tag_of)
def test_describing_an_exception_never_raises_and_tags_it_with_its_class(odd: type[BaseException]) -> None:
    try:
        raise odd()
    except BaseException as exc:  # noqa: BLE001 - the exception under test
        tag, message, trace = describe_exception(exc)
    assert tag == tag_of(odd)
    assert type(message) is str and message and type(trace) is str  # plain str: no method of theirs runs later
    assert trace.startswith("Traceback (most recent call last):") and "in test_describing" in trace


def test_an_exception_group_is_described_by_what_it_holds() -> None:
    """A TaskGroup's failure says only ``unhandled errors in a TaskGroup (1 sub-exception)``:
    its description names the exceptions inside (nested groups flattened), the first
    three, then how many more; odd ones inside are described as they would be alone."""

    class FakedExceptions(ExceptionGroup):
        @property
        def exceptions(self) -> Any:
            raise RuntimeError("no exceptions for you")

    def described(exc: BaseException) -> tuple[str, str]:
        try:
            raise exc
        except BaseException as raised:  # noqa: BLE001 - the exception under test
            tag, message, _ = describe_exception(raised)
        return tag, message

    one = ExceptionGroup("unhandled errors in a TaskGroup", [RuntimeError("broken")])
    assert described(one) == ("ExceptionGroup", "unhandled errors in a TaskGroup (1 sub-exception): RuntimeError: broken")
    nested = ExceptionGroup("outer", [ValueError("bad"), ExceptionGroup("inner", [KeyError("k"), OSError()]), TypeError("t")])
    assert described(nested) == ("ExceptionGroup", "outer (3 sub-exceptions): ValueError: bad; KeyError: 'k'; OSError; and 1 more")
    base = BaseExceptionGroup("stopping", [KeyboardInterrupt(), *(odd() for odd in ODD_EXCEPTIONS)])
    tag, message = described(base)
    assert tag == "BaseExceptionGroup" and message.startswith("stopping (9 sub-exceptions): KeyboardInterrupt; StrRaises;")
    assert message.endswith("; and 6 more")
    faked = FakedExceptions("faked", [RuntimeError("hidden")])
    assert described(faked) == ("FakedExceptions", "faked (1 sub-exception): RuntimeError: hidden")


async def test_a_handler_whose_task_group_failed_records_what_failed_inside(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    async def fetch(part: int) -> None:
        if part == 2:
            raise ConnectionError("part 2: the server hung up")
        await asyncio.Event().wait()  # cancelled by the group when part 2 fails

    async def handler(ctx: RunContext) -> None:
        async with asyncio.TaskGroup() as group:
            for part in range(3):
                group.create_task(fetch(part))

    engine = make_engine([schedule(handler)])
    await engine.start()
    clock.advance(60)
    await asyncio.wait_for(engine.quiesce(), 10)
    [run] = await all_runs(engine, "job")
    assert (run.status, run.error_tag) == ("failed", "ExceptionGroup")
    assert run.error_message == "unhandled errors in a TaskGroup (1 sub-exception): ConnectionError: part 2: the server hung up"


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("odd", ODD_EXCEPTIONS, ids=tag_of)
async def test_an_exception_that_cannot_be_described_still_fails_its_run_at_once(
    make_engine: Callable[..., Engine], clock: ManualClock, kind: str, odd: type[BaseException]
) -> None:
    """Its str(), repr(), class or traceback raise: the run is recorded failed as soon as
    the handler raised (not at its deadline), with the class's name as the error tag."""

    async def async_handler(ctx: RunContext) -> None:
        raise odd()

    def sync_handler(ctx: RunContext) -> None:
        raise odd()

    engine = make_engine([schedule(async_handler if kind == "async" else sync_handler, max_runtime=600)])
    await engine.start()
    clock.advance(60)
    await asyncio.wait_for(engine.quiesce(), 10)
    [run] = await all_runs(engine, "job")
    assert (run.status, run.error_tag, run.finished_at) == ("failed", tag_of(odd), clock.now())
    assert run.error_message
    assert await engine.store.running_runs() == []


@pytest.mark.parametrize("handler", ["async generator", "generator", "class", "string"])
def test_handlers_that_would_not_run_are_refused_at_definition(handler: str) -> None:
    async def agen(ctx: RunContext) -> Any:
        yield ctx

    def gen(ctx: RunContext) -> Any:
        yield ctx

    class Job:
        def __init__(self, ctx: RunContext) -> None:
            pass

    value = {"async generator": agen, "generator": gen, "class": Job, "string": "module:function"}[handler]
    with pytest.raises(DefinitionError, match="handler"):
        schedule(value)


def test_callable_objects_and_partials_are_accepted() -> None:
    class Job:
        async def __call__(self, ctx: RunContext) -> None:
            pass

    async def with_arg(extra: int, ctx: RunContext) -> None:
        pass

    assert schedule(Job()).is_async
    assert schedule(functools.partial(with_arg, 1)).is_async


# ---------------------------------------------------------------------------------------
# deadlines
# ---------------------------------------------------------------------------------------
async def test_an_async_handler_that_blocks_the_loop_past_its_deadline_is_a_timeout(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def blocking(ctx: RunContext) -> None:
        clock.advance(10)  # ten seconds of blocking work, never yielding to the loop

    engine = make_engine([schedule(blocking, max_runtime=5)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    [run] = await all_runs(engine, "job")
    assert (run.status, run.error_tag) == ("failed", "timeout")
    assert "blocking the event loop" in (run.error_message or "")
    assert "blocked the event loop" in caplog.text


async def test_stuck_sync_handlers_are_bounded_and_the_excess_is_recorded_skipped(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def stuck(ctx: RunContext) -> None:
        entered.release()
        release.wait(30)

    engine = make_engine([schedule(stuck, on_overlap="parallel", max_runtime=30)], max_threads=3)
    await engine.start()
    try:
        for minute in range(5):
            clock.advance(60 if minute == 0 else 30)  # the slot
            await engine.quiesce(runs=False)
            if minute < 3:
                await asyncio.to_thread(entered.acquire, True, 10)
            clock.advance(30)  # the watchdog gives up on it; its thread stays stuck (and in flight)
            await engine.quiesce(runs=False)
        await engine.flush()
        runs = await all_runs(engine, "job")
        assert [(r.status, r.error_tag) for r in runs] == [("failed", "timeout")] * 3 + [
            ("skipped", "threads_exhausted")
        ] * 2
        assert "3 handler threads are busy (3 past their deadline and still running)" in (runs[-1].error_message or "")
        assert engine.runner.pool.threads == 3
        assert "not started: all 3 handler threads are busy" in caplog.text
    finally:
        release.set()
    # Once the stuck threads return, they are reused: the next slot runs again.
    while engine.runner.pool.busy:
        await asyncio.sleep(0.01)  # the released threads unwinding (real threads: nothing to await)
    clock.advance(30)
    await engine.quiesce(runs=False)
    await engine.quiesce()
    assert (await all_runs(engine, "job"))[-1].status == "succeeded"  # released: it returns at once


# ---------------------------------------------------------------------------------------
# a run's row exists before its handler starts
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["run now", "backfill"])
async def test_the_running_row_is_committed_before_the_handler_starts(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, how: str
) -> None:
    seen: list[Any] = []

    async def look(ctx: RunContext) -> None:
        other = open_store(store_url)  # another connection: only committed rows are visible
        await other.open()
        try:
            seen.append(await other.get_run(ctx.run_id))
        finally:
            await other.close()

    engine = make_engine([schedule(look)])
    await engine.start()
    if how == "backfill":
        await engine.start_backfill("job", T0 - timedelta(minutes=1), T0)
    else:
        await engine.run_now("job")
    await engine.quiesce()
    assert len(seen) == 1 and seen[0] is not None and seen[0].status == "running"


@pytest.mark.parametrize("trigger", ["manual", "self"])
async def test_a_run_stopped_alone_as_its_batch_is_committed_does_not_cancel_the_others(
    make_engine: Callable[..., Engine], clock: ManualClock, trigger: str
) -> None:
    """Runs launched in one loop iteration wait for one batch's commit. One stopped alone as
    they wait (its lease lost, an operator's stop) is cancelled; before, its cancellation
    went through to the batch's shared future, and every other run of the batch failed
    ``interrupted`` without its handler ever running (and the batch's task raised
    ``InvalidStateError`` into the log)."""
    ran: list[str] = []

    async def handler(ctx: RunContext) -> None:
        ran.append(ctx.name)

    # (parallel: a timed run launched without a claim's id starts without asking its turn)
    overlap = "skip" if trigger == "manual" else "parallel"
    engine = make_engine([schedule(handler, "a", on_overlap=overlap), schedule(handler, "b", on_overlap=overlap)])
    await engine.start()
    await engine.quiesce()
    hold = asyncio.Event()
    flush = engine.store.flush

    async def held() -> None:
        await hold.wait()
        await flush()

    engine.store.flush = held  # type: ignore[method-assign]
    launcher = engine.launcher
    slot = clock.now().replace(second=0, microsecond=0)
    a = launcher.launch(launcher.schedules["a"], slot, trigger, "manual" if trigger == "manual" else "single")  # type: ignore[arg-type]
    b = launcher.launch(launcher.schedules["b"], slot, trigger, "manual" if trigger == "manual" else "single")  # type: ignore[arg-type]
    try:
        for _ in range(5):  # both calls wait for the batch, whose commit is held
            await asyncio.sleep(0)
        assert a.task is not None and b.task is not None and not a.done and not b.done
        engine.runner.stop_call(a, Outcome("failed", clock.now(), "interrupted", "stopped alone (test)"))
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        hold.set()
    await engine.quiesce()
    runs = {r.name: r for name in ("a", "b") for r in await all_runs(engine, name) if r.id in (a.run_id, b.run_id)}
    assert ran == ["b"]
    assert runs["b"].status == "succeeded", runs["b"]
    assert runs["a"].status == "failed" and runs["a"].error_message == "stopped alone (test)"


def test_a_handler_that_kills_its_process_leaves_its_run_to_be_closed(tmp_path: Path) -> None:
    folder = tmp_path / "schedules"
    folder.mkdir()
    (folder / "exit.cron.py").write_text(
        textwrap.dedent(
            """
            import os
            from backend import define_schedule

            def die(ctx):
                os._exit(7)

            job = define_schedule(name="die", cron="0 0 1 1 *", timezone="UTC", handler=die)
            """
        )
    )
    store = f"sqlite:///{tmp_path / 'state.db'}"

    async def create() -> None:  # only serve creates a store
        made = open_store(store)
        await made.open()
        await made.close()

    asyncio.run(create())
    args = ["--schedules", str(folder), "--store", store]
    fired = subprocess.run(
        [sys.executable, "-m", "console.cli", "fire", "die", *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert fired.returncode == 7, fired.stderr
    runs = subprocess.run(
        [sys.executable, "-m", "console.cli", "runs", "die", "--json", *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert runs.returncode == 0, runs.stderr
    import json

    [run] = json.loads(runs.stdout)
    # The next process to open the store closes it: its pid is gone.
    assert (run["status"], run["error_tag"], run["trigger"]) == ("failed", "abandoned", "manual")


def test_a_handler_that_kills_serve_in_a_timer_burst_leaves_its_run_to_be_closed(tmp_path: Path) -> None:
    """serve fires from its timers in bursts whose rows follow in the group commit; a
    committed mark before each burst lets the next process record what the dead one
    was starting."""
    folder = tmp_path / "schedules"
    folder.mkdir()
    (folder / "exit.cron.py").write_text(
        textwrap.dedent(
            """
            import os
            from backend import define_schedule

            def die(ctx):
                os._exit(7)

            async def calm(ctx):
                pass

            die_job = define_schedule(name="die", cron="* * * * * *", timezone="UTC", handler=die)
            calm_job = define_schedule(name="calm", cron="* * * * * *", timezone="UTC", handler=calm)
            """
        )
    )
    store = f"sqlite:///{tmp_path / 'state.db'}"
    args = ["--schedules", str(folder), "--store", store]
    served = subprocess.run(
        [sys.executable, "-m", "console.cli", "serve", *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert served.returncode == 7, served.stderr
    import json

    def runs(name: str) -> list[dict[str, Any]]:
        listed = subprocess.run(
            [sys.executable, "-m", "console.cli", "runs", name, "--json", *args],
            cwd=REPO,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        return list(json.loads(listed.stdout))

    [died] = runs("die")
    assert (died["status"], died["error_tag"], died["trigger"]) == ("failed", "abandoned", "self")
    # The other schedule of the burst is accounted for too: its run, or the same verdict.
    calm = runs("calm")
    assert calm and {r["scheduled_at"] for r in calm} >= {died["scheduled_at"]}


# ---------------------------------------------------------------------------------------
# why a run failed: the traceback, kept (bounded), read with the run, and logged
# ---------------------------------------------------------------------------------------
async def test_a_failed_run_keeps_its_traceback_in_the_ledger_and_the_log(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="schedtui")
    def deep(level: int) -> None:
        if level == 0:
            raise ConnectionRefusedError("smtp refused")
        deep(level - 1)

    async def handler(ctx: RunContext) -> None:
        deep(300)  # a traceback far longer than what is kept

    engine = make_engine([schedule(handler)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    [listed] = await all_runs(engine, "job")
    assert listed.traceback is None  # lists leave it out
    run = await engine.get_run(listed.id)
    assert run.traceback is not None and len(run.traceback) <= 8192
    assert run.traceback.rstrip().endswith("ConnectionRefusedError: smtp refused")  # the tail: where it went wrong
    assert "in deep" in run.traceback and "ConnectionRefusedError: smtp refused" in caplog.text
    assert run.to_json()["traceback"] == run.traceback
    # A run that did not raise has none.
    await engine.run_now("job")
    assert all(r.traceback is None for r in await all_runs(engine, "job") if r.status == "succeeded")
