"""Where a saturated imagenet server's time goes, per image: the engine against everything else, next to the same
split of the in-process loop (preprocessing, engine) at batch 1 and 2.

The server (pinned to one core, batching on and off) runs at concurrency 32 from bench/apps/http_load.py on the
other core; its core is busy all the time, so one image costs it 1 / req/s. The engine's share comes from its own
metrics: ``pipeserve_batch_run_seconds`` over the rows batched (batching on) or the classifier node's latency
(batching off). The rest (HTTP, preprocessing, the pipeline's nodes, the log line) is the difference. The loop
times preprocessing and the engine call separately. A third server, bench/apps/bare_batch_app.py (uvicorn, a bare
ASGI callable and a 20-line greedy batcher of 2, nothing else), shows what HTTP and batching cost at the least.
Slices of every contender alternate, so that the machine's drift (10-20% within a minute here) spreads over all of
them; the table shows medians.

    .venv/bin/python -m bench.request_cost [--rounds 6] [--slice 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.batching import bodies, spec_variant
from bench.paired import LoopProcess, pinned_module, settle
from bench.run import ROOT, only_running, server

NAMES = {
    "on": "pipeserve, batching on (c={c})",
    "off": "pipeserve, batching off (c={c})",
    "bare": "bare ASGI + greedy batcher of 2 (c={c})",
}


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_counters(url: str, kind: str) -> tuple[float, float]:
    """(engine seconds, images) the classifier has run so far, on a pipeserve server (batching ``on`` or ``off``)
    or on the bare batching app (``bare``)."""
    if kind == "bare":
        stats = httpx.get(url + "/stats", timeout=10).json()
        return stats["engine_s"], stats["images"]
    text = httpx.get(url + "/metrics", timeout=10).text
    if kind == "on":
        return (
            _metric(text, "pipeserve_batch_run_seconds_sum", model="classifier"),
            _metric(text, "pipeserve_batch_size_sum", model="classifier"),
        )
    return (
        _metric(text, "pipeserve_node_latency_seconds_sum", node="classifier"),
        _metric(text, "pipeserve_node_latency_seconds_count", node="classifier"),
    )


class Loop:
    """The in-process loop, in this process: one session and one body for every slice."""

    def __init__(self, body_path: Path) -> None:
        from bench.apps.common import session

        self.body = body_path.read_bytes()
        self.onnx = session()
        self.input_name = self.onnx.get_inputs()[0].name

    def split(self, batch: int, duration_s: float) -> tuple[float, float]:
        """(preprocessing ms, engine ms) per image at ``batch``, for ``duration_s``."""
        from bench.apps.common import preprocess_image

        pre = run = 0.0
        images = 0
        end = time.perf_counter() + duration_s
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            x = np.concatenate([preprocess_image(orjson.loads(self.body)["data"]) for _ in range(batch)])
            t1 = time.perf_counter()
            self.onnx.run(None, {self.input_name: x})[0].argmax(-1)
            run += time.perf_counter() - t1
            pre += t1 - t0
            images += batch
        return pre / images * 1000, run / images * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slice", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.server_core})  # the loop runs here, on the servers' core
    os.environ["BENCH_MODEL"] = "imagenet"
    rows: dict[str, list[tuple[float, float]]] = {}  # name -> [(engine ms, rest ms) per image]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        body = bodies(workdir)["json"]
        example = ROOT / "examples" / "imagenet"
        urls = {}
        for kind in ("on", "off"):
            spec = spec_variant(example, workdir / f"spec-{kind}", onnx_batching=kind == "on", ts_batching=False)
            command = pinned_module(args.server_core, "pipeserve.cli.main", "serve", str(spec), "--port", "{port}")
            urls[kind] = stack.enter_context(
                server(f"request-cost-{kind}", command, {"PIPESERVE_ACCESS_LOG": "true"}, "/health/ready", workdir)
            )
        bare = pinned_module(
            args.server_core, "uvicorn", "bench.apps.bare_batch_app:app", "--port", "{port}", "--no-access-log"
        )
        env = {"BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)}
        bare_env = {**env, "BENCH_MAX_BATCH": "2"}
        urls["bare"] = stack.enter_context(server("request-cost-bare", bare, bare_env, "/health", workdir))
        loads = {
            kind: LoopProcess(
                pinned_module(args.client_core, "bench.apps.http_load", "--serve", url + "/predict/label", str(body)),
                env,
                ROOT,
            )
            for kind, url in urls.items()
        }
        for kind, url in urls.items():
            only_running(url)
            loads[kind].measure(8, 3)
        loop = Loop(body)
        for size in (1, 2):
            loop.split(size, 1.0)  # warm: the first runs at a new batch shape allocate
        try:
            for round_ in range(args.rounds):
                order: list[Any] = ["on", "off", "bare", 1, 2]
                for which in order if round_ % 2 == 0 else reversed(order):
                    if isinstance(which, str):
                        url = urls[which]
                        only_running(url)
                        seconds0, images0 = engine_counters(url, which)
                        answer = loads[which].measure(args.concurrency, args.slice)
                        settle([args.server_core])
                        seconds1, images1 = engine_counters(url, which)
                        only_running(None)
                        engine = (seconds1 - seconds0) / (images1 - images0) * 1000
                        name = NAMES[which].format(c=args.concurrency)
                        rows.setdefault(name, []).append((engine, 1000 / answer["rps"] - engine))
                    else:
                        pre, run = loop.split(which, args.slice)
                        rows.setdefault(f"in-process loop, batch {which}", []).append((run, pre))
                print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
        finally:
            only_running(None)
            for load in loads.values():
                load.close()
    baseline = statistics.median(e + r for e, r in rows["in-process loop, batch 1"])
    best = statistics.median(e + r for e, r in rows["in-process loop, batch 2"])
    print(
        f"\nms of one core per image, median of {args.rounds} rounds of {args.slice:g} s "
        "(server: the engine from its metrics, the rest from req/s; loop: preprocessing as the rest)\n"
    )
    print("| contender | engine ms | rest ms | total ms | images/s vs loop at batch 1 | vs loop at batch 2 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in rows.items():
        engine = statistics.median(v[0] for v in values)
        rest = statistics.median(v[1] for v in values)
        total = statistics.median(v[0] + v[1] for v in values)
        print(f"| {name} | {engine:.2f} | {rest:.2f} | {total:.2f} | {baseline / total:.1%} | {best / total:.1%} |")


if __name__ == "__main__":
    main()
