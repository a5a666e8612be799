# An action's body is its docstring alone: @action replaces it with the dispatch to _act.
# mypy: disable-error-code="empty-body"
"""The operator actions on schedules, their runs and their backfills (system ``schedules``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, TypedDict

from backend.client.actions import Check, Cursor, Danger, Help, Http, Id, Range, Schema, When, action
from backend.client.operations.common import LOG_ANSWER, LogOffset, PageSize, ScheduleName, deleted
from backend.errors import BadInput
from backend.inputs import NOTE_MAX_CHARS, check_count, check_note
from backend.model import (
    BACKFILL_MAX_LIMIT,
    BackfillPlan,
    BackfillPlanJson,
    BackfillProgress,
    ExternalFiring,
    Run,
    RunsPage,
    SchedulesSnapshot,
    ScheduleView,
    Timestamp,
    iso,
)
from backend.observability.logs import RunLog
from backend.schedules import MAX_RUNTIME_LIMIT

#: Bounds of :meth:`Backend.runs_between` (the console asks for what is on screen).
RUNS_BETWEEN_MAX_NAMES = 500
RUNS_BETWEEN_MAX_PER_NAME = 1000


def check_runs_between(names: list[str], start: datetime, end: datetime, limit_per_name: int) -> None:
    """Refuse a :meth:`Backend.runs_between` call out of bounds, naming the bad value."""
    if not names:
        raise BadInput("name: give at least one schedule name", field="name")
    if len(names) > RUNS_BETWEEN_MAX_NAMES:
        raise BadInput(f"{len(names)} names are more than {RUNS_BETWEEN_MAX_NAMES} at once", field="name")
    check_count(limit_per_name, "limit_per_name", 1, RUNS_BETWEEN_MAX_PER_NAME)
    if start.tzinfo is None or end.tzinfo is None:
        raise BadInput("from and to must carry a time zone offset", field="from")
    if start >= end:
        raise BadInput(f"from ({iso(start)}) must be before to ({iso(end)})", field="from")


_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"}
#: A stored schedule's keys as the OpenAPI document states them (the engine checks them).
SCHEDULE_CHANGES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cron": {"type": "string"},
        "timezone": {"type": "string"},
        "queue": {"type": "string", "nullable": True},
        "durable": {"type": "string", "nullable": True},
        "payload": {"description": "any JSON, up to 64 KiB encoded"},
        "description": {"type": "string", "nullable": True, "maxLength": 1000},
        "enabled": {"type": "boolean"},
        "on_overlap": {"type": "string", "enum": ["skip", "queue", "parallel"]},
        "backfill": {"type": "string", "enum": ["skip", "latest", "all"]},
        "max_runtime": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_RUNTIME_LIMIT},
        "alert": {"description": "false (no alerts), or {failing: N, late: SECONDS, disabled: SECONDS, "
                  "resolve_after: SECONDS}, each false to turn it off, seconds at most a year (see the README's Alerts)",
                  "nullable": True},
    },
}
SCHEDULE_SPEC: dict[str, Any] = {
    **SCHEDULE_CHANGES,
    "required": ["name", "cron", "timezone"],
    "properties": {"name": _NAME, **SCHEDULE_CHANGES["properties"]},
}


# -- the fields some answers add beside the result (their types are the OpenAPI document's)
Window = TypedDict("Window", {"from": Timestamp, "to": Timestamp})


def _window(runs: Any, arguments: Mapping[str, Any]) -> Window:
    return {"from": iso(arguments["start"]), "to": iso(arguments["end"])}


class Fired(TypedDict):
    run_id: str


def _fired(run: Run, arguments: Mapping[str, Any]) -> Fired:
    return {"run_id": run.id}


class BackfillId(TypedDict):
    id: str


def _backfill_id(progress: BackfillProgress, arguments: Mapping[str, Any]) -> BackfillId:
    return {"id": progress.id}


class PlanBeside(TypedDict):
    plan: BackfillPlanJson


async def _backfill_plan(backend: ScheduleOperations, arguments: Mapping[str, Any]) -> PlanBeside:
    """The plan beside a started backfill's progress (asked before it starts)."""
    plan = await backend.plan_backfill(
        arguments["name"], arguments["start"], arguments["end"], confirm=arguments["confirm"], limit=arguments["limit"]
    )
    return {"plan": plan.to_json()}



def _check_window(names: list[str], start: datetime, end: datetime, limit_per_name: int) -> None:
    check_runs_between(names, start, end, limit_per_name)


class ScheduleOperations:
    """Schedules, runs and backfills: what an engine offers every console and CLI."""

    @action(system="schedules", permission="read", impl="schedules_snapshot",
            http=Http("GET", "/inspect/schedules", ok="{coordination, instance, now, schedules: [schedule]}"))
    async def list_schedules(self) -> SchedulesSnapshot:
        """Every schedule with its state, next slot and last run."""

    @action(system="schedules", permission="read", impl="runs_page",
            http=Http("GET", "/inspect/schedules/runs", ok="{runs: [run], next_before}",
                      errors={404: "a schedule neither defined nor in the ledger"}))
    async def list_runs(
        self, name: ScheduleName, *, limit: PageSize = 50, before: Annotated[str | None, Cursor("run")] = None
    ) -> RunsPage:
        """A page of a schedule's runs, newest first (keyset paging).

        Newest first by scheduled time (then id); ``before`` is the id of the last run of
        the previous page. A schedule no longer defined (removed from the code, deleted)
        keeps its runs until the retention takes them: they are listed by its name."""

    @action(system="schedules", permission="read", check=_check_window,
            http=Http("GET", "/inspect/runs", envelope="runs", wire={"names": "name", "start": "from", "end": "to"},
                      extra=_window,
                      ok="{from, to, runs: {name: [run]}}", errors={404: "a schedule neither defined nor in the ledger"}))
    async def runs_between(
        self,
        names: Annotated[list[str], Help("repeat for several schedules (up to 500)")],
        start: datetime,
        end: datetime,
        *,
        limit_per_name: Annotated[int, Range(1, RUNS_BETWEEN_MAX_PER_NAME)] = 200,
    ) -> dict[str, list[Run]]:
        """Runs of several schedules scheduled in a window, newest first per schedule.

        For timelines: per schedule, its runs with from <= scheduled_at < to, at most
        limit_per_name of them (the newest; a schedule with exactly that many may have
        more). Schedules without runs in the window are left out. A schedule no longer
        defined is read as the runs' page reads it (its runs stay until the retention
        takes them); a name neither defined nor in the ledger is ``NotFound``."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/runs/{run_id}", ok="the run", errors={404: "unknown run"}))
    async def get_run(self, run_id: Annotated[str, Id("run")]) -> Run:
        """One run."""

    @action(system="schedules", permission="read", impl="run_logs.run_log",
            http=Http("GET", "/inspect/runs/{run_id}/log", ok=LOG_ANSWER, errors={404: "unknown run"}))
    async def run_log(self, run_id: Annotated[str, Id("run")], *, after: LogOffset = 0) -> RunLog:
        """What a run's handler logged and printed (its first and last 32 KiB).

        text is the log past its first ``after`` bytes (all of it by default), with one line
        saying how much was left out between the head and the tail; size is the ``after`` of
        the next read; running is true while more may come (a follower reads again until it
        is false)."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/schedules/{name}/upcoming", envelope="slots", ok="{slots: [iso8601]}",
                      errors={404: "unknown schedule"}))
    async def upcoming(self, name: ScheduleName, count: Annotated[int, Range(1, 100)] = 5) -> list[datetime]:
        """The next slots of a schedule by its cron (whether or not it is enabled)."""

    @action(system="schedules", permission="operate", label="Run now", audit="schedule.fire",
            http=Http("POST", "/inspect/schedules/{name}/fire", status=202, envelope="run",
                      extra=_fired, ok="{run_id, run}", errors={404: "unknown schedule"}))
    async def run_now(self, name: ScheduleName) -> Run:
        """Run now (trigger and outcome manual), whatever the overlap policy.

        Starts exactly one run and returns it once it is recorded."""

    @action(system="schedules", permission="operate", label="an external fire",
            http=Http("POST", "/schedule/{name}/fire", status=202, again=200, repeated=lambda firing: not firing.created,
                      fixed={"trigger": "external"}, ok="{run_id, created, queued, run}",
                      errors={404: "unknown schedule", 409: "not an external schedule, disabled, or no slot due"}))
    async def fire_external(self, name: ScheduleName) -> ExternalFiring:
        """Fire the slot that is due now (called by a platform scheduler).

        The slot is the newest cron slot at or before now, at most 10 minutes old, fired at
        most once across the fleet: a retry for the same slot returns the first firing
        (200, created false) instead of firing again (202). Refused for a schedule on its
        own timer (unless the serving engine allows it) or when no slot is due."""

    @action(system="schedules", permission="operate", label="enable", audit="schedule.enable", impl="enable",
            http=Http("POST", "/inspect/schedules/{name}/enable", ok="the schedule",
                      errors={404: "unknown schedule"}))
    async def enable_schedule(
        self, name: ScheduleName, *, note: Annotated[str | None, Check(check_note, {"maxLength": NOTE_MAX_CHARS})] = None
    ) -> ScheduleView:
        """Enable a schedule (it arms its next future slot).

        Slots that passed while it was disabled are not caught up."""

    @action(system="schedules", permission="operate", label="disable", audit="schedule.disable", impl="disable",
            http=Http("POST", "/inspect/schedules/{name}/disable", ok="the schedule",
                      errors={404: "unknown schedule"}))
    async def disable_schedule(
        self, name: ScheduleName, *, note: Annotated[str | None, Check(check_note, {"maxLength": NOTE_MAX_CHARS})] = None
    ) -> ScheduleView:
        """Disable a schedule, with an optional note.

        It keeps its definition, has no next slot and does not fire until enabled."""

    @action(system="schedules", permission="operate", label="creating a schedule", audit="schedule.create",
            http=Http("POST", "/inspect/schedules", status=201, body="spec", ok="the schedule created",
                      errors={409: "name_taken: a schedule (in code or stored) has that name"}))
    async def create_schedule(self, spec: Annotated[Mapping[str, Any], Schema(SCHEDULE_SPEC)]) -> ScheduleView:
        """Create a schedule, kept in the store, that every instance arms within 2 s.

        Keys: name, cron, timezone, exactly one of queue (a queue's name) or durable (a
        durable function's name), and optionally payload, description, enabled,
        on_overlap, backfill, max_runtime. Validated as a schedule defined in code: a bad
        value or an unknown target is ``BadInput`` naming it (422, error.field); a name in
        use is ``NameTaken`` (409 name_taken), but for the same create again by its author
        with the schedule unchanged since (a retry whose first answer was lost), which
        answers as the first did. The answer is the schedule, with source "store"."""

    @action(system="schedules", permission="operate", label="editing a schedule", audit="schedule.update",
            http=Http("PATCH", "/inspect/schedules/{name}", body="changes", ok="the schedule as changed",
                      errors={409: "defined_in_code: schedules defined in code are only enabled or disabled"}))
    async def update_schedule(self, name: str, changes: Annotated[Mapping[str, Any], Schema(SCHEDULE_CHANGES)]) -> ScheduleView:
        """Change a stored schedule; every instance re-arms it within 2 s.

        The changes have any of the create keys but name. Giving queue replaces a durable
        target and the other way round. A due slot is neither fired twice nor lost.
        ``DefinedInCode`` (409 defined_in_code) for a schedule defined in code,
        ``NotFound`` for an unknown one."""

    @action(system="schedules", permission="operate", label="deleting a schedule", audit="schedule.delete",
            danger=Danger('Delete schedule "{name}"?',
                          "It stops firing on every instance within 2 seconds and cannot be undone; its runs stay in the ledger."),
            http=Http("DELETE", "/inspect/schedules/{name}", extra=deleted, ok="{deleted: true}",
                      errors={409: "defined_in_code: schedules defined in code cannot be deleted"}))
    async def delete_schedule(self, name: str) -> None:
        """Delete a stored schedule; it stops firing everywhere within 2 s.

        Its runs stay in the ledger; a run in flight finishes. ``DefinedInCode`` (409),
        ``NotFound`` as for update."""

    @action(system="schedules", permission="read",
            http=Http("POST", "/inspect/schedules/{name}/backfill/plan", wire={"start": "from", "end": "to"}, retry=True,
                      ok="the plan", errors={404: "unknown schedule"}))
    async def plan_backfill(
        self,
        name: ScheduleName,
        start: Annotated[datetime, When(lower=True)],
        end: Annotated[datetime, When()],
        *,
        confirm: bool = False,
        limit: Annotated[int | None, Schema({"minimum": 1, "maximum": BACKFILL_MAX_LIMIT})] = None,
    ) -> BackfillPlan:
        """What a backfill would do (count, first, last, refusal); fires nothing.

        The slots in (from, to]; already_succeeded counts those that have a succeeded run."""

    @action(system="schedules", permission="operate", label="backfill", audit="schedule.backfill",
            danger=Danger('Backfill "{name}"?',
                          "Every slot of the range fires now, one after another, as if it had been due; "
                          "their handlers run with those slots' times."),
            http=Http("POST", "/inspect/schedules/{name}/backfill", status=202, envelope="progress",
                      wire={"start": "from", "end": "to"}, prelude=_backfill_plan, extra=_backfill_id,
                      ok="{id, plan, progress}", errors={404: "unknown schedule", 409: "refused: {count, reason}"}))
    async def start_backfill(
        self,
        name: ScheduleName,
        start: Annotated[datetime, When(lower=True)],
        end: Annotated[datetime, When()],
        *,
        confirm: Annotated[bool, Help("needed above 25 slots")] = False,
        limit: Annotated[int | None, Schema({"minimum": 1, "maximum": BACKFILL_MAX_LIMIT, "default": 1000})] = None,
        skip_succeeded: Annotated[bool, Help("fire only the slots without a succeeded run")] = False,
    ) -> BackfillProgress:
        """Start a range backfill in the background.

        It fires the slots in (from, to] in order; ``Refused`` when the plan is refused or
        a backfill of this schedule runs anywhere."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/backfills/{backfill_id}", ok="backfill progress", errors={404: "unknown backfill"}))
    async def backfill_progress(self, backfill_id: Annotated[str, Id("backfill")]) -> BackfillProgress:
        """Progress of a backfill (fired, failed, remaining, state)."""

    @action(system="schedules", permission="read",
            http=Http("GET", "/inspect/backfills", envelope="backfills", ok="{backfills: [backfill progress]}",
                      errors={404: "unknown schedule"}))
    async def running_backfills(
        self, name: Annotated[str | None, Help("only this schedule's (at most one runs per schedule)")] = None
    ) -> list[BackfillProgress]:
        """The backfills running now, on any instance, oldest first.

        With name, the one of that schedule (an empty list when none runs); ``NotFound``
        for an unknown schedule. What a console reopens, and stops, after its dialog was
        closed."""

    @action(system="schedules", permission="operate", label="cancelling a backfill", audit="schedule.backfill_cancel",
            danger=Danger("Stop backfill {backfill_id}?",
                          "No further slot of it fires; the run in flight finishes on its own. "
                          "The slots not fired stay unfired (backfill them again to fire them)."),
            http=Http("POST", "/inspect/backfills/{backfill_id}/cancel", retry=True,
                      ok="the backfill's progress, state cancelled (or as it had ended)",
                      errors={404: "unknown backfill", 409: "it runs on another instance"}))
    async def cancel_backfill(self, backfill_id: Annotated[str, Id("backfill")]) -> BackfillProgress:
        """Stop a running backfill before its next slot (the run in flight finishes).

        Its progress, cancelled (or as it ended, if it had); ``Refused`` when another
        instance runs it. Its end is recorded in the audit log once the run in flight has
        ended too."""
