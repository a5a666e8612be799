"""The operator actions over HTTP, every route and OpenAPI entry derived from its
declaration (:mod:`backend.client.actions`).

A route authorises the request by the action's permission, reads each parameter where
the declaration puts it (the path, the query or the JSON body; a body naming a field the
action does not have is refused), parses it to its declared type, calls the backend's
method of the action's name and answers with the result as its declaration says (status,
envelope, the fields beside it). The checks of the values themselves are the backend's
(:func:`~backend.client.actions.check_arguments`), so a 422 names the field as every other
path that takes it does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, get_args, get_origin

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.base import MAX_BODY_BYTES, Api, JSONResponse
from backend.api.schemas import AnswerSchemas
from backend.client.actions import ACTIONS, Action, Known, Param, Range, Schema, When, encode
from backend.errors import BadInput
from backend.inputs import check_instant, check_text, out_of_range, whole_number
from backend.model import parse_iso
from backend.safetext import printable
from backend.timeparse import parse_when

__all__ = ["MAX_PAGE_BYTES", "action_routes", "operation"]

#: The JSON of a page's items past which the page ends early, its ``next_before`` naming its
#: last item as a full page's does: 1,000 jobs of 256 KiB would be 250 MB rendered on the
#: engine's loop, and held in memory for a client that reads slowly.
MAX_PAGE_BYTES = 1024 * 1024


def action_routes(api: Api) -> list[Route]:
    """A route per declared action, in the order they are declared."""
    return [_route(api, action) for action in ACTIONS.values()]


def _route(api: Api, action: Action) -> Route:
    http = action.http

    async def handle(request: Request) -> Response:
        arguments = await _arguments(api, action, request)
        backend = api.backend
        content: dict[str, Any] = {}
        if http.prelude is not None:
            content.update(await http.prelude(backend, arguments))
        result = await getattr(backend, action.name)(**arguments)
        now = await backend.now() if http.clock else None
        if http.extra is not None:
            content = {**http.extra(result, arguments), **content}
        if now is not None:
            content["now"] = encode(now)
        encoded = _bounded_page(encode(result, now))
        if http.envelope is not None:
            content[http.envelope] = encoded
        elif encoded is not None:
            content.update(encoded)
        repeated = http.repeated is not None and http.repeated(result)
        status = http.again if repeated and http.again is not None else http.status
        return JSONResponse(content, status_code=status)

    handle.__name__ = action.name
    endpoint = api.endpoint(action.permission)(handle)
    return Route(http.path, endpoint, methods=[http.method], include_in_schema=False)


async def _arguments(api: Api, action: Action, request: Request) -> dict[str, Any]:
    """The action's arguments from the request, in the order of its signature: the path
    first (an unknown schedule is a 404 before anything else is read), the fixed query
    parameters, the query, then the body."""
    http, backend = action.http, api.backend
    arguments: dict[str, Any] = {}
    for param in action.params:
        if http.where(param.name) == "path":
            value = str(request.path_params[http.wire_name(param.name)])
            if any(isinstance(limit, Known) for limit in param.limits):
                await backend.schedule_zone(value)
            arguments[param.name] = value
    _check_query_names(action, request)
    for key, wanted in http.fixed.items():
        given = request.query_params.get(key)
        if given is None:
            raise BadInput(f"{key} is required here (use {key}={wanted})", field=key)
        if given != wanted:
            raise BadInput(f'{key} "{printable(given, 60)}" is not supported here (use {key}={wanted})', field=key)
    for param in action.params:
        if http.where(param.name) == "query":
            arguments[param.name] = _query_value(request, param, http.wire_name(param.name))
    body_params = [p for p in action.params if http.where(p.name) == "body"]
    if not body_params:
        # Read all the same: a body sent here (a field, bad JSON) is refused, never ignored.
        await api.body_of(request, MAX_BODY_BYTES, fields=())
        return arguments
    if http.body is not None:
        body = await api.body_of(request, http.max_body or MAX_BODY_BYTES)
        arguments[http.body] = body
        return arguments
    wires = tuple(http.wire_name(p.name) for p in body_params)
    body = await api.body_of(request, http.max_body or MAX_BODY_BYTES, fields=wires)
    clock: dict[str, Any] = {}
    for param in body_params:
        wire = http.wire_name(param.name)
        raw = body.get(wire)
        when = next((limit for limit in param.limits if isinstance(limit, When)), None)
        if when is not None:
            if raw is None:
                raise BadInput(f'"{wire}" is required: an ISO 8601 time, now, or an offset such as -2d', field=wire)
            if not isinstance(raw, str):  # (given, as a number or an object: said so, not "required")
                raise BadInput(
                    f'"{wire}" {printable(json.dumps(raw), 60)} is not a time: give a string, an ISO 8601 time, now, '
                    "or an offset such as -2d",
                    field=wire,
                )
            if not clock:
                clock = {"zone": await backend.schedule_zone(arguments[when.zone_of]), "now": await backend.now()}
            arguments[param.name] = parse_when(raw, now=clock["now"], zone=clock["zone"], field=wire, lower=when.lower)
        elif raw is None:
            if param.required:
                raise BadInput(f'"{wire}" is required', field=wire)
            arguments[param.name] = param.default
        elif param.base is bool and not isinstance(raw, bool):
            raise BadInput(f'"{wire}" must be true or false', field=wire)
        else:
            arguments[param.name] = raw
    return arguments


def _bounded_page(encoded: Any) -> Any:
    """A page (``{items, next_before}``) cut after the item whose JSON takes the items past
    :data:`MAX_PAGE_BYTES`, with that item's id as ``next_before``: the client asks for the
    rest as for any next page. Anything else as it is."""
    if not isinstance(encoded, dict) or "next_before" not in encoded:
        return encoded
    key, items = next((key, value) for key, value in encoded.items() if isinstance(value, list))
    size = 0
    for count, item in enumerate(items[:-1], 1):
        size += len(json.dumps(item))  # ASCII-escaped: at least as long as its UTF-8
        if size > MAX_PAGE_BYTES:
            return {**encoded, key: items[:count], "next_before": item["id"]}
    return encoded


def _check_query_names(action: Action, request: Request) -> None:
    """Refuse a query parameter the route does not know (``?stauts=dead`` ignored would
    list every job as if filtered) and one given twice that is not a list (which one counts
    would be a guess), as the body's unknown fields are refused."""
    http, query = action.http, request.query_params
    lists = {http.wire_name(p.name) for p in action.params if http.where(p.name) == "query" and get_origin(p.base) is list}
    known = {http.wire_name(p.name) for p in action.params if http.where(p.name) == "query"} | set(http.fixed)
    Api.refuse_unknown_query(request, known)
    for wire in sorted(known - lists):
        if len(query.getlist(wire)) > 1:
            raise BadInput(f"the query parameter {wire} is given {len(query.getlist(wire))} times (give it once)", field=wire)


def _query_value(request: Request, param: Param, wire: str) -> Any:
    query = request.query_params
    base = param.base
    if get_origin(base) is list:
        return query.getlist(wire)
    raw = query.get(wire)
    if base is datetime:
        if not raw:
            raise BadInput(f"the query parameter {wire} is required (an ISO 8601 instant)", field=wire)
        try:
            instant = parse_iso(check_text(raw, wire, one_line=True))
        except OverflowError:  # (an instant whose UTC value lies before year 1)
            raise out_of_range(wire, raw) from None
        except ValueError:
            raise BadInput(f'{wire} "{printable(raw, 60)}" is not an ISO 8601 instant with an offset', field=wire) from None
        return check_instant(instant, wire, raw)  # within 1970 … 8999, as every other time
    if base is bool:
        if raw is None:
            return param.default
        if raw not in ("true", "false"):
            raise BadInput(f'{wire} "{printable(raw, 60)}" must be true or false', field=wire)
        return raw == "true"
    if base is int:
        if raw is None:
            return param.default
        try:
            value = whole_number(raw)  # (ASCII digits: int() takes other scripts' too)
        except ValueError:
            raise BadInput(f'{wire} "{printable(raw, 60)}" is not a whole number', field=wire) from None
        for limit in param.limits:
            if isinstance(limit, Range) and not limit.low <= value <= limit.high:
                raise BadInput(f"{wire} {printable(raw, 60)} is out of range ({limit.low:g}-{limit.high:g})", field=wire)
        return value
    if param.required and not raw:
        raise BadInput(f"the query parameter {wire} is required", field=wire)
    return param.default if raw is None else raw


# -- the OpenAPI document ------------------------------------------------------------------


def operation(action: Action, answers: AnswerSchemas) -> dict[str, Any]:
    """The OpenAPI operation of an action: its summary and description (the docstring),
    its parameters and body (the signature), its answers (the HTTP form; the success's
    body from the result's type, its schema's components kept in ``answers``)."""
    http = action.http
    # (tagged by its system: a generated client makes one class per tag, Swagger UI a section)
    op: dict[str, Any] = {"summary": action.summary, "operationId": action.name, "tags": [action.system]}
    if action.description:
        op["description"] = action.description
    parameters: list[dict[str, Any]] = []
    for param in action.params:
        wire, where = http.wire_name(param.name), http.where(param.name)
        if where == "path":
            parameters.append({"name": wire, "in": "path", "required": True, "schema": {"type": "string"}})
        elif where == "query":
            entry: dict[str, Any] = {"name": wire, "in": "query", "required": param.required, "schema": _schema(param)}
            if param.help:
                entry["description"] = param.help
            if get_origin(param.base) is list:
                entry.update(style="form", explode=True)
            parameters.append(entry)
    for key, wanted in http.fixed.items():
        parameters.append({"name": key, "in": "query", "required": True, "schema": {"type": "string", "enum": [wanted]}})
    if parameters:
        op["parameters"] = parameters
    body_params = [p for p in action.params if http.where(p.name) == "body"]
    if http.body is not None:
        schema = next(limit.openapi for limit in action.param(http.body).limits if isinstance(limit, Schema))
        op["requestBody"] = {"content": {"application/json": {"schema": dict(schema)}}}
    elif body_params:
        body: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {http.wire_name(p.name): _schema(p) for p in body_params},
        }
        required = [http.wire_name(p.name) for p in body_params if p.required]
        if required:
            body["required"] = required
        op["requestBody"] = {"content": {"application/json": {"schema": body}}}
    body = {"application/json": {"schema": answers.answer(action)}}
    responses: dict[str, Any] = {str(http.status): {"description": http.ok or "done", "content": body}}
    if http.again is not None:
        responses[str(http.again)] = {"description": "nothing new was made: the same answer as before", "content": body}
    for status, text in http.errors.items():
        responses[str(status)] = {"description": text}
    op["responses"] = responses
    return op


_TYPES: Mapping[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema(param: Param) -> dict[str, Any]:
    base = param.base
    schema: dict[str, Any] = {}
    if get_origin(base) is list:
        schema = {"type": "array", "items": {"type": _TYPES.get(get_args(base)[0], "string")}}
    elif base is datetime:
        is_when = any(isinstance(limit, When) for limit in param.limits)
        schema = {"type": "string"} if is_when else {"type": "string", "format": "date-time"}
    elif base in _TYPES:
        schema = {"type": _TYPES[base]}
    elif _is_mapping(base):
        schema = {"type": "object"}
    for limit in param.limits:
        schema.update(limit.schema())
    if param.optional and "type" in schema:
        schema["nullable"] = True
    if not param.required and param.default is not None and isinstance(param.default, (bool, int, float, str)):
        schema.setdefault("default", param.default)
    if param.help:
        schema.setdefault("description", param.help)
    return schema


def _is_mapping(annotation: Any) -> bool:
    return (get_origin(annotation) or annotation) in (Mapping, dict)
