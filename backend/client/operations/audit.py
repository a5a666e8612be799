# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The audit log of operator actions (system ``audit``)."""

from __future__ import annotations

from typing import Annotated

from backend.client.actions import Cursor, Http, action
from backend.client.operations.common import PageSize
from backend.events.audit import AuditPage


class AuditOperations:
    """The audit log, read page by page."""

    @action(system="audit", permission="read", impl="audit.list",
            http=Http("GET", "/inspect/audit", ok="{entries: [entry], next_before}"))
    async def audit(self, *, limit: PageSize = 50, before: Annotated[str | None, Cursor("entry")] = None) -> AuditPage:
        """The audit log, newest first (keyset paging).

        Every operator action (Run now, enable, disable, backfills, and the actions of the
        queue, durable executions, locks and stored schedules): {id, at, actor, action,
        target, detail}. actor is the name of the token the action came with, or the OS
        user (or --as) of a CLI or console acting on the store directly. Kept 90 days."""
