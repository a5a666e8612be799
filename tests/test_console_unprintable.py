"""Stored text never reaches the operator's terminal as a command: not through the console,
nor through the command line.

Every text column a handler, a client or an older release could have written is given an
escape sequence (clear the screen, retitle the window, a C1 CSI), a bell, a bidirectional
override and isolate, and a line separator, in the store itself (past every check on
write). Each view, and each screen Enter opens from it, is then drawn, and what the
terminal would be sent is read; and each verb of the command line that reads prints: none
of them is in it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.segment import ControlType, Segment
from textual.color import Color
from textual.widgets import Static

from backend.safetext import never_drawn
from console.cli.main import main
from console.unprintable import Unprintable
from console.widgets import SchedulesTable
from tests.console_fixtures import add_alerts, add_jobs, add_locks, add_timeline_history, build_ledger, ledger_copy
from tests.durable_scenes import add_durable_history
from tests.test_console import console, settle

POISON = "\x1b[2J\x1b]0;pwned\x07\u202eevil\u2066\x9b31m\u2028x"
BAD = "\x1b\x07\u202e\u2066\x9b\u2028"

TEXT_COLUMNS = {
    "runs": ["error_message", "traceback", "error_tag"],
    "schedule_state": ["note", "changed_by"],
    "jobs": ["key", "error_message", "error_tag"],
    "job_attempts": ["error_message"],
    "alerts": ["summary"],
    "audit": ["actor", "target"],
    "locks": ["holder"],
    "instances": ["host"],
    "durable_executions": ["error_message", "waiting_for"],
    "durable_steps": ["error_message"],
    "durable_logs": ["message"],
}


def poison(db: Path) -> None:
    with sqlite3.connect(db) as c:
        for table, columns in TEXT_COLUMNS.items():
            for column in columns:
                c.execute(f"UPDATE {table} SET {column} = ? || {column} WHERE {column} IS NOT NULL", (POISON,))
        c.execute("UPDATE audit SET detail = ?", (json.dumps({"note": POISON, POISON: 1}),))
        c.execute("UPDATE durable_executions SET output = ? WHERE output IS NOT NULL", (json.dumps({"v": POISON}),))
        c.execute("UPDATE jobs SET payload = ?", (json.dumps({"to": POISON}, ensure_ascii=False),))


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-unprintable")
    url = asyncio.run(build_ledger(folder))
    for add in (add_timeline_history, add_durable_history, add_jobs, add_locks, add_alerts):
        asyncio.run(add(url))
    poison(folder / "state.db")
    return folder / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


def drawn(app: Any) -> str:
    """What the terminal is sent for the whole screen: every segment's text."""
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    return "".join(segment.text for line in update.strips for strip in line for segment in strip if not segment.control)


def test_never_drawn_removes_what_a_terminal_takes_for_a_command_and_keeps_the_cells() -> None:
    assert never_drawn("a\x1b[2Jb\u202ec\x07d\x9be\u2028") == "a[2Jbcde"
    assert never_drawn("lone \ud800 surrogate") == "lone \ufffd surrogate"  # (a remote answer's "\ud800")
    assert never_drawn("plain, naïve, 東京") == "plain, naïve, 東京"
    line = [Segment("ok "), Segment("x\x1b]0;t\x07y\ud800", None), Segment("\x1b[?1049h", None, [(ControlType.HOME,)])]
    out = Unprintable().apply(line, Color(0, 0, 0))
    assert [s.text for s in out] == ["ok ", "x]0;ty\ufffd", "\x1b[?1049h"]  # a control segment is Rich's own
    assert sum(s.cell_length for s in out[:2]) == sum(s.cell_length for s in line[:2])


# Keys pressed, then what is drawn is read: each view, and the screens Enter opens on a
# poisoned row (a failed run, a dead job, an execution's steps, an audit entry).
WALK = [("1",), ("tab", "down", "down", "down", "enter"), ("escape", "2"), ("3",), ("enter", "f", "f", "f", "enter"),
        ("escape", "4"), ("down", "down", "enter"), ("escape", "5"), ("6",), ("enter",), ("escape", "7")]  # fmt: skip


async def test_every_view_and_the_screens_enter_opens_show_stored_escapes_as_escapes(store_url: str) -> None:
    shown_escaped = []
    async with console(store_url, size=(120, 40)) as (app, pilot, clock, notes):
        for keys in WALK:
            await pilot.press(*keys)
            await settle(pilot)
            where = f"view {app.active_view_id}" if len(app.screen_stack) == 1 else type(app.screen).__name__
            text = drawn(app)
            assert not [c for c in BAD if c in text], f"{where} drew {[c for c in BAD if c in text]}"
            if "\\x1b[2J" in text:
                shown_escaped.append(where)
    # Where a poisoned row is on screen, it is seen as escapes, not silently cut (the
    # Timeline shows no text of a run).
    assert shown_escaped == ["view schedules", "RunDetails", "view jobs", "JobDetails", "view durable", "StepsScreen",
                             "view locks", "view audit", "AuditDetails", "view health"]  # fmt: skip


async def test_a_widget_that_draws_stored_text_as_it_is_sends_no_escape_to_the_terminal(store_url: str) -> None:
    """The net under every view: a widget that forgets to escape what it shows (here a
    plain Static) still sends the terminal no command."""
    async with console(store_url) as (app, pilot, clock, notes):
        await app.screen.mount(Static("forgot " + POISON, markup=False, id="forgot"))
        await settle(pilot)
        text = drawn(app)
        assert "forgot [2J]0;pwnedevil31mx" in text
        assert not [c for c in BAD if c in text]


async def test_names_crons_and_zones_from_a_server_that_did_not_check_them_are_shown_escaped(store_url: str) -> None:
    """A server checks them where they are made; an older or a misbehaving one may send
    controls in them, which the Schedules table drew through the last-resort filter only
    (stripped: `night]0;PWNED[2Jly`), not as the escapes every other text is shown as."""
    async with console(store_url) as (app, pilot, clock, notes):
        table = app.query_one(SchedulesTable)
        view = replace(app.views[0], name="n\x1b]0;x\x07\u202e", cron="* \x1b[2J* * * *", timezone="UTC\x9b")
        cells = [str(cell) for cell in table._cells(view, clock.now(), clock.now())]
        assert (cells[0], cells[4], cells[5]) == ("n\\x1b]0;x\\x07\\u202e", "* \\x1b[2J* * * *", "UTC\\x9b")


def test_the_command_line_prints_no_stored_escape_and_its_json_means_the_same(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every verb that reads, as text and as ``--json``: tables, ``jobs show`` and ``durable
    show`` (a payload's override, a step's error, a log line), logs. The JSON carries each
    such character as its ``\\u`` escape: the same value, and no command to the terminal."""
    empty = tmp_path / "definitions"
    empty.mkdir()

    def printed(*args: str) -> str:
        assert main([*args, "--store", store_url, "--schedules", str(empty)]) == 0, args
        out, err = capsys.readouterr()
        assert not [c for c in BAD if c in out + err], (args, [c for c in BAD if c in out + err])
        return out

    dead = json.loads(printed("jobs", "list", "mailer", "--status", "dead", "--json"))
    assert POISON in dead[0]["error_message"]  # the value, whole
    executions = json.loads(printed("durable", "list", "--json"))
    assert any(POISON in (e["waiting_for"] or "") for e in executions)
    assert "\\x1b[2J" in printed("jobs", "show", dead[0]["id"])
    shown = [printed("durable", "show", e["id"]) + printed("durable", "logs", e["id"]) for e in executions]
    assert any("\\u202eevil" in text for text in shown)
    for verb in (["runs", "daily-digest"], ["queues"], ["jobs", "list", "mailer"], ["audit"], ["alerts"], ["locks"]):
        printed(*verb)
        json.loads(printed(*verb, "--json"))
