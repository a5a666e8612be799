"""Range backfills: fire the past slots of a schedule in a range, in order, on request.

:func:`plan_backfill` says what a backfill of ``(start, end]`` would do without doing it:
how many slots, the first and last, or why it is refused (reversed, empty, reaching into
the future, no slots, over the limit, or needing confirmation above 25 slots);
:func:`live_estimate` adds what it may do to the schedule's live slots meanwhile.
:class:`Backfills` runs accepted ones in the background, one slot after the other (a
failed slot is recorded and the next still fires), at most one per schedule across every
process sharing the store, with progress readable from anywhere.

The audit log gets three kinds of entries for a backfill: ``schedule.backfill`` when it
starts (by who started it), ``schedule.backfill_cancel`` when an operator stops it (by
them: what had finished, the run in flight, what will not fire), and
``schedule.backfill_end`` once it has ended, every way it can: ``done``, ``cancelled``
(once the run in flight has ended too), ``abandoned`` (its process stopped, or died and
another instance closed it). The end's counts are read from the ledger then, so a run
interrupted by a stop is counted as the failure it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, TypeVar

from backend.clock import Clock
from backend.errors import NotFound, Refused, Unavailable
from backend.events.audit import AuditLog
from backend.inputs import check_count, check_datetime
from backend.model import (
    BACKFILL_CONFIRM_ABOVE,
    BACKFILL_DEFAULT_LIMIT,
    BACKFILL_ESTIMATE_RUNS,
    BACKFILL_MAX_LIMIT,
    BackfillPlan,
    BackfillProgress,
    Run,
    iso,
    utc,
)
from backend.runtime.loops import Loops
from backend.scheduler.launcher import Launcher, ScheduleRun
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["Backfills", "live_estimate", "plan_backfill"]

log = logging.getLogger("schedtui.engine")

T = TypeVar("T")


def plan_backfill(
    schedule: Schedule,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    confirm: bool = False,
    limit: int | None = None,
) -> tuple[BackfillPlan, list[datetime]]:
    """What a backfill of the slots in ``(start, end]`` would do, and its slots (one past
    :data:`BACKFILL_MAX_LIMIT` at most); fires nothing. A walk of 10,000 slots takes about
    0.1 s of CPU: see :meth:`Backfills.plan`."""
    name = schedule.name
    limit = BACKFILL_DEFAULT_LIMIT if limit is None else limit
    check_count(limit, "limit", 1, BACKFILL_MAX_LIMIT)
    # Checked here too: Engine.plan_backfill and start_backfill take them from Python as is.
    start, end = utc(check_datetime(start, "from")), utc(check_datetime(end, "to"))
    slots = list(islice(schedule.cron.occurrences(start, end), BACKFILL_MAX_LIMIT + 1)) if start < end else []
    exceeds = len(slots) > BACKFILL_MAX_LIMIT
    count = len(slots)
    shown = f"more than {BACKFILL_MAX_LIMIT:,}" if exceeds else f"{count:,}"
    reason, refusal = None, None
    if start > end:
        reason, refusal = "reversed range", "reversed range: from is after to"
    elif start == end:
        reason, refusal = "empty range", "empty range: from equals to"
    elif end > now:
        reason = "reaches into the future"
        refusal = f"the range reaches into the future (to is after now, {now.isoformat()})"
    elif count == 0:
        reason, refusal = "no slots in range", "no slots in the range"
    elif count > limit:
        reason = "over the limit"
        refusal = f"{shown} slots exceed the limit of {limit:,}; backfill in smaller slices"
    elif count > BACKFILL_CONFIRM_ABOVE and not confirm:
        reason = "needs confirmation"
        refusal = f"{shown} slots need confirmation (more than {BACKFILL_CONFIRM_ABOVE})"
    plan = BackfillPlan(
        name=name,
        start=start,
        end=end,
        count=count,
        count_exceeds=exceeds,
        first=slots[0] if slots else None,
        last=slots[-1] if slots and not exceeds else None,
        limit=limit,
        confirm=confirm,
        refusal=refusal,
        reason=reason,
    )
    return plan, slots


async def live_estimate(
    store: Store,
    schedule: Schedule,
    count: int,
    now: datetime,
    *,
    enabled: bool,
    walk: Callable[[Callable[[], int]], Awaitable[int]],
) -> dict[str, Any]:
    """The plan's estimate of what ``count`` backfill runs starting ``now`` do to the
    schedule's live slots (the fields of :class:`BackfillPlan` it fills): one run takes the
    median duration of the schedule's newest runs that ran; the runs go one after the
    other, so the backfill takes ``count`` times that; the live slots are the cron's slots
    in that span from now (none while the schedule is disabled). Each of them finds a
    backfill run in flight, and the overlap policy decides its fate."""
    recent = await store.list_runs(schedule.name, limit=BACKFILL_ESTIMATE_RUNS)
    durations = [run.duration_ms for run in recent if run.duration_ms is not None and run.status in ("succeeded", "failed")]
    estimate: dict[str, Any] = {"on_overlap": schedule.on_overlap}
    if not durations:
        return estimate
    run_seconds = statistics.median(durations) / 1000
    duration = count * run_seconds
    live = 0
    if enabled:
        slots = schedule.cron.occurrences(now, now + timedelta(seconds=duration))
        live = await walk(lambda: sum(1 for _ in islice(slots, BACKFILL_MAX_LIMIT)))  # (see Backfills.walk)
    return {**estimate, "run_seconds": run_seconds, "duration_seconds": duration, "live_slots": live}


@dataclass
class _Job:
    progress: BackfillProgress
    actor: str
    """Who started it: its end is recorded as theirs."""
    task: asyncio.Task[None] | None = None
    runs: list[ScheduleRun] = field(default_factory=list)
    """The runs it started, in order."""
    cancelled: bool = False
    cancelled_by: str = ""
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once no slot fires any more (its state is no longer ``running``)."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once it has ended: every run it started has ended, and its end is recorded."""
    ending: bool = False
    """Every slot has fired or will not: nothing left to stop."""
    unsaved: bool = False
    """Its end is not in the store yet (it was unreachable): until then the store says
    ``running``, which refuses other backfills of the schedule."""


async def _nothing() -> None:
    pass


class Backfills:
    """Starts and tracks this process's backfills; reads others' from the store."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        loops: Loops,
        launcher: Launcher,
        audit: AuditLog,
        instance: str,
        new_id: Callable[[], str],
        schedules: dict[str, Schedule],
    ) -> None:
        self.clock = clock
        self.store = store
        self.loops = loops
        self.launcher = launcher
        self.audit = audit
        self.instance = instance
        self.new_id = new_id
        self.schedules = schedules
        """The schedules the engine runs (the catalog adds, replaces and removes stored ones
        in it): a backfill fires each slot by the definition there then, and stops once its
        schedule is gone from it."""
        self.refresh_catalog: Callable[[], Awaitable[None]] = _nothing
        """Reads the stored schedules again if another process changed them (the engine's
        catalog): before each slot of a stored schedule's backfill, so that an engine that
        only opened (``schedtui backfill``, a console without ``--fire``), which follows no
        changes otherwise, sees a delete made elsewhere."""
        self.jobs: dict[str, _Job] = {}
        self._walking = asyncio.Semaphore(1)

    @property
    def idle(self) -> bool:
        return not any(job.task is not None and not job.task.done() for job in self.jobs.values())

    @property
    def stepping(self) -> bool:
        """A backfill between two runs: none begun yet, or the last one ended, and its task
        goes on (writing its progress, launching the next, or its end). What the current
        time calls for, as a timer's firing: ``quiesce(runs=False)`` waits for it."""
        return any(
            job.task is not None and not job.task.done() and (not job.runs or job.runs[-1].done)
            for job in self.jobs.values()
        )

    async def plan(
        self, schedule: Schedule, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> tuple[BackfillPlan, list[datetime]]:
        """:func:`plan_backfill`, on a thread: on the engine's loop, a client that asked for
        plans one after another (a read token may) made every schedule fire late, a tenth
        of a second a plan."""
        now = self.clock.now()
        return await self.walk(lambda: plan_backfill(schedule, start, end, now, confirm=confirm, limit=limit))

    async def walk(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a walk of a cron's slots) on a thread, one at a time: four threads
        walking at once left the engine's loop a fifth of the time."""
        async with self._walking:
            return await asyncio.to_thread(fn)

    async def start(
        self,
        schedule: Schedule,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress:
        """Start firing the slots in ``(start, end]`` in order, in the background; with
        ``skip_succeeded``, only those without a succeeded run. Recorded in the audit log
        (``schedule.backfill``) before its first slot fires.

        Raises :class:`Refused` (with the count and reason) when the plan is refused or a
        backfill of this schedule is already running anywhere."""
        plan, slots = await self.plan(schedule, start, end, confirm=confirm, limit=limit)
        if plan.refusal is not None:
            raise Refused(
                f'backfill of "{schedule.name}" refused: {plan.refusal}',
                count=plan.count,
                reason=plan.reason or plan.refusal,
            )
        if skip_succeeded:
            done = await self.succeeded_slots(schedule, slots)
            slots = [slot for slot in slots if slot not in done]
            if not slots:
                raise Refused(
                    f'backfill of "{schedule.name}": every slot in the range already succeeded',
                    count=0,
                    reason="nothing to run",
                )
        progress = BackfillProgress(
            id=self.new_id(),
            name=schedule.name,
            start=plan.start,
            end=plan.end,
            total=len(slots),
            fired=0,
            failed=0,
            state="running",
            instance=self.instance,
            started_at=self.clock.now(),
        )
        await self.store.start_backfill(progress)
        job = _Job(progress, self.audit.actor())
        self.jobs[progress.id] = job
        detail: dict[str, Any] = {"backfill_id": progress.id, "from": iso(progress.start), "to": iso(progress.end),
                                  "count": progress.total}  # fmt: skip
        if skip_succeeded:
            detail["skip_succeeded"] = True
        await self.audit.record("schedule.backfill", schedule.name, detail, actor=job.actor)
        job.task = self.loops.spawn(self._run(schedule, job, slots), f"backfill {schedule.name}")
        return progress

    async def _run(self, schedule: Schedule, job: _Job, slots: list[datetime]) -> None:
        try:
            for slot in slots:
                if job.runs and self.store.kind == "sqlite":
                    # The last run's end met the file: a store file deleted or replaced
                    # meanwhile is noticed here, and no slot fires into a file that is gone.
                    # (Not on PostgreSQL, which is never lost: a flush there may wait out
                    # an outage, which a backfill rides through.)
                    with contextlib.suppress(Unavailable):
                        await self.store.flush()
                if self.store.health().state == "lost":
                    log.error("backfill %s of %s stopped before its slot %s: the store is lost", job.progress.id,
                              job.progress.name, iso(slot))  # fmt: skip
                    job.progress = dataclasses.replace(job.progress, state="abandoned", finished_at=self.clock.now())
                    await self._end(job)
                    return
                if schedule.created_at is not None:  # (a stored schedule)
                    with contextlib.suppress(Unavailable):  # (read again before the next slot)
                        await self.refresh_catalog()
                current = self.schedules.get(schedule.name)
                if current is None or current.created_at != schedule.created_at:
                    # Deleted meanwhile (here or on another instance; maybe created again under
                    # its name: another schedule, whose ledger these slots are not).
                    log.warning("backfill %s of %s stopped before its slot %s: the schedule was deleted",
                                job.progress.id, job.progress.name, iso(slot))  # fmt: skip
                    job.progress = dataclasses.replace(job.progress, state="cancelled", finished_at=self.clock.now())
                    await self._end(job)
                    return
                schedule = current  # (updated meanwhile: its target and payload now)
                job.progress = dataclasses.replace(job.progress, current=slot)
                scheduled = self.launcher.launch(schedule, slot, "manual", "manual")
                job.runs.append(scheduled)
                run = await asyncio.shield(scheduled.finished())
                job.progress = dataclasses.replace(
                    job.progress,
                    fired=job.progress.fired + 1,
                    failed=job.progress.failed + (run.status == "failed"),
                )
                # Progress is kept here and read from here; a store that cannot take it now
                # gets it with the next update. The backfill goes on either way.
                with contextlib.suppress(Unavailable):
                    await self.store.update_backfill(job.progress)
        except asyncio.CancelledError:
            if not job.cancelled:  # the engine stops: stop() records the end once it closed the run in flight
                job.progress = dataclasses.replace(job.progress, state="abandoned", finished_at=self.clock.now())
                job.stopped.set()
                await self._save(job)
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the operator's stop, handled: a later one (the engine's) is news
            await self._stopped(job)
            # The operator's stop spares the run in flight: the backfill ends when it does.
            try:
                await asyncio.shield(asyncio.gather(*(run.finished() for run in job.runs)))
            except asyncio.CancelledError:
                return  # the engine stops first: stop() records the end once it closed the run
            await self._end(job)
        else:
            # Done only with its end: whoever reads "done" reads the ledger's counts.
            await self._end(job, done=True)

    async def _stopped(self, job: _Job) -> None:
        """An operator stopped it: recorded ``cancelled`` in the store and the audit log."""
        in_flight = next((run for run in job.runs if not run.done), None)
        job.progress = dataclasses.replace(job.progress, state="cancelled", finished_at=self.clock.now())
        await self.audit.record(
            "schedule.backfill_cancel",
            job.progress.name,
            {
                "backfill_id": job.progress.id,
                "finished": job.progress.fired,
                "in_flight": in_flight.run_id if in_flight is not None else None,
                "not_fired": job.progress.remaining - (in_flight is not None),
            },
            actor=job.cancelled_by,
        )
        job.stopped.set()
        await self._save(job)

    async def _save(self, job: _Job) -> None:
        try:
            await self.store.update_backfill(job.progress)
        except Unavailable:
            job.unsaved = True  # written by maintain() once the store is back

    async def _end(self, job: _Job, *, done: bool = False) -> None:
        """Every run it started has ended: its counts as the ledger has them (and ``done``,
        when every slot fired), saved, and its end recorded (``schedule.backfill_end``, as
        the starter's)."""
        if job.finished.is_set():
            return
        job.ending = True
        runs = await self._ledger_runs(job)
        progress = dataclasses.replace(job.progress, fired=len(runs), failed=sum(run.status == "failed" for run in runs))
        if done:
            progress = dataclasses.replace(progress, state="done", finished_at=self.clock.now(), current=None)
        job.progress = progress
        job.stopped.set()
        await self._save(job)
        await self.audit.record("schedule.backfill_end", job.progress.name, end_detail(job.progress, runs), actor=job.actor)
        job.finished.set()
        progress = job.progress
        log.info(
            "backfill %s of %s %s: %d fired, %d failed, %d not fired",
            progress.id, progress.name, progress.state, progress.fired, progress.failed, progress.remaining,
        )  # fmt: skip

    async def _ledger_runs(self, job: _Job) -> list[Run]:
        """The rows of the runs it started, as the ledger has them now (what this process
        recorded, for any the store cannot say)."""
        mine = [scheduled.run for scheduled in job.runs]
        if not mine:
            return []
        progress = job.progress
        try:
            await self.launcher.ledger.flush()
            found = await self.store.runs_between(
                [progress.name], progress.start, progress.end + timedelta(seconds=1), limit_per_name=4 * len(mine) + 100
            )
            stored = {run.id: run for run in found.get(progress.name, [])}
            for run in mine:
                if run.id not in stored and (row := await self.store.get_run(run.id)) is not None:
                    stored[run.id] = row
        except Unavailable as exc:
            log.warning("backfill %s: its runs as this process recorded them (the ledger cannot be read: %s)",
                        progress.id, exc)  # fmt: skip
            return mine
        return [stored.get(run.id, run) for run in mine]

    async def stop(self) -> None:
        """Once the engine has closed every run in flight (interrupted): the end of each
        backfill that has not recorded one (those the stop abandoned, and those cancelled
        whose run in flight the stop interrupted)."""
        for job in list(self.jobs.values()):
            if job.finished.is_set():
                continue
            done = job.progress.state == "running" and job.ending  # stopped while it recorded its end
            if job.progress.state == "running" and not done:  # stopped before its first slot
                job.progress = dataclasses.replace(job.progress, state="abandoned", finished_at=self.clock.now())
            await self._end(job, done=done)

    async def maintain(self) -> None:
        """Write the ends of backfills the store could not take when they ended."""
        for job in self.jobs.values():
            if job.unsaved:
                await self.store.update_backfill(job.progress)
                job.unsaved = False

    async def abandoned(self, progress: BackfillProgress, now: datetime) -> None:
        """A backfill left ``running`` by an instance that is gone (the registry's sweep):
        closed ``abandoned`` with its counts read from the ledger, and its end recorded by
        the one instance whose close took. Its runs are those of its instance, manual, in
        its range, made after it (ids sort by time)."""
        found = await self.store.runs_between(
            [progress.name], progress.start, progress.end + timedelta(seconds=1), limit_per_name=4 * progress.total + 100
        )
        runs = sorted(
            (
                run
                for run in found.get(progress.name, [])
                if run.instance == progress.instance and run.trigger == "manual"
                and run.coordination_outcome == "manual" and run.id > progress.id
            ),
            key=lambda run: run.id,
        )  # fmt: skip
        ended = dataclasses.replace(
            progress, state="abandoned", finished_at=now, fired=len(runs), failed=sum(r.status == "failed" for r in runs)
        )
        if await self.store.end_backfill(ended):
            detail = {**end_detail(ended, runs), "closed_by": self.instance}
            await self.audit.record("schedule.backfill_end", progress.name, detail)

    async def succeeded_slots(self, schedule: Schedule, slots: list[datetime]) -> set[datetime]:
        """Which of ``slots`` (ascending) already have a succeeded run, of any trigger."""
        if not slots:
            return set()
        found = await self.store.runs_between(
            [schedule.name], slots[0], slots[-1] + timedelta(seconds=1), limit_per_name=4 * len(slots) + 100
        )
        wanted = set(slots)
        return {r.scheduled_at for r in found.get(schedule.name, []) if r.status == "succeeded" and r.scheduled_at in wanted}

    async def cancel(self, backfill_id: str) -> BackfillProgress:
        """Stop a running backfill of this process before its next slot (the run in flight
        finishes on its own; the backfill's end is recorded once it has); recorded
        ``cancelled``, by whoever stops it. One that has ended already is left as it is."""
        job = self.jobs.get(backfill_id)
        if job is None:
            progress = await self.progress(backfill_id)
            if progress.state != "running":
                return progress
            raise Refused(
                f"backfill {backfill_id} runs on instance {progress.instance}; cancel it there", reason="runs elsewhere"
            )
        if job.progress.state != "running" or job.cancelled or job.ending:
            await job.stopped.wait()
            return job.progress
        job.cancelled, job.cancelled_by = True, self.audit.actor()
        task = job.task
        if task is not None and not task.done():
            task.cancel()
            stopped = asyncio.ensure_future(job.stopped.wait())
            try:
                await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
        if not job.stopped.is_set():  # cancelled before its first slot: its task never ran
            await self._stopped(job)
            await self._end(job)
        return job.progress

    def running(self, name: str | None, stored: list[BackfillProgress]) -> list[BackfillProgress]:
        """The backfills running now (of schedule ``name``), oldest first: ``stored``, the
        store's, with this process's own as it has them (fresher than their rows)."""
        found = {progress.id: progress for progress in stored}
        for job in self.jobs.values():
            if job.progress.state == "running":
                found[job.progress.id] = job.progress
            else:
                found.pop(job.progress.id, None)  # ended, its row not written yet
        return sorted((p for p in found.values() if name is None or p.name == name), key=lambda p: p.started_at)

    async def progress(self, backfill_id: str) -> BackfillProgress:
        job = self.jobs.get(backfill_id)
        if job is not None:
            return job.progress
        progress = await self.store.get_backfill(backfill_id)
        if progress is None:
            raise NotFound(f'no backfill with id "{backfill_id}"')
        return progress

    async def wait(self, backfill_id: str) -> BackfillProgress:
        """Its progress once no slot fires any more (not ``running``): once done, with its
        end recorded; once cancelled, at once (its run in flight may still run: see
        :meth:`ended`)."""
        job = self.jobs.get(backfill_id)
        if job is None:
            return await self.progress(backfill_id)
        await job.stopped.wait()
        if job.progress.state == "done":
            await job.finished.wait()  # (recorded by then: it is saved first)
        return job.progress

    async def ended(self, backfill_id: str) -> BackfillProgress:
        """Its progress once it has ended (every run it started too), its end recorded."""
        job = self.jobs.get(backfill_id)
        if job is None:
            return await self.progress(backfill_id)
        await job.finished.wait()
        return job.progress


def end_detail(progress: BackfillProgress, runs: list[Run]) -> dict[str, Any]:
    """What a ``schedule.backfill_end`` entry says: how it ended, and its runs by status
    (the failed ones by error tag: ``interrupted``, ``timeout``, an exception's class)."""
    statuses = Counter(run.status for run in runs)
    detail: dict[str, Any] = {
        "backfill_id": progress.id,
        "state": progress.state,
        "total": progress.total,
        "fired": len(runs),
        "succeeded": statuses["succeeded"],
        "failed": statuses["failed"],
        "not_fired": progress.total - len(runs),
    }
    for status in ("skipped", "running"):
        if statuses[status]:
            detail[status] = statuses[status]
    tags = Counter(run.error_tag or "error" for run in runs if run.status == "failed")
    if tags:
        detail["failed_by"] = dict(sorted(tags.items()))
    return detail
