"""A throwaway PostgreSQL server for the test suite and the fleet benchmark.

:func:`provide` returns a :class:`PgServer`: the server named by ``$SCHEDTUI_TEST_DSN``
when that is set, otherwise a new cluster started from the machine's own binaries
(``initdb``/``pg_ctl`` on the PATH, or the newest ``/usr/lib/postgresql/*/bin``) in a
temporary folder, listening on a free loopback port with trust authentication. initdb
refuses to run as root, so as root the cluster belongs to an unprivileged user
(``postgres`` if it exists, else ``nobody``) and its commands run through ``runuser``.

Each test gets a database of its own (``CREATE DATABASE``, a copy of ``template0`` or of a
database migrated once for the session: a few tens of milliseconds), so one cluster
serves the whole session.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

#: Runs beside a cluster this process started, and stops it (and removes its folder) if this
#: process dies without doing so: a test run killed by a timeout leaks no server.
_WATCHDOG = """
import os, shutil, subprocess, sys, time
parent, base, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
while os.path.isdir(base):
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        subprocess.run(stop, capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
        break
    except PermissionError:
        pass
    time.sleep(1)
"""

DSN_ENV = "SCHEDTUI_TEST_DSN"
REQUIRE_ENV = "SCHEDTUI_REQUIRE_POSTGRES"
SUPERUSER = "schedtui"


class NoPostgres(Exception):
    """No server can be had here (no binaries, or they fail); the message says why."""


def required() -> bool:
    """CI sets this: a missing PostgreSQL then fails the PostgreSQL tests instead of skipping them."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def find_bindir() -> Path | None:
    """The folder holding initdb and pg_ctl: from the PATH, else the newest packaged one."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(os.path.realpath(initdb)).parent
    candidates = []
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin", "/opt/homebrew/opt/postgresql*/bin"):
        for folder in Path("/").glob(pattern.lstrip("/")):
            if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
                version = re.findall(r"\d+", str(folder))
                candidates.append((int(version[0]) if version else 0, folder))
    return max(candidates)[1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """A server the tests may create databases on; ``owned`` when this process started it."""

    dsn: str
    """Connection string of the maintenance database (where CREATE DATABASE runs)."""
    owned: bool = False
    bindir: Path | None = None
    base: Path | None = None
    port: int = 0
    user: str | None = None
    """The unprivileged account that owns the cluster (when started as root)."""
    options: str = ""
    watchdog: subprocess.Popen[bytes] | None = None
    created: list[str] = field(default_factory=list)
    _counter: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _template: str | None = None
    _template_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- databases ---------------------------------------------------------------------
    def url(self, dbname: str) -> str:
        """A URL for one database of this server."""
        if self.owned:
            return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"
        params = {k: str(v) for k, v in conninfo_to_dict(self.dsn).items() if v is not None}
        params["dbname"] = dbname
        return "postgresql://?" + urlencode(params)  # libpq takes every parameter in the query

    def create_database(self, prefix: str = "t", *, migrated: bool = False) -> str:
        """A new database; returns its URL. Empty, or ``migrated``: a copy of a database
        whose store was opened once this session, so it holds every table at its latest
        version and a store opens on it without running a migration (that costs half a
        second a database, most of a short test's time). A test of the migrations, or of
        processes meeting on an empty database, asks for an empty one."""
        template = self._migrated_template() if migrated else "template0"
        with self._lock:
            self._counter += 1
            name = f"schedtui_{prefix}_{os.getpid()}_{self._counter}"
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        self.created.append(name)
        return self.url(name)

    def _migrated_template(self) -> str:
        with self._template_lock:
            if self._template is None:
                url = self.create_database("template")
                # On a thread: the caller may be inside a running event loop.
                worker = threading.Thread(target=lambda: asyncio.run(_open_once(url)))
                worker.start()
                worker.join()
                name = self.created[-1]
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    # Nobody may be connected to a template while it is copied: not even
                    # autovacuum, which leaves a database that takes no connections alone.
                    conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                self._template = name
            return self._template

    def drop_created(self) -> None:
        if not self.created:
            return
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()

    # -- the cluster (only when owned) ----------------------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if self.user is None:
            return list(args)
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", self.user, "--", *args]
        return ["su", self.user, "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in args)]

    def pg_ctl(self, action: str, *extra: str, timeout: float = 60) -> None:
        """``pg_ctl start|stop|restart`` on the cluster this process started."""
        assert self.owned and self.bindir is not None and self.base is not None, "not our cluster"
        args = [str(self.bindir / "pg_ctl"), "-D", str(self.base / "data"), "-w", "-t", "30", *extra]
        if action in ("start", "restart"):
            args += ["-l", str(self.base / "server.log"), "-o", self.options]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        done = subprocess.run(self._cmd(*args, action), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise NoPostgres(f"pg_ctl {action} failed: {done.stderr.strip() or done.stdout.strip()}")

    def stop(self) -> None:
        if self.owned and self.base is not None:
            try:
                self.pg_ctl("stop")
            except (NoPostgres, subprocess.TimeoutExpired):
                pass
            if self.watchdog is not None and self.watchdog.poll() is None:
                # The folder holds every database the session made: deleting a few hundred
                # took 10-15 s, the last thing each test worker did. The watchdog deletes it
                # once this process has exited.
                return
            shutil.rmtree(self.base, ignore_errors=True)
        else:
            try:
                self.drop_created()
            except psycopg.Error:
                pass


def start_cluster(*, durable: bool = False, max_connections: int = 300, settings: Sequence[str] = ()) -> PgServer:
    """initdb + pg_ctl start in a new temporary folder; returns once it accepts connections.

    ``durable=False`` (the tests) turns fsync off; the benchmark keeps the defaults.
    ``synchronous_commit`` stays on in both: the store turns it on for its own sessions
    anyway (and says so), and with fsync off a commit's flush costs no disk wait.
    ``settings``: more ``name=value`` server settings (the benchmark's statistics)."""
    bindir = find_bindir()
    if bindir is None:
        raise NoPostgres("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    user = None
    if os.geteuid() == 0:
        for candidate in ("postgres", "nobody"):
            try:
                pwd.getpwnam(candidate)
            except KeyError:
                continue
            user = candidate
            break
        if user is None:
            raise NoPostgres("running as root and no unprivileged user (postgres, nobody) to own the cluster")
    base = Path(tempfile.mkdtemp(prefix="schedtui-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(base, entry.pw_uid, entry.pw_gid)
    port = _free_port()
    base_settings = [
        "listen_addresses=127.0.0.1",
        f"port={port}",
        f"unix_socket_directories={base}",
        f"max_connections={max_connections}",
        "log_min_messages=warning",
    ]
    if not durable:
        base_settings += ["fsync=off", "full_page_writes=off"]
    base_settings += settings
    server = PgServer(
        dsn=f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres",
        owned=True,
        bindir=bindir,
        base=base,
        port=port,
        user=user,
        options=" ".join(f"-c {s}" for s in base_settings),
    )
    init = subprocess.run(
        server._cmd(
            str(bindir / "initdb"), "-D", str(base / "data"), "-U", SUPERUSER, "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    if init.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        raise NoPostgres(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
    try:
        server.pg_ctl("start")
    except NoPostgres:
        log = (base / "server.log").read_text() if (base / "server.log").exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise NoPostgres(f"the throwaway PostgreSQL did not start:\n{log}") from None
    wait_ready(server.dsn, timeout=30)
    stop = server._cmd(str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop")
    server.watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(base), *stop],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives a kill of this process group
    )  # fmt: skip
    return server


def die_with_parent() -> None:
    """``preexec_fn`` for children the tests start (serve processes): on Linux, the kernel
    kills them when the test process dies, whatever killed it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_ready(dsn: str, timeout: float) -> None:
    """Poll until the server accepts a connection (pg_ctl -w already waited; this is a guard)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def provide() -> PgServer:
    """The server for this session: ``$SCHEDTUI_TEST_DSN``, or a throwaway cluster."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        try:
            wait_ready(dsn, timeout=10)
        except psycopg.Error as exc:
            raise NoPostgres(f"{DSN_ENV} is set but the server does not answer: {exc}") from None
        return PgServer(dsn=dsn)
    return start_cluster()


async def _open_once(url: str) -> None:
    """Open a store on ``url`` and close it: every component's tables migrated."""
    from backend import connect

    async with connect(url):
        pass


#: The session's server, once a test asked for one (set by the ``pg_server`` fixture).
ACTIVE: PgServer | None = None
_BY_FOLDER: dict[Path, str] = {}


def database_for(folder: Path) -> str:
    """The URL of the database that belongs to a test's folder (created at first use), so a
    store factory called twice with one ``tmp_path`` reaches one database."""
    assert ACTIVE is not None, "the pg_server fixture was not requested"
    if folder not in _BY_FOLDER:
        _BY_FOLDER[folder] = ACTIVE.create_database(migrated=True)
    return _BY_FOLDER[folder]
