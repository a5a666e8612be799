"""Turning the job queue's rows into its objects: one column order for both stores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.jobs.model import Attempt, Job
from backend.jobs.store import Claimed, RunningJob
from backend.safetext import load_json
from backend.store.rows import ToTime

#: The columns of a job, in the order every store selects them.
JOB_FIELDS = (
    "id", "queue", "status", "payload", "key", "cron", "attempt", "max_attempts", "run_after", "created_at",
    "started_at", "instance", "error_tag", "error_message",
)  # fmt: skip
#: The columns of a claimed job (as the claim returns them).
CLAIMED_FIELDS = (
    "id", "queue", "payload", "key", "cron", "attempt", "max_attempts", "tries", "created_at", "started_at",
)  # fmt: skip
#: The columns of an attempt, in the order every store selects them (after the job's queue).
ATTEMPT_FIELDS = ("attempt", "started_at", "finished_at", "status", "error_tag", "error_message", "instance", "seq")
RUNNING_FIELDS = ("id", "queue", "instance", "token", "tries", "attempt", "max_attempts", "started_at", "seat")


def job_from_row(row: Sequence[Any], when: ToTime) -> Job:
    run_after, created_at = when(row[8]), when(row[9])
    assert run_after is not None and created_at is not None
    return Job(
        id=row[0],
        queue=row[1],
        status=row[2],
        payload=load_json(row[3]),
        key=row[4],
        cron=row[5],
        attempt=row[6],
        max_attempts=row[7],
        run_after=run_after,
        created_at=created_at,
        started_at=when(row[10]),
        instance=row[11],
        error_tag=row[12],
        error_message=row[13],
    )


def claimed_from_row(row: Sequence[Any], when: ToTime, seat: int | None = None) -> Claimed:
    created_at, started_at = when(row[8]), when(row[9])
    assert created_at is not None and started_at is not None
    return Claimed(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], created_at, started_at, seat)


def attempt_from_row(row: Sequence[Any], when: ToTime) -> Attempt:
    started_at, finished_at = when(row[1]), when(row[2])
    assert started_at is not None and finished_at is not None
    return Attempt(row[0], started_at, finished_at, row[3], row[4], row[5], row[6], row[7])


def running_from_row(row: Sequence[Any], when: ToTime) -> RunningJob:
    started_at = when(row[7])
    assert started_at is not None
    return RunningJob(row[0], row[1], row[2], row[3], row[4], row[5], row[6], started_at, row[8])


def queue_full_message(queue: str, held: int, adding: int, limit: int) -> str:
    return (
        f'queue "{queue}" is full: it holds {held:,} queued and dead jobs and the limit is {limit:,}; '
        f"{adding:,} more refused until some run or are deleted"
    )
