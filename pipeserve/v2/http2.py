"""HTTP/2 (RFC 9113, cleartext with prior knowledge) on the event loop: what a gRPC server and client share.

``Http2Endpoint`` is an ``asyncio.Protocol`` that parses frames where the bytes arrive and keeps both directions
of flow control; ``pipeserve.server.v2.http2`` (the inference server's side) and ``pipeserve.remote.http2``
(the preprocessing server's side) add what each end does with a stream. No threads: on a single core, grpcio's
poller and event-engine threads preempted the model several times per request (docs/benchmarks/split.md).

What it implements: the preface and SETTINGS (with ACKs), HEADERS + CONTINUATION with HPACK (the ``hpack``
package decodes; we encode literals that are never indexed, so the peer's table needs no bookkeeping), padded
DATA, both directions of flow control, PING, RST_STREAM, GOAWAY and the errors RFC 9113 asks for. Not: server
push (gRPC does not use it), priorities (ignored, as RFC 9113 allows), TLS and the HTTP/1.1 upgrade (gRPC
clients speak HTTP/2 directly to a cleartext port).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, cast

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
_FRAME_HEADER = struct.Struct(">HHBI")  # length (24 bits, split), type, flags, stream id

Headers = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Http2Limits:
    """What an endpoint accepts from its peer, and advertises.

    Attributes:
        max_concurrent_streams: open streams the peer may start (a server's limit; more are refused).
        stream_window: bytes the peer may send on one stream before we acknowledge them.
        connection_window: the same for the whole connection.
        max_frame_size: the largest frame the peer may send (large frames mean fewer frames per tensor).
        max_header_list_size: the largest decoded header list (metadata).
        max_body_bytes: the largest body of one stream (a larger one is dropped as it arrives; ``too_large``).
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
    """A connection error (section 5.4.1): the endpoint sends GOAWAY with ``code`` and closes."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(slots=True, eq=False)
class Stream:
    """One exchange on a connection, in either role."""

    id: int
    #: The peer's first header block (a request's, or a response's) and, if one came after the body, the second.
    headers: Headers = field(default_factory=list)
    trailers: Headers | None = None
    #: What the peer sent: a view of what was read when it came in one frame, else the frames' payloads joined.
    body: bytearray | memoryview = field(default_factory=bytearray)
    too_large: bool = False  # the body went over ``max_body_bytes`` and was dropped
    ended: bool = False  # the peer sent END_STREAM
    closed: bool = False  # our side is done (sent END_STREAM and the peer's too, or reset)
    send_window: int = DEFAULT_WINDOW
    unacked: int = 0  # received bytes not yet returned to the peer's stream window
    _pending: memoryview | None = None  # our body still to send (waits for window)
    _after: bytes | None = None  # what ends our side once the body is out: a trailer block, or b"" (END_STREAM)


class Http2Endpoint(asyncio.Protocol):
    """One connection. Subclasses decide what a stream means (``_headers_decoded``, ``_stream_ended``)."""

    is_client: ClassVar[bool] = False

    def __init__(self, limits: Http2Limits) -> None:
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface_seen = self.is_client  # only a server reads a preface
        self._streams: dict[int, Stream] = {}
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = limits.max_header_list_size
        self._decoder.max_allowed_table_size = 4096
        self._header_cache: dict[bytes, Headers] = {}
        self._reading_bytes = False  # frames are being parsed from an immutable bytes object (views may be kept)
        self._header_block: bytearray | None = None  # a HEADERS block waiting for its CONTINUATIONs
        self._header_stream = 0
        self._header_ends_stream = False
        self._peer_window = DEFAULT_WINDOW  # the peer's initial stream window (its SETTINGS)
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._peer_max_streams = 2**31 - 1
        self._send_window = DEFAULT_WINDOW  # our connection-level send window
        self._recv_unacked = 0
        self._blocked: dict[int, Stream] = {}  # streams with a body waiting for window

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is not a subclass)
        limits = self._limits
        settings = [
            (SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
            (SETTINGS_MAX_FRAME_SIZE, limits.max_frame_size),
            (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
        ]
        settings.append(
            (SETTINGS_ENABLE_PUSH, 0)
            if self.is_client
            else (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams)
        )
        out = (PREFACE if self.is_client else b"") + frame(
            SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in settings)
        )
        if limits.connection_window > DEFAULT_WINDOW:
            out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(limits.connection_window - DEFAULT_WINDOW))
        self._transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._connection_closed(exc)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        try:
            if not self._preface_seen:
                data = self._preface(data)
            buffer = self._buffer
            if buffer:  # the start of a frame is waiting: complete it in place
                buffer += data
                self._reading_bytes = False
                used = self._frames(buffer)
                del buffer[:used]
            else:  # parse straight from what arrived; keep only an incomplete last frame
                self._reading_bytes = True
                used = self._frames(data)
                if used < len(data) and self._transport is not None:
                    buffer += memoryview(data)[used:]
        except Http2Error as exc:
            self._fail(exc.code, str(exc))
        except Exception:  # a bug here must not leave the peer hanging
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

    # -- what subclasses decide ----------------------------------------------------------------------------------------

    def _headers_decoded(self, stream_id: int, headers: Headers, ends_stream: bool) -> None:
        raise NotImplementedError

    def _stream_ended(self, stream: Stream) -> None:
        """The peer sent END_STREAM on ``stream``: its headers, body (and trailers) are complete."""
        raise NotImplementedError

    def _stream_reset(self, stream: Stream, code: int) -> None:
        """The peer reset ``stream`` (it is already forgotten)."""

    def _peer_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The peer sent GOAWAY: no new streams; ones above ``last_stream_id`` were never processed."""

    def _connection_closed(self, exc: Exception | None) -> None:
        """The connection is gone (closed by either side, or failed)."""

    def _stream_done(self, stream: Stream) -> None:
        """``stream`` is forgotten (done or reset)."""

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
            self._write(frame(PING, ACK, 0, bytes(payload)))
        else:
            self._ping_acked(bytes(payload))

    def _ping_acked(self, payload: bytes) -> None:
        """The peer answered one of our PINGs."""

    def _rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or len(payload) != 4:
            raise Http2Error(PROTOCOL_ERROR, "a malformed RST_STREAM")
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._forget(stream)
            self._stream_reset(stream, _U32.unpack(payload)[0])
        elif self._is_idle(stream_id):
            raise Http2Error(PROTOCOL_ERROR, "RST_STREAM on an idle stream")

    def _goaway(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0 or len(payload) < 8:
            raise Http2Error(PROTOCOL_ERROR, "a malformed GOAWAY")
        last, code = struct.unpack_from(">II", payload)
        self._peer_goaway(last & 0x7FFFFFFF, code, bytes(payload[8:]))

    def _priority(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or len(payload) != 5:
            raise Http2Error(PROTOCOL_ERROR, "a malformed PRIORITY frame")

    def _push_promise(self, flags: int, stream_id: int, payload: memoryview) -> None:
        raise Http2Error(PROTOCOL_ERROR, "PUSH_PROMISE: push is not enabled")

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise Http2Error(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = unpad(flags, payload)
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
        try:
            headers = self._decode(block)
        except hpack.OversizedHeaderListError:
            # The decoder stopped midway, leaving the connection's table unknown: the connection cannot go on.
            raise Http2Error(PROTOCOL_ERROR, f"headers larger than {self._limits.max_header_list_size} bytes") from None
        except hpack.HPACKError as exc:
            raise Http2Error(COMPRESSION_ERROR, f"undecodable headers: {exc}") from None
        self._headers_decoded(self._header_stream, headers, self._header_ends_stream)

    def _decode(self, block: bytes) -> Headers:
        """Decode a header block (always: the HPACK table is the connection's, even for a stream to be refused).

        A peer repeating itself sends the same bytes again: grpcio's client, a block of one-byte references to
        table entries; our own endpoints, literals that are never indexed. Blocks that cannot change the table are
        remembered, until one that may change it arrives.
        """
        cached = self._header_cache.get(block)
        if cached is not None:
            return cached
        headers: Headers = self._decoder.decode(block, raw=False)  # type: ignore[assignment]
        if _leaves_table_alone(block):
            if len(self._header_cache) < 64:
                self._header_cache[block] = headers
        elif self._header_cache:
            self._header_cache.clear()  # the table may have changed: the same bytes may mean other headers now
        return headers

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        size = len(payload)
        self._recv_unacked += size
        if self._recv_unacked >= self._limits.connection_window // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended:
            if stream_id == 0 or self._is_idle(stream_id):
                raise Http2Error(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None:
                self._reset(stream, STREAM_CLOSED)
            return  # a stream already reset or refused: the bytes still counted for the connection window
        data = unpad(flags, payload)
        if stream.too_large or len(stream.body) + len(data) > self._limits.max_body_bytes:
            stream.body = bytearray()
            stream.too_large = True
        elif not stream.body and flags & END_STREAM and self._reading_bytes:
            stream.body = data[:]  # all of it in one frame of an immutable read: a view (a slice outlives the frame)
        else:
            if isinstance(stream.body, memoryview):
                stream.body = bytearray(stream.body)
            stream.body += data
        stream.unacked += size
        if flags & END_STREAM:
            self._peer_ended(stream)
        elif stream.unacked >= self._limits.stream_window // 2:
            self._write(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
            stream.unacked = 0

    def _peer_ended(self, stream: Stream) -> None:
        stream.ended = True
        stream.unacked = 0  # done receiving: nothing more to return to its window
        self._stream_ended(stream)

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
        self._write(frame(SETTINGS, ACK, 0, b""))
        self._flush_blocked()
        self._settings_applied()

    def _settings_applied(self) -> None:
        """The peer's SETTINGS are in force (a client may now use the stream limit it announced)."""

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
        elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
            self._peer_max_streams = value
        elif key == SETTINGS_ENABLE_PUSH and (value > 1 or (value == 1 and self.is_client)):
            raise Http2Error(PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
        # HEADER_TABLE_SIZE bounds the table our encoder may use: we never index, so any size will do.

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

    def _is_idle(self, stream_id: int) -> bool:
        """A stream id that was never opened (by either side)."""
        raise NotImplementedError

    # -- sending ------------------------------------------------------------------------------------------------------

    def _send(self, stream: Stream, headers: bytes, body: bytes | memoryview, after: bytes | None) -> None:
        """Send a header block (skipped if empty), a body within the windows, then end our side: with the trailer
        block ``after``, or (``after`` None) with END_STREAM on the body's last frame. The rest waits for window.
        What goes out now is written in one piece, the body copied once.
        """
        if stream.closed or self._transport is None:
            return
        out: list[bytes | memoryview] = []
        ends = after is None
        if headers:
            flags = END_HEADERS | (END_STREAM if ends and not body else 0)
            out.append(frame(HEADERS, flags, stream.id, headers))
        if body:
            stream._pending = memoryview(body)
            stream._after = b"" if after is None else after
            if not self._take_data(stream, out):  # the rest goes as the peer's windows open
                self._blocked[stream.id] = stream
                self._write(b"".join(out))
                return
        elif after is not None:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, after))
        self._write(b"".join(out))
        self._sent_all(stream)

    def _sent_all(self, stream: Stream) -> None:
        """Our side of ``stream`` is out (END_STREAM sent)."""

    def _take_data(self, stream: Stream, out: list[bytes | memoryview]) -> bool:
        """Append to ``out`` DATA frames (headers and views of the body) for as much of the pending body as the
        windows allow; whether that was all of it (then the frames end our side: END_STREAM on the last, or the
        trailer block after it)."""
        pending = stream._pending
        assert pending is not None
        sent = 0
        total = len(pending)
        while sent < total:
            room = min(self._send_window, stream.send_window, self._peer_max_frame, total - sent)
            if room <= 0:
                break
            last = sent + room == total
            flags = END_STREAM if last and stream._after == b"" else 0
            out.append(frame_header(DATA, flags, stream.id, room))
            out.append(pending[sent : sent + room])
            sent += room
            self._send_window -= room
            stream.send_window -= room
        if sent < total:
            stream._pending = pending[sent:]
            return False
        stream._pending = None
        if stream._after:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream._after))
        return True

    def _flush(self, stream: Stream) -> None:
        if stream._pending is None:
            return
        out: list[bytes | memoryview] = []
        done = self._take_data(stream, out)
        if out:
            self._write(b"".join(out))
        if done:
            del self._blocked[stream.id]
            self._sent_all(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._flush(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        if not stream.closed:
            self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        stream.closed = True
        self._streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        self._stream_done(stream)

    # -- connection ---------------------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def _fail(self, code: int, reason: str) -> None:
        logger.warning("HTTP/2 connection error (%s): %s", code, reason)
        if self._transport is not None:
            last = self._last_peer_stream()
            self._write(frame(GOAWAY, 0, 0, struct.pack(">II", last, code) + reason.encode()[:200]))
            self._transport.close()
        self._transport = None
        self._connection_closed(Http2Error(code, reason))

    def _last_peer_stream(self) -> int:
        """The highest stream id the peer opened that we processed (for GOAWAY)."""
        return 0


_FRAME_HANDLERS: dict[int, Callable[[Http2Endpoint, int, int, memoryview], None]] = {
    DATA: Http2Endpoint._data,
    HEADERS: Http2Endpoint._headers,
    PRIORITY: Http2Endpoint._priority,
    RST_STREAM: Http2Endpoint._rst_stream,
    SETTINGS: Http2Endpoint._settings,
    PUSH_PROMISE: Http2Endpoint._push_promise,
    PING: Http2Endpoint._ping,
    GOAWAY: Http2Endpoint._goaway,
    WINDOW_UPDATE: Http2Endpoint._window_update,
    CONTINUATION: Http2Endpoint._continuation,
}


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> bytes:
    """One frame: its 9-byte header and ``payload``."""
    return frame_header(kind, flags, stream_id, len(payload)) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """The 9-byte header of a frame whose payload is ``length`` bytes."""
    return _FRAME_HEADER.pack(length >> 8, (length & 0xFF) << 8 | kind, flags, stream_id)


def unpad(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload:
        raise Http2Error(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise Http2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


# -- HPACK: literals that are never indexed (RFC 7541 section 6.2.2), so no table needs keeping in step ----------------


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
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


def literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, with a new name."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(raw_name), 7) + raw_name + hpack_int(len(raw_value), 7) + raw_value


def _leaves_table_alone(block: bytes) -> bool:
    """Whether decoding ``block`` leaves the HPACK table as it was: only indexed fields and literals without
    indexing or never indexed (no incremental indexing, no table size update)."""
    position, size = 0, len(block)
    while position < size:
        first = block[position]
        if first & 0x80:  # indexed field: an integer with a 7-bit prefix
            position = _skip_int(block, position, 7)
        elif first & 0xE0 in (0x00, 0x10):  # literal without indexing / never indexed: 4-bit name index
            name_index = first & 0x0F
            position = _skip_int(block, position, 4)
            if name_index == 0:
                position = _skip_string(block, position)
            position = _skip_string(block, position)
        else:  # 0x40: incremental indexing; 0x20: a table size update
            return False
    return True


def _skip_int(block: bytes, position: int, prefix_bits: int) -> int:
    if block[position] & ((1 << prefix_bits) - 1) != (1 << prefix_bits) - 1:
        return position + 1
    position += 1
    while position < len(block) and block[position] & 0x80:
        position += 1
    return position + 1


def _skip_string(block: bytes, position: int) -> int:
    if position >= len(block):
        return position
    start = position
    length = block[position] & 0x7F
    if length == 0x7F:
        length, shift = 0x7F, 0
        position += 1
        while position < len(block):
            byte = block[position]
            length += (byte & 0x7F) << shift
            shift += 7
            position += 1
            if not byte & 0x80:
                break
        return position + length
    return start + 1 + length
