"""What every route of the HTTP API builds on: the JSON response, the error bodies, and
:class:`Api` (the backend, token checks, body and query parsing).

Every error is ``{"error": {"code", "message"}}`` with its status (401, 403, 404, 405, 408,
409, 413, 422, 503); a refusal adds ``count`` and ``reason``, bad input names its
``field``. Bad input never yields a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Literal

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response

from backend.api.tokens import ApiToken, Tokens
from backend.client.interface import Backend
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
from backend.inputs import RepeatedKey, parse_json, whole_number
from backend.safetext import MAX_JSON_DEPTH, escape_json, printable, shallow_json

__all__ = ["BODY_TIMEOUT", "MAX_BODY_BYTES", "Access", "Api", "Endpoint", "JSONResponse", "error_response"]

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


#: The levels a response wraps a stored value in (a page of items, each an object): room
#: kept above :data:`~backend.safetext.MAX_JSON_DEPTH` when a value too deep is cut short.
_PAGE_LEVELS = 8


class JSONResponse(StarletteJSONResponse):
    """The JSON response of every route: a lone surrogate in its content (text no store
    should hold, and no UTF-8 can encode) is sent escaped, as the six characters
    ``\\ud800``, rather than failing the whole response with a 500. Reads of the stores
    escape such text already (:func:`~backend.safetext.load_json`); this is the net under
    any other way it could come. A value too deep to encode is sent cut short the same way
    (one stored before input was held to :data:`~backend.safetext.MAX_JSON_DEPTH` levels)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(escape_json(content))
        except RecursionError:
            # A stored value nested too deeply to encode (taken before its depth was
            # checked): the page is sent with that value cut short, not refused with a 500.
            return self.render(shallow_json(content, MAX_JSON_DEPTH + _PAGE_LEVELS))


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
    own function ``routes(api) -> list[Route]`` (the actions' in :mod:`backend.api.routes`)."""

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
                except ClientDisconnect:
                    # The client went away while sending its body: nobody is left to answer,
                    # and it is no fault of the server's.
                    log.info("client went away during %s %s", request.method, printable(request.scope.get("path", "")))
                    return Response(status_code=499)
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
            data = parse_json(raw.decode("utf-8-sig"))  # (bytes to json.loads would take UTF-16 and -32 too)
        except RepeatedKey as exc:
            raise BadInput(f"the body {exc}", field=printable(exc.key, 60)) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"the body is not valid JSON ({exc})", field="body") from None
        except RecursionError:
            raise BadInput("the body is nested too deeply to be read", field="body") from None
        if not isinstance(data, dict):
            raise BadInput("the body must be a JSON object", field="body")
        unknown = sorted(set(data) - set(fields)) if fields is not None else []
        if unknown:
            shown = ", ".join(f'"{printable(name, 60)}"' for name in unknown)
            known = f"(known: {', '.join(fields)})" if fields else "(it takes none)"
            raise BadInput(f"unknown field(s) {shown} {known}", field=printable(unknown[0], 60))
        return data

    @staticmethod
    def refuse_unknown_query(request: Request, known: Collection[str] = ()) -> None:
        """Refuse a query parameter the route does not know (422 naming it): ``?stauts=dead``
        ignored would answer as if it had been understood."""
        unknown = sorted(set(request.query_params.keys()) - set(known))
        if unknown:
            shown = ", ".join(f'"{printable(name, 60)}"' for name in unknown)
            what = f"(known: {', '.join(sorted(known))})" if known else "(it takes none)"
            raise BadInput(f"unknown query parameter(s) {shown} {what}", field=printable(unknown[0], 60))

    @staticmethod
    def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = whole_number(raw)  # (ASCII digits: int() takes other scripts' too)
        except ValueError:
            raise BadInput(f'{name} "{printable(raw, 60)}" is not a whole number', field=name) from None
        if not low <= value <= high:
            raise BadInput(f"{name} {printable(raw, 60)} is out of range ({low}-{high})", field=name)
        return value


class _TooLarge(Exception):
    """A body over its route's limit (:data:`MAX_BODY_BYTES` unless the route says)."""

    def __init__(self, limit: int = MAX_BODY_BYTES) -> None:
        super().__init__(limit)
        self.limit = limit


class _TooSlow(Exception):
    """A body that did not arrive within the body timeout."""
