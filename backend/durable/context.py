"""What a durable function's code works with: ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``.

Every call names an entry of the execution's timeline. Names are unique within an
execution, and the code must reach its recorded entries in the order they were recorded:
that is how a replay knows that the checkpoint it hands back belongs where the code is.
Steps may run at once (``asyncio.gather``); once they have, the order later entries are
reached in depends on timing, and a replay finds recorded entries by name instead (see
:attr:`~backend.durable.run.ExecutionRun.by_name`). An entry already finished is answered
from its checkpoint and never runs again.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from inspect import CO_COROUTINE
from types import FunctionType
from typing import TYPE_CHECKING, Any, Final

from backend.durable.definition import DEFAULT_RETRY, NO_RETRY, Retry
from backend.durable.errors import Ended, StepFailed
from backend.durable.model import MAX_LIFETIME, SAME_AS_JSON, TAG_AT_MOST_ONCE_INTERRUPTED, TAG_NOT_JSON, decode, encode
from backend.durable.store import Progress, StepRecord
from backend.inputs import is_async_callable
from backend.model import TAG_INTERRUPTED
from backend.runtime.runner import TAG_THREADS_EXHAUSTED, Outcome, RunnerSaturated

if TYPE_CHECKING:
    from backend.durable.run import ExecutionRun

__all__ = ["SIGNAL_NAME", "DurableContext"]

#: What a signal's name may be: it travels in URLs and command lines.
SIGNAL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: Longest line ``ctx.log`` keeps.
MAX_LOG_LINE = 2000


_BEYOND_THE_BOUND: Final = 2 * MAX_LIFETIME.total_seconds()


def _seconds(value: float | timedelta, what: str) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be 0 seconds or more, not {value!r}")
    # (Past the lifetime bound, any length fails the execution "expired" alike: one a
    # timedelta or a date cannot hold must not fail it with an OverflowError instead.)
    return timedelta(seconds=min(seconds, _BEYOND_THE_BOUND))



class DurableContext:
    """Handed to a durable function's code with its input: ``handler(ctx, input)``."""

    __slots__ = ("_run",)

    def __init__(self, run: ExecutionRun) -> None:
        self._run = run

    # -- what the code may know --------------------------------------------------------
    @property
    def id(self) -> str:
        return self._run.id

    @property
    def function(self) -> str:
        return self._run.function.name

    @property
    def input(self) -> Any:
        return self._run.input

    @property
    def schedule(self) -> str | None:
        """The schedule that started it, if one did."""
        return self._run.row.schedule

    @property
    def scheduled_at(self) -> datetime | None:
        """The slot it was started for, if a schedule started it."""
        return self._run.row.scheduled_at

    @property
    def fence(self) -> int:
        """The fencing token of this claim of the execution: greater than every earlier
        claim's. The store refuses a displaced claim's writes; give it to your own steps'
        writes to refuse theirs too."""
        return self._run.lease

    @property
    def created_at(self) -> datetime:
        return self._run.row.created_at

    def log(self, message: str) -> None:
        """Add a line to the execution's log (written in the transaction that records the
        next step, sleep or wait its task reaches, or with the end; of a chatty stretch
        between two, only the newest :data:`LOG_LINES` can ever be read: the older are not
        held). The code runs again from its start on every claim, replaying its recorded
        steps: a line it writes before a step that is recorded was written the first time
        through, and is not written again; one before a step that is not was not, and is.
        Where steps run at once, each branch's lines go by that branch's next step; a line
        logged inside a step's function goes with that step's own record."""
        self._run.lines.hold(str(message)[:MAX_LOG_LINE])

    # -- the timeline ----------------------------------------------------------------------
    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | bool | None = None,
        at_most_once: bool = False,
    ) -> Any:
        """Run ``fn(*args)`` as the step ``name`` and return its result (JSON), or the
        checkpointed result of a step that finished before.

        A failed attempt is retried after a durable wait (``retry``: a :class:`Retry`;
        default 3 attempts, 10 s doubling up to 5 min; ``False``: one attempt); the last
        failure raises :class:`StepFailed`. ``at_most_once``: the step is checkpointed as
        started before it runs and is never retried; found started but unfinished after a
        crash, it is not run again and the execution fails (``at_most_once_interrupted``).
        Each attempt is bounded by the function's ``step_timeout``. Steps may run at once
        (``asyncio.gather`` of steps, or of branches of them); a retry's wait then waits for
        the others to end (see :mod:`backend.durable.departure`)."""
        run = self._run
        try:
            position, record = run.enter(name, "step")
            if at_most_once or retry is False:
                policy = NO_RETRY
            elif retry is None or retry is True:
                policy = DEFAULT_RETRY
            elif isinstance(retry, Retry):
                policy = retry
            else:
                raise TypeError(f"retry must be a Retry, False or None, not {retry!r}")
            attempt = 1
            earlier: StepRecord | None = None  # a failed attempt waiting for this retry
            if record is not None:
                if record.status == "succeeded":
                    return decode(record.output)
                if record.status == "failed":
                    run.failing(name)
                    run.failure = StepFailed(name, position, record.attempt, record.error_tag, record.error_message)
                    raise run.failure
                if record.status == "running" and record.at_most_once:
                    when = record.started_at.isoformat() if record.started_at else "?"
                    raise run.fatal(
                        TAG_AT_MOST_ONCE_INTERRUPTED,
                        f'at-most-once step "{name}" (position {position}) started at {when} and never finished '
                        "(its instance stopped or lost the execution, or the code cancelled it); it is not run again",
                        name,
                    )
                if record.status == "waiting":  # a failed attempt waiting for its retry
                    if record.wake_at is not None and record.wake_at > run.now:
                        await run.suspend(f"retry:{name}", record.wake_at, step=name)
                    attempt = record.attempt + 1
                    earlier = record
            run.boundary()
            if run.departure.pending:  # a step beside it waits to leave the code: it does not start now
                await run.departure.join(name, None)
            if run.clock.now() >= run.held_until:
                await run.hold_lease()
            if not callable(fn):
                raise TypeError(f'step "{name}": {fn!r} is not callable')
            started: datetime | None = None
            if at_most_once:
                started = run.now
                mark = StepRecord(position, name, "step", "running", attempt, started, at_most_once=True, gathered=run.by_name)
                await run.write(Progress(name, started + run.executor.lease_ttl), [mark])
                # A cancellation this write brought news of stops the step before it runs:
                # one that runs at most once is the step an operator cancels to prevent.
                try:
                    run.boundary()
                except Ended:
                    run.never_called(mark)
                    raise
            # (a plain coroutine function, nearly every step, without asking inspect)
            is_async = (type(fn) is FunctionType and bool(fn.__code__.co_flags & CO_COROUTINE)) or is_async_callable(fn)
            call = run.call_step(name, fn, args, is_async)
            try:
                if is_async:  # on the code's own task: the code awaits it at once anyway
                    inside = run.lines.inside(name)
                    try:
                        await run.executor.runner.run_here(call, lambda arguments: fn(*arguments))
                    finally:
                        run.lines.outside(inside)
                    outcome = call.outcome
                    assert outcome is not None  # (run_here settles every call)
                else:
                    assert call.finished is not None
                    try:
                        run.executor.runner.start(call, lambda arguments: run.lines.on_thread(name, fn, arguments))
                    except RunnerSaturated as exc:
                        call.settle(Outcome("failed", run.now, TAG_THREADS_EXHAUSTED, f"not started: {exc}"))
                    outcome = await call.finished
            except asyncio.CancelledError:
                call.cancel()  # the code is cancelled: so is the step it waits for
                raise
            finally:
                run.calls.discard(call)
            run.check()
            if started is None:
                started = call.started or outcome.at  # (never begun: not started for lack of a thread or lease)
            last_attempt = attempt >= policy.attempts
            if outcome.status == "succeeded":
                value = outcome.value
                text, problem = encode(value)
                if problem is None:
                    # A success after failed attempts keeps the last failure: the timeline shows it.
                    tag = earlier.error_tag if earlier is not None else None
                    why = f"attempt {earlier.attempt} failed: {earlier.error_message}" if earlier is not None else None
                    done = StepRecord(position, name, "step", "succeeded", attempt, started, outcome.at, None, text, tag, why,
                                      at_most_once, gathered=run.by_name)  # fmt: skip
                    await run.checkpoint(done, outcome.at)
                    # Exactly what a replay will return: the value itself where its JSON gives it back as it is.
                    return value if type(value) in SAME_AS_JSON else json.loads(text)
                outcome = Outcome("failed", outcome.at, TAG_NOT_JSON, f"its result {problem}")
                last_attempt = True  # the same code returns the same kind of value
            if run.cancel_requested and outcome.error_tag == TAG_INTERRUPTED:
                run.boundary()
            what = f"[{outcome.error_tag}] {outcome.error_message}"
            if not last_attempt:
                wake = outcome.at + policy.delay_after(attempt)
                run.lines.note(
                    f'step "{name}" attempt {attempt} of {policy.attempts} failed: {what}; next attempt at {wake.isoformat()}'
                )
                waiting = StepRecord(position, name, "step", "waiting", attempt, started, outcome.at, wake_at=wake,
                                     error_tag=outcome.error_tag, error_message=outcome.error_message, gathered=run.by_name)  # fmt: skip
                await run.suspend(f"retry:{name}", wake, waiting, step=name)
            run.lines.note(f'step "{name}" failed (attempt {attempt} of {policy.attempts}): {what}')
            failed = StepRecord(position, name, "step", "failed", attempt, started, outcome.at, error_tag=outcome.error_tag,
                                error_message=outcome.error_message, at_most_once=at_most_once, gathered=run.by_name)  # fmt: skip
            run.failing(name)  # (before its checkpoint: an end decided meanwhile, by a sibling's failure, knows of it)
            await run.checkpoint(failed, outcome.at)
            run.failure = StepFailed(name, position, attempt, outcome.error_tag, outcome.error_message)
            raise run.failure
        finally:
            run.leave(name)

    async def sleep(self, name: str, duration: float | timedelta) -> None:
        """Wait ``duration`` (seconds or a timedelta) durably: the execution waits in the
        store, holding nothing, and resumes after it on any live instance."""
        run = self._run
        length = _seconds(duration, f'sleep "{name}"')
        try:
            position, record = run.enter(name, "sleep")
            if record is not None and record.status == "succeeded":
                return
            run.boundary()
            now = run.now
            started = record.started_at if record is not None and record.started_at else now
            wake = record.wake_at if record is not None and record.wake_at else run.wake_after(f'the sleep "{name}"', now, length)
            if wake <= now:
                run.pending.append(StepRecord(position, name, "sleep", "succeeded", 1, started, now, wake_at=wake, gathered=run.by_name))
                return
            waiting = None if record is not None else StepRecord(
                position, name, "sleep", "waiting", 1, started, wake_at=wake, gathered=run.by_name
            )
            await run.suspend(f"sleep:{name}", wake, waiting)
        finally:
            run.leave(name)

    async def wait_for(self, name: str, timeout: float | timedelta | None = None) -> Any:
        """Wait durably for the signal ``name`` (``schedtui durable signal ID NAME``) and
        return its payload; ``None`` once ``timeout`` has passed without it (no timeout:
        until the execution's lifetime bound). A signal sent before the code gets here is
        kept and taken at once."""
        run = self._run
        length = None if timeout is None else _seconds(timeout, f'wait_for "{name}" timeout')
        if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
            raise ValueError(f"signal name {name!r} must be 1-128 letters, digits, '_', '.', ':' or '-'")
        try:
            position, record = run.enter(name, "signal")
            if record is not None and record.status == "succeeded":
                return decode(record.output)
            run.boundary()
            now = run.now
            started = record.started_at if record is not None and record.started_at else now
            if record is not None:
                wake = record.wake_at or run.deadline
            else:
                wake = run.wake_after(f'the wait "{name}"', now, length) if length is not None else run.deadline
            # A signal counts if it was sent by the wait's deadline: so a replay decides as the
            # first run did, whenever it happens (a later signal does not undo a timeout).
            signal = run.signals.get(name)
            if signal is not None and signal[1] <= wake:
                payload = signal[0]
                run.pending.append(StepRecord(position, name, "signal", "succeeded", 1, started, now, output=payload, gathered=run.by_name))
                return decode(payload)
            if wake <= now:
                run.pending.append(
                    StepRecord(position, name, "signal", "succeeded", 1, started, now, wake_at=wake, output="null",
                               error_message="timed out without the signal", gathered=run.by_name)  # fmt: skip
                )
                return None
            waiting = None if record is not None else StepRecord(
                position, name, "signal", "waiting", 1, started, wake_at=wake, gathered=run.by_name
            )
            await run.suspend(f"signal:{name}", wake, waiting, signal=name)
        finally:
            run.leave(name)
