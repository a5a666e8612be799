"""The shared backend interface over a remote engine's HTTP inspect API (httpx).

Reads are retried briefly on connection errors; actions are never retried blindly (a Run
now that timed out may have fired). An unreachable server is an :class:`Unavailable`
with one clear sentence, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from backend.client.actions import Action
from backend.client.interface import SYSTEMS, Backend, ConnectionInfo, RunsPage, SchedulesSnapshot, check_runs_between
from backend.durable.model import Execution, ExecutionsPage, Signalled, Started
from backend.durable.service import MAX_INPUT_BYTES, MAX_SIGNAL_BYTES
from backend.errors import (
    BadInput,
    Forbidden,
    NotFound,
    Refused,
    SchedtuiError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from backend.events.audit import AuditPage
from backend.events.bus import READY, RESYNC, STREAM, TOPICS, Signal
from backend.inputs import check_before, check_id, check_instant, check_json, check_note
from backend.jobs.definition import check_cancel, check_queue_name, check_send
from backend.jobs.model import Job, JobDetail, JobsPage, NotDead, QueueFull, QueueView, Sent
from backend.locks import LockRelease, LocksSnapshot
from backend.locks.model import check_lock_name
from backend.model import BackfillPlan, BackfillProgress, ExternalFiring, Health, InstanceInfo, Run, ScheduleView, iso, parse_iso
from backend.safetext import redact_url, remember_url_secrets
from backend.scheduler.stored import DefinedInCode, NameTaken

__all__ = ["RemoteBackend"]

_READ_RETRIES = (0.2, 0.5, 1.0)
#: Seconds the event stream may stay silent before it counts as broken (the server pings
#: every 15 s).
EVENTS_SILENCE = 40.0


class RemoteBackend(Backend):
    """A :class:`~backend.client.interface.Backend` that talks to ``schedtui serve`` over HTTP.

    ``transport`` lets tests hand in an ``httpx.ASGITransport``; by default it is a real
    connection. ``read_only`` can be forced on; it is also on when the token only reads.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        read_only: bool = False,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        remember_url_secrets(url)
        if not url.startswith(("http://", "https://")):
            raise BadInput(f'server URL "{redact_url(url)}" must start with http:// or https://', field="url")
        self.url = url.rstrip("/")
        self.where = redact_url(self.url)
        """The URL fit to show: without the password of a ``user:pass@`` part."""
        self.read_only = read_only
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._timeout = timeout
        self._info: ConnectionInfo | None = None

    # -- plumbing -----------------------------------------------------------------------
    async def _request(self, method: str, path: str, *, retry: bool, **kwargs: Any) -> Any:
        delays = _READ_RETRIES if retry else ()
        attempt = 0
        while True:
            try:
                response = await self._client.request(method, path, **kwargs)
                break
            except httpx.TimeoutException:
                if attempt < len(delays):
                    await asyncio.sleep(delays[attempt])
                    attempt += 1
                    continue
                raise Unavailable(f"{self.where} did not answer in time ({method} {path})") from None
            except httpx.TransportError as exc:
                if attempt < len(delays):
                    await asyncio.sleep(delays[attempt])
                    attempt += 1
                    continue
                raise Unavailable(f"cannot reach {self.where}: {_reason(exc)}") from None
        return self._decode(response)

    def _decode(self, response: httpx.Response) -> Any:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success:
            if data is None:
                raise Unavailable(f"{self.where} answered {response.status_code} without JSON; is it a schedtui server?")
            return data
        error = data.get("error") if isinstance(data, dict) else None
        message = (error or {}).get("message") or f"{self.where} answered {response.status_code}"
        status = response.status_code
        if status == 401:
            raise Unauthorized(message)
        if status == 403:
            raise Forbidden(message)
        if status == 404:
            raise NotFound(message)
        if status == 409:
            count = data.get("count") if isinstance(data, dict) else None
            reason = data.get("reason") if isinstance(data, dict) else None
            refusal = {
                "queue_full": QueueFull,
                "not_dead": NotDead,
                "defined_in_code": DefinedInCode,
                "name_taken": NameTaken,
            }.get(str((error or {}).get("code")), Refused)
            raise refusal(message, count=count, reason=reason or message)
        if status == 413:
            raise TooLarge(message, field=(error or {}).get("field"))
        if status == 422:
            raise BadInput(message, field=(error or {}).get("field"))
        if status in (502, 503, 504):
            raise Unavailable(message)
        raise SchedtuiError(message)

    async def _get(self, path: str, **params: Any) -> Any:
        return await self._request("GET", path, retry=True, params={k: v for k, v in params.items() if v is not None})

    async def _post(self, path: str, body: dict[str, Any] | None = None, *, retry: bool = False) -> Any:
        return await self._request("POST", path, retry=retry, json=body or {})

    def _check_can_act(self, action: str) -> None:
        if self.read_only:
            raise Forbidden(f"read-only: {action} is not allowed")

    async def _act(self, action: Action, arguments: dict[str, Any]) -> Any:
        # The split actions go through the old two-way methods for now.
        if action.name in ("enable_schedule", "disable_schedule"):
            return await self.set_enabled(arguments["name"], action.name == "enable_schedule", note=arguments["note"])
        if action.name in ("pause_queue", "resume_queue"):
            return await self.set_queue_paused(arguments["queue"], action.name == "pause_queue")
        raise NotImplementedError(action.name)

    # -- the interface ------------------------------------------------------------------
    async def connect(self) -> ConnectionInfo:
        data = await self._get("/inspect/info")
        if data.get("access") == "read":
            self.read_only = True
        self._info = ConnectionInfo(
            kind="remote",
            where=self.where,
            coordination=data["coordination"],
            instance=data["instance"],
            read_only=self.read_only,
            store_kind=data.get("store_kind", ""),
            actor=data.get("actor", ""),
            systems=tuple(data.get("systems", SYSTEMS)),
        )
        return self._info

    async def close(self) -> None:
        await self._client.aclose()

    def info(self) -> ConnectionInfo:
        if self._info is None:
            raise Unavailable(f"not connected to {self.where} yet")
        return self._info

    async def health(self) -> Health:
        """The server's ``/healthz``: a 503 is an answer (the store is failing), not an error."""
        try:
            response = await self._client.get("/healthz")
        except httpx.TransportError as exc:
            raise Unavailable(f"cannot reach {self.where}: {_reason(exc)}") from None
        if response.status_code == 503:
            try:
                return Health.from_json(response.json())
            except (ValueError, KeyError, TypeError):
                pass
        return Health.from_json(self._decode(response))

    async def now(self) -> datetime:
        return parse_iso((await self._get("/inspect/info"))["now"])

    async def schedule_zone(self, name: str) -> str:
        for view in (await self.list_schedules()).schedules:
            if view.name == name:
                return view.timezone
        raise NotFound(f'no schedule named "{name}"')

    async def list_schedules(self) -> SchedulesSnapshot:
        return SchedulesSnapshot.from_json(await self._get("/inspect/schedules"))

    async def list_runs(self, name: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        before = check_before(before)  # the same checks as the server's: no request that cannot succeed
        return RunsPage.from_json(await self._get("/inspect/schedules/runs", name=name, limit=limit, before=before))

    async def get_run(self, run_id: str) -> Run:
        return Run.from_json(await self._get(f"/inspect/runs/{check_id(run_id, 'run')}"))

    async def runs_between(
        self, names: list[str], start: datetime, end: datetime, *, limit_per_name: int = 200
    ) -> dict[str, list[Run]]:
        check_runs_between(names, start, end, limit_per_name)
        params = [("name", n) for n in names] + [("from", iso(start)), ("to", iso(end)), ("limit_per_name", limit_per_name)]
        data = await self._request("GET", "/inspect/runs", retry=True, params=params)
        return {name: [Run.from_json(r) for r in runs] for name, runs in data["runs"].items()}

    async def instances(self) -> list[InstanceInfo]:
        data = await self._get("/inspect/instances")
        return [InstanceInfo.from_json(i) for i in data["instances"]]

    async def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        data = await self._get(f"/inspect/schedules/{_seg(name)}/upcoming", count=count)
        return [parse_iso(s) for s in data["slots"]]

    async def run_now(self, name: str) -> Run:
        self._check_can_act("Run now")
        data = await self._post(f"/inspect/schedules/{_seg(name)}/fire")
        return Run.from_json(data["run"])

    async def fire_external(self, name: str) -> ExternalFiring:
        self._check_can_act("an external fire")
        # Not retried here: a repeat is safe within the slot, but by then it may be the next slot's.
        data = await self._post(f"/schedule/{_seg(name)}/fire?trigger=external")
        return ExternalFiring.from_json(data)

    async def wait_run(self, run_id: str) -> Run:
        delay = 0.05
        while True:
            run = await self.get_run(run_id)
            if run.status != "running":
                return run
            await asyncio.sleep(delay)  # polling a remote server: nothing to wait on
            delay = min(delay * 2, 1.0)

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView:
        self._check_can_act("enable" if enabled else "disable")
        note = check_note(note)
        action = "enable" if enabled else "disable"
        # Setting a state is idempotent, so a retry after a lost answer is safe.
        data = await self._post(f"/inspect/schedules/{_seg(name)}/{action}", {"note": note}, retry=True)
        return ScheduleView.from_json(data)

    async def create_schedule(self, spec: Mapping[str, Any]) -> ScheduleView:
        self._check_can_act("creating a schedule")
        # Not retried: a repeat after a lost answer would be refused as a taken name.
        return ScheduleView.from_json(await self._post("/inspect/schedules", dict(spec)))

    async def update_schedule(self, name: str, changes: Mapping[str, Any]) -> ScheduleView:
        self._check_can_act("editing a schedule")
        # Setting the same fields again is idempotent: a retry after a lost answer is safe.
        data = await self._request("PATCH", f"/inspect/schedules/{_seg(name)}", retry=True, json=dict(changes))
        return ScheduleView.from_json(data)

    async def delete_schedule(self, name: str) -> None:
        self._check_can_act("deleting a schedule")
        await self._request("DELETE", f"/inspect/schedules/{_seg(name)}", retry=False)

    def _backfill_body(
        self, start: datetime, end: datetime, confirm: bool, limit: int | None
    ) -> dict[str, Any]:
        start, end = check_instant(start, "from"), check_instant(end, "to")
        return {"from": iso(start), "to": iso(end), "confirm": confirm, "limit": limit}

    async def plan_backfill(
        self, name: str, start: datetime, end: datetime, *, confirm: bool = False, limit: int | None = None
    ) -> BackfillPlan:
        body = self._backfill_body(start, end, confirm, limit)
        data = await self._post(f"/inspect/schedules/{_seg(name)}/backfill/plan", body, retry=True)
        return BackfillPlan.from_json(data)

    async def start_backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress:
        self._check_can_act("backfill")
        body = {**self._backfill_body(start, end, confirm, limit), "skip_succeeded": skip_succeeded}
        data = await self._post(f"/inspect/schedules/{_seg(name)}/backfill", body)
        return BackfillProgress.from_json(data["progress"])

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        return BackfillProgress.from_json(await self._get(f"/inspect/backfills/{check_id(backfill_id, 'backfill')}"))

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        self._check_can_act("cancelling a backfill")
        # Cancelling is idempotent: a retry after a lost answer is safe.
        return BackfillProgress.from_json(await self._post(f"/inspect/backfills/{_seg(backfill_id)}/cancel", retry=True))

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        delay = 0.05
        while (progress := await self.backfill_progress(backfill_id)).state == "running":
            await asyncio.sleep(delay)  # polling a remote server: nothing to wait on
            delay = min(delay * 2, 1.0)
        return progress

    async def list_locks(self) -> LocksSnapshot:
        return LocksSnapshot.from_json(await self._get("/inspect/locks"))

    async def release_lock(self, name: str) -> LockRelease:
        self._check_can_act("a lock release")
        # Not retried: a repeat after a lost answer would free the next holder's lock.
        data = await self._post(f"/inspect/locks/{_seg(check_lock_name(name))}/release")
        return LockRelease.from_json(data)

    async def audit(self, *, limit: int = 50, before: str | None = None) -> AuditPage:
        before = check_before(before, "entry")
        return AuditPage.from_json(await self._get("/inspect/audit", limit=limit, before=before))

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        headers = {"Last-Event-ID": since} if since else {}
        timeout = httpx.Timeout(self._timeout, read=EVENTS_SILENCE)
        try:
            async with self._client.stream("GET", "/inspect/events", headers=headers, timeout=timeout) as response:
                if not response.is_success:
                    await response.aread()
                    self._decode(response)  # raises the error it says
                parser = SseParser()
                async for chunk in response.aiter_text():
                    batch = parser.feed(chunk)
                    if batch is not None:
                        yield batch
        except httpx.TimeoutException:
            raise Unavailable(f"the event stream of {self.where} went silent (no ping for {EVENTS_SILENCE:g}s)") from None
        except httpx.TransportError as exc:
            raise Unavailable(f"the event stream of {self.where} broke: {_reason(exc)}") from None
        raise Unavailable(f"{self.where} ended the event stream")

    # -- durable executions ----------------------------------------------------------------
    async def list_executions(
        self, function: str | None = None, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> ExecutionsPage:
        before = check_before(before)
        data = await self._get("/inspect/durable/executions", function=function, status=status, limit=limit, before=before)
        return ExecutionsPage.from_json(data)

    async def get_execution(self, execution_id: str) -> Execution:
        return Execution.from_json(await self._get(f"/inspect/durable/executions/{check_id(execution_id, 'execution')}"))

    async def start_execution(self, function: str, input: Any = None) -> Started:
        self._check_can_act("durable start")
        check_json(input, "input", MAX_INPUT_BYTES)  # the server's checks: no request that cannot succeed
        # Not retried: a start whose answer was lost may have queued an execution.
        data = await self._post(f"/inspect/durable/{_seg(function)}/start", {"input": input})
        return Started(data["id"], bool(data.get("duplicate", False)))

    async def signal_execution(self, execution_id: str, name: str, payload: Any = None) -> Signalled:
        self._check_can_act("durable signal")
        check_json(payload, "payload", MAX_SIGNAL_BYTES)
        path = f"/inspect/durable/executions/{check_id(execution_id, 'execution')}/signal/{_seg(name)}"
        # A signal is kept once per execution and name: a retry after a lost answer is safe.
        return Signalled.from_json(await self._post(path, {"payload": payload}, retry=True))

    async def cancel_execution(self, execution_id: str) -> Execution:
        self._check_can_act("durable cancel")
        data = await self._post(f"/inspect/durable/executions/{check_id(execution_id, 'execution')}/cancel")
        return Execution.from_json(data)

    async def retry_execution(self, execution_id: str) -> Execution:
        self._check_can_act("durable retry")
        data = await self._post(f"/inspect/durable/executions/{check_id(execution_id, 'execution')}/retry")
        return Execution.from_json(data)


    # -- the job queue --------------------------------------------------------------------
    async def list_queues(self) -> list[QueueView]:
        return [QueueView.from_json(q) for q in (await self._get("/inspect/queues"))["queues"]]

    async def set_queue_paused(self, queue: str, paused: bool) -> QueueView:
        self._check_can_act("pause" if paused else "resume")
        action = "pause" if paused else "resume"
        # Idempotent: a retry after a lost answer is safe.
        data = await self._post(f"/inspect/queues/{_seg(check_queue_name(queue))}/{action}", retry=True)
        return QueueView.from_json(data)

    async def list_jobs(
        self, queue: str, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> JobsPage:
        before = check_before(before)
        path = f"/inspect/queues/{_seg(check_queue_name(queue))}/jobs"
        return JobsPage.from_json(await self._get(path, status=status, limit=limit, before=before))

    async def send_job(
        self, queue: str, payload: Any = None, *, delay: float = 0, attempts: int | None = None, key: str | None = None
    ) -> Sent:
        self._check_can_act("sending a job")
        check_send(payload, delay, attempts, key)  # the server's checks: no request that cannot succeed
        body = {"payload": payload, "delay": delay, "attempts": attempts, "key": key}
        # Never retried: a send whose answer was lost may have queued the job.
        data = await self._request("POST", f"/inspect/queues/{_seg(check_queue_name(queue))}/jobs", retry=False, json=body)
        return Sent.from_json(data)

    async def get_job(self, job_id: str) -> JobDetail:
        return JobDetail.from_json(await self._get(f"/inspect/jobs/{check_id(job_id, 'job')}"))

    async def cancel_job(self, queue: str, id: str | None = None, *, key: str | None = None) -> bool:
        self._check_can_act("cancel")
        by, value = check_cancel(id, key)
        data = await self._post(f"/inspect/queues/{_seg(check_queue_name(queue))}/cancel", {by: value})
        return bool(data["cancelled"])

    async def retry_job(self, queue: str, job_id: str) -> Job:
        self._check_can_act("retry")
        data = await self._post(f"/inspect/queues/{_seg(check_queue_name(queue))}/jobs/{check_id(job_id, 'job')}/retry")
        return Job.from_json(data)

    async def delete_job(self, queue: str, job_id: str) -> None:
        self._check_can_act("delete")
        path = f"/inspect/queues/{_seg(check_queue_name(queue))}/jobs/{check_id(job_id, 'job')}"
        await self._request("DELETE", path, retry=False)

class SseParser:
    """Server-Sent Events text in, signals out: :meth:`feed` returns the signals of the
    events completed by a chunk (``[]`` for a ping alone), or ``None`` while none is."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, chunk: str) -> list[Signal] | None:
        self._buffer = (self._buffer + chunk).replace("\r\n", "\n")  # a CR may end one chunk, its LF the next
        *blocks, self._buffer = self._buffer.split("\n\n")
        if not blocks:
            return None
        signals = []
        pinged = False
        for block in blocks:
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if line.startswith(":"):
                    pinged = True  # a comment: the server's ping
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                fields[key] = fields.get(key, "") + value.removeprefix(" ")
            event = fields.get("event")
            if event is None:
                continue
            try:
                data = json.loads(fields.get("data") or "{}")
            except ValueError:
                data = {}
            name = data.get("name") if isinstance(data, dict) else None
            if event in TOPICS or event in (READY, RESYNC, STREAM):
                signals.append(Signal(fields.get("id", ""), event, name if isinstance(name, str) else None))
        return signals if signals or pinged else None


def _seg(value: str) -> str:
    """``value`` as one segment of a URL path, whatever it holds: every "/" escaped (a lock
    name may hold some), and a name of dots alone ("." and "..", valid names) escaped too,
    or the client would resolve it as a step up the path before sending it."""
    segment = quote(value, safe="")
    return segment.replace(".", "%2E") if segment.strip(".") == "" else segment


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({text})"
    return text
