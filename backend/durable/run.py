"""One claimed execution in this process: its replay state, its calls, its writes.

An :class:`ExecutionRun` is made for each claim. It calls the function's code (through
the shared :class:`~backend.runtime.runner.HandlerRunner`, like every handler) with a
:class:`~backend.durable.context.DurableContext` over this run. The step checkpoints it
was claimed with (read once, in the claim) answer every step already finished; the first
unfinished one runs for real. Every write carries the claim's lease number, so a run that
was displaced writes nothing (the store refuses it; the run then stops quietly).

How the code is left (see :mod:`.errors`): when it waits (sleep, signal, retry backoff)
the run writes the wait and stops, holding nothing; the next claim replays from the top.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import current_task
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from backend.durable.definition import DurableFunction
from backend.durable.departure import Departure, Wait
from backend.durable.errors import Cancelled, Ended, Fatal, InDoubt, LeaseLost, Released, StepFailed, Stop, Suspended
from backend.durable.lines import ExecutionLines
from backend.durable.model import (
    MAX_LIFETIME,
    TAG_CANCELLED,
    TAG_CONCURRENT_STEPS,
    TAG_EXPIRED,
    TAG_NONDETERMINISTIC,
    TAG_NOT_JSON,
    decode,
    encode,
)
from backend.durable.store import Claimed, DurableStore, Finish, Progress, StepRecord, Suspend, Write, join_failed_steps
from backend.errors import Unavailable
from backend.model import TAG_INTERRUPTED, TAG_TIMEOUT
from backend.runtime.runner import Invocation, Outcome

if TYPE_CHECKING:
    from backend.durable.context import DurableContext
    from backend.durable.executor import DurableExecutor

__all__ = ["ExecutionRun", "started_on"]

log = logging.getLogger("schedtui.durable")


def started_on(instance: str) -> str:
    """The first line of an execution's log."""
    return f"started on {instance}"


class BodyCall(Invocation):
    """The function's code for one claim: bounded by the execution's lifetime."""

    __slots__ = ("finished", "run")

    def __init__(self, run: ExecutionRun) -> None:
        super().__init__(f"execution {run.id} of {run.function.name}", MAX_LIFETIME, True)
        self.run = run
        self.finished: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    def begin(self, now: datetime) -> DurableContext:
        self.deadline = self.run.deadline
        return self.run.context

    def ended(self) -> None:
        # Once the code has really returned (code that ignores its cancellation included):
        # the execution is written, and let go, only then.
        assert self.outcome is not None
        if not self.finished.done():
            self.finished.set_result(self.outcome)


class StepCall(Invocation):
    """One attempt of one step."""

    __slots__ = ("args", "execution", "finished", "run", "started", "step")

    def __init__(self, run: ExecutionRun, step: str, args: tuple[Any, ...], is_async: bool) -> None:
        super().__init__("", run.step_timeout, is_async)
        self.run = run
        self.execution = run.id
        self.step = step
        self.args = args
        self.started: datetime | None = None
        # An async step runs on the code's own task (HandlerRunner.run_here): its outcome is
        # there when that returns. A step on a thread is awaited through this.
        self.finished: asyncio.Future[Outcome] | None = None if is_async else asyncio.get_running_loop().create_future()

    @property
    def label(self) -> str:
        return f'step "{self.step}" of execution {self.execution}'  # made only when logged

    @property
    def thread_name(self) -> str:
        return f"schedtui-step-{self.step}"

    def begin(self, now: datetime) -> tuple[Any, ...]:
        self.deadline = now + self.max_runtime
        self.started = now
        return self.args

    def ended(self) -> None:
        # A step on a thread past its deadline still runs: its retry (or the next step)
        # waits until it has returned, so no two attempts of a step ever run at once.
        assert self.outcome is not None
        self.run.threads.discard(self)
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(self.outcome)


class ExecutionRun:
    """Replay state and writes of one claimed execution (see the module docstring)."""

    def __init__(
        self,
        executor: DurableExecutor,
        claimed: Claimed,
        function: DurableFunction,
        held_until: datetime,
        *,
        start_logged: bool = False,
    ) -> None:
        from backend.durable.context import DurableContext

        row = claimed.execution
        self.executor = executor
        self.store: DurableStore = executor.store
        self.clock = executor.clock
        self.id = row.id
        self.lease = row.lease
        self.row = row
        self.function = function
        self.deadline = row.created_at + MAX_LIFETIME
        self.held_until = held_until
        """Until when its execution's lease surely holds, by this process's clock (its claim,
        or the last renewal, sent plus the ttl, less the margin for the others' clocks): no
        step starts after it."""
        self.step_timeout = timedelta(seconds=function.step_timeout)
        self.recorded: dict[int, StepRecord] = {step.seq: step for step in claimed.steps}
        self.positions: dict[str, int] = {step.name: step.seq for step in claimed.steps}
        self.by_name = any(step.gathered for step in claimed.steps)
        """Recorded steps are found by their names, not their positions: the code has had
        steps in progress at once, or reached steps on tasks of its own (in this run, or in
        one its checkpoints recorded), and the positions its steps take then depend on
        timing."""
        self.signals = claimed.signals
        self.pending: list[StepRecord] = []
        """Checkpoints that need no commit of their own (a sleep or wait found over): they
        go with the next write."""
        self.lines = ExecutionLines()
        """Its log lines on their way to the store, and which write carries each."""
        self.seen: dict[str, int] = {}
        self.position = 0
        self.current_step: str | None = None
        self.cancel_requested = row.cancel_requested
        self.stopping = False
        self.ending: Stop | None = None
        """Why the code must stop, once decided: every later call of the context raises it."""
        self.body: BodyCall | None = None
        self.calls: set[StepCall] = set()
        """The steps' attempts in flight (several at once when the code gathers steps)."""
        self.threads: set[StepCall] = set()
        """Steps running on a thread: a thread cannot be stopped, so while one runs, the
        execution is not handed to another instance (see :meth:`_conclude`)."""
        self._released = asyncio.Event()
        """Set when the instance stops: what waits for the steps in flight waits no more."""
        self.in_progress: dict[str, str] = {}
        """The steps, sleeps and waits in progress (from their start to their return), by
        name: their kind. Steps may run at once; a sleep or a wait runs alone."""
        self._tasks: dict[asyncio.Task[Any] | None, str] = {}
        """The step in progress on each task: one reached on a task that has one is inside it."""
        self.writing = 0
        """Writes in flight (a step's checkpoint each, when steps run at once)."""
        self._answered: asyncio.Future[None] | None = None
        """Set when no write is in flight any more, for an end that waits for that."""
        self.departure = Departure(self)
        """Steps in progress waiting to leave the code together (a retry's wait beside steps
        still running)."""
        self.failure: StepFailed | None = None
        """The last step failure raised into the code (it failed the execution if the code
        then failed)."""
        self.unsettled: dict[asyncio.Task[Any] | None, list[str]] = {}
        """The steps whose failure for good is raised into each task of the code (or on its
        way), which has reached no step since (nor has any other, once the task has ended):
        several when steps at once failed (an ``asyncio.gather``). If the code then fails, a
        retry runs each of them again, not only the last (the others' failures, replayed,
        would fail it again at once)."""
        self.context: DurableContext = DurableContext(self)
        self.input: Any = decode(row.input)
        if row.was == "running" and row.was_instance == executor.instance:
            # A process under the same name (a restart with a fixed --instance) or this one,
            # back from a freeze or a partition: nobody else took it.
            self.lines.note(
                f"claimed again by {executor.instance} (lease {row.lease}): its lease had expired "
                "(the process of this name that held it stopped renewing it: killed, frozen or cut off)"
            )
        elif row.was == "running":
            self.lines.note(
                f"taken over by {executor.instance} (lease {row.lease}): the lease of {row.was_instance} had expired"
            )
        elif row.was_instance is not None and row.was_instance != executor.instance:
            self.lines.note(f"resumed on {executor.instance} (lease {row.lease})")
        elif row.lease == 1 and not start_logged:
            self.lines.note(started_on(executor.instance))

    @property
    def now(self) -> datetime:
        return self.clock.now()

    # -- the code ---------------------------------------------------------------------
    async def drive(self) -> None:
        """Run the code until it ends, waits or is stopped, then write how it ended."""
        if self.cancel_requested:
            await self._end(Finish("cancelled", None, error_tag=TAG_CANCELLED, error_message="cancelled before it resumed"))
            return
        if self.now >= self.deadline:
            await self._end(Finish("failed", None, error_tag=TAG_EXPIRED, error_message=self._expired_message()))
            return
        body = self.body = BodyCall(self)
        handler = self.function.handler
        arg = self.input
        self.executor.runner.start(body, lambda ctx: handler(ctx, arg))
        outcome = await body.finished
        await self._conclude(outcome)

    async def _conclude(self, outcome: Outcome) -> None:
        ending = self.ending
        if ending is None:  # (what the code left behind meets this at its next step)
            self.ending = Ended(f"execution {self.id} has ended: no step runs after its code returned")
            self.departure.wake()  # (a step the code left waiting to leave it meets it now)
        if isinstance(ending, (Suspended, LeaseLost)):
            return
        if not isinstance(ending, Released) or isinstance(ending, InDoubt):
            await self._steps_returned()
        if self.writing:
            await self._writes_answered()
        if self.threads:  # the instance stops with a step on a thread: it is not handed on
            self._left_to_its_lease()
            return
        if isinstance(ending, InDoubt):
            await self._end(Suspend("queued", self.current_step), note=ending.note)
            self.executor.poke()  # (claimed again now: by this instance, or any other)
            return
        if isinstance(ending, Released):
            await self._end(Suspend("queued", self.current_step), note=f"released: {self.executor.instance} is stopping")
            return
        self.lines.release()
        if isinstance(ending, Fatal):
            finish = Finish(
                "failed", ending.step, error_tag=ending.tag, error_message=ending.message, failed_step=ending.failed_step
            )
        elif isinstance(ending, Cancelled) or (self.cancel_requested and outcome.error_tag == TAG_INTERRUPTED):
            finish = Finish("cancelled", self.current_step, error_tag=TAG_CANCELLED, error_message=self._cancel_note())
        elif outcome.status == "succeeded":
            text, problem = encode(outcome.value)
            if problem is None:
                finish = Finish("succeeded", self.current_step, output=text)
            else:
                finish = Finish("failed", self.current_step, error_tag=TAG_NOT_JSON, error_message=f"the result {problem}")
        elif outcome.error_tag == TAG_TIMEOUT:
            finish = Finish("failed", self.current_step, error_tag=TAG_EXPIRED, error_message=self._expired_message())
        elif self.failure is not None and outcome.error_tag == StepFailed.__name__:
            failure = self.failure
            finish = Finish(
                "failed", failure.step, error_tag=failure.error_tag, error_message=failure.message,
                failed_step=self._failed_steps(failure.step),
            )  # fmt: skip
        else:
            failed_step = self._failed_steps(self.failure.step if self.failure is not None else None)
            finish = Finish(
                "failed", self.current_step, error_tag=outcome.error_tag, error_message=outcome.error_message,
                failed_step=failed_step,
            )  # fmt: skip
        await self._end(finish)

    def _failed_steps(self, last: str | None) -> str | None:
        """What a retry runs again (:attr:`Finish.failed_step`): the step whose failure was
        raised last, and every other whose failure the code has not gone past."""
        names = [] if last is None else [last]
        for failed in self.unsettled.values():
            names.extend(name for name in failed if name not in names)
        return join_failed_steps(names) if names else None

    def never_called(self, mark: StepRecord) -> None:
        """The at-most-once step of ``mark`` is not called: its started mark landed, and its
        answer came once the code had failed (a step beside it failed meanwhile). Left
        started, a retry failed it ``at_most_once_interrupted``, asking a person about a call
        that never happened: the end records it failed, and a retry runs it."""
        body = self.body
        if body is None or body.outcome is None or body.outcome.status == "succeeded":
            return  # (the code returned: nothing retries it, its mark shows it ended so)
        self.failing(mark.name)
        self.pending.append(replace(
            mark, status="failed", finished_at=self.now, error_tag=TAG_INTERRUPTED,
            error_message="not called: the code had failed (a step beside it failed) when its started mark was answered",
        ))  # fmt: skip

    def failing(self, name: str) -> None:
        """The step ``name`` failed for good (now, its checkpoint about to be sent; or in a
        checkpoint replayed): its failure is raised into the code's current task."""
        self.unsettled.setdefault(current_task(), []).append(name)

    async def _end(self, then: Finish | Suspend, note: str | None = None) -> None:
        if note:
            self.lines.note(note)
        if isinstance(then, Finish):
            self.lines.note(f"{then.status}" + (f": [{then.error_tag}] {then.error_message}" if then.error_tag else ""))
        try:
            await self.write(then)
        except LeaseLost:
            pass

    def _left_to_its_lease(self) -> None:
        """Handed back now, the execution would be claimed and its step run again beside its
        thread (an embedded engine's process goes on). It stays running under this lease,
        renewed no more: another instance takes it over once the lease has ended."""
        steps = ", ".join(sorted(f'"{call.step}"' for call in self.threads))
        log.warning(
            "execution %s of %s: step %s still runs on its thread as this instance stops: the execution stays "
            "running under this instance's lease, taken over once that lease has ended, never beside it",
            self.id, self.function.name, steps,
        )  # fmt: skip

    async def _steps_returned(self) -> None:
        """Before the end is written (after which a retry may run the steps again): no step
        of the execution still runs. A step the code left in flight (its other branch of an
        ``asyncio.gather`` failed it, a task the code did not await) is cancelled if async
        and waited for; a thread cannot be cancelled: it is waited for, the lease renewed
        meanwhile, unless the instance stops (:meth:`interrupt`)."""
        waits: set[asyncio.Future[Any]] = {c.finished for c in self.threads if c.finished is not None}
        for call in list(self.calls):
            if call.is_async and call.task is not None and not call.has_ended:
                call.cancel()
                waits.add(call.task)
        if not waits:
            return
        released = asyncio.ensure_future(self._released.wait())
        try:
            while waits and not released.done():
                _, waits = await asyncio.wait({*waits, released}, return_when=asyncio.FIRST_COMPLETED)
                waits.discard(released)
        finally:
            released.cancel()

    async def _writes_answered(self) -> None:
        """Before the end is written: no checkpoint of a step beside the code's last is still
        on its way (a gathered sibling's, sent as the code failed). The end, landing first,
        refused it: a step that had succeeded ran again on a retry. Unless the instance
        stops meanwhile (:meth:`interrupt`)."""
        released = asyncio.ensure_future(self._released.wait())
        try:
            while self.writing and not released.done():
                answered = self._answered = asyncio.get_running_loop().create_future()
                waits: set[asyncio.Future[Any]] = {answered, released}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
            self._answered = None

    def _cancel_note(self) -> str:
        return "cancelled by an operator; it stopped at a step boundary"

    def _expired_message(self) -> str:
        return f"the execution outlived its {MAX_LIFETIME.days}-day bound (created {self.row.created_at.isoformat()})"

    # -- stopping it from outside ---------------------------------------------------------
    def request_cancel(self) -> None:
        """An operator asked: stop at the next step boundary; async work in flight is
        cancelled now (a step on a thread cannot be: the boundary after it is the stop)."""
        self.cancel_requested = True
        if self.calls:
            for call in list(self.calls):
                if call.is_async:
                    call.cancel()
        elif not self.writing and self.body is not None and self.ending is None:
            self.body.cancel()  # the code is between steps, in its own awaits (or waiting to leave)

    def lose(self, why: str) -> None:
        """The lease is gone: stop at once, write nothing."""
        if self.ending is None or isinstance(self.ending, Released):
            self.ending = LeaseLost(why)
            log.warning("execution %s of %s: %s; this instance stops running it", self.id, self.function.name, why)
        self._cancel_calls()

    def interrupt(self) -> None:
        """The instance stops and cannot wait any longer: leave the code now; the execution
        goes back to the queue (a step cut short here runs again on the next claim)."""
        if self.ending is None:
            self.ending = Released("the instance is stopping")
        self._released.set()
        self._cancel_calls()

    def _cancel_calls(self) -> None:
        now = self.clock.now()
        for call in list(self.threads):
            # A thread cannot be stopped: its call is settled and lingers (the instance stays
            # registered while it runs; the execution is not handed on: see _conclude).
            self.executor.runner.stop_call(call, Outcome("failed", now, TAG_INTERRUPTED, "its execution was let go of"))
        for call in list(self.calls):
            if call not in self.threads:
                call.cancel()
        if self.body is not None:
            self.body.cancel()
        self.departure.wake()

    # -- helpers for the context ------------------------------------------------------
    def check(self) -> None:
        """Raise what stops the code, if anything has (every context call starts here)."""
        if self.ending is not None:
            raise self.ending

    def boundary(self) -> None:
        """A step boundary: where a cancellation or a stopping instance takes effect."""
        self.check()
        if self.cancel_requested:
            self.ending = Cancelled()
            raise self.ending
        if self.stopping:
            self.ending = Released("the instance is stopping")
            raise self.ending

    async def hold_lease(self) -> None:
        """Before a step runs: its lease is past :attr:`held_until` (its renewals failed, or
        were slow): renew it now, or stop (another instance may claim it at its end)."""
        if not await self.executor.renew_one(self):
            self.lose("its lease ran out before it could be renewed")
            assert self.ending is not None
            raise self.ending
        self.boundary()  # (a cancellation the renewal brought)

    def fatal(self, tag: str, message: str, step: str | None = None) -> Fatal:
        """The execution fails at ``step``, which a retry runs again."""
        self.ending = Fatal(tag, message, step, failed_step=step)
        return self.ending

    def nondeterministic(self, name: str, message: str) -> Fatal:
        """The code reached its steps otherwise than recorded: it fails at ``name``, but no
        step failed, so a retry runs none again (a succeeded one never runs twice)."""
        self.ending = Fatal(TAG_NONDETERMINISTIC, message, name)
        return self.ending

    def enter(self, name: str, kind: str) -> tuple[int, StepRecord | None]:
        """The code reached a step, sleep or wait called ``name``: its position, and its
        checkpoint if it has one. Refuses a name used twice and recorded steps reached in
        another order (the recorded data would be replayed into the wrong place)."""
        self.check()
        if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
            raise ValueError(f"a step name must be 1-200 printable characters, not {name!r}")
        if not self.lines.on_its_loop():
            self._elsewhere(name, kind)
        task = current_task()
        if self.unsettled:  # the code went past the failures its task was told of, and past those of ended tasks
            for other in [t for t in self.unsettled if t is task or t is None or t.done()]:
                del self.unsettled[other]
        if self.in_progress:  # (steps at once; or a step inside one, a sleep beside one: refused)
            self._beside(name, kind, task)
        body = self.body
        if not self.by_name and body is not None and task is not body.task:
            # Reached on a task of the code's own (a branch of a gather or a TaskGroup):
            # the order in which branches reach their steps depends on timing, whether or
            # not two of their steps ever ran at once; a replay, whose recorded steps answer
            # at once, reaches them in another. Found by name from now on.
            self.by_name = True
        recorded_at = self.positions.get(name)
        if not self.by_name:
            position = self.position + 1
        elif recorded_at is not None:
            position = recorded_at
        else:  # a new one: after every position recorded or taken
            position = max(self.position, max(self.recorded, default=0)) + 1
        first = self.seen.get(name)
        if first is not None:
            raise self.nondeterministic(
                name,
                f'step name "{name}" is used twice in this execution (positions {first} and {position}); '
                "step names must be unique within an execution",
            )
        if position > self.position:
            self.position = position
        self.seen[name] = position
        self.current_step = name
        self.in_progress[name] = kind
        self._tasks[task] = name
        if recorded_at is not None and recorded_at != position:
            raise self.nondeterministic(
                name,
                f'the code reached step "{name}" at position {position}, but it is recorded at position '
                f"{recorded_at}: it now reaches recorded steps in another order than when they ran "
                "(was the function changed?); its recorded data is not replayed",
            )
        record = self.recorded.get(position)
        if record is not None and record.name != name:
            raise self.nondeterministic(
                name,
                f'the code reached step "{name}" at position {position}, where step "{record.name}" is recorded: '
                "it now reaches recorded steps in another order than when they ran (was the function changed?); "
                "its recorded data is not replayed",
            )
        if record is not None and record.kind != kind:
            raise self.nondeterministic(
                name,
                f'"{name}" at position {position} is recorded as a {record.kind} but was reached as a {kind}',
            )
        if self.lines.held:
            self.lines.reached(task, name, record is not None)
        return position, record

    def _beside(self, name: str, kind: str, task: asyncio.Task[Any] | None) -> None:
        """``name`` is reached while others are in progress: another step beside steps is
        taken (and from now on recorded steps are found by name: see :attr:`by_name`); one
        inside a step's function, or a sleep or a wait beside any, fails the execution."""
        outer = self._tasks.get(task)
        if outer is None and (within := self.lines.within()) in self.in_progress:
            outer = within  # (on a task that step's function started: its function awaits it, or may)
        if outer is not None:
            # Inside another step's function: that one cannot end before this one does, and
            # this one's retry would wait for it to (see join).
            self.ending = Fatal(
                TAG_CONCURRENT_STEPS,
                f'{kind} "{name}" was reached inside step "{outer}": a step\'s function cannot reach a step, a sleep '
                "or a wait of its execution (call it from the code, beside or after that step)",
                name,
            )
            raise self.ending
        for other, what in self.in_progress.items():
            if what != "step" or kind != "step":
                # A sleep or a wait leaves the code: beside a step in progress, it would
                # leave that step running (the next claim would run it again beside itself).
                self.ending = Fatal(
                    TAG_CONCURRENT_STEPS,
                    f'{kind} "{name}" was reached while {what} "{other}" was still in progress: steps may run at '
                    "once (asyncio.gather of steps), but a sleep or a wait runs alone (await the steps before it, "
                    "and it before the next)",
                    name,
                )
                raise self.ending
        self.by_name = True

    def _elsewhere(self, name: str, kind: str) -> NoReturn:
        """``name`` is reached on another event loop than the code's (a thread's
        ``asyncio.run``): inside a step's function, it fails the execution as one reached
        there on the code's own loop does; elsewhere, the code is told how to reach it."""
        outer = self.lines.within()
        if outer is not None and outer in self.in_progress:
            self.ending = Fatal(
                TAG_CONCURRENT_STEPS,
                f'{kind} "{name}" was reached inside step "{outer}" (on an event loop of its own): a step\'s function '
                "cannot reach a step, a sleep or a wait of its execution (call it from the code, beside or after that step)",
                name,
            )
            raise self.ending
        raise RuntimeError(
            f'{kind} "{name}" of execution {self.id} was reached on another event loop than its code\'s: await it '
            "from the code (or from a thread with asyncio.run_coroutine_threadsafe(..., the code's loop))"
        )

    def leave(self, name: str) -> None:
        """The step, sleep or wait ``name`` returned or raised (once :meth:`enter` took it)."""
        task = current_task()
        if self._tasks.get(task) != name:
            return  # (refused before it was taken: a name used twice is the other one's)
        del self._tasks[task]
        del self.in_progress[name]
        self.departure.wake()  # (one waiting to leave the code may now)

    def wake_after(self, what: str, now: datetime, length: timedelta) -> datetime:
        """``now + length``: when a sleep or a wait ends; one past the lifetime bound fails
        the execution ``expired`` at once (see :meth:`check_bound`)."""
        if length > self.deadline - now:
            raise self.fatal(
                TAG_EXPIRED,
                f"{what} of {length.total_seconds():g}s would end after the execution's {MAX_LIFETIME.days}-day bound "
                f"({self.deadline.isoformat()})",
                self.current_step,
            )
        return now + length

    def check_bound(self, what: str, until: datetime) -> None:
        if until > self.deadline:
            raise self.fatal(
                TAG_EXPIRED,
                f"{what} would end at {until.isoformat()}, after the execution's {MAX_LIFETIME.days}-day bound "
                f"({self.deadline.isoformat()})",
                self.current_step,
            )

    # -- writing ----------------------------------------------------------------------
    async def write(
        self, then: Progress | Suspend | Finish, steps: Sequence[StepRecord] = (), now: datetime | None = None
    ) -> None:
        """One transaction under this run's lease, with whatever checkpoints and log lines
        wait to go. Raises :class:`LeaseLost` (and stops the run) when the store refuses
        it or cannot be reached."""
        pending = [*self.pending, *steps] if self.pending else steps
        taken, lines = self.lines.take(pending)  # the engine's notes, and the code's lines before these steps
        write = Write(self.id, self.lease, now or self.clock.now(), then, pending, lines)
        self.writing += 1
        try:
            cancel = await self.store.durable_write(write)
        except Unavailable as exc:
            self.lines.put_back(taken)
            self.lose(f"the store cannot be reached to checkpoint ({exc})")
            raise LeaseLost(str(exc)) from None
        except asyncio.CancelledError:
            if self.ending is not None:
                raise  # (the runner's own: a stop, a lost lease)
            # The code's own (a timeout around the step, a TaskGroup): see InDoubt.
            what = ", ".join(f'{record.kind} "{record.name}"' for record in pending) or "the execution"
            self.ending = InDoubt(
                f"handed back: the code was cancelled while the write of {what} was in flight, which may have "
                "committed; the next claim replays the code from what the store holds"
            )
            raise self.ending from None
        finally:
            self.writing -= 1
            if not self.writing and self._answered is not None and not self._answered.done():
                self._answered.set_result(None)
        if cancel is None:
            if isinstance(self.ending, (Fatal, Cancelled, Ended)):
                self.ending = None  # the end it was writing is not written: its lease is gone
            self.lose("its lease was taken over by another claim")
            assert isinstance(self.ending, LeaseLost)
            raise self.ending
        if self.pending:
            self.pending = []
        if cancel:
            self.cancel_requested = True
        if not isinstance(then, Progress):  # it waits or ended: what operators watch
            self.executor.shared.events.publish("durable", self.id)

    def checkpoint(self, record: StepRecord, now: datetime) -> Coroutine[Any, Any, None]:
        """A step finished (``now``): its outcome, one commit (the write's coroutine, to await)."""
        return self.write(Progress(record.name, now + self.executor.lease_ttl), (record,), now)

    async def suspend(
        self,
        waiting_for: str,
        wake_at: datetime,
        record: StepRecord | None = None,
        signal: str | None = None,
        *,
        step: str | None = None,
    ) -> NoReturn:
        """Write the wait and leave the code: nothing is held while it waits. A ``step``'s
        wait (a retry's) leaves through the departure: it waits for the steps beside it (the
        code gathered steps) to end, and none starts while it is written: see
        :mod:`.departure`."""
        self.check_bound(f'the wait "{waiting_for}"', wake_at)
        if step is not None:
            # A step's wait leaves through the departure even when no step beside it runs:
            # while it is written, a step another task of the code reaches does not start
            # (it started, and ran on with the execution let go of: run again beside itself
            # by the next claim, its outcome recorded nowhere, its attempts never counted).
            await self.departure.join(step, Wait(wake_at, waiting_for, record, signal))
        then = Suspend("waiting", self.current_step, waiting_for, wake_at, signal)
        await self.write(then, [record] if record is not None else [])
        self.ending = Suspended(waiting_for)
        self.executor.poke()  # due already (a signal that arrived meanwhile)? claim it again now
        raise self.ending

    def call_step(self, step: str, fn: Callable[..., Any], args: tuple[Any, ...], is_async: bool) -> StepCall:
        call = StepCall(self, step, args, is_async)
        self.calls.add(call)
        if not is_async:
            self.threads.add(call)  # (until it has ended: StepCall.ended)
        return call

