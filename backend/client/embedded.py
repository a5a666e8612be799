"""The backend interface over an engine in this process.

Every operator action goes through :meth:`EmbeddedBackend._act`: refused when read-only
(``operate`` actions), its arguments checked from the declaration, then the engine's
implementation that the declaration names (:attr:`~backend.client.actions.Action.impl`)
called with them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from backend.client.actions import Action, check_arguments
from backend.client.interface import Backend, ConnectionInfo
from backend.errors import Forbidden, Unavailable, describe_exception
from backend.events.bus import READY, STREAM, Signal, Subscription
from backend.inputs import check_id
from backend.model import BackfillProgress, CoordinationMode, Health, Run
from backend.safetext import in_line
from backend.scheduler.engine import Engine

__all__ = ["EmbeddedBackend"]

T = TypeVar("T")

log = logging.getLogger("schedtui.engine")

#: How often a change stream that is quiet looks at its store (seconds).
LOOK_AT_THE_STORE = 1.0


@dataclass
class _EngineThread:
    """An event loop on its own thread, so handlers never share the caller's loop.

    The loop runs until :meth:`stop`, whatever the code it runs does: a handler that stops
    it (``loop.stop()``), or whose own task or callback raises ``SystemExit`` or
    ``KeyboardInterrupt`` (asyncio lets those two out of the loop), ended the thread, and
    with it the engine (the console's every action then waited for good). The loop runs
    on, and the log says so, as under ``serve``."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    thread: threading.Thread | None = None
    stopping: bool = False

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="schedtui-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.loop.run_forever()
            except (KeyboardInterrupt, SystemExit) as exc:
                if self.stopping:
                    return
                tag, message, _ = describe_exception(exc)
                log.warning(
                    "%s (%s) was raised out of the engine's event loop by a task or callback it ran "
                    "(a handler's own task?): it runs on", tag, in_line(message[:200]),
                )  # fmt: skip
            else:
                if self.stopping:
                    return
                log.warning("the engine's event loop was stopped by the code it ran (loop.stop() in a handler?); it runs on")

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.loop.close()


class EmbeddedBackend(Backend):
    """The interface over an engine in this process.

    ``arm=True`` starts the engine's timers (the console and ``serve``); otherwise the
    engine is only opened, to read and act (the one-shot CLI verbs). ``own_thread=True``
    runs the engine on a loop of its own thread, so that neither handlers nor the ledger
    ever hold up the caller's loop (the console's UI). ``allow_external_self`` lets
    :meth:`fire_external` fire schedules that have their own timer too.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        read_only: bool = False,
        arm: bool = False,
        own_thread: bool = False,
        allow_external_self: bool = False,
    ) -> None:
        self.engine = engine
        self.read_only = read_only
        self.arm = arm
        if allow_external_self:
            engine.allow_external_self = True
        self._thread = _EngineThread() if own_thread else None
        self._coordination: CoordinationMode | None = None
        """The mode the fleet runs, as the engine observed it at connect."""

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._thread is None:
            return await coro
        return await self._thread.call(coro)

    async def _act(self, action: Action, arguments: dict[str, Any]) -> Any:
        """Refuse an ``operate`` action when read-only, check the arguments, then call the
        implementation on the engine (positional parameters by position, keyword-only ones
        by name, as the declaration has them)."""
        if action.permission == "operate" and self.read_only:
            raise Forbidden(f"read-only: {action.label} is not allowed")
        checked = check_arguments(action, arguments)
        target: Any = self.engine
        for part in action.impl.split("."):
            target = getattr(target, part)
        args = [checked[p.name] for p in action.params if not p.keyword]
        kwargs = {p.name: checked[p.name] for p in action.params if p.keyword}
        result = target(*args, **kwargs)
        if inspect.iscoroutine(result):
            return await self._call(result)
        return result

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            kind="embedded",
            where=self.engine.store.where,
            coordination=self._coordination or self.engine.coordination,
            instance=self.engine.instance,
            read_only=self.read_only,
            store_kind=self.engine.store.kind,
            fires=self.arm,
            actor=self.engine.audit.default_actor,
        )

    async def connect(self) -> ConnectionInfo:
        if self._thread is not None and self._thread.thread is None:
            self._thread.start()
        await self._call(self.engine.start() if self.arm else self.engine.open())
        self._coordination = await self._call(self.engine.observed_coordination())
        return self.info()

    async def close(self, grace: float | None = None) -> None:
        """Stop the engine: runs in flight may finish for ``grace`` seconds (its default)."""
        await self._call(self.engine.stop(grace))
        if self._thread is not None:
            self._thread.stop()

    def interrupt(self) -> None:
        """Stop waiting for runs in flight during :meth:`close` (a second Ctrl-C)."""
        if self._thread is None:
            self.engine.interrupt()
        else:
            self._thread.loop.call_soon_threadsafe(self.engine.interrupt)

    async def health(self) -> Health:
        return await self._call(self.engine.health())

    async def now(self) -> datetime:
        # (the database server's time where this process's clock is off it: what the
        # others' heartbeats, and the slots they fire, are judged against)
        return self.engine.registry.store_time(self.engine.clock.now())

    async def schedule_zone(self, name: str) -> str:
        # (read again from the store when not known here: the API checks a route's schedule
        # with this first, and refused one another process had just created)
        return await self._call(self.engine.schedule_zone(name))

    async def wait_run(self, run_id: str) -> Run:
        return await self._call(self.engine.wait_run(check_id(run_id, "run")))

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        return await self._call(self.engine.wait_backfill(check_id(backfill_id, "backfill")))

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        bus = self.engine.events
        health = self.engine.store.health()
        if health.state == "lost":
            raise Unavailable(f"the store is lost: {health.error}")
        subscription = bus.subscribe(since=since)  # read on the caller's loop, whatever the engine's
        try:
            ready = [Signal(since or subscription.start_id, READY, self.engine.relay.stream_kind)]
            if not bus.live:
                ready.append(Signal(subscription.start_id, STREAM, "down"))
            yield ready
            while not subscription.closed:
                yield await self._next_batch(subscription, idle)
        finally:
            subscription.close()

    async def _next_batch(self, subscription: Subscription, idle: float | None) -> list[Signal]:
        """The next batch (``[]`` after ``idle`` quiet seconds), looking at the store every
        :data:`LOOK_AT_THE_STORE` seconds meanwhile: a store that is lost (its file deleted
        or replaced) sends no signal, and a console following the stream went on saying
        "live" over frozen data until an operator refreshed."""
        waited = 0.0
        while True:
            step = LOOK_AT_THE_STORE if idle is None else min(LOOK_AT_THE_STORE, idle - waited)
            batch = await subscription.get(step)
            if batch or subscription.closed:
                return batch
            waited += step
            health = self.engine.store.health()
            if health.state == "lost":
                raise Unavailable(f"the store is lost: {health.error}")
            if idle is not None and waited >= idle:
                return []
