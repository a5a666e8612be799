"""``schedtui alerts``: what is alerting now (embedded or remote), derived from the action's
declaration (:mod:`console.cli.derive`); and ``schedtui alert-rules``, the same conditions as
a Prometheus rule file.

    schedtui alerts [--resolved] [--json]
    schedtui alert-rules --provider prometheus [--schedules DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backend.alerts.model import CONDITIONS, AlertsPage
from backend.alerts.rules import PROVIDERS, render_rules
from backend.definitions import discover_definitions
from backend.durable import DurableFunction
from backend.jobs import Queue
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
    Verb(("alerts",), "alerts", help=f"what is alerting now ({', '.join(CONDITIONS)})",
         show=_show_alerts),
)  # fmt: skip


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, {}, verb, group)
    p = verb("alert-rules", "the alert conditions as a Prometheus rule file (for Alertmanager)", ["schedules"])
    p.add_argument("--provider", required=True, choices=PROVIDERS, help="the rule file's format")
    p.add_argument("--out", metavar="FILE", help="write the file here instead of printing it")


async def cmd_alert_rules(args: argparse.Namespace) -> int:
    definitions = discover_definitions(args.schedules)
    text = render_rules(
        args.provider, definitions.schedules, definitions.of(Queue), definitions.of(DurableFunction),
        datetime.now(UTC), source=str(args.schedules),
    )  # fmt: skip
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(args.out)
    else:
        print(text, end="")
    return 0


VERBS = {**handlers(DERIVED), "alert-rules": cmd_alert_rules}
