"""The client side of an HTTP/2 connection (``pipeserve.v2.http2``): requests out, each answer into its future.

A call opens a stream (odd ids, within the server's stream limit), sends its header block and body within the
server's flow-control windows, and awaits ``ClientStream.answered``: resolved when the server ends the stream,
failed when it resets it, sends GOAWAY below the stream's id, or the connection goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeserve.v2.http2 import (
    CANCEL,
    NO_ERROR,
    PING,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    Headers,
    Http2Endpoint,
    Http2Error,
    Http2Limits,
    Stream,
    frame,
)

logger = logging.getLogger(__name__)

#: What a client accepts: answers up to 1 GiB, windows large enough that a tensor never waits for an update.
CLIENT_LIMITS = Http2Limits(max_body_bytes=(1 << 30) + 5)


class StreamFailed(Exception):
    """A stream ended without an answer. ``retryable``: the server never processed it (safe to send again)."""

    def __init__(self, reason: str, *, code: int | None = None, retryable: bool = False) -> None:
        super().__init__(reason)
        self.code = code
        self.retryable = retryable


@dataclass(slots=True, eq=False)
class ClientStream(Stream):
    """A request; ``answered`` resolves once the server's headers, body and trailers are all in."""

    answered: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    sent: bool = False  # our END_STREAM is out


class Http2ClientConnection(Http2Endpoint):
    """One connection to a server. ``request(headers, body)`` opens a stream; ``cancel(stream)`` resets it."""

    is_client = True

    def __init__(self, limits: Http2Limits = CLIENT_LIMITS, on_close: Callable[[], None] | None = None) -> None:
        super().__init__(limits)
        self._next_id = 1
        self._on_close = on_close
        self._room = asyncio.Event()  # set while another stream may open
        self._room.set()
        self.closed = False
        self.reason = ""
        self._goaway_last: int | None = None
        self.last_received = 0.0  # loop time of the last bytes from the server
        self._pings: dict[bytes, asyncio.Future[None]] = {}
        self._ping_counter = 0

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def usable(self) -> bool:
        """Open, and not told to stop opening streams."""
        return not self.closed and self._goaway_last is None and self._transport is not None

    async def wait_for_room(self) -> None:
        """Until the server's stream limit lets one more stream open."""
        while len(self._streams) >= self._peer_max_streams:
            self._room.clear()
            await self._room.wait()
            if not self.usable:
                return

    def request(self, headers: bytes, body: bytes | memoryview) -> ClientStream:
        """Open a stream and send ``headers`` and ``body`` (ending our side). Raises ``StreamFailed`` (retryable)
        if the connection cannot take new streams."""
        if not self.usable:
            raise StreamFailed(self.reason or "the connection is closing", retryable=True)
        stream = ClientStream(self._next_id, send_window=self._peer_window)
        self._next_id += 2
        self._streams[stream.id] = stream
        self._send(stream, headers, body, None)
        return stream

    def cancel(self, stream: ClientStream) -> None:
        """Reset a stream whose answer is no longer wanted (deadline, caller gone)."""
        if not stream.closed:
            self._reset(stream, CANCEL)
        self._settle(stream, StreamFailed("cancelled", code=CANCEL))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self, reason: str) -> None:
        """Drop the connection now (a server that stopped answering): every open stream fails."""
        self.reason = reason
        if self._transport is not None:
            self._transport.abort()

    async def ping(self, timeout_s: float) -> bool:
        """Whether the server answers a PING within ``timeout_s``."""
        self._ping_counter += 1
        payload = self._ping_counter.to_bytes(8, "big")
        answered = asyncio.get_running_loop().create_future()
        self._pings[payload] = answered
        self._write(frame(PING, 0, 0, payload))
        try:
            await asyncio.wait_for(answered, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._pings.pop(payload, None)
        return True

    def data_received(self, data: bytes) -> None:
        self.last_received = asyncio.get_running_loop().time()
        super().data_received(data)

    def _ping_acked(self, payload: bytes) -> None:
        answered = self._pings.get(payload)
        if answered is not None and not answered.done():
            answered.set_result(None)

    # -- Http2Endpoint ------------------------------------------------------------------------------------------------

    def _headers_decoded(self, stream_id: int, headers: Headers, ends_stream: bool) -> None:
        if stream_id % 2 == 0:
            raise Http2Error(PROTOCOL_ERROR, f"the server sent HEADERS on stream {stream_id} (push is not enabled)")
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id >= self._next_id:
                raise Http2Error(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, never opened")
            return  # an answer to a stream we reset: too late
        if not stream.headers:
            stream.headers = headers
            if ends_stream:  # trailers-only: the one block carries the status
                stream.trailers = headers
        else:
            stream.trailers = headers
        if ends_stream:
            self._peer_ended(stream)

    def _is_idle(self, stream_id: int) -> bool:
        return stream_id >= self._next_id

    def _stream_ended(self, stream: Stream) -> None:
        assert isinstance(stream, ClientStream)
        if not stream.sent:
            # The server answered before taking the whole request (an error, typically): stop sending the rest.
            self._reset(stream, NO_ERROR)
        else:
            self._forget(stream)
        self._settle(stream, None)

    def _sent_all(self, stream: Stream) -> None:
        assert isinstance(stream, ClientStream)
        stream.sent = True
        if stream.ended:
            self._forget(stream)

    def _stream_reset(self, stream: Stream, code: int) -> None:
        assert isinstance(stream, ClientStream)
        self._settle(
            stream,
            StreamFailed(
                f"the server reset the stream (HTTP/2 error {code})", code=code, retryable=code == REFUSED_STREAM
            ),
        )

    def _stream_done(self, stream: Stream) -> None:
        self._room.set()
        if self._goaway_last is not None and not self._streams:
            self.close()  # draining after GOAWAY: the last answer is in

    def _peer_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self._goaway_last = last_stream_id
        self.reason = (
            f"the server is going away (GOAWAY {code}{': ' + debug.decode(errors='replace') if debug else ''})"
        )
        for stream in [s for s in self._streams.values() if s.id > last_stream_id]:
            self._forget(stream)
            self._settle(stream, StreamFailed(self.reason, retryable=True))  # never processed: safe to resend
        self._room.set()
        if not self._streams:
            self.close()

    def _connection_closed(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.reason:
            self.reason = f"the connection closed ({exc})" if exc else "the connection closed"
        for stream in list(self._streams.values()):
            self._forget(stream)
            self._settle(stream, StreamFailed(self.reason, retryable=not stream.headers))
        self._room.set()
        if self._on_close is not None:
            self._on_close()

    @staticmethod
    def _settle(stream: Stream, error: Exception | None) -> None:
        assert isinstance(stream, ClientStream)
        if stream.answered.done():
            return
        if error is None:
            stream.answered.set_result(None)
        else:
            stream.answered.set_exception(error)
            stream.answered.exception()  # retrieved here: a caller that went away will not look
