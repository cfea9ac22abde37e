"""The in-process limit of an inference server: ONNX Runtime on an already preprocessed tensor, no transport.

    python -m bench.apps.inprocess_tensor TENSOR.npy BATCH DURATION_S
    python -m bench.apps.inprocess_tensor --serve TENSOR.npy      (then lines "BATCH DURATION_S" on stdin)

Prints JSON {"rps": images per second, "p50_ms", "p99_ms"} (latency of one batch), once per measurement.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.apps.common import session


def runner(tensor_path: str) -> Callable[[int, float], dict[str, float]]:
    onnx = session()
    name = onnx.get_inputs()[0].name
    one = np.load(tensor_path)
    batches: dict[int, Any] = {}

    def measure(batch: int, duration_s: float) -> dict[str, float]:
        if batch not in batches:
            batches[batch] = np.ascontiguousarray(np.repeat(one, batch, axis=0))
            for _ in range(3):
                onnx.run(None, {name: batches[batch]})
        tensor = batches[batch]
        latencies = []
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            t0 = time.perf_counter()
            onnx.run(None, {name: tensor})
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        ordered = sorted(latencies)
        return {
            "rps": len(ordered) * batch / elapsed,
            "p50_ms": ordered[len(ordered) // 2] * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        }

    return measure


def main(argv: list[str]) -> None:
    if argv[0] == "--serve":
        measure = runner(argv[1])
        for line in sys.stdin:
            batch, duration = line.split()
            print(json.dumps(measure(int(batch), float(duration))), flush=True)
        return
    print(json.dumps(runner(argv[0])(int(argv[1]), float(argv[2]))))


if __name__ == "__main__":
    main(sys.argv[1:])
