"""Every operator action, declared once, one module a system.

An action of system ``X`` is declared in ``backend/client/operations/X.py`` (the schedules'
backfills with the schedules): a method of that system's class, whose signature and
docstring are its declaration (see :mod:`backend.client.actions`). :class:`~backend.client.interface.Backend`
inherits every one of these classes. Declaring an action registers it in
:data:`~backend.client.actions.ACTIONS`, in the order of the imports below: the order of the
API's routes and of the OpenAPI document.
"""

from backend.client.operations.schedules import ScheduleOperations  # isort: skip
from backend.client.operations.fleet import FleetOperations  # isort: skip
from backend.client.operations.locks import LockOperations  # isort: skip
from backend.client.operations.durable import DurableOperations  # isort: skip
from backend.client.operations.audit import AuditOperations  # isort: skip
from backend.client.operations.alerts import AlertOperations  # isort: skip
from backend.client.operations.health import HealthOperations  # isort: skip
from backend.client.operations.jobs import JobOperations  # isort: skip

__all__ = [
    "AlertOperations",
    "AuditOperations",
    "DurableOperations",
    "FleetOperations",
    "HealthOperations",
    "JobOperations",
    "LockOperations",
    "ScheduleOperations",
]
