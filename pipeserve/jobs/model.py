"""Jobs: a ``/predict``-style request recorded to run later, and what became of it. Pure values; no I/O."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from pipeserve.errors import InvalidInput
from pipeserve.pipeline.graph import DEFAULT_ENDPOINT

JobState = Literal["queued", "running", "done", "failed"]
FINAL_STATES: frozenset[str] = frozenset({"done", "failed"})

_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


def new_job_id() -> str:
    """32 random hex digits: unguessable (a job id is all it takes to read a result) and unique across machines."""
    return os.urandom(16).hex()


def check_job_id(job_id: str) -> str:
    """``job_id`` if it has the shape of one, else ``InvalidInput`` (so lookups never build odd keys)."""
    if not _JOB_ID.fullmatch(job_id):
        raise InvalidInput(f"{job_id[:80]!r} is not a job id", expected="the 32 hex digits POST /jobs answered")
    return job_id


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What to run: one request as ``POST /predict[/...]`` would take it, so that any worker can run it later.

    Attributes:
        data: the request's ``data`` (a JSON value), or the bytes of an uploaded file.
        endpoint: the endpoint whose output is the result (``predict``, or a name under the spec's ``endpoints``).
        label: answer as ``/predict/label`` does (class names).
        params: query parameters for the steps (``k`` for ``top_k``).
        callback_url: POSTed the finished job (done or failed), with retries.
    """

    data: Any
    endpoint: str = DEFAULT_ENDPOINT
    label: bool = False
    params: Mapping[str, str] = field(default_factory=dict)
    callback_url: str | None = None

    def encode(self) -> bytes:
        data = {"$bytes": base64.b64encode(self.data).decode()} if isinstance(self.data, bytes) else self.data
        return orjson.dumps(
            {
                "data": data,
                "endpoint": self.endpoint,
                "label": self.label,
                "params": dict(self.params),
                "callback_url": self.callback_url,
            }
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> JobRequest:
        body = orjson.loads(raw)
        data = body["data"]
        if isinstance(data, dict) and set(data) == {"$bytes"}:
            data = base64.b64decode(data["$bytes"])
        return cls(
            data=data,
            endpoint=body.get("endpoint", DEFAULT_ENDPOINT),
            label=bool(body.get("label", False)),
            params=body.get("params") or {},
            callback_url=body.get("callback_url"),
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as a client sees it (``GET /jobs/{id}``).

    ``result`` is the prediction as JSON bytes, encoded exactly as ``/predict`` encodes it; ``error`` says why a
    failed job failed, ``error_kind`` whether retrying could help (``invalid_input``: no; ``gave_up``: it failed
    ``attempts`` times).
    """

    id: str
    state: JobState
    submitted_at: float
    release: str = ""
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    result: bytes | None = None
    error: str | None = None
    error_kind: str | None = None
    callback_url: str | None = None

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    def to_json(self) -> bytes:
        """The ``GET /jobs/{id}`` body: the result spliced in as ``/predict`` encoded it."""
        body: dict[str, Any] = {
            "id": self.id,
            "status": self.state,
            "submitted_at": self.submitted_at,
            "attempts": self.attempts,
        }
        if self.started_at is not None:
            body["started_at"] = self.started_at
        if self.finished_at is not None:
            body["finished_at"] = self.finished_at
        if self.error is not None:
            body["error"] = self.error
            body["error_kind"] = self.error_kind
        encoded = orjson.dumps(body)
        if self.result is None:
            return encoded
        return encoded[:-1] + b',"result":' + self.result + b"}"

    @classmethod
    def from_fields(cls, job_id: str, fields: Mapping[str, Any]) -> JobRecord:
        """From a stored hash (bytes or str values, as Redis returns them)."""

        def text(name: str) -> str | None:
            value = fields.get(name)
            if value is None:
                return None
            return value.decode() if isinstance(value, bytes) else str(value)

        def number(name: str) -> float | None:
            value = text(name)
            return float(value) if value not in (None, "") else None

        result = fields.get("result")
        if isinstance(result, str):
            result = result.encode()
        return cls(
            id=job_id,
            state=text("state") or "queued",  # type: ignore[arg-type]  # stored by this module: a JobState
            submitted_at=number("submitted_at") or 0.0,
            release=text("release") or "",
            attempts=int(number("attempts") or 0),
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            result=result,
            error=text("error"),
            error_kind=text("error_kind"),
            callback_url=text("callback_url") or None,
        )
