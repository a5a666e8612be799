"""The schedules' verbs: list, runs, logs (a run's), fire, enable, disable, backfill, and
the schedules created at run time::

    schedtui schedules create NAME --cron EXPR --timezone TZ (--queue Q | --durable F)
              [--payload JSON] [--description D] [--disabled] [--on-overlap P] [--backfill P]
              [--max-runtime S] [--json]
    schedtui schedules update NAME [the same options; --enabled to enable again] [--json]
    schedtui schedules delete NAME

Every verb is derived from its action's declaration (:mod:`console.cli.derive`); what is
here is how each one shows its result. A stored schedule is armed, re-armed or stopped by
every instance sharing the store within 2 s. A bad value exits 2 naming it; a taken name
or a schedule defined in code exits 3; a refused backfill exits 3 with the count and the
reason.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from typing import Any

from backend.client.actions import action_of
from backend.client.interface import Backend
from backend.errors import NotFound
from backend.model import BackfillPlan, BackfillProgress, Run, RunsPage, SchedulesSnapshot, ScheduleView
from backend.safetext import printable
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, handlers, items
from console.cli.logs import FOLLOW, follow_log, no_json_follow, show_log
from console.cli.output import EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, print_json, say

__all__ = ["DERIVED", "VERBS", "add_verbs", "runs_table", "schedules_table"]


# -- tables ----------------------------------------------------------------------------------
def schedules_table(schedules: list[ScheduleView], now: datetime) -> str:
    sharded = any(s.sharded for s in schedules)
    rows = []
    for s in schedules:
        last = s.last_run
        if s.problem is not None:
            state = "not valid here"
        elif not s.enabled:
            state = "disabled" + (f" ({s.state_note.note})" if s.state_note and s.state_note.note else "")
        else:
            state = "enabled"
        rows.append(
            [
                s.name,
                s.cron,
                s.timezone,
                s.trigger,
                state,
                fmt.countdown(s.next_fire_at, now) if s.next_fire_at else "-",
                f"{fmt.STATUS_GLYPHS[last.status]} {last.status} {fmt.ago(last.fired_at or last.scheduled_at, now)}"
                if last
                else "-",
                *([s.owner or "-"] if sharded else []),
            ]
        )
    owner = ["OWNER"] if sharded else []
    table = fmt.table(["NAME", "CRON", "TIMEZONE", "TRIGGER", "STATE", "NEXT FIRE", "LAST RUN", *owner], rows)
    # Why each one not valid here is not run: too long for a column, too important to leave out.
    notes = [f'{s.name} is not valid here: {s.problem}; correct it with "schedules update" or delete it'
             for s in schedules if s.problem is not None]  # fmt: skip
    return "\n".join([table, *notes])


def runs_table(runs: list[Run], zone: str) -> str:
    rows = [
        [
            run.id,
            fmt.local_time(run.scheduled_at, zone),
            f"{fmt.STATUS_GLYPHS[run.status]} {run.status}",
            run.trigger,
            run.coordination_outcome,
            printable(run.instance),  # stored as given: it may predate the check of --instance
            fmt.duration(run.duration_ms),
            # (a handler's text: one line, and nothing a terminal would act on)
            printable(" ".join(filter(None, [run.error_tag and f"[{run.error_tag}]", run.error_message])), 300),
        ]
        for run in runs
    ]
    return fmt.table(["ID", "SCHEDULED AT", "STATUS", "TRIGGER", "OUTCOME", "INSTANCE", "DURATION", "ERROR"], rows)


# -- list, runs, fire, enable, disable ---------------------------------------------------------
def _show_schedules(call: Call, snapshot: SchedulesSnapshot) -> None:
    print(schedules_table(snapshot.schedules, snapshot.now))


async def _zone(call: Call) -> None:
    """The schedule's zone, its times are shown in; UTC for one no longer defined, whose
    runs the ledger may still hold (the read says whether it does)."""
    try:
        call.zone = await call.backend.schedule_zone(call.arguments["name"])
    except NotFound:
        call.zone = "UTC"


def _show_runs(call: Call, page: RunsPage) -> None:
    name, before = call.arguments["name"], call.arguments["before"]
    if not page.runs:
        print(f"no runs of {name}" + (f" before {before}" if before else ""))
        return
    print(runs_table(page.runs, call.zone))
    if page.next_before:
        print(f"\nolder: schedtui runs {name} --before {page.next_before}")


async def _wait_run(call: Call, run: Run) -> Run:
    if not call.args.json:
        say(f"fired {call.arguments['name']}: run {run.id}")  # (a stderr that refuses it loses the line only)
    return await call.backend.wait_run(run.id)


def _show_switched(call: Call, view: ScheduleView) -> None:
    note = f" ({view.state_note.note})" if view.state_note and view.state_note.note else ""
    nxt = f"; next fire {fmt.local_time(view.next_fire_at, view.timezone)}" if view.next_fire_at else ""
    print(f"{view.name} {'enabled' if view.enabled else 'disabled'}{note}{nxt}")


# -- backfill ---------------------------------------------------------------------------------
async def _plan_backfill(call: Call) -> int | None:
    """Plan first: a refused plan (too many slots, a bad range) prints the count and the
    reason and exits 3, before anything fires."""
    planned = {p.name: call.arguments[p.name] for p in action_of("plan_backfill").params}
    plan = await call.backend.plan_backfill(**planned)
    call.notes["plan"] = plan
    if plan.ok:
        return None
    if call.args.json:
        print_json(plan.to_json())
    name, zone = call.arguments["name"], call.zone
    say(
        f"schedtui: backfill of {name} refused: {plan.count_text()} slot(s) in "
        f"({fmt.local_time(plan.start, zone)}, {fmt.local_time(plan.end, zone)}]: {plan.refusal}"
        + (" (re-run with --yes after reading the count)" if "need confirmation" in (plan.refusal or "") else "")
    )
    if plan.reason == "needs confirmation":
        say(f"schedtui: {_already_succeeded(plan, call.arguments['skip_succeeded'])}")
        if plan.live_effect():
            say(f"schedtui: live slots: {plan.live_effect()}")
    return EXIT_REFUSED


def _already_succeeded(plan: BackfillPlan, skipped: bool) -> str:
    """How many of the plan's slots already succeeded, and what becomes of them."""
    done = plan.already_succeeded
    if not done:
        return "already succeeded: none of them"
    fate = "skipped" if skipped else "they run again (--skip-succeeded skips them)"
    return f"already succeeded: {done:,} of the {plan.count_text()}, {fate}"


async def _follow_backfill(call: Call, progress: BackfillProgress) -> BackfillProgress:
    plan, zone = call.notes["plan"], call.zone
    count = progress.total if call.arguments["skip_succeeded"] else plan.count
    # On stderr by say(): a stream that refuses these lines (a full disk, a reader gone)
    # loses them, never the backfill, which ran on to its end.
    say(
        f"backfilling {count} slot(s) of {call.arguments['name']}: "
        f"{fmt.local_time(plan.first, zone)} … {fmt.local_time(plan.last, zone)}"
    )
    say(_already_succeeded(plan, call.arguments["skip_succeeded"]))
    if plan.live_effect():
        say(f"live slots: {plan.live_effect()}")
    return await follow_progress(call.backend, progress)


async def follow_progress(backend: Backend, progress: BackfillProgress) -> BackfillProgress:
    """Draw a backfill's progress on stderr until it ends; its last progress. A stderr that
    refuses the drawing loses it, never the backfill (see :func:`~console.cli.output.say`)."""
    tty = sys.stderr.isatty()
    shown = -1
    while True:
        if progress.fired != shown:
            shown = progress.fired
            _draw_progress(progress, tty)
        if progress.state != "running":
            if tty:
                say()
            return progress
        await asyncio.sleep(0.1)  # polling for display only
        progress = await backend.backfill_progress(progress.id)


def _draw_progress(progress: BackfillProgress, tty: bool) -> None:
    width = 30
    done = int(width * progress.fired / progress.total) if progress.total else width
    bar = "#" * done + "." * (width - done)
    text = f"[{bar}] {progress.fired}/{progress.total}  failed {progress.failed}  remaining {progress.remaining}"
    if tty:
        say(f"\r{text}", end="")
    elif progress.fired == progress.total or progress.total < 10 or progress.fired % max(1, progress.total // 10) == 0:
        say(text)


def _show_backfill(call: Call, progress: BackfillProgress) -> None:
    print(
        f"backfill {progress.id} {progress.state}: {progress.fired} fired, "
        f"{progress.succeeded} succeeded, {progress.failed} failed, {progress.remaining} remaining"
    )


# -- schedules created at run time ----------------------------------------------------------
def _said(view: ScheduleView, verb: str) -> str:
    target = f"{view.target.kind} {view.target.name}" if view.target else "?"
    state = "" if view.enabled else " (disabled)"
    nxt = f", next {view.next_fire_at.isoformat()}" if view.next_fire_at else ""
    return f'schedule "{view.name}" {verb}: {view.cron} ({view.timezone}) -> {target}{state}{nxt}'


def _deleted(call: Call, result: Any) -> None:
    print(f'schedule "{call.arguments["name"]}" deleted')


#: The verbs, in the order ``schedtui --help`` lists them.
DERIVED = (
    Verb(("list",), "list_schedules", help="list schedules", json=items("schedules"), show=_show_schedules),
    Verb(("runs",), "list_runs", help="show a schedule's runs, newest first", defaults={"limit": 20},
         json=items("runs"), prepare=_zone, show=_show_runs),
    Verb(("logs",), "run_log", help="what a run's handler logged and printed (--follow: as it comes)",
         switches=FOLLOW, prepare=no_json_follow, follow=follow_log, show=show_log),
    Verb(("fire",), "run_now", help="run a schedule now (in this process) and wait for it", prepare=_zone,
         follow=_wait_run, show=lambda call, run: print(runs_table([run], call.zone)),
         outcome=lambda run: EXIT_OK if run.status == "succeeded" else EXIT_FAILURE),
    Verb(("enable",), "enable_schedule", help="enable a schedule", show=_show_switched),
    Verb(("disable",), "disable_schedule", help="disable a schedule", show=_show_switched),
    # Its --yes is the plan's confirmation (more than 25 slots), asked by the backend: a
    # backfill of a few slots never needed it.
    Verb(("backfill",), "start_backfill", help="fire the slots of a past range, in order", options=("start", "end"),
         flags={"confirm": "yes"}, asks=False, prepare=_plan_backfill, follow=_follow_backfill, show=_show_backfill,
         outcome=lambda p: EXIT_OK if p.state == "done" and not p.failed else EXIT_FAILURE),
    Verb(("schedules", "create"), "create_schedule", positional=("name",), negations={"enabled": "--disabled"},
         show=lambda call, view: print(_said(view, "created"))),
    Verb(("schedules", "update"), "update_schedule", negations={"enabled": "--disabled"},
         show=lambda call, view: print(_said(view, "updated"))),
    # Scripts delete without --yes, as they always have (the console asks).
    Verb(("schedules", "delete"), "delete_schedule", asks=False, show=_deleted),
)  # fmt: skip

GROUPS = {"schedules": "create, update and delete schedules kept in the store"}


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, GROUPS, verb, group)


VERBS = handlers(DERIVED)
