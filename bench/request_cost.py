"""Where a saturated imagenet server's time goes, per image: the engine against everything else, next to the same
split of the in-process loop (preprocessing, engine) at batch 1 and 2.

The server (pinned to one core, batching on and off) runs at concurrency 32 from bench/apps/http_load.py on the
other core; its core is busy all the time, so one image costs it 1 / req/s. The engine's share comes from its own
metrics: ``pipeserve_batch_run_seconds`` over the rows batched (batching on) or the classifier node's latency
(batching off). The rest (HTTP, preprocessing, the pipeline's nodes, the log line) is the difference. The loop
times preprocessing and the engine call separately. A third server, bench/apps/bare_batch_app.py (uvicorn, a bare
ASGI callable and a 20-line greedy batcher of 2, nothing else), shows what HTTP and batching cost at the least.
Slices of every contender alternate, so that the machine's drift (10-20% within a minute here) spreads over all of
them; the table shows medians, and each contender's images/s against the loop's in the same round.

``--contenders`` picks the servers: ``on`` (adaptive, up to 8), ``off``, ``fixedN`` (pipeserve with fixed batches
of up to N) and ``bareN`` (the bare app batching up to N); ``--loop-sizes`` the loop's batch sizes. Comparing
sizes in one server shows what a batch costs beyond the engine (docs/batching.md, ``batch_overhead_ms``):

    .venv/bin/python -m bench.request_cost [--rounds 6] [--slice 4]
    .venv/bin/python -m bench.request_cost --contenders on,fixed2,fixed4,bare8 --loop-sizes 1,2,4
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

from bench.batching import MAX_BATCH, bodies, spec_variant
from bench.paired import LoopProcess, pinned_module, settle
from bench.run import ROOT, only_running, server

CONTENDERS = ("on", "off", "bare2")


def contender_name(kind: str, concurrency: int) -> str:
    """The table's name for a contender: ``on`` (adaptive, up to 8), ``off``, ``fixedN`` (pipeserve, fixed
    batches of up to N) or ``bareN`` (the bare app with a greedy batcher of N)."""
    if kind == "on":
        return f"pipeserve, batching on (c={concurrency})"
    if kind == "off":
        return f"pipeserve, batching off (c={concurrency})"
    for prefix, name in (
        ("fixed", "pipeserve, fixed batches of up to {n}"),
        ("bare", "bare ASGI + greedy batcher of {n}"),
    ):
        if kind.startswith(prefix) and kind[len(prefix) :].isdigit() and int(kind[len(prefix) :]) >= 1:
            return name.format(n=int(kind[len(prefix) :])) + f" (c={concurrency})"
    raise ValueError(f"unknown contender {kind!r}: expected on, off, fixedN or bareN (N >= 1, e.g. fixed4)")


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_counters(url: str, kind: str) -> tuple[float, float, float]:
    """(engine seconds, images, batches) the classifier has run so far, on a pipeserve server (batching ``off``:
    batches are images) or on the bare batching app (``bareN``)."""
    if kind.startswith("bare"):
        stats = httpx.get(url + "/stats", timeout=10).json()
        return stats["engine_s"], stats["images"], stats["batches"]
    text = httpx.get(url + "/metrics", timeout=10).text
    if kind != "off":
        return (
            _metric(text, "pipeserve_batch_run_seconds_sum", model="classifier"),
            _metric(text, "pipeserve_batch_size_sum", model="classifier"),
            _metric(text, "pipeserve_batch_size_count", model="classifier"),
        )
    images = _metric(text, "pipeserve_node_latency_seconds_count", node="classifier")
    return _metric(text, "pipeserve_node_latency_seconds_sum", node="classifier"), images, images


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


def start_servers(stack: ExitStack, kinds: list[str], core: int, workdir: Path) -> dict[str, str]:
    """Start each contender's server on ``core`` (stopped when ``stack`` closes); their URLs by contender."""
    example = ROOT / "examples" / "imagenet"
    env = {"BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)}
    urls = {}
    for kind in kinds:
        if kind.startswith("bare"):
            app = "bench.apps.bare_batch_app:app"
            bare = pinned_module(core, "uvicorn", app, "--port", "{port}", "--no-access-log")
            bare_env = {**env, "BENCH_MAX_BATCH": kind[4:]}
            urls[kind] = stack.enter_context(server(f"request-cost-{kind}", bare, bare_env, "/health", workdir))
            continue
        fixed = kind.startswith("fixed")
        spec = spec_variant(
            example,
            workdir / f"spec-{kind}",
            onnx_batching=kind != "off",
            ts_batching=False,
            mode="fixed" if fixed else "adaptive",
            max_batch=int(kind[5:]) if fixed else MAX_BATCH,
        )
        command = pinned_module(core, "pipeserve.cli.main", "serve", str(spec), "--port", "{port}")
        urls[kind] = stack.enter_context(
            server(f"request-cost-{kind}", command, {"PIPESERVE_ACCESS_LOG": "true"}, "/health/ready", workdir)
        )
    return urls


def print_table(
    rows: dict[str, list[tuple[float, float]]], mean_batch: dict[str, list[float]], sizes: list[int], slices: str
) -> None:
    """The table: per contender, medians over rounds, and its images/s against the loop's in the same rounds."""
    loop_totals = {size: [sum(v) for v in rows[f"in-process loop, batch {size}"]] for size in sizes}
    best_size = min(sizes, key=lambda size: statistics.median(loop_totals[size]))
    print(
        f"\nms of one core per image, median of {slices} (server: the engine from its metrics, the rest from "
        "req/s; loop: preprocessing as the rest); 'vs loop' columns: the median over rounds of the loop's time per "
        "image in the same round over the contender's\n"
    )
    print(
        "| contender | mean batch (range over rounds) | engine ms | rest ms | total ms | images/s vs loop at batch 1 "
        f"| vs loop at batch {best_size} (its best) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, values in rows.items():
        engine = statistics.median(v[0] for v in values)
        rest = statistics.median(v[1] for v in values)
        totals = [sum(v) for v in values]
        vs1 = statistics.median(b / t for b, t in zip(loop_totals[1], totals, strict=True))
        vs_best = statistics.median(b / t for b, t in zip(loop_totals[best_size], totals, strict=True))
        batches = mean_batch[name]
        batch = f"{statistics.median(batches):.2f} ({min(batches):.1f}-{max(batches):.1f})"
        total = statistics.median(totals)
        print(f"| {name} | {batch} | {engine:.2f} | {rest:.2f} | {total:.2f} | {vs1:.1%} | {vs_best:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slice", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="servers to compare, comma-separated: on (adaptive), off, fixedN (fixed batches of up to N), bareN",
    )
    parser.add_argument("--loop-sizes", default="1,2", help="the in-process loop's batch sizes, comma-separated")
    args = parser.parse_args()
    kinds = list(dict.fromkeys(args.contenders.split(",")))  # each once: rounds pair slices by contender
    for kind in kinds:
        contender_name(kind, args.concurrency)  # an unknown name fails before any server starts
    sizes = sorted({int(size) for size in args.loop_sizes.split(",")})
    if 1 not in sizes:
        parser.error("--loop-sizes must include 1 (the table's baseline)")
    os.sched_setaffinity(0, {args.server_core})  # the loop runs here, on the servers' core
    os.environ["BENCH_MODEL"] = "imagenet"
    rows: dict[str, list[tuple[float, float]]] = {}  # name -> [(engine ms, rest ms) per image]
    mean_batch: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        body = bodies(workdir)["json"]
        env = {"BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)}
        urls = start_servers(stack, kinds, args.server_core, workdir)
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
        for size in sizes:
            loop.split(size, 1.0)  # warm: the first runs at a new batch shape allocate
        try:
            for round_ in range(args.rounds):
                order: list[Any] = [*kinds, *sizes]
                for which in order if round_ % 2 == 0 else reversed(order):
                    if isinstance(which, str):
                        url = urls[which]
                        only_running(url)
                        seconds0, images0, batches0 = engine_counters(url, which)
                        answer = loads[which].measure(args.concurrency, args.slice)
                        settle([args.server_core])
                        seconds1, images1, batches1 = engine_counters(url, which)
                        only_running(None)
                        engine = (seconds1 - seconds0) / (images1 - images0) * 1000
                        name = contender_name(which, args.concurrency)
                        rows.setdefault(name, []).append((engine, 1000 / answer["rps"] - engine))
                        mean_batch.setdefault(name, []).append((images1 - images0) / max(batches1 - batches0, 1))
                    else:
                        pre, run = loop.split(which, args.slice)
                        rows.setdefault(f"in-process loop, batch {which}", []).append((run, pre))
                        mean_batch.setdefault(f"in-process loop, batch {which}", []).append(which)
                print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
        finally:
            only_running(None)
            for load in loads.values():
                load.close()
    print_table(rows, mean_batch, sizes, f"{args.rounds} rounds of {args.slice:g} s")


if __name__ == "__main__":
    main()
