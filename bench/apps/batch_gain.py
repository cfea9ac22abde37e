"""How much faster per image ONNX Runtime runs batches of 2 than of 1, on one hot tensor and on fresh ones.

The split and batching benchmarks' limit runs one tensor over and over (hot in the cache). A server's batches are
made of requests that arrived in fresh memory, concatenated per batch; this measures whether the batch-2 gain
survives that. Interleaved 1 s slices (hot b1, hot b2, fresh b1, fresh b2) per round; prints the medians.

    BENCH_MODEL=imagenet taskset -c 0 .venv/bin/python -m bench.apps.batch_gain TENSOR.npy [ROUNDS]

TENSOR.npy: one preprocessed image (bench/split.py writes one; or np.save(preprocess_image(...))).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np

from bench.apps.common import session


def main(argv: list[str]) -> None:
    onnx = session()
    name = onnx.get_inputs()[0].name
    one = np.load(argv[0])
    rounds = int(argv[1]) if len(argv) > 1 else 16
    hot = {size: np.ascontiguousarray(np.repeat(one, size, axis=0)) for size in (1, 2)}
    requests = [one + np.uint8(i) for i in range(64)]  # distinct tensors, as a server's requests are
    taken = 0

    def rate(size: int, fresh: bool, duration_s: float = 1.0) -> float:
        nonlocal taken
        images = 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            batch: Any = hot[size]
            if fresh:
                batch = np.concatenate([requests[(taken + j) % len(requests)].copy() for j in range(size)])
                taken += size
            onnx.run(None, {name: batch})
            images += size
        return images / (time.perf_counter() - started)

    for size in (1, 2):
        for _ in range(3):
            onnx.run(None, {name: hot[size]})
    gains: dict[str, list[float]] = {"hot": [], "fresh": []}
    for _ in range(rounds):
        hot1, hot2, fresh1, fresh2 = rate(1, False), rate(2, False), rate(1, True), rate(2, True)
        gains["hot"].append(hot2 / hot1)
        gains["fresh"].append(fresh2 / fresh1)
    for kind, values in gains.items():
        ordered = sorted(values)
        print(
            f"batch 2 vs 1, {kind:5} tensors: x{statistics.median(values):.3f} "
            f"(middle half x{ordered[len(ordered) // 4]:.3f}-x{ordered[(3 * len(ordered)) // 4]:.3f}, {rounds} rounds)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
