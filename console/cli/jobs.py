"""The job queue's verbs (embedded with ``--schedules/--store``, or remote with ``--url``)::

    schedtui queues [--json]                      schedtui queues pause|resume QUEUE
    schedtui jobs list QUEUE [--status S] [--limit N] [--before ID] [--json]
    schedtui jobs send QUEUE [--payload JSON] [--delay S] [--attempts N] [--key K] [--json]
    schedtui jobs show ID [--json]
    schedtui jobs cancel QUEUE (ID_OR_KEY | --key KEY)   exit 0 if it was queued and is gone, 1 if not
    schedtui jobs retry QUEUE ID [--json]         schedtui jobs delete QUEUE ID

A send refused by a limit exits 2 (a bad value) or 1 (a full queue), with one line naming
the limit; a retry of a job that is not dead exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

from backend import BadInput, Refused
from backend.client.interface import Backend
from backend.inputs import is_id
from backend.jobs.model import JOB_STATUSES, Job, JobDetail, QueueView
from backend.safetext import printable
from console import format as fmt
from console.cli.main import _VERB_OPTIONS, EXIT_FAILURE, EXIT_OK, _print_json, _with_backend

Maker = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def add_verbs(verb: Maker, group: Callable[..., Maker]) -> None:
    p = verb("queues", "list queues, or pause/resume one", _VERB_OPTIONS)
    p.add_argument("action", nargs="?", choices=["pause", "resume"], help="pause or resume QUEUE")
    p.add_argument("queue", nargs="?", metavar="QUEUE")
    p.add_argument("--json", action="store_true", help="a JSON array of queues (or the queue acted on)")

    sub = group("jobs", "list, send, show, cancel, retry and delete jobs")
    p = sub("list", "a queue's jobs, newest first", _VERB_OPTIONS)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--status", choices=JOB_STATUSES, help="only jobs in this state")
    p.add_argument("--limit", type=_whole, default=50, metavar="N", help="how many (50; at most 1000)")
    p.add_argument("--before", metavar="JOB_ID", help="older than this job (the next page)")
    p.add_argument("--json", action="store_true", help="a JSON array of jobs")

    p = sub("send", "queue a job", _VERB_OPTIONS)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--payload", metavar="JSON", help="the job's payload, JSON (default null; 256 KiB at most)")
    p.add_argument("--delay", type=_number, default=0.0, metavar="S", help="run no sooner than S seconds from now (0-30 days)")
    p.add_argument("--attempts", type=_whole, metavar="N", help="attempts before the job is dead (1-20; the queue's default)")
    p.add_argument("--key", metavar="K", help="dedupe key: no second job with it while one is queued, running or dead")
    p.add_argument("--json", action="store_true", help='print {"id", "duplicate"}')

    p = sub("show", "a job (while it exists) and its attempts", _VERB_OPTIONS)
    p.add_argument("id", metavar="ID")
    p.add_argument("--json", action="store_true", help="the job with its attempts, as JSON")

    p = sub("cancel", "delete a queued job by id or key (exit 1 if none was queued)", _VERB_OPTIONS)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("id", metavar="ID_OR_KEY", nargs="?",
                   help="a job's id if it has an id's shape (26 characters such as 01JD3Z6Q0V9W4C7PAXH3KJ1M2B), else its key")
    p.add_argument("--key", metavar="KEY", help="the job's key, whatever its shape (a key that looks like an id)")

    p = sub("retry", "put a dead job back with fresh attempts", _VERB_OPTIONS)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("id", metavar="ID")
    p.add_argument("--json", action="store_true", help="print the job as JSON")

    p = sub("delete", "delete a job in any state", _VERB_OPTIONS)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("id", metavar="ID")


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
                str(a.attempt),
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


# -- verbs ----------------------------------------------------------------------------------
async def cmd_queues(args: argparse.Namespace) -> int:
    if (args.action is None) != (args.queue is None):
        raise BadInput("say `schedtui queues pause QUEUE` or `schedtui queues resume QUEUE`", field="queue")

    async def body(backend: Backend) -> int:
        if args.action is not None:
            view = await backend.set_queue_paused(args.queue, args.action == "pause")
            if args.json:
                _print_json(view.to_json())
            else:
                print(f"{view.name} {'paused' if view.paused else 'resumed'}: {view.queued:,} queued, {view.running} running")
            return EXIT_OK
        queues = await backend.list_queues()
        if args.json:
            _print_json([q.to_json() for q in queues])
        elif not queues:
            print("no queues (a queue is recorded when a process with its definition opens the store)")
        else:
            print(queues_table(queues, await backend.now()))
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_list(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        page = await backend.list_jobs(args.queue, status=args.status, limit=args.limit, before=args.before)
        if args.json:
            _print_json([j.to_json() for j in page.jobs])
            return EXIT_OK
        if not page.jobs:
            print(f"no {args.status + ' ' if args.status else ''}jobs in {args.queue}")
            return EXIT_OK
        print(jobs_table(page.jobs, await backend.now()))
        if page.next_before:
            status = f" --status {args.status}" if args.status else ""
            print(f"\nolder: schedtui jobs list {args.queue}{status} --before {page.next_before}")
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f'--payload "{printable(text, 60)}" is not JSON ({exc})', field="payload") from None


async def cmd_send(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)

    async def body(backend: Backend) -> int:
        try:
            sent = await backend.send_job(args.queue, payload, delay=args.delay, attempts=args.attempts, key=args.key)
        except Refused as exc:  # a full queue: the send failed, the input was fine
            print(f"schedtui: {exc.message}", file=sys.stderr)
            return EXIT_FAILURE
        if args.json:
            _print_json(sent.to_json())
        elif sent.duplicate:
            print(f"duplicate: job {sent.id} holds key {printable(args.key or '', 60)}; nothing queued")
        else:
            print(f"queued job {sent.id} in {args.queue}" + (f" (runs in {args.delay:g}s)" if args.delay else ""))
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_show(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        detail = await backend.get_job(args.id)
        if args.json:
            _print_json(detail.to_json())
        else:
            print(detail_text(detail, await backend.now()))
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_cancel(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.key is None):
        raise BadInput("say which job: `jobs cancel QUEUE ID_OR_KEY` or `jobs cancel QUEUE --key KEY`", field="id")
    # Without --key, the argument's shape decides: an id is an id, anything else a key.
    key = args.key if args.key is not None else None if is_id(args.id) else args.id
    job_id = None if key is not None else args.id
    shown = f"job {job_id}" if job_id is not None else f'the job with key "{printable(key or "", 60)}"'

    async def body(backend: Backend) -> int:
        if await backend.cancel_job(args.queue, job_id, key=key):
            print(f"cancelled {shown} in {args.queue}")
            return EXIT_OK
        print(f"schedtui: no queued {shown.removeprefix('the ')} in {args.queue} (running, dead or gone)", file=sys.stderr)
        return EXIT_FAILURE

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_retry(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        try:
            job = await backend.retry_job(args.queue, args.id)
        except Refused as exc:
            print(f"schedtui: {exc.message}", file=sys.stderr)
            return EXIT_FAILURE
        if args.json:
            _print_json(job.to_json())
        else:
            print(f"job {job.id} of {job.queue} queued again with {job.max_attempts} fresh attempt(s)")
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_delete(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        await backend.delete_job(args.queue, args.id)
        print(f"deleted job {args.id} of {args.queue}")
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "queues": cmd_queues,
    "jobs list": cmd_list,
    "jobs send": cmd_send,
    "jobs show": cmd_show,
    "jobs cancel": cmd_cancel,
    "jobs retry": cmd_retry,
    "jobs delete": cmd_delete,
}
