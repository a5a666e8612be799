# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The operator actions on durable executions (system ``durable``)."""

from __future__ import annotations

from typing import Annotated, Any

from backend.client.actions import Cursor, Danger, Http, Id, Json, Schema, action
from backend.client.operations.common import LOG_ANSWER, LogOffset, PageSize
from backend.durable.model import EXECUTION_STATUSES, Execution, ExecutionsPage, Signalled, Started
from backend.durable.service import MAX_INPUT_BYTES, MAX_SIGNAL_BYTES
from backend.observability.logs import RunLog


class DurableOperations:
    """Durable executions: their pages, timelines and logs; starting, signalling, cancelling
    and retrying them. ``NotFound`` for an unknown execution or function; ``Refused`` for a
    signal or cancel of a finished execution, a retry of one that has not failed."""

    @action(system="durable", permission="read", impl="durable.page",
            http=Http("GET", "/inspect/durable/executions", ok="{executions: [execution], next_before}"))
    async def list_executions(
        self,
        function: Annotated[str | None, Schema({"pattern": "^[A-Za-z0-9_.-]{1,128}$"})] = None,
        *,
        status: Annotated[str | None, Schema({"enum": list(EXECUTION_STATUSES)})] = None,
        limit: PageSize = 50,
        before: Annotated[str | None, Cursor("execution")] = None,
    ) -> ExecutionsPage:
        """A page of durable executions, newest first (keyset paging)."""

    @action(system="durable", permission="read", impl="durable.get",
            http=Http("GET", "/inspect/durable/executions/{execution_id}",
                      ok="execution, with steps [{seq, name, kind, status, attempt, started_at, finished_at, error_message, …}] and logs",
                      errors={404: "unknown execution"}))
    async def get_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """One durable execution with its steps (the timeline) and its log."""

    @action(system="durable", permission="read", impl="run_logs.execution_log",
            http=Http("GET", "/inspect/durable/executions/{execution_id}/log", ok=LOG_ANSWER,
                      errors={404: "unknown execution"}))
    async def execution_log(self, execution_id: Annotated[str, Id("execution")], *, after: LogOffset = 0) -> RunLog:
        """A durable execution's log: what its steps and its code noted (the newest 500 lines).

        The same answer as a run's log; running is true until the execution has finished."""

    @action(system="durable", permission="operate", label="durable start", audit="durable.start", impl="durable.start_execution",
            definitions=True,  # a folder read names every function there is: a typo is refused
            http=Http("POST", "/inspect/durable/{function}/start", status=201, max_body=6 * MAX_INPUT_BYTES + 64 * 1024,
                      ok="{id, duplicate}", errors={404: "unknown durable function", 413: "input over 256 KiB as JSON"}))
    async def start_execution(self, function: str, input: Annotated[Any, Json(MAX_INPUT_BYTES)] = None) -> Started:
        """Start an execution of a durable function."""

    @action(system="durable", permission="operate", label="durable signal", audit="durable.signal", impl="durable.signal",
            http=Http("POST", "/inspect/durable/executions/{execution_id}/signal/{name}", retry=True,
                      max_body=6 * MAX_SIGNAL_BYTES + 64 * 1024, ok="{execution_id, name, duplicate}",
                      errors={404: "unknown execution", 409: "the execution has finished", 413: "payload over 64 KiB as JSON"}))
    async def signal_execution(
        self, execution_id: Annotated[str, Id("execution")], name: str, payload: Annotated[Any, Json(MAX_SIGNAL_BYTES)] = None
    ) -> Signalled:
        """Send a signal (an approval, say) to an execution; the first of a name is kept.

        A signal is kept once per execution and name, so a repeat changes nothing."""

    @action(system="durable", permission="operate", label="durable cancel", audit="durable.cancel", impl="durable.cancel",
            danger=Danger("Cancel execution {execution_id}?",
                          "A queued or waiting execution is cancelled at once, a running one at its next step boundary; "
                          "it cannot be resumed."),
            http=Http("POST", "/inspect/durable/executions/{execution_id}/cancel", ok="the execution",
                      errors={404: "unknown execution", 409: "the execution has finished"}))
    async def cancel_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """Cancel an execution (a running one stops at its next step boundary).

        A queued or waiting execution is cancelled at once."""

    @action(system="durable", permission="operate", label="durable retry", audit="durable.retry", impl="durable.retry",
            http=Http("POST", "/inspect/durable/executions/{execution_id}/retry", ok="the execution",
                      errors={404: "unknown execution", 409: "the execution has not failed"}))
    async def retry_execution(self, execution_id: Annotated[str, Id("execution")]) -> Execution:
        """Run a failed execution again from its failed step, with fresh attempts."""
