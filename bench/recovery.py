"""Concurrency 1 before and after a burst: does a batching server's latency for a lone request come back once
the load is gone?

Each batching server of the batching bench (pipeserve ONNX batching on, LitServe, BentoML, MLServer, the bare
floor), fresh, answers a lone client (concurrency 1), then a burst at concurrency 32, then a lone client again.
A batcher that decides how long to hold a request from what it saw under load (BentoML waits as long as its recent
batches waited on average) keeps a lone request waiting long after the burst. One server at a time, pinned to the
server core, the load generator (bench/apps/http_load.py) on the other.

    .venv/bin/python -m bench.recovery [--slice 4] [--burst 5]     (make bench-recovery)
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.batching import bodies, contenders, engine_of
from bench.paired import LoopProcess, pinned_module
from bench.run import ROOT, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slice", type=float, default=4.0, help="seconds of each concurrency-1 measurement")
    parser.add_argument("--burst", type=float, default=5.0, help="seconds at concurrency 32")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    args = parser.parse_args()
    os.environ["BENCH_MODEL"] = "imagenet"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        body = bodies(workdir)
        every = contenders(workdir, args.server_core, body)
        chosen = [c for c in every if c.batch_source is not None and engine_of(c.name) == "onnx"]  # ONNX, batching
        for c in chosen:
            with ExitStack() as stack:
                name = f"recovery-{c.name.split()[0]}"
                url = stack.enter_context(server(name, c.command, c.env, c.ready_path, workdir))
                load = LoopProcess(
                    pinned_module(args.client_core, "bench.apps.http_load", "--serve", url + c.path, str(c.body)),
                    {"BENCH_MODEL": "imagenet", "PYTHONPATH": str(ROOT)},
                    ROOT,
                )
                stack.callback(load.close)
                fresh = load.measure(1, args.slice)
                burst = load.measure(32, args.burst)
                after = [load.measure(1, args.slice) for _ in range(2)]
                rows.append((c.name, fresh, burst, after))
                print(f"{c.name}: done", flush=True)
    print(f"\nimagenet, one core; p50 ms at concurrency 1 before and after {args.burst:g} s at concurrency 32\n")
    print("| server | c=1 fresh | c=32 burst | c=1 right after | c=1 a slice later |")
    print("|---|---:|---:|---:|---:|")
    for name, fresh, burst, after in rows:
        print(
            f"| {name} | {fresh['p50_ms']:.1f} | {burst['p50_ms']:.1f} ({burst['rps']:.0f} req/s) | "
            f"{after[0]['p50_ms']:.1f} | {after[1]['p50_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
