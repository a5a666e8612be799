"""Bad input on the command line: one line on stderr naming the bad value, exit code 2,
never a traceback, and never a secret.

The values here came from an outside tester: an instance name that carries terminal
escapes or a byte that is not UTF-8, a token that an HTTP header cannot carry, JSON nested
past Python's recursion limit, server URLs that httpx or the socket layer refuse with a
traceback, numbers in digits other than ASCII's, and a client that goes away in the middle
of a request's body. Most run through ``main(argv)`` in this process; values that are not
UTF-8 can only come through a real process's argv.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from backend import BadInput, Engine, Run, connect, open_store
from backend.api.base import Api
from backend.api.tokens import Tokens
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.definitions import discover_definitions
from backend.durable.service import parse_json_option
from console.cli.parsing import parse_args
from tests.servers import FOREIGN_ANSWERS, INSPECT_INFO, Reply, json_server, run_main, start_server
from tests.test_cli import SCHEDULES, Cli, child_env, create_store, write_tree

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    write_tree(tmp_path / "schedules", SCHEDULES)
    create_store(tmp_path / "state.db")
    return Cli(tmp_path)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal for bad input (exit code 2, nothing on stdout)."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    return line


def real(cli: Cli, *args: str | bytes, store: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """``schedtui ARGS`` in a process of its own: argv may hold bytes that are not UTF-8."""
    argv: list[str | bytes] = [*cli.argv(store=store)[:3], *args]
    if store:
        argv += ["--store", cli.store]
    return subprocess.run(
        argv, cwd=cli.root, env={**child_env(), **env}, capture_output=True, text=True, timeout=30,
        errors="backslashreplace",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# --instance
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("evil\x1b[31mRED\nline2", "evil\\x1b[31mRED\\nline2"),
        ("tab\there", "tab\\there"),
        ("", "''"),
        ("  ", "'  '"),
        ("right-to-left\u202eoverride", "\\u202e"),
        ("x" * 300, "longer than 255"),
    ],
)
def test_an_instance_name_that_is_not_one_printable_line_is_refused(cli: Cli, name: str, shown: str) -> None:
    for args in (["--instance", name, "fire", "hourly"], ["fire", "hourly", f"--instance={name}"]):
        line = refused(cli(*args))
        assert line.startswith("schedtui: --instance "), line
        assert shown in line
        assert "\x1b" not in line
    assert cli.log("hourly") == []  # nothing fired
    assert cli.runs("hourly") == []


def test_an_instance_name_that_is_not_utf8_is_refused_by_every_verb_and_serve(cli: Cli) -> None:
    for args in ([b"--instance", b"\xff", b"fire", b"hourly"], [b"serve", b"--instance", b"web\xff"]):
        line = refused(real(cli, *args))
        assert line.startswith("schedtui: --instance "), line
        assert "\\udcff" in line
    assert cli.log("hourly") == []


# Retitles the window, clears the screen, then draws the rest of the line right to left.
TERMINAL_COMMAND = "x\x1b]0;PWNED\x07y\x1b[2J\u202egnp.exe"


@pytest.mark.parametrize(
    "args",
    [["runs", TERMINAL_COMMAND], ["fire", TERMINAL_COMMAND], ["enable", TERMINAL_COMMAND],
     ["disable", TERMINAL_COMMAND], ["schedules", "delete", TERMINAL_COMMAND],
     ["enable", "hourly", "--as", TERMINAL_COMMAND],
     ["locks", "release", TERMINAL_COMMAND]],  # (the last: its question, without --yes)
    ids=lambda args: " ".join(args[:2]),
)  # fmt: skip
def test_a_name_quoted_in_a_refusal_never_reaches_the_terminal_as_a_command(cli: Cli, args: list[str]) -> None:
    # "no schedule named ..." quoted the name as it came: its escape sequences ran in the
    # operator's terminal.
    line = refused(cli(*args))
    assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line, repr(line)
    assert "x\\x1b]0;PWNED\\x07y\\x1b[2J\\u202egnp.exe" in line, line


def test_a_store_path_that_is_not_utf8_is_refused_naming_the_byte(cli: Cli) -> None:
    """It was refused as holding "a control character (a line break?)", which it does not."""
    line = refused(real(cli, "list", "--store", b"sqlite:///st\xe9te.db", store=False))
    assert line == (
        'schedtui: store URL "sqlite:///st\\udce9te.db" holds \\udce9 at position 13 (a byte that is not UTF-8): '
        "a store's file name is UTF-8 text without control characters"
    )


def test_a_printable_instance_name_is_recorded_on_the_run(cli: Cli) -> None:
    cli.ok("--instance", "web-1 (blue):42", "fire", "hourly")
    assert [run["instance"] for run in cli.runs("hourly")] == ["web-1 (blue):42"]


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("evil\x1b[31mRED\nline2", "'evil\\x1b[31mRED\\nline2'"),
        ("", "''"),
        ("  ", "'  '"),
        ("web\udcff", "'web\\udcff'"),
        ("x" * 300, "longer than 255"),
    ],
)
async def test_an_engine_made_in_code_refuses_an_instance_name_as_connect_does(
    tmp_path: Path, name: str, shown: str
) -> None:
    """``Engine(instance=…)`` took any text, which went on every run it recorded (and to
    operators' terminals); ``connect()`` and ``--instance`` refused it."""
    with pytest.raises(BadInput) as caught:
        Engine([], f"sqlite:///{tmp_path / 'state.db'}", instance=name)
    assert caught.value.message.startswith("instance ") and shown in caught.value.message, caught.value.message
    assert caught.value.field == "instance"
    with pytest.raises(BadInput, match="^instance "):  # (the engine's check is connect()'s now)
        async with connect(f"sqlite:///{tmp_path / 'state.db'}", instance=name, create=True):
            pass
    assert Engine([], f"sqlite:///{tmp_path / 'state.db'}", instance="web-1 (blue):42").instance == "web-1 (blue):42"


async def _record_a_run(cli: Cli, **fields: Any) -> None:
    """A manual run of hourly, finished now, written to the CLI's store as an engine
    would (with ``fields``), past every input check: what a handler or an older version
    may leave there."""
    engine = Engine(discover_definitions(cli.root / "schedules"), open_store(cli.store))
    await engine.open()
    try:
        at = engine.clock.now()
        engine.store.save_runs([Run(id=engine.new_id(), name="hourly", scheduled_at=at, trigger="manual",
                                    coordination_outcome="manual", fired_at=at, finished_at=at, **fields)])  # fmt: skip
        await engine.store.flush()
    finally:
        await engine.stop()


async def test_an_instance_name_stored_before_it_was_checked_is_shown_escaped(cli: Cli) -> None:
    # Written by an older version (no engine takes it now): the tables escape it.
    evil = "evil\x1b[31mRED\nline2"
    await _record_a_run(cli, status="succeeded", instance=evil)
    shown = cli.ok("runs", "hourly").stdout
    assert "evil\\x1b[31mRED\\nline2" in shown and "\x1b" not in shown, shown
    assert len(shown.splitlines()) == 2  # the heading and the run's one line


async def test_a_handlers_error_text_is_shown_on_one_line_escaped(cli: Cli) -> None:
    """A handler's exception text went to the runs table as it was: a newline broke the
    table, an escape sequence reached the operator's terminal."""
    await _record_a_run(cli, status="failed", instance="web-1", error_tag="RuntimeError",
                        error_message="\x1b[2Jwiped\nsecond line")  # fmt: skip
    shown = cli.ok("runs", "hourly").stdout
    assert "[RuntimeError] \\x1b[2Jwiped\\nsecond line" in shown and "\x1b" not in shown, shown
    assert len(shown.splitlines()) == 2  # the heading and the run's one line


# ---------------------------------------------------------------------------------------
# --token (and its file and variable): never shown
# ---------------------------------------------------------------------------------------
@pytest.fixture
def listening() -> Iterator[str]:
    """The URL of a socket that accepts connections and never answers: a client that got as
    far as sending its request would fail on the token there, quoting it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


SECRET = "mysecret"


@pytest.mark.parametrize("token", [f"{SECRET}\nX", f"{SECRET}\rX", f"{SECRET}\x1bX", f"{SECRET}\x7f", f"{SECRET}é"])
def test_a_token_a_header_cannot_carry_is_refused_without_showing_it(cli: Cli, listening: str, token: str) -> None:
    line = refused(cli("--url", listening, "--token", token, "list", store=False))
    assert "--token" in line and "not shown" in line
    assert SECRET not in line


def test_a_token_that_is_not_utf8_is_refused_without_showing_it(cli: Cli, listening: str) -> None:
    done = real(cli, b"--url", listening.encode(), b"--token", b"op\xff" + SECRET.encode(), b"list", store=False)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and SECRET not in done.stderr
    assert "--token" in done.stderr.splitlines()[-1]


def test_a_token_from_its_file_or_variable_is_checked_too(cli: Cli, listening: str) -> None:
    path = cli.root / "op.token"
    path.write_text(f"# the operator's\n{SECRET}\x1b[2J\n")
    line = refused(cli("--url", listening, "--token-file", str(path), "list", store=False))
    assert "--token-file" in line and "not shown" in line and SECRET not in line
    done = real(cli, "--url", listening, "list", store=False, SCHEDTUI_TOKEN=f"{SECRET}\x07")
    line = refused(done)
    assert "$SCHEDTUI_TOKEN" in line and SECRET not in line


def test_a_token_file_path_is_shown_escaped(cli: Cli) -> None:
    line = refused(cli("--url", "http://127.0.0.1:9", "--token-file", "no\x1b[31mfile", "list", store=False))
    assert "no\\x1b[31mfile" in line and "\x1b" not in line


def test_files_saved_with_a_byte_order_mark_are_read_without_it(cli: Cli) -> None:
    """Notepad and PowerShell 5 start a UTF-8 file with U+FEFF: it was taken as part of the
    store URL (refused, the mark unseen in the quote), of a webhook URL, and of a token
    (whose name it made invalid: the token was named "operator") (found by an outside attack)."""
    bom = "\ufeff"
    (cli.root / "store.url").write_text(f"{bom}{cli.store}\r\n", encoding="utf-8")
    (cli.root / "op.token").write_text(f"{bom}alice=opsecret123\r\n", encoding="utf-8")
    (cli.root / "notify.txt").write_text(f"{bom}https://hooks.example.com/services/T0/B0/XYZ\r\n", encoding="utf-8")
    args = parse_args(["serve", "--token-file", str(cli.root / "op.token"), "--notify-file", str(cli.root / "notify.txt")])
    assert args.token == ["alice=opsecret123"]
    assert args.alerting.sinks == ("https://hooks.example.com/services/T0/B0/XYZ",)
    done = cli("list", "--store-file", str(cli.root / "store.url"), store=False)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_remote_backend_refuses_such_a_token_itself() -> None:
    with pytest.raises(BadInput) as caught:
        RemoteBackend("http://127.0.0.1:9", f"{SECRET}\nX")
    assert SECRET not in caught.value.message


BAD_TOKENS = [f"{SECRET}\nX", f"{SECRET}\rX", f"{SECRET}\x00X", f"{SECRET}\x1bX", f"{SECRET}é", f"{SECRET}\u20ac"]


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_serve_refuses_a_token_a_header_cannot_carry_without_showing_it(cli: Cli, token: str) -> None:
    """Such a token can never be presented, so a server given it would wait for requests
    that all fail: it is refused before anything is served (without the check, serve
    starts, and the process outlives its timeout)."""
    (cli.root / "ops.token").write_text(f"# the operator's\nalice={token}\n")
    # (the arguments, $SCHEDTUI_TOKEN, where the bad token comes from); "": no variable
    for args, variable, source in [
        (["--token", token], "", "--token"),
        (["--token-file", str(cli.root / "ops.token")], "", "--token-file"),
        (["--read-token", f"bob={token}"], "fine", "--read-token"),
        ([], token, "$SCHEDTUI_TOKEN"),
    ]:
        on_argv = source in ("--token", "--read-token")
        if ("\x00" in token and source != "--token-file") or (len(token.splitlines()) > 1 and not on_argv):
            continue  # argv and the environment cannot hold a NUL; a file or variable is one token a line
        line = refused(real(cli, "serve", "--port", "0", *args, SCHEDTUI_TOKEN=variable))
        assert "which a request header cannot carry; it is not shown" in line and f"(in {source}" in line, line
        assert SECRET not in line
    assert not (cli.root / "ops.log").exists()


@pytest.mark.parametrize("token", BAD_TOKENS)
async def test_an_embedded_server_refuses_such_a_token_before_its_engine_starts(tmp_path: Path, token: str) -> None:
    from backend.api.server import serve
    from backend.api.tokens import ApiToken
    from backend.client.embedded import EmbeddedBackend

    engine = Engine([], f"sqlite:///{tmp_path / 'state.db'}")
    stop = asyncio.Event()
    stop.set()  # without the check it would serve, and return at once
    for operate, read in [([token], None), ("fine", [f"bob={token}"])]:
        with pytest.raises(BadInput, match="which a request header cannot carry") as caught:
            await serve(EmbeddedBackend(engine), port=0, token=operate, read_token=read, stop=stop)
        assert SECRET not in caught.value.message
    assert not engine.started
    with pytest.raises(BadInput, match='the read token "bob" holds'):
        ApiToken("bob", token, "read")  # made in code rather than parsed
    assert Tokens.from_options("alice=printable ASCII~!", None).tokens[0].secret == "printable ASCII~!"


# ---------------------------------------------------------------------------------------
# JSON nested past the recursion limit
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["jobs", "send", "mailer", "--payload", DEEP], "--payload"),
        (["schedules", "create", "deep", "--cron", "0 * * * *", "--timezone", "UTC", "--queue", "q",
          "--payload", DEEP], "--payload"),
        (["durable", "start", "flow", "--input", DEEP], "--input"),
    ],
)  # fmt: skip
def test_json_nested_too_deeply_is_refused(cli: Cli, args: list[str], flag: str) -> None:
    line = refused(cli(*args))
    assert line.startswith(f"schedtui: {flag} ") and "nested too deeply" in line
    assert len(line) < 300  # the value is cut, not printed whole


@pytest.mark.parametrize(
    ("args", "flag", "key"),
    [
        (["jobs", "send", "mailer", "--payload", '{"order": 1, "order": 2}'], "--payload", "order"),
        (["schedules", "create", "twice", "--cron", "0 * * * *", "--timezone", "UTC", "--queue", "q",
          "--payload", '{"a": {"b": 1, "b": 2}}'], "--payload", "b"),
        (["durable", "start", "flow", "--input", '[{"k": 1, "k": 1}]'], "--input", "k"),
    ],
)  # fmt: skip
def test_json_that_gives_a_key_twice_is_refused(cli: Cli, args: list[str], flag: str, key: str) -> None:
    """``{"a": 1, "a": 2}`` kept the last value and lost the first unsaid."""
    line = refused(cli(*args))
    assert line.startswith(f"schedtui: {flag} ") and f'gives the key "{key}" twice' in line
    assert cli.log("hourly") == []


def test_a_payload_set_to_null_is_changed_not_dropped(cli: Cli) -> None:
    """``--payload null`` alone was "nothing to change"; beside another option it was left
    out: the payload stayed."""
    write_tree(cli.root / "schedules", {"q.jobs.py": "from backend import define_queue\nq = define_queue(name='q', handler=print)\n"})
    cli.ok("schedules", "create", "nulled", "--cron", "0 * * * *", "--timezone", "UTC", "--queue", "q",
           "--payload", '{"k": 1}')  # fmt: skip
    assert cli.json("schedules", "update", "nulled", "--payload", "null")["payload"] is None
    cli.ok("schedules", "update", "nulled", "--payload", '{"k": 2}')
    changed = cli.json("schedules", "update", "nulled", "--payload", "null", "--description", "x")
    assert (changed["payload"], changed["description"]) == (None, "x")


@pytest.mark.parametrize("option", ["--schedules", "--store", "--store-file"])
def test_an_empty_folder_or_store_is_refused_not_taken_for_the_default(cli: Cli, option: str) -> None:
    """``--schedules ''`` read the working directory; ``--store ''`` the default store."""
    line = refused(real(cli, "list", option, "", store=False))
    assert line == f"schedtui: {option} is empty: name one, or leave the option out for its default"


# ---------------------------------------------------------------------------------------
# $SCHEDTUI_LOG_LEVEL, $SCHEDTUI_LOG_FILE
# ---------------------------------------------------------------------------------------
LEVELS = "DEBUG, INFO, WARNING, ERROR, CRITICAL"


def with_env(cli: Cli, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``schedtui ARGS --store …`` in this process, with ``env`` added to a child's environment."""
    return run_main(cli.root, *args, "--store", cli.store, env={**child_env(), **env})


@pytest.mark.parametrize(("value", "shown"), [("bogus", "bogus"), ("10", "10"), ("info\x1b[2J", "info\\x1b[2J")])
@pytest.mark.parametrize("args", [["list"], ["serve"], ["demo", "--headless"], ["demo"], ["console"]], ids=" ".join)
def test_a_log_level_that_is_no_level_is_refused_by_every_command_alike(
    cli: Cli, args: list[str], value: str, shown: str
) -> None:
    """It crashed serve, demo and the console with a ValueError traceback (serve once its
    port was bound), and the other verbs took it silently for INFO (found by an outside
    attack). Now every command refuses it as it reads its arguments, naming it."""
    store = [] if args[0] == "demo" else ["--store", cli.store]
    line = refused(run_main(cli.root, *args, *store, env={**child_env(), "SCHEDTUI_LOG_LEVEL": value}))
    assert line == f'schedtui: $SCHEDTUI_LOG_LEVEL "{shown}" is not one of {LEVELS}'


@pytest.mark.parametrize("value", ["", "debug", " Warning ", "CRITICAL"])
def test_a_log_level_is_named_in_any_case_and_empty_is_unset(cli: Cli, value: str) -> None:
    assert with_env(cli, "list", SCHEDTUI_LOG_LEVEL=value).returncode == 0


@pytest.mark.parametrize(("where", "reason"), [("missing/x.log", "No such file or directory"), (".", "Is a directory")])
@pytest.mark.parametrize("args", [["console"], ["demo"]], ids=" ".join)
def test_a_log_file_that_cannot_be_opened_is_refused_before_anything_starts(
    cli: Cli, args: list[str], where: str, reason: str
) -> None:
    """The console opened ``$SCHEDTUI_LOG_FILE`` once its engine had started, and ended in a
    traceback when it could not; now it is tried as the command is read. The verbs that
    never log there take no notice of it."""
    path = cli.root / where
    store = [] if args[0] == "demo" else ["--store", cli.store]
    line = refused(run_main(cli.root, *args, *store, env={**child_env(), "SCHEDTUI_LOG_FILE": str(path)}))
    assert line == f'schedtui: $SCHEDTUI_LOG_FILE "{path}" cannot be opened: {reason}'
    assert not path.parent.exists() or path.is_dir()
    assert with_env(cli, "list", SCHEDTUI_LOG_FILE=str(path)).returncode == 0


@pytest.mark.parametrize("digits", ["9" * 5000, "-" + "9" * 5000, "0" * 4999 + "5000", "9" * 4999 + "x"])
def test_a_number_of_thousands_of_digits_is_out_of_range_like_any_other(cli: Cli, digits: str) -> None:
    """Past 4,300 digits int() refuses a number: it was "not a whole number", a line of
    5,000 digits, where one digit fewer was out of range."""
    line = refused(cli("runs", "hourly", "--limit", digits))
    said = ("is not a whole number",) if digits.endswith("x") else ("is more than 1000", "must be at least 1")
    assert line.endswith(said), line
    assert len(line) < 200  # (the value quoted cut, not in full)


def test_parse_json_option_refuses_deep_nesting_as_bad_input() -> None:
    with pytest.raises(BadInput) as caught:
        parse_json_option(DEEP, "--input")
    assert caught.value.field == "input"
    assert parse_json_option("[[1]]", "--input") == [[1]]


# ---------------------------------------------------------------------------------------
# --url
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://[::1", "http://[::1"),
        ("http://127.0.0.1:8787:1", "http://127.0.0.1:8787:1"),
        ("http://127.0.0.1:99999", "port 99999"),
        ("http://127.0.0.1:0", "port 0"),
        ("http://", "no host"),
        ("http://:8787", "no host"),
        ("http://127.0.0.1:8787/\x1b[2J", "\\x1b[2J"),
        ("http://127.0.0.1:8787/a b", "a b"),
        ("ftp://127.0.0.1", "must start with http:// or https://"),
        ("http://alice:hunter2@[::1", "alice:***@"),
    ],
)
def test_a_bad_server_url_is_refused(cli: Cli, url: str, shown: str) -> None:
    for verb in ("list", "console"):
        line = refused(cli("--url", url, verb, store=False))
        assert line.startswith("schedtui: server URL "), line
        assert shown in line
        assert "hunter2" not in line and "\x1b" not in line


def test_a_server_url_that_is_not_utf8_is_refused(cli: Cli) -> None:
    line = refused(real(cli, b"--url", b"http://127.0.0.1:8787/\xff", b"list", store=False))
    assert "\\udcff" in line and "server URL" in line


def test_a_bad_server_url_from_the_environment_is_refused(cli: Cli) -> None:
    line = refused(real(cli, "list", store=False, SCHEDTUI_URL="http://127.0.0.1:99999"))
    assert "port 99999" in line


@pytest.mark.parametrize("url", ["http://127.0.0.1:8787", "https://sched.internal/base/", "http://[::1]:80", "http://h"])
def test_good_server_urls_are_taken(url: str) -> None:
    assert RemoteBackend(url).url == url.rstrip("/")


def test_a_server_url_with_a_password_and_a_token_is_refused_not_sent_without_the_token(cli: Cli) -> None:
    """httpx sent the URL's user and password as Basic auth and no token: the server then
    refused "the token given", which was never sent."""
    assert RemoteBackend("http://u:pw@127.0.0.1:8787").url == "http://u:pw@127.0.0.1:8787"  # a proxy's, alone
    (cli.root / "op.token").write_text("op-secret\n")
    line = refused(cli("--url", "http://u:hunter2@127.0.0.1:8787", "--token-file", str(cli.root / "op.token"), "list",
                       store=False))  # fmt: skip
    assert line == (
        'schedtui: server URL "http://u:***@127.0.0.1:8787" holds a user and password, and a token is given: a request '
        "carries one or the other; give the token alone (a proxy's password goes elsewhere)"
    )


# ---------------------------------------------------------------------------------------
# numbers: ASCII digits only
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["runs", "hourly", "--limit", "٣"], "'٣'"),
        (["runs", "hourly", "--limit", "1_0"], "'1_0'"),
        (["runs", "hourly", "--limit", " 3"], "' 3'"),
        (["jobs", "send", "mailer", "--attempts", "٣"], "'٣'"),
        (["jobs", "send", "mailer", "--delay", "1_0"], "'1_0'"),
        (["jobs", "send", "mailer", "--delay", "٣"], "'٣'"),
        (["jobs", "send", "mailer", "--delay", "nan"], "'nan'"),
        (["jobs", "send", "mailer", "--delay", "inf"], "'inf'"),
        (["schedules", "create", "x", "--cron", "0 * * * *", "--timezone", "UTC", "--queue", "q",
          "--max-runtime", "٣"], "'٣'"),
        (["backfill", "hourly", "--from", "-1h", "--to", "now", "--limit", "１０"], "'１０'"),
    ],
)  # fmt: skip
def test_numbers_in_other_digits_are_refused(cli: Cli, args: list[str], value: str) -> None:
    line = refused(cli(*args))
    assert value in line
    assert cli.log("hourly") == []


@pytest.mark.parametrize(
    ("args", "value"),
    [(["--port", "٣"], "'٣'"), (["--retention-days", "٣"], "'٣'"), (["--alert-interval", "1_5"], "'1_5'"),
     # lengths past which dates overflow, or a retention reaches before 1970 (it deleted every run)
     (["--retention-days", "36501"], "36,501 is more than 36,500"),
     (["--claims-ttl-hours", "10000000000"], "10,000,000,000 is more than 876,000"),
     (["--abandon-after", "86401"], "86,401 is more than 86,400"),
     (["--clock-offset-ms", "99999999999999999999"], "ms is more than a century")],
)
def test_serve_refuses_numbers_in_other_digits(cli: Cli, args: list[str], value: str) -> None:
    # In a process of its own: taken, the number would start a server that does not stop.
    line = refused(real(cli, "serve", *args))
    assert value in line


@pytest.mark.parametrize("delay", ["10", "0.5", ".5", "5.", "1e1", "+2", "2.5E-1"])
def test_numbers_in_ascii_forms_are_taken(cli: Cli, delay: str) -> None:
    write_tree(cli.root / "schedules", {"mailer.jobs.py": (
        "from backend import define_queue\n"
        "mailer = define_queue(name='mailer', handler=print)\n"
    )})  # fmt: skip
    sent = json.loads(cli.ok("jobs", "send", "mailer", "--delay", delay, "--attempts", "2", "--json").stdout)
    assert sent["id"]


# ---------------------------------------------------------------------------------------
# --url: what no request can carry, and a server that answers what schedtui cannot read
# ---------------------------------------------------------------------------------------
REMOTE_TOKEN = "op-remote-input"
MAILER = {"mailer.jobs.py": "from backend import define_queue\nmailer = define_queue(name='mailer', handler=print)\n"}


@pytest.fixture
def served(cli: Cli) -> Iterator[list[str]]:
    """A real ``schedtui serve`` on the CLI's own store (a queue too): the options that
    point a verb at it."""
    write_tree(cli.root / "schedules", MAILER)
    (cli.root / "op.token").write_text(REMOTE_TOKEN)
    server = start_server(cli.root, "--schedules", "schedules", "--store", cli.store, "--token", f"alice={REMOTE_TOKEN}")
    yield ["--url", server.url, "--token-file", str(cli.root / "op.token")]
    assert server.stop() == 0, server.log_text()
    assert "Traceback" not in server.log_text(), server.log_text()


NOT_UTF8 = "a\udcffb"  # what the bytes a\xffb of a command line become
NAMED = [["enable"], ["disable"], ["schedules", "delete"], ["schedules", "update", "--description", "x"],
         ["durable", "start"]]


def test_a_name_that_is_not_utf8_is_refused_remotely_as_locally(cli: Cli, served: list[str]) -> None:
    """The remote client quoted such a name into the request's path, and the encoder's
    UnicodeEncodeError went up as a traceback (exit 1); a local store says that no such
    schedule exists (exit 2). Now the client refuses it before anything is sent, naming the
    field and the value, escaped, as every text field is refused (exit 2)."""
    for verb in NAMED:
        local = refused(cli(*verb, NOT_UTF8))
        assert '"a\\udcffb"' in local, local
        line = refused(cli(*verb, NOT_UTF8, *served, store=False))
        field = "function" if verb[0] == "durable" else "name"
        assert line.startswith(f'schedtui: {field} "a\\udcffb" holds \\udcff at position 1, which is not text'), line
    line = refused(cli("durable", "signal", "01M91WS9V65X1GQNEAYQZVK8HQ", "g\udcffo", *served, store=False))
    assert line.startswith('schedtui: name "g\\udcffo" holds \\udcff at position 1'), line
    # The bytes themselves, through a real process's argv.
    line = refused(real(cli, b"enable", b"a\xffb", *(arg.encode() for arg in served), store=False))
    assert line.startswith('schedtui: name "a\\udcffb" holds \\udcff'), line
    assert cli.json("audit") == []  # nothing reached the server


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["schedules", "create", "inf1", "--cron", "@daily", "--timezone", "UTC", "--queue", "mailer",
          "--payload", '{"a": 1e309}'], "payload"),
        (["schedules", "create", "nan1", "--cron", "@daily", "--timezone", "UTC", "--queue", "mailer",
          "--alert", '{"late": NaN}'], "alert"),
        (["schedules", "update", "stored", "--payload", "[Infinity]"], "payload"),
        (["schedules", "update", "stored", "--payload", "[-Infinity]"], "payload"),
    ],
)  # fmt: skip
def test_nan_or_infinity_in_a_schedule_is_refused_remotely_as_locally(
    cli: Cli, served: list[str], args: list[str], field: str
) -> None:
    """The remote client handed them to its JSON encoder, whose ValueError went up as a
    traceback (exit 1); locally they are "payload is not JSON (...)" (exit 2)."""
    cli.ok("schedules", "create", "stored", "--cron", "@daily", "--timezone", "UTC", "--queue", "mailer")
    line = refused(cli(*args, *served, store=False))
    assert line.startswith(f"schedtui: {field} is not JSON (Out of range float values"), line
    assert line == refused(cli(*args))
    names = {view["name"]: view for view in cli.json("list")}
    assert "inf1" not in names and "nan1" not in names and names["stored"]["payload"] is None


@pytest.mark.parametrize(
    ("body", "problem"), [({"status": "ok"}, 'no field "coordination"'), ([], "an array where an object was due")]
)
def test_a_server_that_answers_json_of_another_kind_is_one_line(cli: Cli, body: object, problem: str) -> None:
    """A server answering 200 {"status": "ok"} (or an array) to everything: the client read
    its /inspect/info as schedtui's and ended with a KeyError (an AttributeError) traceback.
    Now it is the client's error for a server it cannot use, as for an answer without JSON:
    one line naming the route and what was wrong, exit code 1."""
    with json_server(lambda method, path: body) as url:
        for verb in (["list"], ["fire", "hourly"], ["disable", "hourly"]):
            done = cli(*verb, "--url", url, store=False)
            assert done.returncode == 1 and done.stdout == "", done
            (line,) = done.stderr.splitlines()
            assert line == (f"schedtui: {url} answered GET /inspect/info with JSON schedtui cannot read ({problem}); "
                            "is it a schedtui server?")


@pytest.mark.parametrize(("reply", "body"), FOREIGN_ANSWERS)
def test_another_web_app_at_the_url_is_one_line_naming_the_route(cli: Cli, reply: Reply, body: str) -> None:
    """Any web app answers 404 to /inspect/info: its page (or its JSON, not schedtui's
    error) was taken for schedtui's "not found", exit code 2 (bad input) and "answered
    404", no route named. It is a server the client cannot use: exit code 1, the route and
    what came instead."""
    with json_server(lambda method, path: reply) as url:
        for verb in (["list"], ["fire", "hourly"]):
            done = cli(*verb, "--url", url, store=False)
            assert done.returncode == 1 and done.stdout == "", done
            assert done.stderr.splitlines() == [
                f"schedtui: {url} answered GET /inspect/info with {reply.status} and {body}; is it a schedtui server?"
            ]


ID = "01M91WS9V65X1GQNEAYQZVK8HQ"
REMOTE_VERBS = [
    ["list"], ["runs", "hourly"], ["logs", ID], ["fire", "hourly"], ["enable", "hourly"], ["disable", "hourly"],
    ["backfill", "hourly", "--from", "-2h", "--to", "now", "--yes"],
    ["schedules", "create", "n", "--cron", "@daily", "--timezone", "UTC", "--queue", "q"],
    ["schedules", "update", "n", "--description", "d"], ["schedules", "delete", "n"],
    ["queues"], ["queues", "pause", "q"], ["jobs", "list", "q"], ["jobs", "send", "q"], ["jobs", "show", ID],
    ["jobs", "logs", ID], ["jobs", "cancel", "q", ID], ["jobs", "retry", "q", ID], ["jobs", "delete", "q", ID],
    ["durable", "list"], ["durable", "show", ID], ["durable", "start", "f"], ["durable", "signal", ID, "go"],
    ["durable", "cancel", ID], ["durable", "retry", ID], ["locks"], ["locks", "release", "l", "--yes"],
    ["audit"], ["alerts"], ["instances"],
]  # fmt: skip


@pytest.mark.parametrize("body", [{}, None, [], {"deleted": False}])
def test_every_remote_verb_says_an_answer_of_another_shape_in_one_line(cli: Cli, body: object) -> None:
    """Past a real /inspect/info, every other route answered {} (null, []): each verb ended
    with a KeyError, TypeError or AttributeError traceback, and a delete took any 200 for
    done. Each now names the route it asked and what it got instead."""
    answer = lambda method, path: INSPECT_INFO if path == "/inspect/info" else body  # noqa: E731
    with json_server(answer) as url:
        for verb in REMOTE_VERBS:
            done = cli(*verb, "--url", url, store=False)
            assert done.returncode == 1 and done.stdout == "", (verb, done)
            (line,) = done.stderr.splitlines()
            assert line.startswith(f"schedtui: {url} answered ") and line.endswith("; is it a schedtui server?"), line
            assert " with JSON schedtui cannot read (" in line, line  # not "without JSON": null is JSON


# ---------------------------------------------------------------------------------------
# the API: a client that goes away in the middle of its body
# ---------------------------------------------------------------------------------------
async def test_a_client_gone_in_the_middle_of_its_body_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    api = Api(cast(Backend, None), Tokens([]), body_timeout=5)
    reached: list[Any] = []

    @api.endpoint("open")
    async def endpoint(request: Request) -> Response:
        reached.append(await api.body_of(request))
        return JSONResponse({})

    messages: list[Message] = [
        {"type": "http.request", "body": b'{"note": "half', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/inspect/x", "headers": [], "query_string": b""}
    with caplog.at_level(logging.DEBUG):
        response = await endpoint(Request(scope, receive))
    assert reached == []
    assert response.status_code != 500
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
