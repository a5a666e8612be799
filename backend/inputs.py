"""Checks of operator input shared by every path that takes it (API, CLI, console).

Each check raises :class:`~backend.errors.BadInput` (or :class:`~backend.errors.NotFound`
for an id that cannot exist) naming the value, escaped so that it can be shown on one line.

Two checks cover every text a store keeps, whichever route, verb or call it comes by:
:func:`check_text` (names, keys, notes, descriptions, times typed: no control character
but tab and newline, no lone surrogate) and :func:`check_json` (payloads and inputs: JSON
with no NUL and no lone surrogate, within a size). Both run before anything is written.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from backend.errors import BadInput, NotFound, TooLarge
from backend.safetext import MAX_JSON_DEPTH, NOT_TEXT, json_depth, printable

__all__ = [
    "decimal_number",
    "whole_number",
    "shown_number",
    "EARLIEST",
    "INSTANCE_MAX_CHARS",
    "LATEST",
    "NOTE_MAX_CHARS",
    "check_before",
    "check_count",
    "check_id",
    "check_instance",
    "check_instant",
    "check_json",
    "check_note",
    "check_seconds",
    "check_text",
    "is_id",
    "out_of_range",
    "json_problem",
    "parse_json",
    "RepeatedKey",
]

NOTE_MAX_CHARS = 1000

#: Instants an operator may name (backfill ranges): wide enough for any real ledger, and
#: far enough from the calendar's ends that converting to any zone, or walking a cron
#: expression for its slots, cannot overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

# Run and backfill ids are ULIDs (backend.ids): 26 characters of Crockford base32.
_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
# Not one line of text: NOT_TEXT's characters, tab and newline.
_NOT_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A NUL in JSON text as json.dumps writes it: \u0000 after an even run of backslashes (an
# odd run would be an escaped backslash followed by the letters u0000).
_NUL_IN_JSON = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_text(value: object, field: str, *, max_chars: int | None = None, one_line: bool = False) -> str:
    """``value`` if it is a string every store can keep and a terminal can show: no control
    character (but tab and newline, unless ``one_line``) and no lone surrogate (what a
    byte that is not UTF-8 becomes in a command line). BadInput naming ``field``, the value
    escaped, and the first bad character and its position."""
    if not isinstance(value, str):
        raise BadInput(f"{field} must be a string, not {type(value).__name__}", field=field)
    if max_chars is not None and len(value) > max_chars:
        raise BadInput(f"{field} is longer than {max_chars} characters ({len(value)})", field=field)
    bad = (_NOT_LINE if one_line else NOT_TEXT).search(value)
    if bad is not None:
        kinds = "control characters" if one_line else "control characters other than tab and newline"
        raise BadInput(
            f'{field} "{printable(value, 60)}" holds {printable(bad.group())} at position {bad.start()}, '
            f"which is not text ({kinds}, and lone surrogates, are refused)",
            field=field,
        )
    return value


#: The longest instance name one may give (the default, ``hostname:pid``, is far shorter).
INSTANCE_MAX_CHARS = 255


def check_instance(name: str, field: str = "instance") -> str:
    """An instance name given by hand: 1-255 printable characters, not only blanks. It is
    on every run this process records and is shown in tables, one line each: a control
    character would reach an operator's terminal, a lone surrogate (a byte of a command
    line that is not UTF-8) no store can keep. BadInput naming ``field`` and the value
    (as ``repr`` writes it: escaped) otherwise."""
    if not isinstance(name, str):
        raise BadInput(f"{field} must be a str, not {type(name).__name__}", field="instance")
    if len(name) > INSTANCE_MAX_CHARS:
        raise BadInput(
            f"{field} {name[:60]!r}… is longer than {INSTANCE_MAX_CHARS} characters ({len(name)})", field="instance"
        )
    if not name.strip() or not name.isprintable():
        raise BadInput(
            f"{field} {name!r} is not an instance name: 1-{INSTANCE_MAX_CHARS} printable characters, "
            "no control characters",
            field="instance",
        )
    return name


#: The largest JSON a job's payload, or a durable execution's input, may be (UTF-8 bytes):
#: here, below both, so that a schedule's definition holds its payload to them at import.
MAX_SENT_JSON_BYTES: Final = 256 * 1024


def check_json(value: Any, field: str, limit: int | None = None, *, max_depth: int | None = MAX_JSON_DEPTH) -> str:
    """``value`` as the compact JSON text a store keeps (UTF-8, at most ``limit`` bytes).
    BadInput naming ``field`` when it is not JSON, nests deeper than
    :data:`~backend.safetext.MAX_JSON_DEPTH` levels, or holds a NUL (PostgreSQL cannot keep
    one, in text or jsonb) or a lone surrogate (no UTF-8 store can); TooLarge (HTTP 413)
    over ``limit``. ``max_depth=None``: a value read back from a store, which an earlier
    release may have taken deeper (only the encoder's own limit then applies)."""
    too_deep = f"{field} is nested too deeply: its arrays and objects may nest {max_depth} levels deep at most"
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"{field} is not JSON ({exc})", field=field) from None
    except RecursionError:
        raise BadInput(too_deep, field=field) from None
    if "{" in text and (key := _key_not_text(value)) is not _NONE:
        # json.dumps writes 1, 1.5, True and None as keys "1", "1.5", "true" and "null": the
        # handler would get another value than was given (and {1: …, "1": …} twice one key).
        raise BadInput(
            f"{field} has the key {printable(repr(key), 60)} ({type(key).__name__}): JSON object keys are "
            f"text, so it would arrive as {printable(json.dumps(next(iter(json.loads(json.dumps({key: 0}))))), 60)}; "
            "give the key as a string",
            field=field,
        )
    # (Walked only when it holds enough brackets to be that deep: counting is C-fast.)
    if (
        max_depth is not None
        and text.count("[") + text.count("{") > max_depth
        and (depth := json_depth(value)) > max_depth
    ):
        raise BadInput(f"{too_deep} (it nests {depth})", field=field)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise BadInput(f"{field} holds a lone surrogate ({printable(bad)}), which is not text", field=field) from None
    if _NUL_IN_JSON.search(text):
        raise BadInput(f"{field} holds a NUL character (\\u0000), which a store cannot keep", field=field)
    if limit is not None and size > limit:
        raise TooLarge(f"{field} is {size:,} bytes of JSON; the limit is {limit:,} bytes ({limit // 1024} KiB)", field=field)
    return text


_NONE = object()


def _key_not_text(value: Any) -> Any:
    """The first key of an object in ``value`` that is not a string (``_NONE``: none),
    walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return key
            stack.extend(child for child in item.values() if isinstance(child, (dict, list, tuple)))
        elif isinstance(item, (list, tuple)):
            stack.extend(child for child in item if isinstance(child, (dict, list, tuple)))
    return _NONE


class RepeatedKey(ValueError):
    """A JSON object that names one key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f'gives the key "{printable(key, 60)}" twice (one of its values would be lost)')
        self.key = key


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return value


def json_problem(exc: ValueError) -> str:
    """Why a JSON text was refused, to follow its name: ``is not JSON (…)``, or
    ``gives the key "a" twice (…)``."""
    return str(exc) if isinstance(exc, RepeatedKey) else f"is not JSON ({exc})"


def parse_json(text: str) -> Any:
    """JSON typed or sent by an operator (a body, ``--payload``, a console form), where an
    object that names a key twice is refused (:class:`RepeatedKey`, a ValueError) instead
    of keeping the last: ``{"note": "INC-412", "note": ""}`` would lose the note unsaid.
    ValueError and RecursionError as :func:`json.loads` raises them."""
    return json.loads(text, object_pairs_hook=_once_each)


def check_note(note: object) -> str | None:
    """A schedule's state note as given, or ``None`` for none (an empty one is none)."""
    if note is None:
        return None
    return check_text(note, "note", max_chars=NOTE_MAX_CHARS) or None


def is_id(value: str) -> bool:
    """Whether ``value`` has the shape of a run or backfill id (a ``str``)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_id(value: str, what: str) -> str:
    """``value`` if it can be the id of a ``what`` (``run``, ``backfill``); else NotFound,
    as for any id that names nothing (BadInput for what is no text at all: ``None``, 5)."""
    if not isinstance(value, str):
        raise BadInput(f"{what} id {shown_number(value, 60)} is not text", field="id")
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


def check_datetime(value: object, field: str) -> datetime:
    """:func:`check_instant`, for a value from Python: anything but a datetime is refused,
    named (a string, a number, None)."""
    if not isinstance(value, datetime):
        raise BadInput(f"{field} {shown_number(value)} is not a datetime (give an aware datetime.datetime)", field=field)
    return check_instant(value, field)


def check_seconds(
    value: object, field: str, *, high: float, zero: bool = False, span: str | None = None, label: str | None = None
) -> float:
    """A length of time given in seconds (an int or a float) or as a timedelta, in seconds:
    more than 0 (``zero``: 0 or more) and at most ``high``; :class:`BadInput` naming the
    field and the value (a timedelta's as its seconds) otherwise (a bool, NaN, an
    infinity, a negative length). The message names the value as ``label`` (default: the field) and gives ``high`` in words
    when ``span`` says it ("7 days"). Every length of time a caller gives is checked here."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    # Compared, never converted first: float() of a huge int overflows; NaN fails both.
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
        (0 <= seconds if zero else 0 < seconds) and seconds <= high
    ):
        least = "0 or more" if zero else "more than 0"
        most = f"{high:,.0f}" if high == int(high) else f"{high:,}"
        if span is not None:
            most += f" ({span})"
        raise BadInput(
            f"{label or field} {shown_number(seconds)} must be a number of seconds or a timedelta, {least} and at most {most}",
            field=field,
        )
    return float(seconds)


def out_of_range(field: str, text: str) -> BadInput:
    return BadInput(f'{field} "{printable(text, 60)}" is out of range ({EARLIEST.year} to {LATEST.year - 1})', field=field)


def is_async_callable(obj: Any) -> bool:
    """Whether calling ``obj`` makes a coroutine: a coroutine function (partials of one
    included), or a callable object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(obj) or (callable(obj) and inspect.iscoroutinefunction(obj.__call__))


def check_count(value: object, field: str, low: int, high: int, *, span: str | None = None) -> int:
    """A whole number from ``low`` to ``high``: :class:`BadInput` naming the value, which
    says "is not a whole number" for a float, a bool or a string (1.0, True and "3" were
    told they were out of range, with their value inside it) and "is out of range" for a
    whole one outside (``span``: the range as written there; ``low-high`` otherwise, its
    thousands separated from 10,000)."""
    span = span or (f"{low}-{high}" if high < 10_000 else f"{low:,}-{high:,}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{field} {shown_number(value, 60)} is not a whole number ({span})", field=field)
    if not low <= value <= high:
        raise BadInput(f"{field} {shown_number(value, 60)} is out of range ({span})", field=field)
    return value


def shown_number(value: object, limit: int = 40) -> str:
    """``value`` as a refusal quotes it: its repr, cut to ``limit`` characters (a huge
    int's repr may not even be made: Python refuses past 4300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<a number>"
    return printable(text, limit)


#: Numbers as they are typed: ASCII digits only (int() and float() would take other
#: scripts' digits, and 1_0, for 10).
_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


#: Past this many digits a number typed is taken as ±10**this: beyond every bound, and
#: compared as such (``int()`` refuses past 4,300 digits; the refusal must say out of range).
_MOST_DIGITS = 4000
_BEYOND: int = 10**_MOST_DIGITS


def whole_number(text: str) -> int:
    """``text`` as a whole number written in ASCII digits; ValueError otherwise. A number
    of more than 4,000 digits is ±10**4000 (past any bound), never refused as no number;
    quote what was typed, not the value, in a refusal."""
    if not _WHOLE.fullmatch(text):
        raise ValueError(text)
    if len(text) > _MOST_DIGITS:  # (int() counts leading zeros too)
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > _MOST_DIGITS:
            return -_BEYOND if text.startswith("-") else _BEYOND
        return -int(digits) if text.startswith("-") else int(digits)
    return int(text)


def decimal_number(text: str) -> float:
    """``text`` as a finite number written in ASCII (``2``, ``0.5``, ``1e3``); ValueError otherwise."""
    value = float(text) if _DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(value):  # not written so, or beyond a float ("1e999")
        raise ValueError(text)
    return value
