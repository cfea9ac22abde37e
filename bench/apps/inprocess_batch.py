"""The in-process limit for imagenet: preprocessing and the engine in a loop, no HTTP, at a given batch size.

    python -m bench.apps.inprocess_batch ENGINE BATCH BODY DURATION_S      (ENGINE: onnx | torchscript)

Prints JSON {"rps": images per second, "p50_ms": ..., "p99_ms": ...} (latency of one batch).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import orjson

from bench.apps.common import SPEC_DIR, preprocess_image, session


def engine(name: str) -> Any:
    if name == "onnx":
        onnx = session()
        input_name = onnx.get_inputs()[0].name
        return lambda x: onnx.run(None, {input_name: x})[0]
    import torch

    torch.set_num_threads(1)
    embedding = torch.jit.load(str(SPEC_DIR / "models" / "embedding.pt"))  # type: ignore[no-untyped-call]
    head = torch.jit.load(str(SPEC_DIR / "models" / "classifier.pt"))  # type: ignore[no-untyped-call]

    def run(x: np.ndarray[Any, Any]) -> Any:
        with torch.inference_mode():
            return head(embedding(torch.from_numpy(x))).numpy()

    return run


def main(name: str, batch: int, body_path: str, duration_s: float) -> None:
    body = open(body_path, "rb").read()  # noqa: SIM115 - read once
    run = engine(name)

    def one_batch() -> Any:
        images = [preprocess_image(orjson.loads(body)["data"]) for _ in range(batch)]
        logits = run(np.concatenate(images))
        return np.asarray(logits).argmax(axis=-1)

    for _ in range(5):
        one_batch()
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        t0 = time.perf_counter()
        one_batch()
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "rps": len(latencies) * batch / elapsed,
                "p50_ms": float(np.percentile(latencies, 50) * 1000),
                "p99_ms": float(np.percentile(latencies, 99) * 1000),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
