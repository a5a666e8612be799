# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The operator actions on the fleet: the instances sharing a store (system ``fleet``)."""

from __future__ import annotations

from backend.client.actions import Danger, Http, action
from backend.client.operations.common import InstanceName
from backend.model import InstanceInfo


class FleetOperations:
    """The instances registered in the store, and forgetting a lost one."""

    @action(system="fleet", permission="read",
            http=Http("GET", "/inspect/instances", envelope="instances", clock=True,
                      ok="{now, instances: [{name, host, pid, heartbeat_at, heartbeat_age_s, last_fired_at, role, coordination, "
                         "clock_offset_s, clock_off, stands_down}]}"))
    async def instances(self) -> list[InstanceInfo]:
        """The engine instances registered in the store, with their last heartbeat.

        An engine that fires beats every few seconds; one that only opened the store (a
        CLI verb, a watching console) beat once, when it opened it. On PostgreSQL each
        heartbeat carries the instance's clock offset from the database server's, and
        whether the instance stands down for it (``stands_down`` says why)."""

    @action(system="fleet", permission="operate", label="forgetting an instance", audit="instance.forget",
            impl="forget_instance",
            danger=Danger('Forget instance "{name}"?',
                          "Only one the fleet judges gone (silent past its take-over window, or its pid dead): its "
                          "instance_lost alert resolves and the others take its work over now."),
            http=Http("DELETE", "/inspect/instances/{name:path}", clock=True, ok="the instance as it was registered",
                      errors={404: "no instance with that name is registered",
                              409: "alive by its heartbeat, beat again just now, or its last burst is not recorded yet: "
                                   "nothing forgotten"}))
    async def forget_instance(self, name: InstanceName) -> InstanceInfo:
        """Forget a lost instance: delete its row, so that its instance_lost alert resolves
        and it leaves the instance lists now, not a day later.

        Only an instance the fleet judges gone, as a member does before taking its work
        over: silent past its take-over window, or its pid dead on the judging host; a
        killed or crashed process that a replacement under another name (the default,
        hostname:pid) will never bring back. An instance that is alive, or beats between
        the look and the delete, is refused (409) and nothing is forgotten; so is this
        very instance. Its work is taken over as it would be anyway."""
