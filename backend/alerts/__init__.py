"""Alerts: built-in conditions on schedules, queues, durable executions and the fleet, their
state kept in the store, and one notification per transition across the fleet.

* :mod:`.model`: the alert and the page of alerts the API, the CLI and the console share;
* :mod:`.store`: what alerts need from a store;
* :mod:`.system`: the engine's subsystem (reads; with settings, evaluation and delivery).
"""

from backend.alerts.model import CONDITIONS, Alert, AlertsPage

__all__ = ["CONDITIONS", "Alert", "AlertsPage"]
