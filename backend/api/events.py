"""Live change signals over HTTP: ``GET /inspect/events``, a Server-Sent Events stream.

Each signal is one event: ``id: EPOCH-SEQ``, ``event:`` its topic (``runs``,
``schedules``, ``jobs``, ``durable``, ``locks``, ``audit``; ``resync``: refetch
everything; ``stream``: whether other instances' signals arrive, ``up`` or ``down``),
``data: {"name": …}``. The first event is ``ready``. A comment line (``: ping``) every
:data:`PING_EVERY` seconds keeps proxies from closing a quiet stream and tells the client
the server is alive. A client that reconnects with ``Last-Event-ID`` gets what it missed,
or a ``resync``. At most :data:`MAX_STREAMS` streams are open at once (503 beyond); a
client that reads slowly costs a bounded inbox, never the engine's time
(:mod:`backend.events.bus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from backend.api.base import Api, error_response
from backend.errors import Unavailable
from backend.events.bus import READY, Signal

__all__ = ["MAX_STREAMS", "PING_EVERY", "event_routes"]

log = logging.getLogger("schedtui.api")

#: Seconds between two pings of a quiet stream.
PING_EVERY = 15.0
#: Event streams open at once, at most.
MAX_STREAMS = 100
#: What a browser's EventSource waits before it reconnects (milliseconds).
RETRY_MS = 2000


def _event(signal: Signal, instance: str) -> bytes:
    data: dict[str, Any] = {"name": signal.name}
    if signal.topic == READY:
        data["instance"] = instance
    lines = f"id: {signal.id}\nevent: {signal.topic}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
    return lines.encode()


class EventStream(Response):
    """A stream of change signals until the client leaves or the server closes it. A HEAD
    request gets the headers alone."""

    media_type = "text/event-stream"

    def __init__(self, api: Api, signals: AsyncIterator[list[Signal]], instance: str) -> None:
        # No body attribute: the headers get no Content-Length (the body never ends).
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self.api = api
        self.signals = signals
        self.instance = instance

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.body", "body": f"retry: {RETRY_MS}\n\n".encode(), "more_body": True})
        async for batch in self.signals:
            body = b"".join(_event(signal, self.instance) for signal in batch) if batch else b": ping\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return

        async def left() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = [
            asyncio.ensure_future(self._stream(send)),
            asyncio.ensure_future(left()),
            asyncio.ensure_future(self.api.closing.wait()),
        ]
        self.api.streams += 1
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.api.streams -= 1
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.signals.aclose()  # type: ignore[attr-defined]
        stream = tasks[0]
        if stream.done() and not stream.cancelled() and isinstance(stream.exception(), Unavailable):
            log.info("an event stream ended: %s", stream.exception())
        with contextlib.suppress(Exception):  # the client may be gone already
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def event_routes(api: Api) -> list[Route]:
    @api.endpoint("read")
    async def events(request: Request) -> Response:
        """
        ---
        summary: Live change signals (Server-Sent Events)
        tags: [events]
        description: >
          text/event-stream. Each event names what changed, never the data: event is the
          topic (runs, schedules, jobs, durable, locks, audit; resync: refetch everything;
          stream: up or down, whether other instances' changes arrive), data is
          {"name": ...} (the schedule, queue, function or lock), id resumes the stream
          (send it back as Last-Event-ID). The first event is ready. A ": ping" comment
          comes every 15 s. Instances sharing a PostgreSQL store relay each other's signals.
        parameters:
          - {name: Last-Event-ID, in: header, required: false, schema: {type: string, maxLength: 100}}
        responses:
          200:
            description: "the stream"
            content: {text/event-stream: {schema: {type: string}}}
          503: {description: "too many streams are open"}
        """
        api.refuse_unknown_query(request)
        if api.streams >= MAX_STREAMS:
            return error_response(503, "unavailable", f"too many event streams are open (at most {MAX_STREAMS})")
        since = request.headers.get("last-event-id") or None
        if since is not None and len(since) > 100:
            since = None  # no id of ours is that long: start afresh
        instance = api.backend.info().instance
        return EventStream(api, api.backend.changes(since=since, idle=PING_EVERY), instance)

    return [Route("/inspect/events", events, methods=["GET"])]
