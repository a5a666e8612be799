"""Reading a cron expression's text: fields, macros, validation, and each field's value set.

The syntax is the one :mod:`backend.cron` documents. :func:`parse` splits an expression
and checks every field; :func:`expand` turns the checked fields into their sets of values.
Problems raise :class:`Invalid` with what is wrong; :class:`~backend.cron.Cron` adds the
expression and zone to make the user's message.

croniter is the parser that expands each field into its set of values. We hand it a
canonical spelling of every item (numbers only, ranges only when they really are ranges)
because some of its own spellings mean something else (it reads ``5-5`` as the whole
field). Everything after the expansion, the matching and the DST rules, is done in
:mod:`backend.cronfields` and :mod:`backend.cron`.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from croniter import croniter  # type: ignore[import-untyped, unused-ignore]

__all__ = ["FieldValues", "Invalid", "expand", "parse"]

# Field names used in error messages, in our (seconds-first) order of the six slots.
_SECOND_F, _MINUTE_F, _HOUR_F, _DOM_F, _MONTH_F, _DOW_F = range(6)
_FIELD_NAMES: Final = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
# Value bounds as a user may write them; day-of-week accepts 7 for Sunday.
_BOUNDS: Final = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTH_NAMES: Final = {
    name: i + 1
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}
_DOW_NAMES: Final = {
    name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Only ASCII whitespace separates fields (cron and croniter agree); a no-break space
# inside a field stays there and makes that field invalid.
_SPACE_RE: Final = re.compile(r"[ \t\n\r\f\v]+")
_VALUE_RE: Final = re.compile(r"[0-9]+|[A-Za-z]+", re.ASCII)
_DIGITS_RE: Final = re.compile(r"[0-9]+", re.ASCII)
# Croniter extensions we refuse, so the error can name the syntax instead of saying
# "not a value" about something the user copied from a Quartz or Jenkins schedule.
_HASH_RE: Final = re.compile(r"[HR](\(\d+-\d+\))?(/\d+)?", re.ASCII | re.IGNORECASE)
_DOM_L_RE: Final = re.compile(r"L(-\d+)?|LW", re.ASCII | re.IGNORECASE)
_DOM_W_RE: Final = re.compile(r"\d+W|W\d+", re.ASCII | re.IGNORECASE)
_DOW_L_RE: Final = re.compile(r"\d*L|L\d+|[a-z]{3}L", re.ASCII | re.IGNORECASE)


class Invalid(Exception):
    """What is wrong with the expression, before the full message is built."""


class FieldValues(NamedTuple):
    """The sorted values of the six slots; day-of-week runs 0-6 (Sunday is 0, never 7)."""

    second: tuple[int, ...]
    minute: tuple[int, ...]
    hour: tuple[int, ...]
    dom: tuple[int, ...]
    month: tuple[int, ...]
    dow: tuple[int, ...]


def _cut(text: str) -> str:
    return text if len(text) <= 20 else text[:20] + "…"


def _small_number(digits: str) -> int | None:
    """The value of ASCII ``digits``, or ``None`` past nine of them (leading zeros aside):
    beyond every field's range, and ``int()`` refuses past 4300 digits."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 9 else None


def _parse_value(text: str, field: int) -> int:
    """One value of a field: a number in range, or a name where the field has names."""
    name = _FIELD_NAMES[field]
    if _DIGITS_RE.fullmatch(text):
        low, high = _BOUNDS[field]
        value = _small_number(text)
        if value is None or not low <= value <= high:
            raise Invalid(f"{name} {_cut(text) if value is None else value} out of range ({low}-{high})")
        return value
    names = _MONTH_NAMES if field == _MONTH_F else _DOW_NAMES if field == _DOW_F else {}
    value_of_name = names.get(text.lower())
    if value_of_name is None:
        raise Invalid(f'{name} "{text}" is not a value')
    return value_of_name


def _nonstandard(item: str, field: int) -> str | None:
    """The name of the non-standard syntax ``item`` uses, if it looks like one."""
    if "#" in item:
        return "#"
    if item == "?":
        return "?"
    if _HASH_RE.fullmatch(item):
        return item[0].upper()
    if field == _DOM_F and _DOM_L_RE.fullmatch(item):
        return "L"
    if field == _DOM_F and _DOM_W_RE.fullmatch(item):
        return "W"
    if field == _DOW_F and _DOW_L_RE.fullmatch(item):
        return "L"
    return None


def _canonical_field(text: str, field: int) -> str:
    """Validate one field and spell it the way croniter expands unambiguously.

    croniter turns an equal range such as ``5-5`` into the whole field and wraps reversed
    ranges; we only ever give it single values, ``*``, ``*/step`` and upward ranges.
    """
    name = _FIELD_NAMES[field]
    high_bound = _BOUNDS[field][1]
    items: list[str] = []
    for item in text.split(","):
        if not item:
            raise Invalid(f'{name} "{text}" has an empty list item')
        syntax = _nonstandard(item, field)
        if syntax is not None:
            raise Invalid(f'{name} "{item}" uses the non-standard "{syntax}" syntax')
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _DIGITS_RE.fullmatch(step_text):
                raise Invalid(f'step "{step_text}" in {name} "{item}" is not a number')
            small = _small_number(step_text)
            if small is None:
                raise Invalid(f'step "{_cut(step_text)}" in {name} is too large')
            step = small
            if step == 0:
                raise Invalid(f'step 0 in {name} "{item}"')
        if base == "*":
            if not slash and "," in text:  # (Vixie cron reads it as the whole field; nobody means that)
                raise Invalid(f'{name} "{text}" lists "*" beside other values ("*" alone means every value)')
            items.append(f"*/{step}" if slash else "*")
            continue
        first_text, dash, last_text = base.partition("-")
        if not _VALUE_RE.fullmatch(first_text) or (dash and not _VALUE_RE.fullmatch(last_text)):
            raise Invalid(f'{name} "{item}" is malformed')
        first = _parse_value(first_text, field)
        if dash:
            last = _parse_value(last_text, field)
            if first > last:
                hint = "; Sunday is also 7" if field == _DOW_F else ""
                raise Invalid(f'{name} range "{base}" is reversed (write it low-high{hint})')
        elif slash:
            last = high_bound  # "a/step" runs to the end of the field, as in cronie
        else:
            last = first
        if first == last:
            items.append(str(first))
        elif step == 1:
            items.append(f"{first}-{last}")
        else:
            items.append(f"{first}-{last}/{step}")
    return ",".join(items)


def parse(expr: str) -> tuple[list[str], list[str]]:
    """Split, expand macros and validate; return (tokens as written, canonical).

    The canonical list always has six fields, seconds first (``"0"`` for five fields).
    """
    stripped = _SPACE_RE.sub(" ", expr).strip(" ")
    if not stripped:
        raise Invalid("empty expression")
    if stripped.startswith("@"):
        macro = stripped.lower()
        if macro not in _MACROS:
            raise Invalid(
                f'macro "{stripped}" is not supported (use @yearly, @annually, '
                "@monthly, @weekly, @daily, @midnight or @hourly)"
            )
        stripped = _MACROS[macro]
    tokens = stripped.split(" ")
    if len(tokens) not in (5, 6):
        raise Invalid(f"expected 5 or 6 fields, got {len(tokens)}")
    offset = 0 if len(tokens) == 6 else 1
    canonical = ["0"] if offset else []
    for i, token in enumerate(tokens):
        canonical.append(_canonical_field(token, i + offset))
    return tokens, canonical


def expand(canonical: list[str], has_seconds: bool) -> FieldValues:
    """The value sets of the canonical fields :func:`parse` returned."""
    # croniter wants seconds last unless told otherwise; we tell it, so that its
    # field order is (minute, hour, dom, month, dow, second) for six fields.
    try:
        expanded, nth = croniter.expand(
            " ".join(canonical if has_seconds else canonical[1:]),
            second_at_beginning=True,
        )
    except (ValueError, TypeError) as exc:  # should not happen after our validation
        raise Invalid(f"rejected by the cron parser ({type(exc).__name__})") from None
    if nth:  # pragma: no cover - "#" never reaches croniter
        raise Invalid('uses the non-standard "#" syntax')
    seconds = expanded[5] if has_seconds else [0]
    sets = [seconds, *expanded[:5]]
    values: list[tuple[int, ...]] = []
    for field, raw in enumerate(sets):
        low, high = _BOUNDS[field]
        if field == _DOW_F:
            high = 6
        if raw == ["*"]:
            vals = tuple(range(low, high + 1))
        else:
            vals = tuple(sorted({0 if (field == _DOW_F and v == 7) else int(v) for v in raw}))
        if not vals or any(not low <= v <= high for v in vals):  # pragma: no cover
            raise Invalid(f"{_FIELD_NAMES[field]} could not be expanded")
        values.append(vals)
    return FieldValues(*values)
