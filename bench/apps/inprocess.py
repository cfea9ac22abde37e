"""The in-process limit: the same preprocessing and ONNX Runtime call in a loop, no HTTP, no server.

Prints JSON: {"rps": ..., "p50_ms": ..., "p99_ms": ...}. Run pinned to the core the servers get.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import orjson

from bench.apps.common import Predictor


def main(body_path: str, duration_s: float) -> None:
    body = open(body_path, "rb").read()  # noqa: SIM115 - read once
    predictor = Predictor()
    for _ in range(20):
        predictor.label(orjson.loads(body)["data"])
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        t0 = time.perf_counter()
        predictor.label(orjson.loads(body)["data"])  # the JSON parse is part of any request's work
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    result = {
        "rps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(latencies, 50) * 1000),
        "p99_ms": float(np.percentile(latencies, 99) * 1000),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
