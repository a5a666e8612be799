"""The job queue across real ``schedtui serve`` processes on one real PostgreSQL database,
on the real clock: the fleet-wide cap, a SIGKILLed worker, a PostgreSQL restart, and 50
concurrent sends of one key. Handlers write what they do to a log file (one line per
start and end, appended whole); every check reads that log and the store with SQL. Tests
wait by polling a condition against a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from backend import connect
from tests import pg
from tests.servers import Server, poll, start_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

JOBS = """
    import asyncio
    import os
    import time
    from pathlib import Path

    from backend import define_queue

    LOG = Path(__file__).resolve().parent.parent / "jobs.log"


    def note(what, job):
        with open(LOG, "a") as f:  # one short line per write: appended whole
            f.write(f"{{what}} {{job.id}} {{job.attempt}} {{os.getpid()}} {{time.time():.6f}}\\n")


    async def timed(job):
        note("start", job)
        await asyncio.sleep(job.payload.get("sleep", 0))
        note("end", job)


    async def hangs_first(job):
        note("start", job)
        if job.attempt == 1:
            await asyncio.sleep(3600)
        note("end", job)


    capped = define_queue(name="capped", handler=timed, concurrency={cap})
    victim = define_queue(name="victim", handler=hangs_first, attempts=3)
    work = define_queue(name="work", handler=timed, concurrency=8)
"""


@dataclass(frozen=True)
class Line:
    what: str
    job: str
    attempt: int
    pid: int
    at: float


class Fleet:
    def __init__(self, root: Path, url: str, cap: int = 2) -> None:
        self.root = root
        self.url = url
        self.servers: list[Server] = []
        (root / "schedules").mkdir(exist_ok=True)
        (root / "schedules" / "fleet.jobs.py").write_text(textwrap.dedent(JOBS.format(cap=cap)))

    def start(self, name: str) -> Server:
        server = start_server(self.root, "--schedules", "schedules", "--store", self.url, "--instance", name)
        self.servers.append(server)
        return server

    def lines(self) -> list[Line]:
        path = self.root / "jobs.log"
        if not path.exists():
            return []
        out = []
        for raw in path.read_text().splitlines():
            what, job, attempt, pid, at = raw.split()
            out.append(Line(what, job, int(attempt), int(pid), float(at)))
        return out

    def ended(self) -> set[str]:
        return {line.job for line in self.lines() if line.what == "end"}

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()

    def send(self, queue: str, payloads: list[Any]) -> list[str]:
        async def go() -> list[str]:
            async with connect(self.url) as st:
                sent = await st.jobs.send_many(queue, [{"payload": p} for p in payloads])
            return [s.id for s in sent]

        return asyncio.run(go())

    def send_paced(self, queue: str, payloads: list[Any], every: float) -> list[str]:
        """One send at a time, ``every`` seconds apart (a steady load, not a wait)."""

        async def go() -> list[str]:
            sent = []
            async with connect(self.url) as st:
                for payload in payloads:
                    sent.append((await st.jobs.send(queue, payload)).id)
                    await asyncio.sleep(every)
            return sent

        return asyncio.run(go())

    def pause(self, queue: str) -> None:
        async def go() -> None:
            async with connect(self.url) as st:
                await st.jobs.pause(queue)

        asyncio.run(go())

    def assert_healthy_logs(self) -> None:
        for server in self.servers:
            text = server.log_text()
            assert "Traceback" not in text and "crashed" not in text, text


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(cap: int = 2) -> Fleet:
        made.append(Fleet(tmp_path, pg_url, cap))
        return made[-1]

    yield make
    for f in made:
        for server in f.servers:
            server.stop()


def max_overlap(lines: list[Line]) -> int:
    events = sorted((line.at, 1 if line.what == "start" else -1) for line in lines)
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_two_instances_never_run_more_than_the_cap(fleet: Callable[..., Fleet]) -> None:
    f = fleet(cap=3)
    servers = [f.start("a"), f.start("b")]

    async def burst(server: Server) -> list[str]:
        # Five jobs of 0.3 s at once, for a cap of 3; sent through one instance's API, whose
        # workers hear of them first; the other hears through PostgreSQL and races for seats.
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            answers = await asyncio.gather(*(http.post("/inspect/queues/capped/jobs", json={"payload": {"sleep": 0.3}}) for _ in range(5)))
        return [a.json()["id"] for a in answers]

    ids: list[str] = []
    for round_ in range(8):
        sent = asyncio.run(burst(servers[round_ % 2]))
        ids += sent

        def ran(sent: list[str] = sent) -> bool:
            return f.ended() >= set(sent)

        poll(ran, timeout=30, what="a burst to run")
    lines = f.lines()
    assert max_overlap(lines) == 3, "the queue ran more than its cap of 3 at once (or never reached it)"
    per_pid = Counter(line.pid for line in lines if line.what == "start")
    assert len(per_pid) == 2, per_pid  # both instances held seats
    assert sorted(Counter(line.job for line in lines if line.what == "end").values()) == [1] * 40
    assert f.sql("SELECT count(*) FROM schedtui_jobs") == [(0,)]
    assert f.sql("SELECT count(*) FROM schedtui_job_attempts WHERE status = 'succeeded'") == [(40,)]
    for server in servers:
        assert server.stop() == 0
    f.assert_healthy_logs()


def test_a_sigkilled_workers_job_is_retried_once_elsewhere(fleet: Callable[..., Fleet]) -> None:
    f = fleet()
    servers = {server.process.pid: server for server in (f.start("a"), f.start("b"))}
    (job,) = f.send("victim", [{}])
    first = poll(lambda: next((line for line in f.lines() if line.job == job), None), timeout=30, what="the first attempt")
    assert first.attempt == 1 and first.pid in servers
    servers[first.pid].process.send_signal(signal.SIGKILL)
    servers[first.pid].process.wait(10)
    done = poll(lambda: next((line for line in f.lines() if line.what == "end"), None), timeout=60, what="the retry")
    (survivor,) = [pid for pid in servers if pid != first.pid]
    assert (done.job, done.attempt, done.pid) == (job, 2, survivor)
    starts = [line for line in f.lines() if line.what == "start"]
    assert [(line.attempt, line.pid) for line in starts] == [(1, first.pid), (2, survivor)]  # once, elsewhere
    # The handler's "end" line comes before the worker records the attempt's end: wait for the record.
    query = "SELECT attempt, status, error_tag FROM schedtui_job_attempts WHERE job_id = %s ORDER BY seq"

    def recorded() -> list[tuple[Any, ...]] | None:
        rows = f.sql(query, (job,))
        return rows if len(rows) == 2 and rows[1][1] != "running" else None

    attempts = poll(recorded, timeout=30, what="the retry's end to be recorded")
    assert attempts == [(1, "failed", "abandoned"), (2, "succeeded", None)]
    assert done.at - first.at < 60
    assert servers[survivor].stop() == 0
    assert "Traceback" not in servers[survivor].log_text()


def test_a_postgres_restart_loses_no_job_and_runs_none_twice(fleet: Callable[..., Fleet], pg_server: pg.PgServer) -> None:
    if not pg_server.owned:
        pytest.skip("the server comes from SCHEDTUI_TEST_DSN: this test cannot restart it")
    f = fleet()
    a, b = f.start("a"), f.start("b")
    before = f.send("work", [{"sleep": 0.05}] * 400)
    poll(lambda: len(f.ended()) >= 50, timeout=60, what="the drain to be under way")
    pg_server.pg_ctl("restart")
    assert len(f.ended()) < 400, "the restart came after the drain: it proves nothing"
    after = f.send("work", [{"sleep": 0.0}] * 100)  # sent once it is back
    poll(lambda: f.ended() >= set(before) | set(after), timeout=120, what="every job to run")
    ends = Counter(line.job for line in f.lines() if line.what == "end")
    assert set(ends) == set(before) | set(after)
    assert set(ends.values()) == {1}, [job for job, n in ends.items() if n > 1][:5]
    assert f.sql("SELECT count(*) FROM schedtui_jobs") == [(0,)]
    succeeded = f.sql("SELECT job_id, count(*) FROM schedtui_job_attempts WHERE status = 'succeeded' GROUP BY job_id")
    assert len(succeeded) == 500 and {n for _, n in succeeded} == {1}
    assert [s.process.poll() for s in (a, b)] == [None, None]
    for server in (a, b):
        assert server.stop() == 0
    f.assert_healthy_logs()


def test_fifty_concurrent_sends_of_one_key_over_http_give_one_job(fleet: Callable[..., Fleet]) -> None:
    f = fleet()
    servers = [f.start("a"), f.start("b")]
    f.pause("capped")  # keep the job: it is what we count

    async def sends() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as http:
            return await asyncio.gather(
                *(http.post(f"{servers[i % 2].url}/inspect/queues/capped/jobs", json={"payload": i, "key": "once"}) for i in range(50))
            )

    answers = asyncio.run(sends())
    assert sorted(r.status_code for r in answers) == [200] * 49 + [201]
    assert len({r.json()["id"] for r in answers}) == 1
    assert f.sql("SELECT count(*) FROM schedtui_jobs WHERE key = 'once'") == [(1,)]
    for server in servers:
        assert server.stop() == 0
    f.assert_healthy_logs()
