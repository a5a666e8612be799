"""Durable executions in the console's fixture ledger, as of its frozen instant.

Deterministic (a manual clock, seeded ids): a nightly sync that retried a page and
succeeded, another waiting for its page's retry, a release waiting three days for an
approval, a report that failed, an export sleeping, a cancelled release, one queued for a
function no instance defines, and one running on another instance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from backend import Engine, ManualClock
from backend.durable import DurableContext, Retry, define_durable
from backend.durable.store import DurableStore, Progress, StepRecord, Write
from tests.console_fixtures import FROZEN, seeded_ids

ATTEMPTS: dict[str, int] = {}


async def fetch(execution: str, n: int) -> dict[str, int]:
    key = f"{execution}/{n}"
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if n == 3 and ATTEMPTS[key] == 1:
        raise ConnectionError("502 Bad Gateway from partner API")
    return {"rows": 10 * n}


async def nightly_sync(ctx: DurableContext, input: Any) -> dict[str, int]:
    pages = 0
    for n in range(1, 7):
        await ctx.step(f"fetch-{n}", fetch, ctx.id, n, retry=Retry(attempts=5, initial_delay=10, max_delay=300))
        pages += 1
    await ctx.step("notify", lambda: "sent", at_most_once=True)
    return {"pages": pages}


async def release(ctx: DurableContext, input: Any) -> Any:
    await ctx.step("build", lambda: {"artifact": "app-1.4.2.tar.gz"})
    approval = await ctx.wait_for("approval", timeout=timedelta(days=3))
    return await ctx.step("deploy", lambda: {"approved_by": approval})


def render() -> None:
    raise ValueError("template reports/weekly.html is missing")


async def report(ctx: DurableContext, input: Any) -> None:
    await ctx.step("query", lambda: 128)
    await ctx.step("render", render, retry=False)


async def export(ctx: DurableContext, input: Any) -> None:
    await ctx.step("dump", lambda: "s3://exports/2026-03-02.csv")
    await ctx.sleep("cool-down", timedelta(hours=1))


FUNCTIONS = [
    define_durable(name="nightly-sync", handler=nightly_sync),
    define_durable(name="release", handler=release),
    define_durable(name="report", handler=report),
    define_durable(name="export", handler=export),
]


async def add_durable_history(url: str) -> None:
    ATTEMPTS.clear()
    clock = ManualClock("2026-03-02T07:50:00Z")
    engine = Engine(FUNCTIONS, url, clock=clock, instance="web-1", coordination="advisoryLock",
                    ids=seeded_ids(clock, 23), shutdown_grace=0, retention=None, actor="alice")  # fmt: skip
    await engine.start()
    durable = engine.durable

    async def at(when: str) -> None:
        clock.set(f"2026-03-02T{when}Z")
        await engine.quiesce()

    await durable.start_execution("nightly-sync", {"full": True}, schedule="nightly",
                                  scheduled_at=clock.now())  # fmt: skip
    await at("07:50:00")
    await at("07:50:10")  # page 3's retry: done
    await at("07:52:00")
    await durable.start_execution("release", {"version": "1.4.2"})
    await at("07:52:00")
    await at("07:54:00")
    cancelled = await durable.start_execution("release", {"version": "1.4.1"})
    await at("07:54:00")
    await durable.cancel(cancelled.id, by="alice")
    await at("07:56:00")
    await durable.start_execution("report", {"week": 9})
    await at("07:58:00")
    await durable.start_execution("export")
    await at("07:59:58")
    await durable.start_execution("nightly-sync", {"full": False})  # page 3 fails: retry at 08:00:08
    await at("07:59:58")
    await engine.stop()
    # Started from a web app for a function no instance defines yet; and one running on web-2.
    store: Any = engine.store
    await store.open()
    typed: DurableStore = store
    await at_store(typed, clock)
    await store.close()


async def at_store(store: DurableStore, clock: ManualClock) -> None:
    from backend.durable.store import NewExecution

    ids = seeded_ids(clock, 29)
    clock.set("2026-03-02T08:00:02Z")
    await store.durable_insert(NewExecution(ids(), "reindex", '{"index": "orders"}', clock.now()))
    running = ids()
    await store.durable_insert(NewExecution(running, "export", "null", clock.now()))
    now = clock.now()
    [claimed] = await store.durable_claim("web-2", ["export"], now, now + timedelta(seconds=30), 1)
    step = StepRecord(1, "dump", "step", "succeeded", 1, now, now + timedelta(milliseconds=420), output='"s3://x"')
    later = now + timedelta(seconds=1)
    await store.durable_write(Write(running, claimed.execution.lease, later, Progress("dump", later + timedelta(seconds=30)), [step]))
    clock.set(FROZEN)
