"""The console's widgets: header, schedules table, run timeline and runs table."""

from .header import ConsoleHeader
from .runs import DetailBar, RunsTable, RunTimeline, UpcomingLine
from .schedules import SchedulesTable

__all__ = ["ConsoleHeader", "DetailBar", "RunTimeline", "RunsTable", "SchedulesTable", "UpcomingLine"]
