"""Text that is not text, already in a store: rows an older version let in (a lone surrogate
in a durable input, a job payload, a stored schedule, an audit entry; a NUL, an escape
sequence) and a step output a handler returned. Every read still answers, on SQLite and on
PostgreSQL: the API lists and shows each row (200, never a 500) and the CLI prints it
(``--json`` and tables, exit 0, no traceback), with each such character escaped as the
text ``\\ud800`` or ``\\x1b``. (That no route lets such text in is tests/test_api_input.py.)"""

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
