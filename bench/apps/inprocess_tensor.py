"""The in-process limit of an inference server: ONNX Runtime on an already preprocessed tensor, no transport.

    python -m bench.apps.inprocess_tensor TENSOR.npy BATCH DURATION_S

Prints JSON {"rps": images per second, "p50_ms", "p99_ms"} (latency of one batch).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from bench.apps.common import session


def main(tensor_path: str, batch: int, duration_s: float) -> None:
    onnx = session()
    name = onnx.get_inputs()[0].name
    tensor = np.ascontiguousarray(np.repeat(np.load(tensor_path), batch, axis=0))
    for _ in range(5):
        onnx.run(None, {name: tensor})
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        t0 = time.perf_counter()
        onnx.run(None, {name: tensor})
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    print(
        json.dumps(
            {
                "rps": len(ordered) * batch / elapsed,
                "p50_ms": ordered[len(ordered) // 2] * 1000,
                "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
