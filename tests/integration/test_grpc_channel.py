"""The event-loop gRPC client (``pipeserve.remote.grpc_channel``) against our server and against grpcio's.

grpcio's aio server is the reference peer: it advertises grpc-core's windows (64 KiB per stream until its BDP
probe grows them), uses its own HPACK table and answers PINGs, so flow control, header decoding and keepalive
are tested against software we did not write.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
import uvloop

from pipeserve.remote.grpc_channel import GrpcChannel
from pipeserve.server.v2.grpc_server import GrpcServer, UnaryMethod
from pipeserve.v2 import grpc_wire
from pipeserve.v2.http2 import Http2Limits

pytestmark = pytest.mark.integration


class Handlers:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def echo(self, request: bytes, context: Any) -> bytes:
        return bytes(request)

    async def big(self, request: bytes, context: Any) -> bytes:
        return b"y" * int(bytes(request))

    async def meta(self, request: bytes, context: Any) -> bytes:
        pairs = [(k, v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in context.invocation_metadata()]
        return json.dumps({"metadata": pairs, "remaining": context.time_remaining()}).encode()

    async def sleep(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(float(bytes(request)))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"slept"

    async def fail(self, request: bytes, context: Any) -> bytes:
        code, _, details = bytes(request).decode().partition(":")
        await context.abort(grpc.StatusCode[code], details)
        raise AssertionError("abort raises")


NAMES = ("echo", "big", "meta", "sleep", "fail")


async def _ours(handlers: Handlers, limits: Http2Limits | None = None) -> tuple[Any, int]:
    server = GrpcServer(
        {f"/t.T/{name}": UnaryMethod(getattr(handlers, name), bytes, bytes) for name in NAMES}, limits=limits
    )
    return server, await server.start("127.0.0.1", 0)


async def _grpcio(handlers: Handlers) -> tuple[Any, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30)])
    methods = {name: grpc.unary_unary_rpc_method_handler(getattr(handlers, name)) for name in NAMES}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture(params=["ours", "grpcio"])
async def target(request: pytest.FixtureRequest, handlers: Handlers) -> AsyncIterator[str]:
    server, port = await (_ours if request.param == "ours" else _grpcio)(handlers)
    yield f"127.0.0.1:{port}"
    await server.stop(0.5)


@pytest.fixture
async def channel(target: str) -> AsyncIterator[GrpcChannel]:
    channel = GrpcChannel(target)
    yield channel
    await channel.close()


async def _status(call: Awaitable[Any]) -> grpc_wire.GrpcWireError:
    with pytest.raises(grpc_wire.GrpcWireError) as info:
        await call
    return info.value


@pytest.mark.parametrize("size", [0, 1, 150_528, 20_000_000])
async def test_a_message_of_any_size_round_trips(channel: GrpcChannel, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"q" * (size % 256)
    assert bytes(await channel.unary("/t.T/echo", payload, timeout_s=30)) == payload


async def test_an_answer_larger_than_the_windows_arrives_whole(channel: GrpcChannel) -> None:
    assert bytes(await channel.unary("/t.T/big", b"30000000", timeout_s=30)) == b"y" * 30_000_000


async def test_concurrent_calls_share_one_connection_and_each_get_their_own_answer(channel: GrpcChannel) -> None:
    payloads = [f"call {i} ".encode() * (i % 40 + 1) for i in range(300)]
    answers = await asyncio.gather(*(channel.unary("/t.T/echo", p, timeout_s=30) for p in payloads))
    assert [bytes(a) for a in answers] == payloads


async def test_metadata_and_the_deadline_travel(channel: GrpcChannel) -> None:
    metadata = (("traceparent", "00-abc-def-01"), ("X-Tag", "one"), ("blob-bin", b"\x00\xffraw"))
    answer = json.loads(bytes(await channel.unary("/t.T/meta", b"", timeout_s=7, metadata=metadata)))
    pairs = dict(answer["metadata"])
    assert pairs["traceparent"] == "00-abc-def-01"
    assert pairs["x-tag"] == "one", "metadata keys are lower case on the wire"
    assert pairs["blob-bin"] == "\x00\xffraw"
    assert 5 < answer["remaining"] <= 7.1


async def test_a_status_and_its_message_reach_the_caller(channel: GrpcChannel) -> None:
    details = "input 'x' has shape [1, 3]: 100% wrong\nnaïve ✓"
    error = await _status(channel.unary("/t.T/fail", f"INVALID_ARGUMENT:{details}".encode(), timeout_s=5))
    assert (error.code, error.code_name, error.details) == (grpc_wire.INVALID_ARGUMENT, "INVALID_ARGUMENT", details)
    error = await _status(channel.unary("/t.T/nope", b"", timeout_s=5))
    assert error.code == grpc_wire.UNIMPLEMENTED
    assert bytes(await channel.unary("/t.T/echo", b"after", timeout_s=5)) == b"after"


async def test_the_deadline_ends_the_call_and_the_server_stops_working_on_it(
    channel: GrpcChannel, handlers: Handlers
) -> None:
    started = time.monotonic()
    error = await _status(channel.unary("/t.T/sleep", b"30", timeout_s=0.3))
    assert error.code == grpc_wire.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 2
    await asyncio.wait_for(handlers.cancelled.wait(), 5)
    assert bytes(await channel.unary("/t.T/echo", b"next", timeout_s=5)) == b"next"


async def test_a_caller_that_goes_away_cancels_the_call_on_the_server(channel: GrpcChannel, handlers: Handlers) -> None:
    call = asyncio.ensure_future(channel.unary("/t.T/sleep", b"30", timeout_s=30))
    await asyncio.wait_for(handlers.started.wait(), 5)
    call.cancel()
    await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_nobody_listening_is_unavailable_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    channel = GrpcChannel(f"127.0.0.1:{port}")
    started = time.monotonic()
    error = await _status(channel.unary("/t.T/echo", b"x", timeout_s=5))
    assert error.code == grpc_wire.UNAVAILABLE
    assert "cannot connect" in error.details
    assert time.monotonic() - started < 1
    await channel.close()


async def test_a_restarted_server_is_reached_again(handlers: Handlers) -> None:
    server, port = await _ours(handlers)
    channel = GrpcChannel(f"127.0.0.1:{port}")
    assert bytes(await channel.unary("/t.T/echo", b"1", timeout_s=5)) == b"1"
    await server.stop(0.5)
    error = await _status(channel.unary("/t.T/echo", b"2", timeout_s=5))
    assert error.code == grpc_wire.UNAVAILABLE
    again = GrpcServer({f"/t.T/{name}": UnaryMethod(getattr(handlers, name), bytes, bytes) for name in NAMES})
    await again.start("127.0.0.1", port)
    try:
        assert bytes(await channel.unary("/t.T/echo", b"3", timeout_s=5)) == b"3"
    finally:
        await channel.close()
        await again.stop(0.5)


async def test_calls_in_progress_finish_when_the_server_goes_away_gracefully(handlers: Handlers) -> None:
    server, port = await _ours(handlers)
    channel = GrpcChannel(f"127.0.0.1:{port}")
    call = asyncio.ensure_future(channel.unary("/t.T/sleep", b"0.3", timeout_s=10))
    await asyncio.wait_for(handlers.started.wait(), 5)
    await server.stop(5)  # GOAWAY, then waits for the call in progress
    assert bytes(await call) == b"slept"
    await channel.close()


async def test_more_calls_than_the_servers_stream_limit_wait_for_room(handlers: Handlers) -> None:
    server, port = await _ours(handlers, Http2Limits(max_concurrent_streams=2))
    channel = GrpcChannel(f"127.0.0.1:{port}")
    try:
        await channel.unary("/t.T/echo", b"settings", timeout_s=5)  # the server's SETTINGS are in
        answers = await asyncio.gather(*(channel.unary("/t.T/sleep", b"0.05", timeout_s=10) for _ in range(8)))
        assert [bytes(a) for a in answers] == [b"slept"] * 8, "none refused"
    finally:
        await channel.close()
        await server.stop(0.5)


async def test_a_server_that_stops_answering_is_found_out_by_keepalive() -> None:
    """A peer that accepted the connection and then went silent (a frozen or vanished host): the PING gets no
    answer and the call fails UNAVAILABLE long before its deadline."""

    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read(-1)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = GrpcChannel(f"127.0.0.1:{port}", keepalive_s=0.2, keepalive_timeout_s=0.2)
    started = time.monotonic()
    error = await _status(channel.unary("/t.T/echo", b"x", timeout_s=30))
    assert error.code == grpc_wire.UNAVAILABLE
    assert "keepalive" in error.details
    assert time.monotonic() - started < 3
    await channel.close()
    for writer in writers:
        writer.close()
    server.close()
    await server.wait_closed()


def test_it_runs_on_uvloop_as_the_rest_servers_do() -> None:
    async def main() -> bytes:
        handlers = Handlers()
        server, port = await _ours(handlers)
        channel = GrpcChannel(f"127.0.0.1:{port}")
        try:
            return bytes(await channel.unary("/t.T/echo", b"on uvloop", timeout_s=5))
        finally:
            await channel.close()
            await server.stop(0.5)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == b"on uvloop"
