"""Micro-batching benchmark on imagenet: pipeserve (ONNX and TorchScript, batching on and off) next to the
in-process limit and to LitServe, BentoML and MLServer serving the same ONNX model with the same preprocessing
and their own batching (each in its own venv under bench/peers/).

Servers are pinned to one core, the load generator (bench/apps/http_load.py: answers counted within a window of a
continuous load, after a warm-up) to the other; all servers stay up (the idle ones frozen). Every contender slice
runs right after a batch-1 slice of the in-process limit of its engine on the same core, and each round measures
the limit at batch sizes 1, 2, 4 and 8 back to back (bench/paired.py): "vs limit" is the median over rounds of the
paired ratio to the limit at its best batch size. The mean batch size each server ran comes from /metrics
(pipeserve) or a log the peers' batch functions append to.

    make bench-batching          # or: .venv/bin/python bench/batching.py [--quick]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.paired import (
    LoopProcess,
    Pair,
    Summary,
    apply_factors,
    batch_factor,
    batch_rates,
    pinned_module,
    settle,
    summarize,
)
from bench.run import LUA, ROOT, free_port, only_running, server, wrk

PY = sys.executable
PEERS = ROOT / "bench" / "peers"
MAX_BATCH = 8
SEED = "seed-style FastAPI (no batching)"
FLOOR = "bare ASGI + greedy batcher (floor)"
BATCH_TIMEOUT_S = 0.005


@dataclass
class Contender:
    name: str
    command: list[str]
    env: dict[str, str]
    ready_path: str
    path: str
    body: Path
    batch_source: tuple[str, str] | None  # ("metrics", model) or ("log", path)


def spec_variant(
    source: Path,
    target: Path,
    *,
    onnx_batching: bool,
    ts_batching: bool,
    mode: str = "adaptive",
    max_batch: int = MAX_BATCH,
) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((target / "pipeline.yaml").read_text())
    for node in spec["pipeline"]["nodes"]:
        if node["name"] == "classifier":
            if onnx_batching:
                node["batching"] = {
                    "max_batch_size": max_batch,
                    "max_latency_ms": BATCH_TIMEOUT_S * 1000,
                    "mode": mode,
                }
            else:
                node.pop("batching", None)
        if node["name"] in ("embedding", "head") and not ts_batching:
            node.pop("batching", None)
    (target / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return target


def bodies(workdir: Path) -> dict[str, Path]:
    image = base64.b64encode((ROOT / "examples" / "imagenet" / "samples" / "cat.jpg").read_bytes()).decode()
    formats = {
        "json": {"data": image},
        "bentoml": {"data": [image]},
        "v2": {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [image]}]},
    }
    paths = {}
    for name, body in formats.items():
        paths[name] = workdir / f"{name}.json"
        paths[name].write_text(json.dumps(body))
    return paths


def contenders(workdir: Path, core: int, body: dict[str, Path]) -> list[Contender]:
    pin = ["taskset", "-c", str(core)]
    example = ROOT / "examples" / "imagenet"
    peer_env = {
        "BENCH_MODEL": "imagenet",
        "BENCH_SPEC_DIR": str(example),
        "PYTHONPATH": str(ROOT),
        "BENCH_MAX_BATCH": str(MAX_BATCH),
        "BENCH_BATCH_TIMEOUT_S": str(BATCH_TIMEOUT_S),
    }
    found: list[Contender] = []
    for label, onnx_on, ts_on in (("off", False, False), ("on", True, True)):
        spec = spec_variant(example, workdir / f"spec-{label}", onnx_batching=onnx_on, ts_batching=ts_on)
        serve = [*pin, PY, "-m", "pipeserve.cli.main", "serve", str(spec), "--port", "{port}"]
        env = {"PIPESERVE_ACCESS_LOG": "true"}
        found.append(
            Contender(
                f"pipeserve ONNX batching {label}",
                serve,
                env,
                "/health/ready",
                "/predict/label",
                body["json"],
                ("metrics", "classifier") if onnx_on else None,
            )
        )
        found.append(
            Contender(
                f"pipeserve TorchScript batching {label}",
                serve,
                env,
                "/health/ready",
                "/predict/tag?k=1",
                body["json"],
                ("metrics", "embedding") if ts_on else None,
            )
        )
    logs = {name: workdir / f"{name}-batches.log" for name in ("litserve", "bentoml", "mlserver", "floor")}
    uvicorn = [*pin, PY, "-m", "uvicorn", "--port", "{port}", "--no-access-log"]
    app_env = {"BENCH_MODEL": "imagenet", "BENCH_SPEC_DIR": str(example), "PYTHONPATH": str(ROOT)}
    # The two ends of a web app on the same engine: a seed-style FastAPI app (no batching), and the floor of a
    # batching server (a bare ASGI callable with a 20-line greedy batcher and nothing else: no deadlines, metrics,
    # logs or error handling), which shows how much of the limit any server over HTTP keeps on this machine.
    found.append(
        Contender(SEED, [*uvicorn, "bench.apps.seed_app:app"], app_env, "/health", "/predict/label", body["json"], None)
    )
    found.append(
        Contender(
            FLOOR,
            [*uvicorn, "bench.apps.bare_batch_app:app"],
            {**app_env, "BENCH_MAX_BATCH": str(MAX_BATCH), "BENCH_BATCH_LOG": str(logs["floor"])},
            "/health",
            "/predict/label",
            body["json"],
            ("log", str(logs["floor"])),
        )
    )
    if (PEERS / "litserve" / ".venv" / ".installed").exists():
        found.append(
            Contender(
                "LitServe",
                [*pin, str(PEERS / "litserve/.venv/bin/python"), str(PEERS / "litserve/server.py")],
                {**peer_env, "BENCH_BATCH_LOG": str(logs["litserve"])},
                "/health",
                "/predict",
                body["json"],
                ("log", str(logs["litserve"])),
            )
        )
    if (PEERS / "bentoml" / ".venv" / ".installed").exists():
        found.append(
            Contender(
                "BentoML",
                [
                    *pin,
                    str(PEERS / "bentoml/.venv/bin/bentoml"),
                    "serve",
                    "service:Imagenet",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "{port}",
                    "--working-dir",
                    str(PEERS / "bentoml"),
                ],
                {**peer_env, "BENCH_BATCH_LOG": str(logs["bentoml"]), "BENTOML_HOME": str(workdir / "bentoml-home")},
                "/readyz",
                "/predict_label",
                body["bentoml"],
                ("log", str(logs["bentoml"])),
            )
        )
    if (PEERS / "mlserver" / ".venv" / ".installed").exists():
        repo = workdir / "mlserver"
        (repo / "imagenet").mkdir(parents=True)
        (repo / "imagenet" / "model-settings.json").write_text(
            json.dumps(
                {
                    "name": "imagenet",
                    "implementation": "bench.peers.mlserver.classifier.Classifier",
                    "max_batch_size": MAX_BATCH,
                    "max_batch_time": BATCH_TIMEOUT_S,
                }
            )
        )
        found.append(
            Contender(
                "MLServer",
                [
                    *pin,
                    "sh",
                    "-c",
                    f'printf \'%s\' \'{{"host": "127.0.0.1", "http_port": {{port}}, '
                    f'"grpc_port": {free_port()}, "metrics_port": {free_port()}, "parallel_workers": 0}}\' '
                    f"> {repo}/settings.json && exec {PEERS}/mlserver/.venv/bin/mlserver start {repo}",
                ],
                {**peer_env, "BENCH_BATCH_LOG": str(logs["mlserver"])},
                "/v2/health/ready",
                "/v2/models/imagenet/infer",
                body["v2"],
                ("log", str(logs["mlserver"])),
            )
        )
    return found


def batch_counter(url: str, source: tuple[str, str] | None) -> tuple[float, float]:
    """(batches, rows) run so far."""
    if source is None:
        return 0.0, 0.0
    kind, where = source
    if kind == "log":
        path = Path(where)
        sizes = [int(line) for line in path.read_text().split()] if path.exists() else []
        return float(len(sizes)), float(sum(sizes))
    text = httpx.get(url + "/metrics", timeout=10).text
    label = f'{{model="{where}",pipeline="imagenet"}}'
    count = next(
        (
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(f"pipeserve_batch_size_count{label}")
        ),
        0.0,
    )
    rows = next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"pipeserve_batch_size_sum{label}")),
        0.0,
    )
    return count, rows


SIZES = (1, 2, 4, 8)


def engine_of(contender: str) -> str:
    return "torchscript" if "TorchScript" in contender else "onnx"


def run(args: argparse.Namespace) -> tuple[list[Pair], dict[str, list[dict[int, float]]]]:
    """The pairs, and each round's in-process images/s by batch size relative to batch 1, by engine."""
    pairs: list[Pair] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        lua = workdir / "post.lua"
        lua.write_text(LUA)
        body = bodies(workdir)
        log_dir = ROOT / "bench" / "results" / "raw"
        log_dir.mkdir(parents=True, exist_ok=True)
        chosen = [
            c
            for c in contenders(workdir, args.server_core, body)
            if not args.only or any(word.lower() in c.name.lower() for word in args.only)
        ]
        urls = {
            c.name: stack.enter_context(
                server(f"batching-{c.name.replace(' ', '_')}", c.command, c.env, c.ready_path, log_dir)
            )
            for c in chosen
        }
        for c in chosen:  # warm up every server (and let adaptive batchers learn) before measuring
            only_running(urls[c.name])
            wrk(urls[c.name], c.body, 8, 3, args.client_core, lua, c.path)
        env = {"BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)}
        limits = {
            engine: LoopProcess(
                pinned_module(args.server_core, "bench.apps.inprocess_batch", "--serve", engine, str(body["json"])),
                env,
                ROOT,
            )
            for engine in {engine_of(c.name) for c in chosen}
        }
        # Steady-state throughput: answers counted within a window of a continuous load (bench/apps/http_load.py;
        # wrk drops the requests in flight when it stops, which undercounts a server that holds more of them).
        loads = {
            c.name: LoopProcess(
                pinned_module(args.client_core, "bench.apps.http_load", "--serve", urls[c.name] + c.path, str(c.body)),
                env,
                ROOT,
            )
            for c in chosen
        }
        sweeps: dict[str, list[dict[int, float]]] = {}
        try:
            for round_ in range(args.rounds):
                only_running(None)
                for engine, limit in limits.items():
                    sweeps.setdefault(engine, []).append(batch_rates(limit, SIZES, args.slice / 2, round_))
                latest = {engine: {k: round(v, 3) for k, v in rounds[-1].items()} for engine, rounds in sweeps.items()}
                _say(f"round {round_ + 1}/{args.rounds}: in-process images/s by batch size vs batch 1: {latest}")
                for concurrency in args.concurrency:
                    for c in chosen:
                        engine = engine_of(c.name)
                        only_running(None)
                        base = limits[engine].measure(1, args.slice)
                        url = urls[c.name]
                        only_running(url)
                        before = batch_counter(url, c.batch_source)
                        answer = loads[c.name].measure(concurrency, args.slice)
                        rps, p50, p99 = answer["rps"], answer["p50_ms"], answer["p99_ms"]
                        after = batch_counter(url, c.batch_source)
                        if answer["errors"] and c.name.startswith("pipeserve"):
                            raise RuntimeError(f"{c.name}: {answer['errors']} error answers at c={concurrency}")
                        if answer["errors"]:  # BentoML answers 503 when it predicts a miss: not served, not counted
                            _say(f"  {c.name}: {answer['errors']} error answers at c={concurrency} (not in its req/s)")
                        settle([args.server_core])  # the requests it still had queued, before it is frozen
                        batches, rows = after[0] - before[0], after[1] - before[1]
                        mean = rows / batches if batches else (1.0 if c.batch_source is None else None)
                        pair = Pair(round_, c.name, concurrency, rps, p50, p99, base["rps"], base["p50_ms"],
                                    1.0, mean)  # fmt: skip
                        pairs.append(pair)
                        _say(
                            f"  [{round_ + 1}] c={concurrency:<3} {c.name:34} {rps:8.1f} req/s "
                            f"({pair.vs_batch1:6.1%} of batch 1)  p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  "
                            f"batch {mean or 0:5.2f}"
                        )
        finally:
            only_running(None)
            for process in [*limits.values(), *loads.values()]:
                process.close()
    factors = {engine: batch_factor(rounds) for engine, rounds in sweeps.items()}
    _say(f"best batch in-process (median over rounds): {factors}")
    apply_factors(pairs, {engine: factor for engine, (factor, _) in factors.items()}, engine_of)
    return pairs, sweeps


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def added_p50(pairs: list[Pair], engine: str, concurrency: int) -> float | None:
    """Median over rounds of p50 with batching on minus p50 with it off, measured in the same round."""
    deltas = []
    for round_ in sorted({p.round for p in pairs}):
        on = [p for p in pairs if (p.round, p.contender, p.concurrency) == (round_, f"pipeserve {engine} batching on",
                                                                            concurrency)]  # fmt: skip
        off = [p for p in pairs if (p.round, p.contender, p.concurrency) == (round_, f"pipeserve {engine} batching off",
                                                                             concurrency)]  # fmt: skip
        if on and off:
            deltas.append(on[0].p50_ms - off[0].p50_ms)
    return statistics.median(deltas) if deltas else None


def same_round_ratio(pairs: list[Pair], ours: str, other: str, concurrency: int) -> float:
    """Median over rounds of ``ours``' req/s over ``other``'s, both measured in the same round (no limit involved)."""
    by_key = {(p.round, p.contender, p.concurrency): p.rps for p in pairs}
    ratios = [
        by_key[(round_, ours, concurrency)] / by_key[(round_, other, concurrency)]
        for round_ in sorted({p.round for p in pairs})
        if (round_, ours, concurrency) in by_key and (round_, other, concurrency) in by_key
    ]
    return statistics.median(ratios) if ratios else float("nan")


def checks(rows: list[Summary], pairs: list[Pair]) -> list[tuple[str, bool, str]]:
    def get(name: str, concurrency: int) -> Summary | None:
        return next((r for r in rows if (r.contender, r.concurrency) == (name, concurrency)), None)

    results = []
    for setting in ("on", "off"):
        ours = get(f"pipeserve ONNX batching {setting}", 32)
        if ours is None:
            continue
        low, high = ours.vs_limit_iqr
        floor = get(FLOOR, 32)
        floor_text = (
            f"; the floor (bare ASGI + greedy batcher) {floor.vs_limit:.1%}, "
            f"ours/floor in the same round {same_round_ratio(pairs, ours.contender, FLOOR, 32):.2f}x"
            if floor
            else ""
        )
        results.append(
            (
                f"c=32: pipeserve (ONNX, batching {setting}) >= 95% of the in-process limit",
                ours.vs_limit >= 0.95,
                f"{ours.vs_limit:.1%} of the limit (middle half of rounds {low:.1%}-{high:.1%}); "
                f"{ours.vs_batch1:.1%} of batch 1{floor_text}",
            )
        )
        for peer in ("LitServe", "BentoML", "MLServer"):
            other = get(peer, 32)
            if other:
                direct = same_round_ratio(pairs, ours.contender, peer, 32)
                results.append(
                    (
                        f"c=32: pipeserve (ONNX, batching {setting}) above {peer}",
                        ours.vs_limit > other.vs_limit,
                        f"{ours.vs_limit:.1%} vs {other.vs_limit:.1%} of the limit "
                        f"({ours.vs_limit / other.vs_limit:.2f}x); req/s in the same round: {direct:.2f}x",
                    )
                )
    for engine in ("ONNX", "TorchScript"):
        delta = added_p50(pairs, engine, 1)
        on, off = get(f"pipeserve {engine} batching on", 1), get(f"pipeserve {engine} batching off", 1)
        if delta is not None and on and off:
            results.append(
                (
                    f"c=1: {engine} batching on adds < 1 ms to p50",
                    delta < 1.0,
                    f"{on.p50_ms:.2f} vs {off.p50_ms:.2f} ms; paired by round {delta:+.2f} ms",
                )
            )
    return results


def markdown(rows: list[Summary], results: list[tuple[str, bool, str]], meta: dict[str, Any]) -> str:
    lines = [
        "| concurrency | contender | req/s | p50 ms | p99 ms | vs limit (middle half) | vs limit at batch 1 "
        "| mean batch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        batch = "—" if r.mean_batch is None else f"{r.mean_batch:.2f}"
        lines.append(
            f"| {r.concurrency} | {r.contender} | {r.rps:,.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.vs_limit:.1%} ({r.vs_limit_iqr[0]:.0%}-{r.vs_limit_iqr[1]:.0%}) | {r.vs_batch1:.1%} | {batch} |"
        )
    limits = {}
    for engine, label in (("onnx", "ONNX"), ("torchscript", "TorchScript")):
        values = [r.limit_rps for r in rows if engine_of(r.contender) == engine]
        if values:
            limits[label] = statistics.median(values)
    lines += [
        "",
        "The limits (median over the points, images/s at the best batch size): "
        + ", ".join(f"{label} {value:,.1f}" for label, value in limits.items())
        + ".",
        "",
        "| target | result | measured |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in results]
    header = (
        f"Measured {meta['measured']:%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} cores); servers "
        f"pinned to core {meta['server_core']}, the load generator to core {meta['client_core']}; {meta['rounds']} "
        f"rounds of {meta['slice']:g} s windows of steady load (bench/apps/http_load.py), each right after a slice of "
        "its engine's in-process limit on the same core (bench/paired.py). Batching everywhere"
        f"{' but in the seed-style app' if any(r.contender == SEED for r in rows) else ''}: at most "
        f"{MAX_BATCH} per batch, {BATCH_TIMEOUT_S * 1000:g} ms batch "
        "timeout (pipeserve: adaptive mode, which waits only when waiting pays and runs the size it measured "
        "cheapest). The in-process limit: the same preprocessing and engine call in a loop, no server, at the best "
        "of batch sizes 1, 2, 4 and 8."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


def plot(rows: list[Summary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    concurrencies = sorted({r.concurrency for r in rows})
    for engine, label in (("onnx", "ONNX"), ("torchscript", "TorchScript")):
        values = [r.limit_rps for r in rows if engine_of(r.contender) == engine]
        if values:
            left.axhline(statistics.median(values), linestyle="--", color="grey", alpha=0.6)
            left.annotate(f"in-process limit {label}", (concurrencies[0], statistics.median(values)), fontsize=7)
    for i, name in enumerate(dict.fromkeys(r.contender for r in rows)):
        mine = [r for r in rows if r.contender == name]
        style = {"marker": "o", "color": colors[i % len(colors)], "label": name}
        left.plot([r.concurrency for r in mine], [r.rps for r in mine], **style)
        right.plot([r.concurrency for r in mine], [r.p99_ms for r in mine], **style)
    left.set(xscale="log", xlabel="concurrency", ylabel="requests/s", title="imagenet throughput (one core)")
    right.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="p99 latency (ms)", title="imagenet p99")
    for axis in (left, right):
        axis.set_xticks(concurrencies, labels=[str(c) for c in concurrencies])
        axis.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def reading(rows: list[Summary], pairs: list[Pair], sweeps: dict[str, list[dict[int, float]]]) -> str:
    """What the table says, with this run's numbers."""

    def get(name: str, concurrency: int) -> Summary | None:
        return next((r for r in rows if (r.contender, r.concurrency) == (name, concurrency)), None)

    parts = ["\n## Reading the table\n"]
    on, off = get("pipeserve ONNX batching on", 32), get("pipeserve ONNX batching off", 32)
    peers = [peer for peer in ("LitServe", "BentoML", "MLServer") if get(peer, 32)]
    if on and off:
        peer_text = ", ".join(
            f"{peer} {get(peer, 32).vs_limit:.1%} (ours/theirs in the same round "  # type: ignore[union-attr]
            f"{same_round_ratio(pairs, on.contender, peer, 32):.2f}x)"
            for peer in peers
        )
        parts.append(
            f"**Concurrency 32.** pipeserve with batching on does {on.vs_limit:.1%} of the in-process limit at its "
            f"best batch size ({on.vs_batch1:.1%} of the limit at batch 1), with it off {off.vs_limit:.1%} "
            f"({off.vs_batch1:.1%}); the peers: {peer_text or 'not installed'}. The middle half of the rounds spans "
            f"{on.vs_limit_iqr[0]:.0%}-{on.vs_limit_iqr[1]:.0%} for batching on: differences of a few percent between "
            "rows are within this machine's noise.\n"
        )
    floor, seed = get(FLOOR, 32), get(SEED, 32)
    if on and floor:
        seed_text = (
            f" The seed-style FastAPI app (a sync endpoint in FastAPI's thread pool, no batching) does "
            f"{seed.vs_limit:.1%}."
            if seed
            else ""
        )
        parts.append(
            f"**What any server keeps.** The floor, a bare ASGI callable under uvicorn with a 20-line greedy batcher "
            f"and nothing else (bench/apps/bare_batch_app.py), does {floor.vs_limit:.1%} of the limit at concurrency "
            f"32 with batches of {floor.mean_batch or 1:.1f}: that much of the limit survives HTTP, a fresh body per "
            f"request and the engine running on caches that other work evicted, on this machine. pipeserve with "
            f"batching on does {same_round_ratio(pairs, on.contender, FLOOR, 32):.2f}x the floor's req/s in the same "
            f"rounds, with batches of {on.mean_batch or 1:.1f}: the difference is what its deadlines, disconnect "
            f"handling, metrics, log line and pipeline cost per request, and whatever the batch sizes' difference "
            f"saves in a server beyond the engine's time per row (the adaptive mode charges each batch "
            f"`batch_overhead_ms`, 1 ms by default, on top of the engine's time; `make bench-request-cost` compares "
            f"sizes in one server).{seed_text}\n"
        )
    bento1, pipe1 = get("BentoML", 1), get("pipeserve ONNX batching on", 1)
    if bento1 and pipe1 and bento1.p50_ms > 10 * pipe1.p50_ms:
        parts.append(
            f"**BentoML at concurrency 1** ({bento1.p50_ms:.0f} ms p50) is its dispatcher after load, not its "
            "configuration: it holds a lone request until the queue's size times its wait exceeds the *average wait "
            "of recent batches* (`CorkDispatcher.controller`), and every round's concurrency 1 but the first follows "
            "the previous round's 32 and 64, whose batches waited hundreds of ms. The requests it then holds wait "
            "that long too and keep the average up. A fresh BentoML answers in tens of ms at concurrency 1 "
            "(docs/batching.md, Measured: `make bench-recovery`). Its `max_latency_ms` (10 s here, BentoML's "
            "default) is not in that rule: lowering it makes it answer 503 under load instead.\n"
        )
    curves = []
    peers_pay = ""
    for engine, label in (("onnx", "ONNX Runtime"), ("torchscript", "TorchScript")):
        rounds = sweeps.get(engine)
        if rounds:
            medians = {size: statistics.median(r[size] for r in rounds) for size in rounds[0]}
            curves.append(f"{label} " + ", ".join(f"x{value:.2f} at {size}" for size, value in medians.items()))
            if engine == "onnx" and medians.get(MAX_BATCH, 0.0) < 0.98 * max(medians.values()):
                peers_pay = f" (the peers' full batches of {MAX_BATCH} pay for it here)"
    if curves:
        gained = ""
        if on and off:
            gained = (
                f" In the server at concurrency 32, batching on ran batches of {on.mean_batch or 1:.1f} on average and "
                f"did {on.vs_batch1 / off.vs_batch1 - 1:+.0%} against batching off. The adaptive batcher keeps the "
                "size it runs until a trial beats it side by side (blocks of two batches of a neighbouring size "
                "alternated with blocks of it, four of each, every 128 batches, each batch costed as the engine's "
                "time plus `batch_overhead_ms`, the size chosen by the median of the pair's last 5 trials: "
                "`best_size` in `GET /metadata` and "
                "`/metrics`), so a gain of a few percent is found only when it outlasts the machine's drift between "
                "the trial's batches."
            )
        parts.append(
            "**What batching can gain here.** Images/s by batch size relative to batch 1, in process on one core "
            f"(median over rounds): {'; '.join(curves)}. On a CPU, EfficientNet-Lite0 gains a few percent at best "
            f"from batching, and big batches can cost more per image{peers_pay}; "
            f"pipeserve's adaptive mode times each size and runs the cheapest it has measured.{gained} A model that "
            "is cheaper per row in batches (any GPU) gets bigger batches.\n"
        )
    parts.append(
        "**How it is measured.** This machine's speed drifts by 10-15% within a minute, and by up to 2.5x from one "
        "session's machine to the next (the ONNX limit has measured from ~55 to ~145 images/s). Each "
        "contender slice is divided by a slice of the in-process limit taken seconds before it on the same core, "
        "and the table shows the median of those ratios over rounds. Servers not being measured are frozen "
        "(SIGSTOP) once they have finished what they had queued; every server is warmed up before the first round. "
        "Only 200 answers count as served: BentoML answers 503 when it predicts that a request would miss its "
        "latency goal, and such answers are left out of its req/s (an error answer from pipeserve stops the run).\n"
    )
    parts.append(
        "**Where the rest goes.** The in-process limit does the work of one request and nothing else: a server on "
        "the same core also reads and parses HTTP, routes the request and writes the answer, and the engine runs "
        "on caches that work evicted. `make bench-request-cost` splits a saturated server's CPU per image into the "
        "engine and the rest, next to the loop and to a bare ASGI app with a 20-line batcher (docs/batching.md, "
        "Measured). The load generator counts answers within a window of a continuous load, after a warm-up and "
        "before the drain (bench/apps/http_load.py), so requests still in flight when a slice ends are not lost to "
        "a batching server that holds more of them half-done.\n"
    )
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="only contenders whose name contains one of these words")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks" / "batching.md")
    parser.add_argument("--render", type=Path, help="re-render the table and plot from a saved batching.json")
    parser.add_argument(
        "--results", type=Path, default=ROOT / "bench" / "results" / "batching.json", help="where the pairs are saved"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.slice = 2, 2.0
    results_path = args.results
    if args.render:
        saved = json.loads(args.render.read_text())
        pairs = [Pair(**p) for p in saved["pairs"]]
        sweeps = {
            engine: [{int(size): value for size, value in r.items()} for r in rounds]
            for engine, rounds in saved.get("sweeps", {}).items()
        }
        meta = {**saved, "measured": datetime.fromisoformat(saved["measured"])}
    else:
        pairs, sweeps = run(args)
        meta = {
            "rounds": args.rounds,
            "slice": args.slice,
            "server_core": args.server_core,
            "client_core": args.client_core,
            "measured": datetime.now(UTC),
            "command": f'make bench-batching BENCH_ARGS="{" ".join(sys.argv[1:])}"',
        }
    rows = summarize(pairs)
    results = checks(rows, pairs)
    text = markdown(rows, results, meta)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    plot_path = args.output.with_suffix(".png")
    plot(rows, plot_path)
    command = (
        meta.get("command") or f'make bench-batching BENCH_ARGS="--rounds {meta["rounds"]} --slice {meta["slice"]:g}"'
    )
    saved_at = (args.render or results_path).resolve()
    shown = saved_at.relative_to(ROOT) if saved_at.is_relative_to(ROOT) else saved_at
    args.output.write_text(
        f"# Micro-batching benchmark (imagenet)\n\nCommand: `{command}` (re-render: "
        f"`--render {shown}`)\n\n{text}\n![req/s and p99 against concurrency]({plot_path.name})\n"
        f"{reading(rows, pairs, sweeps)}"
    )
    if not args.render:
        saved = {
            **meta,
            "measured": meta["measured"].isoformat(),
            "sweeps": sweeps,
            "pairs": [asdict(p) for p in pairs],
        }
        results_path.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
