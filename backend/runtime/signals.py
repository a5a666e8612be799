"""The signals that stop a process running an engine (``serve``, ``console --fire``)
gracefully: the first stops it, letting runs in flight finish; another stops the waiting.

Ctrl-C, SIGTERM, and the hangup of its terminal: an SSH session that dropped. By default a
hangup ended the process at once, its runs in flight left to be closed as abandoned, unless
the hangup is ignored (``nohup``), which it stays.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

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
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            continue
        installed.append(sig)

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove
