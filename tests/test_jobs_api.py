"""The job queue over the shared backend interface (embedded, and remote against a real
``schedtui serve``), over HTTP (statuses, limits, tokens), and from the CLI (every verb,
embedded and remote, with its exit codes and ``--json`` objects)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import BadInput, Engine, Forbidden, NotFound, TooLarge, Unavailable, discover_definitions
from backend.api.app import create_app
from backend.api.routes import MAX_PAGE_BYTES
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.jobs.definition import MAX_PAYLOAD_BYTES
from backend.jobs.model import NotDead, QueueFull
from tests.late_answers import LoseFirstAnswer
from tests.servers import Server, cli_env, poll, run_main, start_server

OPERATE, READ = "op-jobs-token", "read-jobs-token"
DEFINITIONS = {
    "mail.jobs.py": """
        import asyncio
        from backend import define_queue

        async def deliver(job):
            if job.payload == "fail":
                raise RuntimeError("smtp said no")
            if job.payload == "hang":
                await asyncio.sleep(3600)

        mail = define_queue(name="mail", handler=deliver, attempts=1, concurrency=2)
        held = define_queue(name="held", handler=deliver)
    """,
}
JOB_KEYS = {
    "id", "queue", "status", "payload", "key", "cron", "attempt", "max_attempts", "run_after", "created_at",
    "started_at", "instance", "error_tag", "error_message",
}  # fmt: skip
ATTEMPT_KEYS = {"number", "round", "attempt", "started_at", "finished_at", "status", "error_tag", "error_message", "instance"}
QUEUE_KEYS = {"name", "concurrency", "paused", "queued", "running", "dead", "oldest_queued_at"}


def write_definitions(root: Path) -> Path:
    folder = root / "schedules"
    folder.mkdir(exist_ok=True)
    for name, text in DEFINITIONS.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("jobs-remote")
    write_definitions(root)
    srv = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'state.db'}",
                       "--token", OPERATE, "--read-token", READ)  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


def embedded(tmp_path: Path, **kwargs: Any) -> EmbeddedBackend:
    folder = write_definitions(tmp_path)
    return EmbeddedBackend(Engine(discover_definitions(folder), f"sqlite:///{tmp_path / 'state.db'}"), **kwargs)


@pytest.fixture(params=["embedded", "remote"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    impl: Backend
    if request.param == "embedded":
        impl = embedded(tmp_path, arm=True)  # arm: its workers run, as serve's do
    else:
        impl = RemoteBackend(request.getfixturevalue("server").url, OPERATE)
    await impl.connect()
    await impl.set_queue_paused("held", True)  # what is sent there stays to be looked at
    yield impl
    await impl.close()


@pytest.fixture(params=["embedded", "remote"])
async def read_only(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    impl: Backend
    if request.param == "embedded":
        impl = embedded(tmp_path, read_only=True)
    else:
        impl = RemoteBackend(request.getfixturevalue("server").url, READ)
    await impl.connect()
    yield impl
    await impl.close()


async def dead_job(backend: Backend) -> str:
    sent = await backend.send_job("mail", "fail")

    async def dead() -> bool:
        detail = await backend.get_job(sent.id)
        return detail.job is not None and detail.job.status == "dead"

    for _ in range(400):  # workers run on the real clock here: wait for the outcome
        if await dead():
            return sent.id
        await __import__("asyncio").sleep(0.025)
    raise AssertionError("the job did not die")


# ---------------------------------------------------------------------------------------
# the contract, embedded and remote
# ---------------------------------------------------------------------------------------
async def test_queues_are_listed_with_their_counts(backend: Backend) -> None:
    queues = {q.name: q for q in await backend.list_queues()}
    assert set(queues) >= {"mail", "held"}
    assert set(queues["mail"].to_json()) == QUEUE_KEYS
    assert (queues["mail"].concurrency, queues["held"].paused) == (2, True)


async def test_a_cancel_by_key_never_takes_the_job_whose_id_the_key_equals(backend: Backend) -> None:
    first = await backend.send_job("held", "first", delay=3600)
    keyed = await backend.send_job("held", "keyed", delay=3600, key=first.id)  # its key is the other's id
    assert await backend.cancel_job("held", key=first.id)
    assert (await backend.get_job(first.id)).job is not None  # untouched: still queued
    with pytest.raises(NotFound):
        await backend.get_job(keyed.id)  # cancelled: gone
    assert not await backend.cancel_job("held", key=first.id)
    assert await backend.cancel_job("held", first.id)  # by id
    with pytest.raises(BadInput, match='id "receipt:42" is not a job id') as refused:
        await backend.cancel_job("held", "receipt:42")  # a key is never taken for an id
    assert refused.value.field == "id"
    with pytest.raises(BadInput, match="one of them"):
        await backend.cancel_job("held", first.id, key="k")
    with pytest.raises(BadInput, match="holds \\\\udcff at position 1") as refused:
        await backend.cancel_job("held", key="a\udcff")  # a byte that is not UTF-8, from a command line
    assert refused.value.field == "key"


async def test_send_list_show_cancel_and_delete(backend: Backend) -> None:
    key = f"receipt:{id(backend)}"
    sent = await backend.send_job("held", {"order": 42}, delay=0, attempts=5, key=key)
    again = await backend.send_job("held", {"order": 43}, key=key)
    assert not sent.duplicate and (again.id, again.duplicate) == (sent.id, True)
    later = await backend.send_job("held", "later", delay=3600)
    page = await backend.list_jobs("held", status="queued", limit=1)
    assert [j.id for j in page.jobs] == [later.id] and page.next_before == later.id
    older = await backend.list_jobs("held", status="queued", limit=1000, before=page.next_before)
    assert sent.id in [j.id for j in older.jobs]
    detail = await backend.get_job(sent.id)
    assert detail.job is not None and set(detail.job.to_json()) == JOB_KEYS
    assert (detail.job.payload, detail.job.max_attempts, detail.job.key, detail.attempts) == ({"order": 42}, 5, key, [])
    assert await backend.cancel_job("held", key=key)
    assert not await backend.cancel_job("held", key=key)
    await backend.delete_job("held", later.id)
    with pytest.raises(NotFound):
        await backend.delete_job("held", later.id)
    with pytest.raises(NotFound):
        await backend.get_job(later.id)


async def test_a_dead_job_shows_its_attempts_and_is_retried(backend: Backend) -> None:
    job_id = await dead_job(backend)
    detail = await backend.get_job(job_id)
    assert detail.job is not None and (detail.job.status, detail.job.attempt, detail.job.error_tag) == ("dead", 1, "RuntimeError")
    (attempt,) = detail.attempts
    assert set(attempt.to_json()) == ATTEMPT_KEYS and attempt.error_message == "smtp said no"
    assert job_id in [j.id for j in (await backend.list_jobs("mail", status="dead")).jobs]
    retried = await backend.retry_job("mail", job_id)
    assert (retried.status, retried.attempt, retried.max_attempts) == ("queued", 0, 1)
    with pytest.raises(NotDead, match="not dead"):
        await backend.retry_job("held", (await backend.send_job("held", 1)).id)


async def test_pause_and_resume(backend: Backend) -> None:
    assert (await backend.set_queue_paused("held", True)).paused
    view = await backend.set_queue_paused("held", False)
    assert not view.paused
    await backend.set_queue_paused("held", True)


async def test_bad_input_is_refused_naming_the_value(backend: Backend) -> None:
    with pytest.raises(TooLarge, match="the limit is 262,144 bytes"):
        await backend.send_job("held", "x" * (256 * 1024 + 1))
    with pytest.raises(BadInput, match="delay 2,592,001s is out of range"):
        await backend.send_job("held", delay=30 * 86400 + 1)
    with pytest.raises(BadInput, match="attempts 0 is out of range"):
        await backend.send_job("held", attempts=0)
    with pytest.raises(BadInput, match="the limit is 256 bytes"):
        await backend.send_job("held", key="k" * 300)
    with pytest.raises(NotFound, match='no queue named "ghost"'):
        await backend.send_job("ghost", 1)
    with pytest.raises(BadInput, match='status "lost" is not one of queued, running, dead'):
        await backend.list_jobs("held", status="lost")
    with pytest.raises(NotFound):
        await backend.get_job("not-an-id")


async def test_read_only_reads_but_never_acts(read_only: Backend) -> None:
    assert {q.name for q in await read_only.list_queues()} >= {"mail"}
    for act in (
        read_only.send_job("mail", 1),
        read_only.cancel_job("mail", key="k"),
        read_only.set_queue_paused("mail", True),
        read_only.retry_job("mail", "01J00000000000000000000000"),
        read_only.delete_job("mail", "01J00000000000000000000000"),
    ):
        with pytest.raises(Forbidden):
            await act


# ---------------------------------------------------------------------------------------
# HTTP: statuses and limits
# ---------------------------------------------------------------------------------------
async def test_http_statuses_of_a_send(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}) as http:
        first = await http.post("/inspect/queues/held/jobs", json={"payload": {"a": 1}, "key": "http-k"})
        assert first.status_code == 201 and first.json() == {"id": first.json()["id"], "duplicate": False}
        again = await http.post("/inspect/queues/held/jobs", json={"payload": {"a": 2}, "key": "http-k"})
        assert again.status_code == 200 and again.json() == {"id": first.json()["id"], "duplicate": True}
        big = await http.post("/inspect/queues/held/jobs", json={"payload": "x" * (256 * 1024)})
        assert big.status_code == 413 and big.json()["error"]["code"] == "too_large"
        assert "262,146 bytes of JSON; the limit is 262,144 bytes" in big.json()["error"]["message"]
        huge = await http.post("/inspect/queues/held/jobs", content=b'{"payload": "' + b"x" * (2 * 1024 * 1024) + b'"}')
        assert huge.status_code == 413
        for body, field in (
            ({"delay": -5}, "delay"),
            ({"attempts": 21}, "attempts"),
            ({"key": "k" * 257}, "key"),
            ({"dealy": 5}, "dealy"),
            ({"delay": "soon"}, "delay"),
        ):
            answer = await http.post("/inspect/queues/held/jobs", json=body)
            assert answer.status_code == 422 and answer.json()["error"]["field"] == field, (body, answer.text)
        bad_json = await http.post("/inspect/queues/held/jobs", content=b"{not json")
        assert bad_json.status_code == 422
        assert (await http.post("/inspect/queues/ghost/jobs", json={})).status_code == 404
        cancel = await http.post("/inspect/queues/held/cancel", json={"key": "http-k"})
        assert cancel.json() == {"cancelled": True}
        assert (await http.post("/inspect/queues/held/cancel", json={"id": "a", "key": "b"})).status_code == 422
        listed = await http.get("/inspect/queues")
        assert listed.status_code == 200 and set(listed.json()) == {"now", "queues"}
        assert (await http.get("/inspect/queues/held/jobs", params={"status": "lost"})).status_code == 422
        assert (await http.get("/inspect/queues/held/jobs", params={"limit": 0})).status_code == 422
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {READ}"}) as http:
        assert (await http.get("/inspect/queues/held/jobs")).status_code == 200
        assert (await http.post("/inspect/queues/held/jobs", json={})).status_code == 403
        assert (await http.post("/inspect/queues/held/pause")).status_code == 403
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/inspect/queues")).status_code == 401


async def test_a_full_queue_answers_409_queue_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.store.sqlite import jobs as sqlite_jobs

    monkeypatch.setattr(sqlite_jobs, "MAX_HELD", 1)
    backend = embedded(tmp_path)
    app = create_app(backend, token=OPERATE)
    await backend.connect()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {OPERATE}"}) as http:
            assert (await http.post("/inspect/queues/held/jobs", json={})).status_code == 201
            full = await http.post("/inspect/queues/held/jobs", json={})
            assert full.status_code == 409 and full.json()["error"]["code"] == "queue_full"
            assert 'queue "held" is full' in full.json()["error"]["message"]
            remote = RemoteBackend("http://t", OPERATE, transport=httpx.ASGITransport(app=app))
            with pytest.raises(QueueFull):
                await remote.send_job("held", 1)
            await remote.close()
    finally:
        await backend.close()


async def test_a_page_of_large_jobs_ends_early_and_pages_on(tmp_path: Path) -> None:
    """``?limit=1000`` of jobs near the 256 KiB payload limit was 250 MB of JSON rendered on
    the engine's loop: a page ends past MAX_PAGE_BYTES, its next_before naming its last
    job, and the remote client (the CLI's and the console's) pages on through the rest."""
    backend = embedded(tmp_path)  # not armed: the jobs stay queued
    app = create_app(backend, read_token=READ)
    await backend.connect()
    try:
        payload = "é" + "x" * (MAX_PAYLOAD_BYTES - 100)  # escaped as \u00e9 in the answer: 5 bytes more
        sent = [(await backend.send_job("held", [i, payload])).id for i in range(12)]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {READ}"}) as http:
            first = await http.get("/inspect/queues/held/jobs", params={"limit": 1000})
            page = first.json()
            assert 1 < len(page["jobs"]) < 12 and page["next_before"] == page["jobs"][-1]["id"]
            assert MAX_PAGE_BYTES < len(first.content) < MAX_PAGE_BYTES + MAX_PAYLOAD_BYTES + 1024
            small = (await http.get("/inspect/queues/held/jobs", params={"limit": 2})).json()
            assert [j["id"] for j in small["jobs"]] == sent[:-3:-1]  # within the bound: as asked
        remote = RemoteBackend("http://t", READ, transport=httpx.ASGITransport(app=app))
        # The remote client reads a cut page on until it holds what was asked for, as an
        # embedded backend answers (the CLI's --json printed only the cut page's items).
        everything = await remote.list_jobs("held", limit=1000)
        assert ([job.id for job in everything.jobs], everything.next_before) == (sent[::-1], None)
        seen: list[str] = []
        before: str | None = None
        while True:
            jobs = await remote.list_jobs("held", limit=5, before=before)
            assert len(jobs.jobs) == 5 or jobs.next_before is None
            seen += [job.id for job in jobs.jobs]
            if jobs.next_before is None:
                break
            assert jobs.next_before == jobs.jobs[-1].id
            before = jobs.next_before
        await remote.close()
        assert seen == sent[::-1]  # newest first, each once
    finally:
        await backend.close()


async def test_http_cancel_by_key_takes_the_keyed_job_not_the_one_with_that_id(server: Server) -> None:
    headers = {"Authorization": f"Bearer {OPERATE}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        first = (await http.post("/inspect/queues/held/jobs", json={"delay": 3600})).json()["id"]
        keyed = (await http.post("/inspect/queues/held/jobs", json={"delay": 3600, "key": first})).json()["id"]
        cancelled = await http.post("/inspect/queues/held/cancel", json={"key": first})
        assert cancelled.json() == {"cancelled": True}
        assert (await http.get(f"/inspect/jobs/{first}")).json()["status"] == "queued"
        assert (await http.get(f"/inspect/jobs/{keyed}")).status_code == 404
        assert (await http.post("/inspect/queues/held/cancel", json={"id": first})).json() == {"cancelled": True}


async def test_the_openapi_document_describes_the_job_routes(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        paths = (await http.get("/openapi.json", headers={"Authorization": f"Bearer {READ}"})).json()["paths"]
    assert set(paths["/inspect/queues/{queue}/jobs"]) == {"get", "post"}
    assert {"201", "200", "409", "413", "422"} <= set(paths["/inspect/queues/{queue}/jobs"]["post"]["responses"])
    for path in ("/inspect/queues", "/inspect/jobs/{job_id}", "/inspect/queues/{queue}/cancel",
                 "/inspect/queues/{queue}/jobs/{job_id}", "/inspect/queues/{queue}/jobs/{job_id}/retry",
                 "/inspect/queues/{queue}/pause", "/inspect/queues/{queue}/resume"):  # fmt: skip
        assert path in paths


# ---------------------------------------------------------------------------------------
# the CLI, embedded and remote
# ---------------------------------------------------------------------------------------
def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args], cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60
    )


@pytest.fixture(params=["embedded", "remote"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "remote":
        return ["--url", request.getfixturevalue("server").url, "--token-file", str(_token_file(tmp_path))]
    write_definitions(tmp_path)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    serve = start_server(tmp_path, "--schedules", "schedules", "--store", store)  # creates the store, runs workers
    request.addfinalizer(lambda: serve.stop())
    return ["--schedules", str(tmp_path / "schedules"), "--store", store]


def _token_file(folder: Path) -> Path:
    path = folder / "token"
    path.write_text(OPERATE)
    return path


def test_every_job_verb_with_its_exit_code(where: list[str], tmp_path: Path) -> None:
    def cli(*args: str, real: bool = False) -> subprocess.CompletedProcess[str]:
        # In this process (main(argv)); ``real``: the installed entry point in its own
        # process, where the exit code and the one line on stderr are the process's.
        return (run_cli if real else run_main)(tmp_path, *args, *where)

    done = cli("queues", "pause", "held", real=True)
    assert done.returncode == 0 and "held paused" in done.stdout, done.stderr
    queues = json.loads(cli("queues", "--json").stdout)
    assert {q["name"] for q in queues} >= {"mail", "held"} and all(set(q) == QUEUE_KEYS for q in queues)

    key = f"cli-{tmp_path.name}"
    sent = json.loads(cli("jobs", "send", "held", "--payload", '{"order": 42}', "--key", key, "--attempts", "4", "--json").stdout)
    assert set(sent) == {"id", "duplicate"} and not sent["duplicate"]
    dup = cli("jobs", "send", "held", "--key", key)
    assert dup.returncode == 0 and f"duplicate: job {sent['id']}" in dup.stdout
    listed = json.loads(cli("jobs", "list", "held", "--status", "queued", "--json").stdout)
    assert sent["id"] in [j["id"] for j in listed] and all(set(j) == JOB_KEYS for j in listed)
    shown = json.loads(cli("jobs", "show", sent["id"], "--json").stdout)
    assert (shown["payload"], shown["max_attempts"], shown["attempts"]) == ({"order": 42}, 4, [])
    text = cli("jobs", "show", sent["id"])
    assert "queued, attempt 0/4" in text.stdout and f"key        {key}" in text.stdout

    for args, code, message in (
        (("jobs", "send", "held", "--payload", "{"), 2, "--payload \"{\" is not valid JSON"),
        (("jobs", "send", "held", "--delay", "99999999"), 2, "delay 99,999,999s is out of range"),
        (("jobs", "send", "held", "--attempts", "0"), 2, "attempts 0 is out of range (1-20)"),
        (("jobs", "send", "held", "--key", "k" * 300), 2, "the limit is 256 bytes"),
        (("jobs", "send", "ghost"), 2, 'no queue named "ghost"'),
        (("jobs", "cancel", "held", "nothing-here"), 1, 'no queued job with key "nothing-here" in held'),
        (("jobs", "retry", "held", sent["id"]), 1, "is queued, not dead"),
        (("jobs", "show", "01J00000000000000000000000"), 2, "no job with id"),
        (("queues", "pause"), 2, "say `schedtui queues pause QUEUE`"),
    ):
        done = cli(*args, real=args[-1] in ("{", "nothing-here"))  # a refusal (2) and a failure (1), for real
        assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)

    assert cli("jobs", "cancel", "held", key).returncode == 0
    other = json.loads(cli("jobs", "send", "held", "--delay", "3600", "--json").stdout)
    assert cli("jobs", "delete", "held", other["id"]).returncode == 0
    assert cli("jobs", "delete", "held", other["id"]).returncode == 2

    failing = json.loads(cli("jobs", "send", "mail", "--payload", '"fail"', "--json").stdout)
    poll(lambda: json.loads(cli("jobs", "show", failing["id"], "--json").stdout)["status"] == "dead",
         timeout=30, what="the job to die")  # fmt: skip
    shown = cli("jobs", "show", failing["id"])
    assert "dead, attempt 1/1" in shown.stdout and "[RuntimeError] smtp said no" in shown.stdout
    retried = json.loads(cli("jobs", "retry", "mail", failing["id"], "--json").stdout)
    assert retried["attempt"] == 0 and retried["status"] in ("queued", "running", "dead")
    table = cli("jobs", "list", "mail")
    assert table.stdout.splitlines()[0].split() == ["ID", "STATUS", "ATTEMPT", "WHEN", "KEY", "CRON", "LAST", "ERROR"]
    assert cli("queues", "resume", "held", real=True).returncode == 0


def test_jobs_cancel_takes_an_id_shaped_argument_as_an_id_and_key_as_a_key(where: list[str], tmp_path: Path) -> None:
    def cli(*args: str, real: bool = False) -> subprocess.CompletedProcess[str]:
        return (run_cli if real else run_main)(tmp_path, *args, *where)

    def sent(*args: str) -> str:
        return str(json.loads(cli("jobs", "send", "held", "--delay", "3600", *args, "--json").stdout)["id"])

    first = sent()
    keyed = sent("--key", first)  # its key is the other's id
    done = cli("jobs", "cancel", "held", "--key", first)
    assert (done.returncode, done.stdout.strip()) == (0, f'cancelled the job with key "{first}" in held'), done.stderr
    assert cli("jobs", "show", keyed).returncode == 2  # gone
    assert json.loads(cli("jobs", "show", first, "--json").stdout)["status"] == "queued"
    done = cli("jobs", "cancel", "held", first)  # the shape of an id: an id
    assert (done.returncode, done.stdout.strip()) == (0, f"cancelled job {first} in held"), done.stderr
    for args, message in (
        (("jobs", "cancel", "held"), "say which job"),
        (("jobs", "cancel", "held", first, "--key", "k"), "say which job"),
        # A byte that is not UTF-8 reaches Python as a lone surrogate: one line, no traceback.
        (("jobs", "cancel", "held", "a\udcff"), 'key "a\\udcff" holds \\udcff at position 1'),
    ):
        done = cli(*args, real="\udcff" in args[-1])  # the byte goes through the OS's argv
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_a_send_whose_answer_was_lost_is_never_sent_again_key_or_not(server: Server) -> None:
    """A send whose answer was lost is in doubt, with a dedupe key too: sent again, the key
    refuses the repeat only while the first job is queued, running or dead, and a short job
    had succeeded by then (an outside attack ran it twice). The caller sees Unavailable
    saying it may have been done, and the one job; sending again by hand with the key is
    then a duplicate."""
    for key in ("lost-answer-report", None):
        transport = LoseFirstAnswer()
        remote = RemoteBackend(server.url, OPERATE, transport=transport, read_retries=(0.0,))
        await remote.connect()
        try:
            before = {job.id for job in (await remote.list_jobs("held", status="queued", limit=500)).jobs}
            with pytest.raises(Unavailable, match="cannot reach .*; it may have been done all the same"):
                await remote.send_job("held", {"to": "x"}, delay=3600, key=key)
            assert transport.lost == ["POST /inspect/queues/held/jobs 201"]
            new = [job for job in (await remote.list_jobs("held", status="queued", limit=500)).jobs if job.id not in before]
            assert [job.key for job in new] == [key]
            if key is not None:
                again = await remote.send_job("held", {"to": "x"}, delay=3600, key=key)
                assert again.duplicate and again.id == new[0].id
        finally:
            await remote.close()


async def test_a_payload_nested_past_the_bound_is_refused_and_a_stored_one_never_fails_a_page(
    server: Server, tmp_path: Path
) -> None:
    """A payload may nest 64 levels; one level more is refused (422 naming the bound). A
    payload nested 960 deep used to be taken, and every page of its queue then answered 500
    for good (the page wraps it deeper, past where Python's encoder runs out of stack): a
    row stored that deep, or deeper than a parse can go, now reads cut short."""

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value

    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}) as http:
        assert (await http.post("/inspect/queues/held/pause")).status_code == 200  # (what is sent stays queued)
        fits = await http.post("/inspect/queues/held/jobs", json={"payload": nested(64)})
        assert fits.status_code == 201, fits.text
        deeper = await http.post("/inspect/queues/held/jobs", json={"payload": nested(65)})
        assert deeper.status_code == 422 and deeper.json()["error"]["field"] == "payload", deeper.text
        assert "64 levels deep at most (it nests 65)" in deeper.json()["error"]["message"]
        for depth in (960, 20_000):  # (stored before the bound: written here behind the server's back)
            sent = await http.post("/inspect/queues/held/jobs", json={"payload": "placeholder"})
            job = sent.json()["id"]
            with sqlite3.connect(server.log.parent / "state.db") as db:  # (the fixture serves the store beside its log)
                db.execute("UPDATE jobs SET payload = ? WHERE id = ?", ("[" * depth + "]" * depth, job))
            page = await http.get("/inspect/queues/held/jobs", params={"limit": 500})
            assert page.status_code == 200, (depth, page.text[:300])
            shown = next(item for item in page.json()["jobs"] if item["id"] == job)
            assert "nested too deeply to be shown" in json.dumps(shown["payload"]), depth
            one = await http.get(f"/inspect/jobs/{job}")
            assert one.status_code == 200, (depth, one.text[:300])
