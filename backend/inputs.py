"""Checks of operator input shared by every path that takes it (API, CLI, console).

Each check raises :class:`~backend.errors.BadInput` (or :class:`~backend.errors.NotFound`
for an id that cannot exist) naming the value, escaped so that it can be shown on one line.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from .errors import BadInput, NotFound
from .safetext import printable

__all__ = [
    "EARLIEST",
    "LATEST",
    "NOTE_MAX_CHARS",
    "check_before",
    "check_id",
    "check_instant",
    "check_note",
    "is_id",
    "out_of_range",
]

NOTE_MAX_CHARS = 1000

#: Instants an operator may name (backfill ranges): wide enough for any real ledger, and
#: far enough from the calendar's ends that converting to any zone, or walking a cron
#: expression for its slots, cannot overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)

# Run and backfill ids are ULIDs (backend.ids): 26 characters of Crockford base32.
_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
# Characters a stored text may not hold: control characters except tab and newline (NUL
# is refused by PostgreSQL; the others would reach an operator's terminal), and the lone
# surrogates that no UTF-8 store can encode.
_NOT_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def check_note(note: object) -> str | None:
    """A schedule's state note as given, or ``None`` for none (an empty one is none)."""
    if note is None:
        return None
    if not isinstance(note, str):
        raise BadInput(f"note must be a string, not {type(note).__name__}", field="note")
    if len(note) > NOTE_MAX_CHARS:
        raise BadInput(f"note is longer than {NOTE_MAX_CHARS} characters ({len(note)})", field="note")
    bad = _NOT_TEXT.search(note)
    if bad is not None:
        raise BadInput(
            f'note "{printable(note, 60)}" holds {printable(bad.group())} at position {bad.start()}, '
            "which is not text (control characters and lone surrogates are refused)",
            field="note",
        )
    return note or None


def is_id(value: str) -> bool:
    """Whether ``value`` has the shape of a run or backfill id."""
    return _ID.fullmatch(value) is not None


def check_id(value: str, what: str) -> str:
    """``value`` if it can be the id of a ``what`` (``run``, ``backfill``); else NotFound,
    as for any id that names nothing."""
    if not is_id(value):
        raise NotFound(f'no {what} with id "{printable(value, 60)}"')
    return value


def check_before(value: str | None, what: str = "run") -> str | None:
    """The ``before`` of a page (of runs, or of ``what``): the id of the last item of the
    previous page."""
    if value is not None and not is_id(value):
        raise BadInput(
            f'before "{printable(value, 60)}" is not {"an" if what[0] in "aeiou" else "a"} {what} id '
            "(26 characters such as 01JD3Z6Q0V9W4C7PAXH3KJ1M2B)",
            field="before",
        )
    return value


def check_instant(value: datetime, field: str, text: str | None = None) -> datetime:
    """An aware instant within :data:`EARLIEST` … :data:`LATEST` (as typed: ``text``)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise BadInput(f"{field} {value.isoformat()} has no timezone", field=field)
    if not EARLIEST <= value < LATEST:
        raise out_of_range(field, text if text is not None else value.isoformat())
    return value


def out_of_range(field: str, text: str) -> BadInput:
    return BadInput(f'{field} "{printable(text, 60)}" is out of range ({EARLIEST.year} to {LATEST.year - 1})', field=field)
