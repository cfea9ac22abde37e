"""Batcher: every caller gets its own answer or its own batch's error, and nothing hangs."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeserve.batching import Batcher, BatchPolicy
from pipeserve.batching.batcher import BatchInfo
from pipeserve.errors import NotReady, Overloaded

# Every await that could hang is bounded by this, so a bug fails the test instead of stalling the suite.
BOUND_S = 2.0


class GatedFn:
    """A batch function that records each batch and, until ``release`` is set, holds it while it runs."""

    def __init__(self, transform: Callable[[Any], Any] = lambda x: x, *, hold: bool = False) -> None:
        self.transform = transform
        self.batches: list[list[Any]] = []
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.running.set()
        await self.release.wait()
        return [self.transform(item) for item in items]


async def settle() -> None:
    """Let tasks created just before run up to their first real wait (here: queueing their item)."""
    for _ in range(3):
        await asyncio.sleep(0)


def score(payload: dict[str, Any]) -> dict[str, Any]:
    return {"id": payload["id"], "total": sum(payload["values"]), "n": len(payload["values"])}


@pytest.mark.parametrize("max_wait_s", [0.0, 0.002])
async def test_concurrent_callers_each_get_their_own_answer(max_wait_s):
    rng = random.Random(20240611)
    payloads = [{"id": i, "values": [rng.uniform(-1e3, 1e3) for _ in range(rng.randint(1, 6))]} for i in range(300)]
    delays = [rng.uniform(0, 0.01) for _ in payloads]
    sizes: list[int] = []

    async def fn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        return [score(item) for item in items]

    async def call(
        batcher: Batcher[dict[str, Any], dict[str, Any]], payload: dict[str, Any], delay: float
    ) -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await batcher.submit(payload)

    policy = BatchPolicy(max_batch_size=8, max_wait_s=max_wait_s, workers=2)
    async with Batcher(fn, policy, on_batch=lambda info: sizes.append(info.size)) as batcher:
        results = await asyncio.wait_for(
            asyncio.gather(*(call(batcher, p, d) for p, d in zip(payloads, delays, strict=True))), BOUND_S
        )

    assert results == [score(p) for p in payloads]  # the same answers as one call per item
    assert sum(sizes) == len(payloads)
    assert 1 < max(sizes) <= 8


async def test_a_failing_batch_fails_all_its_callers_and_no_others():
    batches: list[list[str]] = []

    async def fn(items: list[str]) -> list[str]:
        batches.append(list(items))
        await asyncio.sleep(0)
        if "poison" in items:
            raise ValueError("bad batch")
        return [item.upper() for item in items]

    items = [f"item-{i}" for i in range(40)]
    items[17] = "poison"
    async with Batcher(fn, BatchPolicy(max_batch_size=4, max_wait_s=0.001)) as batcher:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(x) for x in items), return_exceptions=True), BOUND_S
        )

    failed = next(batch for batch in batches if "poison" in batch)
    assert len(failed) > 1, "the poisoned batch should hold other callers too"
    for item, outcome in zip(items, outcomes, strict=True):
        if item in failed:
            assert isinstance(outcome, ValueError)
            assert str(outcome) == "bad batch"
        else:
            assert outcome == item.upper()
    assert sorted(x for batch in batches for x in batch) == sorted(items)


async def test_batcher_keeps_serving_after_a_failed_batch():
    fail = True

    async def fn(items: list[int]) -> list[int]:
        if fail:
            raise RuntimeError("transient")
        return items

    async with Batcher(fn, BatchPolicy(max_batch_size=4)) as batcher:
        with pytest.raises(RuntimeError, match="transient"):
            await asyncio.wait_for(batcher.submit(1), BOUND_S)
        fail = False
        assert await asyncio.wait_for(batcher.submit(2), BOUND_S) == 2


async def test_cancelled_caller_is_dropped_before_its_batch_runs():
    fn = GatedFn(str.upper, hold=True)
    async with Batcher(fn, BatchPolicy(max_batch_size=8)) as batcher:
        first = asyncio.create_task(batcher.submit("a"))
        await asyncio.wait_for(fn.running.wait(), BOUND_S)  # batch ["a"] is running and held
        b, c, d = (asyncio.create_task(batcher.submit(x)) for x in "bcd")
        await settle()
        assert batcher.queued == 3

        c.cancel()
        fn.release.set()
        results = await asyncio.wait_for(asyncio.gather(first, b, d), BOUND_S)

        with pytest.raises(asyncio.CancelledError):
            await c

    assert list(results) == ["A", "B", "D"]
    assert fn.batches == [["a"], ["b", "d"]]  # "c" never reached the batch function


async def test_caller_cancelled_while_its_batch_runs_does_not_disturb_the_others():
    fn = GatedFn(str.upper, hold=True)
    async with Batcher(fn, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [asyncio.create_task(batcher.submit(x)) for x in "xyz"]
        await asyncio.wait_for(fn.running.wait(), BOUND_S)
        tasks[1].cancel()
        await settle()
        fn.release.set()

        done, _ = await asyncio.wait(tasks, timeout=BOUND_S)

    assert len(done) == 3
    assert tasks[1].cancelled()
    assert (tasks[0].result(), tasks[2].result()) == ("X", "Z")
    assert fn.batches == [["x", "y", "z"]]


async def test_partial_batch_flushes_after_max_wait():
    fn = GatedFn()
    async with Batcher(fn, BatchPolicy(max_batch_size=8, max_wait_s=0.05)) as batcher:
        started = time.monotonic()
        result = await asyncio.wait_for(batcher.submit(1), BOUND_S)
        elapsed = time.monotonic() - started

    assert result == 1
    assert 0.04 <= elapsed < 0.5
    assert fn.batches == [[1]]


async def test_full_batch_runs_without_waiting_for_max_wait():
    fn = GatedFn()
    async with Batcher(fn, BatchPolicy(max_batch_size=4, max_wait_s=30.0)) as batcher:
        started = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(4))), BOUND_S)
        elapsed = time.monotonic() - started

    assert results == [0, 1, 2, 3]
    assert elapsed < 1.0
    assert fn.batches == [[0, 1, 2, 3]]


async def test_max_wait_counts_from_the_first_item_of_the_batch():
    fn = GatedFn()
    async with Batcher(fn, BatchPolicy(max_batch_size=8, max_wait_s=0.2)) as batcher:
        started = time.monotonic()
        first = asyncio.create_task(batcher.submit("early"))
        await asyncio.sleep(0.1)
        late = asyncio.create_task(batcher.submit("late"))
        await asyncio.wait_for(asyncio.gather(first, late), BOUND_S)
        elapsed = time.monotonic() - started

    assert fn.batches == [["early", "late"]]
    assert elapsed < 0.29  # 0.3 s if the late item had restarted the wait


async def test_greedy_mode_runs_an_idle_item_at_once_and_batches_what_queues_meanwhile():
    fn = GatedFn(lambda x: -x, hold=True)
    async with Batcher(fn, BatchPolicy(max_batch_size=16, max_wait_s=0)) as batcher:
        first = asyncio.create_task(batcher.submit(0))
        await asyncio.wait_for(fn.running.wait(), BOUND_S)  # ran alone: greedy mode does not wait for company
        rest = [asyncio.create_task(batcher.submit(i)) for i in range(1, 6)]
        await settle()
        fn.release.set()
        results = await asyncio.wait_for(asyncio.gather(first, *rest), BOUND_S)

    assert results == [0, -1, -2, -3, -4, -5]
    assert fn.batches == [[0], [1, 2, 3, 4, 5]]


async def test_greedy_mode_batches_under_concurrency():
    sizes: list[int] = []

    async def fn(items: list[int]) -> list[int]:
        await asyncio.sleep(0.002)
        return [i * 10 for i in items]

    policy = BatchPolicy(max_batch_size=16, max_wait_s=0)
    async with Batcher(fn, policy, on_batch=lambda info: sizes.append(info.size)) as batcher:
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(50))), BOUND_S)

    assert results == [i * 10 for i in range(50)]
    assert max(sizes) > 1
    assert all(size <= 16 for size in sizes)


async def test_workers_run_batches_concurrently():
    active = peak = 0

    async def fn(items: list[int]) -> list[int]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1
        return items

    async with Batcher(fn, BatchPolicy(max_batch_size=1, workers=3)) as batcher:
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(6))), BOUND_S)

    assert results == list(range(6))
    assert peak == 3


async def test_full_queue_refuses_with_overloaded_and_recovers():
    fn = GatedFn(hold=True)
    async with Batcher(fn, BatchPolicy(max_batch_size=1, max_queue_size=2), name="clf") as batcher:
        running = asyncio.create_task(batcher.submit("a"))
        await asyncio.wait_for(fn.running.wait(), BOUND_S)
        queued = [asyncio.create_task(batcher.submit(x)) for x in "bc"]
        await settle()

        with pytest.raises(Overloaded, match="clf") as info:
            await asyncio.wait_for(batcher.submit("d"), BOUND_S)

        assert info.value.retry_after_s > 0
        fn.release.set()
        assert await asyncio.wait_for(asyncio.gather(running, *queued), BOUND_S) == ["a", "b", "c"]
        assert await asyncio.wait_for(batcher.submit("e"), BOUND_S) == "e"

    assert fn.batches == [["a"], ["b"], ["c"], ["e"]]


async def test_submit_before_start_is_not_ready():
    batcher = Batcher(GatedFn(), BatchPolicy())

    with pytest.raises(NotReady):
        await batcher.submit(1)


async def test_submit_after_stop_is_not_ready():
    batcher = Batcher(GatedFn(), BatchPolicy())
    await batcher.start()
    assert await asyncio.wait_for(batcher.submit(1), BOUND_S) == 1
    await batcher.stop()

    with pytest.raises(NotReady):
        await batcher.submit(2)


async def test_submit_after_leaving_the_context_is_not_ready():
    async with Batcher(GatedFn(), BatchPolicy()) as batcher:
        pass

    with pytest.raises(NotReady):
        await batcher.submit(1)


async def test_can_start_again_after_stop():
    batcher = Batcher(GatedFn(), BatchPolicy())
    await batcher.start()
    await batcher.stop()
    await batcher.start()
    try:
        assert await asyncio.wait_for(batcher.submit(7), BOUND_S) == 7
    finally:
        await batcher.stop()


async def test_stop_before_start_is_harmless():
    batcher = Batcher(GatedFn(), BatchPolicy())

    await asyncio.wait_for(batcher.stop(), BOUND_S)


async def test_stop_finishes_queued_work_within_the_grace_period():
    async def fn(items: list[int]) -> list[int]:
        await asyncio.sleep(0.005)
        return [i + 100 for i in items]

    batcher = Batcher(fn, BatchPolicy(max_batch_size=2))
    await batcher.start()
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(10)]
    await settle()

    await asyncio.wait_for(batcher.stop(grace_s=BOUND_S), BOUND_S + 1)

    assert all(task.done() for task in tasks)
    assert [task.result() for task in tasks] == [i + 100 for i in range(10)]


async def test_stop_resolves_every_caller_when_the_batch_function_is_stuck():
    fn = GatedFn(hold=True)  # never released: the running batch must be cancelled
    batcher = Batcher(fn, BatchPolicy(max_batch_size=2))
    await batcher.start()
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(7)]
    await asyncio.wait_for(fn.running.wait(), BOUND_S)
    await settle()

    started = time.monotonic()
    await asyncio.wait_for(batcher.stop(grace_s=0.05), BOUND_S)

    assert time.monotonic() - started < 1.0
    assert all(task.done() for task in tasks)
    for task in tasks:
        assert isinstance(task.exception(), NotReady)


async def test_size_of_counts_rows_toward_max_batch_size():
    fn = GatedFn(len, hold=True)
    infos: list[BatchInfo] = []
    policy = BatchPolicy(max_batch_size=4)
    async with Batcher(fn, policy, size_of=len, on_batch=infos.append) as batcher:
        first = asyncio.create_task(batcher.submit([0]))
        await asyncio.wait_for(fn.running.wait(), BOUND_S)
        rows = [[1, 1, 1], [2, 2, 2], [3, 3], [4, 4]]
        rest = [asyncio.create_task(batcher.submit(r)) for r in rows]
        await settle()
        fn.release.set()
        results = await asyncio.wait_for(asyncio.gather(first, *rest), BOUND_S)

    assert results == [1, 3, 3, 2, 2]
    # Counted as one item each, the four would have run as one batch.
    assert fn.batches == [[[0]], [[1, 1, 1]], [[2, 2, 2]], [[3, 3], [4, 4]]]
    assert [info.size for info in infos] == [1, 3, 3, 4]


async def test_an_item_larger_than_max_batch_size_runs_alone():
    fn = GatedFn(len)
    async with Batcher(fn, BatchPolicy(max_batch_size=4), size_of=len) as batcher:
        results = await asyncio.wait_for(asyncio.gather(batcher.submit([1] * 6), batcher.submit([2])), BOUND_S)

    assert list(results) == [6, 1]
    assert fn.batches == [[[1] * 6], [[2]]]


@pytest.mark.parametrize("wrong", [lambda xs: xs[:-1], lambda xs: [*xs, "extra"]], ids=["too-few", "too-many"])
async def test_wrong_number_of_results_fails_the_batch_callers(wrong):
    async def fn(items: list[str]) -> list[str]:
        return wrong(items) if len(items) > 1 else items

    async with Batcher(fn, BatchPolicy(max_batch_size=4), name="clf") as batcher:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(x) for x in "abcd"), return_exceptions=True), BOUND_S
        )
        assert await asyncio.wait_for(batcher.submit("alone"), BOUND_S) == "alone"

    assert len(outcomes) == 4
    for outcome in outcomes:
        assert isinstance(outcome, Exception)
        assert "results for 4 items" in str(outcome)


async def test_on_batch_reports_each_batch():
    infos: list[BatchInfo] = []

    async def fn(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return items

    async with Batcher(fn, BatchPolicy(max_batch_size=3), on_batch=infos.append) as batcher:
        await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(7))), BOUND_S)

    assert [info.batch_id for info in infos] == [1, 2, 3]
    assert [info.size for info in infos] == [3, 3, 1]
    assert all(info.run_s >= 0.009 for info in infos)
    assert all(info.queue_wait_s >= 0 for info in infos)
    assert infos[2].queue_wait_s >= 0.015  # the last item waited for two batches of ~10 ms


async def test_a_failing_on_batch_callback_does_not_strand_later_callers():
    def on_batch(info: BatchInfo) -> None:
        raise RuntimeError("metrics backend is down")

    async with Batcher(GatedFn(), BatchPolicy(max_batch_size=1), on_batch=on_batch) as batcher:
        first = await asyncio.wait_for(asyncio.gather(batcher.submit(1), return_exceptions=True), BOUND_S)
        # Whatever happens to the callback's error, the next caller must get an answer, not wait forever.
        second = await asyncio.wait_for(asyncio.gather(batcher.submit(2), return_exceptions=True), 1.0)

    assert len(first) == 1
    assert list(second) == [2]
