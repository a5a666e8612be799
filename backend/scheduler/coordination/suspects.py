"""The members a ``cluster`` instance counts out, and for how long.

An instance counts a member out when one of its shard leases lapsed (it stopped renewing)
or when it left a shard it should own free for a whole lease (it is slow). What ends
that depends on what the instance saw:

* **its member lock had lapsed too**: it is out until it joins again (a new member
  token), as a process back from a pause past its lease does at its next round;
* **its member lock was live**: it is still renewing, so it may never join again. It is
  out for a while (a lease at first), then counted in again. A member counted out again
  soon after stays out twice as long each time, up to :data:`MAX_HOLD_LEASES` leases: one
  that was slow for a moment (its database calls failing under load) is back within a
  lease, and one that renews but never takes its shards (a fault, or a version that
  divides them differently) costs its share a lease's wait ever more rarely.

Counting a member out for good while it renewed its lease was a trap: the views of who
is a member then differed for good, every member counted the others out in turn, and the
shards stayed where they happened to be (64 over three members stuck at 21/23/20).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["MAX_HOLD_LEASES", "Suspects"]

log = logging.getLogger("schedtui.cluster")

#: The longest a member that renews its lease is counted out at once, in leases.
MAX_HOLD_LEASES = 32


@dataclass(frozen=True, slots=True)
class _Suspicion:
    token: int | None
    """Its member token when counted out (``None``: its member lock had lapsed)."""
    until: datetime | None
    """When it is counted in again (``None``: once it joins again)."""


class Suspects:
    """Members counted out by this instance (see the module docstring)."""

    def __init__(self, lease: timedelta) -> None:
        self.lease = lease
        self._out: dict[str, _Suspicion] = {}
        self._strikes: dict[str, tuple[int, datetime]] = {}
        """Member -> how many times in a row it was counted out while renewing, and when last."""

    def __contains__(self, name: object) -> bool:
        return name in self._out

    def names(self) -> set[str]:
        return set(self._out)

    def count_out(self, name: str, token: int | None, why: str, now: datetime) -> None:
        if name in self._out:
            return
        if token is None:
            self._out[name] = _Suspicion(None, None)
            log.warning("cluster: counting instance %s out until it joins again: %s", name, why)
            return
        strikes, last = self._strikes.get(name, (0, now))
        if now - last > 2 * MAX_HOLD_LEASES * self.lease:
            strikes = 0  # well behaved for long enough: a fresh start
        strikes += 1
        self._strikes[name] = (strikes, now)
        hold = self.lease * min(2 ** (strikes - 1), MAX_HOLD_LEASES)
        self._out[name] = _Suspicion(token, now + hold)
        log.warning("cluster: counting instance %s out for %gs: %s", name, hold.total_seconds(), why)

    def review(self, tokens: Mapping[str, int], now: datetime) -> None:
        """Count in again those that joined again (``tokens``: the live member locks) and
        those whose time out is over."""
        for name, suspicion in list(self._out.items()):
            if name in tokens and tokens[name] != suspicion.token:
                del self._out[name]
                log.info("cluster: instance %s joined again", name)
            elif suspicion.until is not None and now >= suspicion.until:
                del self._out[name]
                log.info("cluster: counting instance %s in again", name)
