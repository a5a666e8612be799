"""``st.jobs``: sending jobs and acting on queues, from any Python process or from a handler::

    async with connect("postgresql://…") as st:
        sent = await st.jobs.send("mailer", {"order": 42}, key="receipt:42")
        await st.jobs.cancel("mailer", key="receipt:42")

Inside a handler (of a job or a schedule) the same object is ``ctx.jobs``; a sync handler,
which runs on a thread of its own, uses its blocking twin ``ctx.jobs.sync``.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from backend.jobs.model import Job, JobDetail, JobsPage, QueueView, Sent
from backend.runtime.loops import call_from_thread

if TYPE_CHECKING:
    from backend.jobs.system import Jobs

__all__ = ["BlockingJobActions", "JobActions"]


class JobActions:
    """The job queue's actions (every method checks its input: ``BadInput``, ``TooLarge``,
    ``NotFound``, ``QueueFull``, ``NotDead``; ``Unavailable`` when the store is)."""

    def __init__(self, jobs: Jobs, actor: str | None = None) -> None:
        self._jobs = jobs
        self._actor = actor

    def acting_as(self, actor: str | None) -> JobActions:
        return JobActions(self._jobs, actor)

    async def send(
        self, queue: str, payload: Any = None, *, delay: float | timedelta = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        """Queue one job: ``payload`` JSON up to 256 KiB, ``delay`` 0 to 30 days (seconds),
        ``attempts`` 1 to 20 (default: the queue's), ``key`` up to 256 bytes. With a key
        held by a queued, running or dead job, nothing is queued: the answer is that job's
        id and ``duplicate`` True."""
        return await self._jobs.send(queue, payload, delay=delay, attempts=attempts, key=key)

    async def send_many(self, queue: str, jobs: Iterable[Mapping[str, Any]]) -> builtins.list[Sent]:
        """Queue several jobs in one transaction (each a mapping of ``payload``, ``delay``,
        ``attempts``, ``key``); all or none. One answer per job, in order."""
        return await self._jobs.send_many(queue, jobs)

    async def cancel(self, queue: str, id: str | None = None, *, key: str | None = None) -> bool:
        """Delete a queued job by its id, or (``key=``) by its key; True if it was queued (a
        running one finishes). An id is never taken for a key, nor a key for an id."""
        return await self._jobs.cancel(queue, id, key=key)

    async def delete(self, queue: str, job_id: str) -> None:
        """Delete a job in any state (``NotFound`` if there is none)."""
        await self._jobs.delete(queue, job_id)

    async def retry(self, queue: str, job_id: str) -> Job:
        """Put a dead job back, with fresh attempts."""
        return await self._jobs.retry(queue, job_id)

    async def pause(self, queue: str) -> QueueView:
        """Stop starting the queue's jobs (those running finish; sends are still taken)."""
        return await self._jobs.set_paused(queue, True, by=self._actor)

    async def resume(self, queue: str) -> QueueView:
        return await self._jobs.set_paused(queue, False, by=self._actor)

    async def queues(self) -> builtins.list[QueueView]:
        return await self._jobs.queue_views()

    async def list(
        self, queue: str, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> JobsPage:
        """A page of jobs, newest first (``status``: queued, running or dead)."""
        return await self._jobs.list_jobs(queue, status=status, limit=limit, before=before)

    async def get(self, job_id: str) -> JobDetail:
        """A job (while it exists) and its attempts."""
        return await self._jobs.get_job(job_id)

    async def from_schedule(self, queue: str, schedule: str, run_id: str, payload: Any) -> Sent:
        """What a schedule that targets a queue does with each slot (internal)."""
        return await self._jobs.from_schedule(queue, schedule, run_id, payload)

    @property
    def sync(self) -> BlockingJobActions:
        """The same actions for sync code on another thread (a sync handler): each call
        blocks until the engine's loop has carried it out."""
        return BlockingJobActions(self)


class BlockingJobActions:
    """:class:`JobActions` whose methods block (for code that runs off the engine's loop)."""

    def __init__(self, actions: JobActions) -> None:
        self._actions = actions

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._actions, name)
        if not asyncio.iscoroutinefunction(method):
            return method
        loop = self._actions._jobs.loop

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return call_from_thread(loop, method(*args, **kwargs), "await ctx.jobs.… instead of ctx.jobs.sync.…")

        return call
