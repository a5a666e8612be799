"""The HTTP inspect API: a Starlette app over the shared backend interface.

The routes speak only to :class:`~backend.client.interface.Backend` (``serve`` hands in the
embedded implementation), so every system's routes are written once, against the same
methods that the console uses and that :class:`~backend.client.remote.RemoteBackend` mirrors.

Routes (JSON, snake_case; see ``/openapi.json`` for the full document)::

    GET  /healthz
    GET  /inspect/info
    GET  /inspect/schedules
    GET  /inspect/schedules/runs?name=N&limit=L&before=RUN_ID
    GET  /inspect/schedules/{name}/upcoming?count=5
    GET  /inspect/runs?name=A&name=B&from=ISO&to=ISO&limit_per_name=N   runs in a window
    GET  /inspect/runs/{run_id}
    GET  /inspect/instances                              registered engines and heartbeats
    POST /inspect/schedules/{name}/fire                  Run now
    POST /inspect/schedules/{name}/enable | /disable     {"note": "..."}
    POST /inspect/schedules/{name}/backfill/plan         {"from", "to", "confirm", "limit"}
    POST /inspect/schedules/{name}/backfill              the same; starts it in the background
    POST /inspect/schedules   PATCH|DELETE /inspect/schedules/{name}   stored schedules (api_catalog)
    GET  /inspect/backfills/{backfill_id}
    POST /inspect/backfills/{backfill_id}/cancel
    POST /schedule/{name}/fire?trigger=external          what platform schedulers call

Every error is ``{"error": {"code", "message"}}`` with its status (401, 403, 404, 405, 408,
409, 413, 422, 503); a refused backfill adds ``count`` and ``reason``. Bad input never
yields a 500. Bearer tokens: the operator token may do everything, the read token only
``GET``. A request body must arrive within ``body_timeout`` seconds (408 otherwise).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from backend.api.tokens import ApiToken, Tokens
from backend.client.interface import RUNS_BETWEEN_MAX_PER_NAME, Backend
from backend.errors import (
    BadInput,
    Forbidden,
    NotFound,
    Refused,
    SchedtuiError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from backend.events.audit import acting_as
from backend.inputs import check_note, check_text
from backend.model import BACKFILL_MAX_LIMIT, iso, parse_iso
from backend.safetext import escape_json, printable
from backend.timeparse import parse_when

__all__ = ["BODY_TIMEOUT", "MAX_BODY_BYTES", "JSONResponse", "create_app"]

log = logging.getLogger("schedtui.api")

#: Request bodies larger than this are refused with 413 (the largest real body is ~200 bytes).
MAX_BODY_BYTES = 64 * 1024
#: Seconds a client has to send a request's whole body once its head has arrived.
BODY_TIMEOUT = 30.0

Access = Literal["open", "read", "operate"]
Endpoint = Callable[[Request], Awaitable[Response]]

_STATUS: list[tuple[type[SchedtuiError], int]] = [
    (NotFound, 404),
    (Refused, 409),
    (Unauthorized, 401),
    (Forbidden, 403),
    (TooLarge, 413),
    (BadInput, 422),
    (Unavailable, 503),
]


class JSONResponse(StarletteJSONResponse):
    """The JSON response of every route: a lone surrogate in its content (text no store
    should hold, and no UTF-8 can encode) is sent escaped, as the six characters
    ``\\ud800``, rather than failing the whole response with a 500. Reads of the stores
    escape such text already (:func:`~backend.safetext.load_json`); this is the net under
    any other way it could come."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(escape_json(content))


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _from_error(exc: SchedtuiError) -> JSONResponse:
    status = next((s for kind, s in _STATUS if isinstance(exc, kind)), 422)
    error: dict[str, Any] = {"code": exc.code, "message": exc.public}  # never where the store lives
    body: dict[str, Any] = {"error": error}
    if isinstance(exc, Refused):
        # A refusal is 409 {count, reason}: at the top level, and in the error too.
        error.update(count=exc.count, reason=exc.reason)
        body.update(count=exc.count, reason=exc.reason)
    if isinstance(exc, BadInput) and exc.field:
        error["field"] = exc.field
    response = JSONResponse(body, status_code=status)
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


class Api:
    """What every route module builds on: the backend, token checks, body and query parsing.

    ``endpoint(access)`` wraps a route function: it authorises the request (``open``,
    ``read`` or ``operate``), maps :class:`SchedtuiError` to its JSON status, and turns
    anything unexpected into a 500 without a trace. Each system's routes live in their
    own module as ``routes(api) -> list[Route]`` (see :data:`ROUTE_MODULES`)."""

    def __init__(self, backend: Backend, tokens: Tokens, body_timeout: float) -> None:
        self.backend = backend
        self.tokens = tokens
        self.body_timeout = body_timeout
        self.access: dict[Endpoint, Access] = {}
        self.closing = asyncio.Event()
        """Set when the server stops: long-lived responses (the event stream) end then."""
        self.streams = 0
        """Event streams open now."""

    def endpoint(self, access: Access) -> Callable[[Endpoint], Endpoint]:
        """Authorise, then map schedtui errors to JSON; nothing escapes as a 500 with a trace."""
        tokens, body_timeout = self.tokens, self.body_timeout

        def wrap(fn: Endpoint) -> Endpoint:
            async def handler(request: Request) -> Response:
                try:
                    if access == "open":
                        return await fn(request)
                    granted = tokens.check(request.headers.get("authorization", ""))
                    if access == "operate" and granted.access != "operate":
                        raise Forbidden("this token may only read; acting needs the operator token")
                    with acting_as(granted.name):  # the audit log names the token
                        return await fn(request)
                except SchedtuiError as exc:
                    return _from_error(exc)
                except _TooLarge as exc:
                    return error_response(413, "too_large", f"the request body is larger than {exc.limit} bytes")
                except _TooSlow:
                    response = error_response(
                        408, "request_timeout", f"the request body did not arrive within {body_timeout:g}s"
                    )
                    response.headers["Connection"] = "close"
                    return response
                except Exception:
                    # The path is the client's: escaped, so it cannot forge log lines.
                    log.exception("unexpected error in %s %s", request.method, printable(request.scope.get("path", "")))
                    return error_response(500, "internal", "internal error; the server log has the details")

            handler.__name__ = fn.__name__
            handler.__doc__ = fn.__doc__
            self.access[handler] = access
            return handler

        return wrap

    def token_of(self, request: Request) -> ApiToken:
        """The token a request came with (its name is the actor of what it does)."""
        return self.tokens.check(request.headers.get("authorization", ""))

    async def body_of(
        self, request: Request, max_bytes: int = MAX_BODY_BYTES, *, fields: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """The request's JSON object body (``{}`` when empty); 413, 408 and 422 as due. With
        ``fields``, a body naming any other field is refused (422 naming it): a misspelt
        field must not quietly mean "not given"."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise _TooLarge(max_bytes)
        raw = b""
        try:
            async with asyncio.timeout(self.body_timeout):
                async for chunk in request.stream():
                    raw += chunk
                    if len(raw) > max_bytes:
                        raise _TooLarge(max_bytes)
        except TimeoutError:
            raise _TooSlow() from None
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"the body is not valid JSON ({exc})", field="body") from None
        except RecursionError:
            raise BadInput("the body is nested too deeply to be read", field="body") from None
        if not isinstance(data, dict):
            raise BadInput("the body must be a JSON object", field="body")
        unknown = sorted(set(data) - set(fields)) if fields is not None else []
        if unknown:
            shown = ", ".join(f'"{printable(name, 60)}"' for name in unknown)
            raise BadInput(f"unknown field(s) {shown} (known: {', '.join(fields or ())})", field=printable(unknown[0], 60))
        return data

    @staticmethod
    def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise BadInput(f'{name} "{raw}" is not a whole number', field=name) from None
        if not low <= value <= high:
            raise BadInput(f"{name} {value} is out of range ({low}-{high})", field=name)
        return value


def create_app(
    backend: Backend,
    *,
    token: str | Sequence[str] | None = None,
    read_token: str | Sequence[str] | None = None,
    manage_backend: bool = False,
    body_timeout: float = BODY_TIMEOUT,
) -> Starlette:
    """The ASGI app over ``backend``. ``token``/``read_token``: one or several, each
    ``NAME=SECRET`` or a bare secret (see :mod:`backend.api.tokens`). With ``manage_backend``
    the app's lifespan connects and closes it (for an embedded backend: starts and stops
    its engine)."""
    api = Api(backend, Tokens.from_options(token, read_token), body_timeout)
    routes = [route for module in ROUTE_MODULES for route in module(api)]
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

    async def openapi(request: Request) -> Response:
        schema = _declare_path_parameters(schemas.get_schema(routes=app.routes))
        access = {
            (_CONVERTER.sub(r"{\1}", route.path), method.lower()): api.access[route.endpoint]
            for route in routes
            for method in route.methods or ()
            if route.endpoint in api.access
        }
        return JSONResponse(_declare_errors(schema, access))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed here"}.get(
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
        lifespan=lifespan,
    )
    app.state.api = api  # serve ends the event streams through it before stopping
    return app


def schedule_routes(api: Api) -> list[Route]:
    """Health, info, schedules, runs, backfills and the external fire."""
    backend, endpoint, body_of, query_int = api.backend, api.endpoint, api.body_of, api.query_int

    async def schedule_name(request: Request) -> str:
        """The path's schedule name; NotFound (404) before anything else is read."""
        name = str(request.path_params["name"])
        await backend.schedule_zone(name)
        return name

    # -- reads --------------------------------------------------------------------------
    @endpoint("open")
    async def healthz(request: Request) -> Response:
        """
        ---
        summary: Health, without a token - can the store record runs, and what each instance last did
        security: []
        description: >
          status is the store's state: ok, failing (it cannot write now, e.g. a full disk or a
          database that is down; runs wait in memory and are retried) or lost (the SQLite file
          was deleted while in use). store carries {kind, state, error, waiting, since};
          instances lists every registered instance {name, host, pid, heartbeat_at,
          heartbeat_age_s, last_fired_at, role (firing, waiting or observer), coordination}
          (null when the store cannot be read); now is the
          engine's clock. No URL, path or password is ever included.
        responses:
          200: {description: "the store can record runs"}
          503: {description: "the store cannot record runs: store.error says why"}
        """
        health = await backend.health()
        return JSONResponse(health.to_json(), status_code=200 if health.ok else 503)

    @endpoint("read")
    async def info(request: Request) -> Response:
        """
        ---
        summary: What this server is, and what the caller's token may do
        responses:
          200: {description: "instance, coordination, store kind, access (read or operate), actor (the token's name)"}
        """
        token = api.token_of(request)
        connection = backend.info()
        return JSONResponse(
            {
                "instance": connection.instance,
                "coordination": connection.coordination,
                "store_kind": connection.store_kind,
                "access": token.access,
                "actor": token.name,
                "now": iso(await backend.now()),
                "systems": list(backend.info().systems),
            }
        )

    @endpoint("read")
    async def list_schedules(request: Request) -> Response:
        """
        ---
        summary: Every schedule with its state, next slot and last run
        responses:
          200: {description: "{coordination, instance, now, schedules: [schedule]}"}
        """
        snapshot = await backend.list_schedules()
        return JSONResponse(snapshot.to_json())

    @endpoint("read")
    async def list_runs(request: Request) -> Response:
        """
        ---
        summary: A page of a schedule's runs, newest first (keyset paging)
        parameters:
          - {name: name, in: query, required: true, schema: {type: string, minLength: 1}}
          - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 50}}
          - name: before
            in: query
            description: "id of the last run of the previous page"
            schema: {type: string, pattern: "^[0-9A-HJKMNP-TV-Z]{26}$"}
        responses:
          200: {description: "{runs: [run], next_before}"}
          404: {description: unknown schedule}
          422: {description: bad parameter}
        """
        name = request.query_params.get("name")
        if not name:
            raise BadInput("the query parameter name is required", field="name")
        limit = query_int(request, "limit", 50, 1, 1000)
        before = request.query_params.get("before")  # empty is not "none": 422
        page = await backend.list_runs(name, limit=limit, before=before)
        return JSONResponse(page.to_json())

    @endpoint("read")
    async def upcoming(request: Request) -> Response:
        """
        ---
        summary: The next slots of a schedule by its cron
        parameters:
          - {name: count, in: query, schema: {type: integer, minimum: 1, maximum: 100, default: 5}}
        responses:
          200: {description: "{slots: [iso8601]}"}
          404: {description: unknown schedule}
        """
        name = await schedule_name(request)
        count = query_int(request, "count", 5, 1, 100)
        return JSONResponse({"slots": [iso(s) for s in await backend.upcoming(name, count)]})

    @endpoint("read")
    async def get_run(request: Request) -> Response:
        """
        ---
        summary: One run
        responses:
          200: {description: run}
          404: {description: unknown run}
        """
        run = await backend.get_run(str(request.path_params["run_id"]))
        return JSONResponse(run.to_json())

    @endpoint("read")
    async def runs_between(request: Request) -> Response:
        """
        ---
        summary: Runs of several schedules scheduled in a window, newest first per schedule
        description: >
          For timelines: per schedule, its runs with from <= scheduled_at < to, at most
          limit_per_name of them (the newest; a schedule with exactly that many may have
          more). Schedules without runs in the window are left out of "runs".
        parameters:
          - {name: name, in: query, required: true, description: "repeat for several schedules (up to 500)", schema: {type: array, items: {type: string}}, style: form, explode: true}
          - {name: from, in: query, required: true, schema: {type: string, format: date-time}}
          - {name: to, in: query, required: true, schema: {type: string, format: date-time}}
          - {name: limit_per_name, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 200}}
        responses:
          200: {description: "{from, to, runs: {name: [run]}}"}
          404: {description: unknown schedule}
          422: {description: bad parameter}
        """
        names = request.query_params.getlist("name")
        window = []
        for key in ("from", "to"):
            raw = request.query_params.get(key)
            if not raw:
                raise BadInput(f"the query parameter {key} is required (an ISO 8601 instant)", field=key)
            try:
                window.append(parse_iso(check_text(raw, key, one_line=True)))
            except (ValueError, OverflowError):
                raise BadInput(f'{key} "{printable(raw, 60)}" is not an ISO 8601 instant with an offset', field=key) from None
        limit = query_int(request, "limit_per_name", 200, 1, RUNS_BETWEEN_MAX_PER_NAME)
        found = await backend.runs_between(names, window[0], window[1], limit_per_name=limit)
        return JSONResponse(
            {"from": iso(window[0]), "to": iso(window[1]),
             "runs": {name: [r.to_json() for r in runs] for name, runs in found.items()}}
        )

    @endpoint("read")
    async def instances(request: Request) -> Response:
        """
        ---
        summary: The engine instances registered in the store, with their last heartbeat
        description: >
          An engine that fires beats every few seconds; one that only opened the store (a
          CLI verb, a watching console) beat once, when it opened it.
        responses:
          200: {description: "{now, instances: [{name, host, pid, heartbeat_at, heartbeat_age_s, last_fired_at, role, coordination}]}"}
        """
        found = await backend.instances()
        now = await backend.now()
        return JSONResponse({"now": iso(now), "instances": [i.to_json(now) for i in found]})

    @endpoint("read")
    async def get_backfill(request: Request) -> Response:
        """
        ---
        summary: Progress of a backfill (fired, failed, remaining, state)
        responses:
          200: {description: backfill progress}
          404: {description: unknown backfill}
        """
        progress = await backend.backfill_progress(str(request.path_params["backfill_id"]))
        return JSONResponse(progress.to_json())

    # -- actions ------------------------------------------------------------------------
    @endpoint("operate")
    async def fire(request: Request) -> Response:
        """
        ---
        summary: Run now (trigger and outcome manual), whatever the overlap policy
        responses:
          202: {description: "{run_id, run}"}
          403: {description: read-only token}
          404: {description: unknown schedule}
        """
        name = await schedule_name(request)
        run = await backend.run_now(name)
        return JSONResponse({"run_id": run.id, "run": run.to_json()}, status_code=202)

    async def _set_enabled(request: Request, enabled: bool) -> Response:
        name = await schedule_name(request)
        body = await body_of(request, fields=("note",))
        note = check_note(body.get("note"))
        view = await backend.set_enabled(name, enabled, note=note)
        return JSONResponse(view.to_json())

    @endpoint("operate")
    async def enable(request: Request) -> Response:
        """
        ---
        summary: Enable a schedule (it arms its next future slot)
        requestBody:
          content:
            application/json:
              schema: {type: object, additionalProperties: false, properties: {note: {type: string, nullable: true, maxLength: 1000}}}
        responses:
          200: {description: the schedule}
        """
        return await _set_enabled(request, True)

    @endpoint("operate")
    async def disable(request: Request) -> Response:
        """
        ---
        summary: Disable a schedule, with an optional note
        requestBody:
          content:
            application/json:
              schema: {type: object, additionalProperties: false, properties: {note: {type: string, nullable: true, maxLength: 1000}}}
        responses:
          200: {description: the schedule}
        """
        return await _set_enabled(request, False)

    async def _backfill_args(
        request: Request, fields: Sequence[str]
    ) -> tuple[str, datetime, datetime, bool, int | None, bool]:
        name = await schedule_name(request)
        body = await body_of(request, fields=fields)
        zone = await backend.schedule_zone(name)
        now = await backend.now()
        values: list[datetime] = []
        for key in ("from", "to"):
            raw = body.get(key)
            if not isinstance(raw, str):
                raise BadInput(f'"{key}" is required: an ISO 8601 time, now, or an offset such as -2d', field=key)
            values.append(parse_when(raw, now=now, zone=zone, field=key))
        confirm = body.get("confirm", False)
        if not isinstance(confirm, bool):
            raise BadInput('"confirm" must be true or false', field="confirm")
        limit = body.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise BadInput(f'"limit" must be a whole number up to {BACKFILL_MAX_LIMIT}', field="limit")
        skip = body.get("skip_succeeded", False)
        if not isinstance(skip, bool):
            raise BadInput('"skip_succeeded" must be true or false', field="skip_succeeded")
        return name, values[0], values[1], confirm, limit, skip

    @endpoint("read")
    async def plan_backfill(request: Request) -> Response:
        """
        ---
        summary: What a backfill would do (count, first, last, refusal); fires nothing
        requestBody:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                required: [from, to]
                properties:
                  from: {type: string, description: "ISO 8601, now, or -2d/-6h"}
                  to: {type: string}
                  confirm: {type: boolean}
                  limit: {type: integer, minimum: 1, maximum: 10000}
        responses:
          200: {description: the plan}
        """
        name, start, end, confirm, limit, _ = await _backfill_args(request, ("from", "to", "confirm", "limit"))
        plan = await backend.plan_backfill(name, start, end, confirm=confirm, limit=limit)
        return JSONResponse(plan.to_json())

    @endpoint("operate")
    async def start_backfill(request: Request) -> Response:
        """
        ---
        summary: Start a range backfill in the background
        requestBody:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                required: [from, to]
                properties:
                  from: {type: string}
                  to: {type: string}
                  confirm: {type: boolean, description: "needed above 25 slots"}
                  limit: {type: integer, minimum: 1, maximum: 10000, default: 1000}
                  skip_succeeded: {type: boolean, description: "fire only the slots without a succeeded run"}
        responses:
          202: {description: "{id, plan, progress}"}
          409: {description: "refused: {count, reason}"}
        """
        fields = ("from", "to", "confirm", "limit", "skip_succeeded")
        name, start, end, confirm, limit, skip = await _backfill_args(request, fields)
        plan = await backend.plan_backfill(name, start, end, confirm=confirm, limit=limit)
        progress = await backend.start_backfill(name, start, end, confirm=confirm, limit=limit, skip_succeeded=skip)
        return JSONResponse({"id": progress.id, "plan": plan.to_json(), "progress": progress.to_json()}, status_code=202)

    @endpoint("operate")
    async def cancel_backfill(request: Request) -> Response:
        """
        ---
        summary: Stop a running backfill before its next slot (the run in flight finishes)
        responses:
          200: {description: "the backfill's progress, state cancelled (or as it had ended)"}
          404: {description: unknown backfill}
          409: {description: "it runs on another instance"}
        """
        progress = await backend.cancel_backfill(str(request.path_params["backfill_id"]))
        return JSONResponse(progress.to_json())

    @endpoint("operate")
    async def fire_external(request: Request) -> Response:
        """
        ---
        summary: Fire the slot that is due now (called by a platform scheduler)
        description: >
          The slot is the newest cron slot at or before now, at most 10 minutes old. A retry
          for the same slot returns the same run (200) instead of firing again (202).
        parameters:
          - {name: trigger, in: query, required: true, schema: {type: string, enum: [external]}}
        responses:
          202: {description: "fired: {run_id, created, queued, run}"}
          200: {description: "already fired for this slot: the same body"}
          409: {description: "not an external schedule, or no slot due"}
        """
        name = await schedule_name(request)
        trigger = request.query_params.get("trigger")
        if trigger != "external":
            raise BadInput(f'trigger "{trigger}" is not supported here (use trigger=external)', field="trigger")
        firing = await backend.fire_external(name)
        return JSONResponse(firing.to_json(), status_code=202 if firing.created else 200)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/inspect/info", info, methods=["GET"]),
        Route("/inspect/schedules", list_schedules, methods=["GET"]),
        Route("/inspect/schedules/runs", list_runs, methods=["GET"]),
        Route("/inspect/schedules/{name}/upcoming", upcoming, methods=["GET"]),
        Route("/inspect/runs", runs_between, methods=["GET"]),
        Route("/inspect/runs/{run_id}", get_run, methods=["GET"]),
        Route("/inspect/instances", instances, methods=["GET"]),
        Route("/inspect/schedules/{name}/fire", fire, methods=["POST"]),
        Route("/inspect/schedules/{name}/enable", enable, methods=["POST"]),
        Route("/inspect/schedules/{name}/disable", disable, methods=["POST"]),
        Route("/inspect/schedules/{name}/backfill/plan", plan_backfill, methods=["POST"]),
        Route("/inspect/schedules/{name}/backfill", start_backfill, methods=["POST"]),
        Route("/inspect/backfills/{backfill_id}", get_backfill, methods=["GET"]),
        Route("/inspect/backfills/{backfill_id}/cancel", cancel_backfill, methods=["POST"]),
        Route("/schedule/{name}/fire", fire_external, methods=["POST"]),
    ]


def _job_routes(api: Api) -> list[Route]:
    from backend.api.jobs import job_routes

    return job_routes(api)


def _lock_routes(api: Api) -> list[Route]:
    from backend.api.locks import lock_routes

    return lock_routes(api)


def _catalog_routes(api: Api) -> list[Route]:
    from backend.api.catalog import catalog_routes

    return catalog_routes(api)


def _audit_routes(api: Api) -> list[Route]:
    from backend.api.audit import audit_routes

    return audit_routes(api)


def _event_routes(api: Api) -> list[Route]:
    from backend.api.events import event_routes

    return event_routes(api)


def _durable_routes(api: Api) -> list[Route]:
    from backend.api.durable import durable_routes

    return durable_routes(api)


#: The route modules, each ``routes(api) -> list[Route]``, mounted in this order.
ROUTE_MODULES: list[Callable[[Api], list[Route]]] = [
    schedule_routes, _catalog_routes, _job_routes, _durable_routes, _lock_routes, _audit_routes, _event_routes,
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
    401: "no token, or a wrong one",
    403: "a read token tried to act",
    404: "unknown schedule, run, backfill, queue, job, execution, function or lock",
    408: "the request body did not arrive in time",
    413: "the request body is too large",
    422: "a bad parameter or body (error.field names it)",
    503: "the store is unavailable",
}


def _declare_errors(schema: dict[str, Any], access: dict[tuple[str, str], Access]) -> dict[str, Any]:
    """Declare the errors each operation can answer with, and their one JSON shape: which
    follow from the route itself (its token rule, its path parameters, its body), rather
    than from every docstring repeating them."""
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            kind = access.get((path, method), "read")
            statuses = {503}
            if kind == "open":
                operation["security"] = []
            else:
                statuses.add(401)
            if kind == "operate":
                statuses.add(403)
            if "{" in path:
                statuses |= {404, 422}
            if operation.get("parameters"):
                statuses.add(422)
            if method in ("post", "put", "patch"):
                statuses |= {408, 413, 422}
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses):
                responses.setdefault(str(status), {"description": _ERRORS[status]})
            for status, entry in responses.items():
                if int(status) >= 400:
                    entry.setdefault("content", {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}})
    return schema


class _TooLarge(Exception):
    """A body over its route's limit (:data:`MAX_BODY_BYTES` unless the route says)."""

    def __init__(self, limit: int = MAX_BODY_BYTES) -> None:
        super().__init__(limit)
        self.limit = limit


class _TooSlow(Exception):
    """A body that did not arrive within the body timeout."""
