"""The verbs that are no operator action and no console: ``serve`` (the engine, its API),
``migrate`` (the store's tables) and ``manifest`` (platform schedulers' files)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from backend import discover, open_store
from backend.api.server import serve
from backend.client.embedded import EmbeddedBackend
from backend.safetext import printable
from backend.scheduler.manifests import PROVIDERS, render_manifests
from backend.store.migrations import summary
from console.cli.backends import engine_for
from console.cli.derive import Verb
from console.cli.output import EXIT_OK, configure_logging, say
from console.cli.parsing import at_most, clock_offset_ms, port, positive_int, seconds

__all__ = ["DERIVED", "SERVE_DESCRIPTION", "VERBS", "add_verbs", "cmd_manifest", "cmd_migrate", "cmd_serve"]

#: None of these verbs is an operator action.
DERIVED: list[Verb] = []

SERVE_DESCRIPTION = (
    "Run the engine: fire every schedule of the definitions folder on its timer, run the workers of its job "
    "queues, evaluate the alert conditions (notifying the --notify webhooks of each transition) and, with --port, "
    "serve the HTTP API. serve refuses to start when any definitions file is bad "
    "(it names every one, exit code 2), and when its port is taken (exit code 1), before anything fires."
)


def add_verbs(verb: Any, group: Any) -> None:
    s = verb(
        "serve", "run the engine: fire schedules on their timers, serve the API",
        ["schedules", "store", "store_file", "instance", "token", "token_file"], description=SERVE_DESCRIPTION,
        token="operator token, NAME=SECRET (or a bare SECRET, named operator); several allowed; the name is "
        "who acted, in the audit log (or $SCHEDTUI_TOKEN, one per line); visible to other users in `ps`: "
        "prefer --token-file",
        token_file="read operator tokens from this file, one per line",
    )  # fmt: skip
    s.add_argument(
        "--coordination", choices=["single", "advisoryLock", "cluster"],
        help="how instances share the schedules (default: $SCHEDTUI_COORDINATION, else from the store: advisoryLock on "
        "PostgreSQL, single on SQLite); cluster divides them among the live instances (PostgreSQL only)",
    )
    s.add_argument("--retention-days", type=at_most(36_500), default=30, metavar="N",
                   help="keep runs N days (30; at most 36,500)")
    s.add_argument(
        "--claims-ttl-hours", type=at_most(876_000), default=24, metavar="N",
        help="sweep slot claims older than N hours (24); longer than any instance may lag behind",
    )
    s.add_argument(
        "--abandon-after", type=at_most(86_400), default=30, metavar="S",
        help="take an instance's work over (close its runs as abandoned, retry its jobs) once it sent no heartbeat for "
        "S seconds (30); an instance that cannot renew its own for two thirds of that stops its work",
    )
    # A test seam, not an operator option: pretend this machine's clock is off by MS.
    s.add_argument(
        "--clock-offset-ms", type=clock_offset_ms, metavar="MS", help=argparse.SUPPRESS,
        default=os.environ.get("SCHEDTUI_CLOCK_OFFSET_MS") or None,  # argparse applies the type to it
    )
    s.add_argument("--host", default="127.0.0.1", help="API address (127.0.0.1; others need a token)")
    s.add_argument("--port", type=port, metavar="P", help="serve the HTTP API on this port (0: any free port)")
    s.add_argument(
        "--read-token", metavar="T", default=argparse.SUPPRESS, action="append",
        help="read-only token, NAME=SECRET (or a bare SECRET, named reader); several allowed (or "
        "$SCHEDTUI_READ_TOKEN, one per line); visible to other users in `ps`: prefer --read-token-file",
    )
    s.add_argument("--read-token-file", metavar="PATH", default=argparse.SUPPRESS,
                   help="read read-only tokens from this file, one per line")  # fmt: skip
    s.add_argument(
        "--allow-external-self", action="store_true",
        help="let the external fire endpoint fire schedules that have their own timer too (advisoryLock only)",
    )
    s.add_argument(
        "--notify", metavar="URL", action="append", default=[],
        help="POST every alert transition to this webhook (JSON with a `text` a Slack or Mattermost incoming webhook "
        "shows), or to PagerDuty with pagerduty://ROUTING_KEY; several allowed; visible to other users in `ps`: "
        "prefer --notify-file",
    )
    s.add_argument("--notify-file", metavar="PATH",
                   help="webhook (or pagerduty://) URLs to notify, one per line (# comments)")  # fmt: skip
    s.add_argument("--alert-interval", type=seconds, default=15.0, metavar="S",
                   help="evaluate the alert conditions every S seconds (15)")  # fmt: skip
    s.add_argument("--notify-timeout", type=seconds, default=10.0, metavar="S",
                   help="give a webhook S seconds to answer (10); then it is tried again later")  # fmt: skip
    # Test seams, not operator options: a delivery's claim lease, the first retry's wait, the outbox poll.
    s.add_argument("--notify-lease", type=seconds, default=60.0, help=argparse.SUPPRESS)
    s.add_argument("--notify-backoff", type=seconds, default=5.0, help=argparse.SUPPRESS)
    s.add_argument("--notify-poll", type=seconds, default=5.0, help=argparse.SUPPRESS)
    # Test seams too: a cluster shard's lease (its take-over waits).
    s.add_argument("--shard-lease", type=seconds, default=10.0, help=argparse.SUPPRESS)
    s.add_argument("--job-backoff", type=positive_int, default=10, help=argparse.SUPPRESS)  # a failed job's first retry

    verb(
        "migrate", "create or migrate the store's tables to this release, then exit", ["store", "store_file"],
        description="Create the store's tables, or migrate them to this release, then exit; print what was done. "
        "Every start does this too, when its role may: run it with the schema owner's role where the instances run "
        "as a role that may only use the tables.",
    )  # fmt: skip

    p = verb("manifest", "platform scheduler manifests for trigger=external schedules", ["schedules"])
    p.add_argument("--provider", required=True, choices=PROVIDERS, help="where the clock lives")
    p.add_argument("--base-url", required=True, metavar="URL", help="where the platform reaches `schedtui serve`")
    p.add_argument("--out", metavar="DIR", help="write files here instead of printing them")


async def cmd_serve(args: argparse.Namespace) -> int:
    configure_logging()
    from datetime import timedelta

    from backend.clock import OffsetClock
    engine = engine_for(
        args,
        create=True,
        coordination=args.coordination,
        retention=timedelta(days=args.retention_days),
        claims_ttl=timedelta(hours=args.claims_ttl_hours),
        abandon_after=float(args.abandon_after),
        heartbeat_interval=min(5.0, args.abandon_after / 3),
        clock=OffsetClock(timedelta(milliseconds=args.clock_offset_ms)) if args.clock_offset_ms else None,
        alerting=args.alerting,
        shard_ttl=args.shard_lease,
        job_backoff=args.job_backoff,
    )
    log = logging.getLogger("schedtui")
    if args.clock_offset_ms:
        log.warning(
            "THE CLOCK IS SHIFTED by %+d ms (--clock-offset-ms or $SCHEDTUI_CLOCK_OFFSET_MS, a test setting): "
            "every slot fires that much %s than the machine's clock says",
            args.clock_offset_ms,
            "earlier" if args.clock_offset_ms > 0 else "later",
        )
    if not engine.schedules and not engine.durable.functions:
        log.warning("no schedules found under %s", args.schedules)
    if os.getpid() == 1:
        # The orphans of a PID namespace are its process 1's to reap: none are here.
        log.warning(
            "serve runs as process 1 (a container started without an init): the processes its handlers leave "
            "behind (a shell's background job, a daemon's parent) are never reaped and stay as zombies until the "
            "container ends; give the container an init (docker run --init, tini or dumb-init as its entrypoint)"
        )
    backend = EmbeddedBackend(engine, arm=True, allow_external_self=args.allow_external_self)
    await serve(backend, host=args.host, port=args.port, token=args.token, read_token=args.read_token)
    return EXIT_OK


async def cmd_migrate(args: argparse.Namespace) -> int:
    store = open_store(args.store, create=True)
    await store.open()
    try:
        done = store.migrated
    finally:
        await store.close()
    if done:
        print(f'migrated the store "{printable(store.where)}": {summary(done)}')
    else:
        print(f'the store "{printable(store.where)}" is up to date: nothing to migrate')
    return EXIT_OK


async def cmd_manifest(args: argparse.Namespace) -> int:
    files = render_manifests(discover(args.schedules), args.provider, args.base_url)
    if not files:
        say(f"schedtui: no schedule under {args.schedules} has trigger=\"external\"; nothing to write")
        return EXIT_OK
    if args.out:
        out = Path(args.out)
        for file in files:
            target = out / file.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(file.content)
            print(target)
        return EXIT_OK
    for index, file in enumerate(files):
        if len(files) > 1:
            print(f"{'' if index == 0 else chr(10)}# ---- {file.path} ----")
        print(file.content, end="" if file.content.endswith("\n") else "\n")
    return EXIT_OK


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "serve": cmd_serve,
    "migrate": cmd_migrate,
    "manifest": cmd_manifest,
}
