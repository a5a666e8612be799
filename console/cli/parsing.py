"""The ``schedtui`` command line: the parser, the options every verb shares (before the
verb or after it), the checks of their values, and where each command's handler is.

The verbs are declared by the verb modules (:data:`VERB_MODULES`): the operator actions'
derived from their declarations by :mod:`console.cli.derive`, the console's in
:mod:`console.cli.tui`, ``serve``, ``migrate`` and ``manifest`` in :mod:`console.cli.serve`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from backend import BadInput, __version__
from backend.alerts.notifier import AlertSettings, parse_sinks
from backend.api.tokens import Tokens, parse_token
from backend.client.connection import check_instance
from backend.client.remote import check_server_url, check_token
from backend.events.audit import check_actor
from backend.inputs import decimal_number, shown_number, whole_number
from backend.model import DEFAULT_DEFINITIONS_FOLDER, DEFAULT_STORE_URL
from backend.safetext import printable, redact_url, remember_secret
from console.cli.output import UsageError, check_log_file, log_level, say

__all__ = [
    "CONSOLE_OPTIONS", "SHARED", "VERB_MODULES", "VERB_OPTIONS", "at_most", "build_parser", "clock_offset_ms",
    "commands", "notify_file_urls", "parse_args", "port", "positive_int", "seconds", "verb_modules",
]  # fmt: skip


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
def positive_int(text: str) -> int:
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


def at_most(high: int) -> Callable[[str], int]:
    """:func:`positive_int`, at most ``high``: a length of time past which dates overflow
    (and before which a retention would reach back before 1970)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{_typed(text, value)} is more than {high:,}")
        return value

    return parse


#: The clock's test offset, at most (a century, either way: the calendar ends beyond).
_MAX_OFFSET_MS = 100 * 366 * 86_400_000


def clock_offset_ms(text: str) -> int:
    value = _whole(text)
    if abs(value) > _MAX_OFFSET_MS:
        raise argparse.ArgumentTypeError(f"{_typed(text, value)} ms is more than a century ({_MAX_OFFSET_MS:,} ms) either way")
    return value


def seconds(text: str) -> float:
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


def port(text: str) -> int:
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
CONSOLE_OPTIONS = [option.dest for option in SHARED]
VERB_OPTIONS = ["schedules", "store", "store_file", "instance", "url", "token", "token_file", "actor", "read_only"]


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


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each verb's own parser (to tell which shared options a verb takes)."""
    parser = _Parser(prog="schedtui", description="Run and operate scheduled work.")
    parser.add_argument("--version", action="version", version=f"schedtui {__version__}")
    _add_shared(parser, CONSOLE_OPTIONS)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    by_verb: dict[str, argparse.ArgumentParser] = {}

    def verb(name: str, help: str, shared: Sequence[str], *, description: str | None = None, **helps: str) -> argparse.ArgumentParser:
        """A verb (``schedtui serve``) taking the ``shared`` options (``helps``: their help
        where it differs for this verb)."""
        sub = verbs.add_parser(name, help=help, description=description)
        by_verb[name] = sub
        _add_shared(sub, shared, **helps)
        return sub

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
    return parser, by_verb


#: Modules adding verbs (serve's, the console's, then one system's each): ``add_verbs(verb, group)`` declares them and
#: ``VERBS`` maps each command (``"jobs list"``) to its handler. Imported lazily: they import
#: this module's helpers.
VERB_MODULES: list[str] = [
    "console.cli.serve", "console.cli.tui", "console.cli.schedules", "console.cli.jobs", "console.cli.durable",
    "console.cli.locks", "console.cli.audit", "console.cli.alerts", "console.cli.fleet",
]


def verb_modules() -> list[Any]:
    return [importlib.import_module(name) for name in VERB_MODULES]



def commands() -> dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]]:
    """Every command and its handler, from the verb modules."""
    handlers: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {}
    for module in verb_modules():
        handlers.update(module.VERBS)
    return handlers


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse, check shared options against the verb, fill defaults, resolve the tokens.
    Raises :class:`UsageError` for bad usage (exit code 2)."""
    parser, by_verb = build_parser()
    args = parser.parse_args(_glue_offsets(argv))
    if args.verb is None:
        args.verb = "console"
    args.command = f"{args.verb} {args.subverb}" if getattr(args, "subverb", None) else args.verb
    if args.command not in commands():
        raise UsageError(f"schedtui {args.verb}: say what to do (see `schedtui {args.verb} --help`)")
    log_level()  # (checked here, for every command alike, before any engine or firing lock)
    if args.command == "console" or (args.command == "demo" and not args.headless):  # (the commands that log there)
        check_log_file()
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



def _glue_offsets(argv: Sequence[str]) -> list[str]:
    """``--from -3h``: argparse takes ``-3h`` for an option; hand it on as ``--from=-3h``."""
    glued: list[str] = []
    for arg in argv:
        if glued and glued[-1] in ("--from", "--to") and re.match(r"-\d", arg):
            glued[-1] = f"{glued[-1]}={arg}"
        else:
            glued.append(arg)
    return glued
