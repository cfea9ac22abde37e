"""ModelInfer messages as protobuf objects, written field by field: the reference ``infer_proto``'s bytes are
compared with, and requests for tests that call through grpc.aio stubs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeserve.types import TensorDict
from pipeserve.v2 import grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.datatypes import datatype_of, encode_raw


def build_request(
    model_name: str,
    version: str,
    inputs: TensorDict,
    outputs: list[str] | None = None,
    *,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model_name, model_version=version, id=request_id)
    _fill(request.parameters, parameters, request.inputs, request.raw_input_contents, inputs)
    for name in outputs or []:
        request.outputs.add(name=name)
    return request


def build_response(
    model_name: str,
    version: str,
    request_id: str,
    outputs: TensorDict,
    parameters: Mapping[str, Any] | None = None,
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=model_name, model_version=version, id=request_id)
    _fill(response.parameters, parameters, response.outputs, response.raw_output_contents, outputs)
    return response


def _fill(fields: Any, parameters: Mapping[str, Any] | None, specs: Any, raw: Any, tensors: TensorDict) -> None:
    """A message's parameters, and its tensors as specs with raw contents."""
    if parameters:
        grpc_codec.set_parameters(fields, parameters)
    for name, array in tensors.items():
        specs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
        raw.append(encode_raw(array))


def request_tensors(request: pb.ModelInferRequest) -> TensorDict:
    return grpc_codec.tensors_of(request.inputs, list(request.raw_input_contents), what="input")


def response_tensors(response: pb.ModelInferResponse) -> TensorDict:
    return grpc_codec.tensors_of(response.outputs, list(response.raw_output_contents), what="output")
