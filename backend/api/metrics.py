"""``GET /metrics``: the engine's metrics for Prometheus (a read, like every inspect route).

Not an operator action: a route of its own over an :class:`Exposition` (``serve`` hands in
the engine's :class:`~backend.observability.metrics.EngineMetrics`). It answers in the
Prometheus text format; when the server has tokens it needs one (the read token is
enough), as Prometheus sends with ``authorization: credentials_file``.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.base import Api

__all__ = ["Exposition", "metrics_routes"]


class Exposition(Protocol):
    content_type: str
    """Of every scrape's body."""

    async def render(self) -> bytes:
        """One scrape's body."""


def metrics_routes(api: Api, exposition: Exposition) -> list[Route]:
    @api.endpoint("read")
    async def metrics(request: Request) -> Response:
        """
        ---
        summary: Metrics for Prometheus (text exposition format)
        tags: [health]
        description: >
          The families schedtui_runs_total, schedtui_run_duration_seconds,
          schedtui_jobs_finished_total (this instance's), schedtui_schedule_last_success_timestamp_seconds,
          schedtui_schedule_enabled, schedtui_jobs, schedtui_durable_executions, schedtui_locks_held,
          schedtui_instances, schedtui_fleet_snapshot_timestamp_seconds (the fleet's, from the store,
          read in the background every 5 s while scrapes come),
          schedtui_schedule_next_fire_timestamp_seconds, and the process and Python collectors.
        responses:
          200:
            description: "the metrics"
            content: {text/plain: {schema: {type: string}}}
        """
        api.refuse_unknown_query(request)
        return Response(await exposition.render(), headers={"Content-Type": exposition.content_type, "Cache-Control": "no-store"})

    return [Route("/metrics", metrics, methods=["GET"])]
