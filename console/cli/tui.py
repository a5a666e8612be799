"""``schedtui console`` and ``schedtui demo``: the verbs that run the console app, and what
they owe the terminal.

The app runs until quit, or until SIGTERM, SIGINT or the terminal's hangup ends it as its
Quit does; then the terminal is given back as it was (job control, the streams the app
had redirected), and an embedded engine lets its runs in flight finish for a few seconds.
``demo --headless`` prints every firing instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from backend import SchedtuiError
from backend.api.server import serve
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.model import Run
from backend.observability.capture import reinstate_if_moved
from backend.runtime.signals import HANGUP, on_stop_signals, why
from backend.safetext import TerminalFormatter
from console import format as fmt
from console.cli.backends import engine_for
from console.cli.derive import Verb
from console.cli.output import EXIT_OK, EXIT_USAGE, LOG_FORMAT, complain, configure_logging, log_level, say
from console.cli.parsing import CONSOLE_OPTIONS

__all__ = ["CONSOLE_GRACE", "DERIVED", "VERBS", "add_verbs", "cmd_console", "cmd_demo"]

#: None of these verbs is an operator action (the console acts through its keys).
DERIVED: list[Verb] = []


def add_verbs(verb: Any, group: Any) -> None:
    verb("console", "the operations console (also what `schedtui` alone starts)", CONSOLE_OPTIONS)
    p = verb("demo", "the console on bundled demo definitions (schedules, a queue, a durable function) with a temporary store", [])
    p.add_argument("--headless", action="store_true", help="no console: print every firing (Ctrl-C stops)")


async def cmd_demo(args: argparse.Namespace) -> int:
    if args.headless:
        return await _demo_headless()
    if not _has_terminal():
        return EXIT_USAGE
    from console.app import SchedtuiApp
    from console.demo import ExternalPlatform, demo_engine, run_now_at_start, seed_demo

    _quiet_logging()
    with tempfile.TemporaryDirectory(prefix="schedtui-demo-") as tmp:
        folder = Path(tmp)
        await seed_demo(folder)
        backend = EmbeddedBackend(demo_engine(folder), arm=True, own_thread=True)
        platform = ExternalPlatform(folder)
        platform.start()
        app = SchedtuiApp(backend, after_connect=run_now_at_start, keymap=_keymap(), freeze_heap=True)
        try:
            return await _run_console(app, backend)
        finally:
            platform.stop()


async def _demo_headless() -> int:
    configure_logging()
    with tempfile.TemporaryDirectory(prefix="schedtui-demo-") as tmp:
        from console.demo import play_platform, prepare_demo

        engine = await prepare_demo(Path(tmp))

        def show(run: Run) -> None:
            if run.status == "running":
                return
            zone = engine.schedules[run.name].timezone
            print(
                f"{fmt.local_time(run.scheduled_at, zone)}  {fmt.STATUS_GLYPHS[run.status]} {run.status:<9}  "
                f"{run.name:<16} {run.trigger:<8} {run.coordination_outcome:<8} {fmt.duration(run.duration_ms):>7}"
                + (f"  [{run.error_tag}] {run.error_message}" if run.error_tag else ""),
                flush=True,
            )

        engine.add_listener(show)
        engine.shutdown_grace = 2
        print(f"schedtui demo: {len(engine.schedules)} schedules, {len(engine.jobs.queues)} job queue(s), "
              f"{len(engine.durable.functions)} durable function(s), store {engine.store.where}; Ctrl-C stops", flush=True)
        platform = asyncio.ensure_future(play_platform(engine))
        try:
            await serve(EmbeddedBackend(engine, arm=True))  # no port: the engine alone, until Ctrl-C
        finally:
            platform.cancel()
    return EXIT_OK


CONSOLE_GRACE = 5.0
"""Seconds the embedded console's engine lets runs in flight finish after quitting."""


def _has_terminal() -> bool:
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    say("schedtui: the console needs a terminal (stdin and stdout are not a TTY); "
        "for scripts use the verbs, see `schedtui --help`")
    return False


def _quiet_logging() -> None:
    """Log lines would tear the console's screen: send them to $SCHEDTUI_LOG_FILE, or nowhere
    (both variables were checked as the command was read)."""
    path = os.environ.get("SCHEDTUI_LOG_FILE")
    handler: logging.Handler = logging.FileHandler(path) if path else logging.NullHandler()
    handler.setFormatter(TerminalFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(log_level())


def _keymap() -> dict[str, str]:
    from console.app import parse_keymap

    return parse_keymap(os.environ.get("SCHEDTUI_KEYMAP", ""))


async def _run_console(app: Any, backend: Backend) -> int:
    """Run the app; once the terminal is back, close the backend (an embedded engine lets
    its runs in flight finish, up to a few seconds). SIGTERM, SIGINT and the terminal's
    hangup (an SSH session that dropped) end the app as its Quit does, so that a firing
    console's runs in flight finish instead of being closed as abandoned; a second such
    signal stops waiting for them."""
    stopped_by: list[int] = []

    def on_stop(sig: int) -> None:
        stopped_by.append(sig)
        if sig == HANGUP:
            _let_go_of_the_terminal()
        app.exit()

    hurry = backend.interrupt if isinstance(backend, EmbeddedBackend) else (lambda: None)
    if isinstance(backend, EmbeddedBackend):
        backend.engine.end_process = lambda code: _end_with_the_terminal_back(app, code)
    remove_handlers = on_stop_signals(on_stop, hurry)
    try:
        await app.run_async()
    finally:
        _release_job_control()
        # The app put back the streams it had redirected, over the run logs' proxies: a run
        # in flight would print onto the terminal, and its log would stop here.
        reinstate_if_moved()
        try:
            if isinstance(backend, EmbeddedBackend):
                why_now = f"{why(stopped_by[0])}: " if stopped_by else ""
                say(f"schedtui: {why_now}stopping the engine (runs in flight get up to {CONSOLE_GRACE:g}s)")
            try:
                await asyncio.wait_for(backend.close(), CONSOLE_GRACE + 10)
            except (TimeoutError, SchedtuiError) as exc:
                complain(str(exc))
        finally:
            remove_handlers()
    return EXIT_OK


def _release_job_control() -> None:
    """The app has let go of the terminal: SIGTSTP and SIGCONT back to their defaults.
    Textual's driver installs handlers for them and never takes them back, so a SIGCONT
    after the app exited (tmux sends one as it closes a session, the kernel one with the
    hangup of a stopped group) started a driver again: its input thread spun on the
    hung-up terminal at 60% of a core, and the process never exited."""
    for name in ("SIGTSTP", "SIGCONT"):
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_DFL)


def _end_with_the_terminal_back(app: Any, code: int) -> None:
    """The engine ends the process: its lease lapsed while a handler it cannot stop still
    ran (a sync handler's thread; a Run now's, in a console without ``--fire`` too). The
    terminal is given back first (out of the alternate screen, its modes as they were),
    with a line saying why (the engine's own account goes to the log), rather than left
    as the app had it. On the engine's thread, or its loop watch's: the app's is not
    waited for."""
    driver = getattr(app, "_driver", None)
    if driver is not None:
        with contextlib.suppress(Exception):  # ending anyway
            driver.stop_application_mode()
            driver.close()  # (its writer thread writes what is queued, then stops)
    said = (
        f"schedtui: ENDING THE CONSOLE (exit code {code}): its lease on the work it runs lapsed (it could not write "
        "its heartbeat) while a handler that cannot be stopped still ran; another instance may take that work over: "
        "see the log ($SCHEDTUI_LOG_FILE) for which\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, said.encode())  # (the descriptor: the app captured sys.stderr)
    os._exit(code)


def _let_go_of_the_terminal() -> None:
    """The terminal hung up: what is still read or written (the app's last frames, the
    lines on stopping, Python's own flush at exit) goes to /dev/null instead of failing."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)


async def cmd_console(args: argparse.Namespace) -> int:
    if not _has_terminal():
        return EXIT_USAGE
    from console.app import SchedtuiApp

    backend: Backend
    if args.url:
        backend = RemoteBackend(args.url, args.token, read_only=args.read_only)
        interval = 2.0
    else:
        engine = engine_for(args, shutdown_grace=CONSOLE_GRACE)
        if args.fire and engine.coordination == "single":
            # One firer per embedded store: refused here, in one line, before the screen is drawn.
            await engine.store.take_firing_lock(engine.instance)
        # Without --fire the console only watches and acts: an operator's console must not
        # start firing a second time what `schedtui serve` already fires on this store.
        backend = EmbeddedBackend(engine, read_only=args.read_only, arm=args.fire, own_thread=True)
        interval = 1.0
    _quiet_logging()
    app = SchedtuiApp(backend, read_only=args.read_only, refresh_interval=interval, keymap=_keymap(),
                      freeze_heap=True)
    return await _run_console(app, backend)


VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "console": cmd_console,
    "demo": cmd_demo,
}
