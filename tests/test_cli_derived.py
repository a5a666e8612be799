"""The CLI's verbs for operator actions are derived from the actions' declarations.

Every verb that carries out an operator action names it (its parser's default
``action_name``), takes no argument that is not one of the action's parameters (or a
shared option, ``--json``, ``--yes``), is handled by the derivation, and its ``--help``
lists every parameter of the action. The verbs that are no action (``serve``,
``console``, ``demo``, ``manifest``) are the only ones left by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from backend.client.actions import ACTIONS, REQUIRED
from console.cli import derive
from console.cli.main import main
from console.cli.parsing import SHARED, build_parser, commands, verb_modules
from tests.servers import cli_env

REPO = Path(__file__).resolve().parents[1]
NOT_ACTIONS = {"serve", "migrate", "console", "demo", "manifest", "alert-rules"}  # (no operator action)
HELP_WIDTH = "200"  # one option a line, whatever the terminal

DERIVED = {verb.command: verb for module in verb_modules() for verb in module.DERIVED}


def parsers() -> dict[str, argparse.ArgumentParser]:
    return build_parser()[1]


def test_every_verb_but_serve_migrate_console_demo_and_the_file_generators_is_a_derived_action() -> None:
    by_verb = parsers()
    handlers = commands()
    groups = {command for command in by_verb if command not in handlers}
    assert set(handlers) <= set(by_verb) and groups == {"schedules", "jobs", "durable"}  # (a group alone does nothing)
    for command, parser in by_verb.items():
        if command in groups:
            continue
        named = parser.get_default("action_name")
        if command in NOT_ACTIONS:
            assert named is None, command
            continue
        assert command in DERIVED, f"`schedtui {command}` is not declared as a derived Verb"
        assert named == DERIVED[command].action and named in ACTIONS, command
        assert handlers[command].__qualname__.startswith(derive.handlers.__qualname__), command


@pytest.mark.parametrize("command", sorted(DERIVED))
def test_a_derived_verb_has_no_hand_written_argument(command: str) -> None:
    verb = DERIVED[command]
    derived = {argument.dest for argument in verb.arguments()}
    switches = {name.replace("-", "_") for name in verb.switches}  # the command line's own flags (--follow)
    allowed = derived | {option.dest for option in SHARED} | {"help", "json", "yes", "subverb"} | switches
    parser = parsers()[command]
    dests = {action.dest for action in parser._actions}
    assert dests <= allowed, f"`schedtui {command}` has arguments of its own: {dests - allowed}"
    assert derived <= dests
    assert ("json" in dests) == verb.prints_json
    assert ("yes" in dests) == verb.confirms


@pytest.mark.parametrize("command", sorted(DERIVED))
def test_help_lists_every_parameter_of_the_action(command: str) -> None:
    verb = DERIVED[command]
    text = parsers()[command].format_help()
    assert verb.declared.summary.replace("``", "") in " ".join(text.split())
    for param in verb.declared.params:
        arguments = [a for a in verb.arguments() if a.param == param.name]
        assert arguments, f"{command}: no argument for {param.name}"
        for argument in arguments:
            shown = argument.flags[0] if argument.flags[0].startswith("--") else argument.kwargs.get("metavar")
            assert shown and shown in text, f"`schedtui {command} --help` does not list {param.name} ({shown})"
        default = verb.defaults.get(param.name, param.default)
        if default not in (REQUIRED, None, False) and not param.required:
            assert f"default {default}" in text, (command, param.name)


def test_the_help_of_a_verb_in_a_subprocess_lists_its_parameters() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "console.cli", "jobs", "send", "--help"], cwd=REPO,
        env=cli_env(COLUMNS=HELP_WIDTH), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for shown in ("QUEUE", "--payload JSON", "--delay", "--attempts N", "--key", "--json"):
        assert shown in done.stdout, shown


def test_options_come_from_the_declaration() -> None:
    """Spelling, type, choices and range follow the parameters."""
    backfill = {action.dest: action for action in parsers()["backfill"]._actions}
    assert backfill["start"].option_strings == ["--from"] and backfill["start"].required  # start travels as "from"
    assert backfill["confirm"].option_strings == ["--yes"]
    assert backfill["skip_succeeded"].option_strings == ["--skip-succeeded"]
    listed = {action.dest: action for action in parsers()["jobs list"]._actions}
    assert listed["status"].choices == ["queued", "running", "dead"]
    create = {action.dest: action for action in parsers()["schedules create"]._actions}
    assert create["spec.cron"].required and not create["spec.queue"].required
    assert create["spec.on_overlap"].choices == ["skip", "queue", "parallel"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs", "hourly", "--limit", "abc"], "'abc' is not a whole number"),
        (["audit", "--limit", "0"], "0 must be at least 1"),
        (["jobs", "list", "q", "--limit", "1001"], "1001 is more than 1000"),
        (["locks", "release", "x", "--if-token", "99999999999999999999", "--yes"],
         "99999999999999999999 is more than 9007199254740992"),  # (in full: it said 9.0072e+15)
        (["jobs", "list", "q", "--status", "gone"], "invalid choice: 'gone'"),
        (["queues", "pause"], "say `schedtui queues pause QUEUE`"),
        (["durable", "signal", "01J00000000000000000000000"], "say `schedtui durable signal ID NAME`"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2_before_anything_opens(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "never.db"
    assert main([*argv, "--store", f"sqlite:///{store}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not store.exists()


def test_a_dangerous_action_refuses_without_yes_before_it_connects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "never.db"
    assert main(["locks", "release", "nightly/rollup", "--store", f"sqlite:///{store}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and 'Release lock "nightly/rollup" by force?' in err and "add --yes" in err, err
    assert not store.exists()


def test_the_verbs_of_dangerous_actions_that_scripts_call_without_yes_are_named() -> None:
    """Deleting a schedule or a job and cancelling an execution never asked for --yes (the
    console asks); a backfill's --yes is its plan's confirmation. Each such exemption is
    written on its verb, never implied."""
    exempt = {command for command, verb in DERIVED.items() if verb.declared.danger is not None and not verb.confirms}
    assert exempt == {"schedules delete", "jobs delete", "durable cancel", "backfill"}
    assert all(DERIVED[command].asks is False for command in exempt)
