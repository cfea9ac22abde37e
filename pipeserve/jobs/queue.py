"""Where jobs wait: the ``JobQueue`` protocol, and the embedded in-process queue (single machine only).

A queue keeps two things per job: a record (state, request, result or error, attempts), readable by id until
its TTL passes, and an entry in a FIFO from which workers receive it. A received entry stays *pending* until the
worker acks it; a worker that dies leaves its entries pending, and another receives them again once they have
been idle for the visibility timeout (at-least-once). Finishing is idempotent: the first result written wins,
so a job run twice is still reported once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pipeserve.errors import NotFound, Overloaded
from pipeserve.jobs.model import FINAL_STATES, JobRecord, JobRequest, new_job_id

#: How long a finished job's result is kept by default (and an unfinished job's record, counted from submission).
DEFAULT_RESULT_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One job handed to a worker: run it, finish it, then ``ack`` it; until the ack it may be delivered again.

    ``request`` is ``None`` when the job's record is gone (expired): there is nothing left to run. ``redelivered``:
    its previous worker went silent (died) with it in progress; it may be what killed that worker.
    """

    job_id: str
    entry_id: str
    request: JobRequest | None
    redelivered: bool = False


ClaimStatus = Literal["claimed", "sent", "busy", "unfinished"]


@dataclass(frozen=True, slots=True)
class NotificationClaim:
    """Whether a worker may send a job's webhook now.

    ``claimed``: yes (``record`` is the finished job); ``sent``: it was sent already; ``busy``: another worker began
    sending it less than the lease ago (it may have died: try again after the lease); ``unfinished``: the job has no
    outcome yet (or its record is gone).
    """

    status: ClaimStatus
    record: JobRecord | None = None


class JobQueue(Protocol):
    """What the REST API (submit, look up) and the workers (receive, finish, ack) need from a queue."""

    #: Where the queue lives, for logs and errors (``memory``, ``redis://host:6379/0``).
    location: str
    #: How long a received job may go without a heartbeat before another worker may receive it.
    visibility_timeout_s: float

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def submit(self, request: JobRequest) -> JobRecord:
        """Record and enqueue a job. Raises ``Overloaded`` when ``max_queued`` jobs are already waiting."""
        ...

    async def get(self, job_id: str) -> JobRecord:
        """The job's record. Raises ``NotFound`` for an unknown or expired id."""
        ...

    async def wait(self, job_id: str, timeout_s: float) -> JobRecord:
        """The job's record once it is done or failed, or as it stands after ``timeout_s``."""
        ...

    async def depth(self) -> int:
        """Jobs submitted and not yet finished (queued or running)."""
        ...

    async def receive(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        """Up to ``count`` jobs for ``consumer``: new ones, or ones another consumer left pending past the visibility
        timeout. Waits up to ``block_s`` when there are none."""
        ...

    async def begin(self, delivery: Delivery, consumer: str) -> int | None:
        """Mark the job running and count the attempt; the attempts so far, or ``None`` if already finished."""
        ...

    async def finish(
        self,
        delivery: Delivery,
        *,
        result: bytes | None = None,
        error: str | None = None,
        error_kind: str | None = None,
    ) -> bool:
        """Record the outcome unless one is recorded already (the first wins); ``True`` if this one was."""
        ...

    async def retry(self, delivery: Delivery, error: str) -> None:
        """Put the job back at the end of the queue (the current delivery must still be acked)."""
        ...

    async def dead_letter(self, delivery: Delivery, error: str, attempts: int) -> bool:
        """Fail the job for good and add it, with its last error, to the dead-letter stream."""
        ...

    async def claim_notification(self, job_id: str, lease_s: float) -> NotificationClaim:
        """Take the right to send the job's webhook for ``lease_s`` seconds, unless it was sent or is being sent."""
        ...

    async def notified(self, job_id: str) -> None: ...

    async def ack(self, delivery: Delivery) -> None:
        """Done with this delivery: it will not be delivered again."""
        ...

    async def heartbeat(self, consumer: str, deliveries: list[Delivery]) -> None:
        """Still working on these: keep them from looking abandoned."""
        ...


class MemoryJobQueue:
    """The embedded queue: the same semantics in one process, for ``pipeserve serve`` without ``--redis``.

    Single machine only: jobs live in this process's memory and are lost when it stops.

    Example:
        >>> queue = MemoryJobQueue(max_queued=100)
        >>> record = await queue.submit(JobRequest(data=[[5.1, 3.5, 1.4, 0.2]]))  # doctest: +SKIP
    """

    location = "memory (this process only)"

    def __init__(
        self,
        *,
        max_queued: int = 10_000,
        result_ttl_s: float = DEFAULT_RESULT_TTL_S,
        visibility_timeout_s: float = 60.0,
        release: str = "",
    ) -> None:
        self.max_queued = max_queued
        self.result_ttl_s = result_ttl_s
        self.visibility_timeout_s = visibility_timeout_s
        self.release = release
        self._records: dict[str, dict[str, Any]] = {}
        self._expires: dict[str, float] = {}
        self._fifo: deque[tuple[str, str]] = deque()
        self._pending: dict[str, tuple[str, str, float]] = {}  # entry -> (job, consumer, last seen)
        self._entries = 0
        self._next_expiry = 0.0
        self._arrived: asyncio.Event | None = None
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        #: The most recent dead letters (bounded, as the Redis stream is).
        self.dead: deque[dict[str, Any]] = deque(maxlen=10_000)

    async def start(self) -> None:
        self._arrived = asyncio.Event()

    async def stop(self) -> None:
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.cancel()
        self._waiters.clear()

    # -- clients -------------------------------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> JobRecord:
        self._expire()
        waiting = len(self._fifo) + len(self._pending)
        if waiting >= self.max_queued:
            raise Overloaded(f"the job queue is full ({waiting} jobs waiting)", retry_after_s=5.0)
        job_id = new_job_id()
        now = time.time()
        self._records[job_id] = {
            "state": "queued",
            "request": request,
            "submitted_at": now,
            "release": self.release,
            "attempts": 0,
            "callback_url": request.callback_url,
        }
        self._expires[job_id] = time.monotonic() + self.result_ttl_s
        self._push(job_id)
        return self._record(job_id)

    async def get(self, job_id: str) -> JobRecord:
        self._expire()
        if job_id not in self._records:
            raise NotFound(f"no job {job_id} (unknown, or its result expired)")
        return self._record(job_id)

    async def wait(self, job_id: str, timeout_s: float) -> JobRecord:
        record = await self.get(job_id)
        if record.is_final or timeout_s <= 0:
            return record
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            futures = self._waiters.get(job_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self._waiters.pop(job_id, None)
        return await self.get(job_id)

    async def depth(self) -> int:
        return len(self._fifo) + len(self._pending)

    # -- workers -------------------------------------------------------------------------------------------------

    async def receive(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        assert self._arrived is not None, "start() the queue first"
        deliveries = self._reclaim(consumer, count)
        if not deliveries and not self._fifo and block_s > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), block_s)
            except TimeoutError:
                return []
        now = time.monotonic()
        while self._fifo and len(deliveries) < count:
            entry, job_id = self._fifo.popleft()
            self._pending[entry] = (job_id, consumer, now)
            deliveries.append(self._delivery(entry, job_id))
        return deliveries

    async def begin(self, delivery: Delivery, consumer: str) -> int | None:
        fields = self._records.get(delivery.job_id)
        if fields is None or fields["state"] in FINAL_STATES:
            return None
        fields["state"], fields["started_at"], fields["worker"] = "running", time.time(), consumer
        fields["attempts"] += 1
        return int(fields["attempts"])

    async def finish(
        self,
        delivery: Delivery,
        *,
        result: bytes | None = None,
        error: str | None = None,
        error_kind: str | None = None,
    ) -> bool:
        fields = self._records.get(delivery.job_id)
        if fields is None or fields["state"] in FINAL_STATES:
            return False
        fields.update(
            state="done" if error is None else "failed",
            result=result,
            error=error,
            error_kind=error_kind,
            finished_at=time.time(),
        )
        self._expires[delivery.job_id] = time.monotonic() + self.result_ttl_s
        for future in self._waiters.pop(delivery.job_id, []):
            if not future.done():
                future.set_result(None)
        return True

    async def retry(self, delivery: Delivery, error: str) -> None:
        fields = self._records.get(delivery.job_id)
        if fields is None or fields["state"] in FINAL_STATES:
            return
        fields["state"], fields["last_error"] = "queued", error
        self._push(delivery.job_id)

    async def dead_letter(self, delivery: Delivery, error: str, attempts: int) -> bool:
        message = f"gave up after {attempts} attempts; the last error: {error}"
        written = await self.finish(delivery, error=message, error_kind="gave_up")
        if written:
            self.dead.append({"id": delivery.job_id, "error": error, "attempts": attempts, "failed_at": time.time()})
        return written

    async def claim_notification(self, job_id: str, lease_s: float) -> NotificationClaim:
        fields = self._records.get(job_id)
        if fields is None or fields["state"] not in FINAL_STATES:
            return NotificationClaim("unfinished")
        if fields.get("notified"):
            return NotificationClaim("sent")
        claimed = fields.get("notify_claimed_at")
        if claimed is not None and time.monotonic() - claimed < lease_s:
            return NotificationClaim("busy")
        fields["notify_claimed_at"] = time.monotonic()
        return NotificationClaim("claimed", self._record(job_id))

    async def notified(self, job_id: str) -> None:
        fields = self._records.get(job_id)
        if fields is not None:
            fields["notified"] = True

    async def ack(self, delivery: Delivery) -> None:
        self._pending.pop(delivery.entry_id, None)

    async def heartbeat(self, consumer: str, deliveries: list[Delivery]) -> None:
        now = time.monotonic()
        for delivery in deliveries:
            held = self._pending.get(delivery.entry_id)
            if held is not None and held[1] == consumer:
                self._pending[delivery.entry_id] = (held[0], consumer, now)

    # -- internals -----------------------------------------------------------------------------------------------

    def _push(self, job_id: str) -> None:
        self._entries += 1
        self._fifo.append((str(self._entries), job_id))
        if self._arrived is not None:
            self._arrived.set()

    def _reclaim(self, consumer: str, count: int) -> list[Delivery]:
        now = time.monotonic()
        stale = [entry for entry, (_, _, seen) in self._pending.items() if now - seen >= self.visibility_timeout_s]
        deliveries = []
        for entry in stale[:count]:
            job_id = self._pending[entry][0]
            self._pending[entry] = (job_id, consumer, now)
            deliveries.append(self._delivery(entry, job_id, redelivered=True))
        return deliveries

    def _delivery(self, entry: str, job_id: str, *, redelivered: bool = False) -> Delivery:
        fields = self._records.get(job_id)
        return Delivery(job_id, entry, fields["request"] if fields is not None else None, redelivered)

    def _record(self, job_id: str) -> JobRecord:
        fields: Mapping[str, Any] = self._records[job_id]
        return JobRecord(
            id=job_id,
            state=fields["state"],
            submitted_at=fields["submitted_at"],
            release=fields["release"],
            attempts=fields["attempts"],
            started_at=fields.get("started_at"),
            finished_at=fields.get("finished_at"),
            result=fields.get("result"),
            error=fields.get("error"),
            error_kind=fields.get("error_kind"),
            callback_url=fields.get("callback_url"),
        )

    def _expire(self) -> None:
        now = time.monotonic()
        if now < self._next_expiry:  # a sweep at most once a second, not on every call
            return
        self._next_expiry = now + 1.0
        for job_id in [job for job, at in self._expires.items() if at <= now]:
            self._expires.pop(job_id, None)
            self._records.pop(job_id, None)
