"""The locks' HTTP routes (see :mod:`backend.api.app` for the conventions)::

    GET  /inspect/locks                    {now, locks: [lock]}
    POST /inspect/locks/{name}/release     release by force -> {released, lock, now}; name may hold "/"
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.app import Api, JSONResponse
from backend.locks.model import check_lock_name

__all__ = ["lock_routes"]


def lock_routes(api: Api) -> list[Route]:
    """The lock list and the forced release."""
    backend, endpoint = api.backend, api.endpoint

    @endpoint("read")
    async def list_locks(request: Request) -> Response:
        """
        ---
        summary: Every lock - held, expired or free - with its holder, token and times
        description: >
          locks is [{name, holder, token, acquired_at, expires_at, renewed_at, state}]; state
          is held, expired (its holder stopped renewing it) or free (released; holder null).
          now is the lock clock (the database's), to count expiries down against.
        responses:
          200: {description: "{now, locks: [lock]}"}
        """
        return JSONResponse((await backend.list_locks()).to_json())

    @endpoint("operate")
    async def release_lock(request: Request) -> Response:
        """
        ---
        summary: Release a lock by force, whoever holds it
        description: >
          Its holder's renewals and fenced writes are refused from now on, and the next
          holder gets a greater token. released is false when nobody held it; lock is the
          lock as it was just before.
        responses:
          200: {description: "{released, lock, now}"}
          404: {description: no lock with that name}
        """
        name = check_lock_name(str(request.path_params["name"]))
        return JSONResponse((await backend.release_lock(name)).to_json())

    return [
        Route("/inspect/locks", list_locks, methods=["GET"]),
        # A lock name may hold "/" (a client sends it as %2F, which the server decodes):
        # the path converter takes it whole, up to the last "/release".
        Route("/inspect/locks/{name:path}/release", release_lock, methods=["POST"]),
    ]
