"""ModelInfer on the wire without protobuf objects: the same messages as protobuf (and Triton's compiled ones) read
and write, tensors left as views, and anything the walk cannot follow left to protobuf."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as triton  # type: ignore[import-untyped]

from pipeserve.errors import InvalidInput
from pipeserve.v2 import grpc_codec, infer_proto
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.datatypes import encode_raw
from pipeserve.v2.infer_proto import InferResponse, decode_request, decode_response, encode_request, encode_response
from tests.v2_messages import build_request, build_response

from .test_datatypes import bytes_tensor
from .test_grpc_codec import assert_same_tensors, every_datatype

PARAMETERS = {"flag": True, "count": -3, "big": 2**62, "name": "ü", "ratio": 0.25}


def without_raw(message: Any, field: str) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField(field)
    return copy


# --- requests ------------------------------------------------------------------------------------------------------


def test_a_request_reads_back_with_every_datatype_and_field() -> None:
    tensors = every_datatype()
    wire = encode_request("m", "2", tensors, ["y", "z"], request_id="req-1", parameters=PARAMETERS)

    request = decode_request(wire)
    assert (request.message.model_name, request.message.model_version, request.message.id) == ("m", "2", "req-1")
    assert request.requested_outputs() == ["y", "z"]
    assert request.parameters() == PARAMETERS
    assert_same_tensors(request.tensors(), tensors)


def test_a_request_is_the_message_protobuf_would_write() -> None:
    tensors = every_datatype()
    wire = encode_request("m", "2", tensors, ["y"], request_id="req-1", parameters=PARAMETERS)
    expected = build_request("m", "2", tensors, ["y"], request_id="req-1", parameters=PARAMETERS)
    assert pb.ModelInferRequest.FromString(wire) == expected


def test_tritons_own_messages_read_what_we_write_and_we_read_theirs() -> None:
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": bytes_tensor(b"x", b"yz")}
    theirs = triton.ModelInferRequest.FromString(encode_request("m", "1", tensors, request_id="r"))
    assert [t.name for t in theirs.inputs] == ["a", "b"]
    assert list(theirs.inputs[0].shape) == [2, 3]
    assert theirs.raw_input_contents[0] == tensors["a"].tobytes()

    request = triton.ModelInferRequest(model_name="m", id="t")
    request.inputs.add(name="a", datatype="FP32", shape=[2, 3])
    request.raw_input_contents.append(tensors["a"].tobytes())
    ours = decode_request(request.SerializeToString())
    assert ours.message.id == "t"
    assert_same_tensors(ours.tensors(), {"a": tensors["a"]})


def test_raw_tensors_are_views_of_the_bytes_that_arrived() -> None:
    wire = encode_request("m", "", {"x": np.arange(1000, dtype=np.uint8).reshape(1, 1000) % 251})
    received = np.frombuffer(wire, dtype=np.uint8)
    tensor = decode_request(wire).tensors()["x"]
    assert np.shares_memory(tensor, received)  # no copy between the socket's bytes and the model


def test_typed_contents_travel_through_protobuf_and_mixing_both_is_refused() -> None:
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="INT32", shape=[3]).contents.int_contents.extend([1, 2, 3])
    assert decode_request(typed.SerializeToString()).tensors()["x"].tolist() == [1, 2, 3]

    typed.raw_input_contents.append(np.array([1, 2, 3], np.int32).tobytes())
    with pytest.raises(InvalidInput, match="both raw and typed"):
        decode_request(typed.SerializeToString()).tensors()


def test_repeated_input_names_and_a_wrong_count_of_raw_contents_are_refused() -> None:
    twice = pb.ModelInferRequest(model_name="m")
    for _ in range(2):
        twice.inputs.add(name="x", datatype="UINT8", shape=[1])
        twice.raw_input_contents.append(b"\x01")
    with pytest.raises(InvalidInput, match="repeat"):
        decode_request(twice.SerializeToString()).tensors()
    short = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x01"])
    short.inputs.add(name="x", datatype="UINT8", shape=[1])
    short.inputs.add(name="y", datatype="UINT8", shape=[1])
    with pytest.raises(InvalidInput, match="1 raw contents for 2 inputs"):
        decode_request(short.SerializeToString()).tensors()


@pytest.mark.parametrize(
    "wire",
    [
        b"\x0a\x05mo",  # a string running past the end
        b"\x3a\xff",  # a raw entry whose length never ends
        b"\x0b\x0c",  # a group (wire type 3): protobuf's business
        b"\x00\x01",  # field number 0
    ],
)
def test_what_the_walk_cannot_follow_is_protobufs_to_accept_or_refuse(wire: bytes) -> None:
    try:
        expected: Any = pb.ModelInferRequest.FromString(wire)
    except DecodeError:
        with pytest.raises(DecodeError):
            decode_request(wire)
        return
    assert decode_request(wire).message == expected


# --- responses -----------------------------------------------------------------------------------------------------


def test_a_response_is_the_message_protobuf_would_write_and_reads_back() -> None:
    outputs = every_datatype()
    response = InferResponse("m", "3", "req-1", outputs, {"pipeserve_release": "f00"})
    wire = encode_response(response)
    expected = build_response("m", "3", "req-1", outputs, {"pipeserve_release": "f00"})
    assert pb.ModelInferResponse.FromString(wire) == expected
    assert triton.ModelInferResponse.FromString(wire).model_version == "3"

    tensors, parameters = decode_response(wire)
    assert parameters == {"pipeserve_release": "f00"}
    assert_same_tensors(tensors, outputs)


def test_a_response_with_empty_typed_contents_beside_raw_reads_like_mlserver_writes_it() -> None:
    message = pb.ModelInferResponse(model_name="m")
    output = message.outputs.add(name="y", datatype="FP32", shape=[2])
    output.contents.SetInParent()  # MLServer sends an empty contents message next to raw_output_contents
    message.raw_output_contents.append(np.array([1.5, 2.5], np.float32).tobytes())
    tensors, parameters = decode_response(message.SerializeToString())
    assert tensors["y"].tolist() == [1.5, 2.5]
    assert parameters == {}


def test_layouts_that_are_not_v2_s_own_are_converted_not_viewed() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    odd = {
        "transposed": base.T,
        "big_endian": base.astype(">f4"),
        "half": base.astype(np.float16),
        "flags": base > 5,
        "text": np.array(["a", "bé"], dtype=object),
    }
    wire = encode_response(InferResponse("m", "1", "", odd))
    assert list(pb.ModelInferResponse.FromString(wire).raw_output_contents) == [encode_raw(a) for a in odd.values()]
    tensors, _ = decode_response(wire)
    for name in ("transposed", "big_endian", "half", "flags"):
        np.testing.assert_array_equal(tensors[name], odd[name])
    assert tensors["text"].tolist() == [b"a", "bé".encode()]


def test_encoded_heads_are_cached_within_a_bound() -> None:
    for rows in range(infer_proto._CACHE_SIZE + 10):
        encode_request("m", "", {"x": np.zeros((rows, 1), np.float32)})
    assert len(infer_proto._REQUEST_HEADS) <= infer_proto._CACHE_SIZE


def test_parameters_equal_in_python_but_of_other_types_get_their_own_heads() -> None:
    """``True == 1 == 1.0`` and they hash alike: a cache keyed on the values alone sent the first one's type."""
    tensors = {"x": np.zeros((1, 2), np.float32)}
    for value in (True, 1, 1.0, False, 0):
        request = decode_request(encode_request("m", "", tensors, parameters={"p": value}))
        assert type(request.parameters()["p"]) is type(value)
    response = InferResponse("m", "1", "", {"y": np.zeros(1, np.float32)}, parameters={"p": 1})
    encode_response(InferResponse("m", "1", "", {"y": np.zeros(1, np.float32)}, parameters={"p": True}))
    assert decode_response(encode_response(response))[1] == {"p": 1}
    assert type(decode_response(encode_response(response))[1]["p"]) is int


def test_a_message_of_very_many_fields_is_left_to_protobuf() -> None:
    """The walk runs in Python: after MAX_WALKED_FIELDS top-level fields it hands the message to protobuf's parser
    (a million tiny unknown fields took it 2.3 s on the event loop, protobuf 0.05)."""
    tensors = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    unknown = b"\x78\x01" * (infer_proto.MAX_WALKED_FIELDS + 1)  # field 15, varint 1: skipped by protobuf
    wire = unknown + encode_request("m", "", tensors)
    assert infer_proto.split_raw(wire, infer_proto.RAW_INPUT_FIELD) is None
    assert_same_tensors(decode_request(wire).tensors(), tensors)
    assert infer_proto.split_raw(encode_request("m", "", tensors), infer_proto.RAW_INPUT_FIELD) is not None


# --- the walk against protobuf, on messages of any shape --------------------------------------------------------

names = st.text(alphabet="abcxyz_é", min_size=0, max_size=6)
parameter_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=5),
    st.floats(allow_nan=False),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A ModelInferRequest as any writer might lay it out: fields split into pieces in any order (protobuf merges
    concatenated messages), raw contents anywhere, fields from a newer schema we do not know."""
    message = pb.ModelInferRequest(model_name=draw(names), model_version=draw(names), id=draw(names))
    grpc_codec.set_parameters(message.parameters, draw(st.dictionaries(names, parameter_values, max_size=3)))
    for _ in range(draw(st.integers(0, 3))):
        message.inputs.add(name=draw(names), datatype="UINT8", shape=draw(st.lists(st.integers(0, 4), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        message.outputs.add(name=draw(names))
    raws = draw(st.lists(st.binary(max_size=300), max_size=3))
    unknown = draw(st.lists(st.sampled_from([b"\x80\x01\x05", b"\xa9\x01" + b"\x00" * 8, b"\xfd\x07\x01\x02\x03\x04"])))
    rng = random.Random(draw(st.integers(0, 2**32)))
    order = [without_raw(message, "raw_input_contents").SerializeToString(), *unknown]
    rng.shuffle(order)
    # each raw entry at a random place, their own order kept (protobuf keeps a repeated field's order)
    places = sorted(rng.randrange(len(order) + 1) for _ in raws)
    for shift, (place, raw) in enumerate(zip(places, raws, strict=True)):
        order.insert(place + shift, pb.ModelInferRequest(raw_input_contents=[raw]).SerializeToString())
    return b"".join(order)


@given(requests())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_walk_reads_every_request_as_protobuf_does(wire: bytes) -> None:
    full = pb.ModelInferRequest.FromString(wire)
    ours = decode_request(wire)
    assert ours.message == without_raw(full, "raw_input_contents")
    assert [bytes(raw) for raw in ours.raw] == list(full.raw_input_contents)
    assert ours.requested_outputs() == ([o.name for o in full.outputs] or None)
    assert ours.parameters() == grpc_codec.get_parameters(full.parameters)


@given(st.binary(max_size=64))
@settings(max_examples=500)
def test_on_any_bytes_the_walk_agrees_with_protobuf_or_leaves_it_to_protobuf(wire: bytes) -> None:
    try:
        full = pb.ModelInferRequest.FromString(wire)
    except DecodeError:
        with pytest.raises(DecodeError):
            decode_request(wire)
        return
    ours = decode_request(wire)
    assert ours.message == without_raw(full, "raw_input_contents")
    assert [bytes(raw) for raw in ours.raw] == list(full.raw_input_contents)
