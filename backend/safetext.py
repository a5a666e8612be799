"""Text fit to show: secrets redacted, control characters escaped.

Two ways a secret leaks into what an operator sees: a URL shown as it was given (a store
URL's password, in its user part or in its query; a server URL's ``user:pass@``), and an
exception text that quotes it (libpq echoes pieces of a connection string it cannot parse,
the password included). :func:`redact_url` handles the first by structure. For the second,
the secrets this process was given are remembered (:func:`remember_secret`,
:func:`remember_url_secrets`), and :func:`redact` replaces them in any text: every
:class:`~backend.errors.SchedtuiError` message passes through it, and so does every log line
formatted by :class:`RedactingFormatter`.

:func:`printable` escapes what a client sent before it goes into a log line, so a request
path cannot forge log lines or send escape sequences to a terminal.

:data:`NOT_TEXT` is the one definition of what a stored text may not hold; input holding it
is refused (:func:`backend.inputs.check_text`), and what a store holds already (written
before it was refused, or by a handler) is escaped on the way out (:func:`escape_text`,
:func:`load_json`), so that no read fails on it. :func:`store_text` is how both stores write
a handler's text (an exception's message, a log line) that may hold a NUL or a lone surrogate.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, overload
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = [
    "MASK",
    "MAX_JSON_DEPTH",
    "NOT_JSON_TEXT",
    "NOT_TEXT",
    "in_line",
    "in_lines",
    "RedactingFormatter",
    "TerminalFormatter",
    "escape_json",
    "escape_text",
    "json_depth",
    "load_json",
    "printable",
    "redact",
    "redact_url",
    "remember_secret",
    "remember_url_secrets",
    "shallow_json",
    "store_text",
]

MASK = "***"

#: libpq's connection parameters that hold a secret (``password`` and the key file's one).
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})

#: Shorter values are not searched for in free text: replacing every "ab" would garble it.
#: (They are still removed from URLs, by structure.)
_MIN_SECRET = 4

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()

# ``password=value`` in a libpq keyword/value string (the value bare, or single-quoted). A
# value already masked is left with what follows it: a URL's query redacted by structure,
# then quoted in a message (``the store "postgresql://?…&password=***": …``), kept its
# closing quote and colon.
_KEYWORD_VALUE = re.compile(
    r"(?i)\b(password|sslpassword)(\s*=\s*)(\*\*\*(?=[\s\"'),;:]|$)|'(?:[^'\\]|\\.)*'|[^\s&]+)"
)


def remember_secret(value: str | None) -> None:
    """Redact ``value`` from every error message and log line of this process from now on."""
    global _pattern
    if not value or len(value) < _MIN_SECRET:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        # Longest first: a secret that contains another is replaced whole.
        alternatives = sorted(_secrets, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in alternatives))


def remember_url_secrets(url: str) -> None:
    """Remember the passwords a URL carries (user part and query), as written and decoded,
    and a PostgreSQL URL's or conninfo's as libpq itself reads them."""
    for secret in _url_secrets(url):
        remember_secret(secret)
        remember_secret(unquote(secret))
    if url.partition("://")[0].lower() in _LIBPQ_SCHEMES or "=" in url:
        try:
            given = conninfo_to_dict(url)
        except (psycopg.Error, ValueError, TypeError):
            return  # (what libpq cannot read connects nowhere; its error is redacted by structure)
        for key in SECRET_PARAMETERS:
            value = given.get(key)
            if isinstance(value, str):
                remember_secret(value)


def redact(text: str) -> str:
    """``text`` with every remembered secret, every URL's password and any ``password=…``
    replaced by ``***``."""
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    # A URL quoted in an error text (libpq quotes a whole URL it cannot parse) loses its
    # password by structure, even one this process was never told about. (Each pattern is
    # tried only on a text that holds what it needs: most log lines hold neither.)
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group()), text)
    if "=" not in text:
        return text
    return _KEYWORD_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)


#: The URL schemes libpq takes (its own reading of the user part, see :func:`_split`).
_LIBPQ_SCHEMES = ("postgresql", "postgres")

# A URL inside free text: its scheme, then everything up to a blank, a quote or a bracket.
_URL_IN_TEXT = re.compile(r"""\b[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>`]+""")


def _split(url: str) -> tuple[str, str, str | None, str, list[tuple[str, str, str]], str] | None:
    """``scheme://user:password@hostport/path?query#fragment`` taken apart by structure
    alone (nothing here raises, whatever the URL holds): ``(scheme, user, password or None,
    the rest of the address and the path, the query's (key, "=" or "", value) pairs, "#"
    and the fragment)``; ``None`` when it is no URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if scheme.lower() in _LIBPQ_SCHEMES:
        # libpq reads the user part up to an "@" before any "/", "?" and "#" included: a
        # password "Pa55?word" is one to it (and a generic reading would show it whole).
        slash = rest.find("/")
        at = rest.rfind("@", 0, len(rest) if slash < 0 else slash)
        if at > end and ":" in rest[:at]:
            end = min((i for i in (rest.find(c, at + 1) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    user, password = "", None
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        password = secret if colon else None
        netloc = hostport
        user += "@" if password is None else ""
    path, qmark, query = tail.partition("?")
    pairs: list[tuple[str, str, str]] = []
    fragment = ""
    if qmark:
        query, hash_, after = query.partition("#")
        pairs = [pair.partition("=") for pair in query.split("&")]
        fragment = hash_ + after
    else:
        path, hash_, after = path.partition("#")
        fragment = hash_ + after
    return scheme, user, password, netloc + path, pairs, fragment


def redact_url(url: str) -> str:
    """A URL fit to show or log: the password in its user part and every secret query
    parameter (``password``, ``sslpassword``) replaced by ``***``. Also takes a libpq
    keyword/value string (``host=db password=…``). Everything else is left as written."""
    parts = _split(url)
    if parts is None:
        return _KEYWORD_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", url)
    scheme, user, password, address, pairs, fragment = parts
    shown = f"{scheme}://{user}{'' if password is None else f':{MASK}@'}{address}"
    if pairs:
        shown += "?" + "&".join(
            f"{key}={MASK}" if eq and unquote(key).lower() in SECRET_PARAMETERS else f"{key}{eq}{value}"
            for key, eq, value in pairs
        )
    return shown + fragment


def _url_secrets(url: str) -> list[str]:
    parts = _split(url)
    if parts is None:
        return [m.group(3).strip("'") for m in _KEYWORD_VALUE.finditer(url)]
    _, _, password, _, pairs, _ = parts
    found = [password] if password else []
    # As written, and decoded by remember_url_secrets: an error text may quote either.
    found += [value for key, eq, value in pairs if eq and unquote(key).lower() in SECRET_PARAMETERS]
    return found


class RedactingFormatter(logging.Formatter):
    """A log formatter whose output (message and traceback) has every secret redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class TerminalFormatter(RedactingFormatter):
    """:class:`RedactingFormatter` for a terminal or a journal: every control character but
    tab and newline escaped (see :func:`in_lines`), so that no text a record quotes (a
    handler's error, a name) sends an escape sequence to whoever follows the log."""

    def format(self, record: logging.LogRecord) -> str:
        return in_lines(super().format(record))


#: What a terminal draws in no cell, or takes for a command: control characters, line
#: separators, lone surrogates, and the bidirectional embedding, override and isolate
#: controls, which make a terminal that honours them draw the rest of the line in another
#: order (a holder's name, a description: whoever wrote the row; a name typed, quoted back).
_NOT_IN_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

#: The other format characters (Unicode's category Cf): invisible, so a value quoted in a
#: message looked like a good one (a file saved with a byte-order mark, U+FEFF; a zero-width
#: space). All of them but the zero-width joiner and non-joiner, which join the letters of
#: some scripts and the emoji of a sequence: text that holds them is text as written.
_FORMAT = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b\u200e\u200f\u2060-\u2064\u206a-\u206f"
    "\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)

#: What :func:`in_line` and :func:`printable` escape: :data:`_NOT_IN_LINE` and :data:`_FORMAT`.
_ESCAPED_IN_LINE = re.compile(rf"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff{_FORMAT}]")


def in_line(text: str) -> str:
    """``text`` fit for one line of a terminal, whole: every control character, line
    separator, bidirectional control, lone surrogate and other invisible format character
    as its escape (``\\x1b``, ``\\u202e``, ``\\ufeff``). What the command line's tables and
    messages show of stored text."""
    return _ESCAPED_IN_LINE.sub(_escape, text)


#: :data:`_ESCAPED_IN_LINE` but tab and newline: what :func:`in_lines` escapes.
_NOT_IN_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff{_FORMAT}]")


def in_lines(text: str) -> str:
    """``text`` fit for a terminal over several lines (a traceback, a log): as
    :func:`in_line`, but tabs and newlines are kept."""
    return _NOT_IN_LINES.sub(_escape, text)


def in_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``, which escapes only the C0
    controls) with each other character :func:`in_lines` would escape written as its JSON
    escape (``\\u202e``, ``\\u009b``; one past U+FFFF as its surrogate pair): the same JSON,
    safe for a terminal. (None of them can stand outside a JSON string.)"""
    return _NOT_IN_LINES.sub(_json_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def never_drawn(text: str) -> str:
    """``text`` without what a terminal takes for a command or a change of direction
    (:data:`_NOT_IN_LINE`, each of which a terminal draws in no cell), and each lone
    surrogate (which no terminal encoding can carry) as U+FFFD, one cell as it was
    measured: the same cells, drawn; see :mod:`console.unprintable`."""
    return _NOT_IN_LINE.sub(_never_drawn, text)


def _never_drawn(match: re.Match[str]) -> str:
    return "\ufffd" if "\ud800" <= match.group() <= "\udfff" else ""


def printable(text: str, limit: int = 200) -> str:
    """``text`` with control characters (lone surrogates, bidirectional controls) as escapes, cut to
    ``limit`` characters: what a client sent, fit for one log line."""
    if len(text) > limit:
        text = text[:limit] + "…"
    return _ESCAPED_IN_LINE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


#: Characters a stored text may not hold: control characters but tab and newline (NUL is
#: refused by PostgreSQL; the others would reach an operator's terminal) and the lone
#: surrogates that no UTF-8 store or response can encode.
NOT_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
#: What a JSON value may not hold (:func:`backend.inputs.check_json`): a NUL, which
#: PostgreSQL cannot keep, and lone surrogates.
NOT_JSON_TEXT = re.compile(r"[\x00\ud800-\udfff]")
# Either, written as a JSON escape (as json.dumps writes them).
_NOT_JSON_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_text(text: str) -> str:
    """``text`` with each character of :data:`NOT_TEXT` written as its escape (``\\x00``,
    ``\\ud800``): a stored text fit to show, send as UTF-8, and check again as input."""
    return NOT_TEXT.sub(_escape, text)


@overload
def store_text(value: str) -> str: ...
@overload
def store_text(value: None) -> None: ...
@overload
def store_text(value: str | None) -> str | None: ...
def store_text(value: str | None) -> str | None:
    """``value`` as a store writes it: each NUL as ``\\0`` and each lone surrogate as its
    escape (``\\ud800``), as the PostgreSQL store has always written a handler's text (it
    refuses both; SQLite cannot encode a lone surrogate). Any other text, ASCII or not, is
    written as it is and reads back the same, on either store."""
    if value is None or value.isascii() and "\x00" not in value:
        return value
    return value.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def escape_json(value: Any) -> Any:
    """A JSON value (of ``json.loads``) with each character of :data:`NOT_JSON_TEXT` in
    its strings and keys written as its escape (``\\x00``, ``\\ud800``): it encodes as
    UTF-8, and passes the input checks again. Other characters are left alone: JSON
    carries them escaped."""
    if isinstance(value, str):
        return NOT_JSON_TEXT.sub(_escape, value)
    if isinstance(value, list):
        return [escape_json(item) for item in value]
    if isinstance(value, dict):
        return {escape_json(key): escape_json(item) for key, item in value.items()}
    return value


#: The deepest nesting of arrays and objects a JSON value given as input may have (a job's
#: payload, a durable input, a signal's payload). Python's encoder recurses: a value nested
#: about 1,000 deep fails where the stack runs out, and one a little shallower was taken,
#: then failed every page that listed it (the page wraps it a few levels deeper).
MAX_JSON_DEPTH = 64


def json_depth(value: Any) -> int:
    """How deep ``value``'s arrays and objects nest (a scalar: 0, ``[]``: 1, ``[[1]]``: 2),
    walked without recursion, so any depth can be measured."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def shallow_json(value: Any, depth: int) -> Any:
    """``value`` with whatever nests deeper than ``depth`` levels replaced by a string that
    says so: what a response sends of a stored value too deep to encode (one stored before
    :data:`MAX_JSON_DEPTH` was checked), rather than failing the whole page."""
    if not isinstance(value, (dict, list, tuple)):
        return value
    if depth <= 0:
        return "… (nested too deeply to be shown)"
    if isinstance(value, dict):
        return {key: shallow_json(item, depth - 1) for key, item in value.items()}
    return [shallow_json(item, depth - 1) for item in value]


def load_json(text: str) -> Any:
    """A JSON text read from a store, as a value fit to show and send: what
    :func:`escape_json` makes of it. Parsed once; walked only when it can hold one of those.
    A text nested too deeply to parse (stored before input was held to
    :data:`MAX_JSON_DEPTH` levels) reads as a string that says so: the read does not fail."""
    try:
        value = json.loads(text)
    except RecursionError:
        return shallow_json([], 0)
    # (The searches, first ruled out the cheap way: a character class scans ~150 MB/s, and
    # a page of jobs of 256 KiB is read on the engine's loop.)
    plain = text.isascii() and "\x00" not in text or NOT_JSON_TEXT.search(text) is None
    if plain and ("\\u" not in text or _NOT_JSON_ESCAPE.search(text) is None):
        return value
    return escape_json(value)
