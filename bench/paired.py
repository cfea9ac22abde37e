"""Paired measurements: every contender's slice runs right after a slice of the in-process limit on the same core.

This machine's speed drifts by 10-15% within a minute (neighbours on the host: ONNX Runtime alone measured
155-189 images/s from one second to the next), so a table of medians taken minutes apart can show a server at
120% of "the limit" or at 75%. Pairing fixes that: each contender slice is divided by the limit measured seconds
before it, and the ratio's median over rounds is what the targets are checked against (the spread is reported).

The limit is the engine's best batch size, not batch 1: with EfficientNet-Lite0 in ONNX Runtime on one core a
batch of 2 ran 5-9% faster per image than a batch of 1 in a loop (4 and 8 vary by machine). Each round measures
the engine at every candidate size back to back (``batch_rates``); the size with the best median ratio over rounds
sets the factor (``batch_factor``) by which each paired batch-1 slice is scaled.

The load sources stay up for the whole run (``LoopProcess``): a slice costs its duration, not a Python start.
A server still works after its load stops (the requests queued when wrk closed its connections); ``settle`` waits
for the cores to go idle before the next slice, which would otherwise pay for that work.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _core_times(cores: Sequence[int]) -> tuple[int, int]:
    """(busy, total) jiffies of ``cores`` so far, from /proc/stat."""
    busy = total = 0
    wanted = {f"cpu{core}" for core in cores}
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name in wanted:
                values = [int(v) for v in fields[:8]]
                total += sum(values)
                busy += sum(values) - values[3] - values[4]  # minus idle and iowait
    return busy, total


def settle(cores: Sequence[int], *, below: float = 0.25, window_s: float = 0.2, timeout_s: float = 10.0) -> float:
    """Wait until ``cores`` are busy less than ``below`` of a ``window_s`` window (the last slice's server has
    finished the requests it had queued: it works flat out until then, while an idle LitServe polls at ~13%);
    give up after ``timeout_s``. Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        busy0, total0 = _core_times(cores)
        time.sleep(window_s)
        busy1, total1 = _core_times(cores)
        if total1 > total0 and (busy1 - busy0) / (total1 - total0) < below:
            break
    return time.monotonic() - started


def pinned_module(core: int, module: str, *args: str) -> list[str]:
    """The command running ``python -m module args`` (this interpreter) pinned to ``core``."""
    return ["taskset", "-c", str(core), sys.executable, "-m", module, *args]


class LoopProcess:
    """A process that measures on request: one line of arguments in, one JSON line out (see bench/apps)."""

    def __init__(self, command: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.command = list(command)
        self._process = subprocess.Popen(
            self.command,
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self, *args: object) -> dict[str, Any]:
        self.start(*args)
        return self.result()

    def start(self, *args: object) -> None:
        """Ask for a measurement without waiting for it (to run several loops at once)."""
        assert self._process.stdin is not None
        self._process.stdin.write(" ".join(str(a) for a in args) + "\n")
        self._process.stdin.flush()

    def result(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"{' '.join(self.command)} exited ({self._process.wait()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()


def batch_rates(limit: LoopProcess, sizes: Sequence[int], slice_s: float, round_: int = 0) -> dict[int, float]:
    """Images/s at each of ``sizes`` relative to batch 1, measured back to back (one round's sample), largest
    first in odd rounds so that a drift of the machine's speed during the sweep favours no size over the rounds."""
    order = list(sizes) if round_ % 2 == 0 else list(reversed(sizes))
    rates = {size: limit.measure(size, slice_s)["rps"] for size in order}
    return {size: rates[size] / rates[1] for size in sizes}


def batch_factor(rounds: Sequence[dict[int, float]]) -> tuple[float, int]:
    """(the limit at its best batch size / the limit at batch 1, that size) over all rounds: the best size is the
    one whose median ratio is highest. (The best of each round's noisy rates would be biased upward.)"""
    medians = {size: statistics.median(r[size] for r in rounds) for size in rounds[0]}
    best = max(medians, key=lambda size: medians[size])
    return medians[best], best


def apply_factors(pairs: Sequence[Pair], factors: dict[str, float], engine_of: Callable[[str], str]) -> None:
    """Set each pair's factor to its engine's (known only once every round is in)."""
    for pair in pairs:
        pair.factor = factors[engine_of(pair.contender)]


@dataclass
class Pair:
    """One contender slice and the batch-1 limit slice right before it (and the round's batch factor)."""

    round: int
    contender: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    limit_b1_rps: float
    limit_b1_p50_ms: float
    factor: float
    mean_batch: float | None = None

    @property
    def vs_limit(self) -> float:
        return self.rps / (self.limit_b1_rps * self.factor)

    @property
    def vs_batch1(self) -> float:
        return self.rps / self.limit_b1_rps

    @property
    def added_p50_ms(self) -> float:
        return self.p50_ms - self.limit_b1_p50_ms


@dataclass
class Summary:
    """Medians over rounds of one contender at one concurrency."""

    contender: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    vs_limit: float
    vs_limit_iqr: tuple[float, float]
    vs_batch1: float
    added_p50_ms: float
    limit_rps: float
    mean_batch: float | None = None
    rounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(pairs: Sequence[Pair]) -> list[Summary]:
    """One row per (contender, concurrency), in the order they were first measured."""
    keys: list[tuple[str, int]] = []
    for pair in pairs:
        if (pair.contender, pair.concurrency) not in keys:
            keys.append((pair.contender, pair.concurrency))
    keys.sort(key=lambda key: key[1])
    rows = []
    for contender, concurrency in keys:
        group = [p for p in pairs if (p.contender, p.concurrency) == (contender, concurrency)]
        ratios = sorted(p.vs_limit for p in group)
        batches = [p.mean_batch for p in group if p.mean_batch is not None]
        rows.append(
            Summary(
                contender,
                concurrency,
                statistics.median(p.rps for p in group),
                statistics.median(p.p50_ms for p in group),
                statistics.median(p.p99_ms for p in group),
                statistics.median(ratios),
                (_quantile(ratios, 0.25), _quantile(ratios, 0.75)),
                statistics.median(p.vs_batch1 for p in group),
                statistics.median(p.added_p50_ms for p in group),
                statistics.median(p.limit_b1_rps * p.factor for p in group),
                statistics.median(batches) if batches else None,
                len(group),
            )
        )
    return rows


def _quantile(ordered: Sequence[float], q: float) -> float:
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
