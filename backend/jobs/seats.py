"""Running the jobs claimed (a part of :class:`~backend.jobs.workers.Workers`): each as a
:class:`JobRun`, on a lane or a thread; the seat it holds, handed on when it ends to the next
job of its queue claimed ahead (see :mod:`backend.jobs.workers`); jobs that never start
going back untouched; and each attempt's end, decided (:func:`decide`), then handed in.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, deque
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from backend.clock import Clock
from backend.jobs.definition import BACKOFF_FIRST_S, Queue, backoff
from backend.jobs.model import JobContext, job_context
from backend.jobs.store import Claimed, Finish, FinishKind, Handover
from backend.model import TAG_ABANDONED, TAG_INTERRUPTED, TAG_LEASE_LOST
from backend.observability.logs import LogTarget
from backend.runtime.runner import TAG_THREADS_EXHAUSTED, Invocation, Outcome, RunnerSaturated
from backend.safetext import in_line

if TYPE_CHECKING:
    from backend.jobs.system import Jobs
    from backend.runtime.liveness import WorkLease
    from backend.runtime.loops import Loops
    from backend.runtime.runner import HandlerRunner

__all__ = ["JobRun", "Seats", "decide"]

log = logging.getLogger("schedtui.jobs")


class JobRun(Invocation):
    """One attempt of one job in this process."""

    __slots__ = ("claimed", "context", "queue", "spare_seat", "started_at", "workers")

    def __init__(self, workers: Seats, queue: Queue, claimed: Claimed, started_at: datetime | None = None) -> None:
        super().__init__("", workers.runtimes[queue.name], queue.name in workers.async_queues)
        self.workers = workers
        self.queue = queue
        self.claimed = claimed
        self.started_at = claimed.started_at if started_at is None else started_at
        """When the attempt started: its claim, or (claimed ahead) when it was handed a seat."""
        self.context: JobContext | None = None
        self.spare_seat: int | None = None
        """The seat this ended attempt left to nobody, while its finish waits to go (see
        :meth:`Seats._hand_spare_seats`)."""

    captured = True

    @property
    def label(self) -> str:
        c = self.claimed  # (worked out when a message needs it: most attempts never do)
        return f"job {c.id} of {self.queue.name} (attempt {c.attempt}/{c.max_attempts})"

    def log_target(self) -> LogTarget:
        c = self.claimed
        return LogTarget("job", c.id, c.tries, c.attempt)

    @property
    def thread_name(self) -> str:
        return f"schedtui-job-{self.queue.name}"

    def begin(self, now: datetime) -> JobContext:
        deadline = self.deadline = now + self.max_runtime
        c = self.claimed
        self.context = job_context(
            c.id, c.queue, json.loads(c.payload), c.attempt, c.max_attempts, c.key, c.cron, deadline, c.created_at,
            self.workers.jobs.actions, c.tries,
        )  # fmt: skip
        return self.context

    def ended(self) -> None:
        # Not at settle: a sync handler past its deadline still runs, and its seat stays
        # taken (the job stays `running`) until its thread returns; only then is the
        # attempt handed in and a retry can start.
        assert self.outcome is not None
        self.workers.ended(self, self.outcome)


def _ended_at(run: JobRun, outcome: Outcome, clock: Clock) -> datetime:
    """When ``run``'s handler ended: when it was settled, unless it ran on after that."""
    return outcome.at if run.given_up_at is None else clock.now()


def decide(
    claimed: Claimed, outcome: Outcome, *, stopping: bool = False, first_backoff: int = BACKOFF_FIRST_S
) -> tuple[FinishKind, datetime | None]:
    """How an attempt ends: the finish kind and, for a retry, when. A failed attempt is
    retried after the backoff while attempts remain; the last one makes the job dead. An
    attempt interrupted by a shutdown (or abandoned) is retried at once: the job did not
    fail, its worker went away."""
    if outcome.status == "succeeded":
        return "succeeded", None
    if outcome.status == "skipped":
        return "release", None  # never started (no handler thread free): no attempt used
    if claimed.attempt >= claimed.max_attempts:
        return "dead", None
    if (stopping and outcome.error_tag == TAG_INTERRUPTED) or outcome.error_tag == TAG_LEASE_LOST:
        return "retry", outcome.at
    return "retry", outcome.at + timedelta(seconds=backoff(claimed.attempt, first_backoff))


class Seats:
    """The runs of the jobs claimed and their seats (see the module): a part of
    :class:`~backend.jobs.workers.Workers`, which sets up the state declared here."""

    jobs: Jobs
    first_backoff: int
    clock: Clock
    loops: Loops
    runner: HandlerRunner
    instance: str
    lease: WorkLease
    queues: dict[str, Queue]
    runtimes: dict[str, timedelta]
    async_queues: set[str]
    running: dict[str, JobRun]
    active: Counter[str]
    finishes: list[tuple[Finish, JobRun]]
    waiting: dict[str, deque[Claimed]]
    ahead_ids: set[str]
    seat_of: dict[str, int]
    handovers: list[tuple[Handover, JobRun]]
    resent: set[tuple[str, int]]
    ended_since: Counter[str]
    due: set[str]
    next_at: dict[str, datetime | None]
    stopping: bool
    wake: asyncio.Event

    def _run(self, claimed: Claimed) -> JobRun:
        """Start a job claimed with a seat: an async one on a lane of its own (which runs
        the jobs handed its seat after it), a sync one on a thread."""
        run = self._take(claimed, claimed.seat, claimed.started_at)
        if run.is_async:
            self.runner.start_lane(run, run.queue.handler, self._successor, self._lane_lost)
        else:
            self._start_thread(run)
        return run

    def _take(self, claimed: Claimed, seat: int | None, started_at: datetime) -> JobRun:
        """A job of ours about to start (on ``seat``)."""
        run = JobRun(self, self.queues[claimed.queue], claimed, started_at)
        self.running[claimed.id] = run
        self.active[claimed.queue] += 1
        if seat is not None:
            self.seat_of[claimed.id] = seat
        return run

    def _start_thread(self, run: JobRun) -> None:
        try:
            self.runner.start(run, run.queue.handler)
        except RunnerSaturated as exc:
            run.settle(Outcome("skipped", self.clock.now(), TAG_THREADS_EXHAUSTED, f"not started: {exc}"))

    def _successor(self, ended: Invocation) -> JobRun | None:
        """A lane's job ended: the next job of its queue claimed ahead, handed its seat (or
        ``None``: the lane ends)."""
        assert isinstance(ended, JobRun) and ended.outcome is not None
        return self._hand_seat(ended, _ended_at(ended, ended.outcome, self.clock))

    def _lane_lost(self, held: Invocation) -> None:
        """A lane was cancelled from elsewhere: its seat is handed to nobody."""
        assert isinstance(held, JobRun)
        self._hand_seat(held, self.clock.now(), hand=False)

    def _release_stale(self, claimed: list[Claimed]) -> None:
        """Jobs a cycle claimed under an epoch of the lease that lapsed while its answer was
        on its way (a partition that healed, a process frozen meanwhile): another instance
        may have taken them over since, so none starts here; they go back untouched (each
        release applies only while the job is still this claim's)."""
        now = self.clock.now()
        log.warning(
            "%d job(s) claimed while this instance's lease lapsed are not started here: they go back to their queue",
            len(claimed),
        )
        for c in claimed:
            finish = Finish(c.id, c.queue, c.tries, "release", c.attempt, c.started_at, now, self.instance)
            self.finishes.append((finish, JobRun(self, self.queues[c.queue], c)))
            self.ahead_ids.add(c.id)  # in hand until handed in: the sweep must not close it as abandoned
            self.due.add(c.queue)
        self.wake.set()

    def _release_waiting(self, name: str) -> None:
        """Jobs of ``name`` claimed ahead go back untouched (no attempt used)."""
        now = self.clock.now()
        waiting = self.waiting[name]
        while waiting:
            c = waiting.popleft()
            finish = Finish(c.id, c.queue, c.tries, "release", c.attempt, c.started_at, now, self.instance)
            self.finishes.append((finish, JobRun(self, self.queues[name], c)))
        self.due.add(name)  # they are due again: claim them (with seats) in the next cycle
        self.wake.set()

    def _hand_spare_seats(self, name: str) -> None:
        """Jobs of ``name`` claimed ahead came back when nothing of their queue runs here:
        each starts on the seat of an attempt that ended while they were on their way (its
        handlers are shorter than a cycle), whose finish has not gone yet. The finish and
        the handover then go in one transaction, as at a lane's hand-on: the seat is never
        free in the store in between. Without this they went back (released) and were
        claimed again, a round trip each for nothing."""
        if self.stopping or not self.lease.fresh():
            return
        waiting = self.waiting[name]
        now = self.clock.now()
        for finish, ended in self.finishes:  # (not sent yet: those sent freed their seats)
            seat = ended.spare_seat
            if seat is None or finish.queue != name:
                continue
            ended.spare_seat = None
            nxt = waiting.popleft()
            self.ahead_ids.discard(nxt.id)
            run = self._take(nxt, seat, now)
            self.handovers.append((Handover(nxt.id, nxt.tries, seat), run))
            if run.is_async:
                self.runner.start_lane(run, run.queue.handler, self._successor, self._lane_lost)
            else:
                self._start_thread(run)
            if not waiting:
                return

    def _hand_seat(self, ended: JobRun, now: datetime, *, hand: bool = True) -> JobRun | None:
        """An attempt ended: its seat goes to the next job of its queue claimed ahead (if
        any, and while this instance may start handlers). That job's run, started here if
        its handler is sync; an async one is the ended one's lane's to run."""
        seat = self.seat_of.pop(ended.claimed.id, None)
        name = ended.queue.name
        waiting = self.waiting[name]
        if not waiting:
            if hand:
                ended.spare_seat = seat
            return None
        if hand and seat is not None and not self.stopping and self.lease.fresh():
            nxt = waiting.popleft()
            self.ahead_ids.discard(nxt.id)
            run = self._take(nxt, seat, now)
            self.handovers.append((Handover(nxt.id, nxt.tries, seat), run))
            if not run.is_async:
                self._start_thread(run)
            return run
        if not self.active[name]:
            self._release_waiting(name)
        return None

    def ended(self, run: JobRun, outcome: Outcome) -> None:
        """An attempt's handler ended (on the engine's loop, once per attempt)."""
        self.active[run.queue.name] -= 1
        c = run.claimed
        now = _ended_at(run, outcome, self.clock)
        held = run.ran_on(now)
        if held is not None and outcome.status == "failed":
            # Settled (timed out, interrupted) while its handler ran on: the attempt ends now.
            outcome = Outcome(
                "failed", now, outcome.error_tag,
                f"{outcome.error_message}: it returned {held:.1f}s later",
                outcome.traceback,
            )  # fmt: skip
        kind, retry_at = decide(c, outcome, stopping=self.stopping, first_backoff=self.first_backoff)
        if kind == "dead":
            log.warning("job %s of %s is dead after %d attempt(s): %s", c.id, c.queue, c.attempt, in_line(outcome.error_message or ""))
        finish = Finish(
            c.id, c.queue, c.tries, kind, c.attempt, run.started_at, outcome.at, self.instance,
            outcome.error_tag, outcome.error_message, retry_at,
        )  # fmt: skip
        self.finishes.append((finish, run))
        self.ended_since[c.queue] += 1
        if not run.is_async:
            self._hand_seat(run, now)  # after the finish: it goes first, freeing the seat
        # (an async one's lane hands its seat on: see _successor)
        if kind == "retry" and retry_at is not None:
            upcoming = self.next_at.get(c.queue)
            if upcoming is None or retry_at < upcoming:
                self.next_at[c.queue] = retry_at  # known here; the next claim would say so too
        if kind == "release":
            self.due.add(c.queue)
        self.wake.set()
        self.loops.poke()

    def _handed_in(self, run: JobRun, finish: Finish, applied: bool) -> None:
        if self.running.get(finish.id) is run:
            del self.running[finish.id]
        self.ahead_ids.discard(finish.id)
        if applied and finish.kind != "release":  # a release never started: no attempt used
            for meter in self.jobs.meters:
                try:
                    meter(finish)
                except Exception:
                    log.exception("a job meter failed")
        if (finish.id, finish.tries) in self.resent:
            self.resent.discard((finish.id, finish.tries))
            if not applied and finish.kind == "release":
                # (An ended attempt sent again is answered as applied where it was, by its
                # record; a release records nothing.)
                log.info("job %s going back untouched was not applied again: most likely the cycle whose "
                         "answer was lost had applied it", finish.id)  # fmt: skip
                return
        if not applied:
            log.warning(
                "late result of job %s (%s, attempt %d) discarded: the job went on without it "
                "(closed as %s by another instance, or retried)",
                finish.id, finish.kind, finish.attempt, TAG_ABANDONED,
            )  # fmt: skip
