"""The engine's own blocking calls, each on a thread of its own.

``asyncio.to_thread`` runs on the loop's default executor, which handlers share (theirs
``asyncio.to_thread`` and ``run_in_executor`` calls): a handler whose calls never return
fills it (five or six threads on a small machine), and the engine's own calls queued
behind them for ever: the store's close at a stop (``serve`` never ended), a metrics
scrape. Those few calls (a close, an open, a scrape's rendering: never a hot path) start
a daemon thread each instead, which nothing else waits in front of.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_own_thread"]

T = TypeVar("T")


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return  # (its awaiter was cancelled)
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


async def in_own_thread(fn: Callable[..., T], *args: Any, name: str = "schedtui call") -> T:
    """``fn(*args)`` on a daemon thread of its own; its result (or its exception). Cancelled,
    the call runs on; its outcome is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def call() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiter
            error = exc
        with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile: nobody awaits it)
            loop.call_soon_threadsafe(_settle, future, value, error)

    threading.Thread(target=call, name=name, daemon=True).start()
    return await future
