"""What an engine's first run after a change of input shape costs: EfficientNet-Lite0 in ONNX Runtime on one core,
CPU ms per image at batch sizes run steadily and alternately (why adaptive batching's size trials do not count the
first batch of each block, pipeserve/batching/policy.py ``SizeTrial``).

    .venv/bin/python -m bench.shape_switch [--repeats 3] [--core 0]      (or: make bench-shape-switch)
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import time
from pathlib import Path

import numpy as np

BODY = Path(__file__).resolve().parent.parent / "examples" / "imagenet" / "samples" / "cat.jpg"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the one core to run on")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    os.environ["BENCH_MODEL"] = "imagenet"  # read when bench.apps.common is imported
    from bench.apps.common import preprocess_image, session

    engine = session()
    name = engine.get_inputs()[0].name
    image = preprocess_image(base64.b64encode(BODY.read_bytes()).decode())
    inputs = {size: np.concatenate([image] * size) for size in (1, 2, 4)}

    def run(size: int) -> float:
        started = time.thread_time()
        engine.run(None, {name: inputs[size]})
        return (time.thread_time() - started) / size * 1000

    def pattern(sizes: list[int], images: int) -> dict[int, float]:
        times: dict[int, list[float]] = {}
        for _ in range(images // sum(sizes)):
            for size in sizes:
                times.setdefault(size, []).append(run(size))
        return {size: statistics.median(values) for size, values in times.items()}

    for size in inputs:
        for _ in range(5):
            run(size)  # warm: the first runs at a new shape allocate
    pattern([1], 60)  # and the first steady stretch after the warm-up ran slower in both runs made (5.0 ms, not 4.5)
    print("| repeat | steady 1 | steady 2 | 1 after 2 | 2 after 1 | steady 4 | 2 after 4 | 4 after 2 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for repeat in range(args.repeats):
        one, two, four = pattern([1], 60)[1], pattern([2], 60)[2], pattern([4], 60)[4]
        mixed, wide = pattern([1, 2], 90), pattern([2, 4], 120)
        cells = [one, two, mixed[1], mixed[2], four, wide[2], wide[4]]
        print(f"| {repeat + 1} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |", flush=True)
    print("\nCPU ms per image (median); 'x after y': batches of x and y in turn, so that each x follows a y.")


if __name__ == "__main__":
    main()
