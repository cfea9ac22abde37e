"""Any node's value as v2 tensors, so handler nodes can be served over the same protocol as models.

Numeric and boolean NumPy arrays travel as typed tensors (dtype and shape kept, so a remote node's output is
bit-identical to the local one); anything else travels as JSON in a one-element BYTES tensor whose name starts
with ``json:``. A dict becomes one tensor per key; any other value is the tensor ``value``.

Example:
    >>> decode_value(encode_value({"p": np.float32([0.5]), "label": "setosa"}))["label"]
    'setosa'
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from pipeserve.errors import InvalidInput
from pipeserve.types import TensorDict

VALUE = "value"
JSON_PREFIX = "json:"


def _tensor(name: str, item: Any) -> tuple[str, Any]:
    if isinstance(item, np.ndarray) and item.dtype.kind in "biuf":
        return name, item
    try:
        encoded = orjson.dumps(item, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise InvalidInput(
            f"{name!r} cannot travel to a remote node ({exc})", expected="arrays or JSON values"
        ) from None
    array = np.empty(1, dtype=object)
    array[0] = encoded
    return JSON_PREFIX + name, array


def encode_value(value: Any) -> TensorDict:
    """A node's input or output as named tensors (see the module docstring)."""
    if isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        return dict(_tensor(key, item) for key, item in value.items())
    return dict([_tensor(VALUE, value)])


def decode_value(tensors: TensorDict) -> Any:
    """The value ``encode_value`` made (tensors from the wire)."""
    decoded: dict[str, Any] = {}
    for name, array in tensors.items():
        if name.startswith(JSON_PREFIX):
            raw = array.reshape(-1)[0] if array.size == 1 else b"null"
            decoded[name[len(JSON_PREFIX) :]] = orjson.loads(raw)
        else:
            decoded[name] = np.array(array)  # own, writable memory: the wire buffer is read-only
    if set(decoded) == {VALUE}:
        return decoded[VALUE]
    return decoded
