"""Stores opened before a fork (gunicorn ``--preload``, a multiprocessing pool made after
the engine started): the child inherits the parent's connections and the memory of its
threads, not the threads. A child that used them would hang (SQLite: a writer thread that
is not there) or corrupt the parent's sessions (PostgreSQL: one socket, two writers). So
at a fork the child's copy of every open store lets go of them, unclosed (closing would
close the parent's too), and refuses every call with :func:`forked_problem`."""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["Forkable", "forked_problem", "opened"]


class Forkable(Protocol):
    def forget_after_fork(self, parent: int) -> None:
        """In a forked child: drop the parent's connections and threads, unclosed."""


_OPEN: weakref.WeakSet[Forkable] = weakref.WeakSet()
_PID = [os.getpid()]


def opened(store: Forkable) -> None:
    """``store`` holds connections or threads now (until it is collected)."""
    _OPEN.add(store)


def forked_problem(parent: int) -> str:
    """The sentence a forked child's store call fails with (``{store}`` for the store)."""
    return (
        f"{{store}} was opened in process {parent}, before this process ({os.getpid()}) was forked from it: its "
        "connections are the parent's; open the engine (or connect()) after the fork"
    )


def _after_fork_in_child() -> None:
    parent, _PID[0] = _PID[0], os.getpid()
    for store in list(_OPEN):
        store.forget_after_fork(parent)
    _OPEN.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
