# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""What is alerting now (system ``alerts``)."""

from __future__ import annotations

from typing import Annotated

from backend.alerts.model import AlertsPage
from backend.client.actions import Help, Http, action


class AlertOperations:
    """The alerts kept in the store."""

    @action(system="alerts", permission="read", impl="alerts.page",
            http=Http("GET", "/inspect/alerts", ok="{alerts: [alert], firing}"))
    async def alerts(self, *, resolved: Annotated[bool, Help("also the alerts resolved in the last 24 hours")] = False) -> AlertsPage:
        """What is alerting now: firing alerts first, newest first.

        alerts is [{key, condition, subject_kind, subject, state, since, summary, updated_at,
        transition}]: condition is failing, late, not_firing, instance_lost, dead_jobs or stuck;
        subject the schedule, queue, execution id, fleet or instance name; since when it took its
        state; firing counts the firing ones. With resolved, the alerts resolved in the last 24
        hours follow."""
