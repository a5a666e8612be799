"""``schedtui durable …``: list, show, logs, start, signal, cancel and retry durable executions.

Every verb works embedded (``--schedules/--store``: the store is opened, nothing runs
here; a ``serve`` instance runs what is started) and remote (``--url/--token``), and is
derived from its action's declaration (:mod:`console.cli.derive`); what is here is how
each one shows its result. Exit codes: 0 done, 1 refused (a finished execution, one that
has not failed), 2 bad input or an unknown execution or function (one line on stderr
naming it).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import partial
from typing import Any

from backend.durable.model import Execution, ExecutionsPage, Signalled, Started
from backend.safetext import in_lines
from console import format as fmt
from console.cli.derive import Call, Verb, add_derived, fields, handlers, items
from console.cli.logs import FOLLOW, follow_log, no_json_follow, show_log
from console.cli.output import EXIT_FAILURE

__all__ = ["DERIVED", "VERBS", "add_verbs", "execution_text", "executions_table"]

EXECUTION_GLYPHS, STEP_GLYPHS = fmt.EXECUTION_GLYPHS, fmt.STEP_GLYPHS


def executions_table(executions: list[Execution], now: datetime) -> str:
    rows = [
        [
            e.id,
            e.function,
            f"{EXECUTION_GLYPHS.get(e.status, '?')} {e.status}",
            e.current_step or "-",
            e.waiting_for or "-",
            fmt.countdown(e.wake_at, now) if e.wake_at else "-",
            fmt.ago(e.created_at, now),
            " ".join(filter(None, [e.error_tag and f"[{e.error_tag}]", e.error_message])) or "",
        ]
        for e in executions
    ]
    return fmt.table(["ID", "FUNCTION", "STATUS", "STEP", "WAITING FOR", "UNTIL", "CREATED", "ERROR"], rows)


def execution_text(e: Execution, now: datetime) -> str:
    """``durable show``: the execution, its steps and its log."""
    lines = [
        f"execution {e.id} of {e.function}: {EXECUTION_GLYPHS.get(e.status, '?')} {e.status}",
        f"  created    {fmt.local_time(e.created_at, 'UTC')}" + (f" by schedule {e.schedule} "
                                                                  f"(slot {fmt.local_time(e.scheduled_at, 'UTC')})"
                                                                  if e.schedule else ""),
    ]  # fmt: skip
    if e.waiting_for:
        lines.append(f"  waiting    for {e.waiting_for} until {fmt.local_time(e.wake_at, 'UTC')} ({fmt.countdown(e.wake_at, now)})")
    if e.finished_at:
        lines.append(f"  finished   {fmt.local_time(e.finished_at, 'UTC')}")
    if e.instance:
        lines.append(f"  instance   {e.instance}")
    lines.append(f"  input      {json.dumps(e.input, ensure_ascii=False)}")
    if e.status == "succeeded":
        lines.append(f"  output     {json.dumps(e.output, ensure_ascii=False)}")
    if e.error_tag or e.error_message:
        lines.append(f"  error      [{e.error_tag}] {e.error_message}")
    steps = e.steps or []
    lines.append("")
    if steps:
        shown = {s.seq: fmt.step_status(s.status, e.status) for s in steps}
        rows = [
            [
                str(s.seq),
                s.name,
                s.kind + (" (at most once)" if s.at_most_once else ""),
                f"{STEP_GLYPHS.get(shown[s.seq], '?')} {shown[s.seq]}",
                str(s.attempt),
                fmt.local_time(s.started_at, "UTC"),
                fmt.duration(s.duration_ms) if shown[s.seq] != "waiting" else f"until {fmt.local_time(s.wake_at, 'UTC')}",
                " ".join(filter(None, [s.error_tag and f"[{s.error_tag}]", s.error_message])) or "",
            ]
            for s in steps
        ]
        lines.append(fmt.table(["#", "STEP", "KIND", "STATUS", "ATTEMPT", "STARTED (UTC)", "DURATION", "ERROR"], rows))
    else:
        lines.append("no steps yet")
    if e.logs:
        lines.append("")
        lines.append("log:")
        lines.extend(f"  {fmt.local_time(line.at, 'UTC')}  {line.message}" for line in e.logs)
    return "\n".join(lines)


# -- how each verb shows its result ---------------------------------------------------------
async def _show_executions(call: Call, page: ExecutionsPage) -> None:
    function = call.arguments["function"]
    if not page.executions:
        print("no executions" + (f" of {function}" if function else ""))
        return
    print(executions_table(page.executions, await call.backend.now()))
    if page.next_before:
        more = f" {function}" if function else ""
        print(f"\nolder: schedtui durable list{more} --before {page.next_before}")


async def _show_execution(call: Call, execution: Execution) -> None:
    print(in_lines(execution_text(execution, await call.backend.now())))  # (errors, payloads, log lines as they came)


def _show_started(call: Call, started: Started) -> None:
    print(f"started {call.arguments['function']}: execution {started.id}")


def _show_signalled(call: Call, sent: Signalled) -> None:
    execution_id, name = call.arguments["execution_id"], call.arguments["name"]
    if sent.duplicate:
        print(f"execution {execution_id} had signal {name} already; the first one is kept")
    else:
        print(f"signal {name} sent to execution {execution_id}")


def _show_ended(call: Call, execution: Execution) -> None:
    if call.action.name == "cancel_execution" and execution.status == "running":
        print(f"execution {execution.id} stops at its next step (cancellation asked)")
    else:
        print(f"execution {execution.id}: {execution.status}")


# A refusal (a finished execution, one that has not failed) is a failure: exit code 1.
DurableVerb = partial(Verb, refused=EXIT_FAILURE)

#: The verbs, in the order ``schedtui durable --help`` lists them.
DERIVED = (
    DurableVerb(("durable", "list"), "list_executions", help="executions, newest first", positional=("function",),
                defaults={"limit": 20}, json=items("executions"), show=_show_executions),
    DurableVerb(("durable", "show"), "get_execution", help="one execution: its steps (the timeline) and its log",
                show=_show_execution),
    DurableVerb(("durable", "logs"), "execution_log", help="an execution's log (--follow: as it comes)",
                switches=FOLLOW, prepare=no_json_follow, follow=follow_log, show=show_log),
    DurableVerb(("durable", "start"), "start_execution",
                help="start an execution (a `serve` instance that defines the function runs it)",
                json=fields("id"), show=_show_started),
    DurableVerb(("durable", "signal"), "signal_execution", help="send a signal (an approval, say) to an execution",
                show=_show_signalled),
    # Scripts cancel without --yes, as they always have (the console asks).
    DurableVerb(("durable", "cancel"), "cancel_execution",
                help="cancel an execution: waiting or queued at once, running at its next step", asks=False,
                show=_show_ended),
    DurableVerb(("durable", "retry"), "retry_execution",
                help="run a failed execution again from its failed step, with fresh attempts", show=_show_ended),
)  # fmt: skip

GROUPS = {"durable": "durable executions: list, show, logs, start, signal, cancel, retry"}


def add_verbs(verb: Any, group: Any) -> None:
    add_derived(DERIVED, GROUPS, verb, group)


VERBS = handlers(DERIVED)
