"""A typed batcher: callers submit single items and await their own result; batches run in order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeserve.batching.policy import BatchPolicy
from pipeserve.errors import NotReady, Overloaded

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: T
    size: int
    future: asyncio.Future[R]
    enqueued_s: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What ran: for metrics and the log line of each request in the batch."""

    batch_id: int
    size: int
    queue_wait_s: float
    run_s: float


class Batcher(Generic[T, R]):
    """Runs ``fn`` over batches of submitted items; every caller gets its own result or the batch's error.

    ``fn`` takes a list of items and returns a list of results of the same length and order. Items can
    count as several rows (``size_of``), so a request carrying 3 rows fills 3 of ``max_batch_size``.

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
        fn: Callable[[list[T]], Awaitable[list[R]]],
        policy: BatchPolicy,
        *,
        name: str = "batcher",
        size_of: Callable[[T], int] | None = None,
        on_batch: Callable[[BatchInfo], None] | None = None,
    ) -> None:
        self._fn = fn
        self.policy = policy
        self.name = name
        self._size_of = size_of
        self._on_batch = on_batch
        self._queue: deque[_Pending[T, R]] = deque()
        self._queued_rows = 0
        self._wakeup: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._batch_counter = 0
        self._closing = False

    async def __aenter__(self) -> Batcher[T, R]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

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
            asyncio.create_task(self._work(), name=f"{self.name}-worker-{i}") for i in range(self.policy.workers)
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
        self._queued_rows = 0

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for its result.

        Raises:
            Overloaded: the queue is full; retry later.
            NotReady: the batcher is not running.
        """
        if self._wakeup is None or self._closing:
            raise NotReady(f"{self.name} is not running")
        if len(self._queue) >= self.policy.max_queue_size:
            raise Overloaded(
                f"{self.name} queue is full ({self.policy.max_queue_size} waiting)", retry_after_s=self._retry_after_s()
            )
        size = self._size_of(item) if self._size_of is not None else 1
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(item, size, future))
        self._queued_rows += size
        self._wakeup.set()
        return await future

    def _retry_after_s(self) -> float:
        return max(1.0, round(self.policy.max_wait_s * 4, 1))

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            batch = await self._collect()
            if batch:
                await self._run(batch)

    async def _collect(self) -> list[_Pending[T, R]]:
        """Take a batch: what is queued now, and when ``max_wait_s`` > 0, what arrives until the first item's
        wait is up or the batch is full."""
        policy = self.policy
        batch: list[_Pending[T, R]] = []
        rows = 0
        deadline: float | None = None
        while rows < policy.max_batch_size:
            if not self._queue:
                if policy.max_wait_s <= 0 or deadline is None or self._closing:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await self._wait_for_more(remaining):
                    break
                continue
            entry = self._queue[0]
            if batch and rows + entry.size > policy.max_batch_size:
                break
            self._queue.popleft()
            self._queued_rows -= entry.size
            if entry.future.done():  # the caller went away (cancelled): drop it before it costs anything
                continue
            if deadline is None:
                deadline = entry.enqueued_s + policy.max_wait_s
            batch.append(entry)
            rows += entry.size
        return batch

    async def _wait_for_more(self, timeout_s: float) -> bool:
        assert self._wakeup is not None
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _run(self, batch: list[_Pending[T, R]]) -> None:
        self._batch_counter += 1
        started = time.monotonic()
        try:
            results = await self._fn([entry.item for entry in batch])
            if len(results) != len(batch):
                raise RuntimeError(
                    f"{self.name}: batch function returned {len(results)} results for {len(batch)} items"
                )
        except asyncio.CancelledError:
            _fail(batch, NotReady(f"{self.name} stopped while this request ran"))
            raise
        except Exception as exc:  # noqa: BLE001 - the error belongs to every caller of this batch
            _fail(batch, exc)
        else:
            for entry, result in zip(batch, results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
        finally:
            if self._on_batch is not None:
                wait = started - min(entry.enqueued_s for entry in batch)
                rows = sum(entry.size for entry in batch)
                try:
                    self._on_batch(BatchInfo(self._batch_counter, rows, wait, time.monotonic() - started))
                except Exception:
                    logger.exception("%s: on_batch callback failed", self.name)


def _fail(batch: list[_Pending[T, R]], exc: BaseException) -> None:
    for entry in batch:
        if not entry.future.done():
            entry.future.set_exception(exc)
