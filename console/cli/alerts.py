"""``schedtui alerts``: what is alerting now (embedded or remote), derived from the action's
declaration (:mod:`console.cli.derive`).

    schedtui alerts [--resolved] [--json]
"""

from __future__ import annotations

from typing import Any

from backend.alerts.model import AlertsPage
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers

__all__ = ["DERIVED", "VERBS", "add_verbs", "alerts_table"]


def alerts_table(page: AlertsPage) -> str:
    rows = [
        [("▲ " if a.state == "firing" else "✓ ") + a.state, a.condition, f"{a.subject_kind} {a.subject}",
         fmt.local_time(a.since, "UTC"), a.summary]
        for a in page.alerts
    ]  # fmt: skip
    return fmt.table(["STATE", "CONDITION", "SUBJECT", "SINCE", "WHY"], rows)


def _show_alerts(call: Call, page: AlertsPage) -> None:
    if not page.alerts:
        print("nothing is alerting" + ("" if call.arguments["resolved"] else " (--resolved: also the resolved ones)"))
        return
    print(alerts_table(page))
    print(f"\n{page.firing} firing")


DERIVED = (
    Verb(("alerts",), "alerts", help="what is alerting now (failing, late, not_firing, dead_jobs, stuck)",
         show=_show_alerts),
)  # fmt: skip


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, {}, verb, group)


VERBS = handlers(DERIVED)
