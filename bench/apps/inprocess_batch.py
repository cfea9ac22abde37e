"""The in-process limit for imagenet: preprocessing and the engine in a loop, no HTTP, at a given batch size.

    python -m bench.apps.inprocess_batch ENGINE BATCH BODY DURATION_S      (ENGINE: onnx | torchscript)
    python -m bench.apps.inprocess_batch --serve ENGINE BODY               (then lines "BATCH DURATION_S")

Prints JSON {"rps": images per second, "p50_ms": ..., "p99_ms": ...} (latency of one batch), once per measurement.
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


def runner(name: str, body_path: str) -> Any:
    body = open(body_path, "rb").read()  # noqa: SIM115 - read once
    run = engine(name)

    def one_batch(batch: int) -> Any:
        images = [preprocess_image(orjson.loads(body)["data"]) for _ in range(batch)]
        logits = run(np.concatenate(images))
        return np.asarray(logits).argmax(axis=-1)

    warm: set[int] = set()

    def measure(batch: int, duration_s: float) -> dict[str, float]:
        if batch not in warm:
            for _ in range(3):
                one_batch(batch)
            warm.add(batch)
        latencies = []
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            t0 = time.perf_counter()
            one_batch(batch)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        return {
            "rps": len(latencies) * batch / elapsed,
            "p50_ms": float(np.percentile(latencies, 50) * 1000),
            "p99_ms": float(np.percentile(latencies, 99) * 1000),
        }

    return measure


def main(argv: list[str]) -> None:
    if argv[0] == "--serve":
        measure = runner(argv[1], argv[2])
        for line in sys.stdin:
            batch, duration = line.split()
            print(json.dumps(measure(int(batch), float(duration))), flush=True)
        return
    print(json.dumps(runner(argv[0], argv[2])(int(argv[1]), float(argv[3]))))


if __name__ == "__main__":
    main(sys.argv[1:])
