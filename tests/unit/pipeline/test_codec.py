"""codec: request ``data`` -> the first node's input, and results -> JSON-ready values."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
import pytest

from pipeserve.errors import InvalidInput
from pipeserve.pipeline.codec import decode_data, squeeze_single, to_jsonable
from pipeserve.pipeline.spec import InputSpec

IRIS = InputSpec(kind="tensor", dtype="float32", shape=[-1, 4])
ANY_TENSOR = InputSpec(kind="tensor")
IMAGE = InputSpec(kind="image")
PNG_HEAD = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def invalid(spec: InputSpec, data: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        decode_data(spec, data)
    return info.value


# --- tensors -------------------------------------------------------------------------------------------------


def test_tensor_rows_become_an_array_of_the_declared_dtype():
    array = decode_data(IRIS, [[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3]])

    assert isinstance(array, np.ndarray)
    assert array.dtype == np.float32
    assert array.shape == (2, 4)
    np.testing.assert_allclose(array[1], [6.2, 2.9, 4.3, 1.3], rtol=1e-6)


def test_single_row_gets_a_batch_dimension():
    array = decode_data(IRIS, [5.1, 3.5, 1.4, 0.2])

    assert array.shape == (1, 4)


def test_integers_are_accepted_for_float_inputs():
    assert decode_data(IRIS, [1, 2, 3, 4]).dtype == np.float32


def test_declared_integer_dtype():
    array = decode_data(InputSpec(kind="tensor", dtype="int64", shape=[-1, 2]), [[1, 2], [3, 4]])

    assert array.dtype == np.int64
    assert array.tolist() == [[1, 2], [3, 4]]


def test_fixed_inner_dimensions_are_checked():
    spec = InputSpec(kind="tensor", shape=[-1, 2, 3])

    assert decode_data(spec, [[1, 2, 3], [4, 5, 6]]).shape == (1, 2, 3)
    err = invalid(spec, [[1, 2], [3, 4]])
    assert "[2, 2]" in str(err)


def test_without_a_shape_any_rectangular_array_passes():
    assert decode_data(ANY_TENSOR, [[[1.0]], [[2.0]]]).shape == (2, 1, 1)


@pytest.mark.parametrize(
    ("data", "shape_text"),
    [([1.0, 2.0, 3.0], "[3]"), ([[1.0, 2.0, 3.0, 4.0, 5.0]], "[1, 5]"), ([[[1.0, 2.0, 3.0, 4.0]]], "[1, 1, 4]")],
)
def test_wrong_shape(data, shape_text):
    err = invalid(IRIS, data)

    assert f"shape {shape_text}" in err.problem
    assert err.expected is not None
    assert "[-1, 4]" in err.expected
    assert "rows of 4 numbers" in err.expected


def test_ragged_lists():
    err = invalid(IRIS, [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]])

    assert "not rectangular" in err.problem
    assert err.expected is not None
    assert "float32" in err.expected


@pytest.mark.parametrize("data", ["1,2,3,4", ["a", "b", "c", "d"], [["1", "2", "3", "4"]]], ids=["str", "list", "rows"])
def test_strings(data):
    err = invalid(IRIS, data)

    assert "text" in err.problem


@pytest.mark.parametrize("data", [True, [True, False, True, False]], ids=["bool", "list"])
def test_booleans(data):
    err = invalid(IRIS, data)

    assert "boolean" in err.problem


@pytest.mark.parametrize("data", [None, [1.0, None, 3.0, 4.0]], ids=["null", "null-in-list"])
def test_null(data):
    err = invalid(IRIS, data)

    assert "null" in err.problem
    assert err.expected is not None


@pytest.mark.parametrize(
    "data",
    [{"x": [1, 2, 3, 4]}, [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]],
    ids=["object", "list-of-objects"],
)
def test_nested_objects(data):
    err = invalid(IRIS, data)

    assert "object" in err.problem or "nested" in err.problem


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_nan_and_infinity(bad):
    err = invalid(IRIS, [1.0, bad, 3.0, 4.0])

    assert "NaN or infinity" in err.problem


def test_float_too_large_for_float32():
    err = invalid(IRIS, [1.0, 1e39, 3.0, 4.0])  # finite in JSON and float64, infinite in float32

    assert "too large" in err.problem


def test_integer_too_large_for_the_declared_integer_dtype():
    spec = InputSpec(kind="tensor", dtype="int32", shape=[-1, 2])

    err = invalid(spec, [[1, 2**40]])  # must not silently wrap around to 0

    assert err.expected is not None


def test_integer_too_large_for_any_machine_type():
    invalid(IRIS, [1, 10**40, 3, 4])


def test_too_many_rows():
    spec = InputSpec(kind="tensor", shape=[-1, 2], max_batch_rows=3)

    assert decode_data(spec, [[0, 0]] * 3).shape == (3, 2)
    err = invalid(spec, [[0, 0]] * 4)
    assert "4 rows" in err.problem
    assert err.expected == "at most 3 rows per request"


def test_empty_list():
    assert "shape [0]" in invalid(IRIS, []).problem
    assert "no rows" in invalid(ANY_TENSOR, []).problem


def test_single_number_without_a_shape():
    assert "single number" in invalid(ANY_TENSOR, 3.5).problem


def test_expected_text_shows_an_example_row():
    err = invalid(IRIS, "oops")

    assert err.expected == "float32 numbers with shape [-1, 4] (rows of 4 numbers), e.g. [[0.5, 0.5, 0.5, 0.5]]"
    assert str(err) == f"{err.problem}; expected {err.expected}"


def test_expected_text_without_a_shape():
    assert invalid(ANY_TENSOR, "oops").expected == "a (nested) list of float32 numbers"


# --- images --------------------------------------------------------------------------------------------------


def test_image_base64():
    assert decode_data(IMAGE, base64.b64encode(PNG_HEAD).decode()) == PNG_HEAD


def test_image_data_url():
    url = "data:image/png;base64," + base64.b64encode(PNG_HEAD).decode()

    assert decode_data(IMAGE, url) == PNG_HEAD


def test_image_base64_with_surrounding_whitespace():
    assert decode_data(IMAGE, "\n " + base64.b64encode(PNG_HEAD).decode() + "\n") == PNG_HEAD


def test_image_base64_wrapped_in_lines_as_the_base64_tool_prints_it():
    # `base64 cat.jpg` (which the error message suggests) wraps its output every 76 characters.
    payload = PNG_HEAD * 4
    wrapped = base64.encodebytes(payload).decode()
    assert "\n" in wrapped.strip()

    assert decode_data(IMAGE, wrapped) == payload


def test_image_bytes_pass_through():
    assert decode_data(IMAGE, bytearray(PNG_HEAD)) == PNG_HEAD


@pytest.mark.parametrize("text", ["not base64 at all!", "abc", "data:image/png;base64,@@@@"])
def test_image_invalid_base64(text):
    err = invalid(IMAGE, text)

    assert "not valid base64" in err.problem
    assert err.expected is not None
    assert "base64-encoded image" in err.expected


@pytest.mark.parametrize("text", ["", "   ", "data:image/png;base64,"], ids=["empty", "blank", "empty-data-url"])
def test_image_empty_string(text):
    err = invalid(IMAGE, text)

    assert "empty" in err.problem
    assert err.expected == "a base64-encoded image"


@pytest.mark.parametrize(
    ("data", "described"),
    [(123, "a number"), ([1, 2], "a list"), ({"b64": "xx"}, "an object"), (True, "a boolean")],
)
def test_image_not_a_string(data, described):
    err = invalid(IMAGE, data)

    assert described in err.problem
    assert err.expected == "a base64-encoded image as a JSON string"


def test_image_null():
    assert invalid(IMAGE, None).expected == "a base64-encoded image as a JSON string"


# --- json ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [{"value": 1}, [1, "a", None], "text", 0, False])
def test_json_input_passes_through(data):
    assert decode_data(InputSpec(kind="json"), data) == data


def test_json_input_null_is_missing():
    err = invalid(InputSpec(kind="json"), None)

    assert err.expected == "a JSON value"


# --- outputs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "squeezed"),
    [
        ([[0.1, 0.9]], [0.1, 0.9]),
        ([[1], [2]], [[1], [2]]),
        (["setosa"], "setosa"),
        ({"probabilities": [[0.2, 0.8]], "label": ["b"]}, {"probabilities": [0.2, 0.8], "label": "b"}),
        ("text", "text"),
        ([], []),
        (7, 7),
    ],
)
def test_squeeze_single_drops_a_batch_of_one(value, squeezed):
    assert squeeze_single(value) == squeezed


def test_squeeze_single_on_arrays():
    one = squeeze_single(np.array([[1.0, 2.0]]))
    two = squeeze_single(np.array([[1.0], [2.0]]))

    assert one.shape == (2,)
    assert two.shape == (2, 1)
    assert squeeze_single(np.float32(3.0)) == np.float32(3.0)


def test_to_jsonable_converts_numpy_and_bytes():
    value = {
        "probs": np.array([[0.25, 0.75]], dtype=np.float32),
        "best": np.int64(1),
        "score": np.float32(0.5),
        1: (np.uint8(3), b"\x00\xff"),
        "nested": [{"x": np.array([True])}],
    }

    converted = to_jsonable(value)

    assert converted == {
        "probs": [[0.25, 0.75]],
        "best": 1,
        "score": 0.5,
        "1": [3, "AP8="],
        "nested": [{"x": [True]}],
    }
    assert type(converted["best"]) is int
    assert type(converted["score"]) is float
    json.dumps(converted)  # plain JSON, nothing NumPy left


def test_to_jsonable_leaves_plain_values_alone():
    assert to_jsonable({"a": [1, "b", None, 2.5]}) == {"a": [1, "b", None, 2.5]}
