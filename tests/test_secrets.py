"""Secrets stay secret: store and server passwords never reach a log line or an error,
tokens come from files or the environment, blank tokens are refused, and a shifted clock
is announced."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from backend import SchedtuiError, Unavailable
from backend.safetext import in_json, in_line, in_lines, printable, redact, redact_url, remember_url_secrets
from backend.store import open_store
from tests import pg
from tests.servers import cli_env, poll, start_server


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://sched:pw@db/app", "postgresql://sched:***@db/app"),
        ("postgresql://sched@db/app?password=pw&sslmode=require", "postgresql://sched@db/app?password=***&sslmode=require"),
        ("postgresql://db/app?sslpassword=k&Password=p", "postgresql://db/app?sslpassword=***&Password=***"),
        ("postgresql://?host=db&password=p%26q&dbname=app", "postgresql://?host=db&password=***&dbname=app"),
        ("postgresql://u:p@ss@db/app?options=-c%20x", "postgresql://u:***@db/app?options=-c%20x"),
        ("host=db password=pw dbname=app", "host=db password=*** dbname=app"),
        ("host=db password='p w' dbname=app", "host=db password=*** dbname=app"),
        ("http://alice:pa55@sched.internal:8080", "http://alice:***@sched.internal:8080"),
        ("sqlite:///.schedtui/state.db", "sqlite:///.schedtui/state.db"),
        ("postgresql://sched@db/app", "postgresql://sched@db/app"),
        # libpq reads a user part up to its "@": a password may hold "?", "#" and "@"
        ("postgresql://sched:Pa55?word#x@db:5432/app", "postgresql://sched:***@db:5432/app"),
        ("postgres://sched:a#b@db?sslmode=require", "postgres://sched:***@db?sslmode=require"),
        ("postgresql://db?password=pw&application_name=a@b", "postgresql://db?password=***&application_name=a@b"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_an_error_quoting_a_remembered_password_shows_it_masked() -> None:
    remember_url_secrets("postgresql://u:s3cr%zzet@db/app?password=another-one")
    error = Unavailable('invalid percent-encoded token: "s3cr%zzet"; also another-one')
    assert error.message == 'invalid percent-encoded token: "***"; also ***'
    assert str(SchedtuiError("password=hunter22 in a conninfo")) == "password=*** in a conninfo"
    assert redact("nothing secret here") == "nothing secret here"


def test_printable_escapes_control_characters() -> None:
    assert printable("a\nb\rc\x1b[2J\x00\ud800 ok") == "a\\nb\\rc\\x1b[2J\\x00\\ud800 ok"
    assert printable("x" * 300, 10) == "x" * 10 + "…"


def test_invisible_format_characters_are_shown_as_escapes() -> None:
    """A value from a file saved with a byte-order mark was quoted in a refusal with the
    mark as it was: invisible, so the refusal read as one of a good value (found by an
    outside attack). Every format character (Unicode's category Cf) is shown as its escape,
    but the zero-width joiner and non-joiner, which join the letters of some scripts and
    the emoji of a sequence."""
    assert printable("\ufeffsqlite:///x.db") == "\\ufeffsqlite:///x.db"
    assert in_lines("a\u200bb\tc\n") == "a\\u200bb\tc\n"
    assert in_line("flag\U000e0067") == printable("flag\U000e0067") == "flag\\U000e0067"
    assert in_line("👩\u200d💻 فارسی\u200c") == "👩\u200d💻 فارسی\u200c"
    every = [chr(code) for code in range(0x110000) if unicodedata.category(chr(code)) == "Cf"]
    kept = {"\u200c", "\u200d"}
    for char in every:
        assert (in_line(char) == char, printable(char) == char) == (char in kept, char in kept), hex(ord(char))
    dumped = json.dumps(every, ensure_ascii=False)
    assert json.loads(in_json(dumped)) == every  # (past U+FFFF as a surrogate pair: the same JSON)
    assert set(in_json(dumped)) - set(string.printable) == kept


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("store", "secret"),
    [
        ("postgresql://u:s3cr%zzet@127.0.0.1:1/app", "s3cr"),  # libpq quotes the bad token back
        ("postgresql://u@127.0.0.1:1/app?password=hunter22&bogus", "hunter22"),
        ("postgresql://sched:S3cret-pw@[::1/app", "S3cret-pw"),  # libpq quotes the whole URL back
        ("postgresql://sched:Pa55?word#x@127.0.0.1:1/app", "Pa55"),  # the user part, as libpq reads it
    ],
)
def test_a_store_url_error_never_shows_its_password(tmp_path: Path, store: str, secret: str) -> None:
    (tmp_path / "schedules").mkdir()
    done = cli("list", cwd=tmp_path, SCHEDTUI_STORE=store)
    # (2: a URL libpq cannot read; 1: the store cannot be reached)
    assert done.returncode in (1, 2) and len(done.stderr.splitlines()) == 1, done.stderr
    assert secret not in done.stderr and "***" in done.stderr


def test_libpqs_password_from_the_environment_is_masked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "from-the-env-123")
    open_store("postgresql://sched@127.0.0.1:1/app")  # built, not opened
    assert redact('FATAL: password "from-the-env-123" refused') == 'FATAL: password "***" refused'


def test_a_password_in_any_url_of_a_text_is_masked() -> None:
    assert redact('bad URI: "postgresql://sched:never-seen@[::1/app" (x)') == 'bad URI: "postgresql://sched:***@[::1/app" (x)'
    assert redact("see http://a:b@c/d, then") == "see http://a:***@c/d, then"


def test_a_query_password_masked_before_keeps_the_quote_and_colon_after_it() -> None:
    where = redact_url("postgresql://?host=db&password=pw-in-the-query")
    assert redact(f'cannot reach the store "{where}": refused') == (
        'cannot reach the store "postgresql://?host=db&password=***": refused'
    )  # (the quote and the colon were taken as the rest of the password)
    assert redact('password=***"x" password=*** y') == 'password=***"x" password=*** y'


# ---------------------------------------------------------------------------------------
# the store URL: from the environment or a file; a password on the command line is warned about
# ---------------------------------------------------------------------------------------
PS_WARNING = (
    "schedtui: warning: the password in --store can be read by every local user (ps); use --store-file PATH or "
    "$SCHEDTUI_STORE, or a URL without it and libpq's $PGPASSFILE (~/.pgpass) or $PGPASSWORD"
)


def test_a_password_in_store_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "schedules").mkdir()
    done = cli("list", "--store", "postgresql://u:visible-in-ps@127.0.0.1:1/app", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if "warning" in line] == [PS_WARNING]
    assert "visible-in-ps" not in done.stderr
    for quiet in (["--store", "postgresql://u@127.0.0.1:1/app"], ["--store", f"sqlite:///{tmp_path / 'x.db'}"]):
        assert "warning" not in cli("list", *quiet, cwd=tmp_path).stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store-file", "missing.url"], 'schedtui: cannot read --store-file "missing.url": No such file or directory'),
        (["--store-file", "blank.url"], 'schedtui: --store-file "blank.url" holds no store URL'),
        (["--store-file", "blank.url", "--store", "sqlite:///x.db"], "schedtui: give --store or --store-file, not both"),
    ],
)
def test_a_bad_store_file_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "blank.url").write_text("  \n")
    done = cli("list", *args, cwd=tmp_path)
    assert (done.returncode, done.stderr.splitlines()) == (2, [message])


@pytest.mark.postgres
def test_the_store_url_from_a_file_or_the_environment_and_no_warning(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "a.cron.py").write_text(
        'from backend import define_schedule\na = define_schedule(name="a", cron="0 0 1 1 *", timezone="UTC", handler=print)\n'
    )
    with_password = with_user(pg_url, "schedtui", "file-pw-123")  # the test server trusts everyone
    (tmp_path / "store.url").write_text(f"  {with_password}\n")
    server = start_server(tmp_path, "--schedules", "schedules", "--store-file", "store.url")
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        assert server.stop() == 0
    assert "warning" not in server.log_text() and "file-pw-123" not in server.log_text()
    assert "store=postgresql://" in server.log_text()
    for args, env in ((["--store-file", "store.url"], {}), ([], {"SCHEDTUI_STORE": with_password})):
        listed = cli("list", "--schedules", "schedules", *args, cwd=tmp_path, **env)
        assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr
        assert listed.stdout.split()[0] == "NAME" and "a" in listed.stdout.split()


def with_user(url: str, user: str, password: str) -> str:
    """``url`` (a test database's) as ``postgresql://USER:PASSWORD@HOST:PORT/DB``."""
    params = conninfo_to_dict(url)
    return f"postgresql://{user}:{password}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{params['dbname']}"


@pytest.mark.postgres
def test_503_bodies_and_healthz_never_say_where_the_store_is(tmp_path: Path, pg_server: pg.PgServer, pg_url: str) -> None:
    """A client of the HTTP API learns that the store is unavailable and why, in words that
    name no host, port, user or database (the serve's log names the store, redacted)."""
    (tmp_path / "schedules").mkdir()
    dbname, role = conninfo_to_dict(pg_url)["dbname"], f"sched_role_{os.getpid()}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    url = with_user(pg_url, role, "S3cret-pw")
    host, port = conninfo_to_dict(url)["host"], str(conninfo_to_dict(url)["port"])
    assert isinstance(dbname, str) and isinstance(host, str)
    server = start_server(tmp_path, "--schedules", "schedules", "--store", url, "--token", "op=op-token")
    op = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer op-token"}, timeout=30)
    try:
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
        bodies = [op.get(path) for path in ("/inspect/schedules", "/inspect/queues")]
        assert [r.status_code for r in bodies] == [503, 503], [r.text for r in bodies]
        assert all(r.json()["error"]["message"].startswith("the store is unavailable: ") for r in bodies), bodies[0].text
        health = poll(lambda: (r := op.get("/healthz")).status_code == 503 and r, timeout=30, what="/healthz to say 503")
        for text in [*(r.text for r in bodies), health.text]:
            for where in (dbname, role, "S3cret", host, f":{port}", "postgresql://"):
                assert where not in text, (where, text)
    finally:
        op.close()
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
        server.stop()
        with psycopg.connect(pg_url, autocommit=True) as owner:  # the role made the tables
            owner.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER; DROP OWNED BY "{role}"')
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f'DROP ROLE "{role}"')
    assert f"{role}:***@" in server.log_text() and "S3cret" not in server.log_text()


@pytest.mark.postgres
def test_the_startup_log_never_shows_a_query_password(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "schedules").mkdir()
    store = f"{pg_url}?password=hunter2-in-the-query"  # the test server trusts everyone: any password works
    server = start_server(tmp_path, "--schedules", "schedules", "--store", store)
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        assert server.stop() == 0
    log = server.log_text()
    assert "store=" in log and "password=***" in log
    assert "hunter2" not in log


def test_the_remote_cli_never_shows_the_servers_password(tmp_path: Path) -> None:
    done = cli("list", "--url", "http://alice:pa55word@127.0.0.1:9", cwd=tmp_path)
    assert done.returncode == 1 and "cannot reach http://alice:***@127.0.0.1:9" in done.stderr
    assert "pa55word" not in done.stderr


# ---------------------------------------------------------------------------------------
# tokens
# ---------------------------------------------------------------------------------------
@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "a.cron.py").write_text(textwrap.dedent("""
        from backend import define_schedule
        a = define_schedule(name="a", cron="0 0 1 1 *", timezone="UTC", handler=print)
    """))  # fmt: skip
    return tmp_path


def test_tokens_from_files_and_no_warning(folder: Path) -> None:
    (folder / "op.token").write_text("op-secret-from-file\n")
    (folder / "read.token").write_text("  read-secret-from-file  \n")
    server = start_server(folder, "--schedules", "schedules", "--store", f"sqlite:///{folder / 'state.db'}",
                          "--token-file", "op.token", "--read-token-file", "read.token")  # fmt: skip
    try:
        def access(token: str) -> int:
            return httpx.get(f"{server.url}/inspect/info", headers={"Authorization": f"Bearer {token}"}).status_code

        assert (access("op-secret-from-file"), access("read-secret-from-file"), access("wrong")) == (200, 200, 401)
        listed = cli("list", "--url", server.url, "--token-file", "read.token", cwd=folder)
        assert listed.returncode == 0 and "a" in listed.stdout and listed.stderr == ""
    finally:
        assert server.stop() == 0
    assert "warning" not in server.log_text() and "secret-from-file" not in server.log_text()


def test_a_token_on_the_command_line_is_warned_about_once(folder: Path) -> None:
    done = cli("list", "--url", "http://127.0.0.1:9", "--token", "visible-in-ps", cwd=folder)
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "schedtui: warning: --token on the command line can be read by every local user (ps); "
        "use --token-file PATH or $SCHEDTUI_TOKEN"
    ]
    assert "visible-in-ps" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["serve", "--host", "0.0.0.0", "--port", "0", "--token", "   "], {}, "the token from --token is empty"),
        (["serve", "--host", "0.0.0.0", "--port", "0"], {"SCHEDTUI_TOKEN": " \t "}, "the token from $SCHEDTUI_TOKEN is empty"),
        (["serve", "--port", "0", "--read-token", ""], {}, "the token from --read-token is empty"),
        (["serve", "--port", "0", "--token-file", "blank.token"], {}, 'the token from --token-file "blank.token" is empty'),
        (["serve", "--port", "0", "--token-file", "missing.token"], {}, 'cannot read --token-file "missing.token"'),
        (["list", "--url", "http://127.0.0.1:9", "--token", "x", "--token-file", "blank.token"], {}, "not both"),
        (["console", "--url", "http://127.0.0.1:9", "--token", " "], {}, "the token from --token is empty"),
    ],
)
def test_blank_or_unreadable_tokens_are_refused(folder: Path, args: list[str], env: dict[str, str], message: str) -> None:
    (folder / "blank.token").write_text(" \n")
    done = cli(*args, cwd=folder, **env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.splitlines()[-1]
    assert "serving" not in done.stdout


def test_a_shifted_clock_is_announced_loudly(folder: Path) -> None:
    env = cli_env(SCHEDTUI_CLOCK_OFFSET_MS="1500")
    server = start_server(folder, "--schedules", "schedules", "--store", f"sqlite:///{folder / 'state.db'}", env=env)
    assert server.stop() == 0
    [line] = [line for line in server.log_text().splitlines() if "CLOCK" in line]
    assert "WARNING" in line and "SHIFTED by +1500 ms" in line and "earlier" in line
