"""schedtui's engine: named cron schedules with a mandatory timezone, fired exactly once,
recorded in a durable ledger, and operable by hand.

The public API is re-exported here; the modules behind it are private unless documented.
"""

from importlib import metadata as _metadata

from backend.client.connection import Client, SyncClient, connect, connect_sync
from backend.clock import Clock, ManualClock, SystemClock
from backend.cron import Cron
from backend.definitions import Definitions, discover, discover_definitions
from backend.durable import (
    DurableContext,
    DurableFunction,
    Execution,
    ExecutionLog,
    ExecutionsPage,
    Retry,
    Signalled,
    Started,
    StepFailed,
    StepView,
    define_durable,
)
from backend.errors import (
    BadInput,
    CronError,
    DefinitionError,
    DiscoveryError,
    EngineStopped,
    Forbidden,
    InUse,
    ListenError,
    NotFound,
    Refused,
    SchedtuiError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from backend.jobs import Job, JobContext, JobDetail, NotDead, Queue, QueueFull, QueueView, Sent, define_queue
from backend.locks import Lease, LeaseLost, LockNotAcquired, LockResult, StaleLease
from backend.model import (
    BackfillPlan,
    BackfillProgress,
    Run,
    ScheduleState,
    ScheduleView,
    StateNote,
)
from backend.scheduler.engine import Engine
from backend.schedules import RunContext, Schedule, define_schedule
from backend.store import open_store

__all__ = [
    "BackfillPlan",
    "BackfillProgress",
    "BadInput",
    "Client",
    "Clock",
    "Cron",
    "CronError",
    "DefinitionError",
    "Definitions",
    "DiscoveryError",
    "EngineStopped",
    "DurableContext",
    "DurableFunction",
    "Engine",
    "Execution",
    "ExecutionLog",
    "ExecutionsPage",
    "Forbidden",
    "InUse",
    "Job",
    "JobContext",
    "JobDetail",
    "Lease",
    "LeaseLost",
    "ListenError",
    "LockNotAcquired",
    "LockResult",
    "ManualClock",
    "NotDead",
    "NotFound",
    "Queue",
    "QueueFull",
    "QueueView",
    "Refused",
    "Retry",
    "Run",
    "RunContext",
    "Schedule",
    "ScheduleState",
    "ScheduleView",
    "SchedtuiError",
    "Sent",
    "Signalled",
    "StaleLease",
    "Started",
    "StateNote",
    "StepFailed",
    "StepView",
    "SyncClient",
    "SystemClock",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "connect",
    "connect_sync",
    "define_durable",
    "define_queue",
    "define_schedule",
    "discover",
    "discover_definitions",
    "open_store",
]

try:  # one place says the version: the package's metadata (pyproject.toml)
    __version__ = _metadata.version("schedtui")
except _metadata.PackageNotFoundError:  # (imported from a checkout that was never installed)
    __version__ = "0+unknown"
