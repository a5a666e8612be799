"""The one action model: every operator action is a declared ``Backend`` method, and the
embedded backend, the remote backend and the HTTP API (routes and OpenAPI) are derived from
the declarations, with no per-action code of their own."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_origin

import httpx
import jsonschema_rs
import pytest
from starlette.routing import compile_path
from starlette.types import ASGIApp

from backend import Engine, connect, define_durable, define_queue, define_schedule
from backend.api.app import SERVICE_ANSWERS, create_app
from backend.client.actions import ACTIONS, REQUIRED, Action, Danger, Id, Param, action_of
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.errors import Forbidden, SchedtuiError
from backend.events.audit import ACTIONS as AUDIT_ACTIONS
from tests.servers import until

TOKEN = "actions-operator-token"
SOME_ID = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"
#: The members of Backend that are no operator action: plumbing, clocks, waits, the
#: change stream, and the two conveniences over a pair of actions.
NOT_ACTIONS = {
    "connect", "close", "info", "health", "now", "schedule_zone", "wait_run", "wait_backfill", "changes",
    "set_enabled", "set_queue_paused",
}  # fmt: skip


async def work(ctx: Any) -> None:
    pass


async def deliver(job: Any) -> None:
    pass


async def flow(ctx: Any, input: Any) -> Any:
    return await ctx.wait_for("go", timeout=3600)


def definitions() -> list[Any]:
    return [
        define_schedule(name="hourly", cron="0 * * * *", timezone="Europe/Berlin", handler=work),
        define_queue(name="mail", handler=deliver, concurrency=1),
        define_durable(name="flow", handler=flow),
    ]


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[EmbeddedBackend]:
    backend = EmbeddedBackend(Engine(definitions(), f"sqlite:///{tmp_path / 'state.db'}"))
    await backend.connect()
    yield backend
    await backend.close()


def json_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema: ``nullable`` as a choice of ``null``, and an
    object with no field but those it documents (the document lets later versions add
    some; this version's answers must hold exactly those)."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: json_schema(value) for key, value in node.items() if key != "nullable"}
    if "properties" in converted:
        converted.setdefault("additionalProperties", False)
    return {"anyOf": [converted, {"type": "null"}]} if node.get("nullable") else converted


class CheckedAnswers(httpx.AsyncBaseTransport):
    """The API over a backend, in this process, with every success of an action (and every
    answer of ``/healthz`` and ``/inspect/info``) checked against the schema
    ``/openapi.json`` documents for it; ``answered`` names the actions and paths whose
    answers were."""

    def __init__(self, app: ASGIApp) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.answered: set[str] = set()
        self.routes = [(a.name, a.http.method, a.http.path.replace(":path}", "}"), compile_path(a.http.path)[0])
                       for a in ACTIONS.values()]  # fmt: skip
        self.routes += [(path, "GET", path, compile_path(path)[0]) for path in SERVICE_ANSWERS]
        self.validators: dict[str, Any] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        route = next((r for r in self.routes if r[1] == request.method and r[3].fullmatch(request.url.path)), None)
        if route is None or not (200 <= response.status_code < 300 or route[0] in SERVICE_ANSWERS):
            return response
        name, method, path, _ = route
        body = await response.aread()
        validator = await self.validator(path, method, response.status_code)
        answer = json.loads(body)
        errors = [f"{'/'.join(map(str, e.instance_path)) or '(the body)'}: {e.message}" for e in validator.iter_errors(answer)]
        assert not errors, f"{name} answered otherwise than documented: {errors}\n{json.dumps(answer, indent=1)[:2000]}"
        self.answered.add(name)
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def validator(self, path: str, method: str, status: int) -> Any:
        key = f"{method} {path} {status}"
        if key not in self.validators:
            request = httpx.Request("GET", "http://schedtui.test/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
            document = json.loads(await (await self.inner.handle_async_request(request)).aread())
            schema = document["paths"][path][method.lower()]["responses"][str(status)]["content"]["application/json"]["schema"]
            root = {"allOf": [json_schema(schema)], "components": json_schema(document["components"])}
            self.validators[key] = jsonschema_rs.Draft7Validator(root)
        return self.validators[key]


def remote_over(backend: Backend, *, read_only: bool = False) -> RemoteBackend:
    """A remote backend whose server is the API over ``backend``, in this process (every
    answer of an action checked against its schema: :class:`CheckedAnswers`)."""
    transport = CheckedAnswers(create_app(backend, token=TOKEN))
    return RemoteBackend("http://schedtui.test", TOKEN, read_only=read_only, transport=transport)


def test_every_backend_action_is_declared_once_in_its_systems_module() -> None:
    # Backend's members, its own and those of each system's class it inherits.
    members: dict[str, Any] = {}
    for klass in Backend.__mro__:
        for name, value in vars(klass).items():
            if klass.__module__.startswith("backend.client.") and inspect.isfunction(value) and not name.startswith("_"):
                assert name not in members, f"{name} is written in two classes"
                members[name] = value
    declared = {name for name, value in members.items() if hasattr(value, "action")}
    assert declared == set(ACTIONS)
    assert set(members) - declared == NOT_ACTIONS
    for name, action in ACTIONS.items():
        assert getattr(Backend, name).action is action is action_of(name)
        assert action.summary and action.permission in ("read", "operate")
        assert action.system in ("schedules", "jobs", "durable", "locks", "audit", "alerts", "fleet", "health")
        # Where an action is: backend/client/operations/<its system>.py.
        assert members[name].__module__ == f"backend.client.operations.{action.system}", name


def test_no_backend_has_code_of_its_own_for_an_action() -> None:
    for implementation in (EmbeddedBackend, RemoteBackend):
        assert not set(vars(implementation)) & set(ACTIONS), implementation
        assert not set(vars(implementation)) & {"set_enabled", "set_queue_paused"}, implementation


def test_the_api_and_client_packages_import_nothing_that_imports_them_back() -> None:
    root = Path(__file__).resolve().parent.parent
    imports: dict[str, set[str]] = {}
    for package in ("backend/api", "backend/client"):
        for path in (root / package).glob("*.py"):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    node.body = []  # imports for the type checker alone do not count
            found: set[str] = set()
            for node in ast.walk(tree):  # imports inside functions count
                if isinstance(node, ast.ImportFrom) and node.module:
                    found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
                elif isinstance(node, ast.Import):
                    found |= {alias.name for alias in node.names}
            imports[module] = found
    graph = {module: {m for m in found if m in imports and m != module} for module, found in imports.items()}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(m == target or (m not in seen and reaches(m, target, seen | {m})) for m in graph[start])

    assert graph["backend.api.app"] >= {"backend.api.routes", "backend.api.events"}
    assert [module for module in graph if reaches(module, module, {module})] == []


def test_operate_actions_are_audited_under_a_known_name_and_reads_are_not() -> None:
    for action in ACTIONS.values():
        if action.name == "fire_external":
            assert action.audit is None  # a platform scheduler's call: its run says trigger external
        elif action.permission == "operate":
            assert action.audit in AUDIT_ACTIONS, action.name
        else:
            assert action.audit is None and action.danger is None, action.name


def test_a_danger_fills_its_placeholders_and_leaves_unknown_ones() -> None:
    danger = Danger('Release lock "{name}" by force?', "{holder} may still be working on {name}.")
    assert danger.render({"name": "billing/{x}"}) == (
        'Release lock "billing/{x}" by force?',
        "{holder} may still be working on billing/{x}.",
    )
    release = action_of("release_lock").danger
    assert release is not None
    question, _ = release.render({"name": "nightly"})
    assert question == 'Release lock "nightly" by force?'
    dangerous = {name for name, action in ACTIONS.items() if action.danger is not None}
    assert dangerous == {"delete_schedule", "start_backfill", "cancel_backfill", "release_lock", "cancel_execution",
                         "delete_job", "forget_instance"}  # fmt: skip


async def test_every_action_has_a_route_and_an_openapi_entry(embedded: EmbeddedBackend) -> None:
    app = create_app(embedded, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://schedtui.test") as http:
        document = (await http.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    paths, components = document["paths"], document["components"]["schemas"]
    # Every answer but the event stream's (and /metrics', text) has its JSON's schema; each
    # object the answers hold is a component that says what it is (its TypedDict's docstring).
    for path, operations in paths.items():
        for method, entry in operations.items():
            assert entry.get("tags"), (method, path)  # (a generated client's classes, Swagger UI's sections)
            for status, response in entry["responses"].items():
                if path != "/inspect/events":
                    assert "schema" in response.get("content", {}).get("application/json", {}), (method, path, status)
    assert all(schema.get("description") for name, schema in components.items() if name != "Error"), components
    for action in ACTIONS.values():
        path = action.http.path.replace(":path}", "}")
        entry = paths[path][action.http.method.lower()]
        assert entry["operationId"] == action.name
        assert entry["summary"] == action.summary
        assert str(action.http.status) in entry["responses"]
        assert "schema" in entry["responses"][str(action.http.status)]["content"]["application/json"], action.name
        documented = {p["name"] for p in entry.get("parameters", [])}
        body = entry.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        for param in action.params:
            wire = action.http.wire_name(param.name)
            assert wire in documented or wire in body.get("properties", {}) or action.http.body == param.name, (action.name, wire)
        if action.permission == "operate":
            assert "403" in entry["responses"], action.name


def arguments_for(action: Action) -> dict[str, Any]:
    """Arguments of the declared types for ``action``: enough to get past the permission."""
    now = datetime.now(UTC)

    def value(param: Param) -> Any:
        if param.default is not REQUIRED:
            return param.default
        if any(isinstance(limit, Id) for limit in param.limits):
            return SOME_ID
        base = param.base
        if base is datetime:
            return now - timedelta(hours=1 if param.name == "end" else 3)
        if get_origin(base) is list:
            return ["hourly"]
        if base is Mapping or get_origin(base) is Mapping:
            return {}
        return {"queue": "mail", "function": "flow", "name": "hourly"}.get(param.name, "x")

    return {param.name: value(param) for param in action.params}


@pytest.mark.parametrize("kind", ["embedded", "remote"])
async def test_read_only_refuses_exactly_the_operate_actions(tmp_path: Path, kind: str) -> None:
    inner = EmbeddedBackend(Engine(definitions(), f"sqlite:///{tmp_path / 'state.db'}"), read_only=kind == "embedded")
    await inner.connect()
    backend: Backend = inner if kind == "embedded" else remote_over(inner, read_only=True)
    try:
        await backend.connect()
        for action in ACTIONS.values():
            call = getattr(backend, action.name)(**arguments_for(action))
            if action.permission == "operate":
                with pytest.raises(Forbidden, match=f"read-only: {action.label} is not allowed"):
                    await call
            else:
                try:
                    await call
                except Forbidden:
                    pytest.fail(f"{action.name} is a read, refused when read-only")
                except SchedtuiError:
                    pass  # an id that names nothing, say: refused for what it is, not for the permission
        assert (await inner.audit()).entries == []
    finally:
        if backend is not inner:
            await backend.close()
        await inner.close()


@pytest.mark.parametrize("kind", ["embedded", "remote"])
async def test_each_action_records_the_audit_name_it_declares(embedded: EmbeddedBackend, kind: str) -> None:
    backend: Backend = embedded if kind == "embedded" else remote_over(embedded)
    await backend.connect()
    done: list[str] = []

    async def act(name: str, *args: Any, **kwargs: Any) -> Any:
        result = await getattr(backend, name)(*args, **kwargs)
        [newest, *_] = (await embedded.audit(limit=1)).entries
        assert newest.action == action_of(name).audit, name
        done.append(name)
        return result

    await act("run_now", "hourly")
    await act("disable_schedule", "hourly", note="maintenance")
    await act("enable_schedule", "hourly")
    await act("create_schedule", {"name": "made", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail"})
    await act("update_schedule", "made", {"cron": "30 * * * *"})
    await act("delete_schedule", "made")
    now = await backend.now()
    # A backfill's end is recorded by itself, once its runs have ended: after its start.
    progress = await backend.start_backfill("hourly", now - timedelta(hours=3), now - timedelta(minutes=1))
    await backend.wait_backfill(progress.id)
    [end, start, *_] = (await embedded.audit(limit=2)).entries
    assert (start.action, end.action) == (action_of("start_backfill").audit, "schedule.backfill_end")
    done.append("start_backfill")
    await act("pause_queue", "mail")
    await act("resume_queue", "mail")
    sent = await act("send_job", "mail", {"to": "a"}, delay=3600, key="k1")
    await act("cancel_job", "mail", key="k1")
    sent = await act("send_job", "mail", {"to": "b"}, delay=3600)
    await act("delete_job", "mail", sent.id)
    started = await act("start_execution", "flow", {"n": 1})
    await act("signal_execution", started.id, "go", {"ok": True})
    started = await act("start_execution", "flow", {"n": 2})
    await act("cancel_execution", started.id)
    assert len(done) == 17
    if backend is not embedded:
        await backend.close()


async def test_every_action_answers_as_its_schema_in_the_openapi_document_says(tmp_path: Path) -> None:
    """Each action once through the API, with things to act on: its answer is checked
    against the schema ``/openapi.json`` derives from its result's type."""
    gate = asyncio.Event()

    async def held_open(ctx: Any) -> None:
        await gate.wait()

    async def fails(job: Any) -> None:
        raise RuntimeError("it fails")

    async def broken(ctx: Any, input: Any) -> None:
        await ctx.step("boom", fails, None, retry=False)

    store = f"sqlite:///{tmp_path / 'state.db'}"
    inner = EmbeddedBackend(Engine([
        *definitions(),
        define_schedule(name="ext", cron="* * * * *", timezone="UTC", handler=work, trigger="external"),
        define_schedule(name="slow", cron="0 * * * *", timezone="UTC", handler=held_open),
        define_queue(name="bad", handler=fails, attempts=1),
        define_durable(name="broken", handler=broken),
    ], store), arm=True)  # fmt: skip  (armed: its workers run the jobs and executions)
    await inner.connect()
    transport = CheckedAnswers(create_app(inner, token=TOKEN))
    backend = RemoteBackend("http://schedtui.test", TOKEN, transport=transport)
    await backend.connect()
    try:
        now = await backend.now()
        # Schedules and their runs.
        await backend.list_schedules()
        run = await backend.wait_run((await backend.run_now("hourly")).id)
        await backend.list_runs("hourly")
        await backend.runs_between(["hourly", "ext"], now - timedelta(hours=1), now + timedelta(hours=1))
        await backend.get_run(run.id)
        await backend.run_log(run.id)
        await backend.upcoming("hourly")
        await backend.fire_external("ext")
        await backend.disable_schedule("hourly", note="maintenance")
        await backend.enable_schedule("hourly")
        await backend.create_schedule({"name": "made", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail"})
        await backend.update_schedule("made", {"cron": "30 * * * *"})
        await backend.delete_schedule("made")
        await backend.plan_backfill("hourly", now - timedelta(hours=3), now - timedelta(minutes=1))
        progress = await backend.start_backfill("slow", now - timedelta(hours=3), now - timedelta(minutes=1))
        await backend.backfill_progress(progress.id)
        await backend.running_backfills()
        await backend.cancel_backfill(progress.id)
        gate.set()
        # The fleet: a member on another host that beat five minutes ago and never again.
        await backend.instances()
        await inner.engine.store.heartbeat("web-3", "elsewhere", 4242, now - timedelta(minutes=5))
        await backend.forget_instance("web-3")
        # Locks: one held by another process's client.
        async with connect(store, instance="holder:1") as other:
            assert await other.locks.acquire("tour/lock", ttl=300) is not None
            await backend.list_locks()
            await backend.release_lock("tour/lock")
        # Durable executions.
        started = await backend.start_execution("flow", {"n": 1})
        await backend.list_executions()
        await backend.get_execution(started.id)
        await backend.execution_log(started.id)
        await backend.signal_execution(started.id, "go", {"ok": True})
        await backend.cancel_execution((await backend.start_execution("flow", {"n": 2})).id)
        failing = await backend.start_execution("broken", None)

        async def execution_failed() -> bool:
            return (await inner.get_execution(failing.id)).status == "failed"

        await until(execution_failed, "the broken execution to fail")
        await backend.retry_execution(failing.id)
        # Jobs.
        await backend.list_queues()
        await backend.pause_queue("mail")
        await backend.resume_queue("mail")
        sent = await backend.send_job("mail", {"to": "a"}, delay=3600, key="k1")
        await backend.list_jobs("mail")
        await backend.get_job(sent.id)
        await backend.job_log(sent.id)
        await backend.cancel_job("mail", key="k1")
        await backend.delete_job("mail", (await backend.send_job("mail", {"to": "b"}, delay=3600)).id)
        dead = await backend.send_job("bad", None)

        async def job_dead() -> bool:
            job = (await inner.get_job(dead.id)).job
            return job is not None and job.status == "dead"

        await until(job_dead, "the failing job to be dead")
        await backend.retry_job("bad", dead.id)
        # The record of it all, and the routes that are no action.
        await backend.audit()
        await backend.alerts()
        await backend.activity()
        async with httpx.AsyncClient(transport=transport, base_url="http://schedtui.test") as http:
            for path in SERVICE_ANSWERS:
                assert (await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200, path
    finally:
        await backend.close()
        await inner.close()
    assert transport.answered == set(ACTIONS) | set(SERVICE_ANSWERS)
