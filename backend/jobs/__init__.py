"""The job queue: queues defined in code, jobs sent from anywhere, run by ``serve``'s workers
with retries, dedupe keys, dead jobs and a fleet-wide concurrency cap (the README's "Job queue").

* :mod:`~backend.jobs.definition`: :func:`define_queue` and the limits of a send;
* :mod:`~backend.jobs.model`: the objects (job, attempt, queue, …) and the handler's context;
* :mod:`~backend.jobs.store`: what a store must do (:class:`JobStore`) and its invariants;
* :mod:`~backend.jobs.system`: the subsystem an engine runs (sending, operator actions,
  the abandoned-work sweep, retention);
* :mod:`~backend.jobs.workers`: claiming and running jobs through the shared handler runner
  (its parts: :mod:`~backend.jobs.cycles`, :mod:`~backend.jobs.seats`, :mod:`~backend.jobs.stopping`);
* :mod:`~backend.jobs.actions`: ``st.jobs``, the public face of all of it.

Only the light modules are imported here; the engine imports the rest.
"""

from backend.jobs.definition import Queue, define_queue
from backend.jobs.model import Attempt, Job, JobContext, JobDetail, JobsPage, NotDead, QueueFull, QueueView, Sent

__all__ = [
    "Attempt",
    "Job",
    "JobContext",
    "JobDetail",
    "JobsPage",
    "NotDead",
    "Queue",
    "QueueFull",
    "QueueView",
    "Sent",
    "define_queue",
]
