"""What one request carries through the pipeline besides its data, visible to steps wherever they run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

#: The request's parameters (e.g. ``k`` of ``POST /predict/tag?k=5``); empty for most requests.
request_params: ContextVar[Mapping[str, Any]] = ContextVar("pipeserve_request_params", default={})  # noqa: B039

#: Facts about the request gathered on its way (batch id, size, queue wait per model), for its log line.
request_annotations: ContextVar[dict[str, Any] | None] = ContextVar("pipeserve_request_annotations", default=None)

#: The request's deadline as a ``time.monotonic()`` instant, if it has one; queued work past it never runs.
request_deadline: ContextVar[float | None] = ContextVar("pipeserve_request_deadline", default=None)

#: How many requests the server has in progress, this one included (set by the service's admission): a model whose
#: request is the only one in progress runs it at once rather than queueing it for a batch nobody else can join.
requests_in_progress: ContextVar[Callable[[], int] | None] = ContextVar("pipeserve_requests_in_progress", default=None)
