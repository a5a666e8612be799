# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The recent activity per schedule and queue, and lateness (system ``health``)."""

from __future__ import annotations

from typing import Annotated

from backend.activity import Activity
from backend.client.actions import Help, Http, Range, action


class HealthOperations:
    """Runs, failures and jobs by the minute; how late each schedule is."""

    @action(system="health", permission="read", impl="activity.read",
            http=Http("GET", "/inspect/activity",
                      ok="{now, from, minutes, schedules: [{name, enabled, runs, failures, last_success_at, late_since, "
                         "late_s}], queues: [{name, finished, failed, dead, dead_now}]}"))
    async def activity(
        self, *, minutes: Annotated[int, Range(5, 180), Help("the window: this many whole minutes, up to now")] = 60
    ) -> Activity:
        """Runs and failures per schedule and jobs per queue, by the minute; lateness now.

        The window is whole minutes of UTC, the last one the current minute; every series
        holds a count per minute, oldest first. runs: runs that ended then (succeeded or
        failed), failures: those that failed. late_since: the first slot after the
        schedule's newest succeeded run, once it has come (null: on time, or no run yet);
        late_s: how long ago. finished and failed: job attempts that ended; dead: jobs that
        died then and are dead still; dead_now: the queue's dead jobs now."""
