"""The JobQueue contract, checked on both queues: the in-process one and Redis Streams (a real Redis server)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis as redis_sync

from pipeserve.errors import NotFound, Overloaded
from pipeserve.jobs import JobRequest, MemoryJobQueue, RedisJobQueue

BOUND_S = 10.0


@pytest.fixture(params=["memory", "redis"])
async def make_queue(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Any]:
    """A factory of started queues (one pipeline name per test on Redis); all stopped and cleaned up after."""
    made: list[Any] = []
    pipeline = f"test-{uuid.uuid4().hex[:12]}"

    async def make(**options: Any) -> Any:
        if request.param == "memory":
            queue: Any = MemoryJobQueue(release="r1", **options)
        else:
            queue = RedisJobQueue(redis_url, pipeline=pipeline, release="r1", listen=True, **options)
        await queue.start()
        made.append(queue)
        return queue

    yield make
    for queue in made:
        await queue.stop()
    if request.param == "redis":
        client = redis_sync.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"pipeserve:{{{pipeline}}}:*"))
        if keys:
            client.delete(*keys)


async def test_a_job_goes_queued_running_done_and_its_result_is_kept(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=[[1, 2]], callback_url="http://hook.test/x"))
    assert record.state == "queued"
    assert (await queue.get(record.id)).state == "queued"
    assert await queue.depth() == 1
    [delivery] = await queue.receive("w1", 10, 1.0)
    assert delivery.job_id == record.id
    assert delivery.request == JobRequest(data=[[1, 2]], callback_url="http://hook.test/x")
    assert await queue.begin(delivery, "w1") == 1
    assert (await queue.get(record.id)).state == "running"
    assert await queue.finish(delivery, result=b"[0.5,0.25]")
    await queue.ack(delivery)
    done = await queue.get(record.id)
    assert (done.state, done.result, done.attempts) == ("done", b"[0.5,0.25]", 1)
    assert done.callback_url == "http://hook.test/x"
    assert done.to_json().endswith(b',"result":[0.5,0.25]}')
    assert await queue.depth() == 0


async def test_bytes_data_survive_the_queue(make_queue: Any) -> None:
    queue = await make_queue()
    await queue.submit(JobRequest(data=b"\xff\xd8 not text", endpoint="tag", params={"k": "3"}))
    [delivery] = await queue.receive("w1", 10, 1.0)
    assert delivery.request == JobRequest(data=b"\xff\xd8 not text", endpoint="tag", params={"k": "3"})


async def test_the_first_outcome_wins(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=1))
    [delivery] = await queue.receive("w1", 10, 1.0)
    await queue.begin(delivery, "w1")
    assert await queue.finish(delivery, result=b"1")
    assert not await queue.finish(delivery, result=b"2"), "a second result must not overwrite the first"
    assert not await queue.finish(delivery, error="late failure", error_kind="gave_up")
    assert await queue.begin(delivery, "w2") is None, "a finished job is not started again"
    final = await queue.get(record.id)
    assert (final.state, final.result, final.error) == ("done", b"1", None)


async def test_a_pending_job_moves_to_another_worker_after_the_visibility_timeout(make_queue: Any) -> None:
    queue = await make_queue(visibility_timeout_s=0.3)
    record = await queue.submit(JobRequest(data=1))
    [first] = await queue.receive("dies", 10, 1.0)
    await queue.begin(first, "dies")  # ... and the worker is killed: no finish, no ack
    assert await queue.receive("other", 10, 0.05) == []  # not yet: it may still be working
    await asyncio.sleep(0.4)
    [again] = await queue.receive("other", 10, 0.05)
    assert again.job_id == record.id
    assert await queue.begin(again, "other") == 2  # the attempts count the run that died
    assert await queue.finish(again, result=b"ok")
    await queue.ack(again)
    assert (await queue.get(record.id)).state == "done"


async def test_a_heartbeat_keeps_a_slow_job_with_its_worker(make_queue: Any) -> None:
    queue = await make_queue(visibility_timeout_s=0.3)
    await queue.submit(JobRequest(data=1))
    [delivery] = await queue.receive("slow", 10, 1.0)
    for _ in range(3):
        await asyncio.sleep(0.15)
        await queue.heartbeat("slow", [delivery])
    assert await queue.receive("other", 10, 0.05) == []


async def test_a_retried_job_is_delivered_again_and_keeps_its_attempts(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=1))
    [delivery] = await queue.receive("w1", 10, 1.0)
    assert await queue.begin(delivery, "w1") == 1
    await queue.retry(delivery, "boom")
    await queue.ack(delivery)
    assert (await queue.get(record.id)).state == "queued"
    [again] = await queue.receive("w1", 10, 1.0)
    assert again.job_id == record.id
    assert await queue.begin(again, "w1") == 2


async def test_dead_letters_fail_the_job_with_its_last_error(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data="poison"))
    [delivery] = await queue.receive("w1", 10, 1.0)
    await queue.begin(delivery, "w1")
    assert await queue.dead_letter(delivery, "ValueError in node 'x'", 3)
    failed = await queue.get(record.id)
    assert failed.state == "failed"
    assert failed.error_kind == "gave_up"
    assert "gave up after 3 attempts" in (failed.error or "")
    assert "ValueError in node 'x'" in (failed.error or "")
    dead = queue.dead if isinstance(queue, MemoryJobQueue) else await queue.dead_letters()
    assert [(d["id"], d["error"], str(d["attempts"])) for d in dead] == [(record.id, "ValueError in node 'x'", "3")]


async def test_a_full_queue_refuses_with_a_retry_hint(make_queue: Any) -> None:
    queue = await make_queue(max_queued=2)
    await queue.submit(JobRequest(data=1))
    await queue.submit(JobRequest(data=2))
    with pytest.raises(Overloaded, match="full") as refused:
        await queue.submit(JobRequest(data=3))
    assert refused.value.retry_after_s > 0
    [delivery, _] = await queue.receive("w1", 10, 1.0)
    await queue.begin(delivery, "w1")
    await queue.finish(delivery, result=b"1")
    await queue.ack(delivery)
    await queue.submit(JobRequest(data=3))  # room again once a job is done


async def test_unknown_ids_are_not_found(make_queue: Any) -> None:
    queue = await make_queue()
    with pytest.raises(NotFound, match="no job"):
        await queue.get(uuid.uuid4().hex)


async def test_wait_returns_as_soon_as_the_job_finishes(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=1))

    async def work() -> None:
        [delivery] = await queue.receive("w1", 10, 1.0)
        await queue.begin(delivery, "w1")
        await asyncio.sleep(0.2)
        await queue.finish(delivery, result=b"42")
        await queue.ack(delivery)

    worker = asyncio.create_task(work())
    started = time.monotonic()
    done = await asyncio.wait_for(queue.wait(record.id, 5.0), BOUND_S)
    waited = time.monotonic() - started
    await worker
    assert (done.state, done.result) == ("done", b"42")
    assert 0.15 < waited < 2.0
    assert (await queue.wait(record.id, 5.0)).state == "done"  # already final: at once


async def test_wait_gives_up_after_its_timeout_with_the_state_so_far(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=1))
    started = time.monotonic()
    assert (await queue.wait(record.id, 0.2)).state == "queued"
    assert time.monotonic() - started < 2.0


async def test_the_webhook_lease_lets_one_worker_send_and_another_take_over_later(make_queue: Any) -> None:
    queue = await make_queue()
    record = await queue.submit(JobRequest(data=1, callback_url="http://hook.test/"))
    [delivery] = await queue.receive("w1", 10, 1.0)
    await queue.begin(delivery, "w1")
    assert (await queue.claim_notification(record.id, 0.3)).status == "unfinished"
    await queue.finish(delivery, result=b"1")
    claimed = await queue.claim_notification(record.id, 0.3)
    assert claimed.status == "claimed"
    assert claimed.record is not None
    assert claimed.record.result == b"1"
    assert (await queue.claim_notification(record.id, 0.3)).status == "busy", "someone is sending it"
    await asyncio.sleep(0.4)
    assert (await queue.claim_notification(record.id, 0.3)).status == "claimed", "the sender went silent: take over"
    await queue.notified(record.id)
    await asyncio.sleep(0.4)
    assert (await queue.claim_notification(record.id, 0.3)).status == "sent", "sent: never again"


async def test_results_expire_after_their_ttl(make_queue: Any) -> None:
    queue = await make_queue(result_ttl_s=1)
    record = await queue.submit(JobRequest(data=1))
    [delivery] = await queue.receive("w1", 10, 1.0)
    await queue.begin(delivery, "w1")
    await queue.finish(delivery, result=b"1")
    await queue.ack(delivery)
    assert (await queue.get(record.id)).state == "done"
    await asyncio.sleep(1.3)
    with pytest.raises(NotFound):
        await queue.get(record.id)
