"""Who gets to fire a slot when several instances share a store.

:class:`Coordinator` is the gate between "a timer says slot X of schedule S is due" and
"this instance runs the handler". ``single`` lets every firing through (one instance
only: two ``single`` instances fire everything twice); ``advisoryLock`` lets exactly one
instance win each slot through a claims table in PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from .model import Claim, ClaimResult, CoordinationMode, Outcome

if TYPE_CHECKING:
    from .store import Store

__all__ = ["ClaimCoordinator", "Coordinator", "SingleCoordinator"]


class Coordinator(Protocol):
    """Decides which due slots this instance fires.

    Contract: ``claim`` takes claims whose keys are ``name@YYYY-MM-DDTHH:MM:SS`` (see
    :func:`backend.model.slot_key`) and returns the keys this instance won. For a given
    key, across every instance sharing the store, at most one call ever returns it (for as
    long as the claim is retained, and, for claims carrying their slot, for as long as the
    slot's run is in the ledger). The result also names the schedules of the batch that
    another instance has a run of in flight, so overlap policies hold across instances.
    When the claim cannot be written the coordinator raises
    :class:`backend.errors.Unavailable` and the caller must not fire: fail closed.
    """

    mode: CoordinationMode
    outcome: Outcome
    """The coordination outcome recorded on runs this coordinator let through."""
    needs_claims: bool
    """False when every slot is won without asking anyone (``single``)."""

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult: ...


class SingleCoordinator:
    """No gate: this instance assumes it is the only one."""

    mode: CoordinationMode = "single"
    outcome: Outcome = "single"
    needs_claims = False

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        return ClaimResult(frozenset(claim.key for claim in claims))


class ClaimCoordinator:
    """``advisoryLock``: one row per slot in the store's claims table; the insert that
    creates the row wins. Nothing but the store is needed, and a crashed winner blocks
    nothing, because the next slot is a new key."""

    mode: CoordinationMode = "advisoryLock"
    outcome: Outcome = "wonLock"
    needs_claims = True

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(self, claims: Sequence[Claim], instance: str, now: datetime) -> ClaimResult:
        return await self.store.claim(claims, instance, now)
