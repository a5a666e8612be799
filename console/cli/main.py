"""The ``schedtui`` command: parses arguments and dispatches verbs; with no verb, the console.

This module holds the parser, the options every verb shares, and the verbs that are no
operator action and no console (``serve``, ``migrate``, ``manifest``). The console's verbs
(``console``, ``demo``) live in :mod:`console.cli.tui`; the verbs that are actions in the
other verb modules (:data:`VERB_MODULES`), derived from the actions' declarations by
:mod:`console.cli.derive`.

Exit codes: 0 success, 1 failure, 2 bad usage or input (one line on stderr naming the
bad value), 3 a refused backfill (the count and the reason are printed).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import errno
import importlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from backend import (
    BadInput,
    DefinitionError,
    Engine,
    NotFound,
    Refused,
    SchedtuiError,
    Unauthorized,
    Unavailable,
    __version__,
    discover,
    open_store,
)
from backend.alerts.notifier import AlertSettings, parse_sinks
from backend.api.server import serve
from backend.api.tokens import Tokens, parse_token
from backend.client.connection import check_instance
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend, check_server_url, check_token
from backend.definitions import Definitions, discover_definitions
from backend.events.audit import check_actor
from backend.inputs import decimal_number, shown_number, whole_number
from backend.model import (
    COORDINATION_MODES,
    DEFAULT_DEFINITIONS_FOLDER,
    DEFAULT_STORE_URL,
)
from backend.observability.capture import handler_prints_to_stderr
from backend.safetext import TerminalFormatter, in_json, in_lines, printable, redact_url, remember_secret
from backend.scheduler.manifests import PROVIDERS, render_manifests
from backend.store import Store, store_lost, until_lost
from backend.store.migrations import summary
from backend.store.sqlite.file import short_of_descriptors
from console.cli import exitwatch

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


class UsageError(Exception):
    """Bad usage caught by the argument parser."""


class _Parser(argparse.ArgumentParser):
    """argparse, but bad usage is one line on stderr and exit code 2, and options are
    never abbreviated (``--to`` must not be read as the start of ``--token``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            message = f"say `{self._required()}` ({message})"
        raise UsageError(f"{self.prog}: {message}")

    def _required(self) -> str:
        """The command with its required arguments (``schedtui queues pause QUEUE``)."""
        words = [self.prog]
        for action in self._actions:
            if action.option_strings and action.required:
                words.append(f"{action.option_strings[0]} {action.metavar or action.dest.upper()}")
            elif not action.option_strings and action.nargs is None:
                words.append(str(action.metavar or action.dest.upper()))
        return " ".join(words)


# Numbers as typed in ASCII: Python's int() and float() also take other scripts' digits
# ("٣"), underscores ("1_0") and surrounding blanks, and float() "nan" and "inf".
def _positive_int(text: str) -> int:
    try:
        value = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown_number(text, 60)} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{_typed(text, value)} must be at least 1")
    return value


def _typed(text: str, value: int) -> str:
    """A number typed, as a refusal quotes it: grouped (``36,501``), or cut when long
    (:func:`~backend.inputs.whole_number` takes one of thousands of digits as ±10**4000)."""
    return f"{value:,}" if len(text) <= 30 else printable(text, 40)


def _at_most(high: int) -> Callable[[str], int]:
    """:func:`_positive_int`, at most ``high``: a length of time past which dates overflow
    (and before which a retention would reach back before 1970)."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{_typed(text, value)} is more than {high:,}")
        return value

    return parse


#: The clock's test offset, at most (a century, either way: the calendar ends beyond).
_MAX_OFFSET_MS = 100 * 366 * 86_400_000


def _clock_offset_ms(text: str) -> int:
    value = _whole(text)
    if abs(value) > _MAX_OFFSET_MS:
        raise argparse.ArgumentTypeError(f"{_typed(text, value)} ms is more than a century ({_MAX_OFFSET_MS:,} ms) either way")
    return value


def _seconds(text: str) -> float:
    try:
        value = decimal_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown_number(text, 60)} is not a number of seconds") from None
    if not 0 < value < 10**7:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _whole(text: str) -> int:
    try:
        return whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown_number(text, 60)} is not a whole number") from None


def _port(text: str) -> int:
    try:
        value = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown_number(text, 60)} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{_typed(text, value)} is not a port number (0-65535)")
    return value


@dataclass(frozen=True)
class _Shared:
    """An option that may stand before the verb as well as after it."""

    flags: tuple[str, ...]
    dest: str
    help: str
    metavar: str | None = None
    flag: bool = False
    repeat: bool = False


# Any of these may come before the verb (`schedtui --read-only console`) or after it; one
# given before a verb it does not apply to is refused, never silently dropped.
SHARED = [
    _Shared(("--schedules",), "schedules", "definitions folder, searched for *.cron.py, *.jobs.py and *.durable.py "
            f"files (default ./{DEFAULT_DEFINITIONS_FOLDER}, or $SCHEDTUI_SCHEDULES)", "DIR"),
    _Shared(("--store",), "store", f"sqlite:///PATH or postgresql://… (default {DEFAULT_STORE_URL}, or $SCHEDTUI_STORE); "
            "a password in it is visible to other users in `ps`: prefer --store-file, or $PGPASSFILE", "URL"),
    _Shared(("--store-file",), "store_file", "read the store URL from this file (its surrounding whitespace ignored)",
            "PATH"),
    _Shared(("--instance",), "instance", "name recorded on runs (default hostname:pid)", "NAME"),
    _Shared(("--url",), "url", "act on a remote `schedtui serve` instead (or $SCHEDTUI_URL)", "URL"),
    _Shared(("--token",), "token", "bearer token for --url (or $SCHEDTUI_TOKEN); visible to other users in `ps`: "
            "prefer --token-file", "T", repeat=True),
    _Shared(("--token-file",), "token_file", "read the token from this file (its surrounding whitespace ignored)",
            "PATH"),
    _Shared(("--as",), "actor", "who acts, in the audit log and on a disabled schedule (default: your OS user); "
            "a server records the name of your token instead", "NAME"),
    _Shared(("--read-only",), "read_only", "look, do not touch: actions are refused (by the backend too)", flag=True),
    _Shared(("--fire",), "fire", "embedded console: also fire schedules on their timers (as `serve` does); without it "
            "the console watches and acts, and `schedtui serve` does the firing", flag=True),
]  # fmt: skip
_SHARED_BY_DEST = {option.dest: option for option in SHARED}
_DEFAULTS: dict[str, Callable[[], Any]] = {
    "schedules": lambda: os.environ.get("SCHEDTUI_SCHEDULES") or DEFAULT_DEFINITIONS_FOLDER,
    "store": lambda: os.environ.get("SCHEDTUI_STORE") or DEFAULT_STORE_URL,
    "store_file": lambda: None,
    "instance": lambda: None,
    "url": lambda: os.environ.get("SCHEDTUI_URL") or None,
    "token": lambda: None,  # resolved with its file and $SCHEDTUI_TOKEN by _resolve_token
    "token_file": lambda: None,
    "actor": lambda: None,  # the engine's default: the OS user
    "read_only": lambda: False,
    "fire": lambda: False,
}
_CONSOLE = [option.dest for option in SHARED]
_VERB_OPTIONS = ["schedules", "store", "store_file", "instance", "url", "token", "token_file", "actor", "read_only"]


def _add_shared(p: argparse.ArgumentParser, dests: Sequence[str], **helps: str) -> None:
    for dest in dests:
        option = _SHARED_BY_DEST[dest]
        kwargs: dict[str, Any] = {"dest": dest, "help": helps.get(dest, option.help), "default": argparse.SUPPRESS}
        if option.flag:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = option.metavar
            if option.repeat:
                kwargs["action"] = "append"
        p.add_argument(*option.flags, **kwargs)


SERVE_DESCRIPTION = (
    "Run the engine: fire every schedule of the definitions folder on its timer, run the workers of its job "
    "queues, evaluate the alert conditions (notifying the --notify webhooks of each transition) and, with --port, "
    "serve the HTTP API. serve refuses to start when any definitions file is bad "
    "(it names every one, exit code 2), and when its port is taken (exit code 1), before anything fires."
)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each verb's own parser (to tell which shared options a verb takes)."""
    parser = _Parser(prog="schedtui", description="Run and operate scheduled work.")
    parser.add_argument("--version", action="version", version=f"schedtui {__version__}")
    _add_shared(parser, _CONSOLE)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    by_verb: dict[str, argparse.ArgumentParser] = {}

    def verb(name: str, help: str, shared: Sequence[str]) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help)
        by_verb[name] = sub
        _add_shared(sub, shared)
        return sub

    serve = verbs.add_parser(
        "serve", help="run the engine: fire schedules on their timers, serve the API", description=SERVE_DESCRIPTION
    )
    by_verb["serve"] = serve
    _add_shared(serve, ["schedules", "store", "store_file", "instance", "token", "token_file"],
                token="operator token, NAME=SECRET (or a bare SECRET, named operator); several allowed; the name is "
                "who acted, in the audit log (or $SCHEDTUI_TOKEN, one per line); visible to other users in `ps`: "
                "prefer --token-file",
                token_file="read operator tokens from this file, one per line")  # fmt: skip
    serve.add_argument(
        "--coordination", choices=["single", "advisoryLock", "cluster"],
        help="how instances share the schedules (default: $SCHEDTUI_COORDINATION, else from the store: advisoryLock on "
        "PostgreSQL, single on SQLite); cluster divides them among the live instances (PostgreSQL only)",
    )
    serve.add_argument("--retention-days", type=_at_most(36_500), default=30, metavar="N",
                       help="keep runs N days (30; at most 36,500)")
    serve.add_argument(
        "--claims-ttl-hours", type=_at_most(876_000), default=24, metavar="N",
        help="sweep slot claims older than N hours (24); longer than any instance may lag behind",
    )
    serve.add_argument(
        "--abandon-after", type=_at_most(86_400), default=30, metavar="S",
        help="take an instance's work over (close its runs as abandoned, retry its jobs) once it sent no heartbeat for "
        "S seconds (30); an instance that cannot renew its own for two thirds of that stops its work",
    )
    # A test seam, not an operator option: pretend this machine's clock is off by MS.
    serve.add_argument(
        "--clock-offset-ms", type=_clock_offset_ms, metavar="MS", help=argparse.SUPPRESS,
        default=os.environ.get("SCHEDTUI_CLOCK_OFFSET_MS") or None,  # argparse applies the type to it
    )
    serve.add_argument("--host", default="127.0.0.1", help="API address (127.0.0.1; others need a token)")
    serve.add_argument("--port", type=_port, metavar="P", help="serve the HTTP API on this port (0: any free port)")
    serve.add_argument(
        "--read-token", metavar="T", default=argparse.SUPPRESS, action="append",
        help="read-only token, NAME=SECRET (or a bare SECRET, named reader); several allowed (or "
        "$SCHEDTUI_READ_TOKEN, one per line); visible to other users in `ps`: prefer --read-token-file",
    )
    serve.add_argument("--read-token-file", metavar="PATH", default=argparse.SUPPRESS,
                       help="read read-only tokens from this file, one per line")  # fmt: skip
    serve.add_argument(
        "--allow-external-self", action="store_true",
        help="let the external fire endpoint fire schedules that have their own timer too (advisoryLock only)",
    )
    serve.add_argument(
        "--notify", metavar="URL", action="append", default=[],
        help="POST every alert transition to this webhook (JSON with a `text` a Slack or Mattermost incoming webhook "
        "shows), or to PagerDuty with pagerduty://ROUTING_KEY; several allowed; visible to other users in `ps`: "
        "prefer --notify-file",
    )
    serve.add_argument("--notify-file", metavar="PATH",
                       help="webhook (or pagerduty://) URLs to notify, one per line (# comments)")  # fmt: skip
    serve.add_argument("--alert-interval", type=_seconds, default=15.0, metavar="S",
                       help="evaluate the alert conditions every S seconds (15)")  # fmt: skip
    serve.add_argument("--notify-timeout", type=_seconds, default=10.0, metavar="S",
                       help="give a webhook S seconds to answer (10); then it is tried again later")  # fmt: skip
    # Test seams, not operator options: a delivery's claim lease, the first retry's wait, the outbox poll.
    serve.add_argument("--notify-lease", type=_seconds, default=60.0, help=argparse.SUPPRESS)
    serve.add_argument("--notify-backoff", type=_seconds, default=5.0, help=argparse.SUPPRESS)
    serve.add_argument("--notify-poll", type=_seconds, default=5.0, help=argparse.SUPPRESS)
    # Test seams too: a cluster shard's lease (its take-over waits).
    serve.add_argument("--shard-lease", type=_seconds, default=10.0, help=argparse.SUPPRESS)
    serve.add_argument("--job-backoff", type=_positive_int, default=10, help=argparse.SUPPRESS)  # a failed job's first retry

    migrate = verbs.add_parser(
        "migrate", help="create or migrate the store's tables to this release, then exit",
        description="Create the store's tables, or migrate them to this release, then exit; print what was done. "
        "Every start does this too, when its role may: run it with the schema owner's role where the instances run "
        "as a role that may only use the tables.",
    )  # fmt: skip
    by_verb["migrate"] = migrate
    _add_shared(migrate, ["store", "store_file"])

    def group(
        name: str,
        help: str,
        shared: Sequence[str] = (),
        options: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> Callable[[str, str, Sequence[str]], argparse.ArgumentParser]:
        """A verb with sub-verbs (``schedtui jobs list``); returns the maker of its sub-verbs.
        The group alone (``schedtui locks``) is a command too when its module handles it;
        ``options`` adds the group's own options to it (``schedtui locks --json``)."""
        sub = verb(name, help, shared)
        if options is not None:
            options(sub)
        inner = sub.add_subparsers(dest="subverb", metavar="VERB", parser_class=_Parser)

        def subverb(subname: str, help: str, shared: Sequence[str]) -> argparse.ArgumentParser:
            p = inner.add_parser(subname, help=help)
            by_verb[f"{name} {subname}"] = p
            _add_shared(p, shared)
            return p

        return subverb

    for module in verb_modules():
        module.add_verbs(verb, group)

    p = verb("manifest", "platform scheduler manifests for trigger=external schedules", ["schedules"])
    p.add_argument("--provider", required=True, choices=PROVIDERS, help="where the clock lives")
    p.add_argument("--base-url", required=True, metavar="URL", help="where the platform reaches `schedtui serve`")
    p.add_argument("--out", metavar="DIR", help="write files here instead of printing them")
    return parser, by_verb


#: Modules adding verbs (the console's, then one system's each): ``add_verbs(verb, group)`` declares them and
#: ``VERBS`` maps each command (``"jobs list"``) to its handler. Imported lazily, so that
#: they may import this module's helpers.
VERB_MODULES: list[str] = [
    "console.cli.tui", "console.cli.schedules", "console.cli.jobs", "console.cli.durable", "console.cli.locks", "console.cli.audit",
    "console.cli.alerts", "console.cli.fleet",
]


def verb_modules() -> list[Any]:
    return [importlib.import_module(name) for name in VERB_MODULES]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse, check shared options against the verb, fill defaults, resolve the tokens.
    Raises :class:`UsageError` for bad usage (exit code 2)."""
    parser, by_verb = build_parser()
    args = parser.parse_args(_glue_offsets(argv))
    if args.verb is None:
        args.verb = "console"
    args.command = f"{args.verb} {args.subverb}" if getattr(args, "subverb", None) else args.verb
    if args.command not in _verbs():
        raise UsageError(f"schedtui {args.verb}: say what to do (see `schedtui {args.verb} --help`)")
    log_level()  # (checked here, for every command alike, before any engine or firing lock)
    if args.command == "console" or (args.command == "demo" and not args.headless):  # (the commands that log there)
        _check_log_file()
    accepted = {action.dest for action in by_verb[args.command]._actions}
    for option in SHARED:
        if hasattr(args, option.dest) and option.dest not in accepted:
            raise UsageError(f"schedtui: {option.flags[0]} does not apply to `schedtui {args.verb}`")
    for dest, flag in (("schedules", "--schedules"), ("store", "--store"), ("store_file", "--store-file")):
        if isinstance(getattr(args, dest, None), str) and not getattr(args, dest).strip():
            # ('' would mean the working directory, or the default store: not what was named)
            raise UsageError(f"schedtui: {flag} is empty: name one, or leave the option out for its default")
    store_given = next((flag for flag, dest in (("--store", "store"), ("--store-file", "store_file")) if hasattr(args, dest)), None)
    url_given = "--url" if hasattr(args, "url") else "$SCHEDTUI_URL"
    if "store" in accepted:
        _resolve_store(args)
    # Named on the command line or in the environment, rather than the default folder.
    args.schedules_named = hasattr(args, "schedules") or bool(os.environ.get("SCHEDTUI_SCHEDULES"))
    for dest in accepted & set(_DEFAULTS):
        if not hasattr(args, dest):
            setattr(args, dest, _DEFAULTS[dest]())
    if store_given is not None and getattr(args, "url", None):
        # One would be ignored: say so rather than act on the other.
        raise UsageError(f"schedtui: {store_given} and {url_given} name two backends; give one "
                         f"({store_given} acts on the store itself, {url_given} through a server)")
    try:
        if getattr(args, "instance", None) is not None:  # it goes on every run, shown in tables
            check_instance(args.instance, "--instance")
        if getattr(args, "url", None):  # before a client is made of it: httpx would fail with a traceback
            check_server_url(args.url)
    except BadInput as exc:
        raise UsageError(f"schedtui: {exc.message}") from None
    if args.verb == "serve":
        args.token = _resolve_tokens(args, "token", "SCHEDTUI_TOKEN", several=True)
        args.read_token = _resolve_tokens(args, "read_token", "SCHEDTUI_READ_TOKEN", several=True)
        try:
            Tokens.from_options(args.token, args.read_token)  # names and secrets distinct, names valid
        except BadInput as exc:
            raise UsageError(f"schedtui: {exc.message}") from None
        args.alerting = _alert_settings(args)
    elif "token" in accepted:
        tokens = _resolve_tokens(args, "token", "SCHEDTUI_TOKEN", several=False)
        try:
            args.token = parse_token(tokens[0], "operate").secret if tokens else None  # NAME=SECRET sends SECRET
        except BadInput as exc:
            raise UsageError(f"schedtui: {exc.message}") from None
    _resolve_actor(args)
    return args


def _resolve_tokens(args: argparse.Namespace, dest: str, env: str, *, several: bool) -> list[str]:
    """Tokens from ``--X`` (repeatable; with a warning: ``ps`` shows it), ``--X-file`` or
    ``$ENV``: for a server (``several``) one per line of the file or variable, for a client
    the one token. Empty or blank tokens are refused: they would quietly mean "no token"."""
    flag = "--" + dest.replace("_", "-")
    given, path = getattr(args, dest, None), getattr(args, f"{dest}_file", None)
    if given is not None and path is not None:
        raise UsageError(f"schedtui: give {flag} or {flag}-file, not both")
    if given is not None:
        texts, source = [str(t) for t in given], flag
    elif path is not None:
        try:
            content = Path(path).read_text(encoding="utf-8-sig")  # (a byte-order mark left out: see _resolve_store)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(f'schedtui: cannot read {flag}-file "{printable(path)}": {reason}') from None
        texts, source = _token_lines(content), f'{flag}-file "{printable(path)}"'
    else:
        from_env = os.environ.get(env)
        if not from_env:
            return []
        texts, source = _token_lines(from_env), f"${env}"
    if len(texts) > 1 and not several:
        raise UsageError(f"schedtui: {source} gives {len(texts)} tokens; a client sends one")
    tokens = [text.strip() for text in texts]
    if not tokens or not all(tokens):
        raise UsageError(f"schedtui: the token from {source} is empty (or only whitespace)")
    for token in tokens:
        remember_secret(token)
        try:
            remember_secret(parse_token(token, "operate").secret)
            if not several:  # a client sends it in a header, which would fail quoting it
                check_token(token)
        except BadInput as exc:
            raise UsageError(f"schedtui: {exc.message} (in {source})") from None
    if given is not None:  # (after the checks: a refusal is one line)
        say(f"schedtui: warning: {flag} on the command line can be read by every local user (ps); "
            f"use {flag}-file PATH or ${env}")
    return tokens


def notify_file_urls(content: str, path: str) -> list[str]:
    """The URLs of a ``--notify-file``: one a line; blank lines and ``#`` comments, whole
    lines or after the URL, left out; other text after a URL is a usage error."""
    urls = []
    for number, line in enumerate(content.splitlines(), start=1):
        words = line.split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 1 and not words[1].startswith("#"):  # (the URL is not repeated: it holds its secret)
            raise UsageError(
                f'schedtui: --notify-file "{printable(path)}" line {number}: text after the URL that is not a '
                "# comment (one URL a line)"
            )
        urls.append(words[0])
    return urls


def _alert_settings(args: argparse.Namespace) -> AlertSettings:
    """``serve``'s alert options, checked: every sink URL (``--notify``, ``--notify-file``)
    and the timings; a bad one is a usage error naming it."""
    urls = list(args.notify)
    if args.notify:
        say("schedtui: warning: --notify on the command line can be read by every local user (ps), and a "
            "webhook URL holds its secret; use --notify-file PATH")
    if args.notify_file is not None:
        try:
            content = Path(args.notify_file).read_text(encoding="utf-8-sig")  # (a byte-order mark left out: see _resolve_store)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(f'schedtui: cannot read --notify-file "{printable(args.notify_file)}": {reason}') from None
        urls += notify_file_urls(content, args.notify_file)
    try:
        parse_sinks(urls)
        return AlertSettings(
            sinks=tuple(urls), interval=args.alert_interval, timeout=args.notify_timeout, lease=args.notify_lease,
            backoff=args.notify_backoff, poll=args.notify_poll,
        )  # fmt: skip
    except BadInput as exc:
        raise UsageError(f"schedtui: {exc.message}") from None


def _resolve_store(args: argparse.Namespace) -> None:
    """The store URL from ``--store`` (warned about when it carries a password: ``ps``
    shows it to every local user) or ``--store-file``; else the default fills it in."""
    given, path = getattr(args, "store", None), getattr(args, "store_file", None)
    if given is not None and path is not None:
        raise UsageError("schedtui: give --store or --store-file, not both")
    if given is not None:
        if given.startswith(("postgresql:", "postgres:")) and redact_url(given) != given:  # (other schemes are refused)
            say(
                "schedtui: warning: the password in --store can be read by every local user (ps); use --store-file PATH "
                "or $SCHEDTUI_STORE, or a URL without it and libpq's $PGPASSFILE (~/.pgpass) or $PGPASSWORD"
            )
    elif path is not None:
        try:
            # (utf-8-sig: the byte-order mark Notepad and PowerShell 5 begin a file with is no part of its text)
            url = Path(path).read_text(encoding="utf-8-sig").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(f'schedtui: cannot read --store-file "{printable(path)}": {reason}') from None
        if not url:
            raise UsageError(f'schedtui: --store-file "{printable(path)}" holds no store URL')
        args.store = url


def _token_lines(text: str) -> list[str]:
    """Tokens one per line, blank lines and ``#`` comments skipped."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")] or [""]


def _resolve_actor(args: argparse.Namespace) -> None:
    actor = getattr(args, "actor", None)
    if actor is None:
        return
    if getattr(args, "url", None):
        raise UsageError(
            "schedtui: --as applies to a store acted on directly; a server records the name of your token "
            "(see `schedtui serve --token NAME=SECRET`)"
        )
    try:
        check_actor(actor, "--as")
    except BadInput as exc:
        raise UsageError(f"schedtui: {exc.message}") from None


# -------------------------------------------------------------------------------------------
# entry point
# -------------------------------------------------------------------------------------------
def _glue_offsets(argv: Sequence[str]) -> list[str]:
    """``--from -3h``: argparse takes ``-3h`` for an option; hand it on as ``--from=-3h``."""
    glued: list[str] = []
    for arg in argv:
        if glued and glued[-1] in ("--from", "--to") and re.match(r"-\d", arg):
            glued[-1] = f"{glued[-1]}={arg}"
        else:
            glued.append(arg)
    return glued


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_stdout()
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        say(in_lines(str(exc)))
        return EXIT_USAGE
    handler = _verbs()[args.command]
    output = _Output(sys.stdout)
    try:
        with contextlib.nullcontext() if args.command in _OWN_OUTPUT else _verb_output(output):
            return _run(handler(args), args.command)
    except KeyboardInterrupt:
        return 130
    except (BadInput, NotFound, DefinitionError) as exc:
        complain(exc.message)
        return EXIT_USAGE
    except Refused as exc:
        complain(exc.message)
        return EXIT_REFUSED
    except Unauthorized as exc:
        complain(f"{exc.message}: give the token with --token-file PATH or $SCHEDTUI_TOKEN")
        return EXIT_FAILURE
    except SchedtuiError as exc:
        complain(exc.message)
        return EXIT_FAILURE
    except (OSError, ImportError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and output.refused_by(exc):
            return _cannot_write(exc, output.stream)  # (a reader gone is run()'s: exit 141)
        # Out of file descriptors where no store or server said it first: a lazy import
        # (dlopen's failure is an ImportError), a log file, a socket. One line, not a traceback.
        if not _out_of_descriptors(exc):
            raise
        complain(f"{exc}: {short_of_descriptors() or 'this process has no file descriptor left (raise it: ulimit -n)'}")
        return EXIT_FAILURE


class _Output:
    """Standard output while a verb writes its output to it: the stream itself, but a write
    or flush it refuses (a full disk) is remembered, so that the entry point tells that
    refusal from any other OSError (a bug: a traceback) and says it in one line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.refused: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)  # type: ignore[no-any-return]
        except OSError as exc:
            self.refused = exc
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            self.refused = exc
            raise

    def refused_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or was raised in handling) the refusal of this stream."""
        seen: BaseException | None = exc
        while seen is not None:
            if seen is self.refused:
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _cannot_write(exc: OSError, stream: Any) -> int:
    """Standard output refused the verb's output (a full disk): one line saying so, exit 1
    (what was to be read is lost, whatever the verb did: a fired run's outcome is in the
    ledger, `schedtui runs`). What is still buffered for the stream, and Python's flush at
    exit, go to /dev/null: they would fail again, with a traceback."""
    complain(f"cannot write the output: {exc.strerror or exc}")
    with contextlib.suppress(OSError, ValueError, AttributeError):  # (a stream of no descriptor: in a test)
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return EXIT_FAILURE


def _out_of_descriptors(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    return "Too many open files" in str(exc)


def _run(verb: Coroutine[Any, Any, int], name: str) -> int:
    """``asyncio.run(verb)``, but a loop stopped from inside (a handler that called
    ``loop.stop()``) runs on: the verb has not ended, and asyncio.run would have cancelled
    every task (the runs, the API's requests) and ended the process. Once the verb has
    ended, threads a handler left running do not hold the process (see :mod:`exitwatch`:
    closing the loop joins its executor's threads)."""
    with asyncio.Runner() as runner:
        task = runner.get_loop().create_task(verb)
        while True:
            try:
                status = runner.run(_awaiting(task))  # (Ctrl-C cancels the waiter, and so the verb)
            except RuntimeError:
                if task.done():
                    exitwatch.arm(EXIT_FAILURE, name)
                    raise
                logging.getLogger("schedtui").warning(
                    "the event loop was stopped by the code it ran (loop.stop() in a handler?); it runs on"
                )
            except KeyboardInterrupt:
                exitwatch.arm(130, name)
                raise
            except BaseException:
                exitwatch.arm(EXIT_FAILURE, name)
                raise
            else:
                exitwatch.arm(status, name)
                return status


async def _awaiting(task: asyncio.Task[int]) -> int:
    return await task


def complain(message: str) -> None:
    """``schedtui: message`` on stderr (by :func:`say`), its control characters,
    bidirectional controls and lone surrogates escaped (``\\x1b``, ``\\u202e``): a name, or a
    server's answer, quoted in a message never reaches the terminal as a command (an escape
    sequence retitles the window, clears the screen; an override draws the rest of the line
    backwards)."""
    say(f"schedtui: {in_lines(message)}")


def say(text: str = "", *, end: str = "\n") -> None:
    """``text`` on stderr: the command's own words beside its output (a run fired, a
    backfill's progress, a warning, a refusal). A stream that refuses it (a full disk, a
    reader gone, a closed stream) loses the words, never the work the verb waits for, nor
    the exit code that says how that work went: the refusal left the verb, whose engine
    then closed, and a backfill running in this process was abandoned after its first slot."""
    with contextlib.suppress(OSError, ValueError):  # (ValueError: a stream closed)
        print(text, end=end, file=sys.stderr, flush=True)


def _engine(args: argparse.Namespace, *, create: bool = False, definitions_needed: bool = True, **kwargs: Any) -> Engine:
    """The engine over ``--store``. Only ``serve`` creates a missing store (``create``); the
    verbs that read or act, and the console, refuse it naming the path (exit 2). A verb
    that uses no definition (``definitions_needed`` false: the job queue's, locks, audit)
    does without the folder when none was named and the default one is absent; a folder
    that was named must exist."""
    definitions: Definitions | list[Any]
    if not definitions_needed and not args.schedules_named and not Path(args.schedules).is_dir():
        definitions = []
    else:
        definitions = discover_definitions(args.schedules)
    if kwargs.get("coordination") is None:  # the app-wide setting, for serve and the verbs alike
        kwargs["coordination"] = _coordination_setting()
    kwargs.setdefault("actor", getattr(args, "actor", None))
    return Engine(definitions, open_store(args.store, create=create), instance=args.instance, **kwargs)


def _coordination_setting() -> str | None:
    value = os.environ.get("SCHEDTUI_COORDINATION") or None
    if value is not None and value not in COORDINATION_MODES:
        raise BadInput(f'$SCHEDTUI_COORDINATION "{value}" is not one of {", ".join(COORDINATION_MODES)}')
    return value


async def _with_backend(
    args: argparse.Namespace, body: Callable[[Backend], Coroutine[Any, Any, int]], *, definitions_needed: bool = True
) -> int:
    """Run ``body`` on the remote backend (``--url``) or an embedded one (see :func:`_engine`)."""
    backend: Backend
    if args.url:
        backend = RemoteBackend(args.url, args.token, read_only=args.read_only)
    else:
        backend = EmbeddedBackend(_engine(args, definitions_needed=definitions_needed), read_only=args.read_only)
    await backend.connect()
    store = backend.engine.store if isinstance(backend, EmbeddedBackend) else None
    try:
        code = await (body(backend) if store is None else _unless_lost(store, body(backend)))
    finally:
        await backend.close()
    if store is not None and store.health().state == "lost":  # (a run's end, written at close, met it)
        raise _lost(store)
    return code


async def _unless_lost(store: Store, body: Coroutine[Any, Any, int]) -> int:
    """``body``, stopped once the store is lost (its file deleted or replaced): what the
    verb did from then on would be recorded nowhere, and its success would be a lie."""
    work, lost = asyncio.ensure_future(body), asyncio.ensure_future(until_lost(store))
    try:
        await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():  # lost (or Ctrl-C)
            work.cancel()
            await asyncio.wait([work])
        lost.cancel()
    if work.cancelled():
        raise _lost(store)
    failure = work.exception()
    if isinstance(failure, Unavailable) and store.health().state == "lost":
        # A write of its own met the loss first (a run's end, the heartbeat of a process
        # running a Run now): the same stop, told the same way.
        raise _lost(store) from failure
    return work.result()


def _lost(store: Store) -> Unavailable:
    return store_lost(store.where, "restore it, or start `schedtui serve` for a new, empty store")


def _unicode_stdout() -> bool:
    """Whether standard output takes any character (UTF-8), as nearly every terminal does."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def _tolerant_stdout() -> None:
    """On a standard output that is not UTF-8 (a legacy ISO-8859 locale, ``PYTHONIOENCODING=
    ascii``), what it cannot take goes out as an escape (``\\u2713``): a status glyph or a
    name failed the verb with a traceback. (JSON goes out in ASCII there: see _print_json.)"""
    if not _unicode_stdout() and isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")


def _print_json(value: Any) -> None:
    # \u escapes where standard output is not UTF-8: the JSON stays valid and the same.
    # (and what a terminal would act on, a C1 control or a bidirectional override, as \u escapes)
    print(in_json(json.dumps(value, indent=2, ensure_ascii=not _unicode_stdout())))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: What ``$SCHEDTUI_LOG_LEVEL`` may name, in any case (a number is refused: it reads as a
#: mistake, and no release took one).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level() -> int:
    """``$SCHEDTUI_LOG_LEVEL``'s level; INFO when it is unset or empty. Any other value is
    refused (:class:`UsageError`, naming it and the levels there are): it crashed serve,
    demo and the console with a traceback, and the other verbs took it silently for INFO."""
    value = os.environ.get("SCHEDTUI_LOG_LEVEL", "").strip()
    if not value:
        return logging.INFO
    if value.upper() not in LOG_LEVELS:
        raise UsageError(f'schedtui: $SCHEDTUI_LOG_LEVEL "{printable(value)}" is not one of {", ".join(LOG_LEVELS)}')
    return logging.getLevelNamesMapping()[value.upper()]


def _check_log_file() -> None:
    """``$SCHEDTUI_LOG_FILE`` (where the console logs; empty is unset) can be opened to
    append to, or a :class:`UsageError` names it and why: the console ended with a
    traceback, once its engine had started."""
    path = os.environ.get("SCHEDTUI_LOG_FILE")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f'schedtui: $SCHEDTUI_LOG_FILE "{printable(path)}" cannot be opened: {exc.strerror or exc}') from None


#: The commands that set up their own logging and streams (a journal, a screen).
_OWN_OUTPUT = frozenset({"serve", "console", "demo"})


@contextlib.contextmanager
def _verb_output(output: _Output) -> Iterator[None]:
    """A verb's stdout is its own output (a table, JSON), written through ``output`` (which
    remembers a refusal): what the handlers it runs (``fire``, ``backfill``) print goes on
    to stderr, and the records they log at ``$SCHEDTUI_LOG_LEVEL`` (INFO by default) are
    made, so that their runs' logs keep them as ``serve``'s do (below the root's default,
    WARNING, they were never made). Nothing more is printed: the verb's own words are its
    output and its one line on stderr."""
    root = logging.getLogger()
    level = root.level
    sys.stdout = output
    root.setLevel(log_level())  # (checked as the command was read)
    try:
        with handler_prints_to_stderr():
            yield
    finally:
        root.setLevel(level)
        if sys.stdout is output:  # (else an engine left open still wraps it: its capture puts it back)
            sys.stdout = output.stream


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TerminalFormatter(LOG_FORMAT))  # no store password, no token, no escape sequence, ever
    logging.basicConfig(level=log_level(), handlers=[handler])


async def cmd_serve(args: argparse.Namespace) -> int:
    _configure_logging()
    from datetime import timedelta

    from backend.clock import OffsetClock
    engine = _engine(
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


def _verbs() -> dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]]:
    """Every command and its handler: this module's verbs and the verb modules'."""
    verbs = dict(VERBS)
    for module in verb_modules():
        verbs.update(module.VERBS)
    return verbs


#: The exit status of a verb whose reader went away (``… | head``): what a shell reports for
#: a process that SIGPIPE ended (128 + 13).
EXIT_PIPE_CLOSED = 141


def _fill_closed_standard_streams() -> None:
    """Started with a standard stream closed (``>&-``, ``<&-``, some init scripts and
    daemonizers), Python gives ``None`` for it: every verb then ended with a traceback and
    exit 1, a clean stop of serve too, and the console with one (``'NoneType' object has no
    attribute 'isatty'``). What it writes there goes to /dev/null instead, and it reads /dev/null
    (the console then says it needs a terminal, as with ``</dev/null``); nor is the number
    left free for the next file opened (the store's) to take."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        try:
            os.fstat(fd)
        except OSError:  # still closed: the stream's own number, so children inherit it too
            os.dup2(null, fd)
            os.close(null)
            null = fd
        setattr(sys, name, open(null, mode, encoding="utf-8", errors="backslashreplace"))  # noqa: SIM115 - the process's stream


def _flushed(status: int) -> int:
    """``status``, once what is still buffered for standard output is written (here, not at
    exit): a closed pipe raises (see :func:`run`); a full disk is one line and exit 1."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        return _cannot_write(exc, sys.stdout)
    return status


def run() -> None:
    """The console script."""
    exitwatch.allow()
    _fill_closed_standard_streams()
    # As `python -m` and uvicorn do: the working directory first on the import path, so that
    # definitions import the project's own modules (a console script's own folder is the
    # environment's bin/, which holds none of them).
    with contextlib.suppress(OSError):  # (a working directory deleted meanwhile)
        here = os.getcwd()
        if "" not in sys.path and here not in sys.path:
            sys.path.insert(0, here)
    try:
        status = _flushed(main())
    except BrokenPipeError:
        # The reader stopped reading (`schedtui runs … --json | head`): nothing more to say,
        # and no traceback; Python's own flush at exit would fail again without this.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_PIPE_CLOSED)
    sys.exit(status)


if __name__ == "__main__":
    run()
