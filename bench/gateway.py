"""Gateway benchmark (issue 5): what a remote hop costs, against the same pipeline in one process.

examples/iris_ensemble (two models on the same input, averaged by a handler), served three ways in one run:
  * in-process: ``pipeserve serve`` (every node in one process),
  * gateway, 1 remote node: ``svc`` on its own v2 inference server, the rest in the gateway,
  * gateway, 2 remote nodes: ``svc`` and ``logreg`` each on its own server (called at the same time).
The gateway (and the in-process server) on core 0, the node services and wrk on core 1. Contenders are
interleaved (repeat -> concurrency -> contender); the table reports medians over repeats.

    make bench-gateway            # or: .venv/bin/python -m bench.gateway [--repeats 3 --duration 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.run import LUA, PROCESS_GROUPS, ROOT, free_port, server, wrk


def only(urls: set[str]) -> None:
    """Let the servers behind ``urls`` run and freeze every other one (idle servers still use the core)."""
    for url, group in PROCESS_GROUPS.items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT if url in urls else signal.SIGSTOP)


PY = sys.executable
EXAMPLE = ROOT / "examples" / "iris_ensemble"
IN_PROCESS = "in-process (one process)"


@dataclass
class Point:
    contender: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float


def variant(workdir: Path, name: str, remote: dict[str, int]) -> Path:
    """A copy of the example whose ``remote`` nodes listen on the given gRPC ports (the others stay local)."""
    spec = workdir / name
    shutil.copytree(EXAMPLE, spec)
    text = (spec / "pipeline.yaml").read_text()
    for node, default in (("svc", 50061), ("logreg", 50062)):
        url = f'remote: {{url: "grpc://127.0.0.1:{default}"}}'
        text = text.replace(url, f'remote: {{url: "grpc://127.0.0.1:{remote[node]}"}}' if node in remote else "")
    (spec / "pipeline.yaml").write_text(text)
    return spec


def run(args: argparse.Namespace) -> list[Point]:
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        lua = workdir / "post.lua"
        lua.write_text(LUA)
        body = workdir / "iris.json"
        body.write_text(json.dumps({"data": [[5.1, 3.5, 1.4, 0.2]]}))
        log_dir = ROOT / "bench" / "results" / "raw"
        log_dir.mkdir(parents=True, exist_ok=True)
        cli = [PY, "-m", "pipeserve.cli.main"]
        contenders: dict[str, set[str]] = {}
        url_of: dict[str, str] = {}

        single = stack.enter_context(
            server(
                "gw-single",
                ["taskset", "-c", "0", *cli, "serve", str(EXAMPLE), "--port", "{port}", "--log-level", "warning"],
                {},
                "/health/ready",
                log_dir,
            )
        )
        contenders[IN_PROCESS], url_of[IN_PROCESS] = {single}, single
        for label, nodes in (("gateway, 1 remote node", ["svc"]), ("gateway, 2 remote nodes", ["svc", "logreg"])):
            ports = {node: free_port() for node in nodes}
            spec = variant(workdir, label.split(",")[1].strip().replace(" ", "-"), ports)
            services = set()
            for node, port in ports.items():
                command = ["taskset", "-c", "1", *cli, "serve-infer", str(spec), "--models", node,
                           "--http-port", "{port}", "--grpc-port", str(port), "--log-level", "warning"]  # fmt: skip
                services.add(
                    stack.enter_context(server(f"gw-{node}-{len(nodes)}", command, {}, "/v2/health/ready", log_dir))
                )
            gateway = stack.enter_context(
                server(
                    f"gw-gateway-{len(nodes)}",
                    [
                        "taskset",
                        "-c",
                        "0",
                        *cli,
                        "serve",
                        str(spec),
                        "--pattern",
                        "gateway",
                        "--port",
                        "{port}",
                        "--log-level",
                        "warning",
                    ],
                    {},
                    "/health/ready",
                    log_dir,
                )
            )
            contenders[label], url_of[label] = {gateway, *services}, gateway
        for name, urls in contenders.items():  # warm up
            only(urls)
            wrk(url_of[name], body, 4, 2, 1, lua, "/predict")
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                for name, urls in contenders.items():
                    only(urls)
                    rps, p50, p99 = wrk(url_of[name], body, concurrency, args.duration, 1, lua, "/predict")
                    points.append(Point(name, concurrency, rps, p50, p99))
                    print(
                        f"  [{repeat + 1}/{args.repeats}] c={concurrency:<3} {name:26} {rps:9.1f} req/s  "
                        f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms",
                        file=sys.stderr,
                    )
        only(set(PROCESS_GROUPS))
    return points


def summarize(points: list[Point]) -> list[Point]:
    names = list(dict.fromkeys(p.contender for p in points))
    table = []
    for concurrency in sorted({p.concurrency for p in points}):
        for name in names:
            group = [p for p in points if p.contender == name and p.concurrency == concurrency]
            table.append(
                Point(
                    name,
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

    base = get(IN_PROCESS, 1)
    results = []
    for name in ("gateway, 1 remote node", "gateway, 2 remote nodes"):
        point = get(name, 1)
        if base and point:
            hop = point.p50_ms - base.p50_ms  # the two remote calls of the second run at the same time: one hop
            results.append(
                (
                    f"c=1: {name} adds < 2 ms to p50 (one remote hop on the critical path)",
                    hop < 2.0,
                    f"{point.p50_ms:.2f} vs {base.p50_ms:.2f} ms ({hop:+.2f} ms)",
                )
            )
    return results


def markdown(table: list[Point], results: list[tuple[str, bool, str]], args: argparse.Namespace) -> str:
    lines = [
        "| concurrency | contender | req/s | p50 ms | p99 ms | p50 vs in-process |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for p in table:
        base = next(b for b in table if b.contender == IN_PROCESS and b.concurrency == p.concurrency)
        lines.append(
            f"| {p.concurrency} | {p.contender} | {p.rps:,.1f} | {p.p50_ms:.2f} | {p.p99_ms:.2f} | "
            f"{p.p50_ms - base.p50_ms:+.2f} ms |"
        )
    lines += ["", "| target | result | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in results]
    header = (
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} cores); "
        f"{args.duration:g} s per point, median of {args.repeats} interleaved repeats; POST /predict of "
        "examples/iris_ensemble with one row. The gateway and the in-process server on core 0, the node services "
        "(v2 gRPC) and wrk on core 1."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "gateway.md")
    args = parser.parse_args()
    points = run(args)
    results_path = ROOT / "bench" / "results" / "gateway.json"
    results_path.write_text(
        json.dumps({"repeats": args.repeats, "duration": args.duration, "points": [asdict(p) for p in points]})
    )
    table = summarize(points)
    text = markdown(table, checks(table), args)
    print(text)
    command = f'make bench-gateway BENCH_ARGS="--repeats {args.repeats} --duration {args.duration:g}"'
    args.out.write_text(f"# Gateway and remote nodes (iris ensemble)\n\nCommand: `{command}`\n\n{text}")


if __name__ == "__main__":
    main()
