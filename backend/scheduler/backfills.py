"""Range backfills: fire the past slots of a schedule in a range, in order, on request.

:func:`plan_backfill` says what a backfill of ``(start, end]`` would do without doing it:
how many slots, the first and last, or why it is refused (reversed, empty, reaching into
the future, no slots, over the limit, or needing confirmation above 25 slots).
:class:`Backfills` runs accepted ones in the background, one slot after the other (a
failed slot is recorded and the next still fires), at most one per schedule across every
process sharing the store, with progress readable from anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Literal

from backend.clock import Clock
from backend.errors import BadInput, NotFound, Refused, Unavailable
from backend.model import (
    BACKFILL_CONFIRM_ABOVE,
    BACKFILL_DEFAULT_LIMIT,
    BACKFILL_MAX_LIMIT,
    BackfillPlan,
    BackfillProgress,
    utc,
)
from backend.runtime.loops import Loops
from backend.scheduler.launcher import Launcher
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["Backfills", "plan_backfill"]

log = logging.getLogger("schedtui.engine")


def plan_backfill(
    schedule: Schedule,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    confirm: bool = False,
    limit: int | None = None,
) -> BackfillPlan:
    """What a backfill of the slots in ``(start, end]`` would do; fires nothing."""
    name = schedule.name
    limit = BACKFILL_DEFAULT_LIMIT if limit is None else limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BACKFILL_MAX_LIMIT:
        raise BadInput(f"limit {limit!r} is out of range (1-{BACKFILL_MAX_LIMIT:,})", field="limit")
    try:
        start, end = utc(start), utc(end)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
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
    return BackfillPlan(
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


@dataclass
class _Job:
    progress: BackfillProgress
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    unsaved: bool = False
    """Its end is not in the store yet (it was unreachable): until then the store says
    ``running``, which refuses other backfills of the schedule."""


class Backfills:
    """Starts and tracks this process's backfills; reads others' from the store."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        loops: Loops,
        launcher: Launcher,
        instance: str,
        new_id: Callable[[], str],
    ) -> None:
        self.clock = clock
        self.store = store
        self.loops = loops
        self.launcher = launcher
        self.instance = instance
        self.new_id = new_id
        self.jobs: dict[str, _Job] = {}

    @property
    def idle(self) -> bool:
        return not any(job.task is not None and not job.task.done() for job in self.jobs.values())

    def plan(
        self, schedule: Schedule, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan:
        return plan_backfill(schedule, start, end, self.clock.now(), confirm=confirm, limit=limit)

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
        ``skip_succeeded``, only those without a succeeded run.

        Raises :class:`Refused` (with the count and reason) when the plan is refused or a
        backfill of this schedule is already running anywhere."""
        plan = self.plan(schedule, start, end, confirm=confirm, limit=limit)
        if plan.refusal is not None:
            raise Refused(
                f'backfill of "{schedule.name}" refused: {plan.refusal}',
                count=plan.count,
                reason=plan.reason or plan.refusal,
            )
        slots = list(schedule.cron.occurrences(plan.start, plan.end))
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
        job = _Job(progress)
        self.jobs[progress.id] = job
        job.task = self.loops.spawn(self._run(schedule, job, slots), f"backfill {schedule.name}")
        return progress

    async def _run(self, schedule: Schedule, job: _Job, slots: list[datetime]) -> None:
        try:
            for slot in slots:
                job.progress = dataclasses.replace(job.progress, current=slot)
                scheduled = self.launcher.launch(schedule, slot, "manual", "manual")
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
            job.progress = dataclasses.replace(job.progress, state="done", finished_at=self.clock.now(), current=None)
        except asyncio.CancelledError:
            state: Literal["cancelled", "abandoned"] = "cancelled" if job.cancelled else "abandoned"
            job.progress = dataclasses.replace(job.progress, state=state, finished_at=self.clock.now())
            if not job.cancelled:
                raise
        finally:
            try:
                await self.store.update_backfill(job.progress)
            except Unavailable:
                job.unsaved = True  # written by maintain() once the store is back
            job.finished.set()
            log.info(
                "backfill %s of %s %s: %d fired, %d failed, %d remaining",
                job.progress.id,
                schedule.name,
                job.progress.state,
                job.progress.fired,
                job.progress.failed,
                job.progress.remaining,
            )

    async def maintain(self) -> None:
        """Write the ends of backfills the store could not take when they ended."""
        for job in self.jobs.values():
            if job.unsaved:
                await self.store.update_backfill(job.progress)
                job.unsaved = False

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
        finishes on its own); recorded ``cancelled`` with what it fired."""
        job = self.jobs.get(backfill_id)
        if job is None:
            progress = await self.progress(backfill_id)
            if progress.state != "running":
                return progress
            raise Refused(
                f"backfill {backfill_id} runs on instance {progress.instance}; cancel it there", reason="runs elsewhere"
            )
        if job.task is not None and not job.task.done():
            job.cancelled = True
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        if job.progress.state == "running":  # cancelled before its first slot
            job.progress = dataclasses.replace(job.progress, state="cancelled", finished_at=self.clock.now())
            await self.store.update_backfill(job.progress)
            job.finished.set()
        return job.progress

    async def progress(self, backfill_id: str) -> BackfillProgress:
        job = self.jobs.get(backfill_id)
        if job is not None:
            return job.progress
        progress = await self.store.get_backfill(backfill_id)
        if progress is None:
            raise NotFound(f'no backfill with id "{backfill_id}"')
        return progress

    async def wait(self, backfill_id: str) -> BackfillProgress:
        job = self.jobs.get(backfill_id)
        if job is None:
            return await self.progress(backfill_id)
        await job.finished.wait()
        return job.progress
