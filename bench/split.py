"""Preprocessing-inference split benchmark on imagenet (issue 4).

Part 1, end to end on 2 cores (POST /predict/label with a base64 JPEG, wrk on both cores):
  * split: the preprocessing server pinned to core 0 calling the inference server pinned to core 1 over gRPC,
  * web-single: ``pipeserve serve --workers 2`` on both cores,
  * the in-process limit on 2 cores: two processes, one per core, each decoding and classifying in a loop.
Part 2, the inference server alone on core 0 (preprocessed 1x3x224x224 UINT8 pixels in, a load generator on
core 1): v2 gRPC and v2 HTTP with the binary tensor extension, against ONNX Runtime in-process on core 0.

Contenders are interleaved (repeat -> concurrency -> contender); the table reports medians over repeats.

    make bench-split            # or: .venv/bin/python -m bench.split [--repeats 3 --duration 6]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.run import LUA, PROCESS_GROUPS, ROOT, free_port, server, wrk

PY = sys.executable
EXAMPLE = ROOT / "examples" / "imagenet"
ENV = {**os.environ, "BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)}


@dataclass
class Point:
    part: str
    contender: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float


def only(urls: set[str]) -> None:
    """Let the servers behind ``urls`` run and freeze every other one (idle servers still use the core)."""
    for url, group in PROCESS_GROUPS.items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT if url in urls else signal.SIGSTOP)


def inprocess_two_cores(body: Path, duration_s: float) -> tuple[float, float, float]:
    """Two in-process loops, one per core, at the same time: their images/s add up."""
    command = [PY, "-m", "bench.apps.inprocess_batch", "onnx", "1", str(body), str(duration_s)]
    runs = [
        subprocess.Popen(["taskset", "-c", str(core), *command], env=ENV, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for core in (0, 1)
    ]
    results = [json.loads(run.communicate()[0].strip().splitlines()[-1]) for run in runs]
    return (
        sum(r["rps"] for r in results),
        statistics.mean(r["p50_ms"] for r in results),
        max(r["p99_ms"] for r in results),
    )


def inprocess_tensor(tensor: Path, duration_s: float, core: int) -> tuple[float, float, float]:
    out = subprocess.run(
        ["taskset", "-c", str(core), PY, "-m", "bench.apps.inprocess_tensor", str(tensor), "1", str(duration_s)],
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["rps"], result["p50_ms"], result["p99_ms"]


def v2_load(
    protocol: str, target: str, tensor: Path, concurrency: int, duration_s: float, core: int
) -> tuple[float, float, float]:
    out = subprocess.run(
        ["taskset", "-c", str(core), PY, "-m", "bench.apps.v2_load", protocol, target, "classifier", str(tensor),
         str(concurrency), str(duration_s)],
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout  # fmt: skip
    result = json.loads(out.strip().splitlines()[-1])
    if result["errors"]:
        raise RuntimeError(f"{protocol} {target}: {result['errors']} failed requests at concurrency {concurrency}")
    return result["rps"], result["p50_ms"], result["p99_ms"]


@contextmanager
def infer_server(stack: ExitStack, name: str, core: int, log_dir: Path) -> Iterator[tuple[str, str]]:
    """An inference server pinned to ``core``: (its HTTP URL, its gRPC host:port)."""
    grpc_port = free_port()
    command = ["taskset", "-c", str(core), PY, "-m", "pipeserve.cli.main", "serve-infer", str(EXAMPLE),
               "--http-port", "{port}", "--grpc-port", str(grpc_port), "--log-level", "warning"]  # fmt: skip
    url = stack.enter_context(server(name, command, {}, "/v2/health/ready", log_dir))
    yield url, f"127.0.0.1:{grpc_port}"


def run(args: argparse.Namespace) -> list[Point]:
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        lua = workdir / "post.lua"
        lua.write_text(LUA)
        body = workdir / "cat.json"
        cat = (EXAMPLE / "samples" / "cat.jpg").read_bytes()
        body.write_text(json.dumps({"data": base64.b64encode(cat).decode()}))
        tensor = workdir / "cat.npy"
        sys.path.insert(0, str(ROOT))
        os.environ["BENCH_MODEL"] = "imagenet"
        from bench.apps.common import preprocess_image

        np.save(tensor, preprocess_image(base64.b64encode(cat).decode()))
        log_dir = ROOT / "bench" / "results" / "raw"
        log_dir.mkdir(parents=True, exist_ok=True)

        split_infer_url, split_grpc = stack.enter_context(infer_server(stack, "split-infer", 1, log_dir))
        prep_cmd = ["taskset", "-c", "0", PY, "-m", "pipeserve.cli.main", "serve", str(EXAMPLE), "--port", "{port}",
                    "--infer", f"grpc://{split_grpc}", "--log-level", "warning"]  # fmt: skip
        split_url = stack.enter_context(server("split-prep", prep_cmd, {}, "/health/ready", log_dir))
        single_cmd = [PY, "-m", "pipeserve.cli.main", "serve", str(EXAMPLE), "--port", "{port}", "--workers", "2",
                      "--log-level", "warning"]  # fmt: skip
        single_url = stack.enter_context(server("web-single-2w", single_cmd, {}, "/health/ready", log_dir))
        alone_http, alone_grpc = stack.enter_context(infer_server(stack, "infer-alone", 0, log_dir))
        end_to_end = {
            "split (prep core 0 -> gRPC -> inference core 1)": ({split_url, split_infer_url}, split_url),
            "web-single, 2 workers": ({single_url}, single_url),
        }
        for urls, url in end_to_end.values():  # warm up
            only(urls)
            wrk(url, body, 8, 2, "0,1", lua)
        only({alone_http})
        v2_load("grpc", alone_grpc, tensor, 8, 2, 1)
        for repeat in range(args.repeats):
            only(set())
            limit2 = inprocess_two_cores(body, args.duration)
            limit1 = inprocess_tensor(tensor, args.duration, 0)
            for concurrency in args.concurrency:
                points.append(Point("end-to-end", "in-process limit, 2 cores", concurrency, *limit2))
                for name, (urls, url) in end_to_end.items():
                    only(urls)
                    result = wrk(url, body, concurrency, args.duration, "0,1", lua)
                    points.append(Point("end-to-end", name, concurrency, *result))
                    _progress(repeat, args, points[-1])
                points.append(Point("inference alone", "ONNX Runtime in-process, 1 core", concurrency, *limit1))
                only({alone_http})
                for protocol, target in (("grpc", alone_grpc), ("http", alone_http)):
                    result = v2_load(protocol, target, tensor, concurrency, args.duration, 1)
                    label = "v2 gRPC" if protocol == "grpc" else "v2 HTTP (binary tensors)"
                    points.append(Point("inference alone", f"inference server, {label}", concurrency, *result))
                    _progress(repeat, args, points[-1])
        only(set(PROCESS_GROUPS))
    return points


def _progress(repeat: int, args: argparse.Namespace, p: Point) -> None:
    print(
        f"  [{repeat + 1}/{args.repeats}] c={p.concurrency:<3} {p.contender:50} {p.rps:8.1f} req/s  "
        f"p50 {p.p50_ms:8.2f} ms  p99 {p.p99_ms:8.2f} ms",
        file=sys.stderr,
    )


def summarize(points: list[Point]) -> list[Point]:
    order: list[tuple[str, str]] = []
    for p in points:
        if (p.part, p.contender) not in order:
            order.append((p.part, p.contender))
    table = []
    for part in ("end-to-end", "inference alone"):
        for concurrency in sorted({p.concurrency for p in points}):
            for key in order:
                if key[0] != part:
                    continue
                group = [p for p in points if (p.part, p.contender) == key and p.concurrency == concurrency]
                table.append(
                    Point(
                        part,
                        key[1],
                        concurrency,
                        statistics.median(p.rps for p in group),
                        statistics.median(p.p50_ms for p in group),
                        statistics.median(p.p99_ms for p in group),
                    )
                )
    return table


def checks(table: list[Point]) -> list[tuple[str, bool, str]]:
    def get(name: str, concurrency: int) -> Point | None:
        return next((p for p in table if p.contender == name and p.concurrency == concurrency), None)

    limit = "ONNX Runtime in-process, 1 core"
    results = []
    grpc32, limit32 = get("inference server, v2 gRPC", 32), get(limit, 32)
    if grpc32 and limit32:
        share = grpc32.rps / limit32.rps
        detail = f"{grpc32.rps:.1f} vs {limit32.rps:.1f} ({share:.0%})"
        results.append(("c=32: inference server over gRPC >= 90% of in-process ONNX Runtime", share >= 0.9, detail))
    grpc1, limit1 = get("inference server, v2 gRPC", 1), get(limit, 1)
    if grpc1 and limit1:
        hop = grpc1.p50_ms - limit1.p50_ms
        detail = f"{grpc1.p50_ms:.2f} vs {limit1.p50_ms:.2f} ms ({hop:+.2f} ms)"
        results.append(("c=1: the gRPC hop adds < 1.5 ms to p50", hop < 1.5, detail))
    return results


def markdown(
    table: list[Point], results: list[tuple[str, bool, str]], args: argparse.Namespace, measured: datetime
) -> str:
    lines = []
    for part in ("end-to-end", "inference alone"):
        rows = [p for p in table if p.part == part]
        base_name = "in-process limit, 2 cores" if part == "end-to-end" else "ONNX Runtime in-process, 1 core"
        lines += [f"### {part}", "", "| concurrency | contender | req/s | p50 ms | p99 ms | req/s vs in-process |"]
        lines.append("|---:|---|---:|---:|---:|---:|")
        for p in rows:
            base = next(b for b in rows if b.contender == base_name and b.concurrency == p.concurrency)
            lines.append(
                f"| {p.concurrency} | {p.contender} | {p.rps:,.1f} | {p.p50_ms:.2f} | {p.p99_ms:.2f} | "
                f"{p.rps / base.rps:.0%} |"
            )
        lines.append("")
    lines += ["| target | result | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in results]
    header = (
        f"Measured {measured:%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} cores); "
        f"{args.duration:g} s per point, median of {args.repeats} interleaved repeats. End to end: wrk on both "
        "cores with the servers. Inference alone: the server on core 0, the load generator (bench/apps/v2_load.py, "
        "requests encoded once) on core 1. In-process latency is one engine run (batch 1)."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


READING = """
## Reading the table

**The targets** (inference server alone, one core each side) are met in some runs and not in others: this
table (the second full run on 2026-11-23) gives 86% of ONNX Runtime in-process over gRPC at concurrency 32
(target 90%) and +1.49 ms at concurrency 1 (target 1.5 ms); the first full run that day gave 90% and +0.83 ms
(before this stop's batching fixes, which do not touch this path). Interleaved runs by hand the same day put
concurrency 32 at 85-95% (median ~89%) and the hop at +0.55 to +1.8 ms. This machine moves by ±5-10% between
runs; the gRPC server sits at the 90% line, not safely above it. Over v2 HTTP with binary tensors the server
does better (92-101%).

**What moved it: uint8 on the wire** (2026-11-23). The imagenet example's models now take uint8 pixels and compute
`(x - 127) / 128` in their own graph (`build_imagenet.py`; the pipeline's last preprocessing step is
`image.to_tensor`), so a request carries 150 KB instead of 600 KB of float32. Interleaved in one session, the same
network served both ways: float32 79-84% of in-process at concurrency 32 and +1.6 to +1.7 ms at concurrency 1;
uint8 85-93% and +0.8 to +1.2 ms. The floats the network sees are bit-identical (`/ 128` is exact) and the golden
check passes unchanged. The constants also moved into the release's model artifact, so preprocessing and model
cannot disagree on them.

**Where the rest goes.** `perf` on the server at concurrency 32: ONNX Runtime 86% of its CPU, Python 5%, the
kernel 5% (half of it in context switches), grpcio 2%. pipeserve's own Python per request (parse, check,
admission, batcher, response) is ~0.13 ms, 2% (measured with a no-op model). The rest is grpcio's: per request,
~23 context switches on the model's core (its poller thread and four event-engine threads preempting the model
~7 times per run). Tried, each within the noise: disabling gRPC's event engine (`GRPC_EXPERIMENTS`, 13 switches
per request instead of 23, same throughput), renicing gRPC's threads (+3% at nice 19, not adopted: on a shared
core it would starve the server's I/O), batching at the inference server (ONNX Runtime is no faster per image at
batch 4 or 8 on one core here). Over HTTP, uvicorn reads the socket on the event loop between model runs: no
threads, no switches, hence 100%.

**End to end.** The split puts decoding and resizing on one core and the network on the other: at concurrency 32
it is bound by the inference core (122 req/s, about what the inference server alone does over gRPC), while web-single
with 2 workers uses both cores for both halves (184 req/s). The split is about separate scaling and deployment
(GPU inference servers, CPU preprocessing fleets), not about beating one process on one box.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 3 s")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "split.md")
    parser.add_argument("--render", type=Path, help="Re-render the table from a saved JSON file.")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.duration = 1, 3.0
    results_path = ROOT / "bench" / "results" / "split.json"
    if args.render:
        saved = json.loads(args.render.read_text())
        points = [Point(**p) for p in saved["points"]]
        args.repeats, args.duration = saved["repeats"], saved["duration"]
        measured = datetime.fromisoformat(saved["measured"]) if "measured" in saved else datetime.now(UTC)
    else:
        points = run(args)
        measured = datetime.now(UTC)
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(
            json.dumps(
                {
                    "repeats": args.repeats,
                    "duration": args.duration,
                    "measured": measured.isoformat(),
                    "points": [asdict(p) for p in points],
                }
            )
        )
    table = summarize(points)
    results = checks(table)
    text = markdown(table, results, args, measured)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = f'make bench-split BENCH_ARGS="--repeats {args.repeats} --duration {args.duration:g}"'
    args.out.write_text(f"# Preprocessing-inference split (imagenet)\n\nCommand: `{command}`\n\n{text}{READING}")


if __name__ == "__main__":
    main()
