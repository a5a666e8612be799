"""The definitions folder (``--schedules``, default ``./schedules``) and the verbs.

Verbs that use no definition (the job queue's, locks, audit) work without the folder, as
sending from ``connect()`` does; a folder that was named must exist. A process that read a
folder knows every durable function there is: a start of any other is refused, also when
the folder defines none."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backend import NotFound, connect
from tests.servers import cli_env, run_main

QUEUE = """
    from backend import define_queue

    async def deliver(job):
        pass

    mail = define_queue(name="mail", handler=deliver)
"""
SCHEDULE = """
    from backend import define_schedule

    async def work(ctx):
        pass

    hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=work)
"""


def run(cwd: Path, store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args, "--store", store],
        cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def folder_with(root: Path, name: str, text: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "defs.jobs.py").write_text(textwrap.dedent(text))
    return folder


def test_the_job_verbs_need_no_definitions_folder(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    definitions = folder_with(tmp_path, "defs", QUEUE)

    async def record_the_queue() -> None:  # as a process that defines it does
        async with connect(store, definitions=definitions, create=True):
            pass

    asyncio.run(record_the_queue())
    here = tmp_path / "elsewhere"  # no ./schedules here
    here.mkdir()
    sent = run(here, store, "jobs", "send", "mail", "--delay", "3600", "--json")
    assert sent.returncode == 0, sent.stderr
    job = json.loads(sent.stdout)["id"]
    queues = run(here, store, "queues", "--json")
    assert [(q["name"], q["queued"]) for q in json.loads(queues.stdout)] == [("mail", 1)], queues.stderr
    assert job in run(here, store, "jobs", "list", "mail").stdout
    assert run(here, store, "jobs", "cancel", "mail", job).returncode == 0
    assert run(here, store, "locks").returncode == 0
    assert run(here, store, "audit").returncode == 0
    # A folder that was named must exist; the schedules' verbs still need one.
    named = run(here, store, "jobs", "send", "mail", "--schedules", "nowhere")
    assert named.returncode == 2 and 'schedules folder "nowhere" does not exist' in named.stderr
    listed = run(here, store, "list")
    assert listed.returncode == 2 and 'schedules folder "schedules" does not exist' in listed.stderr


async def test_a_folder_that_defines_no_durable_function_refuses_to_start_one(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    definitions = folder_with(tmp_path, "schedules", SCHEDULE)
    async with connect(store, definitions=definitions, create=True) as st:
        with pytest.raises(NotFound, match=r'no durable function named "nope" \(defined here: none\)'):
            await st.durable.start("nope")
    done = await asyncio.to_thread(run, tmp_path, store, "durable", "start", "nope")
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip() == 'schedtui: no durable function named "nope" (defined here: none)'
    listed = await asyncio.to_thread(run, tmp_path, store, "durable", "list", "--json")
    assert json.loads(listed.stdout) == []  # nothing was queued


DURABLE = """
    from backend import define_durable

    async def flow(ctx, input):
        return await ctx.wait_for("go")

    flow_fn = define_durable(name="flow", handler=flow)
"""


async def test_the_durable_verbs_but_start_need_no_definitions_folder(tmp_path: Path) -> None:
    """Reading, signalling and cancelling an execution use no code: an operator with only
    the store's URL can (they were refused for want of ./schedules). A start reads the
    folder, which names every function there is, and a named folder must exist."""
    store = f"sqlite:///{tmp_path / 'state.db'}"
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "flow.durable.py").write_text(textwrap.dedent(DURABLE))
    async with connect(store, definitions=folder, create=True) as st:
        started = await st.durable.start("flow", {"n": 1})
    here = tmp_path / "elsewhere"  # no ./schedules here
    here.mkdir()
    listed = run_main(here, "durable", "list", "--json", "--store", store)
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)] == [started.id]
    for verb in (["durable", "show", started.id], ["durable", "logs", started.id],
                 ["durable", "signal", started.id, "go"], ["durable", "cancel", started.id]):  # fmt: skip
        done = run_main(here, *verb, "--store", store)
        assert done.returncode == 0, (verb, done.stderr)
    start = run_main(here, "durable", "start", "flow", "--store", store)
    assert start.returncode == 2 and 'schedules folder "schedules" does not exist' in start.stderr
    named = run_main(here, "durable", "list", "--schedules", "nowhere", "--store", store)
    assert named.returncode == 2 and 'schedules folder "nowhere" does not exist' in named.stderr
