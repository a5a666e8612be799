"""Recent activity per schedule and per queue, and each schedule's lateness: what the
console's Health view draws (``GET /inspect/activity``)."""

from backend.activity.model import MINUTE, Activity, QueueActivity, ScheduleActivity, window_start
from backend.activity.service import ActivityReads
from backend.activity.store import ActivityStore, MinuteCounts, RunMarks

__all__ = [
    "MINUTE",
    "Activity",
    "ActivityReads",
    "ActivityStore",
    "MinuteCounts",
    "QueueActivity",
    "RunMarks",
    "ScheduleActivity",
    "window_start",
]
