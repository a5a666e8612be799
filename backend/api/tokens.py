"""The HTTP API's bearer tokens, each with a name: who acted, in the audit log.

A token is given as ``NAME=SECRET`` or as a bare ``SECRET``; a bare operator token is
named ``operator`` and a bare read token ``reader``. A secret that looks like
``NAME=REST`` is read as named, except when ``REST`` is only ``=`` signs (base64
padding: ``dGVzdA==`` and ``YWI=`` are bare secrets; ``alice=``, which is no base64, is a name
whose secret was left out, and refused). Several tokens of each kind may be given; names
and secrets must each be distinct. A server without any token is reachable on loopback
only, and its requests act as :data:`ANONYMOUS`. A secret must be printable ASCII, what an
``Authorization`` header carries (:func:`check_token`): any other could never be presented.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from backend.errors import BadInput, Unauthorized
from backend.events.audit import check_actor
from backend.safetext import printable

__all__ = ["ANONYMOUS", "ApiToken", "Tokens", "check_token", "parse_token"]

Access = Literal["read", "operate"]

#: The actor of requests to a server that requires no token.
ANONYMOUS = "anonymous"
DEFAULT_NAMES: dict[Access, str] = {"operate": "operator", "read": "reader"}

_NAMED = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63})=(.*)", re.DOTALL)
#: Padded base64 (``YWI=``, ``dGVzdA==``): a bare secret, though it looks like ``NAME=``.
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)")


def check_token(token: str, source: str = "the token") -> str:
    """``token`` if an ``Authorization`` header can carry it (printable ASCII); else
    BadInput naming where it came from (``source``) and never the token itself, nor any
    part of it: a client would otherwise fail on it, quoting it, when it sends it, and a
    server would wait for a request that can never present it."""
    for char in token:
        if not " " <= char <= "~":
            kind = "a control character" if char < " " or char == "\x7f" else "a character that is not printable ASCII"
            raise BadInput(f"{source} holds {kind}, which a request header cannot carry; it is not shown", field="token")
    return token


@dataclass(frozen=True)
class ApiToken:
    """A token a server accepts. Its secret is checked (:func:`check_token`) when it is
    made: code that hands the server its tokens learns of one that cannot be sent."""

    name: str
    secret: str
    access: Access

    def __post_init__(self) -> None:
        what = "token" if self.access == "operate" else "read token"
        check_token(self.secret, f'the {what} "{printable(self.name)}"')

    def __repr__(self) -> str:  # never the secret, not even in a traceback
        return f"ApiToken(name={self.name!r}, access={self.access!r})"


def parse_token(text: str, access: Access, *, what: str | None = None) -> ApiToken:
    """``NAME=SECRET`` or a bare ``SECRET`` (see the module docstring)."""
    what = what or ("token" if access == "operate" else "read token")
    raw = text.strip()
    if not raw:
        raise BadInput(f"the {what} is empty (or only whitespace); give a real secret", field=what.replace(" ", "_"))
    named = _NAMED.fullmatch(raw)
    if named is not None:
        if named.group(2).strip().strip("="):
            return ApiToken(check_actor(named.group(1), f"{what} name"), named.group(2).strip(), access)
        if not _BASE64.fullmatch(raw):  # "alice=": a name whose secret was left out, not a secret
            raise BadInput(
                f'the {what} "{printable(named.group(1))}" has no secret after "=": give NAME=SECRET',
                field=what.replace(" ", "_"),
            )
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
