"""The job worker: receives jobs from a ``JobQueue``, runs them through the ``InferenceService``, records the outcome.

Jobs are received up to ``concurrency`` at a time and run together, so they reach the models' batchers together
and run in batches by the same policy as ``/predict`` traffic (``batching:`` in the spec). Each job then goes:

    begin (attempt counted) -> run -> finish (first result wins) -> webhook (if any) -> ack

A worker that dies anywhere before the ack leaves the job pending; another worker receives it after the
visibility timeout and carries on from where the record stands (a job already finished is not run again; its
webhook is sent if it was not). A job that raises is retried up to ``max_attempts`` times, then failed and
dead-lettered with its last error; one that kills its workers is dead-lettered the same way, by the attempts
counted when it started. A request that is itself wrong (``InvalidInput``) fails at once: retrying cannot help.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from pipeserve.config import JobSettings
from pipeserve.errors import InvalidInput, NodeFailed, NotFound, PipeserveError
from pipeserve.jobs.model import JobRequest
from pipeserve.jobs.queue import Delivery, JobQueue
from pipeserve.jobs.webhook import WebhookSender
from pipeserve.observability.context import request_id_var
from pipeserve.pipeline.codec import dump_json
from pipeserve.service import InferenceService

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker takes and runs jobs.

    Attributes:
        concurrency: jobs in progress at once; they reach the models' batchers together, so make it at least the
            largest ``max_batch_size`` of the pipeline (twice that keeps a batch forming while one runs).
        max_attempts: runs of a failing job before it is dead-lettered.
        block_s: how long one receive waits for new jobs (shutdown is noticed within this).
        job_timeout_s: a job's deadline once it runs (work still queued in a batcher then never runs).
        notify_lease_s: how long a worker that began sending a webhook has before another may send it again
            (cover the sender's retries: its attempts x timeout, plus backoff).
        report_every_s: how often the worker logs its progress.
    """

    concurrency: int = 16
    max_attempts: int = 3
    block_s: float = 1.0
    job_timeout_s: float | None = 300.0
    notify_lease_s: float = 90.0
    report_every_s: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")


def worker_options(settings: JobSettings, service: InferenceService) -> WorkerOptions:
    """Options from the settings; concurrency defaults to twice the largest batch of the pipeline's models (at
    least 8), so that one batch forms while another runs."""
    largest = max((model.policy.max_batch_size for model in service.pipeline.models if model.queued), default=1)
    return WorkerOptions(
        concurrency=settings.concurrency or max(8, 2 * largest),
        max_attempts=settings.max_attempts,
        job_timeout_s=settings.timeout_s,
        notify_lease_s=settings.webhook_lease_s,
    )


@dataclass(slots=True)
class WorkerStats:
    done: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    duplicates: int = 0


class JobWorker:
    """Runs jobs from ``queue`` through ``service`` until stopped.

    Example:
        >>> worker = JobWorker(service, queue, name="worker-1")  # doctest: +SKIP
        >>> await worker.start()                                  # doctest: +SKIP
        >>> await worker.stop(grace_s=10)                         # doctest: +SKIP
    """

    def __init__(
        self,
        service: InferenceService,
        queue: JobQueue,
        *,
        name: str,
        options: WorkerOptions | None = None,
        webhooks: WebhookSender | None = None,
    ) -> None:
        self.service = service
        self.queue = queue
        self.name = name
        self.options = options or WorkerOptions()
        self.webhooks = webhooks or WebhookSender()
        self.stats = WorkerStats()
        self._in_flight: dict[asyncio.Task[None], Delivery] = {}
        self._main: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        await self.webhooks.start()
        self._stopping = False
        self._main = asyncio.create_task(self._run(), name=f"jobs-{self.name}")
        self._heartbeat = asyncio.create_task(self._beat(), name=f"jobs-{self.name}-heartbeat")

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop receiving; let jobs in progress finish within ``grace_s``. Jobs cut off stay pending in the queue
        (not acked) and are received again by another worker: nothing is lost."""
        self._stopping = True
        if self._main is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._main), self.options.block_s + 1.0)
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._main
        if self._in_flight:
            _, pending = await asyncio.wait(list(self._in_flight), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        await self.webhooks.stop()
        self._log_progress()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def _run(self) -> None:
        last_report = time.monotonic()
        while not self._stopping:
            try:
                await self._step()
            except PipeserveError as exc:  # the queue is unreachable: say so, wait, try again
                logger.error("Worker %s cannot receive jobs: %s", self.name, exc)
                await asyncio.sleep(min(5.0, self.options.block_s * 2))
            except Exception:
                logger.exception("Worker %s: unexpected error while taking jobs", self.name)
                await asyncio.sleep(1.0)
            if time.monotonic() - last_report >= self.options.report_every_s:
                last_report = time.monotonic()
                self._log_progress()

    async def _step(self) -> None:
        if not self.service.is_ready:  # loading, or failed its golden check: leave the jobs to others
            await asyncio.sleep(min(1.0, self.options.block_s))
            return
        free = self.options.concurrency - len(self._in_flight)
        if free <= 0:
            await asyncio.wait(list(self._in_flight), return_when=asyncio.FIRST_COMPLETED)
            return
        deliveries = await self.queue.receive(self.name, free, self.options.block_s)
        suspects = [delivery for delivery in deliveries if delivery.redelivered]
        if suspects:
            await self._run_alone(suspects)
        for delivery in deliveries:
            if not delivery.redelivered:
                self._spawn(delivery)

    def _spawn(self, delivery: Delivery) -> asyncio.Task[None]:
        task = asyncio.create_task(self._process(delivery), name=f"job-{delivery.job_id}")
        self._in_flight[task] = delivery
        task.add_done_callback(self._done)
        return task

    async def _run_alone(self, suspects: list[Delivery]) -> None:
        """Jobs whose worker died with them in progress run one at a time, with nothing else in progress: if one
        of them is what killed it, it takes down no other job with it (which would count an attempt against
        innocent jobs and could dead-letter them)."""
        if self._in_flight:
            await asyncio.wait(list(self._in_flight))
        for delivery in suspects:
            await asyncio.gather(self._spawn(delivery), return_exceptions=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("Worker %s: a job's bookkeeping failed", self.name, exc_info=task.exception())

    async def _beat(self) -> None:
        interval = max(0.5, self.queue.visibility_timeout_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.queue.heartbeat(self.name, list(self._in_flight.values()))
            except PipeserveError as exc:
                logger.warning("Worker %s: heartbeat failed: %s", self.name, exc)

    async def _process(self, delivery: Delivery) -> None:
        token = request_id_var.set(delivery.job_id)
        try:
            if delivery.request is None:  # the job's record expired while it waited: nothing to run
                logger.warning("Job %s expired before it ran; dropping it", delivery.job_id)
            else:
                await self._attempt(delivery, delivery.request)
                if not await self._notify(delivery.job_id, delivery.request):
                    return  # not acked: the job comes back once the other sender's lease is over
            await self.queue.ack(delivery)
        finally:
            request_id_var.reset(token)

    async def _attempt(self, delivery: Delivery, request: JobRequest) -> None:
        options = self.options
        attempts = await self.queue.begin(delivery, self.name)
        if attempts is None:  # finished by an earlier delivery (its worker died before the ack)
            self.stats.duplicates += 1
            return
        if attempts > options.max_attempts:  # it was started that often and never finished: it kills workers
            error = "the worker running it stopped before it finished (killed, or out of memory?)"
            if await self.queue.dead_letter(delivery, error, attempts - 1):
                self.stats.dead_lettered += 1
            return
        try:
            value = await self._predict(request)
        except Exception as exc:  # noqa: BLE001 - any failure is the job's: record it, retry or give up
            await self._failed(delivery, exc, attempts)
            return
        if await self.queue.finish(delivery, result=dump_json(value)):
            self.stats.done += 1
        else:
            self.stats.duplicates += 1

    async def _failed(self, delivery: Delivery, exc: Exception, attempts: int) -> None:
        if isinstance(exc, InvalidInput | NotFound):  # the request itself is wrong: retrying cannot help
            if await self.queue.finish(delivery, error=str(exc), error_kind="invalid_input"):
                self.stats.failed += 1
            return
        error = _describe(exc)
        logger.error("Job %s failed (attempt %d): %s", delivery.job_id, attempts, error, exc_info=exc)
        if attempts >= self.options.max_attempts:
            if await self.queue.dead_letter(delivery, error, attempts):
                self.stats.dead_lettered += 1
        else:
            await self.queue.retry(delivery, error)
            self.stats.retried += 1

    async def _predict(self, request: JobRequest) -> Any:
        timeout_s = self.options.job_timeout_s
        if request.label:
            return await self.service.predict_label(request.data, timeout_s=timeout_s)
        return await self.service.predict(request.data, request.endpoint, request.params or None, timeout_s=timeout_s)

    async def _notify(self, job_id: str, request: JobRequest) -> bool:
        """Send the webhook if it is this worker's to send; ``False`` if another worker holds it (which may have
        died while sending: the delivery is then left pending, to be tried again after the lease)."""
        if not request.callback_url:
            return True
        claim = await self.queue.claim_notification(job_id, self.options.notify_lease_s)
        if claim.status == "busy":
            return False
        if claim.status == "claimed" and claim.record is not None:
            await self.webhooks.send(request.callback_url, claim.record)
            await self.queue.notified(job_id)
        return True

    def _log_progress(self) -> None:
        stats = self.stats
        logger.info(
            "Worker %s: %d done, %d failed, %d retried, %d dead-lettered, %d duplicate deliveries, %d in progress",
            self.name,
            stats.done,
            stats.failed,
            stats.retried,
            stats.dead_lettered,
            stats.duplicates,
            len(self._in_flight),
        )


def _describe(exc: BaseException) -> str:
    """What a client may read about a failure: the node and the kind of error, not internals."""
    if isinstance(exc, NodeFailed):
        cause = type(exc.cause).__name__ if exc.cause is not None else "error"
        return f"pipeline node {exc.node!r} failed ({cause}); the worker log has the details under the job id"
    if isinstance(exc, PipeserveError):
        return str(exc)
    return f"internal error ({type(exc).__name__}); the worker log has the details under the job id"
