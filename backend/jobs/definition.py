"""Defining queues, and the limits every job sent to one must keep.

A queue is validated completely when it is defined, like a schedule: a typo fails at
import time naming the queue. The limits of a send are checked in one place
(:func:`check_send`), before anything is written, by every path that sends: the Python
client, handlers, the HTTP API, the CLI and the console; each refusal names the limit and
the value.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from backend.alerts.policy import QueueAlerting, queue_alerting
from backend.defined import caller_location, made
from backend.definitions import register_definition_type
from backend.errors import BadInput, DefinitionError
from backend.inputs import MAX_SENT_JSON_BYTES, check_count, check_json, check_seconds, check_text, is_async_callable, is_id, shown_number
from backend.safetext import MAX_JSON_DEPTH, printable
from backend.schedules import MAX_RUNTIME_LIMIT, NAME_PATTERN, handler_problem

if TYPE_CHECKING:
    from backend.jobs.model import JobContext

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_RUNTIME",
    "MAX_ATTEMPTS",
    "MAX_CONCURRENCY",
    "MAX_DELAY_S",
    "MAX_HELD",
    "MAX_KEY_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Queue",
    "Send",
    "backoff",
    "check_cancel",
    "check_key",
    "check_queue_name",
    "check_send",
    "define_queue",
]

JobHandler = Callable[["JobContext"], Awaitable[Any] | Any]

#: The limits of a job (the README's "Job queue" lists them as a sender meets them).
MAX_PAYLOAD_BYTES: Final = MAX_SENT_JSON_BYTES
MAX_DELAY_S: Final = 30 * 86400
MIN_ATTEMPTS: Final = 1
MAX_ATTEMPTS: Final = 20
MAX_KEY_BYTES: Final = 256
MAX_HELD: Final = 10_000
"""Queued + dead jobs one queue may hold; past it a send is refused (``queue_full``)."""
MAX_CONCURRENCY: Final = 1_000
DEFAULT_CONCURRENCY: Final = 4
DEFAULT_ATTEMPTS: Final = 3
DEFAULT_MAX_RUNTIME: Final = 900.0
#: The retry delay grows from this, doubling, up to the cap (seconds).
BACKOFF_FIRST_S: Final = 10
BACKOFF_MAX_S: Final = 3600
#: Dead jobs are deleted after this long (a schedule's after a day: its next slot is its retry).
DEAD_KEEP: Final = timedelta(days=7)
CRON_DEAD_KEEP: Final = timedelta(days=1)
#: Attempts stay readable this long after they ended.
ATTEMPTS_KEEP: Final = timedelta(days=7)


def backoff(attempt: int, first: int = BACKOFF_FIRST_S) -> int:
    """Seconds before the retry of failed attempt ``attempt`` (1-based): 10, 20, 40 … 3600
    (from ``first``, 10 unless a test shortens it)."""
    return int(min(first * 2 ** min(attempt - 1, 16), BACKOFF_MAX_S))


@dataclass(frozen=True, eq=False)
class Queue:
    """A validated queue definition. Build it with :func:`define_queue`."""

    name: str
    handler: JobHandler
    concurrency: int = DEFAULT_CONCURRENCY
    """At most this many of its jobs run at once, across every instance sharing the store."""
    attempts: int = DEFAULT_ATTEMPTS
    """The attempts a job gets when its sender does not say."""
    max_runtime: float = DEFAULT_MAX_RUNTIME
    description: str | None = None
    source: str | None = field(default=None, compare=False)
    """Where it was defined, as ``path:line``."""
    alert: QueueAlerting = field(default_factory=QueueAlerting, compare=False)
    """Its ``dead_jobs`` alert: see :mod:`backend.alerts.policy`."""

    @property
    def is_async(self) -> bool:
        return is_async_callable(self.handler)

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, concurrency={self.concurrency})"


register_definition_type(Queue, "queue")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def define_queue(
    *,
    name: str,
    handler: JobHandler,
    concurrency: int = DEFAULT_CONCURRENCY,
    attempts: int = DEFAULT_ATTEMPTS,
    max_runtime: float | timedelta = DEFAULT_MAX_RUNTIME,
    description: str | None = None,
    alert: Any = None,
) -> Queue:
    """Define a named job queue; raises :class:`DefinitionError` on anything invalid.

    ``alert`` overrides its ``dead_jobs`` alert's defaults, or (``False``) turns it off
    (see :mod:`backend.alerts.policy`)."""
    label = f"define_queue({name!r})" if isinstance(name, str) else "define_queue()"

    def bad(problem: str) -> DefinitionError:
        return DefinitionError(f"{label}: {problem}")

    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise bad(f"invalid name {name!r} (1-128 characters of letters, digits, '_', '.', '-')")
    problem = handler_problem(handler)
    if problem is not None:
        raise bad(problem)
    try:
        check_count(concurrency, "concurrency", 1, MAX_CONCURRENCY)
        check_count(attempts, "attempts", MIN_ATTEMPTS, MAX_ATTEMPTS)
    except BadInput as exc:
        raise bad(exc.message) from None
    try:
        max_runtime = check_seconds(max_runtime, "max_runtime", high=MAX_RUNTIME_LIMIT, span="7 days")
    except BadInput as exc:
        raise bad(exc.message) from None
    if description is not None and not isinstance(description, str):
        raise bad(f"description {description!r} is not a string")
    try:
        alerting = queue_alerting(alert)
    except BadInput as exc:
        raise bad(exc.message) from None
    return made(Queue(
        name=name,
        handler=handler,
        concurrency=concurrency,
        attempts=attempts,
        max_runtime=float(max_runtime),
        description=description,
        source=caller_location(),
        alert=alerting,
    ))




# -- sends ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """One job to send, checked: its payload encoded, its delay in seconds."""

    payload: str
    """The payload as JSON text (what the store keeps; at most 256 KiB of UTF-8)."""
    delay: float = 0.0
    attempts: int | None = None
    """``None``: the queue's default."""
    key: str | None = None


def check_queue_name(queue: object) -> str:
    """A queue name as given; :class:`BadInput` naming it otherwise."""
    if not isinstance(queue, str) or not NAME_PATTERN.fullmatch(queue):
        shown = printable(queue, 60) if isinstance(queue, str) else repr(queue)
        raise BadInput(f'queue "{shown}" is not a queue name (1-128 letters, digits, "_", ".", "-")', field="queue")
    return queue


def check_key(key: object) -> str:
    """A job's key (to send with, or to cancel by): one line of text, 1 to 256 bytes."""
    key = check_text(key, "key", one_line=True)
    if not key:
        raise BadInput("key is empty", field="key")
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise BadInput(f'key "{printable(key, 40)}" is {size} bytes; the limit is {MAX_KEY_BYTES} bytes', field="key")
    return key


def check_cancel(id: object, key: object) -> tuple[Literal["id", "key"], str]:
    """Which job a cancel names, as ``("id", id)`` or ``("key", key)``: exactly one of them
    is given, and each means what it says (a key shaped like an id is still a key)."""
    if (id is None) == (key is None):
        raise BadInput('give the job\'s "id" or its "key" (one of them)', field="id" if key is None else "key")
    if key is not None:
        return "key", check_key(key)
    if not isinstance(id, str) or not is_id(id):
        shown = printable(id, 60) if isinstance(id, str) else repr(id)
        raise BadInput(
            f'id "{shown}" is not a job id (26 characters such as 01JD3Z6Q0V9W4C7PAXH3KJ1M2B); to cancel by key, give the key',
            field="id",
        )
    return "id", id


def check_send(
    payload: object = None, delay: object = 0, attempts: object = None, key: object = None, *,
    max_depth: int | None = MAX_JSON_DEPTH,
) -> Send:  # fmt: skip
    """Check one job against every limit; raises :class:`BadInput` (or :class:`TooLarge`
    for the payload) naming the limit and the value. Nothing is written before this.
    ``max_depth=None``: a schedule's payload, checked when it was defined (a stored one an
    earlier release took deeper than the bound still fires). ``delay``: seconds, or a
    ``timedelta`` (as a lock's ttl, a max_runtime and an alert's spans take)."""
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or (isinstance(delay, float) and not math.isfinite(delay)):
        raise BadInput(
            f"delay {shown_number(delay)} is not a number of seconds (0 to {MAX_DELAY_S:,}, 30 days)", field="delay"
        )
    # Compared before any conversion: float() or int() of a huge value overflows.
    if not 0 <= delay <= MAX_DELAY_S:
        if abs(delay) >= 10**15:
            shown = shown_number(delay)
        else:
            shown = f"{int(delay):,}" if delay == int(delay) else f"{delay:,}"
        raise BadInput(f"delay {shown}s is out of range: 0 to {MAX_DELAY_S:,} seconds (30 days)", field="delay")
    if attempts is not None:
        check_count(attempts, "attempts", MIN_ATTEMPTS, MAX_ATTEMPTS)
    if key is not None:
        key = check_key(key)  # an empty key is refused, not taken for none: it would not deduplicate
    return Send(check_json(payload, "payload", MAX_PAYLOAD_BYTES, max_depth=max_depth), float(delay), attempts, key)  # type: ignore[arg-type]
