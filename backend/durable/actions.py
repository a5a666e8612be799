"""``st.durable``: the operations on durable executions from :func:`backend.connect`.

Nothing runs here: an execution started from a web request or a script is run by a
``schedtui serve`` instance that defines its function."""

from __future__ import annotations

import builtins
from typing import Any

from backend.durable.model import Execution, Signalled, Started
from backend.durable.service import Durable

__all__ = ["DurableActions"]


class DurableActions:
    """Start, signal, cancel, retry, list and show executions (``st.durable``)."""

    def __init__(self, durable: Durable, actor: str | None) -> None:
        self._durable = durable
        self._actor = actor

    async def start(self, function: str, input: Any = None) -> Started:
        """Queue an execution of ``function`` (``Started.id``)."""
        return await self._durable.start_execution(function, input)

    async def signal(self, id: str, name: str, payload: Any = None) -> Signalled:
        """Send the signal ``name`` (an approval, say) to an execution."""
        return await self._durable.signal(id, name, payload)

    async def cancel(self, id: str) -> Execution:
        return await self._durable.cancel(id, by=self._actor)

    async def retry(self, id: str) -> Execution:
        return await self._durable.retry(id, by=self._actor)

    async def get(self, id: str) -> Execution:
        """One execution with its steps and log."""
        return await self._durable.get(id)

    async def list(
        self, function: str | None = None, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> tuple[builtins.list[Execution], str | None]:
        """A page of executions, newest first, and the ``before`` of the next page."""
        return await self._durable.list(function, status=status, limit=limit, before=before)
