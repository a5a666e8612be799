"""The signals that stop a process running an engine (``serve``, ``console --fire``)
gracefully: the first stops it, letting runs in flight finish; another stops the waiting.

Ctrl-C, SIGTERM, and the hangup of its terminal: an SSH session that dropped. By default a
hangup ended the process at once, its runs in flight left to be closed as abandoned, unless
the hangup is ignored (``nohup``), which it stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["HANGUP", "KEEP_EVERY", "on_stop_signals", "stop_signals", "why"]

log = logging.getLogger("schedtui.engine")

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

    installed: dict[int, object] = {}
    for sig in stop_signals():
        before = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            continue
        installed[sig] = signal.getsignal(sig)
        _INSTALLED[sig] = before

    watching: asyncio.TimerHandle | None = None

    def keep() -> None:
        # A handler running on the loop (the main thread) may set a stop signal's handler
        # itself: signal.signal(SIGTERM, SIG_IGN) left serve deaf to SIGTERM, silently.
        for sig, ours in installed.items():
            if signal.getsignal(sig) is not ours:
                log.warning("%s's handler was changed by code the engine ran (a handler's signal.signal?): "
                            "set back, so that it stops this process", signal.Signals(sig).name)  # fmt: skip
                loop.add_signal_handler(sig, on_signal, sig)
                installed[sig] = signal.getsignal(sig)
        nonlocal watching
        watching = loop.call_later(KEEP_EVERY, keep)

    if installed:
        watching = loop.call_later(KEEP_EVERY, keep)

    def remove() -> None:
        if watching is not None:
            watching.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
            _INSTALLED.pop(sig, None)

    return remove


#: Seconds between two looks at the stop signals' handlers (see :func:`on_stop_signals`).
KEEP_EVERY = 1.0


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
