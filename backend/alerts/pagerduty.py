"""PagerDuty as a sink: ``--notify pagerduty://ROUTING_KEY`` (its Events API v2).

A webhook gets each transition as it happened, and a receiver can order them by their ids.
PagerDuty keeps one incident per ``dedup_key`` and acts on each event as it arrives: a
trigger delivered after the resolve that followed it (its first attempts failed while the
resolve's went through) would open an incident that nothing ever resolves. So a delivery to
PagerDuty sends the alert's state *when it is delivered*: ``trigger`` with its summary of now
while it fires, ``resolve`` once it does not. Sending one twice does no harm: PagerDuty folds
a trigger into the open incident of its key, and ignores a resolve when none is open.

The routing key is the integration's secret: it travels in the body only, and the sink is
shown as ``pagerduty://events.pagerduty.com #3f9a1c`` like a webhook (scheme, host, a hash).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final, Literal, NamedTuple, TypedDict

from backend.alerts.model import Alert, Condition
from backend.errors import BadInput
from backend.model import iso
from backend.safetext import printable

__all__ = ["SCHEME", "SEVERITY", "PagerDutyTarget", "event", "target_of"]

SCHEME: Final = "pagerduty"
#: Where events go unless the URL names a host (``@events.eu.pagerduty.com``: the EU region).
EVENTS_HOST: Final = "events.pagerduty.com"
#: An Events API v2 integration's key: 32 letters and digits (a little latitude either way).
_ROUTING_KEY = re.compile(r"[A-Za-z0-9]{20,64}")
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?")
#: How urgent each condition is to PagerDuty: nothing fires at all is critical; a schedule
#: that is late is a warning (it may yet run); the rest are errors.
SEVERITY: Final[Mapping[Condition, Literal["critical", "error", "warning"]]] = {
    "not_firing": "critical",
    "failing": "error",
    "instance_lost": "error",
    "dead_jobs": "error",
    "stuck": "error",
    "late": "warning",
}
#: PagerDuty's bounds: a summary of 1,024 characters, a dedup key of 255.
SUMMARY_MAX: Final = 1024
DEDUP_MAX: Final = 255


class PagerDutyTarget(NamedTuple):
    """Where a ``pagerduty://`` URL sends its events, and with which key."""

    url: str
    routing_key: str
    host: str


def target_of(text: str) -> PagerDutyTarget:
    """``pagerduty://ROUTING_KEY`` or ``pagerduty://ROUTING_KEY@HOST[:PORT]``; :class:`BadInput`
    naming what is wrong, never the key."""
    rest = text[len(SCHEME) + 3 :]
    key, at, host = rest.partition("@")
    host = host.rstrip("/") if at else EVENTS_HOST
    if not _ROUTING_KEY.fullmatch(key):
        raise BadInput(
            f"notify URL {SCHEME}://… needs the integration's routing key (20-64 letters and digits) "
            f"before any @host, not {len(key)} character(s) (not shown: it is the integration's secret)",
            field="notify",
        )
    if not _HOST.fullmatch(host):
        raise BadInput(f"notify URL {SCHEME}://…@{printable(host, 80)} names no host", field="notify")
    return PagerDutyTarget(f"https://{host}/v2/enqueue", key, host)


class _Payload(TypedDict):
    summary: str
    source: str
    severity: Literal["critical", "error", "warning"]
    timestamp: str
    component: str
    group: str
    custom_details: dict[str, Any]


class Event(TypedDict, total=False):
    routing_key: str
    event_action: Literal["trigger", "resolve"]
    dedup_key: str
    client: str
    payload: _Payload


def dedup_key(alert_key: str) -> str:
    """The incident's key: the alert's, within PagerDuty's 255 characters (a long subject's
    is cut and told apart by a hash)."""
    key = f"schedtui:{alert_key}"
    if len(key) <= DEDUP_MAX:
        return key
    return f"{key[: DEDUP_MAX - 17]}#{hashlib.sha256(key.encode('utf-8')).hexdigest()[:16]}"


def event(routing_key: str, transition_payload: str, firing: Alert | None) -> bytes:
    """The body a delivery of a transition sends: ``firing`` is the alert of the
    transition's key as it stands now (``None``: it does not fire)."""
    sent = json.loads(transition_payload)
    body: Event = {"routing_key": routing_key, "dedup_key": dedup_key(sent["key"]), "client": "schedtui"}
    if firing is None:
        body["event_action"] = "resolve"
    else:
        what = f"{firing.subject_kind} {firing.subject}" if firing.subject_kind != "fleet" else "the fleet"
        body["event_action"] = "trigger"
        body["payload"] = {
            "summary": f"{firing.condition}: {what}: {firing.summary}"[:SUMMARY_MAX],
            "source": what,
            "severity": SEVERITY.get(firing.condition, "error"),
            "timestamp": iso(firing.since),
            "component": firing.subject,
            "group": firing.subject_kind,
            # (the transition as a webhook gets it: who saw it, its id, its own summary)
            "custom_details": {**sent, "condition": firing.condition},
        }
    return json.dumps(body).encode("utf-8")
