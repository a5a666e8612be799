"""How an operator action is declared once: a typed method that carries :func:`action`, in
its system's class in :mod:`backend.client.operations`, which
:class:`~backend.client.interface.Backend` inherits, is the declaration.

From a method's signature (``typing.Annotated`` metadata for limits), its docstring and the
decorator's arguments, :func:`action` builds an :class:`Action`: its name, parameters,
result, permission, audit name, danger and HTTP form. Everything else is derived from it:

* :class:`~backend.client.embedded.EmbeddedBackend` refuses ``operate`` actions when
  read-only, checks the arguments (:func:`check_arguments`) and calls the implementation
  on the engine (:attr:`Action.impl`);
* :class:`~backend.client.remote.RemoteBackend` builds the request from :attr:`Action.http`
  and decodes the answer from the result's annotation (:func:`decode`);
* the HTTP API (:mod:`backend.api.routes`) mounts a route per action, parses and checks
  its parameters, and documents it in ``/openapi.json``.

This module holds no action itself; :data:`ACTIONS` is filled as :mod:`backend.client.operations` is imported.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from backend.errors import BadInput
from backend.inputs import check_before, check_datetime, check_id, check_json
from backend.model import iso, parse_iso

__all__ = [
    "ACTIONS",
    "REQUIRED",
    "Action",
    "Check",
    "Cursor",
    "Danger",
    "Http",
    "Id",
    "Instant",
    "Json",
    "Known",
    "Limit",
    "Param",
    "Permission",
    "Range",
    "Schema",
    "Help",
    "When",
    "action",
    "action_of",
    "shown_bound",
    "check_arguments",
    "decode",
    "encode",
    "json_kind",
]

Permission = Literal["read", "operate"]
System = Literal["schedules", "jobs", "durable", "locks", "audit", "alerts", "fleet", "health"]


class _Required:
    """The default of a parameter that has none."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class _Unfilled(dict[str, object]):
    """Formatting arguments where a missing key stays as it was written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclass(frozen=True)
class Danger:
    """What a dangerous action asks before it acts: ``question`` (the confirm dialog's
    title, with ``{param}`` placeholders) and ``detail``, one sentence of consequence."""

    question: str
    detail: str

    def render(self, arguments: Mapping[str, object]) -> tuple[str, str]:
        """The question and the detail with the arguments filled in; a placeholder naming
        no argument stays as written (and braces in the values are never read again)."""
        values = _Unfilled({key: value for key, value in arguments.items()})
        return self.question.format_map(values), self.detail.format_map(values)


# -- parameter metadata (``Annotated[T, ...]``) -----------------------------------------


class Limit:
    """A limit of one parameter: :meth:`check` (run by both backends before anything is
    sent or done; returns the value, perhaps normalised) and :meth:`schema` (its OpenAPI
    form). ``field`` is the parameter's name on the wire."""

    def check(self, value: Any, field: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {}


def shown_bound(value: float) -> str:
    """A range's bound as written (an integer in full, not ``9.0072e+15``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Range(Limit):
    """A number from ``low`` to ``high``, both included."""

    low: float
    high: float

    def check(self, value: Any, field: str) -> Any:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return value  # the type is the implementation's to refuse, in its words
        if value != value:  # NaN (JSON's NaN is read as one): no number, rather than out of range
            raise BadInput(f"{field} NaN is not a number", field=field)
        if not self.low <= value <= self.high:
            raise BadInput(f"{field} {value} is out of range ({shown_bound(self.low)}-{shown_bound(self.high)})", field=field)
        return value

    def schema(self) -> dict[str, Any]:
        return {"minimum": self.low, "maximum": self.high}


@dataclass(frozen=True)
class Id(Limit):
    """The id (a ULID) of a ``what`` (``run``, ``job``...): any other text names nothing
    (``NotFound``), as for an id that was never given."""

    what: str

    def check(self, value: Any, field: str) -> Any:
        return check_id(value, self.what) if isinstance(value, str) else value

    def schema(self) -> dict[str, Any]:
        return {"pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"}


@dataclass(frozen=True)
class Cursor(Limit):
    """The ``before`` of a page: the id of the last ``what`` of the previous page."""

    what: str = "run"

    def check(self, value: Any, field: str) -> Any:
        return check_before(value, self.what)

    def schema(self) -> dict[str, Any]:
        return {"pattern": "^[0-9A-HJKMNP-TV-Z]{26}$", "description": f"id of the last {self.what} of the previous page"}


@dataclass(frozen=True)
class Instant(Limit):
    """An aware instant an operator may name (1970 to 8999)."""

    def check(self, value: Any, field: str) -> Any:
        return check_datetime(value, field)  # (the surfaces that take text parse it first)


@dataclass(frozen=True)
class When(Instant):
    """An instant that the HTTP API takes as typed: ISO 8601, ``now`` or an offset such as
    ``-2d``, read against the engine's clock, in the zone of the schedule named by the
    parameter ``zone_of`` when it has no offset."""

    zone_of: str = "name"
    lower: bool = False
    """The start of a range that excludes it, ``(start, end]`` (see
    :func:`~backend.timeparse.wall_instant`)."""

    def schema(self) -> dict[str, Any]:
        return {"description": "ISO 8601, now, or an offset such as -2d or -6h"}


@dataclass(frozen=True)
class Json(Limit):
    """Any JSON value, at most ``limit`` bytes encoded (``TooLarge`` beyond)."""

    limit: int

    def check(self, value: Any, field: str) -> Any:
        check_json(value, field, self.limit)
        return value

    def schema(self) -> dict[str, Any]:
        return {"description": f"any JSON value, up to {self.limit // 1024} KiB encoded"}


@dataclass(frozen=True)
class Check(Limit):
    """A check of the project's own (``check(value) -> value``, raising ``BadInput``), with
    what the OpenAPI document says of the value."""

    function: Callable[[Any], Any]
    openapi: Mapping[str, Any] = field(default_factory=dict)

    def check(self, value: Any, field: str) -> Any:
        return self.function(value)

    def schema(self) -> dict[str, Any]:
        return dict(self.openapi)


@dataclass(frozen=True)
class Schema(Limit):
    """What the OpenAPI document says of a value that the implementation checks itself."""

    openapi: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        return dict(self.openapi)


@dataclass(frozen=True)
class Help:
    """One line on what a parameter means (for ``--help`` and the OpenAPI document)."""

    text: str


# -- the declaration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Http:
    """How an action is served over HTTP, and so how the remote client calls it.

    Where a parameter comes from follows from the path: a ``{param}`` segment is the
    parameter (``{param:path}`` takes one that may hold "/"); the others are query
    parameters of a ``GET`` or ``DELETE`` and JSON body fields otherwise (``query`` names
    those of a ``POST`` read from the query instead). ``wire`` maps a parameter's Python
    name to its name on the wire (``start`` is ``from``). ``body`` names a parameter that
    is the whole JSON body (a schedule's spec).

    The answer: the result's JSON, or ``{envelope: result}``; ``extra(result, arguments)``
    adds fields beside it, ``clock`` adds the engine's ``now`` (and hands it to models whose
    JSON counts ages against it), and ``prelude`` is a read asked before the action whose
    fields join the answer. It has ``status``, or ``again`` when ``repeated(result)`` (a
    duplicate that made nothing new). The remote client sends a request again when it
    failed before it left (no connection), and after it may have reached the server only
    when ``retry`` (default: for a ``GET``; a callable decides from the arguments): where
    its first copy, landing late, changes nothing whatever was done meanwhile (a read, a
    backfill's plan or cancel, a signal: a repeat is a duplicate). A toggle is not (a
    disable held up in a slow server landed after the enable that followed it, and undid
    it), nor a create or a send (a job sent with a key ran twice: the key is free again
    once the first job succeeded). Such an action fails as in doubt instead.
    """

    method: Literal["GET", "POST", "PATCH", "DELETE"]
    path: str
    status: int = 200
    again: int | None = None
    repeated: Callable[[Any], bool] | None = None
    envelope: str | None = None
    extra: Callable[[Any, Mapping[str, Any]], Mapping[str, Any]] | None = None
    clock: bool = False
    prelude: Callable[[Any, Mapping[str, Any]], Awaitable[Mapping[str, Any]]] | None = None
    wire: Mapping[str, str] = field(default_factory=dict)
    query: tuple[str, ...] = ()
    fixed: Mapping[str, str] = field(default_factory=dict)
    """Query parameters the route requires with exactly this value (``trigger=external``)."""
    body: str | None = None
    max_body: int | None = None
    """The largest body taken (bytes); ``None``: the API's default."""
    retry: bool | Callable[[Mapping[str, Any]], bool] | None = None
    ok: str = ""
    """What the success answer holds, in a few words (the OpenAPI response's description)."""
    errors: Mapping[int, str] = field(default_factory=dict)
    """The refusals the action may answer with, beyond those every route has."""

    @property
    def path_params(self) -> tuple[str, ...]:
        """The wire names in the path, in order."""
        return tuple(re.findall(r"{(\w+)(?::\w+)?}", self.path))

    def retried(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the remote client sends the request again after it may have reached the
        server (see the class docstring)."""
        if self.retry is None:
            return self.method == "GET"
        return self.retry(arguments) if callable(self.retry) else self.retry

    def wire_name(self, name: str) -> str:
        return self.wire.get(name, name)

    def where(self, name: str) -> Literal["path", "query", "body"]:
        """Where the parameter ``name`` (its Python name) travels."""
        wire = self.wire_name(name)
        if wire in self.path_params:
            return "path"
        if self.method in ("GET", "DELETE") or name in self.query:
            return "query"
        return "body"


@dataclass(frozen=True)
class Param:
    """One parameter of an action, from the method's signature."""

    name: str
    annotation: Any
    """The type, without its ``Annotated`` metadata."""
    default: Any = REQUIRED
    limits: tuple[Limit, ...] = ()
    help: str = ""
    keyword: bool = False
    """Keyword-only in the signature."""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def optional(self) -> bool:
        """Whether ``None`` is a value of its type."""
        return _is_optional(self.annotation)

    @property
    def base(self) -> Any:
        """The type without ``| None``."""
        return _strip_none(self.annotation)


@dataclass(frozen=True)
class Action:
    """One operator action, as :func:`action` read it from its method."""

    name: str
    system: System
    permission: Permission
    audit: str | None
    danger: Danger | None
    http: Http
    params: tuple[Param, ...]
    result: Any
    """The return annotation (a model with ``to_json``/``from_json``, a list or dict of
    them, ``datetime``, ``bool``, ``None``)."""
    summary: str
    description: str
    impl: str
    """Where the embedded backend finds the implementation: a dotted path on the engine
    (``locks.release``), called with the arguments by name."""
    check: Callable[..., object] | None = None
    """A check of the arguments together (called with them by name), after each one's."""
    label: str = ""
    """The action as an operator says it ("Run now", "disable", "a lock release"): what
    a read-only backend says is not allowed."""
    definitions: bool = False
    """Whether it needs the definitions folder read (a schedule's code; which durable
    functions there are): the command line does without the folder for the others."""

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(name)


ACTIONS: dict[str, Action] = {}
"""Every action by name (the method's name on ``Backend``), filled as its system's class is defined."""


def action_of(name: str) -> Action:
    """The declaration of the action ``name``; ``KeyError`` for a name that is none. (The
    actions are declared as :mod:`backend.client.operations` is imported.)"""
    return ACTIONS[name]


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def action(
    *,
    system: System,
    permission: Permission,
    http: Http,
    audit: str | None = None,
    danger: Danger | None = None,
    impl: str | None = None,
    check: Callable[..., object] | None = None,
    label: str | None = None,
    definitions: bool | None = None,
) -> Callable[[F], F]:
    """Declare the decorated ``Backend`` method an operator action, and replace its body
    by ``await self._act(action, arguments)`` (the arguments by name, defaults applied).

    The method's signature is read at once (its annotations must resolve in its module):
    each parameter becomes a :class:`Param`, its ``Annotated`` metadata its limits and
    help, and the return annotation the result. The docstring's first paragraph is the
    summary, the rest the description. ``definitions``: whether it needs the definitions
    folder (default: the schedules' actions do, which know a schedule by its code)."""

    def declare(method: F) -> F:
        name = method.__name__
        hints = typing.get_type_hints(method, include_extras=True)
        signature = inspect.signature(method)
        params = []
        for p in list(signature.parameters.values())[1:]:
            annotation, limits, help_text = _unpack(hints[p.name])
            default = REQUIRED if p.default is inspect.Parameter.empty else p.default
            params.append(Param(p.name, annotation, default, limits, help_text, p.kind is inspect.Parameter.KEYWORD_ONLY))
        for wire in http.path_params:
            if wire not in {http.wire_name(p.name) for p in params}:
                raise TypeError(f"{name}: the path {http.path} names {wire}, which is no parameter")
        summary, _, description = inspect.cleandoc(method.__doc__ or "").partition("\n\n")
        declared = Action(
            name=name,
            system=system,
            permission=permission,
            audit=audit,
            danger=danger,
            http=http,
            params=tuple(params),
            result=hints.get("return"),
            summary=" ".join(summary.split()),
            description=" ".join(description.split()),
            impl=impl or name,
            check=check,
            label=label or name.replace("_", " "),
            definitions=system == "schedules" if definitions is None else definitions,
        )
        if name in ACTIONS:
            raise TypeError(f"the action {name} is declared twice")
        ACTIONS[name] = declared

        @functools.wraps(method)
        async def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            del arguments[next(iter(signature.parameters))]
            return await self._act(declared, arguments)

        dispatch.action = declared  # type: ignore[attr-defined]
        return typing.cast(F, dispatch)

    return declare


def _unpack(hint: Any) -> tuple[Any, tuple[Limit, ...], str]:
    if get_origin(hint) is typing.Annotated:
        annotation, *metadata = get_args(hint)
        limits = tuple(m for m in metadata if isinstance(m, Limit))
        help_text = next((m.text for m in metadata if isinstance(m, Help)), "")
        return annotation, limits, help_text
    return hint, (), ""


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _strip_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


# -- what both backends derive --------------------------------------------------------------


def check_arguments(declared: Action, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments after each parameter's limits (in the order of the signature; a
    limit may normalise its value) and the action's own check: ``BadInput``,
    ``TooLarge`` or ``NotFound`` naming the first bad one. Run by both backends, so a
    remote client sends no request that cannot succeed."""
    checked = dict(arguments)
    for param in declared.params:
        if param.name not in checked:
            continue
        value = checked[param.name]
        if value is None and param.optional:
            continue
        field_name = declared.http.wire_name(param.name)
        for limit in param.limits:
            value = limit.check(value, field_name)
        checked[param.name] = value
    if declared.check is not None:
        declared.check(**checked)
    return checked


def encode(value: Any, now: datetime | None = None) -> Any:
    """A result as JSON: a model by its ``to_json`` (given ``now`` when it takes it: ages
    are counted against the engine's clock), lists and dicts item by item, datetimes as
    ISO 8601."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, list | tuple):
        return [encode(item, now) for item in value]
    if isinstance(value, dict):
        return {key: encode(item, now) for key, item in value.items()}
    to_json = value.to_json
    if now is not None and len(inspect.signature(to_json).parameters) == 1:
        return to_json(now)
    return to_json()


def decode(annotation: Any, data: Any) -> Any:
    """JSON back into the type ``annotation`` says: the inverse of :func:`encode`.

    JSON of another shape (``null`` or an array where an object is due, a string where a
    number is) raises ``TypeError`` saying so, and a model's ``from_json`` its own
    ``KeyError``/``TypeError``/``ValueError``: never a value of the wrong type returned."""
    if annotation is None or annotation is type(None):
        return None
    if annotation is Any:
        return data
    if _is_optional(annotation):
        return None if data is None else decode(_strip_none(annotation), data)
    origin = get_origin(annotation)
    if origin is list:
        (item,) = get_args(annotation)
        return [decode(item, entry) for entry in _shaped(data, list)]
    if origin is dict:
        _, item = get_args(annotation)
        return {key: decode(item, entry) for key, entry in _shaped(data, dict).items()}
    if annotation is datetime:
        return parse_iso(_shaped(data, str))
    if annotation is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if annotation in (bool, int, float, str):
        return _shaped(data, annotation)
    return annotation.from_json(_shaped(data, dict))


#: What each Python type of :func:`json.loads` is called in JSON.
_JSON_KINDS: dict[type, str] = {dict: "an object", list: "an array", str: "a string", bool: "true or false",
                                int: "a number", float: "a number", type(None): "null"}


def json_kind(value: Any) -> str:
    """What ``value`` (as :func:`json.loads` makes it) is in JSON: "an object", "null"..."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _shaped(data: Any, kind: type) -> Any:
    """``data`` if it is JSON of ``kind`` (a ``bool`` is not an ``int``); TypeError saying
    what it is instead."""
    if type(data) is not kind:
        raise TypeError(f"{json_kind(data)} where {_JSON_KINDS[kind]} was due")
    return data


@dataclass(frozen=True)
class Known(Limit):
    """The name of a ``what`` that must exist (a schedule): the HTTP API looks it up
    before it reads anything else of the request, so an unknown one is a 404 first."""

    what: str = "schedule"
