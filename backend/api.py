"""The HTTP inspect API: a Starlette app over an engine in this process.

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
    GET  /inspect/backfills/{backfill_id}
    POST /inspect/backfills/{backfill_id}/cancel
    POST /schedule/{name}/fire?trigger=external          what platform schedulers call

Every error is ``{"error": {"code", "message"}}`` with its status (401, 403, 404, 405, 409,
413, 422, 503); a refused backfill adds ``count`` and ``reason``. Bad input never yields a
500. Bearer tokens: the operator token may do everything, the read token only ``GET``.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from .engine import Engine
from .errors import (
    BadInput,
    Forbidden,
    NotFound,
    Refused,
    SchedtuiError,
    Unauthorized,
    Unavailable,
)
from .interface import RUNS_BETWEEN_MAX_PER_NAME, EmbeddedBackend
from .model import BACKFILL_MAX_LIMIT, iso, parse_iso
from .timeparse import parse_when

__all__ = ["MAX_BODY_BYTES", "create_app"]

log = logging.getLogger("schedtui.api")

#: Request bodies larger than this are refused with 413 (the largest real body is ~200 bytes).
MAX_BODY_BYTES = 64 * 1024

Access = Literal["open", "read", "operate"]
Endpoint = Callable[[Request], Awaitable[Response]]

_STATUS: list[tuple[type[SchedtuiError], int]] = [
    (NotFound, 404),
    (Refused, 409),
    (Unauthorized, 401),
    (Forbidden, 403),
    (BadInput, 422),
    (Unavailable, 503),
]


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _from_error(exc: SchedtuiError) -> JSONResponse:
    status = next((s for kind, s in _STATUS if isinstance(exc, kind)), 422)
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
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


class _Tokens:
    def __init__(self, operate: str | None, read: str | None) -> None:
        self.operate = operate or None
        self.read = read or None

    @property
    def required(self) -> bool:
        return self.operate is not None or self.read is not None

    def access_of(self, request: Request) -> Access:
        """What the request's bearer token allows; raises Unauthorized for none or a wrong one."""
        if not self.required:
            return "operate"
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("missing bearer token (send Authorization: Bearer <token>)")
        token = token.strip()
        # Both comparisons always run: the time taken says nothing about which token matched.
        is_operate = self.operate is not None and hmac.compare_digest(token.encode(), self.operate.encode())
        is_read = self.read is not None and hmac.compare_digest(token.encode(), self.read.encode())
        if is_operate:
            return "operate"
        if is_read:
            return "read"
        raise Unauthorized("wrong bearer token")


def create_app(
    engine: Engine,
    *,
    token: str | None = None,
    read_token: str | None = None,
    allow_external_self: bool = False,
    manage_engine: bool = False,
) -> Starlette:
    """The ASGI app. With ``manage_engine`` the app's lifespan starts and stops the engine."""
    backend = EmbeddedBackend(engine)
    tokens = _Tokens(token, read_token)

    def endpoint(access: Access) -> Callable[[Endpoint], Endpoint]:
        """Authorise, then map schedtui errors to JSON; nothing escapes as a 500 with a trace."""

        def wrap(fn: Endpoint) -> Endpoint:
            async def handler(request: Request) -> Response:
                try:
                    if access != "open":
                        granted = tokens.access_of(request)
                        if access == "operate" and granted != "operate":
                            raise Forbidden("this token may only read; acting needs the operator token")
                    return await fn(request)
                except SchedtuiError as exc:
                    return _from_error(exc)
                except _TooLarge:
                    return error_response(413, "too_large", f"the request body is larger than {MAX_BODY_BYTES} bytes")
                except Exception:
                    log.exception("unexpected error in %s %s", request.method, request.url.path)
                    return error_response(500, "internal", "internal error; the server log has the details")

            handler.__name__ = fn.__name__
            handler.__doc__ = fn.__doc__
            return handler

        return wrap

    async def body_of(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise _TooLarge()
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise _TooLarge()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"the body is not valid JSON ({exc})", field="body") from None
        if not isinstance(data, dict):
            raise BadInput("the body must be a JSON object", field="body")
        return data

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

    def schedule_name(request: Request) -> str:
        name = str(request.path_params["name"])
        engine.schedule(name)
        return name

    # -- reads --------------------------------------------------------------------------
    @endpoint("open")
    async def healthz(request: Request) -> Response:
        """
        ---
        summary: Liveness
        responses:
          200: {description: "the engine is serving"}
        """
        return JSONResponse({"status": "ok", "instance": engine.instance, "coordination": engine.coordination})

    @endpoint("read")
    async def info(request: Request) -> Response:
        """
        ---
        summary: What this server is, and what the caller's token may do
        responses:
          200: {description: "instance, coordination, store kind, access (read or operate)"}
        """
        access = tokens.access_of(request)
        return JSONResponse(
            {
                "instance": engine.instance,
                "coordination": engine.coordination,
                "store_kind": engine.store.kind,
                "access": access,
                "now": iso(engine.clock.now()),
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
          - {name: name, in: query, required: true, schema: {type: string}}
          - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 50}}
          - {name: before, in: query, description: "id of the last run of the previous page", schema: {type: string}}
        responses:
          200: {description: "{runs: [run], next_before}"}
          404: {description: unknown schedule}
          422: {description: bad parameter}
        """
        name = request.query_params.get("name")
        if not name:
            raise BadInput("the query parameter name is required", field="name")
        limit = query_int(request, "limit", 50, 1, 1000)
        before = request.query_params.get("before") or None
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
        name = schedule_name(request)
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
                window.append(parse_iso(raw))
            except (ValueError, OverflowError):
                raise BadInput(f'{key} "{raw}" is not an ISO 8601 instant with an offset', field=key) from None
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
          200: {description: "{now, instances: [{instance, host, pid, heartbeat_at}]}"}
        """
        found = await backend.instances()
        return JSONResponse({"now": iso(engine.clock.now()), "instances": [i.to_json() for i in found]})

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
        name = schedule_name(request)
        run = await backend.run_now(name)
        return JSONResponse({"run_id": run.id, "run": run.to_json()}, status_code=202)

    async def _set_enabled(request: Request, enabled: bool) -> Response:
        name = schedule_name(request)
        body = await body_of(request)
        note = body.get("note")
        if note is not None and not isinstance(note, str):
            raise BadInput("note must be a string", field="note")
        view = await backend.set_enabled(name, enabled, note=note)
        return JSONResponse(view.to_json())

    @endpoint("operate")
    async def enable(request: Request) -> Response:
        """
        ---
        summary: Enable a schedule (it arms its next future slot)
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
              schema: {type: object, properties: {note: {type: string}}}
        responses:
          200: {description: the schedule}
        """
        return await _set_enabled(request, False)

    async def _backfill_args(request: Request) -> tuple[str, datetime, datetime, bool, int | None, bool]:
        name = schedule_name(request)
        body = await body_of(request)
        zone = engine.schedule(name).timezone
        now = engine.clock.now()
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
                required: [from, to]
                properties:
                  from: {type: string, description: "ISO 8601, now, or -2d/-6h"}
                  to: {type: string}
                  confirm: {type: boolean}
                  limit: {type: integer, maximum: 10000}
        responses:
          200: {description: the plan}
        """
        name, start, end, confirm, limit, _ = await _backfill_args(request)
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
                required: [from, to]
                properties:
                  from: {type: string}
                  to: {type: string}
                  confirm: {type: boolean, description: "needed above 25 slots"}
                  limit: {type: integer, maximum: 10000, default: 1000}
                  skip_succeeded: {type: boolean, description: "fire only the slots without a succeeded run"}
        responses:
          202: {description: "{id, plan, progress}"}
          409: {description: "refused: {count, reason}"}
        """
        name, start, end, confirm, limit, skip = await _backfill_args(request)
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
        name = schedule_name(request)
        trigger = request.query_params.get("trigger")
        if trigger != "external":
            raise BadInput(f'trigger "{trigger}" is not supported here (use trigger=external)', field="trigger")
        firing = await engine.fire_external(name, allow_self=allow_external_self)
        body = {
            "run_id": firing.run_id,
            "created": firing.created,
            "queued": firing.queued,
            "run": firing.run.to_json() if firing.run else None,
        }
        return JSONResponse(body, status_code=202 if firing.created else 200)

    routes = [
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
        return JSONResponse(_declare_path_parameters(schemas.get_schema(routes=app.routes)))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed here"}.get(
            exc.status_code, str(exc.detail)
        )
        return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), message)

    lifespan = None
    if manage_engine:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
            await engine.start()
            try:
                yield
            finally:
                await engine.stop()

    app = Starlette(
        routes=[*routes, Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    return app


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


class _TooLarge(Exception):
    """A body over :data:`MAX_BODY_BYTES`."""
