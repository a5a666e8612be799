"""The built-in conditions: pure functions of facts read from the store and the clock's now.

Each returns a :class:`Finding` when its condition holds about its subject, else ``None``.
A finding's summary names absolute times only (never "5 minutes ago"), so that it stays
the same from one evaluation to the next while nothing changes, and the stored alert is not
rewritten every round.

* ``failing``: the newest N slot runs of a schedule (trigger self or external; a Run now or
  a backfill does not count) all failed; once firing, it holds until no slot run has failed
  for the schedule's ``resolve_after`` since the first that did not (a schedule failing
  every other run is one alert, not a page at every run).
* ``late``: a dead man's switch. Take the newest slot whose grace has passed; the schedule
  is late if no slot run has succeeded since that slot (finished at or after it), counting
  from when the fleet first saw the schedule or it was last enabled. It catches a schedule
  that never runs (its timer, its instance or its platform scheduler is gone), one stuck
  behind ``queue`` overlap or skipping every slot behind a run that never ends, and one
  whose runs all fail. A schedule disabled at run time is late once it has stayed
  disabled longer than its ``disabled`` setting (a day by default): an operator who pauses
  it for an incident is not paged, one who forgot to enable it again is, the next day. A
  schedule defined ``enabled=False`` and never enabled is never late.
* ``not_firing``: no firing member of the fleet has a fresh heartbeat.
* ``instance_lost``: a member of the fleet fell silent without stopping cleanly (killed,
  crashed, frozen, cut off from the store), though others still beat.
* ``dead_jobs``: N or more of a queue's jobs died within its window.
* ``stuck``: a durable execution queued or running without progress, or waiting past its
  wake time, for longer than its function's ``stuck`` setting.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from backend.alerts.model import FLEET, SUBJECT_OF, Alert, Condition, alert_key
from backend.alerts.policy import LATE_MARGIN, DurableAlerting, QueueAlerting, ScheduleAlerting
from backend.alerts.store import DeadJobs, SlotRun, StuckCandidate, Success
from backend.cron import Cron
from backend.model import InstanceInfo, ScheduleState, iso
from backend.safetext import printable

__all__ = [
    "RECOVERY_RUNS",
    "Finding",
    "Overdue",
    "dead_jobs",
    "failing",
    "instance_lost",
    "late",
    "late_grace",
    "not_firing",
    "overdue_slot",
    "resolved_summary",
    "stuck",
    "stuck_after",
]

#: How far back ``late`` looks for the newest slot whose grace has passed (slots).
MAX_SLOTS_BACK: Final = 1000
#: The longest summary kept (an error message may be long).
SUMMARY_MAX: Final = 300


@dataclass(frozen=True, slots=True)
class Finding:
    """A condition that holds about a subject, and why."""

    condition: Condition
    subject: str
    summary: str

    @property
    def key(self) -> str:
        return alert_key(self.condition, self.subject)

    def alert(self, *, state: str, at: datetime, transition: str) -> Alert:
        """The alert this finding makes, taking ``state`` at ``at``."""
        return Alert(
            key=self.key,
            condition=self.condition,
            subject_kind=SUBJECT_OF[self.condition],
            subject=self.subject,
            state="firing" if state == "firing" else "resolved",
            since=at,
            summary=self.summary,
            updated_at=at,
            transition=transition,
        )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1] + "…"


def _seconds(seconds: float) -> str:
    """``90s``, ``15m``, ``2h``, ``1d``: a setting as it was most likely written."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _why(run: SlotRun) -> str:
    if run.error_tag and run.error_message:
        return f"[{run.error_tag}] {run.error_message}"
    return run.error_message or (f"[{run.error_tag}]" if run.error_tag else "no error message")


# -- failing -----------------------------------------------------------------------------------
#: The newest slot runs read for a schedule whose ``failing`` alert fires, to find when its
#: runs stopped failing; where none of them failed and the oldest is within its
#: ``resolve_after``, its newest failure and the run after it are read too (a schedule that
#: runs every second makes 200 runs in 200 s).
RECOVERY_RUNS: Final = 200


def _failed(name: str, what: str, newest: SlotRun) -> Finding:
    return Finding("failing", name, _short(f"{what} failed (slot {iso(newest.scheduled_at)}): {_why(newest)}"))


def failing(
    name: str, policy: ScheduleAlerting, runs: Sequence[SlotRun], *, firing: bool = False, now: datetime | None = None
) -> Finding | None:
    """``runs``: the schedule's newest finished slot runs, newest first (for one whose alert
    is ``firing``, up to :data:`RECOVERY_RUNS` of them, read at ``now``)."""
    n = policy.failing
    if n < 1:
        return None
    if len(runs) >= n and all(run.status == "failed" for run in runs[:n]):
        return _failed(name, "the newest run" if n == 1 else f"the {n} newest runs", runs[0])
    if not firing or now is None or not policy.resolve_after:
        return None
    # Firing, and its newest runs no longer all fail: it holds until none has failed for
    # resolve_after since the first run after the newest failure.
    last_failed = next((i for i, run in enumerate(runs) if run.status == "failed"), None)
    if last_failed is None:
        return None  # (no failure among them, nor found before them: that long without one is long enough)
    if last_failed == 0:  # the newest failed, not N in a row: what fired holds on
        return _failed(name, "the newest run", runs[0])
    first_ok, failed = runs[last_failed - 1], runs[last_failed]
    resolves_at = (first_ok.finished_at or first_ok.scheduled_at) + timedelta(seconds=policy.resolve_after)
    if now >= resolves_at:
        return None
    # (what an operator scanning a narrow table needs first: when it ends)
    return Finding("failing", name, _short(
        f"resolves at {iso(resolves_at)} if no slot run fails before; none has since slot {iso(failed.scheduled_at)} "
        f"({_why(failed)})"
    ))  # fmt: skip


# -- late --------------------------------------------------------------------------------------
def late_grace(
    cron: Cron, max_runtime: float, policy: ScheduleAlerting, slot: datetime, before: datetime | None = None
) -> timedelta:
    """How long after ``slot`` a success may come: the setting, else the run's bound (at
    most the time since the slot before, ``before`` when the caller knows it) and a margin."""
    if policy.grace is not None:
        return timedelta(seconds=policy.grace)
    try:
        gap = (slot - (before if before is not None else cron.prev(slot))).total_seconds()
    except ValueError:  # no slot before (year 1): the bound alone
        gap = max_runtime
    return timedelta(seconds=min(max_runtime, gap) + LATE_MARGIN)


@dataclass(frozen=True, slots=True)
class Overdue:
    """The newest slot whose grace has passed, that grace, and until when it surely stays
    the newest: a caller may keep it until then."""

    slot: datetime
    grace: timedelta
    until: datetime


def overdue_slot(cron: Cron, max_runtime: float, policy: ScheduleAlerting, now: datetime) -> Overdue | None:
    """The newest slot whose grace has passed at ``now`` (see :class:`Overdue`)."""
    try:
        if policy.grace is not None:
            grace = timedelta(seconds=policy.grace)
            slot = cron.latest(now - grace)
            return Overdue(slot, grace, cron.next(slot) + grace)
        later: datetime | None = None
        # Every grace is at least the margin: no slot after ``now - margin`` is overdue, so
        # the walk starts there (from ``now``, an every-second schedule walked 300 slots
        # back each time, and a fleet's thousand of them held the event loop for seconds).
        newest = now - timedelta(seconds=LATE_MARGIN)
        for slot, before in itertools.pairwise(itertools.islice(cron.occurrences_back(newest), MAX_SLOTS_BACK + 1)):
            grace = late_grace(cron, max_runtime, policy, slot, before)
            if slot + grace <= now:
                # The next slot is overdue at its own grace's end, and none after it before
                # that one's slot and the margin (every grace is at least the margin): a
                # safe bound, however irregular the cron.
                after = later or cron.next(slot)
                until = min(after + late_grace(cron, max_runtime, policy, after, slot),
                            cron.next(after) + timedelta(seconds=LATE_MARGIN))  # fmt: skip
                # Nothing newer is overdue at ``now`` (checked above): the answer holds at
                # ``now`` itself even where the bound falls on it.
                return Overdue(slot, grace, max(until, now + timedelta(microseconds=1)))
            later = slot
    except (ValueError, OverflowError):  # no slot within years 1 to 9999 (or a grace past them)
        return None
    return None


def late(
    name: str,
    cron: Cron,
    max_runtime: float,
    policy: ScheduleAlerting,
    now: datetime,
    *,
    enabled: bool,
    state: ScheduleState | None,
    baseline: datetime,
    success: Success | None,
    overdue: Overdue | None = None,
) -> Finding | None:
    """``state``: its run-time state (``None``: never changed by an operator);
    ``baseline``: when the fleet first saw it; ``success``: its newest succeeded slot run;
    ``overdue``: :func:`overdue_slot` at ``now``, if the caller kept it (else worked out)."""
    if not policy.late:
        return None
    if not enabled:
        if state is None or state.enabled or policy.disabled_after is None:
            return None  # disabled in its definition, never enabled: not meant to run
        if now - state.changed_at < timedelta(seconds=policy.disabled_after):
            return None
        note = f' ("{_short(state.note)}")' if state.note else ""
        return Finding(
            "late", name,
            _short(f"disabled by {state.changed_by} since {iso(state.changed_at)}{note}: no slot runs "
                   f"(late after {_seconds(policy.disabled_after)} disabled)"),
        )  # fmt: skip
    start = baseline
    if state is not None and state.enabled:
        start = max(start, state.changed_at)  # slots while it was disabled do not count
    found = overdue if overdue is not None else overdue_slot(cron, max_runtime, policy, now)
    if found is None:
        return None
    slot, grace = found.slot, found.grace
    if slot < start or (success is not None and success.finished_at >= slot):
        return None
    last = f"last success: slot {iso(success.scheduled_at)}" if success is not None else "no slot run has succeeded yet"
    return Finding(
        "late", name,
        f"no successful run since the slot of {iso(slot)} (grace {_seconds(grace.total_seconds())}); {last}",
    )  # fmt: skip


# -- not_firing ----------------------------------------------------------------------------------
#: Seconds within which the offsets of instances that all stand down point at the database
#: server's clock rather than theirs.
SAME_OFFSET_S = 1.0

def not_firing(instances: Sequence[InstanceInfo], now: datetime, fresh: timedelta) -> Finding | None:
    """No instance that fires has beaten within ``fresh`` of ``now`` (each by when it beat on
    the database server's clock: see :attr:`InstanceInfo.heard_at`)."""
    members = [i for i in instances if i.fires]
    if any(now - i.heard_at <= fresh for i in members):
        return None
    standing = [i for i in instances if i.stands_down and now - i.heard_at <= fresh]
    if standing:  # alive, but its clock is off: the page should say so
        first = standing[0]
        more = f" (and {len(standing) - 1} more)" if len(standing) > 1 else ""
        summary = f"no instance fires: {first.name}{more} stands down, {first.clock_text()}"
        offsets = [i.clock_offset_s for i in standing if i.clock_offset_s is not None]
        if len(offsets) > 1 and len(offsets) == len(standing) and max(offsets) - min(offsets) <= SAME_OFFSET_S:
            # Every instance off by the same: they agree with one another, not with the server.
            summary = (f"no instance fires: all {len(standing)} live instances stand down, their clocks "
                       f"{_seconds(round(abs(sum(offsets) / len(offsets)), 1))} {'ahead of' if offsets[0] > 0 else 'behind'} "
                       "the database server's alike: its clock is likely the one that is off (check its time sync)")  # fmt: skip
        return Finding("not_firing", FLEET, _short(summary))
    if not members:
        summary = "no instance of the fleet fires (none registered as firing)"
    else:
        newest = max(members, key=lambda i: i.heard_at)
        summary = (
            f"no firing instance has a heartbeat within {_seconds(fresh.total_seconds())}; "
            f"the newest is {newest.name}'s, at {iso(newest.heard_at)}"
        )
    return Finding("not_firing", FLEET, _short(summary))


# -- instance_lost -------------------------------------------------------------------------------
def instance_lost(instances: Sequence[InstanceInfo], now: datetime, fresh: timedelta, me: str) -> list[Finding]:
    """The members (firing, waiting or standing down; not consoles, CLI verbs or clients, which
    observe) that have not beaten within ``fresh`` of ``now``, but ``me``, the instance judging.
    A clean stop removes its own row: a silent one was killed, crashed, frozen or cut off from
    the store. It holds until the member beats again or its row is gone (a new process took
    its name, or it was forgotten after a day of silence)."""
    return [
        Finding("instance_lost", i.name, _short(
            f"instance {i.name} (host {printable(i.hostname)}, pid {i.pid}) has not beaten since "
            f"{iso(i.heard_at)} and did not stop cleanly: killed, crashed, frozen or cut off from the store; "
            "the live instances take its work over"
        ))  # fmt: skip
        for i in instances
        if i.name != me and i.role != "observer" and now - i.heard_at > fresh
    ]


# -- dead_jobs -----------------------------------------------------------------------------------
def dead_jobs(queue: str, policy: QueueAlerting, facts: DeadJobs) -> Finding | None:
    """``facts.recent``: how many died within the policy's window."""
    if policy.dead_jobs < 1 or facts.recent < policy.dead_jobs:
        return None
    jobs = "1 job" if facts.recent == 1 else f"{facts.recent} jobs"
    newest = f", the newest at {iso(facts.newest)}" if facts.newest is not None else ""
    return Finding(
        "dead_jobs", queue,
        f"{jobs} died within {_seconds(policy.window)}{newest}; {facts.total} dead in all",
    )  # fmt: skip


# -- stuck ---------------------------------------------------------------------------------------
def stuck_after(policy: DurableAlerting, step_timeout: float) -> float | None:
    """Seconds past its expectation an execution of the function may be (``None``: off)."""
    if not policy.stuck:
        return None
    return policy.after if policy.after is not None else 2 * step_timeout


def stuck(candidate: StuckCandidate, after: float | None, now: datetime) -> Finding | None:
    if after is None or now - candidate.reference < timedelta(seconds=after):
        return None
    at = iso(candidate.reference)
    if candidate.status == "waiting":
        why = f"waiting past its wake time {at}"
    elif candidate.status == "queued":
        why = f"queued since {at}, not started"
    else:
        why = f"running without progress since {at}"
    return Finding(
        "stuck", candidate.id,
        f"execution of {candidate.function} {why} (stuck after {_seconds(after)})",
    )  # fmt: skip


# -- resolutions -------------------------------------------------------------------------------
def resolved_summary(alert: Alert, *, gone: bool) -> str:
    """Why a firing alert resolves: its condition no longer holds, or (``gone``) its
    subject is no longer defined."""
    if gone:
        return f"{alert.subject_kind} {alert.subject} is no longer defined"
    return {
        "failing": "the newest run did not fail",
        "late": "a slot run succeeded since (or the schedule is no longer expected to run)",
        "not_firing": "a firing instance beats again",
        "instance_lost": "the instance beats again, or its row is gone (its name taken by a new process, or forgotten)",
        "dead_jobs": "no more dead jobs within the window than the alert allows",
        "stuck": "the execution moved on (or finished)",
    }.get(alert.condition, "the condition no longer holds")
