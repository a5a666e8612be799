"""The shared backend interface over a remote engine's HTTP inspect API (httpx).

Reads are retried briefly on connection errors; actions are never retried blindly (a Run
now that timed out may have fired). An unreachable server is an :class:`Unavailable`
with one clear sentence, never a traceback, and so is one whose answers it cannot read as
what it asked for; a value no request can carry is a :class:`BadInput` before anything is
sent (see :func:`_sendable`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from backend.api.tokens import check_token
from backend.client.actions import Action, check_arguments, decode, encode, json_kind
from backend.client.interface import SYSTEMS, Backend, ConnectionInfo
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
from backend.events.bus import READY, RESYNC, STREAM, TOPICS, Signal
from backend.inputs import check_json, check_text
from backend.jobs.model import NotDead, QueueFull
from backend.model import BackfillProgress, Health, Run
from backend.safetext import printable, redact, redact_url, remember_url_secrets
from backend.scheduler.stored import DefinedInCode, NameTaken, NotValidHere

__all__ = ["RemoteBackend", "check_server_url", "check_token"]

T = TypeVar("T")

_READ_RETRIES = (0.2, 0.5, 1.0)
#: Seconds an idle connection is kept for the next request: below the server's 5
#: (``backend.api.server.KEEP_ALIVE``). At httpx's default, also 5, a request sent on a
#: connection idle that long met the server closing it: the read failed, and an action
#: (a create, a Run now) said it "may have been done all the same" (seen under load).
KEEPALIVE_EXPIRY = 2.0
#: Seconds the event stream may stay silent before it counts as broken (the server pings
#: every 15 s).
EVENTS_SILENCE = 40.0


class RemoteBackend(Backend):
    """A :class:`~backend.client.interface.Backend` that talks to ``schedtui serve`` over HTTP.

    ``transport`` lets tests hand in an ``httpx.ASGITransport``; by default it is a real
    connection. ``read_only`` can be forced on; it is also on when the token only reads.
    ``read_retries``: the waits (seconds) before each retry of a read the server did not
    answer (tests that stop the server shorten them).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        read_only: bool = False,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        read_retries: tuple[float, ...] = _READ_RETRIES,
    ) -> None:
        remember_url_secrets(url)
        check_server_url(url)
        if token:
            check_token(token)
            if httpx.URL(url).userinfo:  # httpx would send them as Basic auth, and no token
                raise BadInput(
                    f'server URL "{printable(redact_url(url), 120)}" holds a user and password, and a token is given: '
                    "a request carries one or the other; give the token alone (a proxy's password goes elsewhere)",
                    field="url",
                )
        self.url = url.rstrip("/")
        self.where = redact_url(self.url)
        """The URL fit to show: without the password of a ``user:pass@`` part."""
        self.read_only = read_only
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.token_sent = bool(token)
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY),
        )  # fmt: skip
        self._timeout = timeout
        self._read_retries = read_retries
        self._info: ConnectionInfo | None = None

    # -- plumbing -----------------------------------------------------------------------
    async def _request(self, method: str, path: str, *, retry: bool, changes: bool = False, **kwargs: Any) -> Any:
        """``retry``: send it again after it may have reached the server, too (one that
        failed before it left is always sent again: nothing was done). ``changes``: it is an
        action, which a request that reached the server may have done all the same."""
        delays, attempt, doubt = self._read_retries, 0, False
        while True:
            try:
                # httpx's timeout bounds each read, not the whole answer: one trickled a
                # byte every 2 s held the command line, and the console's every refresh
                # after it, for good.
                response, body = await self._exchange(method, path, **kwargs)
                break
            except _TooLong as exc:
                doubt = doubt or changes
                raise self._foreign(f"{method} {path}", str(exc), doubt=doubt) from None
            except (httpx.TransportError, TimeoutError) as exc:
                unsent = isinstance(exc, _NOT_SENT)
                doubt = doubt or (changes and not unsent)
                # A server that let the timeout pass (frozen, or a host that drops packets)
                # is not asked again: three more waits of 10 s held a command line 42 s, and
                # the console's header calm for as long. The retries are for a server going
                # away and back (refused, reset: these fail at once).
                timed_out = isinstance(exc, (httpx.TimeoutException, TimeoutError))
                if attempt < len(delays) and (unsent or retry) and not timed_out:
                    await asyncio.sleep(delays[attempt])
                    attempt += 1
                    continue
                if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
                    said = f"{self.where} did not answer in time ({method} {path})"
                else:
                    said = f"cannot reach {self.where}: {_reason(exc)}"
                raise Unavailable(said + (_IN_DOUBT if doubt else "")) from None
        return self._decode(response, body, f"{method} {path}")

    async def _exchange(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, bytes]:
        """One request, and its answer read whole (its body, decoded), within
        :data:`WHOLE_ANSWER_READS` times the timeout and :data:`MAX_ANSWER_BYTES` (or
        :class:`_TooLong`): httpx's timeout bounds each read, not the whole answer (one
        trickled a byte every 2 s held the command line, and the console's every refresh
        after it, for good), and nothing bounds its size (a URL that serves a disk image
        filled the console's memory before a word was said)."""
        async with asyncio.timeout(self._timeout * WHOLE_ANSWER_READS):
            async with self._client.stream(method, path, **kwargs) as response:
                return response, await _body(response)

    def _decode(self, response: httpx.Response, body: bytes, route: str) -> Any:
        """The JSON of the answer to ``route`` (``GET /inspect/info``), or the error it says.
        An answer without JSON, or a refusal (4xx) that is not the API's ``{"error": {code,
        message}}`` (another service at the URL: any web app answers 404 to /inspect/info),
        is :meth:`_foreign`, not the refusal it seems."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = _NOT_JSON
        status = response.status_code
        if response.is_success:
            if data is _NOT_JSON:
                raise self._foreign(route, f"with {status} and {_no_json(response)}")
            return data
        error = data.get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        said = error.get("message")
        schedtuis = isinstance(error.get("code"), str) and isinstance(said, str)
        if 400 <= status < 500 and not schedtuis:
            held = _no_json(response) if data is _NOT_JSON else "JSON that is no schedtui error"
            raise self._foreign(route, f"with {status} and {held}")
        message = said if schedtuis and said else f"{self.where} answered {printable(route, 120)} with {status}"
        if status == 401:
            # In the client's words: the server's advice ("send Authorization: Bearer") is for
            # whoever writes HTTP requests, not for this client's user.
            said = f"{self.where} refused the token given" if self.token_sent else f"{self.where} wants a token; none was given"
            raise Unauthorized(said, token_sent=self.token_sent)
        if status == 403:
            raise Forbidden(message)
        if status == 404:
            raise NotFound(message)
        if status == 409:
            count = data.get("count") if isinstance(data, dict) else None
            reason = data.get("reason") if isinstance(data, dict) else None
            refusal = {
                "queue_full": QueueFull,
                "not_dead": NotDead,
                "defined_in_code": DefinedInCode,
                "name_taken": NameTaken,
                "not_valid_here": NotValidHere,
            }.get(str(error.get("code")), Refused)
            raise refusal(message, count=count, reason=reason or message)
        if status == 413:
            raise TooLarge(message, field=_field(error))
        if status == 422:
            raise BadInput(message, field=_field(error))
        if status in (502, 503, 504):
            raise Unavailable(message)
        if status >= 500:
            # The server (or a proxy before it) failing: an outage to whoever reads (the
            # console marks its data stale and retries), in doubt for an action.
            doubt = "" if route.startswith("GET ") else "; it may have been done all the same: look before doing it again"
            raise Unavailable(f"{message}{doubt}")
        raise SchedtuiError(message)

    def _read(self, route: str, data: Any, build: Callable[[Any], T]) -> T:
        """``build(data)``: the answer to ``route`` (``GET /inspect/info``) as what was asked
        for, a model. JSON of another shape (another service at the URL, a proxy's status
        page) is the same :class:`Unavailable` as an answer without JSON, naming the route
        and what was wrong: never a KeyError traceback, nor a wrong value handed on."""
        try:
            return build(data)
        except SchedtuiError:
            raise
        except (LookupError, TypeError, AttributeError, ValueError, AssertionError, ArithmeticError, RecursionError) as exc:
            if isinstance(exc, KeyError) and exc.args:
                problem = f'no field "{exc.args[0]}"'
            elif isinstance(exc, AssertionError) and not exc.args:
                problem = "a field it needs is missing or null"  # a model's from_json asserts it
            else:
                problem = str(exc) or type(exc).__name__
            raise self._foreign(route, f"with JSON schedtui cannot read ({printable(problem, 120)})") from None

    def _foreign(self, route: str, what: str, *, doubt: bool = False) -> Unavailable:
        """An answer to ``route`` that this client cannot read as schedtui's (``what`` it
        was): the server at the URL is not one it can use. ``doubt``: the request was an
        action, which the server may have done all the same."""
        said = f"{self.where} answered {printable(route, 120)} {what}; is it a schedtui server?"
        return Unavailable(said + (_IN_DOUBT if doubt else ""))

    async def _get(self, path: str, **params: Any) -> Any:
        return await self._request("GET", path, retry=True, params={k: v for k, v in params.items() if v is not None})

    async def _act(self, action: Action, arguments: dict[str, Any]) -> Any:
        """:meth:`_act_once`; a page the server cut short (past its size bound) is read on
        until it holds ``limit`` items, as an embedded backend's does: the CLI's ``--json``
        printed only the items of the cut page, and a script reading fewer than it asked
        for took that for the end."""
        page: Any = await self._act_once(action, arguments)
        names = {param.name for param in action.params}
        if "limit" not in names or "before" not in names or getattr(page, "next_before", None) is None:
            return page
        limit = check_arguments(action, arguments)["limit"]
        (field,) = [f.name for f in dataclasses.fields(page) if isinstance(getattr(page, f.name), list)]
        items = list(getattr(page, field))
        while len(items) < limit and page.next_before is not None:
            page = await self._act_once(action, {**arguments, "before": page.next_before, "limit": limit - len(items)})
            items += getattr(page, field)
        return dataclasses.replace(page, **{field: items})

    async def _act_once(self, action: Action, arguments: dict[str, Any]) -> Any:
        """Refuse an ``operate`` action when read-only, check the arguments as the server
        would (no request that cannot succeed), send the request the declaration describes
        and decode its answer from the result's annotation."""
        if action.permission == "operate" and self.read_only:
            raise Forbidden(f"read-only: {action.label} is not allowed")
        checked = check_arguments(action, arguments)
        http = action.http
        by_wire = {http.wire_name(p.name): checked[p.name] for p in action.params}
        path = re.sub(
            r"\{(\w+)(?::\w+)?\}", lambda match: _seg(_sendable(str(by_wire[match.group(1)]), match.group(1))), http.path
        )
        query: list[tuple[str, Any]] = list(http.fixed.items())
        body: dict[str, Any] = {}
        for param in action.params:
            value, wire = checked[param.name], http.wire_name(param.name)
            where = http.where(param.name)
            if where == "path":
                continue
            if http.body == param.name:
                body = {_sendable(key, "field"): _sendable(item, key) for key, item in dict(value).items()}
            elif where == "query":
                values = value if isinstance(value, list) else [] if value is None else [value]
                query += [(wire, _sendable(encode(v), wire)) for v in values]
            else:
                body[wire] = _sendable(encode(value), wire)
        sends_body = http.method in ("POST", "PATCH")
        data = await self._request(
            http.method, path, retry=http.retried(checked), changes=action.permission != "read", params=query,
            **({"json": body} if sends_body else {}),
        )
        return self._read(f"{http.method} {path}", data, lambda answer: _result(action, checked, answer))

    # -- the interface ------------------------------------------------------------------
    async def connect(self) -> ConnectionInfo:
        self._info = self._read("GET /inspect/info", await self._get("/inspect/info"), self._connection)
        return self._info

    def _connection(self, data: Any) -> ConnectionInfo:
        """What ``/inspect/info`` says, as a :class:`ConnectionInfo` (a read token makes
        this backend read-only)."""
        info = decode(dict[str, Any], data)
        texts = {"coordination": info["coordination"], "instance": info["instance"]}
        texts |= {key: info.get(key, "") for key in ("store_kind", "actor", "access")}
        for key, value in texts.items():
            if not isinstance(value, str):
                raise TypeError(f"{key} is {json_kind(value)}, not a string")
        systems = decode(list[str], info.get("systems", list(SYSTEMS)))
        if texts["access"] == "read":
            self.read_only = True
        return ConnectionInfo(
            kind="remote",
            where=self.where,
            coordination=texts["coordination"],
            instance=texts["instance"],
            read_only=self.read_only,
            store_kind=texts["store_kind"],
            actor=texts["actor"],
            systems=tuple(systems),
        )

    async def close(self) -> None:
        await self._client.aclose()

    def info(self) -> ConnectionInfo:
        if self._info is None:
            raise Unavailable(f"not connected to {self.where} yet")
        return self._info

    async def health(self) -> Health:
        """The server's ``/healthz``: a 503 is an answer (the store is failing), not an error."""
        try:
            response, body = await self._exchange("GET", "/healthz")
        except _TooLong as exc:
            raise self._foreign("GET /healthz", str(exc)) from None
        except TimeoutError:
            raise Unavailable(f"{self.where} did not answer in time (GET /healthz)") from None
        except httpx.TransportError as exc:
            raise Unavailable(f"cannot reach {self.where}: {_reason(exc)}") from None
        if response.status_code == 503:
            try:
                return Health.from_json(json.loads(body))
            except (ValueError, KeyError, TypeError, RecursionError):
                pass
        health: Health = self._read("GET /healthz", self._decode(response, body, "GET /healthz"), lambda data: decode(Health, data))
        return health

    async def now(self) -> datetime:
        now: datetime = self._read("GET /inspect/info", await self._get("/inspect/info"), lambda data: decode(datetime, data["now"]))
        return now

    async def schedule_zone(self, name: str) -> str:
        for view in (await self.list_schedules()).schedules:
            if view.name == name:
                return view.timezone
        raise NotFound(f'no schedule named "{name}"')

    async def wait_run(self, run_id: str) -> Run:
        delay = 0.05
        while True:
            run = await self.get_run(run_id)
            if run.status != "running":
                return run
            await asyncio.sleep(delay)  # polling a remote server: nothing to wait on
            delay = min(delay * 2, 1.0)

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        delay = 0.05
        while (progress := await self.backfill_progress(backfill_id)).state == "running":
            await asyncio.sleep(delay)  # polling a remote server: nothing to wait on
            delay = min(delay * 2, 1.0)
        return progress

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        headers = {"Last-Event-ID": since} if since else {}
        timeout = httpx.Timeout(self._timeout, read=EVENTS_SILENCE)
        try:
            async with self._client.stream("GET", "/inspect/events", headers=headers, timeout=timeout) as response:
                if not response.is_success:
                    try:
                        body = await _body(response)
                    except _TooLong as exc:
                        raise self._foreign("GET /inspect/events", str(exc)) from None
                    self._decode(response, body, "GET /inspect/events")  # raises the error it says
                parser = SseParser()
                async for chunk in response.aiter_text():
                    try:
                        batch = parser.feed(chunk)
                    except _TooLong as exc:
                        raise self._foreign("GET /inspect/events", str(exc)) from None
                    if batch is not None:
                        yield batch
        except httpx.TimeoutException:
            raise Unavailable(f"the event stream of {self.where} went silent (no ping for {EVENTS_SILENCE:g}s)") from None
        except httpx.TransportError as exc:
            raise Unavailable(f"the event stream of {self.where} broke: {_reason(exc)}") from None
        raise Unavailable(f"{self.where} ended the event stream")



class SseParser:
    """Server-Sent Events text in, signals out: :meth:`feed` returns the signals of the
    events completed by a chunk (``[]`` for a ping alone), or ``None`` while none is."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, chunk: str) -> list[Signal] | None:
        self._buffer = (self._buffer + chunk).replace("\r\n", "\n")  # a CR may end one chunk, its LF the next
        *blocks, self._buffer = self._buffer.split("\n\n")
        if len(self._buffer) > MAX_EVENT_CHARS:  # (a server's events are a few dozen characters)
            raise _TooLong(f"with an event of more than {MAX_EVENT_CHARS:,} characters")
        if not blocks:
            return None
        signals = []
        pinged = False
        for block in blocks:
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if line.startswith(":"):
                    pinged = True  # a comment: the server's ping
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                fields[key] = fields.get(key, "") + value.removeprefix(" ")
            event = fields.get("event")
            if event is None:
                continue
            try:
                data = json.loads(fields.get("data") or "{}")
            except ValueError:
                data = {}
            name = data.get("name") if isinstance(data, dict) else None
            if event in TOPICS or event in (READY, RESYNC, STREAM):
                signals.append(Signal(fields.get("id", ""), event, name if isinstance(name, str) else None))
        return signals if signals or pinged else None


# What no URL holds as typed: blanks, control characters, lone surrogates (a byte of a
# command line that is not UTF-8).
_NOT_URL = re.compile(r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_server_url(url: str) -> str:
    """``url`` if a client can reach a server there: ``http://`` or ``https://``, a host, a
    port (when given) of 1-65535, and nothing that cannot be sent. BadInput naming it,
    without its password and escaped, otherwise: never an httpx or socket traceback."""
    shown = printable(redact_url(url), 120)
    if not url.startswith(("http://", "https://")):
        raise BadInput(f'server URL "{shown}" must start with http:// or https://', field="url")
    bad = _NOT_URL.search(url)
    if bad is not None:
        raise BadInput(
            f'server URL "{shown}" holds {bad.group()!r} at position {bad.start()}, '
            "which no URL may (blanks and control characters are written %XX)",
            field="url",
        )
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise BadInput(f'server URL "{shown}" is not a URL ({printable(redact(str(exc)), 80)})', field="url") from None
    if not parsed.host:
        raise BadInput(f'server URL "{shown}" names no host', field="url")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise BadInput(f'server URL "{shown}": port {parsed.port} is not a port number (1-65535)', field="url")
    return url


def _result(action: Action, arguments: Mapping[str, Any], answer: Any) -> Any:
    """The result of ``action`` in the server's ``answer``, as the API writes it (see
    :class:`~backend.client.actions.Http`): the result's JSON, or ``{envelope: result}``.
    An action that returns nothing is answered its ``extra`` fields alone
    (``{"deleted": true}``): they must be there, or another server's 200 would be taken
    for done. Raises what :func:`~backend.client.actions.decode` raises for JSON of
    another shape."""
    http = action.http
    if http.envelope is not None:
        return decode(action.result, decode(dict[str, Any], answer)[http.envelope])
    if action.result is not None and action.result is not type(None):
        return decode(action.result, answer)
    said = decode(dict[str, Any], answer)
    for key, wanted in encode(dict(http.extra(None, arguments)) if http.extra else {}).items():
        if said[key] != wanted:
            raise ValueError(f"{key} is {json.dumps(said[key])[:40]}, not {json.dumps(wanted)}")
    return None


#: What :meth:`RemoteBackend._decode` makes of an answer that is not JSON (``None`` is JSON's null).
_NOT_JSON: Any = object()


#: A whole answer may take this many times the client's timeout (which bounds each read).
WHOLE_ANSWER_READS = 3
#: The most a whole answer may hold: far more than any a schedtui server sends (a page
#: stops past 1 MiB, see :data:`backend.api.routes.MAX_PAGE_BYTES`).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


#: The most one event of the event stream may hold, read so far (it held a whole stream
#: with no blank line in memory).
MAX_EVENT_CHARS = 64 * 1024


class _TooLong(Exception):
    """An answer past :data:`MAX_ANSWER_BYTES` (its message: how long it was)."""


async def _body(response: httpx.Response) -> bytes:
    """A streamed answer's body (decoded), read up to :data:`MAX_ANSWER_BYTES`."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise _TooLong(f"with {int(declared):,} bytes")
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise _TooLong(f"with more than {MAX_ANSWER_BYTES:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
#: The failures of a request that never left: no connection was made, so nothing was done.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: What an action's caller must know when one of its requests went and no answer came back
#: (its repeats included): it may have been done all the same (a frozen server ran a Run now
#: once it woke: pressed again, it ran twice; a disable landed late, after the enable that
#: followed it).
_IN_DOUBT = "; it may have been done all the same: look before doing it again"


def _no_json(response: httpx.Response) -> str:
    """What an answer without JSON holds instead, by its Content-Type ("no JSON (text/html)")."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip()
    return f"no JSON ({printable(kind, 60)})" if kind else "no JSON"


def _field(error: dict[str, Any]) -> str | None:
    field = error.get("field")
    return field if isinstance(field, str) else None


def _sendable(value: Any, field: str) -> Any:
    """``value`` if a request can carry it as ``field`` (in its path, its query or its JSON
    body); BadInput naming the field otherwise, never an encoder's traceback. Text holding
    a lone surrogate (what a byte of a command line that is not UTF-8 becomes) has no UTF-8
    form: it is refused as every text field is (:func:`~backend.inputs.check_text`: the
    value, the character, its position), and it names nothing a server holds, since every
    name was checked so. Any other value must be JSON (:func:`~backend.inputs.check_json`,
    what a job's payload is checked with: no NaN or infinity, no lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            check_text(value, field)  # raises: a lone surrogate is no text
            raise BadInput(f"{field} is not text", field=field) from None
        return value
    check_json(value, field)
    return value


def _seg(value: str) -> str:
    """``value`` as one segment of a URL path, whatever it holds: every "/" escaped (a lock
    name may hold some), and a name of dots alone ("." and "..", valid names) escaped too,
    or the client would resolve it as a step up the path before sending it."""
    segment = quote(value, safe="")
    return segment.replace(".", "%2E") if segment.strip(".") == "" else segment


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({text})"
    return text
