"""The signals that stop a process running an engine (``serve``, ``console --fire``)
gracefully: the first stops it, letting runs in flight finish; another stops the waiting.

Ctrl-C, SIGTERM, and the hangup of its terminal: an SSH session that dropped. By default a
hangup ended the process at once, its runs in flight left to be closed as abandoned, unless
the hangup is ignored (``nohup``), which it stays.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["HANGUP", "on_stop_signals", "stop_signals", "why"]

#: SIGHUP, where there is one.
HANGUP: int | None = getattr(signal, "SIGHUP", None)


def stop_signals() -> list[int]:
    """SIGINT, SIGTERM, and SIGHUP unless it is ignored."""
    stopping: list[int] = [signal.SIGINT, signal.SIGTERM]
    if HANGUP is not None and signal.getsignal(HANGUP) == signal.SIG_DFL:
        stopping.append(HANGUP)
    return stopping


def why(sig: int) -> str:
    """What a stop signal means, for a log line: ``SIGHUP: its terminal hung up``."""
    name = signal.Signals(sig).name
    return f"{name}: its terminal hung up" if sig == HANGUP else name


def on_stop_signals(stop: Callable[[int], None], hurry: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop(signal)`` on the running loop at the first stop signal, ``hurry()`` at
    each one after it; returns what removes the handlers. A loop off the main thread gets
    none (its caller stops it)."""
    loop = asyncio.get_running_loop()
    received = 0

    def on_signal(sig: int) -> None:
        nonlocal received
        received += 1
        if received == 1:
            stop(sig)
        else:
            hurry()

    installed: list[int] = []
    for sig in stop_signals():
        before = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            continue
        installed.append(sig)
        _INSTALLED[sig] = before

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)
            _INSTALLED.pop(sig, None)

    return remove


#: The stop signals handled by an engine's loop in this process, with what each was before.
_INSTALLED: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}


def _forget_in_forked_child() -> None:
    """A child forked while the loop handles the stop signals (a handler's ``os.fork()``, a
    multiprocessing pool) inherits the loop's no-op handlers and its wake-up descriptor,
    which is the parent's: a SIGTERM to the child (``Process.terminate()``, a pool's exit)
    did not end the child and was read by the parent's loop as its own, and ``serve``
    stopped (exit code 0, so a supervisor did not start it again). The child gets the
    signals back as they were before the loop took them, and no wake-up descriptor."""
    if not _INSTALLED:
        return
    signal.set_wakeup_fd(-1)
    for sig, before in _INSTALLED.items():
        signal.signal(sig, before if before is not None else signal.SIG_DFL)
    _INSTALLED.clear()


os.register_at_fork(after_in_child=_forget_in_forked_child)
