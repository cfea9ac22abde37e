"""How a batcher groups work. Pure values; no I/O."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Limits for one model's batcher.

    Attributes:
        max_batch_size: most rows (items, for size-1 items) run together; 1 turns batching off.
        max_wait_s: how long the first item of a batch may wait for others. 0 means "greedy": run what is
            queued the moment a worker is free, so an idle server adds no delay and a busy one batches.
        max_queue_size: items waiting beyond this are refused (``Overloaded``), never queued unbounded.
        workers: batches that may run at once (model replicas / engine threads).

    Example:
        >>> BatchPolicy(max_batch_size=32, max_wait_s=0.002).is_batching
        True
    """

    max_batch_size: int = 1
    max_wait_s: float = 0.0
    max_queue_size: int = 1024
    workers: int = 1

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.max_wait_s < float("inf"):  # also refuses NaN, which compares false with everything
            raise ValueError(f"max_wait_s must be a finite number of seconds >= 0, got {self.max_wait_s}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    @property
    def is_batching(self) -> bool:
        return self.max_batch_size > 1
