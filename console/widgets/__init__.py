"""The console's widgets: header, schedules table, the selected schedule's runs, the timeline."""

from console.widgets.header import ConsoleHeader, FleetBanner
from console.widgets.runs import DetailBar, RecentRuns, RunsTable, UpcomingLine
from console.widgets.schedules import SchedulesTable
from console.widgets.timeline import TimelineGrid

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
