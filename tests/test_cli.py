"""The ``schedtui`` command end to end: every verb on a real store, through ``main(argv)``
in this process (a Python start-up per call would cost most of the file's time); where the
process boundary is what is tested (a process per fire, the installed entry point's exit
codes and stderr, argv bytes through the OS, a terminal, the environment, signals, serve),
in a real subprocess.

Each test gets its own folder with a ``schedules/`` tree and a SQLite store; handlers
append to log files there, so a test sees exactly what ran. The ``serve`` tests run a
real server on the real clock: they wait by polling a condition (a file, the ledger, the
server's log) against a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib.metadata
import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import pytest

import backend
from backend import Engine, ManualClock, Run, define_schedule
from backend.client.embedded import EmbeddedBackend
from backend.events.audit import os_user
from backend.store import Membership
from backend.store.sqlite.store import SQLiteStore
from tests.conftest import expect
from tests.servers import poll, run_main

REPO = Path(__file__).resolve().parents[1]
UTC = UTC

SCHEDULE_KEYS = {
    "name", "cron", "timezone", "trigger", "on_overlap", "backfill", "max_runtime_s", "description",
    "payload", "enabled", "state_note", "next_fire_at", "last_run", "latest_manual", "source", "target", "problem",
    "alert",
}  # fmt: skip
RUN_KEYS = {
    "id", "name", "scheduled_at", "fired_at", "finished_at", "status", "trigger", "coordination_outcome",
    "instance", "error_tag", "error_message", "duration_ms", "traceback",
}  # fmt: skip
INSTANCE_RE = re.compile(rf"^{re.escape(socket.gethostname())}:\d+$")

# Handlers log "<trigger> <scheduled_at> <run_id>" to a file beside the schedules folder.
SCHEDULES = {
    "hourly.cron.py": """
        from pathlib import Path
        from backend import define_schedule

        LOG = Path(__file__).resolve().parent.parent / "hourly.log"

        def handler(ctx):
            with LOG.open("a") as f:
                f.write(f"{ctx.trigger} {ctx.scheduled_at.isoformat()} {ctx.run_id}\\n")

        hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=handler)
    """,
    "ops/nightly/failing.cron.py": """
        from backend import define_schedule

        async def export(ctx):
            raise RuntimeError("disk full")

        failing = define_schedule(
            name="failing", cron="30 6 * * 1-5", timezone="Europe/Berlin", handler=export,
            description="Nightly export", payload={"bucket": "b1"}, max_runtime=120, backfill="latest",
        )
    """,
    "ops/webhook.cron.py": """
        from backend import define_schedule

        webhook = define_schedule(
            name="webhook", cron="*/15 * * * *", timezone="UTC", handler=print, trigger="external",
            on_overlap="queue",
        )
    """,
    "README.md": "not a schedule",
    "helpers.py": "raise RuntimeError('never imported')",
}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["SCHEDTUI_LOG_LEVEL"] = "INFO"
    return env


class Cli:
    """Runs ``schedtui VERB ... --store sqlite:///<tmp>/state.db`` in ``root``: in this
    process, or (``real``) as ``python -m console.cli`` in its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = f"sqlite:///{root / 'state.db'}"

    def argv(self, *args: str, store: bool = True) -> list[str]:
        return [sys.executable, "-m", "console.cli", *args, *(["--store", self.store] if store else [])]

    def __call__(self, *args: str, store: bool = True, real: bool = False) -> subprocess.CompletedProcess[str]:
        if not real:
            return run_main(self.root, *self.argv(*args, store=store)[3:], env=child_env())
        return subprocess.run(
            self.argv(*args, store=store), cwd=self.root, env=child_env(), capture_output=True, text=True, timeout=30
        )

    def ok(self, *args: str, real: bool = False) -> subprocess.CompletedProcess[str]:
        done = self(*args, real=real)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)

    def runs(self, name: str, limit: int = 1000, schedules: str = "schedules") -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.json("runs", name, "--limit", str(limit), "--schedules", schedules)
        return runs

    def schedules(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.json("list")}

    def log(self, name: str) -> list[list[str]]:
        path = self.root / f"{name}.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def create_store(path: Path) -> None:
    """What `schedtui serve` does first: the other verbs refuse a store that does not exist."""

    async def create() -> None:
        store = SQLiteStore(path)
        await store.open()
        await store.close()

    asyncio.run(create())


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    write_tree(tmp_path / "schedules", SCHEDULES)
    create_store(tmp_path / "state.db")
    return Cli(tmp_path)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())




# ---------------------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------------------
def test_list_table(cli: Cli) -> None:
    done = cli.ok("list", real=True)
    assert done.stderr == ""
    header, *rows = done.stdout.splitlines()
    assert columns(header) == ["NAME", "CRON", "TIMEZONE", "TRIGGER", "STATE", "NEXT FIRE", "LAST RUN"]
    table = {row.split()[0]: columns(row) for row in rows}
    assert list(table) == ["failing", "hourly", "webhook"]
    assert table["failing"][:5] == ["failing", "30 6 * * 1-5", "Europe/Berlin", "self", "enabled"]
    assert table["webhook"] == ["webhook", "*/15 * * * *", "UTC", "external", "enabled", "-", "-"]
    name, cron, zone, trigger, state, next_fire, last = table["hourly"]
    assert (name, cron, zone, trigger, state, last) == ("hourly", "0 * * * *", "UTC", "self", "enabled", "-")
    assert re.fullmatch(r"in (\d+m \d+s|\d+m|\d+s)", next_fire), next_fire
    assert re.fullmatch(r"in \d+d( \d+h)?|in \d+h( \d+m)?|in \d+m( \d+s)?", table["failing"][5])


def test_list_json(cli: Cli) -> None:
    before = datetime.now(UTC)
    schedules = cli.json("list")
    after = datetime.now(UTC)
    assert isinstance(schedules, list)
    assert [s["name"] for s in schedules] == ["failing", "hourly", "webhook"]
    for s in schedules:
        assert set(s) == SCHEDULE_KEYS
    failing, hourly, webhook = schedules
    assert {k: v for k, v in failing.items() if k != "next_fire_at"} == {
        "name": "failing",
        "cron": "30 6 * * 1-5",
        "timezone": "Europe/Berlin",
        "trigger": "self",
        "on_overlap": "skip",
        "backfill": "latest",
        "max_runtime_s": 120.0,
        "description": "Nightly export",
        "payload": {"bucket": "b1"},
        "enabled": True,
        "state_note": None,
        "last_run": None,
        "latest_manual": None,
        "source": "code",
        "target": {"kind": "handler", "name": failing["target"]["name"]},
        "problem": None,
        # (its alerts as they apply: the defaults here; an operator could not read them back)
        "alert": {"failing": 1, "late": True, "disabled": 86400.0, "resolve_after": 300.0},
    }
    assert (webhook["trigger"], webhook["on_overlap"], webhook["next_fire_at"], webhook["max_runtime_s"]) == (
        "external",
        "queue",
        None,
        1800.0,
    )
    # The next top of the hour, in UTC with a Z.
    assert hourly["next_fire_at"].endswith(":00:00Z")
    nxt = at(hourly["next_fire_at"])
    assert before < nxt <= after + timedelta(hours=1)
    assert nxt.minute == 0 and nxt.second == 0
    berlin = at(failing["next_fire_at"]).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (berlin.hour, berlin.minute) == (6, 30) and berlin.weekday() < 5


def test_a_schedule_file_that_fails_to_load(cli: Cli) -> None:
    write_tree(cli.root / "schedules", {"broken/bad.cron.py": "import os\nVALUE = os.environ['SCHEDTUI_NO_SUCH_VARIABLE']\n"})
    done = cli("list")
    assert done.returncode == 2
    assert done.stdout == ""
    # The path as the folder was given (relative to the working directory here).
    assert done.stderr.splitlines() == ["schedtui: schedules/broken/bad.cron.py:2: KeyError: 'SCHEDTUI_NO_SUCH_VARIABLE'"]


def test_every_bad_file_is_named_and_serve_refuses_to_start(cli: Cli) -> None:
    write_tree(cli.root / "schedules", {
        "broken/bad.cron.py": "import os\nVALUE = os.environ['SCHEDTUI_NO_SUCH_VARIABLE']\n",
        "stop.jobs.py": "raise KeyboardInterrupt\n",
    })  # fmt: skip
    for args in (["list"], ["serve"]):
        done = cli(*args, real=args == ["serve"])  # serve configures the process's logging
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-3:] == [
            "schedtui: 2 problems in the definitions:",
            "  schedules/broken/bad.cron.py:2: KeyError: 'SCHEDTUI_NO_SUCH_VARIABLE'",
            "  schedules/stop.jobs.py:1: KeyboardInterrupt",
        ]
        assert "starting" not in done.stderr  # serve never started an engine
    assert "refuses to start" in cli("serve", "--help", store=False).stdout


def test_a_dangling_definitions_link_is_named_and_serve_refuses_to_start(cli: Cli) -> None:
    # A release folder gone: `list` showed the others and serve started without it.
    (cli.root / "schedules" / "nightly.cron.py").symlink_to("/srv/release-42/nightly.cron.py")
    for args in (["list"], ["serve"]):
        done = cli(*args, real=args == ["serve"])
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-1:] == [
            "schedtui: schedules/nightly.cron.py is a link to /srv/release-42/nightly.cron.py, which does not exist",
        ]
        assert "starting" not in done.stderr
    # and a folder of definitions linked in is searched
    (cli.root / "schedules" / "nightly.cron.py").unlink()
    write_tree(cli.root / "shared-defs", {"linked.cron.py": """
        from backend import define_schedule
        linked = define_schedule(name="linked", cron="0 4 * * *", timezone="UTC", handler=print)
    """})  # fmt: skip
    (cli.root / "schedules" / "shared").symlink_to("../shared-defs")
    assert "linked" in [columns(line)[0] for line in cli.ok("list").stdout.splitlines()[1:]]


def test_the_version_is_the_packages_own(cli: Cli) -> None:
    """One place says it (pyproject.toml, through the package's metadata): the command and
    ``backend.__version__`` said 0.1.0 by hand through two rounds of schema changes."""
    done = cli("--version", store=False)
    assert done.stdout.strip() == f"schedtui {importlib.metadata.version('schedtui')}" and backend.__version__ != "0.1.0"


def test_the_installed_command_imports_the_projects_own_modules_from_its_working_directory(tmp_path: Path) -> None:
    """A console script's import path starts at the environment's bin/, not where it runs:
    a definition importing the project's own package failed every verb, and serve would
    not start (outside review of the package as shipped). ``python -m`` always had it."""
    write_tree(tmp_path, {
        "myapp/__init__.py": "def send_digest():\n    print('digest sent')\n",
        "schedules/digest.cron.py": """
            from backend import define_schedule
            from myapp import send_digest

            digest = define_schedule(name="digest", cron="0 8 * * *", timezone="UTC", handler=lambda ctx: send_digest())
        """,
    })  # fmt: skip
    create_store(tmp_path / "state.db")
    command = Path(sys.executable).parent / "schedtui"
    assert command.is_file(), "the project is installed (pip install -e .): its console script is there"
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}  # (the installed package alone)
    done = subprocess.run([str(command), "fire", "digest", "--store", f"sqlite:///{tmp_path / 'state.db'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "digest sent" in done.stderr and "✓ succeeded" in done.stdout


# ---------------------------------------------------------------------------------------
# fire
# ---------------------------------------------------------------------------------------
def test_fire_runs_the_handler_here_and_waits(cli: Cli) -> None:
    ids = []
    for _ in range(3):  # a few times: the answer must never be a stale "running"
        done = cli.ok("fire", "hourly", real=True)  # a process each: see the instances below
        match = re.fullmatch(r"fired hourly: run (\w{26})\n", done.stderr)
        assert match, done.stderr
        ids.append(match.group(1))
        header, row = done.stdout.splitlines()
        assert columns(header) == ["ID", "SCHEDULED AT", "STATUS", "TRIGGER", "OUTCOME", "INSTANCE", "DURATION", "ERROR"]
        assert columns(row)[0] == ids[-1]
        assert columns(row)[2:5] == ["✓ succeeded", "manual", "manual"]
    assert [(trigger, run_id) for trigger, _, run_id in cli.log("hourly")] == [("manual", i) for i in ids]
    runs = cli.runs("hourly")
    assert [r["id"] for r in runs] == ids[::-1]
    for r in runs:
        assert set(r) == RUN_KEYS
        assert (r["status"], r["trigger"], r["coordination_outcome"], r["error_tag"]) == ("succeeded", "manual", "manual", None)
        assert INSTANCE_RE.match(r["instance"])
        # A manual run's slot is the moment it was fired.
        assert timedelta(0) <= at(r["fired_at"]) - at(r["scheduled_at"]) < timedelta(seconds=1)
        assert isinstance(r["duration_ms"], int) and 0 <= r["duration_ms"] < 5000
        assert at(r["finished_at"]) >= at(r["fired_at"])
    assert len({r["instance"] for r in runs}) == 3  # each fire is its own process


def test_fire_a_failing_handler_exits_1(cli: Cli) -> None:
    for real in (True, False):
        done = cli("fire", "failing", real=real)
        assert done.returncode == 1, done
        row = columns(done.stdout.splitlines()[1])
        assert row[2:5] == ["✗ failed", "manual", "manual"]
        assert row[-1] == "[RuntimeError] disk full"
    runs = cli.runs("failing")
    assert [(r["status"], r["trigger"], r["coordination_outcome"], r["error_tag"], r["error_message"]) for r in runs] == [
        ("failed", "manual", "manual", "RuntimeError", "disk full")
    ] * 2


@contextlib.contextmanager
def refusing(how: str) -> Iterator[int]:
    """A descriptor whose every write fails: a full disk (/dev/full, ENOSPC) or a pipe
    whose reader has gone (EPIPE; Python ignores SIGPIPE)."""
    if how == "full disk":
        fd = os.open("/dev/full", os.O_WRONLY)
    else:
        reader, fd = os.pipe()
        os.close(reader)
    try:
        yield fd
    finally:
        os.close(fd)


def with_stderr(cli: Cli, how: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``schedtui ARGS`` in a process of its own whose stderr refuses every write (see :func:`refusing`)."""
    with refusing(how) as fd:
        return subprocess.run(cli.argv(*args), cwd=cli.root, env=child_env(), stdout=subprocess.PIPE, stderr=fd,
                              text=True, timeout=60, **kwargs)  # fmt: skip


@pytest.mark.parametrize("how", ["full disk", "reader gone"])
def test_fire_whose_stderr_refuses_its_line_still_says_how_the_run_went(cli: Cli, how: str) -> None:
    """``schedtui fire x 2>/dev/full``: the line "fired x: run …" raised, the verb left with
    exit 1 (141 on a closed pipe) and printed no run, though the run succeeded (found by an
    outside attack). The line is lost; the run, its table and its exit code are not."""
    done = with_stderr(cli, how, "fire", "hourly")
    assert done.returncode == 0, done.stdout
    row = columns(done.stdout.splitlines()[1])
    assert row[2:5] == ["✓ succeeded", "manual", "manual"]
    assert [run["status"] for run in cli.runs("hourly")] == ["succeeded"]
    if how == "full disk":
        done = with_stderr(cli, how, "fire", "failing")
        assert done.returncode == 1, done.stdout
        assert columns(done.stdout.splitlines()[1])[2] == "✗ failed"


def test_fire_json(cli: Cli) -> None:
    done = cli("fire", "failing", "--json")
    assert done.returncode == 1
    assert done.stderr == ""
    run = json.loads(done.stdout)
    assert set(run) == RUN_KEYS
    assert (run["name"], run["status"], run["error_message"]) == ("failing", "failed", "disk full")
    done = cli.ok("fire", "hourly", "--json")
    assert json.loads(done.stdout)["status"] == "succeeded"


def test_fire_json_stays_json_when_the_handler_prints_and_its_info_records_are_kept(cli: Cli) -> None:
    """A handler's print came before the run's JSON on stdout (no script could read it), and
    its INFO records were never made (the verb left the root logger at WARNING), so its
    run's log lacked them where serve's kept them (an outside reading of the README). Its
    prints now go on to stderr, and its records are made at $SCHEDTUI_LOG_LEVEL."""
    write_tree(cli.root / "schedules", {"chatty.cron.py": """
        import logging, sys
        from backend import define_schedule

        def handler(ctx):
            print("<<printed>>", flush=True)
            sys.stdout.buffer.write(b"<<as bytes>>\\n")
            sys.stdout.buffer.flush()
            logging.getLogger("chatty").info("<<logged at INFO>>")

        chatty = define_schedule(name="chatty", cron="0 4 * * *", timezone="UTC", handler=handler)
    """})  # fmt: skip
    for real in (False, True):
        done = cli("fire", "chatty", "--json", real=real)
        assert done.returncode == 0, done
        run = json.loads(done.stdout)
        assert done.stderr == "<<printed>>\n<<as bytes>>\n"
        log = cli.ok("logs", run["id"]).stdout
        assert "<<printed>>" in log and "<<as bytes>>" in log and "INFO chatty: <<logged at INFO>>" in log, log
    done = cli("backfill", "chatty", "--from", "2026-01-01T03:00:00Z", "--to", "2026-01-02T05:00:00Z", "--json")
    assert done.returncode == 0, done
    json.loads(done.stdout)
    assert done.stderr.count("<<printed>>\n") == 2 and done.stderr.count("<<as bytes>>\n") == 2  # (beside its progress)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_that_is_not_utf8_gets_escapes_not_a_traceback(cli: Cli, encoding: str) -> None:
    """A legacy locale's terminal (ISO-8859-1) or ``PYTHONIOENCODING=ascii``: ``schedtui
    runs`` failed with a UnicodeEncodeError traceback at its first status glyph (✓)."""
    cli.ok("fire", "hourly")
    cli.ok("disable", "hourly", "--note", "café ☕ paused")  # a note the terminal cannot show all of

    def run(*args: str, on: str = encoding) -> subprocess.CompletedProcess[str]:
        env = {**child_env(), "PYTHONIOENCODING": on}
        done = subprocess.run(cli.argv(*args), cwd=cli.root, env=env, capture_output=True, timeout=30, check=False)
        assert (done.returncode, done.stderr) == (0, b""), done
        return subprocess.CompletedProcess(done.args, 0, done.stdout.decode(on), "")

    assert "\\u2713 succeeded" in run("runs", "hourly").stdout
    listed = run("list").stdout
    assert ("caf\xe9 \\u2615 paused" if encoding == "latin-1" else "caf\\xe9 \\u2615 paused") in listed
    # JSON stays JSON, and the same as a UTF-8 terminal's: ASCII with \u escapes.
    ascii_json = run("list", "--json").stdout
    assert ascii_json.isascii() and json.loads(ascii_json) == json.loads(run("list", "--json", on="utf-8").stdout)
    assert json.loads(run("runs", "hourly", "--json").stdout) == cli.json("runs", "hourly")


def test_fire_an_external_schedule(cli: Cli) -> None:
    done = cli.ok("fire", "webhook")  # handler=print: prints the context, on stderr (stdout is the run's)
    assert "RunContext(name='webhook'" in done.stderr and "RunContext" not in done.stdout
    assert [r["trigger"] for r in cli.runs("webhook")] == ["manual"]


# ---------------------------------------------------------------------------------------
# enable / disable
# ---------------------------------------------------------------------------------------
def test_disable_with_a_note_then_enable(cli: Cli) -> None:
    done = cli.ok("disable", "hourly", "--note", "db migration tonight", "--as", "ops-alice")
    assert done.stdout == "hourly disabled (db migration tonight)\n"
    hourly = cli.schedules()["hourly"]
    assert (hourly["enabled"], hourly["next_fire_at"]) == (False, None)
    note = hourly["state_note"]
    assert (note["by"], note["note"]) == ("ops-alice", "db migration tonight")
    assert abs(at(note["at"]) - datetime.now(UTC)) < timedelta(seconds=30)
    row = next(columns(line) for line in cli.ok("list").stdout.splitlines() if line.startswith("hourly"))
    assert row[4:6] == ["disabled (db migration tonight)", "-"]
    assert cli.schedules()["failing"]["enabled"] is True  # only that one

    # Disabled schedules can still be fired by hand.
    cli.ok("fire", "hourly")

    done = cli.ok("enable", "hourly")
    assert re.fullmatch(r"hourly enabled; next fire \d{4}-\d\d-\d\d \d\d:00:00 UTC\n", done.stdout), done.stdout
    hourly = cli.schedules()["hourly"]
    assert hourly["enabled"] is True
    assert hourly["next_fire_at"] is not None and hourly["next_fire_at"].endswith(":00:00Z")
    assert hourly["state_note"]["note"] is None
    assert hourly["state_note"]["by"] == os_user()  # a person, not a process


def test_disable_json(cli: Cli) -> None:
    view = cli.json("disable", "failing")
    assert set(view) == SCHEDULE_KEYS
    assert (view["enabled"], view["state_note"]["note"]) == (False, None)


# ---------------------------------------------------------------------------------------
# backfill
# ---------------------------------------------------------------------------------------
def test_backfill_fires_each_slot_in_order_with_progress_and_a_summary(cli: Cli) -> None:
    done = cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T05:00Z")
    lines = done.stderr.splitlines()
    assert lines[0] == "backfilling 5 slot(s) of hourly: 2026-01-01 01:00:00 UTC … 2026-01-01 05:00:00 UTC"
    assert lines[1] == "already succeeded: none of them"
    assert lines[2] == ("live slots: how long it runs is unknown (no recent run of it to time): each live slot "
                        "due while it runs is skipped (on_overlap skip)")  # fmt: skip
    assert lines[-1] == "[" + "#" * 30 + "] 5/5  failed 0  remaining 0"
    assert all(re.fullmatch(r"\[#*\.*\] \d/5  failed 0  remaining \d", line) for line in lines[3:])
    assert re.fullmatch(r"backfill \w{26} done: 5 fired, 5 succeeded, 0 failed, 0 remaining\n", done.stdout)
    slots = [f"2026-01-01T0{h}:00:00+00:00" for h in range(1, 6)]
    assert [(trigger, slot) for trigger, slot, _ in cli.log("hourly")] == [("manual", s) for s in slots]
    runs = cli.runs("hourly")
    assert [r["scheduled_at"] for r in runs] == [f"2026-01-01T0{h}:00:00Z" for h in range(5, 0, -1)]
    assert {(r["status"], r["trigger"], r["coordination_outcome"]) for r in runs} == {("succeeded", "manual", "manual")}


@pytest.mark.parametrize("how", ["full disk", "reader gone"])
def test_a_backfill_whose_stderr_refuses_its_progress_runs_to_its_end(cli: Cli, how: str) -> None:
    """``schedtui backfill x … 2>/dev/full``: the verb's first line to stderr raised, the
    verb left, its engine closed, and the backfill running in it was abandoned after its
    first slot (found by an outside attack). A display that fails never cancels the work."""
    done = with_stderr(cli, how, "backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T03:00Z")
    assert done.returncode == 0, done.stdout
    assert re.fullmatch(r"backfill \w{26} done: 3 fired, 3 succeeded, 0 failed, 0 remaining\n", done.stdout)
    assert [slot for _, slot, _ in cli.log("hourly")] == [f"2026-01-01T0{h}:00:00+00:00" for h in (1, 2, 3)]
    (end,) = [e for e in cli.json("audit") if e["action"] == "schedule.backfill_end"]
    assert (end["detail"]["state"], end["detail"]["not_fired"]) == ("done", 0)


def test_backfill_json_and_failures(cli: Cli) -> None:
    # Bare dates are midnight in the schedule's zone: Mon 5 and Tue 6 January at 06:30 Berlin.
    done = cli("backfill", "failing", "--from", "2026-01-05", "--to", "2026-01-07", "--json")
    assert done.returncode == 1, done
    progress = json.loads(done.stdout)
    assert (progress["state"], progress["total"], progress["fired"], progress["failed"]) == ("done", 2, 2, 2)
    assert (progress["from"], progress["to"]) == ("2026-01-04T23:00:00Z", "2026-01-06T23:00:00Z")
    runs = cli.runs("failing")
    assert [(r["scheduled_at"], r["status"], r["error_tag"]) for r in runs] == [
        ("2026-01-06T05:30:00Z", "failed", "RuntimeError"),
        ("2026-01-05T05:30:00Z", "failed", "RuntimeError"),
    ]


def test_backfill_over_25_slots_needs_yes(cli: Cli) -> None:
    done = cli("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-03T00:00Z")
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "schedtui: backfill of hourly refused: 48 slot(s) in (2026-01-01 00:00:00 UTC, 2026-01-03 00:00:00 UTC]: "
        "48 slots need confirmation (more than 25) (re-run with --yes after reading the count)",
        "schedtui: already succeeded: none of them",
        "schedtui: live slots: how long it runs is unknown (no recent run of it to time): each live slot due "
        "while it runs is skipped (on_overlap skip)",
    ]
    assert cli.log("hourly") == []
    assert cli.runs("hourly") == []

    done = cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T06:00Z", "--yes")
    assert "done: 30 fired, 30 succeeded, 0 failed, 0 remaining" in done.stdout
    assert len(cli.log("hourly")) == 30
    # Its runs are timed now: the plan counts the live slots it may skip (an hourly
    # schedule's runs of milliseconds: none).
    again = cli("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-03T00:00Z")
    assert again.stderr.splitlines()[1] == "schedtui: already succeeded: 30 of the 48, they run again (--skip-succeeded skips them)"
    assert again.stderr.splitlines()[2].startswith("schedtui: live slots: no live slot is due while it runs (")


def test_backfill_says_how_many_slots_already_succeeded_before_it_starts(cli: Cli) -> None:
    cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T03:00Z")
    again = cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T05:00Z")
    assert again.stderr.splitlines()[1] == "already succeeded: 3 of the 5, they run again (--skip-succeeded skips them)"
    assert len(cli.log("hourly")) == 3 + 5
    skipping = cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T06:00Z", "--skip-succeeded")
    assert skipping.stderr.splitlines()[:2] == [
        "backfilling 1 slot(s) of hourly: 2026-01-01 01:00:00 UTC … 2026-01-01 06:00:00 UTC",
        "already succeeded: 5 of the 6, skipped",
    ]
    assert "done: 1 fired" in skipping.stdout and len(cli.log("hourly")) == 3 + 5 + 1


def test_backfill_over_the_limit_is_refused(cli: Cli) -> None:
    done = cli("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-03T00:00Z", "--yes", "--limit", "10")
    assert done.returncode == 3
    assert done.stderr.splitlines() == [
        "schedtui: backfill of hourly refused: 48 slot(s) in (2026-01-01 00:00:00 UTC, 2026-01-03 00:00:00 UTC]: "
        "48 slots exceed the limit of 10; backfill in smaller slices"
    ]
    # Over the default limit of 1,000 too: two months of hours.
    done = cli("backfill", "hourly", "--from", "2025-01-01T00:00Z", "--to", "2025-03-01T00:00Z", "--yes")
    assert done.returncode == 3
    assert "1,416 slot(s)" in done.stderr and "exceed the limit of 1,000" in done.stderr
    assert cli.runs("hourly") == []


def test_backfill_limit_above_the_ceiling_is_bad_usage(cli: Cli) -> None:
    done = cli("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T05:00Z", "--limit", "20000")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["schedtui: limit 20000 is out of range (1-10,000)"]
    assert cli.runs("hourly") == []


@pytest.mark.parametrize(
    ("start", "end", "reason"),
    [
        ("2026-01-03T00:00Z", "2026-01-01T00:00Z", "reversed range: from is after to"),
        ("2026-01-01T00:00Z", "2026-01-01T00:00Z", "empty range: from equals to"),
        ("-1h", "+2h", "the range reaches into the future"),
        ("-2d", "+1h", "the range reaches into the future"),  # 49 slots: --yes would not help
        ("2026-01-01T00:10Z", "2026-01-01T00:50Z", "no slots in the range"),
    ],
)
def test_backfill_refusals(cli: Cli, start: str, end: str, reason: str) -> None:
    done = cli("backfill", "hourly", "--from", start, "--to", end)
    assert done.returncode == 3, done
    (line,) = done.stderr.splitlines()
    assert line.startswith("schedtui: backfill of hourly refused: ")
    assert reason in line
    assert "--yes" not in line  # only a refusal for want of confirmation suggests it
    assert cli.runs("hourly") == []


def test_backfill_relative_times(cli: Cli) -> None:
    done = cli.ok("backfill", "hourly", "--from", "-3h", "--to", "now")
    assert "done: 3 fired, 3 succeeded" in done.stdout
    slots = [at(slot) for _, slot, _ in cli.log("hourly")]
    assert len(slots) == 3
    assert all(s.minute == 0 and s.second == 0 for s in slots)
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [timedelta(hours=1)] * 2
    assert datetime.now(UTC) - timedelta(hours=1) < slots[-1] <= datetime.now(UTC)

    done = cli.ok("backfill", "hourly", "--from=-1d", "--to", "-20h")
    assert "done: 4 fired" in done.stdout


# ---------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------
def test_the_runs_of_a_schedule_removed_from_the_code_stay_readable(cli: Cli) -> None:
    """What ran before a schedule left the code is in the ledger until the retention takes
    it: `runs` shows it (in UTC: its zone went with its definition). It answered "no
    schedule named …". A name with no runs at all is still refused."""
    assert cli("fire", "failing").returncode == 1  # (a run that fails: exit 1)
    (cli.root / "schedules/ops/nightly/failing.cron.py").unlink()
    assert "failing" not in cli.ok("list").stdout
    done = cli.ok("runs", "failing")
    header, row = done.stdout.splitlines()
    assert columns(row)[2:5] == ["✗ failed", "manual", "manual"] and columns(row)[1].endswith(" UTC")
    assert [r["error_message"] for r in cli.json("runs", "failing")] == ["disk full"]
    unknown = cli("runs", "never-was")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == 'schedtui: no schedule named "never-was", and the ledger holds no runs of one'


def test_runs_table_json_limit_and_paging(cli: Cli) -> None:
    assert cli.ok("runs", "hourly").stdout == "no runs of hourly\n"
    cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T05:00Z")
    runs = cli.runs("hourly")
    assert len(runs) == 5
    ids = [r["id"] for r in runs]
    assert ids == sorted(ids, reverse=True)
    assert [r["id"] for r in cli.json("runs", "hourly", "--limit", "2")] == ids[:2]

    done = cli.ok("runs", "hourly")
    header, *rows = done.stdout.splitlines()
    assert columns(header) == ["ID", "SCHEDULED AT", "STATUS", "TRIGGER", "OUTCOME", "INSTANCE", "DURATION", "ERROR"]
    assert [columns(r)[:5] for r in rows] == [
        [i, f"2026-01-01 0{h}:00:00 UTC", "✓ succeeded", "manual", "manual"] for i, h in zip(ids, range(5, 0, -1), strict=False)
    ]

    seen: list[str] = []
    args = ["runs", "hourly", "--limit", "2"]
    for page in range(3):
        out = cli.ok(*args).stdout.splitlines()
        hint = re.fullmatch(r"older: schedtui runs hourly --before (\w{26})", out[-1])
        body = out[1:-2] if hint else out[1:]
        seen += [columns(r)[0] for r in body]
        if page < 2:
            assert hint and out[-2] == "" and hint.group(1) == seen[-1]
            args = ["runs", "hourly", "--limit", "2", "--before", hint.group(1)]
        else:
            assert not hint and len(body) == 1
    assert seen == ids
    assert cli.json("runs", "hourly", "--before", ids[2]) == runs[3:]
    assert cli.ok("runs", "hourly", "--before", ids[-1]).stdout == f"no runs of hourly before {ids[-1]}\n"


# ---------------------------------------------------------------------------------------
# instances
# ---------------------------------------------------------------------------------------
def test_instances_show_each_clock_offset_and_why_a_member_whose_clock_is_off_stands_down(cli: Cli) -> None:
    now = datetime.now(UTC)

    async def beat() -> None:  # the rows two members of a PostgreSQL fleet would write
        store = SQLiteStore(cli.root / "state.db")
        await store.open()
        await store.heartbeat("web-1", "h", 1, now, Membership("firing", "advisoryLock", now, 0.003))
        ahead = now + timedelta(seconds=61.04)  # (its stamps are its clock's)
        await store.heartbeat("web-2", "h", 2, ahead, Membership("firing", "advisoryLock", now, 61.04, True))
        await store.close()

    asyncio.run(beat())
    done = cli.ok("instances")
    header, *rows = done.stdout.splitlines()
    assert columns(header) == ["NAME", "ROLE", "HEARTBEAT", "LAST START", "CLOCK"]
    table = {row.split()[0]: columns(row) for row in rows if row.startswith("web-")}
    assert table["web-1"][:2] == ["web-1", "firing"] and table["web-1"][3:] == ["-", "+3ms"]
    assert table["web-2"][1] == "firing" and table["web-2"][4] == "+61.0s ✗ off"
    assert re.fullmatch(r"\d+s ago", table["web-2"][2]), table["web-2"]
    # The command itself opened the store as an observer: its row says so.
    (mine,) = [columns(row) for row in rows if not row.startswith(("web-", "✗"))]
    assert mine[0].endswith(" (this command)") and mine[1] == "observer", mine
    assert rows[-1] == (
        "✗ web-2 stands down: its clock is 61.0s ahead of the database server's: it fires nothing and takes no "
        "work until they agree (fix its time sync)"
    )
    assert max(len(line) for line in done.stdout.splitlines()[:-1]) <= 80  # the table fits a terminal
    listed = {i["name"]: i for i in cli.json("instances")}
    assert (listed["web-2"]["clock_offset_s"], listed["web-2"]["clock_off"]) == (61.04, True)
    assert listed["web-1"]["stands_down"] is None and listed["web-2"]["stands_down"].startswith("its clock is 61.0s ahead")


def test_a_reader_that_stops_reading_ends_the_verb_quietly(cli: Cli) -> None:
    """`schedtui instances --json | head`: the reader closes the pipe mid-output. The verb
    stops with the status a shell gives a process SIGPIPE ended, and no traceback."""
    now = datetime.now(UTC)

    async def fleet() -> None:  # more JSON than a pipe holds: the verb is still writing
        store = SQLiteStore(cli.root / "state.db")
        await store.open()
        for n in range(400):  # (about 120 KB of JSON; a pipe holds 64)
            await store.heartbeat(f"web-{n:04d}", "h", n + 1, now, Membership("firing", "advisoryLock", now, 0.001))
        await store.close()

    asyncio.run(fleet())
    process = subprocess.Popen(cli.argv("instances", "--json"), cwd=cli.root, env=child_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == b"[\n"
    process.stdout.close()  # as `head -1` does once it has its line
    assert process.wait(timeout=30) == 141
    assert process.stderr.read().decode() == ""


@pytest.mark.parametrize(
    ("args", "buffered"),
    [(("list",), True), (("list",), False), (("runs", "hourly", "--json"), False), (("audit",), True),
     (("fire", "hourly"), True), (("fire", "hourly"), False)],
)  # fmt: skip
def test_a_verb_whose_output_meets_a_full_disk_says_so_in_one_line(cli: Cli, args: tuple[str, ...], buffered: bool) -> None:
    """``schedtui list >/dev/full``: a traceback of 40 lines (found by an outside attack).
    One line, exit 1, whether the refusal comes as the verb prints (unbuffered) or as what
    was buffered is written at its end. A ``fire`` whose run succeeded exits 1 too: its
    output is lost (the run's outcome is in the ledger)."""
    env = child_env()
    if buffered:
        del env["PYTHONUNBUFFERED"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(cli.argv(*args), cwd=cli.root, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == "schedtui: cannot write the output: No space left on device", done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    if args[0] == "fire":
        assert [run["status"] for run in cli.runs("hourly")] == ["succeeded"]
    else:
        assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("args", "code"), [(("list",), 0), (("runs", "--limit", "0"), 2)])
def test_a_verb_started_with_its_output_closed_ends_as_it_would_have(cli: Cli, args: tuple[str, ...], code: int) -> None:
    """``schedtui list >&-`` (an init script, a daemonizer): every verb ended with a
    traceback (``'NoneType' object has no attribute 'flush'``) and exit 1, serve's clean
    stop too (found by an outside attack, 2 of 2)."""
    done = subprocess.run(cli.argv(*args), cwd=cli.root, env=child_env(), stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(1), timeout=30, check=False)  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == (1 if code else 0), done.stderr


@pytest.mark.parametrize("args", [(), ("--url", "http://127.0.0.1:9"), ("demo",)], ids=["console", "remote", "demo"])
def test_the_console_started_with_its_input_closed_says_it_needs_a_terminal(cli: Cli, args: tuple[str, ...]) -> None:
    """``schedtui <&-``: a traceback (``'NoneType' object has no attribute 'isatty'``) and
    exit 1, where ``</dev/null`` says the console needs a terminal (found by an outside
    attack). Standard input is /dev/null then too."""
    done = subprocess.run(cli.argv(*args, store=not args), cwd=cli.root, env=child_env(), capture_output=True, text=True,
                          preexec_fn=lambda: os.close(0), timeout=30, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("schedtui: the console needs a terminal") and done.stderr.count("\n") == 1, done.stderr


# ---------------------------------------------------------------------------------------
# bad usage: exit 2, one line on stderr naming the bad value, nothing on stdout
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["runs", "nosuch"], 'no schedule named "nosuch"'),
        (["fire", "nosuch"], 'no schedule named "nosuch"'),
        (["disable", "nosuch"], 'no schedule named "nosuch"'),
        (["backfill", "nosuch", "--from", "-1h", "--to", "now"], 'no schedule named "nosuch"'),
        (["runs", "hourly", "--limit", "abc"], "'abc' is not a whole number"),
        (["runs", "hourly", "--limit", "0"], "0 must be at least 1"),
        (["runs", "hourly", "--limit", "5000"], "--limit: 5000 is more than 1000"),
        (["list", "--bogus"], "--bogus"),
        (["list", "--schedules", "no-such-folder"], 'schedules folder "no-such-folder" does not exist'),
        (["backfill", "hourly", "--from", "yesterday", "--to", "now"], '--from "yesterday" is not a time'),
        (["backfill", "hourly", "--from", "-1h", "--to", "2026-13-01"], '--to "2026-13-01" is not a time'),
        (["backfill", "hourly", "--to", "now"], "--from"),
        (["backfill", "hourly", "--from", "-999999999d", "--to", "now"], '--from "-999999999d" is out of range'),
        (["backfill", "failing", "--from", "0001-01-01", "--to", "now"], '--from "0001-01-01" is out of range'),
        (["runs", "hourly", "--before", "zz"], 'before "zz" is not a run id'),
        (["--fire", "list"], "--fire does not apply to `schedtui list`"),
        (["--read-only", "serve"], "--read-only does not apply to `schedtui serve`"),
        (["list", "--url", "http://127.0.0.1:9"], "--store and --url name two backends; give one"),
        (["console", "--url", "http://127.0.0.1:9"], "--store and --url name two backends; give one"),
    ],
)
def test_bad_usage(cli: Cli, args: list[str], named: str) -> None:
    done = cli(*args, real=args == ["frobnicate"])  # argparse's own refusal, from the real entry point
    assert done.returncode == 2, done
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert named in line
    assert "Traceback" not in done.stderr
    assert cli.log("hourly") == []


def test_a_note_that_is_not_text_is_bad_usage(cli: Cli) -> None:
    # A byte that is not UTF-8 reaches Python as a lone surrogate: no store could keep it.
    done = subprocess.run(
        [*cli.argv("disable", "hourly"), "--note", b"vendor \xff outage"], cwd=cli.root, env=child_env(),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith('schedtui: note "vendor \\udcff outage" holds \\udcff at position 7')
    assert cli.schedules()["hourly"]["enabled"]


def test_shared_options_work_before_or_after_the_verb(cli: Cli) -> None:
    write_tree(cli.root / "other", {"only.cron.py": 'from backend import define_schedule\n'
                                    'only = define_schedule(name="only", cron="0 0 1 1 *", timezone="UTC", handler=print)\n'})
    for args in (["--schedules", "other", "list", "--json"], ["list", "--schedules", "other", "--json"]):
        assert [s["name"] for s in json.loads(cli.ok(*args).stdout)] == ["only"], args


def test_read_only_before_or_after_the_verb_is_never_dropped(cli: Cli) -> None:
    for args, action in (
        (["--read-only", "fire", "hourly"], "Run now"),
        (["fire", "hourly", "--read-only"], "Run now"),
        (["--read-only", "disable", "hourly"], "disable"),
        (["--read-only", "backfill", "hourly", "--from", "-2h", "--to", "now"], "backfill"),
    ):
        done = cli(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.splitlines()[-1] == f"schedtui: read-only: {action} is not allowed"
    assert cli.log("hourly") == [] and cli.schedules()["hourly"]["enabled"]


def test_a_store_beside_a_url_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from console.cli.output import UsageError
    from console.cli.parsing import parse_args

    monkeypatch.setenv("SCHEDTUI_URL", "http://sched:8080")
    (tmp_path / "store.url").write_text("sqlite:///elsewhere.db\n")
    with pytest.raises(UsageError, match=r"--store-file and \$SCHEDTUI_URL name two backends; give one"):
        parse_args(["console", "--store-file", str(tmp_path / "store.url")])
    assert parse_args(["console"]).url == "http://sched:8080"  # the URL alone: as ever
    monkeypatch.setenv("SCHEDTUI_STORE", "sqlite:///from-the-environment.db")
    assert parse_args(["list"]).url == "http://sched:8080"  # a store from the environment: a default, not a choice


def test_console_options_before_the_verb_reach_the_console() -> None:
    from console.cli.parsing import parse_args

    for argv in (
        ["--read-only", "console", "--url", "http://sched:8080"],
        ["console", "--read-only", "--url", "http://sched:8080"],
        ["--url", "http://sched:8080", "--read-only"],  # no verb: the console
    ):
        args = parse_args(argv)
        assert (args.verb, args.read_only, args.url, args.fire) == ("console", True, "http://sched:8080", False), argv
    assert parse_args(["--schedules", "elsewhere", "console", "--fire"]).schedules == "elsewhere"


def test_unknown_store_scheme_is_bad_usage_and_hides_the_password(cli: Cli) -> None:
    done = cli("list", "--store", "mysql://ops:s3cret@db.internal/sched", store=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        'schedtui: unsupported store URL "mysql://ops:***@db.internal/sched" (use sqlite:///PATH or postgresql://…)'
    ]


def test_a_sqlite_url_with_options_is_bad_usage_and_creates_no_file(cli: Cli, tmp_path: Path) -> None:
    """Its query would otherwise be taken as part of the file's name (and ``serve`` would make
    a new, empty store under that name)."""
    done = cli("list", "--store", f"sqlite:///{tmp_path}/state.db?mode=ro", store=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f'schedtui: store URL "sqlite:///{tmp_path}/state.db?mode=ro" has a query ("?mode=ro"): a SQLite store '
        "URL names a file and takes no options"
    ]
    assert not (tmp_path / "state.db?mode=ro").exists()


def test_a_store_file_of_two_lines_is_bad_usage_and_creates_no_file(cli: Cli, tmp_path: Path) -> None:
    """Its URL was taken whole: serve made a store at a path across the line break."""
    lines = tmp_path / "store.url"
    lines.write_text(f"sqlite:///{tmp_path}/a.db\nsqlite:///{tmp_path}/b.db\n")
    for verb in ("list", "serve"):
        done = cli(verb, "--store-file", str(lines), store=False)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f'schedtui: store URL "sqlite:///{tmp_path}/a.db\\nsqlite:///{tmp_path}/b.db" holds \\n at position '
            f"{len(f'sqlite:///{tmp_path}/a.db') + 1} (a line break: a --store-file of two lines?): a store's file name "
            "is UTF-8 text without control characters"
        ]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(("a.db", "b.db"))]


MISSING_STORE_HINT = "(no such file); check --store and the working directory (only `schedtui serve` and `schedtui demo` create a store)"


@pytest.mark.parametrize(
    "verb",
    [
        ["list"],
        ["runs", "hourly"],
        ["fire", "hourly"],
        ["enable", "hourly"],
        ["disable", "hourly", "--note", "x"],
        ["backfill", "hourly", "--from", "-2h", "--to", "now", "--yes"],
    ],
    ids=lambda verb: verb[0],
)
def test_verbs_that_read_or_act_refuse_a_missing_store_and_create_nothing(cli: Cli, verb: list[str]) -> None:
    missing = cli.root / "typo" / "state.db"
    done = cli(*verb, "--store", f"sqlite:///{missing}", store=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [f'schedtui: no store at "{missing}" {MISSING_STORE_HINT}']
    assert not missing.parent.exists()
    assert cli.log("hourly") == []


def test_the_default_store_is_not_created_by_a_verb_in_the_wrong_folder(cli: Cli) -> None:
    elsewhere = cli.root / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "console.cli", "list", "--schedules", str(cli.root / "schedules")],
        cwd=elsewhere, env=child_env(), capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f'schedtui: no store at "{elsewhere / ".schedtui" / "state.db"}" {MISSING_STORE_HINT}']
    assert list(elsewhere.iterdir()) == []


def test_the_embedded_console_refuses_a_missing_store_before_drawing(cli: Cli) -> None:
    import pty

    missing = cli.root / "typo" / "state.db"
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            cli.argv("console", "--store", f"sqlite:///{missing}", store=False),
            cwd=cli.root, env=child_env(), stdin=terminal, stdout=terminal, stderr=subprocess.PIPE, text=True,
        )
        try:
            _, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:  # it drew a console instead of refusing
                process.kill()
                process.wait(5)
    finally:
        os.close(terminal)
        os.close(controller)
    assert process.returncode == 2
    assert err.splitlines() == [f'schedtui: no store at "{missing}" {MISSING_STORE_HINT}']
    assert not missing.parent.exists()


def test_no_verb_starts_the_console_which_needs_a_terminal(cli: Cli) -> None:
    done = cli(store=False, real=True)  # no TTY here: the console says so instead of drawing
    assert done.returncode == 2
    assert "the console needs a terminal" in done.stderr and "schedtui --help" in done.stderr
    assert cli("--help", store=False, real=True).stdout.startswith("usage: schedtui")


def test_the_installed_console_script(cli: Cli) -> None:
    script = Path(sys.executable).with_name("schedtui")
    if not script.exists():
        pytest.skip("the schedtui console script is not installed (pip install -e .)")
    done = subprocess.run(
        [str(script), "list", "--json", "--store", cli.store], cwd=cli.root, env=child_env(), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert [s["name"] for s in json.loads(done.stdout)] == ["failing", "hourly", "webhook"]


# ---------------------------------------------------------------------------------------
# serve: a real server on the real clock
# ---------------------------------------------------------------------------------------
TICKER = """
    import time
    from pathlib import Path
    from backend import define_schedule

    LOG = Path(__file__).resolve().parent.parent / "{name}.log"

    def handler(ctx):
        with LOG.open("a") as f:
            f.write(f"start {{ctx.scheduled_at.isoformat()}} {{ctx.run_id}}\\n")
        time.sleep({sleep})
        with LOG.open("a") as f:
            f.write(f"end {{ctx.scheduled_at.isoformat()}} {{ctx.run_id}}\\n")

    job = define_schedule(name="{name}", cron="* * * * * *", timezone="UTC", handler=handler, max_runtime=300)
"""


class Server:
    def __init__(self, cli: Cli, folder: str, *, prefix: Sequence[str] = ()) -> None:
        self.cli = cli
        self.err = cli.root / f"serve-{folder}.err"
        self.proc = subprocess.Popen(
            [*prefix, *cli.argv("serve", "--schedules", folder)],
            cwd=cli.root,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=self.err.open("w"),
        )

    def log(self) -> str:
        return self.err.read_text()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"serve did not stop within {timeout}s after signal {sig}:\n{self.log()}")


@pytest.fixture
def serve(cli: Cli) -> Iterator[Callable[[str, str, float], Server]]:
    servers: list[Server] = []

    def start(folder: str, name: str, sleep: float, prefix: Sequence[str] = ()) -> Server:
        write_tree(cli.root / folder, {f"{name}.cron.py": TICKER.format(name=name, sleep=sleep)})
        server = Server(cli, folder, prefix=prefix)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def entries(cli: Cli, name: str, kind: str) -> list[tuple[str, str]]:
    return [(slot, run_id) for k, slot, run_id in cli.log(name) if k == kind]


@pytest.mark.slow
def test_serve_fires_every_second_stops_when_disabled_and_on_sigint(cli: Cli, serve: Callable[..., Server]) -> None:
    server = serve("live", "ticker", 0)
    poll(lambda: len(entries(cli, "ticker", "end")) >= 2, timeout=15, what="two ticks")

    done = subprocess.run(
        cli.argv("disable", "ticker", "--note", "enough", "--schedules", "live"),
        cwd=cli.root, env=child_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    disabled_at = time.monotonic()
    # The server re-reads schedule state every second: it must notice within ~2 s.
    poll(lambda: "schedule ticker disabled by" in server.log(), timeout=5, what="the server to notice the disable")
    assert time.monotonic() - disabled_at < 2.5
    changed_at = at(json.loads(cli.ok("list", "--json", "--schedules", "live").stdout)[0]["state_note"]["at"])

    # Watch the ledger until two more slots would have fired; none may, beyond one in flight.
    def quiet_for_two_slots() -> list[dict[str, Any]] | None:
        runs = cli.runs("ticker", schedules="live")
        return runs if datetime.now(UTC) > changed_at + timedelta(seconds=3.5) else None

    runs = poll(quiet_for_two_slots, timeout=15, what="the observation window", every=0.2)
    slots = sorted(at(r["scheduled_at"]) for r in runs)
    assert len(slots) >= 2
    assert slots[-1] <= changed_at + timedelta(seconds=2), (changed_at, slots[-1])
    assert {(r["status"], r["trigger"], r["coordination_outcome"]) for r in runs} == {("succeeded", "self", "single")}
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [timedelta(seconds=1)] * (len(slots) - 1)
    assert sorted(run_id for _, run_id in entries(cli, "ticker", "end")) == sorted(r["id"] for r in runs)

    assert server.stop(signal.SIGINT) == 0
    assert "stopping" in server.log()
    after = cli.runs("ticker", schedules="live")
    assert [r for r in after if r["status"] == "running"] == []
    assert len(after) == len(runs)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_lets_a_run_in_flight_finish(cli: Cli, serve: Callable[..., Server], sig: int) -> None:
    """SIGHUP: the terminal serve ran in hung up (an SSH session that dropped). By default
    the process died at once, its run in flight left to be closed as abandoned."""
    server = serve("slow", "slow", 1.5)
    slot, run_id = poll(lambda: entries(cli, "slow", "start"), timeout=15, what="a run to start")[0]
    assert server.stop(sig) == 0, server.log()
    if sig == signal.SIGHUP:
        assert "stopping (SIGHUP: its terminal hung up): runs in flight may finish" in server.log()
    assert (slot, run_id) in entries(cli, "slow", "end")
    runs = {r["id"]: r for r in cli.runs("slow", schedules="slow")}
    assert (runs[run_id]["status"], runs[run_id]["error_tag"]) == ("succeeded", None)
    assert runs[run_id]["duration_ms"] >= 1500
    assert [r for r in runs.values() if r["status"] == "running"] == []
    # Slots that came due while it ran were skipped (on_overlap=skip), not started.
    assert {r["status"] for r in runs.values() if r["id"] != run_id} <= {"skipped"}
    assert len(entries(cli, "slow", "start")) == 1


class Terminal:
    """The far end of a pseudo-terminal, read on a thread of its own (a console that fills
    the terminal's buffer would block), until :meth:`hang_up` closes it: what sshd does to
    a session's terminal when its connection drops (the kernel sends SIGHUP to the
    session's leader)."""

    def __init__(self) -> None:
        self.controller, self.terminal = os.openpty()
        fcntl.ioctl(self.terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.output = bytearray()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        import select

        while not self._closing.is_set():
            if select.select([self.controller], [], [], 0.05)[0]:
                try:
                    data = os.read(self.controller, 65536)
                except OSError:  # EIO: the other end is closed
                    return
                if not data:
                    return
                self.output += data

    def lead(self) -> None:
        """In the child (``preexec_fn``): a session of its own, this terminal its controlling one."""
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def hang_up(self) -> None:
        self._closing.set()
        self._reader.join(5)
        os.close(self.controller)
        self.controller = -1

    def close(self) -> None:
        if self.controller >= 0:
            self.hang_up()
        os.close(self.terminal)

    @contextlib.contextmanager
    def running(self, cli: Cli, *args: str) -> Iterator[subprocess.Popen[bytes]]:
        """``schedtui ARGS`` on this terminal (its controlling one, ``TERM=xterm``), killed
        on the way out if it is still running."""
        process = subprocess.Popen(
            cli.argv(*args), cwd=cli.root, env={**child_env(), "TERM": "xterm"},
            stdin=self.terminal, stdout=self.terminal, stderr=self.terminal, preexec_fn=self.lead,
        )  # fmt: skip
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "hangup"])
def test_a_firing_console_stopped_by_a_signal_or_a_hangup_lets_its_run_in_flight_finish(cli: Cli, how: str) -> None:
    """``console --fire`` over SSH: its terminal hangs up when the connection drops, or it
    gets SIGTERM. Either ended the process at once: its run in flight was closed as
    abandoned, and a terminal that was still there was left in the console's modes (the
    alternate screen, mouse reports). Now both end it as its Quit does."""
    write_tree(cli.root / "fired", {"slow.cron.py": TICKER.format(name="slow", sleep=1.5)})
    screen = Terminal()
    try:
        with screen.running(cli, "console", "--fire", "--schedules", "fired") as process:
            slot, run_id = poll(lambda: entries(cli, "slow", "start"), timeout=30, what="a run to start")[0]
            if how == "SIGTERM":
                process.send_signal(signal.SIGTERM)
            else:
                screen.hang_up()
            assert process.wait(30) == 0
    finally:
        screen.close()
    assert (slot, run_id) in entries(cli, "slow", "end")
    runs = {r["id"]: r for r in cli.runs("slow", schedules="fired")}
    assert (runs[run_id]["status"], runs[run_id]["error_tag"]) == ("succeeded", None)
    assert [r for r in runs.values() if r["status"] == "running"] == []
    if how == "SIGTERM":  # the terminal is still there: left as it was found, and told why
        shown = screen.output.decode(errors="replace")
        assert "\x1b[?1049l" in shown  # out of the alternate screen
        assert "schedtui: SIGTERM: stopping the engine" in shown


@pytest.mark.slow
def test_a_console_whose_terminal_hangs_up_and_continues_after_its_quit_still_exits(cli: Cli) -> None:
    """Quit, its engine letting a run in flight finish, then the terminal hung up and the
    process got a SIGCONT (tmux sends one as it closes a session): Textual's handler for it,
    left installed after the app had exited, started its driver again, whose input thread
    spun on the hung-up terminal at 60% of a core, and the process never exited."""
    write_tree(cli.root / "fired", {"slow.cron.py": TICKER.format(name="slow", sleep=20)})
    screen = Terminal()
    try:
        with screen.running(cli, "console", "--fire", "--schedules", "fired") as process:
            poll(lambda: entries(cli, "slow", "start"), timeout=30, what="a run to start")
            os.write(screen.controller, b"q")
            poll(lambda: b"stopping the engine" in screen.output, timeout=30, what="the app to exit")
            screen.hang_up()
            process.send_signal(signal.SIGCONT)
            assert process.wait(30) == 0
    finally:
        screen.close()


def test_a_byte_that_is_not_utf8_on_the_terminal_reads_as_a_replacement_not_a_crash(cli: Cli) -> None:
    """A Latin-1 terminal sends ``é`` as the one byte 0xE9 (a pasted binary sends worse):
    Textual's strict decoder ended the console's input thread, and the console, with a
    traceback (exit 0, a firing one's engine stopped). It reads as U+FFFD now, and the
    console goes on answering keys."""
    screen = Terminal()
    try:
        with screen.running(cli, "console", "--schedules", "schedules") as process:
            poll(lambda: b"SCHEDULES" in screen.output, timeout=30, what="the console to draw")
            os.write(screen.controller, b"/caf\xe9 ")
            poll(lambda: "caf\ufffd" in screen.output.decode(errors="replace"), timeout=30, what="the filter to show it")
            os.write(screen.controller, b"\x03")  # ctrl+c quits (a key: the console still reads them)
            assert process.wait(30) == 0
    finally:
        screen.close()
    shown = screen.output.decode(errors="replace")
    assert "UnicodeDecodeError" not in shown and "Traceback" not in shown


async def test_the_consoles_output_outlives_a_terminal_that_hung_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual writes the screen on a thread of its own, from a queue of 30 writes. Its
    thread died of the first write to a terminal that had hung up (EIO), so the app's next
    30 writes filled the queue and the 31st blocked the event loop for good: the console
    never stopped its engine. The console's driver drops what a gone terminal refuses."""
    from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread
    from textual.drivers.linux_driver import LinuxDriver

    from console.driver import batched

    controller, terminal = os.openpty()
    stream = open(terminal, "w")  # noqa: SIM115  (closed below)
    os.close(controller)  # hung up: a write to it fails now
    with pytest.raises(OSError):
        stream.write("x")
        stream.flush()
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}  # (the driver takes them)
    monkeypatch.setattr(sys, "__stderr__", stream)
    try:
        driver = batched(LinuxDriver)(object())  # type: ignore[arg-type]  # (an app it never calls here)
        writer = WriterThread(driver._file)  # type: ignore[attr-defined]  # what the driver starts with the application mode
        writer.start()

        def app() -> None:  # on a thread of its own: with a dead writer it blocks for good
            for _ in range(MAX_QUEUED_WRITES * 3):
                writer.write("\x1b[?1049h a frame")
            writer.stop()

        painting = threading.Thread(target=app, daemon=True)
        painting.start()
        painting.join(15)
        assert not painting.is_alive(), "the app's writes block: the writer thread died"
        assert not writer.is_alive()
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
        try:
            stream.close()
        except OSError:
            pass


@pytest.mark.slow
def test_under_nohup_a_hangup_does_not_stop_serve(cli: Cli, serve: Callable[..., Server]) -> None:
    """``nohup`` ignores the hangup for serve to run on after its terminal is gone: serve
    leaves it ignored."""
    server = serve("kept", "kept", 0, prefix=["nohup"])
    poll(lambda: len(entries(cli, "kept", "end")) >= 1, timeout=15, what="a tick")
    server.proc.send_signal(signal.SIGHUP)
    ended = len(entries(cli, "kept", "end"))
    poll(lambda: len(entries(cli, "kept", "end")) >= ended + 2, timeout=15, what="two ticks after the hangup")
    assert server.proc.poll() is None and "stopping" not in server.log()
    assert server.stop(signal.SIGINT) == 0


@pytest.mark.slow
def test_serve_as_process_1_of_a_container_says_it_reaps_no_orphans(cli: Cli, serve: Callable[..., Server]) -> None:
    """In a PID namespace without an init (``docker run`` of ``schedtui serve``), serve is
    process 1: the orphans of its handlers' children are its to reap, and it reaps none, so
    they stay zombies. It says so at start (and a serve that is not process 1 does not)."""
    try:
        server = serve("alone", "alone", 0, prefix=["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"])
    except FileNotFoundError:
        pytest.skip("no unshare here")
    try:
        # (until its engine starts: its stop signals are handled from then, and a SIGINT
        # before that, as process 1 says its warning first, ended it with 130)
        said = poll(lambda: server.log() if "schedtui.engine: starting" in server.log() or server.proc.poll() is not None
                    else None, timeout=30, what="serve to start in its own PID namespace")  # fmt: skip
        if server.proc.poll() is not None and "Operation not permitted" in said:
            pytest.skip(f"cannot make a PID namespace here: {said.strip()}")
        assert "give the container an init (docker run --init, tini or dumb-init as its entrypoint)" in said
    finally:
        # unshare ignores SIGINT and SIGTERM while it waits; serve is its child.
        children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
        for pid in children:
            os.kill(int(pid), signal.SIGINT)
        assert server.proc.wait(15) == 0, server.log()
    plain = serve("plain", "plain", 0)
    poll(lambda: entries(cli, "plain", "end"), timeout=15, what="a tick")
    assert plain.stop() == 0 and "process 1" not in plain.log()


@pytest.mark.slow
def test_a_killed_server_leaves_its_run_to_be_closed_abandoned(cli: Cli, serve: Callable[..., Server]) -> None:
    server = serve("stuck", "stuck", 120)
    _, run_id = poll(lambda: entries(cli, "stuck", "start"), timeout=15, what="a run to start")[0]

    def committed_running() -> bool:
        return any(r["id"] == run_id and r["status"] == "running" for r in cli.runs("stuck", schedules="stuck"))

    poll(committed_running, timeout=10, what="the running row to be committed", every=0.1)
    server.proc.send_signal(signal.SIGKILL)
    assert server.proc.wait(10) == -signal.SIGKILL  # reaped: its pid is gone, not a zombie

    # Opening the store (any verb) closes what the dead instance left running.
    cli.ok("list", "--schedules", "stuck")
    runs = {r["id"]: r for r in cli.runs("stuck", schedules="stuck")}
    run = runs[run_id]
    assert (run["status"], run["error_tag"]) == ("failed", "abandoned")
    assert f"(pid {server.proc.pid}) is no longer running" in run["error_message"]
    assert run["finished_at"] is not None
    assert [r for r in runs.values() if r["status"] == "running"] == []


# ---------------------------------------------------------------------------------------
# Engine and interface behaviour the CLI depends on, pinned in-process without races
# ---------------------------------------------------------------------------------------
def test_no_paging_hint_on_the_last_page(cli: Cli) -> None:
    cli.ok("backfill", "hourly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T02:00Z")
    out = cli.ok("runs", "hourly", "--limit", "2").stdout.splitlines()
    assert len(out) == 3 and not out[-1].startswith("older:")


class LazyStore(SQLiteStore):
    """A valid store that hands runs to its writer only at the next flush (or close_runs,
    to keep the order of hand-in): a long group-commit window, which the Store contract allows."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held: list[Run] = []

    def save_runs(self, runs: Sequence[Run]) -> None:
        self.held.extend(runs)

    def release(self) -> None:
        held, self.held = self.held, []
        if held:
            super().save_runs(held)

    async def flush(self) -> None:
        self.release()
        await super().flush()

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        self.release()
        return await super().close_runs(runs)


async def test_wait_run_of_a_run_that_just_finished_is_not_stale(tmp_path: Path) -> None:
    """``fire`` used to print "running" and exit 1 for a run that had succeeded, about one
    time in four: wait_run read the store before the engine had handed in the finished
    version. Pinned here without a race, on a store that commits as late as it may."""
    gate = asyncio.Event()

    async def handler(ctx: Any) -> None:
        await gate.wait()

    job = define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=handler)
    engine = Engine([job], LazyStore(tmp_path / "state.db"), clock=ManualClock(), instance="t", shutdown_grace=0)
    backend = EmbeddedBackend(engine)
    await backend.connect()
    try:
        run = await backend.run_now("job")
        finished = expect(engine, lambda r: r.id == run.id and r.status != "running")
        gate.set()
        assert (await finished).status == "succeeded"
        assert (await backend.wait_run(run.id)).status == "succeeded"
    finally:
        await backend.close()


def test_a_verb_works_when_an_extension_module_cannot_be_loaded(cli: Cli, tmp_path: Path) -> None:
    """Found by CI at ``ulimit -n 13``: loading ``_multiprocessing`` (for the run logs' patch
    of ``ThreadPool``) failed in dlopen, which raises ImportError, not OSError, and the verb
    ended in a traceback. Here the extension fails the same way with descriptors to spare:
    the verb works, and only a ThreadPool a handler makes goes unpatched."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "_multiprocessing.py").write_text(
        'raise ImportError("_multiprocessing.so: cannot open shared object file: Too many open files")\n'
    )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(broken), env["PYTHONPATH"]])
    done = subprocess.run(cli.argv("list"), cwd=cli.root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "hourly" in done.stdout


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EMFILE, "Too many open files", "schedules/hourly.py"),
        ImportError("_ssl.so: cannot open shared object file: Too many open files"),
    ],
    ids=["os-error", "import-error"],
)
def test_out_of_descriptors_where_no_store_said_it_is_one_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """Whatever runs short first (a lazy import, a definition file, a socket), the verb ends
    in one line naming the limit, exit 1; any other OSError is still a traceback (a bug)."""
    import console.cli.backends as cli_backends

    def short(*args: object, **kwargs: object) -> NoReturn:
        raise error

    monkeypatch.setattr(cli_backends, "discover_definitions", short)
    done = cli("list")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("schedtui: ") and "ulimit -n" in done.stderr, done.stderr
    assert "Too many open files" in done.stderr


def test_out_of_file_descriptors_is_said_as_such_at_every_limit(cli: Cli) -> None:
    """Under a low ``ulimit -n`` a verb either works, or fails with one line saying the
    process is out of file descriptors (never SQLite's bare "unable to open database file",
    nor a zone taken for unknown because its file could not be opened)."""
    said = []
    for limit in range(9, 15):

        def low(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        done = subprocess.run(
            cli.argv("list"), cwd=cli.root, env=child_env(), capture_output=True, text=True, timeout=60, preexec_fn=low
        )
        if done.returncode == 0:
            continue
        assert done.stderr.count("\n") == 1, (limit, done.stderr)
        assert "ulimit -n" in done.stderr or "Too many open files" in done.stderr, (limit, done.stderr)
        assert "unknown timezone" not in done.stderr
        said.append(limit)
    assert said, "no limit tried was low enough to fail"
