"""Shared fixtures: a manual clock, a temporary SQLite store, engines built from them, and
a PostgreSQL server for the tests marked ``postgres`` (see :mod:`tests.pg`)."""

from __future__ import annotations

import asyncio
import compileall
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import textual._wait

from backend import Engine, ManualClock, Run, Schedule
from tests import pg, pooler
from tests.file_seconds import FILE_SECONDS

pytest_plugins = ["tests.timeouts"]  # each test's time limit

# Pilot.pause() waits for the app to go idle: it sleeps in steps of 20 ms until one passes
# with under 5% of it on the CPU, so every pause costs 20 ms at least. The console tests
# pause thousands of times, mostly once the app is idle already; steps of 5 ms (the same
# 5%) take a third off their time. What says the app is settled does not rest on that
# window alone: tests/console_scenes.settle also waits for the workers, refreshes and
# tables still to measure, and wants the app quiet twice in a row.
textual._wait.SLEEP_GRANULARITY = 0.005
textual._wait.SLEEP_IDLE = textual._wait.SLEEP_GRANULARITY / 20


def pytest_sessionstart(session: pytest.Session) -> None:
    """The processes the suite starts (``serve``, the command line: hundreds) import the
    package from its sources. Where ``PYTHONDONTWRITEBYTECODE`` is set, as on this project's
    CI machines, none of them writes the bytecode it compiles, so each compiled every
    module again: about 0.2 s of CPU a process. Compiled once here, as ``pip install``
    does for a package it installs (in the first process only: xdist's workers find it)."""
    if not hasattr(session.config, "workerinput"):
        root = Path(__file__).resolve().parent.parent
        for package in ("backend", "console", "tests"):
            compileall.compile_dir(root / package, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (see :mod:`tests.file_seconds`), each file's tests in their
    own order; the sort is stable, so every worker collects the same order."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.PgServer]:
    """One PostgreSQL server for the whole session, started at the first test that needs it.

    Without PostgreSQL on the machine the test is skipped, unless $SCHEDTUI_REQUIRE_POSTGRES
    is set (CI), where it fails."""
    try:
        server = pg.provide()
    except pg.NoPostgres as exc:
        if pg.required():
            pytest.fail(f"PostgreSQL is required here ({pg.REQUIRE_ENV}) but: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL: {exc}")
    pg.ACTIVE = server
    yield server
    pg.ACTIVE = None
    server.stop()


@pytest.fixture(scope="session")
def pg_pooler(pg_server: pg.PgServer) -> Iterator[pooler.Pooler]:
    """A PgBouncer in transaction mode in front of the session's server (see
    :mod:`tests.pooler`), started at the first test that needs it. Skipped without
    pgbouncer on the machine, unless $SCHEDTUI_REQUIRE_POSTGRES is set (CI): then it fails."""
    running = pooler.started(pg_server)
    yield running
    running.stop()


@pytest.fixture
def pg_url(pg_server: pg.PgServer) -> str:
    """The URL of a new database for this test, its tables already made (see
    :meth:`tests.pg.PgServer.create_database`)."""
    return pg_server.create_database(migrated=True)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock("2026-03-02T08:00:00Z")


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def make_engine(clock: ManualClock, store_url: str) -> AsyncIterator[Callable[..., Engine]]:
    """Build engines on the test clock and store; every one is stopped at the end."""
    engines: list[Engine] = []

    def make(schedules: list[Schedule], **kwargs: Any) -> Engine:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("instance", f"test-{len(engines)}")
        kwargs.setdefault("shutdown_grace", 0)
        engine = Engine(schedules, kwargs.pop("store", store_url), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop(grace=0)


def fail_once(owner: object, method: str, error: BaseException) -> None:
    """Make ``owner.method`` (a coroutine method) raise ``error`` at its next call only: a
    store that refuses one write (a full disk, a connection lost) and then answers again."""
    original = getattr(owner, method)

    async def failing(*args: object, **kwargs: object) -> None:
        setattr(owner, method, original)
        raise error

    setattr(owner, method, failing)


def expect(engine: Engine, predicate: Callable[[Run], bool], timeout: float = 10.0) -> Awaitable[Run]:
    """Start listening now for the first recorded run matching ``predicate``; await it later.

    The timeout only bounds a broken test; it never stands in for synchronisation."""
    fut: asyncio.Future[Run] = asyncio.get_running_loop().create_future()

    def listener(run: Run) -> None:
        if not fut.done() and predicate(run):
            fut.set_result(run)

    engine.add_listener(listener)

    async def wait() -> Run:
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            engine.remove_listener(listener)

    return wait()


async def all_runs(engine: Engine, name: str) -> list[Run]:
    """Every run of a schedule, oldest first (by id, i.e. creation order)."""
    await engine.flush()
    return list(reversed(await engine.store.list_runs(name, limit=100_000)))
