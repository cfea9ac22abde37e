"""The job queue on Redis Streams with a consumer group: any number of workers on any number of machines.

Keys (``P`` = ``pipeserve:{PIPELINE}``; the braces make every key of a pipeline one Redis Cluster hash slot):

- ``P:jobs:RELEASE`` — the stream of jobs (id and request), one per release fingerprint, read by the group
  ``workers``. A
  worker only ever reads its own release's stream, so a job is never run by another release's preprocessing or
  model (a rolling update drains the old stream with the old workers).
- ``P:job:ID`` — the job's hash: state, attempts, result or error, callback; expires ``result_ttl_s`` after it
  finished (or after submission, if it never does).
- ``P:dead`` — the dead-letter stream: jobs that failed ``max_attempts`` times, with their last error.
- ``P:done`` — a pub/sub channel announcing finished job ids (for ``GET /jobs/ID?wait=S``).

Acked entries are deleted, so the stream's length is the backlog (queued + running) that ``max_queued`` bounds.
State changes that must not race (submit under a limit, start, first-result-wins, the webhook lease) are Lua
scripts, atomic on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pipeserve.errors import NotFound, NotReady, Overloaded
from pipeserve.jobs.model import JobRecord, JobRequest, new_job_id
from pipeserve.jobs.queue import DEFAULT_RESULT_TTL_S, ClaimStatus, Delivery, NotificationClaim

logger = logging.getLogger(__name__)

T = TypeVar("T")
GROUP = "workers"

_SUBMIT = """
local backlog = redis.call('XLEN', KEYS[1])
if tonumber(ARGV[1]) > 0 and backlog >= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[2], 'state', 'queued', 'submitted_at', ARGV[3], 'release', ARGV[4], 'attempts', 0,
           'callback_url', ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('XADD', KEYS[1], '*', 'id', ARGV[7], 'request', ARGV[2])
return backlog + 1
"""

_BEGIN = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -2 end
if state == 'done' or state == 'failed' then return -1 end
redis.call('HSET', KEYS[1], 'state', 'running', 'started_at', ARGV[1], 'worker', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'attempts', 1)
"""

_FINISH = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'done' or state == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'finished_at', ARGV[2])
if ARGV[1] == 'done' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'error', ARGV[3], 'error_kind', ARGV[4])
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
if ARGV[6] ~= '' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'id', ARGV[7], 'error', ARGV[6], 'attempts', ARGV[8],
             'failed_at', ARGV[2])
end
redis.call('PUBLISH', KEYS[2], ARGV[7])
return 1
"""

_RETRY = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'done' or state == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'queued', 'last_error', ARGV[1])
redis.call('XADD', KEYS[2], '*', 'id', ARGV[2], 'request', ARGV[3])
return 1
"""

_CLAIM_NOTIFICATION = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'done' and state ~= 'failed' then return 0 end
if redis.call('HGET', KEYS[1], 'notified') then return 2 end
local claimed = tonumber(redis.call('HGET', KEYS[1], 'notify_claimed_at') or '0')
if tonumber(ARGV[1]) - claimed < tonumber(ARGV[2]) then return 3 end
redis.call('HSET', KEYS[1], 'notify_claimed_at', ARGV[1])
return 1
"""

_CLAIMS: dict[int, ClaimStatus] = {0: "unfinished", 1: "claimed", 2: "sent", 3: "busy"}


class RedisJobQueue:
    """``JobQueue`` on Redis Streams (see the module docstring for the keys).

    Example:
        >>> queue = RedisJobQueue("redis://127.0.0.1:6379/0", pipeline="iris", release="3f2a...")  # doctest: +SKIP
        >>> await queue.start()                                                                       # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        pipeline: str,
        release: str,
        max_queued: int = 10_000,
        result_ttl_s: float = DEFAULT_RESULT_TTL_S,
        visibility_timeout_s: float = 60.0,
        listen: bool = False,
    ) -> None:
        self.url = url
        self.location = _redacted(url)
        self.pipeline = pipeline
        self.release = release
        self.max_queued = max_queued
        self.result_ttl_s = result_ttl_s
        self.visibility_timeout_s = visibility_timeout_s
        self._listen = listen
        prefix = f"pipeserve:{{{pipeline}}}"
        self.stream = f"{prefix}:jobs:{release}"
        self.dead_stream = f"{prefix}:dead"
        self.channel = f"{prefix}:done"
        self._job_prefix = f"{prefix}:job:"
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._last_reclaim = 0.0

    def _key(self, job_id: str) -> str:
        return self._job_prefix + job_id

    async def start(self) -> None:
        """Connect, create the consumer group (reading the stream from its start) and, to serve ``wait``, subscribe.

        Raises:
            NotReady: Redis cannot be reached.
        """
        try:
            import redis.asyncio as aioredis
        except ImportError as exc:  # pragma: no cover - an install problem, named for the user
            raise NotReady("the job queue on Redis needs the redis package: pip install 'pipeserve[queue]'") from exc
        self._redis = aioredis.from_url(self.url, decode_responses=False, health_check_interval=30)
        for name, source in (
            ("submit", _SUBMIT),
            ("begin", _BEGIN),
            ("finish", _FINISH),
            ("retry", _RETRY),
            ("claim_notification", _CLAIM_NOTIFICATION),
        ):
            self._scripts[name] = self._redis.register_script(source)

        async def create_group() -> None:
            try:
                await self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
            except Exception as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        await self._call(create_group)
        if self._listen:
            pubsub = self._redis.pubsub()
            await self._call(lambda: pubsub.subscribe(self.channel))
            self._listener = asyncio.create_task(self._dispatch(pubsub), name="job-completions")
        logger.info("Job queue on %s: stream %s", self.location, self.stream)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        for futures in self._waiters.values():
            for future in futures:
                future.cancel()
        self._waiters.clear()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis operation; a connection problem becomes ``NotReady`` naming the queue."""
        if self._redis is None:
            raise NotReady("the job queue is not started")
        from redis import exceptions

        try:
            return await fn()
        except (OSError, exceptions.ConnectionError, exceptions.TimeoutError) as exc:
            raise NotReady(f"the job queue at {self.location} is unreachable: {exc}") from exc

    # -- clients -------------------------------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> JobRecord:
        job_id = new_job_id()
        now = time.time()
        backlog = await self._call(
            lambda: self._scripts["submit"](
                keys=[self.stream, self._key(job_id)],
                args=[
                    self.max_queued,
                    request.encode(),
                    repr(now),
                    self.release,
                    int(self.result_ttl_s),
                    request.callback_url or "",
                    job_id,
                ],
            )
        )
        if backlog == -1:
            raise Overloaded(f"the job queue is full ({self.max_queued} jobs waiting)", retry_after_s=5.0)
        return JobRecord(job_id, "queued", now, release=self.release, callback_url=request.callback_url)

    async def get(self, job_id: str) -> JobRecord:
        fields = await self._call(lambda: self._redis.hgetall(self._key(job_id)))
        if not fields:
            raise NotFound(f"no job {job_id} (unknown, or its result expired)")
        return JobRecord.from_fields(job_id, {key.decode(): value for key, value in fields.items()})

    async def wait(self, job_id: str, timeout_s: float) -> JobRecord:
        if self._listener is None:  # not subscribed (Redis was down at start): poll instead
            deadline = time.monotonic() + timeout_s
            while not (record := await self.get(job_id)).is_final and time.monotonic() < deadline:  # noqa: ASYNC110 - no events to wait on without the subscription
                await asyncio.sleep(0.05)
            return record
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(future)  # before reading, so a completion in between is seen
        try:
            record = await self.get(job_id)
            if record.is_final or timeout_s <= 0:
                return record
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout_s)
            return await self.get(job_id)
        finally:
            futures = self._waiters.get(job_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self._waiters.pop(job_id, None)

    async def _dispatch(self, pubsub: Any) -> None:
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Lost the job-completion subscription on %s; resubscribing", self.location)
                await asyncio.sleep(1.0)
                with contextlib.suppress(Exception):
                    await pubsub.subscribe(self.channel)
                continue
            if message is None or message.get("type") != "message":
                continue
            for future in self._waiters.pop(message["data"].decode(), []):
                if not future.done():
                    future.set_result(None)

    async def depth(self) -> int:
        return int(await self._call(lambda: self._redis.xlen(self.stream)))

    # -- workers -------------------------------------------------------------------------------------------------

    async def receive(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = []
        reclaimed = 0
        now = time.monotonic()
        if now - self._last_reclaim >= min(5.0, self.visibility_timeout_s / 4):
            self._last_reclaim = now
            claimed = await self._call(
                lambda: self._redis.xautoclaim(
                    self.stream, GROUP, consumer, int(self.visibility_timeout_s * 1000), start_id="0-0", count=count
                )
            )
            entries.extend((entry, fields) for entry, fields in claimed[1] if fields)
            reclaimed = len(entries)
            if entries:
                logger.warning("Reclaimed %d job(s) left pending by a worker that went away", len(entries))
        if len(entries) < count:
            block_ms = int(block_s * 1000) if not entries and block_s > 0 else None
            read = await self._call(
                lambda: self._redis.xreadgroup(
                    GROUP, consumer, {self.stream: ">"}, count=count - len(entries), block=block_ms
                )
            )
            for _, stream_entries in read or []:
                entries.extend(stream_entries)
        return [
            Delivery(
                fields[b"id"].decode(),
                entry.decode(),
                JobRequest.decode(fields[b"request"]) if fields.get(b"request") else None,
                redelivered=i < reclaimed,
            )
            for i, (entry, fields) in enumerate(entries)
        ]

    async def begin(self, delivery: Delivery, consumer: str) -> int | None:
        attempts = await self._call(
            lambda: self._scripts["begin"](keys=[self._key(delivery.job_id)], args=[repr(time.time()), consumer])
        )
        return None if attempts < 0 else int(attempts)

    async def finish(
        self,
        delivery: Delivery,
        *,
        result: bytes | None = None,
        error: str | None = None,
        error_kind: str | None = None,
    ) -> bool:
        return await self._finish(delivery, result=result, error=error, error_kind=error_kind)

    async def _finish(
        self,
        delivery: Delivery,
        *,
        result: bytes | None = None,
        error: str | None = None,
        error_kind: str | None = None,
        dead_error: str = "",
        attempts: int = 0,
    ) -> bool:
        state = "done" if error is None else "failed"
        written = await self._call(
            lambda: self._scripts["finish"](
                keys=[self._key(delivery.job_id), self.channel, self.dead_stream],
                args=[
                    state,
                    repr(time.time()),
                    result if error is None else error,
                    error_kind or "",
                    int(self.result_ttl_s),
                    dead_error,
                    delivery.job_id,
                    attempts,
                ],
            )
        )
        return bool(written)

    async def retry(self, delivery: Delivery, error: str) -> None:
        await self._call(
            lambda: self._scripts["retry"](
                keys=[self._key(delivery.job_id), self.stream],
                args=[error, delivery.job_id, delivery.request.encode() if delivery.request else b""],
            )
        )

    async def dead_letter(self, delivery: Delivery, error: str, attempts: int) -> bool:
        message = f"gave up after {attempts} attempts; the last error: {error}"
        return await self._finish(
            delivery, error=message, error_kind="gave_up", dead_error=error or "(none)", attempts=attempts
        )

    async def claim_notification(self, job_id: str, lease_s: float) -> NotificationClaim:
        code = await self._call(
            lambda: self._scripts["claim_notification"](keys=[self._key(job_id)], args=[repr(time.time()), lease_s])
        )
        status = _CLAIMS[int(code)]
        return NotificationClaim(status, await self.get(job_id) if status == "claimed" else None)

    async def notified(self, job_id: str) -> None:
        await self._call(lambda: self._redis.hset(self._key(job_id), "notified", 1))

    async def ack(self, delivery: Delivery) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.xack(self.stream, GROUP, delivery.entry_id)
        pipe.xdel(self.stream, delivery.entry_id)
        await self._call(pipe.execute)

    async def heartbeat(self, consumer: str, deliveries: list[Delivery]) -> None:
        if deliveries:
            ids = [delivery.entry_id for delivery in deliveries]
            await self._call(lambda: self._redis.xclaim(self.stream, GROUP, consumer, 0, ids, justid=True))

    async def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The most recent dead letters, newest first (for operators and tests)."""
        entries = await self._call(lambda: self._redis.xrevrange(self.dead_stream, count=count))
        return [{key.decode(): value.decode() for key, value in fields.items()} for _, fields in entries]


def _redacted(url: str) -> str:
    """The URL without a password, for logs and error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"
