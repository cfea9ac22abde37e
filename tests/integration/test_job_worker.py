"""The job worker's recovery paths, driven through a real queue and a real pipeline (iris)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pipeserve import InferenceService, load_spec
from pipeserve.jobs import JobRequest, JobWorker, MemoryJobQueue, WebhookSender, WorkerOptions
from tests.webhooks import HookReceiver

ROW = [[5.1, 3.5, 1.4, 0.2]]


@pytest.fixture
async def iris_service(iris_dir: Path) -> AsyncIterator[InferenceService]:
    service = InferenceService(load_spec(iris_dir))
    await service.start()
    yield service
    await service.stop()


async def _until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_webhook_whose_sender_died_is_sent_once_after_its_lease(iris_service: InferenceService) -> None:
    hooks = HookReceiver(failures=0)
    queue = MemoryJobQueue(visibility_timeout_s=0.3)
    await queue.start()
    try:
        record = await queue.submit(JobRequest(data=ROW, callback_url=hooks.url))
        # A worker ran the job, wrote its result, began sending the webhook... and died: no send, no ack.
        [delivery] = await queue.receive("dead", 1, 1.0)
        await queue.begin(delivery, "dead")
        await queue.finish(delivery, result=b"[1]")
        assert (await queue.claim_notification(record.id, 1.0)).status == "claimed"
        started = time.monotonic()
        worker = JobWorker(
            iris_service,
            queue,
            name="alive",
            options=WorkerOptions(block_s=0.1, notify_lease_s=1.0),
            webhooks=WebhookSender(attempts=1),
        )
        await worker.start()
        try:

            async def delivered() -> bool:
                return bool(hooks.received)

            await _until(delivered)
            assert time.monotonic() - started >= 0.6, "not before the dead sender's lease ran out"
            await asyncio.sleep(0.8)  # nothing more comes
            assert [job for job, _ in hooks.received] == [record.id]
            assert hooks.received[0][1]["result"] == [1], "the result the first run wrote, not a rerun's"
            assert await queue.depth() == 0, "acked once the webhook was sent"
        finally:
            await worker.stop(1.0)
    finally:
        await queue.stop()
        hooks.close()


async def test_a_job_left_pending_by_a_dead_worker_is_run_again_and_reported_once(
    iris_service: InferenceService,
) -> None:
    queue = MemoryJobQueue(visibility_timeout_s=0.3)
    await queue.start()
    try:
        lost = await queue.submit(JobRequest(data=ROW))
        [delivery] = await queue.receive("dead", 1, 1.0)
        await queue.begin(delivery, "dead")  # ... and the worker died mid-run
        others = [await queue.submit(JobRequest(data=ROW, label=True)) for _ in range(5)]
        worker = JobWorker(iris_service, queue, name="alive", options=WorkerOptions(block_s=0.1))
        await worker.start()
        try:

            async def all_done() -> bool:
                records = [await queue.get(job.id) for job in [lost, *others]]
                return all(r.state == "done" for r in records)

            await _until(all_done)
        finally:
            await worker.stop(1.0)
        again = await queue.get(lost.id)
        assert again.attempts == 2
        assert again.result is not None
        assert again.result.startswith(b"[0.96")
        assert [(await queue.get(job.id)).result for job in others] == [b'"setosa"'] * 5
        assert worker.stats.done == 6
    finally:
        await queue.stop()
