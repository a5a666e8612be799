"""Handlers in a process of their own (``isolation="process"``): the watchdog really stops
them, and nothing they do (hang, raise, exit) reaches the engine's process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from backend import DefinitionError, Engine, ManualClock, RunContext, Schedule, define_schedule, discover
from backend.runtime import isolated
from tests.conftest import all_runs
from tests.servers import poll

HANDLERS = '''
import os, time
from pathlib import Path
from backend import define_schedule
from tests.odd_exceptions import StrAndReprRaise

HERE = Path(__file__).parent

def hang(ctx):
    (HERE / "hang.pid").write_text(str(os.getpid()))
    time.sleep(600)

async def boom(ctx):
    print("a line of the handler's own")  # stays out of the report
    raise KeyError(ctx.payload["missing"])

def exits(ctx):
    os._exit(3)

def odd(ctx):
    raise StrAndReprRaise()

def fine(ctx):
    return {"ran": ctx.name, "slot": ctx.scheduled_at.isoformat()}

def leaves(ctx):
    # A helper left running in its process group (a cache warmer, a tunnel), and a daemon
    # in a session of its own: both inherit the handler's stderr.
    import subprocess, sys
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    left = subprocess.Popen(sleeper)
    daemon = subprocess.Popen(sleeper, start_new_session=True)
    (HERE / "left.pids").write_text(f"{left.pid} {daemon.pid}")
    print("returning now")
    return "done"

def forks(ctx):
    # A helper made with a bare fork keeps every descriptor, the report's pipe too.
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    (HERE / "forked.pid").write_text(str(pid))
    return "done"

def lingers(ctx):
    import atexit
    atexit.register(time.sleep, 600)  # a library's exit hook that takes its time
    return "done"

hang_job = define_schedule(name="hang", cron="0 * * * *", timezone="UTC", handler=hang, max_runtime=60, isolation="process")
boom_job = define_schedule(name="boom", cron="0 * * * *", timezone="UTC", handler=boom, payload={}, isolation="process")
exit_job = define_schedule(name="exits", cron="0 * * * *", timezone="UTC", handler=exits, isolation="process")
odd_job = define_schedule(name="odd", cron="0 * * * *", timezone="UTC", handler=odd, isolation="process")
fine_job = define_schedule(name="fine", cron="0 * * * *", timezone="UTC", handler=fine, isolation="process")
leaves_job = define_schedule(name="leaves", cron="0 * * * *", timezone="UTC", handler=leaves, isolation="process",
                             max_runtime=5)
forks_job = define_schedule(name="forks", cron="0 * * * *", timezone="UTC", handler=forks, isolation="process",
                            max_runtime=10)
lingers_job = define_schedule(name="lingers", cron="0 * * * *", timezone="UTC", handler=lingers, isolation="process",
                              max_runtime=10)
'''


@pytest.fixture
def definitions(tmp_path: Path) -> list[Schedule]:
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "isolated.cron.py").write_text(textwrap.dedent(HANDLERS))
    return discover(folder)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_watchdog_kills_a_hanging_handler_in_its_process(
    make_engine: Callable[..., Engine], clock: ManualClock, definitions: list[Schedule], tmp_path: Path
) -> None:
    engine = make_engine([s for s in definitions if s.name == "hang"])
    await engine.start()
    clock.set("2026-03-02T09:00:00Z")
    await engine.quiesce(runs=False)
    pid_file = tmp_path / "defs" / "hang.pid"
    # (on a thread: the loop must go on running, it is what starts the handler's process)
    found = await asyncio.to_thread(
        poll, lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the handler's process to start"
    )
    pid = int(found)
    clock.advance(60)
    await engine.quiesce()
    [run] = await all_runs(engine, "hang")
    assert (run.status, run.error_tag) == ("failed", "timeout")
    assert "handler's process was killed" in (run.error_message or "")
    poll(lambda: not alive(pid), timeout=10, what="the handler's process to be gone")


@pytest.mark.parametrize(
    ("name", "status", "tag", "message"),
    [
        ("boom", "failed", "KeyError", "'missing'"),
        ("exits", "failed", "process_exit", "the handler's process exited with code 3 without a result"),
        # Its str() and repr() raise: the child still reports it, by its class.
        ("odd", "failed", "StrAndReprRaise", "StrAndReprRaise (its str() raised ValueError, its repr() ValueError)"),
        ("fine", "succeeded", None, None),
    ],
)
async def test_what_a_handler_in_its_process_does_is_its_runs_outcome(
    make_engine: Callable[..., Engine], clock: ManualClock, definitions: list[Schedule],
    name: str, status: str, tag: str | None, message: str | None,
) -> None:
    engine = make_engine([s for s in definitions if s.name == name])
    await engine.start()
    run = await engine.run_now(name, wait=True)
    assert (run.status, run.error_tag, run.error_message) == (status, tag, message)
    detail = await engine.get_run(run.id)
    if name == "boom":
        assert "KeyError: 'missing'" in (detail.traceback or "") and "a line of the handler's own" not in (detail.error_message or "")
    assert os.getpid() == os.getpid()  # still here: the engine's process survived


async def test_a_run_ends_with_its_handlers_process_whatever_that_left_running(
    make_engine: Callable[..., Engine], definitions: list[Schedule], tmp_path: Path
) -> None:
    """The run is the handler's: a process it started and left in its process group held
    the run open (its inherited stderr never closed) until that process exited, and past
    ``max_runtime`` the watchdog failed a run that had succeeded. It is stopped with the
    handler's process, and the run's log says so; a daemon in a session of its own is left
    running, and its output is not waited for."""
    engine = make_engine([s for s in definitions if s.name == "leaves"])
    await engine.start()
    pids: list[int] = []
    try:
        # (bounded on real time: without the fix it waits the sleeper's 600 s, or fails at 5)
        run = await asyncio.wait_for(engine.run_now("leaves", wait=True), 30)
        pids = [int(pid) for pid in (tmp_path / "defs" / "left.pids").read_text().split()]
        assert (run.status, run.error_tag) == ("succeeded", None), run.error_message
        left, daemon = pids
        poll(lambda: not alive(left), timeout=10, what="the process it left in its group to be stopped")
        assert alive(daemon)
        log = await engine.run_logs.run_log(run.id)
        assert "returning now" in log.text and "they were stopped with it" in log.text
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("name", ["forks", "lingers"])
async def test_a_run_ends_with_its_handlers_result_whatever_holds_its_process_after(
    make_engine: Callable[..., Engine], definitions: list[Schedule], tmp_path: Path, name: str
) -> None:
    """A handler that forked a helper (which holds the report's pipe: the run waited for the
    pipe's end) or registered an atexit hook that takes its time (the process exits after
    it) had returned, yet its run was failed ``timeout`` at ``max_runtime``, and the next
    slots of a ``skip`` schedule were skipped meanwhile. The run ends with the handler's
    result; the process has a moment to exit, then its group is stopped."""
    engine = make_engine([s for s in definitions if s.name == name])
    await engine.start()
    forked = tmp_path / "defs" / "forked.pid"
    try:
        # (bounded on real time: without the fix it fails at max_runtime, 10 s)
        run = await asyncio.wait_for(engine.run_now(name, wait=True), 30)
        assert (run.status, run.error_tag) == ("succeeded", None), run.error_message
        if forked.exists():
            poll(lambda: not alive(int(forked.read_text())), timeout=10, what="the forked helper to be stopped")
        log = await engine.run_logs.run_log(run.id)
        assert "had not exited 2s after its result" in log.text or "they were stopped with it" in log.text, log.text
    finally:
        if forked.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(forked.read_text()), signal.SIGKILL)


async def test_a_handler_in_its_process_imports_as_the_engines_process_does(
    make_engine: Callable[..., Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child had the folder ``backend/`` itself on its path (a move of this module left
    the path one folder too deep): the application's own package ``jobs`` (or ``api``,
    ``store``, ``events``…) was backend's there, and a folder the application put on its
    path at run time was missing (outside review of the package as shipped)."""
    app = tmp_path / "app"
    (app / "jobs").mkdir(parents=True)
    (app / "jobs" / "__init__.py").write_text("def cleanup():\n    return \"the application's cleanup\"\n")
    monkeypatch.syspath_prepend(str(app))  # (as an application does at run time: not in PYTHONPATH)
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "app.cron.py").write_text(textwrap.dedent("""
        import sys
        from backend import define_schedule

        def cleanup(ctx):
            import json, jobs
            print("said:", jobs.cleanup())
            print("path:", json.dumps(sys.path))

        job = define_schedule(name="cleanup", cron="0 * * * *", timezone="UTC", handler=cleanup, isolation="process")
    """))
    engine = make_engine(discover(folder))
    await engine.start()
    run = await engine.run_now("cleanup", wait=True)
    assert (run.status, run.error_tag) == ("succeeded", None), run.error_message
    log = (await engine.run_logs.run_log(run.id)).text
    assert "said: the application's cleanup" in log, log
    [path] = [json.loads(line.split("path: ", 1)[1]) for line in log.splitlines() if "path: " in line]
    assert str(app) in path and str(Path(isolated.__file__).resolve().parents[1]) not in path


def test_process_isolation_needs_a_definitions_file() -> None:
    async def inline(ctx: RunContext) -> None:
        pass

    with pytest.raises(DefinitionError, match="isolation 'thread' is not one of process"):
        define_schedule(name="x", cron="* * * * *", timezone="UTC", handler=inline, isolation="thread")  # type: ignore[arg-type]  # the refused value is the point
    ok = define_schedule(name="x", cron="* * * * *", timezone="UTC", handler=inline, isolation="process")
    assert ok.source_file == __file__
