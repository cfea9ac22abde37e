"""The asynchronous API: ``POST /jobs[/label|/ENDPOINT]`` -> 202 and a job id, ``GET /jobs/{id}[?wait=S]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Query, Request
from starlette.responses import Response

from pipeserve.errors import InvalidInput, NotFound
from pipeserve.jobs import JobQueue, JobRequest, check_job_id
from pipeserve.pipeline.codec import dump_json
from pipeserve.pipeline.graph import DEFAULT_ENDPOINT
from pipeserve.server.rest.endpoints import JSON_BODY_EXPECTED, parse_document, parse_upload, read_body
from pipeserve.server.rest.schemas import ErrorResponse, JobAccepted, JobStatus
from pipeserve.service import InferenceService

CALLBACK_HEADER = "x-callback-url"
#: The longest a ``GET /jobs/{id}?wait=S`` holds the connection.
MAX_WAIT_S = 60.0


def add_job_routes(
    app: FastAPI, service: InferenceService, queue: Callable[[], JobQueue], *, max_body_bytes: int
) -> None:
    """Add the job routes to ``app``; ``queue()`` returns the started queue (or raises ``NotReady``)."""
    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorResponse, "description": "The body is malformed (as for /predict)."},
        503: {"model": ErrorResponse, "description": "The queue is full or unreachable (see Retry-After)."},
    }

    async def submit(request: Request, endpoint: str, label: bool) -> Response:
        body = await read_body(request.scope, request.receive, max_body_bytes)  # type: ignore[arg-type]  # ASGI receive
        callback = request.headers.get(CALLBACK_HEADER)
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            if service.spec.input.kind != "image":
                raise InvalidInput("this pipeline does not take file uploads", expected=JSON_BODY_EXPECTED)
            data, fields = await parse_upload(request.scope, body)
            callback = fields.get("callback_url", callback)
        else:
            document = parse_document(body)
            data = document["data"]
            callback = document.get("callback_url", callback)
        service.check_input(data)
        job = JobRequest(
            data=data,
            endpoint=endpoint,
            label=label,
            params=dict(request.query_params),
            callback_url=_check_callback(callback),
        )
        record = await queue().submit(job)
        location = f"{request.scope.get('root_path', '')}/jobs/{record.id}"
        return Response(
            dump_json({"id": record.id, "status": record.state, "url": location}),
            status_code=202,
            media_type="application/json",
            headers={"Location": location},
        )

    @app.post("/jobs", status_code=202, response_model=JobAccepted, responses=errors, tags=["jobs"])
    async def submit_predict(request: Request) -> Response:
        """Queue a request as ``POST /predict`` takes it (JSON ``{"data": ..., "callback_url": ...}`` or, for image
        pipelines, a multipart upload); answer at once with the job's id. Poll ``GET /jobs/{id}``, or get the
        finished job POSTed to ``callback_url`` (or the ``X-Callback-Url`` header)."""
        return await submit(request, DEFAULT_ENDPOINT, False)

    @app.post("/jobs/label", status_code=202, response_model=JobAccepted, responses=errors, tags=["jobs"])
    async def submit_label(request: Request) -> Response:
        """Queue a request as ``POST /predict/label`` takes it; the result is the class name."""
        return await submit(request, DEFAULT_ENDPOINT, True)

    @app.post(
        "/jobs/{endpoint}",
        status_code=202,
        response_model=JobAccepted,
        responses={**errors, 404: {"model": ErrorResponse}},
        tags=["jobs"],
    )
    async def submit_endpoint(request: Request, endpoint: str) -> Response:
        """Queue a request for a named endpoint (as ``POST /predict/{endpoint}``; query parameters such as ``k``
        are kept)."""
        if endpoint not in service.endpoints:
            known = ", ".join(["label", *(name for name in service.endpoints if name != DEFAULT_ENDPOINT)])
            raise NotFound(f"pipeline {service.spec.name!r} has no endpoint {endpoint!r} (jobs can go to: {known})")
        return await submit(request, endpoint, False)

    @app.get(
        "/jobs/{job_id}",
        response_model=JobStatus,
        responses={404: {"model": ErrorResponse}, 400: {"model": ErrorResponse}},
        tags=["jobs"],
    )
    async def job_status(
        job_id: str,
        wait: float = Query(
            default=0.0,
            ge=0,
            le=MAX_WAIT_S,
            description="Hold the answer up to this many seconds for the job to finish.",
        ),
    ) -> Response:
        """A job's status: ``queued``, ``running``, ``done`` (with ``result``, as ``/predict`` would have answered its
        ``prediction``) or ``failed`` (with ``error`` and ``error_kind``)."""
        check_job_id(job_id)
        record = await (queue().wait(job_id, wait) if wait > 0 else queue().get(job_id))
        return Response(record.to_json(), media_type="application/json")


def _check_callback(url: Any) -> str | None:
    if url is None or url == "":
        return None
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInput(f"callback_url {str(url)[:200]!r} is not an http(s) URL", expected="e.g. https://host/hook")
    return str(url)
