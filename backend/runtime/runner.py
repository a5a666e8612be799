"""Running handlers: one place that calls user code and decides how each call ended.

Schedules use it today; queue jobs and durable steps use the same one. A call is an
:class:`Invocation`: the runner starts it (an async handler as a task on the engine's loop,
a sync one on a bounded pool of threads), watches its deadline, and *settles* it exactly
once with an :class:`Outcome`:

* ``succeeded``: the handler returned before its deadline;
* ``failed`` with the exception's class as error tag: the handler raised anything at all,
  ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` included (a handler can fail
  its run, never the process);
* ``failed``/``timeout``: the deadline passed. An async handler is cancelled; a thread
  cannot be killed in Python, so a sync handler runs on, holding its pool thread, until it
  returns. A handler that returns after its deadline without the watchdog having noticed
  (it blocked the event loop) is a timeout too;
* ``failed``/``interrupted``: the engine stopped waiting for it (shutdown) or it was
  cancelled;
* ``failed``/``lease_lost``: this instance's lease on its work lapsed (see
  :mod:`backend.runtime.liveness`) before the call started, or while it ran.

Settling is not ending: a call *ends* when its handler has really returned (a sync
handler's thread, an async handler that ignored its cancellation, a child process that
was killed). Subclasses receive the outcome in :meth:`Invocation.settled` and the end in
:meth:`Invocation.ended`; whatever a call holds (a queue's seat, a schedule's place under
its overlap policy, a durable step's turn) it holds until it has ended, so that no retry
or next run starts beside a handler that is still running.

While a handler runs, what it logs and prints is its call's (schedule runs and job
attempts: :attr:`Invocation.captured`): the call's capture is the context's
:data:`~backend.observability.capture.CURRENT`, set on its task (an async handler, a child
process's) or on its pool thread (a sync handler), and closed when the call has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import inspect
import itertools
import logging
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from backend.clock import Clock
from backend.errors import describe_exception
from backend.inputs import is_async_callable
from backend.model import TAG_INTERRUPTED, TAG_LEASE_LOST, TAG_TIMEOUT
from backend.observability.capture import CURRENT, Capture, reinstate_if_moved
from backend.runtime.isolated import IsolatedFailure, run_isolated
from backend.runtime.liveness import WorkLease
from backend.runtime.loops import Loops

if TYPE_CHECKING:
    from backend.observability.runlogs import RunLogs

__all__ = [
    "DEFAULT_MAX_THREADS",
    "HandlerRunner",
    "Invocation",
    "Outcome",
    "RunnerSaturated",
    "TAG_THREADS_EXHAUSTED",
    "is_async_callable",
]

log = logging.getLogger("schedtui.engine")

#: How many sync handlers may run at once (threads abandoned by the watchdog included).
DEFAULT_MAX_THREADS: Final = 32
#: Error tag of a run that could not start because every handler thread was busy.
TAG_THREADS_EXHAUSTED: Final = "threads_exhausted"
MAX_ERROR_MESSAGE: Final = 2000
#: The tail of a traceback that is kept (the innermost frames say why).
MAX_TRACEBACK: Final = 8192
_IDLE_THREAD_EXIT_S = 60.0
#: A handler that returns this long after its call was settled is said to have run on.
LINGER_NOTED_S = 1.0
#: A lane lets the event loop run after this many calls in a row (see HandlerRunner.start_lane).
LANE_YIELD = 16
#: The watchdog's heap of deadlines is rid of ended calls once it holds this many entries,
#: and then twice as many as are left (see HandlerRunner._watch).
COMPACT_AT = 64


@dataclass(slots=True)
class Outcome:
    """How one handler call ended. (Not frozen: one is made per call, and a frozen
    dataclass costs five times as much to construct; nothing changes one once made.)"""

    status: Literal["succeeded", "failed", "skipped"]
    at: datetime
    error_tag: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    value: Any = None
    """What the handler returned (``None`` unless it succeeded)."""


class _InContext:
    """The rest of a call of a lane (see :meth:`HandlerRunner.start_lane`) that waited at its
    first step (which yielded ``first``): awaited on the lane's task with each of its steps
    run in ``context``, the call's own."""

    __slots__ = ("context", "first", "steps")

    def __init__(self, steps: Any, context: contextvars.Context, first: Any) -> None:
        self.steps = steps
        self.context = context
        self.first = first

    def __await__(self) -> Any:
        steps, run = self.steps, self.context.run
        out = self.first
        while True:
            try:
                value = yield out
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # noqa: B036 - thrown in by the task (a cancellation): passed on
                try:
                    out = run(steps.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = run(steps.send, value)
                except StopIteration as stop:
                    return stop.value


class RunnerSaturated(Exception):
    """Every handler thread is busy: the call was not started (internal; callers record it)."""


class Invocation(Capture):
    """One handler call: what it calls, its deadline, and how it ended.

    Subclass it and override :meth:`settled` to act on the outcome; it is called exactly
    once, on the engine's loop, whichever of the handler, the watchdog or an interrupt
    comes first.
    """

    __slots__ = (
        "_label", "cancels", "deadline", "epoch", "gate", "given_up_at", "has_ended", "is_async", "max_runtime", "outcome",
        "task", "thread",
    )  # fmt: skip

    captured: ClassVar[bool] = False
    """Whether what the handler logs and prints is kept as its log (:meth:`~Capture.log_target`):
    the call is its own capture (see :class:`~backend.observability.capture.Capture`)."""

    def __init__(self, label: str, max_runtime: timedelta, is_async: bool) -> None:
        self.buffer = None
        self.opener = None
        self._label = label
        self.max_runtime = max_runtime
        self.deadline: datetime | None = None
        """Set by :meth:`begin`: the start plus ``max_runtime``."""
        self.is_async = is_async
        self.task: asyncio.Task[None] | None = None
        self.outcome: Outcome | None = None
        self.gate: asyncio.Future[Any] | None = None
        """If set, the call waits for it before it begins (its ledger row being committed)."""
        self.epoch = 0
        """The epoch of this instance's lease when the call was started (claimed)."""
        self.thread: asyncio.Future[Any] | None = None
        """A sync handler's thread, once handed to one: resolves when the thread returns."""
        self.has_ended = False
        """True once the handler has really ended (see :meth:`ended`)."""
        self.given_up_at: datetime | None = None
        """When the watchdog, a stop or a lapse settled the call while its handler ran."""
        self.cancels = 0
        """How many times :meth:`cancel` cancelled its task (see :meth:`HandlerRunner.run_here`)."""

    @property
    def label(self) -> str:
        """What the log calls this call (a subclass may compute it only when asked)."""
        return self._label

    @property
    def stopped_how(self) -> str:
        """What the watchdog's timeout does to this call, for its message."""
        return (
            "async handler was cancelled"
            if self.is_async
            else "sync handler runs on until it returns (a thread cannot be stopped), holding its place"
        )

    @property
    def thread_name(self) -> str:
        """The name a sync handler's thread carries while it runs this call."""
        return "schedtui-handler"

    @property
    def max_runtime_s(self) -> float:
        return self.max_runtime.total_seconds()

    def process_spec(self, arg: Any) -> dict[str, Any] | None:
        """What a child process needs to make this call (see :mod:`backend.runtime.isolated`), or
        ``None`` to call the handler in this process (override)."""
        return None

    def begin(self, now: datetime) -> Any:
        """The handler is about to be called (on its task): set the deadline and return the
        handler's argument (override; call this first)."""
        self.deadline = now + self.max_runtime

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def settle(self, outcome: Outcome) -> bool:
        """Record the outcome unless there is one already; True if this call did."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self.settled(outcome)
        if self.task is None and not self.has_ended:  # never handed to the runner: nothing runs
            self.has_ended = True
            self.ended()
        return True

    def settled(self, outcome: Outcome) -> None:
        """Called once with the outcome (override)."""

    def ended(self) -> None:
        """Called once, after :meth:`settled`, when the handler has really returned (or never
        started): what the call held may be let go now (override)."""

    def lingers(self) -> None:
        """Called once, after :meth:`settled`, when the handler runs on past it (override):
        it holds what it holds until :meth:`ended`."""

    @property
    def lingering(self) -> bool:
        """Settled, but its handler still runs (a sync handler past its deadline)."""
        return self.outcome is not None and not self.has_ended

    def ran_on(self, now: datetime) -> float | None:
        """Seconds the handler ran on after the call was settled (``None`` under a second:
        a cancelled handler's ordinary unwinding)."""
        if self.given_up_at is None:
            return None
        seconds = (now - self.given_up_at).total_seconds()
        return seconds if seconds >= LINGER_NOTED_S else None

    def cancel(self) -> None:
        if self.task is not None:
            self.cancels += 1
            self.task.cancel()


class _ThreadPool:
    """At most ``max_threads`` threads run sync handlers; idle ones are reused, then exit.

    A handler abandoned by the watchdog keeps its thread until it returns, so a handler
    that hangs for ever costs one thread, not one per slot: once all are taken, new calls
    are refused (and recorded as such) instead of growing the process without bound."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.threads = 0
        """Threads alive in the pool."""
        self.busy = 0
        """Calls handed in and not returned yet (running, or about to be picked up)."""

    def reserve(self) -> bool:
        with self._lock:
            if self.busy >= self.max_threads:
                return False
            self.busy += 1
            return True

    def release(self) -> None:
        """Give back a :meth:`reserve` that was never submitted."""
        with self._lock:
            self.busy -= 1

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a thread; needs a :meth:`reserve` first."""
        with self._lock:
            spawn = self.busy > self.threads
            if spawn:
                self.threads += 1
        self._work.put(fn)
        if spawn:
            thread = threading.Thread(target=self._worker, name="schedtui-handler", daemon=True)
            # Started in an empty context: a pool thread carries no run's log capture (each
            # call sets its own, on the thread).
            contextvars.Context().run(thread.start)

    def _worker(self) -> None:
        while True:
            try:
                fn = self._work.get(timeout=_IDLE_THREAD_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self.threads > self.busy:  # a spare thread: nothing can be waiting for it
                        self.threads -= 1
                        return
                continue
            try:
                fn()
            finally:
                with self._lock:
                    self.busy -= 1


class _Carried(Exception):
    """What a sync handler raised that a future cannot hold (``StopIteration``), on its
    way from the handler's thread to the code that records it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """The error tag, message and traceback a failed call is recorded with; never raises
    (see :func:`~backend.errors.describe_exception`)."""
    if issubclass(type(exc), IsolatedFailure):  # not isinstance(): it reads exc.__class__
        assert isinstance(exc, IsolatedFailure)
        return exc.tag, exc.message[:MAX_ERROR_MESSAGE], (exc.trace or "")[-MAX_TRACEBACK:]
    tag, message, trace = describe_exception(exc)
    return tag, message[:MAX_ERROR_MESSAGE], trace[-MAX_TRACEBACK:]


def _never_ran(value: Any) -> TypeError | None:
    """The error of a handler that returned a generator (``lambda ctx: export(ctx)``,
    ``export``'s body a generator's): its body never ran."""
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        return TypeError(
            f"the handler returned a{'n async' if inspect.isasyncgen(value) else ''} generator, so its body never ran: "
            "a handler is a def or async def without yield (iterate the generator inside it)"
        )
    return None


async def _awaited_in(awaitable: Any, context: contextvars.Context) -> Any:
    """Await ``awaitable`` with each of its steps run in ``context`` (a lane's call's own)."""
    steps = context.run(awaitable.__await__)
    try:
        first = context.run(steps.send, None)
    except StopIteration as stop:
        return stop.value
    return await _InContext(steps, context, first)


#: The runners opened in this process: a child forked from it marks each (``forked``), so
#: that a handler's child is told apart from its parent without a system call a call.
_OPEN_RUNNERS: weakref.WeakSet[HandlerRunner] = weakref.WeakSet()


def _mark_forked() -> None:
    for runner in list(_OPEN_RUNNERS):
        runner.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


class HandlerRunner:
    """Starts invocations and watches their deadlines (one watchdog loop for all).

    Contract: :meth:`start` either starts the call or raises :class:`RunnerSaturated`
    (sync handlers only, when the thread pool is full) without side effects; every started
    invocation is settled exactly once and then ended exactly once (when its handler has
    really returned, or never began); a call whose lease epoch is no longer held when it
    would begin never begins (settled ``lease_lost``); :meth:`interrupt` settles what is
    still in flight.
    """

    def __init__(
        self, clock: Clock, loops: Loops, *, max_threads: int = DEFAULT_MAX_THREADS, lease: WorkLease | None = None
    ) -> None:
        self.clock = clock
        self.loops = loops
        self.lease = lease
        self._unbegun: set[int] = set()
        self.pool = _ThreadPool(max_threads)
        self.in_flight: dict[int, Invocation] = {}
        self.lingering: set[Invocation] = set()
        """Settled calls whose handler still runs (sync handlers past their deadline)."""
        self._deadlines: list[tuple[datetime, int, Invocation]] = []
        """(deadline, key, invocation): the key breaks ties, so invocations are never compared."""
        self._compact_at = COMPACT_AT
        """The heap's size at which the ended calls are dropped from it (see :meth:`_watch`)."""
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.threads_running = 0
        """Sync handlers running on a thread right now (abandoned ones included)."""
        self.in_code: set[int] = set()
        """The threads running a sync handler's code now, kept by the threads themselves (a
        set's add and discard are atomic): true after the loop is gone, which
        :attr:`threads_running` (counted on the loop) is not."""
        self.logs: RunLogs | None = None
        """Keeps what handlers log and print (per-run logs), unless capturing is off."""
        self.pid = os.getpid()
        """The process whose engine calls the handlers (see :meth:`_end_forked_child`)."""
        self.forked = False
        """Set in a child forked since :meth:`open` (see :data:`_OPEN_RUNNERS`)."""

    @property
    def abandoned(self) -> int:
        """Sync handlers settled (timed out, interrupted) that have not returned yet."""
        return sum(1 for invocation in self.lingering if invocation.thread is not None)

    def open(self) -> None:
        self.pid, self.forked = os.getpid(), False
        _OPEN_RUNNERS.add(self)
        self._wake = asyncio.Event()
        self.loops.expect("watchdog")  # busy until it first parks
        self.loops.keep(self._watchdog, "watchdog")

    # -- starting ---------------------------------------------------------------------
    @property
    def unbegun(self) -> int:
        """Invocations started whose ``begin`` has not been called yet (their row's commit,
        or the loop reaching their task, still to come): ``quiesce(runs=False)`` waits for
        them, a handler blocked on a lock guard is not started yet, so not one of them."""
        return len(self._unbegun)

    def start(self, invocation: Invocation, fn: Callable[[Any], Any]) -> None:
        """Call ``fn(invocation.begin(now))`` on a task of its own, under its deadline."""
        if not invocation.is_async and not self.pool.reserve():
            raise RunnerSaturated(
                f"all {self.pool.max_threads} handler threads are busy"
                + (f" ({self.abandoned} past their deadline and still running)" if self.abandoned else "")
            )
        if self.lease is not None:
            invocation.epoch = self.lease.epoch
        key = next(self._seq)
        self.in_flight[key] = invocation
        self._unbegun.add(key)
        invocation.task = task = asyncio.get_running_loop().create_task(self._call(key, invocation, fn))

        def task_done(_: asyncio.Task[None]) -> None:
            self._unbegun.discard(key)
            self.in_flight.pop(key, None)  # (also one cancelled before its first step)
            thread = invocation.thread
            if thread is None:
                if not invocation.is_async:
                    self.pool.release()  # never handed to a thread: its reservation is free
                self._end(invocation)
            elif thread.done():
                self._end(invocation)
            # else: its thread still runs; it ends the call when it returns

        task.add_done_callback(task_done)

    async def run_here(self, invocation: Invocation, fn: Callable[[Any], Any]) -> None:
        """Call an async ``fn(invocation.begin(now))`` on the calling task, under the same
        rules as :meth:`start` (deadline, lease epoch, exactly one outcome, then its end),
        without a task of its own: for calls their caller awaits at once (a durable
        function's steps), where a task would cost a loop round trip each.

        Cancelling the invocation cancels the calling task; such a cancellation (the
        invocation's :meth:`~Invocation.cancel`, counted in ``cancels``) ends the call
        only, any other one goes on up to the caller once the call is settled."""
        task = asyncio.current_task()
        assert task is not None and invocation.is_async
        if self.lease is not None:
            invocation.epoch = self.lease.epoch
        key = next(self._seq)
        self.in_flight[key] = invocation
        invocation.task = task
        try:
            if self._lapsed(invocation):
                return
            arg = invocation.begin(self.clock.now())
            deadline = invocation.deadline
            assert deadline is not None, "Invocation.begin() sets the deadline"
            self._watch(key, invocation, deadline)
            token = CURRENT.set(None) if self.logs is not None else None
            try:
                value = await fn(arg)
                if value is not None and inspect.isawaitable(value):
                    value = await value  # `return fetch(ctx)`, its await left out: the work is the awaitable
            finally:
                if token is not None:
                    CURRENT.reset(token)
        except BaseException as exc:  # noqa: B036 - SystemExit & co. fail the call, not the process
            self._raised(invocation, exc)
        else:
            self._returned(invocation, deadline, value, warn=False)
        finally:
            self.in_flight.pop(key, None)
            invocation.task = None
            # Take back the cancellations aimed at this call; any left came from elsewhere.
            for _ in range(min(invocation.cancels, task.cancelling())):
                task.uncancel()
            self._end(invocation)
        if task.cancelling() > 0:
            raise asyncio.CancelledError

    def start_lane(
        self,
        invocation: Invocation,
        fn: Callable[[Any], Any],
        successor: Callable[[Invocation], Invocation | None],
        lost: Callable[[Invocation], None],
    ) -> None:
        """Call an async ``fn(invocation.begin(now))`` as :meth:`start` does, then, on the same
        task, each call ``successor`` hands on as the previous one ends (``None``: the lane
        ends): a *lane*, one task for a run of short calls (a queue's jobs on one seat) where a
        task each would cost more than most of their handlers.

        Each call runs under the same rules as on a task of its own: its deadline, its lease
        epoch, exactly one outcome then its end, its own context (what its handler sets in
        context variables stays its own) and its capture. :meth:`Invocation.cancel` cancels
        the call in hand only. A cancellation of the lane's task from elsewhere ends the call
        in hand (``interrupted``) and the lane, and ``lost(call)`` is told. The lane lets the
        loop run after every :data:`LANE_YIELD` calls (calls that never wait would hold it
        otherwise). For calls made in this process (no :meth:`Invocation.process_spec`)."""
        assert invocation.is_async, "a lane runs async handlers in this process"
        if self.lease is not None:
            invocation.epoch = self.lease.epoch
        holder: list[Invocation | None] = [invocation]
        invocation.task = task = asyncio.get_running_loop().create_task(self._lane(holder, fn, successor))

        def lane_done(_: asyncio.Task[None]) -> None:
            held = holder[0]
            if held is None:
                return  # the lane ran out of calls
            if not held.has_ended:  # (cancelled before it reached the call)
                held.task = None
                self._end(held)
            lost(held)

        task.add_done_callback(lane_done)

    async def _lane(
        self,
        holder: list[Invocation | None],
        fn: Callable[[Any], Any],
        successor: Callable[[Invocation], Invocation | None],
    ) -> None:
        invocation = holder[0]
        task = invocation.task if invocation is not None else None
        assert task is not None
        ran = 0
        while invocation is not None:
            await self._inline(invocation, fn, task)
            invocation = holder[0] = successor(invocation)
            if invocation is None:
                return
            invocation.task = task
            if self.lease is not None:
                invocation.epoch = self.lease.epoch
            ran += 1
            if ran % LANE_YIELD == 0:
                await asyncio.sleep(0)  # a run of calls that never wait: let the loop run

    async def _inline(self, invocation: Invocation, fn: Callable[[Any], Any], task: asyncio.Task[None]) -> None:
        """One call of a lane, on the lane's ``task`` (see :meth:`start_lane`): as
        :meth:`_call`, and ended here."""
        if invocation.done:  # settled before the lane reached it: it never begins
            invocation.task = None
            self._end(invocation)
            return
        key = next(self._seq)
        self.in_flight[key] = invocation
        try:
            if self._lapsed(invocation):
                return
            arg = invocation.begin(self.clock.now())
            deadline = invocation.deadline
            assert deadline is not None, "Invocation.begin() sets the deadline"
            self._watch(key, invocation, deadline)
            # Its own context, as a task of its own would have: what the handler sets in
            # context variables stays its own (its child tasks copy it).
            context = contextvars.copy_context()
            logs = self.logs
            if logs is not None:
                reinstate_if_moved()
                captured: Capture | None = None
                if invocation.captured:
                    invocation.opener = logs.register
                    captured = invocation
                context.run(CURRENT.set, captured)
            steps = context.run(fn, arg).__await__()
            try:
                first = context.run(steps.send, None)
            except StopIteration as stop:  # done without waiting (most short handlers)
                value = stop.value
            else:
                value = await _InContext(steps, context, first)
            if value is not None:
                if inspect.isawaitable(value):  # `return send(job)`, its await left out: the work is the awaitable
                    value = await _awaited_in(value, context)
                never_ran = _never_ran(value)
                if never_ran is not None:
                    raise never_ran
        except BaseException as exc:  # noqa: B036 - SystemExit & co. fail the call, not the process
            self._raised(invocation, exc)
        else:
            self._returned(invocation, deadline, value)
        finally:
            self.in_flight.pop(key, None)
            invocation.task = None  # a later cancel() of this call must not reach the lane's next one
            # Take back the cancellations aimed at this call; any left came from elsewhere.
            for _ in range(min(invocation.cancels, task.cancelling())):
                task.uncancel()
            self._end(invocation)
        if task.cancelling() > 0:
            raise asyncio.CancelledError

    def _watch(self, key: int, invocation: Invocation, deadline: datetime) -> None:
        deadlines = self._deadlines
        # The watchdog parks until the earliest deadline at most: one no earlier than the
        # earliest now cannot need it woken (a burst's runs mostly share their deadline).
        if (not deadlines or deadline < deadlines[0][0]) and self.loops.needs_wake("watchdog", deadline):
            self._wake.set()
        heapq.heappush(deadlines, (deadline, key, invocation))
        if len(deadlines) > self._compact_at:
            # Calls that ended in time leave the heap when the watchdog wakes, and calls one
            # after another (a durable function's steps) do not wake it: without this the
            # heap would keep every call of the last max_runtime (a step's 15 minutes).
            live = [entry for entry in deadlines if not entry[2].done]
            heapq.heapify(live)
            self._deadlines = live
            self._compact_at = max(COMPACT_AT, 2 * len(live))

    async def _call(self, key: int, invocation: Invocation, fn: Callable[[Any], Any]) -> None:
        try:
            try:
                if invocation.gate is not None:
                    # Shielded: a gate may be shared (the rows of a burst, committed in one
                    # batch), and this call's cancellation must not cancel it for the others.
                    await asyncio.shield(invocation.gate)
                if invocation.done or self._lapsed(invocation):
                    return  # (settled as it waited: its row refused, or its engine stopping)
                arg = invocation.begin(self.clock.now())
            finally:
                self._unbegun.discard(key)
                self.loops.poke()
            deadline = invocation.deadline
            assert deadline is not None, "Invocation.begin() sets the deadline"
            self._watch(key, invocation, deadline)
            spec = invocation.process_spec(arg)
            logs = self.logs
            captured: Capture | None = None
            if logs is not None:
                reinstate_if_moved()
                if invocation.captured:
                    invocation.opener = logs.register
                    captured = invocation
            if spec is not None or invocation.is_async:
                # On this task: its child tasks copy the capture with the rest of its context.
                token = CURRENT.set(captured) if logs is not None else None
                try:
                    if spec is not None:
                        value = await run_isolated(spec)
                    else:
                        value = await fn(arg)
                        if value is not None and inspect.isawaitable(value):
                            value = await value  # `return send(ctx)`, its await left out: the work is the awaitable
                finally:
                    if token is not None:
                        CURRENT.reset(token)
            else:
                value = await self._on_thread(invocation, fn, arg, captured)
                if inspect.isawaitable(value):  # lambda ctx: send(ctx): the work is the awaitable
                    value = await value
            never_ran = _never_ran(value)
            if never_ran is not None:
                raise never_ran
        except BaseException as exc:  # noqa: B036 - SystemExit & co. fail the run, not the process
            self._raised(invocation, exc)
        else:
            self._returned(invocation, deadline, value)

    # -- a call's outcome, as every way of running one settles it --------------------------
    def _lapsed(self, invocation: Invocation) -> bool:
        """Whether the call was claimed under a lease that lapsed since (a frozen process
        that woke, a partition: another instance may have taken the work over); if so it
        is settled as never started."""
        lease = self.lease
        if lease is None or lease.holds(invocation.epoch):
            return False
        invocation.settle(
            Outcome(
                "failed", self.clock.now(), TAG_LEASE_LOST,
                "not started: this instance's lease on its work lapsed after it was claimed",
            )
        )  # fmt: skip
        return True

    def _end_forked_child(self, invocation: Invocation, code: int) -> None:
        """A handler that forked this process (``os.fork()``) has returned (or raised) in
        the child: the child ends here, with ``code``. Else it ran on as a copy of the
        engine, whose event loop shares its epoll instance with the parent's: as that copy
        closed, it took the parent's self-pipe out of it, and ``serve`` was deaf to SIGTERM
        (and to wake-ups from other threads) for good. A sync handler's child runs no loop:
        it waited on its pool thread for a minute, holding what it inherited, then ended."""
        if not self.forked:  # (a flag, not os.getpid(): a system call at every call)
            return
        with contextlib.suppress(BaseException):
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.write(2, (
                f"schedtui: {invocation.label}: its handler forked this process ({self.pid}) and "
                f"{'returned' if code == 0 else 'raised'} in the child ({os.getpid()}), which ends here "
                f"with exit code {code} (end a forked child with os._exit())\n"
            ).encode("utf-8", "backslashreplace"))  # fmt: skip
        os._exit(code)

    def _raised(self, invocation: Invocation, exc: BaseException) -> None:
        """Settle a call whose code raised (a cancellation: ``interrupted``). Called on the
        call's task (its own, its lane's, or its caller's)."""
        self._end_forked_child(invocation, 1)
        if type(exc) is _Carried:
            exc = exc.error
        if issubclass(type(exc), asyncio.CancelledError) and self._cancelled(invocation):  # (not isinstance(): it reads exc.__class__)
            invocation.settle(Outcome("failed", self.clock.now(), TAG_INTERRUPTED, "the run was cancelled"))
            return
        tag, message, trace = _describe(exc)
        if invocation.opener is not None and trace:
            # Its log ends as the process's stderr would: with the traceback (kept in the run too).
            invocation.write(trace if trace.endswith("\n") else trace + "\n")
        invocation.settle(Outcome("failed", self.clock.now(), tag, message, trace))

    @staticmethod
    def _cancelled(invocation: Invocation) -> bool:
        """Whether a call that raised ``CancelledError`` was cancelled (by the watchdog, a
        stop, its engine, or whatever cancelled its task), rather than raising one of its
        own (``raise asyncio.CancelledError``, a child task it cancelled and then awaited):
        that one is its error like any other, not ``interrupted``."""
        if invocation.cancels or invocation.done:
            return True
        task = asyncio.current_task()
        return task is None or task.cancelling() > 0

    def _returned(self, invocation: Invocation, deadline: datetime, value: Any, *, warn: bool = True) -> None:
        """Settle a call whose code returned ``value``: succeeded, unless it held the event
        loop past its deadline (the watchdog never got to run); ``warn``: say so in the log."""
        self._end_forked_child(invocation, 0)
        now = self.clock.now()
        if now <= deadline or invocation.done:
            invocation.settle(Outcome("succeeded", now, None, None, None, value))
            return
        ran = (now - deadline).total_seconds() + invocation.max_runtime_s
        if warn:
            log.warning(
                "%s blocked the event loop until %.1fs after its start (max_runtime %gs): "
                "an async handler doing blocking work stalls every schedule; make it a plain def",
                invocation.label, ran, invocation.max_runtime_s,
            )  # fmt: skip
        invocation.settle(
            Outcome(
                "failed", now, TAG_TIMEOUT,
                f"exceeded max_runtime of {invocation.max_runtime_s:g}s: finished after {ran:.1f}s, "
                "blocking the event loop (the watchdog could not interrupt it)",
            )
        )  # fmt: skip

    def _end(self, invocation: Invocation) -> None:
        """The handler has really returned (or never began): settle it if nothing did, and
        let the invocation go of what it held."""
        if invocation.has_ended:
            return
        if invocation.outcome is None:  # (a task cancelled before its first step)
            invocation.settle(Outcome("failed", self.clock.now(), TAG_INTERRUPTED, "the run was cancelled"))
        invocation.has_ended = True
        self.lingering.discard(invocation)
        if invocation.buffer is not None and self.logs is not None:
            self.logs.ended(invocation)
        ran_on = None if invocation.given_up_at is None else invocation.ran_on(self.clock.now())
        if ran_on is not None:
            log.warning("%s returned %.1fs after it was given up on: what it held is free now", invocation.label, ran_on)
        invocation.ended()
        self.loops.poke()

    def _linger(self, invocation: Invocation) -> None:
        """A call was settled while its handler still runs: it holds what it holds until then."""
        if not invocation.has_ended and invocation.given_up_at is None and invocation.outcome is not None:
            invocation.given_up_at = invocation.outcome.at
            self.lingering.add(invocation)
            invocation.lingers()

    def _on_thread(
        self, invocation: Invocation, fn: Callable[[Any], Any], arg: Any, captured: Capture | None = None
    ) -> asyncio.Future[Any]:
        """Run a sync handler on a pool thread (reserved by :meth:`start`). The returned
        future (also :attr:`Invocation.thread`) resolves when the thread returns, whether
        or not anyone still waits for it; the call ends then."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        invocation.thread = fut

        def returned(result: Any, error: BaseException | None) -> None:
            self.threads_running -= 1
            if not fut.done():
                if error is not None:
                    # A future refuses StopIteration (TypeError): the call would then never
                    # end. It travels wrapped and is recorded as itself (see _raised).
                    fut.set_exception(_Carried(error) if issubclass(type(error), StopIteration) else error)
                else:
                    fut.set_result(result)
            fut.exception() if fut.done() and not fut.cancelled() else None  # retrieved: never logged as unhandled
            task = invocation.task
            if task is None or task.done():  # else its task settles it first, then ends it
                self._end(invocation)

        capturing = self.logs is not None

        def target() -> None:
            threading.current_thread().name = invocation.thread_name
            # On this thread: the threads the handler starts copy it (see backend.observability.capture).
            token = CURRENT.set(captured) if capturing else None
            ident = threading.get_ident()
            self.in_code.add(ident)
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # noqa: B036 - handed to the loop, recorded there
                result, error = None, exc
            finally:
                self.in_code.discard(ident)
                if token is not None:
                    CURRENT.reset(token)
            self._end_forked_child(invocation, 0 if error is None else 1)  # (it lingered on its pool thread)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
                loop.call_soon_threadsafe(returned, result, error)

        self.threads_running += 1
        self.pool.submit(target)
        return asyncio.shield(fut)

    # -- the watchdog -------------------------------------------------------------------
    async def _watchdog(self) -> None:
        dropped: datetime | None = None
        while True:
            now = self.clock.now()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, invocation = heapq.heappop(self._deadlines)
                if invocation.done:
                    continue
                kind = invocation.stopped_how
                log.warning("%s timed out; its %s", invocation.label, kind)
                invocation.settle(
                    Outcome("failed", now, TAG_TIMEOUT, f"exceeded max_runtime of {invocation.max_runtime_s:g}s; the {kind}")
                )
                invocation.cancel()
                self._linger(invocation)
            while self._deadlines and self._deadlines[0][2].done:
                dropped = heapq.heappop(self._deadlines)[0]  # finished in time: drop lazily
            until = self._deadlines[0][0] if self._deadlines else None
            # Park no later than the last deadline dropped: the next call (calls one after
            # another, a durable function's steps, mostly due no earlier) then need not wake
            # this loop (see _watch); waking at that deadline is harmless.
            if dropped is not None and dropped <= now:
                dropped = None
            if dropped is not None and (until is None or dropped < until):
                until = dropped
            await self.loops.park("watchdog", until, self._wake)

    # -- stopping -----------------------------------------------------------------------
    def running_tasks(self) -> list[asyncio.Task[None]]:
        return [i.task for i in self.in_flight.values() if i.task is not None and not i.done]

    def interrupt(self, message: str, tag: str = TAG_INTERRUPTED) -> None:
        """Settle every call in flight as ``failed`` (``interrupted``, or ``tag``) and cancel
        it; a sync handler's thread runs on until it returns (see :attr:`lingering`)."""
        now = self.clock.now()
        for invocation in list(self.in_flight.values()):
            self.stop_call(invocation, Outcome("failed", now, tag, message))

    def stop_call(self, invocation: Invocation, outcome: Outcome) -> None:
        """Settle one call with ``outcome`` (unless it is settled) and cancel it."""
        invocation.settle(outcome)
        invocation.cancel()
        self._linger(invocation)
