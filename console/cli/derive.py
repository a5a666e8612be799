"""The CLI's verbs for operator actions, derived from the actions' declarations.

A :class:`Verb` names an action (:mod:`backend.client.actions`) and the words that call
it: ``Verb(("locks", "release"), "release_lock")``. The rest follows from the
declaration, so that no verb repeats its parameters or its call:

* the arguments: a required parameter is a positional argument, an optional one an
  ``--option`` spelled as its name on the wire (``start`` is ``--from``); the type, the
  choices, the range and the help come from the :class:`~backend.client.actions.Param`.
  A JSON value is typed as JSON text; an instant read as typed (``When``: ISO 8601,
  ``now``, ``-2d``) is read in the schedule's zone against the engine's clock; a mapping
  described by a ``Schema`` (a schedule's spec) takes one option per key;
* ``--json``, for an action with a result: the result as the API encodes it
  (:func:`~backend.client.actions.encode`, its ``to_json()``), or a part of it;
* ``--yes``, for a dangerous action (``Action.danger``): without it the verb refuses
  with the action's question on one line of stderr and exit code 2, before it connects;
* the call: ``getattr(backend, action.name)(**arguments)``, on the backend that
  ``--url`` or ``--store`` names; a refusal exits with the verb's code for it.

What stays per verb is what the declaration cannot say: the human output (a table or a
sentence), a default of the command line's own, and the hooks of a verb that does more
than its action (``fire`` waits for its run; ``backfill`` plans first and follows).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, get_origin

from backend import BadInput, Refused
from backend.client.actions import REQUIRED, Action, Cursor, Param, Range, Schema, When, action_of, encode, shown_bound
from backend.client.interface import Backend
from backend.durable.service import parse_json_option
from backend.inputs import decimal_number, shown_number, whole_number
from backend.safetext import printable
from backend.timeparse import parse_when
from console.cli.backends import with_backend
from console.cli.output import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, complain, print_json
from console.cli.parsing import VERB_OPTIONS

__all__ = ["Call", "Part", "Verb", "add_derived", "fields", "handlers", "items"]

MakeVerb = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]
MakeGroup = Callable[..., MakeVerb]
Handler = Callable[[argparse.Namespace], Awaitable[int]]

@dataclass
class Call:
    """One run of a verb, as its hooks see it: the parsed command line, the backend, the
    action and its arguments (by parameter name; a hook may change them before the call)."""

    args: argparse.Namespace
    backend: Backend
    action: Action
    arguments: dict[str, Any]
    zone: str = "UTC"
    """The zone the schedule named by the arguments lives in, once a hook or an instant
    parameter looked it up (what its times are shown in)."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What a hook learned for a later one (a backfill's plan)."""


Show = Callable[[Call, Any], Awaitable[None] | None]


@dataclass(frozen=True)
class Part:
    """What of the encoded result ``--json`` prints: the list ``items`` (a page's runs),
    or only the ``fields`` named."""

    items: str | None = None
    fields: tuple[str, ...] = ()

    def __call__(self, encoded: Any) -> Any:
        if self.items is not None:
            return encoded[self.items]
        return {name: encoded[name] for name in self.fields}

    def describe(self) -> str:
        if self.items is not None:
            return f"a JSON array of {self.items}"
        return f"print {{{', '.join(self.fields)}}} as JSON"


def items(name: str) -> Part:
    """``--json`` prints the list ``name`` of the encoded result (a page's runs)."""
    return Part(items=name)


def fields(*names: str) -> Part:
    """``--json`` prints only these fields of the encoded result."""
    return Part(fields=names)


def _succeeded(result: Any) -> int:
    return EXIT_OK


@dataclass(frozen=True)
class Verb:
    """A command that is an operator action: ``words`` call the action ``action``.

    The presentation is the verb's own: ``help`` (else the action's summary), ``show``
    (the human output; else nothing), ``json`` (what of the encoded result ``--json``
    prints; else all of it), ``defaults`` (a default of the command line's own, by
    parameter), ``positional`` (optional parameters taken positionally), ``options``
    (required parameters taken as required options), ``flags`` (a parameter's option
    spelled otherwise: ``confirm`` is ``--yes``), ``negations`` (the option that sets a
    boolean key of a mapping false: ``--disabled``), ``metavars``, ``switches`` (flags of the
    command line's own, which no parameter says: ``--follow``; the hooks read them from
    ``call.args``). ``asks`` says whether a
    dangerous action needs ``--yes`` (default: whether it is dangerous). ``refused`` is the
    exit code of a refusal (``Refused``).

    The hooks, for a verb that does more than its one call: ``adapt`` turns the
    arguments as typed into the action's (before connecting; may raise ``BadInput``),
    ``prepare`` runs before the call (an exit code stops the verb), ``follow`` after it
    (it returns what is shown), and ``outcome`` gives the exit code of what is shown.
    """

    words: tuple[str, ...]
    action: str
    help: str = ""
    show: Show | None = None
    json: Part | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    positional: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    negations: Mapping[str, str] = field(default_factory=dict)
    metavars: Mapping[str, str] = field(default_factory=dict)
    switches: Mapping[str, str] = field(default_factory=dict)
    asks: bool | None = None
    refused: int = EXIT_REFUSED
    adapt: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    prepare: Callable[[Call], Awaitable[int | None]] | None = None
    follow: Callable[[Call, Any], Awaitable[Any]] | None = None
    outcome: Callable[[Any], int] = _succeeded

    @property
    def command(self) -> str:
        return " ".join(self.words)

    @property
    def declared(self) -> Action:
        return action_of(self.action)

    @property
    def confirms(self) -> bool:
        """Whether the verb refuses to act without ``--yes``."""
        return self.declared.danger is not None if self.asks is None else self.asks

    @property
    def prints_json(self) -> bool:
        return self.declared.result not in (None, type(None), bool)

    def line(self) -> str:
        """The verb's line in its parent's list of verbs."""
        if self.help:
            return self.help
        summary = self.declared.summary.replace("``", "").rstrip(".")
        return summary[:1].lower() + summary[1:]

    def arguments(self) -> list[Argument]:
        """The command-line arguments of the action's parameters, in the signature's order."""
        found: list[Argument] = []
        for param in self.declared.params:
            found.extend(_arguments_of(self, param))
        return found

    def build(self, parser: argparse.ArgumentParser) -> None:
        """Add the verb's arguments to its parser (beside the shared options)."""
        declared = self.declared
        parser.description = declared.summary.replace("``", "")
        parser.set_defaults(action_name=declared.name)
        exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for argument in self.arguments():
            target: Any = parser
            if argument.exclusive is not None:
                if argument.exclusive not in exclusive:
                    exclusive[argument.exclusive] = parser.add_mutually_exclusive_group()
                target = exclusive[argument.exclusive]
            target.add_argument(*argument.flags, **argument.kwargs)
        for name, help_text in self.switches.items():
            parser.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", help=help_text)
        if self.prints_json:
            parser.add_argument("--json", action="store_true",
                                help=self.json.describe() if self.json else "print the result as JSON")
        if self.confirms:
            assert declared.danger is not None  # confirms says so
            named = {a.param: a.kwargs.get("metavar", a.param.upper()) for a in self.arguments()}
            question, detail = declared.danger.render(named)
            parser.add_argument("--yes", action="store_true", help=f"confirm: {question} {detail}")

    def read(self, args: argparse.Namespace) -> dict[str, Any]:
        """The action's arguments from the parsed command line (a JSON text parsed, a
        mapping's keys gathered; an instant stays as typed until :func:`run` reads it)."""
        arguments: dict[str, Any] = {}
        for argument in self.arguments():
            typed = getattr(args, argument.dest)
            value = argument.convert(typed) if typed is not None and argument.convert is not None else typed
            if argument.key is None:
                arguments[argument.param] = value
            elif typed is not None:  # (given: ``--payload null`` is a null payload, not no option)
                arguments.setdefault(argument.param, {})[argument.key] = value
        for param in self.declared.params:
            if _schema_of(param) is not None and not arguments.get(param.name):
                flags = [a.flags[-1] for a in self.arguments() if a.param == param.name and a.flags[-1].startswith("--")]
                raise BadInput(f"nothing to change: give at least one option ({', '.join(flags[:3])}, ...)", field=param.name)
        return arguments


@dataclass(frozen=True)
class Argument:
    """One command-line argument: ``add_argument(*flags, **kwargs)``, filling the
    parameter ``param`` (or its ``key``, for a mapping), with ``convert`` applied to what
    was typed."""

    param: str
    key: str | None
    dest: str
    flags: tuple[str, ...]
    kwargs: dict[str, Any]
    convert: Callable[[Any], Any] | None = None
    exclusive: str | None = None
    """Arguments with the same name here exclude each other (``--enabled``, ``--disabled``)."""


def _arguments_of(verb: Verb, param: Param) -> list[Argument]:
    schema = _schema_of(param)
    if schema is not None:
        return _mapping_arguments(verb, param, schema)
    default = verb.defaults.get(param.name, param.default)
    positional = (param.required or param.name in verb.positional) and param.name not in verb.options
    flag = _flag(verb, param)
    kind = _kind(param)
    kwargs: dict[str, Any] = {"dest": param.name, "help": _help(param, default)}
    convert: Callable[[Any], Any] | None = None
    if kind is bool:
        kwargs.update(action="store_true")
    else:
        kwargs["default"] = None if default is REQUIRED else default
        metavar = verb.metavars.get(param.name) or _metavar(param, kind, positional)
        if kind == "json":
            convert = _json_reader(flag)
        elif kind in (int, float):
            kwargs["type"] = _number_type(kind, _range(param))
        choices = _choices(param)
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["metavar"] = metavar
    if positional:
        if not param.required:
            kwargs["nargs"] = "?"
        del kwargs["dest"]  # a positional argument's dest is its name
        return [Argument(param.name, None, param.name, (param.name,), kwargs, convert)]
    if param.required:  # taken as an option (``options``): a required one
        kwargs["required"] = True
    return [Argument(param.name, None, param.name, (flag,), kwargs, convert)]


def _flag(verb: Verb, param: Param) -> str:
    """The option of a parameter: its name on the wire (``start`` is ``--from``), unless
    the verb spells it otherwise."""
    return "--" + verb.flags.get(param.name, verb.declared.http.wire_name(param.name)).replace("_", "-")


def _mapping_arguments(verb: Verb, param: Param, schema: Mapping[str, Any]) -> list[Argument]:
    """One argument per key of a mapping that a ``Schema`` describes (a schedule's spec):
    a required key positional (``positional``) or a required option, the others options."""
    found = []
    required = set(schema.get("required", ()))
    for key, prop in schema["properties"].items():
        dest = f"{param.name}.{key}"
        flag = "--" + key.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": str(prop.get("description", ""))}
        kind = prop.get("type")
        if kind == "boolean":
            kwargs.update(action="store_const", const=True, help=kwargs["help"] or f"set {key}")
            found.append(Argument(param.name, key, dest, (flag,), kwargs, exclusive=dest))
            negation = verb.negations.get(key)
            if negation is not None:
                negative = {"dest": dest, "action": "store_const", "const": False, "default": None, "help": f"set {key} false"}
                found.append(Argument(param.name, key, dest, (negation,), negative, exclusive=dest))
            continue
        convert: Callable[[Any], Any] | None = None
        if "enum" in prop:
            kwargs["choices"] = list(prop["enum"])
        elif kind in ("number", "integer"):
            kwargs["type"] = _number_type(float if kind == "number" else int, None)
            kwargs["metavar"] = "N"
        elif kind is None:
            convert = _json_reader(flag)
            kwargs["metavar"] = "JSON"
        else:
            kwargs["metavar"] = verb.metavars.get(key, key.upper())
        if key in verb.positional:
            del kwargs["dest"]
            found.append(Argument(param.name, key, dest, (dest,), {**kwargs, "metavar": key.upper()}, convert))
            continue
        if key in required:
            kwargs["required"] = True
        found.append(Argument(param.name, key, dest, (flag,), kwargs, convert))
    return found


def _schema_of(param: Param) -> Mapping[str, Any] | None:
    """The ``Schema`` of a mapping parameter with named keys (a spec), else ``None``."""
    if get_origin(param.base) not in (Mapping, dict) and param.base not in (Mapping, dict):
        return None
    for limit in param.limits:
        if isinstance(limit, Schema) and "properties" in limit.openapi:
            return limit.openapi
    return None


def _kind(param: Param) -> Any:
    """What the command line types for the parameter: ``bool``, ``int``, ``float``,
    ``str``, ``"json"`` (a JSON value as text) or ``"when"`` (an instant as typed)."""
    base = param.base
    if base is Any:
        return "json"
    if _read_as_typed(param):
        return "when"
    if base in (bool, int, float, str):
        return base
    raise TypeError(f"{param.name}: the command line has no form for {base!r}")


def _read_as_typed(param: Param) -> bool:
    """Whether the parameter is an instant the operator types (``When``)."""
    return param.base is datetime and any(isinstance(limit, When) for limit in param.limits)


def _metavar(param: Param, kind: Any, positional: bool) -> str:
    if kind == "json":
        return "JSON"
    if kind == "when":
        return "WHEN"
    if kind is int and not positional:
        return "N"
    if param.name == "id" or param.name.endswith("_id"):
        return "ID"
    cursor = next((limit for limit in param.limits if isinstance(limit, Cursor)), None)
    if cursor is not None:
        return f"{cursor.what.upper()}_ID"
    return param.name.upper()


def _range(param: Param) -> Range | None:
    return next((limit for limit in param.limits if isinstance(limit, Range)), None)


def _choices(param: Param) -> list[Any] | None:
    for limit in param.limits:
        enum = limit.schema().get("enum")
        if enum:
            return list(enum)
    return None


def _help(param: Param, default: Any) -> str:
    """The parameter's help, its range and the command line's default."""
    described = [str(limit.schema()["description"]) for limit in param.limits
                 if "description" in limit.schema() and not isinstance(limit, Cursor)]  # fmt: skip
    text = param.help or next(iter(described), "")
    cursor = next((limit for limit in param.limits if isinstance(limit, Cursor)), None)
    if cursor is not None:
        text = text or f"older than this {cursor.what} (the next page)"
    notes = []
    limits = _range(param)
    bounds = {key: value for limit in param.limits for key, value in limit.schema().items() if key in ("minimum", "maximum")}
    if limits is not None:
        notes.append(f"{_number(limits.low)}-{_number(limits.high)}")
    elif len(bounds) == 2 and not described:  # a description says its bounds in words
        notes.append(f"{_number(bounds['minimum'])}-{_number(bounds['maximum'])}")
    if default not in (REQUIRED, None, False):
        notes.append(f"default {default}")
    return " ".join(filter(None, [text, f"({'; '.join(notes)})" if notes else ""]))


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"


def _number_type(kind: type, limits: Range | None) -> Callable[[str], Any]:
    """An argparse type: a whole number or a number (in ASCII: see :func:`whole_number`),
    within ``limits`` when given."""
    parse: Callable[[str], Any] = whole_number if kind is int else decimal_number

    def number(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown_number(text, 60)} is not {'a whole number' if kind is int else 'a number'}") from None
        if limits is not None and value < limits.low:
            raise argparse.ArgumentTypeError(f"{printable(text, 60)} must be at least {shown_bound(limits.low)}")
        if limits is not None and value > limits.high:
            raise argparse.ArgumentTypeError(f"{printable(text, 60)} is more than {shown_bound(limits.high)}")
        return value

    number.__name__ = kind.__name__  # argparse names the type in its messages
    return number


def _json_reader(flag: str) -> Callable[[Any], Any]:
    return lambda text: parse_json_option(text, flag)


async def _read_instants(call: Call, verb: Verb) -> None:
    """Instants typed as text (``--from -2d``), read in the zone of the schedule their
    declaration names, against the engine's clock."""
    typed = [p for p in call.action.params if _read_as_typed(p) and isinstance(call.arguments.get(p.name), str)]
    if not typed:
        return
    when = next(limit for limit in typed[0].limits if isinstance(limit, When))
    call.zone = await call.backend.schedule_zone(call.arguments[when.zone_of])
    now = await call.backend.now()
    for param in typed:
        lower = any(isinstance(limit, When) and limit.lower for limit in param.limits)
        call.arguments[param.name] = parse_when(call.arguments[param.name], now=now, zone=call.zone,
                                                field=_flag(verb, param), lower=lower)  # fmt: skip


def refusal(verb: Verb, arguments: Mapping[str, Any]) -> str:
    """The line a dangerous verb prints when ``--yes`` is missing."""
    danger = verb.declared.danger
    assert danger is not None
    question, detail = danger.render(arguments)
    return f"{question} {detail} Not done: add --yes to confirm."


async def run(verb: Verb, args: argparse.Namespace) -> int:
    """Carry out the verb: its arguments, the confirmation, the call, the output."""
    declared = verb.declared
    arguments = verb.read(args)
    if verb.adapt is not None:
        arguments = verb.adapt(arguments)
    if verb.confirms and not args.yes:
        complain(refusal(verb, arguments))
        return EXIT_USAGE

    async def body(backend: Backend) -> int:
        call = Call(args, backend, declared, arguments)
        try:
            await _read_instants(call, verb)
            if verb.prepare is not None:
                stopped = await verb.prepare(call)
                if stopped is not None:
                    return stopped
            result = await getattr(backend, declared.name)(**call.arguments)
            if verb.follow is not None:
                result = await verb.follow(call, result)
        except Refused as exc:
            if verb.refused == EXIT_REFUSED:
                raise  # the entry point's line and code
            complain(exc.message)
            return verb.refused
        if getattr(args, "json", False):
            encoded = encode(result)
            print_json(encoded if verb.json is None else verb.json(encoded))
        elif verb.show is not None:
            shown = verb.show(call, result)
            if inspect.isawaitable(shown):
                await shown
        return verb.outcome(result)

    return await with_backend(args, body, definitions_needed=declared.definitions)


def add_derived(verbs: Sequence[Verb], groups: Mapping[str, str], verb: MakeVerb, group: MakeGroup) -> None:
    """Declare ``verbs`` with the makers of :func:`console.cli.parsing.build_parser`. A verb
    of two words belongs to the group of its first (``groups`` gives a group's line when
    no verb of one word is the group's own command, as ``locks`` is)."""
    own = {v.words[0]: v for v in verbs if len(v.words) == 1}
    subverbs: dict[str, MakeVerb] = {}
    for v in verbs:
        head = v.words[0]
        if len(v.words) == 1 and not any(len(o.words) == 2 and o.words[0] == head for o in verbs):
            v.build(verb(head, v.line(), VERB_OPTIONS))
            continue
        if head not in subverbs:
            mine = own.get(head)
            subverbs[head] = group(head, mine.line() if mine else groups[head], VERB_OPTIONS, mine.build if mine else None)
        if len(v.words) == 2:
            v.build(subverbs[head](v.words[1], v.line(), VERB_OPTIONS))


def handlers(verbs: Sequence[Verb]) -> dict[str, Handler]:
    """Each verb's command (``"locks release"``) and its handler."""

    def handler(v: Verb) -> Handler:
        async def handle(args: argparse.Namespace) -> int:
            return await run(v, args)

        return handle

    return {v.command: handler(v) for v in verbs}

