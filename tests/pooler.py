"""A throwaway PgBouncer in front of the suite's PostgreSQL server (see :mod:`tests.pg`).

:func:`start` runs the machine's ``pgbouncer`` in a temporary folder of its own (its ini,
its user list, its log), listening on a free loopback port, every database of the server
behind it, in **transaction** pooling mode with a small pool per database and user: a
client's server connection is handed to another client as soon as its transaction ends,
so what a session remembers (a ``SET``, a ``LISTEN``, a named prepared statement) is lost
or leaks, as behind a production pooler. PgBouncer refuses to run as root, so as root it
runs as the unprivileged account :mod:`tests.pg` gives the cluster.

Without ``pgbouncer`` on the machine the tests that need it are skipped, unless
``$SCHEDTUI_REQUIRE_POSTGRES`` is set (CI, which installs it), where they fail.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests import pg

#: Server connections per (database, user): fewer than a store's pool holds, so clients
#: really do take turns on them.
POOL_SIZE = 2


class NoPooler(Exception):
    """No PgBouncer can be had here; the message says why."""


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    for candidate in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _unprivileged() -> pwd.struct_passwd | None:
    """The account to run as (``None``: this one), as :mod:`tests.pg` picks it for initdb."""
    if os.geteuid() != 0:
        return None
    for candidate in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(candidate)
        except KeyError:
            continue
    raise NoPooler("running as root and no unprivileged user (postgres, nobody) to run pgbouncer as")


@dataclass
class Pooler:
    """A running PgBouncer in front of ``server``; :meth:`url` names a database through it."""

    server: pg.PgServer
    process: subprocess.Popen[bytes]
    base: Path
    port: int

    def url(self, direct_url: str) -> str:
        """``direct_url`` (a database of the server) with the pooler's host and port instead."""
        parts = urlsplit(direct_url)
        if parts.hostname:  # postgresql://user@host:port/db
            user = f"{parts.username}@" if parts.username else ""
            return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))
        # postgresql://?host=…&port=…&dbname=… (tests.pg's form for a server it did not start)
        params = {k: str(v) for k, v in conninfo_to_dict(direct_url).items() if v is not None}
        params.update(host="127.0.0.1", port=str(self.port))
        return "postgresql://?" + "&".join(f"{k}={v}" for k, v in params.items())

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.base, ignore_errors=True)


def start(server: pg.PgServer, *, pool_mode: str = "transaction", pool_size: int = POOL_SIZE) -> Pooler:
    """Start PgBouncer in front of ``server``; returns once it accepts connections."""
    binary = find_pgbouncer()
    if binary is None:
        raise NoPooler("no pgbouncer binary on this machine (Debian: apt-get install pgbouncer)")
    target = conninfo_to_dict(server.dsn)
    host, port = str(target.get("host") or "127.0.0.1"), str(target.get("port") or "5432")
    user = str(target.get("user") or pg.SUPERUSER)
    account = _unprivileged()
    base = Path(tempfile.mkdtemp(prefix="schedtui-pgbouncer-"))
    listen = pg._free_port()
    (base / "userlist.txt").write_text(f'"{user}" ""\n')
    (base / "pgbouncer.ini").write_text(
        "\n".join([
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {listen}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {base / 'userlist.txt'}",
            f"pool_mode = {pool_mode}",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 500",
            f"logfile = {base / 'pgbouncer.log'}",
            f"pidfile = {base / 'pgbouncer.pid'}",
            "log_connections = 0",
            "log_disconnections = 0",
            "",
        ])
    )  # fmt: skip
    if account is not None:
        for path in (base, base / "userlist.txt", base / "pgbouncer.ini"):
            os.chown(path, account.pw_uid, account.pw_gid)
    process = subprocess.Popen(
        [binary, str(base / "pgbouncer.ini")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(base / "stderr.log").open("wb"),
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        extra_groups=[] if account else None,
        preexec_fn=pg.die_with_parent,  # no pgbouncer outlives the test process
    )
    pooler = Pooler(server, process, base, listen)
    probe = pooler.url(server.dsn)
    deadline = time.monotonic() + 15
    while True:
        try:
            with psycopg.connect(probe, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return pooler
        except psycopg.OperationalError as exc:
            if process.poll() is not None or time.monotonic() > deadline:
                why = (base / "stderr.log").read_text(errors="replace") + pooler.log()
                pooler.stop()
                raise NoPooler(f"pgbouncer did not start ({exc}):\n{why}") from None
            time.sleep(0.05)


def started(server: pg.PgServer, *, pool_mode: str = "transaction", pool_size: int = POOL_SIZE) -> Pooler:
    """:func:`start`, for a fixture: without pgbouncer on the machine the test is skipped,
    unless $SCHEDTUI_REQUIRE_POSTGRES is set (CI): then it fails."""
    import pytest

    try:
        return start(server, pool_mode=pool_mode, pool_size=pool_size)
    except NoPooler as exc:
        if pg.required():
            pytest.fail(f"PgBouncer is required here ({pg.REQUIRE_ENV}) but: {exc}", pytrace=False)
        pytest.skip(f"no PgBouncer: {exc}")
