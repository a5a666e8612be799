"""What the Health view and ``GET /inspect/activity`` show: per schedule and per queue, what
happened in each minute of a recent window, and how late each schedule is now.

The window is ``minutes`` whole minutes of UTC, the last one the minute ``now`` is in: the
minute ``i`` (oldest first) covers ``[start + i min, start + (i + 1) min)``, so an event at
exactly ``hh:mm:00`` counts in minute ``hh:mm``. Every series holds one count per minute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from backend.model import Timestamp, iso, parse_iso

__all__ = ["MINUTE", "Activity", "QueueActivity", "ScheduleActivity", "window_start"]

MINUTE = timedelta(minutes=1)


def window_start(now: datetime, minutes: int) -> datetime:
    """The start of the first of the ``minutes`` whole minutes ending with the one ``now``
    is in."""
    now = now.astimezone(UTC)
    return now.replace(second=0, microsecond=0) - (minutes - 1) * MINUTE


def _series(data: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in data)


def _when(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return parse_iso(value) if value else None


class ScheduleActivityJson(TypedDict):
    """One schedule over the window: the runs that ended in each minute and those that failed;
    ``late_since`` the first slot since its newest success once that slot has come (null while
    on time), ``late_s`` how late it is now in seconds."""

    name: str
    enabled: bool
    runs: list[int]
    failures: list[int]
    last_success_at: Timestamp | None
    late_since: Timestamp | None
    late_s: float | None


@dataclass(frozen=True, slots=True)
class ScheduleActivity:
    """One schedule over the window.

    ``runs`` counts the runs that ended in each minute, succeeded or failed (skipped and
    missed slots ran nothing: they show in the lateness instead), ``failures`` those of them
    that failed. Runs of every trigger count (a backfill's runs in the minute they ended).

    Lateness is a dead man's switch: ``late_since`` is the first slot of the schedule's cron
    after the slot of its newest succeeded run (of any trigger), once that slot has come;
    ``None`` while the schedule is on time (no slot has come since its newest success).
    A schedule that never succeeded is late since its first slot at or after its oldest
    recorded run; one without any run has no lateness (``last_success_at`` and
    ``late_since`` are both ``None``). A run in flight counts as late until it succeeds:
    the alerts, not this figure, allow a grace."""

    name: str
    enabled: bool
    runs: tuple[int, ...]
    failures: tuple[int, ...]
    last_success_at: datetime | None = None
    """The slot (``scheduled_at``) of the newest succeeded run."""
    late_since: datetime | None = None

    @property
    def total_runs(self) -> int:
        return sum(self.runs)

    @property
    def total_failures(self) -> int:
        return sum(self.failures)

    def lateness(self, now: datetime) -> timedelta | None:
        """How late it is at ``now``; ``None`` when on time or without runs."""
        if self.late_since is None:
            return None
        return max(timedelta(0), now - self.late_since)

    def to_json(self, now: datetime | None = None) -> ScheduleActivityJson:
        lateness = self.lateness(now) if now is not None else None
        return {
            "name": self.name,
            "enabled": self.enabled,
            "runs": list(self.runs),
            "failures": list(self.failures),
            "last_success_at": iso(self.last_success_at),
            "late_since": iso(self.late_since),
            "late_s": None if lateness is None else round(lateness.total_seconds(), 3),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleActivity:
        return cls(
            name=data["name"],
            enabled=bool(data["enabled"]),
            runs=_series(data["runs"]),
            failures=_series(data["failures"]),
            last_success_at=_when(data, "last_success_at"),
            late_since=_when(data, "late_since"),
        )


class QueueActivityJson(TypedDict):
    """One job queue over the window: attempts that ended in each minute, those that failed, the
    jobs that died in it (and are dead still); ``dead_now`` the dead jobs it holds now."""

    name: str
    finished: list[int]
    failed: list[int]
    dead: list[int]
    dead_now: int


@dataclass(frozen=True, slots=True)
class QueueActivity:
    """One job queue over the window.

    ``finished`` counts the attempts that ended in each minute (succeeded or failed),
    ``failed`` those that failed, and ``dead`` the jobs that died in it (their last attempt
    failed) and are dead still: a dead job retried or deleted since is no longer counted.
    ``dead_now`` is how many dead jobs the queue holds now."""

    name: str
    finished: tuple[int, ...]
    failed: tuple[int, ...]
    dead: tuple[int, ...]
    dead_now: int = 0

    @property
    def total_finished(self) -> int:
        return sum(self.finished)

    @property
    def total_failed(self) -> int:
        return sum(self.failed)

    @property
    def dead_growth(self) -> int:
        """How many jobs died in the window (and are dead still)."""
        return sum(self.dead)

    def to_json(self) -> QueueActivityJson:
        return {
            "name": self.name,
            "finished": list(self.finished),
            "failed": list(self.failed),
            "dead": list(self.dead),
            "dead_now": self.dead_now,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueActivity:
        return cls(
            name=data["name"],
            finished=_series(data["finished"]),
            failed=_series(data["failed"]),
            dead=_series(data["dead"]),
            dead_now=int(data.get("dead_now", 0)),
        )


ActivityJson = TypedDict(
    "ActivityJson",
    {
        "now": Timestamp,
        "from": Timestamp,
        "minutes": int,
        "schedules": list[ScheduleActivityJson],
        "queues": list[QueueActivityJson],
    },
)
ActivityJson.__doc__ = """What happened per schedule and per queue in each of the ``minutes`` whole minutes from
``from`` (the last one the minute ``now`` is in); every series holds one count per minute."""


@dataclass(frozen=True, slots=True)
class Activity:
    """Every schedule (in the engine's order) and every queue (by name) over the window of
    ``minutes`` minutes that ends with the minute ``now`` is in (see the module docstring)."""

    now: datetime
    minutes: int
    schedules: list[ScheduleActivity]
    queues: list[QueueActivity]

    @property
    def start(self) -> datetime:
        return window_start(self.now, self.minutes)

    def to_json(self) -> ActivityJson:
        return {
            "now": iso(self.now),
            "from": iso(self.start),
            "minutes": self.minutes,
            "schedules": [s.to_json(self.now) for s in self.schedules],
            "queues": [q.to_json() for q in self.queues],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Activity:
        return cls(
            now=parse_iso(data["now"]),
            minutes=int(data["minutes"]),
            schedules=[ScheduleActivity.from_json(s) for s in data["schedules"]],
            queues=[QueueActivity.from_json(q) for q in data["queues"]],
        )
