"""The job queue's verbs (embedded with ``--schedules/--store``, or remote with ``--url``)::

    schedtui queues [--json]                      schedtui queues pause|resume QUEUE
    schedtui jobs list QUEUE [--status S] [--limit N] [--before ID] [--json]
    schedtui jobs send QUEUE [--payload JSON] [--delay S] [--attempts N] [--key K] [--json]
    schedtui jobs show ID [--json]
    schedtui jobs logs ID [--attempt N] [--follow | --json]
    schedtui jobs cancel QUEUE (ID_OR_KEY | --key KEY)   exit 0 if it was queued and is gone, 1 if not
    schedtui jobs retry QUEUE ID [--json]         schedtui jobs delete QUEUE ID

Every verb is derived from its action's declaration (:mod:`console.cli.derive`); what is
here is how each one shows its result. A send refused by a limit exits 2 (a bad value)
or 1 (a full queue), with one line naming the limit; a retry of a job that is not dead
exits 1.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import partial
from typing import Any

from backend import BadInput
from backend.inputs import is_id
from backend.jobs.model import Job, JobDetail, JobsPage, QueueView, Sent
from backend.safetext import in_lines, printable
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers, items
from console.cli.logs import FOLLOW, follow_log, no_json_follow, show_log
from console.cli.output import EXIT_FAILURE, EXIT_OK, complain

__all__ = ["DERIVED", "VERBS", "add_verbs", "detail_text", "jobs_table", "queues_table"]


# -- tables ----------------------------------------------------------------------------------
def queues_table(queues: list[QueueView], now: datetime) -> str:
    rows = [
        [
            q.name,
            f"{q.running}/{q.concurrency}",
            f"{q.queued:,}",
            f"{q.dead:,}",
            fmt.ago(q.oldest_queued_at, now) if q.oldest_queued_at else "-",
            "paused" if q.paused else "",
        ]
        for q in queues
    ]
    return fmt.table(["QUEUE", "RUNNING", "QUEUED", "DEAD", "OLDEST DUE", "STATE"], rows)


def _when(job: Job, now: datetime) -> str:
    if job.status == "queued":
        return "due" if job.run_after <= now else fmt.countdown(job.run_after, now)
    if job.status == "running":
        return f"started {fmt.ago(job.started_at, now)}"
    return ""


def _error(tag: str | None, message: str | None) -> str:
    return printable(" ".join(filter(None, [tag and f"[{tag}]", message])), 120)


def jobs_table(jobs: list[Job], now: datetime) -> str:
    rows = [
        [
            job.id,
            job.status,
            f"{job.attempt}/{job.max_attempts}",
            _when(job, now),
            printable(job.key or "", 30),
            job.cron or "",
            _error(job.error_tag, job.error_message),
        ]
        for job in jobs
    ]
    return fmt.table(["ID", "STATUS", "ATTEMPT", "WHEN", "KEY", "CRON", "LAST ERROR"], rows)


def detail_text(detail: JobDetail, now: datetime) -> str:
    lines = []
    job = detail.job
    if job is None:
        lines.append(f"job {detail.id} of {detail.queue}: gone (it succeeded, or was deleted); its attempts:")
    else:
        lines.append(f"job {job.id} of {job.queue}: {job.status}, attempt {job.attempt}/{job.max_attempts}")
        if job.status == "queued":
            lines.append(f"  next try   {_when(job, now)} ({fmt.local_time(job.run_after, 'UTC')})")
        if job.key:
            lines.append(f"  key        {printable(job.key)}")
        if job.cron:
            lines.append(f"  schedule   {job.cron}")
        lines.append(f"  created    {fmt.local_time(job.created_at, 'UTC')}")
        lines.append(f"  payload    {printable(json.dumps(job.payload, ensure_ascii=False), 400)}")
    if detail.attempts:
        rows = [
            [
                fmt.attempt_label(a, detail.attempts),
                fmt.local_time(a.started_at, "UTC"),
                fmt.duration(round((a.finished_at - a.started_at).total_seconds() * 1000)),
                a.status,
                a.instance,
                _error(a.error_tag, a.error_message),
            ]
            for a in detail.attempts
        ]
        lines.append("")
        lines.append(fmt.table(["ATTEMPT", "STARTED", "TOOK", "STATUS", "INSTANCE", "ERROR"], rows))
    elif job is not None:
        lines.append("  no attempt has ended yet")
    return "\n".join(lines)


# -- how each verb shows its result ---------------------------------------------------------
async def _show_queues(call: Call, queues: list[QueueView]) -> None:
    if not queues:
        print("no queues (a queue is recorded when a process with its definition opens the store)")
    else:
        print(queues_table(queues, await call.backend.now()))


def _show_paused(call: Call, view: QueueView) -> None:
    print(f"{view.name} {'paused' if view.paused else 'resumed'}: {view.queued:,} queued, {view.running} running")


async def _show_jobs(call: Call, page: JobsPage) -> None:
    queue, status = call.arguments["queue"], call.arguments["status"]
    if not page.jobs:
        print(f"no {status + ' ' if status else ''}jobs in {queue}")
        return
    print(jobs_table(page.jobs, await call.backend.now()))
    if page.next_before:
        more = f" --status {status}" if status else ""
        print(f"\nolder: schedtui jobs list {queue}{more} --before {page.next_before}")


def _show_sent(call: Call, sent: Sent) -> None:
    queue, delay, key = call.arguments["queue"], call.arguments["delay"], call.arguments["key"]
    if sent.duplicate:
        print(f"duplicate: job {sent.id} holds key {printable(key or '', 60)}; nothing queued")
    else:
        print(f"queued job {sent.id} in {queue}" + (f" (runs in {delay:g}s)" if delay else ""))


async def _show_detail(call: Call, detail: JobDetail) -> None:
    print(in_lines(detail_text(detail, await call.backend.now())))  # (a payload's bidirectional override)


def _id_or_key(arguments: dict[str, Any]) -> dict[str, Any]:
    """``jobs cancel QUEUE ID_OR_KEY``: without ``--key``, the argument's shape decides
    (an id is an id, anything else a key)."""
    job_id, key = arguments["id"], arguments["key"]
    if (job_id is None) == (key is None):
        raise BadInput("say which job: `jobs cancel QUEUE ID_OR_KEY` or `jobs cancel QUEUE --key KEY`", field="id")
    if job_id is not None and not is_id(job_id):
        job_id, key = None, job_id
    return {**arguments, "id": job_id, "key": key}


def _cancelled_what(arguments: dict[str, Any]) -> str:
    if arguments["id"] is not None:
        return f"job {arguments['id']}"
    return f'the job with key "{printable(arguments["key"] or "", 60)}"'


def _show_cancelled(call: Call, cancelled: bool) -> None:
    shown, queue = _cancelled_what(call.arguments), call.arguments["queue"]
    if cancelled:
        print(f"cancelled {shown} in {queue}")
    else:
        complain(f"no queued {shown.removeprefix('the ')} in {queue} (running, dead or gone)")


def _show_retried(call: Call, job: Job) -> None:
    print(f"job {job.id} of {job.queue} queued again with {job.max_attempts} fresh attempt(s)")


def _show_deleted(call: Call, result: None) -> None:
    print(f"deleted job {call.arguments['job_id']} of {call.arguments['queue']}")


# A refusal (a full queue, a retry of a job that is not dead) is a failure of the verb,
# its input was fine: exit code 1.
JobVerb = partial(Verb, refused=EXIT_FAILURE)

#: The verbs, in the order ``schedtui --help`` lists them.
DERIVED = (
    JobVerb(("queues",), "list_queues", help="list queues, or pause/resume one", show=_show_queues),
    JobVerb(("queues", "pause"), "pause_queue", show=_show_paused),
    JobVerb(("queues", "resume"), "resume_queue", show=_show_paused),
    JobVerb(("jobs", "list"), "list_jobs", help="a queue's jobs, newest first", json=items("jobs"), show=_show_jobs),
    JobVerb(("jobs", "send"), "send_job", help="queue a job", show=_show_sent),
    JobVerb(("jobs", "show"), "get_job", help="a job (while it exists) and its attempts", show=_show_detail),
    JobVerb(("jobs", "logs"), "job_log", help="what a job attempt's handler logged and printed (--follow: as it comes)",
            switches=FOLLOW, prepare=no_json_follow, follow=follow_log, show=show_log),
    JobVerb(("jobs", "cancel"), "cancel_job", help="delete a queued job by id or key (exit 1 if none was queued)",
            positional=("id",), metavars={"id": "ID_OR_KEY"}, adapt=_id_or_key, show=_show_cancelled,
            outcome=lambda cancelled: EXIT_OK if cancelled else EXIT_FAILURE),
    JobVerb(("jobs", "retry"), "retry_job", help="put a dead job back with fresh attempts", show=_show_retried),
    # Scripts delete without --yes, as they always have (the console asks).
    JobVerb(("jobs", "delete"), "delete_job", help="delete a job in any state", asks=False, show=_show_deleted),
)  # fmt: skip

GROUPS = {"jobs": "list, send, show, read the logs of, cancel, retry and delete jobs"}


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, GROUPS, verb, group)


VERBS = handlers(DERIVED)
