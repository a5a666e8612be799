"""The routes of schedules created at run time (see :mod:`backend.api.app` for the conventions)::

    POST   /inspect/schedules          {name, cron, timezone, queue | durable, ...} -> 201 schedule
    PATCH  /inspect/schedules/{name}   {any of the same but name}                  -> schedule
    DELETE /inspect/schedules/{name}                                                -> {deleted: true}
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.app import Api, JSONResponse

__all__ = ["catalog_routes"]


def catalog_routes(api: Api) -> list[Route]:
    """Create, update and delete stored schedules."""
    backend, endpoint = api.backend, api.endpoint

    @endpoint("operate")
    async def create_schedule(request: Request) -> Response:
        """
        ---
        summary: Create a schedule, kept in the store, that every instance arms within 2 s
        description: >
          Exactly one of queue (a queue's name) or durable (a durable function's name).
          Validated as a schedule defined in code: a bad
          value or an unknown target is 422 naming it (error.field). The answer is the
          schedule, with source "store".
        requestBody:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                required: [name, cron, timezone]
                properties:
                  name: {type: string, pattern: "^[A-Za-z0-9_.-]{1,128}$"}
                  cron: {type: string}
                  timezone: {type: string}
                  queue: {type: string, nullable: true}
                  durable: {type: string, nullable: true}
                  payload: {description: "any JSON, up to 64 KiB encoded"}
                  description: {type: string, nullable: true, maxLength: 1000}
                  enabled: {type: boolean}
                  on_overlap: {type: string, enum: [skip, queue, parallel]}
                  backfill: {type: string, enum: [skip, latest, all]}
                  max_runtime: {type: number, exclusiveMinimum: true, minimum: 0}
        responses:
          201: {description: the schedule created}
          409: {description: "name_taken: a schedule (in code or stored) has that name"}
        """
        spec = await api.body_of(request)
        view = await backend.create_schedule(spec)
        return JSONResponse(view.to_json(), status_code=201)

    @endpoint("operate")
    async def update_schedule(request: Request) -> Response:
        """
        ---
        summary: Change a stored schedule; every instance re-arms it within 2 s
        description: >
          The body has any of the create fields but name. Giving queue replaces a durable
          target and the other way round. A due slot is neither fired twice nor lost.
        responses:
          200: {description: the schedule as changed}
          409: {description: "defined_in_code: schedules defined in code are only enabled or disabled"}
        """
        changes = await api.body_of(request)
        view = await backend.update_schedule(str(request.path_params["name"]), changes)
        return JSONResponse(view.to_json())

    @endpoint("operate")
    async def delete_schedule(request: Request) -> Response:
        """
        ---
        summary: Delete a stored schedule; it stops firing everywhere within 2 s
        description: Its runs stay in the ledger; a run in flight finishes.
        responses:
          200: {description: "{deleted: true}"}
          409: {description: "defined_in_code: schedules defined in code cannot be deleted"}
        """
        await backend.delete_schedule(str(request.path_params["name"]))
        return JSONResponse({"deleted": True})

    return [
        Route("/inspect/schedules", create_schedule, methods=["POST"]),
        Route("/inspect/schedules/{name}", update_schedule, methods=["PATCH"]),
        Route("/inspect/schedules/{name}", delete_schedule, methods=["DELETE"]),
    ]
