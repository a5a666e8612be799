"""The one exception tree of schedtui.

Every error the engine, the stores, the HTTP API and the remote client raise on purpose
derives from :class:`SchedtuiError`. Each carries a short ``title`` and an operator-facing
``message``, so the console can show it as a notification and the API as JSON without
knowing the concrete type. Where a built-in exception fits, the subclass inherits it too,
so ``except ValueError`` keeps working for callers who never heard of schedtui::

    SchedtuiError
    ├── DefinitionError (ValueError)      a schedule that cannot exist as written
    │   ├── CronError                     bad cron expression or timezone
    │   └── DiscoveryError                definitions files that fail to load (every problem)
    ├── BadInput (ValueError)             an operator or API argument that makes no sense
    │   └── TooLarge                      a value over its size limit (a job's payload)
    ├── NotFound (LookupError)            unknown schedule, run or backfill
    ├── Refused                           a valid request the engine declines (count, reason)
    ├── Unauthorized (PermissionError)    no or a wrong token
    ├── Forbidden (PermissionError)       a read-only caller tried to act
    ├── InUse                             another process already fires this embedded store
    ├── Unavailable (ConnectionError)     the store or the remote engine cannot be reached
    └── ListenError (OSError)             serve cannot listen on its address (a taken port)
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from datetime import datetime
from typing import cast

from backend.safetext import printable, redact

__all__ = [
    "BadInput",
    "CronError",
    "DefinitionError",
    "DiscoveryError",
    "EngineStopped",
    "Forbidden",
    "InUse",
    "ListenError",
    "NameTaken",
    "NotFound",
    "Refused",
    "SchedtuiError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "describe_exception",
]


class SchedtuiError(Exception):
    """Root of every deliberate schedtui error."""

    title: str = "Error"
    """A few words naming the kind of problem, e.g. for a notification's title."""

    #: Machine-readable code used in the HTTP API's ``{"error": {"code", "message"}}``.
    code: str = "error"

    def __init__(self, message: str) -> None:
        message = redact(message)  # a store's error text may quote its password
        super().__init__(message)
        self.message = message
        """The whole sentence for an operator; names the bad value where there is one."""
        self.public = message
        """What a client of the HTTP API is told: the message, unless it says where the
        store lives (see :class:`Unavailable`)."""

    def __str__(self) -> str:
        return self.message


class DefinitionError(SchedtuiError, ValueError):
    """A schedule definition that cannot be accepted."""

    title = "Invalid schedule"
    code = "invalid_definition"


class CronError(DefinitionError):
    """A cron expression or timezone that cannot be used.

    The message names the expression, the zone and what is wrong, e.g.
    ``invalid cron expression "0 25 * * *" (tz="UTC"): hour 25 out of range``.
    """

    title = "Invalid cron expression"
    code = "invalid_cron"


class DiscoveryError(DefinitionError):
    """Definitions files that could not be imported or clash with one another.

    ``problems`` lists each one (``path:line: problem``); the message is the only one, or
    all of them under a count."""

    title = "Schedule discovery failed"
    code = "discovery_failed"

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


class BadInput(SchedtuiError, ValueError):
    """An argument that makes no sense (a malformed date, a limit above the ceiling, …)."""

    title = "Bad input"
    code = "bad_input"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        """The name of the offending field, when the input came as named fields."""


class TooLarge(BadInput):
    """A value larger than its limit (a job's payload over 256 KiB): HTTP 413."""

    title = "Too large"
    code = "too_large"


class NotFound(SchedtuiError, LookupError):
    """An unknown schedule, run or backfill."""

    title = "Not found"
    code = "not_found"


class Refused(SchedtuiError):
    """A well-formed request the engine declines, with how many slots and why.

    Raised by a backfill that needs confirmation, exceeds its limit, is reversed, empty or
    reaches into the future, or collides with a backfill already running.
    """

    title = "Refused"
    code = "refused"

    def __init__(self, message: str, *, count: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.count = count
        """The number of slots concerned (``None`` when it does not apply)."""
        self.reason = reason or message
        """Why, in a few words (e.g. ``needs confirmation``)."""


class Unauthorized(SchedtuiError, PermissionError):
    """No token, or a wrong one."""

    title = "Unauthorized"
    code = "unauthorized"

    def __init__(self, message: str, *, token_sent: bool | None = None) -> None:
        super().__init__(message)
        self.token_sent = token_sent
        """Whether the client sent a token (``None``: not known here): a missing token and a
        refused one are told apart, and told how to give one, by the client's surface."""


class Forbidden(SchedtuiError, PermissionError):
    """The caller may read but not act (read token or read-only mode)."""

    title = "Read-only"
    code = "forbidden"


class Unavailable(SchedtuiError, ConnectionError):
    """The store or the remote engine cannot be reached right now.

    ``public``: the same failure told without where the store lives (its path, host, port,
    user, database), for clients of the HTTP API; the message, for the operator's log and
    command line, names it (see :func:`backend.store.store_unavailable`)."""

    title = "Unavailable"
    code = "unavailable"

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        if public is not None:
            self.public = redact(public)


class EngineStopped(Unavailable):
    """An action (or a start) asked of an engine that has stopped, is stopping, or was
    started on an event loop that has ended: an Engine runs once, on one loop."""

    title = "Engine stopped"


class ListenError(SchedtuiError, OSError):
    """``serve`` cannot listen on its address: the port is taken, the host unknown, …"""

    title = "Cannot listen"
    code = "cannot_listen"


class InUse(SchedtuiError):
    """Another process holds what this one needs: the firing of this embedded (SQLite)
    store's schedules, or this instance's name; the message names it."""

    title = "Store in use"
    code = "in_use"


class NameTaken(Unavailable):
    """A heartbeat that was not written: another process (``host``, ``pid``) holds this
    instance's name, its heartbeat at ``heartbeat_at`` fresher than the take-over window
    (this process's, or the holder's own ``window`` in seconds when longer; ``None``: an
    older version's row, which gives none). The instance cannot renew its lease meanwhile
    (so it stops its work, as in an outage)."""

    def __init__(self, instance: str, host: str, pid: int, heartbeat_at: datetime, window: float | None = None) -> None:
        self.instance, self.host, self.pid, self.heartbeat_at = instance, host, pid, heartbeat_at
        self.window = window
        where = host.split("#")[0]
        super().__init__(
            f'the instance name "{printable(instance)}" is held by another live process (pid {pid} on host '
            f'"{printable(where)}", heartbeat at {heartbeat_at.isoformat()}): give each instance its own name '
            "(--instance)",
            public="this instance's name is held by another live process",
        )


# ---------------------------------------------------------------------------------------
# how a handler's exception is recorded
# ---------------------------------------------------------------------------------------
#: The getters of a class's real name (``type(x).__name__`` asks the metaclass, which may
#: override it) and of an exception's real traceback (``exc.__traceback__`` asks the
#: exception's own ``__getattribute__``).
_CLASS_NAME = type.__dict__["__name__"]
_TRACEBACK = BaseException.__dict__["__traceback__"]


def _class_name(obj: object) -> str:
    # type(obj), never obj.__class__: that is an attribute the object may fake or make raise;
    # and a plain str (a class's name may be set to a str subclass).
    return str.__str__(_CLASS_NAME.__get__(type(obj)))


#: How many of an exception group's leaves its description names (the traceback has all).
GROUP_LEAVES_SHOWN = 3
_GROUP_EXCEPTIONS = BaseExceptionGroup.__dict__["exceptions"]


def _leaves(group: BaseExceptionGroup[BaseException]) -> str:
    """The exceptions an exception group holds, nested groups flattened, as ``Tag:
    message`` (what a TaskGroup's ``unhandled errors in a TaskGroup (1 sub-exception)``
    alone does not say); the first :data:`GROUP_LEAVES_SHOWN`, then how many more."""
    found: list[BaseException] = []
    pending: list[tuple[BaseException, int]] = [(group, 0)]
    while pending:
        exc, depth = pending.pop()
        if issubclass(type(exc), BaseExceptionGroup) and depth < 20:
            try:  # (the real attribute: a subclass may fake or break its own)
                inner = tuple(_GROUP_EXCEPTIONS.__get__(exc))
            except BaseException:  # noqa: BLE001 - describing a failure must not fail
                inner = ()
            pending.extend((leaf, depth + 1) for leaf in reversed(inner))
        elif exc is not group:
            found.append(exc)
    shown = []
    for leaf in found[:GROUP_LEAVES_SHOWN]:
        tag = _class_name(leaf)
        text = _text(leaf, str)[0]
        shown.append(f"{tag}: {text}" if text else tag)
    more = len(found) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "") if shown else "(no exception inside)"


def _text(exc: BaseException, how: Callable[[object], str]) -> tuple[str | None, str | None]:
    """``how(exc)`` (``str`` or ``repr``) as a plain str, or the class of what it raised."""
    try:
        text = how(exc)
        # A str subclass's own methods (slicing, truth) could raise in turn: make it plain.
        return str.__str__(text), None
    except BaseException as failure:  # noqa: BLE001 - describing a failure must not fail
        return None, _class_name(failure)


def describe_exception(exc: BaseException) -> tuple[str, str, str]:
    """How a handler's exception is recorded: ``(tag, message, traceback)``, the tag being
    the name of its class.

    Never raises, whatever the exception does: a ``__str__`` or ``__repr__`` that raises
    (anything, ``SystemExit`` included) or returns a str subclass, a ``__class__`` or a
    metaclass ``__name__`` that raises, attributes that cannot be read, a traceback that
    cannot be formatted. What cannot be had is said in its place, so that the failure is
    recorded at once (a description that raised would leave the call unsettled)."""
    tag = _class_name(exc)
    message, str_failed = _text(exc, str)
    if not message:
        shown, repr_failed = _text(exc, repr)
        if str_failed is None:
            message = shown or tag
        elif shown is not None:
            message = f"{shown} (its str() raised {str_failed})"
        else:
            message = f"{tag} (its str() raised {str_failed}, its repr() {repr_failed})"
    if issubclass(type(exc), BaseExceptionGroup):  # (isinstance would ask exc.__class__, which may raise)
        message = f"{message}: {_leaves(cast(BaseExceptionGroup[BaseException], exc))}"
    try:
        trace = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - its attributes (notes, cause, …) would not format
        try:
            frames = traceback.format_tb(_TRACEBACK.__get__(exc))
        except BaseException:  # noqa: BLE001
            frames = []
        trace = "".join(["Traceback (most recent call last):\n", *frames, f"{tag}: {message}\n"])
    return tag, message, trace
