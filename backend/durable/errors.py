"""What a durable function's code may see raised, and the runner's own stop signals.

:class:`StepFailed` is the one error a durable function meets on purpose: a step whose
attempts ran out. The code may catch it (and carry on, or fail as it likes); left alone,
it fails the execution with the step's error.

The rest are the runner's way of leaving the function's code at a step boundary (the
execution waits in the store, its lease was lost, it was cancelled, the instance is
stopping, or replaying it would be wrong). They derive from :class:`BaseException`, like
``asyncio.CancelledError``, so that an ``except Exception`` in user code lets them pass.
"""

from __future__ import annotations

from backend.errors import SchedtuiError

__all__ = ["StepFailed"]


class StepFailed(SchedtuiError):
    """A step failed and has no attempt left. ``step``, ``position``, ``attempts``,
    ``error_tag`` (the last attempt's exception class, ``timeout``, …) and
    ``error_message`` say which and why."""

    title = "Step failed"
    code = "step_failed"

    def __init__(self, step: str, position: int, attempts: int, error_tag: str | None, error_message: str | None) -> None:
        self.step = step
        self.position = position
        self.attempts = attempts
        self.error_tag = error_tag
        self.error_message = error_message
        tries = f"after {attempts} attempts" if attempts > 1 else "(one attempt)"
        super().__init__(
            f'step "{step}" (position {position}) failed {tries}: '
            + ": ".join(filter(None, [error_tag, error_message]))
        )


class Stop(BaseException):
    """The runner leaves the function's code here (see the subclasses)."""


class Suspended(Stop):
    """The execution is waiting in the store (sleep, signal, retry); nothing holds it here."""


class LeaseLost(Stop):
    """Another claim took the execution over, or the store cannot be reached to checkpoint:
    this instance must not write for it any more."""


class Cancelled(Stop):
    """An operator cancelled the execution; it stops at this step boundary."""


class Ended(Stop):
    """The execution's code has returned (or raised): a step called after it, by a task
    it left behind, is not run (its work would be done outside any lease, and recorded
    nowhere)."""


class Released(Stop):
    """This instance is stopping: the execution goes back to the queue at this boundary."""


class InDoubt(Released):
    """The code cancelled a call of its context while that call's write was in flight (a
    timeout around a step, a ``TaskGroup`` whose other task failed): the write was sent, so
    it may commit all the same, and the code, told "cancelled", would go on as if it had
    not, where a replay would find it recorded and take the other way. The execution goes
    back to the queue at once (``note`` says why, in its log), and the next claim replays
    it from what the store holds."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


class Fatal(Stop):
    """Replaying would be wrong (steps reached in another order, a name used twice, an
    at-most-once step found interrupted, the lifetime bound): the execution fails.

    ``step`` is where the code was; ``failed_step`` is the step whose checkpoint a retry
    removes so that it runs again (``None`` when no step failed: the code reached its
    steps otherwise than recorded)."""

    def __init__(self, tag: str, message: str, step: str | None = None, failed_step: str | None = None) -> None:
        super().__init__(message)
        self.tag = tag
        self.message = message
        self.step = step
        self.failed_step = failed_step
