"""Where an engine is in its one life, and the event loop and process it lives in.

An engine is made, opened (its store), started (its timers and workers), and stopped,
once: its parts are made for one life. It runs on the event loop it started on, in the
process it started in: a fork's child (``gunicorn --preload``, a multiprocessing pool)
would share its timers and connections and go by its name. :class:`Lifetime` keeps that
state and refuses what it forbids; the engine's ``open``, ``start`` and ``stop`` move it
along (see :mod:`backend.scheduler.engine` and :mod:`backend.scheduler.lifecycle`).
"""

from __future__ import annotations

import asyncio
import os

from backend.errors import BadInput, EngineStopped

__all__ = ["Lifetime"]


class Lifetime:
    """An engine's state: made, opened, started, stopping, stopped.

    Contract: :meth:`check_running` refuses (``EngineStopped``, or ``BadInput`` for a fork)
    an action on an engine that has stopped or begun to stop, that was started on another
    event loop or on one that has ended, or that is used in a process forked since it was
    started; :meth:`check_open` also one that is not open. An engine only opened (a
    client) may open again after its stop; one that started may not."""

    def __init__(self, *, named_in: int | None) -> None:
        self.opened = False
        """The store is open: from here on, a stop closes it."""
        self.started = False
        self.stopping = False
        self.stopped = False
        """Stopped once: an engine is not started again (its parts are made for one life)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop it started on."""
        self.pid = os.getpid()
        """The process it started in (made in, until it starts)."""
        self.starting: asyncio.Future[None] | None = None
        """A start in flight: a stop meanwhile waits for it, then stops what it started."""
        self.named_in = named_in
        """The process whose pid the engine's default name carries (None: a name given)."""

    @property
    def running(self) -> bool:
        """Started and not stopping."""
        return self.started and not self.stopping

    def began(self) -> None:
        """The start has opened the store: the engine is started, on this loop, in this process."""
        self.started = True
        self.loop, self.pid = asyncio.get_running_loop(), os.getpid()

    def check_not_forked(self, instance: str) -> None:
        """Refuse to open an engine made before a fork under its default name: every child
        would go by the parent's name, and take each other's work for their own."""
        if self.named_in is not None and self.named_in != os.getpid():
            raise BadInput(
                f"this engine was made in process {self.named_in} and is opened in process {os.getpid()} (a fork): "
                f'its default instance name, "{instance}", is the first one\'s; make the engine after the fork, '
                "or give it instance=…"
            )

    def check_running(self, action: str) -> None:
        """Refuse ``action`` on an engine that has stopped (or is stopping, or was started
        on an event loop that has ended, or in a process forked since): it would run work no
        one records."""
        if self.started and self.pid != os.getpid():
            raise BadInput(
                f"cannot {action}: this engine was started in process {self.pid} and is used in process "
                f"{os.getpid()}, forked from it since: its timers, workers and connections are that process's; "
                "make (and start) the engine after the fork"
            )
        if self.stopped or self.stopping:
            raise EngineStopped(
                f"cannot {action}: this engine has {'stopped' if self.stopped else 'begun to stop'} "
                "(an Engine runs once; make a new one to run again)"
            )
        if self.started and self.loop is not None and self.loop is not _running_loop():
            raise EngineStopped(
                f"cannot {action}: this engine was started on another event loop"
                f"{' (it has ended)' if self.loop.is_closed() else ''}; an Engine runs on the loop it started on"
            )

    def check_open(self, action: str) -> None:
        """:meth:`check_running`, and refuse ``action`` on an engine not opened yet."""
        self.check_running(action)
        if not self.opened:
            raise EngineStopped(f"cannot {action}: this engine is not open (start() or open() it first)")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
