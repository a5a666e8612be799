"""Each test's time limit: a test stuck on a wait that never comes fails, the suite goes on.

Past ``$SCHEDTUI_TEST_TIMEOUT`` seconds (300: the slowest test takes under a minute on a
2-core machine) every thread's stack goes to stderr, which pytest shows with the failure,
and :class:`TestTimedOut` is raised in the main thread; again every 10 s, in case the
first landed in a background task that swallowed it, until the test has ended.

Not pytest-timeout: its signal method raises pytest's ``Failed``, which Hypothesis takes for
a failing example and shrinks by replaying the hang; its thread method ends the worker,
and xdist (``--dist loadfile``) then sends the same file, hang first, to the next worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

LIMIT = float(os.environ.get("SCHEDTUI_TEST_TIMEOUT", "300"))


class TestTimedOut(BaseException):
    """A test ran past its limit. Not an ``Exception``: Hypothesis, and code under test
    that catches what it does not expect, must let it through."""

    __test__ = False  # (a class named Test*: not one for pytest to collect)


def stacks() -> str:
    """Every thread's stack, then every task's of the loop running here (a test stuck on
    an ``await`` shows only the loop's ``select`` in its thread's)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = [
        f"--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    ]
    loop = asyncio._get_running_loop()
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        parts.append(f"--- task {task.get_name()}:\n" + "".join(awaiting(task.get_coro())))
    return "\n".join(parts)


def awaiting(coro: Any) -> list[str]:
    """Where a suspended coroutine waits, outermost first, down its chain of awaits."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}\n')
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if LIMIT <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    fired = False

    def expire(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            print(f"\n{item.nodeid} ran past {LIMIT:g} s; every thread's stack:\n{stacks()}", file=sys.stderr, flush=True)
        raise TestTimedOut(f"{item.nodeid} ran past {LIMIT:g} s (every thread's stack is on its stderr)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, LIMIT, 10)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
