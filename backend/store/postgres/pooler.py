"""The PostgreSQL store behind a connection pooler (PgBouncer and the like).

In **transaction** pooling mode a client's server connection is lent to it for one
transaction only: what a session remembers does not stay with the client. A ``SET`` lands
on whichever server connection ran it (and stays there for the next client), a ``LISTEN``
listens on a connection the client no longer has, and a named prepared statement is
missing, or worse, another client's statement of the same name, on the next one. The
store is told by its URL (schedtui reads these parameters and takes them out before libpq
sees the rest):

* ``pooler=transaction``: no server-side prepared statements (psycopg's automatic ones
  off, the connections kept for hot paths not used), no per-session timeouts set (they
  would leak to the pooler's other clients: the role's or the database's own settings
  apply, and the store says at open when they are unlimited), no ``LISTEN`` on the pooled
  URL (the other instances' changes are polled, the backstop every loop already has).
  ``pooler=session`` changes nothing (a session pooler keeps sessions whole); it only says so.
* ``listen_host=…``/``listen_port=…``: where the listening connection goes instead of the
  URL's host and port (the server itself, past the pooler): changes are heard at once again.

Without ``pooler=transaction`` the store checks at open whether two of its connections
were served by one server session (only a pooler lends one backend to two live
connections) and refuses to open if so, naming the parameter. A pooler that happens to
use a fresh server connection for each is not caught by this (nothing is claimed then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

from psycopg import AsyncConnection

from backend.errors import BadInput

__all__ = ["PoolerSettings", "detect_sharing", "split_url"]

PoolerMode = Literal["none", "session", "transaction"]

POOLER = "pooler"
LISTEN_HOST = "listen_host"
LISTEN_PORT = "listen_port"
_OURS = (POOLER, LISTEN_HOST, LISTEN_PORT)
_MODES: tuple[PoolerMode, ...] = ("session", "transaction")

#: The README section the messages point to.
SEE = 'see "Behind PgBouncer" in the README'


@dataclass(frozen=True)
class PoolerSettings:
    """What the store URL says of a pooler in front of the server (see the module)."""

    mode: PoolerMode = "none"
    listen_host: str | None = None
    listen_port: int | None = None

    @property
    def transaction(self) -> bool:
        return self.mode == "transaction"

    @property
    def listens_directly(self) -> bool:
        return self.listen_host is not None or self.listen_port is not None


def split_url(url: str, shown: str) -> tuple[str, PoolerSettings]:
    """``url`` without schedtui's own query parameters (each taken out as written: the
    others reach libpq byte for byte), and what they say. ``shown``: the URL as messages
    may quote it. A bad value is :class:`~backend.errors.BadInput` naming it."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, PoolerSettings()
    query, hash_, fragment = query.partition("#")
    kept: list[str] = []
    found: dict[str, str] = {}
    for piece in query.split("&"):
        key, _, value = piece.partition("=")
        if unquote(key) in _OURS:
            found[unquote(key)] = unquote(value)
        else:
            kept.append(piece)
    if not found:
        return url, PoolerSettings()
    mode: PoolerMode = "none"
    if POOLER in found:
        value = found[POOLER]
        if value not in _MODES:
            raise BadInput(f'bad store URL "{shown}": pooler={value!r} is not a pooling mode (use pooler=transaction or pooler=session)')
        mode = "transaction" if value == "transaction" else "session"
    host = found.get(LISTEN_HOST)
    if host is not None and not host:
        raise BadInput(f'bad store URL "{shown}": listen_host is empty (name the server to listen on, past the pooler)')
    port: int | None = None
    if LISTEN_PORT in found:
        text = found[LISTEN_PORT]
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise BadInput(f'bad store URL "{shown}": listen_port={text!r} is not a port number (1-65535)')
        port = int(text)
    rest = "&".join(kept)
    return base + ("?" + rest if rest else "") + hash_ + fragment, PoolerSettings(mode, host, port)


#: A server session's identity: its process, and its server's start (two servers of a
#: multi-host URL may each have a process of that number).
BACKEND_PID = "SELECT pg_backend_pid(), pg_postmaster_start_time()"


async def detect_sharing(first: AsyncConnection[Any], second: AsyncConnection[Any], rounds: int = 3) -> int | None:
    """A server process that served both of two open connections, if one did: proof of a
    pooler lending sessions per transaction (or per statement), since two live sessions of
    a server never share a backend, and each keeps its own for life. ``None`` proves
    nothing (a pooler may have served them from different ones). A statement on each in
    turn, ``rounds`` times: the server connection one just used is idle when the other
    asks, the one a pooler hands out next (most reuse the most recently used first), and a
    server connection the pooler was still opening may be handed out once instead."""
    seen: tuple[set[tuple[int, Any]], set[tuple[int, Any]]] = (set(), set())
    for _ in range(rounds):
        for mine, other, conn in ((seen[0], seen[1], first), (seen[1], seen[0], second)):
            row = await (await conn.execute(BACKEND_PID)).fetchone()
            if row is None:
                return None
            session = (int(row[0]), row[1])
            if session in other:
                return session[0]
            mine.add(session)
    return None
