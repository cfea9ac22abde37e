from __future__ import annotations

import asyncio
import itertools

import pytest

from pipeserve.batching import Batcher, BatchPolicy, CpuLane

BOUND_S = 5.0


async def test_jobs_hold_the_lane_one_at_a_time_in_arrival_order() -> None:
    lane = CpuLane()
    order: list[int] = []
    inside = 0

    async def job(i: int) -> None:
        nonlocal inside
        async with lane:
            inside += 1
            assert inside == 1, "two jobs held the lane at once"
            order.append(i)
            await asyncio.sleep(0)  # even a job that yields keeps the lane until it leaves
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(job(i) for i in range(20))), BOUND_S)
    assert order == list(range(20))
    assert lane.jobs == 20
    await asyncio.sleep(0)
    assert not lane.is_held


async def test_jobs_ready_in_the_same_iteration_still_let_the_loop_turn_between_them() -> None:
    lane = CpuLane()
    events: list[str] = []

    async def job(i: int) -> None:
        async with lane:
            events.append(f"job{i}")  # sync work: no await inside

    async def ticker() -> None:
        while True:
            events.append("tick")
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    await asyncio.wait_for(asyncio.gather(*(job(i) for i in range(4))), BOUND_S)
    ticking.cancel()
    jobs = [i for i, event in enumerate(events) if event.startswith("job")]
    assert all(b - a > 1 for a, b in itertools.pairwise(jobs)), events


async def test_the_loop_turns_between_two_jobs() -> None:
    lane = CpuLane()
    events: list[str] = []

    async def job(name: str) -> None:
        async with lane:
            events.append(name)

    async def other_work() -> None:
        events.append("other")

    async with lane:  # both jobs queue behind a holder; the other work is ready meanwhile
        first, second = asyncio.create_task(job("a")), asyncio.create_task(job("b"))
        await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(other_work()))
    await asyncio.wait_for(asyncio.gather(first, second), BOUND_S)
    assert events.index("other") < events.index("b"), events


async def test_a_cancelled_waiter_drops_out_and_the_next_gets_the_turn() -> None:
    lane = CpuLane()
    ran: list[str] = []

    async def job(name: str) -> None:
        async with lane:
            ran.append(name)

    async with lane:
        gone = asyncio.create_task(job("gone"))
        kept = asyncio.create_task(job("kept"))
        await asyncio.sleep(0)
        assert lane.waiting == 2
        gone.cancel()
        await asyncio.sleep(0)
        assert lane.waiting == 1
    await asyncio.wait_for(kept, BOUND_S)
    assert gone.cancelled()
    assert ran == ["kept"]
    await asyncio.sleep(0)
    assert not lane.is_held


async def test_a_waiter_cancelled_just_after_its_turn_came_passes_the_turn_on() -> None:
    lane = CpuLane()
    ran: list[str] = []

    async def job(name: str) -> None:
        async with lane:
            ran.append(name)

    async with lane:
        second = asyncio.create_task(job("second"))
        third = asyncio.create_task(job("third"))
        await asyncio.sleep(0)
    # Leaving scheduled the admission of "second"; this cancel runs after it, before "second" resumes.
    asyncio.get_running_loop().call_soon(second.cancel)
    await asyncio.wait_for(third, BOUND_S)
    assert second.cancelled()
    assert ran == ["third"]
    await asyncio.sleep(0)
    assert not lane.is_held


async def test_an_error_inside_releases_the_lane() -> None:
    lane = CpuLane()
    with pytest.raises(ValueError, match="boom"):
        async with lane:
            raise ValueError("boom")
    async with lane:
        assert lane.is_held
    assert lane.is_held, "held until the loop has turned once"
    await asyncio.sleep(0)
    assert not lane.is_held


async def test_a_gated_batcher_takes_its_batch_when_its_turn_comes() -> None:
    """While the lane is busy, items keep arriving; the batch taken at the turn holds all of them."""
    lane = CpuLane()
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        assert lane.is_held, "a gated batch runs while its worker holds the gate"
        sizes.append(len(items))
        return [x * 10 for x in items]

    async with Batcher(run, BatchPolicy(max_batch_size=8)) as batcher:
        batcher.gate = lane
        async with lane:  # the CPU is busy with something else while requests arrive
            calls = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
            for _ in range(5):
                await asyncio.sleep(0)
        results = await asyncio.wait_for(asyncio.gather(*calls), BOUND_S)
    assert results == [0, 10, 20, 30, 40]
    assert sizes == [5]


async def test_a_gated_batcher_drops_callers_that_left_while_it_waited_for_the_gate() -> None:
    lane = CpuLane()
    seen: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        seen.append(items)
        return items

    async with Batcher(run, BatchPolicy(max_batch_size=8)) as batcher:
        batcher.gate = lane
        async with lane:
            calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
            await asyncio.sleep(0)
            calls[1].cancel()
        assert await asyncio.wait_for(calls[0], BOUND_S) == 0
        assert await asyncio.wait_for(calls[2], BOUND_S) == 2
    assert seen == [[0, 2]]


async def test_a_gated_turn_takes_only_the_rows_that_fit_the_lanes_budget() -> None:
    """A turn on the lane holds the event loop: it takes as many rows as are expected to run within the budget."""
    lane = CpuLane()
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    async with Batcher(run, BatchPolicy(max_batch_size=16), learns_latency=False) as batcher:
        batcher.gate, batcher.gate_budget_s = lane, 0.1
        batcher.latency.observe(1, 0.03)  # 30 ms a row: 3 rows fit in 0.1 s
        async with lane:
            calls = [asyncio.create_task(batcher.submit(i)) for i in range(7)]
            await asyncio.sleep(0)
        assert await asyncio.wait_for(asyncio.gather(*calls), BOUND_S) == list(range(7))
    assert sizes == [3, 3, 1]
