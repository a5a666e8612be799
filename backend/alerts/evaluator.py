"""Evaluating the conditions, and writing the transitions they make.

One round (every ``interval`` seconds on the injected clock, in every instance that runs
``serve``) reads the facts in a fixed number of statements whatever the number of
schedules, queues and executions (the firing alerts, the newest slot runs, the newest
successes, the dead jobs, the stuck candidates, the fleet), applies the conditions of
:mod:`backend.alerts.conditions`, and compares what holds with the firing alerts:

* a condition that holds about a subject whose alert is not firing: a ``firing``
  transition;
* a firing alert whose condition no longer holds (or whose subject is gone): a ``resolved``
  transition;
* a firing alert whose summary changed (more dead jobs): its summary, with no transition.

Transitions are written together (:meth:`AlertStore.write_transitions`): each one only if
the stored alert still has the other state and was changed before this round read its
facts. Several instances evaluate the same facts; for each transition exactly one of them
wins, and only the winner's transition has outbox rows, so the fleet sends one
notification per transition. A round that read older facts than the last transition (a
slow instance) does not undo it.

A rule (one condition about one subject: ``failing:export``) whose evaluation raises fails
alone: the round goes on with the others, and leaves that rule's firing alert as it is
(the round could not tell). The failure is logged with its traceback once, not every
round, and once more when the rule evaluates again.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from backend.alerts import conditions
from backend.alerts.conditions import Finding
from backend.alerts.model import Alert, Condition, alert_key
from backend.alerts.policy import DurableAlerting, QueueAlerting
from backend.alerts.store import AlertStore, SlotRun, Transition
from backend.durable.definition import DEFAULT_STEP_TIMEOUT, DurableFunction
from backend.errors import Unavailable
from backend.jobs.definition import Queue
from backend.model import InstanceInfo, ScheduleState, iso
from backend.schedules import Schedule

__all__ = ["MAX_STUCK", "Evaluator", "Proposal", "Round", "notification"]

log = logging.getLogger("schedtui.alerts")

#: The most stuck executions one round reads (the oldest); past it, none is resolved.
MAX_STUCK: Final = 200
#: The default queue and function policies, for those defined by other instances only.
DEFAULT_QUEUE: Final = QueueAlerting()
DEFAULT_DURABLE: Final = DurableAlerting()


@dataclass
class Proposal:
    """What one round's reads call for, before anything is written."""

    at: datetime
    findings: dict[str, Finding]
    transitions: list[Transition] = field(default_factory=list)
    summaries: list[Alert] = field(default_factory=list)
    unevaluated: list[str] = field(default_factory=list)
    """The keys of the rules whose evaluation raised this round."""


@dataclass
class Round:
    """What one evaluation found and did."""

    at: datetime
    findings: dict[str, Finding] = field(default_factory=dict)
    transitions: list[Alert] = field(default_factory=list)
    """The transitions this round proposed."""
    won: list[Alert] = field(default_factory=list)
    """Those this instance wrote (another instance may have written the others)."""
    summaries: int = 0
    unevaluated: list[str] = field(default_factory=list)
    """The keys of the rules whose evaluation raised (their alerts left as they were)."""


def notification(alert: Alert, instance: str, *, was_since: datetime | None = None) -> dict[str, Any]:
    """The JSON body every sink gets for a transition. ``text`` is what a Slack or
    Mattermost incoming webhook shows as it is (one line, no colour needed)."""
    what = f"{alert.subject_kind} {alert.subject}" if alert.subject_kind != "fleet" else "the fleet"
    if alert.state == "firing":
        text = f"▲ FIRING {alert.condition}: {what}: {alert.summary} (since {iso(alert.since)}, seen by {instance})"
    else:
        fired = f", firing since {iso(was_since)}" if was_since is not None else ""
        text = f"✓ RESOLVED {alert.condition}: {what}: {alert.summary} (at {iso(alert.since)}{fired}, seen by {instance})"
    return {
        "alert": alert.condition,
        "state": alert.state,
        "subject_kind": alert.subject_kind,
        "subject": alert.subject,
        "summary": alert.summary,
        "since": iso(alert.since),
        "instance": instance,
        "key": alert.key,
        "transition": alert.transition,
        "text": text,
    }


class Evaluator:
    """Evaluates every condition about what this engine knows (see the module docstring).

    ``schedules``, ``queues`` and ``functions`` are the engine's own (read at each round:
    stored schedules come and go); ``states`` gives a schedule's run-time state and whether
    it is enabled; ``fleet`` reads the instances; ``fresh`` is how old a firing member's
    heartbeat may be (the take-over window); ``beat``, when given, writes this instance's own
    heartbeat if it is due and says whether it did; ``unrunnable`` (read at each round) names
    the stored schedules this instance cannot run (another instance may: their alerts are
    left as they are, never resolved as gone); ``code_owners``, when given, reads the
    instance that last started with each schedule defined in code (the fleet's timings):
    a schedule this instance does not define but a live firing instance does (the other
    release of a rolling deploy) is not gone either."""

    def __init__(
        self,
        *,
        store: AlertStore,
        instance: str,
        new_id: Callable[[], str],
        schedules: Mapping[str, Schedule],
        queues: Mapping[str, Queue],
        functions: Mapping[str, DurableFunction],
        state_of: Callable[[str], ScheduleState | None],
        is_enabled: Callable[[str], bool],
        fleet: Callable[[], Any],
        fresh: timedelta,
        beat: Callable[[datetime], Awaitable[bool]] | None = None,
        unrunnable: Collection[str] = (),
        code_owners: Callable[[], Awaitable[Mapping[str, str | None]]] | None = None,
    ) -> None:
        self.store = store
        self.code_owners = code_owners
        self.instance = instance
        self.new_id = new_id
        self.schedules = schedules
        self.queues = queues
        self.functions = functions
        self.state_of = state_of
        self.is_enabled = is_enabled
        self.fleet = fleet
        self.fresh = fresh
        self.beat = beat
        self.unrunnable = unrunnable
        self._baselines: dict[str, datetime] = {}
        self._overdue: dict[str, tuple[tuple[Any, ...], datetime, conditions.Overdue | None]] = {}
        """Per schedule, its overdue slot as of when (kept until it may change: the cron
        walk is most of a round's own work)."""
        self._raising: dict[str, str] = {}
        """Per rule whose evaluation raised at its last round, what it raised (logged once)."""

    def overdue(self, schedule: Schedule, now: datetime) -> conditions.Overdue | None:
        """:func:`conditions.overdue_slot`, kept while it holds (the definition unchanged,
        the clock between when it was worked out and its ``until``)."""
        key = (schedule.cron, schedule.max_runtime, schedule.alert)
        kept = self._overdue.get(schedule.name)
        if kept is not None and kept[0] == key and kept[1] <= now and (kept[2] is None or now < kept[2].until):
            return kept[2]
        found = conditions.overdue_slot(schedule.cron, schedule.max_runtime, schedule.alert, now)
        if found is not None:
            self._overdue[schedule.name] = (key, now, found)
        return found

    # -- facts -> findings -----------------------------------------------------------------------
    async def find(
        self, now: datetime, firing: Mapping[str, Alert] | None = None
    ) -> tuple[dict[str, Finding], Callable[[Alert], bool | None], list[str]]:
        """What holds now, a judge of a firing alert that no finding holds about: ``True``
        resolve it (its condition was looked at and no longer holds), ``None`` resolve it
        as gone (its subject is no longer defined), ``False`` leave it (this round could not
        tell: its rule raised), and the keys of the rules that raised. ``firing``: the keys
        of the alerts firing now, each its alert (a condition may hold longer than it takes
        to fire)."""
        firing = firing or {}
        findings: dict[str, Finding] = {}
        raised: dict[str, str] = {}

        def add(finding: Finding | None) -> None:
            if finding is not None:
                findings[finding.key] = finding

        @contextlib.contextmanager
        def rule(condition: Condition, subject: str) -> Iterator[None]:
            """Evaluates one rule: one that raises fails alone (see the module docstring)."""
            key = alert_key(condition, subject)
            try:
                yield
            except Unavailable:
                raise  # the store (a read behind it): the whole round is skipped
            except Exception as exc:  # a bug, or a definition no rule foresaw: not the others' fault
                raised[key] = seen = f"{type(exc).__name__}: {exc}"
                if self._raising.get(key) != seen:  # with the traceback once, not every round
                    log.exception("alerts: the rule %s cannot be evaluated (%s); its alert is left as it is, "
                                  "the other rules are evaluated", key, seen)  # fmt: skip
                self._raising[key] = seen
            else:
                if key in self._raising:
                    log.info("alerts: the rule %s evaluates again (the rounds before failed with %s)",
                             key, self._raising.pop(key))  # fmt: skip

        schedules = dict(self.schedules)
        watched = [s for s in schedules.values() if s.alert.failing or s.alert.late]
        names = [s.name for s in watched]
        newest = max((s.alert.failing for s in watched), default=0)
        if names:
            unseen = [name for name in names if name not in self._baselines]
            if unseen:
                self._baselines.update(await self.store.alert_baselines(unseen, now))
            runs = await self.store.slot_runs(names, newest) if newest else {}
            # A failing alert that fires resolves once no run failed for a while: its
            # schedule's runs are read back further, to when they stopped failing.
            recovering = [s.name for s in watched if s.alert.failing and s.alert.resolve_after
                          and alert_key("failing", s.name) in firing]  # fmt: skip
            if recovering:
                runs.update(await self.store.slot_runs(recovering, conditions.RECOVERY_RUNS))
                await self._read_back_to_the_last_failure(recovering, schedules, runs, now)
            successes = await self.store.last_successes(names)
            for schedule in watched:
                name = schedule.name
                with rule("failing", name):
                    add(conditions.failing(
                        name, schedule.alert, runs.get(name, []), firing=alert_key("failing", name) in firing, now=now,
                    ))  # fmt: skip
                with rule("late", name):
                    add(conditions.late(
                        name, schedule.cron, schedule.max_runtime, schedule.alert, now,
                        enabled=self.is_enabled(name), state=self.state_of(name),
                        baseline=self._baselines.get(name, now), success=successes.get(name),
                        overdue=self.overdue(schedule, now) if schedule.alert.late else None,
                    ))  # fmt: skip

        instances: list[InstanceInfo] = await self.fleet()
        silent = conditions.not_firing(instances, now, self.fresh)
        if silent is not None and self.beat is not None:
            # This instance's own heartbeat may be what was overdue (it was suspended, or
            # its clock jumped): see it written (or the one under way done), then look
            # again. Always: a beat that committed just after the read, its stamp taken
            # before this call, says nothing was written here, yet the read was stale.
            await self.beat(now)
            instances = await self.fleet()
            silent = conditions.not_firing(instances, now, self.fresh)
        add(silent)
        for lost in conditions.instance_lost(instances, now, self.fresh, self.instance):
            add(lost)

        queues = dict(self.queues)
        windows = {name: now - timedelta(seconds=q.alert.window) for name, q in queues.items()}
        dead = await self.store.dead_jobs(windows, now - timedelta(seconds=DEFAULT_QUEUE.window))
        for name, facts in dead.items():
            with rule("dead_jobs", name):
                add(conditions.dead_jobs(name, queues[name].alert if name in queues else DEFAULT_QUEUE, facts))

        functions = dict(self.functions)
        limits = {name: conditions.stuck_after(f.alert, f.step_timeout) for name, f in functions.items()}
        default_limit = conditions.stuck_after(DEFAULT_DURABLE, DEFAULT_STEP_TIMEOUT)
        shortest = min((v for v in [*limits.values(), default_limit] if v is not None), default=None)
        truncated = False
        if shortest is not None:
            candidates = await self.store.stuck_candidates(now - timedelta(seconds=shortest), MAX_STUCK)
            truncated = len(candidates) >= MAX_STUCK
            for candidate in candidates:
                with rule("stuck", candidate.id):
                    add(conditions.stuck(candidate, limits.get(candidate.function, default_limit), now))
        for key in set(self._raising) - set(raised):  # not evaluated this round: its subject is gone
            del self._raising[key]
        elsewhere = await self._defined_elsewhere(firing.values(), schedules, instances, now)

        def judge(alert: Alert) -> bool | None:
            if alert.key in raised:
                return False  # its rule could not tell
            if alert.subject_kind == "schedule":
                if alert.subject in schedules:
                    return True
                return False if alert.subject in self.unrunnable or alert.subject in elsewhere else None
            if alert.condition == "stuck":
                return not truncated
            return True

        return findings, judge, sorted(raised)

    async def _read_back_to_the_last_failure(
        self, recovering: Sequence[str], schedules: Mapping[str, Schedule], runs: dict[str, list[SlotRun]], now: datetime
    ) -> None:
        """A recovering schedule whose :data:`~conditions.RECOVERY_RUNS` newest runs hold no
        failure, the oldest of them within its ``resolve_after``, stopped failing before
        them: its newest failure and the first run after it are added to its runs (the
        condition reads when they stopped failing from them). Without them, an
        every-second schedule's alert resolved once 200 runs had not failed, 200 s
        instead of 5 minutes: one failing every four minutes paged twice each time."""
        deeper = []
        for name in recovering:
            kept = runs.get(name, [])
            if len(kept) < conditions.RECOVERY_RUNS or any(run.status == "failed" for run in kept):
                continue
            oldest = kept[-1]
            if (oldest.finished_at or oldest.scheduled_at) + timedelta(seconds=schedules[name].alert.resolve_after) > now:
                deeper.append(name)
        if not deeper:
            return
        for name, (failed, first_ok) in (await self.store.last_failures(deeper)).items():
            kept = runs[name]
            # (newest first; the first run after the failure may be the oldest read already)
            runs[name] = [*kept, first_ok, failed] if first_ok.scheduled_at < kept[-1].scheduled_at else [*kept, failed]

    async def _defined_elsewhere(
        self, firing: Iterable[Alert], schedules: Mapping[str, Schedule], instances: Sequence[InstanceInfo], now: datetime
    ) -> set[str]:
        """The schedules of firing alerts that this instance does not define, but a live
        firing instance does: resolved as gone here, they fired again there, a page and its
        resolution every round of a rolling deploy that adds or removes a schedule."""
        others = {a.subject for a in firing if a.subject_kind == "schedule" and a.subject not in schedules}
        if not others or self.code_owners is None:
            return set()
        owners = await self.code_owners()
        live = {i.name for i in instances if i.fires and now - i.heard_at <= self.fresh and i.name != self.instance}
        return {name for name in others if owners.get(name) in live}

    # -- findings -> transitions -------------------------------------------------------------
    async def propose(self, now: datetime) -> Proposal:
        """Read the firing alerts and the facts: the transitions and summaries they call for."""
        firing = {a.key: a for a in await self.store.list_alerts()}
        findings, judge, unevaluated = await self.find(now, firing)
        proposal = Proposal(now, findings, unevaluated=unevaluated)
        for key, finding in findings.items():
            stored = firing.get(key)
            if stored is None:
                alert = finding.alert(state="firing", at=now, transition=self.new_id())
                proposal.transitions.append(Transition(alert, json.dumps(notification(alert, self.instance))))
            elif stored.summary != finding.summary:
                proposal.summaries.append(Alert(
                    key, stored.condition, stored.subject_kind, stored.subject, "firing", stored.since,
                    finding.summary, now, stored.transition,
                ))  # fmt: skip
        for key, stored in firing.items():
            if key in findings:
                continue
            verdict = judge(stored)
            if verdict is False:
                continue
            summary = conditions.resolved_summary(stored, gone=verdict is None)
            alert = Alert(key, stored.condition, stored.subject_kind, stored.subject, "resolved", now, summary, now,
                          self.new_id())  # fmt: skip
            body = notification(alert, self.instance, was_since=stored.since)
            proposal.transitions.append(Transition(alert, json.dumps(body)))
        return proposal

    async def commit(self, proposal: Proposal, *, sinks_after: datetime) -> Round:
        """Write a proposal's transitions and summaries (those the store still takes)."""
        done = Round(proposal.at, proposal.findings, [t.alert for t in proposal.transitions],
                     unevaluated=proposal.unevaluated)  # fmt: skip
        if proposal.transitions:
            won = set(await self.store.write_transitions(proposal.transitions, sinks_after=sinks_after))
            done.won = [t.alert for t in proposal.transitions if t.alert.key in won]
            for alert in done.won:
                log.warning("alert %s %s: %s", alert.key, alert.state.upper(), alert.summary)
        if proposal.summaries:
            done.summaries = await self.store.update_summaries(proposal.summaries)
        return done

    async def evaluate(self, now: datetime, *, sinks_after: datetime) -> Round:
        """One round (see the module docstring): the transitions proposed and those won."""
        return await self.commit(await self.propose(now), sinks_after=sinks_after)
