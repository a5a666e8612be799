"""The last line of defence between stored text and the operator's terminal.

Every view shows text a handler, a client or an older release wrote (an error message with
a subprocess's colours, a job key, a holder's name, a log line) through
:func:`~backend.safetext.in_line`, so an escape sequence or a bidirectional override is
seen as its escape. A place that forgets would send it to the terminal as it is: an ESC
that clears the screen or retitles the window, a U+202E that draws the rest of the line
backwards, a lone surrogate the terminal's encoding cannot carry. This filter, applied to
every line every widget draws, removes them: each is drawn in no cell (Rich measures it
so), so the layout stays as measured; a lone surrogate, measured one cell, becomes U+FFFD.
"""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter
from textual.markup import escape

from backend.safetext import in_lines, never_drawn

__all__ = ["Unprintable", "escaped"]


class Unprintable(LineFilter):
    """Removes what a terminal would take for a command from every segment's text (see
    :func:`~backend.safetext.never_drawn`); control segments, Rich's own, pass."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        out = segments
        for index, segment in enumerate(segments):
            if segment.control or segment.text.isascii() and segment.text.isprintable():
                continue  # (nearly every segment: no regular expression run for it)
            text = never_drawn(segment.text)
            if text != segment.text:
                if out is segments:
                    out = list(segments)
                out[index] = Segment(text, segment.style)
        return out


def escaped(text: str) -> str:
    """``text`` for Textual's markup: its markup escaped, and each escape sequence,
    bidirectional control and lone surrogate shown as its escape (tabs and newlines kept:
    a traceback, a payload over lines)."""
    return escape(in_lines(text))
