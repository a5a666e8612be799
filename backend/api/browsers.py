"""What a web page in the operator's browser may not do to the API.

No browser page is a client of this API (ours are httpx and curl, which send no
``Origin``), yet a browser lets any page send a *simple* request anywhere: a ``POST`` with
a ``text/plain`` body or none, without asking the server first. :class:`BrowserGuard`
refuses, with 403, what a browser sent cross-site:

* a request other than ``GET``/``HEAD`` that carries an ``Origin`` header, or
  ``Sec-Fetch-Site: cross-site`` or ``same-site`` (CSRF). On every server: a token is no
  ambient credential today, but a proxy that adds it for the browser's user would make it one;
* on a server without tokens, a ``Host`` that names no loopback address (nor the host it
  was bound to): a DNS-rebinding page, whose own name now points at 127.0.0.1, could
  otherwise read every answer.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from backend.api.base import error_response
from backend.safetext import printable

__all__ = ["BrowserGuard", "is_loopback_host"]

#: Methods a browser page cannot make act (and whose answers it cannot read cross-site).
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def is_loopback_host(host: str) -> bool:
    """True for a ``Host`` header's host (its port already cut off) naming this machine by
    a name no one else can hold: ``localhost``, any ``127.x.y.z``, ``::1``."""
    host = host.lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host of a ``Host`` header, without its port (``[::1]:8787`` -> ``[::1]``)."""
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    return header.rpartition(":")[0] if ":" in header else header


class BrowserGuard:
    """ASGI middleware refusing what a browser sent cross-site (see the module docstring).
    ``loopback_only``: also refuse a ``Host`` naming no loopback address, except ``host``
    (the one the server was bound to)."""

    def __init__(self, app: ASGIApp, *, loopback_only: bool, host: str | None = None) -> None:
        self.app = app
        self.loopback_only = loopback_only
        self.host = host.lower() if host else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await error_response(403, "forbidden", refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> str | None:
        """Why the request is refused (``None``: it is not)."""
        headers = {name: value.decode("latin-1") for name, value in scope["headers"]}
        if scope["method"] not in _SAFE_METHODS:
            site = headers.get(b"sec-fetch-site", "").lower()
            if b"origin" in headers or site in ("cross-site", "same-site"):
                origin = headers.get(b"origin", f"Sec-Fetch-Site: {site}")
                return (
                    f'refused a request a web page sent (from "{printable(origin, 100)}"): '
                    "this API takes no requests from browsers"
                )
        if self.loopback_only:
            for name, value in scope["headers"]:
                host = _host_of(value.decode("latin-1").strip()) if name == b"host" else None
                if host is not None and not is_loopback_host(host) and host.lower() != self.host:
                    return (
                        f'refused the Host "{printable(value.decode("latin-1"), 100)}": a server without tokens '
                        "answers only requests addressed to localhost, 127.0.0.1 or [::1] (a page of another site "
                        "may have pointed its own name here)"
                    )
        return None
