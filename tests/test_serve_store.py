"""Real ``schedtui serve`` processes and their SQLite store: one firer per file, a file
deleted while serving, a disk that fills up and empties again (a real tmpfs), and what
``/healthz`` says meanwhile.

These run on the real clock against real processes; they wait by polling a condition
against a deadline (``tests.servers.poll``), never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pty
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from backend import Engine, ManualClock, ScheduleState, Unavailable, define_schedule
from backend.api.app import create_app
from backend.client.embedded import EmbeddedBackend
from backend.model import Health, iso
from backend.store import Beat
from backend.store.sqlite.sql import MIGRATIONS
from backend.store.sqlite.store import SQLiteStore
from tests.conftest import expect
from tests.servers import Server, cli_env, poll, start_server

EVERY_SECOND = 8  # schedules, so that a full disk is felt within a second

SCHEDULES = "\n".join(
    textwrap.dedent(
        f"""
        async def work_{i}(ctx):
            pass

        tick_{i} = define_schedule(name="tick-{i}", cron="* * * * * *", timezone="UTC", handler=work_{i})
        """
    )
    for i in range(EVERY_SECOND)
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "ticks.cron.py").write_text("from backend import define_schedule\n" + SCHEDULES)
    return tmp_path


def serve_argv(db: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "console.cli", "serve", "--host", "127.0.0.1", "--port", "0",
        "--schedules", "schedules", "--store", f"sqlite:///{db}", *extra,
    ]  # fmt: skip


def ledger(db: Path, query: str = "SELECT name, scheduled_at, status, trigger FROM runs") -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(query).fetchall()


def count_runs(db: Path) -> int:
    try:
        count = ledger(db, "SELECT count(*) FROM runs")[0][0]
        assert isinstance(count, int)
        return count
    except sqlite3.Error:  # not created yet
        return 0


def run_in_terminal(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run with a pseudo-terminal as stdin and stdout (what the console needs), stderr captured."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(argv, cwd=cwd, env=cli_env(), stdin=terminal, stdout=terminal, stderr=subprocess.PIPE, text=True)
        try:
            _, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:  # it drew a console instead of refusing
                process.kill()
                process.wait(5)
    finally:
        os.close(terminal)
        os.close(controller)
    return subprocess.CompletedProcess(argv, process.returncode, "", err)


def healthz(server: Server) -> httpx.Response:
    return httpx.get(f"{server.url}/healthz", timeout=10)


# ---------------------------------------------------------------------------------------
# one firer per SQLite file
# ---------------------------------------------------------------------------------------
def test_a_second_serve_on_the_same_file_is_refused_naming_the_first_until_it_dies(root: Path) -> None:
    db = root / "state.db"
    first = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the first serve to fire")
        second = subprocess.run(
            serve_argv(db, "--instance", "second"), cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1, second.stderr
        assert second.stdout == ""
        assert second.stderr.splitlines() == [
            f'schedtui: refusing to fire: instance "first" (pid {first.process.pid} on {socket.gethostname()}, since '
            + second.stderr.split(", since ", 1)[1].split(")", 1)[0]
            + f') already fires the schedules of the store "{db}"; two firing processes on one SQLite file would run '
            "every slot twice. Stop that one first (the other verbs, and a console without --fire, work beside it; "
            "several firing instances need PostgreSQL)"
        ]
        # Refused before it registered or fired anything.
        assert [row[0] for row in ledger(db, "SELECT instance FROM instances")] == ["first"]
        assert {row[0] for row in ledger(db, "SELECT DISTINCT instance FROM runs")} == {"first"}
        # Reading and acting beside a running serve still works.
        listed = subprocess.run(
            [sys.executable, "-m", "console.cli", "fire", "tick-0", "--store", f"sqlite:///{db}"],
            cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        # A console that would fire too is refused the same way, before drawing anything.
        console = run_in_terminal(
            [sys.executable, "-m", "console.cli", "console", "--fire", "--store", f"sqlite:///{db}"], cwd=root
        )
        assert console.returncode == 1
        assert console.stderr.startswith('schedtui: refusing to fire: instance "first"'), console.stderr
    finally:
        first.process.send_signal(signal.SIGKILL)  # the kernel releases its lock, however it dies
        first.process.wait(15)
    again = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "second")
    try:
        poll(lambda: ("second",) in ledger(db, "SELECT DISTINCT instance FROM runs"), timeout=20, what="the second to fire")
    finally:
        assert again.stop() == 0, again.log_text()


def test_another_name_for_the_file_is_no_way_around_the_one_firer(root: Path) -> None:
    """A symlink (to the file, or to its folder) leads to the same firing lock; a hard link,
    whose name would get a write-ahead log of its own, is refused by every verb."""
    db = root / "state.db"
    first = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the first serve to fire")
        (root / "link.db").symlink_to(db)
        (root / "folder").symlink_to(root, target_is_directory=True)
        for other in (root / "link.db", root / "folder" / "state.db"):
            second = subprocess.run(serve_argv(other, "--instance", "second"), cwd=root, env=cli_env(),
                                    capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
            assert second.returncode == 1, second.stderr
            assert second.stderr.startswith('schedtui: refusing to fire: instance "first"'), second.stderr
            assert f'the schedules of the store "{db}"' in second.stderr
        os.link(db, root / "hard.db")
        for argv in (serve_argv(root / "hard.db", "--instance", "second"),
                     [sys.executable, "-m", "console.cli", "list", "--store", f"sqlite:///{root / 'hard.db'}"],
                     [sys.executable, "-m", "console.cli", "list", "--store", f"sqlite:///{db}"]):  # fmt: skip
            refused = subprocess.run(argv, cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60, check=False)
            assert refused.returncode == 2, refused.stderr
            [line] = refused.stderr.splitlines()
            assert line.startswith("schedtui: the store file ") and "has 2 names (hard links)" in line, line
        assert not (root / "hard.db-wal").exists()  # never opened under that name
        poll(lambda: "now has 2 names (hard links)" in first.log_text(), timeout=10, what="the firer to warn of the link")
        assert {row[0] for row in ledger(db, "SELECT DISTINCT instance FROM runs")} == {"first"}
    finally:
        stopped = first.stop()
    assert stopped == 0, first.log_text()


def test_a_second_process_is_refused_the_file_whatever_the_coordination(root: Path) -> None:
    """Claims coordinate the engines of one process (the demo's two); between processes an
    embedded store has no lease to fence a frozen one with: a second serve by claims is
    refused as a second single one is."""
    db = root / "state.db"
    first = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first",
                         "--coordination", "advisoryLock")  # fmt: skip
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the first serve to fire")
        for mode in ("advisoryLock", "single"):
            refused_as_second(root, db, 'schedtui: refusing to fire: instance "first"', "--coordination", mode)
    finally:
        stopped = first.stop()
    assert stopped == 0, first.log_text()


def refused_as_second(root: Path, db: Path, said: str, *extra: str) -> None:
    """A second serve on ``db`` is refused (exit 1, saying ``said``), and the first alone fired."""
    second = subprocess.run(serve_argv(db, "--instance", "second", *extra), cwd=root, env=cli_env(),
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert second.returncode == 1, second.stderr
    assert second.stderr.startswith(said), second.stderr
    assert {row[0] for row in ledger(db, "SELECT DISTINCT instance FROM runs")} == {"first"}


def test_a_firing_lock_file_deleted_by_a_tidy_up_lets_no_second_firer_in(root: Path) -> None:
    """The lock file is found by its name; the store file's own lock is its inode's."""
    db = root / "state.db"
    first = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the first serve to fire")
        (root / "state.db.firing-lock").unlink()  # `rm -f state.db.*`, a tmp cleaner
        refused_as_second(root, db, "schedtui: refusing to fire: another process already fires")
    finally:
        stopped = first.stop()
    assert stopped == 0, first.log_text()


FORKING = textwrap.dedent("""
    import os, pathlib, time
    from backend import define_schedule

    def fork_once(ctx):
        if pathlib.Path("child.pid").exists():
            return
        pid = os.fork()  # (a handler's own child, or a multiprocessing pool of the fork kind)
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        pathlib.Path("child.pid").write_text(str(pid))

    forks = define_schedule(name="forks", cron="* * * * * *", timezone="UTC", handler=fork_once)
""")


def test_a_child_a_handler_forked_does_not_hold_the_firing_lock_after_its_parent_died(root: Path) -> None:
    """A child forked by a handler got copies of the firing lock's descriptors, and the
    kernel lets go of the lock when the last copy closes: after a SIGKILL of ``serve`` the
    child, living on, held it, and the restarted serve was refused (``another process
    already fires``) for as long as the child lived. The child closes its copies at the fork."""
    (root / "schedules" / "forks.cron.py").write_text(FORKING)
    db = root / "state.db"
    first = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first")
    child = 0
    try:
        child = int(poll(lambda: (root / "child.pid").exists() and (root / "child.pid").read_text(), timeout=30,
                         what="the handler's child"))  # fmt: skip
        first.process.kill()
        first.process.wait(10)
        os.kill(child, 0)  # the child lives on
        second = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "second")
        try:
            poll(lambda: ("second",) in ledger(db, "SELECT DISTINCT instance FROM runs"), timeout=30,
                 what="the restarted serve to fire")  # fmt: skip
        finally:
            assert second.stop() == 0, second.log_text()
    finally:
        first.stop()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_a_store_file_bind_mounted_on_its_own_is_refused_by_every_verb(root: Path) -> None:
    """A file mounted alone (``docker run -v state.db:/app/state.db``) is a second name whose
    write-ahead log lives apart from it, outside the mount."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("a bind mount needs Linux and root")
    db, other = root / "state.db", root / "other" / "state.db"
    sqlite3.connect(db).close()
    other.parent.mkdir()
    other.touch()
    mounted = subprocess.run(["mount", "--bind", str(db), str(other)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.strip()}")
    try:
        for argv in (serve_argv(other, "--instance", "second"),
                     [sys.executable, "-m", "console.cli", "list", "--store", f"sqlite:///{other}"]):  # fmt: skip
            refused = subprocess.run(argv, cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60, check=False)
            assert refused.returncode == 2, refused.stderr
            [line] = refused.stderr.splitlines()
            assert line.startswith(f'schedtui: the store file "{other}" is mounted on its own'), line
        assert not (root / "other" / "state.db-wal").exists()
    finally:
        subprocess.run(["umount", "-l", str(other)], check=False)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("UPDATE schema_version SET version = 'abc'", "holds 'abc', not one version number"),
        ("INSERT INTO schema_version VALUES (3)", f"holds {len(MIGRATIONS)}, 3, not one version number"),
        ("DELETE FROM schema_version", "is empty, yet the store holds schedtui's tables"),
    ],
)
def test_a_store_whose_version_table_was_edited_is_refused_naming_it(root: Path, damage: str, said: str) -> None:
    db = root / "state.db"
    async def make() -> None:
        made = SQLiteStore(db)
        await made.open()
        await made.close()

    asyncio.run(make())
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(len(MIGRATIONS),)]
        conn.execute(damage)
        conn.commit()
    listed = subprocess.run([sys.executable, "-m", "console.cli", "list", "--store", f"sqlite:///{db}"],
                            cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert listed.returncode == 1
    assert listed.stderr.splitlines() == [
        f'schedtui: the schema_version table of the store "{db}" {said}'
        + listed.stderr.split(said, 1)[1].rstrip("\n")
    ]
    assert "restore the store from a backup" in listed.stderr


def test_a_store_path_that_is_a_folder_or_under_a_file_is_one_line_naming_it(root: Path) -> None:
    (root / "folder.db").mkdir()
    (root / "plain").write_text("")
    for verb in ("list", "serve"):
        argv = [sys.executable, "-m", "console.cli", verb, "--schedules", "schedules", "--store"]
        folder = subprocess.run([*argv, f"sqlite:///{root / 'folder.db'}"], cwd=root, env=cli_env(),
                                capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert (folder.returncode, folder.stderr) == (
            2, f'schedtui: the store "{root / "folder.db"}" is a folder; --store names the database file itself\n'
        ), folder.stderr
    under = subprocess.run(serve_argv(root / "plain" / "new" / "state.db"), cwd=root, env=cli_env(),
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (under.returncode, under.stderr) == (
        1, f'schedtui: cannot create the folder for the store "{root / "plain" / "new" / "state.db"}": Not a directory\n'
    ), under.stderr


def test_serve_follows_no_symlink_planted_at_its_side_files(root: Path) -> None:
    # A root serve truncated the link's target and wrote its holder line into it, or grew it
    # to 2 MiB (the reserve): whoever could write the store's folder chose what it overwrote.
    db, precious = root / "state.db", root / "precious.txt"
    precious.write_text("precious\n")
    (root / "state.db.firing-lock").symlink_to(precious)
    refused = subprocess.run(serve_argv(db), cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stderr.splitlines()[-1]) == (2, (
        f'schedtui: the firing lock "{db}.firing-lock" is a symbolic link; it is schedtui\'s own file: remove the link'
    )), refused.stderr  # fmt: skip
    (root / "state.db.firing-lock").unlink()
    (root / "state.db.reserve").symlink_to(precious)
    server = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the serve to fire")
    finally:
        assert server.stop() == 0
    assert f'cannot open the reserve "{db}.reserve" (a symbolic link: not followed)' in server.log_text()
    assert precious.read_text() == "precious\n"


# ---------------------------------------------------------------------------------------
# a store file deleted while serving
# ---------------------------------------------------------------------------------------
def serve_until_lost(root: Path, db: Path, lose: Callable[[], None]) -> str:
    """A serve on ``db`` that has fired, ``lose()``, then its log once it has stopped, exit 1."""
    server = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the serve to fire")
        lose()
        code = poll(lambda: server.process.poll() is not None and (server.process.returncode,), timeout=60, what="serve to stop")
    finally:
        if server.process.poll() is None:
            server.process.kill()
    log = server.log_text()
    assert code == (1,), log
    return log


def test_a_serve_whose_store_file_is_deleted_says_so_and_exits_1_without_recreating_it(root: Path) -> None:
    db = root / "state.db"
    log = serve_until_lost(root, db, db.unlink)
    assert f'the store file "{db}" was deleted or replaced while in use' in log
    assert log.rstrip().splitlines()[-1] == (
        f'schedtui: stopped: the store "{db}" was deleted or replaced while in use, so nothing written since would '
        "survive (the runs not written are in the log); restore it, or start again to create a new one"
    )
    assert "Traceback" not in log
    assert not db.exists()


@pytest.mark.parametrize("how", ["deleted, then the backup copied back", "the backup moved over it"])
def test_a_backup_restored_over_a_store_lost_under_serve_is_the_backup(root: Path, how: str) -> None:
    # SQLite finds a file's write-ahead log by name: the lost file's, left beside it, was
    # replayed into the restored copy (its last runs added to it, or a corrupt store).
    db, backup = root / "state.db", root / "backup.db"

    def lose() -> None:
        with contextlib.closing(sqlite3.connect(db)) as conn, contextlib.closing(sqlite3.connect(backup)) as copy:
            conn.backup(copy)
        poll(lambda: count_runs(db) > count_runs(backup) + 2 * EVERY_SECOND, timeout=20, what="runs written after the backup")
        if how.startswith("deleted"):
            db.unlink()
        else:
            (root / "copy.db").write_bytes(backup.read_bytes())
            (root / "copy.db").rename(db)

    log = serve_until_lost(root, db, lose)
    assert f'(its "{db}-wal" and "{db}-shm" were removed: SQLite would have replayed them' in log
    assert not (root / "state.db-wal").exists() and not (root / "state.db-shm").exists()
    if how.startswith("deleted"):
        db.write_bytes(backup.read_bytes())
    assert ledger(db, "PRAGMA integrity_check") == [("ok",)]
    assert count_runs(db) == count_runs(backup)


SLOW = """
import asyncio, os, pathlib
from backend import define_schedule

async def slow(ctx):
    here = pathlib.Path(os.environ["SLOW_DIR"])
    (here / f"ran-{ctx.scheduled_at:%H%M}").touch()
    while not (here / "go").exists():  # the test's cue
        await asyncio.sleep(0.02)

slow_schedule = define_schedule(name="slow", cron="*/5 * * * *", timezone="UTC", handler=slow)
"""


@pytest.mark.parametrize("verb", [("backfill", "slow", "--from", "-2h", "--to", "-1h", "--yes"), ("fire", "slow")])
def test_a_verb_whose_store_file_is_deleted_meanwhile_fails_and_fires_nothing_more(tmp_path: Path, verb: tuple[str, ...]) -> None:
    # It said "done: 12 fired, 12 succeeded", exit 0, every run written into a file that was gone.
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "slow.cron.py").write_text(SLOW)
    db = tmp_path / "state.db"
    store = ("--schedules", "slow", "--store", f"sqlite:///{db}")
    assert subprocess.run([sys.executable, "-m", "console.cli", "migrate", *store[2:]], cwd=tmp_path, env=cli_env()).returncode == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "console.cli", *verb, *store], cwd=tmp_path, env=cli_env(SLOW_DIR=str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        poll(lambda: list(tmp_path.glob("ran-*")), timeout=30, what="the first handler to start")
        db.unlink()
        (tmp_path / "go").touch()
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, (out, err)
    assert err.rstrip().splitlines()[-1] == (
        f'schedtui: stopped: the store "{db}" was deleted or replaced while in use, so nothing written since would '
        "survive (the runs not written are in the log); restore it, or start `schedtui serve` for a new, empty store"
    ), err
    assert len(list(tmp_path.glob("ran-*"))) == 1, err
    assert " done:" not in out and "Traceback" not in err
    assert not db.exists()


# ---------------------------------------------------------------------------------------
# a full disk (a real tmpfs)
# ---------------------------------------------------------------------------------------
def tmpfs(disk: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``disk`` for a test (needs root, as in CI); the test
    is skipped where it cannot be."""
    disk.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs Linux and root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """1 MiB: no room for the store's reserve."""
    yield from tmpfs(tmp_path / "disk", "1m")


@pytest.fixture
def roomy_disk(tmp_path: Path) -> Iterator[Path]:
    """6 MiB: room for the store and its reserve, until filled."""
    yield from tmpfs(tmp_path / "disk", "6m")


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses another byte."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0")
    return filler


def test_a_full_disk_loses_no_run_and_healthz_says_why_until_space_is_back(root: Path, small_disk: Path) -> None:
    db = small_disk / "state.db"
    server = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}")
    op = httpx.Client(base_url=server.url, timeout=10)
    answered: list[str] = []
    try:
        poll(lambda: count_runs(db) >= 2 * EVERY_SECOND, timeout=30, what="a few seconds of runs")
        answered.append(op.post("/inspect/schedules/tick-0/fire").json()["run_id"])
        filler = fill(small_disk)

        failing = poll(lambda: (r := healthz(server)).status_code == 503 and r, timeout=30, what="/healthz to say 503")
        body = failing.json()
        assert body["status"] == "failing"
        assert body["store"]["state"] == "failing" and body["store"]["error"] == "database or disk is full"
        assert body["store"]["kind"] == "sqlite" and body["store"]["since"]
        assert str(small_disk) not in failing.text  # no path on an open endpoint
        assert "cannot rollback" not in server.log_text()
        # (The health can turn first, on a write no run waited for: a heartbeat's, the
        # reserve's; the line comes with the first runs that wait.)
        poll(lambda: "database or disk is full; they are kept and retried" in server.log_text(), timeout=30,
             what="the log to say the runs are kept")  # fmt: skip
        # Runs keep firing, and wait; Run now is refused before firing (nothing unrecorded).
        poll(lambda: healthz(server).json()["store"]["waiting"] >= 3 * EVERY_SECOND, timeout=30, what="runs to wait")
        refused = op.post("/inspect/schedules/tick-1/fire")
        assert refused.status_code == 503, refused.text
        assert "not fired: the store cannot record runs now (database or disk is full)" in refused.json()["error"]["message"]

        filler.unlink()
        poll(lambda: "writable again" in server.log_text(), timeout=30, what="the ledger to be written again")
        healthy = poll(lambda: (r := healthz(server)).status_code == 200 and r, timeout=30, what="/healthz 200")
        store = healthy.json()["store"]
        assert (store["state"], store["error"], store["since"], healthy.json()["status"]) == ("ok", None, None, "ok")
        fired = op.post("/inspect/schedules/tick-1/fire")
        assert fired.status_code == 202, fired.text
        answered.append(fired.json()["run_id"])
    finally:
        op.close()
        stopped = server.stop()
    assert stopped == 0, server.log_text()
    assert "run not written to the ledger" not in server.log_text()

    # Every slot between the first and the last fired once and is in the ledger, through
    # the whole time the disk was full; so are the runs Run now answered for.
    rows = ledger(db, "SELECT id, name, scheduled_at, trigger FROM runs")
    assert {row[0] for row in rows} >= set(answered)
    for i in range(EVERY_SECOND):
        slots = sorted(int(row[2]) for row in rows if row[1] == f"tick-{i}" and row[3] == "self")  # type: ignore[call-overload]  # (integer microseconds)
        assert len(slots) == len(set(slots)), f"tick-{i}: a slot recorded twice"
        expected = (slots[-1] - slots[0]) // 1_000_000 + 1
        assert len(slots) == expected, f"tick-{i}: {expected - len(slots)} slot(s) missing from the ledger"
        assert timedelta(microseconds=slots[-1] - slots[0]) > timedelta(seconds=3)


RECORDING = textwrap.dedent(
    """
    from backend import define_schedule

    def record(ctx):  # each start of a handler, one line, in a file off the full disk
        with open({handled!r}, "a") as f:
            f.write(f"{{ctx.name}} {{ctx.scheduled_at.isoformat()}}\\n")

    {schedules}
    """
)


def test_serve_on_a_disk_already_full_says_so_at_once_in_one_line(root: Path, small_disk: Path) -> None:
    # It was silent 25-50 s, then said "disk I/O error"; a new store's gave a traceback.
    db = small_disk / "state.db"
    server = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{db}")
    try:
        poll(lambda: count_runs(db) > 0, timeout=20, what="the serve to fire")
    finally:
        assert server.stop() == 0
    fill(small_disk)
    for store, said in (
        (db, f'schedtui: cannot open the store "{db}": '),
        (small_disk / "new" / "state.db", f'schedtui: cannot write the firing lock "{small_disk}/new/state.db.firing-lock": '),
    ):
        began = time.monotonic()
        refused = subprocess.run(serve_argv(store), cwd=root, env=cli_env(), capture_output=True, text=True, timeout=120)
        assert time.monotonic() - began < 10, refused.stderr
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        last = refused.stderr.splitlines()[-1]
        assert last.startswith(said) and last.endswith(("its disk is full", "No space left on device")), last


def test_a_full_disk_then_a_restart_fires_no_slot_again_and_forgets_no_run(tmp_path: Path, roomy_disk: Path) -> None:
    """serve stopped while the disk is full keeps the runs it could not write (in the reserve
    beside the store) and exits 1; the next serve writes them to the ledger before it catches
    up, so no slot that ran fires again (backfill="all") or is recorded missed ("skip")."""
    handled, db = tmp_path / "handled.txt", roomy_disk / "state.db"
    schedules = "\n".join(
        f'{policy}_{i} = define_schedule(name="{policy}-{i}", cron="* * * * * *", timezone="UTC", handler=record, '
        f'backfill="{policy}")'
        for policy in ("all", "skip") for i in range(2)
    )  # fmt: skip
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "rec.cron.py").write_text(RECORDING.format(handled=str(handled), schedules=schedules))
    first = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "first")
    try:
        poll(lambda: count_runs(db) >= 8, timeout=30, what="a few runs")
        filler = fill(roomy_disk)
        poll(lambda: healthz(first).json()["store"]["waiting"] >= 12, timeout=30, what="runs waiting for the disk")
        first.process.send_signal(signal.SIGINT)
        first_code = first.process.wait(60)
    finally:
        if first.process.poll() is None:
            first.process.kill()
    first_log = first.log_text()
    filler.unlink()
    since = (datetime.now(UTC) - _dt_us(0)) // timedelta(microseconds=1)
    second = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{db}", "--instance", "second")
    try:
        live = f"SELECT DISTINCT name FROM runs WHERE instance = 'second' AND scheduled_at > {since}"
        poll(lambda: len(ledger(db, live)) == 4, timeout=30, what="the second serve to fire every schedule")
    finally:
        second_code = second.stop()

    starts = handled.read_text().splitlines()
    assert len(starts) == len(set(starts)), [s for s in starts if starts.count(s) > 1]  # no slot ran twice
    rows = {(name, datetime.fromisoformat(iso(_dt_us(us)))): status for name, us, status, _ in ledger(db)}  # type: ignore[arg-type]  # us: an int; iso() of one: a str
    ran = {(name, datetime.fromisoformat(at)) for name, at in (line.split() for line in starts)}
    assert {key: rows.get(key) for key in ran} == dict.fromkeys(ran, "succeeded"), "a run that ran is not in the ledger"
    for name in ("all-0", "all-1", "skip-0", "skip-1"):  # each slot from the first to the last once
        slots = sorted(at for n, at in rows if n == name)
        assert len(slots) == (slots[-1] - slots[0]).total_seconds() + 1, name
    kept = int(re.findall(r"kept (\d+) run\(s\) in its reserve", first_log)[0])
    assert kept >= 12, first_log
    assert first_code == 1, first_log
    assert first_log.rstrip().splitlines()[-1].startswith(f"schedtui: stopped with {kept} run(s) not written to the ledger"), first_log
    assert f"{kept} run(s) kept by an earlier process" in second.log_text()
    assert second_code == 0, second.log_text()


def _dt_us(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


# ---------------------------------------------------------------------------------------
# /healthz, in process (the state it reports, without racing a real process's exit)
# ---------------------------------------------------------------------------------------
async def test_healthz_reports_the_store_and_each_instance_and_503_once_the_file_is_gone(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, tmp_path: Path
) -> None:
    async def work(ctx: object) -> None:
        pass

    engine = make_engine([define_schedule(name="minutely", cron="* * * * *", timezone="UTC", handler=work)])
    await engine.start()
    clock.advance(60)
    await engine.quiesce()
    (fired,) = [r for r in await engine.store.list_runs("minutely", limit=5)]
    transport = httpx.ASGITransport(app=create_app(EmbeddedBackend(engine), token="op"))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        clock.advance(2.5)
        (beat,) = await engine.store.fleet()
        ok = await c.get("/healthz")  # no token needed
        assert ok.status_code == 200
        assert ok.json() == {
            "status": "ok",
            "instance": engine.instance,
            "coordination": "single",
            "store": {"kind": "sqlite", "state": "ok", "error": None, "waiting": 0, "since": None},
            "instances": [
                {
                    "name": engine.instance,
                    "host": engine.host,
                    "pid": os.getpid(),
                    "heartbeat_at": iso(beat.heartbeat_at),
                    "heartbeat_age_s": round((clock.now() - beat.heartbeat_at).total_seconds(), 1),
                    "last_fired_at": iso(fired.fired_at),
                    "role": "firing",
                    "coordination": "single",
                    "clock_offset_s": None,  # (SQLite: not measured)
                    "clock_off": False,
                    "stands_down": None,
                }
            ],
            "now": iso(clock.now()),
        }
        assert Health.from_json(ok.json()).to_json() == ok.json()  # what a remote client reads back

        (tmp_path / "state.db").unlink()
        with pytest.raises(Unavailable, match="deleted or replaced"):
            await engine.store.set_state(ScheduleState("minutely", False, "op", clock.now()))
        gone = await c.get("/healthz")
        assert gone.status_code == 503
        assert gone.json()["status"] == "lost"
        assert gone.json()["store"]["error"] == "the store file was deleted or replaced while in use"
        assert str(tmp_path) not in gone.text and "op" not in gone.headers.get("www-authenticate", "")


# ---------------------------------------------------------------------------------------
# a closed run stays closed: so an engine must never close its own run that just finished
# ---------------------------------------------------------------------------------------
class SlowLook(SQLiteStore):
    """A valid store whose instances() answers only once ``until()`` holds: so a look for
    abandoned runs (running runs, then instances) overlaps the finish of a run it read as
    running, as a slow read does."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.until: Callable[[], bool] | None = None
        self.read = asyncio.Event()

    async def instances(self) -> dict[str, Beat]:
        beats = await super().instances()
        self.read.set()
        while self.until is not None and not self.until():
            await asyncio.sleep(0)  # yield (no time passes), so the run finishes in between
        return beats


async def test_an_engine_does_not_close_its_own_run_that_finished_while_it_looked(
    make_engine: Callable[..., Engine], clock: ManualClock, tmp_path: Path
) -> None:
    release = asyncio.Event()

    async def held(ctx: object) -> None:
        await release.wait()

    store = SlowLook(tmp_path / "slow.db")
    engine = make_engine([define_schedule(name="job", cron="* * * * *", timezone="UTC", handler=held)], store=store)
    await engine.start()
    running = expect(engine, lambda r: r.status == "running" and r.fired_at is not None)
    clock.advance(60)
    run = await running
    await engine.flush()  # its "running" row is in the ledger
    store.until = lambda: run.id not in engine.launcher.active  # the run is done on the engine
    look = asyncio.ensure_future(engine.close_abandoned())
    await store.read.wait()  # it has read the run as running, and the instances...
    release.set()  # ...and the run finishes before it goes on
    assert await look == []
    await engine.quiesce()
    stored = await engine.get_run(run.id)
    assert (stored.status, stored.error_tag, stored.error_message) == ("succeeded", None, None)


def test_the_mount_that_holds_a_store_is_read_from_the_kernels_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The longest mount point above the file, the last mounted there, with its type after
    the optional fields; a mount point's space is written ``\\040``."""
    from backend.store.sqlite import file as store_file

    if sys.platform == "linux":  # the machine's own table first: the folder of a test is on some mount
        mount = store_file.mount_of(tmp_path / "state.db")
        assert mount is not None and str(tmp_path).startswith(mount[0]) and mount[1] not in ("", "?"), mount
    table = tmp_path / "mountinfo"
    table.write_text(textwrap.dedent("""\
        27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
        40 27 0:50 / /srv rw,relatime shared:7 - ext4 /dev/vdb rw
        41 40 0:51 / /srv/shared rw,relatime shared:8 master:2 - nfs4 files:/export rw,vers=4.2
        42 41 0:52 / /srv/shared/my\\040dir rw,relatime - fuse.sshfs me@host:/x rw
        43 40 0:53 / /srv/shared-not rw,relatime - ext4 /dev/vdc rw
        44 40 0:54 / /srv/shared rw,relatime - ext4 /dev/vdd rw
        45 27 0:55 / /srv/odd rw,relatime
    """))
    monkeypatch.setattr(store_file, "MOUNTINFO", str(table))
    assert store_file.mount_of(Path("/srv/shared/my dir/state.db")) == ("/srv/shared/my dir", "fuse.sshfs")
    assert store_file.mount_of(Path("/srv/shared-not/state.db")) == ("/srv/shared-not", "ext4")
    assert store_file.mount_of(Path("/srv/shared/state.db")) == ("/srv/shared", "ext4")  # mounted over the nfs4
    assert store_file.mount_of(Path("/srv/odd/state.db")) == ("/srv", "ext4")  # (a line without a type: skipped)
    assert store_file.mount_of(Path("/var/state.db")) == ("/", "ext4")
    monkeypatch.setattr(store_file, "MOUNTINFO", str(tmp_path / "missing"))
    assert store_file.mount_of(Path("/srv/state.db")) is None


def test_a_store_on_a_network_filesystem_is_warned_of_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite keeps apart the processes of one machine only: a file on NFS (or SMB, 9p,
    sshfs…) that another machine opens too may be fired twice or corrupted."""
    from backend.store.sqlite import file as store_file

    async def open_and_close(path: Path) -> None:
        store = SQLiteStore(path)
        await store.open()
        await store.close()

    folder = (tmp_path / "share").resolve()
    folder.mkdir()
    asyncio.run(open_and_close(folder / "local.db"))  # the machine's own table: a local disk
    assert [r for r in caplog.records if "network filesystem" in r.getMessage()] == []
    table = tmp_path / "mountinfo"
    table.write_text(f"27 1 254:0 / / rw - ext4 /dev/vda rw\n41 27 0:51 / {folder} rw - nfs4 files:/export rw\n")
    monkeypatch.setattr(store_file, "MOUNTINFO", str(table))
    for _ in range(2):
        asyncio.run(open_and_close(folder / "state.db"))
    [warning] = [r.getMessage() for r in caplog.records if "network filesystem" in r.getMessage()]
    assert warning.startswith(f'the store "{folder / "state.db"}" is on a network filesystem (nfs4, mounted at {folder})')
    assert "through PostgreSQL" in warning


def test_a_store_and_the_files_beside_it_are_made_their_owners_alone(tmp_path: Path) -> None:
    """Under the usual umask (022), the store's folder was 0755 and its files 0644: every
    local user could read what handlers printed, payloads and the audit log (outside
    security review). Now 0700 and 0600, as a PostgreSQL data folder; a store given a mode
    of its own (shared with a group) lends it to the files made beside it."""
    path = tmp_path / "app" / ".schedtui" / "state.db"

    async def fire_a_while() -> dict[str, int]:
        engine = Engine([], f"sqlite:///{path}", clock=ManualClock(datetime(2026, 3, 2, tzinfo=UTC)), shutdown_grace=0)
        await engine.start()
        try:
            folder = path.parent
            return {p.name: os.stat(p).st_mode & 0o777 for p in [folder, *folder.iterdir()]}
        finally:
            await engine.stop()

    was = os.umask(0o022)
    try:
        modes = asyncio.run(fire_a_while())
        assert modes == {
            ".schedtui": 0o700, "state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600,
            "state.db.firing-lock": 0o600, "state.db.reserve": 0o600,
        }, {name: oct(mode) for name, mode in modes.items()}  # fmt: skip
        assert os.stat(path.parent.parent).st_mode & 0o777 == 0o755  # (only the store's own folder)
        path.chmod(0o640)
        for side in ("state.db.firing-lock", "state.db.reserve"):
            (path.parent / side).unlink()
        modes = asyncio.run(fire_a_while())
        assert (modes["state.db.firing-lock"], modes["state.db.reserve"], modes["state.db-shm"]) == (0o640, 0o640, 0o640)
    finally:
        os.umask(was)


def test_a_store_on_a_read_only_filesystem_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store on a read-only mount (a backup's snapshot) cannot be opened even to read it
    (SQLite makes its log's shared memory beside it): every verb said only "unable to open
    database file" (outside attack: the store's data over its life)."""
    from backend.store.sqlite import file as store_file

    statvfs = os.statvfs

    def read_only(folder: Path) -> os.statvfs_result:
        real = statvfs(folder)
        return os.statvfs_result((*real[:8], real.f_flag | os.ST_RDONLY, real.f_namemax))

    with monkeypatch.context() as patched:
        patched.setattr(os, "statvfs", read_only)
        said = store_file.explain(sqlite3.OperationalError("unable to open database file"), tmp_path)
    assert said.startswith("unable to open database file: its folder is on a read-only filesystem"), said
    assert "copy the store (with its -wal file) to a writable folder" in said
    with monkeypatch.context() as patched:
        patched.setattr(os, "access", lambda *args, **kwargs: False)  # (root may write anywhere: as another user)
        said = store_file.explain(sqlite3.OperationalError("unable to open database file"), tmp_path)
    assert f'this user cannot write in its folder "{tmp_path}"' in said
    assert store_file.explain(sqlite3.OperationalError("unable to open database file"), tmp_path) == (
        "unable to open database file"
    )
