"""``schedtui serve``: the engine and, when asked for, its HTTP API in one process.

The engine (behind the embedded backend) and uvicorn share one event loop. The API's
address is bound before anything else happens: a taken port fails at once, before the
engine has caught up or fired anything. SIGINT/SIGTERM stops the API, then the engine
(which lets runs in flight finish); a second signal stops waiting for them.

Slow or idle clients are bounded: a request head must arrive within ``head_timeout``
seconds of the connection (or of the previous response), a body within the API's
``body_timeout``, an idle keep-alive connection is closed after uvicorn's keep-alive
timeout, past ``max_connections`` open connections new requests get 503, past
:data:`MAX_OPEN` none is accepted until one closes (a connection that has sent nothing
is not counted toward the first, and at the second the oldest such one gives its place
to the next), and a body in too many
small pieces is refused (400) before they cost the engine's loop. Those refusals, and
uvicorn's own, are JSON as the API's errors are.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from backend.client.embedded import EmbeddedBackend
from backend.errors import BadInput, ListenError, Unavailable
from backend.runtime.signals import on_stop_signals, why
from backend.store import store_lost, until_lost

if TYPE_CHECKING:  # imported when serving: prometheus_client takes a while to load
    from backend.observability.metrics import EngineMetrics

__all__ = [
    "HEAD_TIMEOUT",
    "KEEP_ALIVE",
    "MAX_BODY_PIECES",
    "MAX_CONNECTIONS",
    "MAX_OPEN",
    "MIN_PIECE_BYTES",
    "STOP_WITHIN",
    "freeze_startup_heap",
    "bare_host",
    "is_loopback",
    "listen_on",
    "serve",
]

log = logging.getLogger("schedtui.server")

#: Seconds a client has to send a complete request head (request line and headers).
HEAD_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE = 5
#: Open connections (and requests in progress) past which requests are answered 503.
MAX_CONNECTIONS = 256
#: Open connections past which none more is accepted until one closes: the system holds
#: the rest in the listening socket's queue (and refuses past it), where they cost the
#: engine's loop nothing. (Between the two bounds, a request gets a JSON 503.)
MAX_OPEN = 2 * MAX_CONNECTIONS  # (twice whatever bound a server is given)
#: Pieces (HTTP chunks, network reads) a request body may arrive in, unless they average
#: :data:`MIN_PIECE_BYTES` or more: real clients send a body in one or a few.
MAX_BODY_PIECES = 1024
MIN_PIECE_BYTES = 256
#: Seconds a refused request's connection is read on (and what comes discarded) before it
#: is closed, so that the client reads the answer rather than a reset.
LINGER = 2.0
#: Seconds a stop waits for the requests in progress before it cuts them short.
STOP_WITHIN = 5


class _QuietUvicorn(logging.Filter):
    """The requests a stop cuts short (see :data:`STOP_WITHIN`) are said in one line, not
    as uvicorn's error and a traceback for each; a request it cannot parse (answered a JSON
    400) is said at debug, not as a warning anyone could send thousands of a second."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            return False  # "Exception in ASGI application": the cut itself
        if record.msg == "Invalid HTTP request received." and record.levelno < logging.ERROR:
            # (uvicorn says it before the JSON 400 is sent: what anyone can send, at debug)
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("uvicorn.error").isEnabledFor(logging.DEBUG)
        if record.getMessage().startswith("Cancel ") and "timeout graceful shutdown exceeded" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = f"stopping: requests still in progress after {STOP_WITHIN:g}s were cut short", None
        return True


logging.getLogger("uvicorn.error").addFilter(_QuietUvicorn())


#: Seconds a connection that has sent nothing may stay, once the open connections reach
#: the bound, before a new one takes its place (a real client sends its request at once).
SILENT_GRACE = 0.1


class _Silent:
    """The connections that have sent nothing yet, oldest first. Bare connects, reopened
    as fast as they were closed, kept both bounds full: every request of the platform's
    external triggers and of ``/healthz`` was refused (503) or never accepted while the
    flood lasted. They no longer count toward the bound of requests (503), and at the
    bound of open connections the oldest of them gives its place to the next one."""

    def __init__(self) -> None:
        self.since: dict[Any, float] = {}

    def evict_oldest(self, now: float) -> bool:
        """Close the oldest connection that has sent nothing for :data:`SILENT_GRACE`
        seconds; whether there was one."""
        for protocol, at in self.since.items():
            if now - at < SILENT_GRACE:
                return False
            if protocol.transport.is_closing():
                continue  # (on its way out: it leaves this when it is gone)
            protocol.transport.close()
            log.debug("closing a connection that has sent nothing, for a new one (at the bound of connections)")
            return True
        return False


class _Acceptor:
    """Accepts the listening socket's connections while fewer than ``limit`` are open.

    asyncio's own server accepts whatever arrives, up to the listen backlog in one go,
    each with a protocol and a timer: 10,000 bare connects (no byte, no token) made the
    engine on the same loop fire seconds late. Here one connection is accepted at a time,
    between the loop's other work, and none past the bound: the rest wait in the
    system's listen queue until a connection closes (the protocol calls :meth:`closed`),
    or until one that has sent nothing gives its place (see :class:`_Silent`)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        limit: int,
        open_now: Callable[[], int],
        silent: _Silent,
    ) -> None:
        self._sock = sock
        self._protocol = protocol
        self._limit = limit
        self._open_now = open_now
        self._silent = silent
        self._room = asyncio.Event()
        sock.setblocking(False)
        self._task = asyncio.ensure_future(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._open_now() >= self._limit and not self._silent.evict_oldest(loop.time()):
                self._room.clear()
                with contextlib.suppress(TimeoutError):  # (a silent one may come of age meanwhile)
                    await asyncio.wait_for(self._room.wait(), SILENT_GRACE)
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors, a connection reset in the queue
                log.debug("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.05)  # (EMFILE would be ready again at once)
                continue
            try:
                await loop.connect_accepted_socket(self._protocol, conn)
            except OSError:  # (it left before its transport was made)
                conn.close()

    def closed(self) -> None:
        self._room.set()

    def close(self) -> None:
        """Stop accepting (uvicorn's shutdown calls this, as for asyncio's servers)."""
        self._task.cancel()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _quiet_server_class(limit: int, silent: _Silent, on_closed: list[Callable[[], None]]) -> type:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn, minus its own signal handling (ours stops the engine and the API
        together), accepting through :class:`_Acceptor`."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            assert sockets is not None and len(sockets) == 1  # (serve always hands its one socket)
            await self.lifespan.startup()
            config = self.config

            def protocol() -> asyncio.Protocol:
                return config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=self.server_state, app_state=self.lifespan.state
                )

            open_now = self.server_state.connections.__len__
            acceptor = _Acceptor(sockets[0], protocol, limit, open_now, silent)
            on_closed.append(acceptor.closed)
            self.servers = [acceptor]  # type: ignore[list-item]
            self.started = True

    return QuietServer


def _bounded_protocol(
    seconds: float, max_connections: int, silent: _Silent, on_closed: Sequence[Callable[[], None]]
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on each request head, a bound on the pieces
    a request body may arrive in, and its refusals in JSON.

    uvicorn bounds an idle keep-alive connection, but not one that has started a request
    and stalls in its headers: such a client could hold a connection forever. The deadline
    runs from the connection (and from the end of each response) until a complete head
    has arrived; past it the connection is closed.

    h11 parses each piece of a body (an HTTP chunk, a network read) on the engine's loop,
    whether a route reads the body or not: 65,000 chunks of one byte cost it 0.4 s. Past
    :data:`MAX_BODY_PIECES` pieces averaging under :data:`MIN_PIECE_BYTES` on a connection
    (each request's first piece not counted), the request is answered 400 and the
    connection closed, nothing more of it parsed.

    uvicorn answers a request past ``max_connections`` (503) and one it cannot parse (400)
    in text/plain, and logs a warning for each, and for each ``Upgrade`` header: here they
    are answered as every other error, and what anyone can send is logged at debug only."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedProtocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _pieces = 0
        _piece_bytes = 0
        _discarding = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            silent.since[self] = self.loop.time()
            self._arm_head_deadline()
            parse = self.conn.next_event

            def next_event() -> Any:
                event = parse()
                if isinstance(event, h11.Request):
                    # Counted over the connection, each request's first piece free: counted
                    # by request, a client pipelining requests of 1,000 one-byte chunks each
                    # never met the bound, and eight such connections made a 1-second
                    # schedule fire 0.4 s late.
                    self._pieces -= 1
                    # (the connections that have sent nothing are not counted: they cost
                    # nothing, and give their place to new ones at the bound of open ones)
                    speaking = len(self.connections) - len(silent.since)
                    if speaking >= max_connections or len(self.tasks) >= max_connections:
                        limit = f"the server is at its limit of {max_connections} open connections; try again shortly"
                        self._refuse(503, "unavailable", limit)
                        return h11.PAUSED
                    return _origin_form(event)
                elif isinstance(event, h11.Data):
                    self._pieces += 1
                    self._piece_bytes += len(event.data)
                    if self._pieces >= max(MAX_BODY_PIECES, self._piece_bytes // MIN_PIECE_BYTES):
                        self._refuse(
                            400,
                            "too_many_pieces",
                            f"the request body arrived in more than {MAX_BODY_PIECES} pieces (HTTP chunks or network "
                            f"reads) of under {MIN_PIECE_BYTES} bytes on average; send it in fewer",
                        )
                        return h11.PAUSED  # uvicorn stops reading and parsing
                return event

            self.conn.next_event = next_event  # type: ignore[method-assign]

        def connection_lost(self, exc: Exception | None) -> None:
            silent.since.pop(self, None)
            self._cancel_head_deadline()
            super().connection_lost(exc)
            for closed in on_closed:
                closed()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a complete head arrived: its request is under way
                self._cancel_head_deadline()

        def on_response_complete(self) -> None:
            self._arm_head_deadline()  # before: a pipelined head handled below cancels it
            super().on_response_complete()

        def _arm_head_deadline(self) -> None:
            self._cancel_head_deadline()
            self._head_deadline = self.loop.call_later(seconds, self._head_too_slow)

        def _cancel_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if not self.transport.is_closing():
                log.debug("closing a connection that sent no complete request head within %gs", seconds)
                self.transport.close()

        def _unsupported_upgrade_warning(self) -> None:
            log.debug("ignored the Upgrade header of a request (no WebSocket here)")

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 cannot parse, as JSON as every other."""
            self._refuse(400, "bad_request", "invalid HTTP request (a malformed request line or header, or a bad body framing)")

        def _answer(self, status: int, code: str, message: str) -> None:
            """Answer ``{"error": {code, message}}`` and say the connection closes, unless
            the route has begun its own answer. The route, if still running, is told the
            client left; its answer is dropped."""
            if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                return
            cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None  # (else done)
            if cycle is not None and cycle.response_started:
                return
            if cycle is not None:
                cycle.response_started = cycle.response_complete = cycle.disconnected = True
                cycle.message_event.set()
            body = json.dumps({"error": {"code": code, "message": message}}).encode()
            headers = [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")]
            try:
                for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event) or b"")
            except h11.LocalProtocolError:  # h11 will not answer in its state: the close says it
                pass

        def _refuse(self, status: int, code: str, message: str) -> None:
            """Answer the request under way with an error and close the connection."""
            self._answer(status, code, message)
            log.debug("refused a request (%s) and closing its connection", code)
            # Closed at once, with the body's rest unread, the socket would be reset and the
            # answer lost: read on, unparsed, for a moment, as the client sees the answer.
            self._discarding = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_soon(self.flow.resume_reading)  # (after uvicorn pauses it)
            self.loop.call_later(LINGER, self.transport.close)

        def data_received(self, data: bytes) -> None:
            silent.since.pop(self, None)
            if not self._discarding:
                super().data_received(data)

    return BoundedProtocol


_ABSOLUTE_FORM = re.compile(rb"https?://([^/?#]*)(.*)", re.IGNORECASE | re.DOTALL)


def _origin_form(request: Any) -> Any:
    """An h11 request whose target is in absolute form (``GET http://host:port/path``,
    which RFC 9112 section 3.2.2 says a server must accept) with its target as the path,
    and the target's authority as its Host (the Host header is ignored then); any other
    as it is."""
    import h11

    absolute = _ABSOLUTE_FORM.fullmatch(request.target)
    if absolute is None:
        return request
    authority, rest = absolute.groups()
    target = rest if rest.startswith(b"/") else b"/" + rest
    headers = [(name, value) for name, value in request.headers if name != b"host"] + [(b"host", authority)]
    try:
        return h11.Request(method=request.method, target=target, headers=headers, http_version=request.http_version)
    except h11.LocalProtocolError:  # (no authority): as sent, a 404
        return request


def freeze_startup_heap() -> None:
    """Everything loaded by now (modules, schedules, crons, the app) lives as long as the
    process: move it out of the garbage collector's sight, so that a full collection, when
    it lands in a burst of firings or a request, scans only what they allocate (a full pass
    over the startup heap took 7-20 ms and showed up as the worst second's lag)."""
    gc.collect()
    gc.freeze()


def bare_host(host: str) -> str:
    """An IPv6 address as a URL writes it (``[::1]``, as an operator copies it from one)
    without its brackets: what the socket and the checks take."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach."""
    host = bare_host(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_on(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket listening on ``host:port`` (0: any free port); :class:`ListenError` naming
    the address and the system's reason when it cannot be had (a taken port, an unknown host)."""
    host = bare_host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        # A name such as localhost may resolve to ::1 first: IPv4 is what clients try.
        family, kind, proto, _, address = sorted(infos, key=lambda info: info[0] != socket.AF_INET)[0]
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {_address(host, port)}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {_address(host, port)}: {exc.strerror or exc}") from None
    return sock


async def serve(
    backend: EmbeddedBackend,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    token: str | Sequence[str] | None = None,
    read_token: str | Sequence[str] | None = None,
    stop: asyncio.Event | None = None,
    head_timeout: float = HEAD_TIMEOUT,
    body_timeout: float | None = None,
    max_connections: int = MAX_CONNECTIONS,
    on_ready: Callable[[str], None] | None = None,
    metrics: EngineMetrics | None = None,
) -> None:
    """Start the backend's engine (firing on its timers) and run until ``stop`` is set or
    the process is signalled. ``port=None``: no HTTP API. ``on_ready`` gets the API's URL
    once it accepts requests. ``metrics``: what ``GET /metrics`` answers (by default the
    engine's, made here)."""
    host = bare_host(host)
    if port is not None and not (token or read_token) and not is_loopback(host):
        raise BadInput(
            f"refusing to listen on {host} without a token: anyone who can reach it could run your "
            "schedules (set --token/--read-token or SCHEDTUI_TOKEN, or listen on 127.0.0.1)",
            field="host",
        )
    app: Any = None
    sock: socket.socket | None = None
    if port is not None:
        from backend.api.app import BODY_TIMEOUT, create_app
        from backend.observability.metrics import EngineMetrics

        # Both before the engine starts: bad tokens and a taken port fire nothing, and the
        # metrics count every run.
        app = create_app(
            backend, token=token, read_token=read_token, body_timeout=body_timeout or BODY_TIMEOUT,
            metrics=metrics or EngineMetrics(backend.engine), host=host,
        )  # fmt: skip
        sock = listen_on(host, port)
    try:
        await _serve(backend, app, sock, host, stop or asyncio.Event(), head_timeout, max_connections, on_ready,
                     token_required=bool(token or read_token))  # fmt: skip
    finally:
        if sock is not None:
            sock.close()


async def _serve(
    backend: EmbeddedBackend,
    app: Any,
    sock: socket.socket | None,
    host: str,
    stop: asyncio.Event,
    head_timeout: float,
    max_connections: int,
    on_ready: Callable[[str], None] | None,
    *,
    token_required: bool,
) -> None:
    def on_stop(sig: int) -> None:
        log.info("stopping (%s): runs in flight may finish (signal again to stop waiting)", why(sig))
        stop.set()

    on_stop_signals(on_stop, backend.interrupt)
    backend.arm = True
    # A stop during the start (waiting for another instance's migration, a slow catch-up)
    # ends it: it was ignored, twice too, until the start ended (`docker stop` then killed it).
    connecting = asyncio.ensure_future(backend.connect())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting  # (a start cancelled undoes what it took: see Engine.start)
        log.info("stopped during start-up: nothing was fired")
        return
    connecting.result()
    freeze_startup_heap()
    server: Any = None
    server_task: asyncio.Task[None] | None = None
    if sock is not None:
        import uvicorn

        on_closed: list[Callable[[], None]] = []
        silent = _Silent()
        config = uvicorn.Config(
            app,
            http=_bounded_protocol(head_timeout, max_connections, silent, on_closed),
            ws="none",  # (with `websockets` installed, uvicorn took Upgrade requests for its own)
            log_level="warning",
            log_config=None,  # uvicorn's lines go through the process's logging (redacted)
            access_log=False,
            lifespan="off",
            timeout_keep_alive=KEEP_ALIVE,
            # A client that never reads its answer must not hold a stop (and the firing
            # that goes on until the API has stopped): past this, its request is cut.
            timeout_graceful_shutdown=STOP_WITHIN,
            limit_concurrency=None,  # (the protocol's: uvicorn's answers in text/plain and logs each)
        )
        server = _quiet_server_class(2 * max_connections, silent, on_closed)(config)
        server_task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not server_task.done():
            await asyncio.sleep(0.01)  # uvicorn offers no start event
        if server_task.done():
            await backend.close(grace=0)
            try:
                server_task.result()
            except BaseException as exc:  # uvicorn ends a failed start with sys.exit()
                raise ListenError(f"the API could not start on {_address(host, sock.getsockname()[1])}: {exc!r}") from None
            raise ListenError(f"the API stopped as it started on {_address(host, sock.getsockname()[1])}")
        bound = sock.getsockname()
        url = f"http://{_address(bound[0], bound[1])}"
        log.info("API listening on %s (%s)", url, "token required" if token_required else "no token: loopback only")
        try:
            print(f"schedtui: serving {url}", flush=True)
        except (OSError, ValueError) as exc:  # (ValueError: a stream closed)
            # A stdout that refuses the line (a log file on a full disk, a reader gone) loses
            # it, never the server: serve died at start. (A logging handler never raises.)
            log.warning("could not write `schedtui: serving %s` to stdout (%s: %s); serving on", url,
                        type(exc).__name__, exc)  # fmt: skip
        if on_ready is not None:
            on_ready(url)
    # A store file deleted while serving: stop, and exit 1 saying so.
    lost = asyncio.ensure_future(until_lost(backend.engine.store))
    lost.add_done_callback(lambda _: stop.set())
    await stop.wait()
    if server is not None and server_task is not None:
        app.state.api.closing.set()  # end the event streams: uvicorn waits for every response
        server.should_exit = True
        await server_task
    await backend.close()
    if not lost.done():
        lost.cancel()
    elif not lost.cancelled() and lost.exception() is None:
        raise store_lost(backend.engine.store.where, "restore it, or start again to create a new one")
    left = backend.engine.store.health()  # after close: what it could not write
    if left.waiting:
        # Not a clean stop: a supervisor and an operator must hear of it (a full disk).
        raise Unavailable(
            f'stopped with {left.waiting} run(s) not written to the ledger of "{backend.engine.store.where}": {left.error} '
            "(the log says where each run is kept)"
        )
