"""The job queue as a subsystem of the engine (:class:`~backend.runtime.subsystems.Subsystem`).

Any process that opens the store can send and act (``connect()``, the CLI, the API);
only a started engine (``serve``) runs workers, closes the attempts of jobs whose worker
died, and sweeps what has expired. Every send is checked against every limit before
anything is written (:func:`~backend.jobs.definition.check_send`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, cast

from backend.errors import BadInput, NotFound, Unavailable
from backend.inputs import check_before, check_count, check_id, shown_number
from backend.jobs.actions import JobActions
from backend.jobs.definition import (
    ATTEMPTS_KEEP,
    BACKOFF_FIRST_S,
    CRON_DEAD_KEEP,
    DEAD_KEEP,
    MAX_HELD,
    Queue,
    Send,
    check_cancel,
    check_queue_name,
    check_send,
)
from backend.jobs.model import JOB_STATUSES, Job, JobDetail, JobsPage, JobStatus, QueueView, Sent, numbered
from backend.jobs.store import REVOKE, Finish, FinishKind, JobStore, NewJob, QueueSpec
from backend.jobs.workers import Workers
from backend.model import TAG_ABANDONED
from backend.runtime.subsystems import Shared

__all__ = ["OWN_CLAIM_CLOSED", "Jobs"]

log = logging.getLogger("schedtui.jobs")

#: Why a sweep closes a running job held under this instance's own name that its workers
#: do not hold (the attempt's message, after "abandoned: "): a claim of its own whose answer
#: was lost, or an earlier process of that name.
OWN_CLAIM_CLOSED: Final = "claimed by this instance in a claim whose answer was lost, or by an earlier process of that name"

#: Due jobs of a queue this instance does not run, unclaimed for this long, are reported
#: (looked for that often; said every 5 minutes at most), as a durable function's are.
WAITING_AFTER: Final = timedelta(seconds=60)
WAITING_REPORT_EVERY: Final = timedelta(minutes=5)

#: Seconds between claims of a queue when nothing says there is work (the fallback poll).
DEFAULT_POLL_INTERVAL = 1.0


class Notifier:
    """Tells other processes about sends, after their commit and coalesced: while one
    notification is on its way, the queues sent to meanwhile wait and go in the next."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.pending: set[str] = set()
        self.task: asyncio.Future[Any] | None = None

    def poke(self, queue: str) -> None:
        if not self.jobs.store.job_notifications:
            return
        self.pending.add(queue)
        if self.task is None or self.task.done():
            self.task = self.jobs.shared.loops.keep(self._send, "jobs notifier")

    async def _send(self) -> None:
        while self.pending:
            await self.flush()

    async def flush(self) -> None:
        batch = sorted(self.pending)
        self.pending.clear()
        if not batch:
            return
        try:
            await self.jobs.store.notify_jobs(batch)
        except Unavailable as exc:
            # Workers poll as well: a lost notification costs latency, not jobs.
            log.debug("could not notify workers of %s: %s", ", ".join(batch), exc)


class Jobs:
    """The job queue of one engine: ``engine.jobs``. Operations check their input and
    raise :class:`~backend.errors.SchedtuiError` subclasses (``NotFound`` for an unknown
    queue or job, ``BadInput``/``TooLarge`` for a value over a limit, ``QueueFull``)."""

    def __init__(
        self,
        shared: Shared,
        queues: Iterable[Queue],
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        first_backoff: int = BACKOFF_FIRST_S,
    ) -> None:
        self.shared = shared
        self.store = cast(JobStore, shared.store)
        self.queues: dict[str, Queue] = {}
        for queue in queues:
            if queue.name in self.queues:
                raise BadInput(f'queue name "{queue.name}" is given twice')
            self.queues[queue.name] = queue
        self.poll_interval = poll_interval
        self.first_backoff = first_backoff
        """Seconds before a failed attempt's first retry (doubling after); a test seam."""
        self.actions = JobActions(self)
        self.notifier = Notifier(self)
        self.workers: Workers | None = None
        """Set once started: only ``serve`` (and a console with ``--fire``) runs jobs."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_prune: datetime | None = None
        self.waiting_checked: datetime | None = None
        self.waiting_reported: datetime | None = None
        self.meters: list[Callable[[Finish], None]] = []
        """Told every attempt this process ran and the store took the end of (succeeded,
        retry or dead), once (the metrics); a failing one is logged."""

    # -- the subsystem ---------------------------------------------------------------------
    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.queues:
            # Known to senders from now on; their settings are serve's to set (at start).
            specs = [QueueSpec(q.name, q.concurrency, q.attempts, q.max_runtime) for q in self.queues.values()]
            await self.store.define_queues(specs, self.shared.clock.now(), update=False)

    def start(self) -> None:
        if not self.queues:
            return  # an instance without queues runs no workers, sweeps and listens to nothing
        if self.workers is None:
            self.workers = Workers(self, self.queues.values(), poll_interval=self.poll_interval, first_backoff=self.first_backoff)
        log.info(
            "running %d job queue(s): %s",
            len(self.queues),
            ", ".join(f"{q.name} (concurrency {q.concurrency})" for q in self.queues.values()),
        )
        self.workers.start()

    async def maintain(self, now: datetime) -> None:
        try:
            # Both store-wide, whatever this process defines: a serve with no queue in its
            # definitions (moved out of them by a deploy, or jobs sent from elsewhere) left
            # a dead instance's jobs running for good, and kept every dead job, attempt and
            # log for good.
            await self.rescue(now)
            if self.waiting_checked is None or now - self.waiting_checked >= WAITING_AFTER:
                self.waiting_checked = now
                await self._report_waiting(now)
            if self.last_prune is None or now - self.last_prune >= timedelta(hours=1):
                self.last_prune = now
                removed = await self.store.prune_jobs(now - DEAD_KEEP, now - CRON_DEAD_KEEP, now - ATTEMPTS_KEEP)
                if removed:
                    log.info("job retention: removed %d dead job(s) and old attempt(s)", removed)
        except Unavailable as exc:
            # The rest of the engine's housekeeping goes on; the next round tries again.
            # (A kind of its own: its rescues and prunes going through say nothing of the
            # workers' cycles, which insert.)
            self.shared.outages.trouble("job housekeeping", "store unavailable for the job queue's housekeeping", exc)
        else:
            self.shared.outages.back("job housekeeping")

    async def stop(self, grace: float) -> None:
        if self.workers is not None:
            await self.workers.stop(grace)
        await self.notifier.flush()

    @property
    def idle(self) -> bool:
        return self.workers is None or self.workers.idle

    def is_ours(self, id_: str) -> bool:
        return self.workers is not None and id_ in self.workers.running

    async def _report_waiting(self, now: datetime) -> None:
        """Say which queues this instance does not run have jobs due for a while that nobody
        claims (a queue renamed or removed by a deploy, sends to it still accepted): else
        they waited in silence, with nothing in any log."""
        if self.waiting_reported is not None and now - self.waiting_reported < WAITING_REPORT_EVERY:
            return
        waiting = await self.store.waiting_jobs(now - WAITING_AFTER)
        for queue, count in waiting.items():
            if queue in self.queues:
                continue  # ours: claimed as soon as a seat is free
            self.waiting_reported = now
            log.warning(
                '%d job(s) of queue "%s" have been due for over %ds and no instance has claimed them; this instance '
                "does not run that queue (it runs: %s)",
                count, queue, WAITING_AFTER.total_seconds(), ", ".join(sorted(self.queues)) or "none",
            )  # fmt: skip

    # -- jobs whose worker died --------------------------------------------------------------
    async def rescue(self, now: datetime) -> int:
        """Close the attempts of running jobs whose instance is gone as failed/``abandoned``:
        retried at once while attempts remain, else dead. Every live instance looks; the
        finish is conditional, so each attempt is closed once; an instance without workers
        (no queue in its definitions) looks too. Jobs this instance claimed in a cycle whose
        answer was lost go back untouched instead (they never started)."""
        workers = self.workers
        running = await self.store.running_jobs()
        if not running:
            return 0
        registry = self.shared.registry
        beats = await self.shared.store.instances()
        finishes = workers.release_unanswered(running, now) if workers is not None else []
        released = {finish.id for finish in finishes}
        for job in running:
            if job.instance == self.shared.instance:
                held = workers is not None and workers.holds(job.id, job.token)
                if held or job.id in released or not registry.holds_name():
                    continue
                why = OWN_CLAIM_CLOSED
            else:
                found = registry.gone(beats, job.instance, now)
                if found is None:
                    continue
                why = found
            kind: FinishKind = "retry" if job.attempt < job.max_attempts else "dead"
            finishes.append(
                Finish(job.id, job.queue, job.tries, kind, job.attempt, job.started_at, now, job.instance,
                       TAG_ABANDONED, f"abandoned: {why}", retry_at=now if kind == "retry" else None, swept=True)
            )  # fmt: skip
        if not finishes:
            return 0
        applied = await self.store.finish_jobs(finishes)
        closed = 0
        for finish, ok in zip(finishes, applied, strict=False):
            if ok and finish.kind == "release":
                self._sent(finish.queue)  # due again, with its attempts intact
            elif ok:
                closed += 1
                log.warning(
                    "job %s of %s abandoned (attempt %d, %s): %s",
                    finish.id, finish.queue, finish.attempt, "retried" if finish.kind == "retry" else "now dead",
                    finish.error_message,
                )  # fmt: skip
                if finish.kind == "retry":
                    self._sent(finish.queue)
        return closed

    # -- sending ---------------------------------------------------------------------------
    def _sent(self, queue: str, *, notify: bool = True) -> None:
        """New work in ``queue``: wake our workers, and (after the commit, unless the store
        did: ``notify`` false) everyone's."""
        if self.workers is not None:
            self.workers.poke(queue)
        if notify:
            self.notifier.poke(queue)
        self.shared.events.publish("jobs", queue)

    async def send(
        self, queue: str, payload: Any = None, *, delay: float | timedelta = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        """Send one job (see :meth:`send_many`)."""
        return (await self.send_checked(queue, [check_send(payload, delay, attempts, key)]))[0]

    async def send_many(self, queue: str, jobs: Iterable[Mapping[str, Any]]) -> list[Sent]:
        """Send jobs in one transaction: each a mapping of ``payload``, ``delay``,
        ``attempts``, ``key`` (all optional). Every job is checked before any is written."""
        if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
            raise BadInput(f"jobs {shown_number(jobs, 60)} is not a list of mappings (of payload, delay, attempts, key)",
                           field="jobs")  # fmt: skip
        sends = []
        for index, job in enumerate(jobs):
            if not isinstance(job, Mapping):
                raise BadInput(f"job {index} is not a mapping of payload, delay, attempts, key", field="jobs")
            unknown = set(job) - {"payload", "delay", "attempts", "key"}
            if unknown:
                raise BadInput(f"job {index} has unknown field(s): {', '.join(sorted(map(str, unknown)))}", field="jobs")
            try:
                sends.append(check_send(job.get("payload"), job.get("delay", 0), job.get("attempts"), job.get("key")))
            except BadInput as exc:
                raise type(exc)(f"job {index}: {exc.message}", field=exc.field) from None
        return await self.send_checked(queue, sends)

    async def send_checked(
        self, queue: str, sends: list[Send], *, cron: str | None = None, ids: list[str] | None = None
    ) -> list[Sent]:
        check_queue_name(queue)
        if not sends:
            return []
        if len(sends) > MAX_HELD:
            raise BadInput(f"{len(sends):,} jobs in one send; a queue holds at most {MAX_HELD:,}", field="jobs")
        now = self.shared.registry.store_time(self.shared.clock.now())
        new = [
            NewJob(ids[i] if ids else self.shared.new_id(), s.payload, now + timedelta(seconds=s.delay), s.attempts, s.key, cron)
            for i, s in enumerate(sends)
        ]
        # Other processes' workers are woken by the store, in the send's round trip when it
        # can (else through the notifier).
        sent = await self.store.send_jobs(queue, new, now, wake_later=self.notifier.poke)
        self._sent(queue, notify=False)
        return sent

    async def from_schedule(self, queue: str, schedule: str, run_id: str, payload: Any) -> Sent:
        """A slot (or Run now) of a schedule that targets ``queue``: one job with the
        schedule's payload, ``cron`` its name and one attempt. Its id is the run's, so a
        run enqueues one job however often it is repeated."""
        send = check_send(payload, 0, 1, None, max_depth=None)
        return (await self.send_checked(queue, [send], cron=schedule, ids=[run_id]))[0]

    # -- operator actions ----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _holding(self, queue: str) -> AsyncIterator[None]:
        """Around an action that changes what may start in ``queue``: this process's jobs
        claimed ahead of it go back first (see :meth:`Workers.holding`), and the other
        processes' once they hear of it, after the commit."""
        if self.workers is None:
            yield
        else:
            async with self.workers.holding(queue):
                yield
        self.notifier.poke(REVOKE + queue)

    async def _known(self, queue: str) -> None:
        check_queue_name(queue)
        if not any(view.name == queue for view in await self.queue_views()):
            raise NotFound(f'no queue named "{queue}"')

    async def queue_views(self) -> list[QueueView]:
        return await self.store.queue_views(self.shared.clock.now())

    async def queue_view(self, queue: str) -> QueueView:
        check_queue_name(queue)
        for view in await self.queue_views():
            if view.name == queue:
                return view
        raise NotFound(f'no queue named "{queue}"')

    async def set_paused(self, queue: str, paused: bool, *, by: str | None = None) -> QueueView:
        check_queue_name(queue)
        async with self._holding(queue):
            if not await self.store.pause_queue(queue, paused, by or self.shared.instance, self.shared.clock.now()):
                raise NotFound(f'no queue named "{queue}"')
        log.info("queue %s %s by %s", queue, "paused" if paused else "resumed", by or self.shared.instance)
        await self.shared.audit.record("queue.pause" if paused else "queue.resume", queue, {})
        if not paused:
            self._sent(queue)
        else:
            self.shared.events.publish("jobs", queue)
        return await self.queue_view(queue)

    async def pause(self, queue: str) -> QueueView:
        """Pause a queue (an operator's action): its jobs wait; running ones finish."""
        return await self.set_paused(queue, True)

    async def resume(self, queue: str) -> QueueView:
        """Resume a paused queue (an operator's action)."""
        return await self.set_paused(queue, False)

    async def send_by_operator(
        self, queue: str, payload: Any = None, *, delay: float | timedelta = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        """:meth:`send` for an operator (console, CLI, API): recorded in the audit log, as
        the application's own sends are not."""
        sent = await self.send(queue, payload, delay=delay, attempts=attempts, key=key)
        await self.shared.audit.record("job.send", sent.id, {"queue": queue, "key": key, "duplicate": sent.duplicate})
        return sent

    async def list_jobs(
        self, queue: str, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> JobsPage:
        """A page of a queue's jobs, newest first, and the ``before`` of the next page."""
        if status is not None and status not in JOB_STATUSES:
            raise BadInput(f'status "{status}" is not one of {", ".join(JOB_STATUSES)}', field="status")
        check_count(limit, "limit", 1, 1000)
        before = check_before(before, "job")
        await self._known(queue)
        jobs = await self.store.list_jobs(queue, status=cast(JobStatus | None, status), limit=limit + 1, before=before)
        if len(jobs) > limit:
            return JobsPage(jobs[:limit], jobs[limit - 1].id)
        return JobsPage(jobs, None)

    async def get_job(self, job_id: str) -> JobDetail:
        """The job (while it exists) and its attempts."""
        check_id(job_id, "job")
        job = await self.store.get_job(job_id)
        queue, attempts = await self.store.job_attempts(job_id)
        if job is None and queue is None:
            raise NotFound(f'no job with id "{job_id}" (a job that succeeded or was deleted is gone once its attempts are)')
        return JobDetail(job_id, job.queue if job is not None else str(queue), job, numbered(attempts))

    async def cancel(self, queue: str, id: str | None = None, *, key: str | None = None) -> bool:
        """Delete a queued job by its id, or by its key (exactly one); True if it was queued
        and is gone."""
        by, value = check_cancel(id, key)
        await self._known(queue)
        async with self._holding(queue):
            cancelled = await self.store.cancel_job(queue, **{by: value})
        if cancelled:
            await self.shared.audit.record("job.cancel", value, {"queue": queue, "by": by})
            self.shared.events.publish("jobs", queue)
        return cancelled

    async def delete(self, queue: str, job_id: str) -> None:
        """Delete a job in any state (a running one finishes; its result is not kept)."""
        check_id(job_id, "job")
        await self._known(queue)
        async with self._holding(queue):
            if not await self.store.delete_job(queue, job_id):
                raise NotFound(f'no job with id "{job_id}" in queue "{queue}"')
        await self.shared.audit.record("job.delete", job_id, {"queue": queue})
        self.shared.events.publish("jobs", queue)

    async def retry(self, queue: str, job_id: str) -> Job:
        """A dead job back to the queue now, with fresh attempts."""
        check_id(job_id, "job")
        await self._known(queue)
        job = await self.store.retry_job(queue, job_id, self.shared.clock.now())
        if job is None:
            raise NotFound(f'no job with id "{job_id}" in queue "{queue}"')
        await self.shared.audit.record("job.retry", job_id, {"queue": queue})
        self._sent(queue)
        return job
