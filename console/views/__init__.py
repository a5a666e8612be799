"""The numbered views and their registry.

A view is one module here with one :class:`~console.views.base.View` subclass. To add one
(the jobs, durable, locks, audit and health views came with their systems), write its module and
fill in ``make`` in its :data:`VIEWS` entry; the keys, the footer, ``?``, the command
palette and the tab line follow from the registry. A view whose system the backend does
not offer (:attr:`backend.client.interface.ConnectionInfo.systems`), or that is not written yet,
says so instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass

from console.views.audit import AuditView
from console.views.base import UnavailableView, View
from console.views.durable import DurableView
from console.views.health import HealthView
from console.views.jobs import JobsView
from console.views.locks import LocksView
from console.views.schedules import SchedulesView
from console.views.timeline import TimelineView

__all__ = ["VIEWS", "UnavailableView", "View", "ViewSpec", "view_spec"]


@dataclass(frozen=True)
class ViewSpec:
    id: str
    """Also the view's widget id and, with a ``view_`` prefix, its key binding's id."""
    key: str
    title: str
    system: str
    """The backend system it needs (see ``ConnectionInfo.systems``)."""
    help: str
    make: type[View] | None
    """The view's class (its ``KEYS`` are the view's keys); ``None`` while it is not written."""


VIEWS: tuple[ViewSpec, ...] = (
    ViewSpec("schedules", "1", "Schedules", "schedules", "every schedule; the selected one's runs", SchedulesView),
    ViewSpec("timeline", "2", "Timeline", "schedules", "every schedule's runs on a time axis", TimelineView),
    ViewSpec("jobs", "3", "Jobs", "jobs", "job queues: queued, running and dead jobs", JobsView),
    ViewSpec("durable", "4", "Durable", "durable", "durable executions: their steps, signals, cancels and retries", DurableView),
    ViewSpec("locks", "5", "Locks", "locks", "project locks: holders, fencing tokens, expiries", LocksView),
    ViewSpec("audit", "6", "Audit", "audit", "who did what, and when", AuditView),
    ViewSpec("health", "7", "Health", "health", "what is alerting, and the last hour by the minute", HealthView),
)


def view_spec(view_id: str) -> ViewSpec:
    return next(spec for spec in VIEWS if spec.id == view_id)
