"""The alert conditions as a Prometheus rule file, for teams that alert through Alertmanager.

:func:`prometheus_rules` writes one ``groups``/``rules`` YAML document over the metric
families ``schedtui serve`` exposes on ``GET /metrics``: a rule per condition and per
schedule, queue and durable function of a definitions folder (with their ``alert=``
overrides), and a catch-all per condition for those defined elsewhere (stored schedules,
other instances' queues) with the defaults. What Prometheus can see differs from what the
engine sees, and each rule says how in its ``description``:

* ``failing``: failed slot runs and no succeeded one within the schedule's last N periods
  (``schedtui_runs_total``, summed over the instances);
* ``late``: the newest success older than a period and the grace while the schedule is
  enabled (``schedtui_schedule_last_success_timestamp_seconds``,
  ``schedtui_schedule_enabled``), or its next fire overdue by the grace
  (``schedtui_schedule_next_fire_timestamp_seconds``), or disabled for the whole of its
  ``disabled`` setting (not for a schedule defined ``enabled=False``, which is not meant
  to run);
* ``not_firing``: no firing member (``schedtui_instances{role="firing"}``), or no instance
  scraped at all;
* ``instance_lost``: fewer members beat than at any time in the last 30 minutes
  (``schedtui_instances``; a clean stop counts too, which the engine's condition does not);
* ``dead_jobs``: the dead jobs of a queue grew by N within its window (``schedtui_jobs``);
* ``stuck``: the count of a function's queued or running executions stayed the same and
  above zero for its ``stuck`` time (``schedtui_durable_executions``: a count cannot tell
  one execution's age).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any, Final

import yaml

from backend.alerts.conditions import stuck_after
from backend.alerts.policy import LATE_MARGIN, DurableAlerting, QueueAlerting, ScheduleAlerting
from backend.durable.definition import DEFAULT_STEP_TIMEOUT, DurableFunction
from backend.errors import BadInput
from backend.jobs.definition import Queue
from backend.schedules import DEFAULT_MAX_RUNTIME, Schedule

__all__ = ["PROVIDERS", "prometheus_rules", "render_rules"]

PROVIDERS: Final = ("prometheus",)
#: How long each rule's condition must hold before Prometheus fires it (smooths one late scrape).
FOR: Final = "1m"
#: A clock this far off the database's is worth a warning, well before the lease's limit.
CLOCK_WARNING_S: Final = 1.0
#: The shortest range a rule reads: a few scrape intervals.
MIN_RANGE: Final = 300.0
#: The defaults a catch-all rule assumes for a schedule it knows nothing of (a period of an hour).
CATCH_ALL_PERIOD: Final = 3600.0
#: How many slots ahead are looked at for a schedule's longest period.
PERIOD_SLOTS: Final = 24


def _duration(seconds: float) -> str:
    """A PromQL duration: ``90s``, ``15m``, ``2h``, ``1d``."""
    seconds = max(1, math.ceil(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _not_any(label: str, names: Sequence[str]) -> str:
    """A matcher excluding ``names`` (empty when there are none)."""
    if not names:
        return ""
    escaped = "|".join(name.replace(".", "\\\\.") for name in sorted(names))
    return f',{label}!~"{escaped}"'


def period(schedule: Schedule, now: datetime) -> float:
    """The longest time between two of the schedule's slots (seconds), whatever the day the
    rules are made: the gaps among its next slots (at least two, however far: a yearly or
    a leap-day schedule's), plus, for a schedule that does not fire every hour, the zone's
    largest offset change in the year ahead (a daily 09:00's day lasts 25 hours in autumn)."""
    slots: list[datetime] = []
    horizon = now + timedelta(days=400)
    for slot in schedule.cron.occurrences(now, _LAST_INSTANT):
        slots.append(slot)
        if len(slots) > PERIOD_SLOTS or (len(slots) >= 2 and slot > horizon):
            break
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(slots)]
    if not gaps:
        return CATCH_ALL_PERIOD
    shift = 0.0 if schedule.cron.fields[1] == "*" else _largest_shift(schedule.cron.zone, now.date())
    return max(gaps) + shift


#: The end of the calendar a cron searches.
_LAST_INSTANT: Final = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


@functools.lru_cache(maxsize=256)
def _largest_shift(zone: tzinfo, today: date) -> float:
    """The largest change of ``zone``'s UTC offset over the 400 days from ``today``
    (seconds; read a day apart, as no zone changes its offset twice in a day)."""
    start = datetime(today.year, today.month, today.day, 12, tzinfo=UTC)
    offsets = [(start + timedelta(days=day)).astimezone(zone).utcoffset() or timedelta(0) for day in range(401)]
    return max((abs(b - a).total_seconds() for a, b in itertools.pairwise(offsets)), default=0.0)


def _rule(
    name: str, expr: str, condition: str, summary: str, description: str, reason: str = "", **labels: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": " ".join(expr.split()),
        "for": FOR,
        "labels": {"condition": condition, **({"reason": reason} if reason else {}), **labels},
        "annotations": {"summary": summary, "description": description},
    }


def _failing(matcher: str, n: int, window: float, who: str, labels: dict[str, str]) -> dict[str, Any]:
    runs = f'schedtui_runs_total{{{matcher},trigger!="manual"'
    w = _duration(window)
    expr = (f'sum by (schedule) (increase({runs},status="failed"}}[{w}])) >= {n} '
            f'unless sum by (schedule) (increase({runs},status="succeeded"}}[{w}])) > 0')  # fmt: skip
    return _rule(
        "SchedtuiFailing", expr, "failing", f"{who}: its runs fail",
        f"{n} or more slot runs of {{{{ $labels.schedule }}}} failed within {w} and none succeeded "
        f"(the engine: its newest {n} slot run(s) failed).",
        **labels,
    )  # fmt: skip


def _late(matcher: str, window: float, grace: float, disabled: float | None, who: str,
          labels: dict[str, str]) -> list[dict[str, Any]]:  # fmt: skip
    w, g = _duration(window + grace), _duration(grace)
    enabled = f"schedtui_schedule_enabled{{{matcher}}}"
    expr = (f"(time() - max by (schedule) (schedtui_schedule_last_success_timestamp_seconds{{{matcher}}}) > {window + grace:g}"
            f" or time() - min by (schedule) (schedtui_schedule_next_fire_timestamp_seconds{{{matcher}}}) > {grace:g})"
            f" and on (schedule) max by (schedule) ({enabled}) == 1")  # fmt: skip
    rules = [_rule(
        "SchedtuiLate", expr, "late", f"{who}: no successful run for too long",
        f"{{{{ $labels.schedule }}}} has not succeeded for more than {w} (a period and a grace of {g}), "
        f"or its next fire is more than {g} overdue.",
        reason="no_success", **labels,
    )]  # fmt: skip
    if disabled is not None:
        d = _duration(disabled)
        rules.append(_rule(
            "SchedtuiLate", f"max by (schedule) (max_over_time({enabled}[{d}])) == 0", "late",
            f"{who}: disabled for too long",
            f"{{{{ $labels.schedule }}}} has been disabled for all of the last {d}: nothing runs.",
            reason="disabled", **labels,
        ))  # fmt: skip
    return rules


def _schedule_rules(schedule: Schedule, now: datetime) -> list[dict[str, Any]]:
    policy: ScheduleAlerting = schedule.alert
    matcher = f"schedule={_quote(schedule.name)}"
    labels = {"schedule": schedule.name}
    who = "schedule {{ $labels.schedule }}"
    every = period(schedule, now)
    rules = []
    if policy.failing:
        rules.append(_failing(matcher, policy.failing, max(policy.failing * every, MIN_RANGE), who, labels))
    if policy.late:
        grace = policy.grace if policy.grace is not None else min(schedule.max_runtime, every) + LATE_MARGIN
        # Defined disabled, it is not meant to run: never late for being disabled (the
        # engine's own condition also pages once an operator enabled and then disabled it;
        # the metric cannot tell the two apart).
        disabled_after = policy.disabled_after if schedule.enabled else None
        rules.extend(_late(matcher, every, grace, disabled_after, who, labels))
    return rules


def _queue_rule(matcher: str, policy: QueueAlerting, labels: dict[str, str]) -> dict[str, Any]:
    w = _duration(max(policy.window, MIN_RANGE))
    return _rule(
        "SchedtuiDeadJobs",
        f'max by (queue) (delta(schedtui_jobs{{{matcher},state="dead"}}[{w}])) >= {policy.dead_jobs}',
        "dead_jobs", "queue {{ $labels.queue }}: jobs died",
        f"{{{{ $labels.queue }}}} gained {policy.dead_jobs} or more dead jobs within {w} "
        "(a dead job waits for an operator: `schedtui jobs retry`).",
        **labels,
    )  # fmt: skip


def _stuck_rule(matcher: str, after: float, labels: dict[str, str]) -> dict[str, Any]:
    s = _duration(max(after, MIN_RANGE))
    series = f'schedtui_durable_executions{{{matcher},status=~"queued|running"}}'
    return _rule(
        "SchedtuiStuck",
        f"min_over_time({series}[{s}]) > 0 and changes({series}[{s}]) == 0",
        "stuck", "durable function {{ $labels.function }}: executions do not move",
        f"The number of queued or running executions of {{{{ $labels.function }}}} stayed the same, above zero, "
        f"for {s}: one is probably stuck (the engine tells which: `schedtui alerts`).",
        **labels,
    )  # fmt: skip


def prometheus_rules(
    schedules: Sequence[Schedule], queues: Sequence[Queue], functions: Sequence[DurableFunction], now: datetime
) -> dict[str, Any]:
    """The rule file's document (see the module docstring)."""
    rules: list[dict[str, Any]] = [_rule(
        "SchedtuiNotFiring",
        'max(schedtui_instances{role="firing"}) < 1 or absent(schedtui_instances{role="firing"})',
        "not_firing", "no schedtui instance fires",
        "No instance of the fleet is a firing member, or none is scraped at all: nothing fires the schedules.",
    ), _rule(
        "SchedtuiInstanceLost",
        "max(sum without (role) (schedtui_instances)) "
        "< max_over_time(max(sum without (role) (schedtui_instances))[30m:1m])",
        "instance_lost", "fewer schedtui instances than in the last 30 minutes",
        "Fewer members beat than did within the last 30 minutes: one was killed, crashed, froze or was cut off from "
        "the store (or was stopped on purpose: Prometheus cannot tell a clean stop, the engine can; `schedtui "
        "alerts` names the instance). It resolves 30 minutes after the count dropped, or once it is back.",
    ), _rule(
        "SchedtuiLeaseLapsed",
        "increase(schedtui_lease_lapses_total[10m]) > 0",
        "lease_lapsed", "instance {{ $labels.instance }}: its lease lapsed",
        "The instance stopped its work (runs, jobs, durable executions) because its lease lapsed: it could not "
        "reach the store in time, or its clock was off the database server's (its log says which: LEASE LAPSED, "
        "CLOCK).",
    ), _rule(
        "SchedtuiClockOffset",
        f"abs(schedtui_clock_offset_seconds) > {CLOCK_WARNING_S:g}",
        "clock_offset", "instance {{ $labels.instance }}: its clock is off the database's",
        f"The instance's clock differs from the database server's by more than {CLOCK_WARNING_S:g}s; at a twelfth "
        "of the take-over window (2.5 s by default) its lease lapses and it stops its work: fix its time sync (NTP).",
    ), _rule(
        "SchedtuiNotificationsGivenUp",
        'increase(schedtui_alert_notifications_total{outcome="given_up"}[30m]) > 0',
        "notify_failed", "instance {{ $labels.instance }}: a webhook took none of an alert's attempts",
        "An alert transition could not be delivered to {{ $labels.webhook }} in any of its attempts (about 20 "
        "minutes): the paging path itself is broken (the audit log's alert.notify_failed has the last error).",
    )]  # fmt: skip
    for schedule in sorted(schedules, key=lambda s: s.name):
        rules.extend(_schedule_rules(schedule, now))
    others = f"schedule!=\"\"{_not_any('schedule', [s.name for s in schedules])}"
    default = ScheduleAlerting()
    who = "schedule {{ $labels.schedule }}"
    rules.append(_failing(others, default.failing, CATCH_ALL_PERIOD, who, {}))
    rules.extend(_late(others, CATCH_ALL_PERIOD, DEFAULT_MAX_RUNTIME + LATE_MARGIN, default.disabled_after, who, {}))
    for queue in sorted(queues, key=lambda q: q.name):
        if queue.alert.dead_jobs:
            rules.append(_queue_rule(f"queue={_quote(queue.name)}", queue.alert, {"queue": queue.name}))
    rules.append(_queue_rule(f"queue!=\"\"{_not_any('queue', [q.name for q in queues])}", QueueAlerting(), {}))
    for function in sorted(functions, key=lambda f: f.name):
        after = stuck_after(function.alert, function.step_timeout)
        if after is not None:
            rules.append(_stuck_rule(f"function={_quote(function.name)}", after, {"function": function.name}))
    default_after = stuck_after(DurableAlerting(), DEFAULT_STEP_TIMEOUT)
    assert default_after is not None
    rules.append(_stuck_rule(f"function!=\"\"{_not_any('function', [f.name for f in functions])}", default_after, {}))
    return {"groups": [{"name": "schedtui", "rules": rules}]}


def render_rules(
    provider: str,
    schedules: Sequence[Schedule],
    queues: Sequence[Queue],
    functions: Sequence[DurableFunction],
    now: datetime,
    *,
    source: str = "",
) -> str:
    """The rule file as text; :class:`BadInput` for an unknown provider."""
    if provider not in PROVIDERS:
        raise BadInput(f'unknown provider "{provider}" (choose one of {", ".join(PROVIDERS)})', field="provider")
    header = [
        "# schedtui's alert conditions as Prometheus alerting rules"
        + (f", from the definitions in {source}" if source else "") + ".",
        "# Generated by `schedtui alert-rules --provider prometheus`; load it with rule_files: in prometheus.yml.",
        "# Scrape every `schedtui serve` (GET /metrics, with the read token).",
    ]
    document = prometheus_rules(schedules, queues, functions, now)
    return "\n".join(header) + "\n" + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)
