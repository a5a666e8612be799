"""``schedtui instances``: the instances registered in the store, as their heartbeats say.

    schedtui instances [--json]      name, role, heartbeat age, last start, clock offset

Derived from the action's declaration (:mod:`console.cli.derive`). A member whose clock is
off the database server's stands down (it fires nothing and takes no work): its offset is
marked ``✗ off`` and a line under the table says why. One silent past the take-over window
is ``✗ gone``; ``serve`` forgets it after a day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from backend.client.embedded import EmbeddedBackend
from backend.model import InstanceInfo, iso
from backend.safetext import printable
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers, items
from console.fleet import is_gone

__all__ = ["DERIVED", "VERBS", "Instances", "add_verbs", "instances_table"]


@dataclass(frozen=True)
class Instances:
    """The instances with the engine's clock, which their ages are counted against (the
    HTTP answer's ``{now, instances}``)."""

    now: datetime
    instances: list[InstanceInfo]
    this: str | None = None
    """The instance this command registered as (over ``--store``: it opens the store as an
    observer, so it is among them); ``None`` over ``--url``."""

    def to_json(self) -> dict[str, Any]:
        return {"now": iso(self.now), "instances": [i.to_json(self.now) for i in self.instances]}


def clock_cell(instance: InstanceInfo) -> str:
    """``+3ms``, ``+61.0s ✗ off`` (its own verdict: off), ``-`` (not measured)."""
    return fmt.clock_offset(instance.clock_offset_s) + (" ✗ off" if instance.clock_off else "")


def role_cell(instance: InstanceInfo, now: datetime) -> str:
    """``firing``; ``✗ gone (firing)`` once silent past the take-over window (killed, crashed:
    only a clean stop removes its row; the fleet took its work over)."""
    role = instance.role or "-"
    return f"✗ gone ({role})" if is_gone(instance, now) else role


def instances_table(answer: Instances) -> str:
    now = answer.now
    rows = [
        [printable(i.name) + (" (this command)" if i.name == answer.this else ""), role_cell(i, now),
         fmt.ago(i.heard_at, now), fmt.ago(i.last_fired_at, now), clock_cell(i)]
        for i in answer.instances
    ]  # fmt: skip
    return fmt.table(["NAME", "ROLE", "HEARTBEAT", "LAST START", "CLOCK"], rows)


async def _with_now(call: Call, instances: list[InstanceInfo]) -> Instances:
    this = call.backend.engine.instance if isinstance(call.backend, EmbeddedBackend) else None
    return Instances(await call.backend.now(), instances, this)


def _show_instances(call: Call, answer: Instances) -> None:
    if not answer.instances:
        print("no instance is registered")
        return
    print(instances_table(answer))
    for instance in answer.instances:
        why = instance.clock_text()
        if why is not None:
            print(f"✗ {printable(instance.name)} stands down: {why}")


def _show_forgotten(call: Call, instance: InstanceInfo) -> None:
    print(f"instance {printable(instance.name)} forgotten (pid {instance.pid} on {printable(instance.hostname)}, "
          f"last heartbeat {iso(instance.heartbeat_at)}): its instance_lost alert resolves at the next evaluation")


#: The verbs, in the order ``schedtui --help`` lists them.
DERIVED = (
    Verb(("instances",), "instances", help="the registered instances: role, last heartbeat, clock offset; or forget a "
         "lost one", json=items("instances"), follow=_with_now, show=_show_instances),
    Verb(("instances", "forget"), "forget_instance", show=_show_forgotten),
)  # fmt: skip


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, {}, verb, group)


VERBS = handlers(DERIVED)
