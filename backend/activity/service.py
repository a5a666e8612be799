"""The engine's activity read (``engine.activity``): per-minute counts from the store, and
each schedule's lateness from its cron (see :mod:`backend.activity.model`).

A read is a bounded number of statements whatever the number of schedules or queues: the
runs' counts, the schedules' newest successes, the queues' counts, and the queue list.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta

from backend.activity.model import MINUTE, Activity, QueueActivity, ScheduleActivity, window_start
from backend.activity.store import ActivityStore, MinuteCounts, RunMarks
from backend.clock import Clock
from backend.inputs import check_count
from backend.jobs.model import QueueView
from backend.schedules import Schedule

__all__ = ["MAX_MINUTES", "MIN_MINUTES", "ActivityReads", "late_since"]

MIN_MINUTES = 5
MAX_MINUTES = 180


def late_since(schedule: Schedule, marks: RunMarks | None, now: datetime) -> datetime | None:
    """The slot a schedule is late since at ``now`` (see
    :class:`~backend.activity.model.ScheduleActivity`), or ``None`` when it is on time or has
    no run."""
    if marks is None:
        return None
    try:
        if marks.last_success is not None:
            due = schedule.cron.next(marks.last_success)
        elif marks.first_run is not None:
            due = schedule.cron.next(marks.first_run - timedelta(seconds=1))  # its first slot at or after it
        else:
            return None
    except ValueError:  # no slot before year 10000
        return None
    return due if due <= now else None


class ActivityReads:
    """Reads :class:`~backend.activity.model.Activity`. ``schedules`` is the engine's (the
    schedules defined in code and in the store), ``is_enabled`` its state of each, ``queues``
    the job queue's list of queues; ``handoff`` hands the ledger's pending runs to the store
    first, so that a read sees every run recorded so far."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: ActivityStore,
        schedules: Mapping[str, Schedule],
        is_enabled: Callable[[str], bool],
        queues: Callable[[], Awaitable[list[QueueView]]],
        handoff: Callable[[], None],
    ) -> None:
        self.clock = clock
        self.store = store
        self.schedules = schedules
        self.is_enabled = is_enabled
        self.queues = queues
        self.handoff = handoff

    async def read(self, *, minutes: int = 60) -> Activity:
        """The last ``minutes`` minutes (5-180), up to now."""
        check_count(minutes, "minutes", MIN_MINUTES, MAX_MINUTES)
        self.handoff()
        now = self.clock.now()
        start = window_start(now, minutes)
        end = start + minutes * MINUTE
        schedules = list(self.schedules.values())
        runs = _by_subject(await self.store.run_counts(start, end), minutes)
        marks = await self.store.run_marks([s.name for s in schedules])
        jobs = _by_subject(await self.store.queue_counts(start, end), minutes)
        views = await self.queues()
        zeros = [0] * minutes
        empty = (zeros, zeros, zeros)
        return Activity(
            now=now,
            minutes=minutes,
            schedules=[
                ScheduleActivity(
                    name=s.name,
                    enabled=self.is_enabled(s.name),
                    runs=tuple(runs.get(s.name, empty)[0]),
                    failures=tuple(runs.get(s.name, empty)[1]),
                    last_success_at=marks[s.name].last_success if s.name in marks else None,
                    late_since=late_since(s, marks.get(s.name), now),
                )
                for s in schedules
            ],
            queues=[
                QueueActivity(
                    name=view.name,
                    finished=tuple(jobs.get(view.name, empty)[0]),
                    failed=tuple(jobs.get(view.name, empty)[1]),
                    dead=tuple(jobs.get(view.name, empty)[2]),
                    dead_now=view.dead,
                )
                for view in views
            ],
        )


def _by_subject(counts: list[MinuteCounts], minutes: int) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """The store's rows as three series per subject (total, failed, dead), a count a minute."""
    series: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for subject, minute, total, failed, dead in counts:
        if not 0 <= minute < minutes:
            continue  # never, from the stores' statements; a bad row must not misplace a count
        found = series.get(subject)
        if found is None:
            found = series[subject] = ([0] * minutes, [0] * minutes, [0] * minutes)
        found[0][minute] += total
        found[1][minute] += failed
        found[2][minute] += dead
    return series
