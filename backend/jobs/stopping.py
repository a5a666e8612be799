"""Stopping the job workers, and what a stop leaves (a part of
:class:`~backend.jobs.workers.Workers`): a stop, and a lapse of this instance's lease,
end the attempts in flight and send back the jobs claimed ahead; the ends go to the store
once more; jobs claimed by cycles whose answer never came (their tokens kept for
:data:`UNANSWERED_KEPT`) go back untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from backend.clock import Clock
from backend.errors import Unavailable
from backend.jobs.cycles import Stream
from backend.jobs.seats import JobRun
from backend.jobs.store import Claimed, Finish, Handover, RunningJob
from backend.model import TAG_INTERRUPTED, TAG_LEASE_LOST
from backend.runtime.runner import Outcome
from backend.runtime.subsystems import answers_of

if TYPE_CHECKING:
    from backend.jobs.store import JobStore
    from backend.runtime.liveness import WorkLease
    from backend.runtime.loops import Loops
    from backend.runtime.runner import HandlerRunner

__all__ = ["STOP_WAIT", "UNANSWERED_KEPT", "Stopping"]

log = logging.getLogger("schedtui.jobs")

#: How long the token of a claim that failed is remembered (its commit may land late).
UNANSWERED_KEPT = timedelta(minutes=10)
#: How long a stop waits for cancelled async handlers to return (seconds).
STOP_WAIT = 1.0


class Stopping:
    """A stop and what it leaves (see the module): a part of
    :class:`~backend.jobs.workers.Workers`, which sets up the state declared here."""

    clock: Clock
    loops: Loops
    runner: HandlerRunner
    instance: str
    new_id: Callable[[], str]
    store: JobStore
    lease: WorkLease
    running: dict[str, JobRun]
    finishes: list[tuple[Finish, JobRun]]
    inflight: dict[str, list[tuple[Finish, JobRun]]]
    streams: list[Stream]
    waiting: dict[str, deque[Claimed]]
    handovers: list[tuple[Handover, JobRun]]
    inflight_handovers: dict[str, list[tuple[Handover, JobRun]]]
    unanswered: dict[str, datetime]
    stopping: bool
    cycles_cut: list[asyncio.Future[Any]]

    if TYPE_CHECKING:  # the main class's, and the other parts'

        def poke(self, queue: str | None = None) -> None: ...

        def holds(self, job_id: str, token: str | None) -> bool: ...

        def _release_waiting(self, name: str) -> None: ...

        def _handed_in(self, run: JobRun, finish: Finish, applied: bool) -> None: ...

    def lease_lapsed(self, why: str) -> None:
        """This instance's lease lapsed: stop every attempt in flight (``lease_lost``,
        retried at once: by whoever holds a lease, once the store has the attempt's end or
        the take-over closes it); claimed attempts not started yet never start."""
        now = self.clock.now()
        for name in self.waiting:
            self._release_waiting(name)  # never started: they go back untouched
        for run in list(self.running.values()):
            message = f"stopped: this instance's lease on its work lapsed ({why})"
            self.runner.stop_call(run, Outcome("failed", now, TAG_LEASE_LOST, message))

    async def stop(self, grace: float) -> None:
        """Claim nothing more; let attempts in flight end for up to ``grace`` seconds; end
        the rest as interrupted (retried at once, elsewhere or at the next start); hand
        every ended attempt to the store."""
        self.stopping = True
        with contextlib.suppress(ValueError):
            self.lease.on_lapse.remove(self.lease_lapsed)
            self.lease.on_renewed.remove(self.poke)
        tasks = [run.task for run in self.running.values() if run.task is not None and not run.done]
        if tasks and grace > 0:
            log.info("waiting up to %.0fs for %d job(s) in flight", grace, len(tasks))
            await self.loops.within_grace(tasks, grace)
        now = self.clock.now()
        for run in list(self.running.values()):
            if not run.done:
                self.runner.stop_call(run, Outcome("failed", now, TAG_INTERRUPTED, "the engine stopped while this job ran"))
        # Cancelled async handlers end within a moment (one that ignores its cancellation
        # does not); a sync handler's thread cannot be stopped.
        ending = [run.task for run in self.running.values() if run.task is not None and run.is_async and not run.has_ended]
        if ending:
            await asyncio.wait(ending, timeout=STOP_WAIT)
        lingering = [run for run in self.running.values() if not run.has_ended]
        if lingering:
            log.warning(
                "%d job handler(s) still running as this instance stops (%s): their jobs stay running in the "
                "store under this instance, and are retried once it is gone (at once on this host when the "
                "process has exited, elsewhere after the take-over window), never beside it",
                len(lingering), ", ".join(sorted(run.claimed.id for run in lingering)[:5]),
            )  # fmt: skip
        # What cycles cut short by the stop carried, and what ended since (in doubt: every
        # finish is conditional, so one applied already changes nothing the second time).
        for name in self.waiting:
            self._release_waiting(name)
        cut, self.cycles_cut = self.cycles_cut, []
        await answers_of(cut)  # their answers first: what they claimed is then in the store to be found below
        in_doubt = [item for carried in self.inflight.values() for item in carried]
        for token in self.inflight:  # cut short: their claims may have committed
            self._unanswered(token)
        batch = in_doubt + self.finishes
        handovers = [h for carried in self.inflight_handovers.values() for h, _ in carried] + [h for h, _ in self.handovers]
        self.inflight.clear()
        self.inflight_handovers.clear()
        self.handovers = []
        for stream in self.streams:
            stream.tokens.clear()
            stream.claiming = None
        self.finishes = []
        if batch:
            await self._hand_in_last(batch, len(in_doubt), handovers, now)
        # Whether or not that hand-in was answered (its answer may be lost after its commit),
        # what unanswered claims took goes back: nothing else gives it back before the
        # take-over window.
        if self.unanswered:
            try:
                lost = self.release_unanswered(await self.store.running_jobs(), now)
                if lost:
                    await self.store.finish_jobs(lost)
            except Unavailable as exc:
                log.warning("could not look for jobs claimed by cycles whose answer was lost while stopping: %s", exc)

    async def _hand_in_last(
        self, batch: list[tuple[Finish, JobRun]], in_doubt: int, handovers: list[Handover], now: datetime
    ) -> None:
        """Hand the stop's ended attempts to the store (the first ``in_doubt`` carried by
        cycles cut short: one applied already changes nothing the second time)."""
        try:
            if handovers:  # (a handler that ignored its cancellation keeps its seat)
                applied = (await self.store.cycle_jobs(
                    [f for f, _ in batch], {}, self.instance, self.new_id(), now, handovers=handovers
                )).applied  # fmt: skip
            else:
                applied = await self.store.finish_jobs([f for f, _ in batch])
        except Unavailable as exc:
            # Still `running` in the store under this instance: closed as abandoned (and
            # retried) by the next instance to look, once this one is gone.
            log.warning("could not hand in %d ended job attempt(s) while stopping: %s", len(batch), exc)
            return
        for index, ((finish, run), ok) in enumerate(zip(batch, applied, strict=False)):
            self._handed_in(run, finish, ok or index < in_doubt)

    def _unanswered(self, token: str) -> None:
        """Remember the token of a claim that failed; forget those kept long enough (the
        oldest first: an outage fails a cycle a second)."""
        now = self.clock.now()
        while self.unanswered and now - next(iter(self.unanswered.values())) > UNANSWERED_KEPT:
            del self.unanswered[next(iter(self.unanswered))]
        self.unanswered[token] = now

    def release_unanswered(self, running: Iterable[RunningJob], now: datetime) -> list[Finish]:
        """The ``release`` finishes (back to the queue untouched: no attempt used) of jobs
        ``running`` under this instance by a claim whose answer never came (see
        :attr:`unanswered`): none of them started here."""
        finishes = []
        for job in running:
            if job.instance == self.instance and job.token in self.unanswered and not self.holds(job.id, job.token):
                log.warning("job %s of %s was claimed here by a cycle whose answer was lost: it never started; "
                            "it goes back to its queue untouched", job.id, job.queue)  # fmt: skip
                finishes.append(Finish(job.id, job.queue, job.tries, "release", job.attempt, job.started_at, now, job.instance))
        return finishes
