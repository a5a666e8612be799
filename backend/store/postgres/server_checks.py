"""What the store asks of the PostgreSQL server it opens, and says when it is not so: a
UTF8 database, commits made durable before they are answered, and, behind a transaction
pooler (where the store can set nothing per session), read committed sessions and the
server's own timeouts. Each runs once, on the first connection of an open."""

from __future__ import annotations

import logging
from typing import Any

from psycopg import AsyncConnection

from backend.store import store_unavailable
from backend.store.postgres.pooler import SEE
from backend.store.postgres.sql import ISOLATION, POOLED_TIMEOUTS, SERVER_ENCODING, SYNCHRONOUS_COMMIT

__all__ = ["check_encoding", "check_pooled_isolation", "check_pooled_timeouts", "check_synchronous_commit"]

log = logging.getLogger("schedtui.store")


async def check_pooled_timeouts(conn: AsyncConnection[Any], where: str) -> None:
    """Behind a transaction pooler the store sets no timeout of its own (a ``SET``
    would stay on the server connection for the pooler's next client): say so when the
    server's, for this role and database, are none."""
    row = await (await conn.execute(POOLED_TIMEOUTS)).fetchone()
    names = ("statement_timeout", "idle_in_transaction_session_timeout")
    unset = [name for name, value in zip(names, row or (), strict=False) if value == "0"]
    lock_timeout = row[2] if row and len(row) > 2 else "0"
    if lock_timeout != "0":
        log.warning(
            'the store "%s" is behind a transaction pooler, where schedtui cannot lift the server\'s '
            "lock_timeout (%s for this role and database): its waits for its own locks fail past it (a start "
            "while another instance migrates the tables fails to open; a schedule's run that waits for its "
            "turn is recorded failed); lift it for schedtui's role: ALTER ROLE … SET lock_timeout = 0 (%s)",
            where, lock_timeout, SEE,
        )  # fmt: skip
    if unset:
        log.warning(
            'the store "%s" is behind a transaction pooler, where schedtui sets no timeout per connection, '
            "and the server's %s unlimited: a statement or transaction left hanging holds its locks; set them "
            "for schedtui's role, e.g. ALTER ROLE … SET statement_timeout = '30s'; ALTER ROLE … SET "
            "idle_in_transaction_session_timeout = '60s' (%s)",
            where, " and ".join(unset) + (" are" if len(unset) > 1 else " is"), SEE,
        )  # fmt: skip


async def check_encoding(conn: AsyncConnection[Any], where: str) -> None:
    """Refuse a database that is not UTF8: a LATIN1 one fails every write of a character
    it has no byte for (a handler's error, a payload, a note), and a SQL_ASCII one every
    statement with text, each as a driver error in the middle of the work; better once,
    at start, saying what to do."""
    row = await (await conn.execute(SERVER_ENCODING)).fetchone()
    encoding = row[0] if row else "UTF8"
    if isinstance(encoding, bytes):  # (a SQL_ASCII database's text comes back undecoded)
        encoding = encoding.decode("ascii", "replace")
    if encoding != "UTF8":
        raise store_unavailable(
            where,
            "cannot use {store} as given",
            f"its database's encoding is {encoding}, and schedtui's text (names, payloads, a handler's errors "
            "and logs) is Unicode: create the database with ENCODING 'UTF8' (CREATE DATABASE … TEMPLATE "
            "template0 ENCODING 'UTF8')",
            f"the database's encoding is {encoding} (UTF8 is needed)",
        )


async def check_pooled_isolation(conn: AsyncConnection[Any], where: str) -> None:
    """Behind a transaction pooler the store cannot make its sessions ``read committed``
    (see CONFIGURE): refuse a server whose sessions default to anything else, rather
    than fire, claim and fence under a snapshot that misses the commits they wait for."""
    row = await (await conn.execute(ISOLATION)).fetchone()
    level = row[0] if row else "read committed"
    if level != "read committed":
        raise store_unavailable(
            where,
            "cannot use {store} as given",
            f"its sessions default to {level} isolation (default_transaction_isolation), and behind a "
            "transaction pooler schedtui cannot set read committed for its own: its claims, fences and locks "
            "need it; set it for schedtui's role: ALTER ROLE … SET default_transaction_isolation = "
            f"'read committed' ({SEE})",
            f"the server's sessions default to {level} isolation (read committed is needed)",
        )


async def check_synchronous_commit(conn: AsyncConnection[Any], where: str, *, pooled: bool) -> None:
    """Warn when the server's sessions of this role and database do not make a commit
    durable before answering it (see CONFIGURE): the store turns it back on for its
    own connections, but not behind a transaction pooler, where it cannot."""
    row = await (await conn.execute(SYNCHRONOUS_COMMIT)).fetchone()
    if not row or row[0] != "off":
        return
    if pooled:
        log.warning(
            'the store "%s" has synchronous_commit = off for this role or database, and behind a transaction '
            "pooler schedtui cannot turn it on for its own sessions: a server crash can lose commits it already "
            "acknowledged, and with them the claims, checkpoints and lock tokens that keep work from running "
            "twice; set it for schedtui's role: ALTER ROLE … SET synchronous_commit = on (%s)",
            where, SEE,
        )  # fmt: skip
    else:
        log.warning(
            'the store "%s" has synchronous_commit = off for this role or database: schedtui turns it on for '
            "its own connections (a commit lost in a server crash after it was acknowledged could run work "
            "twice); other clients of the database keep it off",
            where,
        )

