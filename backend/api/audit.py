"""The audit log over HTTP: ``GET /inspect/audit?limit=&before=`` (read access)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.app import Api, JSONResponse

__all__ = ["audit_routes"]


def audit_routes(api: Api) -> list[Route]:
    @api.endpoint("read")
    async def list_audit(request: Request) -> Response:
        """
        ---
        summary: The audit log, newest first (keyset paging)
        description: >
          Every operator action (Run now, enable, disable, backfills, and the actions of
          the queue, durable executions, locks and stored schedules): {id, at, actor,
          action, target, detail}. actor is the name of the token the action came with, or
          the OS user (or --as) of a CLI or console acting on the store directly. Kept 90 days.
        parameters:
          - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 50}}
          - name: before
            in: query
            description: "id of the last entry of the previous page"
            schema: {type: string, pattern: "^[0-9A-HJKMNP-TV-Z]{26}$"}
        responses:
          200: {description: "{entries: [entry], next_before}"}
          422: {description: bad parameter}
        """
        limit = api.query_int(request, "limit", 50, 1, 1000)
        before = request.query_params.get("before")  # empty is not "none": 422
        page = await api.backend.audit(limit=limit, before=before)
        return JSONResponse(page.to_json())

    return [Route("/inspect/audit", list_audit, methods=["GET"])]
