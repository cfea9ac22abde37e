"""Tensors <-> gRPC v2 messages, and wire compatibility with Triton's own compiled messages (tritonclient)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import service_pb2 as triton

from pipeserve.errors import InvalidInput
from pipeserve.types import TensorDict
from pipeserve.v2 import grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.datatypes import DATATYPES
from tests.v2_messages import build_request, build_response, request_tensors, response_tensors

from .test_datatypes import bytes_tensor, sample

TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def every_datatype() -> TensorDict:
    tensors: TensorDict = {name.lower(): sample(name) for name in DATATYPES if name != "BYTES"}
    tensors["bytes"] = bytes_tensor(b"pos", b"", b"\xff\xfe\x00").reshape(3, 1)
    tensors["empty"] = np.empty((0, 4), dtype=np.float32)
    tensors["empty_bytes"] = bytes_tensor()
    return tensors


def assert_same_tensors(got: TensorDict, want: TensorDict) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        if array.dtype != object:
            assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array)


def typed_request(datatype: str, shape: list[int], values: list[Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    if datatype == "BYTES":
        tensor.contents.bytes_contents.extend(values)
    elif datatype in TYPED_FIELD:
        getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values)
    return request


def invalid_request(request: pb.ModelInferRequest) -> str:
    with pytest.raises(InvalidInput) as info:
        request_tensors(request)
    return str(info.value)


# --- requests ------------------------------------------------------------------------------------------------------


def test_raw_contents_of_every_datatype_round_trip_in_input_order() -> None:
    tensors = every_datatype()
    request = build_request("m", "1", tensors, ["y"], request_id="r", parameters={"k": "v"})

    assert len(request.raw_input_contents) == len(tensors)
    assert all(not t.HasField("contents") for t in request.inputs)
    assert [o.name for o in request.outputs] == ["y"]
    assert grpc_codec.get_parameters(request.parameters) == {"k": "v"}
    assert_same_tensors(request_tensors(request), tensors)


@pytest.mark.parametrize("datatype", list(TYPED_FIELD))
def test_typed_contents_of_every_datatype_with_a_field_are_read(datatype: str) -> None:
    array = sample(datatype)
    request = typed_request(datatype, [2, 3], array.reshape(-1).tolist())

    tensor = request_tensors(request)["x"]

    assert tensor.dtype == DATATYPES[datatype]
    assert tensor.shape == (2, 3)
    np.testing.assert_array_equal(tensor, array)


def test_typed_bytes_contents_are_one_element_per_entry_empty_and_non_utf8_included() -> None:
    tensor = request_tensors(typed_request("BYTES", [1, 3], [b"a", b"", b"\xff"]))["x"]
    assert tensor.dtype == object
    assert tensor.tolist() == [[b"a", b"", b"\xff"]]


def test_a_typed_scalar_has_one_element() -> None:
    assert request_tensors(typed_request("INT32", [], [5]))["x"].tolist() == 5


@pytest.mark.parametrize("datatype", ["FP16"])
def test_raw_only_datatypes_in_typed_contents_are_invalid_input(datatype: str) -> None:
    message = invalid_request(typed_request(datatype, [1], []))
    assert f"input 'x': {datatype} can only travel raw" in message


def test_an_unknown_datatype_is_invalid_input_in_typed_and_raw_form() -> None:
    assert "unknown datatype 'FLOAT'" in invalid_request(typed_request("FLOAT", [1], []))
    raw = pb.ModelInferRequest(raw_input_contents=[b"\x00" * 4])
    raw.inputs.add(name="x", datatype="FLOAT", shape=[1])
    assert "unknown datatype 'FLOAT'" in invalid_request(raw)


def test_a_typed_element_count_that_does_not_match_the_shape_names_the_input() -> None:
    message = invalid_request(typed_request("FP32", [2, 2], [1.0, 2.0, 3.0]))
    assert "input 'x' has 3 elements" in message
    assert "4 for shape [2, 2]" in message


@pytest.mark.parametrize(("datatype", "value"), [("UINT8", 300), ("INT8", -200), ("INT16", 40000)])
def test_a_typed_value_out_of_the_datatypes_range_is_invalid_input(datatype: str, value: int) -> None:
    message = invalid_request(typed_request(datatype, [1], [value]))
    assert "'x'" in message
    assert datatype in message


def test_a_raw_size_that_does_not_match_the_shape_names_the_input() -> None:
    request = pb.ModelInferRequest(raw_input_contents=[b"\x00" * 12])
    request.inputs.add(name="features", datatype="FP32", shape=[1, 4])
    message = invalid_request(request)
    assert "input 'features' has 12 bytes" in message
    assert "16 bytes for shape [1, 4]" in message


def test_a_raw_entry_count_that_differs_from_the_inputs_is_invalid_input() -> None:
    request = build_request("m", "", {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)})
    del request.raw_input_contents[1]
    assert "1 raw contents for 2 inputs" in invalid_request(request)


def test_repeated_input_names_are_invalid_input() -> None:
    request = typed_request("INT32", [1], [1])
    request.inputs.add(name="x", datatype="INT32", shape=[1]).contents.int_contents.append(2)
    assert "repeat" in invalid_request(request)


# --- responses -----------------------------------------------------------------------------------------------------

OUTPUTS: TensorDict = {
    "probabilities": np.array([[0.25, 0.75]], dtype=np.float32),
    "label": np.array([1], dtype=np.int64),
    "half": np.array([1.5], dtype=np.float16),
    "text": bytes_tensor(b"ok", b"", b"\xff"),
}


def test_a_response_carries_every_output_raw_never_typed() -> None:
    response = build_response("m", "2", "id-1", OUTPUTS, {"pipeserve_release": "f00"})

    assert (response.model_name, response.model_version, response.id) == ("m", "2", "id-1")
    assert [o.name for o in response.outputs] == list(OUTPUTS)
    assert [o.datatype for o in response.outputs] == ["FP32", "INT64", "FP16", "BYTES"]
    assert [list(o.shape) for o in response.outputs] == [[1, 2], [1], [1], [3]]
    assert all(not o.HasField("contents") for o in response.outputs)
    assert response.raw_output_contents[0] == OUTPUTS["probabilities"].tobytes()
    assert grpc_codec.get_parameters(response.parameters) == {"pipeserve_release": "f00"}
    assert_same_tensors(response_tensors(response), OUTPUTS)


def test_parameters_keep_their_python_types() -> None:
    values = {"b": True, "i": -3, "f": 0.5, "s": "x"}
    request = pb.ModelInferRequest()
    grpc_codec.set_parameters(request.parameters, values)

    assert {k: v.WhichOneof("parameter_choice") for k, v in request.parameters.items()} == {
        "b": "bool_param",
        "i": "int64_param",
        "f": "double_param",
        "s": "string_param",
    }
    assert grpc_codec.get_parameters(request.parameters) == values


def test_a_parameter_with_no_value_set_reads_as_none() -> None:
    request = pb.ModelInferRequest()
    request.parameters["empty"].SetInParent()
    assert grpc_codec.get_parameters(request.parameters) == {"empty": None}


# --- wire compatibility with Triton's messages (tritonclient's compiled service_pb2, package "inference") ----------


def _field_shapes(descriptor: Descriptor) -> dict[int, tuple[str, int, bool, str | None]]:
    return {
        f.number: (f.name, f.type, f.is_repeated, f.message_type.name if f.message_type else None)
        for f in descriptor.fields
    }


def _all_messages(descriptor: Any) -> list[Descriptor]:
    found: list[Descriptor] = []
    for message in descriptor.message_types_by_name.values():
        found.append(message)
        found.extend(message.nested_types)
    return found


#: Fields we declare that Triton's proto lacks (MLServer's metadata parameters, where the release travels).
OURS_ONLY = {("ModelMetadataResponse", 6)}
SHARED_MESSAGES = [
    m for m in _all_messages(pb.DESCRIPTOR) if m.full_name != "pipeserve.oip.ModelMetadataResponse.ParametersEntry"
]


def test_both_protos_live_in_their_own_packages_in_one_process() -> None:
    assert pb.DESCRIPTOR.package == "pipeserve.oip"
    assert triton.DESCRIPTOR.package == "inference"


@pytest.mark.parametrize("ours", SHARED_MESSAGES, ids=lambda d: d.full_name)
def test_every_field_has_tritons_number_name_and_type(ours: Descriptor) -> None:
    theirs_name = ours.full_name.replace("pipeserve.oip.", "inference.", 1)
    theirs = triton.DESCRIPTOR.pool.FindMessageTypeByName(theirs_name)
    mine = _field_shapes(ours)
    for number in [n for n in mine if (ours.name, n) in OURS_ONLY]:
        assert number not in _field_shapes(theirs)
        del mine[number]
    assert mine == _field_shapes(theirs)


def test_a_tritonclient_request_parses_as_ours_with_every_parameter_kind() -> None:
    """tritonclient sends raw inputs, priority as uint64_param, timeout as int64_param, floats as double_param."""
    ints = grpcclient.InferInput("ints", [2, 2], "INT32")
    ints.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.int32))
    text = grpcclient.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(np.array([b"a", b"", b"\xff"], dtype=object))
    half = grpcclient.InferInput("half", [1], "FP16")
    half.set_data_from_numpy(np.array([2.5], dtype=np.float16))
    theirs = grpcclient._utils._get_inference_request(
        "m", [ints, text, half], "1", "req", [grpcclient.InferRequestedOutput("y")],
        0, False, False, 7, 100, {"f": 0.5, "s": "x", "b": True, "i": 4},
    )  # fmt: skip

    ours = pb.ModelInferRequest.FromString(theirs.SerializeToString())

    assert (ours.model_name, ours.model_version, ours.id) == ("m", "1", "req")
    assert [o.name for o in ours.outputs] == ["y"]
    assert grpc_codec.get_parameters(ours.parameters) == {
        "priority": 7,
        "timeout": 100,
        "f": 0.5,
        "s": "x",
        "b": True,
        "i": 4,
    }
    assert ours.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"
    tensors = request_tensors(ours)
    assert tensors["ints"].tolist() == [[1, 2], [3, 4]]
    assert tensors["text"].tolist() == [b"a", b"", b"\xff"]
    assert tensors["half"].dtype == np.float16
    assert tensors["half"].tolist() == [2.5]


def test_our_request_parses_as_tritons_with_raw_contents_and_parameters() -> None:
    ours = build_request(
        "m", "3", {"x": np.array([1.5], np.float64)}, ["y"], request_id="r", parameters={"d": 0.25, "n": 9}
    )
    ours.parameters["big"].uint64_param = 2**64 - 1

    theirs = triton.ModelInferRequest.FromString(ours.SerializeToString())

    assert (theirs.model_name, theirs.model_version, theirs.id) == ("m", "3", "r")
    assert theirs.inputs[0].name == "x"
    assert theirs.inputs[0].datatype == "FP64"
    assert list(theirs.inputs[0].shape) == [1]
    assert theirs.raw_input_contents[0] == np.array([1.5], "<f8").tobytes()
    assert theirs.outputs[0].name == "y"
    assert theirs.parameters["d"].double_param == 0.25
    assert theirs.parameters["n"].int64_param == 9
    assert theirs.parameters["big"].uint64_param == 2**64 - 1


def test_tritonclient_reads_our_response_with_as_numpy() -> None:
    response = build_response("m", "1", "id", OUTPUTS, {"pipeserve_release": "f00"})

    result = grpcclient.InferResult(triton.ModelInferResponse.FromString(response.SerializeToString()))

    np.testing.assert_array_equal(result.as_numpy("probabilities"), OUTPUTS["probabilities"])
    np.testing.assert_array_equal(result.as_numpy("label"), OUTPUTS["label"])
    np.testing.assert_array_equal(result.as_numpy("half"), OUTPUTS["half"])
    assert result.as_numpy("text").tolist() == [b"ok", b"", b"\xff"]
    assert result.get_response().parameters["pipeserve_release"].string_param == "f00"


def test_a_triton_style_typed_response_parses_as_ours() -> None:
    theirs = triton.ModelInferResponse(model_name="m", model_version="1")
    out = theirs.outputs.add(name="y", datatype="INT64", shape=[1, 2])
    out.contents.int64_contents.extend([5, -6])
    theirs.parameters["u"].uint64_param = 3

    ours = pb.ModelInferResponse.FromString(theirs.SerializeToString())

    assert response_tensors(ours)["y"].tolist() == [[5, -6]]
    assert grpc_codec.get_parameters(ours.parameters) == {"u": 3}


def test_tritons_model_metadata_skips_our_parameters_field_and_keeps_the_rest() -> None:
    ours = pb.ModelMetadataResponse(name="iris", versions=["1", "2"], platform="onnx")
    ours.inputs.add(name="input", datatype="FP32", shape=[-1, 4])
    ours.outputs.add(name="label", datatype="INT64", shape=[-1])
    grpc_codec.set_parameters(ours.parameters, {"pipeserve_release": "f00", "max_batch_size": 64})

    theirs = triton.ModelMetadataResponse.FromString(ours.SerializeToString())

    assert "parameters" not in theirs.DESCRIPTOR.fields_by_name
    assert (theirs.name, list(theirs.versions), theirs.platform) == ("iris", ["1", "2"], "onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in theirs.inputs] == [("input", "FP32", [-1, 4])]
    assert [(t.name, t.datatype, list(t.shape)) for t in theirs.outputs] == [("label", "INT64", [-1])]
    back = pb.ModelMetadataResponse.FromString(theirs.SerializeToString())  # unknown fields survive a re-encode
    assert grpc_codec.get_parameters(back.parameters) == {"pipeserve_release": "f00", "max_batch_size": 64}


def test_repository_and_health_messages_cross_both_ways() -> None:
    index = pb.RepositoryIndexResponse()
    index.models.add(name="iris", version="1", state="UNAVAILABLE", reason="unloaded")
    theirs_index = triton.RepositoryIndexResponse.FromString(index.SerializeToString())
    assert [(m.name, m.version, m.state, m.reason) for m in theirs_index.models] == [
        ("iris", "1", "UNAVAILABLE", "unloaded")
    ]

    load = triton.RepositoryModelLoadRequest(repository_name="", model_name="iris")
    load.parameters["config"].string_param = "{}"
    ours_load = pb.RepositoryModelLoadRequest.FromString(load.SerializeToString())
    assert ours_load.model_name == "iris"
    assert ours_load.parameters["config"].string_param == "{}"

    ready = pb.ModelReadyRequest.FromString(triton.ModelReadyRequest(name="iris", version="2").SerializeToString())
    assert (ready.name, ready.version) == ("iris", "2")
    meta = triton.ServerMetadataResponse.FromString(
        pb.ServerMetadataResponse(
            name="pipeserve", version="0.1", extensions=["binary_tensor_data"]
        ).SerializeToString()
    )
    assert (meta.name, meta.version, list(meta.extensions)) == ("pipeserve", "0.1", ["binary_tensor_data"])


def test_a_request_with_raw_and_typed_contents_is_invalid() -> None:
    request = build_request("m", "", {"x": np.array([1.0], dtype=np.float32)})
    request.inputs[0].contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="both raw and typed"):
        request_tensors(request)


def test_a_response_with_raw_and_empty_typed_contents_reads_the_raw_ones() -> None:
    """MLServer answers a raw request with raw contents and an empty ``contents`` message beside them."""
    response = build_response("m", "1", "", {"y": np.array([2.5], dtype=np.float64)})
    response.outputs[0].contents.SetInParent()
    assert response_tensors(response)["y"].tolist() == [2.5]
