"""A TCP relay on loopback that a test can freeze: a network partition of one process.

Everything a client sends goes through to the target and back, until :meth:`freeze`:
then nothing moves either way (connections stay open, bytes wait in the kernel, new
connections are accepted and go nowhere), as when a network path goes silent. After
:meth:`thaw` what waited goes through. It can also lose one answer (:meth:`lose_reply`):
the server got the statement and committed, the client never hears back. Threads, so
that it works whatever the test's event loop does.
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
        self._losing: bytes | None = None
        self._freeze_on_loss = False
        self.lost = threading.Event()
        """Set once the reply :meth:`lose_reply` waited for was lost."""
        threading.Thread(target=self._accept, name="relay accept", daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def lose_reply(self, marker: bytes, *, freeze: bool = False) -> None:
        """The next data the server sends that holds ``marker`` is dropped, and its
        connection closed both ways: a transaction answered at its commit (a pipeline's,
        at its Sync) committed, and the client never hears of it. With ``freeze``, the
        relay freezes at that moment, until :meth:`thaw` (a network blip: what the client
        sends next, on a new connection too, waits with the rest)."""
        self.lost.clear()
        self._freeze_on_loss = freeze
        self._losing = marker

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
            for src, dst, replies in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, replies), name="relay pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        while True:
            self._flowing.wait()
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if replies and self._losing is not None and self._lose(data):
                break  # (dropped: both ends are closed below)
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

    def _lose(self, data: bytes) -> bool:
        """Whether ``data`` is the reply to lose (then no other one is)."""
        with self._lock:
            if self._losing is None or self._losing not in data:
                return False
            self._losing = None
            if self._freeze_on_loss:
                self.freeze()
        self.lost.set()
        return True


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
