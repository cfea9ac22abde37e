from __future__ import annotations

import pytest

from pipeserve.runtimes.devices import assign_devices, check_device


@pytest.mark.parametrize(
    ("devices", "replicas", "expected"),
    [
        (["cpu"], 1, ["cpu"]),
        (["cpu"], 3, ["cpu", "cpu", "cpu"]),
        (["cuda:0", "cuda:1"], 4, ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]),
        (["cuda:0", "cuda:1", "cpu"], 2, ["cuda:0", "cuda:1"]),
        (["cuda"], 2, ["cuda:0", "cuda:0"]),
    ],
)
def test_replicas_go_round_robin_over_devices(devices: list[str], replicas: int, expected: list[str]) -> None:
    assert assign_devices(devices, replicas) == expected


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "CUDA:0", "cuda:", "tpu:0", ""])
def test_unknown_devices_are_refused_with_the_accepted_forms(bad: str) -> None:
    with pytest.raises(ValueError, match="expected 'cpu', 'cuda' or 'cuda:N'"):
        check_device(bad)


def test_replicas_and_devices_must_be_given() -> None:
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        assign_devices(["cpu"], 0)
    with pytest.raises(ValueError, match="at least one device"):
        assign_devices([], 1)
