"""Durable functions as the engine holds them: the subsystem, and the operations on executions.

:class:`Durable` is ``engine.durable``. As a subsystem it runs the
:class:`~.executor.DurableExecutor` where the engine is started (``schedtui serve``);
everywhere (the CLI's verbs, ``connect()``, the API) it carries out the operations:
start, signal, cancel, retry, list and show. Operations check their input here, once,
for every path that reaches them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Final, cast

from backend.durable.context import SIGNAL_NAME
from backend.durable.definition import DurableFunction
from backend.durable.executor import DurableExecutor
from backend.durable.model import EXECUTION_STATUSES, Execution, ExecutionsPage, Signalled, Started, execution_id_for_slot
from backend.durable.run import started_on
from backend.durable.store import DurableStore, NewExecution
from backend.errors import BadInput, NotFound, Refused
from backend.inputs import MAX_SENT_JSON_BYTES, RepeatedKey, check_before, check_count, check_id, check_json, parse_json
from backend.runtime.subsystems import Shared
from backend.safetext import printable
from backend.schedules import NAME_PATTERN, RunContext

__all__ = ["MAX_INPUT_BYTES", "MAX_SIGNAL_BYTES", "Durable", "parse_json_option"]

#: Largest input of an execution, and payload of a signal (encoded JSON).
MAX_INPUT_BYTES: Final = MAX_SENT_JSON_BYTES
MAX_SIGNAL_BYTES: Final = 64 * 1024
DEFAULT_CONCURRENCY: Final = 32


def parse_json_option(text: str | None, field: str) -> Any:
    """A JSON value typed by an operator (``--input``, ``--payload``); ``None`` for none."""
    if text is None:
        return None
    try:
        return parse_json(text)
    except RepeatedKey as exc:
        raise BadInput(f'{field} "{printable(text, 60)}" {exc}', field=field.lstrip("-")) from None
    except ValueError as exc:
        raise BadInput(f'{field} "{printable(text, 60)}" is not valid JSON ({exc})', field=field.lstrip("-")) from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise BadInput(
            f'{field} "{printable(text, 60)}" is nested too deeply to be read', field=field.lstrip("-")
        ) from None


class Durable:
    """The durable functions of one engine, and the operations on their executions."""

    def __init__(
        self,
        shared: Shared,
        functions: Iterable[DurableFunction],
        *,
        lease_ttl: timedelta = timedelta(seconds=30),
        poll_interval: timedelta = timedelta(seconds=1),
        concurrency: int = DEFAULT_CONCURRENCY,
        check_owners_every: timedelta = timedelta(seconds=5),
        retention: timedelta | None = timedelta(days=30),
    ) -> None:
        self.shared = shared
        self.clock = shared.clock
        self.store = cast(DurableStore, shared.store)
        self.functions: dict[str, DurableFunction] = {}
        for function in functions:
            if function.name in self.functions:
                raise BadInput(f'durable function name "{function.name}" is given twice')
            self.functions[function.name] = function
        self.complete = False
        """Whether ``functions`` is all a definitions folder defines (the engine sets it): then
        a start of any other function is refused, even when the folder defines none."""
        self.executor = DurableExecutor(
            shared,
            self.functions,
            lease_ttl=lease_ttl,
            poll_interval=poll_interval,
            concurrency=concurrency,
            check_owners_every=check_owners_every,
            retention=retention,
        )

    # -- the subsystem ---------------------------------------------------------------------
    async def open(self) -> None:
        pass

    def start(self) -> None:
        self.executor.start()

    async def maintain(self, now: datetime) -> None:
        # The retention is store-wide, whatever this process defines (a serve with no
        # durable function in its definitions kept every finished execution for good).
        await self.executor.prune(now)
        if self.functions:
            await self.executor.maintain(now)

    async def stop(self, grace: float) -> None:
        await self.executor.stop(grace)

    @property
    def idle(self) -> bool:
        return self.executor.idle

    def is_ours(self, id_: str) -> bool:
        return id_ in self.executor.running

    # -- operations --------------------------------------------------------------------
    def _function(self, name: object, *, anywhere: bool = False) -> str:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise NotFound(f'no durable function named "{printable(str(name), 60)}"')
        if not anywhere and (self.functions or self.complete) and name not in self.functions:
            known = ", ".join(sorted(self.functions)) or "none"
            raise NotFound(f'no durable function named "{name}" (defined here: {known})')
        return name

    async def start_execution(
        self,
        function: str,
        input: Any = None,
        *,
        id: str | None = None,
        schedule: str | None = None,
        scheduled_at: datetime | None = None,
        anywhere: bool = False,
    ) -> Started:
        """Queue an execution of ``function`` with ``input`` (JSON, at most 256 KiB).

        Any instance that defines the function runs it. Where this process read a
        definitions folder (or was given durable functions), an unknown name is refused,
        even when the folder defines none, unless ``anywhere``; a process without
        definitions (``connect()`` without them) cannot check. Such an execution waits for
        an instance that defines it (``serve`` warns about it)."""
        name = self._function(function, anywhere=anywhere)
        text = check_json(input, "input", MAX_INPUT_BYTES)
        execution_id = id or self.shared.new_id()
        now = self.clock.now()
        new = NewExecution(execution_id, name, text, now, schedule, scheduled_at)
        # An operator's start is audited (a schedule's slot is in the run ledger): the entry
        # is written with the execution, in its statement.
        audit = None if schedule is not None else self.shared.audit.entry("durable.start", execution_id, {"function": name})
        epoch = self.shared.registry.lease.epoch  # (what the insert claims, it claims under this epoch)
        lease_until = self.executor.reserve(name, now)  # run here at once, if this instance may
        claim = None if lease_until is None else (self.shared.instance, lease_until)
        log = None if claim is None else started_on(self.shared.instance)
        try:
            created = await self.store.durable_insert(new, claim=claim, audit=audit, log=log)
        except BaseException:
            if claim is not None:
                self.executor.unreserve()
                # Inserted claimed, with only the answer lost? Given back by the next round.
                self.executor.not_run_here(execution_id, claim[1])
            raise
        if claim is not None:
            if created:
                self.executor.launch_new(new, epoch, claim[1])
            else:
                self.executor.unreserve()
        if created:
            if claim is None:  # (a run launched here says so itself)
                self.executor.poke()
                self.shared.events.publish("durable", execution_id)
            if audit is not None:
                self.shared.audit.carried(audit)
        return Started(execution_id, duplicate=not created)

    async def signal(self, id: str, name: str, payload: Any = None) -> Signalled:
        """Send the signal ``name`` to an execution. The first signal of a name is kept
        (a repeat is a ``duplicate``, changing nothing); an execution waiting for it wakes."""
        check_id(id, "execution")
        if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
            raise BadInput(
                f"signal name \"{printable(str(name), 60)}\" must be 1-128 letters, digits, '_', '.', ':' or '-'",
                field="name",
            )
        text = check_json(payload, "payload", MAX_SIGNAL_BYTES)
        found = await self.store.durable_signal(id, name, text, self.clock.now())
        if found is None:
            raise NotFound(f'no execution with id "{id}"')
        status, duplicate = found
        if status in ("succeeded", "failed", "cancelled"):
            raise Refused(f"execution {id} is {status}; it takes no more signals", reason=f"execution {status}")
        self.executor.poke()
        if not duplicate:
            self.shared.events.publish("durable", id)
        # A repeat is recorded too, marked (as a job send's): who sent what is the audit's
        # question, and the first one's entry may be the one whose answer was lost.
        details: dict[str, Any] = {"name": name, "duplicate": True} if duplicate else {"name": name}
        await self.shared.audit.record("durable.signal", id, details)
        return Signalled(id, name, duplicate)

    async def cancel(self, id: str, *, by: str | None = None) -> Execution:
        """Cancel an execution: a queued or waiting one at once; a running one stops at
        its next step boundary (async work in flight is cancelled)."""
        check_id(id, "execution")
        actor = by or self.shared.audit.actor()
        note = f"cancelled by {actor}"
        found = await self.store.durable_cancel(id, self.clock.now(), note)
        if found is None:
            raise NotFound(f'no execution with id "{id}"')
        status, done = found
        if done is None:
            raise Refused(f"execution {id} has finished ({status}); there is nothing to cancel", reason=f"execution {status}")
        run = self.executor.running.get(id)
        if run is not None:
            run.request_cancel()
        self.shared.events.publish("durable", id)
        await self.shared.audit.record("durable.cancel", id, {"was": status, "done": done}, actor=actor)
        return await self.get(id)

    async def retry(self, id: str, *, by: str | None = None) -> Execution:
        """Queue a failed execution again: it replays its finished steps and runs its
        failed step again, with fresh attempts."""
        check_id(id, "execution")
        actor = by or self.shared.audit.actor()
        status = await self.store.durable_retry(id, self.clock.now(), f"retried by {actor}")
        if status is None:
            raise NotFound(f'no execution with id "{id}"')
        if status != "failed":
            raise Refused(f"execution {id} is {status}; only a failed execution can be retried", reason=f"execution {status}")
        self.executor.poke()
        self.shared.events.publish("durable", id)
        await self.shared.audit.record("durable.retry", id, actor=actor)
        return await self.get(id)

    async def get(self, id: str) -> Execution:
        """One execution with its steps (its timeline) and its log."""
        check_id(id, "execution")
        execution = await self.store.durable_get(id)
        if execution is None:
            raise NotFound(f'no execution with id "{id}"')
        return execution.as_ended()

    async def list(
        self,
        function: str | None = None,
        *,
        status: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> tuple[list[Execution], str | None]:
        """A page of executions, newest first, and the ``before`` of the next page."""
        if function is not None and (not isinstance(function, str) or not NAME_PATTERN.fullmatch(function)):
            raise BadInput(f'function "{printable(str(function), 60)}" is not a durable function name', field="function")
        if status is not None and status not in EXECUTION_STATUSES:
            raise BadInput(f'status "{printable(str(status), 40)}" is not one of {", ".join(EXECUTION_STATUSES)}', field="status")
        check_count(limit, "limit", 1, 1000)
        before = check_before(before, "execution")
        rows = await self.store.durable_list(function=function, status=status, limit=limit + 1, before=before)
        if len(rows) > limit:
            return rows[:limit], rows[limit - 1].id
        return rows, None

    async def page(
        self, function: str | None = None, *, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> ExecutionsPage:
        """:meth:`list` as a page."""
        rows, next_before = await self.list(function, status=status, limit=limit, before=before)
        return ExecutionsPage(rows, next_before)

    # -- schedules that start executions ------------------------------------------------
    async def start_for_slot(self, function: str, ctx: RunContext) -> Started:
        """What a schedule defined with ``durable=function`` does for a slot: start one
        execution, whose id derives from the schedule and the slot, so the slot starts one
        however many instances fire it (Run now starts a new one each time). The function
        may be one only other instances define (a stored schedule made through an instance
        of a newer release, during a rolling deploy): the slot's execution waits for one of
        them, rather than the slot failing where this instance wins it."""
        id_ = None if ctx.trigger == "manual" else execution_id_for_slot(ctx.name, ctx.scheduled_at)
        return await self.start_execution(
            function, ctx.payload, id=id_, schedule=ctx.name, scheduled_at=ctx.scheduled_at, anywhere=True
        )
