"""gRPC's unary calls over ``http2.py``, on the event loop: the server pipeserve's inference servers run by default.

The wire format is gRPC's (``PROTOCOL-HTTP2.md`` in grpc/grpc): a POST to ``/package.Service/Method`` with
``content-type: application/grpc``, one length-prefixed message (gzip or deflate if ``grpc-encoding`` says so),
the deadline in ``grpc-timeout``; the answer is ``:status 200``, one message and the ``grpc-status`` /
``grpc-message`` trailers, or trailers alone for an error. Handlers have grpc.aio's shape,
``async def Method(request, context)``, with ``context.abort``, ``time_remaining`` and ``invocation_metadata``,
so one servicer serves under either server.

Example:
    >>> echo = UnaryMethod(handler, Request.FromString, Reply.SerializeToString)  # doctest: +SKIP
    >>> server = GrpcServer({"/pkg.Service/Echo": echo})                           # doctest: +SKIP
    >>> await server.start("127.0.0.1", 50051)                                     # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from pipeserve import _eager
from pipeserve.server.v2.http2 import Http2Connection, Http2Limits, ServerStream
from pipeserve.v2.grpc_wire import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    INVALID_ARGUMENT,
    OK_HEADERS,
    OK_TRAILERS,
    PROTOCOL_HEADERS,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    GrpcWireError,
    frame_message,
    parse_timeout,
    status_block,
    unframe_message,
)

logger = logging.getLogger("pipeserve.server.grpc")


@dataclass(frozen=True, slots=True)
class UnaryMethod:
    """One RPC: ``handler(request, context)`` with the request decoded and the response encoded by these."""

    handler: Callable[[Any, ServerContext], Coroutine[Any, Any, Any]]
    #: Takes the message as a bytes-like object (a memoryview; protobuf's ``FromString`` takes one).
    deserialize: Callable[[Any], Any]
    serialize: Callable[[Any], bytes]
    #: The handler bounds itself by ``context.time_remaining()``; else the server cancels it at the deadline.
    enforces_deadline: bool = False


class ServerContext:
    """What a handler knows of its call, with grpc.aio's ``ServicerContext`` method names."""

    __slots__ = ("_deadline", "_metadata", "_stream")

    def __init__(self, stream: ServerStream, deadline: float | None) -> None:
        self._stream = stream
        self._deadline = deadline
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The caller's metadata (``-bin`` keys base64-decoded to bytes), without the protocol's headers."""
        if self._metadata is None:
            pairs: list[tuple[str, str | bytes]] = []
            for key, value in self._stream.headers:
                if key.startswith(":") or key in PROTOCOL_HEADERS:
                    continue
                pairs.append((key, _b64decode(value) if key.endswith("-bin") else value))
            self._metadata = tuple(pairs)
        return self._metadata

    def time_remaining(self) -> float | None:
        """Seconds until the call's deadline (``grpc-timeout``), or ``None`` without one."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: Any, details: str = "") -> NoReturn:
        """End the call with ``code`` (a ``grpc.StatusCode`` or its number) and ``details``."""
        value = getattr(code, "value", code)
        raise GrpcWireError(int(value[0] if isinstance(value, tuple) else value), details)


class GrpcServer:
    """Serves ``methods`` (full paths, ``/package.Service/Method``) on one TCP port."""

    def __init__(self, methods: Mapping[str, UnaryMethod], *, limits: Http2Limits | None = None) -> None:
        self._methods = dict(methods)
        self._limits = limits or Http2Limits()
        self._server: asyncio.Server | None = None
        self._connections: set[Http2Connection] = set()

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def open_calls(self) -> int:
        """Calls fully received and not answered yet, on every connection (requests that arrived together count
        each other before any of them runs)."""
        return sum(connection.open_calls for connection in self._connections)

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; returns the port (``port`` 0 picks a free one). Raises ``OSError`` if it is taken."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._connection, host, port, reuse_address=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot bind gRPC to {host}:{port}: {exc.strerror or exc}") from None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float | None = 5.0) -> None:
        """Refuse new calls (GOAWAY), let calls in progress finish within ``grace_s``, then close the rest."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.goaway()
        waits = [asyncio.ensure_future(c.idle.wait()) for c in connections]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace_s or 0.001)
            for wait in pending:
                wait.cancel()
        for connection in list(self._connections):
            connection.abort()
        await self._server.wait_closed()
        self._server = None

    def _connection(self) -> Http2Connection:
        connection = Http2Connection(self._handle, self._limits, self._connections.discard)
        self._connections.add(connection)
        return connection

    async def _handle(self, stream: ServerStream) -> None:
        try:
            payload = await self._call(stream)
        except GrpcWireError as exc:
            stream.respond(b"", b"", status_block(exc.code, exc.details))
            return
        stream.respond(OK_HEADERS, frame_message(payload), OK_TRAILERS)

    async def _call(self, stream: ServerStream) -> bytes:
        """Run the call; its answer's message, or ``GrpcWireError`` with the status to answer instead."""
        method, message, deadline = self._request(stream)
        try:
            request = method.deserialize(message)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or another deserializer's error
            raise GrpcWireError(INVALID_ARGUMENT, f"the request is not a valid message: {exc}") from None
        context = ServerContext(stream, deadline)
        try:
            if deadline is None or method.enforces_deadline:
                response = await method.handler(request, context)
            else:
                response = await _eager.run_within(method.handler(request, context), deadline)
            return method.serialize(response)
        except GrpcWireError:
            raise
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline and not method.enforces_deadline:
                raise GrpcWireError(DEADLINE_EXCEEDED, "the call's deadline passed") from None
            logger.exception("gRPC call %s failed", _header(stream, ":path"))
            raise GrpcWireError(INTERNAL, "internal error (logged on the server)") from None
        except Exception:
            logger.exception("gRPC call %s failed", _header(stream, ":path"))
            raise GrpcWireError(INTERNAL, "internal error (logged on the server)") from None

    def _request(self, stream: ServerStream) -> tuple[UnaryMethod, bytes | memoryview, float | None]:
        """The method, the request message and the deadline; raises ``GrpcWireError`` for what cannot be served."""
        if stream.too_large:
            raise GrpcWireError(RESOURCE_EXHAUSTED, f"the request is larger than {self._limits.max_body_bytes} bytes")
        headers = dict(stream.headers)
        if headers.get(":method") != "POST" or not headers.get("content-type", "").startswith("application/grpc"):
            raise GrpcWireError(UNIMPLEMENTED, "gRPC calls are POSTs with content-type application/grpc")
        path = headers.get(":path", "")
        method = self._methods.get(path)
        if method is None:
            raise GrpcWireError(UNIMPLEMENTED, f"unknown method {path}")
        timeout = headers.get("grpc-timeout")
        deadline = time.monotonic() + parse_timeout(timeout) if timeout else None
        message = unframe_message(stream.body, headers.get("grpc-encoding"))
        return method, message, deadline


def _header(stream: ServerStream, name: str) -> str:
    return next((value for key, value in stream.headers if key == name), "")


def _b64decode(value: str) -> bytes:
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return value.encode()
