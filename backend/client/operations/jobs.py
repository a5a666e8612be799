# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The operator actions on the job queue (system ``jobs``)."""

from __future__ import annotations

from typing import Annotated, Any

from backend.client.actions import Cursor, Danger, Help, Http, Id, Range, Schema, action
from backend.client.operations.common import LOG_ANSWER, LogOffset, PageSize, QueueName, deleted
from backend.jobs.definition import MAX_PAYLOAD_BYTES, check_cancel, check_send
from backend.jobs.model import Job, JobDetail, JobsPage, QueueView, Sent
from backend.observability.logs import RunLog


def _check_send(queue: str, payload: Any = None, delay: float = 0, attempts: int | None = None, key: str | None = None) -> None:
    check_send(payload, delay, attempts, key)


def _check_cancel(queue: str, id: str | None = None, key: str | None = None) -> None:
    check_cancel(id, key)


class JobOperations:
    """Queues and their jobs: pausing, sending, cancelling, retrying and deleting."""

    @action(system="jobs", permission="read", impl="jobs.queue_views",
            http=Http("GET", "/inspect/queues", envelope="queues", clock=True,
                      ok="{now, queues: [{name, concurrency, paused, queued, running, dead, oldest_queued_at}]}"))
    async def list_queues(self) -> list[QueueView]:
        """Every queue with its counts (queued, running, dead) and whether it is paused."""

    @action(system="jobs", permission="operate", label="pause", audit="queue.pause", impl="jobs.pause",
            http=Http("POST", "/inspect/queues/{queue}/pause", ok="the queue", errors={404: "unknown queue"}))
    async def pause_queue(self, queue: QueueName) -> QueueView:
        """Pause a queue - its jobs wait (sends are still taken); running ones finish."""

    @action(system="jobs", permission="operate", label="resume", audit="queue.resume", impl="jobs.resume",
            http=Http("POST", "/inspect/queues/{queue}/resume", ok="the queue", errors={404: "unknown queue"}))
    async def resume_queue(self, queue: QueueName) -> QueueView:
        """Resume a paused queue."""

    @action(system="jobs", permission="read", impl="jobs.list_jobs",
            http=Http("GET", "/inspect/queues/{queue}/jobs", ok="{jobs: [job], next_before}", errors={404: "unknown queue"}))
    async def list_jobs(
        self,
        queue: QueueName,
        *,
        status: Annotated[str | None, Schema({"enum": ["queued", "running", "dead"]})] = None,
        limit: PageSize = 50,
        before: Annotated[str | None, Cursor("job")] = None,
    ) -> JobsPage:
        """A page of a queue's jobs, newest first (keyset paging)."""

    @action(system="jobs", permission="operate", label="sending a job", audit="job.send", impl="jobs.send_by_operator", check=_check_send,
            http=Http("POST", "/inspect/queues/{queue}/jobs", status=201, again=200, repeated=lambda sent: sent.duplicate,
                      max_body=6 * MAX_PAYLOAD_BYTES + 64 * 1024,
                      ok="queued: {id, duplicate: false}; a job with this key exists: {id, duplicate: true}, nothing queued",
                      errors={404: "unknown queue", 409: "queue_full: it holds 10,000 queued and dead jobs",
                              413: "the payload is over 256 KiB"}))
    async def send_job(
        self,
        queue: QueueName,
        payload: Annotated[Any, Schema({"description": "any JSON, up to 256 KiB encoded"})] = None,
        *,
        delay: Annotated[float, Schema({"minimum": 0, "maximum": 2592000, "description": "seconds (30 days at most)"})] = 0,
        attempts: Annotated[int | None, Schema({"minimum": 1, "maximum": 20})] = None,
        key: Annotated[str | None, Schema({"maxLength": 256, "description": "up to 256 bytes of UTF-8"})] = None,
    ) -> Sent:
        """Send a job (a key held by another job queues nothing and answers its id).

        Every limit is checked before anything is written (``BadInput``, ``TooLarge``;
        ``QueueFull`` is a ``Refused``). Sent again after a connection error only with a
        ``key`` (the repeat queues nothing and answers the job's id, ``duplicate`` true)."""

    @action(system="jobs", permission="read", impl="jobs.get_job",
            http=Http("GET", "/inspect/jobs/{job_id}", errors={404: "unknown job"},
                      ok="the job with attempts: [{number, round, attempt, started_at, finished_at, status, error_tag, error_message, "
                         "instance}]"))
    async def get_job(self, job_id: Annotated[str, Id("job")]) -> JobDetail:
        """A job (while it exists) and its attempts; once gone, its attempts (job fields null)."""

    @action(system="jobs", permission="read", impl="run_logs.job_log",
            http=Http("GET", "/inspect/jobs/{job_id}/log", ok=LOG_ANSWER, errors={404: "unknown job, or no such attempt"}))
    async def job_log(
        self,
        job_id: Annotated[str, Id("job")],
        *,
        attempt: Annotated[int | None, Range(1, 1000),
                           Help("the attempt's number, as jobs show lists it (on across retries; default: the newest)")] = None,
        after: LogOffset = 0,
    ) -> RunLog:
        """What a job attempt's handler logged and printed (its first and last 32 KiB).

        The newest attempt's, or that of the attempt numbered ``attempt`` (its ``number``
        in the job's ``attempts``: 1, 2, … on across retries from dead, where ``attempt``
        starts again from 1); the same answer as a run's log, ``attempt`` its number."""

    @action(system="jobs", permission="operate", label="cancel", audit="job.cancel", impl="jobs.cancel", check=_check_cancel,
            http=Http("POST", "/inspect/queues/{queue}/cancel", envelope="cancelled",
                      ok="{cancelled}: true if it was queued and is gone", errors={404: "unknown queue"}))
    async def cancel_job(
        self,
        queue: QueueName,
        id: Annotated[str | None, Schema({"pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"})] = None,
        *,
        key: Annotated[str | None, Schema({"minLength": 1, "maxLength": 256})] = None,
    ) -> bool:
        """Delete a queued job by its id or by its key (a running one finishes).

        Exactly one of id and key. Each means what it says: a key that happens to look
        like an id (even another job's) cancels the job with that key. True if it was
        queued and is gone."""

    @action(system="jobs", permission="operate", label="retry", audit="job.retry", impl="jobs.retry",
            http=Http("POST", "/inspect/queues/{queue}/jobs/{job_id}/retry", ok="the job",
                      errors={404: "unknown queue or job", 409: "the job is not dead"}))
    async def retry_job(self, queue: QueueName, job_id: Annotated[str, Id("job")]) -> Job:
        """Put a dead job back in its queue, with fresh attempts (``Refused`` if it is not dead)."""

    @action(system="jobs", permission="operate", label="delete", audit="job.delete", impl="jobs.delete",
            danger=Danger("Delete job {job_id} of {queue}?",
                          "It is gone from the queue whatever its state; a running one finishes, and its result is not kept."),
            http=Http("DELETE", "/inspect/queues/{queue}/jobs/{job_id}", extra=deleted, ok="{deleted: true}",
                      errors={404: "unknown queue or job"}))
    async def delete_job(self, queue: QueueName, job_id: Annotated[str, Id("job")]) -> None:
        """Delete a job in any state (a running one finishes; its result is not kept)."""
