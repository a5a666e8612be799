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
ended since its last claim), a cycle also claims up to :data:`~backend.jobs.cycles.AHEAD_ROUNDS` times the
concurrency (at most :data:`~backend.jobs.cycles.AHEAD_MAX`) without a seat: each waits here, and starts at
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
queue has nothing left running to hand them a seat, when the lease lapses, at a stop, and
when their queue changes under them: an operator's action in this process
(:meth:`Workers.holding`: they go back and the handovers of those that started are
written before the action reaches the store, which counts the others as queued) or
elsewhere (a :data:`~backend.jobs.store.REVOKE` notification: a cancel, a delete, a
pause, a lower concurrency), and, for every queue, when the listening connection comes
up again (a notification sent while it was down was heard by nobody here).

**Lanes.** An async job claimed with a seat starts a *lane*, one task that runs it and
then each job handed its seat, one after another
(:meth:`~backend.runtime.runner.HandlerRunner.start_lane`): a burst of short handlers
costs a task per seat, not per job. A sync job runs on a thread of its own.

Each claimed job runs as a :class:`JobRun`, an :class:`~backend.runtime.runner.Invocation`: the
runner calls the handler under the queue's ``max_runtime``, and its outcome decides the
attempt's end: ``succeeded``; a retry after ``min(10 * 2**(attempt-1), 3600)`` seconds;
``dead`` after the last attempt.

The class is in parts, each a mixin in a module of its own: :mod:`~backend.jobs.cycles`
(the claim cycles), :mod:`~backend.jobs.seats` (running the jobs claimed and handing on
their seats) and :mod:`~backend.jobs.stopping` (a stop, a lapse of the lease, and what
they leave); :class:`Workers` holds their state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from backend.jobs.cycles import Cycles, Stream
from backend.jobs.definition import BACKOFF_FIRST_S, Queue
from backend.jobs.seats import JobRun, Seats
from backend.jobs.stopping import Stopping
from backend.jobs.store import REVOKE, Claimed, Finish, Handover

if TYPE_CHECKING:
    from backend.jobs.system import Jobs

__all__ = ["JobRun", "Workers"]

#: How long an operator's action waits for the workers here to write what they hold of its
#: queue (seconds, real time): past it (the store unreachable), the action goes all the same.
HOLD_WAIT = 5.0


class Workers(Cycles, Seats, Stopping):
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
        self.streams = [Stream(frozenset(names[i::count])) for i in range(count)]
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
        self.cycles_cut: list[asyncio.Future[Any]] = []
        """Cycles on their way when a stop cancelled them: the stop waits for their answers."""
        self.unanswered: dict[str, datetime] = {}
        """Claim tokens of cycles that failed (by when): the claim may have committed with
        its answer lost, so jobs `running` here under one of them never started. The sweep
        puts them back untouched (:meth:`release_unanswered`); kept for
        :data:`~backend.jobs.stopping.UNANSWERED_KEPT`, in case the commit lands after the
        failure was seen."""
        self.held: Counter[str] = Counter()
        """Per queue, operator actions on their way in this process (see :meth:`holding`)."""
        self.revokes = 0
        """Holds and revocations begun: a cycle sent before the last one began releases the
        jobs it claimed ahead (its claim may have been made before the action)."""
        self.listened = False
        """Whether the listening connection has been up (see :meth:`heard`)."""
        self.cycled = asyncio.Event()
        """Set as each cycle ends (an action waiting for what it holds to be written)."""
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
        self.store.expect_jobs(cycling=True)
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
        """A notification from another process (the listener); ``None``: the listening
        connection came up. Back up after it was lost, what was said meanwhile was not
        heard: a revoke of any queue may be among it, so every queue's jobs claimed ahead
        go back (the next claim decides on what the store now says). Either way every queue
        is looked at."""
        if queue is None:
            if self.listened:
                for name in self.queues:
                    self.revoke(name)
            self.listened = True
            self.poke()
        elif queue.startswith(REVOKE):
            self.revoke(queue[len(REVOKE):])
        else:
            self.poke(queue)

    def revoke(self, name: str) -> None:
        """Queue ``name`` changed elsewhere (a job cancelled or deleted, a pause, a lower
        concurrency): its jobs claimed ahead here go back untouched, so that none starts
        against what the store now says; the next claim decides anew."""
        if name not in self.queues:
            return
        self.revokes += 1
        if self.waiting[name]:
            self._release_waiting(name)

    @contextlib.asynccontextmanager
    async def holding(self, name: str) -> AsyncIterator[None]:
        """Around an operator's action on queue ``name`` in this process (a cancel, a delete,
        a pause): first its jobs claimed ahead here go back, and the handovers of those that
        started are written, so that the store decides on what is true (a job that started
        is running, one that did not is queued); until the action is done, none is claimed
        ahead or handed a seat."""
        if name not in self.queues:
            yield
            return
        self.held[name] += 1
        try:
            self.revoke(name)
            deadline = asyncio.get_running_loop().time() + HOLD_WAIT
            while self._unwritten(name) and not self.stopping:
                self.cycled.clear()
                self.wake.set()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cycled.wait(), left)
            yield
        finally:
            self.held[name] -= 1
            self.due.add(name)
            self.wake.set()

    def _unwritten(self, name: str) -> bool:
        """Whether jobs of ``name`` claimed ahead here are not yet back, or started with
        their handover not yet written."""
        carried = [*self.finishes, *(item for batch in self.inflight.values() for item in batch)]
        if any(finish.kind == "release" and finish.queue == name for finish, _ in carried):
            return True
        handing = [*self.handovers, *(item for batch in self.inflight_handovers.values() for item in batch)]
        return any(run.queue.name == name for _, run in handing)

    @property
    def idle(self) -> bool:
        return not self.running and not self.finishes and not self.inflight and not self.ahead_ids

    def holds(self, job_id: str, token: str | None) -> bool:
        """Whether a ``running`` job of this instance is in hand here (running, ending,
        claimed ahead, or claimed by a cycle on its way)."""
        return job_id in self.running or job_id in self.ahead_ids or token in self.inflight
