"""``schedtui locks``: the lock table, and releasing a lock by force.

    schedtui locks [--json]                  every lock: holder, token, state, expiry, last renewal
    schedtui locks release NAME --yes [--json]

Both are derived from their actions' declarations (:mod:`console.cli.derive`): a release
is dangerous, so it needs ``--yes``.
"""

from __future__ import annotations

from typing import Any

from backend.locks import Lock, LockRelease, LocksSnapshot
from backend.safetext import in_line
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers, items

__all__ = ["DERIVED", "VERBS", "add_verbs", "locks_table"]


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


def _show_locks(call: Call, snapshot: LocksSnapshot) -> None:
    print(locks_table(snapshot) if snapshot.locks else "no locks")


def _show_released(call: Call, done: LockRelease) -> None:
    if done.released:
        lock = done.lock
        print(f'lock "{lock.name}" released (was held by {in_line(lock.holder or "-")}, token {lock.token}); '
              "the next holder gets a greater token")
    else:
        print(f'lock "{call.arguments["name"]}" was not held; nothing to release')


#: The verbs, in the order ``schedtui --help`` lists them.
DERIVED = (
    Verb(("locks",), "list_locks", help="the project locks: who holds what, until when", json=items("locks"),
         show=_show_locks),
    Verb(("locks", "release"), "release_lock", help="release a lock by force (the next holder gets a greater token)",
         show=_show_released),
)  # fmt: skip


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, {}, verb, group)


VERBS = handlers(DERIVED)
