"""``schedtui locks``: the lock table, and releasing a lock by force.

    schedtui locks [--json]                  every lock: holder, token, state, expiry, last renewal
    schedtui locks release NAME --yes [--json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from backend.client.interface import Backend
from backend.locks import Lock, LocksSnapshot
from console import format as fmt
from console.cli.main import _VERB_OPTIONS, EXIT_OK, EXIT_USAGE, _print_json, _with_backend

__all__ = ["VERBS", "add_verbs", "locks_table"]

FORCE_WARNING = (
    "releasing a lock by force lets the next holder in while the current one may still be working "
    "(its fenced writes are refused from then on)"
)


def add_verbs(verb: Callable[..., argparse.ArgumentParser], group: Callable[..., Any]) -> None:
    def own(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="a JSON array of locks")

    sub = group("locks", "the project locks: who holds what, until when", _VERB_OPTIONS, own)
    p = sub("release", "release a lock by force (the next holder gets a greater token)", _VERB_OPTIONS)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--yes", action="store_true", help="confirm: " + FORCE_WARNING)
    p.add_argument("--json", action="store_true", help="print {released, lock, now}")


def locks_table(snapshot: LocksSnapshot) -> str:
    now = snapshot.now

    def expiry(lock: Lock) -> str:
        state = lock.state(now)
        if state == "held":
            return fmt.countdown(lock.expires_at, now)
        if state == "expired":
            return f"expired {fmt.ago(lock.expires_at, now)}"
        return f"released {fmt.ago(lock.expires_at, now)}"

    rows = [
        [lock.name, lock.holder or "-", str(lock.token), lock.state(now), expiry(lock), fmt.ago(lock.renewed_at, now)]
        for lock in snapshot.locks
    ]
    return fmt.table(["NAME", "HOLDER", "TOKEN", "STATE", "EXPIRES", "LAST RENEWAL"], rows)


async def cmd_locks(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        snapshot = await backend.list_locks()
        if args.json:
            _print_json([lock.to_json(snapshot.now) for lock in snapshot.locks])
        elif not snapshot.locks:
            print("no locks")
        else:
            print(locks_table(snapshot))
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


async def cmd_release(args: argparse.Namespace) -> int:
    if not args.yes:
        print(f'schedtui: lock "{args.name}" not released: {FORCE_WARNING}; add --yes to confirm', file=sys.stderr)
        return EXIT_USAGE

    async def body(backend: Backend) -> int:
        done = await backend.release_lock(args.name)
        if args.json:
            _print_json(done.to_json())
        elif done.released:
            lock = done.lock
            print(f'lock "{lock.name}" released (was held by {lock.holder}, token {lock.token}); '
                  "the next holder gets a greater token")
        else:
            print(f'lock "{args.name}" was not held; nothing to release')
        return EXIT_OK

    return await _with_backend(args, body, definitions_needed=False)


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "locks": cmd_locks,
    "locks release": cmd_release,
}
