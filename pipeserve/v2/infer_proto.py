"""ModelInfer messages on the wire with their tensors left where they are: the v2 gRPC hot path, both ends.

With protobuf objects alone, a 150 KB tensor crossed memory five times per call: copied into the request message,
serialized, framed, and on the server copied out of the parsed message again. Right after a model run every one
of those copies (and every Python step around them) runs with cold caches, which made them a third of what the
network hop added to a request (docs/split.md). Here the raw tensor fields (``raw_input_contents``,
``raw_output_contents``, which carry nearly all the bytes) are cut out of a message by a walk over its top-level
fields and kept as views of the bytes that arrived; the small rest is parsed by protobuf, in C. Writing is the
reverse: the small fields are serialized once per distinct call shape and cached, and the tensors are appended
(protobuf reads concatenated fields as one message: a repeated field's entries in order, wherever they are).

A message the walk cannot follow (a group, a truncated field) is parsed whole by protobuf, which then gives the
same message or the same error.

Example:
    >>> request = decode_request(encode_request("m", "", {"x": np.zeros((1, 2), np.float32)}))
    >>> request.message.model_name, request.tensors()["x"].shape
    ('m', (1, 2))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeserve.types import TensorDict
from pipeserve.v2 import grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.datatypes import DATATYPES, datatype_of, encode_raw

#: Field numbers of the raw tensor contents (``inference.proto``, as Triton numbers them).
RAW_INPUT_FIELD = 7
RAW_OUTPUT_FIELD = 6
_ID_FIELD = 3
_PARAMETERS_FIELD = 4
_OUTPUTS_FIELD = 6
_LENGTH_DELIMITED = 2
#: Top-level fields the walk reads before leaving a message to protobuf (a request has a few per tensor; a
#: message of a million tiny fields took the walk 2.3 s against protobuf's 0.05).
MAX_WALKED_FIELDS = 1024

#: Encoded small fields kept per distinct call shape (model, version, tensor names, datatypes and shapes, ...).
_CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A ``ModelInferRequest`` as a server reads it: ``message`` holds every field but the raw tensors, which
    are in ``raw`` (views of the bytes received, in order)."""

    message: pb.ModelInferRequest
    raw: list[bytes | memoryview]
    #: Bit n set: the request carries field n at its top level (all set when unknown).
    fields: int = -1

    def tensors(self) -> TensorDict:
        """The named input tensors (raw or typed contents).

        Raises:
            InvalidInput: sizes that do not match shapes, unknown datatypes, repeated names, raw and typed both.
        """
        return grpc_codec.tensors_of(self.message.inputs, self.raw, what="input")

    def requested_outputs(self) -> list[str] | None:
        """The outputs asked for, in order; ``None`` for all of them."""
        if not self.fields & 1 << _OUTPUTS_FIELD:
            return None
        return [out.name for out in self.message.outputs] or None

    def parameters(self) -> dict[str, Any]:
        if not self.fields & 1 << _PARAMETERS_FIELD:
            return {}
        return grpc_codec.get_parameters(self.message.parameters)


@dataclass(frozen=True, slots=True)
class InferResponse:
    """A ``ModelInferResponse`` to write: ``outputs`` in the order they are sent, as raw contents."""

    model_name: str
    model_version: str
    id: str
    outputs: Mapping[str, np.ndarray[Any, Any]]
    parameters: Mapping[str, Any] = field(default_factory=dict)


def decode_request(message: bytes | memoryview) -> InferRequest:
    """Read a serialized ``ModelInferRequest``.

    Raises:
        google.protobuf.message.DecodeError: bytes that are not such a message.
    """
    split = split_raw(message, RAW_INPUT_FIELD)
    if split is None:
        return _whole_request(message)
    rest, raw, fields = split
    parsed = pb.ModelInferRequest.FromString(rest)
    if parsed.raw_input_contents:  # only where the walk was wrong; cannot happen, but never answer wrongly
        return _whole_request(message)
    return InferRequest(parsed, raw, fields)


def _whole_request(message: bytes | memoryview) -> InferRequest:
    parsed = pb.ModelInferRequest.FromString(bytes(message))
    return InferRequest(parsed, list(parsed.raw_input_contents))


def encode_response(response: InferResponse) -> bytes:
    """A serialized ``ModelInferResponse`` with the outputs as raw contents."""
    key = (
        response.model_name,
        response.model_version,
        _parameters_key(response.parameters),
        tuple([(name, array.dtype, array.shape) for name, array in response.outputs.items()]),
    )
    head = _RESPONSE_HEADS.get(key)
    if head is None:
        message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version)
        if response.parameters:
            grpc_codec.set_parameters(message.parameters, response.parameters)
        for name, array in response.outputs.items():
            message.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
        head = _remember(_RESPONSE_HEADS, key, message.SerializeToString())
    parts: list[bytes | memoryview] = [head]
    if response.id:
        encoded = response.id.encode()
        parts += (_ID_TAG, _encode_varint(len(encoded)), encoded)
    for array in response.outputs.values():
        data = _raw_view(array)
        parts += (_RAW_OUTPUT_TAG, _encode_varint(len(data)), data)
    return b"".join(parts)


def encode_request(
    model_name: str,
    model_version: str,
    inputs: TensorDict,
    outputs: Sequence[str] | None = None,
    *,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> bytes:
    """A serialized ``ModelInferRequest`` with the inputs as raw contents (the tensors are copied once)."""
    key = (
        model_name,
        model_version,
        _parameters_key(parameters) if parameters else (),
        tuple([(name, array.dtype, array.shape) for name, array in inputs.items()]),
        tuple(outputs or ()),
    )
    head = _REQUEST_HEADS.get(key)
    if head is None:
        message = pb.ModelInferRequest(model_name=model_name, model_version=model_version)
        if parameters:
            grpc_codec.set_parameters(message.parameters, parameters)
        for name, array in inputs.items():
            message.inputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
        for name in outputs or ():
            message.outputs.add(name=name)
        head = _remember(_REQUEST_HEADS, key, message.SerializeToString())
    parts: list[bytes | memoryview] = [head]
    if request_id:
        encoded = request_id.encode()
        parts += (_ID_TAG, _encode_varint(len(encoded)), encoded)
    for array in inputs.values():
        data = _raw_view(array)
        parts += (_RAW_INPUT_TAG, _encode_varint(len(data)), data)
    return b"".join(parts)


def decode_response(message: bytes | memoryview) -> tuple[TensorDict, dict[str, Any]]:
    """The output tensors (views of ``message`` where they came raw) and the parameters of a response.

    Raises:
        google.protobuf.message.DecodeError: bytes that are not a ``ModelInferResponse``.
        InvalidInput: outputs whose contents do not match their shapes.
    """
    split = split_raw(message, RAW_OUTPUT_FIELD)
    if split is None:
        parsed, raw = pb.ModelInferResponse.FromString(bytes(message)), None
    else:
        rest, raw, _ = split
        parsed = pb.ModelInferResponse.FromString(rest)
        if parsed.raw_output_contents:  # see decode_request
            parsed, raw = pb.ModelInferResponse.FromString(bytes(message)), None
    if raw is None:
        raw = list(parsed.raw_output_contents)
    parameters = grpc_codec.get_parameters(parsed.parameters) if parsed.parameters else {}
    return grpc_codec.tensors_of(parsed.outputs, raw, what="output"), parameters


def _parameters_key(parameters: Mapping[str, Any]) -> tuple[tuple[str, type, Any], ...]:
    """Parameters as part of a cache key: with their types (``True == 1 == 1.0`` are different parameters)."""
    return tuple([(name, type(value), value) for name, value in parameters.items()])


def split_raw(message: bytes | memoryview, raw_field: int) -> tuple[bytes, list[bytes | memoryview], int] | None:
    """``message`` without the entries of the length-delimited field ``raw_field``, those entries (views, in
    order), and a bit mask of the field numbers seen (bit n for field n < 64); ``None`` when ``message`` has no
    such entry or its top level cannot be walked (protobuf decides)."""
    view = memoryview(message)
    size = len(view)
    raw_key = (raw_field << 3) | _LENGTH_DELIMITED
    kept: list[memoryview] = []
    raw: list[bytes | memoryview] = []
    position = start = fields = walked = 0
    try:
        while position < size:
            walked += 1
            if walked > MAX_WALKED_FIELDS:  # a message of many small fields: protobuf's C parser is much faster
                return None
            field_start = position
            key, position = _varint(view, position)
            number = key >> 3
            if number == 0:
                return None
            fields |= 1 << min(number, 63)
            value_start, position = _skip_value(view, position, key & 7)
            if key == raw_key:
                if field_start > start:
                    kept.append(view[start:field_start])
                raw.append(view[value_start:position])
                start = position
    except (IndexError, ValueError):  # a field running past the end, a group, an unknown wire type
        return None
    if position != size or not raw:
        return None
    if start < size:
        kept.append(view[start:size])
    return b"".join(kept), raw, fields


def _skip_value(view: memoryview, position: int, wire_type: int) -> tuple[int, int]:
    """(where a field's value starts, where the next field starts), the field's key read up to ``position``."""
    if wire_type == _LENGTH_DELIMITED:
        length, start = _varint(view, position)
        return start, start + length
    if wire_type == 0:
        return position, _varint(view, position)[1]
    if wire_type == 1:
        return position, position + 8
    if wire_type == 5:
        return position, position + 4
    raise ValueError(f"wire type {wire_type}")  # groups (deprecated) and invalid types


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it. Raises IndexError past the end or the 10th byte."""
    byte = view[position]
    if byte < 0x80:
        return byte, position + 1
    result = shift = 0
    for _ in range(10):
        byte = view[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
    raise IndexError("varint longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _raw_view(array: np.ndarray[Any, Any]) -> bytes | memoryview:
    """A tensor's raw bytes: a view of its memory when it is already laid out as v2 sends it (C order, the
    datatype's little-endian dtype), else a copy in that layout."""
    direct = _DIRECT.get(array.dtype)
    if direct is None:
        direct = _DIRECT[array.dtype] = (
            array.dtype.kind not in "OUS" and array.dtype == DATATYPES[datatype_of(array.dtype)]
        )
    if direct and array.flags.c_contiguous:
        return array.reshape(-1).data.cast("B") if array.size else b""
    return encode_raw(array)


def _remember(cache: dict[Any, bytes], key: Any, value: bytes) -> bytes:
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


_REQUEST_HEADS: dict[Any, bytes] = {}
_RESPONSE_HEADS: dict[Any, bytes] = {}
_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]
_ID_TAG = _SMALL_VARINTS[_ID_FIELD << 3 | _LENGTH_DELIMITED]
_RAW_INPUT_TAG = _SMALL_VARINTS[RAW_INPUT_FIELD << 3 | _LENGTH_DELIMITED]
_RAW_OUTPUT_TAG = _SMALL_VARINTS[RAW_OUTPUT_FIELD << 3 | _LENGTH_DELIMITED]
#: Per dtype: whether an array's memory is already its v2 raw layout (when C-contiguous).
_DIRECT: dict[np.dtype[Any], bool] = {}
