"""Helpers for the durable-function tests: engines over one store on one manual clock,
and an in-process crash that writes nothing more (as a SIGKILL would)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock
from backend.durable import Execution
from backend.scheduler import names
from tests import pg


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        return pg.database_for(tmp_path)
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def engines(clock: ManualClock, durable_url: str) -> AsyncIterator[Callable[..., Engine]]:
    """Engines over one store on the test clock (``advisoryLock`` coordination, so that
    several may run at once on SQLite too); each is stopped at the end."""
    made: list[Engine] = []

    def make(definitions: list[Any], **kwargs: Any) -> Engine:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("instance", f"i{len(made)}")
        kwargs.setdefault("shutdown_grace", 0)
        kwargs.setdefault("coordination", "advisoryLock")
        engine = Engine(definitions, kwargs.pop("store", durable_url), **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.stop(grace=0)


async def crash(engine: Engine) -> None:
    """Stop an engine as a SIGKILL would: nothing it does afterwards reaches the store (no
    release, no last checkpoint), its leases stay until they expire; its instance name is
    held no more in this process (the next engine under it is that process started again)."""
    names.let_go(engine.store.where, engine.instance, engine)
    executor = engine.durable.executor
    await engine.store.close()
    for run in list(executor.running.values()):
        run.lose("crashed (test)")
    await engine.loops.cancel_all()
    drives = set(executor._drives)
    if drives:
        await asyncio.wait(drives, timeout=10)
    engine.life.opened = False  # stop() at the end has nothing left to do


async def settle(engine: Engine) -> None:
    await engine.quiesce()


async def execution(engine: Engine, id_: str) -> Execution:
    return await engine.durable.get(id_)
