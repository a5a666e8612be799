"""Running a coroutine from a stateful machine's rule, bounded in real time.

Not ``asyncio.wait_for``: on a timeout it waits for the task it cancelled to end, and a task
that outlives its cancellation (a store call parked on something only a later rule sets)
would hold the test, and each replay of Hypothesis's shrinking, for ever. Here the caller
fails with the coroutine's name instead, and what is left of the task is abandoned with the
machine's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_within(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], bound: float) -> T:
    """``coro``'s result, run on ``loop``; ``AssertionError`` if it takes ``bound`` seconds."""
    name = getattr(coro, "__qualname__", repr(coro))
    task = loop.create_task(coro)
    loop.run_until_complete(asyncio.wait({task}, timeout=bound))
    if not task.done():
        task.cancel()
        loop.run_until_complete(asyncio.wait({task}, timeout=5))
        raise AssertionError(f"{name} did not end within {bound} s")
    return task.result()
