"""A TCP relay on loopback that a test can freeze: a network partition of one process.

Everything a client sends goes through to the target and back, until :meth:`freeze`:
then nothing moves either way (connections stay open, bytes wait in the kernel, new
connections are accepted and go nowhere), as when a network path goes silent. After
:meth:`thaw` what waited goes through. Threads, so that it works whatever the test's
event loop does.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

__all__ = ["FreezableRelay", "relay_to", "via"]


class FreezableRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="relay accept", daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> FreezableRelay:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._flowing.wait()  # a frozen path: the client's connect succeeds, then silence
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="relay pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            self._flowing.wait()
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            self._flowing.wait()  # frozen while this chunk was read: it waits with the rest
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay_to(url: str) -> FreezableRelay:
    """A relay to the server of ``url`` (see :func:`via`)."""
    params = conninfo_to_dict(url)
    return FreezableRelay(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))


def via(url: str, port: int) -> str:
    """The same database, reached through a relay listening on ``port``. A URL that names
    its server in the query (``postgresql://?host=…&port=…``, as ``$SCHEDTUI_TEST_DSN``'s
    databases are named) loses those parameters: libpq would prefer them to the relay."""
    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "hostaddr", "port")])
    netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))
