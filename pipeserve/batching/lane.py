"""A CPU lane: on a single core, CPU-bound work runs on the event loop itself, one job at a time, in order."""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class CpuLane:
    """FIFO mutual exclusion for sync work run *on* the event loop, with the loop's I/O polled between holders.

    On a process that may use one core, a worker thread cannot run beside the event loop: handing CPU-bound work
    to it only adds the hop (two futures, a wake-up through the loop's self-pipe, context switches) and lets the
    loop's socket reads preempt the engine in the middle of a run (measured on imagenet at concurrency 32: 4%
    fewer images/s than running the same work on the loop). The lane runs the work on the loop instead, but one
    holder at a time, in the order they asked: when a holder leaves, the next is let in on a later loop
    iteration, after the loop has polled its sockets. Health checks, new connections and ``/metrics`` therefore
    wait for at most one job, and the jobs queue FIFO like they would for the one worker thread.

    Only short jobs belong here (the pipeline sends jobs that typically take under ``MAX_JOB_S``); longer ones
    still go to a worker thread, which the OS preempts so that the loop keeps answering.

    Example:
        >>> lane = CpuLane()
        >>> async def job(x: int) -> int:
        ...     async with lane:
        ...         return x * 2  # sync work, on the loop; nobody else holds the lane meanwhile
        >>> asyncio.run(job(21))
        42
    """

    #: The longest a job may typically take to run on the lane (the loop answers nothing else meanwhile).
    MAX_JOB_S = 0.1

    __slots__ = ("_held", "_waiters", "jobs")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: Jobs that have held the lane, for tests and diagnostics.
        self.jobs = 0

    @property
    def waiting(self) -> int:
        """Jobs waiting for their turn."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    @property
    def is_held(self) -> bool:
        return self._held

    async def __aenter__(self) -> None:
        if not self._held and not self._waiters:
            self._held = True
            self.jobs += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # let in, but cancelled before it ran: pass the turn on
            raise
        self.jobs += 1

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    def _release(self) -> None:
        # The lane stays held until the loop has turned (polled its sockets): then the next waiter is let in, or
        # the lane is free again. Freeing it at once would let a job that became ready in this same iteration
        # run straight after, and a burst of them would hold the loop for the whole burst.
        asyncio.get_running_loop().call_soon(self._admit_next)

    def _admit_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter (deadline, disconnect) just drops out
                waiter.set_result(None)
                return
        self._held = False
