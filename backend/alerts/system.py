"""Alerts as a subsystem of the engine (:class:`~backend.runtime.subsystems.Subsystem`).

Every engine reads alerts (:meth:`Alerts.page`: what ``schedtui alerts``, ``GET
/inspect/alerts`` and the console's header show). An engine given :class:`AlertSettings`
(``schedtui serve``) also evaluates the conditions on its clock and delivers the
notifications of the transitions: see :mod:`backend.alerts.evaluator` and
:mod:`backend.alerts.notifier`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from backend.alerts.model import AlertsPage, ordered
from backend.alerts.store import AlertStore
from backend.clock import Clock
from backend.errors import Unavailable

__all__ = ["RESOLVED_SHOWN", "Alerts"]

#: How long a resolved alert is listed with ``resolved=True``.
RESOLVED_SHOWN: Final = timedelta(hours=24)


class Alerts:
    """The alerts of one engine's store."""

    def __init__(self, *, store: object, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def _store(self) -> AlertStore:
        if not isinstance(self.store, AlertStore):
            raise Unavailable(f"this store ({type(self.store).__name__}) keeps no alerts")
        return self.store

    async def page(self, *, resolved: bool = False) -> AlertsPage:
        """The firing alerts (and, with ``resolved``, those resolved in the last
        :data:`RESOLVED_SHOWN`), firing ones first, newest first."""
        after = self.clock.now() - RESOLVED_SHOWN if resolved else None
        return ordered(await self._store().list_alerts(resolved_after=after))
