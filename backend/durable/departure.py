"""Steps of one claimed execution that leave its code together.

A retry's wait lets go of the execution: written while a step beside it still runs, the
next claim would run that step again beside itself (and find an at-most-once one
interrupted). So a step whose retry must wait *joins* the departure: the wait is written
once every other step has ended or joined too (the code gathered steps), by the last to
get there, one wait for all until the earliest, with each one's record; and a step reached
while some wait to leave, their wait being written included, does not start (it joins
without a wait: the next claim runs it).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from backend.durable.errors import Released, Suspended
from backend.durable.store import StepRecord, Suspend

if TYPE_CHECKING:
    from backend.durable.run import ExecutionRun

__all__ = ["Departure", "Wait"]


class Wait(NamedTuple):
    """What a step leaving the code waits for."""

    wake_at: datetime
    waiting_for: str
    record: StepRecord | None
    signal: str | None


class Departure:
    """The steps of one run waiting to leave its code (see the module docstring)."""

    def __init__(self, run: ExecutionRun) -> None:
        self.run = run
        self.waits: dict[str, Wait | None] = {}
        """By step: what it waits for (``None``: it was reached while others waited)."""
        self._written: asyncio.Future[None] | None = None
        """Settled once the one wait has been written (or could not be)."""
        self._joiners: list[asyncio.Future[None]] = []

    @property
    def pending(self) -> bool:
        """A step waits to leave the code: no other step starts."""
        return bool(self.waits)

    async def join(self, step: str, wait: Wait | None) -> NoReturn:
        """Leave the code with the others: wait until no step of the run is in progress
        but those leaving too, then, the last to get here, write the one wait; raises what
        ends the code (:class:`Suspended`, or what stopped the run meanwhile)."""
        run = self.run
        self.waits[step] = wait
        loop = asyncio.get_running_loop()
        while self._written is None and any(name not in self.waits for name in run.in_progress):
            run.check()
            joined = loop.create_future()
            self._joiners.append(joined)
            await joined
        run.check()
        if self._written is not None:  # another wrote it: leave with it
            await asyncio.shield(self._written)
            run.check()
            raise Released("the wait it joined was not written")  # (never: the writer ends the run either way)
        waits = [w for w in self.waits.values() if w is not None]
        if not waits:  # (never: the one with a wait stays here until it is written)
            raise Released("no step waits to leave the code any more")
        self._written = loop.create_future()
        try:
            first = min(waits, key=lambda w: w.wake_at)
            then = Suspend("waiting", run.current_step, first.waiting_for, first.wake_at, first.signal)
            await run.write(then, [w.record for w in waits if w.record is not None])
            run.ending = Suspended(first.waiting_for)
            run.executor.poke()
        finally:
            self._written.set_result(None)
            self.wake()
        raise run.ending

    def wake(self) -> None:
        """Something the joined steps wait for changed (a step ended, the run stops)."""
        if self._joiners:
            joiners, self._joiners = self._joiners, []
            for joined in joiners:
                if not joined.done():
                    joined.set_result(None)
