"""The fleet's state as the metrics read it: one :class:`FleetSnapshot` from the store.

:class:`FleetStore` is implemented by both stores (:mod:`backend.store.sqlite.metrics`,
:mod:`backend.store.postgres.metrics`). A snapshot costs the same few statements whatever
the number of schedules, queues or functions: one for the schedules (their stored state
and last success), one each for the job counts, the durable executions, the locks held and
the live members.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["JOB_STATES", "FleetSnapshot", "FleetStore", "ScheduleFacts", "job_counts", "member_counts"]

#: The states ``schedtui_jobs`` counts (a job that succeeded is gone).
JOB_STATES = ("queued", "running", "dead")
#: The roles ``schedtui_instances`` counts: members only (an observer fires nothing); a
#: member whose clock is off stands down (``standing_down``), whatever its role.
MEMBER_ROLES = ("firing", "waiting", "standing_down")


@dataclass(frozen=True, slots=True)
class ScheduleFacts:
    """One schedule as the store knows it."""

    name: str
    enabled: bool | None
    """Its stored state; ``None`` when no operator ever changed it (its definition holds)."""
    last_success: datetime | None
    """When its newest succeeded run finished (any trigger); ``None``: none kept."""


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What every instance of a store answers alike."""

    schedules: tuple[ScheduleFacts, ...]
    jobs: dict[tuple[str, str], int]
    """``(queue, state)`` -> jobs, every state of every recorded queue (zeros too)."""
    durable: dict[tuple[str, str], int]
    """``(function, status)`` -> executions kept in the store."""
    locks_held: int
    """Locks with a holder whose lease has not expired."""
    instances: dict[str, int]
    """Role (``firing``, ``waiting``) -> members with a fresh heartbeat."""


class FleetStore(Protocol):
    """Contract: :meth:`fleet_snapshot` reads in a fixed number of statements (five),
    whatever ``names`` holds; connection trouble raises :class:`~backend.errors.Unavailable`."""

    async def fleet_snapshot(
        self, names: Sequence[str], *, now: datetime, live_after: datetime, lock_now: datetime | None
    ) -> FleetSnapshot:
        """The schedules among ``names`` (each once, in that order); members whose heartbeat
        is newer than ``live_after`` (the reader's window back from ``now``), or than their
        own window back from ``now`` when theirs is longer (as the others judge a member's
        silence); locks unexpired at ``lock_now`` (``None``: the database's clock, as the
        locks use it)."""


def job_counts(rows: Iterable[tuple[str, str | None, int]]) -> dict[tuple[str, str], int]:
    """``(queue, state or None, n)`` rows -> every state of every queue named (``None``:
    a queue with no job, named so that its zeros are reported)."""
    counts: dict[tuple[str, str], int] = {}
    for queue, state, n in rows:
        for known in JOB_STATES:
            counts.setdefault((queue, known), 0)
        if state in JOB_STATES:
            counts[(queue, state)] += int(n)
    return counts


def member_counts(rows: Iterable[tuple[str | None, int]]) -> dict[str, int]:
    """``(role, n)`` rows -> members per role; a row without a role (an older version's
    heartbeat) is a firing member, an observer is none."""
    counts = dict.fromkeys(MEMBER_ROLES, 0)
    for role, n in rows:
        key = role or "firing"
        if key in counts:
            counts[key] += int(n)
    return counts
