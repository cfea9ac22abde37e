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
import gzip
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from pipeserve.server.v2.http2 import Http2Connection, Http2Limits, Stream

logger = logging.getLogger("pipeserve.server.grpc")

# Status codes (grpc/grpc doc/statuscodes.md).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: Request headers that are HTTP/2 or gRPC protocol, not the caller's metadata.
_PROTOCOL_HEADERS = frozenset(
    {"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "user-agent", "content-length"}
)


@dataclass(frozen=True, slots=True)
class UnaryMethod:
    """One RPC: ``handler(request, context)`` with the request decoded and the response encoded by these."""

    handler: Callable[[Any, ServerContext], Awaitable[Any]]
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]


class _Abort(Exception):
    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ServerContext:
    """What a handler knows of its call, with grpc.aio's ``ServicerContext`` method names."""

    __slots__ = ("_deadline", "_metadata", "_stream")

    def __init__(self, stream: Stream, deadline: float | None) -> None:
        self._stream = stream
        self._deadline = deadline
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The caller's metadata (``-bin`` keys base64-decoded to bytes), without the protocol's headers."""
        if self._metadata is None:
            pairs: list[tuple[str, str | bytes]] = []
            for key, value in self._stream.headers:
                if key.startswith(":") or key in _PROTOCOL_HEADERS:
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
        raise _Abort(int(value[0] if isinstance(value, tuple) else value), details)


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

    async def _handle(self, stream: Stream) -> None:
        try:
            payload = await self._call(stream)
        except _Abort as exc:
            stream.respond(b"", b"", _status_block(exc.code, exc.details))
            return
        stream.respond(_OK_HEADERS, len(payload).to_bytes(5, "big") + payload, _OK_TRAILERS)

    async def _call(self, stream: Stream) -> bytes:
        """Run the call; its answer's message, or ``_Abort`` with the status to answer instead."""
        method, message, deadline = self._request(stream)
        try:
            request = method.deserialize(message)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or another deserializer's error
            raise _Abort(INVALID_ARGUMENT, f"the request is not a valid message: {exc}") from None
        context = ServerContext(stream, deadline)
        try:
            if deadline is None:
                response = await method.handler(request, context)
            else:
                loop = asyncio.get_running_loop()
                async with asyncio.timeout_at(loop.time() + deadline - time.monotonic()):
                    response = await method.handler(request, context)
            return method.serialize(response)
        except _Abort:
            raise
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise _Abort(DEADLINE_EXCEEDED, "the call's deadline passed") from None
            logger.exception("gRPC call %s failed", _header(stream, ":path"))
            raise _Abort(INTERNAL, "internal error (logged on the server)") from None
        except Exception:
            logger.exception("gRPC call %s failed", _header(stream, ":path"))
            raise _Abort(INTERNAL, "internal error (logged on the server)") from None

    def _request(self, stream: Stream) -> tuple[UnaryMethod, bytes, float | None]:
        """The method, the request message and the deadline; raises ``_Abort`` for what cannot be served."""
        if stream.too_large:
            raise _Abort(RESOURCE_EXHAUSTED, f"the request is larger than {self._limits.max_body_bytes} bytes")
        headers = dict(stream.headers)
        if headers.get(":method") != "POST" or not headers.get("content-type", "").startswith("application/grpc"):
            raise _Abort(UNIMPLEMENTED, "gRPC calls are POSTs with content-type application/grpc")
        path = headers.get(":path", "")
        method = self._methods.get(path)
        if method is None:
            raise _Abort(UNIMPLEMENTED, f"unknown method {path}")
        deadline = None
        timeout = headers.get("grpc-timeout")
        if timeout:
            unit = _TIMEOUT_UNITS.get(timeout[-1])
            if unit is None or not timeout[:-1].isdigit():
                raise _Abort(INVALID_ARGUMENT, f"malformed grpc-timeout {timeout!r}")
            deadline = time.monotonic() + int(timeout[:-1]) * unit
        body = stream.body
        if len(body) < 5:
            raise _Abort(INTERNAL if body else UNIMPLEMENTED, "a unary call carries exactly one message")
        size = int.from_bytes(body[1:5], "big")
        if len(body) != 5 + size:
            raise _Abort(INTERNAL, f"the message frame says {size} bytes, the stream carried {len(body) - 5}")
        message = bytes(body[5:])
        if body[0]:
            message = _decompress(headers.get("grpc-encoding", "identity"), message)
        stream.body = bytearray()
        return method, message, deadline


def _decompress(encoding: str, message: bytes) -> bytes:
    try:
        if encoding == "gzip":
            return gzip.decompress(message)
        if encoding == "deflate":
            return zlib.decompress(message)
    except (OSError, zlib.error, EOFError) as exc:
        raise _Abort(INTERNAL, f"cannot decompress the {encoding} message: {exc}") from None
    if encoding == "identity":
        raise _Abort(INTERNAL, "a compressed message without grpc-encoding")
    raise _Abort(UNIMPLEMENTED, f"grpc-encoding {encoding} is not supported (identity, gzip, deflate are)")


def _header(stream: Stream, name: str) -> str:
    return next((value for key, value in stream.headers if key == name), "")


def _b64decode(value: str) -> bytes:
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return value.encode()


# -- HPACK for our answers: literals that are never indexed, so the peer's table size never matters ---------------


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, with a new name (RFC 7541 section 6.2.2)."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(raw_name), 7, 0) + raw_name + _hpack_int(len(raw_value), 7, 0) + raw_value


def _grpc_message(details: str) -> str:
    """Percent-encode as gRPC asks: bytes outside printable ASCII, and '%' itself."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in details.encode())


_STATUS_200 = b"\x88"  # ":status: 200" is entry 8 of HPACK's static table
_OK_HEADERS = _STATUS_200 + _literal("content-type", "application/grpc")
_OK_TRAILERS = _literal("grpc-status", "0")


def _status_block(code: int, details: str) -> bytes:
    """A trailers-only answer: the status, the content type and gRPC's status in one header block."""
    block = _OK_HEADERS + _literal("grpc-status", str(code))
    if details:
        block += _literal("grpc-message", _grpc_message(details))
    return block
