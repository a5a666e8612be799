"""The OpenAPI schemas of the answers, derived from the types that make them.

Each model's ``to_json`` returns a ``TypedDict`` (``RunJson``, ``JobJson``…) that states its
JSON: mypy holds the code that builds it to that shape, and :class:`AnswerSchemas` turns
it into the document's schema, one component per ``TypedDict`` (its docstring the
description, its keys the properties). An action's answer is its result's JSON (a
reference to its component), or ``{envelope: result}`` where it has one, with the fields
its ``extra`` and ``prelude`` add (their return annotations, ``TypedDict`` too) and the
engine's ``now`` when it adds the clock.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, is_typeddict

from backend.client.actions import Action
from backend.model import JsonFormat, Timestamp

__all__ = ["AnswerSchemas"]

#: The JSON type of each Python scalar (by exact type: a ``bool`` is no ``integer``).
_JSON_TYPES: Mapping[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}


class AnswerSchemas:
    """Schemas of answers, with the components they refer to (``components`` once every
    answer has been asked for)."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {}
        self._names: dict[Any, str] = {}

    # -- one action's answer -------------------------------------------------------------
    def answer(self, action: Action) -> dict[str, Any]:
        """The schema of the body an action answers with on success."""
        http = action.http
        result = self.of(action.result) if action.result not in (None, type(None)) else None
        if result is not None and http.envelope is None and not (http.extra or http.prelude or http.clock):
            return result  # (its component, by reference: a generated client names the type)
        if http.envelope is not None:
            assert result is not None, f"{action.name}: an envelope around no result"
            body = self._object({http.envelope: result}, [http.envelope])
        elif result is None:
            body = self._object({}, [])
        else:
            body = self._inline(action.result)
        added: list[tuple[Mapping[str, Any], list[str]]] = []
        for source in (http.extra, http.prelude):
            if source is not None:
                added.append(self._fields_of(source, action.name))
        if http.clock:
            added.append(({"now": self.of(Timestamp)}, ["now"]))
        for properties, required in added:
            body["properties"] = {**properties, **body["properties"]}
            body["required"] = [*required, *body.get("required", [])]
        if not body.get("required"):
            body.pop("required", None)
        return body

    def _fields_of(self, source: Callable[..., Any], action: str) -> tuple[Mapping[str, Any], list[str]]:
        """The fields an ``extra`` or ``prelude`` adds: its return annotation's."""
        returned = typing.get_type_hints(source, include_extras=True).get("return")  # (a prelude's: what it awaits to)
        if returned is None or not is_typeddict(returned):
            raise TypeError(f"{action}: the fields its answer adds ({source.__qualname__}) must be annotated as a TypedDict")
        inline = self._inline(returned)
        return inline["properties"], list(inline.get("required", []))

    # -- any annotation ------------------------------------------------------------------
    def of(self, annotation: Any) -> dict[str, Any]:
        """The schema of a value of ``annotation``: a model (its ``to_json``'s type), a
        ``TypedDict`` (a reference to its component), a list, a dict, a literal…"""
        annotation = _json_type(annotation)
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            base, *metadata = get_args(annotation)
            schema = self.of(base)
            for item in metadata:
                if isinstance(item, JsonFormat):
                    schema["format"] = item.name
            return schema
        if origin in (Required, NotRequired):
            return self.of(get_args(annotation)[0])
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            nullable = len(members) < len(get_args(annotation))
            if len(members) == 1:
                schema = self.of(members[0])
            else:
                schema = {"anyOf": [self.of(member) for member in members]}
            if nullable:
                schema = {"allOf": [schema]} if "$ref" in schema else schema
                schema["nullable"] = True
            return schema
        if origin is Literal:
            values = list(get_args(annotation))
            kinds = {_JSON_TYPES[type(value)] for value in values}
            schema = {"enum": values}
            if len(kinds) == 1:
                schema["type"] = kinds.pop()
            return schema
        if origin is list:
            (item,) = get_args(annotation)
            return {"type": "array", "items": self.of(item)}
        if origin is dict:
            _, item = get_args(annotation)
            return {"type": "object", "additionalProperties": self.of(item)}
        if annotation is Any:
            return {}
        if annotation is datetime:
            return self.of(Timestamp)
        if annotation in _JSON_TYPES:
            return {"type": _JSON_TYPES[annotation]}
        if is_typeddict(annotation):
            return {"$ref": f"#/components/schemas/{self._component(annotation)}"}
        raise TypeError(f"no JSON schema for {annotation!r}")

    def _component(self, typed: Any) -> str:
        name = self._names.get(typed)
        if name is None:
            base = typed.__name__.removesuffix("Json") or typed.__name__
            name, n = base, 1
            while name in self.components:
                n += 1
                name = f"{base}{n}"
            self._names[typed] = name
            self.components[name] = {}  # (claimed first: a type that holds itself refers to it)
            self.components[name] = self._inline(typed)
        return name

    def _inline(self, annotation: Any) -> dict[str, Any]:
        """A ``TypedDict`` (or a model's) as an object schema written out, not referred to."""
        typed = _json_type(annotation)
        if not is_typeddict(typed):
            raise TypeError(f"{annotation!r} answers with no JSON object")
        hints = typing.get_type_hints(typed, include_extras=True)
        properties = {key: self.of(hint) for key, hint in hints.items()}
        # (NotRequired read from the hint: with postponed annotations, 3.11's TypedDict puts
        # every key in __required_keys__)
        required = [key for key, hint in hints.items() if get_origin(hint) is not NotRequired and key in typed.__required_keys__]
        schema = self._object(properties, required)
        if typed.__doc__:
            schema["description"] = " ".join(inspect.cleandoc(typed.__doc__).split())
        return schema

    @staticmethod
    def _object(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
        # (No "additionalProperties": false: a later version may add a field, and a client
        # generated from this document must still read its answers. The suite holds each
        # answer to exactly these fields.)
        schema: dict[str, Any] = {"type": "object", "properties": dict(properties)}
        if required:
            schema["required"] = list(required)
        return schema


def _json_type(annotation: Any) -> Any:
    """A model class as the type of its JSON (its ``to_json``'s return annotation)."""
    if isinstance(annotation, type) and not is_typeddict(annotation) and hasattr(annotation, "to_json"):
        returned = typing.get_type_hints(annotation.to_json, include_extras=True).get("return")
        if returned is None:
            raise TypeError(f"{annotation.__name__}.to_json has no return annotation")
        return returned
    return annotation
