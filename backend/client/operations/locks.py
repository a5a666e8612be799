# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The operator actions on locks (system ``locks``)."""

from __future__ import annotations

from typing import Annotated

from backend.client.actions import Danger, Help, Http, Range, action
from backend.client.operations.common import LockName
from backend.locks import LockRelease, LocksSnapshot


class LockOperations:
    """The locks in the store, and releasing one by force."""

    @action(system="locks", permission="read", impl="locks.list", http=Http("GET", "/inspect/locks", ok="{now, locks: [lock]}"))
    async def list_locks(self) -> LocksSnapshot:
        """Every lock - held, expired or free - with its holder, token and times.

        locks is [{name, holder, token, acquired_at, expires_at, renewed_at, state}]; state
        is held, expired (its holder stopped renewing it) or free (released; holder null).
        now is the lock clock (the database's), to count expiries down against."""

    @action(system="locks", permission="operate", label="a lock release", audit="lock.release", impl="locks.release",
            danger=Danger('Release lock "{name}" by force?',
                          "The next holder gets it at once while the current one may still be working; "
                          "its renewals and fenced writes are refused from then on."),
            http=Http("POST", "/inspect/locks/{name:path}/release", ok="{released, lock, now}",
                      errors={404: "no lock with that name", 409: "token given, and no longer the lock's: nothing released"}))
    async def release_lock(
        self,
        name: LockName,
        *,
        if_token: Annotated[int | None, Range(1, 2**53), Help("only while this is its token (the lease you saw)")] = None,
    ) -> LockRelease:
        """Release a lock by force, whoever holds it (with if_token: only while that is still
        its token, else 409 and nothing released: a lease taken since the operator looked
        is never cut by mistake).

        Its holder's renewals and fenced writes are refused from now on, and the next
        holder gets a greater token. released is false when nobody held it; lock is the
        lock as it was just before. ``NotFound`` for a name no lock ever had. Never
        retried blindly: a second release would free the next holder's lock."""
