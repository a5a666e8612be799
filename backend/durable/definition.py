"""Defining durable functions: :func:`define_durable` and a step's :class:`Retry` policy.

A durable function is an ``async def handler(ctx, input)`` whose work is done in named
steps (``await ctx.step(...)``), sleeps and signal waits; see :mod:`.context`. It is
validated when it is defined, like a schedule, and discovered in the definitions folder
(``*.durable.py`` by convention) as a module-level object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from backend.alerts.policy import DurableAlerting, durable_alerting
from backend.defined import caller_location, made
from backend.definitions import register_definition_type
from backend.durable.model import MAX_LIFETIME
from backend.errors import BadInput, DefinitionError
from backend.inputs import check_seconds, is_async_callable
from backend.schedules import NAME_PATTERN, handler_problem

if TYPE_CHECKING:
    from backend.durable.context import DurableContext

__all__ = ["DEFAULT_STEP_TIMEOUT", "DurableFunction", "Retry", "define_durable"]

DurableHandler = Callable[["DurableContext", Any], Awaitable[Any]]

#: The runner's bound on one attempt of one step, unless the function says otherwise.
DEFAULT_STEP_TIMEOUT: Final = 900.0


#: The longest a step's timeout or a retry's wait may be: an execution's whole life.
MAX_SECONDS: Final = MAX_LIFETIME.total_seconds()


def _seconds(value: float | timedelta, what: str, *, zero: bool = True) -> float:
    try:
        return check_seconds(value, what, high=MAX_SECONDS, zero=zero, span="366 days")
    except BadInput as exc:
        raise DefinitionError(exc.message) from None


@dataclass(frozen=True, slots=True, init=False)
class Retry:
    """How a failed step is retried: up to ``attempts`` attempts in all, waiting
    ``initial_delay`` seconds after the first failure, doubling each time, at most
    ``max_delay``. The waits are durable: the execution waits in the store, holding no
    worker, and resumes on whichever instance is alive when the retry is due."""

    attempts: int
    initial_delay: float
    max_delay: float

    def __init__(
        self, attempts: int = 3, initial_delay: float | timedelta = 10.0, max_delay: float | timedelta = 300.0
    ) -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
            raise DefinitionError(f"Retry attempts {attempts!r} must be a whole number from 1 to 1000")
        initial = _seconds(initial_delay, "Retry initial_delay")
        most = _seconds(max_delay, "Retry max_delay")
        if most < initial:
            raise DefinitionError(f"Retry max_delay {most:g}s is shorter than initial_delay {initial:g}s")
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "initial_delay", initial)
        object.__setattr__(self, "max_delay", most)

    def delay_after(self, attempt: int) -> timedelta:
        """The wait before the attempt that follows failed attempt number ``attempt``."""
        seconds = self.initial_delay * 2.0 ** min(attempt - 1, 60)
        return timedelta(seconds=min(seconds, self.max_delay))


#: The policy of a step given no ``retry``: 3 attempts, 10 s, doubling, at most 5 minutes.
DEFAULT_RETRY: Final = Retry()
#: One attempt.
NO_RETRY: Final = Retry(attempts=1, initial_delay=0, max_delay=0)


@dataclass(frozen=True, eq=False)
class DurableFunction:
    """A validated durable function. Build it with :func:`define_durable`."""

    name: str
    handler: DurableHandler
    step_timeout: float = DEFAULT_STEP_TIMEOUT
    description: str | None = None
    source: str | None = field(default=None, compare=False)
    """Where it was defined, as ``path:line``."""
    alert: DurableAlerting = field(default_factory=DurableAlerting, compare=False)
    """Its ``stuck`` alert: see :mod:`backend.alerts.policy`."""

    def __repr__(self) -> str:
        return f"DurableFunction({self.name!r})"


def define_durable(
    *,
    name: str,
    handler: DurableHandler,
    step_timeout: float | timedelta = DEFAULT_STEP_TIMEOUT,
    description: str | None = None,
    alert: Any = None,
) -> DurableFunction:
    """Define a durable function; raises :class:`DefinitionError` on anything invalid.

    ``handler`` is ``async def handler(ctx, input)``; ``step_timeout`` bounds each attempt
    of each of its steps (seconds; a longer one is a failed attempt with error tag
    ``timeout``); ``alert`` overrides its ``stuck`` alert's default, or (``False``) turns it
    off (see :mod:`backend.alerts.policy`)."""
    label = f"define_durable({name!r})" if isinstance(name, str) else "define_durable()"
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise DefinitionError(f"{label}: invalid name {name!r} (1-128 characters of letters, digits, '_', '.', '-')")
    problem = handler_problem(handler)
    if problem is not None:
        raise DefinitionError(f"{label}: {problem}")
    if not is_async_callable(handler):
        raise DefinitionError(
            f"{label}: handler {getattr(handler, '__name__', repr(handler))} must be an async def "
            "(its steps may be plain functions: they run on a thread)"
        )
    try:
        timeout = _seconds(step_timeout, "step_timeout", zero=False)
    except DefinitionError as exc:
        raise DefinitionError(f"{label}: {exc.message}") from None
    if description is not None and not isinstance(description, str):
        raise DefinitionError(f"{label}: description {description!r} is not a string")
    try:
        alerting = durable_alerting(alert)
    except BadInput as exc:
        raise DefinitionError(f"{label}: {exc.message}") from None
    return made(DurableFunction(
        name=name, handler=handler, step_timeout=timeout, description=description, source=caller_location(),
        alert=alerting,
    ))




register_definition_type(DurableFunction, "durable function")
