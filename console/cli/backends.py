"""The engine or the client a verb acts through: an embedded engine over ``--store``, or a
remote ``schedtui serve`` (``--url``), behind one backend interface."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from backend import BadInput, Engine, Unavailable, open_store
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.definitions import Definitions, discover_definitions
from backend.model import COORDINATION_MODES
from backend.store import Store, store_lost, until_lost

__all__ = ["engine_for", "with_backend"]


def engine_for(args: argparse.Namespace, *, create: bool = False, definitions_needed: bool = True, **kwargs: Any) -> Engine:
    """The engine over ``--store``. Only ``serve`` creates a missing store (``create``); the
    verbs that read or act, and the console, refuse it naming the path (exit 2). A verb
    that uses no definition (``definitions_needed`` false: the job queue's, locks, audit)
    does without the folder when none was named and the default one is absent; a folder
    that was named must exist."""
    definitions: Definitions | list[Any]
    if not definitions_needed and not args.schedules_named and not Path(args.schedules).is_dir():
        definitions = []
    else:
        definitions = discover_definitions(args.schedules)
    if kwargs.get("coordination") is None:  # the app-wide setting, for serve and the verbs alike
        kwargs["coordination"] = _coordination_setting()
    kwargs.setdefault("actor", getattr(args, "actor", None))
    return Engine(definitions, open_store(args.store, create=create), instance=args.instance, **kwargs)


def _coordination_setting() -> str | None:
    value = os.environ.get("SCHEDTUI_COORDINATION") or None
    if value is not None and value not in COORDINATION_MODES:
        raise BadInput(f'$SCHEDTUI_COORDINATION "{value}" is not one of {", ".join(COORDINATION_MODES)}')
    return value


async def with_backend(
    args: argparse.Namespace, body: Callable[[Backend], Coroutine[Any, Any, int]], *, definitions_needed: bool = True
) -> int:
    """Run ``body`` on the remote backend (``--url``) or an embedded one (see :func:`engine_for`)."""
    backend: Backend
    if args.url:
        backend = RemoteBackend(args.url, args.token, read_only=args.read_only)
    else:
        backend = EmbeddedBackend(engine_for(args, definitions_needed=definitions_needed), read_only=args.read_only)
    await backend.connect()
    store = backend.engine.store if isinstance(backend, EmbeddedBackend) else None
    try:
        code = await (body(backend) if store is None else _unless_lost(store, body(backend)))
    finally:
        await backend.close()
    if store is not None and store.health().state == "lost":  # (a run's end, written at close, met it)
        raise _lost(store)
    return code


async def _unless_lost(store: Store, body: Coroutine[Any, Any, int]) -> int:
    """``body``, stopped once the store is lost (its file deleted or replaced): what the
    verb did from then on would be recorded nowhere, and its success would be a lie."""
    work, lost = asyncio.ensure_future(body), asyncio.ensure_future(until_lost(store))
    try:
        await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():  # lost (or Ctrl-C)
            work.cancel()
            await asyncio.wait([work])
        lost.cancel()
    if work.cancelled():
        raise _lost(store)
    failure = work.exception()
    if isinstance(failure, Unavailable) and store.health().state == "lost":
        # A write of its own met the loss first (a run's end, the heartbeat of a process
        # running a Run now): the same stop, told the same way.
        raise _lost(store) from failure
    return work.result()


def _lost(store: Store) -> Unavailable:
    return store_lost(store.where, "restore it, or start `schedtui serve` for a new, empty store")
