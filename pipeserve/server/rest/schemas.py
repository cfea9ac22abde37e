"""Wire schemas of the REST API (for validation where FastAPI parses, and for the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class PredictRequest(BaseModel):
    """The body of ``POST /predict`` and ``POST /predict/label``."""

    data: Any = Field(
        description="One request's input: numbers for tensor pipelines (e.g. [[5.1, 3.5, 1.4, 0.2]]), "
        "a base64 string for image pipelines, any JSON for handler pipelines.",
        examples=[[[5.1, 3.5, 1.4, 0.2]]],
    )


class PredictResponse(BaseModel):
    prediction: Any = Field(
        description="The pipeline's output; a one-row batch is returned without its batch dimension."
    )


class LabelResponse(BaseModel):
    prediction: str | list[str] = Field(description="The class name (or one per row).")


class ErrorResponse(BaseModel):
    error: str = Field(description="What was wrong.")
    expected: str | None = Field(default=None, description="What would have been accepted.")
    request_id: str = Field(description="The request's id, as in the X-Request-ID header and the server log.")


class HealthResponse(BaseModel):
    health: str = "ok"


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool
    state: str
    reason: str
    fingerprint: str | None = None


class JobAccepted(BaseModel):
    id: str = Field(description="The job's id: 32 hex digits.")
    status: str = Field(description="queued")
    url: str = Field(description="Where to poll the job: GET this URL.")


class JobStatus(BaseModel):
    id: str
    status: str = Field(description="queued | running | done | failed")
    submitted_at: float = Field(description="Unix time.")
    attempts: int = Field(description="Runs started so far (a failing job is retried, then dead-lettered).")
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = Field(default=None, description="When done: what /predict would have answered as `prediction`.")
    error: str | None = Field(default=None, description="When failed: why.")
    error_kind: str | None = Field(
        default=None, description="invalid_input (the request is wrong; retrying cannot help) | gave_up"
    )
