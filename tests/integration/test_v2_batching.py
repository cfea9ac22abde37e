"""An inference server on one core: a model runs on the event loop, a request alone at once, requests that arrive
together in batches (the native gRPC server counts the calls it has received before any of them runs)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeserve.pipeline.loader import load_spec
from pipeserve.remote.clients import GrpcClient
from pipeserve.server.v2 import start_grpc_server
from pipeserve.service.models import ModelRepository, ModelService

SPEC = """
pipeline:
  name: one-core
  input: {kind: tensor, shape: [-1, 2]}
  nodes:
  - name: model
    model_load_meta: {runtime: 'tests.fakes:SlowRuntime', artifact: weights.bin, options: {delay_s: 0.004}}
    batching: {max_batch_size: 4, max_latency_ms: 0}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def one_core(tmp_path: Path) -> AsyncIterator[tuple[Any, GrpcClient]]:
    """The model's runtime (it records its batches and threads) and a client whose first call has warmed it."""
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "pipeline.yaml").write_text(SPEC)
    service = ModelService(ModelRepository.from_spec(load_spec(tmp_path)), warmup_runs=1, worker_threads=1)
    await service.start()
    port = _free_port()
    server = await start_grpc_server(service, "127.0.0.1", port)
    client = GrpcClient(f"grpc://127.0.0.1:{port}")
    try:
        _, node = service.ready_node("model")
        assert node.runs_on_loop, "one core, a fast model: on the event loop"
        fake: Any = node.runtime
        await client.infer("model", "", {"input": np.zeros((1, 2), np.float32)}, None, 5.0)
        fake.batches.clear()
        fake.threads.clear()
        yield fake, client
    finally:
        await client.close()
        await server.stop(None)
        await service.stop(grace_s=2.0)


async def test_a_request_alone_runs_at_once_on_the_event_loop(one_core: tuple[Any, GrpcClient]) -> None:
    fake, client = one_core
    for i in range(5):
        outputs, _ = await client.infer("model", "", {"input": np.full((1, 2), i, np.float32)}, None, 5.0)
        assert outputs["output"].tolist() == [[float(i), float(i)]]
    assert fake.batches == [1] * 5
    assert fake.threads == [threading.current_thread().name] * 5


async def test_requests_that_arrive_together_run_in_batches(one_core: tuple[Any, GrpcClient]) -> None:
    fake, client = one_core
    calls = [client.infer("model", "", {"input": np.full((1, 2), i, np.float32)}, None, 5.0) for i in range(12)]
    answers = await asyncio.gather(*calls)
    assert [outputs["output"].tolist() for outputs, _ in answers] == [[[float(i), float(i)]] for i in range(12)]
    assert sum(fake.batches) == 12
    assert max(fake.batches) > 1, f"calls sent together were batched: {fake.batches}"
    assert max(fake.batches) <= 4
