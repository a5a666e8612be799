"""Text that is not text, already in a store: rows an older version let in (a lone surrogate
in a durable input, a job payload, a stored schedule, an audit entry; a NUL, an escape
sequence) and a step output a handler returned. Every read still answers, on SQLite and on
PostgreSQL: the API lists and shows each row (200, never a 500) and the CLI prints it
(``--json`` and tables, exit 0, no traceback), with each such character escaped as the
text ``\\ud800`` or ``\\x1b``. (That no route lets such text in is tests/test_api_input.py.)

And such text made as a handler runs (a job's or a run's exception message, a durable step's
error, log line or result): each store writes it escaped as the other does, so the attempt,
the run or the step is recorded with its own error, and nothing else stops."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.durable.store import NewExecution
from backend.events.audit import AuditEntry
from backend.ids import encode_id
from backend.jobs.store import NewJob, QueueSpec
from backend.scheduler.stored import StoredSchedule
from backend.store import open_store
from tests.servers import Server, cli_env, poll, start_server, store_for

OPERATE = "op-bad-text-token"
DEFINITIONS = """
    from backend import define_durable, define_queue

    async def deliver(job):
        pass

    def half_a_pair():
        return {"said": "out \\ud800"}

    async def flow(ctx, input):
        return await ctx.step("speak", half_a_pair)

    mail = define_queue(name="mail", handler=deliver)
    flow = define_durable(name="flow", handler=flow)
"""
# Ids of now: an audit entry is kept 90 days.
JOB_ID, EXECUTION_ID, AUDIT_ID = (encode_id(int(time.time() * 1000), low) for low in (1, 2, 3))
#: What each row holds as JSON text: as json.dumps wrote it (a lone surrogate escaped) in
#: the versions that let it in; and what every read shows of it.
HELD = '{"k\\ud800": "v\\udcff", "nul": "a\\u0000b"}'
SHOWN = {"k\\ud800": "v\\udcff", "nul": "a\\x00b"}


@dataclass
class Written:
    server: Server
    root: Path
    store: str
    handler_execution: str
    """An execution whose step (and so its output) a handler made of a lone surrogate."""


async def write_old_rows(url: str) -> None:
    """The rows, written as the store keeps them, past every check (as an older version did)."""
    now = datetime.now(UTC)
    store: Any = open_store(url, create=True)
    await store.open()
    try:
        await store.define_queues([QueueSpec("mail", 1, 1, 60.0)], now, update=False)
        await store.send_jobs("mail", [NewJob(JOB_ID, HELD, now + timedelta(days=1), None)], now)
        # A function no instance defines: it stays queued, to be listed.
        await store.durable_insert(NewExecution(EXECUTION_ID, "retired", HELD, now))
        await store.create_stored_schedule(StoredSchedule(
            name="stored", cron="0 * * * *", timezone="UTC", queue="mail", durable=None, payload=json.loads(HELD),
            description="set by \x1b[1mops", enabled=True, on_overlap="skip", backfill="skip", max_runtime=60.0,
            created_at=now, created_by="old", updated_at=now, updated_by="old",
        ))  # fmt: skip
        await store.append_audit(AuditEntry(AUDIT_ID, now, "old", "schedule.create", "stored", json.loads(HELD)))
    finally:
        await store.close()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Written]:
    root: Path = tmp_path_factory.mktemp(f"bad-text-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "systems.durable.py").write_text(textwrap.dedent(DEFINITIONS))
    store = store_for(request, root, "badtext")
    asyncio.run(write_old_rows(store))
    server = start_server(root, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    try:
        with client(server) as http:
            started = http.post("/inspect/durable/flow/start", json={"input": None})
            assert started.status_code == 201, started.text
            execution = started.json()["id"]
            poll(lambda: http.get(f"/inspect/durable/executions/{execution}").json()["status"] == "succeeded",
                 timeout=30, what="the handler's execution to succeed")  # fmt: skip
        yield Written(server, root, store, execution)
    finally:
        assert server.stop() == 0, server.log_text()
        assert "Traceback" not in server.log_text(), server.log_text()


def client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}, timeout=30)


def test_the_api_lists_and_shows_every_row(written: Written) -> None:
    with client(written.server) as http:

        def read(path: str) -> Any:
            response = http.get(path)
            assert response.status_code == 200, (path, response.text)
            return response.json()

        executions = {e["id"]: e for e in read("/inspect/durable/executions")["executions"]}
        assert executions[EXECUTION_ID]["input"] == SHOWN
        assert executions[written.handler_execution]["output"] == {"said": "out \\ud800"}
        assert read(f"/inspect/durable/executions/{EXECUTION_ID}")["input"] == SHOWN
        assert read(f"/inspect/durable/executions/{written.handler_execution}")["output"] == {"said": "out \\ud800"}
        assert [j["payload"] for j in read("/inspect/queues/mail/jobs")["jobs"]] == [SHOWN]
        assert read(f"/inspect/jobs/{JOB_ID}")["payload"] == SHOWN
        [stored] = [s for s in read("/inspect/schedules")["schedules"] if s["name"] == "stored"]
        assert (stored["payload"], stored["description"]) == (SHOWN, "set by \\x1b[1mops")
        entries = {e["id"]: e for e in read("/inspect/audit")["entries"]}
        assert entries[AUDIT_ID]["detail"] == SHOWN


def cli(written: Written, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "console.cli", *args, "--schedules", "schedules", "--store", written.store],
        cwd=written.root, env=cli_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), (args, done.stderr)
    return done


def test_the_cli_prints_every_row(written: Written) -> None:
    def printed(*args: str) -> Any:
        return json.loads(cli(written, *args, "--json").stdout)

    assert {e["id"]: e["input"] for e in printed("durable", "list")}[EXECUTION_ID] == SHOWN
    assert printed("durable", "show", EXECUTION_ID)["input"] == SHOWN
    assert printed("durable", "show", written.handler_execution)["output"] == {"said": "out \\ud800"}
    assert [j["payload"] for j in printed("jobs", "list", "mail")] == [SHOWN]
    assert printed("jobs", "show", JOB_ID)["payload"] == SHOWN
    [stored] = [s for s in printed("list") if s["name"] == "stored"]
    assert (stored["payload"], stored["description"]) == (SHOWN, "set by \\x1b[1mops")
    assert {e["id"]: e["detail"] for e in printed("audit")}[AUDIT_ID] == SHOWN
    # The tables too: the text is there, escaped.
    assert '"k\\\\ud800": "v\\\\udcff"' in cli(written, "durable", "show", EXECUTION_ID).stdout
    assert "v\\\\udcff" in cli(written, "jobs", "show", JOB_ID).stdout


# ---------------------------------------------------------------------------------------
# Text a handler makes as it runs (an exception's message, a log line, a result), written by
# the store as it is made: each is recorded with its own text, escaped, on both stores, and
# nothing else stops (the job workers, the run ledger, the durable runner).
# ---------------------------------------------------------------------------------------

HANDLERS = """
    from backend import define_durable, define_queue, define_schedule

    async def brittle(job):
        raise RuntimeError("x \\ud800 and \\x00")

    async def steady(job):
        pass

    def boom(ctx):
        raise RuntimeError("boom \\ud800")

    def fail():
        raise RuntimeError("step \\ud800")

    async def failing(ctx, input):
        return await ctx.step("fail", fail, retry=False)

    def half_a_pair():
        return {"bad": "\\ud800"}

    def not_a_number():
        return float("nan")

    async def chatty(ctx, input):
        ctx.log("said \\ud800 and \\x00")
        return await ctx.step("speak", half_a_pair)

    async def nan(ctx, input):
        return await ctx.step("count", not_a_number)

    brittle = define_queue(name="brittle", handler=brittle, attempts=1)
    steady = define_queue(name="steady", handler=steady)
    boom = define_schedule(name="boom", cron="0 0 1 1 *", timezone="UTC", handler=boom)
    failing = define_durable(name="failing", handler=failing)
    chatty = define_durable(name="chatty", handler=chatty)
    nan = define_durable(name="nan", handler=nan)
"""


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def raising(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp(f"bad-text-raised-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "raising.jobs.py").write_text(textwrap.dedent(HANDLERS))
    store = store_for(request, root, "badtextraised")
    server = start_server(root, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    try:
        yield server
    finally:
        log = server.log_text()
        assert server.stop() == 0, server.log_text()
        # (A failed run logs its traceback: nothing else does.)
        for broken in ("UnicodeEncodeError", "a job cycle failed", "cannot be written", "store unavailable"):
            assert broken not in log, log


def test_a_job_handlers_error_is_recorded_and_the_other_queues_run(raising: Server) -> None:
    with client(raising) as http:
        sent = http.post("/inspect/queues/brittle/jobs", json={"payload": {"n": 1}})
        assert sent.status_code == 201, sent.text
        bad = sent.json()["id"]
        job = poll(lambda: (j := http.get(f"/inspect/jobs/{bad}").json())["status"] == "dead" and j,
                   timeout=15, what="the failing job to be dead")  # fmt: skip
        # (A NUL is written as the PostgreSQL store has always written it: ``\\0``.)
        assert (job["error_tag"], job["error_message"]) == ("RuntimeError", "x \\ud800 and \\0")
        [attempt] = job["attempts"]
        assert (attempt["status"], attempt["error_tag"], attempt["error_message"]) == (
            "failed", "RuntimeError", "x \\ud800 and \\0",
        )  # fmt: skip
        # The workers go on: a job of another queue runs.
        sent = http.post("/inspect/queues/steady/jobs", json={"payload": {"n": 2}})
        assert sent.status_code == 201, sent.text
        good = sent.json()["id"]
        poll(lambda: [a["status"] for a in http.get(f"/inspect/jobs/{good}").json()["attempts"]] == ["succeeded"],
             timeout=15, what="the other queue's job to run")  # fmt: skip


def test_a_schedule_runs_error_is_recorded_and_not_abandoned(raising: Server) -> None:
    with client(raising) as http:
        fired = http.post("/inspect/schedules/boom/fire")
        assert fired.status_code == 202, fired.text
        run_id = fired.json()["run_id"]
        run = poll(lambda: (r := http.get(f"/inspect/runs/{run_id}").json())["status"] != "running" and r,
                   timeout=15, what="the run to finish")  # fmt: skip
        assert (run["status"], run["error_tag"], run["error_message"]) == ("failed", "RuntimeError", "boom \\ud800"), run
        assert "boom \\ud800" in run["traceback"]
        time.sleep(3)  # past the abandon window: the run stays as it was recorded
        [again] = http.get("/inspect/schedules/runs", params={"name": "boom"}).json()["runs"]
        assert (again["id"], again["status"], again["error_tag"], again["error_message"]) == (
            run_id, "failed", "RuntimeError", "boom \\ud800",
        )  # fmt: skip


def finished(http: httpx.Client, name: str) -> dict[str, Any]:
    """The detail of a new execution of ``name``, once it has finished."""
    started = http.post(f"/inspect/durable/{name}/start", json={"input": None})
    assert started.status_code == 201, started.text
    path = f"/inspect/durable/executions/{started.json()['id']}"
    return poll(lambda: (e := http.get(path).json())["status"] in ("succeeded", "failed", "cancelled") and e,
                timeout=15, what=f"the execution of {name} to finish")  # fmt: skip


def test_a_durable_steps_error_is_recorded(raising: Server) -> None:
    with client(raising) as http:
        failed = finished(http, "failing")
    assert (failed["status"], failed["error_tag"], failed["current_step"]) == ("failed", "RuntimeError", "fail"), failed
    assert failed["error_message"] == 'step "fail" (position 1) failed (one attempt): RuntimeError: step \\ud800'
    [step] = failed["steps"]
    assert (step["status"], step["error_tag"], step["error_message"]) == ("failed", "RuntimeError", "step \\ud800")


def test_a_durable_log_line_and_result_are_recorded(raising: Server) -> None:
    with client(raising) as http:
        chatty = finished(http, "chatty")
        nan = finished(http, "nan")
    assert (chatty["status"], chatty["output"]) == ("succeeded", {"bad": "\\ud800"}), chatty
    # (A NUL in a log line is written as the PostgreSQL store writes it: ``\\0``.)
    assert "said \\ud800 and \\0" in [line["message"] for line in chatty["logs"]]
    # NaN is no JSON: the step fails as such, on both stores.
    assert (nan["status"], nan["error_tag"]) == ("failed", "output_not_json"), nan
