"""Admission for every service entry point: a bound on requests in progress, and the request's deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from pipeserve._eager import run_within
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

    async def run(self, work: Callable[[], Coroutine[Any, Any, T]], timeout_s: float | None, *, what: str) -> T:
        if self.in_flight >= self.max_in_flight:
            raise Overloaded(f"the server has {self.in_flight} requests in flight, its limit", retry_after_s=1.0)
        self.in_flight += 1
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        token = request_deadline.set(deadline) if deadline is not None else None
        # The transport's count when it has one (requests received, admitted or not yet), else the admitted ones.
        counted = requests_in_progress.set(self._count) if requests_in_progress.get() is None else None
        try:
            if timeout_s is None or deadline is None:
                return await work()
            # The deadline's timer is armed only if the work waits: a request that runs start to finish on the
            # event loop (a model alone on a single core) cannot be interrupted anyway, and a timer armed and
            # cancelled per request was ~40 us of its cold path.
            try:
                return cast(T, await run_within(work(), deadline))
            except TimeoutError:
                raise DeadlineExceeded(f"{what} took longer than its deadline of {timeout_s * 1000:.0f} ms") from None
        finally:
            self.in_flight -= 1
            if counted is not None:
                requests_in_progress.reset(counted)
            if token is not None:
                request_deadline.reset(token)
