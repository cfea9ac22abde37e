"""Device names and how model replicas are spread over devices. Pure functions."""

from __future__ import annotations

import re
from collections.abc import Sequence

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_device(name: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; anything else is a ``ValueError`` that says what is accepted."""
    if not _DEVICE.fullmatch(name):
        raise ValueError(f"unknown device {name!r}; expected 'cpu', 'cuda' or 'cuda:N' (e.g. 'cuda:0')")
    return "cuda:0" if name == "cuda" else name


def assign_devices(devices: Sequence[str], replicas: int) -> list[str]:
    """The device of each replica: round-robin over ``devices``, so 4 replicas on 2 GPUs get 2 each.

    Example:
        >>> assign_devices(["cuda:0", "cuda:1"], 3)
        ['cuda:0', 'cuda:1', 'cuda:0']
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not devices:
        raise ValueError("devices must name at least one device")
    checked = [check_device(device) for device in devices]
    return [checked[i % len(checked)] for i in range(replicas)]
