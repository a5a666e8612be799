"""Schedules created at run time through every surface: the backend interface (embedded
and remote, against a real ``schedtui serve``), the HTTP API's statuses, and the
``schedtui schedules`` verbs in real subprocesses (embedded and remote)."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import httpx
import pytest

from backend import BadInput, Engine, NotFound, Unavailable
from backend.client import remote as remote_module
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.definitions import discover_definitions
from backend.scheduler.catalog import CatalogStore
from backend.scheduler.stored import DefinedInCode, NameTaken, NotValidHere, StoredSchedule, check_spec
from backend.store import open_store
from tests.late_answers import FloodAnswers, LoseEveryAnswer, LoseFirstAnswer, TrickleReads
from tests.servers import Server, start_server
from tests.test_cli import Cli, create_store, write_tree

OPERATE = "op-secret"
DEFINITIONS = {
    "schedules/mail.jobs.py": """
        from backend import define_queue

        async def send(job):
            pass

        mail = define_queue(name="mail", handler=send)
    """,
    "schedules/hourly.cron.py": """
        from backend import define_schedule

        async def work(ctx):
            pass

        hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=work)
    """,
}
_names = itertools.count()


@pytest.fixture(scope="module")
def rt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("rt")
    write_tree(root, DEFINITIONS)
    srv = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'state.db'}",
                       "--token", f"alice={OPERATE}")
    yield srv
    assert srv.stop() == 0, srv.log_text()


@pytest.fixture(params=["embedded", "remote"])
async def rt_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        write_tree(tmp_path, DEFINITIONS)
        impl: Backend = EmbeddedBackend(Engine(discover_definitions(tmp_path / "schedules"), f"sqlite:///{tmp_path / 'state.db'}"))
    else:
        impl = RemoteBackend(request.getfixturevalue("rt_server").url, OPERATE)
    await impl.connect()
    yield impl
    await impl.close()


async def test_create_update_delete_through_the_interface(rt_backend: Backend) -> None:
    name = f"reap-{next(_names)}"
    view = await rt_backend.create_schedule(
        {"name": name, "cron": "*/15 * * * *", "timezone": "UTC", "queue": "mail", "payload": {"older_than": "7d"}}
    )
    assert (view.source, view.target and view.target.to_json(), view.payload) == (
        "store", {"kind": "queue", "name": "mail"}, {"older_than": "7d"}
    )
    listed = {s.name: s for s in (await rt_backend.list_schedules()).schedules}
    assert listed[name].source == "store" and listed["hourly"].source == "code"
    assert listed["hourly"].target is not None and listed["hourly"].target.kind == "handler"
    with pytest.raises(NameTaken):
        await rt_backend.create_schedule({"name": name, "cron": "* * * * *", "timezone": "UTC", "queue": "mail"})
    with pytest.raises(NameTaken):
        await rt_backend.create_schedule({"name": "hourly", "cron": "* * * * *", "timezone": "UTC", "queue": "mail"})
    again = await rt_backend.create_schedule(  # the same create by its author: a retry, answered as the first
        {"name": name, "cron": "*/15 * * * *", "timezone": "UTC", "queue": "mail", "payload": {"older_than": "7d"}}
    )
    assert (again.name, again.cron, again.payload) == (name, "*/15 * * * *", {"older_than": "7d"})
    changed = await rt_backend.update_schedule(name, {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "enabled": False})
    assert (changed.cron, changed.timezone, changed.enabled, changed.next_fire_at) == ("0 3 * * *", "Europe/Berlin", False, None)
    # Who and when, as a disable records them ("disabled too long" counts from it): an update
    # that disabled a schedule recorded neither, and its alert never fired.
    assert changed.state_note is not None and changed.state_note.by and changed.state_note.at is not None
    with pytest.raises(BadInput) as bad:
        await rt_backend.update_schedule(name, {"cron": "0 25 * * *"})
    assert bad.value.field == "cron" and "0 25 * * *" in bad.value.message
    with pytest.raises(BadInput, match="nowhere"):
        await rt_backend.update_schedule(name, {"queue": "nowhere"})
    with pytest.raises(DefinedInCode):
        await rt_backend.update_schedule("hourly", {"cron": "5 * * * *"})
    with pytest.raises(DefinedInCode):
        await rt_backend.delete_schedule("hourly")
    await rt_backend.delete_schedule(name)
    with pytest.raises(NotFound):
        await rt_backend.delete_schedule(name)
    with pytest.raises(NotFound):
        await rt_backend.update_schedule(name, {"cron": "5 * * * *"})
    assert name not in {s.name for s in (await rt_backend.list_schedules()).schedules}


async def test_a_deleted_schedules_runs_stay_readable_by_its_name(rt_backend: Backend) -> None:
    """Its runs stay in the ledger until the retention takes them, and both reads of runs
    by name find them: the runs' page and a window of several schedules (the timeline's
    read, which refused the name). A name the ledger has no run of is still NotFound."""
    name = f"gone-{next(_names)}"
    await rt_backend.create_schedule({"name": name, "cron": "0 4 * * *", "timezone": "UTC", "queue": "mail"})
    run = await rt_backend.wait_run((await rt_backend.run_now(name)).id)
    await rt_backend.delete_schedule(name)
    page = await rt_backend.list_runs(name)
    assert [r.id for r in page.runs] == [run.id]
    window = await rt_backend.runs_between(["hourly", name], run.scheduled_at, run.scheduled_at + timedelta(seconds=1))
    assert list(window) == [name] and [r.id for r in window[name]] == [run.id]
    before = await rt_backend.runs_between([name], run.scheduled_at - timedelta(hours=1), run.scheduled_at)
    assert before == {}  # no run in that window, but runs of it in the ledger: not refused
    for names in (["never-was"], ["hourly", "never-was"]):
        with pytest.raises(NotFound, match="never-was"):
            await rt_backend.runs_between(names, run.scheduled_at, run.scheduled_at + timedelta(seconds=1))
    with pytest.raises(NotFound, match="never-was"):
        await rt_backend.list_runs("never-was")


async def test_a_row_not_valid_here_is_listed_refused_and_corrected_through_the_interface(
    rt_backend: Backend, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A row the instance cannot run (written by a release whose time zone database has the
    zone): listed with why, its runs readable, an action on it a 409 naming the problem,
    an update correcting it answered with the schedule running again."""
    name = f"foreign-{next(_names)}"
    folder = tmp_path if isinstance(rt_backend, EmbeddedBackend) else request.getfixturevalue("rt_server").log.parent
    await write_foreign_row(folder, name)
    listed = {s.name: s for s in (await rt_backend.list_schedules()).schedules}
    assert "Mars/Olympus_Mons" in (listed[name].problem or "")
    assert (listed[name].next_fire_at, listed["hourly"].problem) == (None, None)
    assert (await rt_backend.list_runs(name)).runs == []
    with pytest.raises(NotValidHere, match="Mars/Olympus_Mons"):
        await rt_backend.run_now(name)
    fixed = await rt_backend.update_schedule(name, {"timezone": "Asia/Tokyo"})
    assert (fixed.problem, fixed.timezone) == (None, "Asia/Tokyo") and fixed.next_fire_at is not None
    await rt_backend.delete_schedule(name)


async def test_the_api_answers_as_documented(rt_server: Server) -> None:
    auth = {"Authorization": f"Bearer {OPERATE}"}
    async with httpx.AsyncClient(base_url=rt_server.url, headers=auth) as http:
        spec = {"name": "api-made", "cron": "*/5 * * * *", "timezone": "UTC", "queue": "mail"}
        created = await http.post("/inspect/schedules", json=spec)
        assert created.status_code == 201, created.text
        assert created.json()["source"] == "store" and created.json()["target"] == {"kind": "queue", "name": "mail"}
        again = await http.post("/inspect/schedules", json=spec)  # the same create again, by its author
        assert again.status_code == 201 and again.json()["name"] == "api-made", again.text
        other = await http.post("/inspect/schedules", json={**spec, "cron": "*/10 * * * *"})
        assert other.status_code == 409 and other.json()["error"]["code"] == "name_taken"
        bad_cases = [
            ({**spec, "name": "x1", "cron": "nope"}, "cron"),
            ({**spec, "name": "x2", "timezone": "Mars/Base"}, "timezone"),
            ({**spec, "name": "x3", "queue": "ghost"}, "queue"),
            ({"name": "x4", "cron": "* * * * *", "timezone": "UTC"}, "queue"),
            ({**spec, "name": "x5", "durable": "flow"}, "durable"),
            ({**spec, "name": "x6", "backfill": "maybe"}, "backfill"),
            ({**spec, "name": "x7", "max_runtime": "long"}, "max_runtime"),
            ({**spec, "name": "x8", "extra": 1}, "extra"),
            ({**spec, "name": 7}, "name"),
            ({**spec, "name": "x9", "cron": 5}, "cron"),
        ]
        for body, field in bad_cases:
            answer = await http.post("/inspect/schedules", json=body)
            assert answer.status_code == 422 and answer.json()["error"]["field"] == field, (body, answer.text)
        assert (await http.post("/inspect/schedules", content=b"[1]")).status_code == 422
        patched = await http.patch("/inspect/schedules/api-made", json={"description": "made over HTTP"})
        assert patched.status_code == 200 and patched.json()["description"] == "made over HTTP"
        assert (await http.patch("/inspect/schedules/api-made", json={"on_overlap": "x"})).status_code == 422
        code = await http.patch("/inspect/schedules/hourly", json={"cron": "1 * * * *"})
        assert code.status_code == 409 and code.json()["error"]["code"] == "defined_in_code"
        assert (await http.delete("/inspect/schedules/hourly")).json()["error"]["code"] == "defined_in_code"
        assert (await http.patch("/inspect/schedules/ghost", json={"cron": "1 * * * *"})).status_code == 404
        assert (await http.delete("/inspect/schedules/api-made")).status_code == 200
        assert (await http.delete("/inspect/schedules/api-made")).status_code == 404
        read = await http.post("/inspect/schedules", json=spec, headers={"Authorization": "Bearer wrong"})
        assert read.status_code == 401
        entries = (await http.get("/inspect/audit", params={"limit": 10})).json()["entries"]
        mine = [(e["action"], e["actor"], e["detail"].get("again")) for e in entries if e["target"] == "api-made"]
        assert mine == [("schedule.delete", "alice", None), ("schedule.update", "alice", None),
                        ("schedule.create", "alice", True), ("schedule.create", "alice", None)]  # fmt: skip
        update = next(e for e in entries if e["target"] == "api-made" and e["action"] == "schedule.update")
        assert update["detail"]["before"]["description"] is None
        assert update["detail"]["after"]["description"] == "made over HTTP"
        paths = (await http.get("/openapi.json")).json()["paths"]
        assert "post" in paths["/inspect/schedules"]
        assert {"patch", "delete"} <= set(paths["/inspect/schedules/{name}"])
        assert "409" in paths["/inspect/schedules/{name}"]["patch"]["responses"]


@pytest.fixture
def rt_cli(tmp_path: Path) -> Cli:
    write_tree(tmp_path, DEFINITIONS)
    create_store(tmp_path / "state.db")
    return Cli(tmp_path)


async def write_foreign_row(folder: Path, name: str, zone: str = "Mars/Olympus_Mons") -> None:
    """A stored row as a release whose time zone database has ``zone`` writes it."""
    store = open_store(f"sqlite:///{folder / 'state.db'}")
    await store.open()
    try:
        now = datetime.now(UTC)
        full = {**check_spec({"name": name, "cron": "0 4 * * *", "timezone": "UTC", "queue": "mail"}), "timezone": zone}
        assert await cast(CatalogStore, store).create_stored_schedule(
            StoredSchedule(**full, created_at=now, created_by="newer", updated_at=now, updated_by="newer")
        )
    finally:
        await store.close()


async def test_the_cli_lists_a_row_not_valid_here_with_why_and_refuses_to_fire_it(rt_cli: Cli) -> None:
    s = ("--schedules", "schedules")
    await write_foreign_row(rt_cli.root, "foreign")
    table = rt_cli.ok("list", *s).stdout
    row = next(line for line in table.splitlines() if line.startswith("foreign "))
    assert "not valid here" in row and "Mars/Olympus_Mons" in row
    assert "foreign is not valid here: timezone 'Mars/Olympus_Mons'" in table
    fired = rt_cli("fire", "foreign", *s)
    assert fired.returncode == 3 and fired.stderr.count("\n") == 1 and "Mars/Olympus_Mons" in fired.stderr, fired
    fixed = json.loads(rt_cli.ok("schedules", "update", "foreign", "--timezone", "UTC", "--json", *s).stdout)
    assert (fixed["problem"], fixed["timezone"]) == (None, "UTC") and fixed["next_fire_at"] is not None


def test_the_cli_creates_updates_and_deletes_embedded(rt_cli: Cli) -> None:
    s = ("--schedules", "schedules")
    made = rt_cli("schedules", "create", "reap", "--cron", "*/15 * * * *", "--timezone", "UTC", "--queue", "mail",
                  "--payload", '{"older_than": "7d"}', "--description", "old sessions", *s)
    assert made.returncode == 0 and made.stdout.startswith('schedule "reap" created: */15 * * * * (UTC) -> queue mail'), made
    bad = rt_cli("schedules", "create", "x", "--cron", "*/15 * * *", "--timezone", "UTC", "--queue", "mail", *s)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "*/15 * * *" in bad.stderr
    zone = rt_cli("schedules", "create", "x", "--cron", "* * * * *", "--timezone", "Nowhere/Land", "--queue", "mail", *s)
    assert zone.returncode == 2 and "Nowhere/Land" in zone.stderr
    unknown = rt_cli("schedules", "create", "x", "--cron", "* * * * *", "--timezone", "UTC", "--durable", "flow", *s)
    assert unknown.returncode == 2 and '"flow"' in unknown.stderr
    payload = rt_cli("schedules", "create", "x", "--cron", "* * * * *", "--timezone", "UTC", "--queue", "mail", "--payload", "{", *s)
    assert payload.returncode == 2 and "--payload" in payload.stderr
    taken = rt_cli("schedules", "create", "reap", "--cron", "* * * * *", "--timezone", "UTC", "--queue", "mail", *s)
    assert taken.returncode == 3 and "exists already" in taken.stderr
    changed = json.loads(rt_cli.ok("schedules", "update", "reap", "--cron", "0 * * * *", "--disabled", "--json", *s).stdout)
    assert (changed["cron"], changed["enabled"], changed["source"]) == ("0 * * * *", False, "store")
    assert changed["state_note"] is not None and changed["state_note"]["by"]  # as `schedtui disable` records it
    code = rt_cli("schedules", "update", "hourly", "--cron", "5 * * * *", *s)
    assert code.returncode == 3 and "defined in code" in code.stderr
    listed = rt_cli.schedules()
    assert listed["reap"]["description"] == "old sessions" and listed["hourly"]["source"] == "code"
    assert rt_cli.ok("schedules", "delete", "reap", *s).stdout == 'schedule "reap" deleted\n'
    gone = rt_cli("schedules", "delete", "reap", *s)
    assert (gone.returncode, gone.stderr) == (2, 'schedtui: no schedule named "reap"\n')


def test_the_cli_over_the_remote_api(rt_cli: Cli, rt_server: Server) -> None:
    remote = ("--url", rt_server.url, "--token", OPERATE)
    made = rt_cli("schedules", "create", "cli-remote", "--cron", "0 4 * * *", "--timezone", "Europe/Paris",
                  "--queue", "mail", "--json", *remote, store=False)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["timezone"] == "Europe/Paris"
    bad = rt_cli("schedules", "update", "cli-remote", "--on-overlap", "sometimes", *remote, store=False)
    assert bad.returncode == 2 and "sometimes" in bad.stderr
    done = rt_cli("schedules", "delete", "cli-remote", *remote, store=False)
    assert done.returncode == 0, done.stderr
    again = rt_cli("schedules", "delete", "cli-remote", *remote, store=False)
    assert again.returncode == 2 and "no schedule named" in again.stderr


async def test_a_toggle_whose_answer_was_lost_is_not_sent_again_and_says_it_may_have_been_done(rt_server: Server) -> None:
    """A disable held up in a slow server was sent again, answered "disabled", and its
    first copy landed after the enable the operator did next, and undid it (an outside
    attack). A toggle is in doubt instead, sent once."""
    name = f"toggle-{next(_names)}"
    plain = RemoteBackend(rt_server.url, OPERATE)
    await plain.connect()
    await plain.create_schedule({"name": name, "cron": "0 4 * * *", "timezone": "UTC", "queue": "mail"})
    await plain.close()
    transport = LoseFirstAnswer()
    remote = RemoteBackend(rt_server.url, OPERATE, transport=transport, read_retries=(0.0, 0.0))
    await remote.connect()
    try:
        with pytest.raises(Unavailable, match="it may have been done all the same"):
            await remote.disable_schedule(name, note="maintenance")
        assert transport.lost == [f"POST /inspect/schedules/{name}/disable 200"]
        disables = [e for e in (await remote.audit(limit=50)).entries if e.target == name and e.action == "schedule.disable"]
        assert len(disables) == 1
    finally:
        await remote.close()


async def test_an_action_sent_again_whose_every_answer_was_lost_still_says_it_may_have_been_done(rt_server: Server) -> None:
    """A backfill's cancel may be sent again (a late first copy changes nothing); when no
    copy's answer came back, the caller was told nothing of the copies that acted."""
    transport = LoseEveryAnswer()
    remote = RemoteBackend(rt_server.url, OPERATE, transport=transport, read_retries=(0.0, 0.0))
    await remote.connect()
    try:
        with pytest.raises(Unavailable, match="cannot reach .*; it may have been done all the same"):
            await remote.cancel_backfill("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")
    finally:
        await remote.close()
    assert len(transport.lost) == 3  # (sent again twice)


async def test_an_answer_trickled_a_byte_at_a_time_ends_within_the_whole_answers_bound(rt_server: Server) -> None:
    """httpx's timeout bounds each read: an answer trickled a byte every 2 s held the
    command line, and the console's refreshes, for good (an outside attack)."""
    transport = TrickleReads("/inspect/schedules", every=0.05)
    remote = RemoteBackend(rt_server.url, OPERATE, transport=transport, timeout=0.1, read_retries=(0.0,))
    await remote.connect()
    try:
        with pytest.raises(Unavailable, match=r"did not answer in time \(GET /inspect/schedules\)"):
            await remote.list_schedules()
    finally:
        await remote.close()


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "declared"])
async def test_an_answer_past_its_size_bound_is_refused_once_it_passes_it_and_an_action_so_answered_is_in_doubt(
    rt_server: Server, declared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL whose answers never end (a stream, a disk image behind a proxy) was read whole
    into memory by every refresh: the console's memory grew without a word. Now an answer
    is read up to its bound (64 MiB; 1 MiB here) and refused with a sentence; one that
    says it is larger is refused unread; an action so answered may have been done."""
    monkeypatch.setattr(remote_module, "MAX_ANSWER_BYTES", 1024 * 1024)
    transport = FloodAnswers("/inspect/schedules", declared=declared)
    remote = RemoteBackend(rt_server.url, OPERATE, transport=transport, read_retries=(0.0,))
    await remote.connect()
    try:
        said = r"with 10,000,000,000 bytes" if declared else r"with more than 1,048,576 bytes"
        with pytest.raises(Unavailable, match=rf"answered GET /inspect/schedules {said}; is it a schedtui server\?$"):
            await remote.list_schedules()
        (body,) = transport.bodies  # (not read again: no transport error)
        assert body.sent == (0 if declared else 1024 * 1024 + 65536)
        name = f"flooded-{next(_names)}"
        spec = {"name": name, "cron": "0 4 * * *", "timezone": "UTC", "queue": "mail"}
        with pytest.raises(Unavailable, match=rf"{said}; is it a schedtui server\?; it may have been done all the same"):
            await remote.create_schedule(spec)
    finally:
        await remote.close()
    plain = RemoteBackend(rt_server.url, OPERATE)
    try:
        assert name in {view.name for view in (await plain.list_schedules()).schedules}  # it was
    finally:
        await plain.close()


async def test_a_create_whose_answer_was_lost_is_in_doubt_and_made_again_by_hand_answers_as_the_first(
    rt_server: Server,
) -> None:
    """It is not sent again by the client (its first copy, landing late, would make again a
    schedule deleted meanwhile), so the caller sees Unavailable saying it may have been
    done; its repeat by hand, by the same author, answers with the schedule (it was refused
    as name_taken once); the audit log marks the repeat."""
    name = f"lost-answer-{next(_names)}"
    transport = LoseFirstAnswer()
    remote = RemoteBackend(rt_server.url, OPERATE, transport=transport, read_retries=(0.0,))
    await remote.connect()
    try:
        spec = {"name": name, "cron": "0 4 * * *", "timezone": "UTC", "queue": "mail"}
        with pytest.raises(Unavailable, match="it may have been done all the same"):
            await remote.create_schedule(spec)
        assert transport.lost == ["POST /inspect/schedules 201"]
        view = await remote.create_schedule(spec)
        assert (view.name, view.source, view.cron) == (name, "store", "0 4 * * *")
        entries = [e for e in (await remote.audit(limit=50)).entries if e.target == name]
        assert [(e.action, e.actor, (e.detail or {}).get("again")) for e in reversed(entries)] == [
            ("schedule.create", "alice", None), ("schedule.create", "alice", True)
        ]
    finally:
        await remote.close()
