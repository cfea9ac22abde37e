"""The event-loop gRPC server (``pipeserve.server.v2.grpc_server`` over ``http2``) against clients we did not write.

grpcio's own client (what tritonclient and the KServe SDK use) for the gRPC semantics: messages of every size,
concurrency, metadata, deadlines, statuses, compression, cancellation and shutdown. A hand-driven HTTP/2 client
(``hpack`` + raw frames) for the protocol's corners grpcio never shows: pings, tiny flow-control windows,
CONTINUATION and padding, stream limits and malformed input.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import hpack
import pytest

from pipeserve.server.v2.grpc_server import GrpcServer, ServerContext, UnaryMethod
from pipeserve.v2 import http2
from pipeserve.v2._proto import inference_pb2 as pb

pytestmark = pytest.mark.integration


def _same(data: bytes) -> bytes:
    return data


class Handlers:
    """The methods under test; ``cancelled`` records the calls whose handler was cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def echo(self, request: bytes, context: ServerContext) -> bytes:
        return request

    async def big(self, request: bytes, context: ServerContext) -> bytes:
        return b"x" * int(request)

    async def meta(self, request: bytes, context: ServerContext) -> bytes:
        pairs = [(k, v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in context.invocation_metadata()]
        return json.dumps({"metadata": pairs, "remaining": context.time_remaining()}).encode()

    async def sleep(self, request: bytes, context: ServerContext) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(float(request))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"slept"

    async def abort(self, request: bytes, context: ServerContext) -> bytes:
        code, _, details = request.decode().partition(":")
        await context.abort(grpc.StatusCode[code], details)

    async def boom(self, request: bytes, context: ServerContext) -> bytes:
        raise RuntimeError("secret internals")

    async def metadata(self, request: pb.ServerMetadataRequest, context: ServerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="test", version="1")


def _methods(handlers: Handlers) -> dict[str, UnaryMethod]:
    methods = {
        f"/test.T/{name}": UnaryMethod(getattr(handlers, name), bytes, _same)
        for name in ("echo", "big", "meta", "sleep", "abort", "boom")
    }
    methods["/test.T/metadata"] = UnaryMethod(
        handlers.metadata, pb.ServerMetadataRequest.FromString, pb.ServerMetadataResponse.SerializeToString
    )
    return methods


@pytest.fixture
async def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
async def server(handlers: Handlers) -> AsyncIterator[tuple[GrpcServer, int]]:
    server = GrpcServer(_methods(handlers), limits=http2.Http2Limits(max_body_bytes=64 * 1024 * 1024))
    port = await server.start("127.0.0.1", 0)
    yield server, port
    await server.stop(0.5)


@pytest.fixture
async def channel(server: tuple[GrpcServer, int]) -> AsyncIterator[grpc.aio.Channel]:
    options = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server[1]}", options=options) as channel:
        yield channel


def _call(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/test.T/{name}", None, None)


async def _error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- gRPC semantics, with grpcio's client ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 100_000, 20_000_000])
async def test_a_message_of_any_size_round_trips(channel: grpc.aio.Channel, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    assert await _call(channel, "echo")(payload, timeout=30) == payload


async def test_a_response_larger_than_every_window_arrives_whole(channel: grpc.aio.Channel) -> None:
    assert await _call(channel, "big")(b"50000000", timeout=30) == b"x" * 50_000_000


async def test_concurrent_calls_on_one_connection_each_get_their_own_answer(
    channel: grpc.aio.Channel, server: tuple[GrpcServer, int]
) -> None:
    echo = _call(channel, "echo")
    payloads = [f"request {i} ".encode() * (i % 50 + 1) for i in range(400)]
    answers = await asyncio.gather(*(echo(p, timeout=30) for p in payloads))
    assert answers == payloads
    assert server[0].connections == 1


async def test_protobuf_messages_are_decoded_and_encoded(channel: grpc.aio.Channel) -> None:
    call = channel.unary_unary(
        "/test.T/metadata",
        request_serializer=pb.ServerMetadataRequest.SerializeToString,
        response_deserializer=pb.ServerMetadataResponse.FromString,
    )
    assert await call(pb.ServerMetadataRequest(), timeout=5) == pb.ServerMetadataResponse(name="test", version="1")


async def test_metadata_and_the_deadline_reach_the_handler(channel: grpc.aio.Channel) -> None:
    metadata = (("traceparent", "00-abc-def-01"), ("x-tag", "one"), ("blob-bin", b"\x00\xffraw"))
    answer = json.loads(await _call(channel, "meta")(b"", timeout=7, metadata=metadata))
    pairs = dict(answer["metadata"])
    assert pairs["traceparent"] == "00-abc-def-01"
    assert pairs["x-tag"] == "one"
    assert pairs["blob-bin"] == "\x00\xffraw"  # -bin values arrive decoded
    assert not any(key.startswith(":") or key in ("content-type", "grpc-timeout", "te") for key in pairs)
    assert 5 < answer["remaining"] <= 7


async def test_without_a_deadline_time_remaining_is_none(channel: grpc.aio.Channel) -> None:
    assert json.loads(await _call(channel, "meta")(b""))["remaining"] is None


async def test_a_handler_past_the_deadline_is_cancelled(channel: grpc.aio.Channel, handlers: Handlers) -> None:
    error = await _error(_call(channel, "sleep")(b"30", timeout=0.3))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(handlers.cancelled.wait(), 2)


async def test_abort_answers_its_code_and_any_message(channel: grpc.aio.Channel) -> None:
    details = "input 'x' has shape [1, 3]: 100% wrong\nnaïve ✓"
    error = await _error(_call(channel, "abort")(f"INVALID_ARGUMENT:{details}".encode(), timeout=5))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == details
    error = await _error(_call(channel, "abort")(b"RESOURCE_EXHAUSTED:full", timeout=5))
    assert (error.code(), error.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")


async def test_a_handler_that_raises_is_internal_without_its_text(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    error = await _error(_call(channel, "boom")(b"", timeout=5))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (error.details() or "")
    assert "secret internals" in caplog.text  # the traceback is in the server's log
    assert await _call(channel, "echo")(b"still serving", timeout=5) == b"still serving"


async def test_an_unknown_method_is_unimplemented(channel: grpc.aio.Channel) -> None:
    error = await _error(channel.unary_unary("/test.T/nope", None, None)(b"", timeout=5))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/test.T/nope" in (error.details() or "")


async def test_an_undecodable_message_is_invalid_argument(channel: grpc.aio.Channel) -> None:
    error = await _error(channel.unary_unary("/test.T/metadata", None, None)(b"\xff\xff\xff", timeout=5))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_gzip_compressed_requests_are_read(server: tuple[GrpcServer, int]) -> None:
    payload = b"compress me " * 10_000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server[1]}", compression=grpc.Compression.Gzip) as channel:
        assert await _call(channel, "echo")(payload, timeout=5) == payload


async def test_a_request_over_the_size_limit_is_refused_and_the_connection_serves_on(
    handlers: Handlers,
) -> None:
    server = GrpcServer(_methods(handlers), limits=http2.Http2Limits(max_body_bytes=1_000_000))
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            error = await _error(_call(channel, "echo")(b"x" * 2_000_000, timeout=5))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1000000 bytes" in (error.details() or "")
            assert await _call(channel, "echo")(b"small", timeout=5) == b"small"
    finally:
        await server.stop(0.5)


async def test_a_cancelled_call_cancels_its_handler(channel: grpc.aio.Channel, handlers: Handlers) -> None:
    call = _call(channel, "sleep")(b"30", timeout=30)
    await asyncio.wait_for(handlers.started.wait(), 5)
    call.cancel()
    await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_stop_lets_calls_in_progress_finish_and_refuses_new_ones(handlers: Handlers) -> None:
    server = GrpcServer(_methods(handlers))
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = _call(channel, "sleep")(b"0.5", timeout=10)
        await asyncio.wait_for(handlers.started.wait(), 5)
        started = time.monotonic()
        await server.stop(5)
        assert time.monotonic() - started < 4
        assert await call == b"slept"
        error = await _error(_call(channel, "echo")(b"late", timeout=2))
        assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_stop_cancels_what_outlives_the_grace_period(handlers: Handlers) -> None:
    server = GrpcServer(_methods(handlers))
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = _call(channel, "sleep")(b"30", timeout=10)
        await asyncio.wait_for(handlers.started.wait(), 5)
        started = time.monotonic()
        await server.stop(0.2)
        assert time.monotonic() - started < 2
        await asyncio.wait_for(handlers.cancelled.wait(), 2)
        assert (await _error(call)).code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


async def test_a_taken_port_raises_oserror_naming_it(handlers: Handlers) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind gRPC to 127.0.0.1:{port}"):
            await GrpcServer(_methods(handlers)).start("127.0.0.1", port)


# -- HTTP/2 corners, with a hand-driven client ----------------------------------------------------------------------


class RawClient:
    """Just enough HTTP/2 to send chosen frames and read what comes back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        writer.write(http2.PREFACE + client.frame(http2.SETTINGS, 0, 0, payload))
        return client

    @staticmethod
    def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload

    def headers(self, path: str = "/test.T/echo", extra: list[tuple[str, str]] | None = None) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test")]
        return self.encoder.encode([*fields, ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])])

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    async def read_frame(self) -> tuple[int, int, int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(9), 5)
        length = int.from_bytes(head[:3], "big")
        payload = await asyncio.wait_for(self.reader.readexactly(length), 5)
        return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, int, int, bytes]:
        while True:
            frame = await self.read_frame()
            if frame[0] == kind and (stream_id is None or frame[2] == stream_id):
                return frame

    async def answer(self, stream_id: int, window_step: int = 0) -> tuple[bytes, dict[str, str]]:
        """The body and the trailers of ``stream_id`` (returning window as DATA arrives, if ``window_step``)."""
        body = b""
        while True:
            kind, flags, sid, payload = await self.read_frame()
            if sid != stream_id:
                continue
            if kind == http2.DATA:
                body += payload
                if window_step and payload:
                    self.send(
                        self.frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))),
                        self.frame(http2.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", len(payload))),
                    )
            elif kind == http2.HEADERS and flags & http2.END_STREAM:
                return body, {str(k): str(v) for k, v in self.decoder.decode(payload, raw=False)}
            elif kind == http2.HEADERS:
                self.decoder.decode(payload)
            elif kind == http2.RST_STREAM:
                raise AssertionError(f"stream {stream_id} reset: {payload.hex()}")

    async def closed_with(self) -> int:
        """The error code of the GOAWAY the server sent before closing."""
        code = None
        while True:
            try:
                kind, _, _, payload = await self.read_frame()
            except asyncio.IncompleteReadError:
                assert code is not None, "closed without GOAWAY"
                return code
            if kind == http2.GOAWAY:
                code = int.from_bytes(payload[4:8], "big")

    def close(self) -> None:
        self.writer.close()


def _message(data: bytes) -> bytes:
    return b"\x00" + len(data).to_bytes(4, "big") + data


async def test_a_ping_is_answered_with_its_payload(server: tuple[GrpcServer, int]) -> None:
    client = await RawClient.connect(server[1])
    client.send(client.frame(http2.PING, 0, 0, b"12345678"))
    _kind, flags, _, payload = await client.until(http2.PING)
    assert (flags & http2.ACK, payload) == (http2.ACK, b"12345678")
    client.close()


async def test_a_client_with_a_tiny_window_gets_the_answer_in_window_sized_pieces(
    server: tuple[GrpcServer, int],
) -> None:
    client = await RawClient.connect(server[1], {http2.SETTINGS_INITIAL_WINDOW_SIZE: 100})
    client.send(
        client.frame(http2.HEADERS, http2.END_HEADERS, 1, client.headers("/test.T/big")),
        client.frame(http2.DATA, http2.END_STREAM, 1, _message(b"5000")),
    )
    first = await client.until(http2.DATA, 1)
    assert len(first[3]) <= 100  # no more than the window allowed
    client.send(
        client.frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", len(first[3]))),
        client.frame(http2.WINDOW_UPDATE, 0, 1, struct.pack(">I", len(first[3]))),
    )
    rest, trailers = await client.answer(1, window_step=1)
    assert first[3] + rest == _message(b"x" * 5000)
    assert trailers["grpc-status"] == "0"
    client.close()


async def test_continuation_frames_and_padding_are_understood(server: tuple[GrpcServer, int]) -> None:
    client = await RawClient.connect(server[1])
    block = client.headers(extra=[("x-long", "v" * 300)])
    padded = bytes((7,)) + _message(b"padded hello") + b"\x00" * 7
    client.send(
        client.frame(http2.HEADERS, 0, 1, block[:10]),
        client.frame(http2.CONTINUATION, 0, 1, block[10:50]),
        client.frame(http2.CONTINUATION, http2.END_HEADERS, 1, block[50:]),
        client.frame(http2.DATA, http2.PADDED | http2.END_STREAM, 1, padded),
    )
    body, trailers = await client.answer(1)
    assert (body, trailers["grpc-status"]) == (_message(b"padded hello"), "0")
    client.close()


async def test_streams_beyond_the_limit_are_refused_and_the_others_served(handlers: Handlers) -> None:
    server = GrpcServer(_methods(handlers), limits=http2.Http2Limits(max_concurrent_streams=1))
    port = await server.start("127.0.0.1", 0)
    client = await RawClient.connect(port)
    client.send(
        client.frame(http2.HEADERS, http2.END_HEADERS, 1, client.headers("/test.T/sleep")),
        client.frame(http2.DATA, http2.END_STREAM, 1, _message(b"0.2")),
        client.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 3, client.headers()),
    )
    _, _, _, payload = await client.until(http2.RST_STREAM, 3)
    assert struct.unpack(">I", payload)[0] == http2.REFUSED_STREAM
    body, trailers = await client.answer(1)
    assert (body, trailers["grpc-status"]) == (_message(b"slept"), "0")
    client.close()
    await server.stop(0.5)


async def test_a_reset_stream_cancels_its_handler(server: tuple[GrpcServer, int], handlers: Handlers) -> None:
    client = await RawClient.connect(server[1])
    client.send(
        client.frame(http2.HEADERS, http2.END_HEADERS, 1, client.headers("/test.T/sleep")),
        client.frame(http2.DATA, http2.END_STREAM, 1, _message(b"30")),
    )
    await asyncio.wait_for(handlers.started.wait(), 5)
    client.send(client.frame(http2.RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL)))
    await asyncio.wait_for(handlers.cancelled.wait(), 5)
    client.close()


async def test_a_call_without_a_message_is_answered_with_an_error(server: tuple[GrpcServer, int]) -> None:
    client = await RawClient.connect(server[1])
    client.send(client.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, client.headers()))
    _, trailers = await client.answer(1)
    assert trailers["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    client.close()


async def test_a_non_grpc_request_is_refused(server: tuple[GrpcServer, int]) -> None:
    client = await RawClient.connect(server[1])
    block = client.encoder.encode([(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "t")])
    client.send(client.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, block))
    _, trailers = await client.answer(1)
    assert trailers["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    client.close()


@pytest.mark.parametrize(
    ("garbage", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http2.PROTOCOL_ERROR),
        (http2.PREFACE + RawClient.frame(http2.SETTINGS, 0, 0, b"\x00\x01"), http2.FRAME_SIZE_ERROR),
        (http2.PREFACE + RawClient.frame(http2.CONTINUATION, http2.END_HEADERS, 1, b""), http2.PROTOCOL_ERROR),
        (http2.PREFACE + RawClient.frame(http2.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"), http2.PROTOCOL_ERROR),
        (http2.PREFACE + RawClient.frame(http2.HEADERS, http2.END_HEADERS, 2, b"\x82"), http2.PROTOCOL_ERROR),
        (http2.PREFACE + RawClient.frame(http2.HEADERS, http2.END_HEADERS, 1, b"\xff\xff\xff\xff"), None),
    ],
    ids=["http1", "bad-settings", "stray-continuation", "zero-window", "even-stream", "bad-hpack"],
)
async def test_a_protocol_error_closes_the_connection_with_goaway_and_the_server_serves_on(
    server: tuple[GrpcServer, int], channel: grpc.aio.Channel, garbage: bytes, code: int | None
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server[1])
    writer.write(garbage)
    client = RawClient(reader, writer)
    got = await client.closed_with()
    assert got == code if code is not None else got != http2.NO_ERROR
    client.close()
    assert await _call(channel, "echo")(b"fine", timeout=5) == b"fine"


async def test_a_frame_over_the_advertised_size_closes_the_connection(handlers: Handlers) -> None:
    server = GrpcServer(_methods(handlers), limits=http2.Http2Limits(max_frame_size=16_384))
    port = await server.start("127.0.0.1", 0)
    client = await RawClient.connect(port)
    client.send(
        client.frame(http2.HEADERS, http2.END_HEADERS, 1, client.headers()),
        client.frame(http2.DATA, http2.END_STREAM, 1, _message(b"x" * 20_000)),
    )
    assert await client.closed_with() == http2.FRAME_SIZE_ERROR
    client.close()
    await server.stop(0.5)
