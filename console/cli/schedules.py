"""``schedtui schedules``: schedules created at run time, kept in the store.

    schedtui schedules create NAME --cron EXPR --timezone TZ (--queue Q | --durable F)
              [--payload JSON] [--description D] [--disabled] [--on-overlap P] [--backfill P]
              [--max-runtime S] [--json]
    schedtui schedules update NAME [the same options; --enabled to enable again] [--json]
    schedtui schedules delete NAME

Every instance sharing the store arms, re-arms or stops the schedule within 2 s. A bad value
exits 2 naming it; a taken name or a schedule defined in code exits 3.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Coroutine
from typing import Any

from backend import BadInput
from backend.client.interface import Backend
from backend.model import BACKFILL_POLICIES, OVERLAP_POLICIES, ScheduleView
from backend.safetext import printable
from console.cli.main import _VERB_OPTIONS, EXIT_OK, _print_json, _with_backend

__all__ = ["VERBS", "add_verbs", "spec_of"]


def add_verbs(verb: Callable[..., argparse.ArgumentParser], group: Callable[..., Any]) -> None:
    sub = group("schedules", "create, update and delete schedules kept in the store", _VERB_OPTIONS)
    create = sub("create", "create a schedule in the store (a queue or durable function as target)", _VERB_OPTIONS)
    update = sub("update", "change a schedule created at run time", _VERB_OPTIONS)
    for p, new in ((create, True), (update, False)):
        p.add_argument("name", metavar="NAME")
        p.add_argument("--cron", metavar="EXPR", required=new, help="cron expression (5 or 6 fields)")
        p.add_argument("--timezone", metavar="TZ", required=new, help="IANA zone the expression is read in")
        target = p.add_mutually_exclusive_group(required=new)
        target.add_argument("--queue", metavar="Q", help="send one job to this queue per slot")
        target.add_argument("--durable", metavar="F", help="start one execution of this durable function per slot")
        p.add_argument("--payload", metavar="JSON", help="the job's payload or the execution's input, JSON")
        p.add_argument("--description", metavar="D")
        state = p.add_mutually_exclusive_group()
        state.add_argument("--disabled", action="store_true", help="created (or set) disabled")
        if not new:
            state.add_argument("--enabled", action="store_true", help="set enabled")
        p.add_argument("--on-overlap", metavar="P", help=f"one of {', '.join(OVERLAP_POLICIES)} (default skip)")
        p.add_argument("--backfill", metavar="P", help=f"one of {', '.join(BACKFILL_POLICIES)} (default skip)")
        p.add_argument("--max-runtime", metavar="S", help="seconds a run may take (default 1800)")
        p.add_argument("--json", action="store_true", help="print the schedule as JSON")
    delete = sub("delete", "delete a schedule created at run time (its runs stay)", _VERB_OPTIONS)
    delete.add_argument("name", metavar="NAME")


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options given, as a spec (only those given: an update changes only them)."""
    spec: dict[str, Any] = {}
    for key in ("cron", "timezone", "queue", "durable", "description", "on_overlap", "backfill"):
        value = getattr(args, key, None)
        if value is not None:
            spec[key] = value
    if args.payload is not None:
        try:
            spec["payload"] = json.loads(args.payload)
        except ValueError as exc:
            raise BadInput(f'--payload "{printable(args.payload, 60)}" is not JSON ({exc})', field="payload") from None
    if args.max_runtime is not None:
        try:
            spec["max_runtime"] = float(args.max_runtime)
        except ValueError:
            raise BadInput(f'--max-runtime "{printable(args.max_runtime, 30)}" is not a number of seconds', field="max_runtime") from None
    if args.disabled:
        spec["enabled"] = False
    elif getattr(args, "enabled", False):
        spec["enabled"] = True
    return spec


def _said(view: ScheduleView, verb: str) -> str:
    target = f"{view.target.kind} {view.target.name}" if view.target else "?"
    state = "" if view.enabled else " (disabled)"
    nxt = f", next {view.next_fire_at.isoformat()}" if view.next_fire_at else ""
    return f'schedule "{view.name}" {verb}: {view.cron} ({view.timezone}) -> {target}{state}{nxt}'


async def cmd_create(args: argparse.Namespace) -> int:
    spec = {"name": args.name, **spec_of(args)}

    async def body(backend: Backend) -> int:
        view = await backend.create_schedule(spec)
        _print_json(view.to_json()) if args.json else print(_said(view, "created"))
        return EXIT_OK

    return await _with_backend(args, body)


async def cmd_update(args: argparse.Namespace) -> int:
    changes = spec_of(args)
    if not changes:
        raise BadInput("nothing to change: give at least one option (--cron, --timezone, --queue, ...)")

    async def body(backend: Backend) -> int:
        view = await backend.update_schedule(args.name, changes)
        _print_json(view.to_json()) if args.json else print(_said(view, "updated"))
        return EXIT_OK

    return await _with_backend(args, body)


async def cmd_delete(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        await backend.delete_schedule(args.name)
        print(f'schedule "{args.name}" deleted')
        return EXIT_OK

    return await _with_backend(args, body)


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "schedules create": cmd_create,
    "schedules update": cmd_update,
    "schedules delete": cmd_delete,
}
