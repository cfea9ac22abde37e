"""RemoteModels: least-in-flight balancing, retries elsewhere, taking endpoints out and back, the release check."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from pipeserve.errors import DeadlineExceeded, InvalidInput, NotReady, Overloaded
from pipeserve.pipeline.context import request_deadline
from pipeserve.remote.clients import EndpointDown, ModelInfo, V2Client, parse_endpoint
from pipeserve.remote.pool import ReleaseMismatch, RemoteModels
from pipeserve.types import Signature, TensorDict, TensorSpec
from pipeserve.v2 import RELEASE_PARAMETER

RELEASE = "f00dfeedc0ffee00"
SIGNATURE = Signature((TensorSpec("input", "FP32", (-1, 4)),), (TensorSpec("output", "FP32", (-1, 3)),))
INPUTS: TensorDict = {"input": np.zeros((1, 4), np.float32)}


class FakeClient(V2Client):
    """An endpoint that answers from its attributes: ``fail`` (raised by infer), ``release``, ``is_ready``."""

    def __init__(self, url: str, *, release: str | None = RELEASE, delay_s: float = 0.0) -> None:
        super().__init__(url)
        self.release = release
        self.delay_s = delay_s
        self.fail: Exception | None = None
        self.is_ready = True
        self.calls = 0
        self.closed = False

    def _parameters(self) -> dict[str, Any]:
        return {} if self.release is None else {RELEASE_PARAMETER: self.release}

    async def ready(self, timeout_s: float) -> bool:
        return self.is_ready

    async def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        return ModelInfo(SIGNATURE, self._parameters())

    async def infer(
        self, model: str, version: str, inputs: TensorDict, outputs: list[str] | None, timeout_s: float
    ) -> tuple[TensorDict, dict[str, Any]]:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        return {"output": np.full((1, 3), float(self.calls)), "url": np.array([self.url])}, self._parameters()

    async def close(self) -> None:
        self.closed = True


class DownClient(FakeClient):
    """Refuses everything until ``recovered`` is set, like a server that is being restarted."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.recovered = False

    async def ready(self, timeout_s: float) -> bool:
        if not self.recovered:
            raise EndpointDown("UNAVAILABLE: connection refused")
        return True


Factory = Callable[..., Awaitable[RemoteModels]]


@pytest.fixture
async def make_pool() -> AsyncIterator[Factory]:
    """``make_pool(client, client, ..., **options)``: a started pool whose endpoints use the given fake clients."""
    pools: list[RemoteModels] = []

    async def make(*clients: FakeClient, **options: Any) -> RemoteModels:
        options.setdefault("expected_release", RELEASE)
        options.setdefault("probe_interval_s", 60.0)
        pool = RemoteModels([c.url for c in clients], **options)
        for endpoint, client in zip(pool.endpoints, clients, strict=True):
            endpoint._client = client
        await pool.start()
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.stop()


async def wait_for(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- balancing -----------------------------------------------------------------------------------------------------


async def test_concurrent_requests_spread_over_both_up_endpoints_by_calls_in_flight(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1", delay_s=0.05), FakeClient("grpc://b:2", delay_s=0.05)
    pool = await make_pool(a, b)

    await asyncio.gather(*(pool.infer("m", "", INPUTS, None) for _ in range(6)))

    assert (a.calls, b.calls) == (3, 3)
    assert [e.in_flight for e in pool.endpoints] == [0, 0]


async def test_a_request_goes_to_the_endpoint_with_fewer_calls_in_flight(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    pool = await make_pool(a, b)
    pool.endpoints[0].in_flight = 2  # a is busy with other requests

    for _ in range(3):
        await pool.infer("m", "", INPUTS, None)

    assert (a.calls, b.calls) == (0, 3)


async def test_sequential_requests_alternate_between_equally_idle_endpoints(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    pool = await make_pool(a, b)

    urls = [str((await pool.infer("m", "", INPUTS, None))["url"][0]) for _ in range(4)]

    assert sorted(urls) == ["grpc://a:1", "grpc://a:1", "grpc://b:2", "grpc://b:2"]


# --- retries and taking endpoints out ------------------------------------------------------------------------------


async def test_an_endpoint_down_is_taken_out_and_the_request_retried_on_the_other(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    a.fail = EndpointDown("UNAVAILABLE: connection reset")
    pool = await make_pool(a, b)

    for _ in range(3):
        outputs = await pool.infer("m", "", INPUTS, None)
        assert outputs["url"][0] == "grpc://b:2"

    assert a.calls == 1  # tried once, then out of the rotation
    assert b.calls == 3
    down = pool.endpoints[0]
    assert not down.up
    assert down.reason == "UNAVAILABLE: connection reset"
    assert pool.unavailable_reason() is None
    assert pool.describe()["endpoints"][0] == {
        "url": "grpc://a:1",
        "up": False,
        "reason": "UNAVAILABLE: connection reset",
    }


async def test_all_endpoints_down_is_not_ready_naming_every_endpoint_and_reason(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("http://b:2")
    a.fail = EndpointDown("UNAVAILABLE: connection refused")
    b.fail = EndpointDown("HTTP 503: model 'm' version 1 is not ready: unloaded")
    pool = await make_pool(a, b)

    with pytest.raises(NotReady) as info:
        await pool.infer("m", "", INPUTS, None)

    message = str(info.value)
    assert "no inference endpoint is available" in message
    assert "grpc://a:1: UNAVAILABLE: connection refused" in message
    assert "http://b:2: HTTP 503: model 'm' version 1 is not ready: unloaded" in message
    assert (a.calls, b.calls) == (1, 1)


async def test_endpoints_that_never_came_up_are_not_ready_without_any_call(make_pool: Factory) -> None:
    a, b = DownClient("grpc://a:1"), DownClient("grpc://b:2")
    pool = await make_pool(a, b)

    with pytest.raises(NotReady, match=r"grpc://a:1: UNAVAILABLE: connection refused; grpc://b:2: UNAVAILABLE"):
        await pool.infer("m", "", INPUTS, None)

    assert (a.calls, b.calls) == (0, 0)


async def test_overloaded_on_every_endpoint_raises_overloaded_and_keeps_them_up(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    a.fail = Overloaded("grpc://a:1 is overloaded: queue full", retry_after_s=1.0)
    b.fail = Overloaded("grpc://b:2 is overloaded: queue full", retry_after_s=1.0)
    pool = await make_pool(a, b)

    with pytest.raises(Overloaded, match="is overloaded"):
        await pool.infer("m", "", INPUTS, None)

    assert (a.calls, b.calls) == (1, 1)
    assert all(e.up for e in pool.endpoints)
    assert [e.in_flight for e in pool.endpoints] == [0, 0]


async def test_an_overloaded_endpoint_is_skipped_for_another_that_answers(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    a.fail = Overloaded("busy")
    pool = await make_pool(a, b)
    pool.endpoints[1].in_flight = 1  # a is picked first

    outputs = await pool.infer("m", "", INPUTS, None)

    assert outputs["url"][0] == "grpc://b:2"
    assert pool.endpoints[0].up


async def test_an_error_of_the_request_itself_is_not_retried_elsewhere(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    a.fail = b.fail = InvalidInput("the inference server rejected the input: bad shape")
    pool = await make_pool(a, b)

    with pytest.raises(InvalidInput, match="bad shape"):
        await pool.infer("m", "", INPUTS, None)

    assert a.calls + b.calls == 1
    assert all(e.up for e in pool.endpoints)


# --- the release check ---------------------------------------------------------------------------------------------


async def test_a_response_from_another_release_takes_the_endpoint_out_naming_both_fingerprints(
    make_pool: Factory,
) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    pool = await make_pool(a, b)
    a.release = "0123456789abcdef"  # redeployed behind our back, after the probe
    pool.endpoints[1].in_flight = 1  # a is picked first

    outputs = await pool.infer("m", "", INPUTS, None)

    assert outputs["url"][0] == "grpc://b:2"  # a's answer is thrown away
    endpoint = pool.endpoints[0]
    assert not endpoint.up
    assert "release mismatch" in endpoint.reason
    assert "0123456789abcdef" in endpoint.reason
    assert RELEASE in endpoint.reason
    assert "grpc://a:1" in endpoint.reason


async def test_a_response_without_a_fingerprint_is_a_mismatch_under_the_fingerprint_check(make_pool: Factory) -> None:
    a = FakeClient("grpc://a:1")
    pool = await make_pool(a)
    a.release = None

    with pytest.raises(NotReady, match=r"release none \(not a pipeserve inference server"):
        await pool.infer("m", "", INPUTS, None)


async def test_the_probe_keeps_an_endpoint_of_another_release_out(make_pool: Factory) -> None:
    a = FakeClient("grpc://a:1", release="0123456789abcdef")
    pool = RemoteModels([a.url], expected_release=RELEASE, probe_interval_s=60.0)
    pool.endpoints[0]._client = a
    pool._models[("m", "")] = SIGNATURE  # a model the pipeline calls

    await pool.start()
    try:
        assert not pool.endpoints[0].up
        assert "0123456789abcdef" in pool.endpoints[0].reason
        assert RELEASE in pool.endpoints[0].reason
    finally:
        await pool.stop()


async def test_signature_checks_the_release_and_takes_a_mismatched_endpoint_out(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    pool = await make_pool(a, b)
    a.release = "0123456789abcdef"

    assert await pool.signature("m", "") == SIGNATURE
    assert not pool.endpoints[0].up


async def test_the_golden_release_check_accepts_a_missing_fingerprint(make_pool: Factory) -> None:
    a = FakeClient("grpc://a:1", release=None)  # MLServer or Triton: no fingerprint
    pool = await make_pool(a, release_check="golden")

    assert await pool.signature("m", "") == SIGNATURE
    outputs = await pool.infer("m", "", INPUTS, None)

    assert outputs["output"].shape == (1, 3)
    assert pool.endpoints[0].up


def test_release_mismatch_is_an_endpoint_down() -> None:
    assert issubclass(ReleaseMismatch, EndpointDown)


# --- probing -------------------------------------------------------------------------------------------------------


async def test_the_probe_brings_a_recovered_endpoint_back(make_pool: Factory) -> None:
    a = DownClient("grpc://a:1")
    pool = await make_pool(a, probe_interval_s=0.05)
    assert not pool.endpoints[0].up
    assert (
        pool.unavailable_reason() == "no inference endpoint is available: grpc://a:1: UNAVAILABLE: connection refused"
    )

    a.recovered = True
    await wait_for(lambda: pool.endpoints[0].up)

    assert pool.endpoints[0].reason == ""
    assert (await pool.infer("m", "", INPUTS, None))["url"][0] == "grpc://a:1"


async def test_an_endpoint_taken_out_by_a_request_comes_back_once_it_answers_again(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    a.fail = EndpointDown("UNAVAILABLE: restarting")
    pool = await make_pool(a, b, probe_interval_s=0.05)
    await pool.infer("m", "", INPUTS, None)
    assert not pool.endpoints[0].up

    a.fail = None
    await wait_for(lambda: pool.endpoints[0].up)


async def test_a_server_that_says_it_is_not_ready_stays_out(make_pool: Factory) -> None:
    a = FakeClient("grpc://a:1")
    a.is_ready = False
    pool = await make_pool(a, probe_interval_s=0.05)
    await asyncio.sleep(0.15)  # several probes
    assert not pool.endpoints[0].up
    assert pool.endpoints[0].reason == "the server says it is not ready"


async def test_stop_closes_the_clients(make_pool: Factory) -> None:
    a = FakeClient("grpc://a:1")
    pool = await make_pool(a)
    await pool.stop()
    assert a.closed


# --- deadlines -----------------------------------------------------------------------------------------------------


async def test_an_expired_request_deadline_raises_without_calling_any_endpoint(make_pool: Factory) -> None:
    a, b = FakeClient("grpc://a:1"), FakeClient("grpc://b:2")
    pool = await make_pool(a, b)
    token = request_deadline.set(time.monotonic() - 0.001)
    try:
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await pool.infer("m", "", INPUTS, None)
    finally:
        request_deadline.reset(token)

    assert (a.calls, b.calls) == (0, 0)
    assert all(e.up for e in pool.endpoints)
    assert [e.in_flight for e in pool.endpoints] == [0, 0]


async def test_the_call_timeout_is_cut_to_the_requests_remaining_time(make_pool: Factory) -> None:
    seen: list[float] = []

    class Recording(FakeClient):
        async def infer(self, *args: Any) -> tuple[TensorDict, dict[str, Any]]:
            seen.append(args[-1])
            return await super().infer(*args)

    pool = await make_pool(Recording("grpc://a:1"), call_timeout_s=30.0)
    token = request_deadline.set(time.monotonic() + 2.0)
    try:
        await pool.infer("m", "", INPUTS, None)
    finally:
        request_deadline.reset(token)
    await pool.infer("m", "", INPUTS, None)

    assert 1.0 < seen[0] <= 2.0
    assert seen[1] == 30.0


# --- construction and endpoint URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("grpc://infer-0:8001", ("grpc", "grpc://infer-0:8001")),
        ("infer-0:8001", ("grpc", "grpc://infer-0:8001")),
        ("127.0.0.1:8001", ("grpc", "grpc://127.0.0.1:8001")),
        ("http://infer-0:8000", ("http", "http://infer-0:8000")),
        ("http://infer-0:8000/", ("http", "http://infer-0:8000")),
    ],
)
def test_parse_endpoint_accepts_grpc_bare_and_http_urls(url: str, parsed: tuple[str, str]) -> None:
    assert parse_endpoint(url) == parsed


@pytest.mark.parametrize(
    "url", ["ftp://infer-0:8001", "https://infer-0:8000", "grpc://infer-0", "infer-0", "http://:8000", "grpc://h:port"]
)
def test_parse_endpoint_rejects_other_schemes_and_a_missing_port(url: str) -> None:
    with pytest.raises(ValueError, match="is not grpc://HOST:PORT or http://HOST:PORT") as info:
        parse_endpoint(url)
    assert repr(url) in str(info.value)


def test_a_pool_rejects_a_malformed_endpoint_at_construction() -> None:
    with pytest.raises(ValueError, match="ftp://"):
        RemoteModels(["grpc://a:1", "ftp://b:2"])


def test_a_pool_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RemoteModels([])
