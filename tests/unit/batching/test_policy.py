"""BatchPolicy: a pure value that rejects impossible limits when built."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pipeserve.batching import BatchPolicy


def test_defaults_do_not_batch():
    policy = BatchPolicy()

    assert (policy.max_batch_size, policy.max_wait_s, policy.max_queue_size, policy.workers) == (1, 0.0, 1024, 1)
    assert policy.is_batching is False


def test_is_batching_above_one_row():
    assert BatchPolicy(max_batch_size=2).is_batching is True


def test_is_frozen():
    policy = BatchPolicy(max_batch_size=4)

    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_batch_size = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": -3}, "max_batch_size"),
        ({"max_wait_s": -0.001}, "max_wait_s"),
        ({"max_wait_s": math.nan}, "max_wait_s"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"workers": 0}, "workers"),
    ],
    ids=["batch-0", "batch-negative", "wait-negative", "wait-nan", "queue-0", "workers-0"],
)
def test_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BatchPolicy(**kwargs)


def test_accepts_the_smallest_valid_values():
    policy = BatchPolicy(max_batch_size=1, max_wait_s=0.0, max_queue_size=1, workers=1)

    assert policy.max_queue_size == 1
