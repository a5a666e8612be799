"""Durable functions: code whose steps are checkpointed, so a crash resumes it where it was.

Define one with :func:`define_durable`; its code calls ``ctx.step``, ``ctx.sleep`` and
``ctx.wait_for`` (:class:`DurableContext`). ``schedtui serve`` runs executions on every
instance that defines the function (:mod:`.executor`); any process starts, signals,
cancels and retries them (:class:`Durable`, ``st.durable`` of :func:`backend.connect`).
"""

from backend.durable.context import DurableContext
from backend.durable.definition import DEFAULT_STEP_TIMEOUT, DurableFunction, Retry, define_durable
from backend.durable.errors import StepFailed
from backend.durable.model import (
    EXECUTION_STATUSES,
    MAX_LIFETIME,
    Execution,
    ExecutionLog,
    ExecutionsPage,
    Signalled,
    Started,
    StepView,
    execution_id_for_slot,
)
from backend.durable.service import Durable

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "EXECUTION_STATUSES",
    "MAX_LIFETIME",
    "Durable",
    "DurableContext",
    "DurableFunction",
    "Execution",
    "ExecutionLog",
    "ExecutionsPage",
    "Retry",
    "Signalled",
    "Started",
    "StepFailed",
    "StepView",
    "define_durable",
    "execution_id_for_slot",
]
