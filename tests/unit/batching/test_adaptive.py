"""Deadlines, tracing, per-replica workers and the adaptive policy of the batcher."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

import pytest

from pipeserve.batching import Batcher, BatchPolicy, CpuLane
from pipeserve.batching import batcher as batcher_module
from pipeserve.batching.policy import ArrivalRate, LatencyModel, SizeTrial, TrialHistory
from pipeserve.errors import DeadlineExceeded


async def test_an_expired_deadline_answers_without_running() -> None:
    ran: list[list[int]] = []
    gate = asyncio.Event()

    async def slow(items: list[int]) -> list[int]:
        ran.append(items)
        if items == [0]:
            await gate.wait()
        return items

    async with Batcher(slow, BatchPolicy(max_batch_size=1)) as batcher:
        first = asyncio.create_task(batcher.submit(0))
        await asyncio.sleep(0.01)
        late = asyncio.create_task(batcher.submit(1, deadline_s=time.monotonic() + 0.02))
        alive = asyncio.create_task(batcher.submit(2, deadline_s=time.monotonic() + 10))
        await asyncio.sleep(0.05)
        gate.set()
        assert await asyncio.wait_for(first, 2) == 0
        with pytest.raises(DeadlineExceeded, match="did not run"):
            await asyncio.wait_for(late, 2)
        assert await asyncio.wait_for(alive, 2) == 2
    assert [1] not in ran


async def test_traced_results_name_their_batch_and_wait() -> None:
    async def echo(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return items

    async with Batcher(echo, BatchPolicy(max_batch_size=8)) as batcher:
        traced = await asyncio.gather(*(batcher.submit_traced(i) for i in range(5)))
    assert [t.result for t in traced] == list(range(5))
    assert traced[0].batch.batch_id >= 1
    ids = {t.batch.batch_id for t in traced}
    assert all(t.queue_wait_s >= 0 for t in traced)
    assert sum(t.batch.items for t in traced if t.batch.batch_id == min(ids)) >= 1
    assert max(t.batch.size for t in traced) > 1, "concurrent items batch together"


async def test_each_worker_runs_its_own_function() -> None:
    seen: dict[int, int] = {0: 0, 1: 0}

    def bound(replica: int):  # type: ignore[no-untyped-def]
        async def run(items: list[int]) -> list[tuple[int, int]]:
            seen[replica] += len(items)
            await asyncio.sleep(0.01)
            return [(replica, item) for item in items]

        return run

    async with Batcher([bound(0), bound(1)], BatchPolicy(max_batch_size=2, workers=2)) as batcher:
        results = await asyncio.gather(*(batcher.submit(i) for i in range(12)))
    assert [item for _, item in results] == list(range(12))
    assert seen[0] > 0, "both replicas ran batches"
    assert seen[1] > 0, "both replicas ran batches"


def test_one_function_per_worker_is_checked() -> None:
    async def run(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match="one per worker"):
        Batcher([run], BatchPolicy(workers=2))


async def test_adaptive_does_not_wait_when_batching_saves_nothing() -> None:
    # Cost proportional to the batch size: a second request joining saves nothing, so never wait.
    async def linear(items: list[int]) -> list[int]:
        await asyncio.sleep(0.002 * len(items))
        return items

    policy = BatchPolicy(max_batch_size=16, max_wait_s=0.5, mode="adaptive")
    async with Batcher(linear, policy) as batcher:
        for size in (1, 2, 4):
            batcher.latency.observe(size, 0.002 * size)
        started = time.monotonic()
        for i in range(3):
            await batcher.submit(i)
            await asyncio.sleep(0.01)
        assert time.monotonic() - started < 0.3, "fixed mode would have waited 0.5 s per request"


async def test_adaptive_waits_for_company_when_it_pays() -> None:
    # A large fixed cost per batch: requests arriving every ~5 ms are worth waiting for.
    batch_sizes: list[int] = []

    async def fixed_cost(items: list[int]) -> list[int]:
        batch_sizes.append(len(items))
        await asyncio.sleep(0.03)
        return items

    policy = BatchPolicy(max_batch_size=8, max_wait_s=0.2, mode="adaptive")
    async with Batcher(fixed_cost, policy) as batcher:
        for size in (1, 2, 4, 8):
            batcher.latency.observe(size, 0.03)

        async def arrive(i: int) -> int:
            await asyncio.sleep(0.005 * i)
            return await batcher.submit(i)

        results = await asyncio.gather(*(arrive(i) for i in range(8)))
    assert results == list(range(8))
    assert max(batch_sizes) >= 3, batch_sizes


def test_latency_model_learns_and_extrapolates() -> None:
    model = LatencyModel()
    assert model.estimate(4) is None
    assert model.saving_s(1) == 0.0
    model.observe(2, 0.02)
    assert model.estimate(4) == pytest.approx(0.04), "one size seen: proportional, no saving assumed"
    assert model.saving_s(2) == pytest.approx(0.0)
    model.observe(3, float("nan"))
    model.observe(0, 1.0)
    assert model.sizes_seen == 1
    fixed_cost = LatencyModel()
    for _ in range(20):
        fixed_cost.observe(1, 0.010)
        fixed_cost.observe(8, 0.024)
    assert fixed_cost.estimate(16) == pytest.approx(0.040, rel=0.1)
    assert fixed_cost.saving_s(1) == pytest.approx(0.008, rel=0.05)


def test_arrival_rate_is_a_moving_average_of_gaps() -> None:
    rate = ArrivalRate(alpha=0.5)
    assert rate.expected_gap_s() is None
    for t in (0.0, 0.01, 0.02, 0.03):
        rate.arrived(t)
    assert rate.expected_gap_s() == pytest.approx(0.01)
    rate.arrived(0.13)
    assert rate.expected_gap_s() == pytest.approx(0.055)


def test_best_size_is_the_cheapest_per_row() -> None:
    model = LatencyModel()
    assert model.best_size(8) is None
    model.observe(1, 0.027)
    assert model.best_size(8) is None, "one size seen: nothing to compare"
    model.observe(8, 0.313)  # TorchScript on one core: bigger batches cost more per image
    assert model.best_size(8) == 1
    model.observe(4, 0.100)  # 25 ms per row: the cheapest
    assert model.best_size(8) == 4
    assert model.best_size(2) is None, "sizes above the limit do not count: one size left"
    model.observe(2, 0.0505)  # 25.25 ms per row: within 2% of the best, and smaller sizes win ties
    assert model.best_size(8) == 2
    model.observe(2, 0.060)  # 30 ms per row: no longer a tie
    assert model.best_size(8) == 4


async def test_adaptive_batches_stop_at_the_cheapest_size() -> None:
    sizes: list[int] = []

    async def costly_when_big(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0.001 * len(items) ** 2)
        return items

    policy = BatchPolicy(max_batch_size=16, mode="adaptive")
    async with Batcher(costly_when_big, policy, learns_latency=False) as batcher:  # only the seeded costs
        for size, seconds in ((1, 0.001), (2, 0.004), (16, 0.256)):
            batcher.latency.observe(size, seconds)
        await asyncio.gather(*(batcher.submit(i) for i in range(40)))
    assert max(sizes[1:]) == 1, sizes


async def test_adaptive_learns_smaller_batches_under_a_deep_queue() -> None:
    """Every batch would be full under a deep queue; trying other sizes finds that 1 is cheaper per row."""
    sizes: list[int] = []

    async def costly_when_big(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0.0005 * len(items) ** 2)
        return items

    policy = BatchPolicy(max_batch_size=8, mode="adaptive")
    async with Batcher(costly_when_big, policy) as batcher:  # learns from its own runs, nothing seeded
        results = await asyncio.gather(*(batcher.submit(i) for i in range(60)))
    assert results == list(range(60))
    assert sizes[:2] == [8, 1], "explores the full size, then 1"
    assert sizes[2:12] == [1] * 10, sizes
    assert batcher.latency.best_size(8) == 1


def test_rows_within_a_budget_and_forgetting() -> None:
    model = LatencyModel()
    assert model.rows_within(0.1, 8) == 1, "nothing learned: one row"
    model.observe(1, 0.03)
    assert model.rows_within(0.1, 8) == 3
    assert model.rows_within(0.1, 2) == 2
    assert model.rows_within(0.01, 8) == 1, "always at least one row"
    model.forget()
    assert model.sizes_seen == 0


def test_a_tie_within_two_percent_goes_to_the_smaller_size() -> None:
    model = LatencyModel(window=1)
    model.observe(1, 0.0061)
    model.observe(2, 0.0120)  # 1.6% cheaper per row: a tie, the smaller size wins
    model.observe(4, 0.0232)  # 4.9% cheaper per row than 1: a real saving
    assert model.best_size(8) == 4
    model.observe(4, 0.0256)  # now dearer per row than 1 and 2
    assert model.best_size(8) == 1


async def test_an_idle_batcher_of_batches_of_one_runs_an_item_alone_at_once() -> None:
    """``run_alone`` is the queue's answer without the queue: counted, timed, reported, the batch's error raised."""
    seen: list[int] = []
    reported: list[int] = []

    async def double(items: list[int]) -> list[int]:
        seen.extend(items)
        if 13 in items:
            raise ValueError("unlucky")
        return [2 * i for i in items]

    batcher = Batcher(double, BatchPolicy(max_batch_size=1), on_batch=lambda info: reported.append(info.size))
    assert not batcher.runs_alone(), "not started"
    async with batcher:
        assert batcher.runs_alone()
        traced = await batcher.run_alone(21)
        assert (traced.result, traced.batch.size, traced.batch.batch_id) == (42, 1, 1)
        with pytest.raises(ValueError, match="unlucky"):
            await batcher.run_alone(13)
        with pytest.raises(DeadlineExceeded):
            await batcher.run_alone(7, deadline_s=time.monotonic() - 1)
        assert seen == [21, 13], "an expired item never runs"
        await asyncio.sleep(0)  # reports go out after the answers
        assert reported == [1], "the failed batch reports no result"
        assert (await batcher.submit(5)) == 10, "the queue still works"


async def test_an_item_runs_alone_only_when_nothing_is_queued_or_running() -> None:
    release = asyncio.Event()

    async def held(items: list[int]) -> list[int]:
        await release.wait()
        return items

    async with Batcher(held, BatchPolicy(max_batch_size=1)) as batcher:
        first = asyncio.create_task(batcher.submit(1))
        await asyncio.sleep(0.01)
        assert not batcher.runs_alone(), "a batch is running"
        second = asyncio.create_task(batcher.submit(2))
        await asyncio.sleep(0)
        assert not batcher.runs_alone(), "an item is queued: it goes first (FIFO)"
        release.set()
        assert list(await asyncio.gather(first, second)) == [1, 2]
        assert batcher.runs_alone()


async def test_adaptive_mode_runs_items_alone_once_batches_of_one_are_cheapest_except_when_exploring() -> None:
    async def echo(items: list[int]) -> list[int]:
        return items

    policy = BatchPolicy(max_batch_size=4, max_wait_s=0.005, mode="adaptive")
    async with Batcher(echo, policy, learns_latency=False) as batcher:
        batcher._batch_counter = 1  # past the first batch
        assert not batcher.runs_alone(), "nothing learned yet"
        batcher.latency.observe(1, 0.010)
        batcher.latency.observe(4, 0.048)  # 12 ms per row at 4: batches of one are cheaper
        assert batcher.best_size == 1
        assert batcher.runs_alone()
        batcher.gate = CpuLane()
        assert batcher.runs_alone(), "with a gate too"
        batcher._batch_counter = batcher_module.EXPLORE_EVERY
        assert not batcher.runs_alone(), "every EXPLORE_EVERY-th batch starts a trial of another size, via the queue"
        batcher._batch_counter = batcher_module.EXPLORE_EVERY + 1
        for _ in range(3):
            batcher.latency.observe(4, 0.020)  # 5 ms per row at 4 now, but only a trial changes the size in use
        assert batcher.best_size == 1
        batcher.latency.forget()  # what was learned is relearned (e.g. after a warm-up): the size follows
        batcher.latency.observe(1, 0.010)
        batcher.latency.observe(4, 0.020)
        assert batcher.best_size == 4
        assert not batcher.runs_alone(), "the queue is where requests that arrived together meet"


async def test_fixed_batchers_of_more_than_one_never_run_items_alone() -> None:
    async def echo(items: list[int]) -> list[int]:
        return items

    async with Batcher(echo, BatchPolicy(max_batch_size=4)) as greedy:
        assert not greedy.runs_alone(), "greedy batches what queued while the last batch ran"
    async with Batcher(echo, BatchPolicy(max_batch_size=1)) as single:
        assert single.runs_alone()


async def test_the_only_request_in_progress_runs_alone_unless_the_batcher_would_wait_for_company() -> None:
    async def echo(items: list[int]) -> list[int]:
        return items

    policy = BatchPolicy(max_batch_size=4, max_wait_s=0.005, mode="adaptive")
    async with Batcher(echo, policy, learns_latency=False) as batcher:
        batcher._batch_counter = 1
        batcher.latency.observe(1, 0.010)
        batcher.latency.observe(4, 0.020)  # 5 ms per row at 4: batching pays
        assert not batcher.runs_alone()
        assert batcher.runs_alone(only_request=True), "no arrivals seen: nothing to wait for"
        for t in (0.0, 0.001, 0.002, 0.003, 0.004):
            batcher._arrivals.arrived(t)  # one every ms: the next is worth waiting for
        assert not batcher.runs_alone(only_request=True)
    async with Batcher(echo, BatchPolicy(max_batch_size=4)) as greedy:
        assert greedy.runs_alone(only_request=True), "greedy takes what is queued: just this one"
    async with Batcher(echo, BatchPolicy(max_batch_size=4, max_wait_s=0.005)) as waiting:
        assert not waiting.runs_alone(only_request=True), "fixed mode waits its max_wait_s, as configured"


def test_a_trial_alternates_blocks_of_the_two_sizes_and_keeps_the_cheaper() -> None:
    trial = SizeTrial(incumbent=4, candidate=2, rounds=2, block=3)
    planned = []
    per_row = {2: 0.009, 4: 0.010}
    while (size := trial.next_size) is not None:
        planned.append(size)
        trial.record(size, per_row[size] * size)
    assert planned == [2, 2, 2, 4, 4, 4, 2, 2, 2, 4, 4, 4]
    assert trial.winner() == 2


def test_a_trial_does_not_count_the_first_batch_after_a_change_of_size() -> None:
    """An engine's first run at a new shape is dearer (ONNX Runtime: make bench-shape-switch). Counted, that cost
    fell on every batch of a trial of single batches in turn, most of it per row on the smaller size: here 1 is
    cheaper than 2 at steady state but 0.6 ms dearer per row with the switch counted."""
    steady = {1: 0.0043, 2: 0.0088}  # per batch: 4.3 ms per row at 1, 4.4 at 2
    switch_s = 0.0015
    trial = SizeTrial(incumbent=2, candidate=1)
    last = None
    while (size := trial.next_size) is not None:
        trial.record(size, steady[size] + (switch_s if size != last else 0.0))
        last = size
    assert trial.winner() == 1


@pytest.mark.parametrize(
    ("incumbent", "candidate", "per_row", "winner"),
    [
        (4, 2, {2: 0.0101, 4: 0.0100}, 2),  # a smaller size within 2% wins the tie
        (4, 2, {2: 0.0105, 4: 0.0100}, 4),
        (2, 4, {2: 0.0100, 4: 0.0099}, 2),  # a larger size must be cheaper by more than 2%
        (2, 4, {2: 0.0100, 4: 0.0097}, 4),
    ],
)
def test_a_trial_breaks_ties_toward_the_smaller_size(
    incumbent: int, candidate: int, per_row: dict[int, float], winner: int
) -> None:
    trial = SizeTrial(incumbent=incumbent, candidate=candidate, rounds=1)
    while (size := trial.next_size) is not None:
        trial.record(size, per_row[size] * size)
    assert trial.winner() == winner


def test_a_trial_the_queue_cannot_feed_is_given_up_for_the_incumbent() -> None:
    trial = SizeTrial(incumbent=2, candidate=4, rounds=1, max_misses=3)
    for _ in range(4):
        trial.record(3, 0.01)  # only 3 rows were queued: not the 4 planned
    assert trial.done
    assert trial.winner() == 2
    with pytest.raises(ValueError, match="two batch sizes"):
        SizeTrial(incumbent=2, candidate=2)
    with pytest.raises(ValueError, match="blocks of >= 2"):
        SizeTrial(incumbent=2, candidate=4, block=1)


async def test_trials_find_the_cheapest_size_while_the_machine_speed_drifts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-row costs as a shared CPU shows them: the machine speed changes by half from one phase to the next, as
    much as the sizes differ. The warm-up's costs say 4 (measured at a fast moment); side by side, 2 is cheaper."""
    monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 8)
    per_row = {1: 0.010, 2: 0.0085, 4: 0.0095}
    batches = 0
    sizes: list[int] = []

    async def model(items: list[int]) -> list[int]:
        nonlocal batches
        batches += 1
        slow = 1.5 if (batches // 5) % 2 else 1.0  # drifts every 5 batches
        batcher.latency.observe(len(items), per_row[len(items)] * len(items) * slow)
        sizes.append(len(items))
        return items

    policy = BatchPolicy(max_batch_size=4, mode="adaptive", max_queue_size=2000)
    batcher: Batcher[int, int] = Batcher(model, policy, learns_latency=False)
    for size, seconds in ((1, 0.0100), (2, 0.0170), (4, 0.0280)):  # warm-up, fast: 4 looks cheapest (7 ms)
        batcher.latency.observe(size, seconds)
    async with batcher:
        assert batcher.best_size == 4
        results = await asyncio.gather(*(batcher.submit(i) for i in range(1500)))
    assert results == list(range(1500))
    assert batcher.best_size == 2
    assert Counter(sizes[-40:]).most_common(1)[0][0] == 2, sizes[-40:]  # between trials of 1 and 4, it runs 2


async def test_a_size_that_fails_in_a_trial_ends_the_trial_for_the_size_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch that raises fails its callers; if it was a trial's, the trial ends at once and the size in use stays
    (a trial kept planning the failing size, and every batch after it failed). Later trials may try it again: the
    failure may have been the data's, not the size's."""
    monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 4)
    sizes: list[int] = []

    async def model(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if len(items) == 4:
            raise MemoryError("batches of 4 do not fit")
        return items

    policy = BatchPolicy(max_batch_size=4, mode="adaptive", max_queue_size=2000)
    batcher: Batcher[int, int] = Batcher(model, policy)
    for size, seconds in ((1, 0.010), (2, 0.012), (4, 0.100)):  # 2 is cheapest; a trial will try 1 or 4
        batcher.latency.observe(size, seconds)
    async with batcher:
        outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(400)), return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, MemoryError)]
    assert len(failed) == 4 * sizes.count(4) > 0  # only the batches of 4 failed, each its own callers
    assert all((a, b) != (4, 4) for a, b in itertools.pairwise(sizes)), sizes  # each ended its trial
    assert sizes.count(4) <= len(sizes) // 8 + 1  # one batch in every other trial, none between trials
    assert batcher.best_size == 2


async def test_a_trial_that_outlives_forgetting_does_not_choose_for_the_new_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The costs are forgotten and relearned (after a warm-up) while a trial's last batch runs: the trial's winner,
    costed mostly before, is not stamped as the choice for the new costs; the size in use comes from what was
    learned since. (Forgotten earlier in a trial, the trial is dropped when the next batch is planned.)"""
    monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 4)
    costs = {1: 0.010, 2: 0.012, 4: 0.020}  # per batch: 4 is cheapest per row, then 2; a trial tries 2 against 4
    relearned = {1: 0.002, 2: 0.008, 4: 0.040}  # after forgetting: 1 is cheapest per row, and 2 beats 4
    forgot = False

    async def model(items: list[int]) -> list[int]:
        nonlocal forgot, costs
        trial = batcher._trial
        if trial is not None and trial.next_size is not None and len(trial._plan) == 1 and not forgot:
            # the trial's last batch is running: forget, and learn the new costs
            forgot = True
            costs = relearned
            batcher.latency.forget()
            for size, seconds in relearned.items():
                batcher.latency.observe(size, seconds)
        elif forgot and batcher._trial is None:
            monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 10**9)  # no trial after this one
        batcher.latency.observe(len(items), costs[len(items)])
        return items

    policy = BatchPolicy(max_batch_size=4, mode="adaptive", max_queue_size=2000)
    batcher: Batcher[int, int] = Batcher(model, policy, learns_latency=False)
    for size, seconds in costs.items():
        batcher.latency.observe(size, seconds)
    async with batcher:
        assert batcher.best_size == 4
        results = await asyncio.gather(*(batcher.submit(i) for i in range(200)))
    assert results == list(range(200))
    assert forgot
    assert batcher.best_size == 1  # from the relearned costs; the trial, begun before, would have said 2


def test_sizes_are_compared_with_what_each_batch_costs_the_server_beyond_the_engine() -> None:
    """EfficientNet-Lite0 in ONNX Runtime on one core: the engine runs batches of 2 and 4 equally fast per row, but
    each batch costs the server about 1 ms more (measured): per image, batches of 4 are the cheaper ones."""
    model = LatencyModel(window=1)
    model.observe(1, 0.01170)
    model.observe(2, 0.02292)  # 11.46 ms per row
    model.observe(4, 0.04544)  # 11.36 ms per row: within the tie, so the engine alone says 2
    model.observe(8, 0.09216)  # 11.52 ms per row
    assert model.best_size(8) == 2
    assert model.best_size(8, overhead_s=0.001) == 4, "2: 11.96, 4: 11.61, 8: 11.65 ms per row with the overhead"
    assert model.best_size(8, overhead_s=0.02) == 8, "a dear batch makes the biggest the cheapest"


async def _size_under_load(per_row: dict[int, float], overhead_s: float) -> int | None:
    """The size an adaptive batcher runs after 600 requests, with these noiseless engine costs per row."""

    async def model(items: list[int]) -> list[int]:
        batcher.latency.observe(len(items), per_row[len(items)] * len(items))
        return items

    policy = BatchPolicy(max_batch_size=4, mode="adaptive", max_queue_size=2000, batch_overhead_s=overhead_s)
    batcher: Batcher[int, int] = Batcher(model, policy, learns_latency=False)
    for size, row_s in per_row.items():  # the warm-up's costs
        batcher.latency.observe(size, row_s * size)
    async with batcher:
        await asyncio.gather(*(batcher.submit(i) for i in range(600)))
    return batcher.best_size


async def test_an_adaptive_batcher_under_load_runs_the_size_cheapest_with_the_overhead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batcher adds the policy's overhead to every batch it costs, in the warm-up's costs and in its trials."""
    monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 8)
    per_row = {1: 0.01170, 2: 0.01136, 4: 0.01146}  # the engine alone: 2 is 0.9% cheaper; with 1 ms per batch, 4
    assert await _size_under_load(per_row, 0.0) == 2
    assert await _size_under_load(per_row, 0.001) == 4


def test_a_negative_batch_overhead_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_overhead_s"):
        BatchPolicy(max_batch_size=4, batch_overhead_s=-0.001)
    assert BatchPolicy().batch_overhead_s == pytest.approx(0.001), "the default: 1 ms per batch"


def test_the_trial_history_picks_the_cheaper_size_more_often_than_one_trial_in_noise() -> None:
    """8% noise per batch, size 4 truly 3% cheaper per row than 2 (a shared CPU, batches of EfficientNet-Lite0 with
    the per-batch overhead): one trial's verdict, with its tie band, keeps 2 about half the time; the median of the
    pair's last 5 trials much less often."""
    import random

    rng = random.Random(7)
    history = TrialHistory()
    size = 2
    wrong_alone = wrong_history = 0
    runs = 600
    for _ in range(runs):
        trial = SizeTrial(incumbent=size, candidate=4 if size == 2 else 2)
        while (planned := trial.next_size) is not None:
            trial.record(planned, ((0.97 if planned == 4 else 1.0) + rng.gauss(0.0, 0.08)) * planned)
        wrong_alone += trial.winner() == 2
        size = history.add(trial)
        wrong_history += size == 2
    assert wrong_history / runs < 0.25 < wrong_alone / runs, (wrong_history / runs, wrong_alone / runs)


def test_one_slow_run_does_not_push_a_size_out_of_a_budget_for_good() -> None:
    """On one core a batch runs on the event loop only within the lane's budget, and a size kept out never runs
    again to correct its estimate: the budget is judged by the fastest recent run, not the median."""
    model = LatencyModel()
    model.observe(1, 0.0115)
    model.observe(8, 0.092)  # warm, at warm-up
    assert model.rows_within(0.1, 8) == 8
    model.observe(8, 0.110)  # one slow run (the machine drifts by 10-20%): the median is now 101 ms
    assert model.estimate(8) == pytest.approx(0.101)
    assert model.rows_within(0.1, 8) == 8
    for _ in range(5):
        model.observe(8, 0.130)  # truly slower now: every recent run is over the budget... but the fastest
    assert model.rows_within(0.1, 8) == 8, "the 92 ms run is still among the last 9"
    for _ in range(4):
        model.observe(8, 0.130)
    assert model.rows_within(0.1, 8) == 6, "once it has left the window, 8 rows no longer fit (7: 113 ms, by the line)"


async def test_forgotten_costs_take_the_trial_history_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials of costs that were forgotten (a new warm-up) no longer vote: the first trial after decides alone."""
    monkeypatch.setattr(batcher_module, "EXPLORE_EVERY", 8)
    per_row = {1: 0.0120, 2: 0.0100, 4: 0.0110}

    async def model(items: list[int]) -> list[int]:
        batcher.latency.observe(len(items), per_row[len(items)] * len(items))
        return items

    batcher: Batcher[int, int] = Batcher(
        model, BatchPolicy(max_batch_size=4, mode="adaptive", max_queue_size=2000), learns_latency=False
    )
    for size, row_s in per_row.items():
        batcher.latency.observe(size, row_s * size)
    async with batcher:
        await asyncio.gather(*(batcher.submit(i) for i in range(400)))
        assert batcher._history._ratios, "trials voted"
        batcher.latency.forget()
        batcher.latency.observe(1, 0.0120)
        batcher.latency.observe(2, 0.0200)
        assert batcher.best_size == 2
        assert not batcher._history._ratios, "the old trials were dropped with the costs they compared"
