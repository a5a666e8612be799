"""Schedules created at run time: their stored row, and the checks a spec passes first.

A stored schedule targets a queue or a durable function (never a handler: code cannot be
stored). Its fields are checked by :func:`~backend.schedules.define_schedule` itself, so a
stored schedule is refused for exactly what a code schedule would be, with the offending
field named (:class:`~backend.errors.BadInput` ``field``). Keeping the rows in the store
and arming them on every instance is :mod:`backend.scheduler.catalog`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from backend.cron import Cron
from backend.errors import BadInput, CronError, DefinitionError, Refused
from backend.inputs import check_json, check_text
from backend.model import BACKFILL_POLICIES, OVERLAP_POLICIES, BackfillPolicy, OverlapPolicy, ScheduleTarget
from backend.schedules import DEFAULT_MAX_RUNTIME, NAME_PATTERN, Schedule, define_schedule

__all__ = [
    "FIELDS",
    "CodeTiming",
    "MAX_DESCRIPTION",
    "MAX_PAYLOAD_BYTES",
    "DefinedInCode",
    "NameTaken",
    "NotValidHere",
    "StoredSchedule",
    "check_changes",
    "check_spec",
]

#: The keys a spec may carry besides ``name`` (an update carries any of them).
FIELDS = (
    "cron",
    "timezone",
    "queue",
    "durable",
    "payload",
    "description",
    "enabled",
    "on_overlap",
    "backfill",
    "max_runtime",
    "alert",
)
#: The keys that may be null (``null`` clears them: the other target, no payload, no
#: description, the alerts' defaults); any other null is refused rather than taken for
#: "the default", which would silently undo an operator's setting.
NULLABLE = ("queue", "durable", "payload", "description", "alert")
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_DESCRIPTION = 1000
MAX_ALERT_BYTES = 1024


class CodeTiming(NamedTuple):
    """The timing a schedule defined in code fires by across the fleet, as the store
    records it: the one the last instance to start with another timing runs (a deploy),
    and that instance (the last to start with it since; ``None``: recorded by a release
    that did not say)."""

    cron: str
    timezone: str
    instance: str | None
    rules: str | None = None
    """A digest of the zone's offsets as that instance's time zone database has them
    (``None``: not said): two machines whose databases differ on the zone's rules (a
    rolling OS upgrade across a change of them) fire one local time at two instants."""


class DefinedInCode(Refused):
    """A schedule defined in code may be enabled and disabled, not edited or deleted."""

    title = "Defined in code"
    code = "defined_in_code"


class NotValidHere(Refused):
    """A stored schedule this instance cannot run (its row names a zone this machine's time
    zone database lacks, or a value past a bound of this release): it may be updated or
    deleted, nothing else, until it is valid here again."""

    title = "Not valid here"
    code = "not_valid_here"


class NameTaken(Refused):
    """A schedule of that name exists already (in code or in the store)."""

    title = "Name taken"
    code = "name_taken"


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """One row of the stored schedules. ``version`` grows with every update of the row."""

    name: str
    cron: str
    timezone: str
    queue: str | None
    durable: str | None
    payload: Any
    description: str | None
    enabled: bool
    on_overlap: OverlapPolicy
    backfill: BackfillPolicy
    max_runtime: float
    created_at: datetime
    created_by: str
    updated_at: datetime
    updated_by: str
    version: int = 1
    alert: Any = None
    """Its ``alert=`` option as JSON (``None``: the defaults; see :mod:`backend.alerts.policy`)."""
    timing_changed_at: datetime | None = None
    """The last update that changed its cron or zone (``None``: none since its creation)."""

    @property
    def target(self) -> ScheduleTarget:
        if self.queue is not None:
            return ScheduleTarget("queue", self.queue)
        return ScheduleTarget("durable", self.durable or "")

    def spec(self) -> dict[str, Any]:
        """The row's definition as a spec (for audit before/after)."""
        return {"name": self.name, **{key: getattr(self, key) for key in FIELDS}}

    def to_schedule(self) -> Schedule:
        """The schedule the engine runs (raises :class:`BadInput` if the row is invalid)."""
        return replace(_define(self.spec()), created_at=self.created_at, timing_changed_at=self.timing_changed_at)


def check_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A complete spec for a new stored schedule, with defaults filled in; raises
    :class:`BadInput` naming the first bad key and value."""
    if not isinstance(spec, Mapping):
        raise BadInput("a schedule spec must be an object", field="body")
    _unknown_keys(spec, ("name", *FIELDS))
    for key in ("name", "cron", "timezone"):
        if spec.get(key) is None:
            raise BadInput(f"{key} is required", field=key)
    _no_nulls(spec, "leave it out for its default")
    full: dict[str, Any] = {
        "name": spec["name"],
        "cron": spec["cron"],
        "timezone": spec["timezone"],
        "queue": spec.get("queue"),
        "durable": spec.get("durable"),
        "payload": spec.get("payload"),
        "description": spec.get("description"),
        "enabled": spec.get("enabled", True),
        "on_overlap": spec.get("on_overlap", "skip"),
        "backfill": spec.get("backfill", "skip"),
        "max_runtime": spec.get("max_runtime", DEFAULT_MAX_RUNTIME),
        "alert": spec.get("alert"),
    }
    _as_kept(full)
    _define(full)
    _check_new_payload(full)
    return full


def _check_new_payload(full: Mapping[str, Any]) -> None:
    """What an operator writes is held to the depth bound; a row read back is not (see
    :func:`_define`): one an earlier release took deeper must not make its schedule not
    valid here after an upgrade."""
    check_json(full.get("payload"), "payload", MAX_PAYLOAD_BYTES)


def check_changes(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` (a full spec) with ``changes`` applied, checked as a whole. Giving
    ``queue`` drops ``durable`` and the other way round (a target is one of them)."""
    if not isinstance(changes, Mapping):
        raise BadInput("the changes must be an object", field="body")
    if "name" in changes and changes["name"] != current["name"]:
        raise BadInput(f"name {changes['name']!r} cannot be changed (delete and create instead)", field="name")
    _unknown_keys(changes, ("name", *FIELDS))
    _no_nulls(changes, "leave it out to keep its value")
    full = dict(current)
    if changes.get("queue") is not None and "durable" not in changes:
        full["durable"] = None
    if changes.get("durable") is not None and "queue" not in changes:
        full["queue"] = None
    for key in FIELDS:
        if key in changes:
            full[key] = changes[key]
    _as_kept(full)
    _define(full)
    _check_new_payload(full)
    return full


def _as_kept(full: dict[str, Any]) -> None:
    """A spec as a store keeps it: lengths of time given as timedeltas (as
    ``define_schedule`` takes them) as their seconds, what JSON can say; an empty
    description as none (what ``--description ''`` clears it with: the command line has
    no null for a text, and ``--description null`` is that text)."""
    if full.get("description") == "":
        full["description"] = None
    if isinstance(full.get("max_runtime"), timedelta):
        full["max_runtime"] = full["max_runtime"].total_seconds()
    alert = full.get("alert")
    if isinstance(alert, Mapping) and any(isinstance(value, timedelta) for value in alert.values()):
        full["alert"] = {key: value.total_seconds() if isinstance(value, timedelta) else value for key, value in alert.items()}


def _unknown_keys(spec: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in spec:
        if key not in allowed:
            raise BadInput(f"unknown field {key!r} (known: {', '.join(allowed)})", field=str(key))


def _no_nulls(spec: Mapping[str, Any], instead: str) -> None:
    for key, value in spec.items():
        if value is None and key not in NULLABLE:
            raise BadInput(f"{key} may not be null ({instead})", field=str(key))


def _define(spec: Mapping[str, Any]) -> Schedule:
    """``define_schedule`` over a spec, its refusal turned into a BadInput naming the field."""
    name = spec["name"]
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadInput(f"name {name!r} is not a schedule name (1-128 letters, digits, '_', '.', '-')", field="name")
    for key in ("cron", "timezone"):
        check_text(spec[key], key, one_line=True)
    try:
        Cron(spec["cron"], "UTC")
    except CronError as exc:
        raise BadInput(f"cron {spec['cron']!r}: {_plain(_in_zone_given(exc, spec))}", field="cron") from None
    try:
        Cron(spec["cron"], spec["timezone"])
    except CronError as exc:
        raise BadInput(f"timezone {spec['timezone']!r}: {_plain(exc.message)}", field="timezone") from None
    queue, durable = spec.get("queue"), spec.get("durable")
    if (queue is None) == (durable is None):
        raise BadInput(
            "give exactly one target: queue or durable" + ("" if queue is None else f" (queue={queue!r}, durable={durable!r})"),
            field="queue" if queue is None else "durable",
        )
    if spec["on_overlap"] not in OVERLAP_POLICIES:
        raise BadInput(f"on_overlap {spec['on_overlap']!r} is not one of {', '.join(OVERLAP_POLICIES)}", field="on_overlap")
    if spec["backfill"] not in BACKFILL_POLICIES:
        raise BadInput(f"backfill {spec['backfill']!r} is not one of {', '.join(BACKFILL_POLICIES)}", field="backfill")
    description = spec.get("description")
    if description is not None:
        check_text(description, "description", max_chars=MAX_DESCRIPTION)
    check_json(spec.get("payload"), "payload", MAX_PAYLOAD_BYTES, max_depth=None)  # (a new one's depth: _check_new_payload)
    check_json(spec.get("alert"), "alert", MAX_ALERT_BYTES)  # kept as JSON
    try:
        defined = define_schedule(
            name=name,
            cron=spec["cron"],
            timezone=spec["timezone"],
            queue=queue,
            durable=durable,
            description=description,
            enabled=spec["enabled"],
            on_overlap=spec["on_overlap"],
            backfill=spec["backfill"],
            max_runtime=spec["max_runtime"],
            trigger="self",  # no platform scheduler knows a schedule created at run time
            alert=spec.get("alert"),
        )
    except DefinitionError as exc:
        problem = _plain(exc.message)
        field = next((key for key in FIELDS if problem.startswith(f"{key} ")), None)
        raise BadInput(problem, field=field) from None
    # Its payload checked above (a row an earlier release stored deeper than a new one may
    # nest runs as it did), not by define_schedule's bounds for code.
    return replace(defined, payload=spec.get("payload"))


def _in_zone_given(refusal: CronError, spec: Mapping[str, Any]) -> str:
    """The message of an expression refused in UTC (whatever the zone: the field at fault is
    the cron) as it reads in the zone given, when that is a zone: it said tz="UTC" to someone
    who gave Australia/Lord_Howe."""
    try:
        Cron("* * * * *", spec["timezone"])
    except CronError:
        return refusal.message  # (the zone is refused too: said once the cron is right)
    try:
        Cron(spec["cron"], spec["timezone"])
    except CronError as given:
        return given.message
    return refusal.message  # pragma: no cover - a cron refused in UTC is refused in every zone


def _plain(message: str) -> str:
    """A definition error's message without its ``define_schedule('x'):`` label."""
    head, sep, rest = message.partition("): ")
    return rest if sep and head.startswith("define_schedule(") else message
