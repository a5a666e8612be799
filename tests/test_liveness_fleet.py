"""Never twice at once, with real ``schedtui serve`` processes on a real PostgreSQL and the
real clock: a worker cut off from the database (a TCP relay that freezes) stops its work
before another takes it over; one whose sync handlers cannot be stopped ends itself;
instances in two PID namespaces on one host (``unshare --pid``) do not judge each other's
pids; a sync handler past ``max_runtime`` keeps its seat until it returns, and a schedule
run's overlap place on every instance; an instance is judged by its own take-over window
where that is the longer.

Handlers append one line per start, stop and end to a log file (pid and wall time); the
checks read that log and the store. The windows are short (``--abandon-after 6``: the
renewal bound is 4 s), so each test takes some ten to twenty seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.servers import Server, cli_env, poll, readline_within, start_server
from tests.tcp_relay import relay_to, via
from tests.test_cli import Terminal
from tests.test_jobs_fleet import Fleet, Line

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WINDOW = "6"  # --abandon-after: take-over after 6 s of silence, a worker stops after 4 s

JOBS = """
    import asyncio
    import os
    import time
    from pathlib import Path

    from backend import define_queue

    LOG = Path(__file__).resolve().parent.parent / "jobs.log"


    def note(what, job):
        with open(LOG, "a") as f:  # one short line per write: appended whole
            f.write(f"{what} {job.id} {job.attempt} {os.getpid()} {time.time():.6f}\\n")


    async def waits(job):
        note("start", job)
        try:
            if "until" in job.payload:  # until the test has seen what it waits for
                while not Path(job.payload["until"]).exists():
                    await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(job.payload["sleep"])
        except asyncio.CancelledError:
            note("stop", job)
            raise
        note("end", job)


    def blocks(job):
        note("start", job)
        if job.attempt == 1:
            time.sleep(job.payload["sleep"])
        note("end", job)


    async def blocks_the_loop(job):
        note("start", job)
        if job.attempt == 1:  # time.sleep in an async def: the event loop stops with it
            for _ in range(int(job.payload["sleep"] * 10)):
                time.sleep(0.1)
                note("tick", job)
        note("end", job)


    async def stubborn(job):
        note("start", job)
        while job.attempt == 1:  # ignores its cancellation: only its process's end stops it
            try:
                await asyncio.sleep(0.02)
                note("tick", job)
            except asyncio.CancelledError:
                note("ignored", job)
        note("end", job)


    work = define_queue(name="work", handler=waits, concurrency=8, attempts=3)
    stubborn_queue = define_queue(name="stubborn", handler=stubborn, attempts=3)
    loop_blocker = define_queue(name="loop_blocker", handler=blocks_the_loop, attempts=3)
    threads = define_queue(name="threads", handler=blocks, concurrency=8, attempts=3)
    capped = define_queue(name="capped", handler=blocks, concurrency=1, attempts=3, max_runtime=1)
    brief = define_queue(name="brief", handler=waits, concurrency=2, attempts=3)
"""


class Workers(Fleet):
    """The job fleet of ``test_jobs_fleet``, with the queues above, short windows, and
    processes started by hand (``others``: killed at the end too)."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root, url)
        (root / "schedules" / "fleet.jobs.py").write_text(textwrap.dedent(JOBS))
        self.others: list[subprocess.Popen[str]] = []

    def start(self, name: str, url: str | None = None, *extra: str) -> Server:
        args = ["--schedules", "schedules", "--store", url or self.url, "--instance", name, "--abandon-after", WINDOW, *extra]
        server = start_server(self.root, *args)
        self.servers.append(server)
        return server

    def starts(self, pid: int | None = None) -> list[Line]:
        return [line for line in self.lines() if line.what == "start" and (pid is None or line.pid == pid)]

    def kill_all(self) -> None:
        for process in [server.process for server in self.servers] + self.others:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def workers(tmp_path: Path, pg_url: str) -> Iterator[Workers]:
    made = Workers(tmp_path, pg_url)
    yield made
    made.kill_all()


def no_overlap(lines: list[Line], job: str, died: dict[int, float] | None = None) -> list[tuple[float, float, int]]:
    """The attempts of ``job`` as (start, end, pid), checked never to overlap. An attempt
    with no end line ran until its process ``died`` (pid -> when), else for ever."""
    spans: list[tuple[float, float, int]] = []
    ends = {(line.attempt, line.pid): line.at for line in lines if line.job == job and line.what in ("stop", "end")}
    for line in lines:
        if line.job == job and line.what == "start":
            end = ends.get((line.attempt, line.pid), (died or {}).get(line.pid, float("inf")))
            spans.append((line.at, end, line.pid))
    spans.sort()
    for (_, end, pid), (start, _, other) in zip(spans, spans[1:], strict=False):
        assert end < start, f"job {job}: the attempt on pid {pid} ran until {end}, past the start on pid {other} at {start}"
    return spans


# ---------------------------------------------------------------------------------------
# a partition of one worker
# ---------------------------------------------------------------------------------------
def test_jobs_a_cut_off_worker_claimed_ahead_run_elsewhere_once_and_never_beside_it(workers: Workers) -> None:
    # Short jobs on a queue of two seats: the worker claims ahead (jobs running under its
    # token with no seat yet, waiting for one of its seats to free). It is cut off while it
    # holds some: it may start them only on its own seats within its lease, never after.
    with relay_to(workers.url) as relay:
        a = workers.start("a", via(workers.url, relay.port))
        jobs = workers.send("brief", [{"sleep": 0.02}] * 600)
        held = "SELECT id FROM schedtui_jobs WHERE queue = 'brief' AND status = 'running' AND instance = 'a' AND seat IS NULL"
        poll(lambda: workers.sql(held), timeout=60, every=0.01, what="a to claim jobs ahead")
        # Freeze while a holds some in the store (a moment later they may have had a seat).
        for _ in range(100):
            relay.freeze()
            frozen_at = time.time()
            ahead = {job for (job,) in workers.sql(held)}
            if ahead:
                break
            relay.thaw()
        assert ahead, "a held no job ahead at any freeze"
        workers.start("b")
        # A cycle of a's caught mid-statement holds its row locks on the server, which waits
        # for the rest of it with no timeout: b's beat ends that session, or b waits for ever.
        poll(lambda: set(jobs) <= workers.ended(), timeout=90, what="every job to end")
        lines = [line for line in workers.lines() if line.job in set(jobs)]
        late = [line for line in lines if line.pid == a.process.pid and line.what == "start" and line.at > frozen_at + 4]
        assert late == [], "a started a job past its lease's renewal bound"
        for job in jobs:
            no_overlap(lines, job)
        # The cap holds across both workers: never more than two handlers of the queue at once.
        running = most = 0
        for line in sorted(lines, key=lambda line: (line.at, line.what == "start")):
            running += 1 if line.what == "start" else -1
            most = max(most, running)
        assert most <= 2, f"{most} handlers of a queue of two seats ran at once"
        assert "LEASE LAPSED" in a.log_text()
    # Every job ran to its end (one whose end a could not hand in ran again, after).
    assert ahead and ahead <= workers.ended()


def test_a_worker_cut_off_from_the_store_stops_its_handlers_before_another_takes_them_over(workers: Workers) -> None:
    with relay_to(workers.url) as relay:
        a = workers.start("a", via(workers.url, relay.port))
        jobs = workers.send("work", [{"sleep": 25}] * 4)
        poll(lambda: len(workers.starts(a.process.pid)) == 4, timeout=30, what="a to run the four jobs")
        b = workers.start("b")
        relay.freeze()
        frozen_at = time.time()
        poll(lambda: len(workers.starts(b.process.pid)) == 4, timeout=40, what="b to take the four jobs over")
        lines = workers.lines()
        for job in jobs:
            (a_start, a_end, _), (b_start, _, _) = no_overlap(lines, job)
            assert a_end < frozen_at + 6, "a stopped its handler within the renewal bound"
            assert b_start > frozen_at + 4
        assert a.process.poll() is None  # async handlers are cancelled: the process goes on
        assert "LEASE LAPSED" in a.log_text()
        relay.thaw()
        poll(lambda: "lease renewed" in a.log_text(), timeout=30, what="a to renew its lease once the path is back")
    # Each first attempt was closed once, by the take-over (a's own lease_lost end, handed in
    # late, was refused: the job had been claimed again under a newer fence).
    firsts = workers.sql("SELECT error_tag, instance FROM schedtui_job_attempts WHERE attempt = 1")
    assert sorted(firsts) == [("abandoned", "a")] * 4


def test_a_cut_off_worker_whose_sync_handlers_cannot_stop_ends_itself_first(workers: Workers) -> None:
    with relay_to(workers.url) as relay:
        a = workers.start("a", via(workers.url, relay.port))
        jobs = workers.send("threads", [{"sleep": 20}] * 3)
        poll(lambda: len(workers.starts(a.process.pid)) == 3, timeout=30, what="a to run the three jobs")
        b = workers.start("b")
        relay.freeze()
        frozen_at = time.time()
        assert a.process.wait(15) == 75  # a thread cannot be stopped: the process ends itself
        ended_at = time.time()  # at the latest
        assert ended_at < frozen_at + 6, "it ended before the take-over window"
        assert "ENDING THE PROCESS: 3 sync handler(s) still run" in a.log_text()
        poll(lambda: len(workers.starts(b.process.pid)) == 3, timeout=40, what="b to take the jobs over")
        # b took the work over because a's pid was gone (dead, or a zombie: its threads were
        # no more), read from /proc when it decided, before it started anything: the proof
        # that no handler of a ran beside b's. (The test's own clock cannot order this: b
        # may start the jobs before this process has even reaped a.)
        reasons = workers.sql("SELECT error_message FROM schedtui_job_attempts WHERE attempt = 1")
        assert [reason for (reason,) in reasons] == [f"abandoned: instance a (pid {a.process.pid}) is no longer running"] * 3
        assert not [line for line in workers.lines() if line.pid == a.process.pid and line.what != "start"]
        for job in jobs:
            pids = [line.pid for line in workers.starts() if line.job == job]
            assert pids == [a.process.pid, b.process.pid]


def test_a_handler_ignoring_its_cancellation_ends_with_its_process_before_a_clock_ahead_takes_it_over(
    workers: Workers,
) -> None:
    """The lease's margin, a third of the window, is shared by two clocks and the stop: a's
    clock 0.45 s behind the database's, b's 0.45 s ahead (each within the limit), so b
    judges a silent 0.9 s early. With a sixth of the window allowed each clock, and 2 s for
    a handler that ignores its cancellation, a's process ended after b had started the job
    again beside it: the clocks took the whole margin, the stop's 2 s were past it."""
    with relay_to(workers.url) as relay:
        a = workers.start("a", via(workers.url, relay.port), "--clock-offset-ms", "-450")
        [job] = workers.send("stubborn", [{}])
        poll(lambda: workers.starts(a.process.pid), timeout=30, what="a to start the job")
        b = workers.start("b", None, "--clock-offset-ms", "450")
        relay.freeze()
        assert a.process.wait(15) == 75
        assert "ENDING THE PROCESS: 1 handler(s) ignored their cancellation" in a.log_text()
        taken_over_after(workers, job, a, b)


def test_an_async_handler_that_blocks_the_loop_past_the_lapse_ends_its_process_first(workers: Workers) -> None:
    """The heartbeat stops with the blocked loop, and so does the loop's own watch of the
    lease: before, the job's second attempt started elsewhere once the window had passed,
    beside the first (then this instance took the job back while the second ran)."""
    a = workers.start("a")
    [job] = workers.send("loop_blocker", [{"sleep": 20}])
    poll(lambda: workers.starts(a.process.pid), timeout=30, what="a to start the job")
    b = workers.start("b")
    assert a.process.wait(20) == 75
    assert "ENDING THE PROCESS: the event loop has been blocked for" in a.log_text()
    taken_over_after(workers, job, a, b)


def taken_over_after(workers: Workers, job: str, a: Server, b: Server) -> None:
    """b starts ``job``'s second attempt, after the last line a's first attempt wrote (its
    process has ended: nothing of it runs beside the second)."""
    poll(lambda: workers.starts(b.process.pid), timeout=40, what="b to take the job over")
    ran_on_a = [line.at for line in workers.lines() if line.pid == a.process.pid]
    [taken] = workers.starts(b.process.pid)
    assert (taken.job, taken.attempt) == (job, 2)
    assert max(ran_on_a) < taken.at, f"the first attempt ran on {max(ran_on_a) - taken.at:.2f}s beside the second"


# ---------------------------------------------------------------------------------------
# two PID namespaces on one host
# ---------------------------------------------------------------------------------------
def pid_unused_out_here() -> int:
    """A pid no process of this namespace has, half the pid space away from the next ones it
    hands out: the suite's own processes would take the whole time of a test to come near it.
    (A burn of a few thousand pids, as before, landed on a live pid of a busy CI host.)"""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    pid = (int(Path("/proc/sys/kernel/ns_last_pid").read_text()) + pid_max // 2) % pid_max
    while pid < 1000 or any(Path(f"/proc/{near}").exists() for near in range(pid - 50, pid + 50)):
        pid = (pid + 997) % pid_max
    return pid


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) here")
def test_instances_in_two_pid_namespaces_of_one_host_never_take_each_others_work(workers: Workers) -> None:
    log = workers.root / "ns.log"
    # Inside, the shell sets the namespace's next pid to one no process out here has (pids
    # 1, 2 ... are alive on any host), so the serve's pid there reads as dead out here. The
    # serve runs as the shell's child, not exec'd in its place: pid 1 is alive everywhere.
    serve = [sys.executable, "-m", "console.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--schedules",
             "schedules", "--store", workers.url, "--instance", "ns-b", "--abandon-after", WINDOW]  # fmt: skip
    chosen = pid_unused_out_here()
    script = f'echo {chosen - 1} > /proc/sys/kernel/ns_last_pid && "$@"; exit $?'
    inner = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh", *serve],
        cwd=workers.root, env=cli_env(), stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
    )  # fmt: skip
    workers.others.append(inner)
    assert inner.stdout is not None
    if not readline_within(inner.stdout, 30).startswith("schedtui: serving"):
        pytest.fail(f"the serve in its own PID namespace did not start in 30 s (unshare needs root): {log.read_text()}")
    release = workers.root / "release"  # the jobs run until the host instance has swept for a while
    jobs = workers.send("work", [{"until": str(release)}] * 4)
    poll(lambda: len(workers.starts()) == 4, timeout=30, what="ns-b to run the four jobs")
    inner_pid = workers.starts()[0].pid
    assert inner_pid == chosen != inner.pid  # its own pids inside the namespace
    beats = workers.sql("SELECT host, pid FROM schedtui_instances WHERE instance = 'ns-b'")
    assert beats[0][1] == inner_pid and not Path(f"/proc/{inner_pid}").exists(), "its pid is not dead out here"
    host = workers.start("host")
    first_beat = workers.sql("SELECT heartbeat_at FROM schedtui_instances WHERE instance = 'host'")[0][0]
    # Several rounds of the host's sweep (a beat every 1.3 s here) while ns-b's jobs run.
    poll(
        lambda: workers.sql("SELECT heartbeat_at FROM schedtui_instances WHERE instance = 'host'")[0][0]
        > first_beat + timedelta(seconds=4),
        timeout=30, what="the host instance to sweep for a few rounds",
    )  # fmt: skip
    assert len(workers.starts()) == 4, "the host instance re-ran ns-b's jobs"
    assert "no longer running" not in host.log_text()
    own = workers.sql("SELECT host FROM schedtui_instances WHERE instance = 'host'")[0][0]
    assert own.split("#")[:2] == beats[0][0].split("#")[:2] and own != beats[0][0]  # one host, two namespaces
    release.touch()
    poll(lambda: {line.job for line in workers.lines() if line.what == "end"} == set(jobs), timeout=30, what="the jobs to end")
    assert {(line.attempt, line.pid) for line in workers.starts()} == {(1, inner_pid)}


# ---------------------------------------------------------------------------------------
# a sync handler past max_runtime, in serve
# ---------------------------------------------------------------------------------------
def test_a_sync_handler_past_max_runtime_holds_its_seat_until_it_returns(workers: Workers) -> None:
    workers.start("a", None, "--job-backoff", "1")  # the timed-out attempt's retry after 1 s, not 10 s
    jobs = workers.send("capped", [{"sleep": 3}, {"sleep": 0}])
    poll(lambda: len([line for line in workers.lines() if line.what == "end"]) >= 3, timeout=60, what="the attempts to run")
    lines = workers.lines()
    running = most = 0
    for line in sorted(lines, key=lambda line: (line.at, line.what != "end")):
        running += 1 if line.what == "start" else -1
        most = max(most, running)
    assert most == 1, "two handlers of a queue with concurrency 1 ran at once"
    for job in jobs:
        no_overlap(lines, job)
    attempts = workers.sql(
        "SELECT attempt, status, error_tag, error_message FROM schedtui_job_attempts WHERE job_id = %s ORDER BY seq", (jobs[0],)
    )
    assert (attempts[0][1], attempts[0][2]) == ("failed", "timeout")
    assert "holding its place: it returned" in attempts[0][3]


# ---------------------------------------------------------------------------------------
# a schedule's overlap place across the fleet
# ---------------------------------------------------------------------------------------
#: What each schedule file below starts with: its handlers note their runs in the jobs' log.
NOTES = """
    import asyncio
    import os
    import time
    from pathlib import Path

    from backend import define_schedule

    HERE = Path(__file__).resolve().parent.parent
    LOG = HERE / "jobs.log"  # the jobs' format: the run as "schedule:run_id", attempt 1
    RELEASE = HERE / "release"


    def note(what, ctx):
        with open(LOG, "a") as f:
            f.write(f"{what} {ctx.name}:{ctx.run_id} 1 {os.getpid()} {time.time():.6f}\\n")

"""
SCHEDULES = NOTES + """

    def overruns(ctx):  # a sync handler past max_runtime: its thread runs on until the release
        note("start", ctx)
        while not RELEASE.exists():
            time.sleep(0.05)
        note("end", ctx)


    async def waits(ctx):
        note("start", ctx)
        while not RELEASE.exists():
            await asyncio.sleep(0.05)
        note("end", ctx)


    if OVERRUN:
        skipping = define_schedule(name="skipping", cron="* * * * * *", timezone="UTC", handler=overruns,
                                   max_runtime=1, on_overlap="skip")
        queueing = define_schedule(name="queueing", cron="* * * * * *", timezone="UTC", handler=overruns,
                                   max_runtime=1, on_overlap="queue")
    else:
        long = define_schedule(name="long", cron="* * * * * *", timezone="UTC", handler=waits, on_overlap="skip")
"""


def schedules(workers: Workers, *, overrun: bool) -> None:
    (workers.root / "schedules" / "fleet.cron.py").write_text(textwrap.dedent(SCHEDULES.replace("OVERRUN", str(overrun))))


def one_at_a_time(lines: list[Line], schedule: str) -> int:
    """The runs of ``schedule`` in the handlers' log, checked never to overlap; how many."""
    ends = {line.job: line.at for line in lines if line.what == "end"}
    spans = sorted((line.at, ends.get(line.job, float("inf")), line.job) for line in lines
                   if line.what == "start" and line.job.startswith(schedule + ":"))  # fmt: skip
    for (_, end, run), (start, _, other) in zip(spans, spans[1:], strict=False):
        assert end < start, f"{schedule}: run {run} ran until {end}, past the start of {other} at {start}"
    return len(spans)


def test_a_timed_out_handler_keeps_its_overlap_place_on_every_instance_until_it_returns(workers: Workers) -> None:
    """A sync handler past max_runtime is recorded ``timeout`` but runs on: before, only its
    own instance kept its place, and another started the schedule's next slot beside it."""
    schedules(workers, overrun=True)
    a = workers.start("a", None, "--clock-offset-ms", "-300")  # b claims each slot first
    poll(lambda: len(workers.starts(a.process.pid)) == 2, timeout=30, what="a to start both schedules")
    b = workers.start("b")

    def b_after_a() -> bool:
        skipped = workers.sql("SELECT count(*) FROM schedtui_runs WHERE name = 'skipping' AND instance = 'b'")[0][0]
        queued = workers.sql(
            "SELECT count(*) FROM schedtui_runs WHERE name = 'queueing' AND instance = 'b' AND fired_at IS NULL"
        )[0][0]
        return bool(workers.starts(b.process.pid)) or (skipped >= 2 and queued >= 2)

    poll(b_after_a, timeout=30, what="b to win slots of both schedules")
    assert not workers.starts(b.process.pid), "b started a run beside a's timed-out handler"
    # (Closed and held; a slot a claimed behind them holds its turn too, running, not started.)
    held = workers.sql(
        "SELECT name, status, error_tag FROM schedtui_runs WHERE instance = 'a' AND held AND status <> 'running' ORDER BY name"
    )
    assert held == [("queueing", "failed", "timeout"), ("skipping", "failed", "timeout")]
    skipped = workers.sql(  # (but for a placeholder of a slot b is about to skip)
        "SELECT status, error_tag, error_message FROM schedtui_runs WHERE name = 'skipping' AND instance = 'b' AND status <> 'running'"
    )
    assert {(status, tag) for status, tag, _ in skipped} == {("skipped", "overlap")}, skipped
    assert all("(on another instance) was still in flight" in message for _, _, message in skipped)
    (workers.root / "release").touch()
    # Once a's handlers return, b's queued slots run, one at a time, after them.
    poll(lambda: any(line.job.startswith("queueing:") for line in workers.starts(b.process.pid)), timeout=30,
         what="b to start its queued slots")
    poll(lambda: not workers.sql("SELECT 1 FROM schedtui_runs WHERE held AND status <> 'running'"), timeout=30,
         what="the places to be let go")
    lines = workers.lines()
    assert one_at_a_time(lines, "skipping") >= 1
    assert one_at_a_time(lines, "queueing") >= 2


def test_an_instance_of_a_shorter_window_never_takes_a_live_one_of_a_longer_window_over(workers: Workers) -> None:
    """A rolling change of --abandon-after (30 s to 6 s) runs both for a while: b, of 6 s,
    took a's run for abandoned after 6 s of silence, though a stops its own work only after
    20 s, and started the schedule's next slot beside it."""
    schedules(workers, overrun=False)
    a = workers.start("a", None, "--abandon-after", "30")
    poll(lambda: workers.starts(a.process.pid), timeout=30, what="a to start its run")
    b = workers.start("b")  # --abandon-after 6
    started = "SELECT id FROM schedtui_runs WHERE instance = 'a' AND status = 'running' AND fired_at IS NOT NULL"
    [(run_id,)] = workers.sql(started)  # (not a placeholder of a slot it is about to skip)
    a.process.send_signal(signal.SIGSTOP)  # well within a's renewal bound (20 s)
    try:

        def silent_for() -> float:
            beats = dict(workers.sql("SELECT instance, heartbeat_at FROM schedtui_instances"))
            return float((beats["b"] - beats["a"]).total_seconds())

        # b beats (and sweeps) every 1.3 s: by then it judged a by 6 s many times over.
        poll(lambda: silent_for() > 12, timeout=30, what="b to sweep while a has been silent for 12 s")
        assert workers.sql("SELECT status FROM schedtui_runs WHERE id = %s", (run_id,)) == [("running",)]
        assert not workers.starts(b.process.pid)
        assert "abandoned" not in b.log_text()
    finally:
        a.process.send_signal(signal.SIGCONT)
    (workers.root / "release").touch()
    poll(
        lambda: workers.sql("SELECT status FROM schedtui_runs WHERE id = %s", (run_id,)) == [("succeeded",)],
        timeout=30, what="a's run to succeed",
    )  # fmt: skip
    assert "LEASE LAPSED" not in a.log_text()
    assert one_at_a_time(workers.lines(), "long") >= 1


# ---------------------------------------------------------------------------------------
# a process that fires nothing (``schedtui fire``) cut off while its Run now runs
# ---------------------------------------------------------------------------------------
PACED = NOTES + """

    def paced(ctx):  # a timed run is brief; a Run now runs until the release, on a thread
        note("start", ctx)
        while ctx.trigger == "manual" and not RELEASE.exists():
            time.sleep(0.05)
        note("end", ctx)


    paced_schedule = define_schedule(name="paced", cron="* * * * * *", timezone="UTC", handler=paced, on_overlap="skip")
"""


def test_a_cut_off_fire_command_ends_itself_before_the_fleet_starts_the_next_run_beside_its_handler(
    workers: Workers,
) -> None:
    """``schedtui fire paced`` (a process that fires nothing, window 30 s) runs a sync
    Run now through a path that freezes. Before, it held no lease: b judged it gone after
    30 s, closed its run ``abandoned`` and started the next slot beside its handler, which
    ran on. Now its lease lapses after 20 s and, a thread not being stoppable, it ends
    itself first."""
    (workers.root / "schedules" / "fleet.cron.py").write_text(textwrap.dedent(PACED))
    b = workers.start("b")
    poll(lambda: workers.starts(b.process.pid), timeout=30, what="b to run the schedule")
    with relay_to(workers.url) as relay:
        cli = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "fire", "paced", "--schedules", "schedules", "--store",
             via(workers.url, relay.port), "--instance", "cli"],
            cwd=workers.root, env=cli_env(), stdout=subprocess.DEVNULL, stderr=(workers.root / "cli.log").open("w"), text=True,
        )  # fmt: skip
        workers.others.append(cli)
        poll(lambda: workers.starts(cli.pid), timeout=30, what="the Run now to start")
        poll(lambda: "(on another instance) was still in flight" in str(workers.sql(
            "SELECT error_message FROM schedtui_runs WHERE instance = 'b' AND status = 'skipped'")),
            timeout=30, what="b to skip a slot for the Run now")  # fmt: skip
        relay.freeze()
        frozen_at = time.time()
        assert cli.wait(40) == 75  # a thread cannot be stopped: the process ends itself
        ended_at = time.time()  # (at the latest)
        assert ended_at < frozen_at + 30, "it ended before the take-over window"
        assert "ENDING THE PROCESS: 1 sync handler(s) still run" in (workers.root / "cli.log").read_text()
        poll(lambda: [line for line in workers.starts(b.process.pid) if line.at > frozen_at + 25], timeout=40,
             what="b to run the schedule again once the Run now's process is gone")  # fmt: skip
    (manual,) = workers.starts(cli.pid)
    assert not [line for line in workers.lines() if line.pid == cli.pid and line.what == "end"]
    beside = [line for line in workers.starts(b.process.pid) if manual.at < line.at < ended_at]
    assert not beside, f"b started {beside} while the Run now's handler still ran"
    assert workers.sql("SELECT status, error_tag FROM schedtui_runs WHERE trigger = 'manual'") == [("failed", "abandoned")]


def test_a_cut_off_console_that_fires_nothing_ends_itself_and_gives_the_terminal_back(workers: Workers) -> None:
    """The same Run now pressed (``r``) in a console without ``--fire``, over SSH: it ends
    itself before the take-over too, out of the alternate screen, saying why on the
    terminal (the engine's account goes to the log, which would tear the screen)."""
    (workers.root / "schedules" / "fleet.cron.py").write_text(textwrap.dedent(PACED))
    b = workers.start("b")
    poll(lambda: workers.starts(b.process.pid), timeout=30, what="b to run the schedule")
    screen = Terminal()
    try:
        with relay_to(workers.url) as relay:
            console = subprocess.Popen(
                [sys.executable, "-m", "console.cli", "console", "--schedules", "schedules", "--store",
                 via(workers.url, relay.port), "--instance", "console"],
                cwd=workers.root, env={**cli_env(SCHEDTUI_LOG_FILE=str(workers.root / "console.log")), "TERM": "xterm"},
                stdin=screen.terminal, stdout=screen.terminal, stderr=screen.terminal, preexec_fn=screen.lead, text=True,
            )  # fmt: skip
            workers.others.append(console)
            poll(lambda: b"paced" in screen.output, timeout=30, what="the console to show the schedule")
            os.write(screen.controller, b"r")
            poll(lambda: workers.starts(console.pid), timeout=30, what="the Run now to start")
            relay.freeze()
            frozen_at = time.time()
            assert console.wait(40) == 75
            ended_at = time.time()
            assert ended_at < frozen_at + 30, "it ended before the take-over window"
    finally:
        screen.close()
    shown = screen.output.decode(errors="replace")
    after = shown[shown.rindex("\x1b[?1049l"):]  # out of the alternate screen, then the reason
    assert "schedtui: ENDING THE CONSOLE (exit code 75)" in after
    assert "ENDING THE PROCESS: 1 sync handler(s) still run" in (workers.root / "console.log").read_text()
    (manual,) = workers.starts(console.pid)
    beside = [line for line in workers.starts(b.process.pid) if manual.at < line.at < ended_at]
    assert not beside, f"b started {beside} while the Run now's handler still ran"
