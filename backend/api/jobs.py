"""The job queue's HTTP routes (DESIGN.md part 2), over the shared backend interface::

    GET    /inspect/queues                                  {now, queues: [queue]}
    POST   /inspect/queues/{queue}/pause | /resume          the queue
    GET    /inspect/queues/{queue}/jobs?status=&limit=&before=   {jobs, next_before}
    POST   /inspect/queues/{queue}/jobs {payload, delay, attempts, key}
                                        201 {id, duplicate: false} | 200 {id, duplicate: true}
    GET    /inspect/jobs/{id}                               the job and its attempts
    POST   /inspect/queues/{queue}/cancel {id | key}        {cancelled}
    DELETE /inspect/queues/{queue}/jobs/{id}                {deleted: true}
    POST   /inspect/queues/{queue}/jobs/{id}/retry          the job (409 unless it is dead)

Limits answer 413 (payload), 422 (delay, attempts, key, bad JSON) and 409 (``queue_full``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend.api.app import Api, JSONResponse
from backend.jobs.definition import MAX_PAYLOAD_BYTES
from backend.model import iso

__all__ = ["SEND_BODY_BYTES", "job_routes"]

#: A send's body may carry the largest payload even when its client escapes every
#: character (``\\u00e9`` is 6 bytes for 2), plus the other fields.
SEND_BODY_BYTES = 6 * MAX_PAYLOAD_BYTES + 64 * 1024

_SEND_FIELDS = ("payload", "delay", "attempts", "key")


def job_routes(api: Api) -> list[Route]:
    """Queues and jobs."""
    backend, endpoint, body_of, query_int = api.backend, api.endpoint, api.body_of, api.query_int

    def queue_of(request: Request) -> str:
        return str(request.path_params["queue"])

    @endpoint("read")
    async def list_queues(request: Request) -> Response:
        """
        ---
        summary: Every queue with its counts (queued, running, dead) and whether it is paused
        responses:
          200: {description: "{now, queues: [{name, concurrency, paused, queued, running, dead, oldest_queued_at}]}"}
        """
        queues = await backend.list_queues()
        return JSONResponse({"now": iso(await backend.now()), "queues": [q.to_json() for q in queues]})

    async def _pause(request: Request, paused: bool) -> Response:
        view = await backend.set_queue_paused(queue_of(request), paused)
        return JSONResponse(view.to_json())

    @endpoint("operate")
    async def pause(request: Request) -> Response:
        """
        ---
        summary: Pause a queue - its jobs wait (sends are still taken); running ones finish
        responses:
          200: {description: the queue}
          404: {description: unknown queue}
        """
        return await _pause(request, True)

    @endpoint("operate")
    async def resume(request: Request) -> Response:
        """
        ---
        summary: Resume a paused queue
        responses:
          200: {description: the queue}
          404: {description: unknown queue}
        """
        return await _pause(request, False)

    @endpoint("read")
    async def list_jobs(request: Request) -> Response:
        """
        ---
        summary: A page of a queue's jobs, newest first (keyset paging)
        parameters:
          - {name: status, in: query, schema: {type: string, enum: [queued, running, dead]}}
          - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 1000, default: 50}}
          - name: before
            in: query
            description: "id of the last job of the previous page"
            schema: {type: string, pattern: "^[0-9A-HJKMNP-TV-Z]{26}$"}
        responses:
          200: {description: "{jobs: [job], next_before}"}
          404: {description: unknown queue}
        """
        limit = query_int(request, "limit", 50, 1, 1000)
        page = await backend.list_jobs(
            queue_of(request),
            status=request.query_params.get("status"),
            limit=limit,
            before=request.query_params.get("before"),
        )
        return JSONResponse(page.to_json())

    @endpoint("operate")
    async def send(request: Request) -> Response:
        """
        ---
        summary: Send a job (a key held by another job queues nothing and answers its id)
        requestBody:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                properties:
                  payload: {description: "any JSON, up to 256 KiB encoded"}
                  delay: {type: number, minimum: 0, maximum: 2592000, description: "seconds (30 days at most)"}
                  attempts: {type: integer, minimum: 1, maximum: 20, nullable: true}
                  key: {type: string, maxLength: 256, nullable: true, description: "up to 256 bytes of UTF-8"}
        responses:
          201: {description: "queued: {id, duplicate: false}"}
          200: {description: "a job with this key exists: {id, duplicate: true}, nothing queued"}
          404: {description: unknown queue}
          409: {description: "queue_full: it holds 10,000 queued and dead jobs"}
          413: {description: "the payload is over 256 KiB"}
        """
        queue = queue_of(request)
        body = await body_of(request, SEND_BODY_BYTES, fields=_SEND_FIELDS)
        delay = body.get("delay")
        sent = await backend.send_job(
            queue, body.get("payload"), delay=0 if delay is None else delay, attempts=body.get("attempts"), key=body.get("key")
        )
        return JSONResponse(sent.to_json(), status_code=200 if sent.duplicate else 201)

    @endpoint("read")
    async def get_job(request: Request) -> Response:
        """
        ---
        summary: A job (while it exists) and its attempts; once gone, its attempts (job fields null)
        responses:
          200: {description: "the job with attempts: [{attempt, started_at, finished_at, status, error_tag, error_message, instance}]"}
          404: {description: unknown job}
        """
        detail = await backend.get_job(str(request.path_params["job_id"]))
        return JSONResponse(detail.to_json())

    @endpoint("operate")
    async def cancel(request: Request) -> Response:
        """
        ---
        summary: Delete a queued job by its id or by its key (a running one finishes)
        description: >
          Exactly one of id and key. Each means what it says: a key that happens to look
          like an id (even another job's) cancels the job with that key.
        requestBody:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                properties:
                  id: {type: string, pattern: "^[0-9A-HJKMNP-TV-Z]{26}$"}
                  key: {type: string, minLength: 1, maxLength: 256}
        responses:
          200: {description: "{cancelled}: true if it was queued and is gone"}
          404: {description: unknown queue}
        """
        body = await body_of(request, fields=("id", "key"))
        cancelled = await backend.cancel_job(queue_of(request), body.get("id"), key=body.get("key"))
        return JSONResponse({"cancelled": cancelled})

    @endpoint("operate")
    async def delete(request: Request) -> Response:
        """
        ---
        summary: Delete a job in any state (a running one finishes; its result is not kept)
        responses:
          200: {description: "{deleted: true}"}
          404: {description: unknown queue or job}
        """
        await backend.delete_job(queue_of(request), str(request.path_params["job_id"]))
        return JSONResponse({"deleted": True})

    @endpoint("operate")
    async def retry(request: Request) -> Response:
        """
        ---
        summary: Put a dead job back in its queue, with fresh attempts
        responses:
          200: {description: the job}
          404: {description: unknown queue or job}
          409: {description: "the job is not dead"}
        """
        job = await backend.retry_job(queue_of(request), str(request.path_params["job_id"]))
        return JSONResponse(job.to_json())

    return [
        Route("/inspect/queues", list_queues, methods=["GET"]),
        Route("/inspect/queues/{queue}/pause", pause, methods=["POST"]),
        Route("/inspect/queues/{queue}/resume", resume, methods=["POST"]),
        Route("/inspect/queues/{queue}/jobs", list_jobs, methods=["GET"]),
        Route("/inspect/queues/{queue}/jobs", send, methods=["POST"]),
        Route("/inspect/jobs/{job_id}", get_job, methods=["GET"]),
        Route("/inspect/queues/{queue}/cancel", cancel, methods=["POST"]),
        Route("/inspect/queues/{queue}/jobs/{job_id}", delete, methods=["DELETE"]),
        Route("/inspect/queues/{queue}/jobs/{job_id}/retry", retry, methods=["POST"]),
    ]
