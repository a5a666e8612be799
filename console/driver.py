"""The terminal driver, with what it reads handed to the app in batches.

Textual's driver reads the terminal on a thread of its own and hands each key to the event
loop with a cross-thread call of its own. A paste without bracketed paste is one key per
character: 300 KB of it was 300,000 such calls, each waking the loop and trading the
interpreter lock between the threads, and the console answered nothing for minutes. Here
the driver's thread only queues what it read and wakes the loop once for everything queued
since the loop last took it; the loop posts it all to the app, in order.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from textual.driver import Driver
from textual.message import Message

__all__ = ["batched"]


class _Batched(Driver):
    """A driver whose :meth:`send_message` queues, then wakes the loop once per batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outbox: deque[Message] = deque()
        self._lock = threading.Lock()
        self._waking = False

    def send_message(self, message: Message) -> None:
        with self._lock:
            self._outbox.append(message)
            if self._waking:
                return  # the loop has been woken and has not taken the batch yet
            self._waking = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            batch = list(self._outbox)
            self._outbox.clear()
            self._waking = False
        for message in batch:
            self._app.post_message(message)


def batched(driver: type[Driver]) -> type[Driver]:
    """``driver`` with what it reads handed to the app in batches."""
    return type(f"Batched{driver.__name__}", (_Batched, driver), {})
