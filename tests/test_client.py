"""``connect()`` and ``connect_sync()``: acting on a store from any process, no engine
running; and the remote client (:class:`RemoteBackend`, what ``--url`` and a remote
console use) on what it sends and what it reads, against real HTTP servers."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import Engine, ManualClock, RunContext, connect, connect_sync, define_schedule
from backend.client.actions import ACTIONS, Id
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend
from backend.errors import BadInput, NotFound, Refused, Unavailable
from tests.servers import FOREIGN_ANSWERS, INSPECT_INFO, Reply, Server, json_server, start_server

CALLS: list[str] = []


async def digest(ctx: RunContext) -> None:
    CALLS.append(ctx.trigger)


def schedules() -> list[Any]:
    return [define_schedule(name="digest", cron="0 9 * * *", timezone="Europe/Berlin", handler=digest)]


async def test_connect_lists_fires_and_disables_without_arming_timers(store_url: str) -> None:
    CALLS.clear()
    async with connect(store_url, definitions=schedules(), actor="alice", create=True) as st:
        assert st.engine.timers.wheel.next_at() is None  # nothing armed, nothing fires on the clock
        [view] = await st.schedules.list()
        assert (view.name, view.enabled) == ("digest", True)
        run = await st.schedules.fire("digest")
        assert (run.status, run.trigger) == ("succeeded", "manual") and CALLS == ["manual"]
        view = await st.schedules.disable("digest", note="vendor outage")
        assert view.state_note is not None and (view.state_note.by, view.state_note.note) == ("alice", "vendor outage")
        runs, _ = await st.schedules.runs("digest")
        assert [r.id for r in runs] == [run.id]
        audit = await st.engine.audit.list()
        assert [(e.actor, e.action) for e in audit.entries] == [("alice", "schedule.disable"), ("alice", "schedule.fire")]
    # What it did is in the store for everyone: an engine opened afterwards sees it.
    engine = Engine(schedules(), store_url, clock=ManualClock("2026-03-02T08:00:00Z"))
    await engine.open()
    try:
        assert not engine.is_enabled("digest")
    finally:
        await engine.stop()


async def test_connect_plans_and_runs_a_backfill(store_url: str) -> None:
    CALLS.clear()
    async with connect(store_url, definitions=schedules(), create=True) as st:
        now = st.engine.clock.now()
        plan = await st.schedules.plan_backfill("digest", now - timedelta(days=3), now)
        assert plan.ok and plan.count == 3
        progress = await st.schedules.backfill("digest", now - timedelta(days=3), now)
        assert (progress.state, progress.fired) == ("done", 3) and CALLS == ["manual"] * 3


async def test_connect_plans_as_the_api_does_and_skips_what_succeeded(store_url: str) -> None:
    CALLS.clear()
    async with connect(store_url, definitions=schedules(), create=True) as st:
        now = st.engine.clock.now()
        await st.schedules.backfill("digest", now - timedelta(days=3), now)
        plan = await st.schedules.plan_backfill("digest", now - timedelta(days=4), now)
        assert (plan.count, plan.already_succeeded, plan.on_overlap) == (4, 3, "skip")
        assert plan.live_slots is not None  # its runs are timed now
        # The plan the HTTP API, the CLI and the console show, field for field.
        served = await EmbeddedBackend(st.engine).plan_backfill("digest", now - timedelta(days=4), now)
        assert plan.to_json() == served.to_json()
        progress = await st.schedules.backfill("digest", now - timedelta(days=4), now, skip_succeeded=True)
        assert (progress.state, progress.total, progress.fired) == ("done", 1, 1) and CALLS == ["manual"] * 4
        with pytest.raises(Refused, match="every slot in the range already succeeded"):
            await st.schedules.backfill("digest", now - timedelta(days=4), now, skip_succeeded=True)
        with pytest.raises(BadInput, match="limit 0 is out of range"):
            await st.schedules.plan_backfill("digest", now - timedelta(days=4), now, limit=0)
        # What is no datetime is refused naming it, from connect() and from the engine alike.
        for plan_backfill in (st.schedules.plan_backfill, st.engine.plan_backfill):
            year_1 = datetime(1, 1, 1, tzinfo=UTC)
            for start, end, message in [("-2d", now, "from '-2d' is not a datetime"), (now, None, "to None is not a datetime"),
                                        (1764547200, now, "from 1764547200 is not a datetime"),
                                        (year_1, now, 'from "0001-01-01T00:00:00[+]00:00" is out of range')]:  # fmt: skip
                with pytest.raises(BadInput, match=message):
                    await plan_backfill("digest", start, end)  # type: ignore[arg-type]


async def test_connect_creates_updates_and_deletes_stored_schedules(store_url: str) -> None:
    """The README's names: st.schedules.create/update/delete; and NotDead beside QueueFull."""
    from backend import NotDead, QueueFull
    from backend.jobs import define_queue
    from backend.scheduler.stored import DefinedInCode

    async def job(ctx: Any) -> None:
        pass

    assert issubclass(NotDead, Refused) and issubclass(QueueFull, Refused)
    definitions = [*schedules(), define_queue(name="mail", handler=job)]
    async with connect(store_url, definitions=definitions, actor="alice", create=True) as st:
        view = await st.schedules.create({"name": "reap", "cron": "*/15 * * * *", "timezone": "UTC", "queue": "mail"})
        assert (view.name, view.source) == ("reap", "store")
        view = await st.schedules.update("reap", {"cron": "0 * * * *"})
        assert view.cron == "0 * * * *"
        with pytest.raises(BadInput, match='"\\* \\* \\*"'):
            await st.schedules.update("reap", {"cron": "* * *"})
        with pytest.raises(DefinedInCode):
            await st.schedules.delete("digest")
        await st.schedules.delete("reap")
        assert [v.name for v in await st.schedules.list()] == ["digest"]
        audit = await st.engine.audit.list()
        assert [(e.actor, e.action) for e in reversed(audit.entries)] == [
            ("alice", "schedule.create"), ("alice", "schedule.update"), ("alice", "schedule.delete")
        ]  # fmt: skip


async def test_lengths_of_a_stored_schedule_may_be_timedeltas_as_in_code(store_url: str) -> None:
    """``max_runtime`` and the alert's seconds are "seconds or a timedelta" in code; a stored
    schedule given one failed in the store's driver (``sqlite3.ProgrammingError``: no
    SchedtuiError), or was refused as "alert is not JSON"."""
    from backend.jobs import define_queue

    async def job(ctx: Any) -> None:
        pass

    async with connect(store_url, definitions=[define_queue(name="mail", handler=job)], create=True) as st:
        spec = {"name": "reap", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail",
                "max_runtime": timedelta(minutes=5), "alert": {"late": timedelta(hours=1), "failing": 2}}  # fmt: skip
        view = await st.schedules.create(spec)
        assert view.max_runtime_s == 300
        view = await st.schedules.update("reap", {"max_runtime": timedelta(minutes=7)})
        assert view.max_runtime_s == 420
        with pytest.raises(BadInput, match="max_runtime 691200"):
            await st.schedules.update("reap", {"max_runtime": timedelta(days=8)})


async def test_the_python_api_refuses_what_the_api_and_the_cli_refuse(store_url: str) -> None:
    """A name that is no text was a TypeError (unhashable list), jobs that are no list one
    too; a ``before`` that is no run id (empty included) was taken, answering a first page
    or nothing, where the API and the CLI refuse it."""
    from backend.jobs import define_queue

    async def job(ctx: Any) -> None:
        pass

    fired = CALLS.count("manual")
    async with connect(store_url, definitions=[*schedules(), define_queue(name="mail", handler=job)], create=True) as st:
        for call in (lambda: st.schedules.fire(["digest"]), lambda: st.schedules.runs(["digest"]),  # type: ignore[arg-type]
                     lambda: st.schedules.get(None)):  # type: ignore[arg-type]  # fmt: skip
            with pytest.raises(BadInput, match="schedule name .* is not text"):
                await call()
        with pytest.raises(BadInput, match="jobs 5 is not a list of mappings"):
            await st.jobs.send_many("mail", 5)  # type: ignore[arg-type]
        for before in ("x", ""):
            with pytest.raises(BadInput, match=f'before "{before}" is not a run id'):
                await st.schedules.runs("digest", before=before)
        # Named as the API names them (a job's, an execution's: it said "a run id").
        with pytest.raises(BadInput, match='before "x" is not a job id'):
            await st.jobs.list("mail", before="x")
        with pytest.raises(BadInput, match='before "x" is not an execution id'):
            await st.durable.list(before="x")
        assert CALLS.count("manual") == fired


async def test_without_definitions_a_schedule_is_unknown_and_says_so(store_url: str) -> None:
    with pytest.raises(NotFound, match="no store at"):
        async with connect(store_url):
            pass
    async with connect(store_url, create=True) as st:
        assert await st.schedules.list() == []
        with pytest.raises(NotFound, match='no schedule named "digest"'):
            await st.schedules.fire("digest")


def test_connect_sync_blocks_and_returns_the_same_values(store_url: str) -> None:
    CALLS.clear()
    with connect_sync(store_url, definitions=schedules(), create=True) as st:
        [view] = st.schedules.list()
        assert view.name == "digest"
        run = st.schedules.fire("digest")
        assert run.status == "succeeded"
        assert st.schedules.disable("digest").enabled is False
    with connect_sync(store_url, definitions=schedules()) as st:
        assert st.schedules.get("digest").enabled is False


@pytest.mark.postgres
async def test_connect_on_postgresql(pg_url: str) -> None:
    async with connect(pg_url, definitions=schedules()) as st:
        run = await st.schedules.fire("digest")
        assert run.status == "succeeded"
    async with connect(pg_url, definitions=schedules()) as st:
        assert (await st.schedules.get_run(run.id)).status == "succeeded"


# ---------------------------------------------------------------------------------------
# the remote client: what no request can carry, and answers it cannot read
# ---------------------------------------------------------------------------------------
OPERATE = "op-client-token"
DEFINITIONS = """
    from backend import define_durable, define_queue, define_schedule

    async def work(ctx):
        pass

    async def deliver(job):
        pass

    async def waits(ctx, input):
        return await ctx.wait_for("go", timeout=3600)

    okay = define_schedule(name="okay", cron="0 * * * *", timezone="UTC", handler=work)
    mailer = define_queue(name="mailer", handler=deliver)
    flow = define_durable(name="flow", handler=waits)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "all.cron.py").write_text(textwrap.dedent(DEFINITIONS))
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", f"alice={OPERATE}")
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


@pytest.fixture
async def remote(server: Server) -> AsyncIterator[RemoteBackend]:
    backend = RemoteBackend(server.url, OPERATE)
    await backend.connect()
    yield backend
    await backend.close()


SPEC = {"name": "inf", "cron": "@daily", "timezone": "UTC", "queue": "mailer"}
BAD = "a\udcffb"  # what the bytes a\xffb of a command line become


async def test_what_no_request_can_carry_is_bad_input_naming_the_field(remote: RemoteBackend) -> None:
    """A lone surrogate in a path, a query or a body, and NaN or an infinity in a body,
    reached the HTTP library's encoders, whose UnicodeEncodeError and ValueError went up
    as they were: a traceback on the command line, and nothing at all from the console's
    schedule form (its worker catches SchedtuiError). Each is now BadInput naming the field
    (a text: its value, escaped), and nothing is sent."""
    execution = await remote.start_execution("flow", None)
    audited = len((await remote.audit()).entries)
    inf, nan = float("inf"), float("nan")
    cases: list[tuple[Callable[[], Awaitable[object]], str, str]] = [
        # in the path
        (lambda: remote.enable_schedule(BAD), "name", 'name "a\\udcffb" holds \\udcff at position 1'),
        (lambda: remote.disable_schedule(BAD), "name", 'name "a\\udcffb" holds \\udcff at position 1'),
        (lambda: remote.run_now(BAD), "name", 'name "a\\udcffb"'),
        (lambda: remote.update_schedule(BAD, {"description": "x"}), "name", 'name "a\\udcffb"'),
        (lambda: remote.delete_schedule(BAD), "name", 'name "a\\udcffb"'),
        (lambda: remote.start_execution(BAD, None), "function", 'function "a\\udcffb"'),
        (lambda: remote.signal_execution(execution.id, "g\udcffo", None), "name", 'name "g\\udcffo"'),
        # in the query
        (lambda: remote.list_runs(BAD), "name", 'name "a\\udcffb"'),
        (lambda: remote.list_executions(BAD), "function", 'function "a\\udcffb"'),
        # in the body
        (lambda: remote.create_schedule({**SPEC, "name": BAD}), "name", 'name "a\\udcffb"'),
        (lambda: remote.update_schedule("okay", {"description": BAD}), "description", 'description "a\\udcffb"'),
        (lambda: remote.create_schedule({**SPEC, "payload": {"a": inf}}), "payload", "payload is not JSON (Out of range"),
        (lambda: remote.create_schedule({**SPEC, "alert": {"late": nan}}), "alert", "alert is not JSON (Out of range"),
        (lambda: remote.create_schedule({**SPEC, "max_runtime": inf}), "max_runtime", "max_runtime is not JSON"),
        (lambda: remote.update_schedule("okay", {"payload": [-inf]}), "payload", "payload is not JSON (Out of range"),
        (lambda: remote.create_schedule({**SPEC, "payload": object()}), "payload", "payload is not JSON (Object of type"),
    ]
    for call, field, said in cases:
        with pytest.raises(BadInput) as caught:
            await call()
        assert (caught.value.field, caught.value.message[: len(said)]) == (field, said)
    # The ones that already were refused so say it as before (the same check, one place).
    with pytest.raises(BadInput, match=r"^payload is not JSON \(Out of range"):
        await remote.send_job("mailer", inf)
    with pytest.raises(BadInput, match=r"^input is not JSON \(Out of range"):
        await remote.start_execution("flow", nan)
    assert len((await remote.audit()).entries) == audited  # nothing was done
    assert [view.name for view in (await remote.list_schedules()).schedules] == ["okay"]


def _arguments(action_name: str) -> dict[str, Any]:
    """Arguments every action takes (and checks) for its required parameters."""
    now = datetime.now(UTC)
    given: dict[str, Any] = {"start": now - timedelta(hours=2), "end": now, "names": ["okay"], "spec": SPEC,
                             "changes": {"description": "d"}}
    arguments: dict[str, Any] = {}
    for param in ACTIONS[action_name].params:
        if not param.required and param.name != "id":  # cancel_job takes an id or a key
            continue
        if param.name in given:
            arguments[param.name] = given[param.name]
        elif any(isinstance(limit, Id) for limit in param.limits) or param.name == "id":
            arguments[param.name] = "01M91WS9V65X1GQNEAYQZVK8HQ"
        else:
            arguments[param.name] = "okay"
    return arguments


@pytest.mark.parametrize("body", [{}, None, [], "ok", {"deleted": False}])
async def test_every_action_reads_an_answer_of_another_shape_as_a_server_it_cannot_use(body: object) -> None:
    """A server that is not schedtui's answered 200 with JSON of another shape: the client
    handed it to the models, and the KeyError, TypeError or AttributeError went up (or
    ``null`` was returned as the model, and a delete was taken for done). Now every read
    is the client's Unavailable for a server it cannot use, as an answer without JSON is,
    naming the route and what was wrong."""
    answer: Callable[[str, str], object] = lambda method, path: INSPECT_INFO if path == "/inspect/info" else body  # noqa: E731
    with json_server(answer) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            assert (await backend.connect()).instance == "web-1:4242"
            for name in ACTIONS:
                with pytest.raises(Unavailable) as caught:
                    await getattr(backend, name)(**_arguments(name))
                said = caught.value.message
                assert said.startswith(f"{url} answered ") and said.endswith("; is it a schedtui server?"), (name, said)
            with pytest.raises(Unavailable, match="answered GET /healthz with JSON schedtui cannot read"):
                await backend.health()
        finally:
            await backend.close()
    with json_server(lambda method, path: body) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            with pytest.raises(Unavailable, match=r"answered GET /inspect/info with JSON schedtui cannot read \("):
                await backend.connect()
            with pytest.raises(Unavailable, match=r"answered GET /inspect/info with JSON schedtui cannot read \("):
                await backend.now()
        finally:
            await backend.close()


@pytest.mark.parametrize(("reply", "body"), FOREIGN_ANSWERS)
async def test_a_refusal_that_is_not_schedtuis_is_a_server_it_cannot_use(reply: Reply, body: str) -> None:
    """Another web app's 404 page was schedtui's NotFound ("answered 404", no route): the
    CLI's exit code 2, bad input; a 200 without JSON named no route. Each is the
    Unavailable of a server the client cannot use, for every action past /inspect/info
    too, naming the route and what came instead."""
    with json_server(lambda method, path: reply) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            with pytest.raises(Unavailable) as caught:
                await backend.connect()
            assert caught.value.message == (
                f"{url} answered GET /inspect/info with {reply.status} and {body}; is it a schedtui server?"
            )
        finally:
            await backend.close()
    answer = lambda method, path: INSPECT_INFO if path == "/inspect/info" else reply  # noqa: E731
    with json_server(answer) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            await backend.connect()
            for name in ACTIONS:
                action = ACTIONS[name]
                with pytest.raises(Unavailable) as caught:
                    await getattr(backend, name)(**_arguments(name))
                said = caught.value.message
                assert said.startswith(f"{url} answered {action.http.method} /") and said.endswith(
                    f" with {reply.status} and {body}; is it a schedtui server?"
                ), (name, said)
            with pytest.raises(Unavailable, match=f"answered GET /healthz with {reply.status} and "):
                await backend.health()
        finally:
            await backend.close()


async def test_schedtuis_own_refusals_are_still_what_they_say() -> None:
    """The same statuses in the API's own shape keep their meaning (and the route's name
    where the message says nothing)."""
    refusals = {
        "/inspect/runs/01M91WS9V65X1GQNEAYQZVK8HQ": Reply(404, b'{"error": {"code": "not_found", "message": "no run 1"}}',
                                                          "application/json"),
        "/inspect/schedules": Reply(422, b'{"error": {"code": "bad_input", "message": "cron: no", "field": "cron"}}',
                                    "application/json"),
        "/inspect/queues": Reply(500, b"<html>oops</html>"),
        "/inspect/locks/x/release": Reply(500, b"<html>oops</html>"),
    }  # fmt: skip
    answer = lambda method, path: refusals.get(path, INSPECT_INFO)  # noqa: E731
    with json_server(answer) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            await backend.connect()
            with pytest.raises(NotFound, match="^no run 1$"):
                await backend.get_run("01M91WS9V65X1GQNEAYQZVK8HQ")
            with pytest.raises(BadInput, match="^cron: no$") as bad:
                await backend.create_schedule(SPEC)
            assert bad.value.field == "cron"
            # A 500 is the server failing: an outage (the console marks its data stale and
            # retries; it reported an error at every poll, the data shown as fresh), in doubt
            # for an action.
            with pytest.raises(Unavailable, match=f"^{url} answered GET /inspect/queues with 500$"):
                await backend.list_queues()
            with pytest.raises(Unavailable, match="with 500; it may have been done all the same: look before doing it again$"):
                await backend.release_lock("x")
        finally:
            await backend.close()


@pytest.mark.parametrize(
    ("info", "problem"),
    [
        ({"status": "ok"}, 'no field "coordination"'),
        ({**INSPECT_INFO, "instance": 7}, "instance is a number, not a string"),
        ({**INSPECT_INFO, "systems": "schedules"}, "a string where an array was due"),
        ({**INSPECT_INFO, "now": None}, "null where a string was due"),
    ],
)
async def test_what_was_wrong_with_an_answer_is_named(info: Mapping[str, Any], problem: str) -> None:
    with json_server(lambda method, path: info) as url:
        backend = RemoteBackend(url, read_retries=())
        try:
            with pytest.raises(Unavailable) as caught:
                await backend.connect()
                await backend.now()
        finally:
            await backend.close()
    assert caught.value.message == (
        f"{url} answered GET /inspect/info with JSON schedtui cannot read ({problem}); is it a schedtui server?"
    )


async def test_an_idle_connection_is_let_go_before_the_server_closes_it() -> None:
    """A create sent from the console on a connection idle for the server's keep-alive
    (5 s, httpx's default too) met the server closing it: ReadError, and "it may have been
    done all the same" for a create that never reached the server (seen under load). The
    client lets an idle connection go well before the server does."""
    from backend.api.server import KEEP_ALIVE
    from backend.client.remote import KEEPALIVE_EXPIRY

    backend = RemoteBackend("http://127.0.0.1:9")
    try:
        pool = backend._client._transport._pool  # type: ignore[attr-defined]  # (httpx's own pool)
        assert pool._keepalive_expiry == KEEPALIVE_EXPIRY <= KEEP_ALIVE / 2
    finally:
        await backend.close()


async def test_a_read_the_server_let_time_out_is_not_sent_again_but_one_reset_is() -> None:
    """A frozen server (SIGSTOP) accepts connections and answers nothing: each read waited
    its 10 s timeout four times over (its three retries), so a command line hung 42 s and
    the console's header stayed calm as long. A timed-out read now fails at once; a server
    that resets the connection (going away and back) is still asked again."""
    held: list[socket.socket] = []
    resets = 2
    listener = socket.create_server(("127.0.0.1", 0))
    reset_first = threading.Event()

    def serves() -> None:  # holds every request unanswered, or resets the first ones
        nonlocal resets
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            if reset_first.is_set() and resets:
                resets -= 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # (RST: the client's read fails at once)
                continue
            held.append(conn)

    class Counting(httpx.AsyncHTTPTransport):
        sent = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            Counting.sent += 1
            return await super().handle_async_request(request)

    thread = threading.Thread(target=serves, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    backend = RemoteBackend(url, timeout=0.2, read_retries=(0.0, 0.0, 0.0), transport=Counting())
    try:
        with pytest.raises(Unavailable, match="did not answer in time"):
            await backend.get_run("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")
        assert Counting.sent == 1  # (four before: the request and its three retries)
        reset_first.set()
        with pytest.raises(Unavailable, match="did not answer in time"):
            await backend.get_run("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")
        assert Counting.sent == 4 and resets == 0  # reset twice, asked again each time
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in held:
            conn.close()
        await backend.close()
        thread.join(5)


async def test_an_action_whose_answer_never_came_says_it_may_have_been_done() -> None:
    """A Run now to a frozen server answered "did not answer in time"; once it woke, it
    fired, and the operator who pressed r again ran it twice. An action's request that
    went out unanswered says it may have been done; a read's does not."""
    received = threading.Event()
    release = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def holds() -> None:  # reads each request, answers none (SIGSTOPped, as far as a client can tell)
        held = []
        while not release.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            held.append(conn)
            received.set()
        for conn in held:
            conn.close()

    thread = threading.Thread(target=holds, daemon=True)
    thread.start()
    backend = RemoteBackend(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.3, read_retries=())
    try:
        with pytest.raises(Unavailable) as acting:
            await backend.run_now("nightly")
        assert acting.value.message.endswith("(POST /inspect/schedules/nightly/fire); it may have been done all the same: "
                                             "look before doing it again")  # fmt: skip
        with pytest.raises(Unavailable) as reading:
            await backend.get_run("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")
        assert "it may have been done" not in reading.value.message
        # The request reached the server: its thread may read it later than the client's
        # 0.3 s bound (a loaded machine), not never (the bound only stops a broken test).
        assert received.wait(10)
    finally:
        release.set()
        listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept; close alone does not)
        listener.close()
        await backend.close()
        thread.join(5)


async def test_the_engines_own_thread_runs_on_whatever_a_handler_does_to_its_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The console's engine runs on a loop of its own thread. A handler that stopped that
    loop (``loop.stop()``), or whose own task raised ``SystemExit`` or ``KeyboardInterrupt``
    (asyncio lets those two out of the loop), ended the thread: the run never recorded, the
    engine dead and every later action of the console waiting for good. The loop runs on,
    the run is recorded (the task's exception failing the handler that awaited it), and
    the log says so."""

    async def stops(ctx: RunContext) -> None:
        asyncio.get_running_loop().stop()

    async def child_exits(ctx: RunContext) -> None:
        async def child() -> None:
            sys.exit(3)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(child())

    async def child_interrupts(ctx: RunContext) -> None:
        async def child() -> None:
            raise KeyboardInterrupt

        await asyncio.create_task(child())

    expected = {"stops": ("succeeded", None), "child-exits": ("failed", "SystemExit"),
                "child-interrupts": ("failed", "KeyboardInterrupt")}  # fmt: skip
    handlers = {"stops": stops, "child-exits": child_exits, "child-interrupts": child_interrupts}
    engine = Engine(
        [define_schedule(name=name, cron="0 0 1 1 *", timezone="UTC", handler=handler) for name, handler in handlers.items()],
        f"sqlite:///{tmp_path / 'state.db'}", instance="console",
    )  # fmt: skip
    backend = EmbeddedBackend(engine, arm=True, own_thread=True)
    await backend.connect()
    try:
        for name, outcome in expected.items():
            for _ in range(2):
                started = await asyncio.wait_for(backend.run_now(name), 10)  # (the bound only ends a broken test)
                ended = await asyncio.wait_for(backend.wait_run(started.id), 10)
                assert (ended.status, ended.error_tag) == outcome, (name, ended)
        assert (await asyncio.wait_for(backend.health(), 10)) is not None
    finally:
        await asyncio.wait_for(backend.close(), 20)  # (a dead engine thread never answered it)
    said = caplog.text
    assert "the engine's event loop was stopped by the code it ran (loop.stop() in a handler?); it runs on" in said
    assert "SystemExit (3) was raised out of the engine's event loop by a task or callback it ran" in said
    assert "KeyboardInterrupt (KeyboardInterrupt()) was raised out of the engine's event loop" in said
