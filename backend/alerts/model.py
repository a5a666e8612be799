"""Alerts as every layer sees them: the API, ``--json``, the console's header, the client.

An :class:`Alert` is one condition about one subject (a schedule, a queue, a durable
execution or the fleet), ``firing`` or ``resolved`` since a transition. Its ``key`` is
``CONDITION:SUBJECT``: one alert per condition and subject, kept in the store, whose state
every instance of a fleet reads and only one instance changes per transition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, TypedDict

from backend.model import Timestamp, iso, parse_iso

__all__ = [
    "CONDITIONS",
    "STATES",
    "SUBJECT_KINDS",
    "Alert",
    "AlertState",
    "AlertsPage",
    "Condition",
    "SubjectKind",
    "alert_key",
]

Condition = Literal["failing", "late", "not_firing", "instance_lost", "dead_jobs", "stuck"]
CONDITIONS: Final = ("failing", "late", "not_firing", "instance_lost", "dead_jobs", "stuck")
SubjectKind = Literal["schedule", "queue", "execution", "fleet", "instance"]
SUBJECT_KINDS: Final = ("schedule", "queue", "execution", "fleet", "instance")
AlertState = Literal["firing", "resolved"]
STATES: Final = ("firing", "resolved")

#: The subject of the fleet-wide condition (``not_firing``).
FLEET: Final = "fleet"

#: What each condition is about.
SUBJECT_OF: Final[dict[Condition, SubjectKind]] = {
    "failing": "schedule",
    "late": "schedule",
    "not_firing": "fleet",
    "instance_lost": "instance",
    "dead_jobs": "queue",
    "stuck": "execution",
}


def alert_key(condition: str, subject: str) -> str:
    """The key of the alert of ``condition`` about ``subject``: ``failing:nightly``.
    (Subject names hold no ``:``, so the key is never ambiguous.)"""
    return f"{condition}:{subject}"


class AlertJson(TypedDict):
    """One alert: a condition about a subject (``key`` is ``CONDITION:SUBJECT``), ``firing``
    or ``resolved`` since its last transition (``transition`` its id; empty if not stored)."""

    key: str
    condition: Condition
    subject_kind: SubjectKind
    subject: str
    state: AlertState
    since: Timestamp
    summary: str
    updated_at: Timestamp
    transition: str


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: a condition about a subject, and its state since its last transition."""

    key: str
    condition: Condition
    subject_kind: SubjectKind
    subject: str
    """The schedule's or queue's name, the execution's id, or ``fleet``."""
    state: AlertState
    since: datetime
    """When it took its state (the transition's time)."""
    summary: str
    """Why, in one line (``3 newest runs failed: ValueError: …``)."""
    updated_at: datetime
    """When its row last changed (its transition, or a new summary while firing)."""
    transition: str = ""
    """The id of the transition that gave it its state (what a notification carries, and
    its ``Idempotency-Key``); empty for an alert worked out at read time and not stored."""

    def to_json(self) -> AlertJson:
        return {
            "key": self.key,
            "condition": self.condition,
            "subject_kind": self.subject_kind,
            "subject": self.subject,
            "state": self.state,
            "since": iso(self.since),
            "summary": self.summary,
            "updated_at": iso(self.updated_at),
            "transition": self.transition,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Alert:
        return cls(
            key=data["key"],
            condition=data["condition"],
            subject_kind=data["subject_kind"],
            subject=data["subject"],
            state=data["state"],
            since=parse_iso(data["since"]),
            summary=data["summary"],
            updated_at=parse_iso(data["updated_at"]),
            transition=data.get("transition") or "",
        )


class AlertsPageJson(TypedDict):
    """The alerts, firing ones first, each group newest first; ``firing`` counts those firing."""

    alerts: list[AlertJson]
    firing: int


@dataclass(frozen=True, slots=True)
class AlertsPage:
    """The alerts, firing ones first, each group newest first; ``firing`` counts those
    firing (the console header's number)."""

    alerts: tuple[Alert, ...]
    firing: int

    def to_json(self) -> AlertsPageJson:
        return {"alerts": [alert.to_json() for alert in self.alerts], "firing": self.firing}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AlertsPage:
        alerts = tuple(Alert.from_json(item) for item in data["alerts"])
        return cls(alerts=alerts, firing=int(data.get("firing", sum(1 for a in alerts if a.state == "firing"))))


def ordered(alerts: list[Alert] | tuple[Alert, ...]) -> AlertsPage:
    """A page of ``alerts``: firing ones first, each group newest first (by ``since``, then key)."""
    firing = sorted((a for a in alerts if a.state == "firing"), key=lambda a: (a.since, a.key), reverse=True)
    resolved = sorted((a for a in alerts if a.state != "firing"), key=lambda a: (a.since, a.key), reverse=True)
    return AlertsPage(tuple(firing + resolved), len(firing))
