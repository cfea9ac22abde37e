"""The batch callback's metrics: histograms on every batch, learned-cost gauges every LEARNED_EVERY batches."""

from __future__ import annotations

from dataclasses import dataclass

from pipeserve.observability.metrics import LEARNED_EVERY, Metrics


@dataclass
class Info:
    size: int
    queue_wait_s: float = 0.001
    run_s: float = 0.01


class LearningNode:
    """Stands in for a ModelNode: what its batcher learned so far."""

    def __init__(self) -> None:
        self.per_row = {1: 0.010, 2: 0.0095}
        self.best: int | None = 2

    def learned_costs(self) -> tuple[dict[int, float], int | None]:
        return dict(self.per_row), self.best


def sample(metrics: Metrics, line_start: str) -> float | None:
    text = metrics.render().decode()
    line = next((line for line in text.splitlines() if line.startswith(line_start)), None)
    return None if line is None else float(line.rsplit(" ", 1)[1])


def test_the_first_batch_exports_what_was_learned() -> None:
    metrics = Metrics()
    on_batch = metrics.batch_observer("imagenet", "classifier")
    on_batch(LearningNode(), Info(size=2))
    learned = 'pipeserve_batch_learned_seconds_per_row{model="classifier",pipeline="imagenet",size='
    assert sample(metrics, learned + '"1"}') == 0.010
    assert sample(metrics, learned + '"2"}') == 0.0095
    assert sample(metrics, 'pipeserve_batch_best_size{model="classifier",pipeline="imagenet"}') == 2
    assert sample(metrics, 'pipeserve_batch_size_count{model="classifier",pipeline="imagenet"}') == 1


def test_gauges_follow_the_learning_every_few_batches_and_histograms_every_batch() -> None:
    metrics = Metrics()
    on_batch = metrics.batch_observer("p", "m")
    node = LearningNode()
    on_batch(node, Info(size=1))
    node.per_row = {1: 0.008, 2: 0.0095, 4: 0.02}
    node.best = 1
    for _ in range(LEARNED_EVERY - 1):
        on_batch(node, Info(size=1))
    learned = 'pipeserve_batch_learned_seconds_per_row{model="m",pipeline="p",size='
    assert sample(metrics, learned + '"1"}') == 0.010, "not updated before LEARNED_EVERY batches"
    assert sample(metrics, learned + '"4"}') is None
    on_batch(node, Info(size=1))
    assert sample(metrics, learned + '"1"}') == 0.008
    assert sample(metrics, learned + '"4"}') == 0.02
    assert sample(metrics, 'pipeserve_batch_best_size{model="m",pipeline="p"}') == 1
    assert sample(metrics, 'pipeserve_batch_size_count{model="m",pipeline="p"}') == LEARNED_EVERY + 1


def test_fixed_mode_exports_costs_but_no_best_size_and_plain_nodes_only_histograms() -> None:
    metrics = Metrics()
    fixed = LearningNode()
    fixed.best = None
    metrics.batch_observer("p", "fixed")(fixed, Info(size=4))
    metrics.batch_observer("p", "plain")(object(), Info(size=3))
    assert sample(metrics, 'pipeserve_batch_learned_seconds_per_row{model="fixed",pipeline="p",size="2"}') == 0.0095
    assert sample(metrics, 'pipeserve_batch_best_size{model="fixed",pipeline="p"}') is None
    assert sample(metrics, 'pipeserve_batch_learned_seconds_per_row{model="plain"') is None
    assert sample(metrics, 'pipeserve_batch_size_sum{model="plain",pipeline="p"}') == 3
