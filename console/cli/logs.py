"""Showing a log on the command line: a run's (``schedtui logs``), a job attempt's (``jobs
logs``), a durable execution's (``durable logs``), once or followed.

The log goes to stdout as it was written (control characters escaped by the backend);
what the command says about it goes to stderr. ``--follow`` prints what is there, then
reads again every :data:`FOLLOW_EVERY_S` from where it stopped (the answer's ``size``)
and prints only what is new, until the log says nothing more will come: the run has
ended, or the process running it is gone (its row says ``running`` until it is closed as
abandoned), which it says.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Final

from backend import BadInput
from backend.observability.logs import RunLog
from backend.safetext import in_lines
from console.cli.derive import Call
from console.cli.output import complain

__all__ = ["FOLLOW", "FOLLOW_EVERY_S", "follow_log", "no_json_follow", "show_log"]

#: How often ``--follow`` reads again (seconds).
FOLLOW_EVERY_S: Final = 1.0
#: The switch of the log verbs.
FOLLOW: Final = {"follow": "while it is still running: print what comes as it comes, until it ends"}


def _subject(log: RunLog) -> str:
    if log.kind == "job":
        return f"job {log.id} of {log.name} (attempt {log.attempt})"
    if log.kind == "durable":
        return f"execution {log.id} of {log.name}"
    return f"run {log.id} of {log.name}"


def _orphaned(log: RunLog) -> bool:
    """Recorded running, but nothing more will come: the process running it is gone."""
    return log.kind != "durable" and log.status == "running" and not log.running


def _gone(log: RunLog) -> str:
    return f"{_subject(log)}: the process running it is gone (recorded running until it is closed as abandoned)"


def _write(text: str) -> None:
    if text:
        sys.stdout.write(in_lines(text))  # (the backend escaped the controls; a bidirectional override too)
        sys.stdout.flush()


async def no_json_follow(call: Call) -> int | None:
    """``--follow`` and ``--json`` do not go together (one prints as it comes, the other one answer)."""
    if call.args.follow and getattr(call.args, "json", False):
        raise BadInput("--follow prints the log as it comes and --json prints one answer: give one of them", field="follow")
    return None


async def follow_log(call: Call, log: RunLog) -> RunLog:
    """With ``--follow``: print the log, then what comes, until it ends; the last answer."""
    if not call.args.follow:
        return log
    _write(log.text)
    if log.kind == "job" and log.attempt is not None:
        call.arguments["attempt"] = log.attempt  # the attempt followed, even once a retry starts
    action: Any = getattr(call.backend, call.action.name)
    while log.running:
        await asyncio.sleep(FOLLOW_EVERY_S)  # polling, for display only
        call.arguments["after"] = log.size
        log = await action(**call.arguments)
        _write(log.text)
    return log


def show_log(call: Call, log: RunLog) -> None:
    if call.args.follow:
        complain(_gone(log) if _orphaned(log) else f"{_subject(log)}: {log.status}")
        return
    _write(log.text)
    if not log.size:
        complain(f"{_subject(log)} wrote nothing ({log.status})")
    if log.running:
        complain(f"{_subject(log)} is still running (--follow reads on)")
    elif _orphaned(log):
        complain(_gone(log))
