"""Locks across real processes on a real PostgreSQL, on the real clock.

* A holder frozen (SIGSTOP) past its lease: the next holder takes the lock and writes;
  the frozen one, woken (SIGCONT), has its fenced write refused.
* Twenty processes race for one lock: exactly one holder at a time, tokens strictly
  increasing in the order the holders came.

The processes use the synchronous client (``connect_sync``), so these also cover the
twin. Tests wait by polling (the processes' output, the database), never by sleeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from tests import pg
from tests.servers import poll

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]

HOLDER = """
    import sys
    import psycopg
    from backend import StaleLease, connect_sync

    url = sys.argv[1]

    def work(lease):
        with psycopg.connect(url) as conn:
            with conn.transaction():
                lease.fence(conn, "ledger")
                conn.execute("INSERT INTO ledger (writer, token) VALUES ('A', %s)", (lease.token,))
            print(f"wrote {lease.token}", flush=True)
            sys.stdin.readline()  # frozen here by the test, then let go on
            try:
                with conn.transaction():
                    lease.fence(conn, "ledger")
                    conn.execute("INSERT INTO ledger (writer, token) VALUES ('A-again', %s)", (lease.token,))
                print("written again", flush=True)
            except StaleLease as exc:
                print(f"refused: {exc}", flush=True)

    with connect_sync(url, instance="A") as st:
        result = st.locks.with_lock("ledger-lock", work, ttl=2)
        print(f"acquired={result.acquired} error={type(result.error).__name__}", flush=True)
"""

TAKER = """
    import sys, time
    import psycopg
    from backend import connect_sync

    url = sys.argv[1]

    def work(lease):
        with psycopg.connect(url) as conn, conn.transaction():
            lease.fence(conn, "ledger")
            conn.execute("INSERT INTO ledger (writer, token) VALUES ('B', %s)", (lease.token,))
        return lease.token

    with connect_sync(url, instance="B") as st:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            result = st.locks.with_lock("ledger-lock", work, ttl=2)
            if result.acquired:
                assert result.error is None, result.error
                print(f"wrote {result.value}", flush=True)
                break
            time.sleep(0.05)  # the holder is frozen: try again until its lease runs out
"""

RACER = """
    import os, sys, time
    import psycopg
    from backend import connect_sync

    url, me, go, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    got = 0
    with connect_sync(url, instance=me) as st, psycopg.connect(url, autocommit=True) as conn:
        def work(lease):
            inside = conn.execute("UPDATE occupancy SET n = n + 1 RETURNING n").fetchone()[0]
            conn.execute(
                "INSERT INTO holds (token, who, started, occupancy) VALUES (%s, %s, clock_timestamp(), %s)",
                (lease.token, me, inside),
            )
            time.sleep(0.003)  # the work
            conn.execute("UPDATE holds SET ended = clock_timestamp() WHERE token = %s", (lease.token,))
            conn.execute("UPDATE occupancy SET n = n - 1")

        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while got < want and time.monotonic() < deadline:
            result = st.locks.with_lock("race", work, ttl=10)
            if result.acquired:
                assert result.error is None, result.error
                got += 1
            else:
                time.sleep(0.001)
    print(f"got {got}", flush=True)
"""


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    return out


class Proc:
    """A Python script in a real process; its stdout lines are read as they come."""

    def __init__(self, root: Path, script: str, *args: str, name: str) -> None:
        path = root / f"{name}.py"
        if not path.exists():
            path.write_text(textwrap.dedent(script))
        self.out_path = root / f"{name}-{os.getpid()}-{id(self)}.out"
        self.err_path = self.out_path.with_suffix(".err")
        self.proc = subprocess.Popen(
            [sys.executable, str(path), *args], cwd=root, env=env(), stdin=subprocess.PIPE,
            stdout=self.out_path.open("w"), stderr=self.err_path.open("w"), text=True, preexec_fn=pg.die_with_parent,
        )  # fmt: skip

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def line(self, prefix: str, timeout: float = 30) -> str:
        def found() -> str | None:
            if self.proc.poll() not in (None, 0):
                pytest.fail(f"process exited {self.proc.returncode}:\n{self.err_path.read_text()}")
            return next((line for line in self.lines() if line.startswith(prefix)), None)

        return poll(found, timeout=timeout, what=f'a line "{prefix}…"')

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        assert code == 0, self.err_path.read_text()
        return code


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    made: list[Proc] = []
    yield made
    for p in made:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGCONT)
            p.proc.kill()
            p.proc.wait()


def sql(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def test_a_holder_frozen_past_its_lease_has_its_fenced_write_refused_after_the_next_holders(
    pg_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    sql(pg_url, "CREATE TABLE ledger (id serial PRIMARY KEY, writer text NOT NULL, token bigint NOT NULL)")
    holder = Proc(tmp_path, HOLDER, pg_url, name="holder")
    procs.append(holder)
    first = int(holder.line("wrote ").split()[1])
    holder.proc.send_signal(signal.SIGSTOP)  # frozen: it renews nothing from now on
    try:
        taker = Proc(tmp_path, TAKER, pg_url, name="taker")
        procs.append(taker)
        second = int(taker.line("wrote ", timeout=60).split()[1])
        taker.wait()
    finally:
        holder.proc.send_signal(signal.SIGCONT)
    assert second > first
    holder.stdin.write("go on\n")
    holder.stdin.flush()
    refused = holder.line("refused: ")
    assert refused == (
        f'refused: write to "ledger" refused for lock "ledger-lock" token {first}: token {second} has already written to it'
    )
    assert holder.line("acquired=") == "acquired=True error=LeaseLost"
    holder.wait()
    assert sql(pg_url, "SELECT writer, token FROM ledger ORDER BY id") == [("A", first), ("B", second)]
    assert sql(pg_url, "SELECT token FROM schedtui_lock_fences WHERE resource = 'ledger'") == [(second,)]


def test_twenty_processes_racing_for_one_lock_hold_it_one_at_a_time_with_growing_tokens(
    pg_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    sql(pg_url, "CREATE TABLE occupancy (n int NOT NULL); INSERT INTO occupancy VALUES (0)")
    sql(pg_url, "CREATE TABLE holds (token bigint PRIMARY KEY, who text, started timestamptz, ended timestamptz, occupancy int)")
    go = tmp_path / "go"
    want = 2
    for i in range(20):
        procs.append(Proc(tmp_path, RACER, pg_url, f"p{i:02d}", str(go), str(want), name="racer"))
    for p in procs:
        p.line("ready", timeout=120)
    go.touch()  # all twenty start racing at once
    for p in procs:
        p.wait(timeout=120)
    holds = sql(pg_url, "SELECT token, who, started, ended, occupancy FROM holds ORDER BY started")
    assert {p.lines()[-1] for p in procs} == {f"got {want}"}
    assert len(holds) == 20 * want and len({who for _, who, *_ in holds}) == 20
    assert {occupancy for *_, occupancy in holds} == {1}, "two holders were inside at once"
    tokens = [token for token, *_ in holds]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "tokens must grow in the order of holding"
    for (_, _, _, ended, _), (_, _, started, _, _) in zip(holds, holds[1:], strict=False):
        assert ended < started, "a hold began before the previous one ended"
