"""schedtui's engine: named cron schedules with a mandatory timezone, fired exactly once,
recorded in a durable ledger, and operable by hand.

The public API is re-exported here; the modules behind it are private unless documented.
"""

from .clock import Clock, ManualClock, SystemClock
from .cron import Cron
from .engine import Engine
from .errors import (
    BadInput,
    CronError,
    DefinitionError,
    DiscoveryError,
    Forbidden,
    InUse,
    NotFound,
    Refused,
    SchedtuiError,
    Unauthorized,
    Unavailable,
)
from .model import (
    BackfillPlan,
    BackfillProgress,
    Run,
    RunContext,
    ScheduleState,
    ScheduleView,
    StateNote,
)
from .schedules import Schedule, define_schedule, discover
from .store import open_store

__all__ = [
    "BackfillPlan",
    "BackfillProgress",
    "BadInput",
    "Clock",
    "Cron",
    "CronError",
    "DefinitionError",
    "DiscoveryError",
    "Engine",
    "Forbidden",
    "InUse",
    "ManualClock",
    "NotFound",
    "Refused",
    "Run",
    "RunContext",
    "Schedule",
    "ScheduleState",
    "ScheduleView",
    "SchedtuiError",
    "StateNote",
    "SystemClock",
    "Unauthorized",
    "Unavailable",
    "define_schedule",
    "discover",
    "open_store",
]

__version__ = "0.1.0"
