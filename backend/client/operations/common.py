"""The parameter types and answer pieces that the actions of several systems share.

Each ``Annotated`` alias carries what an action's parameter of that kind accepts (a
:class:`~backend.client.actions.Check`, a :class:`~backend.client.actions.Range`, its help), so that the API, the
CLI and the console refuse a bad value with the same words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypedDict

from backend.client.actions import Check, Help, Known, Range
from backend.errors import BadInput
from backend.inputs import INSTANCE_MAX_CHARS, check_instance
from backend.jobs.definition import check_queue_name
from backend.locks.model import check_lock_name

ScheduleName = Annotated[str, Known("schedule"), Help("the schedule's name")]
QueueName = Annotated[
    str, Check(check_queue_name, {"pattern": "^[A-Za-z0-9_.-]{1,128}$"}), Help("the queue's name")
]
LockName = Annotated[
    str, Check(check_lock_name, {"pattern": "^[A-Za-z0-9_.:/@-]{1,200}$"}), Help('the lock\'s name (it may hold "/")')
]
PageSize = Annotated[int, Range(1, 1000), Help("how many, at most")]
InstanceName = Annotated[
    str, Check(lambda name: check_instance(name, "name"), {"minLength": 1, "maxLength": INSTANCE_MAX_CHARS}),
    Help("the instance's name (as schedtui instances lists it)"),
]


def _check_offset(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise BadInput(f"after {value} is no byte offset (0 or more: the size of an earlier answer)", field="after")
    return value


LogOffset = Annotated[
    int, Check(_check_offset, {"minimum": 0}),
    Help("where an earlier answer ended (its size: bytes of a run's or a job's log, the newest line's number of a "
         "durable execution's): only what came since"),
]
#: What a log action answers (the OpenAPI response's description).
LOG_ANSWER = "{kind, id, name, attempt, status, running, text, size, omitted_bytes, omitted_lines}"


# -- the fields some answers add beside the result (their types are the OpenAPI document's)


class Deleted(TypedDict):
    deleted: Literal[True]


def deleted(result: None, arguments: Mapping[str, Any]) -> Deleted:
    return {"deleted": True}

