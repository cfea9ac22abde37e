"""Domain errors -> HTTP status codes and JSON error bodies. The one table of this transport."""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson

from pipeserve.errors import (
    DeadlineExceeded,
    GoldenCheckFailed,
    InvalidInput,
    NodeFailed,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    SpecError,
)

logger = logging.getLogger("pipeserve.server")

# Order matters: the first matching class wins (subclasses before their bases).
STATUS_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidInput, 400),
    (NotFound, 404),
    (Overloaded, 503),
    (NotReady, 503),
    (GoldenCheckFailed, 503),
    (DeadlineExceeded, 504),
    (NodeFailed, 500),
    (SpecError, 500),
)

Headers = list[tuple[bytes, bytes]]


def error_body(message: str, *, request_id: str, expected: str | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"error": message}
    if expected is not None:
        body["expected"] = expected
    body.update(extra)
    body["request_id"] = request_id
    return orjson.dumps(body)


def map_exception(exc: BaseException, request_id: str) -> tuple[int, bytes, Headers]:
    """Status, JSON body and extra headers for ``exc``. 5xx are logged here, with the traceback."""
    status = next((code for cls, code in STATUS_CODES if isinstance(exc, cls)), 500)
    headers: Headers = []
    if isinstance(exc, InvalidInput):
        return status, error_body(exc.problem, request_id=request_id, expected=exc.expected), headers
    if isinstance(exc, Overloaded):
        headers.append((b"retry-after", str(max(1, math.ceil(exc.retry_after_s))).encode()))
        return status, error_body(str(exc), request_id=request_id), headers
    if isinstance(exc, NotReady | GoldenCheckFailed):
        headers.append((b"retry-after", b"5"))
        return status, error_body(f"not ready: {exc}", request_id=request_id), headers
    if isinstance(exc, NotFound | DeadlineExceeded):
        return status, error_body(str(exc), request_id=request_id), headers
    if isinstance(exc, NodeFailed):
        logger.error("Request failed in node %s", exc.node, exc_info=exc, extra={"request_id": request_id})
        message = f"internal error in pipeline node {exc.node!r}; the server log has the details under this request id"
        return 500, error_body(message, request_id=request_id, node=exc.node), headers
    logger.error("Unhandled error", exc_info=exc, extra={"request_id": request_id})
    return (
        500,
        error_body(
            "internal server error; the server log has the details under this request id", request_id=request_id
        ),
        headers,
    )
