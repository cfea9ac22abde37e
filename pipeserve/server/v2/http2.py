"""A small HTTP/2 server connection (RFC 9113, cleartext with prior knowledge) for gRPC's unary calls.

It runs on the event loop as an ``asyncio.Protocol``: frames are parsed where the bytes arrive, a request whose
stream has ended is handed to ``on_request`` as a task, and its answer (headers, body, trailers) is written in
one go, within the peer's flow-control windows. No threads: on a single core, grpcio's poller and event-engine
threads preempted the model several times per request (see docs/benchmarks/split.md).

What it implements: the connection preface and SETTINGS (with ACKs), HEADERS + CONTINUATION with HPACK (the
``hpack`` package), padded DATA, both directions of flow control, PING, RST_STREAM (the stream's task is
cancelled), GOAWAY both ways (a graceful close lets streams in progress finish), stream limits and the errors
RFC 9113 asks for. What it does not: server push (gRPC does not use it), priorities (ignored, as RFC 9113
allows), TLS and the HTTP/1.1 upgrade (gRPC clients speak HTTP/2 directly to a cleartext port).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import hpack

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
# Error codes (section 7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1

_U32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Http2Limits:
    """What this server accepts and advertises.

    Attributes:
        max_concurrent_streams: open streams per connection (more are refused with REFUSED_STREAM).
        stream_window: bytes a client may send on one stream before we acknowledge them.
        connection_window: the same for the whole connection.
        max_frame_size: the largest frame a client may send us (large frames mean fewer frames per tensor).
        max_header_list_size: the largest decoded header list (metadata) of a request.
        max_body_bytes: the largest request body (refused with ``on_too_large``).
    """

    max_concurrent_streams: int = 1024
    stream_window: int = 16 * 1024 * 1024
    connection_window: int = 64 * 1024 * 1024
    max_frame_size: int = MAX_FRAME_LIMIT
    max_header_list_size: int = 64 * 1024
    max_body_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not DEFAULT_MAX_FRAME <= self.max_frame_size <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame_size must be in [{DEFAULT_MAX_FRAME}, {MAX_FRAME_LIMIT}]")
        for name in ("stream_window", "connection_window"):
            if not DEFAULT_WINDOW <= getattr(self, name) <= MAX_WINDOW:
                raise ValueError(f"{name} must be in [{DEFAULT_WINDOW}, {MAX_WINDOW}]")
        if self.max_concurrent_streams < 1 or self.max_header_list_size < 1024 or self.max_body_bytes < 1:
            raise ValueError("max_concurrent_streams, max_header_list_size and max_body_bytes must be positive")


class Http2Error(Exception):
    """A connection error (section 5.4.1): the connection sends GOAWAY with ``code`` and closes."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(slots=True, eq=False)
class Stream:
    """One request/response exchange. ``headers`` are the decoded request headers (pseudo-headers included)."""

    id: int
    connection: Http2Connection
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False  # the client sent END_STREAM
    closed: bool = False  # the response is complete or the stream was reset
    send_window: int = DEFAULT_WINDOW
    unacked: int = 0  # received bytes not yet returned to the client's stream window
    task: asyncio.Task[None] | None = None
    #: The request body went over ``Http2Limits.max_body_bytes`` (it was dropped, not buffered).
    too_large: bool = False
    _pending: memoryview | None = None  # response body still to send (waits for window)
    _trailers: bytes = b""

    def respond(self, headers: bytes, body: bytes, trailers: bytes) -> None:
        """Send a response: an encoded header block, a body (may be empty) and an encoded trailer block.

        ``headers`` empty means a trailers-only response (``trailers`` then carries everything).
        """
        self.connection._respond(self, headers, body, trailers)

    def reset(self, code: int = INTERNAL_ERROR) -> None:
        self.connection._reset(self, code)


RequestHandler = Callable[[Stream], Coroutine[Any, Any, None]]


class Http2Connection(asyncio.Protocol):
    """One client connection. ``on_request(stream)`` is run as a task once a stream's request has fully arrived."""

    def __init__(
        self, on_request: RequestHandler, limits: Http2Limits, on_close: Callable[[Http2Connection], None]
    ) -> None:
        self._on_request = on_request
        self._limits = limits
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._streams: dict[int, Stream] = {}
        self._last_stream_id = 0
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = limits.max_header_list_size
        self._decoder.max_allowed_table_size = 4096
        self._header_block: bytearray | None = None  # a HEADERS block waiting for its CONTINUATIONs
        self._header_stream = 0
        self._header_ends_stream = False
        self._peer_window = DEFAULT_WINDOW  # the peer's initial stream window (its SETTINGS)
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._send_window = DEFAULT_WINDOW  # our connection-level send window
        self._recv_unacked = 0
        self._blocked: dict[int, Stream] = {}  # streams with a response waiting for window
        self._goaway_sent = False
        self._closing = False
        self.idle = asyncio.Event()
        self.idle.set()

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        limits = self._limits
        settings = b"".join(
            struct.pack(">HI", key, value)
            for key, value in (
                (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (SETTINGS_MAX_FRAME_SIZE, limits.max_frame_size),
                (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
            )
        )
        out = _frame(SETTINGS, 0, 0, settings)
        if limits.connection_window > DEFAULT_WINDOW:
            out += _frame(WINDOW_UPDATE, 0, 0, _U32.pack(limits.connection_window - DEFAULT_WINDOW))
        transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for stream in list(self._streams.values()):
            self._forget(stream, cancel=True)
        self._on_close(self)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        try:
            if not self._preface_seen:
                data = self._preface(data)
            buffer = self._buffer
            if buffer:  # the start of a frame is waiting: complete it in place
                buffer += data
                used = self._frames(buffer)
                del buffer[:used]
            else:  # parse straight from what arrived; keep only an incomplete last frame
                used = self._frames(data)
                if used < len(data) and self._transport is not None:
                    buffer += memoryview(data)[used:]
        except Http2Error as exc:
            self._fail(exc.code, str(exc))
        except Exception:  # a bug here must not leave the client hanging
            logger.exception("HTTP/2 connection failed")
            self._fail(INTERNAL_ERROR, "internal error")

    def _preface(self, data: bytes) -> bytes:
        """Consume the client's connection preface; what follows it is returned (empty until it is complete)."""
        buffer = self._buffer
        buffer += data
        if len(buffer) < len(PREFACE):
            if not PREFACE.startswith(bytes(buffer)):
                raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            return b""
        if buffer[: len(PREFACE)] != PREFACE:
            raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        rest = bytes(buffer[len(PREFACE) :])
        buffer.clear()
        self._preface_seen = True
        return rest

    def _frames(self, data: bytes | bytearray) -> int:
        """Handle every complete frame in ``data``; returns the bytes used."""
        offset = 0
        size = len(data)
        max_frame = self._limits.max_frame_size
        with memoryview(data) as view:
            while size - offset >= 9:
                length = int.from_bytes(view[offset : offset + 3], "big")
                if length > max_frame:
                    raise Http2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes (at most {max_frame})")
                end = offset + 9 + length
                if end > size:
                    break
                stream_id = int.from_bytes(view[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
                with view[offset + 9 : end] as payload:
                    self._frame(view[offset + 3], view[offset + 4], stream_id, payload)
                offset = end
                if self._transport is None:
                    break
        return offset

    # -- frames -------------------------------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._header_block is not None and kind != CONTINUATION:
            raise Http2Error(PROTOCOL_ERROR, "a header block was interrupted by another frame")
        handler = _FRAME_HANDLERS.get(kind)
        if handler is not None:  # unknown frame types are ignored (section 4.1)
            handler(self, flags, stream_id, payload)

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0 or len(payload) != 8:
            raise Http2Error(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a malformed PING")
        if not flags & ACK:
            self._write(_frame(PING, ACK, 0, bytes(payload)))

    def _rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or len(payload) != 4:
            raise Http2Error(PROTOCOL_ERROR, "a malformed RST_STREAM")
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._forget(stream, cancel=True)
        elif stream_id > self._last_stream_id:
            raise Http2Error(PROTOCOL_ERROR, "RST_STREAM on an idle stream")

    def _goaway(self, flags: int, stream_id: int, payload: memoryview) -> None:
        self._closing = True  # the client opens no more streams; answer the ones it has
        self._close_if_done()

    def _priority(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or len(payload) != 5:
            raise Http2Error(PROTOCOL_ERROR, "a malformed PRIORITY frame")

    def _push_promise(self, flags: int, stream_id: int, payload: memoryview) -> None:
        raise Http2Error(PROTOCOL_ERROR, "a client cannot push")

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise Http2Error(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = _unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise Http2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        self._header_stream = stream_id
        self._header_ends_stream = bool(flags & END_STREAM)
        if len(block) > 4 * self._limits.max_header_list_size:
            raise Http2Error(PROTOCOL_ERROR, "a header block larger than the header list limit")
        if flags & END_HEADERS:
            self._header_block_done(bytes(block))
        else:
            self._header_block = bytearray(block)

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._header_block is None or stream_id != self._header_stream:
            raise Http2Error(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._header_block += payload
        if len(self._header_block) > 4 * self._limits.max_header_list_size:
            raise Http2Error(PROTOCOL_ERROR, "a header block larger than the header list limit")
        if flags & END_HEADERS:
            block, self._header_block = bytes(self._header_block), None
            self._header_block_done(block)

    def _header_block_done(self, block: bytes) -> None:
        stream_id = self._header_stream
        try:
            # Decoded even for a stream about to be refused: the HPACK table is shared by the whole connection. A
            # list over the limit stops the decoder midway, leaving the table unknown: that ends the connection.
            headers = self._decoder.decode(block, raw=False)
        except hpack.OversizedHeaderListError:
            raise Http2Error(PROTOCOL_ERROR, f"headers larger than {self._limits.max_header_list_size} bytes") from None
        except hpack.HPACKError as exc:
            raise Http2Error(COMPRESSION_ERROR, f"undecodable headers: {exc}") from None
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they end its request
            if stream.ended or not self._header_ends_stream:
                self._reset(stream, STREAM_CLOSED if stream.ended else PROTOCOL_ERROR)
                return
            self._end_of_request(stream)
            return
        if stream_id <= self._last_stream_id:
            raise Http2Error(STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self._last_stream_id = stream_id
        if self._closing or len(self._streams) >= self._limits.max_concurrent_streams:
            self._write(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = Stream(stream_id, self, send_window=self._peer_window)
        self._streams[stream_id] = stream
        self.idle.clear()
        stream.headers = headers  # type: ignore[assignment]  # raw=False gives pairs of str
        if self._header_ends_stream:
            self._end_of_request(stream)

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        size = len(payload)
        self._recv_unacked += size
        if self._recv_unacked >= self._limits.connection_window // 2:
            self._write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended:
            if stream_id == 0 or stream_id > self._last_stream_id:
                raise Http2Error(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None:
                self._reset(stream, STREAM_CLOSED)
            return  # a stream we reset or refused: the bytes still counted for the connection window
        data = _unpad(flags, payload)
        if stream.too_large or len(stream.body) + len(data) > self._limits.max_body_bytes:
            stream.body = bytearray()
            stream.too_large = True
        else:
            stream.body += data
        stream.unacked += size
        if flags & END_STREAM:
            self._end_of_request(stream)
        elif stream.unacked >= self._limits.stream_window // 2:
            self._write(_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
            stream.unacked = 0

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise Http2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if len(payload):
                raise Http2Error(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise Http2Error(FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6")
        for i in range(0, len(payload), 6):
            self._setting(*struct.unpack_from(">HI", payload, i))
        self._write(_frame(SETTINGS, ACK, 0, b""))
        self._flush_blocked()

    def _setting(self, key: int, value: int) -> None:
        if key == SETTINGS_INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise Http2Error(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE above 2^31-1")
            delta, self._peer_window = value - self._peer_window, value
            for stream in self._streams.values():
                stream.send_window += delta
        elif key == SETTINGS_MAX_FRAME_SIZE:
            if not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT:
                raise Http2Error(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
            self._peer_max_frame = value
        elif key == SETTINGS_ENABLE_PUSH and value > 1:
            raise Http2Error(PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
        # HEADER_TABLE_SIZE bounds the table our encoder may use: our answers never index, so any size will do.

    def _window_update(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise Http2Error(PROTOCOL_ERROR, "a zero WINDOW_UPDATE")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise Http2Error(FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._flush_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream already done: allowed
        if increment == 0 or stream.send_window + increment > MAX_WINDOW:
            self._reset(stream, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        if stream.id in self._blocked:
            self._flush(stream)

    # -- streams ------------------------------------------------------------------------------------------------------

    def _end_of_request(self, stream: Stream) -> None:
        stream.ended = True
        if stream.unacked:  # the stream is done receiving: nothing to return to its window
            stream.unacked = 0
        stream.task = asyncio.get_running_loop().create_task(self._run(stream))

    async def _run(self, stream: Stream) -> None:
        try:
            await self._on_request(stream)
        except asyncio.CancelledError:
            pass  # reset by the client or the connection closed
        except Exception:
            logger.exception("HTTP/2 request handler failed")
            if not stream.closed:
                self._reset(stream, INTERNAL_ERROR)
        finally:
            if not stream.closed and stream.id not in self._blocked:
                self._reset(stream, INTERNAL_ERROR)  # the handler returned without answering

    def _respond(self, stream: Stream, headers: bytes, body: bytes, trailers: bytes) -> None:
        if stream.closed or self._transport is None:
            return
        out = []
        if headers:
            out.append(_frame(HEADERS, END_HEADERS, stream.id, headers))
        if body:
            stream._pending = memoryview(body)
            stream._trailers = trailers
            data, done = self._take_data(stream)
            out.append(data)
            if not done:  # waits for window: the trailers go after the rest of the body
                self._blocked[stream.id] = stream
                self._write(b"".join(out))
                return
        out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, trailers))
        self._write(b"".join(out))
        self._forget(stream)

    def _take_data(self, stream: Stream) -> tuple[bytes, bool]:
        """DATA frames for as much of the stream's pending body as the windows allow, and whether that was all."""
        pending = stream._pending
        assert pending is not None
        frames = []
        sent = 0
        total = len(pending)
        while sent < total:
            room = min(self._send_window, stream.send_window, self._peer_max_frame, total - sent)
            if room <= 0:
                break
            frames.append(_frame(DATA, 0, stream.id, pending[sent : sent + room]))
            sent += room
            self._send_window -= room
            stream.send_window -= room
        stream._pending = pending[sent:] if sent < total else None
        return b"".join(frames), stream._pending is None

    def _flush(self, stream: Stream) -> None:
        if stream._pending is None:
            return
        data, done = self._take_data(stream)
        if done:
            del self._blocked[stream.id]
            data += _frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream._trailers)
            self._write(data)
            self._forget(stream)
        elif data:
            self._write(data)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._flush(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        if not stream.closed:
            self._write(_frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._forget(stream, cancel=True)

    def _forget(self, stream: Stream, *, cancel: bool = False) -> None:
        stream.closed = True
        self._streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        if cancel and stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if not self._streams:
            self.idle.set()
            self._close_if_done()

    # -- connection ---------------------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def goaway(self) -> None:
        """Begin a graceful close: no new streams; the connection closes when the open ones are answered."""
        if self._transport is None or self._goaway_sent:
            return
        self._goaway_sent = self._closing = True
        self._write(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream_id, NO_ERROR)))
        self._close_if_done()

    def abort(self) -> None:
        """Close now; streams in progress are cancelled."""
        if self._transport is not None:
            self._transport.abort()

    def _close_if_done(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            if not self._goaway_sent:
                self._goaway_sent = True
                self._write(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream_id, NO_ERROR)))
            self._transport.close()

    def _fail(self, code: int, reason: str) -> None:
        logger.warning("HTTP/2 connection error (%s): %s", code, reason)
        if self._transport is not None:
            self._write(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream_id, code) + reason.encode()[:200]))
            self._transport.close()
        self._transport = None
        for stream in list(self._streams.values()):
            self._forget(stream, cancel=True)


_FRAME_HANDLERS: dict[int, Callable[[Http2Connection, int, int, memoryview], None]] = {
    DATA: Http2Connection._data,
    HEADERS: Http2Connection._headers,
    PRIORITY: Http2Connection._priority,
    RST_STREAM: Http2Connection._rst_stream,
    SETTINGS: Http2Connection._settings,
    PUSH_PROMISE: Http2Connection._push_promise,
    PING: Http2Connection._ping,
    GOAWAY: Http2Connection._goaway,
    WINDOW_UPDATE: Http2Connection._window_update,
    CONTINUATION: Http2Connection._continuation,
}


def _frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> bytes:
    return (len(payload) << 8 | kind).to_bytes(4, "big") + bytes((flags,)) + _U32.pack(stream_id) + payload


def _unpad(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload:
        raise Http2Error(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise Http2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
