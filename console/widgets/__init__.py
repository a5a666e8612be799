"""The console's widgets: header, schedules table, the selected schedule's runs, the timeline."""

from .header import ConsoleHeader, FleetBanner
from .runs import DetailBar, RecentRuns, RunsTable, UpcomingLine
from .schedules import SchedulesTable
from .timeline import TimelineGrid

__all__ = [
    "ConsoleHeader",
    "DetailBar",
    "FleetBanner",
    "RecentRuns",
    "RunsTable",
    "SchedulesTable",
    "TimelineGrid",
    "UpcomingLine",
]
