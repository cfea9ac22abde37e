"""v2 REST bodies: JSON requests and responses, and Triton's binary tensor extension on both sides."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from pipeserve.errors import InvalidInput
from pipeserve.types import TensorDict
from pipeserve.v2.datatypes import DATATYPES
from pipeserve.v2.rest_codec import (
    InferRequestBody,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    parse_infer_request,
)

from .test_datatypes import bytes_tensor, sample


def every_datatype() -> TensorDict:
    tensors: TensorDict = {name.lower(): sample(name) for name in DATATYPES if name != "BYTES"}
    tensors["bytes"] = bytes_tensor(b"pos", b"", b"\xff\xfe", b"neg", b"\x00", b"x").reshape(2, 3)
    tensors["empty"] = np.empty((0, 4), dtype=np.float32)
    return tensors


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, str]:
    """A hand-made binary request: the JSON header, the blobs after it, and the header length to send."""
    json_part = orjson.dumps(header)
    return json_part + b"".join(blobs), str(len(json_part))


def request_for(outputs: list[str] | None = None, **kwargs: Any) -> InferRequestBody:
    values: dict[str, Any] = {
        "request_id": None,
        "inputs": {},
        "outputs": outputs,
        "binary_outputs": {},
        "binary_default": False,
        "parameters": {},
    }
    values.update(kwargs)
    return InferRequestBody(**values)


def invalid(body: bytes, header_length: str | None = None) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_infer_request(body, header_length)
    return str(info.value)


def assert_same_tensors(got: TensorDict, want: TensorDict) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        if array.dtype != object:
            assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array)


# --- requests ------------------------------------------------------------------------------------------------------


def test_a_binary_request_of_every_datatype_round_trips_in_input_order() -> None:
    tensors = every_datatype()
    body, json_size = encode_infer_request(tensors, binary=True, request_id="r1")
    assert json_size is not None

    request = parse_infer_request(body, str(json_size))

    assert_same_tensors(request.inputs, tensors)
    assert request.request_id == "r1"
    assert request.outputs is None
    assert request.binary_default is True  # no outputs listed: binary_data_output, as tritonclient sends


def test_a_json_request_round_trips_without_a_header_length() -> None:
    tensors = {name: array for name, array in every_datatype().items() if name not in ("fp16", "bytes")}
    tensors["text"] = bytes_tensor(b"pos", b"", "hé".encode())
    body, json_size = encode_infer_request(tensors, ["out"], binary=False)
    assert json_size is None

    request = parse_infer_request(body, None)

    assert_same_tensors(request.inputs, tensors)
    assert request.outputs == ["out"]
    assert request.binary_outputs == {"out": False}
    assert request.binary_default is False


def test_tritonclients_default_body_is_read() -> None:
    """The JSON tritonclient sends by default (PROTOCOLS §5.2), then the 12 bytes of the tensor."""
    array = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    header = {
        "inputs": [{"name": "IN", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}],
        "parameters": {"binary_data_output": True},
    }
    body, length = binary_body(header, array.tobytes())

    request = parse_infer_request(body, length)

    np.testing.assert_array_equal(request.inputs["IN"], array)
    assert request.binary_default is True


def test_binary_and_json_inputs_mix_and_blobs_follow_the_binary_ones_in_order() -> None:
    header = {
        "inputs": [
            {"name": "a", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
            {"name": "b", "shape": [1], "datatype": "FP64", "data": [0.5]},
            {"name": "c", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 9}},
        ]
    }
    body, length = binary_body(header, np.array([7, 8], "<i4").tobytes(), b"\x01\x00\x00\x00x\x00\x00\x00\x00")

    request = parse_infer_request(body, length)

    assert request.inputs["a"].tolist() == [7, 8]
    assert request.inputs["b"].tolist() == [0.5]
    assert request.inputs["c"].tolist() == [b"x", b""]


def test_a_zero_size_binary_tensor_has_binary_data_size_zero() -> None:
    header = {"inputs": [{"name": "x", "shape": [0, 4], "datatype": "FP32", "parameters": {"binary_data_size": 0}}]}
    body, length = binary_body(header)
    assert parse_infer_request(body, length).inputs["x"].shape == (0, 4)


def test_nested_json_data_is_read_row_major() -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]})
    assert parse_infer_request(body, None).inputs["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_fp16_in_json_is_rejected_naming_the_input() -> None:
    body = orjson.dumps({"inputs": [{"name": "half", "shape": [1], "datatype": "FP16", "data": [1.0]}]})
    message = invalid(body)
    assert "'half'" in message
    assert "FP16 cannot travel in JSON" in message


def test_extra_top_level_keys_and_a_numeric_id_are_accepted() -> None:
    """The KServe client always sends "id" and "model_name"; the id comes back as a string."""
    body = orjson.dumps(
        {"id": 7, "model_name": "m", "inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}]}
    )
    request = parse_infer_request(body, None)
    assert request.request_id == "7"


def test_request_parameters_are_kept() -> None:
    body = orjson.dumps(
        {
            "parameters": {"timeout": 5, "x": "y"},
            "inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}],
        }
    )
    assert parse_infer_request(body, None).parameters == {"timeout": 5, "x": "y"}


@pytest.mark.parametrize("header_length", ["abc", "1.5", ""])
def test_a_header_length_that_is_not_an_integer_is_invalid_input(header_length: str) -> None:
    body, _ = binary_body({"inputs": []})
    message = invalid(body, header_length)
    assert "inference-header-content-length" in message
    assert repr(header_length) in message


@pytest.mark.parametrize("delta", [1, 1000])
def test_a_header_length_beyond_the_body_is_invalid_input(delta: int) -> None:
    body, length = binary_body({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}]})
    message = invalid(body, str(int(length) + delta))
    assert f"for a {len(body)}-byte body" in message


def test_a_negative_header_length_is_invalid_input() -> None:
    body, _ = binary_body({"inputs": []})
    assert "is -1 for a" in invalid(body, "-1")


def test_a_header_length_cutting_the_json_short_is_invalid_json() -> None:
    body, length = binary_body(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "parameters": {"binary_data_size": 1}}]}, b"\x01"
    )
    assert "not valid JSON" in invalid(body, str(int(length) - 3))


def test_a_binary_data_size_beyond_the_body_names_the_input_and_what_remains() -> None:
    header = {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    body, length = binary_body(header, b"\x00" * 12)
    message = invalid(body, length)
    assert "input 'x' says binary_data_size 16 but 12 bytes remain" in message


def test_binary_data_without_the_header_length_is_invalid_input() -> None:
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    json_part = orjson.dumps(header)
    assert "not valid JSON" in invalid(json_part + b"\x00\x00\x80\x3f", None)
    assert "binary_data_size 4 but 0 bytes remain" in invalid(json_part, None)


def test_a_binary_data_size_that_does_not_match_the_shape_names_the_input() -> None:
    header = {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}
    body, length = binary_body(header, b"\x00" * 12)
    message = invalid(body, length)
    assert "input 'x' has 12 bytes of FP32 data" in message
    assert "16 bytes for shape [4]" in message


@pytest.mark.parametrize("size", [-1, "8", 1.5])
def test_a_binary_data_size_that_is_not_a_byte_count_is_invalid_input(size: Any) -> None:
    header = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": size}}]}
    body, length = binary_body(header, b"\x00" * 8)
    assert f"binary_data_size {size}" in invalid(body, length)


def test_trailing_bytes_after_the_last_tensor_are_invalid_input() -> None:
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    body, length = binary_body(header, b"\x00" * 4, b"junk")
    assert "4 bytes follow the last tensor" in invalid(body, length)


def test_trailing_bytes_after_a_json_only_request_with_a_header_length_are_invalid_input() -> None:
    body, length = binary_body({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}]}, b"xx")
    assert "2 bytes follow the last tensor" in invalid(body, length)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ([], "no 'inputs' list"),
        ({}, "no 'inputs' list"),
        ({"inputs": []}, "no 'inputs' list"),
        ({"inputs": {"name": "x"}}, "no 'inputs' list"),
        ({"inputs": ["x"]}, "an input is not an object"),
        ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}, "an input has no name"),
        ({"inputs": [{"name": "x", "shape": [1], "data": [1]}]}, "input 'x' has no datatype"),
        ({"inputs": [{"name": "x", "shape": "1", "datatype": "FP32", "data": [1]}]}, "input 'x' has shape '1'"),
        ({"inputs": [{"name": "x", "shape": [True], "datatype": "FP32", "data": [1]}]}, "input 'x' has shape [True]"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "input 'x' has no data"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1]}]}, "unknown datatype 'FLOAT'"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1, 2]}]}, "input 'x' has 2 elements"),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}] * 2},
            "input 'x' appears twice",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}], "parameters": [1]},
            "'parameters' is not an object",
        ),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}], "outputs": {}}, "not a list"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1]}], "outputs": [{}]}, "no name"),
    ],
)
def test_a_malformed_request_says_what_is_wrong(doc: Any, problem: str) -> None:
    assert problem in invalid(orjson.dumps(doc))


def test_a_body_that_is_not_json_is_invalid_input() -> None:
    assert "the body is not valid JSON" in invalid(b"{inputs: nope")


# --- responses -----------------------------------------------------------------------------------------------------

OUTPUTS: TensorDict = {
    "probabilities": np.array([[0.25, 0.75]], dtype=np.float32),
    "label": np.array([1], dtype=np.int64),
    "text": bytes_tensor(b"ok", b"\xff"),
}


def response_doc(body: bytes, json_size: int | None) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(body[:json_size] if json_size is not None else body)
    return doc


def test_a_json_response_has_flat_data_model_name_version_id_and_parameters() -> None:
    body, json_size = encode_infer_response(
        "iris", "2", request_for(request_id="abc"), OUTPUTS, {"pipeserve_release": "f00"}
    )

    assert json_size is None
    doc = response_doc(body, None)
    assert doc["model_name"] == "iris"
    assert doc["model_version"] == "2"
    assert doc["id"] == "abc"
    assert doc["parameters"] == {"pipeserve_release": "f00"}
    assert doc["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}
    assert doc["outputs"][1] == {"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}
    assert doc["outputs"][2]["datatype"] == "BYTES"


def test_a_response_without_a_request_id_has_no_id() -> None:
    body, _ = encode_infer_response("m", "1", request_for(), OUTPUTS)
    assert "id" not in response_doc(body, None)


def test_binary_data_output_makes_every_output_binary_after_the_json_header() -> None:
    body, json_size = encode_infer_response("m", "1", request_for(binary_default=True), OUTPUTS)

    assert json_size is not None
    doc = response_doc(body, json_size)
    sizes = [out["parameters"]["binary_data_size"] for out in doc["outputs"]]
    assert all("data" not in out for out in doc["outputs"])
    assert sizes == [8, 8, 4 + 2 + 4 + 1]
    assert len(body) == json_size + sum(sizes)
    assert body[json_size : json_size + 8] == OUTPUTS["probabilities"].tobytes()


def test_a_per_output_binary_data_flag_overrides_binary_data_output() -> None:
    request = request_for(
        ["label", "probabilities"], binary_outputs={"label": False, "probabilities": True}, binary_default=False
    )
    body, json_size = encode_infer_response("m", "1", request, OUTPUTS)
    assert json_size is not None
    doc = response_doc(body, json_size)
    assert doc["outputs"][0] == {"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 8}

    opposite = request_for(["label"], binary_outputs={"label": False}, binary_default=True)
    body, json_size = encode_infer_response("m", "1", opposite, OUTPUTS)
    assert json_size is None  # the only output asked for JSON despite binary_data_output
    assert response_doc(body, None)["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}]


def test_only_the_requested_outputs_come_back_in_the_requested_order() -> None:
    body, _ = encode_infer_response("m", "1", request_for(["text", "label"]), OUTPUTS)
    assert [out["name"] for out in response_doc(body, None)["outputs"]] == ["text", "label"]


def test_an_unknown_requested_output_is_invalid_input_naming_it_and_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as info:
        encode_infer_response("m", "1", request_for(["label", "score"]), OUTPUTS)
    message = str(info.value)
    assert "unknown outputs ['score']" in message
    assert "'probabilities'" in message


def test_a_mixed_binary_and_json_response_decodes_to_the_same_tensors_losslessly() -> None:
    request = request_for(binary_outputs={"label": False}, binary_default=True)
    body, json_size = encode_infer_response("m", "1", request, OUTPUTS, {"k": 1})

    doc, tensors = decode_infer_response(body, str(json_size))

    assert doc["parameters"] == {"k": 1}
    assert_same_tensors(tensors, OUTPUTS)  # the non-UTF-8 BYTES element survives in binary


def test_a_json_response_decodes_without_a_header_length() -> None:
    outputs = {"probabilities": OUTPUTS["probabilities"], "label": OUTPUTS["label"]}
    body, json_size = encode_infer_response("m", "1", request_for(), outputs)
    _, tensors = decode_infer_response(body, None if json_size is None else str(json_size))
    assert_same_tensors(tensors, outputs)


def test_a_response_without_outputs_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="no 'outputs' list"):
        decode_infer_response(b'{"error": "boom"}', None)


def test_client_requests_ask_for_binary_outputs_per_output_when_outputs_are_named() -> None:
    body, json_size = encode_infer_request({"x": np.zeros(1, np.float32)}, ["a", "b"], binary=True)
    assert json_size is not None
    doc = orjson.loads(body[:json_size])
    assert "parameters" not in doc
    assert doc["outputs"] == [
        {"name": "a", "parameters": {"binary_data": True}},
        {"name": "b", "parameters": {"binary_data": True}},
    ]
    assert doc["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]
