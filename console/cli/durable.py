"""``schedtui durable …``: list, show, start, signal, cancel and retry durable executions.

Every verb works embedded (``--schedules/--store``: the store is opened, nothing runs
here; a ``serve`` instance runs what is started) and remote (``--url/--token``). Exit
codes: 0 done, 1 refused (a finished execution, one that has not failed), 2 bad input
or an unknown execution or function (one line on stderr naming it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

from backend import Refused
from backend.client.interface import Backend
from backend.durable.model import EXECUTION_STATUSES, Execution
from backend.durable.service import parse_json_option
from console import format as fmt
from console.cli.main import _VERB_OPTIONS, EXIT_FAILURE, EXIT_OK, _positive_int, _print_json, _with_backend

EXECUTION_GLYPHS, STEP_GLYPHS = fmt.EXECUTION_GLYPHS, fmt.STEP_GLYPHS

MakeSub = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]


def add_verbs(verb: Callable[..., argparse.ArgumentParser], group: Callable[..., MakeSub]) -> None:
    sub = group("durable", "durable executions: list, show, start, signal, cancel, retry")
    p = sub("list", "executions, newest first", _VERB_OPTIONS)
    p.add_argument("function", metavar="FUNCTION", nargs="?", help="only this durable function's")
    p.add_argument("--status", choices=EXECUTION_STATUSES, help="only executions in this status")
    p.add_argument("--limit", type=_positive_int, default=20, metavar="N", help="how many (20)")
    p.add_argument("--before", metavar="ID", help="older than this execution (the next page)")
    p.add_argument("--json", action="store_true", help="a JSON array of executions")
    p = sub("show", "one execution: its steps (the timeline) and its log", _VERB_OPTIONS)
    p.add_argument("id", metavar="ID")
    p.add_argument("--json", action="store_true", help="the execution as JSON, with steps and logs")
    p = sub("start", "start an execution (a `serve` instance that defines the function runs it)", _VERB_OPTIONS)
    p.add_argument("function", metavar="FUNCTION")
    p.add_argument("--input", metavar="JSON", help="the input, a JSON value (default null)")
    p.add_argument("--json", action="store_true", help='print {"id"}')
    p = sub("signal", "send a signal (an approval, say) to an execution", _VERB_OPTIONS)
    p.add_argument("id", metavar="ID")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--payload", metavar="JSON", help="the signal's payload, a JSON value (default null)")
    p.add_argument("--json", action="store_true", help='print {"execution_id", "name", "duplicate"}')
    for name, help in (
        ("cancel", "cancel an execution: waiting or queued at once, running at its next step"),
        ("retry", "run a failed execution again from its failed step, with fresh attempts"),
    ):
        p = sub(name, help, _VERB_OPTIONS)
        p.add_argument("id", metavar="ID")
        p.add_argument("--json", action="store_true", help="print the execution as JSON")


async def _act(args: argparse.Namespace, body: Callable[[Backend], Coroutine[Any, Any, int]]) -> int:
    """Run ``body`` on the backend; a refusal is exit code 1 with one line."""

    async def wrapped(backend: Backend) -> int:
        try:
            return await body(backend)
        except Refused as exc:
            print(f"schedtui: {exc.message}", file=sys.stderr)
            return EXIT_FAILURE

    return await _with_backend(args, wrapped)


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
        rows = [
            [
                str(s.seq),
                s.name,
                s.kind + (" (at most once)" if s.at_most_once else ""),
                f"{STEP_GLYPHS.get(s.status, '?')} {s.status}",
                str(s.attempt),
                fmt.local_time(s.started_at, "UTC"),
                fmt.duration(s.duration_ms) if s.status != "waiting" else f"until {fmt.local_time(s.wake_at, 'UTC')}",
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


async def cmd_list(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        page = await backend.list_executions(args.function, status=args.status, limit=args.limit, before=args.before)
        if args.json:
            _print_json([e.to_json() for e in page.executions])
            return EXIT_OK
        if not page.executions:
            print("no executions" + (f" of {args.function}" if args.function else ""))
            return EXIT_OK
        print(executions_table(page.executions, await backend.now()))
        if page.next_before:
            more = f" {args.function}" if args.function else ""
            print(f"\nolder: schedtui durable list{more} --before {page.next_before}")
        return EXIT_OK

    return await _act(args, body)


async def cmd_show(args: argparse.Namespace) -> int:
    async def body(backend: Backend) -> int:
        execution = await backend.get_execution(args.id)
        if args.json:
            _print_json(execution.to_json())
        else:
            print(execution_text(execution, await backend.now()))
        return EXIT_OK

    return await _act(args, body)


async def cmd_start(args: argparse.Namespace) -> int:
    value = parse_json_option(args.input, "--input")

    async def body(backend: Backend) -> int:
        started = await backend.start_execution(args.function, value)
        if args.json:
            _print_json({"id": started.id})
        else:
            print(f"started {args.function}: execution {started.id}")
        return EXIT_OK

    return await _act(args, body)


async def cmd_signal(args: argparse.Namespace) -> int:
    value = parse_json_option(args.payload, "--payload")

    async def body(backend: Backend) -> int:
        sent = await backend.signal_execution(args.id, args.name, value)
        if args.json:
            _print_json(sent.to_json())
        elif sent.duplicate:
            print(f"execution {args.id} had signal {args.name} already; the first one is kept")
        else:
            print(f"signal {args.name} sent to execution {args.id}")
        return EXIT_OK

    return await _act(args, body)


def _done(verb: str) -> Callable[[argparse.Namespace], Coroutine[Any, Any, int]]:
    async def cmd(args: argparse.Namespace) -> int:
        async def body(backend: Backend) -> int:
            if verb == "cancel":
                execution = await backend.cancel_execution(args.id)
            else:
                execution = await backend.retry_execution(args.id)
            if args.json:
                _print_json(execution.to_json())
            elif verb == "cancel" and execution.status == "running":
                print(f"execution {execution.id} stops at its next step (cancellation asked)")
            else:
                print(f"execution {execution.id}: {execution.status}")
            return EXIT_OK

        return await _act(args, body)

    return cmd


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "durable list": cmd_list,
    "durable show": cmd_show,
    "durable start": cmd_start,
    "durable signal": cmd_signal,
    "durable cancel": _done("cancel"),
    "durable retry": _done("retry"),
}
