"""``schedtui audit``: who did what, newest first (embedded or remote), derived from the
action's declaration (:mod:`console.cli.derive`)."""

from __future__ import annotations

import json
from typing import Any

from backend.events.audit import AuditEntry, AuditPage
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers, items

__all__ = ["DERIVED", "VERBS", "add_verbs", "audit_table", "detail_text"]


def detail_text(entry: AuditEntry) -> str:
    """The detail on one line: ``key=value`` pairs, strings bare, the rest as JSON."""
    if not entry.detail:
        return ""
    parts = []
    for key, value in entry.detail.items():
        if value is None:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def audit_table(entries: list[AuditEntry]) -> str:
    rows = [
        [fmt.local_time(e.at, "UTC"), e.actor, e.action, e.target, detail_text(e)]
        for e in entries
    ]
    return fmt.table(["AT", "ACTOR", "ACTION", "TARGET", "DETAIL"], rows)


def _show_audit(call: Call, page: AuditPage) -> None:
    before = call.arguments["before"]
    if not page.entries:
        print("no audit entries" + (f" before {before}" if before else ""))
        return
    print(audit_table(page.entries))
    if page.next_before:
        print(f"\nolder: schedtui audit --before {page.next_before}")


DERIVED = (
    Verb(("audit",), "audit", help="who did what: the operator actions, newest first", defaults={"limit": 20},
         json=items("entries"), show=_show_audit),
)  # fmt: skip


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, {}, verb, group)


VERBS = handlers(DERIVED)
