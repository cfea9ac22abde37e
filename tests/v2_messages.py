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
    if parameters:
        grpc_codec.set_parameters(request.parameters, parameters)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
        request.raw_input_contents.append(encode_raw(array))
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
    if parameters:
        grpc_codec.set_parameters(response.parameters, parameters)
    for name, array in outputs.items():
        response.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
        response.raw_output_contents.append(encode_raw(array))
    return response


def request_tensors(request: pb.ModelInferRequest) -> TensorDict:
    return grpc_codec.tensors_of(request.inputs, list(request.raw_input_contents), what="input")


def response_tensors(response: pb.ModelInferResponse) -> TensorDict:
    return grpc_codec.tensors_of(response.outputs, list(response.raw_output_contents), what="output")
