"""The terminal driver, with what it reads handed to the app in batches, pastes read as
text, and writes that outlive the terminal.

Textual's driver reads the terminal on a thread of its own and hands each key to the event
loop with a cross-thread call of its own. A paste without bracketed paste is one key per
character: 300 KB of it was 300,000 such calls, each waking the loop and trading the
interpreter lock between the threads, and the console answered nothing for minutes. Here
the driver's thread only queues what it read and wakes the loop once for everything queued
since the loop last took it; the loop posts it all to the app, in order.

After a hangup (an SSH session that dropped) a write to the terminal fails (EIO). Textual's
writer thread died of the first such failure; what the app wrote next filled its queue and
then blocked the event loop for good, so the console could not stop its engine. Here the
terminal's output drops what it cannot write: the console goes on to its end, and
``console --fire`` lets its runs in flight finish (see ``console.cli.main``).

An ESC inside a bracketed paste (text copied from a terminal, with its colours) began an
escape sequence in Textual's parser, which sent it on as keys, ahead of the paste: the
rest of the paste became key presses (a tab moved the focus, a return submitted the form
unasked) and the text was lost or reordered. Here such an ESC is dropped before the
parser reads it (a field keeps no control character anyway): the paste stays one paste.

A byte that is not UTF-8 (a Latin-1 terminal, a pasted binary) ended Textual's input thread
with a traceback: here it reads as U+FFFD.
"""

from __future__ import annotations

import codecs
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from textual._xterm_parser import XTermParser
from textual.driver import Driver
from textual.message import Message

__all__ = ["PasteAsText", "batched", "lenient_decoder"]

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"


class PasteAsText(XTermParser):
    """Textual's parser, fed with each ESC inside a bracketed paste dropped (see the
    module docstring). The paste's end marker may come split over two reads: its start
    is held back until the next read says what it is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pasting = False
        self._held = ""  # a read's tail that may begin the paste's end marker
        self._seen = ""  # the last characters passed on outside a paste (a start split over reads)

    def feed(self, data: str) -> Any:
        if not data:  # (the end of input: as it is)
            return super().feed(data)
        text = self._held + data
        self._held = ""
        out: list[str] = []
        at = 0
        while at < len(text):
            if not self._pasting:
                found = (self._seen + text[at:]).find(PASTE_START)
                if found < 0:
                    out.append(text[at:])
                    self._seen = (self._seen + text[at:])[-(len(PASTE_START) - 1) :]
                    break
                begins = at + found - len(self._seen) + len(PASTE_START)
                out.append(text[at:begins])
                self._pasting, self._seen, at = True, "", begins
                continue
            escape = text.find("\x1b", at)
            if escape < 0:
                out.append(text[at:])
                break
            out.append(text[at:escape])
            rest = text[escape:]
            if rest.startswith(PASTE_END):
                out.append(PASTE_END)
                self._pasting, at = False, escape + len(PASTE_END)
            elif PASTE_END.startswith(rest):
                self._held = rest  # maybe the end marker, split: the next read says
                break
            else:
                at = escape + 1  # an ESC of the pasted text: dropped
        passed = "".join(out)
        return super().feed(passed) if passed else ()


class _Output:
    """The terminal's output stream, dropping what a terminal that hung up refuses."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file

    def write(self, text: str) -> int:
        try:
            return self._file.write(text)
        except OSError:  # EIO: the terminal is gone, and with it whoever would read this
            return len(text)

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, …: the stream's own
        return getattr(self._file, name)


class _Batched(Driver):
    """A driver whose :meth:`send_message` queues, then wakes the loop once per batch,
    and whose output survives the terminal's hangup."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        output = getattr(self, "_file", None)  # (Textual's terminal drivers write there)
        if output is not None:
            self._file = _Output(output)
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


def lenient_decoder(encoding: str) -> Callable[[], codecs.IncrementalDecoder]:
    """The terminal's input decoder, which puts U+FFFD for a byte that is not UTF-8 (a
    Latin-1 terminal's ``é``, a pasted binary) instead of raising: Textual's strict one
    ended the input thread, and the console with a traceback (exit 0, its engine stopped)."""
    return functools.partial(codecs.getincrementaldecoder(encoding), errors="replace")


def batched(driver: type[Driver]) -> type[Driver]:
    """``driver`` with what it reads handed to the app in batches (and, on a terminal,
    pastes read as text: see :class:`PasteAsText`)."""
    from textual.drivers import linux_driver

    if issubclass(driver, linux_driver.LinuxDriver):
        setattr(linux_driver, "XTermParser", PasteAsText)  # noqa: B010  (the name its input thread makes its parser of)
        setattr(linux_driver, "getincrementaldecoder", lenient_decoder)  # noqa: B010  (and its decoder of)
    return type(f"Batched{driver.__name__}", (_Batched, driver), {})
