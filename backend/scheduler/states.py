"""The operator-controlled state of schedules: enabled or not, by whom, when and why.

It lives in the store, so every process sharing the store sees it: ``schedtui disable`` in
one shell stops the firing of a ``schedtui serve`` elsewhere within a poll interval.
:class:`ScheduleStates` keeps this process's copy and tells the engine what changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from backend.errors import NotFound
from backend.inputs import check_note
from backend.model import ScheduleState
from backend.schedules import Schedule
from backend.store import Store

__all__ = ["ScheduleStates"]

log = logging.getLogger("schedtui.engine")


class ScheduleStates:
    """This process's copy of every schedule's state (a schedule never changed by an
    operator has none: its definition's ``enabled`` holds).

    Contract: :meth:`is_enabled` answers from memory; :meth:`refresh` re-reads the store
    and calls ``on_change(schedule, enabled)`` once for each schedule whose enabled flag
    changed since, whoever changed it."""

    def __init__(self, store: Store, schedules: dict[str, Schedule]) -> None:
        self.store = store
        self.schedules = schedules
        self._states: dict[str, ScheduleState] = {}
        self.on_change: Callable[[Schedule, ScheduleState], None] | None = None
        self.publish: Callable[[str], None] | None = None
        """Told the name of each schedule whose state changed (the change signals)."""

    def get(self, name: str) -> ScheduleState | None:
        return self._states.get(name)

    def is_enabled(self, name: str) -> bool:
        state = self._states.get(name)
        if state is not None:
            return state.enabled
        try:
            return self.schedules[name].enabled
        except KeyError:
            raise NotFound(f'no schedule named "{name}"') from None

    def forget(self, name: str) -> None:
        """A deleted schedule's state goes with it (the store deleted its row too)."""
        self._states.pop(name, None)

    async def load(self) -> None:
        self._states = await self.store.get_states()

    async def refresh(self) -> None:
        """Re-read the store and apply what changed."""
        for name, state in (await self.store.get_states()).items():
            if name in self.schedules and self._states.get(name) != state:
                self.apply(state)

    def apply(self, state: ScheduleState) -> None:
        was = self.is_enabled(state.name)
        self._states[state.name] = state
        if self.publish is not None:
            self.publish(state.name)
        if state.enabled != was and self.on_change is not None:
            self.on_change(self.schedules[state.name], state)

    async def set(self, name: str, enabled: bool, *, at: datetime, by: str, note: str | None = None) -> None:
        """Persist a new state and apply it here at once. Enabling a schedule that is
        enabled (in the store: another process may have just disabled it) writes nothing:
        a new state would move the moment the next start's catch-up begins from (the last
        enable), dropping the slots missed before it."""
        if name not in self.schedules:
            raise NotFound(f'no schedule named "{name}"')
        note = check_note(note)
        if enabled:
            await self.refresh()
            if self.is_enabled(name):
                return
        state = ScheduleState(name=name, enabled=enabled, changed_by=by, changed_at=at, note=note or None)
        await self.store.set_state(state)
        self.apply(state)
