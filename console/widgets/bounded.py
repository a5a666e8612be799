"""Text fields that hold at most so much and take a burst of text at once.

A terminal without bracketed paste delivers a paste as one key per character. A plain
field makes a new value, a ``Changed`` message holding it, and (in the schedule form) a
JSON parse for each: a 300 KB paste is hundreds of thousands of ever longer copies, and the
console hangs. These fields gather the characters that reach them together and take them in
one edit, and refuse what would pass their limit as it arrives (saying so once, naming the
limit). Every text field of the console is one of them, each with the backend's limit for
what it holds where there is one (a payload, a note, a name, a key) and a bound of its own
otherwise (:data:`LINE_CHARS`, :data:`NUMBER_CHARS`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea

from backend.safetext import printable

__all__ = ["LINE_CHARS", "NUMBER_CHARS", "Bounded", "BoundedInput", "BoundedTextArea", "fit", "said"]

LINE_CHARS = 500
"""A line no backend limit bounds (a filter, a time, a cron expression, a command): far
more than any real one."""
NUMBER_CHARS = 24
"""A field that holds a number (a delay, a count to type)."""

Unit = Literal["bytes", "characters"]


def fit(text: str, room: int, unit: Unit = "bytes") -> str:
    """The longest start of ``text`` that takes at most ``room`` bytes of UTF-8 (or
    ``room`` characters)."""
    if room <= 0:
        return ""
    if unit == "characters":
        return text[:room]
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= room:
        return text
    return encoded[:room].decode("utf-8", "ignore")  # a character cut in two is left out


def size(text: str, unit: Unit) -> int:
    return len(text) if unit == "characters" else len(text.encode("utf-8", "surrogatepass"))


def said(what: str, limit: int, unit: Unit = "bytes") -> str:
    """The notification's text when ``what`` is full."""
    if unit == "characters":
        most = f"{limit:,} characters"
    else:
        kib = f" ({limit // 1024} KiB)" if limit >= 1024 and limit % 1024 == 0 else ""
        most = f"{limit:,} bytes{kib} of UTF-8"
    return f"{what} holds at most {most}; what was typed or pasted past that was not taken."


if TYPE_CHECKING:
    _Mixin = Widget
else:
    _Mixin = object  # not a widget itself: Textual takes CSS (``Input``) from a widget's first widget base


class Bounded(_Mixin):
    """What the bounded fields share: the limit, the burst of characters typed and not yet
    taken, and the one notification. (The key gate hands a run of keys :meth:`burst` takes
    to the field as one paste.)"""

    def _bound(self, limit: int, what: str, unit: Unit) -> None:
        self.limit = limit
        """How much it holds at most, in ``unit``."""
        self.what = what
        """What it holds, as the notification names it (``"A schedule's payload"``)."""
        self.unit: Unit = unit
        self.refused = 0
        """Characters not taken, since the field was made."""
        self._typed: list[str] = []
        self._said = False

    def burst(self, key: events.Key) -> str | None:
        """The text ``key`` types into the field, or ``None`` for a key that does more."""
        return key.character if key.is_printable and key.character is not None else None

    def _gather(self, event: events.Key) -> bool:
        """Whether ``event`` was text, kept to be taken with every other character already
        waiting, in one edit (else what was kept is taken now, before the key acts)."""
        text = self.burst(event)
        if text is not None:
            event.stop()
            event.prevent_default()
            if not self._typed:
                self.call_later(self.take_typed)
            self._typed.append(text)
            return True
        self.take_typed()  # before the key's binding (a move, a delete, enter) acts
        self._said = False
        return False

    def take_typed(self) -> None:
        """Put the characters typed so far into the field (what fits)."""
        if self._typed:
            text, self._typed = "".join(self._typed), []
            self._take(text)

    def _take(self, text: str) -> None:
        raise NotImplementedError

    def _fit(self, text: str, used: int) -> str:
        """What of ``text`` fits beside ``used``; saying so (once) when not all of it does."""
        taken = fit(text, self.limit - used, self.unit)
        if len(taken) < len(text):
            self.refused += len(text) - len(taken)
            if not self._said:
                self._said = True
                self.notify(said(self.what, self.limit, self.unit), title="Too long", severity="warning", markup=False)
        return taken

    def _on_blur(self, event: events.Blur) -> None:
        self.take_typed()


class BoundedInput(Bounded, Input):
    """An :class:`~textual.widgets.Input` holding at most ``limit`` bytes of UTF-8 (or
    characters, by ``unit``). What is typed or pasted past the limit is not taken, and a
    notification says so, naming the limit (once, until a key other than a character is
    pressed). With ``restrict`` (a character class, ``[0-9]*``), the characters it does
    not allow are left out of a burst, as they are when typed one at a time."""

    def __init__(
        self, value: str = "", *, limit: int, what: str, unit: Unit = "bytes", restrict_says: str = "", **kwargs: Any
    ) -> None:
        super().__init__(value, **kwargs)
        self._bound(limit, what, unit)
        self.restrict_says = restrict_says or f"only {kwargs.get('restrict')}"
        """What ``restrict`` allows, in words (``digits and a point``), for the notification."""

    async def _on_key(self, event: events.Key) -> None:
        self._gather(event)

    def _on_paste(self, event: events.Paste) -> None:
        event.stop()
        event.prevent_default()
        self.take_typed()
        if event.text:
            self._take(event.text.splitlines()[0])

    def _take(self, text: str) -> None:
        if self.restrict is not None:
            allowed = "".join(c for c in text if re.fullmatch(self.restrict, c))
            if len(allowed) < len(text):
                self.restricted()
                # Said, not only rung: "1e3" would otherwise be sent as 13, without a word.
                left_out = "".join(dict.fromkeys(c for c in text if not re.fullmatch(self.restrict, c)))
                self.notify(f"{self.what} takes {self.restrict_says}: {printable(left_out, 20)!r} was not taken.",
                            title="Not taken", severity="warning", markup=False)  # fmt: skip
            text = allowed
        start, end = sorted(self.selection)
        value = self.value
        taken = self._fit(text, size(value[:start], self.unit) + size(value[end:], self.unit))
        if taken:
            self.replace(taken, start, end)


class BoundedTextArea(Bounded, TextArea):
    """A :class:`~textual.widgets.TextArea` holding at most ``limit`` bytes of UTF-8 (as
    :class:`BoundedInput`); enter is text here too (a newline)."""

    def __init__(self, text: str = "", *, limit: int, what: str, unit: Unit = "bytes", **kwargs: Any) -> None:
        super().__init__(text, **kwargs)
        self._bound(limit, what, unit)

    def burst(self, key: events.Key) -> str | None:
        return "\n" if key.key == "enter" else super().burst(key)

    async def _on_key(self, event: events.Key) -> None:
        if self.read_only or not self._gather(event):
            return  # TextArea's own handling (read-only, or a key that is not text)
        self._restart_blink()

    async def _on_paste(self, event: events.Paste) -> None:
        event.stop()
        event.prevent_default()
        if self.read_only:
            return
        self.take_typed()
        self._take(event.text)

    def _take(self, text: str) -> None:
        if self.read_only:
            return
        start, end = sorted(self.selection)
        used = size(self.text, self.unit) - size(self.get_text_range(start, end), self.unit)
        taken = self._fit(text, used)
        if taken:
            result = self.replace(taken, start, end, maintain_selection_offset=False)
            self.move_cursor(result.end_location)
