"""Domain errors. Transports map these to their own status codes; nothing here knows HTTP or gRPC."""

from __future__ import annotations

from pathlib import Path


class PipeserveError(Exception):
    """Base class of every error pipeserve raises on purpose."""


class SpecError(PipeserveError, ValueError):
    """A pipeline spec is invalid. The message names the file, the node and the field.

    Example:
        >>> str(SpecError("unknown node 'm9'", file="p.yaml", node="m1", field="next"))
        "p.yaml: node 'm1': field 'next': unknown node 'm9'"
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | Path | None = None,
        node: str | None = None,
        field: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = str(file) if file is not None else None
        self.node = node
        self.field = field
        parts = [p for p in (self.file, f"node {node!r}" if node else None, f"field {field!r}" if field else None) if p]
        super().__init__(": ".join([*parts, problem]))


class InvalidInput(PipeserveError, ValueError):
    """A request's input is malformed; ``expected`` says what would have been accepted."""

    def __init__(self, problem: str, *, expected: str | None = None) -> None:
        self.problem = problem
        self.expected = expected
        super().__init__(problem if expected is None else f"{problem}; expected {expected}")


class PayloadTooLarge(InvalidInput):
    """A request body is over the configured limit."""

    def __init__(self, size_bytes: int | None, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        got = "over the limit" if size_bytes is None else f"{size_bytes} bytes"
        super().__init__(f"request body is {got}", expected=f"at most {limit_bytes} bytes")


class NotReady(PipeserveError):
    """The service cannot answer yet (loading, warming up) or any more (failed golden check, shutting down)."""


class Overloaded(PipeserveError):
    """A bounded queue is full; the caller should retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class DeadlineExceeded(PipeserveError):
    """A request's deadline passed before its work ran or finished."""


class NodeFailed(PipeserveError):
    """A pipeline node raised; ``node`` names it. The cause is chained and logged, never sent to clients."""

    def __init__(self, node: str, cause: BaseException | None = None) -> None:
        self.node = node
        self.cause = cause
        kind = type(cause).__name__ if cause is not None else "error"
        super().__init__(f"node {node!r} failed ({kind})")


class GoldenCheckFailed(PipeserveError):
    """The sample input did not reproduce the golden output: model and preprocessing are out of step."""


class NotFound(PipeserveError):
    """A named thing (model, version, sample) does not exist."""
