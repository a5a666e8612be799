"""Durable executions across real ``schedtui serve`` processes on a real PostgreSQL.

Each step records every call in a file (one line per call, appended), so what ran how
often is known whatever happened to the processes. Faults are real: SIGKILL of the
instance running an execution (in the middle of a step, and during an at-most-once step),
and SIGSTOP past its lease while another instance is running. Tests wait by polling a
condition against a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend import connect
from backend.durable import Execution
from tests import pg
from tests.servers import REPO, poll

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

DEFINITIONS = """
    import asyncio, os, time
    from pathlib import Path
    from backend.durable import define_durable

    CALLS = Path({calls!r})
    HOLD = Path({hold!r})

    def record(execution, step):
        with open(CALLS, "a") as f:
            f.write(f"{{execution}} {{step}} {{os.getpid()}}\\n")

    async def page(execution, n):
        record(execution, f"page-{{n}}")
        while n == 3 and HOLD.exists():
            await asyncio.sleep(0.05)
        return n

    async def sync(ctx, input):
        total = 0
        for n in range(1, 6):
            total += await ctx.step(f"page-{{n}}", page, ctx.id, n)
        return {{"total": total}}

    async def notify(execution):
        record(execution, "notify")
        while HOLD.exists():
            await asyncio.sleep(0.05)
        return "sent"

    async def summary(ctx, input):
        await ctx.step("prepare", page, ctx.id, 1)
        await ctx.step("notify", notify, ctx.id, at_most_once=True)
        return "done"

    nightly = define_durable(name="nightly-sync", handler=sync)
    mail = define_durable(name="summary", handler=summary)
"""


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class Fleet:
    def __init__(self, root: Path, url: str, abandon_after: int = 30) -> None:
        self.root, self.url, self.abandon_after = root, url, abandon_after
        self.calls = root / "calls.log"
        self.hold = root / "hold"
        self.instances: list[Instance] = []
        folder = root / "defs"
        folder.mkdir()
        (folder / "sync.durable.py").write_text(textwrap.dedent(DEFINITIONS.format(calls=str(self.calls), hold=str(self.hold))))

    def start(self, name: str) -> Instance:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        log_path = self.root / f"{name}-{len(self.instances)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "serve", "--schedules", "defs", "--store", self.url, "--instance", name,
             "--abandon-after", str(self.abandon_after)],
            cwd=self.root, env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("w"), preexec_fn=pg.die_with_parent,
        )  # fmt: skip
        instance = Instance(name, proc, log_path)
        self.instances.append(instance)
        poll(lambda: "starting 0 schedule(s)" in instance.log() or proc.poll() is not None, timeout=30,
             what=f"{name} to start")  # fmt: skip
        assert proc.poll() is None, instance.log()
        return instance

    def calls_of(self, execution: str) -> list[tuple[str, str]]:
        if not self.calls.exists():
            return []
        lines = [line.split() for line in self.calls.read_text().splitlines() if line.strip()]
        return [(step, pid) for id_, step, pid in lines if id_ == execution]

    def stop_all(self) -> None:
        for instance in self.instances:
            if instance.proc.poll() is None:
                instance.proc.send_signal(signal.SIGCONT)
                instance.proc.send_signal(signal.SIGINT)
                try:
                    instance.proc.wait(20)
                except subprocess.TimeoutExpired:
                    instance.proc.kill()
                    instance.proc.wait()


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, pg_url)
    yield made
    made.stop_all()


def start(url: str, function: str) -> str:
    async def go() -> str:
        async with connect(url) as st:
            return (await st.durable.start(function)).id

    return asyncio.run(go())


def get(url: str, id_: str) -> Execution:
    async def go() -> Execution:
        async with connect(url) as st:
            return await st.durable.get(id_)

    return asyncio.run(go())


def finished(url: str, id_: str) -> Execution | None:
    execution = get(url, id_)
    return execution if execution.done else None


def test_sigkill_mid_execution_resumes_elsewhere_and_finished_steps_never_rerun(fleet: Fleet) -> None:
    fleet.hold.touch()
    a = fleet.start("a")
    id_ = start(fleet.url, "nightly-sync")
    poll(lambda: ("page-3", str(a.proc.pid)) in fleet.calls_of(id_), timeout=30, what="a to reach page-3")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    killed_at = time.monotonic()
    fleet.hold.unlink()
    fleet.start("b")
    done = poll(lambda: finished(fleet.url, id_), timeout=60, what="b to finish the execution")
    resumed_in = time.monotonic() - killed_at
    assert (done.status, done.output, done.instance) == ("succeeded", {"total": 15}, "b")
    counts = Counter(step for step, _ in fleet.calls_of(id_))
    assert counts == {"page-1": 1, "page-2": 1, "page-3": 2, "page-4": 1, "page-5": 1}, counts
    assert resumed_in < 60


def test_an_instance_that_took_over_an_execution_exits_on_sigint_within_its_grace(fleet: Fleet) -> None:
    # A serve that took over a SIGKILLed owner's execution once hung on SIGINT for ever (its
    # stop raised when the run ended during the last lease renewal; the store stayed open).
    fleet.hold.touch()
    a = fleet.start("a")
    id_ = start(fleet.url, "nightly-sync")
    poll(lambda: ("page-3", str(a.proc.pid)) in fleet.calls_of(id_), timeout=30, what="a to reach page-3")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    b = fleet.start("b")
    poll(lambda: ("page-3", str(b.proc.pid)) in fleet.calls_of(id_), timeout=60, what="b to take page-3 over")
    b.proc.send_signal(signal.SIGINT)
    poll(lambda: "runs in flight may finish" in b.log(), timeout=10, what="b to begin stopping")
    fleet.hold.unlink()  # page-3 ends within the grace: b checkpoints it and lets go
    try:
        code = b.proc.wait(30)  # serve's shutdown grace
    except subprocess.TimeoutExpired:
        pytest.fail(f"b did not exit within its shutdown grace after SIGINT:\n{b.log()}")
    assert code == 0, b.log()
    released = get(fleet.url, id_)
    assert released.status == "queued", released
    assert [step.name for step in released.steps or [] if step.status == "succeeded"] == ["page-1", "page-2", "page-3"]
    assert any("released: b is stopping" in line.message for line in released.logs or [])


def test_sigkill_during_an_at_most_once_step_never_runs_it_again(fleet: Fleet) -> None:
    fleet.hold.touch()
    a = fleet.start("a")
    id_ = start(fleet.url, "summary")
    poll(lambda: ("notify", str(a.proc.pid)) in fleet.calls_of(id_), timeout=30, what="a to start the at-most-once step")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    fleet.hold.unlink()
    fleet.start("b")
    done = poll(lambda: finished(fleet.url, id_), timeout=60, what="b to settle the execution")
    assert (done.status, done.error_tag) == ("failed", "at_most_once_interrupted")
    assert Counter(step for step, _ in fleet.calls_of(id_)) == {"page-1": 1, "notify": 1}


def test_a_frozen_owner_is_displaced_by_a_running_instance_and_cannot_write_after(tmp_path: Path, pg_url: str) -> None:
    fleet = Fleet(tmp_path, pg_url, abandon_after=3)  # leases of 3 s
    try:
        fleet.hold.touch()
        a = fleet.start("a")
        id_ = start(fleet.url, "nightly-sync")
        poll(lambda: ("page-3", str(a.proc.pid)) in fleet.calls_of(id_), timeout=30, what="a to reach page-3")
        b = fleet.start("b")
        a.proc.send_signal(signal.SIGSTOP)  # frozen past its lease, alive
        fleet.hold.unlink()
        done = poll(lambda: finished(fleet.url, id_), timeout=60, what="b to take over and finish")
        assert (done.status, done.instance) == ("succeeded", "b")
        a.proc.send_signal(signal.SIGCONT)  # its page-3 ends now; its checkpoint must be refused
        poll(lambda: "its lease was taken over by another claim" in a.log() or "could not be renewed" in a.log(),
             timeout=30, what="a to find its lease gone")  # fmt: skip
        after = get(fleet.url, id_)
        assert (after.status, after.output, after.instance) == ("succeeded", {"total": 15}, "b")
        calls = fleet.calls_of(id_)
        assert [pid for step, pid in calls if step in ("page-4", "page-5")] == [str(b.proc.pid)] * 2
        assert any("taken over by b" in line.message for line in after.logs or [])
    finally:
        fleet.stop_all()
