"""Admission for every service entry point: a bound on requests in progress, and the request's deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pipeserve.errors import DeadlineExceeded, Overloaded
from pipeserve.pipeline.context import request_deadline, requests_in_progress

T = TypeVar("T")


class Admission:
    """At most ``max_in_flight`` requests at once (more get ``Overloaded``, i.e. 503 + Retry-After), each within
    its deadline: queued work past it never runs (the batchers read ``request_deadline``) and the caller gets
    ``DeadlineExceeded``.

    Example:
        >>> admission = Admission(256)
        >>> await admission.run(lambda: pipeline.run(x), timeout_s=2.0, what="the request")  # doctest: +SKIP
    """

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._count = lambda: self.in_flight

    async def run(self, work: Callable[[], Awaitable[T]], timeout_s: float | None, *, what: str) -> T:
        if self.in_flight >= self.max_in_flight:
            raise Overloaded(f"the server has {self.in_flight} requests in flight, its limit", retry_after_s=1.0)
        self.in_flight += 1
        token = request_deadline.set(time.monotonic() + timeout_s) if timeout_s is not None else None
        counted = requests_in_progress.set(self._count)
        try:
            if timeout_s is None:
                return await work()
            try:
                async with asyncio.timeout(timeout_s):
                    return await work()
            except TimeoutError:
                raise DeadlineExceeded(f"{what} took longer than its deadline of {timeout_s * 1000:.0f} ms") from None
        finally:
            self.in_flight -= 1
            requests_in_progress.reset(counted)
            if token is not None:
                request_deadline.reset(token)
