"""What each definition says about its alerts: the ``alert=`` option and its defaults.

``alert=`` on :func:`~backend.schedules.define_schedule`, :func:`~backend.jobs.define_queue`
and :func:`~backend.durable.define_durable` (and the ``alert`` key of a stored schedule)
takes ``False`` (no alert about it), ``None``/``True`` (the defaults) or a mapping that
overrides some of them:

* a schedule: ``{"failing": N, "late": GRACE, "disabled": AFTER, "resolve_after": S}``:
  ``failing`` alerts when its newest N slot runs all failed (default 1), and resolves once
  no slot run has failed for S seconds since the first that did not (default 300; 0 or
  ``False``: at that first one), so that a schedule failing every other run pages once,
  not at every run; ``late`` when no slot run succeeded since
  the newest slot older than GRACE seconds (default: its ``max_runtime``, at most the time
  between its slots, plus 5 minutes; ``True`` for that default); ``disabled`` counts a
  schedule disabled at run time late once it has stayed disabled AFTER seconds (default a
  day);
* a queue: ``{"dead_jobs": N, "window": SECONDS}``: alerts while N or more of its jobs died
  within the window (default 1 in 3600 s);
* a durable function: ``{"stuck": SECONDS}``: alerts about an execution that is queued or
  running without progress, or waiting past its wake time, for longer (default twice the
  function's ``step_timeout``).

Any key set to ``False`` turns that condition off. Seconds may be a number or a timedelta,
at most :data:`MAX_ALERT_SECONDS` (a year).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from backend.errors import BadInput
from backend.inputs import check_seconds, shown_number
from backend.model import ScheduleAlertingJson

__all__ = [
    "DEFAULT_DEAD_JOBS_WINDOW",
    "DEFAULT_DISABLED_AFTER",
    "DEFAULT_RESOLVE_AFTER",
    "LATE_MARGIN",
    "MAX_ALERT_SECONDS",
    "DurableAlerting",
    "QueueAlerting",
    "ScheduleAlerting",
    "durable_alerting",
    "queue_alerting",
    "schedule_alerting",
]

#: Added to a schedule's default grace: the firing lag, a catch-up, a slow commit.
LATE_MARGIN: Final = 300.0
#: A schedule disabled at run time counts as late after this long (seconds).
DEFAULT_DISABLED_AFTER: Final = 86_400.0
#: A ``failing`` alert resolves once no slot run has failed for this long (seconds) since
#: the first that did not: a schedule that fails every other run stays one alert (as
#: Alertmanager's ``resolve_timeout``, five minutes).
DEFAULT_RESOLVE_AFTER: Final = 300.0
DEFAULT_DEAD_JOBS_WINDOW: Final = 3_600.0
#: The most runs ``failing`` may look back over.
MAX_FAILING: Final = 100
#: The longest any alert's seconds may be (a year): an evaluation subtracts it from now
#: and adds it to slots, which must stay well inside the calendar.
MAX_ALERT_SECONDS: Final = 365 * 86_400


@dataclass(frozen=True, slots=True)
class ScheduleAlerting:
    """A schedule's alerts: ``failing`` runs in a row (0: off), resolved once none failed
    for ``resolve_after`` seconds (0: at the first that did not); ``late`` on or off, after
    ``grace`` seconds (``None``: the default, see the module docstring); a run-time disable
    counts after ``disabled_after`` seconds (``None``: never)."""

    failing: int = 1
    late: bool = True
    grace: float | None = None
    disabled_after: float | None = DEFAULT_DISABLED_AFTER
    resolve_after: float = DEFAULT_RESOLVE_AFTER

    def to_json(self) -> ScheduleAlertingJson | Literal[False]:
        if self == OFF_SCHEDULE:
            return False
        return {
            "failing": self.failing or False,
            "late": (self.grace if self.grace is not None else True) if self.late else False,
            "disabled": self.disabled_after if self.disabled_after is not None else False,
            "resolve_after": self.resolve_after,
        }


@dataclass(frozen=True, slots=True)
class QueueAlerting:
    """A queue's alerts: ``dead_jobs`` that died within ``window`` seconds (0: off)."""

    dead_jobs: int = 1
    window: float = DEFAULT_DEAD_JOBS_WINDOW


@dataclass(frozen=True, slots=True)
class DurableAlerting:
    """A durable function's alerts: ``stuck`` on or off, after ``after`` seconds
    (``None``: twice its ``step_timeout``)."""

    stuck: bool = True
    after: float | None = None


OFF_SCHEDULE: Final = ScheduleAlerting(failing=0, late=False, grace=None, disabled_after=None)


def _seconds(value: object, what: str) -> float:
    try:
        return check_seconds(value, "alert", label=f"alert {what}", high=MAX_ALERT_SECONDS, span="365 days")
    except BadInput as exc:
        raise BadInput(f"{exc.message} (or False: off)", field="alert") from None


def _count(value: object, what: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BadInput(
            f"alert {what} {shown_number(value)} must be a whole number from 1 to {most} (or False: off)", field="alert"
        )
    return value


def _options(value: object, keys: tuple[str, ...]) -> Mapping[str, Any] | None:
    """``None`` for "off", ``{}`` for the defaults, else the mapping (its keys checked)."""
    if value is False:
        return None
    if value is None or value is True:
        return {}
    if not isinstance(value, Mapping):
        raise BadInput(
            f"alert {value!r} must be False, True or a mapping with {', '.join(keys)}", field="alert"
        )
    unknown = [key for key in value if key not in keys]
    if unknown:
        raise BadInput(f"alert has no option {unknown[0]!r} (known: {', '.join(keys)})", field="alert")
    return value


def _is_zero(value: object) -> bool:
    """``False``, or a length of nothing (which ``_seconds`` refuses, as others' zero is)."""
    return value is False or (not isinstance(value, bool) and value in (0, timedelta(0)))


def schedule_alerting(value: object) -> ScheduleAlerting:
    """A schedule's ``alert=`` read; :class:`BadInput` naming the bad value."""
    options = _options(value, ("failing", "late", "disabled", "resolve_after"))
    if options is None:
        return OFF_SCHEDULE
    failing = options.get("failing", 1)
    late = options.get("late", True)
    disabled = options.get("disabled", DEFAULT_DISABLED_AFTER)
    resolve_after = options.get("resolve_after", DEFAULT_RESOLVE_AFTER)
    return ScheduleAlerting(
        failing=0 if failing is False else _count(failing, "failing", MAX_FAILING),
        late=late is not False,
        grace=None if late is True or late is False else _seconds(late, "late"),
        disabled_after=None if disabled is False else _seconds(disabled, "disabled"),
        resolve_after=0.0 if _is_zero(resolve_after) else _seconds(resolve_after, "resolve_after"),
    )


def queue_alerting(value: object) -> QueueAlerting:
    """A queue's ``alert=`` read; :class:`BadInput` naming the bad value."""
    options = _options(value, ("dead_jobs", "window"))
    if options is None:
        return QueueAlerting(dead_jobs=0)
    dead = options.get("dead_jobs", 1)
    return QueueAlerting(
        dead_jobs=0 if dead is False else _count(dead, "dead_jobs", 10_000),
        window=_seconds(options.get("window", DEFAULT_DEAD_JOBS_WINDOW), "window"),
    )


def durable_alerting(value: object) -> DurableAlerting:
    """A durable function's ``alert=`` read; :class:`BadInput` naming the bad value."""
    options = _options(value, ("stuck",))
    if options is None:
        return DurableAlerting(stuck=False)
    stuck = options.get("stuck", True)
    on_or_off = stuck is True or stuck is False
    return DurableAlerting(stuck=stuck is not False, after=None if on_or_off else _seconds(stuck, "stuck"))
