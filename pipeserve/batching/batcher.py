"""A typed batcher: callers submit single items and await their own result; batches run in order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeserve.batching.policy import ArrivalRate, BatchPolicy, LatencyModel, SizeTrial, TrialHistory
from pipeserve.errors import DeadlineExceeded, NotReady, Overloaded

T = TypeVar("T")
R = TypeVar("R")

BatchFn = Callable[[list[T]], Awaitable[list[R]]]

logger = logging.getLogger(__name__)

#: In adaptive mode, every this many batches a trial compares another size with the one in use (``SizeTrial``, 16
#: batches, 8 of them at the other size: about 6% of batches).
EXPLORE_EVERY = 128


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What ran: for metrics and the log line of each request in the batch."""

    batch_id: int
    size: int
    items: int
    queue_wait_s: float
    run_s: float
    worker: int = 0
    #: When it started (``time.monotonic()``).
    started_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Traced(Generic[R]):
    """An item's result with the batch it ran in and how long it waited in the queue."""

    result: R
    batch: BatchInfo
    queue_wait_s: float


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: T
    size: int
    future: asyncio.Future[tuple[R, BatchInfo, float]]
    deadline_s: float | None
    enqueued_s: float = field(default_factory=time.monotonic)


class Batcher(Generic[T, R]):
    """Runs ``fn`` over batches of submitted items; every caller gets its own result or the batch's error.

    ``fn`` takes a list of items and returns a list of results of the same length and order; pass one ``fn``
    per worker (a sequence) to bind each worker to its own model replica. Items can count as several rows
    (``size_of``), so a request carrying 3 rows fills 3 of ``max_batch_size``. FIFO: items run in the order
    they were submitted; an item whose caller went away or whose deadline passed is dropped before it runs.

    In adaptive mode the batcher learns how long a batch of each size takes (``latency``) from the batches it
    runs, to decide whether waiting for company pays and which batch size costs least per row.

    With a ``gate`` (e.g. a ``CpuLane``), a worker first waits its turn at the gate, then takes what is queued at
    that moment and runs it while holding the gate: the time spent waiting for the shared resource is the
    batching window, so a gated batcher never waits for company on top of it.

    Example:
        >>> async def double(xs: list[int]) -> list[int]:
        ...     return [2 * x for x in xs]
        >>> async def main() -> list[int]:
        ...     async with Batcher(double, BatchPolicy(max_batch_size=8)) as b:
        ...         return list(await asyncio.gather(*(b.submit(i) for i in range(5))))
        >>> asyncio.run(main())
        [0, 2, 4, 6, 8]
    """

    def __init__(
        self,
        fn: BatchFn[T, R] | Sequence[BatchFn[T, R]],
        policy: BatchPolicy,
        *,
        name: str = "batcher",
        size_of: Callable[[T], int] | None = None,
        on_batch: Callable[[BatchInfo], None] | None = None,
        learns_latency: bool = True,
    ) -> None:
        fns = list(fn) if isinstance(fn, Sequence) else [fn] * policy.workers
        if len(fns) != policy.workers:
            raise ValueError(f"{name}: {len(fns)} batch functions for {policy.workers} workers; give one per worker")
        self._fns = fns
        self.policy = policy
        self.name = name
        self._size_of = size_of
        self._on_batch = on_batch
        # When ``fn`` waits for a shared thread pool, its wall time includes that wait; such a caller turns this
        # off and feeds ``latency`` with the engine's own time instead.
        self._learns_latency = learns_latency
        self._queue: deque[_Pending[T, R]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._batch_counter = 0
        self._explored = 0
        #: The sizes adaptive mode tries while it learns: max_batch_size, 1, 2, 4, ... below it.
        powers = (1 << i for i in range(policy.max_batch_size.bit_length()))
        self._ladder = [policy.max_batch_size, *(size for size in powers if size < policy.max_batch_size)]
        self._closing = False
        #: Held around taking and running each batch, when set (see the class docstring).
        self.gate: AbstractAsyncContextManager[None] | None = None
        #: With a gate: at most the rows expected to run within this many seconds per turn (>= 1 row).
        self.gate_budget_s: float | None = None
        self.latency = LatencyModel()
        self._arrivals = ArrivalRate()
        self._running = 0  # batches in progress
        # Adaptive mode: the size in use (chosen from the learned costs, then by trials) and the trial under way.
        self._best: tuple[int, int] | None = None  # (the latency model's generation, the size)
        self._trial: SizeTrial | None = None
        self._trial_generation = 0  # the latency model's generation when the trial began
        self._trials = 0
        self._history = TrialHistory()  # what the last trials of each pair of sizes found (for these costs)

    async def __aenter__(self) -> Batcher[T, R]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def sizes(self) -> list[int]:
        """The batch sizes adaptive mode tries while it learns, smallest first: 1, 2, 4, ... and the full size."""
        return sorted(self._ladder)

    @property
    def best_size(self) -> int | None:
        """Adaptive mode: the batch size it runs under load, ``None`` until two sizes are costed (and in fixed
        mode). It starts as the size cheapest per row in what was learned (the warm-up times every size); after
        that only trials change it (``SizeTrial``, every ``EXPLORE_EVERY`` batches, against a neighbouring size,
        decided with the pair's previous trials by ``TrialHistory``)."""
        if self.policy.mode != "adaptive":
            return None
        generation = self.latency.generation
        if self._best is None or self._best[0] != generation:
            best = self.latency.best_size(self.policy.max_batch_size, self.policy.batch_overhead_s)
            if best is None:
                return None
            self._best = (generation, best)
            self._trial = None
            self._history.clear()  # trials of forgotten costs
        return self._best[1]

    @property
    def queued(self) -> int:
        """Items waiting for a batch."""
        return len(self._queue)

    async def start(self) -> None:
        """Start the worker tasks on the running loop."""
        if self._workers:
            return
        self._closing = False
        self._wakeup = asyncio.Event()
        self._workers = [
            asyncio.create_task(self._work(i), name=f"{self.name}-worker-{i}") for i in range(self.policy.workers)
        ]

    async def stop(self, grace_s: float = 5.0) -> None:
        """Finish queued work within ``grace_s``, then cancel; waiting callers get ``NotReady``."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._workers = []
        while self._queue:
            entry = self._queue.popleft()
            if not entry.future.done():
                entry.future.set_exception(NotReady(f"{self.name} stopped before this request ran"))

    async def submit(self, item: T, *, deadline_s: float | None = None) -> R:
        """Queue ``item`` and wait for its result.

        ``deadline_s`` is a ``time.monotonic()`` instant: if the item is still queued then, it never runs and
        the caller gets ``DeadlineExceeded``.

        Raises:
            Overloaded: the queue is full; retry later.
            NotReady: the batcher is not running.
            DeadlineExceeded: the deadline passed while the item waited.
        """
        result, _, _ = await self._enqueue(item, deadline_s)
        return result

    async def submit_traced(self, item: T, *, deadline_s: float | None = None) -> Traced[R]:
        """``submit``, also returning the batch the item ran in and its own queue wait."""
        result, info, wait_s = await self._enqueue(item, deadline_s)
        return Traced(result, info, wait_s)

    def runs_alone(self, *, only_request: bool = False) -> bool:
        """Whether an item submitted now would be the next batch, alone, so that ``run_alone`` gives the same
        answer without the queue's hops: nothing is queued or running, and batches of one are what this batcher
        runs (``max_batch_size`` 1, or adaptive mode found one row cheapest per row and is not due to try another
        size), or ``only_request`` (the caller knows no other request is in progress anywhere in the server) and
        the batcher would not wait for company (greedy, or adaptive with the next request not expected soon
        enough for waiting to pay).

        Not merely "nothing is queued": requests that arrived together wait in the event loop for their turn to
        submit, and only the queue lets them meet in a batch (run alone as each came up, an inference server's
        batches of a model cheapest at 2 stayed at 1).
        """
        if self._wakeup is None or self._closing or self._queue or self._running:
            return False
        policy = self.policy
        if policy.max_batch_size == 1:
            return True
        exploring = self._trial is not None or (self._batch_counter > 0 and self._batch_counter % EXPLORE_EVERY == 0)
        if policy.mode == "adaptive" and not exploring and self.best_size == 1:
            return True
        if not only_request:
            return False
        if policy.max_wait_s == 0:
            return True
        if policy.mode != "adaptive" or exploring:
            return False
        gap = self._arrivals.expected_gap_s()  # as _collect decides whether to wait for a second row
        return gap is None or gap >= self.latency.saving_s(1) or gap >= policy.max_wait_s

    async def run_alone(self, item: T, *, deadline_s: float | None = None) -> Traced[R]:
        """Run ``item`` as a batch of its own, now, on worker 0: for when ``runs_alone()`` (the caller checks, and
        holds the gate if there is one). Counted, timed and reported like any batch.

        Raises:
            DeadlineExceeded: the deadline has passed already.
            Exception: whatever the batch function raised.
        """
        now = time.monotonic()
        if deadline_s is not None and now >= deadline_s:
            raise DeadlineExceeded(f"the request's deadline passed before {self.name} ran it")
        self._arrivals.arrived(now)
        size = self._size_of(item) if self._size_of is not None else 1
        results, info = await self._execute([item], size, 0, now)
        return Traced(results[0], info, info.queue_wait_s)

    def _enqueue(self, item: T, deadline_s: float | None) -> asyncio.Future[tuple[R, BatchInfo, float]]:
        if self._wakeup is None or self._closing:
            raise NotReady(f"{self.name} is not running")
        if len(self._queue) >= self.policy.max_queue_size:
            raise Overloaded(
                f"{self.name} queue is full ({self.policy.max_queue_size} waiting)", retry_after_s=self._retry_after_s()
            )
        size = self._size_of(item) if self._size_of is not None else 1
        future: asyncio.Future[tuple[R, BatchInfo, float]] = asyncio.get_running_loop().create_future()
        entry = _Pending(item, size, future, deadline_s)
        self._queue.append(entry)
        self._arrivals.arrived(entry.enqueued_s)
        self._wakeup.set()
        return future

    def _retry_after_s(self) -> float:
        return max(1.0, round(self.policy.max_wait_s * 4, 1))

    async def _work(self, worker: int) -> None:
        assert self._wakeup is not None  # start() sets it
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            gate = self.gate
            if gate is None:
                batch = await self._collect()
                if batch:
                    await self._run(batch, worker)
                continue
            async with gate:
                batch = []
                limit = self._size_limit()
                if self.gate_budget_s is not None:
                    limit = self.latency.rows_within(self.gate_budget_s, limit)
                self._take(batch, 0, limit)
                if batch:
                    await self._run(batch, worker)

    def _size_limit(self) -> int:
        """Rows per batch: ``max_batch_size``, or in adaptive mode the size that costs least per row.

        Adaptive mode learns that size by trying others: the full size, 1, 2, 4, ... in turn, on every batch
        until two sizes have been costed (the warm-up times them all); then, every ``EXPLORE_EVERY`` batches, a
        ``SizeTrial`` alternates blocks of a neighbouring size of the ladder with the one in use and keeps the cheaper.
        Under a queue that is always deep, batches would otherwise only ever be full, and a model that is slower
        per row in large batches (common on CPUs) would never find out.
        """
        policy = self.policy
        if policy.mode != "adaptive":
            return policy.max_batch_size
        best = self.best_size
        if best is None:
            size = self._ladder[self._explored % len(self._ladder)]
            self._explored += 1
            return size
        if self._trial is None and self._batch_counter and self._batch_counter % EXPLORE_EVERY == 0:
            self._trial = SizeTrial(best, self._neighbour(best))
            self._trial_generation = self.latency.generation
            self._trials += 1
        planned = self._trial.next_size if self._trial is not None else None
        return planned if planned is not None else best

    def _neighbour(self, size: int) -> int:
        """The next smaller and the next larger size of the ladder, in turn (the only one at either end)."""
        ladder = sorted(set(self._ladder) | {size})
        index = ladder.index(size)
        below = ladder[index - 1] if index > 0 else None
        above = ladder[index + 1] if index + 1 < len(ladder) else None
        if below is None or (above is not None and self._trials % 2):
            return above if above is not None else size
        return below

    def _trial_ran(self, observed_before: int) -> None:
        """A batch of the trial under way ran: record its cost (the latency model's observation of it)."""
        trial = self._trial
        assert trial is not None
        latency = self.latency
        if latency.observed > observed_before and latency.last is not None:
            rows, seconds = latency.last
            trial.record(rows, seconds + self.policy.batch_overhead_s)
        else:
            trial.record(0, 0.0)  # not costed: a miss
        if trial.done:
            # Else what was learned was forgotten meanwhile: best_size starts over from the new costs.
            if self._trial_generation == latency.generation:
                self._best = (latency.generation, self._history.add(trial))
            self._trial = None

    def _take(self, batch: list[_Pending[T, R]], rows: int, limit: int) -> int:
        """Move queued items into ``batch`` while they fit; drop the ones nobody waits for. Returns rows."""
        now = time.monotonic()
        while self._queue and rows < limit:
            entry = self._queue[0]
            if batch and rows + entry.size > limit:
                break
            self._queue.popleft()
            if entry.future.done():  # the caller went away (cancelled, disconnected): drop it before it costs
                continue
            if entry.deadline_s is not None and now >= entry.deadline_s:
                waited = now - entry.enqueued_s
                entry.future.set_exception(
                    DeadlineExceeded(
                        f"the request's deadline passed after {waited * 1000:.0f} "
                        f"ms in {self.name}'s queue; it did not run"
                    )
                )
                continue
            batch.append(entry)
            rows += entry.size
        return rows

    async def _collect(self) -> list[_Pending[T, R]]:
        """Take a batch: what is queued now and, when the policy says waiting pays, what arrives soon."""
        policy = self.policy
        limit = self._size_limit()
        batch: list[_Pending[T, R]] = []
        rows = self._take(batch, 0, limit)
        if not batch or policy.max_wait_s <= 0:
            return batch
        deadline = batch[0].enqueued_s + policy.max_wait_s
        while rows < limit and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if policy.mode == "adaptive":
                gap = self._arrivals.expected_gap_s()
                # Waiting for the next request delays everyone queued by ~gap; its joining saves this much compute.
                if gap is None or gap >= self.latency.saving_s(rows) or gap >= remaining:
                    break
                remaining = min(remaining, 2 * gap)
            if not await self._wait_for_more(remaining):
                break
            rows = self._take(batch, rows, limit)
        return batch

    async def _wait_for_more(self, timeout_s: float) -> bool:
        assert self._wakeup is not None  # start() sets it
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _run(self, batch: list[_Pending[T, R]], worker: int) -> None:
        rows = sum(entry.size for entry in batch)
        try:
            results, info = await self._execute([entry.item for entry in batch], rows, worker, batch[0].enqueued_s)
        except asyncio.CancelledError:
            _fail(batch, NotReady(f"{self.name} stopped while this request ran"))
            raise
        except Exception as exc:  # noqa: BLE001 - the error belongs to every caller of this batch
            _fail(batch, exc)
            return
        started = info.started_s
        for entry, result in zip(batch, results, strict=True):
            if not entry.future.done():
                entry.future.set_result((result, info, started - entry.enqueued_s))

    async def _execute(
        self, items: list[T], rows: int, worker: int, first_enqueued_s: float
    ) -> tuple[list[R], BatchInfo]:
        """Run one batch: its results (checked to be one per item) and what ran; reported after the caller's turn."""
        self._batch_counter += 1
        batch_id = self._batch_counter
        observed_before = self.latency.observed
        started = time.monotonic()
        self._running += 1
        try:
            results = await self._fns[worker](items)
        except BaseException:
            if self._trial is not None:  # a size that fails is never tried again by this trial: the size in use stays
                self._best, self._trial = (self.latency.generation, self._trial.incumbent), None
            raise
        finally:
            self._running -= 1
        if len(results) != len(items):
            raise RuntimeError(f"{self.name}: batch function returned {len(results)} results for {len(items)} items")
        run_s = time.monotonic() - started
        if self._learns_latency:
            self.latency.observe(rows, run_s)
        if self._trial is not None:
            self._trial_ran(observed_before)
        info = BatchInfo(batch_id, rows, len(items), started - first_enqueued_s, run_s, worker, started)
        if self._on_batch is not None:  # after the callers' answers are out: metrics are not on their clock
            asyncio.get_running_loop().call_soon(self._report, info)
        return results, info

    def _report(self, info: BatchInfo) -> None:
        assert self._on_batch is not None
        try:
            self._on_batch(info)
        except Exception:
            logger.exception("%s: on_batch callback failed", self.name)


def _fail(batch: list[_Pending[T, R]], exc: BaseException) -> None:
    for entry in batch:
        if not entry.future.done():
            entry.future.set_exception(exc)
