"""The HTTP routes of durable executions (mounted by :mod:`backend.api.app`)::

    GET  /inspect/durable/executions?function=&status=&limit=&before=   -> {executions, next_before}
    GET  /inspect/durable/executions/{execution_id}                      the execution, its steps and log
    POST /inspect/durable/{function}/start             {input}           -> 201 {id, duplicate}
    POST /inspect/durable/executions/{execution_id}/signal/{name}  {payload}
    POST /inspect/durable/executions/{execution_id}/cancel | /retry

Like every route they speak only to the backend interface; its checks answer bad input
(422), an input or payload over its limit (413), unknown executions and functions (404)
and refusals (409).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.app import Api, JSONResponse
from backend.durable.service import MAX_INPUT_BYTES, MAX_SIGNAL_BYTES

__all__ = ["SIGNAL_BODY_BYTES", "START_BODY_BYTES", "durable_routes"]

#: A body may carry the largest input (payload) even when its client escapes every
#: character (``\\u00e9`` is 6 bytes for 2): the input's own limit is what answers.
START_BODY_BYTES = 6 * MAX_INPUT_BYTES + 64 * 1024
SIGNAL_BODY_BYTES = 6 * MAX_SIGNAL_BYTES + 64 * 1024


def durable_routes(api: Api) -> list[Route]:
    backend, endpoint, body_of, query_int = api.backend, api.endpoint, api.body_of, api.query_int

    @endpoint("read")
    async def list_executions(request: Request) -> Response:
        """
        ---
        summary: A page of durable executions, newest first (keyset paging)
        parameters:
          - {name: function, in: query, schema: {type: string, pattern: "^[A-Za-z0-9_.-]{1,128}$"}}
          - name: status
            in: query
            schema: {type: string, enum: [queued, running, waiting, succeeded, failed, cancelled]}
          - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 50}}
          - name: before
            in: query
            description: "id of the last execution of the previous page"
            schema: {type: string, pattern: "^[0-9A-HJKMNP-TV-Z]{26}$"}
        responses:
          200: {description: "{executions: [execution], next_before}"}
          422: {description: bad parameter}
        """
        params = request.query_params  # a parameter given empty is refused, not taken for none
        page = await backend.list_executions(
            params.get("function"),
            status=params.get("status"),
            limit=query_int(request, "limit", 50, 1, 1000),
            before=params.get("before"),
        )
        return JSONResponse(page.to_json())

    @endpoint("read")
    async def get_execution(request: Request) -> Response:
        """
        ---
        summary: One durable execution with its steps (the timeline) and its log
        responses:
          200: {description: "execution, with steps [{seq, name, kind, status, attempt, started_at, finished_at, error_message, …}] and logs"}
          404: {description: unknown execution}
        """
        execution = await backend.get_execution(str(request.path_params["execution_id"]))
        return JSONResponse(execution.to_json())

    @endpoint("operate")
    async def start(request: Request) -> Response:
        """
        ---
        summary: Start an execution of a durable function
        requestBody:
          content:
            application/json:
              schema: {type: object, additionalProperties: false, properties: {input: {description: "any JSON value, the function's input"}}}
        responses:
          201: {description: "{id, duplicate}"}
          404: {description: unknown durable function}
          413: {description: "input over 256 KiB as JSON"}
          422: {description: input not JSON}
        """
        function = str(request.path_params["function"])
        body = await body_of(request, START_BODY_BYTES, fields=("input",))
        started = await backend.start_execution(function, body.get("input"))
        return JSONResponse(started.to_json(), status_code=201)

    @endpoint("operate")
    async def signal(request: Request) -> Response:
        """
        ---
        summary: Send a signal (an approval, say) to an execution; the first of a name is kept
        requestBody:
          content:
            application/json:
              schema: {type: object, additionalProperties: false, properties: {payload: {description: "any JSON value"}}}
        responses:
          200: {description: "{execution_id, name, duplicate}"}
          404: {description: unknown execution}
          409: {description: the execution has finished}
          413: {description: "payload over 64 KiB as JSON"}
          422: {description: bad signal name or payload}
        """
        body = await body_of(request, SIGNAL_BODY_BYTES, fields=("payload",))
        sent = await backend.signal_execution(
            str(request.path_params["execution_id"]), str(request.path_params["name"]), body.get("payload")
        )
        return JSONResponse(sent.to_json())

    @endpoint("operate")
    async def cancel(request: Request) -> Response:
        """
        ---
        summary: Cancel an execution (a running one stops at its next step boundary)
        responses:
          200: {description: the execution}
          404: {description: unknown execution}
          409: {description: the execution has finished}
        """
        execution = await backend.cancel_execution(str(request.path_params["execution_id"]))
        return JSONResponse(execution.to_json())

    @endpoint("operate")
    async def retry(request: Request) -> Response:
        """
        ---
        summary: Run a failed execution again from its failed step, with fresh attempts
        responses:
          200: {description: the execution}
          404: {description: unknown execution}
          409: {description: the execution has not failed}
        """
        execution = await backend.retry_execution(str(request.path_params["execution_id"]))
        return JSONResponse(execution.to_json())

    return [
        Route("/inspect/durable/executions", list_executions, methods=["GET"]),
        Route("/inspect/durable/executions/{execution_id}", get_execution, methods=["GET"]),
        Route("/inspect/durable/executions/{execution_id}/signal/{name}", signal, methods=["POST"]),
        Route("/inspect/durable/executions/{execution_id}/cancel", cancel, methods=["POST"]),
        Route("/inspect/durable/executions/{execution_id}/retry", retry, methods=["POST"]),
        Route("/inspect/durable/{function}/start", start, methods=["POST"]),
    ]
