"""What a definitions file makes while it is imported, and where it made it.

``define_schedule``, ``define_queue`` and ``define_durable`` note each definition they make
(:func:`made`), and discovery collects those made while it imports a file
(:func:`collecting`), beside the module's own names: a definition made by a bare call, in a
loop or kept in a list is found as one bound to a name is. Outside discovery, noting does
nothing.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["caller_location", "collecting", "made"]

T = TypeVar("T")

_collected: ContextVar[list[object] | None] = ContextVar("schedtui_definitions_made", default=None)


def made(definition: T) -> T:
    """Note ``definition`` for the discovery importing a file now, if any; return it."""
    collected = _collected.get()
    if collected is not None:
        collected.append(definition)
    return definition


@contextlib.contextmanager
def collecting() -> Iterator[list[object]]:
    """The definitions made (:func:`made`) until the block ends, in order."""
    collected: list[object] = []
    token = _collected.set(collected)
    try:
        yield collected
    finally:
        _collected.reset(token)


def caller_location() -> str | None:
    """``path:line`` of the code that called the ``define_*`` function calling this."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None
        return f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller else None
    finally:
        del frame
