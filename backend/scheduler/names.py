"""The instance names this process's engines go by: one engine per name and store.

An instance name is who holds work in the store: its heartbeat row, its runs, its jobs'
and executions' leases. Two engines of one process under one name were one instance to
the store, and each took the other's work for its own. The case that broke it: the
default name is ``hostname:pid``, so a :func:`~backend.connect` client opened inside a
``serve`` process (a job handler sending a job, a web app beside the engine) went by the
serving engine's name, recorded it an observer, and on closing deleted its row: the
fleet then took every job the serving engine was running over at once, and ran each a
second time while the first attempt ran on.

So a second engine of the process that takes the default name gets ``hostname:pid/2``
(``/3``, …), and one given a name another engine of the process holds on the same store
is refused when it opens.
"""

from __future__ import annotations

import os
import socket
import weakref

from backend.errors import InUse

__all__ = ["default_instance_name", "hold", "let_go", "take_default_name"]

#: The default names engines of this process were given, while those engines live.
_defaults: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
#: The names open engines hold, by store (its ``where``), while those engines live.
_open: weakref.WeakValueDictionary[tuple[str, str], object] = weakref.WeakValueDictionary()


def default_instance_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def take_default_name(holder: object) -> str:
    """``hostname:pid`` for the first engine of the process, ``hostname:pid/2`` for one
    made while that one lives, and so on."""
    base = default_instance_name()
    name, number = base, 1
    while _defaults.get(name) not in (None, holder):
        number += 1
        name = f"{base}/{number}"
    _defaults[name] = holder
    return name


def hold(where: str, name: str, holder: object) -> None:
    """Hold ``name`` on the store at ``where`` for ``holder`` (at its open);
    :class:`InUse` when another engine of this process holds it."""
    other = _open.get((where, name))
    if other is not None and other is not holder:
        raise InUse(
            f'the instance name "{name}" is already used by another engine of this process on the store '
            f'"{where}": give each its own name (two engines under one name take each other\'s work for their own)'
        )
    _open[(where, name)] = holder


def let_go(where: str, name: str, holder: object) -> None:
    """Release what :func:`hold` and :func:`take_default_name` took for ``holder``."""
    if _open.get((where, name)) is holder:
        del _open[(where, name)]
    if _defaults.get(name) is holder:
        del _defaults[name]
