"""A one-line text field that holds at most so many bytes and takes a burst of text at once.

A terminal without bracketed paste delivers a paste as one key per character. A plain
field makes a new value, a ``Changed`` message holding it, and (in the schedule form) a
JSON parse for each: a 300 KB paste is hundreds of thousands of ever longer copies, and the
console hangs. This field gathers the characters that reach it together and takes them in
one edit, and refuses what would pass its limit as it arrives (saying so once)."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widgets import Input

__all__ = ["BoundedInput", "fit"]


def fit(text: str, room: int) -> str:
    """The longest start of ``text`` whose UTF-8 takes at most ``room`` bytes."""
    if room <= 0:
        return ""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= room:
        return text
    return encoded[:room].decode("utf-8", "ignore")  # a character cut in two is left out


class BoundedInput(Input):
    """An :class:`~textual.widgets.Input` holding at most ``limit`` bytes of UTF-8. What is
    typed or pasted past the limit is not taken, and a notification says so, naming the
    limit (once, until a key other than a character is pressed)."""

    def __init__(self, value: str = "", *, limit: int, what: str, **kwargs: Any) -> None:
        super().__init__(value, **kwargs)
        self.limit = limit
        """Bytes of UTF-8 it holds at most."""
        self.what = what
        """What it holds, as the notification names it (``"A schedule's payload"``)."""
        self.refused = 0
        """Characters not taken, since the field was made."""
        self._typed: list[str] = []
        self._said = False

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character is not None:
            # Taken with every other character already waiting here, in one edit.
            event.stop()
            event.prevent_default()
            if not self._typed:
                self.call_later(self.take_typed)
            self._typed.append(event.character)
            return
        self.take_typed()  # before the key's binding (a move, a delete, enter) acts
        self._said = False

    def _on_paste(self, event: events.Paste) -> None:
        event.stop()
        event.prevent_default()
        self.take_typed()
        if event.text:
            self._take(event.text.splitlines()[0])

    def _on_blur(self, event: events.Blur) -> None:
        self.take_typed()

    def take_typed(self) -> None:
        """Put the characters typed so far into the value (what fits)."""
        if self._typed:
            text, self._typed = "".join(self._typed), []
            self._take(text)

    def _take(self, text: str) -> None:
        start, end = sorted(self.selection)
        value = self.value
        room = self.limit - len(value[:start].encode("utf-8", "surrogatepass")) - len(
            value[end:].encode("utf-8", "surrogatepass"))
        taken = fit(text, room)
        if len(taken) < len(text):
            self.refused += len(text) - len(taken)
            if not self._said:
                self._said = True
                self.notify(f"{self.what} holds at most {self.limit:,} bytes ({self.limit // 1024} KiB) of UTF-8; "
                            "what was typed or pasted past that was not taken.", title="Too long",
                            severity="warning", markup=False)
        if taken:
            self.replace(taken, start, end)
