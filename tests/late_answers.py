"""A store call whose answer is late, and a lease that lapses meanwhile: the fault of a
partition that heals (or a process frozen) while a claim's answer is on its way; and an
HTTP answer lost on its way back to the remote client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from backend import Engine


class LateAnswer:
    """Wraps an async store call: the first call whose result ``matches`` goes through (it
    commits), then its answer waits until :meth:`let_go`; every other call goes through."""

    def __init__(self, call: Callable[..., Awaitable[Any]], matches: Callable[[Any], bool] = lambda _: True) -> None:
        self.call = call
        self.matches = matches
        self.held = asyncio.Event()
        """Set once a call has committed and its answer waits."""
        self._hold = asyncio.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.call(*args, **kwargs)
        if not self.held.is_set() and self.matches(result):
            self.held.set()
            await self._hold.wait()
        return result

    async def committed(self) -> None:
        await asyncio.wait_for(self.held.wait(), 10)  # (the timeout only bounds a broken test)

    def let_go(self) -> None:
        self._hold.set()


def lapse_and_renew(engine: Engine) -> None:
    """The instance's lease lapses and is renewed: a new epoch (a partition that healed)."""
    engine.lease.lapse("cut off (test)")
    engine.lease.renewed(engine.lease.sending())
    assert not engine.lease.lapsed


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    """Sends every request to the server; the answer to the first ``POST`` is lost on its
    way back (the connection drops after the server acted)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            await response.aread()
            self.lost.append(f"{request.method} {request.url.path} {response.status_code}")
            raise httpx.RemoteProtocolError("the server disconnected before the answer came (test)", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class LoseEveryAnswer(LoseFirstAnswer):
    """Every ``POST`` reaches the server and acts; every answer to one is lost."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            await response.aread()
            self.lost.append(f"{request.method} {request.url.path} {response.status_code}")
            raise httpx.RemoteProtocolError("the server disconnected before the answer came (test)", request=request)
        return response


class Trickle(httpx.AsyncByteStream):
    """An answer's body, one byte every ``every`` seconds (each read well within a per-read
    timeout: only a bound on the whole answer ends it)."""

    def __init__(self, body: bytes, every: float) -> None:
        self.body, self.every = body, every

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for byte in self.body:
            await asyncio.sleep(self.every)
            yield bytes([byte])


class TrickleReads(httpx.AsyncBaseTransport):
    """Every ``GET`` of ``path`` answers as the server does, trickled (see :class:`Trickle`)."""

    def __init__(self, path: str, every: float) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.path, self.every = path, every

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method != "GET" or request.url.path != self.path:
            return response
        body = await response.aread()
        return httpx.Response(response.status_code, headers=response.headers, stream=Trickle(body, self.every))

    async def aclose(self) -> None:
        await self.inner.aclose()


class Endless(httpx.AsyncByteStream):
    """An answer's body that never ends, 64 KiB a read; ``sent`` counts what was read of it."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        chunk = b"[" * 65536
        while True:
            self.sent += len(chunk)
            yield chunk


class FloodAnswers(httpx.AsyncBaseTransport):
    """Every request to ``path`` reaches the server; its answer is replaced by one that never
    ends (``declared``: or by one whose Content-Length says 10 GB): a URL that serves
    something else than schedtui, a disk image, a stream."""

    def __init__(self, path: str, *, declared: bool = False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.path, self.declared = path, declared
        self.bodies: list[Endless] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path != self.path:
            return response
        await response.aread()
        body = Endless()
        self.bodies.append(body)
        headers = {"content-type": "application/octet-stream"}
        if self.declared:
            headers["content-length"] = str(10**10)
        return httpx.Response(200, headers=headers, stream=body)

    async def aclose(self) -> None:
        await self.inner.aclose()
