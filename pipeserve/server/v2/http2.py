"""The server side of an HTTP/2 connection (``pipeserve.v2.http2``): requests in, each run as a task, answers out.

A request whose stream has ended is handed to ``on_request`` as a task; its answer (headers, body, trailers) is
written in one go, within the client's flow-control windows. A RST_STREAM cancels the stream's task; GOAWAY
(sent on shutdown, or received) lets the streams in progress finish and then closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pipeserve import _eager
from pipeserve.v2.http2 import (
    GOAWAY,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    Headers,
    Http2Endpoint,
    Http2Error,
    Http2Limits,
    Stream,
    frame,
)

__all__ = ["Http2Connection", "Http2Limits", "RequestHandler", "ServerStream"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class ServerStream(Stream):
    """A request and its answer. ``headers`` are the request's (pseudo-headers included)."""

    connection: Http2Connection | None = None
    task: asyncio.Task[None] | None = None

    def respond(self, headers: bytes, body: bytes, trailers: bytes) -> None:
        """Answer: an encoded header block, a body (may be empty) and an encoded trailer block. ``headers`` empty
        means a trailers-only answer (``trailers`` then carries the status too)."""
        assert self.connection is not None
        self.connection._send(self, headers, body, trailers)

    def reset(self, code: int = INTERNAL_ERROR) -> None:
        assert self.connection is not None
        self.connection._reset(self, code)


RequestHandler = Callable[[ServerStream], Coroutine[Any, Any, None]]


class Http2Connection(Http2Endpoint):
    """One client connection. ``on_request(stream)`` runs once a stream's request has fully arrived: at once, up
    to its first wait (a task finishes it), after every frame of the bytes that brought it has been read."""

    #: Bytes read from the socket at a time (asyncio's default is 256 KB): a read takes every request waiting
    #: (uint8 images are 150 KB each), so that those that arrived together are seen together and can be batched,
    #: and fewer of them straddle two reads (which costs a copy).
    READ_SIZE = 4 * 1024 * 1024

    def __init__(
        self, on_request: RequestHandler, limits: Http2Limits, on_close: Callable[[Http2Connection], None]
    ) -> None:
        super().__init__(limits)
        self._on_request = on_request
        self._on_close = on_close
        self._last_stream_id = 0
        self._goaway_sent = False
        self._closing = False
        self._arrived: list[ServerStream] = []
        #: Requests fully received and not answered yet (started or about to be).
        self.open_calls = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(getattr(transport, "max_size", None), int):  # asyncio's selector transport reads this much
            transport.max_size = self.READ_SIZE  # type: ignore[attr-defined]
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        arrived, self._arrived = self._arrived, []
        for stream in arrived:
            if not stream.closed:  # a RST_STREAM in the same bytes
                stream.task = _eager.start(self._run(stream))
            else:
                self.open_calls -= 1

    def _headers_decoded(self, stream_id: int, headers: Headers, ends_stream: bool) -> None:
        if stream_id % 2 == 0:
            raise Http2Error(PROTOCOL_ERROR, f"a client opened stream {stream_id} (even ids are the server's)")
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they end its request
            if stream.ended or not ends_stream:
                self._reset(stream, STREAM_CLOSED if stream.ended else PROTOCOL_ERROR)
                return
            stream.trailers = headers
            self._peer_ended(stream)
            return
        if stream_id <= self._last_stream_id:
            raise Http2Error(STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self._last_stream_id = stream_id
        if self._closing or len(self._streams) >= self._limits.max_concurrent_streams:
            self._write(frame(RST_STREAM, 0, stream_id, struct.pack(">I", REFUSED_STREAM)))
            return
        # The headers may be shared with other streams (the decoder's cache): read, never changed.
        stream = ServerStream(stream_id, headers, send_window=self._peer_window, connection=self)
        self._streams[stream_id] = stream
        self.idle.clear()
        if ends_stream:
            self._peer_ended(stream)

    def _is_idle(self, stream_id: int) -> bool:
        return stream_id > self._last_stream_id

    def _last_peer_stream(self) -> int:
        return self._last_stream_id

    def _stream_ended(self, stream: Stream) -> None:
        assert isinstance(stream, ServerStream)
        # Started once all the bytes read with it are parsed: requests that arrived together count each other.
        self.open_calls += 1
        self._arrived.append(stream)

    async def _run(self, stream: ServerStream) -> None:
        try:
            await self._on_request(stream)
        except asyncio.CancelledError:
            pass  # reset by the client or the connection closed
        except Exception:
            logger.exception("HTTP/2 request handler failed")
            if not stream.closed:
                self._reset(stream, INTERNAL_ERROR)
        finally:
            self.open_calls -= 1
            if not stream.closed and stream.id not in self._blocked:
                self._reset(stream, INTERNAL_ERROR)  # the handler returned without answering

    def _sent_all(self, stream: Stream) -> None:
        self._forget(stream)  # the request was complete before the answer started: the stream is done

    def _stream_reset(self, stream: Stream, code: int) -> None:
        self._cancel(stream)

    def _stream_done(self, stream: Stream) -> None:
        if not self._streams:
            self.idle.set()
            self._close_if_done()

    def _reset(self, stream: Stream, code: int) -> None:
        super()._reset(stream, code)
        self._cancel(stream)

    @staticmethod
    def _cancel(stream: Stream) -> None:
        task = stream.task if isinstance(stream, ServerStream) else None
        if task is not None and not task.done():
            task.cancel()

    def _peer_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self._closing = True  # the client opens no more streams; answer the ones it has
        self._close_if_done()

    def _connection_closed(self, exc: Exception | None) -> None:
        for stream in list(self._streams.values()):
            self._forget(stream)
            self._cancel(stream)
        self._on_close(self)

    def goaway(self) -> None:
        """Begin a graceful close: no new streams; the connection closes when the open ones are answered."""
        if self._transport is None or self._goaway_sent:
            return
        self._goaway_sent = self._closing = True
        self._write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream_id, NO_ERROR)))
        self._close_if_done()

    def abort(self) -> None:
        """Close now; streams in progress are cancelled."""
        if self._transport is not None:
            self._transport.abort()

    def _close_if_done(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            if not self._goaway_sent:
                self._goaway_sent = True
                self._write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream_id, NO_ERROR)))
            self._transport.close()
