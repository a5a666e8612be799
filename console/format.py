"""How schedtui writes times, durations and statuses for people (CLI tables and the console)."""

from __future__ import annotations

import functools
import os
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from backend.jobs.model import Attempt
from backend.safetext import in_line
from backend.timeparse import compact_delta as compact_delta  # (the console's spans, as the engine's messages write them)

STATUS_GLYPHS = {
    "succeeded": "✓",
    "failed": "✗",
    "skipped": "↷",
    "missed": "⊘",
    "running": "▶",
}
# One terminal cell each (no emoji): they must line up in tmux and over SSH.
OUTCOME_GLYPHS = {
    "single": "●",
    "wonLock": "◆",
    "cluster": "◈",
    "external": "⇲",
    "manual": "✎",
}

#: Durable executions and their steps, likewise one cell each.
EXECUTION_GLYPHS = {
    "queued": "○",
    "running": "▶",
    "waiting": "◷",
    "succeeded": "✓",
    "failed": "✗",
    "cancelled": "⊘",
}
STEP_GLYPHS = {"running": "▶", "waiting": "◷", "succeeded": "✓", "failed": "✗", "cancelled": "⊘", "ended": "⊘"}
#: What a finished execution's step is that never finished itself.
_OPEN_STEPS = ("waiting", "running")


def step_status(step: str, execution: str) -> str:
    """A step's status as shown: one still ``waiting`` or ``running`` in an execution that
    has ended (failed, cancelled) is ``ended``: it waits for nothing and runs nowhere (a
    sleep was shown "waiting until …" in an execution failed ``nondeterministic``)."""
    if step in _OPEN_STEPS and execution in ("succeeded", "failed", "cancelled"):
        return "ended"
    return step


def operator_zone() -> str:
    """The operator's IANA zone: ``$TZ`` when it names one, else the zone ``/etc/localtime``
    links to, else ``UTC``. (A name, not a fixed offset: a week on a timeline may cross a
    daylight-saving change.)"""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = str(Path("/etc/localtime").resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for name in candidates:
        if name:
            try:
                ZoneInfo(name)
                return "UTC" if name in ("Etc/UTC", "Etc/UCT", "UCT", "Universal", "Zulu", "Etc/Zulu") else name
            except (ZoneInfoNotFoundError, ValueError, OSError):  # (OSError: TZ=Europe, a folder; a name too long)
                continue
    return "UTC"


@functools.lru_cache(maxsize=64)
def zone_of(name: str) -> tzinfo:
    """The zone ``name``; UTC when this host's zone data does not know it (a remote
    server's newer tzdata, a zone only its system has): its times then say UTC, rather
    than take the console down."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return UTC


def zone_abbr(zone: str, at: datetime) -> str:
    """``CET``, ``EDT``, ``UTC``: the zone's abbreviation at that instant."""
    return at.astimezone(zone_of(zone)).strftime("%Z")


#: How far from now a time is written with its year even within the year: "12-30" read on
#: January 2nd is taken for three days ago, not a year on.
YEAR_SHOWN_FROM = timedelta(days=183)


def short_time(dt: datetime | None, zone: str, now: datetime | None, *, seconds: bool = True) -> str:
    """``03-02 09:00:00 CET``: month-day and time in ``zone``; ``2027-12-08 02:29:03 CET``
    for a time in another year than ``now`` or half a year or more from it, or when ``now``
    is not known (a wait's 366-day limit read "until 12-08 02:29:03": tomorrow, to an
    operator, where it meant a year on). ``seconds=False`` leaves the seconds out."""
    if dt is None:
        return "-"
    local = dt.astimezone(zone_of(zone))
    day = "%m-%d"
    if now is None or now.astimezone(local.tzinfo).year != local.year or abs(dt - now) >= YEAR_SHOWN_FROM:
        day = "%Y-%m-%d"
    return local.strftime(f"{day} %H:%M:%S %Z" if seconds else f"{day} %H:%M %Z")


def day_time(dt: datetime, zone: str, now: datetime) -> str:
    """``09:00:00``, the time alone, for a time on ``now``'s day in ``zone``; another day's
    as :func:`short_time` writes it, without the zone (a CREATED column said ``09:00:00``
    for an execution created weeks before)."""
    local = dt.astimezone(zone_of(zone))
    if local.date() == now.astimezone(local.tzinfo).date():
        return local.strftime("%H:%M:%S")
    return short_time(dt, zone, now).rsplit(" ", 1)[0]


def age(then: datetime, now: datetime) -> str:
    """``45s``, ``3m``, ``23h``, ``4d``: one unit, for narrow columns (``0s`` at least)."""
    seconds = max(0, int((now - then).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def local_time(dt: datetime | None, zone: str, *, seconds: bool = True) -> str:
    """``2026-11-30 09:00:00 CET`` in the schedule's zone."""
    if dt is None:
        return "-"
    local = dt.astimezone(zone_of(zone))
    return local.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def countdown(target: datetime | None, now: datetime) -> str:
    """``in 4m 59s`` / ``due`` / ``-``; recomputed from the absolute target every time."""
    if target is None:
        return "-"
    delta = target - now
    if delta <= timedelta(0):
        return "due now"
    if delta < timedelta(seconds=1):
        return "in <1s"
    return "in " + compact_delta(delta)


def ago(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "-"
    delta = now - then
    if delta < timedelta(0):
        return "in " + compact_delta(-delta)
    return compact_delta(delta) + " ago"



def clock_offset(seconds: float | None) -> str:
    """An instance's clock against the database server's, narrow: ``+3ms``, ``-812ms``,
    ``+61.0s``, ``+2h 5m`` (``-`` when not measured)."""
    if seconds is None:
        return "-"
    sign = "+" if seconds > 0 else "-"
    size = abs(seconds)
    if size < 1:
        ms = round(size * 1000)
        return f"{sign}{ms}ms" if ms else "0ms"
    if size < 1000:
        return f"{sign}{size:.1f}s"
    return sign + compact_delta(timedelta(seconds=size))


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return compact_delta(timedelta(milliseconds=ms))


ECHO_CHARS = 40
"""The most of a value the operator typed that a message repeats (a notification, a form's
problem line): enough to recognise it, never a whole pasted payload."""


def cut(text: str, width: int) -> str:
    """``text`` on one line (:func:`~backend.safetext.in_line`: a stored text's escape
    sequence or bidirectional override is shown as its escape), in at most ``width``
    characters: cut with an ellipsis when longer."""
    text = in_line(text)
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


NOTE_CHARS = 120
"""How much of a note (why a schedule is off) a notification repeats: all of most, the
start of a long one, so that the toast fits an 80x24 screen with its title."""


def echo(value: str) -> str:
    """A typed value as a message repeats it: :func:`cut` to :data:`ECHO_CHARS`."""
    return cut(value, ECHO_CHARS)


def echoing(message: str, *values: str) -> str:
    """``message`` (one the console wrote, or the backend's answer) with each of ``values``
    (what the operator typed) that it repeats and that is longer than :data:`ECHO_CHARS`
    cut as :func:`echo` cuts it; the message still names the value."""
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) <= ECHO_CHARS:
            continue
        if value in message:
            message = message.replace(value, echo(value))
            continue
        # Repeated already cut short, as "its beginning…" (the cron's message cuts at 100).
        start = message.find(value[:ECHO_CHARS])
        if start >= 0:
            common = len(os.path.commonprefix([message[start:], value]))
            if message[start + common : start + common + 1] == "…":
                message = message[:start] + echo(value) + message[start + common + 1 :]
    return message


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain, aligned text table (greppable; no box drawing). Each cell is shown
    :func:`~backend.safetext.in_line`: a stored text's escape sequence (a lock holder's name
    that clears the screen, a carriage return that draws over the row) never reaches the
    terminal, whichever table shows it."""
    rows = [[in_line(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    return "\n".join(lines)


def attempt_label(attempt: Attempt, attempts: list[Attempt]) -> str:
    """A job's attempt as ``jobs show`` and the console list it: its number (what
    ``--attempt`` takes); for a job retried from dead, its round and its number within it
    too (the rounds' attempts all count from 1)."""
    if attempts and attempts[-1].round > 1:
        return f"{attempt.number} (round {attempt.round}: {attempt.attempt})"
    return str(attempt.number)
