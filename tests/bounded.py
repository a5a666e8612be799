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
        where = awaiting(task)
        others = [t for t in asyncio.all_tasks(loop) if t is not task and not t.done()]
        # What the others wait on too: the rule may wait for one of them (a writer parked on
        # a statement whose lock another process holds), which is where the hang is.
        rest = "\n".join(f"task {t.get_name()}:\n{awaiting(t)}" for t in sorted(others, key=lambda t: t.get_name())[:40])
        task.cancel()
        loop.run_until_complete(asyncio.wait({task}, timeout=5))
        raise AssertionError(
            f"{name} did not end within {bound} s; it was waiting at:\n{where}\n"
            f"the loop's {len(others)} other task(s) (40 at most):\n{rest}"
        )
    return task.result()


def awaiting(task: asyncio.Task[Any], depth: int = 0) -> str:
    """Where ``task`` waits: each frame of its chain of awaits, outermost first, then what
    it waits on, into the tasks it awaits (what a hung rule was stuck on, which its replay
    may never reach again)."""
    pad = "  " * (depth + 1)
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            lines.append(f"{pad}{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    waiter = getattr(task, "_fut_waiter", None)  # (the future its await parks on)
    if depth > 8:
        lines.append(f"{pad}…")
    elif isinstance(waiter, asyncio.Task):
        lines.append(f"{pad}on task {waiter.get_name()}:")
        lines.append(awaiting(waiter, depth + 1))
    elif getattr(waiter, "_children", None) is not None:  # asyncio.gather's future
        for child in waiter._children:  # type: ignore[union-attr]
            if isinstance(child, asyncio.Task) and not child.done():
                lines.append(f"{pad}on gathered task {child.get_name()}:")
                lines.append(awaiting(child, depth + 1))
    elif waiter is not None:
        lines.append(f"{pad}on {waiter!r}")
    return "\n".join(lines) or f"{pad}(nothing)"
