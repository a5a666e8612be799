"""``connect()``: act on a store from any Python process, without running an engine.

A web app's request handler, a script or a notebook opens the store, acts, and closes it;
no timers are armed and nothing fires on the clock::

    from backend import connect

    async with connect("postgresql://…", definitions="schedules") as st:
        views = await st.schedules.list()
        run = await st.schedules.fire("daily-digest")        # runs the handler here
        await st.schedules.disable("daily-digest", note="vendor outage")
        sent = await st.jobs.send("mailer", {"order": 42}, key="receipt:42")

``definitions`` is the folder of ``*.cron.py`` (and ``*.jobs.py``, ``*.durable.py``) files,
or the definitions themselves; the schedule actions need it, since the store holds runs and
states, not code (sending jobs does not: queues are recorded in the store).
:func:`connect_sync` is the same for synchronous code (Django, Flask): its methods block
and return the same values.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from backend.client.embedded import EmbeddedBackend
from backend.definitions import Definitions as FolderDefinitions
from backend.definitions import discover_definitions
from backend.durable.actions import DurableActions
from backend.inputs import INSTANCE_MAX_CHARS, check_instance
from backend.locks.sync import SyncLocks
from backend.model import BackfillPlan, BackfillProgress, Run, ScheduleView
from backend.scheduler.engine import Engine
from backend.store import open_store

__all__ = ["INSTANCE_MAX_CHARS", "Client", "ScheduleActions", "SyncClient", "check_instance", "connect", "connect_sync"]

T = TypeVar("T")

class ScheduleActions:
    """The operator actions on schedules (``st.schedules``)."""

    def __init__(self, engine: Engine, actor: str | None) -> None:
        self._engine = engine
        self._actor = actor
        # The backfill and catalog actions go through their declarations, as the API's and
        # the CLI's do: the same checks, the same implementation, the same plan.
        self._actions = EmbeddedBackend(engine)

    async def list(self) -> list[ScheduleView]:
        """Every defined schedule with its state, next slot and newest run."""
        return await self._engine.list_schedules()

    async def get(self, name: str) -> ScheduleView:
        return await self._engine.get_schedule(name)

    async def runs(
        self, name: str, *, limit: int = 50, before: str | None = None
    ) -> tuple[builtins.list[Run], str | None]:
        """A page of runs, newest first, and the ``before`` of the next page (or ``None``)."""
        return await self._engine.list_runs(name, limit=limit, before=before)

    async def get_run(self, run_id: str) -> Run:
        return await self._engine.get_run(run_id)

    async def fire(self, name: str, *, wait: bool = True) -> Run:
        """Run now, in this process (trigger ``manual``); by default waits for the end."""
        return await self._engine.run_now(name, wait=wait)

    async def enable(self, name: str, *, note: str | None = None) -> ScheduleView:
        return await self._engine.set_enabled(name, True, note=note, by=self._actor)

    async def disable(self, name: str, *, note: str | None = None) -> ScheduleView:
        return await self._engine.set_enabled(name, False, note=note, by=self._actor)

    async def create(self, spec: Mapping[str, Any]) -> ScheduleView:
        """Store a new schedule (a queue's or a durable function's: see
        :meth:`backend.client.interface.Backend.create_schedule`); every engine on the store
        arms it within 2 s."""
        return await self._actions.create_schedule(spec)

    async def update(self, name: str, changes: Mapping[str, Any]) -> ScheduleView:
        """Change a stored schedule (``DefinedInCode`` for one in code)."""
        return await self._actions.update_schedule(name, changes)

    async def delete(self, name: str) -> None:
        """Delete a stored schedule; its runs stay in the ledger."""
        await self._actions.delete_schedule(name)

    async def plan_backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan:
        """What a backfill of ``(start, end]`` would do (with how many of its slots already
        succeeded); fires nothing."""
        return await self._actions.plan_backfill(name, start, end, confirm=confirm, limit=limit)

    async def backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress:
        """Fire the slots of ``(start, end]`` in order, in this process (with
        ``skip_succeeded``, only those without a succeeded run); returns when done."""
        progress = await self._actions.start_backfill(
            name, start, end, confirm=confirm, limit=limit, skip_succeeded=skip_succeeded
        )
        return await self._engine.wait_backfill(progress.id)


class Client:
    """An open store and the actions on it (see :func:`connect`)."""

    def __init__(self, engine: Engine, *, actor: str | None = None) -> None:
        self.engine = engine
        self.schedules = ScheduleActions(engine, actor)
        self.jobs = engine.jobs.actions.acting_as(actor)
        """Send jobs and act on queues (:class:`~backend.jobs.actions.JobActions`)."""
        self.locks = engine.locks
        """Leases on named locks: ``with_lock``, ``hold``, ``list``, ``release``."""
        self.durable = DurableActions(engine.durable, actor)

    @property
    def where(self) -> str:
        return self.engine.store.where


Definitions = str | Path | Iterable[Any] | None


def _schedules(definitions: Definitions) -> FolderDefinitions | Iterable[Any]:
    """Every definition (schedules, queues, …) of a folder (as found: all there are), or
    those given (the engine refuses what is not one)."""
    if definitions is None:
        return []
    if isinstance(definitions, (str, Path)):
        return discover_definitions(definitions)
    return definitions


@contextlib.asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    definitions: Definitions = None,
    instance: str | None = None,
    actor: str | None = None,
    create: bool = False,
) -> AsyncIterator[Client]:
    """Open the store at ``url`` (default ``sqlite:///.schedtui/state.db``) without timers.

    ``actor`` is who the actions are recorded as, in the audit log and on a disabled
    schedule (default: the OS user). Runs
    started here (Run now, backfills) run in this process and are waited for on exit. A
    missing SQLite file is refused (a typo must not create an empty, healthy-looking
    store) unless ``create``."""
    engine = Engine(_schedules(definitions), open_store(url, create=create), instance=instance, actor=actor)
    await engine.open()
    engine.jobs.store.expect_jobs(sending=True)  # what a client does most is send
    try:
        yield Client(engine, actor=actor)
    finally:
        await engine.stop()


class _Loop:
    """An event loop on a thread of its own, for the synchronous client."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="schedtui-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class _Blocking:
    """Wraps an object of async methods: each call blocks until the loop thread is done."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if asyncio.iscoroutinefunction(value):

            @functools.wraps(value)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop.run(value(*args, **kwargs))

            return call
        return value


class SyncClient:
    """:class:`Client` for synchronous code: ``st.schedules.list()`` blocks and returns."""

    def __init__(self, client: Client, loop: _Loop) -> None:
        self.client = client
        self.schedules: Any = _Blocking(client.schedules, loop)
        self.jobs: Any = _Blocking(client.jobs, loop)
        self.locks = SyncLocks(client.locks, loop.run)
        self.durable: Any = _Blocking(client.durable, loop)

    @property
    def where(self) -> str:
        return self.client.where


@contextlib.contextmanager
def connect_sync(
    url: str | None = None,
    *,
    definitions: Definitions = None,
    instance: str | None = None,
    actor: str | None = None,
    create: bool = False,
) -> Iterator[SyncClient]:
    """:func:`connect` for synchronous code; the store runs on a private event loop thread."""
    loop = _Loop()
    manager = connect(url, definitions=definitions, instance=instance, actor=actor, create=create)
    try:
        client = loop.run(manager.__aenter__())
        try:
            yield SyncClient(client, loop)
        except BaseException as exc:
            if not loop.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            loop.run(manager.__aexit__(None, None, None))
    finally:
        loop.close()
