"""A closed-loop load generator for a v2 inference server: N concurrent callers sending one preprocessed tensor.

    python -m bench.apps.v2_load PROTOCOL TARGET MODEL TENSOR.npy CONCURRENCY DURATION_S
    python -m bench.apps.v2_load --serve PROTOCOL TARGET MODEL TENSOR.npy   (then lines "CONCURRENCY DURATION_S")
        PROTOCOL: grpc-native (TARGET host:port; pipeserve's gRPC client, what a preprocessing server uses)
                  | grpc (the same client on grpc.aio's channel, ``--grpc-client grpcio``)
                  | http (TARGET http://host:port; aiohttp with Triton's binary tensor extension, the request
                    encoded once)

The gRPC callers do what a preprocessing server does per call: encode the tensor into a request, decode the answer's
tensors. Prints JSON {"rps", "p50_ms", "p99_ms", "errors"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from pipeserve.v2.rest_codec import HEADER_LENGTH, encode_infer_request


async def grpc_caller(target: str, model: str, tensor: np.ndarray[Any, Any], engine: str = "grpcio") -> Any:
    from pipeserve.remote.clients import GrpcClient

    client = GrpcClient(f"grpc://{target}", engine)  # type: ignore[arg-type]

    async def once() -> None:
        outputs, _ = await client.infer(model, "", {"input": tensor}, None, 60)
        if not outputs:
            raise RuntimeError("an answer without outputs")

    once.close = client.close  # type: ignore[attr-defined]
    return once


async def native_caller(target: str, model: str, tensor: np.ndarray[Any, Any]) -> Any:
    return await grpc_caller(target, model, tensor, "native")


CALLERS = {"grpc": "grpc_caller", "grpc-native": "native_caller", "http": "http_caller"}


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

    once.close = session.close  # type: ignore[attr-defined]
    return once


async def measure(once: Any, concurrency: int, duration_s: float) -> dict[str, Any]:
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
    ordered = sorted(latencies) or [float("nan")]
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "errors": errors,
    }


async def main(protocol: str, target: str, model: str, tensor_path: str, concurrency: int, duration_s: float) -> None:
    once = await globals()[CALLERS[protocol]](target, model, np.load(tensor_path))
    for _ in range(5):
        await once()
    print(json.dumps(await measure(once, concurrency, duration_s)))
    await _close(once)


async def _close(once: Any) -> None:
    close = getattr(once, "close", None)
    if close is not None:
        await close()


async def serve(protocol: str, target: str, model: str, tensor_path: str) -> None:
    """Measure on request: lines "CONCURRENCY DURATION_S" on stdin, one JSON line each on stdout."""
    once = await globals()[CALLERS[protocol]](target, model, np.load(tensor_path))
    for _ in range(5):
        await once()
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        concurrency, duration = line.split()
        print(json.dumps(await measure(once, int(concurrency), float(duration))), flush=True)
    await _close(once)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        asyncio.run(serve(*sys.argv[2:6]))
    else:
        protocol, target, model, tensor, concurrency, duration = sys.argv[1:7]
        asyncio.run(main(protocol, target, model, tensor, int(concurrency), float(duration)))
