"""v2 datatypes: names <-> NumPy, raw (binary / gRPC raw) and JSON tensor encodings, and their size checks."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from pipeserve.errors import InvalidInput
from pipeserve.v2.datatypes import (
    DATATYPES,
    datatype_of,
    decode_json,
    decode_raw,
    element_count,
    encode_json,
    encode_raw,
    numpy_of,
    select_outputs,
)

NUMERIC = [name for name in DATATYPES if name != "BYTES"]
JSON_NUMERIC = [name for name in NUMERIC if name != "FP16"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray[Any, Any]:
    """A tensor of ``datatype`` with distinct values (where the type allows), including its extremes."""
    count = int(np.prod(shape))
    if datatype == "BOOL":
        flags: np.ndarray[Any, Any] = np.arange(count) % 2 == 0
        return flags.reshape(shape)
    dtype = DATATYPES[datatype]
    if dtype.kind == "f":
        values = np.linspace(-2.5, 3.25, count).astype(dtype)
    else:
        info = np.iinfo(dtype)
        values = np.arange(count).astype(dtype)
        values[0], values[-1] = info.min, info.max
    return values.reshape(shape)


def bytes_tensor(*items: bytes) -> np.ndarray[Any, Any]:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


# --- names ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DATATYPES))
def test_every_datatype_name_maps_to_a_numpy_dtype_and_back(name: str) -> None:
    assert datatype_of(numpy_of(name)) == name


@pytest.mark.parametrize(("dtype", "name"), [("U5", "BYTES"), ("S3", "BYTES"), (">f4", "FP32"), (">i8", "INT64")])
def test_strings_are_bytes_and_byte_order_does_not_change_the_datatype(dtype: str, name: str) -> None:
    assert datatype_of(np.dtype(dtype)) == name


def test_a_numpy_dtype_without_a_v2_datatype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="complex64"):
        datatype_of(np.dtype("complex64"))


def test_an_unknown_datatype_name_is_invalid_input_listing_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match="'FLOAT'") as info:
        numpy_of("FLOAT")
    assert "FP32" in str(info.value)


def test_a_negative_dimension_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match=r"negative dimension"):
        element_count([2, -1])


# --- raw -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_datatype_round_trips_through_raw_bytes(name: str) -> None:
    array = sample(name)
    raw = encode_raw(array)
    assert len(raw) == array.size * DATATYPES[name].itemsize

    back = decode_raw(raw, name, [2, 3])

    assert back.dtype == DATATYPES[name]
    assert back.shape == (2, 3)
    np.testing.assert_array_equal(back, array)


def test_raw_bytes_are_little_endian_row_major_even_from_a_big_endian_array() -> None:
    array = np.array([[1, 2], [3, 256]], dtype=">i4")
    assert encode_raw(array) == struct.pack("<4i", 1, 2, 3, 256)
    assert encode_raw(np.asfortranarray(array)) == struct.pack("<4i", 1, 2, 3, 256)


def test_bool_is_one_byte_per_element_zero_or_one() -> None:
    raw = encode_raw(np.array([True, False, True]))
    assert raw == b"\x01\x00\x01"
    assert decode_raw(raw, "BOOL", [3]).tolist() == [True, False, True]


def test_fp16_travels_as_ieee_half_precision_bytes() -> None:
    raw = encode_raw(np.array([1.0, -2.0], dtype=np.float16))
    assert raw == b"\x00\x3c\x00\xc0"
    back = decode_raw(raw, "FP16", [2])
    assert back.dtype == np.float16
    assert back.tolist() == [1.0, -2.0]


def test_bytes_elements_are_length_prefixed_and_may_be_empty_or_not_utf8() -> None:
    array = bytes_tensor(b"pos", b"", b"\xff\x00\xfe")
    raw = encode_raw(array)
    assert raw == b"\x03\x00\x00\x00pos" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00\xff\x00\xfe"

    back = decode_raw(raw, "BYTES", [3, 1])

    assert back.dtype == object
    assert back.shape == (3, 1)
    assert back.reshape(-1).tolist() == [b"pos", b"", b"\xff\x00\xfe"]


def test_text_elements_are_encoded_as_utf8() -> None:
    raw = encode_raw(np.array(["hé", "x"]))
    assert decode_raw(raw, "BYTES", [2]).tolist() == ["hé".encode(), b"x"]


@pytest.mark.parametrize(("name", "shape"), [("FP32", [0, 4]), ("INT64", [3, 0]), ("BYTES", [0]), ("BOOL", [0])])
def test_a_zero_size_tensor_is_zero_bytes_and_keeps_its_shape(name: str, shape: list[int]) -> None:
    array = np.empty(shape, dtype=DATATYPES[name])
    assert encode_raw(array) == b""
    assert decode_raw(b"", name, shape).shape == tuple(shape)


def test_a_raw_size_that_does_not_match_the_shape_names_the_input_and_the_expected_size() -> None:
    with pytest.raises(InvalidInput) as info:
        decode_raw(b"\x00" * 12, "FP32", [1, 4], name="features")
    message = str(info.value)
    assert "'features'" in message
    assert "12 bytes" in message
    assert "16 bytes for shape [1, 4]" in message


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"\x03\x00", "ends inside a length prefix"),
        (b"\x05\x00\x00\x00ab", "runs past the end"),
        (b"\x01\x00\x00\x00a", "has 1 BYTES elements"),
    ],
)
def test_malformed_bytes_data_is_invalid_input_naming_the_input(raw: bytes, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem) as info:
        decode_raw(raw, "BYTES", [2], name="text")
    assert "'text'" in str(info.value)


def test_raw_data_of_an_unknown_datatype_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="unknown datatype 'BF16'"):
        decode_raw(b"\x00\x00", "BF16", [1])


# --- JSON ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", JSON_NUMERIC)
def test_every_json_datatype_round_trips_through_flat_json_data(name: str) -> None:
    array = sample(name)
    data = encode_json(array)
    assert len(data) == 6  # flat, row-major

    back = decode_json(data, name, [2, 3])

    assert back.dtype == DATATYPES[name]
    np.testing.assert_array_equal(back, array)


def test_json_uint64_values_beyond_int64_are_read_exactly() -> None:
    assert decode_json([0, 2**64 - 1], "UINT64", [2]).tolist() == [0, 2**64 - 1]


@pytest.mark.parametrize("data", [[1e30], [0.5, 1e30]])
def test_a_json_number_beyond_an_integer_datatypes_range_is_invalid_input(data: list[float]) -> None:
    with pytest.raises(InvalidInput, match="'x': data cannot be read as INT32"):
        decode_json(data, "INT32", [len(data)], name="x")


def test_nested_and_flat_json_data_give_the_same_tensor() -> None:
    nested = decode_json([[1, 2, 3], [4, 5, 6]], "INT32", [2, 3])
    flat = decode_json([1, 2, 3, 4, 5, 6], "INT32", [2, 3])
    np.testing.assert_array_equal(nested, flat)
    assert nested.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_bool_json_data_is_true_and_false() -> None:
    array = np.array([[True, False]])
    assert encode_json(array) == [True, False]
    assert decode_json([True, False], "BOOL", [1, 2]).tolist() == [[True, False]]


def test_bytes_json_data_is_utf8_text_in_and_out() -> None:
    back = decode_json(["pos", "", "hé"], "BYTES", [3])
    assert back.tolist() == [b"pos", b"", "hé".encode()]
    assert encode_json(back) == ["pos", "", "hé"]


def test_non_utf8_bytes_in_json_output_are_replaced_not_raised() -> None:
    assert encode_json(bytes_tensor(b"a\xff")) == ["a\ufffd"]


def test_fp16_cannot_travel_in_json() -> None:
    with pytest.raises(InvalidInput, match="FP16 cannot travel in JSON") as info:
        decode_json([1.0], "FP16", [1], name="half")
    assert "'half'" in str(info.value)


def test_a_zero_size_tensor_in_json_is_an_empty_list() -> None:
    array = decode_json([], "FP32", [0, 4])
    assert array.shape == (0, 4)
    assert array.dtype == np.float32
    assert encode_json(array) == []


def test_a_json_element_count_that_does_not_match_the_shape_names_the_input_and_shape() -> None:
    with pytest.raises(InvalidInput) as info:
        decode_json([1.0, 2.0, 3.0], "FP32", [1, 4], name="features")
    message = str(info.value)
    assert "'features' has 3 elements" in message
    assert "4 for shape [1, 4]" in message


@pytest.mark.parametrize("data", [["a", "b"], [[1, 2], [3]], None])
def test_json_data_that_is_not_numbers_of_the_shape_is_invalid_input(data: Any) -> None:
    with pytest.raises(InvalidInput, match="'x'"):
        decode_json(data, "FP32", [2], name="x")


def test_the_requested_outputs_are_selected_in_the_requested_order() -> None:
    outputs = {"a": np.zeros(1), "b": np.ones(1), "c": np.full(1, 2.0)}
    assert list(select_outputs(outputs, None)) == ["a", "b", "c"]
    assert list(select_outputs(outputs, [])) == ["a", "b", "c"]
    assert list(select_outputs(outputs, ["c", "a"])) == ["c", "a"]
    with pytest.raises(InvalidInput, match=r"unknown outputs \['score'\]") as info:
        select_outputs(outputs, ["a", "score"])
    assert "outputs among ['a', 'b', 'c']" in str(info.value)
