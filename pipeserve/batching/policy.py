"""How a batcher groups work, and what it learns about batch cost. Pure values and arithmetic; no I/O."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

BatchMode = Literal["fixed", "adaptive"]

#: In the warm-up's estimates (``LatencyModel.best_size``; trials use ``TrialHistory``), per-row costs within this
#: factor of the best count as a tie, which the smaller batch size wins: at saturation
#: a size k% dearer per row costs k% of the throughput, and small sizes are the ones whose estimates go stale
#: (measured at low load, when caches are cold) while big batches run under load.
TIE = 1.02

#: What one batch costs a server beyond its engine run, by default: waking the batcher, merging and splitting the
#: rows, answering its callers, and re-warming the caches the engine evicted for the requests' own work. The
#: engine's time alone misses it, and then sizes that run the engine equally fast per row look equal although the
#: smaller one costs the server more per row. Measured on one core of an AMD EPYC (EfficientNet-Lite0 in ONNX
#: Runtime at ~65 images/s): 0.9 ms per batch in pipeserve and 1.1 ms in a bare uvicorn server with a greedy
#: batcher, from their time per image outside the engine at batches of 2, 4 and 8 (``make bench-request-cost``).
BATCH_OVERHEAD_S = 0.001


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Limits for one model's batcher.

    Attributes:
        max_batch_size: most rows (items, for size-1 items) run together; 1 turns batching off.
        max_wait_s: how long the first item of a batch may wait for others. 0 means "greedy": run what is
            queued the moment a worker is free, so an idle server adds no delay and a busy one batches.
        max_queue_size: items waiting beyond this are refused (``Overloaded``), never queued unbounded.
        workers: batches that may run at once (model replicas / engine threads).
        mode: ``fixed`` waits up to ``max_wait_s`` for a full batch; ``adaptive`` waits only while the next
            request is expected sooner than the compute its joining would save (learned from the batches run),
            never longer than ``max_wait_s``.
        batch_overhead_s: adaptive mode: what one batch costs the server beyond its engine run, added to each
            batch's measured engine time when sizes are compared per row (see ``BATCH_OVERHEAD_S``).

    Example:
        >>> BatchPolicy(max_batch_size=32, max_wait_s=0.002).is_batching
        True
    """

    max_batch_size: int = 1
    max_wait_s: float = 0.0
    max_queue_size: int = 1024
    workers: int = 1
    mode: BatchMode = "fixed"
    batch_overhead_s: float = BATCH_OVERHEAD_S

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.max_wait_s < float("inf"):  # also refuses NaN, which compares false with everything
            raise ValueError(f"max_wait_s must be a finite number of seconds >= 0, got {self.max_wait_s}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.mode not in ("fixed", "adaptive"):
            raise ValueError(f"mode must be 'fixed' or 'adaptive', got {self.mode!r}")
        if not 0 <= self.batch_overhead_s < float("inf"):
            raise ValueError(f"batch_overhead_s must be a finite number of seconds >= 0, got {self.batch_overhead_s}")

    @property
    def is_batching(self) -> bool:
        return self.max_batch_size > 1


@dataclass(slots=True)
class LatencyModel:
    """Batch run time as a function of batch size, learned from the batches observed.

    Each observed size keeps its last ``window`` run times and counts their median: one cold run (an engine's
    first at a new shape allocates; a batch tried once in a while runs with cold caches) does not skew it, as it
    skewed a moving average for dozens of runs. Sizes not seen yet are estimated by a least-squares line through
    the seen ones (or, with one size seen, as proportional to the size: no saving assumed).

    Example:
        >>> model = LatencyModel()
        >>> for _ in range(5):
        ...     model.observe(1, 0.010); model.observe(8, 0.024)
        >>> round(model.estimate(4) * 1000, 1)
        16.0
        >>> round(model.saving_s(1) * 1000, 1)   # a 2nd request joining a batch of 1 saves 8 ms of compute
        8.0
    """

    window: int = 9
    _runs: dict[int, deque[float]] = field(default_factory=dict)
    _by_size: dict[int, float] = field(default_factory=dict)
    _fastest: dict[int, float] = field(default_factory=dict)
    #: Batches observed so far, and the last one's (rows, seconds).
    observed: int = 0
    last: tuple[int, float] | None = None
    #: How many times it forgot what it learned.
    generation: int = 0

    def observe(self, size: int, seconds: float) -> None:
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        self.observed += 1
        self.last = (size, seconds)
        runs = self._runs.get(size)
        if runs is None:
            runs = self._runs[size] = deque(maxlen=self.window)
        runs.append(seconds)
        self._by_size[size] = _median(list(runs))  # one assignment: readers in other threads see old or new
        self._fastest[size] = min(runs)

    def by_size(self) -> dict[int, float]:
        """The learned seconds per batch, by batch size."""
        return dict(self._by_size)

    @property
    def sizes_seen(self) -> int:
        return len(self._by_size)

    def estimate(self, size: int) -> float | None:
        """Seconds a batch of ``size`` rows takes, or ``None`` before any batch was seen."""
        learned = dict(self._by_size)  # a snapshot: worker threads may observe meanwhile
        if size in learned:
            return learned[size]
        if not learned:
            return None
        if len(learned) == 1:
            ((seen, seconds),) = learned.items()
            return seconds * size / seen
        sizes = list(learned)
        times = list(learned.values())
        mean_x, mean_y = sum(sizes) / len(sizes), sum(times) / len(times)
        var = sum((x - mean_x) ** 2 for x in sizes)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, times, strict=True)) / var
        return max(0.0, mean_y + slope * (size - mean_x))

    def forget(self) -> None:
        """Drop what was learned (e.g. the cold first runs of a warm-up)."""
        self._by_size.clear()
        self._fastest.clear()
        self._runs.clear()
        self.generation += 1

    def fastest(self, size: int) -> float | None:
        """The fastest of the last runs of ``size`` rows, or the estimate for a size not seen (``None`` before any
        batch). Noise only ever adds time: a size judged by its median could be pushed over a budget by one slow
        run, and a size kept out by a budget never runs again to correct it."""
        fastest = self._fastest.get(size)
        return fastest if fastest is not None else self.estimate(size)

    def rows_within(self, seconds: float, limit: int) -> int:
        """The most rows (1 to ``limit``) whose batch can run within ``seconds`` (``fastest``): the largest size
        seen that ran within it, then the sizes above it while their estimates fit."""
        fastest = dict(self._fastest)  # a snapshot: worker threads may observe meanwhile
        rows = max((size for size, run_s in fastest.items() if size <= limit and run_s <= seconds), default=1)
        for size in range(rows + 1, limit + 1):
            estimate = self.fastest(size)
            if estimate is None or estimate > seconds:
                break
            rows = size
        return rows

    def best_size(self, limit: int, overhead_s: float = 0.0) -> int | None:
        """The batch size (at most ``limit``) seen to take the least time per row, each batch charged
        ``overhead_s`` on top of its run; a smaller size wins when it is within 2% of the best (noise). ``None``
        until two sizes have been seen.

        On a CPU, per-row cost often stops falling (EfficientNet-Lite0 in ONNX Runtime) or rises (the same
        network in TorchScript: 27 ms at 1, 39 ms per image at 8, measured) as batches grow.

        Example:
            >>> model = LatencyModel()
            >>> model.observe(2, 0.0230); model.observe(4, 0.0455)   # the engine: 11.5 and 11.4 ms per row
            >>> model.best_size(8), model.best_size(8, overhead_s=0.001)
            (2, 4)
        """
        per_row = {
            size: (seconds + overhead_s) / size for size, seconds in dict(self._by_size).items() if size <= limit
        }
        if len(per_row) < 2:
            return None
        best = min(per_row.values())
        return min(size for size, cost in per_row.items() if cost <= best * TIE)

    def saving_s(self, size: int) -> float:
        """Compute saved when one more row joins a batch of ``size`` instead of running alone later."""
        one, now, more = self.estimate(1), self.estimate(size), self.estimate(size + 1)
        if one is None or now is None or more is None:
            return 0.0
        return max(0.0, one - (more - now))


@dataclass(slots=True)
class SizeTrial:
    """A candidate batch size tried against the size in use (the incumbent): blocks of ``block`` batches of each
    alternate, each batch costed per row. Its verdict is ``ratio()``, which the batcher weighs with the pair's
    previous trials (``TrialHistory``); ``winner()`` is this trial's verdict alone.

    Compared side by side because on a shared machine the speed drifts by 10-20% within a minute, as much as batch
    sizes differ: costs learned for each size at different moments compared the drift (an adaptive batcher picked
    mean batches of 1.9 in one run and 4.6 in the next, on the same load).

    The first batch of each block is run but not counted: an engine's first run after a change of input shape is
    dearer (EfficientNet-Lite0 in ONNX Runtime at batch 1 took 2-6% longer right after a batch of 2 than after
    another batch of 1: make bench-shape-switch), and a size in use runs batch after batch at its own shape. Trials
    of single batches in turn charged that cost to every batch they counted, per row mostly to the smaller size.

    Example:
        >>> trial = SizeTrial(incumbent=4, candidate=2, rounds=1)
        >>> trial.next_size
        2
        >>> for size, seconds in ((2, 0.030), (2, 0.024), (4, 0.060), (4, 0.052)):
        ...     trial.record(size, seconds)
        >>> trial.done, trial.winner()
        (True, 2)
    """

    incumbent: int
    candidate: int
    rounds: int = 4
    #: Batches of one size in a row; the first of each block settles the engine at the new shape, uncounted.
    block: int = 2
    #: Batches that were not the size planned (too few rows queued) before the trial is given up.
    max_misses: int = 6
    _plan: list[tuple[int, bool]] = field(default_factory=list)  # (size, counted)
    _per_row: dict[int, list[float]] = field(default_factory=dict)
    _misses: int = 0

    def __post_init__(self) -> None:
        if self.incumbent == self.candidate or min(self.incumbent, self.candidate) < 1:
            raise ValueError(f"a trial compares two batch sizes >= 1, got {self.incumbent} and {self.candidate}")
        if self.block < 2 or self.rounds < 1:
            raise ValueError(f"a trial needs blocks of >= 2 batches and >= 1 round, got {self.block}, {self.rounds}")
        for _ in range(self.rounds):
            for size in (self.candidate, self.incumbent):
                self._plan += [(size, False)] + [(size, True)] * (self.block - 1)
        self._per_row = {self.candidate: [], self.incumbent: []}

    @property
    def next_size(self) -> int | None:
        """The batch size to run next, or ``None`` once the trial is over."""
        return self._plan[0][0] if self._plan and self._misses < self.max_misses else None

    @property
    def done(self) -> bool:
        return self.next_size is None

    def record(self, rows: int, seconds: float) -> None:
        """A batch ran: it counts if it was the size planned next (and not a block's first)."""
        if self._plan and rows == self._plan[0][0]:
            size, counted = self._plan.pop(0)
            if counted:
                self._per_row[size].append(seconds / rows)
        else:
            self._misses += 1

    def ratio(self) -> float | None:
        """The larger size's median cost per row over the smaller's, or ``None`` if the trial was given up."""
        if self._plan or not all(self._per_row.values()):
            return None
        small, large = sorted((self.incumbent, self.candidate))
        return _median(self._per_row[large]) / _median(self._per_row[small])

    def winner(self) -> int:
        """The size to keep, on this trial alone: the candidate if the trial finished and it was cheaper (a smaller
        one also on a tie within ``TIE``), else the incumbent. The batcher decides on ``TrialHistory`` instead."""
        if self._plan:
            return self.incumbent  # given up (the queue was never deep enough for the planned sizes)
        candidate = _median(self._per_row[self.candidate])
        incumbent = _median(self._per_row[self.incumbent])
        if self.candidate < self.incumbent:
            return self.candidate if candidate <= incumbent * TIE else self.incumbent
        return self.candidate if candidate * TIE < incumbent else self.incumbent


@dataclass(slots=True)
class TrialHistory:
    """The verdicts of the last ``keep`` trials between each pair of sizes, and the size they favour together.

    One trial counts 4 batches of each size; with ~8% noise per batch (a shared CPU) its verdict on sizes 3% apart
    is wrong about a third of the time, and a tie band that favours one side makes that worse on the other. Each
    finished trial adds its ratio (the larger size's median cost per row over the smaller's); the size in use is
    the cheaper one by the median of the pair's last ``keep`` ratios, with no tie band: sizes that cost the same
    may alternate, at no cost. ``make bench-trial-noise`` simulates both rules.

    Example:
        >>> def trial(per_row_4: float) -> SizeTrial:   # 2 in use costs 1.0 per row
        ...     trial = SizeTrial(incumbent=2, candidate=4, rounds=1)
        ...     while (size := trial.next_size) is not None:
        ...         trial.record(size, (per_row_4 if size == 4 else 1.0) * size)
        ...     return trial
        >>> history = TrialHistory()
        >>> [history.add(trial(per_row_4)) for per_row_4 in (0.97, 1.05, 0.98)]   # medians 0.97, 1.01, 0.98
        [4, 2, 4]
        >>> given_up = SizeTrial(incumbent=2, candidate=4, max_misses=1)
        >>> given_up.record(3, 0.03)   # only 3 rows were queued: not the size planned
        >>> history.add(given_up)   # a trial given up keeps the size in use
        2
    """

    keep: int = 5
    _ratios: dict[tuple[int, int], deque[float]] = field(default_factory=dict)

    def add(self, trial: SizeTrial) -> int:
        """Record a finished trial and return the size to run: of its two sizes, the cheaper by the median ratio of
        the pair's last ``keep`` trials; its incumbent if it was given up, or on an exact tie."""
        ratio = trial.ratio()
        if ratio is None:
            return trial.incumbent
        small, large = sorted((trial.incumbent, trial.candidate))
        ratios = self._ratios.get((small, large))
        if ratios is None:
            ratios = self._ratios[(small, large)] = deque(maxlen=self.keep)
        ratios.append(ratio)
        median = _median(list(ratios))
        return large if median < 1 else small if median > 1 else trial.incumbent

    def clear(self) -> None:
        self._ratios.clear()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(slots=True)
class ArrivalRate:
    """Expected gap between arrivals: an exponential moving average of the observed gaps."""

    alpha: float = 0.1
    _last_s: float | None = None
    _gap_s: float | None = None

    def arrived(self, now_s: float) -> None:
        if self._last_s is not None:
            gap = max(0.0, now_s - self._last_s)
            self._gap_s = gap if self._gap_s is None else self._gap_s + self.alpha * (gap - self._gap_s)
        self._last_s = now_s

    def expected_gap_s(self) -> float | None:
        return self._gap_s
