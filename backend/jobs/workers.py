"""Claiming jobs and running them through the shared handler runner (``serve`` only).

One loop, the *dispatcher*, does all of this process's talking to the store for the
queue, in cycles: each cycle hands in the attempts that ended since the last one and
claims, for every queue with room, as many due jobs as it has room for, in one
transaction (see :meth:`~backend.jobs.store.JobStore.cycle_jobs`). Attempts that end
while a cycle is on its way wait for the next: a burst of short jobs costs a cycle per
batch, not a transaction per job.

**Streams.** The queues are dealt round to :attr:`~backend.jobs.store.JobStore.job_streams`
streams (two on PostgreSQL, one on SQLite), each with its own cycles: while one stream's
cycle is in the database, this process runs the jobs another's brought back. Within a
stream one cycle claims at a time (two claiming the same queues would race for the same
seats and rows). Attempts that end while a claim of the stream is on its way wait for it to
come back and go with the next cycle (one transaction for both); while no claim is, one
more cycle may hand them in.

The dispatcher claims for a queue when it has room and reason to: a send in this process
or a notification from another, jobs left over by the last claim, the next known due
time, or the fallback poll. It parks on the injected clock otherwise, so
:meth:`~backend.scheduler.engine.Engine.quiesce` sees it idle.

**Claiming ahead.** A seat changes hands in the cycle that hands in the attempt that held
it, so a queue whose handlers are shorter than a cycle would run at one cycle per seat
and job. For such a queue (async, with a backlog, and a concurrency's worth of attempts
ended since its last claim), a cycle also claims up to :data:`AHEAD_ROUNDS` times the
concurrency (at most :data:`AHEAD_MAX`) without a seat: each waits here, and starts at
once on the seat of an attempt of its queue that ends, the *handover* going to the store
in the next cycle after that attempt's finish (:class:`~backend.jobs.store.Handover`);
one that ends before that needs no handover (its finish follows the one that freed its
seat). Every running handler is on a seat its worker holds in the store, so the cap holds
fleet-wide; a job claimed ahead is ``running`` under its own fencing token from its
claim. A stream's cycles go one at a time while a handover of its queues is pending or on
its way (a finish must reach the store before the handover of its seat). Jobs claimed
ahead that come back when every attempt of their queue here ended meanwhile start on the
seats those attempts left, their finishes not sent yet (one transaction for finish and
handover again). Jobs claimed ahead go back (``release``: no attempt used) when their
queue has nothing left running to hand them a seat, when the lease lapses, and at a stop.

**Lanes.** An async job claimed with a seat starts a *lane*, one task that runs it and
then each job handed its seat, one after another
(:meth:`~backend.runtime.runner.HandlerRunner.start_lane`): a burst of short handlers
costs a task per seat, not per job. A sync job runs on a thread of its own.

Each claimed job runs as a :class:`JobRun`, an :class:`~backend.runtime.runner.Invocation`: the
runner calls the handler under the queue's ``max_runtime``, and its outcome decides the
attempt's end: ``succeeded``; a retry after ``min(10 * 2**(attempt-1), 3600)`` seconds;
``dead`` after the last attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from backend.clock import Clock
from backend.errors import Unavailable
from backend.jobs.definition import BACKOFF_FIRST_S, Queue, backoff
from backend.jobs.model import JobContext, job_context
from backend.jobs.store import Claimed, Finish, FinishKind, Handover, QueueSpec, RunningJob
from backend.model import TAG_ABANDONED, TAG_INTERRUPTED, TAG_LEASE_LOST
from backend.observability.logs import LogTarget
from backend.runtime.runner import TAG_THREADS_EXHAUSTED, Invocation, Outcome, RunnerSaturated

if TYPE_CHECKING:
    from backend.jobs.system import Jobs

__all__ = ["JobRun", "Workers"]

log = logging.getLogger("schedtui.jobs")

#: How long the dispatcher waits after the store failed a cycle before trying again (seconds).
RETRY_AFTER_TROUBLE = 1.0
#: How long the token of a claim that failed is remembered (its commit may land late).
UNANSWERED_KEPT = timedelta(minutes=10)
#: How long a stop waits for cancelled async handlers to return (seconds).
STOP_WAIT = 1.0
#: Per queue, jobs claimed ahead at most, in multiples of its concurrency (see the module)...
AHEAD_ROUNDS = 16
#: ... and in all. A cycle's own costs (its statements, commit and round trip, and this
#: process's part) are large beside a short job's: with tests/bench/queue.py's no-op jobs,
#: 4 rounds drained at 0.7 times the rate of 16.
AHEAD_MAX = 256


class _Stream:
    """Some of the queues, with their own cycles (see the module): at most one of its
    cycles claims at a time; when none does, at most one more, that only hands in."""

    __slots__ = ("claiming", "names", "tokens")

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.claiming: str | None = None
        """The token of its cycle on its way that claims, if one does. Two that claim the
        same queues would race each other for the same seats and rows: measured with
        tests/bench/queue.py, that drains at half the rate of one."""
        self.tokens: set[str] = set()
        """Its cycles on their way."""


class JobRun(Invocation):
    """One attempt of one job in this process."""

    __slots__ = ("claimed", "context", "queue", "spare_seat", "started_at", "workers")

    def __init__(self, workers: Workers, queue: Queue, claimed: Claimed, started_at: datetime | None = None) -> None:
        super().__init__("", workers.runtimes[queue.name], queue.name in workers.async_queues)
        self.workers = workers
        self.queue = queue
        self.claimed = claimed
        self.started_at = claimed.started_at if started_at is None else started_at
        """When the attempt started: its claim, or (claimed ahead) when it was handed a seat."""
        self.context: JobContext | None = None
        self.spare_seat: int | None = None
        """The seat this ended attempt left to nobody, while its finish waits to go (see
        :meth:`Workers._hand_spare_seats`)."""

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


class Workers:
    """Runs the queues this process defines. See the module for the cycle.

    Contract: every claimed job is run exactly once here and its attempt handed to the
    store exactly once (:attr:`running` holds it until the store has it); the room asked
    for per queue never exceeds the queue's concurrency minus the attempts in flight.
    """

    def __init__(self, jobs: Jobs, queues: Iterable[Queue], *, poll_interval: float, first_backoff: int = BACKOFF_FIRST_S) -> None:
        self.jobs = jobs
        self.first_backoff = first_backoff
        shared = jobs.shared
        self.clock = shared.clock
        self.loops = shared.loops
        self.runner = shared.runner
        self.outages = shared.outages
        self.instance = shared.instance
        self.new_id = shared.new_id
        self.store = jobs.store
        self.lease = shared.registry.lease
        self.queues = {q.name: q for q in queues}
        self.runtimes = {q.name: timedelta(seconds=q.max_runtime) for q in self.queues.values()}
        self.async_queues = {q.name for q in self.queues.values() if q.is_async}
        """Queues of async handlers: each claimed job with a seat starts a lane that runs the
        jobs handed its seat after it (see :meth:`~backend.runtime.runner.HandlerRunner.start_lane`)."""
        self.poll_interval = timedelta(seconds=poll_interval)
        self.running: dict[str, JobRun] = {}
        """Claimed here and not yet handed to the store as ended."""
        self.active: Counter[str] = Counter()
        """Per queue, attempts whose handler has not ended yet."""
        self.asked: Counter[str] = Counter()
        """Per queue, the room asked for by the cycles on their way."""
        self.finishes: list[tuple[Finish, JobRun]] = []
        """Ended attempts not yet in a cycle."""
        self.inflight: dict[str, list[tuple[Finish, JobRun]]] = {}
        """The cycles on their way (by their claim token), with the ended attempts they carry."""
        names = sorted(self.queues)
        count = max(1, min(len(names), self.store.job_streams))
        self.streams = [_Stream(frozenset(names[i::count])) for i in range(count)]
        """The queues, dealt round in their names' order to the streams (see the module)."""
        self.stream_of = {name: stream for stream in self.streams for name in stream.names}
        self.waiting: dict[str, deque[Claimed]] = {name: deque() for name in self.queues}
        """Per queue, jobs claimed ahead (no seat yet), oldest first."""
        self.ahead_ids: set[str] = set()
        """Jobs claimed here that are not running: waiting (claimed ahead), or going back
        (released) until that is handed in."""
        self.seat_of: dict[str, int] = {}
        """The seat each running attempt here holds in the store (its own, or handed over)."""
        self.handovers: list[tuple[Handover, JobRun]] = []
        """Handovers not yet in a cycle (each after the finish that frees its seat)."""
        self.inflight_handovers: dict[str, list[tuple[Handover, JobRun]]] = {}
        """The handovers the cycles on their way carry (by their token)."""
        self.resent: set[tuple[str, int]] = set()
        """Ends (job id, tries) handed in again after a cycle that failed: the failed one
        may have applied them (their second hand-in then does not apply)."""
        self.unanswered: dict[str, datetime] = {}
        """Claim tokens of cycles that failed (by when): the claim may have committed with
        its answer lost, so jobs `running` here under one of them never started. The sweep
        puts them back untouched (:meth:`release_unanswered`); kept for
        :data:`UNANSWERED_KEPT`, in case the commit lands after the failure was seen."""
        self.ahead_asked: Counter[str] = Counter()
        """Per queue, jobs asked for ahead by the cycle on its way."""
        self.ended_since: Counter[str] = Counter()
        """Per queue, attempts ended since its last claim was sent."""
        self.fast: set[str] = set()
        """Queues whose last claim saw a concurrency's worth of attempts end since the one
        before: their handlers are shorter than a cycle, worth claiming ahead for."""
        self.due: set[str] = set(self.queues)
        """Queues with a reason to claim now (a send, a notification, a retry due)."""
        self.backlog: set[str] = set()
        """Queues whose last claim got all it asked for: there may be more."""
        self.next_at: dict[str, datetime | None] = {}
        self.polled_at: dict[str, datetime] = {}
        self.trouble_until: datetime | None = None
        self.stopping = False
        self.wake = asyncio.Event()
        self.defined = False

    @property
    def tokens(self) -> set[str]:
        """Tokens of the claims on their way: their jobs are ours though not yet known."""
        return set(self.inflight)

    # -- the dispatcher ------------------------------------------------------------------
    def start(self) -> None:
        self.wake = asyncio.Event()
        self.lease.on_lapse.append(self.lease_lapsed)
        self.lease.on_renewed.append(self.poke)
        self.loops.expect("jobs")
        self.loops.keep(self._dispatch, "jobs")
        if self.store.job_notifications:
            self.loops.keep(lambda: self.store.watch_jobs(self.heard), "jobs listener")

    def poke(self, queue: str | None = None) -> None:
        """There may be work for ``queue`` (``None``: for every queue)."""
        if queue is None:
            self.due.update(self.queues)
        elif queue in self.queues:
            self.due.add(queue)
        else:
            return
        self.wake.set()

    def heard(self, queue: str | None) -> None:
        """A notification from another process (the listener)."""
        self.poke(queue)

    @property
    def idle(self) -> bool:
        return not self.running and not self.finishes and not self.inflight and not self.ahead_ids

    def holds(self, job_id: str, token: str | None) -> bool:
        """Whether a ``running`` job of this instance is in hand here (running, ending,
        claimed ahead, or claimed by a cycle on its way)."""
        return job_id in self.running or job_id in self.ahead_ids or token in self.inflight

    def room(self, queue: Queue) -> int:
        free = queue.concurrency - self.active[queue.name] - self.asked[queue.name]
        if queue.name not in self.async_queues:
            free = min(free, self.runner.pool.max_threads - self.runner.pool.busy - sum(self.asked.values()))
        return free

    def ahead(self, queue: Queue) -> int:
        """How many more jobs of ``queue`` to claim ahead (see the module)."""
        name = queue.name
        if name not in self.async_queues or name not in self.fast or name not in self.backlog or not self.store.job_reservations:
            return 0
        return min(AHEAD_ROUNDS * queue.concurrency, AHEAD_MAX) - len(self.waiting[name]) - self.ahead_asked[name]

    def _wanted(self, now: datetime, stream: _Stream) -> tuple[dict[str, int], dict[str, int]]:
        if self.stopping or not self.lease.fresh():
            return {}, {}  # (woken when the lease is renewed)
        wanted: dict[str, int] = {}
        ahead: dict[str, int] = {}
        for name in stream.names:
            queue = self.queues[name]
            room = self.room(queue)
            more = self.ahead(queue)
            if room <= 0 and more <= 0:
                continue
            polled = self.polled_at.get(name)
            upcoming = self.next_at.get(name)
            if (
                name in self.due
                or name in self.backlog
                or polled is None
                or polled + self.poll_interval <= now
                or (upcoming is not None and upcoming <= now)
            ):
                if room > 0:
                    wanted[name] = room
                if more > 0:
                    ahead[name] = more
        return wanted, ahead

    def _park_until(self, now: datetime) -> datetime | None:
        if self.trouble_until is not None:
            return self.trouble_until
        if not self.lease.fresh():
            return None  # woken when the lease is renewed
        times = []
        for name, queue in self.queues.items():
            if self.room(queue) <= 0 or self.stream_of[name].claiming is not None:
                continue  # woken by its attempts ending, or by the claim on its way coming back
            polled = self.polled_at.get(name)
            times.append(polled + self.poll_interval if polled is not None else now)
            upcoming = self.next_at.get(name)
            if upcoming is not None:
                times.append(upcoming)
        return min(times) if times else None

    async def _define(self) -> None:
        """Record this process's queue settings (serve is their authority)."""
        specs = [QueueSpec(q.name, q.concurrency, q.attempts, q.max_runtime) for q in self.queues.values()]
        while not self.defined:
            try:
                await self.store.define_queues(specs, self.clock.now(), update=True)
                self.defined = True
            except Unavailable as exc:
                self.outages.trouble("jobs", "store unavailable to the job workers", exc)
                await self.loops.park("jobs", self.clock.now() + timedelta(seconds=RETRY_AFTER_TROUBLE))

    async def _dispatch(self) -> None:
        await self._define()
        while True:
            now = self.clock.now()
            if self.trouble_until is not None and now >= self.trouble_until:
                self.trouble_until = None
            sent = False
            if self.trouble_until is None:
                for stream in self.streams:
                    sent = self._maybe_send(stream, now) or sent
            if not sent:
                await self.loops.park("jobs", self._park_until(now), self.wake)

    def _maybe_send(self, stream: _Stream, now: datetime) -> bool:
        """Send a cycle for ``stream`` if it has reason to: claims to make, or ended
        attempts to hand in with no cycle of its that only hands in on its way."""
        names = stream.names
        mine = len(self.streams) == 1
        # One cycle at a time while handovers are pending or on their way: a later cycle
        # must not overtake the finish that frees a handed-over seat.
        serial = any(mine or run.queue.name in names for _, run in self.handovers) or any(
            self.inflight_handovers.get(token) for token in stream.tokens
        )
        if serial and stream.tokens:
            return False
        if stream.claiming is not None and not self.stopping:
            # Attempts that end while a claim is on its way go with the next cycle: one
            # transaction, not two (the seats they free were not the claim's to take).
            return False
        wanted, ahead = self._wanted(now, stream)
        if not (wanted or ahead) and stream.tokens:
            return False
        if mine:
            batch, self.finishes = self.finishes, []
            handing, self.handovers = self.handovers, []
        else:
            batch = [item for item in self.finishes if item[0].queue in names]
            handing = [item for item in self.handovers if item[1].queue.name in names]
            if batch:
                self.finishes = [item for item in self.finishes if item[0].queue not in names]
            if handing:
                self.handovers = [item for item in self.handovers if item[1].queue.name not in names]
        if not (wanted or ahead or batch or handing):
            return False
        # A job that ended before its handover was written needs none: its finish goes in
        # the same cycle, after the one that freed its seat.
        if handing and batch:
            ending = {f.id for f, _ in batch}
            handing = [item for item in handing if item[0].id not in ending]
        self._send_cycle(stream, batch, handing, wanted, ahead, now)
        return True

    def _send_cycle(
        self,
        stream: _Stream,
        batch: list[tuple[Finish, JobRun]],
        handovers: list[tuple[Handover, JobRun]],
        wanted: dict[str, int],
        ahead: dict[str, int],
        now: datetime,
    ) -> None:
        token = self.new_id()
        self.inflight[token] = batch
        self.inflight_handovers[token] = handovers
        stream.tokens.add(token)
        if wanted or ahead:
            stream.claiming = token
        self.asked.update(wanted)
        self.ahead_asked.update(ahead)
        for name in {**wanted, **ahead}:
            self.polled_at[name] = now
            queue = self.queues[name]
            if self.ended_since[name] >= queue.concurrency:
                self.fast.add(name)
            else:
                self.fast.discard(name)
            self.ended_since[name] = 0
            if self.room(queue) <= 0:
                self.due.discard(name)  # all its room is asked for; a later reason sets it again
        epoch = self.lease.epoch  # (what it claims is claimed under this epoch of the lease)
        self.loops.spawn(self._cycle(stream, token, batch, handovers, wanted, ahead, now, epoch), "jobs cycle")

    async def _cycle(
        self,
        stream: _Stream,
        token: str,
        batch: list[tuple[Finish, JobRun]],
        handovers: list[tuple[Handover, JobRun]],
        wanted: dict[str, int],
        ahead: dict[str, int],
        now: datetime,
        epoch: int,
    ) -> None:
        try:
            cycle = await self.store.cycle_jobs(
                [f for f, _ in batch], wanted, self.instance, token, now,
                ahead=ahead or None, handovers=[h for h, _ in handovers],
            )  # fmt: skip
        except Exception as exc:
            if not isinstance(exc, Unavailable):
                log.exception("a job cycle failed")
            self.outages.trouble("jobs", "store unavailable to the job workers", exc)
            for _, run in batch:
                run.spare_seat = None  # (its finish may have been applied: the seat may be free)
            self.finishes[:0] = batch  # handed in again with the next cycle
            self.resent.update((finish.id, finish.tries) for finish, _ in batch)
            self.handovers[:0] = handovers
            self.asked.subtract(wanted)
            self.ahead_asked.subtract(ahead)
            self.inflight.pop(token, None)
            self.inflight_handovers.pop(token, None)
            if wanted or ahead:
                self._unanswered(token)
            stream.tokens.discard(token)
            if stream.claiming == token:
                stream.claiming = None
            self.due.update(wanted)
            self.due.update(ahead)
            self.trouble_until = self.clock.now() + timedelta(seconds=RETRY_AFTER_TROUBLE)
            self.wake.set()
            return
        for (finish, run), applied in zip(batch, cycle.applied, strict=False):
            self._handed_in(run, finish, applied)
        for (handover, run), moved in zip(handovers, cycle.handed, strict=False):
            if not moved and not run.done:
                # The attempt whose seat it took was closed elsewhere: the seat is not ours.
                message = f"stopped: seat {handover.seat} it started on was taken over (this instance's lease lapsed)"
                self.runner.stop_call(run, Outcome("failed", self.clock.now(), TAG_LEASE_LOST, message))
        claimed_jobs = cycle.claimed
        if claimed_jobs and not self.lease.holds(epoch):
            self._release_stale(claimed_jobs)
            claimed_jobs = []
        got: Counter[str] = Counter()
        for claimed in claimed_jobs:
            got[claimed.queue] += 1
            if claimed.seat is None:
                self.waiting[claimed.queue].append(claimed)
                self.ahead_ids.add(claimed.id)
            else:
                self._run(claimed)
        for name in sorted({f.queue for f, _ in batch} | set(got)):
            self.jobs.shared.events.publish("jobs", name)  # a job started or ended there
        self.asked.subtract(wanted)
        self.ahead_asked.subtract(ahead)
        for name in {**wanted, **ahead}:
            self.next_at[name] = cycle.next_at.get(name)
            if got[name] >= wanted.get(name, 0) + ahead.get(name, 0):
                self.backlog.add(name)
            else:
                self.backlog.discard(name)
            if self.waiting[name] and not self.active[name]:
                self._hand_spare_seats(name)
                if self.waiting[name] and not self.active[name]:
                    self._release_waiting(name)  # nothing of its queue runs here to hand it a seat
        self.inflight.pop(token, None)  # after its jobs are in `running`: the sweep sees one or the other
        self.inflight_handovers.pop(token, None)
        stream.tokens.discard(token)
        if stream.claiming == token:
            stream.claiming = None
        self.wake.set()
        self.loops.poke()

    # -- running -------------------------------------------------------------------------
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
            log.warning("job %s of %s is dead after %d attempt(s): %s", c.id, c.queue, c.attempt, outcome.error_message)
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
            if not applied:
                log.info("the end of job %s (%s, attempt %d) was not applied again: most likely the cycle "
                         "whose answer was lost had applied it", finish.id, finish.kind, finish.attempt)  # fmt: skip
                return
        if not applied:
            log.warning(
                "late result of job %s (%s, attempt %d) discarded: the job went on without it "
                "(closed as %s by another instance, or retried)",
                finish.id, finish.kind, finish.attempt, TAG_ABANDONED,
            )  # fmt: skip

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

    # -- stopping ------------------------------------------------------------------------
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
            await asyncio.wait(tasks, timeout=grace)
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
                self._handed_in(run, finish, ok or index < len(in_doubt))
        if self.unanswered:
            try:
                lost = self.release_unanswered(await self.store.running_jobs(), now)
                if lost:
                    await self.store.finish_jobs(lost)
            except Unavailable as exc:
                log.warning("could not look for jobs claimed by cycles whose answer was lost while stopping: %s", exc)

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
