"""The HTTP inspect API: a Starlette app over the shared backend interface.

The routes speak only to :class:`~backend.client.interface.Backend` (``serve`` hands in the
embedded implementation). Every operator action's route and OpenAPI entry is derived from
its declaration (:mod:`backend.client.actions`, mounted by :mod:`backend.api.routes`), the
same declaration that :class:`~backend.client.remote.RemoteBackend` sends its requests by.
Besides them::

    GET  /healthz              health, without a token
    GET  /inspect/info         what this server is, and what the caller's token may do
    GET  /inspect/events       live change signals (backend.api.events)
    GET  /metrics              the engine's metrics for Prometheus (backend.api.metrics)
    GET  /openapi.json         the document of every route

Every error is ``{"error": {"code", "message"}}`` with its status (400, 401, 403, 404, 405,
408, 409, 413, 422, 503); a refused backfill adds ``count`` and ``reason``. Bad input never
yields a 500. Bearer tokens: the operator token may do everything, the read token only
read. What a web page sent is refused (:mod:`backend.api.browsers`). A request body must
arrive within ``body_timeout`` seconds (408 otherwise).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypedDict

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from backend.api.base import BODY_TIMEOUT, MAX_BODY_BYTES, Access, Api, JSONResponse, error_response
from backend.api.browsers import BrowserGuard
from backend.api.events import event_routes
from backend.api.metrics import Exposition, metrics_routes
from backend.api.routes import action_routes
from backend.api.routes import operation as action_operation
from backend.api.schemas import AnswerSchemas
from backend.api.tokens import Tokens
from backend.client.actions import ACTIONS
from backend.client.interface import Backend
from backend.model import CoordinationMode, Health, Timestamp, iso
from backend.safetext import in_line, printable

__all__ = ["BODY_TIMEOUT", "MAX_BODY_BYTES", "JSONResponse", "create_app"]


def create_app(
    backend: Backend,
    *,
    token: str | Sequence[str] | None = None,
    read_token: str | Sequence[str] | None = None,
    manage_backend: bool = False,
    body_timeout: float = BODY_TIMEOUT,
    metrics: Exposition | None = None,
    host: str | None = None,
) -> Starlette:
    """The ASGI app over ``backend``. ``token``/``read_token``: one or several, each
    ``NAME=SECRET`` or a bare secret (see :mod:`backend.api.tokens`). With ``manage_backend``
    the app's lifespan connects and closes it (for an embedded backend: starts and stops
    its engine). ``metrics``: what ``GET /metrics`` answers with (no such route without).
    ``host``: the one it listens on; without tokens, the only ``Host`` accepted besides
    loopback ones (:mod:`backend.api.browsers`)."""
    api = Api(backend, Tokens.from_options(token, read_token), body_timeout)
    routes = [*service_routes(api), *action_routes(api), *event_routes(api)]
    if metrics is not None:
        routes += metrics_routes(api, metrics)
    schemas = SchemaGenerator(
        {
            "openapi": "3.0.3",
            "info": {"title": "schedtui inspect API", "version": "1"},
            "components": {
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
            "security": [{"bearer": []}],
        }
    )

    # The routes do not change while the app serves: the document is made once, at the first
    # request (made each time, it cost the engine's loop about 16 ms a request).
    document: list[bytes] = []

    @api.endpoint("read")
    async def openapi(request: Request) -> Response:
        api.refuse_unknown_query(request)
        if not document:
            document.append(bytes(JSONResponse(_openapi()).body))
        return Response(document[0], media_type="application/json")

    def _openapi() -> dict[str, Any]:
        schema = _declare_path_parameters(schemas.get_schema(routes=app.routes))
        paths = schema.setdefault("paths", {})
        answers = AnswerSchemas()
        for action in ACTIONS.values():  # the actions' routes are left out above: derived here
            path = _CONVERTER.sub(r"{\1}", action.http.path)
            paths.setdefault(path, {})[action.http.method.lower()] = action_operation(action, answers)
        for path, statuses in SERVICE_ANSWERS.items():
            operation = paths[path]["get"]
            operation["responses"] = responses = {str(status): entry for status, entry in operation["responses"].items()}
            for status, answer in statuses.items():  # (the docstring's YAML reads a status as a number)
                responses[status]["content"] = {"application/json": {"schema": answers.of(answer)}}
        schema["components"]["schemas"] = dict(sorted(answers.components.items()))
        access = {
            (_CONVERTER.sub(r"{\1}", route.path), method.lower()): api.access[route.endpoint]
            for route in routes
            for method in route.methods or ()
            if route.endpoint in api.access
        }
        return _declare_errors(schema, access, loopback_only=not api.tokens.required)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        # The path as it came (request.url.path drops a newline: "/locks/a%0Ab/release" was
        # answered "no route /locks/ab/release", another lock's route), escaped.
        path = request.scope["path"]
        shown = printable(path, 300) + (" (a path holds no control character)" if in_line(path) != path else "")
        message = {404: f"no route {shown}", 405: f"{request.method} is not allowed here"}.get(
            exc.status_code, str(exc.detail)
        )
        response = error_response(exc.status_code, codes.get(exc.status_code, "http_error"), message)
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route of the path only;
            # a path served by several (GET and POST /inspect/schedules) has them all.
            path = request.scope["path"]
            matching = [r for r in app.routes if isinstance(r, Route) and r.path_regex.fullmatch(path)]
            methods = {method for route in matching for method in route.methods or ()}
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    lifespan = None
    if manage_backend:

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            await backend.connect()
            try:
                yield
            finally:
                await backend.close()

    app = Starlette(
        routes=[*routes, Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)],
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(BrowserGuard, loopback_only=not api.tokens.required, host=host)],
        lifespan=lifespan,
    )
    # A path with a slash too many is no route (404), not Starlette's redirect to the one
    # without: that 307 answered an action's POST before its token was checked.
    app.router.redirect_slashes = False
    app.state.api = api  # serve ends the event streams through it before stopping
    return app


class ServerInfo(TypedDict):
    """What this server is (its instance, coordination and store), what the caller's token
    may do (``access``; ``actor``: the token's name), its clock and the systems it runs."""

    instance: str
    coordination: CoordinationMode
    store_kind: str
    access: Literal["read", "operate"]
    actor: str
    now: Timestamp
    systems: list[str]


#: The answers of the routes that are no action, by path and status.
SERVICE_ANSWERS: dict[str, dict[str, Any]] = {
    "/healthz": {"200": Health, "503": Health},
    "/inspect/info": {"200": ServerInfo},
}


def service_routes(api: Api) -> list[Route]:
    """Health and info: what a client asks before any action."""
    backend, endpoint = api.backend, api.endpoint

    @endpoint("open")
    async def healthz(request: Request) -> Response:
        """
        ---
        summary: Health, without a token - can the store record runs, and what each instance last did
        tags: [health]
        security: []
        description: >
          status is the store's state: ok, failing (it cannot write now, e.g. a full disk or a
          database that is down; runs wait in memory and are retried) or lost (the SQLite file
          was deleted while in use). instances is null when the store cannot be read; an
          instance's clock_offset_s is its clock minus the database server's (null where not
          measured), and stands_down says why a member whose clock is off fires nothing. now
          is the engine's clock. No URL, path or password is ever included.
        responses:
          200: {description: "the store can record runs"}
          503: {description: "the store cannot record runs: store.error says why"}
        """
        api.refuse_unknown_query(request)
        health = await backend.health()
        return JSONResponse(health.to_json(), status_code=200 if health.ok else 503)

    @endpoint("read")
    async def info(request: Request) -> Response:
        """
        ---
        summary: What this server is, and what the caller's token may do
        tags: [health]
        responses:
          200: {description: "instance, coordination, store kind, access (read or operate), actor (the token's name)"}
        """
        api.refuse_unknown_query(request)
        token = api.token_of(request)
        connection = backend.info()
        answer: ServerInfo = {
            "instance": connection.instance,
            "coordination": connection.coordination,
            "store_kind": connection.store_kind,
            "access": token.access,
            "actor": token.name,
            "now": iso(await backend.now()),
            "systems": list(connection.systems),
        }
        return JSONResponse(answer)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/inspect/info", info, methods=["GET"]),
    ]


#: A path parameter's converter (``{name:path}``), which the OpenAPI paths leave out.
_CONVERTER = re.compile(r"{(\w+):\w+}")


def _declare_path_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """Declare every ``{name}`` of a route's path as a required string path parameter: the
    routes say it once, in their path, rather than again in each docstring."""
    for path, operations in schema.get("paths", {}).items():
        names = re.findall(r"{(\w+)}", path)
        for operation in operations.values():
            declared = {p.get("name") for p in operation.get("parameters", []) if p.get("in") == "path"}
            extra = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in names
                if n not in declared
            ]
            if extra:
                operation["parameters"] = extra + operation.get("parameters", [])
    return schema


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
                "count": {"type": "integer", "nullable": True},
                "reason": {"type": "string"},
            },
        },
        "count": {"type": "integer", "nullable": True},
        "reason": {"type": "string"},
    },
}
_ERRORS = {
    400: "the request body arrived in too many small pieces",
    401: "no token, or a wrong one",
    403: "a read token tried to act, or a web page sent the request (an Origin; without tokens, a foreign Host)",
    404: "unknown schedule, run, backfill, queue, job, execution, function or lock",
    408: "the request body did not arrive in time",
    413: "the request body is too large",
    422: "a bad parameter or body, or a query parameter the route does not know (error.field names it)",
    503: "the store is unavailable",
}


def _declare_errors(schema: dict[str, Any], access: dict[tuple[str, str], Access], *, loopback_only: bool) -> dict[str, Any]:
    """Declare the errors each operation can answer with, and their one JSON shape: which
    follow from the route itself (its token rule, its path parameters, its body) and the
    server (``loopback_only``: without tokens, any request may name a foreign ``Host``),
    rather than from every docstring repeating them."""
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            kind = access.get((path, method), "read")
            statuses = {422, 503}  # (422: a query parameter it does not know, on any route)
            if kind == "open":
                operation["security"] = []
            else:
                statuses.add(401)
            if kind == "operate" or loopback_only or method not in ("get", "head"):
                statuses.add(403)
            if "{" in path:
                statuses.add(404)
            if method in ("post", "put", "patch"):
                statuses |= {400, 408, 413, 422}
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses):
                responses.setdefault(str(status), {"description": _ERRORS[status]})
            for status, entry in responses.items():
                if int(status) >= 400:
                    entry.setdefault("content", {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}})
    return schema


