"""A closed-loop load generator for a v2 inference server: N concurrent callers sending one preprocessed tensor.

    python -m bench.apps.v2_load PROTOCOL TARGET MODEL TENSOR.npy CONCURRENCY DURATION_S
        PROTOCOL: grpc (TARGET host:port) | http (TARGET http://host:port; Triton's binary tensor extension)

The request is encoded once (the client's own cost is not what is measured). Prints JSON
{"rps", "p50_ms", "p99_ms", "errors"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from pipeserve.v2 import grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.grpc_service import MESSAGE_OPTIONS, SERVICE
from pipeserve.v2.rest_codec import HEADER_LENGTH, encode_infer_request


async def grpc_caller(target: str, model: str, tensor: np.ndarray[Any, Any]) -> Any:
    import grpc

    channel = grpc.aio.insecure_channel(target, options=MESSAGE_OPTIONS)
    request = grpc_codec.build_request(model, "", {"input": tensor}).SerializeToString()
    call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=None, response_deserializer=None)

    async def once() -> None:
        pb.ModelInferResponse.FromString(await call(request, timeout=60))

    return once


async def http_caller(target: str, model: str, tensor: np.ndarray[Any, Any]) -> Any:
    import aiohttp

    body, json_size = encode_infer_request({"input": tensor}, binary=True)
    headers = {HEADER_LENGTH: str(json_size), "content-type": "application/octet-stream"}
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = f"{target}/v2/models/{model}/infer"

    async def once() -> None:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")

    return once


async def main(protocol: str, target: str, model: str, tensor_path: str, concurrency: int, duration_s: float) -> None:
    tensor = np.load(tensor_path)
    once = await (grpc_caller if protocol == "grpc" else http_caller)(target, model, tensor)
    for _ in range(5):
        await once()
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + duration_s

    async def caller() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                await once()
            except Exception:  # noqa: BLE001 - counted and reported
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    print(
        json.dumps(
            {
                "rps": len(ordered) / elapsed,
                "p50_ms": ordered[len(ordered) // 2] * 1000,
                "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
                "errors": errors,
            }
        )
    )


if __name__ == "__main__":
    protocol, target, model, tensor, concurrency, duration = sys.argv[1:7]
    asyncio.run(main(protocol, target, model, tensor, int(concurrency), float(duration)))
