"""``schedtui audit``: who did what, newest first (embedded or remote)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Coroutine
from typing import Any

from backend.client.interface import Backend
from backend.events.audit import AuditEntry
from console import format as fmt


def add_verbs(verb: Callable[..., argparse.ArgumentParser], group: Callable[..., Any]) -> None:
    from console.cli.main import _VERB_OPTIONS, _positive_int

    def limit(text: str) -> int:
        value = _positive_int(text)
        if value > 1000:
            raise argparse.ArgumentTypeError(f"{value} is more than 1000")
        return value

    p = verb("audit", "who did what: the operator actions, newest first", _VERB_OPTIONS)
    p.add_argument("--limit", type=limit, default=20, metavar="N", help="how many (20; at most 1000)")
    p.add_argument("--before", metavar="ID", help="older than this entry (the next page)")
    p.add_argument("--json", action="store_true", help="a JSON array of entries")


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


async def cmd_audit(args: argparse.Namespace) -> int:
    from console.cli.main import EXIT_OK, _print_json, _with_backend

    async def body(backend: Backend) -> int:
        page = await backend.audit(limit=args.limit, before=args.before)
        if args.json:
            _print_json([e.to_json() for e in page.entries])
            return EXIT_OK
        if not page.entries:
            print("no audit entries" + (f" before {args.before}" if args.before else ""))
            return EXIT_OK
        print(audit_table(page.entries))
        if page.next_before:
            print(f"\nolder: schedtui audit --before {page.next_before}")
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {"audit": cmd_audit}
