"""The HTTP API's bearer tokens, each with a name: who acted, in the audit log.

A token is given as ``NAME=SECRET`` or as a bare ``SECRET``; a bare operator token is
named ``operator`` and a bare read token ``reader``. A secret that looks like
``NAME=REST`` is read as named, except when ``REST`` is only ``=`` signs (base64
padding: ``dGVzdA==`` and ``YWI=`` are bare secrets). Several tokens of each kind may be given; names
and secrets must each be distinct. A server without any token is reachable on loopback
only, and its requests act as :data:`ANONYMOUS`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from backend.errors import BadInput, Unauthorized
from backend.events.audit import check_actor

__all__ = ["ANONYMOUS", "ApiToken", "Tokens", "parse_token"]

Access = Literal["read", "operate"]

#: The actor of requests to a server that requires no token.
ANONYMOUS = "anonymous"
DEFAULT_NAMES: dict[Access, str] = {"operate": "operator", "read": "reader"}

_NAMED = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63})=(.*)", re.DOTALL)


@dataclass(frozen=True)
class ApiToken:
    name: str
    secret: str
    access: Access

    def __repr__(self) -> str:  # never the secret, not even in a traceback
        return f"ApiToken(name={self.name!r}, access={self.access!r})"


def parse_token(text: str, access: Access, *, what: str | None = None) -> ApiToken:
    """``NAME=SECRET`` or a bare ``SECRET`` (see the module docstring)."""
    what = what or ("token" if access == "operate" else "read token")
    raw = text.strip()
    if not raw:
        raise BadInput(f"the {what} is empty (or only whitespace); give a real secret", field=what.replace(" ", "_"))
    named = _NAMED.fullmatch(raw)
    if named is not None and named.group(2).strip().strip("="):
        return ApiToken(check_actor(named.group(1), f"{what} name"), named.group(2).strip(), access)
    return ApiToken(DEFAULT_NAMES[access], raw, access)


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value != "" else []  # "": no token, as an unset variable
    return list(value)


class Tokens:
    """The tokens a server accepts. Contract: :meth:`check` compares the presented secret
    with every token, always all of them (the time taken says nothing about which one
    matched), and names the matching token; no token, or a wrong one, is
    :class:`Unauthorized`."""

    def __init__(self, tokens: Iterable[ApiToken]) -> None:
        self.tokens = list(tokens)
        names: set[str] = set()
        secrets: set[str] = set()
        for token in self.tokens:
            if token.name in names:
                raise BadInput(
                    f'two tokens are named "{token.name}"; name each one (NAME=SECRET)', field="token"
                )
            if token.secret in secrets:
                raise BadInput(f'the token "{token.name}" has the same secret as another one', field="token")
            names.add(token.name)
            secrets.add(token.secret)

    @classmethod
    def from_options(cls, operate: str | Sequence[str] | None, read: str | Sequence[str] | None) -> Tokens:
        """From ``--token``/``--read-token`` values (each ``NAME=SECRET`` or a bare secret)."""
        return cls(
            [parse_token(text, "operate") for text in _as_list(operate)]
            + [parse_token(text, "read") for text in _as_list(read)]
        )

    @property
    def required(self) -> bool:
        return bool(self.tokens)

    def check(self, authorization: str) -> ApiToken:
        """The token an ``Authorization`` header presents."""
        if not self.required:
            return ApiToken(ANONYMOUS, "", "operate")
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized("missing bearer token (send Authorization: Bearer <token>)")
        given = presented.strip().encode()
        found: ApiToken | None = None
        for token in self.tokens:
            if hmac.compare_digest(given, token.secret.encode()) and found is None:
                found = token
        if found is None:
            raise Unauthorized("wrong bearer token")
        return found
