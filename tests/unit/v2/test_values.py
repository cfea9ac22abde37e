"""Node values over v2 tensors: arrays keep dtype and shape, everything else travels as JSON."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipeserve.errors import InvalidInput
from pipeserve.v2.datatypes import decode_raw, encode_raw
from pipeserve.v2.values import decode_value, encode_value


def wire(tensors: dict[str, Any]) -> dict[str, Any]:
    """Through the bytes a v2 transport carries, and back."""
    from pipeserve.v2.datatypes import datatype_of

    return {name: decode_raw(encode_raw(a), datatype_of(a.dtype), list(a.shape)) for name, a in tensors.items()}


@pytest.mark.parametrize(
    "value",
    [
        np.array([[0.25, 0.5, 0.125]], dtype=np.float32),
        np.arange(6, dtype=np.int64).reshape(2, 3),
        np.array([True, False]),
    ],
)
def test_arrays_come_back_with_their_dtype_and_shape(value: Any) -> None:
    back = decode_value(wire(encode_value(value)))
    assert back.dtype == value.dtype
    np.testing.assert_array_equal(back, value)
    back[...] = back  # writable, as a local node's output would be


def test_a_dict_of_arrays_and_json_values_comes_back_key_by_key() -> None:
    value = {"svc": np.array([[0.9, 0.1]], dtype=np.float32), "label": "setosa", "meta": {"k": [1, 2]}, "none": None}
    back = decode_value(wire(encode_value(value)))
    assert set(back) == set(value)
    np.testing.assert_array_equal(back["svc"], value["svc"])
    assert back["svc"].dtype == np.float32
    assert back["label"] == "setosa"
    assert back["meta"] == {"k": [1, 2]}
    assert back["none"] is None


@pytest.mark.parametrize("value", ["text", 3, [1, "a"], None, {}])
def test_other_values_travel_as_json(value: Any) -> None:
    assert decode_value(wire(encode_value(value))) == value


def test_a_value_that_is_not_json_is_refused_naming_it() -> None:
    with pytest.raises(InvalidInput, match="'value' cannot travel"):
        encode_value(object())
