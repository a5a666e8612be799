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
  cannot be killed in Python, so a sync handler is *abandoned*: it runs on, unobserved,
  holding its pool thread until it returns. A handler that returns after its deadline
  without the watchdog having noticed (it blocked the event loop) is a timeout too;
* ``failed``/``interrupted``: the engine stopped waiting for it (shutdown) or it was
  cancelled.

Subclasses of :class:`Invocation` receive the outcome in :meth:`Invocation.settled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from .clock import Clock
from .errors import describe_exception
from .isolated import IsolatedFailure, run_isolated
from .loops import Loops
from .model import TAG_INTERRUPTED, TAG_TIMEOUT

__all__ = [
    "DEFAULT_MAX_THREADS",
    "HandlerRunner",
    "Invocation",
    "Outcome",
    "RunnerSaturated",
    "TAG_THREADS_EXHAUSTED",
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


class RunnerSaturated(Exception):
    """Every handler thread is busy: the call was not started (internal; callers record it)."""


class Invocation:
    """One handler call: what it calls, its deadline, and how it ended.

    Subclass it and override :meth:`settled` to act on the outcome; it is called exactly
    once, on the engine's loop, whichever of the handler, the watchdog or an interrupt
    comes first.
    """

    __slots__ = ("_label", "deadline", "gate", "is_async", "max_runtime", "outcome", "task")

    def __init__(self, label: str, max_runtime: timedelta, is_async: bool) -> None:
        self._label = label
        self.max_runtime = max_runtime
        self.deadline: datetime | None = None
        """Set by :meth:`begin`: the start plus ``max_runtime``."""
        self.is_async = is_async
        self.task: asyncio.Task[None] | None = None
        self.outcome: Outcome | None = None
        self.gate: asyncio.Future[None] | None = None
        """If set, the call waits for it before it begins (its ledger row being committed)."""

    @property
    def label(self) -> str:
        """What the log calls this call (a subclass may compute it only when asked)."""
        return self._label

    @property
    def stopped_how(self) -> str:
        """What the watchdog's timeout does to this call, for its message."""
        return "async handler was cancelled" if self.is_async else "sync handler was abandoned"

    @property
    def thread_name(self) -> str:
        """The name a sync handler's thread carries while it runs this call."""
        return "schedtui-handler"

    @property
    def max_runtime_s(self) -> float:
        return self.max_runtime.total_seconds()

    def process_spec(self, arg: Any) -> dict[str, Any] | None:
        """What a child process needs to make this call (see :mod:`backend.isolated`), or
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
        return True

    def settled(self, outcome: Outcome) -> None:
        """Called once with the outcome (override)."""

    def cancel(self) -> None:
        if self.task is not None:
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

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a thread; needs a :meth:`reserve` first."""
        with self._lock:
            spawn = self.busy > self.threads
            if spawn:
                self.threads += 1
        self._work.put(fn)
        if spawn:
            threading.Thread(target=self._worker, name="schedtui-handler", daemon=True).start()

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


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """The error tag, message and traceback a failed call is recorded with; never raises
    (see :func:`~backend.errors.describe_exception`)."""
    if issubclass(type(exc), IsolatedFailure):  # not isinstance(): it reads exc.__class__
        assert isinstance(exc, IsolatedFailure)
        return exc.tag, exc.message[:MAX_ERROR_MESSAGE], (exc.trace or "")[-MAX_TRACEBACK:]
    tag, message, trace = describe_exception(exc)
    return tag, message[:MAX_ERROR_MESSAGE], trace[-MAX_TRACEBACK:]


class HandlerRunner:
    """Starts invocations and watches their deadlines (one watchdog loop for all).

    Contract: :meth:`start` either starts the call or raises :class:`RunnerSaturated`
    (sync handlers only, when the thread pool is full) without side effects; every started
    invocation is settled exactly once; :meth:`interrupt` settles what is still in flight.
    """

    def __init__(self, clock: Clock, loops: Loops, *, max_threads: int = DEFAULT_MAX_THREADS) -> None:
        self.clock = clock
        self.loops = loops
        self._unbegun: set[int] = set()
        self.pool = _ThreadPool(max_threads)
        self.in_flight: dict[int, Invocation] = {}
        self._deadlines: list[tuple[datetime, int, Invocation]] = []
        """(deadline, key, invocation): the key breaks ties, so invocations are never compared."""
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.abandoned = 0
        """Sync handlers given up on by the watchdog that have not returned yet."""

    def open(self) -> None:
        self._wake = asyncio.Event()
        self.loops.expect("watchdog")  # busy until it first parks
        self.loops.spawn(self._watchdog(), "watchdog")

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
                + (f" ({self.abandoned} abandoned by the watchdog and still running)" if self.abandoned else "")
            )
        key = next(self._seq)
        self.in_flight[key] = invocation
        self._unbegun.add(key)
        invocation.task = task = asyncio.get_running_loop().create_task(self._call(key, invocation, fn))
        task.add_done_callback(lambda _: self._unbegun.discard(key))  # (also one cancelled before its first step)

    def _watch(self, key: int, invocation: Invocation, deadline: datetime) -> None:
        deadlines = self._deadlines
        # The watchdog parks until the earliest deadline at most: one no earlier than the
        # earliest now cannot need it woken (a burst's runs mostly share their deadline).
        if (not deadlines or deadline < deadlines[0][0]) and self.loops.needs_wake("watchdog", deadline):
            self._wake.set()
        heapq.heappush(deadlines, (deadline, key, invocation))

    async def _call(self, key: int, invocation: Invocation, fn: Callable[[Any], Any]) -> None:
        try:
            try:
                if invocation.gate is not None:
                    await invocation.gate
                arg = invocation.begin(self.clock.now())
            finally:
                self._unbegun.discard(key)
                self.loops.poke()
            deadline = invocation.deadline
            assert deadline is not None, "Invocation.begin() sets the deadline"
            self._watch(key, invocation, deadline)
            spec = invocation.process_spec(arg)
            if spec is not None:
                value = await run_isolated(spec)
            elif invocation.is_async:
                value = await fn(arg)
            else:
                value = await self._on_thread(invocation, fn, arg)
                if inspect.isawaitable(value):  # lambda ctx: send(ctx): the work is the awaitable
                    value = await value
        except asyncio.CancelledError:
            invocation.settle(Outcome("failed", self.clock.now(), TAG_INTERRUPTED, "the run was cancelled"))
        except BaseException as exc:  # noqa: B036 - SystemExit & co. fail the run, not the process
            tag, message, trace = _describe(exc)
            invocation.settle(Outcome("failed", self.clock.now(), tag, message, trace))
        else:
            now = self.clock.now()
            if now > deadline and not invocation.done:
                # The watchdog never got to run: the handler held the event loop past its deadline.
                ran = (now - deadline).total_seconds() + invocation.max_runtime_s
                log.warning(
                    "%s blocked the event loop until %.1fs after its start (max_runtime %gs): "
                    "an async handler doing blocking work stalls every schedule; make it a plain def",
                    invocation.label,
                    ran,
                    invocation.max_runtime_s,
                )
                invocation.settle(
                    Outcome(
                        "failed",
                        now,
                        TAG_TIMEOUT,
                        f"exceeded max_runtime of {invocation.max_runtime_s:g}s: finished after {ran:.1f}s, "
                        "blocking the event loop (the watchdog could not interrupt it)",
                    )
                )
            else:
                invocation.settle(Outcome("succeeded", now, None, None, None, value))
        finally:
            self.in_flight.pop(key, None)

    def _on_thread(self, invocation: Invocation, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
        """Run a sync handler on a pool thread (reserved by :meth:`start`)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def target() -> None:
            threading.current_thread().name = invocation.thread_name
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # noqa: B036 - handed to the loop, recorded there
                result, error = None, exc
            if invocation.done and invocation.outcome is not None and invocation.outcome.error_tag == TAG_TIMEOUT:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._abandoned_returned)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
                loop.call_soon_threadsafe(settle, result, error)

        self.pool.submit(target)
        return fut

    def _abandoned_returned(self) -> None:
        self.abandoned = max(0, self.abandoned - 1)

    # -- the watchdog -------------------------------------------------------------------
    async def _watchdog(self) -> None:
        while True:
            now = self.clock.now()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, invocation = heapq.heappop(self._deadlines)
                if invocation.done:
                    continue
                kind = invocation.stopped_how
                log.warning("%s timed out; its %s", invocation.label, kind)
                if invocation.settle(
                    Outcome("failed", now, TAG_TIMEOUT, f"exceeded max_runtime of {invocation.max_runtime_s:g}s; the {kind}")
                ) and not invocation.is_async:
                    self.abandoned += 1
                invocation.cancel()
            while self._deadlines and self._deadlines[0][2].done:
                heapq.heappop(self._deadlines)  # finished in time: drop lazily
            await self.loops.park("watchdog", self._deadlines[0][0] if self._deadlines else None, self._wake)

    # -- stopping -----------------------------------------------------------------------
    def running_tasks(self) -> list[asyncio.Task[None]]:
        return [i.task for i in self.in_flight.values() if i.task is not None and not i.done]

    def interrupt(self, message: str) -> None:
        """Settle every call in flight as ``failed``/``interrupted`` and cancel it."""
        now = self.clock.now()
        for key, invocation in list(self.in_flight.items()):
            invocation.settle(Outcome("failed", now, TAG_INTERRUPTED, message))
            invocation.cancel()
            # A task cancelled before its first step never runs its `finally`.
            self.in_flight.pop(key, None)
