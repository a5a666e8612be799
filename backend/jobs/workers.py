"""Claiming jobs and running them through the shared handler runner (``serve`` only).

One loop, the *dispatcher*, does all of this process's talking to the store for the
queue, one cycle at a time: each cycle hands in the attempts that ended since the last
one and claims, for every queue with room, as many due jobs as it has room for, in one
transaction (see :meth:`~backend.jobs.store.JobStore.cycle_jobs`). Attempts that end
while a cycle is on its way wait for the next: a burst of short jobs costs a cycle per
batch, not a transaction per job.

The dispatcher claims for a queue when it has room and reason to: a send in this process
or a notification from another, jobs left over by the last claim, the next known due
time, or the fallback poll. It parks on the injected clock otherwise, so
:meth:`~backend.scheduler.engine.Engine.quiesce` sees it idle.

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
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from backend.errors import Unavailable
from backend.jobs.definition import Queue, backoff
from backend.jobs.model import JobContext
from backend.jobs.store import Claimed, Finish, FinishKind, QueueSpec
from backend.model import TAG_ABANDONED, TAG_INTERRUPTED, TAG_LEASE_LOST
from backend.observability.logs import LogTarget
from backend.runtime.runner import TAG_THREADS_EXHAUSTED, Invocation, Outcome, RunnerSaturated

if TYPE_CHECKING:
    from backend.jobs.system import Jobs

__all__ = ["JobRun", "Workers"]

log = logging.getLogger("schedtui.jobs")

#: How long the dispatcher waits after the store failed a cycle before trying again (seconds).
RETRY_AFTER_TROUBLE = 1.0
#: How long a stop waits for cancelled async handlers to return (seconds).
STOP_WAIT = 1.0


class JobRun(Invocation):
    """One attempt of one job in this process."""

    __slots__ = ("claimed", "context", "queue", "workers")

    def __init__(self, workers: Workers, queue: Queue, claimed: Claimed) -> None:
        super().__init__(
            f"job {claimed.id} of {queue.name} (attempt {claimed.attempt}/{claimed.max_attempts})",
            timedelta(seconds=queue.max_runtime),
            queue.is_async,
        )
        self.workers = workers
        self.queue = queue
        self.claimed = claimed
        self.context: JobContext | None = None

    captured = True

    def log_target(self) -> LogTarget:
        c = self.claimed
        return LogTarget("job", c.id, c.tries, c.attempt)

    @property
    def thread_name(self) -> str:
        return f"schedtui-job-{self.queue.name}"

    def begin(self, now: datetime) -> JobContext:
        deadline = self.deadline = now + self.max_runtime
        c = self.claimed
        self.context = JobContext(
            id=c.id,
            queue=c.queue,
            payload=json.loads(c.payload),
            attempt=c.attempt,
            max_attempts=c.max_attempts,
            key=c.key,
            cron=c.cron,
            deadline=deadline,
            created_at=c.created_at,
            jobs=self.workers.jobs.actions,
            fence=c.tries,
        )
        return self.context

    def ended(self) -> None:
        # Not at settle: a sync handler past its deadline still runs, and its seat stays
        # taken (the job stays `running`) until its thread returns; only then is the
        # attempt handed in and a retry can start.
        assert self.outcome is not None
        self.workers.ended(self, self.outcome)


def decide(claimed: Claimed, outcome: Outcome, *, stopping: bool = False) -> tuple[FinishKind, datetime | None]:
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
    return "retry", outcome.at + timedelta(seconds=backoff(claimed.attempt))


class Workers:
    """Runs the queues this process defines. See the module for the cycle.

    Contract: every claimed job is run exactly once here and its attempt handed to the
    store exactly once (:attr:`running` holds it until the store has it); the room asked
    for per queue never exceeds the queue's concurrency minus the attempts in flight.
    """

    def __init__(self, jobs: Jobs, queues: Iterable[Queue], *, poll_interval: float) -> None:
        self.jobs = jobs
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
        self.claiming: str | None = None
        """The token of the cycle on its way that claims, if one does. At most two cycles
        are on their way at once: one that claims, and one that only hands in ended
        attempts (so that a send arriving meanwhile is claimed at once). Two that claim
        would race each other for the same seats and rows: measured with
        tests/bench/queue.py, that drains at half the rate of one."""
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
        self.loops.spawn(self._dispatch(), "jobs")
        if self.store.job_notifications:
            self.loops.spawn(self.store.watch_jobs(self.heard), "jobs listener")

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
        return not self.running and not self.finishes and not self.inflight

    def room(self, queue: Queue) -> int:
        free = queue.concurrency - self.active[queue.name] - self.asked[queue.name]
        if not queue.is_async:
            free = min(free, self.runner.pool.max_threads - self.runner.pool.busy - sum(self.asked.values()))
        return free

    def _wanted(self, now: datetime) -> dict[str, int]:
        if self.stopping or not self.lease.fresh():
            return {}  # (woken when the lease is renewed)
        wanted = {}
        for name, queue in self.queues.items():
            room = self.room(queue)
            if room <= 0:
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
                wanted[name] = room
        return wanted

    def _park_until(self, now: datetime) -> datetime | None:
        if self.trouble_until is not None:
            return self.trouble_until
        if self.claiming is not None:
            return None  # woken when it comes back
        if not self.lease.fresh():
            return None  # woken when the lease is renewed
        times = []
        for name, queue in self.queues.items():
            if self.room(queue) <= 0:
                continue  # woken by its attempts ending
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
            if self.trouble_until is None:
                wanted = self._wanted(now) if self.claiming is None else {}
                finishing = len(self.inflight) - (self.claiming is not None)  # cycles that only hand in
                if wanted or (self.finishes and not finishing):
                    batch, self.finishes = self.finishes, []
                    self._send_cycle(batch, wanted, now)
                    continue
            await self.loops.park("jobs", self._park_until(now), self.wake)

    def _send_cycle(self, batch: list[tuple[Finish, JobRun]], wanted: dict[str, int], now: datetime) -> None:
        token = self.new_id()
        self.inflight[token] = batch
        if wanted:
            self.claiming = token
        self.asked.update(wanted)
        for name in wanted:
            self.polled_at[name] = now
            if self.room(self.queues[name]) <= 0:
                self.due.discard(name)  # all its room is asked for; a later reason sets it again
        self.loops.spawn(self._cycle(token, batch, wanted, now), "jobs cycle")

    async def _cycle(self, token: str, batch: list[tuple[Finish, JobRun]], wanted: dict[str, int], now: datetime) -> None:
        try:
            cycle = await self.store.cycle_jobs([f for f, _ in batch], wanted, self.instance, token, now)
        except Exception as exc:
            if not isinstance(exc, Unavailable):
                log.exception("a job cycle failed")
            self.outages.trouble("jobs", "store unavailable to the job workers", exc)
            self.finishes[:0] = batch  # handed in again with the next cycle
            self.asked.subtract(wanted)
            del self.inflight[token]
            if self.claiming == token:
                self.claiming = None
            self.due.update(wanted)
            self.trouble_until = self.clock.now() + timedelta(seconds=RETRY_AFTER_TROUBLE)
            self.wake.set()
            return
        for (finish, run), applied in zip(batch, cycle.applied, strict=False):
            self._handed_in(run, finish, applied)
        got: Counter[str] = Counter()
        for claimed in cycle.claimed:
            got[claimed.queue] += 1
            self._run(claimed)
        for name in sorted({f.queue for f, _ in batch} | set(got)):
            self.jobs.shared.events.publish("jobs", name)  # a job started or ended there
        self.asked.subtract(wanted)
        for name, asked in wanted.items():
            self.next_at[name] = cycle.next_at.get(name)
            if got[name] >= asked:
                self.backlog.add(name)
            else:
                self.backlog.discard(name)
        del self.inflight[token]  # after its jobs are in `running`: the sweep sees one or the other
        if self.claiming == token:
            self.claiming = None
        self.wake.set()
        self.loops.poke()

    # -- running -------------------------------------------------------------------------
    def _run(self, claimed: Claimed) -> None:
        queue = self.queues[claimed.queue]
        run = JobRun(self, queue, claimed)
        self.running[claimed.id] = run
        self.active[queue.name] += 1
        try:
            self.runner.start(run, queue.handler)
        except RunnerSaturated as exc:
            run.settle(Outcome("skipped", self.clock.now(), TAG_THREADS_EXHAUSTED, f"not started: {exc}"))

    def ended(self, run: JobRun, outcome: Outcome) -> None:
        """An attempt's handler ended (on the engine's loop, once per attempt)."""
        self.active[run.queue.name] -= 1
        c = run.claimed
        now = self.clock.now()
        held = run.ran_on(now)
        if held is not None and outcome.status == "failed":
            # Settled (timed out, interrupted) while its handler ran on: the attempt ends now.
            outcome = Outcome(
                "failed", now, outcome.error_tag,
                f"{outcome.error_message}: it returned {held:.1f}s later",
                outcome.traceback,
            )  # fmt: skip
        kind, retry_at = decide(c, outcome, stopping=self.stopping)
        if kind == "dead":
            log.warning("job %s of %s is dead after %d attempt(s): %s", c.id, c.queue, c.attempt, outcome.error_message)
        finish = Finish(
            id=c.id,
            queue=c.queue,
            tries=c.tries,
            kind=kind,
            attempt=c.attempt,
            started_at=c.started_at,
            finished_at=outcome.at,
            instance=self.instance,
            error_tag=outcome.error_tag,
            error_message=outcome.error_message,
            retry_at=retry_at,
        )
        self.finishes.append((finish, run))
        if kind == "retry" and retry_at is not None:
            upcoming = self.next_at.get(c.queue)
            if upcoming is None or retry_at < upcoming:
                self.next_at[c.queue] = retry_at  # known here; the next claim would say so too
        if kind == "release":
            self.due.add(c.queue)
        self.wake.set()
        self.loops.poke()

    def _handed_in(self, run: JobRun, finish: Finish, applied: bool) -> None:
        self.running.pop(run.claimed.id, None)
        if applied and finish.kind != "release":  # a release never started: no attempt used
            for meter in self.jobs.meters:
                try:
                    meter(finish)
                except Exception:
                    log.exception("a job meter failed")
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
        in_doubt = [item for carried in self.inflight.values() for item in carried]
        batch = in_doubt + self.finishes
        self.inflight.clear()
        self.claiming = None
        self.finishes = []
        if batch:
            try:
                applied = await self.store.finish_jobs([f for f, _ in batch])
            except Unavailable as exc:
                # Still `running` in the store under this instance: closed as abandoned (and
                # retried) by the next instance to look, once this one is gone.
                log.warning("could not hand in %d ended job attempt(s) while stopping: %s", len(batch), exc)
                return
            for index, ((finish, run), ok) in enumerate(zip(batch, applied, strict=False)):
                self._handed_in(run, finish, ok or index < len(in_doubt))
