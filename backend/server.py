"""``schedtui serve``: the engine and, when asked for, its HTTP API in one process.

The engine and uvicorn share one event loop. SIGINT/SIGTERM stops the API, then the
engine (which lets runs in flight finish); a second signal stops waiting for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

from .engine import Engine
from .errors import BadInput, Unavailable
from .store import until_lost

__all__ = ["freeze_startup_heap", "is_loopback", "serve"]

log = logging.getLogger("schedtui.server")


def _quiet_server_class() -> type:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn, minus its own signal handling: ours stops the engine and the API together."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


def freeze_startup_heap() -> None:
    """Everything loaded by now (modules, schedules, crons, the app) lives as long as the
    process: move it out of the garbage collector's sight, so that a full collection, when
    it lands in a burst of firings or a request, scans only what they allocate (a full pass
    over the startup heap took 7-20 ms and showed up as the worst second's lag)."""
    gc.collect()
    gc.freeze()


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


async def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    token: str | None = None,
    read_token: str | None = None,
    allow_external_self: bool = False,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until ``stop`` is set or the process is signalled. ``port=None``: no HTTP API."""
    if port is not None and not (token or read_token) and not is_loopback(host):
        raise BadInput(
            f"refusing to listen on {host} without a token: anyone who can reach it could run your "
            "schedules (set --token/--read-token or SCHEDTUI_TOKEN, or listen on 127.0.0.1)",
            field="host",
        )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping: runs in flight may finish (signal again to stop waiting)")
            stop.set()
        else:
            engine.interrupt()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # not the main thread: the caller stops us
            pass

    await engine.start()
    freeze_startup_heap()
    server: Any = None
    server_task: asyncio.Task[None] | None = None
    if port is not None:
        import uvicorn

        from .api import create_app

        app = create_app(engine, token=token, read_token=read_token, allow_external_self=allow_external_self)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        server = _quiet_server_class()(config)
        server_task = asyncio.ensure_future(server.serve())
        while not server.started and not server_task.done():
            await asyncio.sleep(0.01)  # uvicorn offers no start event
        if server_task.done():
            await engine.stop(grace=0)
            server_task.result()
            raise BadInput(f"could not listen on {host}:{port}", field="port")
        bound = server.servers[0].sockets[0].getsockname() if server.servers else (host, port)
        log.info(
            "API listening on http://%s:%s (%s)",
            bound[0],
            bound[1],
            "token required" if token or read_token else "no token: loopback only",
        )
        print(f"schedtui: serving http://{bound[0]}:{bound[1]}", flush=True)
    # [stores] A store file deleted while serving: stop, and exit 1 saying so.
    lost = asyncio.ensure_future(until_lost(engine.store))
    lost.add_done_callback(lambda _: stop.set())
    await stop.wait()
    if server is not None and server_task is not None:
        server.should_exit = True
        await server_task
    await engine.stop()
    if not lost.done():
        lost.cancel()
    elif not lost.cancelled() and lost.exception() is None:
        raise Unavailable(
            f'stopped: the store "{engine.store.where}" was deleted or replaced while in use, so nothing written '
            "since would survive (the runs not written are in the log); restore it, or start again to create a new one"
        )
