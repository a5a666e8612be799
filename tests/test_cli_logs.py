"""The log verbs: ``schedtui logs RUN_ID`` (``--follow`` while it runs), ``schedtui jobs logs
JOB_ID`` (``--attempt N``) and ``schedtui durable logs ID``, in real processes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from backend import Engine, ManualClock, discover_definitions
from tests.test_cli import Cli, child_env, create_store, write_tree

SCHEDULES = {
    "talk.cron.py": """
        import logging, time
        from backend import define_schedule

        def talk(ctx):
            print("hello from", ctx.name)
            logging.getLogger("talk").warning("careful")

        def slow(ctx):
            for n in range(12):
                print(f"tick {n}", flush=True)
                time.sleep(0.5)

        talk = define_schedule(name="talk", cron="0 0 1 1 *", timezone="UTC", handler=talk)
        slow = define_schedule(name="slow", cron="0 0 1 1 *", timezone="UTC", handler=slow)
    """,
    "mail.jobs.py": """
        from backend import define_queue

        def deliver(job):
            print(f"attempt {job.attempt} of job {job.id}")
            if job.attempt == 1:
                raise ConnectionError("smtp down")

        mail = define_queue(name="mail", handler=deliver, attempts=2)
    """,
}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    write_tree(tmp_path / "schedules", SCHEDULES)
    create_store(tmp_path / "state.db")
    return Cli(tmp_path)


def test_logs_prints_what_the_run_wrote(cli: Cli) -> None:
    fired = cli.ok("fire", "talk")
    # The handler's warning reaches stderr too (no logging configured: Python's last
    # resort), before or after the line naming the run, as the threads go.
    (run_id,) = re.findall(r"\brun ([0-9A-Z]{26})$", fired.stderr, re.MULTILINE)
    shown = cli.ok("logs", run_id)
    lines = shown.stdout.splitlines()
    assert lines[0] == "hello from talk"
    assert lines[1].endswith(" WARNING talk: careful") and len(lines) == 2
    answer = cli.json("logs", run_id)
    assert (answer["kind"], answer["id"], answer["status"], answer["running"]) == ("run", run_id, "succeeded", False)
    assert answer["text"] == shown.stdout and answer["size"] == len(shown.stdout.encode())
    rest = cli.ok("logs", run_id, "--after", str(len("hello from talk\n")))
    assert rest.stdout == shown.stdout.split("\n", 1)[1]


def test_logs_of_a_run_that_is_no_run(cli: Cli) -> None:
    for args in (["logs", "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"], ["logs", "nope"], ["jobs", "logs", "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"],
                 ["durable", "logs", "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"]):  # fmt: skip
        done = cli(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no " in done.stderr, (args, done.stderr)
    both = cli("logs", "01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "--follow", "--json")
    assert both.returncode == 2 and "--follow" in both.stderr


def _fired(stderr: IO[str]) -> str:
    """The run's id in "fired slow: run ID", printed on stderr as the run starts. The
    handler's own prints go there too (`fire` keeps stdout for the run), from its thread:
    a print's text and its newline are two writes, so the line may come inside another."""
    while (found := re.search(r"fired slow: run (\w+)", line := stderr.readline())) is None:
        assert line, "fire ended without saying which run it started"
    return found.group(1)


def test_follow_prints_the_log_as_it_comes_until_the_run_ends(cli: Cli) -> None:
    firing = subprocess.Popen(cli.argv("fire", "slow"), cwd=cli.root, env=child_env(), stderr=subprocess.PIPE, text=True)
    assert firing.stderr is not None
    run_id = _fired(firing.stderr)
    follower = subprocess.Popen(
        cli.argv("logs", run_id, "--follow"), cwd=cli.root, env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follower.stdout is not None and follower.stderr is not None
    first = follower.stdout.readline()
    running_then = firing.poll() is None  # the first line came while the run was still running
    rest = follower.stdout.read()  # (through the same buffer as the first line)
    said = follower.stderr.read()
    assert firing.wait(30) == 0 and follower.wait(30) == 0
    assert running_then
    assert (first + rest).splitlines() == [f"tick {n}" for n in range(12)]  # each line once, in order
    assert said.strip() == f"schedtui: run {run_id} of slow: succeeded"


def test_follow_ends_when_the_process_running_the_run_is_killed(cli: Cli) -> None:
    firing = subprocess.Popen(cli.argv("fire", "slow"), cwd=cli.root, env=child_env(), stderr=subprocess.PIPE, text=True)
    assert firing.stderr is not None
    run_id = _fired(firing.stderr)
    follower = subprocess.Popen(
        cli.argv("logs", run_id, "--follow"), cwd=cli.root, env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follower.stdout is not None
    try:
        first = follower.stdout.readline()  # the run is followed while it runs
        firing.kill()  # as SIGKILL leaves it: its run recorded running, its log's last row not final
        firing.wait(30)
        rest, said = follower.communicate(timeout=30)  # (its process is gone: nothing more will come)
    finally:
        follower.kill()
        firing.kill()
    ticks = (first + rest).splitlines()
    assert ticks == [f"tick {n}" for n in range(len(ticks))] and 0 < len(ticks) < 12
    assert follower.returncode == 0
    assert said.strip() == (
        f"schedtui: run {run_id} of slow: the process running it is gone (recorded running until it is closed as abandoned)"
    )
    (closed,) = cli.runs("slow")  # the next verb to open the store closes it, by the same judgement
    assert (closed["status"], closed["error_tag"]) == ("failed", "abandoned")


def run_jobs(root: Path) -> str:
    """Run a job of mail through both its attempts (the first fails) in an engine here."""

    async def go() -> str:
        clock = ManualClock("2026-03-02T08:00:00Z")
        engine = Engine(discover_definitions(root / "schedules"), f"sqlite:///{root / 'state.db'}", clock=clock,
                        shutdown_grace=0)  # fmt: skip
        await engine.start()
        try:
            sent = await engine.jobs.send("mail", None)
            await engine.quiesce()
            clock.advance(11)
            await engine.quiesce()
            return sent.id
        finally:
            await engine.stop(grace=0)

    return asyncio.run(go())


def test_jobs_logs_of_each_attempt(cli: Cli) -> None:
    job_id = run_jobs(cli.root)
    newest = cli.ok("jobs", "logs", job_id)
    assert newest.stdout == f"attempt 2 of job {job_id}\n"
    first = cli.ok("jobs", "logs", job_id, "--attempt", "1")
    assert first.stdout.startswith(f"attempt 1 of job {job_id}\n") and first.stdout.endswith("ConnectionError: smtp down\n")
    answer: dict[str, Any] = cli.json("jobs", "logs", job_id, "--attempt", "1")
    assert (answer["kind"], answer["attempt"], answer["status"], answer["name"]) == ("job", 1, "failed", "mail")
    missing = cli("jobs", "logs", job_id, "--attempt", "3")
    assert missing.returncode == 2 and f"job {job_id} has no attempt 3" in missing.stderr
    assert cli("jobs", "logs", job_id, "--attempt", "0").returncode == 2


def test_the_log_verbs_take_follow() -> None:
    for verb in (["logs"], ["jobs", "logs"], ["durable", "logs"]):
        shown = subprocess.run([sys.executable, "-m", "console.cli", *verb, "--help"], env=child_env(), capture_output=True,
                               text=True, timeout=30)  # fmt: skip
        assert "--follow" in shown.stdout and "--after" in shown.stdout, verb
